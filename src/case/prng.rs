//! A small, stable pseudo-random stream (SplitMix64) for materialising case
//! arrays from a seed. Stable on purpose: a repro's seed must give the same
//! arrays in every future version, whatever the `rand` ecosystem does.

/// A SplitMix64 stream; its state is the only thing it holds.
pub struct Prng(u64);

impl Prng {
    /// A stream from `seed`.
    pub fn new(seed: u64) -> Self {
        Prng(seed ^ 0x6a09_e667_f3bc_c909)
    }

    /// An independent stream for one (purpose, b, t): rows keep their values
    /// when the shrinker removes other rows or changes other dimensions.
    pub fn keyed(seed: u64, purpose: u64, b: usize, t: usize) -> Self {
        let mut mix = Prng::new(seed);
        for word in [purpose, b as u64, t as u64] {
            mix.0 ^= word.wrapping_mul(0xd6e8_feb8_6659_fd93);
            mix.next_u64();
        }
        Prng(mix.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    /// Uniform in 0..n (n >= 1).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// One of `items`, uniformly.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}
