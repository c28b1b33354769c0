//! Sampling with a KV cache. `n` continuations of one prefix encode the prefix ONCE and share its
//! cache (Monte Carlo rollouts and beams depend on this); rows that stop leave the batch.

use crate::model::{Head, Model};
use crate::tokenizer::Tokenizer;
use crate::transformer::KvCache;
use anyhow::{bail, Result};
use candle_core::{IndexOp, Tensor};
use rand::{Rng, SeedableRng};
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
        }
    }
}

/// Pick a token from one row of logits.
pub fn sample_token(logits: &[f32], p: &SamplingParams, rng: &mut ChaCha8Rng) -> u32 {
    let argmax = || {
        logits
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
            .0 as u32
    };
    if p.temperature <= 0.0 {
        return argmax();
    }
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_unstable_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    if p.top_k > 0 {
        idx.truncate(p.top_k);
    }
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
    let mut r: f32 = rng.random();
    for (k, &pr) in probs.iter().enumerate() {
        if r < pr {
            return idx[k] as u32;
        }
        r -= pr;
    }
    idx[probs.len() - 1] as u32
}

fn last_logits(model: &Model, hidden: &Tensor) -> Result<Tensor> {
    if !matches!(model.head, Head::Lm(_)) {
        bail!(
            "generation needs a causal LM head (architecture {})",
            model.config.architecture
        );
    }
    let t = hidden.dim(1)?;
    model.head_logits(&hidden.i((.., t - 1, ..))?)
}

/// `n` continuations of `prompt`: the prompt is encoded once, its cache shared by all rows.
pub fn generate(
    model: &Model,
    tok: Option<&Tokenizer>,
    prompt: &[u32],
    n: usize,
    p: &SamplingParams,
) -> Result<Vec<Vec<u32>>> {
    if prompt.is_empty() || n == 0 {
        bail!("generation needs a non-empty prompt and n > 0");
    }
    let dev = &model.device;
    let mut prefix_cache = KvCache::default();
    let ids = Tensor::new(prompt, dev)?.unsqueeze(0)?;
    let h = model.hidden(&ids, None, Some(&mut prefix_cache))?;
    let first: Vec<f32> = last_logits(model, &h)?.squeeze(0)?.to_vec1()?;
    let mut rngs: Vec<ChaCha8Rng> = (0..n as u64)
        .map(|i| ChaCha8Rng::seed_from_u64(p.seed.wrapping_mul(1_000_003).wrapping_add(i)))
        .collect();
    let mut outs: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut live: Vec<usize> = (0..n).collect();
    let mut cache = prefix_cache.repeat_batch(n)?;
    let mut next: Vec<u32> = rngs.iter_mut().map(|r| sample_token(&first, p, r)).collect();
    for step in 0..p.max_new_tokens {
        let mut still = Vec::with_capacity(live.len());
        for (k, &row) in live.iter().enumerate() {
            outs[row].push(next[k]);
            let stopped = p.stop_token_ids.contains(&next[k])
                || (!p.stop_strings.is_empty()
                    && tok
                        .and_then(|t| t.decode(&outs[row]).ok())
                        .is_some_and(|text| p.stop_strings.iter().any(|s| text.ends_with(s.as_str()))));
            if !stopped {
                still.push(k);
            }
        }
        if still.is_empty() || step + 1 == p.max_new_tokens {
            break;
        }
        if still.len() < live.len() {
            let keep = Tensor::new(still.iter().map(|&k| k as u32).collect::<Vec<_>>(), dev)?;
            cache = cache.select(&keep)?;
            next = still.iter().map(|&k| next[k]).collect();
            live = still.iter().map(|&k| live[k]).collect();
        }
        let ids = Tensor::new(next.as_slice(), dev)?.unsqueeze(1)?;
        let h = model.hidden(&ids, None, Some(&mut cache))?;
        let logits = last_logits(model, &h)?.to_vec2::<f32>()?;
        next = live
            .iter()
            .zip(&logits)
            .map(|(&row, l)| sample_token(l, p, &mut rngs[row]))
            .collect();
    }
    Ok(outs)
}
