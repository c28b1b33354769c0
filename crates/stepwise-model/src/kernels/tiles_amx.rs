//! Attention products for sixteen queries at a time on AMX tiles (see
//! [`crate::kernels::sgemm::amx`]): the bf16 attention's scores and weighted values, read from
//! the layouts the AVX512_BF16 tiles ([`super::tiles`]) already use, which are AMX's. A query's
//! pairs of components are a row of bf16 (the left operand); the keys, `[d / 2, t_pad]` pairs of
//! components, and the values, `[t_pad / 2, d]` pairs of positions, are right operands as they
//! lie. The sums are f32, as the AVX512_BF16 tiles', rounded in the hardware's order.
//!
//! Every function here needs the tiles configured ([`crate::kernels::sgemm::amx::configure`]).

// Off x86-64 only `available` (false) and the stubs are reached.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_macros))]

/// Query rows of a tile.
pub(crate) const QUERIES: usize = 16;
/// Tile rows and 32-bit columns.
const TILE: usize = 16;

/// Loads `$tile` from `$at`, rows `$stride` bytes apart.
macro_rules! load {
    ($tile:literal, $at:expr, $stride:expr) => {
        std::arch::asm!(concat!("tileloadd ", $tile, ", [{a} + {s}*1]"), a = in(reg) $at, s = in(reg) $stride, options(nostack, readonly))
    };
}

/// Stores `$tile` to `$at`, rows `$stride` bytes apart.
macro_rules! store {
    ($tile:literal, $at:expr, $stride:expr) => {
        std::arch::asm!(concat!("tilestored [{a} + {s}*1], ", $tile), a = in(reg) $at, s = in(reg) $stride, options(nostack))
    };
}

/// `$acc += $a · $b`.
macro_rules! dot {
    ($acc:literal, $a:literal, $b:literal) => {
        std::arch::asm!(concat!("tdpbf16ps ", $acc, ", ", $a, ", ", $b), options(nostack, nomem))
    };
}

/// Zeroes tmm0–tmm3.
macro_rules! zero4 {
    () => {
        std::arch::asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem))
    };
}

/// `scores[r][j] = Σ_c q[r][c] · key_j[c]` for the tile's 16 query rows and keys `j < n` (`n`
/// a multiple of 16). `q` holds 16 rows of `d / 2` pairs (the scaled queries in bf16); `keys`
/// `d / 2` rows of `t_pad ≥ n` pairs; `scores` 16 rows of `n`.
///
/// # Safety
/// The tiles are configured; `d` is a multiple of 32 and the slices hold what is said above.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn scores(q: &[u32], keys: &[u32], t_pad: usize, d: usize, n: usize, scores: &mut [f32]) {
    debug_assert!(d.is_multiple_of(32) && n.is_multiple_of(TILE) && n <= t_pad);
    debug_assert!(q.len() >= QUERIES * d / 2 && keys.len() >= d / 2 * t_pad && scores.len() >= QUERIES * n);
    // SAFETY: as this function's: 16 rows of d / 2 query pairs, d / 2 rows of keys `t_pad` apart
    // (n of them read), 16 rows of n scores.
    unsafe { rows_times(Left(q.as_ptr(), d / 2), Right(keys.as_ptr(), t_pad, n), scores.as_mut_ptr()) }
}

/// `y[r][c] = Σ_j weight[r][j] · value_j[c]` for the tile's 16 query rows over `pairs` pairs of
/// keys (a multiple of 16; weights past the row's keys zero). `weights` holds 16 rows of
/// `pairs` pairs; `values` at least `pairs` rows of `d` pairs of positions; `y` 16 rows of `d`.
///
/// # Safety
/// The tiles are configured; `d` is a multiple of 32 and the slices hold what is said above.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn weighted_values(weights: &[u32], pairs: usize, values: &[u32], d: usize, y: &mut [f32]) {
    debug_assert!(d.is_multiple_of(32) && pairs.is_multiple_of(TILE));
    debug_assert!(weights.len() >= QUERIES * pairs && values.len() >= pairs * d && y.len() >= QUERIES * d);
    // SAFETY: as this function's: 16 rows of `pairs` weight pairs, `pairs` rows of d value
    // pairs, 16 rows of d outputs.
    unsafe { rows_times(Left(weights.as_ptr(), pairs), Right(values.as_ptr(), d, d), y.as_mut_ptr()) }
}

/// A left operand: 16 rows of `.1` pairs of bf16, one after the other.
struct Left(*const u32, usize);

/// A right operand: rows of pairs (one a pair of the left's), `.1` pairs apart, of which the
/// first `.2` (a multiple of 16) are read.
struct Right(*const u32, usize, usize);

/// `out[r][j] = Σ_p left[r][p] · right[p][j]` (each term a pair's two products) for the 16 rows
/// and the right's `cols` columns, into 16 rows of `cols` f32 from `out`.
///
/// # Safety
/// The tiles are configured; the left's pairs are a multiple of 16; the operands and `out` hold
/// what is said above.
#[cfg(target_arch = "x86_64")]
unsafe fn rows_times(Left(left, inner): Left, Right(right, right_stride, cols): Right, out: *mut f32) {
    let (l_stride, r_stride, o_stride) = (inner * 4, right_stride * 4, cols * 4);
    // SAFETY (all below): every tile read lies within the left (16 rows, pairs `p..p + 16` <
    // inner), the right (rows `p..p + 16`, columns below `cols`) and `out` (16 rows of `cols`).
    unsafe {
        let mut j0 = 0;
        // Four tiles of columns at a time, sharing each load of the left.
        while j0 + 4 * TILE <= cols {
            zero4!();
            for p in (0..inner).step_by(TILE) {
                let r = right.add(p * right_stride + j0);
                load!("tmm4", left.add(p), l_stride);
                load!("tmm5", r, r_stride);
                dot!("tmm0", "tmm4", "tmm5");
                load!("tmm6", r.add(TILE), r_stride);
                dot!("tmm1", "tmm4", "tmm6");
                load!("tmm7", r.add(2 * TILE), r_stride);
                dot!("tmm2", "tmm4", "tmm7");
                load!("tmm5", r.add(3 * TILE), r_stride);
                dot!("tmm3", "tmm4", "tmm5");
            }
            store!("tmm0", out.add(j0), o_stride);
            store!("tmm1", out.add(j0 + TILE), o_stride);
            store!("tmm2", out.add(j0 + 2 * TILE), o_stride);
            store!("tmm3", out.add(j0 + 3 * TILE), o_stride);
            j0 += 4 * TILE;
        }
        while j0 < cols {
            std::arch::asm!("tilezero tmm0", options(nostack, nomem));
            for p in (0..inner).step_by(TILE) {
                load!("tmm4", left.add(p), l_stride);
                load!("tmm5", right.add(p * right_stride + j0), r_stride);
                dot!("tmm0", "tmm4", "tmm5");
            }
            store!("tmm0", out.add(j0), o_stride);
            j0 += TILE;
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::kernels::sgemm::amx;
    use half::bf16;

    fn pair(lo: f32, hi: f32) -> u32 {
        u32::from(bf16::from_f32(lo).to_bits()) | u32::from(bf16::from_f32(hi).to_bits()) << 16
    }

    /// Scores and weighted values against exact sums of the same bf16 values, for heads of 32,
    /// 64 and 128 and key counts that leave a single tile after groups of four.
    #[test]
    fn tiles_sum_the_bf16_products() {
        if !amx::available() {
            eprintln!("no AMX here: its attention tiles untested");
            return;
        }
        let value = |i: usize| ((i * 7919 % 1013) as f32 / 1013.0) - 0.5;
        let round = |v: f32| bf16::from_f32(v).to_f32() as f64;
        for d in [32, 64, 128] {
            // Keys: one group of four tiles and two tiles, two tiles, four.
            for (n, t_pad) in [(96, 128), (32, 32), (64, 64)] {
                let q: Vec<f32> = (0..QUERIES * d).map(value).collect();
                let key = |j: usize, c: usize| value(100_000 + j * d + c);
                let q_pairs: Vec<u32> = q.chunks_exact(2).map(|p| pair(p[0], p[1])).collect();
                let keys: Vec<u32> = (0..d / 2 * t_pad)
                    .map(|i| (i / t_pad, i % t_pad))
                    .map(|(c, j)| pair(key(j, 2 * c), key(j, 2 * c + 1)))
                    .collect();
                let mut s = vec![0f32; QUERIES * n];
                let pairs = n / 2;
                let weight = |r: usize, j: usize| value(7 * r + 3 * j + 1);
                let weights: Vec<u32> = (0..QUERIES * pairs)
                    .map(|i| (i / pairs, i % pairs))
                    .map(|(r, p)| pair(weight(r, 2 * p), weight(r, 2 * p + 1)))
                    .collect();
                let val = |j: usize, c: usize| value(50_000 + j * d + c);
                let values: Vec<u32> = (0..pairs * d).map(|i| pair(val(2 * (i / d), i % d), val(2 * (i / d) + 1, i % d))).collect();
                let mut y = vec![0f32; QUERIES * d];
                // SAFETY: AMX is here; the tiles are configured before and released after; the
                // sizes are the functions'.
                unsafe {
                    amx::configure();
                    scores(&q_pairs, &keys, t_pad, d, n, &mut s);
                    weighted_values(&weights, pairs, &values, d, &mut y);
                    amx::release();
                }
                for r in 0..QUERIES {
                    for j in 0..n {
                        let want: f64 = (0..d).map(|c| round(q[r * d + c]) * round(key(j, c))).sum();
                        assert!((s[r * n + j] as f64 - want).abs() < 1e-4, "scores d {d} n {n} ({r}, {j})");
                    }
                    for c in 0..d {
                        let want: f64 = (0..n).map(|j| round(weight(r, j)) * round(val(j, c))).sum();
                        assert!((y[r * d + c] as f64 - want).abs() < 1e-4 * want.abs().max(1.0), "values d {d} n {n} ({r}, {c})");
                    }
                }
            }
        }
    }
}
