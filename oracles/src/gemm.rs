//! Matrix products for the fused kind's blocked passes, through the `gemm`
//! crate (packed AVX-512 / AVX2 kernels, chosen at run time, on rayon's
//! threads). A [`Mat`] is a strided view checked against its slice once, so
//! the one `unsafe` call below never reads or writes outside it.

use gemm::Parallelism;

/// The element types the passes multiply: f64 for values, f32 for rounding
/// magnitudes (which need a few digits, at twice the speed).
pub trait Scalar: Copy + Default + Send + Sync + 'static {
    /// 1: the scale of both the destination and the product (dst = dst + lhs rhs).
    const ONE: Self;
}
impl Scalar for f64 {
    const ONE: f64 = 1.0;
}
impl Scalar for f32 {
    const ONE: f32 = 1.0;
}

/// An r x c matrix: element (i, j) at `offset + i * row_stride + j * col_stride`.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// r: i ranges over 0..r.
    pub rows: usize,
    /// c: j ranges over 0..c.
    pub cols: usize,
    /// Index of element (0, 0) in the slice.
    pub offset: usize,
    /// Elements between (i, j) and (i + 1, j).
    pub row_stride: usize,
    /// Elements between (i, j) and (i, j + 1).
    pub col_stride: usize,
}

impl Layout {
    /// Row-major with leading dimension `ld` (>= cols), starting at `offset`.
    pub fn row_major(rows: usize, cols: usize, ld: usize, offset: usize) -> Layout {
        Layout { rows, cols, offset, row_stride: ld, col_stride: 1 }
    }
    /// A dense row-major matrix.
    pub fn dense(rows: usize, cols: usize) -> Layout {
        Layout::row_major(rows, cols, cols, 0)
    }
    /// The transpose, as a view of the same elements (strides swapped, no copy).
    pub fn t(self) -> Layout {
        Layout { rows: self.cols, cols: self.rows, row_stride: self.col_stride, col_stride: self.row_stride, ..self }
    }
    /// The last element's index + 1 (0 for an empty matrix).
    fn end(&self) -> usize {
        if self.rows == 0 || self.cols == 0 {
            0
        } else {
            self.offset + (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride + 1
        }
    }
}

/// dst = lhs @ rhs, or dst += lhs @ rhs when `accumulate`.
pub fn matmul<T: Scalar>(dst: &mut [T], d: Layout, lhs: &[T], l: Layout, rhs: &[T], r: Layout, accumulate: bool) {
    assert!(l.cols == r.rows && d.rows == l.rows && d.cols == r.cols, "matmul shapes {l:?} @ {r:?} -> {d:?}");
    assert!(d.end() <= dst.len() && l.end() <= lhs.len() && r.end() <= rhs.len(), "matmul view outside its slice");
    if d.rows == 0 || d.cols == 0 {
        return;
    }
    if l.cols == 0 {
        if !accumulate {
            for i in 0..d.rows {
                for j in 0..d.cols {
                    dst[d.offset + i * d.row_stride + j * d.col_stride] = T::default();
                }
            }
        }
        return;
    }
    let threads = rayon::current_num_threads();
    let parallelism = if threads > 1 { Parallelism::Rayon(threads) } else { Parallelism::None };
    // SAFETY: every index the views can address lies inside its slice
    // (checked above); dst does not alias lhs or rhs (distinct borrows).
    unsafe {
        gemm::gemm(
            d.rows,
            d.cols,
            l.cols,
            dst.as_mut_ptr().add(d.offset),
            d.col_stride as isize,
            d.row_stride as isize,
            accumulate,
            lhs.as_ptr().add(l.offset),
            l.col_stride as isize,
            l.row_stride as isize,
            rhs.as_ptr().add(r.offset),
            r.col_stride as isize,
            r.row_stride as isize,
            T::ONE,
            T::ONE,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_products_match_the_definition() {
        let (m, k, n) = (5, 7, 3);
        let a: Vec<f64> = (0..m * k).map(|i| (i as f64 * 0.37).sin()).collect();
        let b: Vec<f64> = (0..k * n).map(|i| (i as f64 * 0.11).cos()).collect();
        // dst is a [m x n] block at column 2 of a [m x 8] buffer; b used transposed from a [n x k] store.
        let bt: Vec<f64> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let mut dst = vec![1.0; m * 8];
        let d = Layout::row_major(m, n, 8, 2);
        matmul(&mut dst, d, &a, Layout::dense(m, k), &bt, Layout::dense(n, k).t(), true);
        for i in 0..m {
            for j in 0..n {
                let want: f64 = 1.0 + (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum::<f64>();
                assert!((dst[i * 8 + 2 + j] - want).abs() < 1e-12, "({i}, {j})");
            }
            assert_eq!(dst[i * 8], 1.0, "outside the view untouched");
        }
    }
}
