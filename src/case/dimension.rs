//! A shape dimension for proptest: drawn biased to 1, small primes, powers
//! of two and multiples of common block sizes (each +-1), and shrunk by
//! trying 1 first, then bisecting.

use proptest::prelude::*;
use proptest::sample::select;
use proptest::strategy::ValueTree;

const PRIMES: [usize; 16] = [2, 3, 5, 7, 11, 13, 17, 31, 61, 127, 131, 257, 509, 1021, 2039, 4093];
/// Block sizes kernels use along the vocabulary or time axis.
const BLOCKS: [usize; 6] = [8, 128, 256, 512, 1024, 2048];

/// A dimension in 1..=max, biased to 1, small primes, powers of two and
/// multiples of common block sizes, each +-1. It shrinks by trying 1 first,
/// then bisecting (see [`Dimension`]).
pub fn dimension(max: usize) -> BoxedStrategy<usize> {
    Dimension(drawn_dimension(max)).boxed()
}

fn drawn_dimension(max: usize) -> BoxedStrategy<usize> {
    let max = max.max(1);
    let clamp = move |v: usize| v.clamp(1, max);
    let primes: Vec<usize> = PRIMES.iter().copied().filter(|&p| p <= max).collect();
    let blocks: Vec<usize> = BLOCKS.iter().copied().filter(|&b| b <= max).collect();
    let max_log2 = usize::BITS - 1 - max.leading_zeros();
    let mut options: Vec<(u32, BoxedStrategy<usize>)> = vec![
        (3, (1..=max.min(4)).boxed()),
        (2, (0..=max_log2, -1i64..=1).prop_map(move |(k, d)| clamp(((1i64 << k) + d).max(1) as usize)).boxed()),
        (2, (1..=max).boxed()),
    ];
    if !primes.is_empty() {
        options.push((2, select(primes).boxed()));
    }
    if !blocks.is_empty() {
        let tile = select(blocks)
            .prop_flat_map(move |block| (Just(block), 1..=max / block, -1i64..=1))
            .prop_map(move |(block, n, d)| clamp((n as i64 * block as i64 + d).max(1) as usize));
        options.push((3, tile.boxed()));
    }
    proptest::strategy::Union::new_weighted(options).boxed()
}

/// A dimension drawn by an inner strategy that shrinks by trying 1 at once,
/// then bisecting between 1 and the value. Every shrink step of a shape
/// compiles a new step in the worker; most bugs still show at a dimension of
/// 1, and the inner strategy's own shrinking (the weighted alternatives, each
/// bisected from its own value) would take a compile per halving to get there.
#[derive(Debug)]
struct Dimension(BoxedStrategy<usize>);

impl Strategy for Dimension {
    type Tree = DimensionTree;
    type Value = usize;

    fn new_tree(&self, runner: &mut proptest::test_runner::TestRunner) -> proptest::strategy::NewTree<Self> {
        let value = self.0.new_tree(runner)?.current();
        Ok(DimensionTree { lo: 1, curr: value, hi: value, tried_one: false })
    }
}

/// Bisection over [lo, hi] with hi the smallest value known to fail and
/// lo the smallest that may; the first step tries lo itself.
#[derive(Debug)]
pub struct DimensionTree {
    lo: usize,
    curr: usize,
    hi: usize,
    tried_one: bool,
}

impl DimensionTree {
    fn reposition(&mut self) -> bool {
        let mid = self.lo + (self.hi - self.lo) / 2;
        if mid == self.curr {
            return false;
        }
        self.curr = mid;
        true
    }
}

impl ValueTree for DimensionTree {
    type Value = usize;

    fn current(&self) -> usize {
        self.curr
    }

    fn simplify(&mut self) -> bool {
        if !self.tried_one {
            self.tried_one = true;
            if self.curr > self.lo {
                self.hi = self.curr;
                self.curr = self.lo;
                return true;
            }
            return false;
        }
        if self.hi <= self.lo {
            return false;
        }
        self.hi = self.curr;
        self.reposition()
    }

    fn complicate(&mut self) -> bool {
        if self.hi <= self.lo {
            return false;
        }
        self.lo = self.curr + 1;
        self.reposition()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shrinks a tree the way proptest's runner does, on a failure predicate;
    /// returns the minimal value and the number of values tried.
    fn shrink(mut tree: impl ValueTree<Value = usize>, fails: impl Fn(usize) -> bool) -> (usize, usize) {
        let (mut tried, mut minimal) = (0, tree.current());
        if !tree.simplify() {
            return (minimal, tried);
        }
        loop {
            tried += 1;
            let more = if fails(tree.current()) {
                minimal = tree.current();
                tree.simplify()
            } else {
                tree.complicate()
            };
            if !more {
                return (minimal, tried);
            }
        }
    }

    #[test]
    fn a_dimension_tries_one_first_then_bisects_to_the_smallest_failing() {
        let tree = |v| DimensionTree { lo: 1, curr: v, hi: v, tried_one: false };
        assert_eq!(shrink(tree(2049), |_| true), (1, 1));
        let (minimal, tried) = shrink(tree(2049), |v| v >= 385);
        assert_eq!(minimal, 385);
        assert!(tried <= 13, "{tried} steps");
        assert_eq!(shrink(tree(1), |_| true), (1, 0));
        assert_eq!(shrink(tree(7), |v| v == 7).0, 7);
    }
}
