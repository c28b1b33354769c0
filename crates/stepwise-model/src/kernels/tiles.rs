//! Register-tiled attention products for four queries at a time.
//!
//! A single query row reads every key once per dot product and keeps its scores in memory, so
//! each multiply-add costs about two loads and a store. Four query rows against two vectors of
//! keys (or of value columns) keep eight vector accumulators in registers instead: per step two
//! loads of keys (values) and four broadcasts feed eight multiply-adds. AVX-512 CPUs run the
//! same tiles on 16-lane vectors, AVX2 CPUs on 8-lane ones.

/// Query rows per tile.
pub const TILE_ROWS: usize = 4;
/// Keys per tile (two AVX-512 registers); score rows are padded to a multiple of it.
pub const TILE_WIDTH: usize = 32;
/// Value columns per tile of the AVX2 build (two AVX registers); head sizes that are not a
/// multiple of it take the portable loop.
const VALUE_WIDTH: usize = 16;

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
        // SAFETY: `FMA` builds run only where `simd::dispatch` found AVX2 and FMA (and the
        // AVX-512 build where it found AVX-512F); the bounds are checked above.
        return unsafe {
            if super::simd::has_avx512() {
                scores_avx512(q, kt, stride, n, scores)
            } else {
                scores_avx2(q, kt, stride, n, scores)
            }
        };
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

/// Defines a score tile for one vector width: `$lanes` f32 per register, two registers of keys
/// per row, with that width's zero, load, broadcast, multiply-add and store.
macro_rules! scores_tile {
    ($(#[$doc:meta])* $name:ident, $feature:literal, $lanes:literal, $zero:ident, $load:ident, $set1:ident, $fmadd:ident, $store:ident) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feature)]
        #[allow(clippy::needless_range_loop)] // component c of four query rows at once
        unsafe fn $name(q: [&[f32]; TILE_ROWS], kt: &[f32], stride: usize, n: usize, scores: &mut [f32]) {
            use std::arch::x86_64::*;
            let d = q[0].len();
            for j in (0..n).step_by(2 * $lanes) {
                let mut acc = [$zero(); 2 * TILE_ROWS];
                for c in 0..d {
                    // SAFETY: kt holds d rows of `stride ≥ n` values, and j + 2 · lanes ≤ n.
                    let (k0, k1) = unsafe {
                        let p = kt.as_ptr().add(c * stride + j);
                        ($load(p), $load(p.add($lanes)))
                    };
                    for r in 0..TILE_ROWS {
                        let qv = $set1(q[r][c]);
                        acc[2 * r] = $fmadd(qv, k0, acc[2 * r]);
                        acc[2 * r + 1] = $fmadd(qv, k1, acc[2 * r + 1]);
                    }
                }
                for r in 0..TILE_ROWS {
                    // SAFETY: scores holds TILE_ROWS rows of n ≥ j + 2 · lanes values.
                    unsafe {
                        let p = scores.as_mut_ptr().add(r * n + j);
                        $store(p, acc[2 * r]);
                        $store(p.add($lanes), acc[2 * r + 1]);
                    }
                }
            }
        }
    };
}

scores_tile!(
    /// [`scores`] on 8-lane vectors: four rows × 16 keys per tile.
    ///
    /// # Safety
    /// AVX2 + FMA, and the bounds [`scores`] checks.
    scores_avx2, "avx2,fma", 8, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_storeu_ps
);

scores_tile!(
    /// [`scores`] on 16-lane vectors: four rows × 32 keys per tile.
    ///
    /// # Safety
    /// AVX-512F, and the bounds [`scores`] checks.
    scores_avx512, "avx512f", 16, _mm512_setzero_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_storeu_ps
);

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
    assert!(y.iter().all(|yr| yr.len() == d));
    #[cfg(target_arch = "x86_64")]
    if FMA && d.is_multiple_of(VALUE_WIDTH) {
        // SAFETY: as in `scores`.
        return unsafe {
            if super::simd::has_avx512() {
                weighted_values_avx512(p, p_stride, v, v_stride, n, y)
            } else {
                weighted_values_avx2(p, p_stride, v, v_stride, n, y)
            }
        };
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
    for c in (0..d).step_by(VALUE_WIDTH) {
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

/// [`weighted_values_avx2`] on 16-lane vectors: sixteen columns per pass, keys taken two at a
/// time into separate accumulators.
///
/// # Safety
/// AVX-512F, `d` a multiple of 16, and the bounds [`weighted_values`] checks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn weighted_values_avx512(
    p: &[f32],
    p_stride: usize,
    v: &[f32],
    v_stride: usize,
    n: usize,
    mut y: [&mut [f32]; TILE_ROWS],
) {
    use std::arch::x86_64::*;
    let d = y[0].len();
    for c in (0..d).step_by(16) {
        let mut acc = [_mm512_setzero_ps(); 2 * TILE_ROWS];
        // SAFETY (whole loop): value rows j < n have d ≥ c + 16 columns; p has TILE_ROWS rows
        // of ≥ n weights.
        let mut j = 0;
        while j + 2 <= n {
            unsafe {
                let vp = v.as_ptr().add(j * v_stride + c);
                let (v0, v1) = (_mm512_loadu_ps(vp), _mm512_loadu_ps(vp.add(v_stride)));
                for r in 0..TILE_ROWS {
                    let pr = p.as_ptr().add(r * p_stride + j);
                    acc[2 * r] = _mm512_fmadd_ps(_mm512_set1_ps(*pr), v0, acc[2 * r]);
                    acc[2 * r + 1] = _mm512_fmadd_ps(_mm512_set1_ps(*pr.add(1)), v1, acc[2 * r + 1]);
                }
            }
            j += 2;
        }
        if j < n {
            unsafe {
                let v0 = _mm512_loadu_ps(v.as_ptr().add(j * v_stride + c));
                for r in 0..TILE_ROWS {
                    let pr = _mm512_set1_ps(*p.as_ptr().add(r * p_stride + j));
                    acc[2 * r] = _mm512_fmadd_ps(pr, v0, acc[2 * r]);
                }
            }
        }
        for (r, yr) in y.iter_mut().enumerate() {
            // SAFETY: yr has d ≥ c + 16 values.
            unsafe { _mm512_storeu_ps(yr.as_mut_ptr().add(c), _mm512_add_ps(acc[2 * r], acc[2 * r + 1])) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 31) % 97) as f32 / 48.0 - 1.0)
            .collect()
    }

    type ScoresFn = fn([&[f32]; TILE_ROWS], &[f32], usize, usize, &mut [f32]);
    type ValuesFn = fn(&[f32], usize, &[f32], usize, usize, [&mut [f32]; TILE_ROWS]);

    /// Every build this CPU can run: the portable loops, AVX2, AVX-512.
    fn builds() -> Vec<(&'static str, ScoresFn, ValuesFn)> {
        let mut all: Vec<(&'static str, ScoresFn, ValuesFn)> =
            vec![("portable", scores::<false>, weighted_values::<false>)];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                // SAFETY (both): the CPU has AVX2 and FMA.
                all.push((
                    "avx2",
                    |q, kt, s, n, out| unsafe { scores_avx2(q, kt, s, n, out) },
                    |p, ps, v, vs, n, y| unsafe { weighted_values_avx2(p, ps, v, vs, n, y) },
                ));
            }
            if is_x86_feature_detected!("avx512f") {
                // SAFETY (both): the CPU has AVX-512F.
                all.push((
                    "avx512",
                    |q, kt, s, n, out| unsafe { scores_avx512(q, kt, s, n, out) },
                    |p, ps, v, vs, n, y| unsafe { weighted_values_avx512(p, ps, v, vs, n, y) },
                ));
            }
        }
        all
    }

    #[test]
    fn tiles_match_plain_sums() {
        for (name, scores_fn, values_fn) in builds() {
            // Head sizes on the vector path (16, 32, 64) and off it (12, portable values).
            for d in [16, 32, 64, 12] {
                let (n, stride) = (2 * TILE_WIDTH, 2 * TILE_WIDTH + 8);
                let qs: Vec<Vec<f32>> = (0..TILE_ROWS).map(|r| data(d, r)).collect();
                let kt = data(d * stride, 9);
                let mut s = vec![0f32; TILE_ROWS * n];
                scores_fn(std::array::from_fn(|r| qs[r].as_slice()), &kt, stride, n, &mut s);
                for r in 0..TILE_ROWS {
                    for j in 0..n {
                        let want: f32 = (0..d).map(|c| qs[r][c] * kt[c * stride + j]).sum();
                        assert!((s[r * n + j] - want).abs() < 1e-4, "{name}: scores, d {d}");
                    }
                }
                if d % VALUE_WIDTH != 0 && name != "portable" {
                    continue;
                }
                for keys in [13, 14, 1] {
                    let v_stride = d + 3;
                    let v = data(keys * v_stride, 5);
                    let mut ys = vec![vec![0f32; d]; TILE_ROWS];
                    let [a, b, c, e] = &mut ys[..] else { unreachable!() };
                    values_fn(&s, n, &v, v_stride, keys, [a, b, c, e]);
                    for (r, y) in ys.iter().enumerate() {
                        for (c, &got) in y.iter().enumerate() {
                            let want: f32 = (0..keys).map(|j| s[r * n + j] * v[j * v_stride + c]).sum();
                            let tol = 1e-4 * want.abs().max(1.0);
                            assert!((got - want).abs() < tol, "{name}: values, d {d}, {keys} keys");
                        }
                    }
                }
            }
        }
    }
}
