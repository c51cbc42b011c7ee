//! Neumaier-compensated summation: the oracle's reductions lose no more than
//! a few f64 ulps regardless of length or cancellation.

/// A running sum with a compensation term (Neumaier's variant of Kahan).
#[derive(Clone, Copy, Debug, Default)]
pub struct CompensatedSum {
    sum: f64,
    compensation: f64,
}

impl CompensatedSum {
    /// The empty sum, 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds x, keeping the rounding error of the f64 addition in the
    /// compensation (exact: Fast2Sum with the larger of the two first).
    #[inline]
    pub fn add(&mut self, x: f64) {
        let t = self.sum + x;
        if self.sum.abs() >= x.abs() {
            self.compensation += (self.sum - t) + x;
        } else {
            self.compensation += (x - t) + self.sum;
        }
        self.sum = t;
    }

    /// The sum so far: the running sum plus its compensation, rounded once.
    #[inline]
    pub fn value(&self) -> f64 {
        self.sum + self.compensation
    }

    /// The compensated sum of `values`, in their order.
    pub fn of(values: impl IntoIterator<Item = f64>) -> f64 {
        let mut s = Self::new();
        for v in values {
            s.add(v);
        }
        s.value()
    }
}
