//! bf16 products of a few rows (a decoding step of one to eight sequences) with the weight's
//! values in a vector's lanes. The tiles ([`super::tiles_bf16`]) put the rows in the lanes and
//! broadcast the weight a pair of values at a time: built for many rows, at one row they use one
//! lane in sixteen and spend a broadcast on every four bytes of weight (one decoding client ran at
//! half vLLM's speed). Here sixteen weight rows are read a cache line each, transposed in
//! registers so that a vector holds one pair step of sixteen columns, and each row's pair is
//! broadcast instead. Every sum runs in the tiles' order (pair step after pair step from zero, a
//! depth chunk of [`DEPTH`] at a time, each chunk's sum added to the output), so a row's values
//! are bit for bit what the tiles compute for it, however many rows share its step.

use super::{Dst, DEPTH};
use half::bf16;
use rayon::prelude::*;

/// The most rows this kernel takes: their sums and the sixteen transposed weight vectors fill
/// the 32 vector registers less a few. Past them the tiles' lanes fill up: sixteen rows in two
/// groups over the same lines (each transposing them) served 0.75–0.8× the tiles' tokens/s.
pub(super) const MAX_ROWS: usize = 8;

/// Columns (weight rows) a block of the kernel computes: one vector's lanes.
const LANES: usize = 16;

/// Whether `m` rows take this kernel: few of them, bf16 products, and no AMX (whose tiles
/// compute those columns in an order of their own).
pub(super) fn applies(m: usize) -> bool {
    (1..=MAX_ROWS).contains(&m) && super::bf16_products_available() && !super::amx::available()
}

/// `dst (+)= a · wᵀ` for `m` ≤ [`MAX_ROWS`] bf16 rows `a` (row `r` at `a[r · stride..][..k]`)
/// and the bf16 weight `w` `[n, k]`, `dst` `[m, n]`, in `tasks` parallel blocks of columns.
///
/// # Panics
/// When [`applies`] does not hold or a slice is too short for the sizes.
pub(super) fn matmul(dst: &mut [f32], (a, stride): (&[u16], usize), w: &[bf16], (m, n, k): (usize, usize, usize), accumulate: bool, tasks: usize) {
    assert!(applies(m), "the few-row kernel takes 1 to {MAX_ROWS} rows, with bf16 products and no AMX");
    assert!(
        stride >= k && a.len() >= (m - 1) * stride + k && w.len() >= n * k && dst.len() >= m * n,
        "product of [{m}, {k}] by [{n}, {k}]"
    );
    // Each row's pair steps as the tiles pack them: two neighbouring values, an odd last with zero.
    let pairs: Vec<u32> = (0..m)
        .flat_map(|r| {
            let row = &a[r * stride..][..k];
            (0..k.div_ceil(2)).map(move |s| u32::from(row[2 * s]) | row.get(2 * s + 1).map_or(0, |&h| u32::from(h)) << 16)
        })
        .collect();
    let dst = Dst { at: dst.as_mut_ptr(), stride: n };
    let block = n.div_ceil(tasks.max(1)).next_multiple_of(LANES);
    (0..n.div_ceil(block)).into_par_iter().for_each(|b| {
        let (j0, cols) = (b * block, block.min(n - b * block));
        let x = Rows { pairs: &pairs, per_row: k.div_ceil(2) };
        let (dst, w) = (dst.past_columns(j0), &w[j0 * k..(j0 + cols) * k]);
        macro_rules! rows {
            ($($m:literal),*) => {
                match m {
                    // SAFETY: `applies` held (AVX-512F, BW and BF16); the block's `cols` weight
                    // rows of `k` values and its columns of `dst`'s `m` rows lie within the
                    // sizes asserted above, and no other task writes them.
                    $($m => unsafe { columns::<$m>(dst, x, w, (cols, k), accumulate) },)*
                    _ => unreachable!("checked by `applies`"),
                }
            };
        }
        rows!(1, 2, 3, 4, 5, 6, 7, 8);
    });
}

/// The rows' pair steps, `per_row` a row.
#[derive(Clone, Copy)]
struct Rows<'a> {
    pairs: &'a [u32],
    per_row: usize,
}

/// [`matmul`]'s block of `n` columns (`w` `[n, k]`) for `M` rows, a vector of columns and a
/// depth chunk at a time.
///
/// # Safety
/// The CPU must have AVX-512F, BW and BF16; `dst` holds `M` rows of `n` values from its start.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn columns<const M: usize>(dst: Dst, x: Rows, w: &[bf16], (n, k): (usize, usize), accumulate: bool) {
    for j0 in (0..n).step_by(LANES) {
        let cols = LANES.min(n - j0);
        // Past the last weight row a lane repeats it; those columns are dropped.
        let rows: [*const half::bf16; LANES] = std::array::from_fn(|c| w[(j0 + c.min(cols - 1)) * k..].as_ptr());
        for k0 in (0..k).step_by(DEPTH) {
            let end = k.min(k0 + DEPTH);
            // SAFETY: the caller's (AVX-512 BF16; rows `0..M` of `dst`; `rows` within `w`).
            unsafe {
                let acc = chunk::<M>(&rows, x, (k0, end));
                store(dst, j0, cols, &acc, !accumulate && k0 == 0);
            }
        }
    }
}

/// The sums over the depth chunk `k0..end` of the `M` rows against the sixteen weight rows
/// `rows` (one vector of columns), pair step after pair step from zero.
///
/// # Safety
/// The CPU must have AVX-512F, BW and BF16; each of `rows` holds `end` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn chunk<const M: usize>(rows: &[*const bf16; LANES], x: Rows, (k0, end): (usize, usize)) -> [std::arch::x86_64::__m512; M] {
    use std::arch::x86_64::*;
    let bh = |v: __m512i| -> __m512bh {
        // SAFETY: both are 64 bytes of plain bits.
        unsafe { std::mem::transmute(v) }
    };
    let mut acc = [_mm512_setzero_ps(); M];
    for s0 in (k0 / 2..end.div_ceil(2)).step_by(LANES) {
        // The values left in the chunk from pair step `s0`, 32 at most: an odd last one reads as
        // a pair with zero, and nothing past the chunk is read.
        let left = (end - 2 * s0).min(2 * LANES);
        let mask: __mmask32 = if left == 32 { !0 } else { (1u32 << left) - 1 };
        let mut v: [__m512; LANES] = std::array::from_fn(|c| {
            // Four lines on, for the next steps (a prefetch never faults).
            let at = rows[c].wrapping_add(2 * s0);
            _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(4 * 2 * LANES).cast());
            // SAFETY: `2 · s0` lies within the row's values, and the mask keeps the load
            // within the chunk.
            _mm512_castsi512_ps(unsafe { _mm512_maskz_loadu_epi16(mask, at.cast()) })
        });
        super::pack::transpose16(&mut v);
        for (s, step) in v.iter().enumerate().take(left.div_ceil(2)) {
            let w_pairs = bh(_mm512_castps_si512(*step));
            for (r, acc) in acc.iter_mut().enumerate() {
                let pair = x.pairs[r * x.per_row + s0 + s];
                *acc = _mm512_dpbf16_ps(*acc, bh(_mm512_set1_epi32(pair as i32)), w_pairs);
            }
        }
    }
    acc
}

/// The first `acc.len()` rows of `dst`'s columns `j0..j0 + cols` written as `acc` (`first`: a
/// product's first depth chunk, not accumulating) or added to.
///
/// # Safety
/// The CPU must have AVX-512F; those rows and columns lie within `dst`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn store(dst: Dst, j0: usize, cols: usize, acc: &[std::arch::x86_64::__m512], first: bool) {
    use std::arch::x86_64::*;
    let lanes: __mmask16 = ((1u32 << cols) - 1) as u16;
    for (r, acc) in acc.iter().enumerate() {
        // SAFETY: the caller's: row `r` and columns `j0..j0 + cols` (the mask) lie within.
        unsafe {
            let at = dst.at.add(r * dst.stride + j0);
            let sum = if first { *acc } else { _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, at), *acc) };
            _mm512_mask_storeu_ps(at, lanes, sum);
        }
    }
}

/// Never called: [`applies`] is false off x86-64.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn columns<const M: usize>(_: Dst, _: Rows, _: &[bf16], _: (usize, usize), _: bool) {
    unreachable!("no bf16 products off x86-64")
}

#[cfg(test)]
mod tests {
    use super::super::pairs::{matmul_t_bf16_rows, Bf16Rows};
    use super::*;

    /// Bit for bit the tiles' sums, for one to four rows, odd and even depths, depths past a
    /// chunk, columns past whole vectors, written or added to.
    #[test]
    fn few_rows_sum_as_the_tiles_do() {
        if !applies(1) {
            return eprintln!("AMX here, or no AVX512_BF16: the tiles take every product");
        }
        let value = |i: usize, salt: usize| bf16::from_f32((((i * 7919 + salt * 104_729) % 2003) as f32 / 2003.0 - 0.5) * 3.0);
        for (n, k) in [(1, 1), (5, 3), (16, 32), (17, 33), (48, 1024), (100, 1025), (33, 2100)] {
            let w: Vec<bf16> = (0..n * k).map(|i| value(i, 1)).collect();
            let rows: Vec<u16> = (0..MAX_ROWS * (k + 3)).map(|i| value(i, 2).to_bits()).collect();
            for m in 1..=MAX_ROWS {
                for accumulate in [false, true] {
                    let start: Vec<f32> = (0..m * n).map(|i| value(i, 3).to_f32()).collect();
                    let (mut want, mut got) = (start.clone(), start.clone());
                    super::super::pairs::tiles_rows(&mut want, Bf16Rows::Rows(&rows, k + 3), &w, (m, n, k), accumulate, 2);
                    matmul(&mut got, (&rows, k + 3), &w, (m, n, k), accumulate, 2);
                    let same = want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "[{m}, {k}] by [{n}, {k}], accumulate {accumulate}");
                    // And the product's entry point takes this kernel.
                    let mut through = start.clone();
                    assert!(matmul_t_bf16_rows(&mut through, Bf16Rows::Rows(&rows, k + 3), &w, (m, n, k), accumulate, 2));
                    assert!(through.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()));
                }
            }
        }
    }
}
