//! The packed engine as the rest of the crate sees it: one object-safe interface over
//! [`PackedDecoder`] on any backend (the CUDA engine's, or the reference backend's plain Rust).
//!
//! A [`crate::Model`] either holds its weights in the CPU decoder (candle and the fused CPU
//! kernels) or hands every call to a [`PackedEngine`]; which one is decided once, when the model
//! is made ([`crate::Model::load_on`], [`crate::Model::on_packed`]). Scoring, token
//! log-probabilities and generation ask the model, and the model asks its engine: no caller
//! names a device, and the GPU's code path runs on the reference backend in tests on any machine.

use crate::config::ModelConfig;
use crate::decode_cache::DecodeCache;
use crate::packed::Packed;
use crate::packed_engine::paged::worst_case_blocks;
use crate::packed_engine::{Backend, PackedDecoder, PagedCache, PagedRows, TrainBackend};
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
    /// [`PackedEngine::head_at`] with each sequence's served adapter (`adapters[i]`, or one for
    /// all).
    fn head_at_with(
        &self,
        batch: &Packed,
        read: &[usize],
        columns: Option<&[u32]>,
        adapters: &[Option<usize>],
    ) -> Result<(Vec<f32>, usize)>;
    /// Serves `adapters` unmerged on its weights (refused where the device has no kernel for
    /// them: the CUDA engine's).
    fn serve_adapters(&self, adapters: Option<std::sync::Arc<crate::Adapters>>) -> Result<()>;
    /// The form it reads adapters in, or why it serves none ([`PackedDecoder::adapter_form`]).
    fn adapter_form(&self) -> Result<crate::adapters::Form>;
    /// Each sequence's token log-probabilities (position 0 holds 0), in packed batches of at
    /// most `max_tokens` tokens.
    fn sequence_logprobs(&self, seqs: &[&[u32]], max_tokens: usize) -> Result<Vec<Vec<f32>>>;
    /// For each query `(context, options)`, each option's log-probability after the context:
    /// the context fed once and kept, the options going on from its cache
    /// ([`PackedDecoder::options_after`]), in groups of at most `max_tokens` context tokens.
    fn options_after(&self, queries: &[crate::packed_engine::Query<'_>], max_tokens: usize) -> Result<Vec<Vec<f64>>>;
    /// The KV cache of a running batch ([`crate::Decoding`]), as big as `size` says.
    fn decode_cache<'a>(&'a self, size: KvSize) -> Result<Box<dyn DecodeCache + 'a>>;
}

/// How big a batch's paged KV cache is made: the budget, or less when every request is known
/// when the cache is made ([`fn@crate::generate`]'s one request, an RL update's prompts), since a
/// pool is allocated whole and zeroed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvSize {
    /// At most this many bytes of keys and values (`None`: the backend's default budget, half
    /// the device's free memory, on the CPU at most 2 GiB).
    pub budget: Option<usize>,
    /// Only what these requests need at worst together, when they are all the batch will hold
    /// (empty: not known): `(prompt tokens, continuations, new tokens each)` a request.
    pub only_for: Vec<(usize, usize, usize)>,
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

    fn head_at_with(
        &self,
        batch: &Packed,
        read: &[usize],
        columns: Option<&[u32]>,
        adapters: &[Option<usize>],
    ) -> Result<(Vec<f32>, usize)> {
        PackedDecoder::head_at_with(self, batch, read, columns, adapters)
    }

    fn serve_adapters(&self, adapters: Option<std::sync::Arc<crate::Adapters>>) -> Result<()> {
        PackedDecoder::serve_adapters(self, adapters)
    }

    fn adapter_form(&self) -> Result<crate::adapters::Form> {
        PackedDecoder::adapter_form(self)
    }

    fn sequence_logprobs(&self, seqs: &[&[u32]], max_tokens: usize) -> Result<Vec<Vec<f32>>> {
        crate::train::packed::sequence_logprobs(self, seqs, max_tokens)
    }

    fn options_after(&self, queries: &[crate::packed_engine::Query<'_>], max_tokens: usize) -> Result<Vec<Vec<f64>>> {
        PackedDecoder::options_after(self, queries, max_tokens)
    }

    fn decode_cache<'a>(&'a self, size: KvSize) -> Result<Box<dyn DecodeCache + 'a>> {
        let bytes = match size.budget {
            Some(b) => b,
            None => self.backend().kv_budget()?,
        };
        let mut blocks = PagedCache::blocks_in(self, bytes);
        if !size.only_for.is_empty() {
            // A request that cannot fit is refused by the budget's cache, which says so.
            let worst: usize = size.only_for.iter().map(|&(p, n, m)| worst_case_blocks(p, n, m)).sum();
            blocks = blocks.min(worst.max(1));
        }
        Ok(Box::new(PagedRows::new(self, blocks)?))
    }
}
