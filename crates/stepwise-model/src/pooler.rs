//! Step rewards read from what an engine returns, for every PRM layout, in one place that no
//! device reaches into (vLLM's STEP pooler): classifier and value heads and Math-Shepherd's two
//! vocabulary columns from head outputs at the reward rows ([`good_probs`]), log-ratio verifiers
//! from token log-probabilities ([`log_ratio_rewards`]). The engines (the CPU decoder, a packed
//! engine) give head outputs at rows ([`crate::Model::head_at`]) and token log-probabilities
//! ([`crate::log_ratio::sequence_logprobs`]); nothing here knows which one ran.

use crate::layout::Encoded;
use crate::log_ratio::{span_sums, LogRatio};
use anyhow::Result;
use candle_core::{Device, Tensor};

/// P(good) of each row of head outputs `values` (`width` a row): softmax class 1 of a
/// classifier's classes (or of an LM head's `[bad, good]` columns), the sigmoid of a value head.
pub fn good_probs(values: Vec<f32>, width: usize) -> Result<Vec<f32>> {
    if values.is_empty() {
        return Ok(Vec::new());
    }
    let rows = values.len() / width.max(1);
    let logits = Tensor::from_vec(values, (rows, width), &Device::Cpu)?;
    Ok(crate::model::good_prob(&logits)?.to_vec1()?)
}

/// Step rewards of a log-ratio verifier: `sigmoid(β · Σ (log π − log π_ref))` over each step's
/// span, from each sequence's token log-probabilities under the verifier (`own`) and under its
/// reference (`reference`; `None` for a constant reference, `lr.reference_logprob`).
pub fn log_ratio_rewards(
    batch: &[&Encoded],
    own: &[Vec<f32>],
    reference: Option<&[Vec<f32>]>,
    lr: LogRatio,
) -> Result<Vec<Vec<f32>>> {
    // Laid out as a padded batch `[b·t]` (padding 0, which no span reaches).
    let t = batch.iter().map(|e| e.ids.len()).max().unwrap_or(1).max(1);
    let padded = |each: &[Vec<f32>]| -> Result<Tensor> {
        let mut flat = vec![0f32; batch.len() * t];
        for (b, lp) in each.iter().enumerate() {
            flat[b * t..b * t + lp.len()].copy_from_slice(lp);
        }
        Ok(Tensor::from_vec(flat, batch.len() * t, &Device::Cpu)?)
    };
    let ratio = match (reference, lr.reference_logprob) {
        (Some(r), _) => (padded(own)? - padded(r)?)?,
        (None, Some(c)) => (padded(own)? - c as f64)?,
        (None, None) => anyhow::bail!("a log-ratio verifier scores against its reference model: none was given"),
    };
    let spans: Vec<(usize, usize, usize)> = batch
        .iter()
        .enumerate()
        .flat_map(|(b, e)| {
            lr.step_spans(e.steps_from.max(1), &e.positions)
                .into_iter()
                .map(move |(s, end)| (b, s, end))
        })
        .collect();
    if spans.is_empty() {
        return Ok(batch.iter().map(|_| Vec::new()).collect());
    }
    let p: Vec<f32> = candle_nn::ops::sigmoid(&(span_sums(&ratio, t, &spans)? * lr.beta as f64)?)?.to_vec1()?;
    Ok(per_solution(&p, batch))
}

/// `values`, one per reward position of every solution of `batch` in order, split into each
/// solution's.
pub fn per_solution(values: &[f32], batch: &[&Encoded]) -> Vec<Vec<f32>> {
    let mut rest = values;
    batch
        .iter()
        .map(|e| {
            let (mine, tail) = rest.split_at(e.positions.len());
            rest = tail;
            mine.to_vec()
        })
        .collect()
}
