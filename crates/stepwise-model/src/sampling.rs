//! Sampling one token from a row of logits ([`sample_token`]): greedy at temperature 0, else a
//! draw from the softmax at the temperature (within top-k and top-p when set) by the inverse of
//! its cumulative distribution, walked from the most likely token down, or in id order for a
//! real vocabulary's flat rows. Each continuation draws from its own generator, so
//! [`crate::Decoding`] gives the same samples for the same logits on every engine.

use crate::kernels::simd;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// How to sample.
#[derive(Debug, Clone)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// Nucleus sampling mass (1.0 = off).
    pub top_p: f32,
    /// Keep only the k most likely tokens (0 = off).
    pub top_k: usize,
    /// Most new tokens per continuation.
    pub max_new_tokens: usize,
    /// Seed: the same seed gives the same samples.
    pub seed: u64,
    /// Token ids that end a continuation (kept in the output).
    pub stop_token_ids: Vec<u32>,
    /// Strings that end a continuation when the decoded new text ends with one (kept).
    pub stop_strings: Vec<String>,
    /// With `Some(k)`, each sampled token's log-probability under the model (its logits before
    /// temperature, top-k and top-p, as vLLM's default) and the `k` likeliest tokens at its
    /// position are recorded ([`crate::Decoding::logprobs`]).
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_new_tokens: 256,
            seed: 0,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
            logprobs: None,
        }
    }
}

/// Pick a token from one row of logits: greedy at temperature 0, else a draw from the softmax at
/// the temperature (within the `top_k` most likely and the smallest set holding `top_p` of the
/// mass, when set), by the inverse of its cumulative distribution:
/// - walking the tokens from the most likely down (equal logits by ascending id), summed in that
///   order: a small vocabulary's rows (the lab's), any row with `top_k` or `top_p` set, and a
///   real vocabulary's peaked rows (a trained model's), whose likely tokens are sorted alone;
/// - walking a real vocabulary's flat rows (past `SORTED_VOCAB` tokens with a quarter or more
///   of them likely, as a random model's) in id order, summed in f64, with neither set: the
///   same distribution without sorting 151,936 logits a row (most of a random 0.5B policy's
///   sampling time, a sixth of its serving time at 64 clients).
///
/// The sorted walk needs the logits in descending order, and their sum in that order, but never
/// the ids until it stops: equal logits give equal weights, so the sorted values alone decide
/// the position drawn, and the id at that position is found afterwards (`id_at`).
pub fn sample_token(logits: &[f32], p: &SamplingParams, rng: &mut ChaCha8Rng) -> u32 {
    if p.temperature <= 0.0 {
        return logits
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
            .0 as u32;
    }
    draw_token(logits, p, rng.random())
}

/// [`sample_token`] at temperature > 0 for the uniform draw `r` in [0, 1).
fn draw_token(logits: &[f32], p: &SamplingParams, r: f32) -> u32 {
    // Both shortcuts need finite logits and their largest, found once here.
    let shortcut = finite_max(logits).and_then(|max| match likely_floor(logits, p, max) {
        Some(floor) => draw_among_likely(logits, p, r, floor),
        None => draw_in_id_order(logits, p, r, max),
    });
    shortcut.unwrap_or_else(|| {
        let keys = descending_keys(logits.iter().map(|&x| key(x)), p.top_k);
        let at = draw(&keys, p, r, None).expect("a draw over the whole order always picks a position");
        id_at(logits, &keys, at)
    })
}

/// Vocabularies up to this size are always walked in descending order (and sorted by
/// comparison rather than by radix).
const SORTED_VOCAB: usize = 4096;

/// [`sample_token`]'s draw `r` walking the tokens in id order, for a flat row ([`likely_floor`]
/// found none) of a vocabulary past [`SORTED_VOCAB`] with neither `top_k` nor `top_p` set, its
/// logits finite and `max` the largest; else `None`.
fn draw_in_id_order(logits: &[f32], p: &SamplingParams, r: f32, max: f32) -> Option<u32> {
    if logits.len() <= SORTED_VOCAB || p.top_k > 0 || p.top_p < 1.0 {
        return None;
    }
    let mut weights = vec![0f32; logits.len()];
    let mut block_sums = Vec::with_capacity(logits.len().div_ceil(WEIGHT_BLOCK));
    simd::dispatch(SoftmaxWeights {
        logits,
        max,
        temperature: p.temperature,
        weights: &mut weights,
        block_sums: &mut block_sums,
    });
    let total: f64 = block_sums.iter().map(|&s| f64::from(s)).sum();
    // Below `total`, which the walk over the block sums reaches exactly (the same additions).
    let target = f64::from(r) * total;
    let mut acc = 0.0;
    for (b, &sum) in block_sums.iter().enumerate() {
        if acc + f64::from(sum) <= target {
            acc += f64::from(sum);
            continue;
        }
        let block = &weights[b * WEIGHT_BLOCK..logits.len().min((b + 1) * WEIGHT_BLOCK)];
        for (j, &w) in block.iter().enumerate() {
            acc += f64::from(w);
            if acc > target {
                return Some((b * WEIGHT_BLOCK + j) as u32);
            }
        }
        // The block's sum crossed the target and its own walk, summed in another order, fell
        // short by a rounding: its last token with any weight.
        return block
            .iter()
            .rposition(|&w| w > 0.0)
            .map(|j| (b * WEIGHT_BLOCK + j) as u32);
    }
    None
}

/// Tokens a block of [`SoftmaxWeights`]: the walk in id order skips whole blocks by their sums.
const WEIGHT_BLOCK: usize = 1024;

/// The softmax weights `e^((x − max) / temperature)` of `logits` into `weights`, and the sum of
/// each block of [`WEIGHT_BLOCK`] of them pushed onto `block_sums`: vectorised ([`simd::exp`],
/// about 2 ulp).
struct SoftmaxWeights<'a> {
    logits: &'a [f32],
    max: f32,
    temperature: f32,
    weights: &'a mut [f32],
    block_sums: &'a mut Vec<f32>,
}

impl simd::Kernel for SoftmaxWeights<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        let scale = 1.0 / self.temperature;
        for (xs, ws) in self
            .logits
            .chunks(WEIGHT_BLOCK)
            .zip(self.weights.chunks_mut(WEIGHT_BLOCK))
        {
            for (w, &x) in ws.iter_mut().zip(xs) {
                *w = simd::exp::<FMA>((x - self.max) * scale);
            }
            self.block_sums.push(simd::sum(ws));
        }
    }
}

/// Logits this far below the largest, times the temperature, weigh less than `exp(-20)`, under
/// half a unit in the last place of a softmax normaliser (which is at least 1).
const NEGLIGIBLE: f32 = 20.0;

/// Where a row's likely tokens start: [`NEGLIGIBLE`] × temperature below its largest logit
/// `max` (the logits all finite), when under a quarter of them lie above that (a peaked row).
fn likely_floor(logits: &[f32], p: &SamplingParams, max: f32) -> Option<f32> {
    let floor = max - NEGLIGIBLE * p.temperature;
    // Counted before anything is collected: a flat row (a random model's) gives up here.
    (logits.iter().filter(|&&x| x >= floor).count() * 4 <= logits.len()).then_some(floor)
}

/// [`sample_token`]'s draw `r` from the tokens whose logits lie at or above `floor`
/// ([`likely_floor`]), sorted alone: what the whole order gives, bit for bit, or `None` where
/// that cannot be shown (a draw reaching past them). A trained model puts most of a
/// 151,936-token vocabulary far below its top tokens.
fn draw_among_likely(logits: &[f32], p: &SamplingParams, r: f32, floor: f32) -> Option<u32> {
    let keys = descending_keys(logits.iter().filter(|&&x| x >= floor).map(|&x| key(x)), 0);
    // The largest logit below the floor (all are finite here).
    let rest = lane_max(logits, |x| if x < floor { x } else { f32::NEG_INFINITY });
    draw(&keys, p, r, Some(rest)).map(|at| id_at(logits, &keys, at))
}

/// Lanes of the running maxima: independent chains the compiler turns into vector `max`es (one
/// chain of a 151,936-logit row was most of a trained model's draw).
const MAX_LANES: usize = 16;

/// The largest of `keep(x)` over `xs` (`-∞` when empty), none of them NaN.
fn lane_max(xs: &[f32], keep: impl Fn(f32) -> f32) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; MAX_LANES];
    let chunks = xs.chunks_exact(MAX_LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            let x = keep(x);
            *lane = if x > *lane { x } else { *lane };
        }
    }
    tail.iter()
        .map(|&x| keep(x))
        .chain(lanes)
        .fold(f32::NEG_INFINITY, f32::max)
}

/// The largest logit, or `None` when any is infinite or NaN.
fn finite_max(logits: &[f32]) -> Option<f32> {
    // Exponent bits all set: an infinity or a NaN.
    let non_finite = logits.iter().fold(0u32, |any, &x| {
        any | u32::from(x.to_bits() & 0x7f80_0000 == 0x7f80_0000)
    });
    (non_finite == 0).then(|| lane_max(logits, |x| x))
}

/// A logit's sort key: ascending keys are descending logits in `f32::total_cmp`'s order.
fn key(x: f32) -> u32 {
    let bits = x.to_bits();
    // Ascending in total_cmp's order as unsigned integers; inverted for descending.
    !(if bits >> 31 == 1 { !bits } else { bits | 1 << 31 })
}

/// The logit a key stands for.
fn logit(key: u32) -> f32 {
    let ascending = !key;
    f32::from_bits(if ascending >> 31 == 1 {
        ascending & !(1 << 31)
    } else {
        !ascending
    })
}

/// The draw `r` at the sorted logit keys `keys` (descending logits): all of them, or (`rest`:
/// the largest logit after them) the leading part of the whole order, in which case `None` when
/// the part does not decide the draw as the whole order would. Returns the position drawn.
fn draw(keys: &[u32], p: &SamplingParams, r: f32, rest: Option<f32>) -> Option<usize> {
    let (keys, rest) = match p.top_k {
        k if k > 0 && k <= keys.len() => (&keys[..k], None),
        _ => (keys, rest),
    };
    let max = logit(keys[0]);
    let weight = |logit: f32| ((logit - max) / p.temperature).exp();
    let mut probs: Vec<f32> = keys.iter().map(|&k| weight(logit(k))).collect();
    let total: f32 = probs.iter().sum();
    // The whole order adds the later weights to `total` one by one, largest first: when the
    // largest changes nothing, no later one does (rounding is monotonic), and `total` is exact.
    // (Below `NEGLIGIBLE` this holds by construction, as `total` ≥ 1; checked all the same.)
    if rest.is_some_and(|next| total + weight(next) != total) {
        return None;
    }
    if p.top_p >= 1.0 {
        return walk(&probs, total, r, rest.is_none());
    }
    probs.iter_mut().for_each(|x| *x /= total);
    let mut acc = 0.0;
    let keep = probs.iter().position(|&x| {
        acc += x;
        acc >= p.top_p
    });
    let keep = match keep {
        Some(k) => k + 1,
        None if rest.is_none() => probs.len(),
        None => return None,
    };
    probs.truncate(keep);
    let total: f32 = probs.iter().sum();
    walk(&probs, total, r, true)
}

/// The draw `r` walking `weights` (most likely first) divided by `total`, each quotient taken
/// only when the walk reaches it: the position reached; past the end, the last position when
/// the weights are `complete`, else `None`.
fn walk(weights: &[f32], total: f32, mut r: f32, complete: bool) -> Option<usize> {
    for (at, &w) in weights.iter().enumerate() {
        let pr = w / total;
        if r < pr {
            return Some(at);
        }
        r -= pr;
    }
    complete.then(|| weights.len() - 1)
}

/// The token at position `at` of the descending order whose keys are `keys`: among the tokens
/// with that logit, by ascending id, the one as many places on as equal keys precede `at`.
fn id_at(logits: &[f32], keys: &[u32], at: usize) -> u32 {
    let k = keys[at];
    let before = keys[..at].iter().rev().take_while(|&&x| x == k).count();
    logits
        .iter()
        .enumerate()
        .filter(|(_, &x)| key(x) == k)
        .nth(before)
        .expect("every key comes from a logit")
        .0 as u32
}

/// The keys `keys` sorted ascending (descending logits), the first `top_k` only when it is not 0:
/// a radix sort for a real vocabulary (a comparison sort of 151,936 logits took milliseconds a
/// row, most of a decoding step's time), a selection first when only the top k are wanted.
fn descending_keys(keys: impl Iterator<Item = u32>, top_k: usize) -> Vec<u32> {
    let mut keys: Vec<u32> = keys.collect();
    if top_k > 0 && top_k < keys.len() {
        keys.select_nth_unstable(top_k - 1);
        keys.truncate(top_k);
    }
    if keys.len() > SORTED_VOCAB {
        radix_sort(&mut keys);
    } else {
        keys.sort_unstable();
    }
    keys
}

/// Sorts `keys` ascending: least significant digit first, 11 bits a pass, skipping the digits
/// every key shares.
fn radix_sort(keys: &mut Vec<u32>) {
    const BITS: u32 = 11;
    const PASSES: usize = 32usize.div_ceil(BITS as usize);
    let digit = |k: u32, pass: usize| ((k >> (pass as u32 * BITS)) & ((1 << BITS) - 1)) as usize;
    let mut counts = [[0usize; 1 << BITS]; PASSES];
    for &k in keys.iter() {
        for (pass, c) in counts.iter_mut().enumerate() {
            c[digit(k, pass)] += 1;
        }
    }
    let mut other = vec![0u32; keys.len()];
    for (pass, c) in counts.iter().enumerate() {
        if c.contains(&keys.len()) {
            continue;
        }
        let mut start = [0usize; 1 << BITS];
        let mut at = 0;
        for (s, &n) in start.iter_mut().zip(c.iter()) {
            *s = at;
            at += n;
        }
        for &k in keys.iter() {
            let d = digit(k, pass);
            other[start[d]] = k;
            start[d] += 1;
        }
        std::mem::swap(keys, &mut other);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// The order by sorting ids through their logits: descending, equal logits by ascending id.
    fn by_comparison(logits: &[f32], top_k: usize) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if top_k > 0 {
            idx.truncate(top_k);
        }
        idx
    }

    /// The sorted keys, each position mapped back to its id, are the comparison sort: keys
    /// and logits round-trip, ties go by ascending id, top-k keeps the first k.
    #[test]
    fn sorted_keys_give_the_comparison_order() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for n in [1, 7, 100, 5000, 151_936] {
            // Ties (values on a coarse grid), negative values, zeros of both signs, infinities.
            let mut logits: Vec<f32> = (0..n)
                .map(|_| (rng.random::<f32>() * 64.0 - 32.0).round() / 4.0)
                .collect();
            if n > 10 {
                logits[3] = -0.0;
                logits[5] = f32::NEG_INFINITY;
                logits[8] = f32::INFINITY;
            }
            for &x in &logits {
                assert_eq!(logit(key(x)).to_bits(), x.to_bits());
            }
            for top_k in [0, 1, 50, n] {
                let want = by_comparison(&logits, top_k);
                let keys = descending_keys(logits.iter().map(|&x| key(x)), top_k);
                assert_eq!(keys.len(), want.len(), "{n} ids, top {top_k}");
                // Every position of the small cases, a spread of the largest's.
                for at in (0..keys.len()).filter(|at| n <= 5000 || at % 613 == 0 || *at < 64) {
                    assert_eq!(
                        id_at(&logits, &keys, at) as usize,
                        want[at],
                        "{n} ids, top {top_k}, at {at}"
                    );
                }
            }
        }
    }

    /// The draw as it was written before any shortcut: the whole vocabulary sorted by
    /// comparison, the softmax over it, the walk from the top.
    fn reference_draw(logits: &[f32], p: &SamplingParams, mut r: f32) -> u32 {
        let mut idx = by_comparison(logits, p.top_k);
        let max = logits[idx[0]];
        let mut probs: Vec<f32> = idx.iter().map(|&i| ((logits[i] - max) / p.temperature).exp()).collect();
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let keep = probs.iter().position(|&x| {
                acc += x;
                acc >= p.top_p
            });
            let keep = keep.map_or(probs.len(), |k| k + 1);
            probs.truncate(keep);
            idx.truncate(keep);
            let total: f32 = probs.iter().sum();
            probs.iter_mut().for_each(|x| *x /= total);
        }
        for (k, &pr) in probs.iter().enumerate() {
            if r < pr {
                return idx[k] as u32;
            }
            r -= pr;
        }
        idx[probs.len() - 1] as u32
    }

    /// Sampling draws exactly the token of the whole-vocabulary reference (sorted, or in id order
    /// for a real vocabulary's flat rows with neither top-k nor top-p), for peaked logits (where
    /// only the likely tokens are sorted) and flat ones, every temperature, top-k and top-p,
    /// including draws at the very top of the unit interval.
    #[test]
    fn sampling_draws_what_the_whole_order_draws() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let (mut shortcut, mut walked_in_id_order) = (0, 0);
        for case in 0..30 {
            let n = [50, 5000, 151_936][case % 3];
            let peaked = case % 2 == 0;
            // Every fifth case on a coarse grid: many equal logits, drawn by ascending id.
            let grid = |x: f32| if case % 5 == 4 { (x * 4.0).round() / 4.0 } else { x };
            let logits: Vec<f32> = (0..n)
                .map(|i| {
                    let bulk = (rng.random::<f32>() - 0.5) * 6.0;
                    grid(if peaked && i % 997 == 0 { bulk + 28.0 } else { bulk })
                })
                .collect();
            for (temperature, top_k, top_p) in [
                (0.8, 0, 1.0),
                (0.3, 0, 0.9),
                (1.5, 20, 1.0),
                (1.0, 3, 0.5),
                (0.7, n, 1.0),
            ] {
                let p = SamplingParams {
                    temperature,
                    top_k,
                    top_p,
                    ..Default::default()
                };
                for r in [0.0, rng.random::<f32>(), rng.random::<f32>(), 0.999_999_9] {
                    let floor = finite_max(&logits).and_then(|max| likely_floor(&logits, &p, max));
                    let id_order = floor.is_none() && n > SORTED_VOCAB && top_k == 0 && top_p >= 1.0;
                    let got = draw_token(&logits, &p, r);
                    if id_order {
                        assert!(is_id_order_draw(&logits, &p, r, got), "{n} logits, {p:?}, r {r}: {got}");
                        walked_in_id_order += 1;
                        continue;
                    }
                    let want = reference_draw(&logits, &p, r);
                    shortcut += usize::from(floor.is_some_and(|f| draw_among_likely(&logits, &p, r, f).is_some()));
                    assert_eq!(got, want, "{n} logits, peaked {peaked}, {p:?}, r {r}");
                }
            }
        }
        assert!(shortcut > 50, "the shortcut decided only {shortcut} draws");
        assert!(walked_in_id_order > 10, "{walked_in_id_order} draws in id order");
    }

    /// Whether `id` is the draw `r` of the inverse cumulative distribution in id order, as
    /// plainly as it can be written (f64 weights from the standard `exp`), within a rounding
    /// margin of 1e-5 of the total at either end of its interval.
    fn is_id_order_draw(logits: &[f32], p: &SamplingParams, r: f32, id: u32) -> bool {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let weights: Vec<f64> = logits
            .iter()
            .map(|&x| ((f64::from(x) - f64::from(max)) / f64::from(p.temperature)).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let before: f64 = weights[..id as usize].iter().sum();
        let target = f64::from(r) * total;
        before - 1e-5 * total <= target && target < before + weights[id as usize] + 1e-5 * total
    }

    /// Both walks sample the softmax: on a flat row of 6,000 tokens on three logit levels
    /// (drawn in id order) and the same row with top-k = 6,000 (sorted), each level's share of
    /// 30,000 draws lies within 5 standard deviations of its probability.
    #[test]
    fn both_walks_sample_the_softmax() {
        let levels = [0.0f32, 1.0, 2.0];
        let logits: Vec<f32> = (0..6000).map(|i| levels[i % 3]).collect();
        let weight = |l: f32| f64::from((l / 0.8).exp());
        let total: f64 = levels.iter().map(|&l| weight(l)).sum();
        for top_k in [0, 6000] {
            let p = SamplingParams {
                temperature: 0.8,
                top_k,
                ..Default::default()
            };
            let mut rng = ChaCha8Rng::seed_from_u64(17);
            let draws = 30_000;
            let mut counts = [0usize; 3];
            for _ in 0..draws {
                counts[sample_token(&logits, &p, &mut rng) as usize % 3] += 1;
            }
            for (level, &count) in levels.iter().zip(&counts) {
                let prob = weight(*level) / total;
                let sd = (draws as f64 * prob * (1.0 - prob)).sqrt();
                let off = (count as f64 - draws as f64 * prob).abs();
                assert!(
                    off < 5.0 * sd,
                    "top-k {top_k}: level {level} drawn {count} times, expected {:.0} ± {sd:.0}",
                    draws as f64 * prob
                );
            }
        }
    }
}
