//! bf16 matrices transposed (the packed trainer's weights for the input gradients, its
//! activations for the weight gradients): blocks of 32 × 32 in AVX-512 registers where the CPU
//! has AVX-512BW (two 16 × 16 transposes of value pairs, then the pairs taken apart), the edges
//! value by value; columns of blocks in parallel, each value written once.

use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Rows and columns of a block.
const B: usize = 32;

/// `src` `[rows, cols]` (bf16 bits) transposed to `[cols, rows]`.
///
/// # Panics
/// When `src` holds fewer than `rows · cols` values.
pub(crate) fn transposed_u16(src: &[u16], rows: usize, cols: usize) -> Vec<u16> {
    assert!(src.len() >= rows * cols, "[{rows}, {cols}] from {} values", src.len());
    let mut out = Vec::with_capacity(rows * cols);
    if rows * cols == 0 {
        return out;
    }
    let fast = registers_available();
    out.spare_capacity_mut()[..rows * cols]
        .par_chunks_mut(B * rows)
        .enumerate()
        .for_each(|(cb, block)| {
            let (c0, width) = (cb * B, block.len() / rows);
            for r0 in (0..rows).step_by(B) {
                let height = B.min(rows - r0);
                if fast && width == B && height == B {
                    // SAFETY: AVX-512F/BW are here (`fast`); rows r0..r0 + 32 of columns
                    // c0..c0 + 32 lie within `src`, and `block` holds 32 rows of `rows` values.
                    unsafe { block32(src, cols, (r0, c0), block, rows) };
                    continue;
                }
                for c in 0..width {
                    for r in r0..r0 + height {
                        block[c * rows + r].write(src[r * cols + c0 + c]);
                    }
                }
            }
        });
    // SAFETY: every one of the `rows · cols` values was written above (each column block's
    // rows, by whole blocks or value by value), within the capacity reserved.
    unsafe { out.set_len(rows * cols) };
    out
}

/// Whether the 32 × 32 register blocks can run here.
fn registers_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bw")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The block of `src`'s rows `r0..r0 + 32` and columns `c0..c0 + 32` transposed into `out`
/// (its row `c` at `c · stride + r0`): each half of the rows transposed as 16 × 16 pairs of
/// values, then a transposed row's even (odd) values taken from both halves' pair rows.
///
/// # Safety
/// The CPU has AVX-512F and AVX-512BW; `src` holds rows `r0..r0 + 32` of `cols` values with
/// columns `c0..c0 + 32`; `out` holds 32 rows of `stride ≥ r0 + 32` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn block32(src: &[u16], cols: usize, (r0, c0): (usize, usize), out: &mut [MaybeUninit<u16>], stride: usize) {
    use super::pack::transpose16;
    use std::arch::x86_64::*;
    // SAFETY (loads and stores): within the rows and columns the caller guarantees.
    let row = |r: usize| unsafe { _mm512_castsi512_ps(_mm512_loadu_si512(src.as_ptr().add((r0 + r) * cols + c0).cast())) };
    let mut top: [__m512; 16] = std::array::from_fn(row);
    let mut bottom: [__m512; 16] = std::array::from_fn(|r| row(16 + r));
    transpose16(&mut top);
    transpose16(&mut bottom);
    // Lane i of a transposed row: value 2i (or 2i + 1) of the top pairs for i < 16, of the
    // bottom ones (index 32 + …) after.
    let even: [u16; 32] = std::array::from_fn(|i| if i < 16 { 2 * i as u16 } else { 32 + 2 * (i as u16 - 16) });
    // SAFETY: 32 values each.
    let (even, odd) = unsafe {
        let even = _mm512_loadu_si512(even.as_ptr().cast());
        (even, _mm512_add_epi16(even, _mm512_set1_epi16(1)))
    };
    for q in 0..16 {
        let (t, b) = (_mm512_castps_si512(top[q]), _mm512_castps_si512(bottom[q]));
        // SAFETY: rows 2q and 2q + 1 of `out` hold values r0..r0 + 32.
        unsafe {
            _mm512_storeu_si512(out.as_mut_ptr().add(2 * q * stride + r0).cast(), _mm512_permutex2var_epi16(t, even, b));
            _mm512_storeu_si512(out.as_mut_ptr().add((2 * q + 1) * stride + r0).cast(), _mm512_permutex2var_epi16(t, odd, b));
        }
    }
}

/// Never called: [`registers_available`] is false off x86-64.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn block32(_: &[u16], _: usize, _: (usize, usize), _: &mut [MaybeUninit<u16>], _: usize) {
    unreachable!("no AVX-512 off x86-64")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whole blocks, edges of rows and of columns, and both, give the plain transpose.
    #[test]
    fn transposes_every_shape() {
        for (rows, cols) in [(0, 5), (1, 1), (1, 40), (32, 32), (33, 70), (64, 96), (100, 37), (65, 33), (96, 64)] {
            let src: Vec<u16> = (0..rows * cols).map(|i| (i * 7919 % 65_521) as u16).collect();
            let got = transposed_u16(&src, rows, cols);
            let want: Vec<u16> = (0..cols).flat_map(|c| (0..rows).map(move |r| (r, c))).map(|(r, c)| src[r * cols + c]).collect();
            assert_eq!(got, want, "[{rows}, {cols}]");
        }
    }
}
