//! Log-likelihood-ratio rewards, the engine's side: the token log-probabilities a log-ratio
//! verifier's step rewards are summed from. What a span is and how it is scored
//! ([`LogRatio`], [`spans`]) is `stepwise_text::log_ratio`'s, re-exported here.

pub use stepwise_text::log_ratio::*;

use crate::model::Model;
use anyhow::Result;
use candle_core::{DType, Tensor};

/// `log p(ids[b, i] | ids[b, <i])` at every position of a padded batch `[b, t]`, as `[b·t]`
/// with 0 at position 0 (differentiable when the model is in training mode).
pub fn token_logprobs(model: &Model, ids: &Tensor, pad_mask: Option<&Tensor>) -> Result<Tensor> {
    let (b, t) = ids.dims2()?;
    let hidden = model.hidden(crate::Input::padded(ids, pad_mask))?;
    let flat = hidden.reshape((b * t, hidden.dim(2)?))?;
    // Row (b, i) predicts token (b, i + 1); the last row of a sequence predicts nothing.
    let ids_v: Vec<u32> = ids.flatten_all()?.to_vec1()?;
    let next: Vec<u32> = (0..b * t)
        .map(|r| if r % t + 1 < t { ids_v[r + 1] } else { 0 })
        .collect();
    let predicted = crate::kernels::token_logprobs(&model.head_logits(&flat)?, &next)?.reshape((b, t))?;
    // Shift right by one: position i holds the log-probability of token i.
    let zero = Tensor::zeros((b, 1), DType::F32, ids.device())?;
    Ok(Tensor::cat(&[&zero, &predicted.narrow(1, 0, t - 1)?], 1)?.flatten_all()?)
}

/// `log p(token i | tokens < i)` of every token of every sequence under `model` (no gradient
/// unless the model is training); position 0 holds 0. On the CPU decoder `batch_size`
/// sequences a padded forward pass; on a packed engine (a GPU) packed batches of at most
/// `max_tokens` tokens.
pub fn sequence_logprobs(
    model: &Model,
    seqs: &[&[u32]],
    batch_size: usize,
    max_tokens: usize,
) -> Result<Vec<Vec<f32>>> {
    if let Some(engine) = model.packed() {
        return engine.sequence_logprobs(seqs, max_tokens.max(1));
    }
    let mut out = Vec::with_capacity(seqs.len());
    for chunk in seqs.chunks(batch_size.max(1)) {
        let (ids, mask, t) = crate::model::pad_batch(chunk, &model.device)?;
        let lp: Vec<f32> = token_logprobs(model, &ids, mask.as_ref())?.to_vec1()?;
        for (b, s) in chunk.iter().enumerate() {
            out.push(lp[b * t..b * t + s.len()].to_vec());
        }
    }
    Ok(out)
}

/// Sum `values[b·t]` over each span of each sequence: `spans[k] = (sequence, start, end)`.
pub fn span_sums(values: &Tensor, t: usize, spans: &[(usize, usize, usize)]) -> Result<Tensor> {
    let n = values.dim(0)?;
    let mut select = vec![0f32; spans.len() * n];
    for (k, &(b, start, end)) in spans.iter().enumerate() {
        for i in start..=end {
            select[k * n + b * t + i] = 1.0;
        }
    }
    let select = Tensor::from_vec(select, (spans.len(), n), values.device())?;
    Ok(select.matmul(&values.unsqueeze(1)?)?.squeeze(1)?)
}
