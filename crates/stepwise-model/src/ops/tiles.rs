//! Register-tiled attention products for four queries at a time.
//!
//! A single query row reads every key once per dot product and keeps its scores in memory, so
//! each multiply-add costs about two loads and a store. Four query rows against sixteen keys (or
//! sixteen value columns) keep eight vector accumulators in registers instead: per step two loads
//! of keys (values) and four broadcasts feed eight multiply-adds.

/// Query rows per tile.
pub const TILE_ROWS: usize = 4;
/// Keys (or value columns) per tile: two AVX registers.
pub const TILE_WIDTH: usize = 16;

/// `scores[r][j] = Σ_c q[r][c] · kt[c][j]` for the tile's rows `r < TILE_ROWS` and keys
/// `j < n` (`n` a multiple of [`TILE_WIDTH`]). `q[r]` holds the row's `d` (already scaled)
/// components; `kt` is the keys transposed, `d` rows of `stride ≥ n` values; `scores` holds
/// `TILE_ROWS` rows of `n`.
#[inline(always)]
pub fn scores<const FMA: bool>(q: [&[f32]; TILE_ROWS], kt: &[f32], stride: usize, n: usize, scores: &mut [f32]) {
    let d = q[0].len();
    assert!(n.is_multiple_of(TILE_WIDTH) && scores.len() >= TILE_ROWS * n && kt.len() >= (d - 1) * stride + n);
    #[cfg(target_arch = "x86_64")]
    if FMA {
        // SAFETY: `FMA` builds run only where `simd::dispatch` found AVX2 and FMA; the bounds are
        // checked above.
        return unsafe { scores_avx2(q, kt, stride, n, scores) };
    }
    for (r, q) in q.iter().enumerate() {
        let row = &mut scores[r * n..][..n];
        row.fill(0.0);
        for (c, &qc) in q.iter().enumerate() {
            for (s, &k) in row.iter_mut().zip(&kt[c * stride..][..n]) {
                *s += qc * k;
            }
        }
    }
}

/// # Safety
/// AVX2 + FMA, and the bounds [`scores`] checks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)] // component c of four query rows at once
unsafe fn scores_avx2(q: [&[f32]; TILE_ROWS], kt: &[f32], stride: usize, n: usize, scores: &mut [f32]) {
    use std::arch::x86_64::*;
    let d = q[0].len();
    for j in (0..n).step_by(TILE_WIDTH) {
        let mut acc = [_mm256_setzero_ps(); 2 * TILE_ROWS];
        for c in 0..d {
            // SAFETY: kt holds d rows of `stride ≥ n` values, and j + 16 ≤ n.
            let (k0, k1) = unsafe {
                let p = kt.as_ptr().add(c * stride + j);
                (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
            };
            for r in 0..TILE_ROWS {
                let qv = _mm256_set1_ps(q[r][c]);
                acc[2 * r] = _mm256_fmadd_ps(qv, k0, acc[2 * r]);
                acc[2 * r + 1] = _mm256_fmadd_ps(qv, k1, acc[2 * r + 1]);
            }
        }
        for r in 0..TILE_ROWS {
            // SAFETY: scores holds TILE_ROWS rows of n ≥ j + 16 values.
            unsafe {
                let p = scores.as_mut_ptr().add(r * n + j);
                _mm256_storeu_ps(p, acc[2 * r]);
                _mm256_storeu_ps(p.add(8), acc[2 * r + 1]);
            }
        }
    }
}

/// `y[r][c] = Σ_j p[r][j] · v[j][c]` for the tile's rows and keys `j < n`: `p` holds
/// `TILE_ROWS` rows of `p_stride ≥ n` weights, value row `j` starts at `v[j * v_stride]`, and
/// `y[r]` receives `d` columns.
#[inline(always)]
pub fn weighted_values<const FMA: bool>(
    p: &[f32],
    p_stride: usize,
    v: &[f32],
    v_stride: usize,
    n: usize,
    y: [&mut [f32]; TILE_ROWS],
) {
    let d = y[0].len();
    assert!(n == 0 || (p.len() >= (TILE_ROWS - 1) * p_stride + n && v.len() >= (n - 1) * v_stride + d));
    #[cfg(target_arch = "x86_64")]
    if FMA && d.is_multiple_of(TILE_WIDTH) {
        // SAFETY: as in `scores`.
        return unsafe { weighted_values_avx2(p, p_stride, v, v_stride, n, y) };
    }
    for (r, y) in y.into_iter().enumerate() {
        y.fill(0.0);
        for j in 0..n {
            let pj = p[r * p_stride + j];
            for (yc, &vc) in y.iter_mut().zip(&v[j * v_stride..][..d]) {
                *yc += pj * vc;
            }
        }
    }
}

/// # Safety
/// AVX2 + FMA, `d` a multiple of 16, and the bounds [`weighted_values`] checks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn weighted_values_avx2(
    p: &[f32],
    p_stride: usize,
    v: &[f32],
    v_stride: usize,
    n: usize,
    mut y: [&mut [f32]; TILE_ROWS],
) {
    use std::arch::x86_64::*;
    let d = y[0].len();
    for c in (0..d).step_by(TILE_WIDTH) {
        let mut acc = [_mm256_setzero_ps(); 2 * TILE_ROWS];
        for j in 0..n {
            // SAFETY: value row j has d ≥ c + 16 columns; p has TILE_ROWS rows of ≥ n weights.
            unsafe {
                let vp = v.as_ptr().add(j * v_stride + c);
                let (v0, v1) = (_mm256_loadu_ps(vp), _mm256_loadu_ps(vp.add(8)));
                for r in 0..TILE_ROWS {
                    let pv = _mm256_broadcast_ss(&*p.as_ptr().add(r * p_stride + j));
                    acc[2 * r] = _mm256_fmadd_ps(pv, v0, acc[2 * r]);
                    acc[2 * r + 1] = _mm256_fmadd_ps(pv, v1, acc[2 * r + 1]);
                }
            }
        }
        for (r, yr) in y.iter_mut().enumerate() {
            // SAFETY: yr has d ≥ c + 16 values.
            unsafe {
                let p = yr.as_mut_ptr().add(c);
                _mm256_storeu_ps(p, acc[2 * r]);
                _mm256_storeu_ps(p.add(8), acc[2 * r + 1]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::simd::{dispatch, Kernel};

    fn data(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 31) % 97) as f32 / 48.0 - 1.0)
            .collect()
    }

    /// Both builds of both products against plain sums.
    struct Check {
        d: usize,
    }

    impl Kernel for Check {
        fn run<const FMA: bool>(self) {
            let (d, n, stride) = (self.d, 32, 40);
            let qs: Vec<Vec<f32>> = (0..TILE_ROWS).map(|r| data(d, r)).collect();
            let kt = data(d * stride, 9);
            let mut s = vec![0f32; TILE_ROWS * n];
            scores::<FMA>([&qs[0], &qs[1], &qs[2], &qs[3]], &kt, stride, n, &mut s);
            for r in 0..TILE_ROWS {
                for j in 0..n {
                    let want: f32 = (0..d).map(|c| qs[r][c] * kt[c * stride + j]).sum();
                    assert!((s[r * n + j] - want).abs() < 1e-4, "scores d {d}");
                }
            }
            let (keys, v_stride) = (13, d + 3);
            let v = data(keys * v_stride, 5);
            let mut ys = vec![vec![0f32; d]; TILE_ROWS];
            let [a, b, c, e] = &mut ys[..] else { unreachable!() };
            weighted_values::<FMA>(&s, n, &v, v_stride, keys, [a, b, c, e]);
            for (r, y) in ys.iter().enumerate() {
                for (c, &got) in y.iter().enumerate() {
                    let want: f32 = (0..keys).map(|j| s[r * n + j] * v[j * v_stride + c]).sum();
                    assert!((got - want).abs() < 1e-3 * want.abs().max(1.0), "values d {d}");
                }
            }
        }
    }

    #[test]
    fn tiles_match_plain_sums() {
        for d in [16, 32, 12, 64] {
            Check { d }.run::<false>();
            dispatch(Check { d });
        }
    }
}
