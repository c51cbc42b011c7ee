//! SPEC v2's logit transforms, before the temperature (Unsloth's logit
//! scale, Gemma-style softcap):
//!
//! ```text
//! z' = logit_scale * z,    z'' = logit_softcap * tanh(z' / logit_softcap)   (+inf: z'' = z')
//! ```
//!
//! as a row source over another: the forward pass reads z'' rows, and a
//! gradient row wrt z'' is chained back to z by dz''/dz = s sech^2(z'/c).

use crate::problem::{LogitRows, Shape};
use crate::vector::{self, GradRow};

/// The transform's two hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogitTransform {
    /// logit_scale s: z' = s z (finite, > 0).
    pub scale: f64,
    /// +inf: no softcap.
    pub softcap: f64,
}

impl LogitTransform {
    /// z'' of one z.
    pub fn apply(&self, z: f64) -> f64 {
        let zs = self.scale * z;
        if self.softcap.is_finite() {
            self.softcap * (zs / self.softcap).tanh()
        } else {
            zs
        }
    }

    /// dz''/dz at z: s sech^2(s z / c) (s without a softcap).
    pub fn derivative(&self, z: f64) -> f64 {
        if self.softcap.is_finite() {
            let c = (self.scale * z / self.softcap).cosh();
            self.scale / (c * c)
        } else {
            self.scale
        }
    }
}

/// Rows z'' of an inner source of raw rows z.
pub struct TransformedRows<'a> {
    pub inner: &'a dyn LogitRows,
    pub transform: LogitTransform,
}

impl LogitRows for TransformedRows<'_> {
    fn shape(&self) -> Shape {
        self.inner.shape()
    }

    /// z'' and, when asked, its rounding magnitude: the inner magnitude
    /// carried through the derivative, plus |z''| (the transform's own
    /// rounding in the implementation).
    fn logit_row(&self, row: usize, out: &mut [f64], magnitude: Option<&mut [f64]>) {
        let t = self.transform;
        match magnitude {
            Some(m) => {
                self.inner.logit_row(row, out, Some(m));
                for (z, mv) in out.iter_mut().zip(m.iter_mut()) {
                    let z2 = t.apply(*z);
                    *mv = *mv * t.derivative(*z) + z2.abs();
                    *z = z2;
                }
            }
            None => {
                self.inner.logit_row(row, out, None);
                out.iter_mut().for_each(|z| *z = t.apply(*z));
            }
        }
    }

    fn grad_row_pass(&self, row: usize, chosen: usize, out: &mut [f64], k: &GradRow) {
        self.logit_row(row, out, None);
        vector::grad_pass(out, k);
        out[chosen] += k.scale * k.c_logp;
        self.chain_to_raw(row, out);
    }

    fn chain_to_raw(&self, row: usize, out: &mut [f64]) {
        let mut z = vec![0.0; out.len()];
        self.inner.logit_row(row, &mut z, None);
        for (g, &zv) in out.iter_mut().zip(&z) {
            *g *= self.transform.derivative(zv);
        }
    }
}
