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

/// `dst[i]` = values `2i` and `2i + 1` of `src` rounded to bf16 (to nearest, ties to even), the
/// first in the low half: the operand layout of `vdpbf16ps`. An odd last value is paired with
/// zero.
///
/// # Safety
/// The CPU must have AVX-512F and AVX512_BF16; `dst` holds `⌈src.len() / 2⌉` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
pub unsafe fn to_bf16_pairs(src: &[f32], dst: &mut [u32]) {
    use std::arch::x86_64::*;
    debug_assert!(dst.len() >= src.len().div_ceil(2));
    let whole = src.len() / 32 * 32;
    for i in (0..whole).step_by(32) {
        // SAFETY: values `i..i + 32` lie in `src`, pairs `i / 2..i / 2 + 16` in `dst`.
        unsafe {
            let p = src.as_ptr().add(i);
            let pairs = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(p.add(16)), _mm512_loadu_ps(p));
            _mm512_storeu_si512(
                dst.as_mut_ptr().add(i / 2).cast(),
                std::mem::transmute::<__m512bh, __m512i>(pairs),
            );
        }
    }
    let bits = |v: f32| u32::from(half::bf16::from_f32(v).to_bits());
    for (i, pair) in src[whole..].chunks(2).enumerate() {
        dst[whole / 2 + i] = bits(pair[0]) | pair.get(1).map_or(0, |&v| bits(v)) << 16;
    }
}

/// `dst[c]` = `a[c]` and `b[c]` rounded to bf16, `a`'s in the low half: two rows of values as
/// the pairs [`weighted_values_bf16`] reads (`b` empty: zeros).
///
/// # Safety
/// The CPU must have AVX-512F and AVX512_BF16; `b` is empty or as long as `a`, and `dst` too.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
pub unsafe fn interleave_bf16(a: &[f32], b: &[f32], dst: &mut [u32]) {
    use std::arch::x86_64::*;
    let n = a.len();
    debug_assert!((b.is_empty() || b.len() == n) && dst.len() == n);
    let whole = n / 16 * 16;
    let wide = |v: __m256bh| -> __m512i {
        // SAFETY: both are 32 bytes of plain bits.
        _mm512_cvtepu16_epi32(unsafe { std::mem::transmute::<__m256bh, __m256i>(v) })
    };
    for c in (0..whole).step_by(16) {
        // SAFETY: values `c..c + 16` lie in `a`, `b` (when not empty) and `dst`.
        unsafe {
            let low = wide(_mm512_cvtneps_pbh(_mm512_loadu_ps(a.as_ptr().add(c))));
            let high = if b.is_empty() {
                _mm512_setzero_si512()
            } else {
                _mm512_slli_epi32::<16>(wide(_mm512_cvtneps_pbh(_mm512_loadu_ps(b.as_ptr().add(c)))))
            };
            _mm512_storeu_si512(dst.as_mut_ptr().add(c).cast(), _mm512_or_si512(low, high));
        }
    }
    let bits = |v: f32| u32::from(half::bf16::from_f32(v).to_bits());
    for c in whole..n {
        dst[c] = bits(a[c]) | b.get(c).map_or(0, |&v| bits(v)) << 16;
    }
}

/// [`scores`] in bf16 products: `scores[r][j] = Σ_c q[r][c] · k[j][c]` with `q[r]` and the keys
/// as bf16 pairs of neighbouring components (`q[r]` holds `d / 2` pairs; `kp` holds `d / 2` rows
/// of `stride ≥ n` keys' pairs), two components per `vdpbf16ps`; f32 sums.
///
/// # Safety
/// The CPU must have AVX-512F and AVX512_BF16; `n` a multiple of [`TILE_WIDTH`], `kp` holds
/// `(d / 2 − 1) · stride + n` values and `scores` `TILE_ROWS · n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::needless_range_loop)] // pair c of four query rows at once
pub unsafe fn scores_bf16(q: [&[u32]; TILE_ROWS], kp: &[u32], stride: usize, n: usize, scores: &mut [f32]) {
    use std::arch::x86_64::*;
    let pairs = q[0].len();
    debug_assert!(n.is_multiple_of(TILE_WIDTH) && scores.len() >= TILE_ROWS * n);
    debug_assert!(pairs == 0 || kp.len() >= (pairs - 1) * stride + n);
    let bh = |v: __m512i| -> __m512bh {
        // SAFETY: both are 64 bytes of plain bits.
        unsafe { std::mem::transmute(v) }
    };
    for j in (0..n).step_by(TILE_WIDTH) {
        let mut acc = [_mm512_setzero_ps(); 2 * TILE_ROWS];
        for c in 0..pairs {
            // SAFETY: row `c` of `kp` holds keys `j..j + 32` (see above).
            unsafe {
                let p = kp.as_ptr().add(c * stride + j);
                let (k0, k1) = (
                    bh(_mm512_loadu_si512(p.cast())),
                    bh(_mm512_loadu_si512(p.add(16).cast())),
                );
                for r in 0..TILE_ROWS {
                    let qv = bh(_mm512_set1_epi32(q[r][c] as i32));
                    acc[2 * r] = _mm512_dpbf16_ps(acc[2 * r], qv, k0);
                    acc[2 * r + 1] = _mm512_dpbf16_ps(acc[2 * r + 1], qv, k1);
                }
            }
        }
        for r in 0..TILE_ROWS {
            // SAFETY: `scores` holds TILE_ROWS rows of n ≥ j + 32 values.
            unsafe {
                let p = scores.as_mut_ptr().add(r * n + j);
                _mm512_storeu_ps(p, acc[2 * r]);
                _mm512_storeu_ps(p.add(16), acc[2 * r + 1]);
            }
        }
    }
}

/// Value columns per pass of [`weighted_values_bf16`] (two AVX-512 registers).
pub const BF16_VALUE_WIDTH: usize = 32;

/// [`weighted_values`] in bf16 products: `y[r][c] = Σ_j p[r][j] · v[j][c]` with `p[r]` as bf16
/// pairs of neighbouring keys (`pairs` of them) and `vp` holding, for each pair of keys, a row of
/// `d` columns' pairs (`v[2i][c]` low, `v[2i + 1][c]` high); f32 sums.
///
/// # Safety
/// The CPU must have AVX-512F and AVX512_BF16; `d` (the length of each `y[r]`) a multiple of
/// [`BF16_VALUE_WIDTH`]; every `p[r]` holds `pairs` values and `vp` `pairs · d`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
pub unsafe fn weighted_values_bf16(p: [&[u32]; TILE_ROWS], vp: &[u32], pairs: usize, mut y: [&mut [f32]; TILE_ROWS]) {
    use std::arch::x86_64::*;
    let d = y[0].len();
    debug_assert!(d.is_multiple_of(BF16_VALUE_WIDTH) && vp.len() >= pairs * d && p.iter().all(|r| r.len() >= pairs));
    let bh = |v: __m512i| -> __m512bh {
        // SAFETY: both are 64 bytes of plain bits.
        unsafe { std::mem::transmute(v) }
    };
    for c in (0..d).step_by(BF16_VALUE_WIDTH) {
        let mut acc = [_mm512_setzero_ps(); 2 * TILE_ROWS];
        for i in 0..pairs {
            // SAFETY: row `i` of `vp` holds `d ≥ c + 32` columns (see above).
            unsafe {
                let at = vp.as_ptr().add(i * d + c);
                let (v0, v1) = (
                    bh(_mm512_loadu_si512(at.cast())),
                    bh(_mm512_loadu_si512(at.add(16).cast())),
                );
                for r in 0..TILE_ROWS {
                    let pv = bh(_mm512_set1_epi32(*p[r].get_unchecked(i) as i32));
                    acc[2 * r] = _mm512_dpbf16_ps(acc[2 * r], pv, v0);
                    acc[2 * r + 1] = _mm512_dpbf16_ps(acc[2 * r + 1], pv, v1);
                }
            }
        }
        for (r, yr) in y.iter_mut().enumerate() {
            // SAFETY: `yr` has d ≥ c + 32 values.
            unsafe {
                let at = yr.as_mut_ptr().add(c);
                _mm512_storeu_ps(at, acc[2 * r]);
                _mm512_storeu_ps(at.add(16), acc[2 * r + 1]);
            }
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

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn bf16_tiles_match_sums_of_rounded_values() {
        if !crate::kernels::sgemm::bf16_products_available() {
            eprintln!("no AVX512_BF16 here: bf16 tiles untested");
            return;
        }
        let round = |v: f32| half::bf16::from_f32(v).to_f32();
        // The conversions, past whole vectors too: the same bits as rounding one value at a time.
        let bits = |v: f32| u32::from(half::bf16::from_f32(v).to_bits());
        let (a, b) = (data(37, 1), data(37, 2));
        let (mut pairs, mut rows) = (vec![0u32; 19], vec![0u32; 37]);
        // SAFETY: bf16_products_available() holds.
        unsafe {
            to_bf16_pairs(&a, &mut pairs);
            interleave_bf16(&a, &b, &mut rows);
        }
        for (i, &got) in pairs.iter().enumerate() {
            assert_eq!(
                got,
                bits(a[2 * i]) | a.get(2 * i + 1).map_or(0, |&v| bits(v)) << 16,
                "pair {i}"
            );
        }
        for (c, &got) in rows.iter().enumerate() {
            assert_eq!(got, bits(a[c]) | bits(b[c]) << 16, "column {c}");
        }
        for d in [32, 64, 128] {
            let (n, stride) = (2 * TILE_WIDTH, 2 * TILE_WIDTH + 16);
            let qs: Vec<Vec<f32>> = (0..TILE_ROWS).map(|r| data(d, r)).collect();
            // Keys row-major, then as pairs of components: row c of `kp` holds every key's pair c.
            let keys: Vec<Vec<f32>> = (0..n).map(|j| data(d, 40 + j)).collect();
            let mut qp = vec![vec![0u32; d / 2]; TILE_ROWS];
            let mut kp = vec![0u32; d / 2 * stride];
            let mut pair = [0u32; 1];
            // SAFETY (all calls below): bf16_products_available() holds.
            unsafe {
                for (q, qp) in qs.iter().zip(&mut qp) {
                    to_bf16_pairs(q, qp);
                }
                for (j, key) in keys.iter().enumerate() {
                    for c in 0..d / 2 {
                        to_bf16_pairs(&key[2 * c..2 * c + 2], &mut pair);
                        kp[c * stride + j] = pair[0];
                    }
                }
            }
            let mut s = vec![0f32; TILE_ROWS * n];
            unsafe { scores_bf16(std::array::from_fn(|r| qp[r].as_slice()), &kp, stride, n, &mut s) };
            for r in 0..TILE_ROWS {
                for (j, key) in keys.iter().enumerate() {
                    let want: f32 = (0..d).map(|c| round(qs[r][c]) * round(key[c])).sum();
                    assert!(
                        (s[r * n + j] - want).abs() < 1e-4,
                        "scores, d {d}: {} vs {want}",
                        s[r * n + j]
                    );
                }
            }
            // Weights over an odd number of keys (the last pair half zero).
            for keys_n in [13, 2, 1] {
                let v: Vec<Vec<f32>> = (0..keys_n).map(|j| data(d, 90 + j)).collect();
                let pairs = keys_n.div_ceil(2);
                let mut vp = vec![0u32; pairs * d];
                let mut pp = vec![vec![0u32; pairs]; TILE_ROWS];
                unsafe {
                    for (i, row) in vp.chunks_exact_mut(d).enumerate() {
                        let below = v.get(2 * i + 1).map_or(&[][..], |r| &r[..]);
                        interleave_bf16(&v[2 * i], below, row);
                    }
                    for (r, pp) in pp.iter_mut().enumerate() {
                        to_bf16_pairs(&s[r * n..][..keys_n], pp);
                    }
                }
                let mut ys = vec![vec![0f32; d]; TILE_ROWS];
                let [a, b, c, e] = &mut ys[..] else { unreachable!() };
                unsafe { weighted_values_bf16(std::array::from_fn(|r| pp[r].as_slice()), &vp, pairs, [a, b, c, e]) };
                for (r, y) in ys.iter().enumerate() {
                    for (c, &got) in y.iter().enumerate() {
                        let want: f32 = (0..keys_n).map(|j| round(s[r * n + j]) * round(v[j][c])).sum();
                        assert!(
                            (got - want).abs() < 1e-4 * want.abs().max(1.0),
                            "values, d {d}, {keys_n} keys"
                        );
                    }
                }
            }
        }
    }
}
