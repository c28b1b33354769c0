//! A token's log-probability under a row of logits and the likeliest tokens there
//! ([`token_logprob`]): what [`crate::Decoding`] records for each sampled token of a request that
//! asks ([`crate::SamplingParams::logprobs`]), as vLLM's sampler returns them, and what
//! `stepwise serve` reads from a prompt's pass (`echo`). The log-probabilities are the model's own
//! (the logits before temperature, top-k and top-p), as vLLM's default `raw_logprobs`.

use crate::kernels::simd;

/// A token's log-probability at its position, and the likeliest tokens there with theirs (most
/// likely first, equal ones by ascending id).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub token: u32,
    /// `log softmax(logits)[token]`.
    pub logprob: f32,
    /// The `k` likeliest tokens and their log-probabilities.
    pub top: Vec<(u32, f32)>,
}

/// `token`'s log-probability under `logits` (one position's row) and the `k` likeliest tokens
/// (at most the row's length): one vectorised pass for the log-normaliser, one for the top `k`
/// kept in a small sorted buffer (no sort of the vocabulary). A token outside the row gets −∞.
pub fn token_logprob(logits: &[f32], token: u32, k: usize) -> TokenLogprob {
    let lse = log_sum_exp(logits);
    let logprob = logits.get(token as usize).map_or(f32::NEG_INFINITY, |&x| x - lse);
    let top = likeliest(logits, k).into_iter().map(|(t, x)| (t, x - lse)).collect();
    TokenLogprob { token, logprob, top }
}

/// `ln Σ eˣ` over `xs`, from its largest (−∞ for an empty or all −∞ row).
pub fn log_sum_exp(xs: &[f32]) -> f32 {
    let max = simd::max(xs);
    if !max.is_finite() {
        return max;
    }
    let mut sum = 0.0;
    simd::dispatch(ExpSum { xs, max, sum: &mut sum });
    max + sum.ln()
}

/// `Σ e^(x − max)` of `xs` into `sum`, sixteen lanes at a time.
struct ExpSum<'a> {
    xs: &'a [f32],
    max: f32,
    sum: &'a mut f32,
}

impl simd::Kernel for ExpSum<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        const WIDE: usize = 16;
        let mut acc = [0f32; WIDE];
        let chunks = self.xs.chunks_exact(WIDE);
        let tail: f32 = chunks.remainder().iter().map(|&x| simd::exp::<FMA>(x - self.max)).sum();
        for c in chunks {
            for l in 0..WIDE {
                acc[l] += simd::exp::<FMA>(c[l] - self.max);
            }
        }
        *self.sum = simd::sum(&acc) + tail;
    }
}

/// The `k` largest of `xs` with their indices, largest first (equal ones by ascending index):
/// one pass, each value compared with the smallest kept, a block at a time where none of the
/// block's values is above it.
fn likeliest(xs: &[f32], k: usize) -> Vec<(u32, f32)> {
    const BLOCK: usize = 16;
    let k = k.min(xs.len());
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k == 0 {
        return top;
    }
    // Ahead of `b`: larger, or equal with a smaller index (NaN ranks below everything).
    let ahead = |a: (u32, f32), b: (u32, f32)| a.1 > b.1 || (a.1 == b.1 && a.0 < b.0) || (b.1.is_nan() && !a.1.is_nan());
    for (b, block) in xs.chunks(BLOCK).enumerate() {
        // A later index never passes an equal value; NaNs never pass (nor skip a NaN floor).
        if top.len() == k && block.iter().fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m }) <= top[k - 1].1 {
            continue;
        }
        for (j, &x) in block.iter().enumerate() {
            let c = ((b * BLOCK + j) as u32, x);
            if top.len() == k && !ahead(c, top[k - 1]) {
                continue;
            }
            let at = top.iter().position(|&t| ahead(c, t)).unwrap_or(top.len());
            top.insert(at, c);
            top.truncate(k);
        }
    }
    top
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same in f64, the plain way: log-softmax, then a full sort.
    fn reference(xs: &[f32], token: u32, k: usize) -> (f64, Vec<(u32, f64)>) {
        let max = xs.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
        let lse = max + xs.iter().map(|&x| (f64::from(x) - max).exp()).sum::<f64>().ln();
        let mut all: Vec<(u32, f64)> = xs.iter().enumerate().map(|(i, &x)| (i as u32, f64::from(x) - lse)).collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        all.truncate(k);
        (f64::from(xs[token as usize]) - lse, all)
    }

    #[test]
    fn log_probabilities_and_the_likeliest_match_a_plain_softmax_and_sort() {
        // Odd lengths (vector tails), ties, a peaked row and a flat one, very negative logits.
        for (n, peak) in [(1usize, 0.0f32), (7, 3.0), (17, 0.0), (1000, 12.0), (151_937, 0.5)] {
            let xs: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 997) as f32 / 97.0).sin() * 4.0 + if i % 101 == 3 { peak } else { 0.0 } - if i % 13 == 0 { 80.0 } else { 0.0 })
                .map(|x| (x * 8.0).round() / 8.0)
                .collect();
            for k in [0usize, 1, 5, 20] {
                let token = (n / 2) as u32;
                let got = token_logprob(&xs, token, k);
                let (lp, top) = reference(&xs, token, k);
                assert!((f64::from(got.logprob) - lp).abs() < 1e-4 * lp.abs().max(1.0), "n {n}: {} vs {lp}", got.logprob);
                assert_eq!(got.top.len(), k.min(n));
                for ((t, x), (rt, rx)) in got.top.iter().zip(&top) {
                    assert_eq!(t, rt, "n {n} k {k}: the likeliest in order, ties by id");
                    assert!((f64::from(*x) - rx).abs() < 1e-4 * rx.abs().max(1.0));
                }
                // Log-probabilities give themselves back (a pass's rows may come as either).
                let lse = log_sum_exp(&xs);
                let logp: Vec<f32> = xs.iter().map(|&x| x - lse).collect();
                assert!((token_logprob(&logp, token, k).logprob - got.logprob).abs() < 1e-4);
            }
        }
    }

    #[test]
    fn infinite_and_nan_logits_rank_last() {
        let xs = [f32::NEG_INFINITY, 1.0, f32::NAN, 1.0];
        let got = token_logprob(&xs, 3, 3);
        assert_eq!(got.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 0]);
        assert_eq!(log_sum_exp(&[f32::NEG_INFINITY; 3]), f32::NEG_INFINITY);
        assert_eq!(token_logprob(&[0.0, 0.0], 5, 0).logprob, f32::NEG_INFINITY);
    }
}
