//! The packed engine as the rest of the crate sees it: one object-safe interface over
//! [`PackedDecoder`] on any backend (the CUDA engine's, or the reference backend's plain Rust).
//!
//! A [`crate::Model`] either holds its weights in the CPU decoder (candle and the fused CPU
//! kernels) or hands every call to a [`PackedEngine`]; which one is decided once, when the model
//! is made ([`crate::Model::load_on`], [`crate::Model::on_packed`]). Scoring, token
//! log-probabilities and generation ask the model, and the model asks its engine: no caller
//! names a device, and the GPU's code path runs on the reference backend in tests on any machine.

use crate::config::ModelConfig;
use crate::generate::{SamplingParams, StepRows};
use crate::packed::Packed;
use crate::packed_engine::{Backend, PackedDecoder, PagedCache, PagedDecoding, TrainBackend};
use crate::tokenizer::Tokenizer;
use anyhow::Result;
use std::sync::atomic::Ordering;

/// A decoder whose weights live on a packed engine's device.
pub trait PackedEngine: Send + Sync + std::fmt::Debug {
    /// The device's name, for reports (`cpu` is never one).
    fn name(&self) -> String;
    /// The model's hyper-parameters.
    fn config(&self) -> &ModelConfig;
    /// Positions encoded so far.
    fn encoded_tokens(&self) -> usize;
    /// Head outputs at rows `read` of a packed batch, `(values, width)`: the head's columns
    /// `columns` only when given (a Math-Shepherd PRM's two tokens of the vocabulary).
    fn head_at(&self, batch: &Packed, read: &[usize], columns: Option<&[u32]>) -> Result<(Vec<f32>, usize)>;
    /// Each sequence's token log-probabilities (position 0 holds 0), in packed batches of at
    /// most `max_tokens` tokens.
    fn sequence_logprobs(&self, seqs: &[&[u32]], max_tokens: usize) -> Result<Vec<Vec<f32>>>;
    /// A running batch for continuous batching with a KV cache of at most `kv_budget` bytes
    /// (`None`: half the device's free memory), feeding at most `prefill_chunk` prompt tokens a
    /// step (`tok` decodes text for stop strings).
    fn batcher<'a>(
        &'a self,
        tok: Option<&'a Tokenizer>,
        kv_budget: Option<usize>,
        prefill_chunk: usize,
    ) -> Result<Box<dyn Batcher + 'a>>;
}

/// A running batch of generation requests (continuous batching): the methods of
/// [`crate::Decoding`], which hands them to this on a packed engine.
pub trait Batcher: Send {
    /// Continuations being decoded, and those the prompts being fed will start.
    fn live_rows(&self) -> usize;
    /// The rows the last step ran its forward pass on.
    fn last_step(&self) -> StepRows;
    /// Whether no request is waiting for a step.
    fn is_idle(&self) -> bool;
    /// A request for `n` continuations of `prompt`, encoded now; its id.
    fn add(&mut self, prompt: &[u32], n: usize, params: SamplingParams) -> Result<usize>;
    /// A request for `n` continuations of `prompt` fed through the coming steps; its id.
    fn join(&mut self, prompt: &[u32], n: usize, params: SamplingParams) -> Result<usize>;
    /// Drop request `id`.
    fn cancel(&mut self, id: usize);
    /// One decoding step: the requests whose continuations have all stopped.
    fn step(&mut self) -> Result<Vec<(usize, Vec<Vec<u32>>)>>;
}

impl<B: TrainBackend + 'static> PackedEngine for PackedDecoder<B> {
    fn name(&self) -> String {
        Backend::name(&**self.backend())
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn encoded_tokens(&self) -> usize {
        self.encoded_tokens.load(Ordering::Relaxed)
    }

    fn head_at(&self, batch: &Packed, read: &[usize], columns: Option<&[u32]>) -> Result<(Vec<f32>, usize)> {
        PackedDecoder::head_at(self, batch, read, columns)
    }

    fn sequence_logprobs(&self, seqs: &[&[u32]], max_tokens: usize) -> Result<Vec<Vec<f32>>> {
        crate::train::packed::sequence_logprobs(self, seqs, max_tokens)
    }

    fn batcher<'a>(
        &'a self,
        tok: Option<&'a Tokenizer>,
        kv_budget: Option<usize>,
        prefill_chunk: usize,
    ) -> Result<Box<dyn Batcher + 'a>> {
        let bytes = match kv_budget {
            Some(b) => b,
            None => self.backend().memory()?.0 / 2,
        };
        let blocks = PagedCache::blocks_in(self, bytes);
        Ok(Box::new(PagedDecoding::new(self, tok, blocks)?.prefill_chunk(prefill_chunk)))
    }
}

impl<B: Backend> Batcher for PagedDecoding<'_, B> {
    fn live_rows(&self) -> usize {
        PagedDecoding::live_rows(self)
    }

    fn last_step(&self) -> StepRows {
        PagedDecoding::last_step(self)
    }

    fn is_idle(&self) -> bool {
        PagedDecoding::is_idle(self)
    }

    fn add(&mut self, prompt: &[u32], n: usize, params: SamplingParams) -> Result<usize> {
        PagedDecoding::add(self, prompt, n, params)
    }

    fn join(&mut self, prompt: &[u32], n: usize, params: SamplingParams) -> Result<usize> {
        PagedDecoding::join(self, prompt, n, params)
    }

    fn cancel(&mut self, id: usize) {
        PagedDecoding::cancel(self, id)
    }

    fn step(&mut self) -> Result<Vec<(usize, Vec<Vec<u32>>)>> {
        PagedDecoding::step(self)
    }
}
