//! Weight matrices as the checkpoint stores them: f32, or bf16/f16 kept at two bytes a value in
//! memory and widened to f32 a block at a time inside the kernels, so a bf16 model holds no f32
//! copy of itself and every product still runs in f32 arithmetic. Widening is exact (every bf16
//! and f16 value is an f32 value), so a bf16 checkpoint computes the same numbers whether it is
//! held as bf16 or converted to f32 at load.

use candle_core::{CpuStorage, Layout};
use half::{bf16, f16};
use std::cell::RefCell;

/// A contiguous weight (or a block of its rows) in its stored precision.
#[derive(Clone, Copy, Debug)]
pub(crate) enum WeightSlice<'a> {
    /// Four bytes a value.
    F32(&'a [f32]),
    /// bfloat16 (the top half of an f32), widened to f32 for its products.
    Bf16(&'a [bf16]),
    /// bfloat16 multiplied in bf16 with f32 sums (`vdpbf16ps`): made only where the CPU has
    /// AVX-512F and AVX512_BF16 and the model asked for it ([`WeightSlice::from_storage`]).
    Bf16Products(&'a [bf16]),
    /// IEEE half precision.
    F16(&'a [f16]),
}

impl<'a> WeightSlice<'a> {
    /// The contiguous view of a CPU storage in f32, bf16 or f16 (`None` for other dtypes or a
    /// strided layout); a bf16 one multiplies in bf16 when `bf16_products` and the CPU can
    /// ([`WeightSlice::bf16`]).
    pub(crate) fn from_storage(storage: &'a CpuStorage, layout: &Layout, bf16_products: bool) -> Option<Self> {
        let (start, end) = layout.contiguous_offsets()?;
        Some(match storage {
            CpuStorage::F32(d) => WeightSlice::F32(&d[start..end]),
            CpuStorage::BF16(d) => WeightSlice::bf16(&d[start..end], bf16_products),
            CpuStorage::F16(d) => WeightSlice::F16(&d[start..end]),
            _ => return None,
        })
    }

    /// bf16 values, multiplied in bf16 when `products` asks for it and the CPU has AVX-512F
    /// with AVX512_BF16 ([`crate::kernels::sgemm::bf16_products_available`]), else widened.
    pub(crate) fn bf16(values: &'a [bf16], products: bool) -> Self {
        if products && super::sgemm::bf16_products_available() {
            WeightSlice::Bf16Products(values)
        } else {
            WeightSlice::Bf16(values)
        }
    }

    /// Number of values.
    pub(crate) fn len(&self) -> usize {
        match self {
            WeightSlice::F32(w) => w.len(),
            WeightSlice::Bf16(w) | WeightSlice::Bf16Products(w) => w.len(),
            WeightSlice::F16(w) => w.len(),
        }
    }

    /// Values `range` of it.
    pub(crate) fn slice(&self, range: std::ops::Range<usize>) -> Self {
        match self {
            WeightSlice::F32(w) => WeightSlice::F32(&w[range]),
            WeightSlice::Bf16(w) => WeightSlice::Bf16(&w[range]),
            WeightSlice::Bf16Products(w) => WeightSlice::Bf16Products(&w[range]),
            WeightSlice::F16(w) => WeightSlice::F16(&w[range]),
        }
    }

    /// Write its values as f32 into `dst` (of the same length).
    pub(crate) fn widen_into(&self, dst: &mut [f32]) {
        match self {
            WeightSlice::F32(w) => dst.copy_from_slice(w),
            // A shift the compiler vectorises: bf16 is the upper 16 bits of an f32.
            WeightSlice::Bf16(w) | WeightSlice::Bf16Products(w) => {
                use half::slice::HalfFloatSliceExt;
                for (d, &bits) in dst.iter_mut().zip(w.reinterpret_cast()) {
                    *d = f32::from_bits(u32::from(bits) << 16);
                }
            }
            WeightSlice::F16(w) => {
                use half::slice::HalfFloatSliceExt;
                w.convert_to_f32_slice(dst)
            }
        }
    }

    /// Run `f` on these values as f32: in place when they are f32, else widened into this
    /// thread's buffer (`rows` rows of `len / rows` values at a time, each call of `f` given the
    /// index of its first row).
    pub(crate) fn for_each_f32_block(&self, rows: usize, block_rows: usize, mut f: impl FnMut(usize, &[f32])) {
        if let WeightSlice::F32(w) = self {
            return f(0, w);
        }
        let width = self.len() / rows.max(1);
        WIDENED.with(|buf| {
            let mut fresh = Vec::new();
            let mut mine = buf.try_borrow_mut();
            let buf: &mut Vec<f32> = match mine.as_deref_mut() {
                Ok(b) => b,
                Err(_) => &mut fresh,
            };
            for first in (0..rows).step_by(block_rows.max(1)) {
                let n = block_rows.min(rows - first);
                buf.resize(n * width, 0.0);
                self.slice(first * width..(first + n) * width).widen_into(buf);
                f(first, buf);
            }
        })
    }
}

thread_local! {
    /// This thread's block of widened weight rows.
    static WIDENED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widening_is_exact_and_blocks_cover_every_row() {
        let values: Vec<f32> = (0..60).map(|i| (i as f32 - 30.0) * 0.37).collect();
        let b: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
        let h: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
        for (w, want) in [
            (WeightSlice::Bf16(&b), b.iter().map(|v| v.to_f32()).collect::<Vec<_>>()),
            (WeightSlice::F16(&h), h.iter().map(|v| v.to_f32()).collect()),
            (WeightSlice::F32(&values), values.clone()),
        ] {
            let mut seen = Vec::new();
            w.for_each_f32_block(12, 5, |first, block| {
                assert_eq!(first * 5, seen.len());
                seen.extend_from_slice(block);
            });
            assert_eq!(seen, want);
        }
    }
}
