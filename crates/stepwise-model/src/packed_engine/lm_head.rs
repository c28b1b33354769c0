//! The LM head in training and for log-probabilities: `log p(token | row)` of `(row, token)`
//! pairs over a packed batch, and the backward of any loss of them. The vocabulary logits are
//! made a chunk of rows at a time ([`LOGITS_BYTES`] bounds a chunk's f32 logits and their bf16
//! gradient), so memory follows the token budget, not rows × vocabulary.
//!
//! The loss is the caller's, on the host, from the pairs' log-probabilities: it returns the
//! loss and `∂loss/∂logp` of each pair (a coefficient a row), and the device turns that into the
//! logits' gradient `c · (onehot − softmax)`. Next-token prediction, a log-ratio verifier's BCE
//! on summed log-ratios and GRPO's clipped policy loss are each one such function.

use super::backward::Pass;
use super::train::Params;
use super::train_backend::TrainBackend;
use super::{Head, Out, PackedDecoder};
use crate::packed::Packed;
use anyhow::{bail, ensure, Result};

/// Most bytes a chunk of the LM head's rows takes by default: its f32 logits and their bf16
/// gradient ([`PackedDecoder::set_logits_budget`]).
pub const LOGITS_BYTES: usize = 1 << 30;

/// A loss of token log-probabilities: the loss and its derivative by each.
pub type TokenLossFn<'a> = &'a mut dyn FnMut(&[f32]) -> Result<(f32, Vec<f32>)>;

/// The LM head's buffers over a chunk of rows.
struct LmChunk<B: TrainBackend> {
    head_in: B::Bf16,
    logits: B::F32,
    logp: B::F32,
    lse: B::F32,
}

impl<B: TrainBackend> LmChunk<B> {
    fn new(b: &B, rows: usize, hidden: usize, vocab: usize) -> Result<Self> {
        Ok(LmChunk {
            head_in: b.zeros_bf16(rows * hidden)?,
            logits: b.zeros_f32(rows * vocab)?,
            logp: b.zeros_f32(rows)?,
            lse: b.zeros_f32(rows)?,
        })
    }
}

impl<B: TrainBackend> PackedDecoder<B> {
    /// The LM head's matrix: `lm_head`, or the embeddings when tied.
    fn lm_matrix(&self) -> Result<&B::Bf16> {
        match &self.head {
            Head::Lm(w) => Ok(w.as_ref().unwrap_or(&self.embed)),
            _ => bail!(
                "{} has a reward head: token log-probabilities need a causal LM",
                self.config.architecture
            ),
        }
    }

    /// Rows of the LM head run at once: their f32 logits and bf16 gradient within the logits
    /// budget.
    fn lm_chunk_rows(&self) -> usize {
        (self.logits_bytes / (6 * self.config.vocab_size)).max(1)
    }

    /// Bounds a chunk of the LM head's logits (f32) and their gradient (bf16) to `bytes`
    /// ([`LOGITS_BYTES`] by default): less memory, more chunks.
    pub fn set_logits_budget(&mut self, bytes: usize) {
        self.logits_bytes = bytes;
    }

    /// Refuses target tokens outside the vocabulary, or a model without an LM head.
    pub(super) fn check_tokens(&self, pairs: &[(usize, u32)]) -> Result<()> {
        self.lm_matrix()?;
        if let Some(&(row, token)) = pairs.iter().find(|&&(_, t)| t as usize >= self.config.vocab_size) {
            bail!(
                "target ({row}, {token}): token {token} is outside the model's vocabulary of {}",
                self.config.vocab_size
            );
        }
        Ok(())
    }

    /// `pairs` (row of `x`, token) through the final norm and the LM head into `c`: the normed
    /// rows, their logits, each token's log-probability and each row's log-sum-exp. Returns the
    /// rows and tokens on the device.
    fn lm_chunk(&self, x: &B::F32, pairs: &[(usize, u32)], c: &mut LmChunk<B>) -> Result<(B::I32, B::I32)> {
        let (b, cfg) = (&*self.backend, &self.config);
        let (h, v, r) = (cfg.hidden_size, cfg.vocab_size, pairs.len());
        let rows = b.upload_i32(&pairs.iter().map(|&(row, _)| row as i32).collect::<Vec<_>>())?;
        let tokens = b.upload_i32(&pairs.iter().map(|&(_, t)| t as i32).collect::<Vec<_>>())?;
        b.rms_norm(x, Some(&rows), &self.norm, &mut c.head_in, r, h, cfg.rms_norm_eps as f32)?;
        b.gemm(&c.head_in, self.lm_matrix()?, Out::F32(&mut c.logits), r, v, h, false)?;
        b.token_logprobs(&c.logits, &tokens, &mut c.logp, &mut c.lse, r, v)?;
        Ok((rows, tokens))
    }

    /// `log p(token | the tokens up to row)` of each `(row, token)` pair of the packed `batch`
    /// (rows counted over all its tokens): a forward pass, no gradient. A sequence's
    /// log-probabilities of its own tokens are the pairs `(row(i, p − 1), ids[p])`.
    pub fn token_logprobs(&self, batch: &Packed, pairs: &[(usize, u32)]) -> Result<Vec<f32>> {
        self.check_tokens(pairs)?;
        if pairs.is_empty() {
            return Ok(Vec::new());
        }
        let read: Vec<usize> = pairs.iter().map(|&(r, _)| r).collect();
        let pass = self.forward(batch, &read, super::backward::Keep::Nothing)?;
        let b = &*self.backend;
        let chunk = self.lm_chunk_rows().min(pairs.len());
        let mut c = LmChunk::new(b, chunk, self.config.hidden_size, self.config.vocab_size)?;
        let mut out = Vec::with_capacity(pairs.len());
        for part in pairs.chunks(chunk) {
            self.lm_chunk(&pass.x, part, &mut c)?;
            out.extend(b.read_f32(&c.logp, part.len())?);
        }
        Ok(out)
    }
}

/// The LM head at `pairs`, `loss` of their log-probabilities (on the host), and its backward:
/// the head's (or the tied embeddings') gradient added to `g`'s (when `trained`), and the last
/// layer's output's gradient. The logits are made twice, once for the log-probabilities the loss needs and once
/// for the backward, unless every row fits one chunk.
pub(super) fn lm_head_backward<B: TrainBackend>(
    dec: &PackedDecoder<B>,
    g: &mut Params<B::F32>,
    pass: &Pass<B>,
    pairs: &[(usize, u32)],
    loss: TokenLossFn<'_>,
    trained: bool,
) -> Result<(f32, B::F32)> {
    let (b, cfg) = (&*dec.backend, &dec.config);
    let (h, v, eps) = (cfg.hidden_size, cfg.vocab_size, cfg.rms_norm_eps as f32);
    let chunk = dec.lm_chunk_rows().min(pairs.len());
    let mut c = LmChunk::new(b, chunk, h, v)?;
    let mut logp = Vec::with_capacity(pairs.len());
    // The rows and tokens on the device of the chunk whose logits `c` holds.
    let mut held = None;
    for part in pairs.chunks(chunk) {
        held = Some(dec.lm_chunk(&pass.x, part, &mut c)?);
        logp.extend(b.read_f32(&c.logp, part.len())?);
    }
    let (value, coef) = loss(&logp)?;
    ensure!(
        coef.len() == pairs.len(),
        "a token loss gave {} derivatives for {} tokens",
        coef.len(),
        pairs.len()
    );
    ensure!(
        value.is_finite() && coef.iter().all(|c| c.is_finite()),
        "the loss is not finite ({value})"
    );
    let (mut d_logits, mut d_head_in) = (b.zeros_bf16(chunk * v)?, b.zeros_f32(chunk * h)?);
    let mut dx = b.zeros_f32(pass.tokens * h)?;
    let (tied, w) = (matches!(dec.head, Head::Lm(None)), dec.lm_matrix()?);
    // One chunk: its logits are still in `c`; several: each is made again.
    if pairs.len() > chunk {
        held = None;
    }
    for (k, part) in pairs.chunks(chunk).enumerate() {
        let r = part.len();
        let (rows, tokens) = match held.take() {
            Some(kept) => kept,
            None => dec.lm_chunk(&pass.x, part, &mut c)?,
        };
        let coef = b.upload_f32(&coef[k * chunk..][..r])?;
        b.token_logprobs_backward(&c.logits, &tokens, &c.lse, &coef, &mut d_logits, r, v)?;
        if trained {
            let d_w = if tied { &mut g.embed } else { &mut g.head[0] };
            b.gemm_weight_grad(&d_logits, &c.head_in, d_w, r, v, h)?;
        }
        b.gemm_nn(&d_logits, w, Out::F32(&mut d_head_in), r, v, h, false)?;
        b.rms_norm_backward(&pass.x, Some(&rows), &dec.norm, &d_head_in, &mut dx, &mut g.norm, r, h, eps)?;
    }
    Ok((value, dx))
}
