//! `--partition K/N`: one of N disjoint parts of a run, for spreading a
//! nightly over N machines (docs/cli.md, "Partitioned runs"). A run's units
//! are numbered as the whole run numbers them (`check`'s signature groups,
//! `mutants`' catalog files, `gradcheck`'s and `invariance`'s
//! implementations) and part K holds those whose number is K - 1 modulo N:
//! round robin, so the parts of a run share its costly and cheap units
//! alike. Every unit is drawn from the run's seed and its own number, never
//! from the part, so the N parts hold exactly the units of the whole run,
//! with the same cases and verdicts; `grpo-verify merge` joins their
//! reports into the whole run's.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Part `k` of `n` (1 <= k <= n).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    /// Which part, from 1.
    pub k: usize,
    /// How many parts the run is split into.
    pub n: usize,
}

impl Partition {
    /// The whole run: one part.
    pub const WHOLE: Partition = Partition { k: 1, n: 1 };

    /// Does this part hold unit `index` of the whole run?
    pub fn holds(&self, index: usize) -> bool {
        index % self.n == self.k - 1
    }

    /// The units of `units` this part holds, in order.
    pub fn keep<T>(&self, units: Vec<T>) -> Vec<T> {
        units.into_iter().enumerate().filter(|(i, _)| self.holds(*i)).map(|(_, u)| u).collect()
    }

    /// Is this the whole run (N = 1)?
    pub fn is_whole(&self) -> bool {
        self.n == 1
    }
}

impl FromStr for Partition {
    type Err = String;

    fn from_str(text: &str) -> Result<Partition, String> {
        let bad = || format!("{text:?}: expected K/N, the K-th of N parts, with 1 <= K <= N (e.g. 2/3)");
        let (k, n) = text.split_once('/').ok_or_else(bad)?;
        let (k, n): (usize, usize) = (k.trim().parse().map_err(|_| bad())?, n.trim().parse().map_err(|_| bad())?);
        if k < 1 || k > n {
            return Err(bad());
        }
        Ok(Partition { k, n })
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.k, self.n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parts of a run are disjoint and together hold every unit once.
    #[test]
    fn the_parts_hold_every_unit_once() {
        for n in 1..=4 {
            let mut held = vec![0; 23];
            for k in 1..=n {
                let part = Partition { k, n };
                for (i, count) in held.iter_mut().enumerate() {
                    *count += part.holds(i) as usize;
                }
                assert_eq!(part.keep((0..23).collect::<Vec<_>>()).len(), (0..23).filter(|&i| part.holds(i)).count());
            }
            assert!(held.iter().all(|&c| c == 1), "n = {n}: {held:?}");
        }
        for bad in ["0/3", "4/3", "1/0", "3", "a/b", "1/2/3", ""] {
            assert!(bad.parse::<Partition>().is_err(), "{bad}");
        }
        assert_eq!("2/3".parse::<Partition>(), Ok(Partition { k: 2, n: 3 }));
    }
}
