//! Packing a block of the activations for the tiles: rows side by side per step of `k` (f32),
//! or pairs of neighbouring steps rounded to bf16, sixteen rows at a time through a register
//! transpose.

use super::PANEL;
use half::bf16;

/// Packs columns `k0..k0 + depth` of the `m` rows of `a` into panels of [`PANEL`] rows, each
/// step of `k` holding the panel's rows side by side (rows past `m` are zero).
pub(super) fn pack(a: &[f32], a_stride: usize, m: usize, k0: usize, depth: usize, packed: &mut Vec<f32>) {
    let panels = m.div_ceil(PANEL);
    // Every value is written below, so a buffer from an earlier call needs no clearing.
    packed.resize(panels * PANEL * depth, 0.0);
    for (p, panel) in packed[..panels * PANEL * depth]
        .chunks_exact_mut(PANEL * depth)
        .enumerate()
    {
        let rows = PANEL.min(m - p * PANEL);
        let row = |r: usize| &a[(p * PANEL + r.min(rows - 1)) * a_stride + k0..][..depth];
        let whole = depth - depth % 16;
        for half in 0..PANEL / 16 {
            let live = rows.saturating_sub(half * 16).min(16);
            let src: [&[f32]; 16] = std::array::from_fn(|r| row(half * 16 + r));
            // SAFETY: `available()` holds (checked by `matmul_t`); every source row holds
            // `depth` values and the panel `depth · PANEL`.
            unsafe { pack_half(&src, live, whole, &mut panel[half * 16..]) };
        }
        for step in whole..depth {
            for r in 0..PANEL {
                panel[step * PANEL + r] = if r < rows { row(r)[step] } else { 0.0 };
            }
        }
    }
}

/// Steps `0..whole` (a multiple of 16) of sixteen rows into `dst[step · PANEL..][..16]`, sixteen
/// steps at a time through a register transpose; lanes of rows `live..` are zero.
///
/// # Safety
/// The CPU must have AVX-512F; every row of `src` holds `whole` values and `dst`
/// `(whole − 1) · PANEL + 16`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pack_half(src: &[&[f32]; 16], live: usize, whole: usize, dst: &mut [f32]) {
    use std::arch::x86_64::*;
    debug_assert!(whole == 0 || dst.len() >= (whole - 1) * PANEL + 16);
    for s0 in (0..whole).step_by(16) {
        // SAFETY: `s0 + 16 <= whole`, within every source row and `dst` (see above).
        unsafe {
            let mut v: [__m512; 16] = std::array::from_fn(|r| {
                if r < live {
                    _mm512_loadu_ps(src[r].as_ptr().add(s0))
                } else {
                    _mm512_setzero_ps()
                }
            });
            transpose16(&mut v);
            for (s, v) in v.iter().enumerate() {
                _mm512_storeu_ps(dst.as_mut_ptr().add((s0 + s) * PANEL), *v);
            }
        }
    }
}

/// [`pack`] in bf16: columns `k0..k0 + depth` of the `m` rows of `a` rounded to bf16 (to nearest,
/// ties to even), each panel step holding a pair of neighbouring columns (the earlier in the low
/// half) for each of the panel's [`PANEL`] rows; an odd last column is paired with zero, and rows
/// past `m` are zero.
pub(super) fn pack_pairs(a: &[f32], a_stride: usize, m: usize, k0: usize, depth: usize, packed: &mut Vec<u32>) {
    let panels = m.div_ceil(PANEL);
    let pairs = depth.div_ceil(2);
    packed.resize(panels * PANEL * pairs, 0);
    for (p, panel) in packed[..panels * PANEL * pairs]
        .chunks_exact_mut(PANEL * pairs)
        .enumerate()
    {
        let rows = PANEL.min(m - p * PANEL);
        let row = |r: usize| &a[(p * PANEL + r.min(rows - 1)) * a_stride + k0..][..depth];
        // Sixteen pairs (32 columns) at a time through the registers, the rest one by one.
        let whole = depth / 32 * 16;
        for half in 0..PANEL / 16 {
            let live = rows.saturating_sub(half * 16).min(16);
            let src: [&[f32]; 16] = std::array::from_fn(|r| row(half * 16 + r));
            // SAFETY: the weight is `Bf16Products` (checked by `matmul_t`), made only where AVX512_BF16 is; every source row holds
            // `depth ≥ 2 · whole` values and the panel `pairs · PANEL`.
            unsafe { pack_pairs_half(&src, live, whole, &mut panel[half * 16..]) };
        }
        let to_bits = |v: f32| u32::from(bf16::from_f32(v).to_bits());
        for step in whole..pairs {
            for r in 0..PANEL {
                panel[step * PANEL + r] = if r < rows {
                    let x = row(r);
                    let high = x.get(2 * step + 1).map_or(0, |&v| to_bits(v));
                    to_bits(x[2 * step]) | high << 16
                } else {
                    0
                };
            }
        }
    }
}

/// Pairs `0..whole` (a multiple of 16) of sixteen rows into `dst[step · PANEL..][..16]`: each
/// row's 32 columns rounded to bf16 in one instruction, then sixteen rows' pairs transposed.
///
/// # Safety
/// The CPU must have AVX-512F and AVX512_BF16; every row of `src` holds `2 · whole` values and
/// `dst` `(whole − 1) · PANEL + 16`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn pack_pairs_half(src: &[&[f32]; 16], live: usize, whole: usize, dst: &mut [u32]) {
    use std::arch::x86_64::*;
    debug_assert!(whole == 0 || dst.len() >= (whole - 1) * PANEL + 16);
    for s0 in (0..whole).step_by(16) {
        // SAFETY: columns `2 · s0 .. 2 · s0 + 32` lie within every source row, and steps
        // `s0 .. s0 + 16` within `dst` (see above).
        unsafe {
            let mut v: [__m512; 16] = std::array::from_fn(|r| {
                if r < live {
                    let at = src[r].as_ptr().add(2 * s0);
                    let pairs = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(at.add(16)), _mm512_loadu_ps(at));
                    std::mem::transmute::<__m512bh, __m512>(pairs)
                } else {
                    _mm512_setzero_ps()
                }
            });
            transpose16(&mut v);
            for (s, v) in v.iter().enumerate() {
                _mm512_storeu_ps(dst.as_mut_ptr().add((s0 + s) * PANEL).cast(), *v);
            }
        }
    }
}

/// Transposes the 16 × 16 matrix whose rows are `v`'s vectors.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) fn transpose16(v: &mut [std::arch::x86_64::__m512; 16]) {
    use std::arch::x86_64::*;
    // Interleave pairs of rows (32-bit), then pairs of pairs (64-bit): each 128-bit lane of
    // `q[4g + j]` holds rows 4g..4g + 4 of columns j, j + 4, j + 8, j + 12.
    let t: [__m512; 16] = std::array::from_fn(|i| {
        let (a, b) = (v[i / 2 * 2], v[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_ps(a, b)
        } else {
            _mm512_unpackhi_ps(a, b)
        }
    });
    let q: [__m512; 16] = std::array::from_fn(|i| {
        let (g, j) = (i / 4, i % 4);
        let (a, b) = (
            _mm512_castps_pd(t[4 * g + j / 2]),
            _mm512_castps_pd(t[4 * g + 2 + j / 2]),
        );
        _mm512_castpd_ps(if j % 2 == 0 {
            _mm512_unpacklo_pd(a, b)
        } else {
            _mm512_unpackhi_pd(a, b)
        })
    });
    // Then gather the 128-bit lanes: column j + 4h from lanes h of the four row groups.
    for j in 0..4 {
        let even = [
            _mm512_shuffle_f32x4::<0x88>(q[j], q[4 + j]),
            _mm512_shuffle_f32x4::<0x88>(q[8 + j], q[12 + j]),
        ];
        let odd = [
            _mm512_shuffle_f32x4::<0xdd>(q[j], q[4 + j]),
            _mm512_shuffle_f32x4::<0xdd>(q[8 + j], q[12 + j]),
        ];
        v[j] = _mm512_shuffle_f32x4::<0x88>(even[0], even[1]);
        v[j + 8] = _mm512_shuffle_f32x4::<0xdd>(even[0], even[1]);
        v[j + 4] = _mm512_shuffle_f32x4::<0x88>(odd[0], odd[1]);
        v[j + 12] = _mm512_shuffle_f32x4::<0xdd>(odd[0], odd[1]);
    }
}

/// Never called: [`bf16_products_available`] is false off x86-64.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn pack_pairs_half(_: &[&[f32]; 16], _: usize, _: usize, _: &mut [u32]) {
    unreachable!("no `Bf16Products` weight exists off x86-64")
}

/// Never called: [`available`] is false off x86-64.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn pack_half(_: &[&[f32]; 16], _: usize, _: usize, _: &mut [f32]) {
    unreachable!("sgemm::available() is false off x86-64")
}
