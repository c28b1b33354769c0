//! bf16 products on Intel's AMX tiles (Sapphire Rapids and later Xeons), where the CPU and the
//! kernel allow them: each `tdpbf16ps` multiplies a 16 × 32 block of bf16 by a 32 × 16 one into
//! 16 × 16 f32 sums, 16,384 operations an instruction against 64 for AVX512_BF16's `vdpbf16ps`.
//! On a 2-vCPU Xeon that had both, a loop of them ran at about 3,000 GFLOP/s a core (2,900 and
//! 3,054 in two runs) against 108 (`bench/amx_peak.c`, `bench/bf16_peak.c`).
//!
//! The product is the AVX-512 tiles' `dst (+)= a · wᵀ` with the roles of the operands swapped
//! so that both are read as they already lie: the weight `[n, k]` (16 rows of 32 values of `k`
//! a tile, straight from where the model holds it, rows `2k` bytes apart) is the left operand,
//! and the activations, which [`super::pack::pack_pairs`] already packs as pairs of neighbouring
//! steps of `k` for each of 32 rows side by side (AMX's "VNNI" layout for the right operand),
//! the right. Each result tile is `wᵀ`'s block `[16 weight rows, 16 activation rows]`, written
//! transposed into `dst` through the AVX-512 transpose the other tiles use.
//!
//! A tile sums its 32 values of `k` at a time in the hardware's order, chunk by chunk
//! ([`super::DEPTH`]) into `dst` as the AVX-512 tiles do, so a row's result does not depend on
//! which panel, tile or thread computed it; it differs from the AVX-512 tiles' in f32's rounding
//! of the sums (the products are exact in both). The whole tiles of 32 steps of a chunk (all of
//! it for every Qwen2 and Llama width; a training step's weight gradients, whose depth is the
//! batch's token count, leave up to 31) of the weight's whole 16-row blocks take them; the steps
//! past those are added by the AVX512_BF16 tiles, which take the columns left over too.
//! `STEPWISE_AMX=0` turns them off (to compare).
//!
//! Linux lends a process the tiles' 8 KiB of state only once asked (`arch_prctl` with
//! `ARCH_REQ_XCOMP_PERM`); [`available`] asks once, and says no where the kernel refuses.

// Off x86-64 only `available` (false) and the stubs are reached.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_macros))]

use super::{Dst, Dst16, PANEL};
use half::bf16;

/// Rows (and 32-bit columns) of a tile.
const TILE: usize = 16;
/// Steps of `k` one tile multiplies: 16 pairs.
const STEP: usize = 32;
/// Weight rows a block of tiles covers: two tiles of 16.
const BLOCK: usize = 2 * TILE;
/// Weight rows every panel runs over before the next ones: 256 rows of a 1,024-step chunk are
/// 512 KiB, kept in L2.
const CHUNK: usize = 8 * BLOCK;

/// Whether this process may run AMX bf16 tiles: the CPU has AMX-TILE and AMX-BF16, the kernel
/// lent the tile state, and `STEPWISE_AMX` is not `0`.
pub(crate) fn available() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| std::env::var("STEPWISE_AMX").map_or(true, |v| v.trim() != "0") && supported())
}

/// Whether the CPU and the kernel allow AMX bf16 tiles (asking the kernel for their state).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn supported() -> bool {
    // CPUID leaf 7: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE.
    if !super::super::simd::has_avx512() {
        return false;
    }
    let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
    if edx & (1 << 22) == 0 || edx & (1 << 24) == 0 {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a plain system call with two integer arguments; on success the kernel lends this
    // process's threads the tile state from now on.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn supported() -> bool {
    false
}

/// The steps of a depth chunk of `depth` the AMX tiles take: its whole tiles of 32 (0 where
/// AMX is not available); the rest are the AVX512_BF16 tiles'.
pub(super) fn whole_steps(depth: usize) -> usize {
    match available() {
        true => depth / STEP * STEP,
        false => 0,
    }
}

/// The tile configuration `ldtilecfg` reads: palette 1, eight tiles of 16 rows of 64 bytes.
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    bytes_per_row: [u16; 16],
    rows: [u8; 16],
}

const CONFIG: Config = Config {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    bytes_per_row: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
};

/// The first `steps` steps of the depth chunk from `k0` of `dst (+)= a · wᵀ` for the weight's
/// first `n / 16 · 16` rows (output columns), over the chunk's packed panels `packed`
/// ([`super::pack::pack_pairs`] of `a`'s `m` rows, `pairs` pair steps each); returns how many
/// columns it computed (the rest, and the chunk's steps past `steps`, are the caller's).
///
/// # Safety
/// `steps` is [`whole_steps`] of the chunk's depth, not 0, and at most `2 · pairs`; `packed`
/// holds the chunk's panels; `w` is `[n, k]`; `m` rows of `n` values from `dst.at` are
/// writable (and readable when `add`).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tiles<S: Sink>(
    dst: S,
    packed: &[u32],
    pairs: usize,
    w: &[bf16],
    (m, n, k): (usize, usize, usize),
    (k0, steps): (usize, usize),
    add: bool,
) -> usize {
    let cols = n / TILE * TILE;
    debug_assert!(steps > 0 && steps == whole_steps(steps) && steps <= 2 * pairs && w.len() >= n * k);
    debug_assert!(packed.len() >= m.div_ceil(PANEL) * PANEL * pairs);
    if cols == 0 {
        return 0;
    }
    // SAFETY: AMX is available (`whole_steps` gave `steps`).
    unsafe { configure() };
    let mut sums = Sums([0.0; 4 * TILE * TILE]);
    // A chunk of the weight's rows stays in L2 while every panel runs over it, and a panel's
    // rows of `dst` are written a chunk's width at a time.
    for c0 in (0..cols).step_by(CHUNK) {
        for p in 0..m.div_ceil(PANEL) {
            let rows = PANEL.min(m - p * PANEL);
            let panel = packed[p * PANEL * pairs..].as_ptr();
            for j0 in (c0..cols.min(c0 + CHUNK)).step_by(BLOCK) {
                let two = j0 + BLOCK <= cols;
                let weights = w[j0 * k + k0..].as_ptr();
                // SAFETY: the tiles read `TILE` (or `BLOCK`) weight rows of `steps` values from
                // column `k0` (rows below `cols ≤ n`) and the panel's first `steps / 2` pair steps.
                unsafe {
                    match (two, rows > TILE) {
                        (true, true) => block::<2, 2>(weights, k, panel, steps, &mut sums),
                        (true, false) => block::<2, 1>(weights, k, panel, steps, &mut sums),
                        (false, true) => block::<1, 2>(weights, k, panel, steps, &mut sums),
                        (false, false) => block::<1, 1>(weights, k, panel, steps, &mut sums),
                    }
                }
                for wt in 0..if two { 2 } else { 1 } {
                    for half in 0..rows.div_ceil(TILE) {
                        let (row, col) = (p * PANEL + half * TILE, j0 + wt * TILE);
                        // SAFETY: AVX-512F is here (`supported` checks); row `row` < m and
                        // column `col` < n, the tile's rows below m.
                        unsafe { dst.put(sums.tile(wt, half), (row, col), (rows - half * TILE).min(TILE), add) };
                    }
                }
            }
        }
    }
    // SAFETY: configured above.
    unsafe { release() };
    cols
}

/// Configures this thread's tiles as eight of 16 rows of 64 bytes (what every AMX kernel here
/// runs on), until [`release`].
///
/// # Safety
/// [`available`] holds.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn configure() {
    // SAFETY: AMX is available (the caller's); the configuration is palette 1's.
    unsafe { std::arch::asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly)) };
}

/// Returns this thread's tiles to their initial state.
///
/// # Safety
/// [`available`] holds.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn release() {
    // SAFETY: AMX is available (the caller's); `tilerelease` takes no operands.
    unsafe { std::arch::asm!("tilerelease", options(nostack, nomem)) };
}

/// Never called: [`available`] is false off x86-64.
#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tiles<S: Sink>(_: S, _: &[u32], _: usize, _: &[bf16], _: (usize, usize, usize), _: (usize, usize), _: bool) -> usize {
    unreachable!("AMX exists only on x86-64")
}

/// A block's four result tiles, `[weight tile][activation half][16 weight rows][16 activation
/// rows]`, aligned for the tile store.
#[repr(C, align(64))]
struct Sums([f32; 4 * TILE * TILE]);

impl Sums {
    fn tile(&self, weight_tile: usize, half: usize) -> &[f32; TILE * TILE] {
        let at = (weight_tile * 2 + half) * TILE * TILE;
        self.0[at..at + TILE * TILE].try_into().expect("a whole tile")
    }
}

/// One block: `W` tiles of 16 weight rows (from `weights`, rows `k` values apart) by `A` halves
/// of a panel (16 activation rows each), summed over the chunk's `depth` steps into tmm0–tmm3
/// (weight tile `t`, half `h` in tmm`2t + h`) and stored into `sums`.
///
/// # Safety
/// The tiles are configured ([`CONFIG`]); `W · 16` rows of `depth` values from `weights` and
/// `depth / 2` pair steps of the panel from `panel` are readable.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn block<const W: usize, const A: usize>(weights: *const bf16, k: usize, panel: *const u32, depth: usize, sums: &mut Sums) {
    use std::arch::asm;
    let (w_stride, p_stride) = (2 * k, PANEL * 4);
    // SAFETY (every block below): the tiles are configured; the addresses are within what the
    // caller guarantees readable; tmm registers are never used by compiled code.
    unsafe {
        asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
        for s in 0..depth / STEP {
            let w0 = weights.add(s * STEP);
            let p0 = panel.add(s * TILE * PANEL);
            asm!("tileloadd tmm4, [{w} + {ws}*1]", "tileloadd tmm6, [{p} + {ps}*1]", "tdpbf16ps tmm0, tmm4, tmm6",
                w = in(reg) w0, ws = in(reg) w_stride, p = in(reg) p0, ps = in(reg) p_stride, options(nostack, readonly));
            if A == 2 {
                asm!("tileloadd tmm7, [{p} + {ps}*1]", "tdpbf16ps tmm1, tmm4, tmm7",
                    p = in(reg) p0.add(TILE), ps = in(reg) p_stride, options(nostack, readonly));
            }
            if W == 2 {
                asm!("tileloadd tmm5, [{w} + {ws}*1]", "tdpbf16ps tmm2, tmm5, tmm6",
                    w = in(reg) w0.add(TILE * k), ws = in(reg) w_stride, options(nostack, readonly));
                if A == 2 {
                    asm!("tdpbf16ps tmm3, tmm5, tmm7", options(nostack, nomem));
                }
            }
        }
        let (out, stride) = (sums.0.as_mut_ptr(), 4 * TILE);
        asm!("tilestored [{o} + {s}*1], tmm0", o = in(reg) out, s = in(reg) stride, options(nostack));
        if A == 2 {
            asm!("tilestored [{o} + {s}*1], tmm1", o = in(reg) out.add(TILE * TILE), s = in(reg) stride, options(nostack));
        }
        if W == 2 {
            asm!("tilestored [{o} + {s}*1], tmm2", o = in(reg) out.add(2 * TILE * TILE), s = in(reg) stride, options(nostack));
            if A == 2 {
                asm!("tilestored [{o} + {s}*1], tmm3", o = in(reg) out.add(3 * TILE * TILE), s = in(reg) stride, options(nostack));
            }
        }
    }
}

/// Where [`tiles`] writes its result tiles: an f32 output ([`Dst`], written over or added to) or
/// a bf16 one ([`Dst16`], written over, each sum rounded to the nearest bf16).
pub(super) trait Sink: Copy + Send + Sync {
    /// A result tile (`tile[j][i]`: weight row `j`, activation row `i`) transposed into the
    /// output's rows `row..row + rows` and columns `col..col + 16`.
    ///
    /// # Safety
    /// The CPU has AVX-512F; those rows and columns lie inside the output; `add` only for an
    /// f32 output.
    unsafe fn put(self, tile: &[f32; TILE * TILE], at: (usize, usize), rows: usize, add: bool);
}

impl Sink for Dst {
    unsafe fn put(self, tile: &[f32; TILE * TILE], (row, col): (usize, usize), rows: usize, add: bool) {
        // SAFETY: as the trait's: the window lies inside the output.
        let out = Window { at: unsafe { self.at.add(row * self.stride + col) }, stride: self.stride, rows, add };
        // SAFETY: as the trait's.
        unsafe { store(tile, out) }
    }
}

impl Sink for Dst16 {
    unsafe fn put(self, tile: &[f32; TILE * TILE], (row, col): (usize, usize), rows: usize, add: bool) {
        debug_assert!(!add, "a bf16 output is written, never added to");
        // SAFETY: as the trait's.
        unsafe { store_bf16(tile, self.at.add(row * self.stride + col), self.stride, rows) }
    }
}

/// Where a result tile goes: `rows` rows of 16 values from `at`, `stride` apart, written over
/// or (`add`) added to.
struct Window {
    at: *mut f32,
    stride: usize,
    rows: usize,
    add: bool,
}

/// Writes a result tile (`tile[j][i]`: weight row `j`, activation row `i`) transposed into
/// `out` (row `i`, column `j`).
///
/// # Safety
/// The CPU has AVX-512F; `out.rows` rows of 16 values from `out.at` are writable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn store(tile: &[f32; TILE * TILE], out: Window) {
    use std::arch::x86_64::*;
    // SAFETY: each row of the tile is 16 values within it.
    let mut v: [__m512; TILE] = std::array::from_fn(|j| unsafe { _mm512_loadu_ps(tile.as_ptr().add(j * TILE)) });
    super::pack::transpose16(&mut v);
    for (i, row) in v.iter().enumerate().take(out.rows) {
        // SAFETY: row `i` < `out.rows` of 16 values from `out.at`.
        unsafe {
            let at = out.at.add(i * out.stride);
            let sum = if out.add { _mm512_add_ps(_mm512_loadu_ps(at), *row) } else { *row };
            _mm512_storeu_ps(at, sum);
        }
    }
}

/// [`store`] into bf16 rows (`rows` of 16 values from `at`, `stride` apart): each sum rounded
/// to the nearest bf16, ties to even, NaN kept quiet (as `half::bf16::from_f32` rounds).
///
/// # Safety
/// The CPU has AVX-512F; `rows` rows of 16 values from `at` are writable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn store_bf16(tile: &[f32; TILE * TILE], at: *mut u16, stride: usize, rows: usize) {
    use std::arch::x86_64::*;
    // SAFETY: each row of the tile is 16 values within it.
    let mut v: [__m512; TILE] = std::array::from_fn(|j| unsafe { _mm512_loadu_ps(tile.as_ptr().add(j * TILE)) });
    super::pack::transpose16(&mut v);
    let (one, half_ulp, quiet) = (_mm512_set1_epi32(1), _mm512_set1_epi32(0x7fff), _mm512_set1_epi32(0x40));
    for (i, row) in v.iter().enumerate().take(rows) {
        let bits = _mm512_castps_si512(*row);
        let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), one);
        let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(bits, _mm512_add_epi32(half_ulp, lsb)));
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(*row, *row);
        let kept = _mm512_or_si512(_mm512_srli_epi32::<16>(bits), quiet);
        let out = _mm512_mask_blend_epi32(nan, rounded, kept);
        // SAFETY: row `i` < `rows` of 16 values from `at`.
        unsafe { _mm256_storeu_si256(at.add(i * stride).cast(), _mm512_cvtepi32_epi16(out)) };
    }
}

/// Never called: [`available`] is false off x86-64.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn store(_: &[f32; TILE * TILE], _: Window) {
    unreachable!("no AMX off x86-64")
}

/// Never called: [`available`] is false off x86-64.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn store_bf16(_: &[f32; TILE * TILE], _: *mut u16, _: usize, _: usize) {
    unreachable!("no AMX off x86-64")
}

#[cfg(test)]
mod tests {
    use super::super::{pack::pack_pairs, Dst, DEPTH};
    use super::*;

    /// The AMX tiles alone (no AVX-512 tile after them) against exact sums of the same bf16
    /// values: every whole 16-row block of the weight computed, the columns past it untouched.
    #[test]
    fn tiles_sum_the_bf16_products() {
        if !available() {
            eprintln!("no AMX here: its tiles untested");
            return;
        }
        let value = |i: usize| ((i * 7919 % 1009) as f32 / 1009.0) - 0.5;
        for &(m, n, k) in &[(1, 16, 32), (16, 32, 64), (17, 47, 96), (40, 64, 1024), (33, 20, 2080)] {
            let a: Vec<f32> = (0..m * k).map(value).collect();
            let w: Vec<bf16> = (0..n * k).map(|i| bf16::from_f32(value(i + 3))).collect();
            let rounded: Vec<f32> = a.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
            let start: Vec<f32> = (0..m * n).map(|i| value(i + 11)).collect();
            for add in [false, true] {
                let mut got = start.clone();
                let mut packed = Vec::new();
                for k0 in (0..k).step_by(DEPTH) {
                    let depth = DEPTH.min(k - k0);
                    pack_pairs(&a, k, m, k0, depth, &mut packed);
                    let dst = Dst {
                        at: got.as_mut_ptr(),
                        stride: n,
                    };
                    let (pairs, steps) = (depth / 2, whole_steps(depth));
                    assert_eq!(steps, depth, "whole tiles");
                    // SAFETY: AMX is here; the chunk's panels are packed; `got` is `[m, n]`.
                    let done = unsafe { tiles(dst, &packed, pairs, &w, (m, n, k), (k0, steps), add || k0 > 0) };
                    assert_eq!(done, n / 16 * 16);
                }
                for i in 0..m {
                    for j in 0..n {
                        let (g, s) = (got[i * n + j], start[i * n + j]);
                        if j >= n / 16 * 16 {
                            assert_eq!(g, s, "column {j} past the blocks is left alone");
                            continue;
                        }
                        let exact: f64 = (0..k).map(|p| rounded[i * k + p] as f64 * w[j * k + p].to_f64()).sum();
                        let want = if add { s as f64 + exact } else { exact };
                        assert!((g as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()), "{m}x{n}x{k} add={add} at ({i}, {j}): {g} vs {want}");
                    }
                }
            }
        }
    }
}
