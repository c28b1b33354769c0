//! Products whose activations are bf16 already (the packed trainer's): packed into the bf16
//! tiles' pairs straight from their bits, from rows or from the transposed layout a weight's
//! gradient reads (`dyᵀ` from `dy` as it lies), with no f32 copy and no transpose.

use super::{bf16_products_available, column_block, columns_bf16, Dst, Dst16, DEPTH, PANEL};
use half::bf16;
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Where a product's bf16 activations `a` `[m, k]` lie (bf16 bits).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Bf16Rows<'a> {
    /// Row `r`'s steps at `values[r · stride..][..k]`.
    Rows(&'a [u16], usize),
    /// Transposed: step `s` of row `r` at `values[s · stride + r]`.
    Columns(&'a [u16], usize),
}

impl Bf16Rows<'_> {
    /// Whether `values` hold `m` rows of `k` steps.
    fn holds(self, m: usize, k: usize) -> bool {
        match self {
            Bf16Rows::Rows(v, stride) => stride >= k && (m == 0 || v.len() >= (m - 1) * stride + k),
            Bf16Rows::Columns(v, stride) => stride >= m && (k == 0 || v.len() >= (k - 1) * stride + m),
        }
    }
}

/// Panels a parallel task of [`pack_pairs_bf16`] packs (256 rows).
const PANELS_A_TASK: usize = 8;

/// Steps `k0..k0 + depth` (of `k`) of the `m` rows of `a` packed as [`super::pack::pack_pairs`]
/// packs f32 rows: panels of [`PANEL`] rows, each pair step holding a row's two neighbouring
/// steps (the earlier in the low half; an odd last step with zero), rows past `m` zero; the
/// panels packed in parallel, each value written once (no zeroing first).
pub(super) fn pack_pairs_bf16(a: Bf16Rows, (m, k): (usize, usize), k0: usize, depth: usize, packed: &mut Vec<u32>) {
    let per_panel = PANEL * depth.div_ceil(2);
    let len = m.div_ceil(PANEL) * per_panel;
    packed.clear();
    packed.reserve(len);
    if len == 0 {
        return;
    }
    let spare = &mut packed.spare_capacity_mut()[..len];
    spare.par_chunks_mut(PANELS_A_TASK * per_panel).enumerate().for_each(|(t, out)| {
        for (i, panel) in out.chunks_exact_mut(per_panel).enumerate() {
            pack_panel(a, (m, k), (k0, depth), (t * PANELS_A_TASK + i) * PANEL, panel);
        }
    });
    // SAFETY: `pack_panel` wrote each of the `len` values (every pair step of every panel, its
    // rows past `m` with zero), and `len` is within the capacity reserved above.
    unsafe { packed.set_len(len) };
}

/// One panel of [`pack_pairs_bf16`]: rows `first..first + PANEL` (those below `m`, then zeros)
/// of steps `k0..k0 + depth`, pair step after pair step, into `out` (all of it written).
fn pack_panel(a: Bf16Rows, (m, k): (usize, usize), (k0, depth): (usize, usize), first: usize, out: &mut [MaybeUninit<u32>]) {
    let rows = PANEL.min(m - first);
    for (step, dst) in out.chunks_exact_mut(PANEL).enumerate().take(depth.div_ceil(2)) {
        let (lo, hi) = (k0 + 2 * step, k0 + 2 * step + 1);
        let (live, pad) = dst.split_at_mut(rows);
        match a {
            Bf16Rows::Rows(v, stride) => {
                for (r, d) in live.iter_mut().enumerate() {
                    let row = &v[(first + r) * stride..];
                    let high = if hi < k { u32::from(row[hi]) } else { 0 };
                    d.write(u32::from(row[lo]) | high << 16);
                }
            }
            Bf16Rows::Columns(v, stride) => {
                let low = &v[lo * stride + first..][..rows];
                match hi < k {
                    true => {
                        let high = &v[hi * stride + first..][..rows];
                        for ((d, &l), &h) in live.iter_mut().zip(low).zip(high) {
                            d.write(u32::from(l) | u32::from(h) << 16);
                        }
                    }
                    false => live.iter_mut().zip(low).for_each(|(d, &l)| {
                        d.write(u32::from(l));
                    }),
                }
            }
        }
        pad.iter_mut().for_each(|d| {
            d.write(0);
        });
    }
}

/// `dst = a · wᵀ` (or `+=` with `accumulate`) for the bf16 activations `a` `[m, k]` and the
/// bf16 weight `w` `[n, k]`, `dst` `[m, n]`, in bf16 products (each depth chunk packed on the
/// pool, then `tasks` blocks of columns), as [`super::matmul_t`] computes it from `a` widened.
/// Returns false, computing nothing, where the CPU cannot multiply in bf16.
///
/// # Panics
/// When a slice is too short for the sizes.
pub(crate) fn matmul_t_bf16_rows(
    dst: &mut [f32],
    a: Bf16Rows,
    w: &[bf16],
    (m, n, k): (usize, usize, usize),
    accumulate: bool,
    tasks: usize,
) -> bool {
    if !bf16_products_available() {
        return false;
    }
    assert!(a.holds(m, k) && w.len() >= n * k && dst.len() >= m * n, "product of [{m}, {k}] by [{n}, {k}]");
    if m == 0 || n == 0 || k == 0 {
        if !accumulate {
            dst[..m * n].fill(0.0);
        }
        return true;
    }
    match a {
        Bf16Rows::Rows(rows, stride) if super::few::applies(m) => {
            super::few::matmul(dst, (rows, stride), w, (m, n, k), accumulate, tasks)
        }
        _ => tiles_rows(dst, a, w, (m, n, k), accumulate, tasks),
    }
    true
}

/// [`matmul_t_bf16_rows`] in the tiles, whatever the rows (bf16 products available, the sizes
/// checked, none of them zero).
pub(super) fn tiles_rows(dst: &mut [f32], a: Bf16Rows, w: &[bf16], (m, n, k): (usize, usize, usize), accumulate: bool, tasks: usize) {
    let chunks: Vec<usize> = (0..k).step_by(DEPTH).collect();
    let packed: Vec<Vec<u32>> = chunks
        .into_par_iter()
        .map(|k0| {
            let mut packed = Vec::new();
            pack_pairs_bf16(a, (m, k), k0, DEPTH.min(k - k0), &mut packed);
            packed
        })
        .collect();
    let dst = Dst {
        at: dst.as_mut_ptr(),
        stride: n,
    };
    // SAFETY: bf16 products are available (the caller's check); `dst` holds `m` rows of `n`,
    // `w` `n` rows of `k` (the caller's assertion) and `packed` every depth chunk's panels of
    // the `m` rows.
    unsafe { columns_bf16(dst, &packed, w, (m, n, k), accumulate, tasks) };
}

/// `dst = bf16(a · wᵀ)` (each sum rounded to the nearest bf16) for the bf16 activations `a`
/// `[m, k]` and weight `w` `[n, k]`, `dst` `[m, n]` bf16 bits, straight from the AMX tiles'
/// sums (no f32 output to write and read again): where AMX computes all of it in one depth
/// chunk (`k` a multiple of 32 up to [`DEPTH`], `n` of 16, as every Qwen2 projection's but the
/// MLP's down one). Returns false, computing nothing, elsewhere.
///
/// # Panics
/// When a slice is too short for the sizes.
pub(crate) fn matmul_t_bf16_rows_to_bf16(dst: &mut [u16], a: Bf16Rows, w: &[bf16], (m, n, k): (usize, usize, usize), tasks: usize) -> bool {
    if !super::amx::available() || m == 0 || k == 0 || k > DEPTH || k % 32 != 0 || n == 0 || n % 16 != 0 {
        return false;
    }
    assert!(a.holds(m, k) && w.len() >= n * k && dst.len() >= m * n, "product of [{m}, {k}] by [{n}, {k}]");
    let mut packed = Vec::new();
    pack_pairs_bf16(a, (m, k), 0, k, &mut packed);
    let dst = Dst16 { at: dst.as_mut_ptr(), stride: n };
    // Blocks of whole tiles of 16 (`column_block` gives multiples of 48; `n` is one of 16).
    let block = column_block(n, tasks);
    (0..n.div_ceil(block)).into_par_iter().for_each(|b| {
        let cols = block.min(n - b * block);
        let dst = dst.past_columns(b * block);
        // SAFETY: AMX is available; `k` is whole tiles of 32 steps in one chunk (`steps = k`,
        // `k / 2` pairs packed above); the block's `cols` weight rows (a multiple of 16, so
        // all computed) and columns of `dst` are this task's alone, within the sizes asserted.
        let done = unsafe { super::amx::tiles(dst, &packed, k / 2, &w[b * block * k..(b * block + cols) * k], (m, cols, k), (0, k), false) };
        debug_assert_eq!(done, cols);
    });
    true
}

#[cfg(test)]
mod tests {
    use super::super::pack::pack_pairs;
    use super::*;

    /// Packing bf16 bits, from rows or from their transpose, gives the pairs packing the same
    /// values as f32 gives (odd depths, partial panels, a second depth chunk).
    #[test]
    fn bf16_rows_pack_as_their_f32_values() {
        if !bf16_products_available() {
            return eprintln!("no AVX512_BF16 here: f32 packing is the only one");
        }
        for (m, k) in [(1, 1), (5, 3), (33, 70), (70, 1031), (64, 2048), (300, 40)] {
            let bits: Vec<u16> = (0..m * k).map(|i| bf16::from_f32((i as f32 * 0.37).sin()).to_bits()).collect();
            let values: Vec<f32> = bits.iter().map(|&b| bf16::from_bits(b).to_f32()).collect();
            let mut t = vec![0u16; m * k];
            for r in 0..m {
                for s in 0..k {
                    t[s * m + r] = bits[r * k + s];
                }
            }
            for k0 in (0..k).step_by(DEPTH) {
                let depth = DEPTH.min(k - k0);
                let (mut want, mut rows, mut cols) = (Vec::new(), Vec::new(), Vec::new());
                pack_pairs(&values, k, m, k0, depth, &mut want);
                pack_pairs_bf16(Bf16Rows::Rows(&bits, k), (m, k), k0, depth, &mut rows);
                pack_pairs_bf16(Bf16Rows::Columns(&t, m), (m, k), k0, depth, &mut cols);
                assert!(want == rows && want == cols, "[{m}, {k}] from {k0}");
            }
        }
    }

    /// The bf16 output is the f32 product's sums rounded, bit for bit, from rows or columns;
    /// shapes past one depth chunk or with columns past whole tiles are refused (false).
    #[test]
    fn bf16_output_is_the_f32_output_rounded() {
        if !super::super::amx::available() {
            return eprintln!("no AMX here: the bf16 output is never taken");
        }
        let value = |i: usize| ((i * 7919 % 1009) as f32 / 1009.0) - 0.5;
        for (m, n, k) in [(1, 16, 32), (33, 48, 64), (70, 160, 1024), (300, 112, 96)] {
            let bits: Vec<u16> = (0..m * k).map(|i| bf16::from_f32(value(i)).to_bits()).collect();
            let t: Vec<u16> = (0..k * m).map(|i| bits[(i % m) * k + i / m]).collect();
            let mut w: Vec<bf16> = (0..n * k).map(|i| bf16::from_f32(value(i + 5))).collect();
            // A NaN weight: its column's sums are NaN, kept NaN in bf16.
            w[3 * k] = bf16::NAN;
            for a in [Bf16Rows::Rows(&bits, k), Bf16Rows::Columns(&t, m)] {
                let mut sums = vec![0f32; m * n];
                assert!(matmul_t_bf16_rows(&mut sums, a, &w, (m, n, k), false, 2));
                assert!(sums[3].is_nan(), "the NaN weight's column");
                let want: Vec<u16> = sums.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
                let mut got = vec![0u16; m * n];
                assert!(matmul_t_bf16_rows_to_bf16(&mut got, a, &w, (m, n, k), 2), "[{m}, {n}, {k}]");
                assert!(got == want, "[{m}, {n}, {k}] {a:?}");
            }
        }
        let mut out = vec![0u16; 64 * 64];
        let a = vec![0u16; 64 * 2048];
        assert!(!matmul_t_bf16_rows_to_bf16(&mut out, Bf16Rows::Rows(&a, 1056), &vec![bf16::ZERO; 16 * 1056], (2, 16, 1056), 2));
        assert!(!matmul_t_bf16_rows_to_bf16(&mut out, Bf16Rows::Rows(&a, 64), &vec![bf16::ZERO; 20 * 64], (2, 20, 64), 2));
    }
}
