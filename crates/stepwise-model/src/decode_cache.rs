//! What continuous batching needs of a device: the keys and values of a running batch, and one
//! forward pass over them. [`crate::Decoding`] is the one scheduler (requests, rows, prompt
//! chunks, stops, sampling, admission against a budget); a [`DecodeCache`] is all that differs
//! between engines, as vLLM keeps its scheduler, KV-cache manager and sampler apart:
//!
//! - [`CpuRows`] (this file): the CPU decoder's caches, one a row (or, where candle's path runs,
//!   one left-padded cache for the batch), with no bound but memory;
//! - [`crate::packed_engine::PagedRows`]: the packed engine's paged cache (a GPU's, or the
//!   reference backend's in tests), bounded by its blocks.
//!
//! A cache holds two ordered lists the scheduler indexes: the decoding rows (the scheduler's row
//! order) and the prompts being fed (its prefill order).

use crate::input::{BatchCache, Input};
use crate::kv_rows::RowsCache;
use crate::model::{Head, Model};
use crate::transformer::KvCache;
use anyhow::{bail, Result};
use candle_core::{IndexOp, Tensor};

/// Where a logits callback writes: every row's next token, then each prompt fed whole's logits.
pub type Sample<'s> = dyn FnMut(&[f32]) -> Result<()> + Send + 's;

/// The served adapters ([`crate::Adapters`]) of a pass's sequences: each decoding row's and each
/// prompt chunk's (`None`, or none given: the base model).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassAdapters {
    /// Each decoding row's adapter, in the rows' order.
    pub rows: Vec<Option<usize>>,
    /// Each prompt chunk's adapter, in the prompts' order.
    pub prompts: Vec<Option<usize>>,
}

impl PassAdapters {
    /// Whether a sequence of the pass runs with an adapter.
    pub fn any(&self) -> bool {
        self.rows.iter().chain(&self.prompts).any(Option::is_some)
    }
}

/// The keys and values of a running batch on one engine (see the module's documentation).
pub trait DecodeCache: Send {
    /// The model's vocabulary size (a prompt's tokens are checked against it when it comes).
    fn vocab(&self) -> usize;
    /// The room `n` continuations of a `prompt`-token prompt, `max_new` tokens each, take at
    /// worst, in the units of [`DecodeCache::capacity`]; an error when they could never fit.
    fn reserve(&self, prompt: usize, n: usize, max_new: usize) -> Result<usize>;
    /// The room in all (`usize::MAX`: no bound).
    fn capacity(&self) -> usize;
    /// The adapters the engine serves ([`crate::Model::serve_adapters`]).
    fn adapters(&self) -> Option<std::sync::Arc<crate::Adapters>> {
        None
    }
    /// Blocks free now and in all, for a cache made of blocks.
    fn blocks(&self) -> Option<(usize, usize)>;
    /// Encodes `prompt` in a pass of its own as a new prompt (the last), fed whole, with the
    /// served `adapter`; its last position's logits. `None` where prompts are only fed through
    /// the decoding steps.
    fn encode_alone(&mut self, prompt: &[u32], adapter: Option<usize>) -> Result<Option<Vec<f32>>>;
    /// A new prompt to feed, the last, with nothing cached yet.
    fn push_prompt(&mut self);
    /// Prompt `i` leaves (its request was cancelled), giving its room back.
    fn drop_prompt(&mut self, i: usize);
    /// Only rows `keep` (indices, ascending) stay, in that order; the others give their room back.
    fn keep_rows(&mut self, keep: &[usize]) -> Result<()>;
    /// One forward pass: each row continued by its token `next[r]`, and the first `chunks.len()`
    /// prompts by `chunks[i]`, each with its served adapter of `adapters`; then `sample` gets the
    /// logits (`[rows + finishing, vocab]`) of every row and of the last token of the first
    /// `finishing` prompts (those fed to their end). With no row to read (only a prompt's middle
    /// chunk ran), `sample` is not called.
    fn forward(
        &mut self,
        next: &[u32],
        chunks: &[&[u32]],
        adapters: &PassAdapters,
        finishing: usize,
        sample: &mut Sample,
    ) -> Result<()>;
    /// Prompt `i`, fed whole, becomes `n` rows after the others, sharing what it cached.
    fn start(&mut self, i: usize, n: usize) -> Result<()>;
    /// Row `k`, about to leave, keeps what it cached under a handle for later prompts to start
    /// from ([`DecodeCache::prompt_from`]); the row itself then leaves with nothing. The handle
    /// and the room it holds at most; `None` (the default) where the cache cannot keep a row's
    /// keys and values apart from it.
    fn retain_row(&mut self, k: usize) -> Option<(usize, usize)> {
        let _ = k;
        None
    }
    /// The last prompt pushed starts as the first `len` positions kept under `handle` (which
    /// stays), so only its tokens after them are fed.
    fn prompt_from(&mut self, handle: usize, len: usize) -> Result<()> {
        let _ = (handle, len);
        anyhow::bail!("this cache keeps no sequence to start a prompt from")
    }
    /// What was kept under `handle` gives its room back.
    fn forget(&mut self, handle: usize) {
        let _ = handle;
    }
}

/// The CPU decoder's caches.
pub struct CpuRows<'a> {
    model: &'a Model,
    rows: RowCaches,
    /// Rows held.
    len: usize,
    /// Each prompt's cache.
    prompts: Vec<KvCache>,
}

/// The decoding rows' keys and values.
enum RowCaches {
    /// A cache a row, where the CPU inference kernels run: a step writes one position a row,
    /// and a row leaving or joining copies no other row's.
    Own(RowsCache),
    /// One cache for all rows, left-padded (the candle path: a model being trained).
    Shared(KvCache),
}

impl<'a> CpuRows<'a> {
    /// Empty caches of the kind `model` reads.
    pub fn new(model: &'a Model) -> Self {
        let rows = if model.device.is_cpu() && !model.decoder.differentiable {
            RowCaches::Own(RowsCache::default())
        } else {
            RowCaches::Shared(KvCache::default())
        };
        CpuRows {
            model,
            rows,
            len: 0,
            prompts: Vec::new(),
        }
    }

    /// Vocabulary logits of `hidden` states `[b, hidden]`, refused for a model without an LM head.
    fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        if !matches!(self.model.head, Head::Lm(_)) {
            bail!(
                "generation needs a causal LM head (architecture {})",
                self.model.config.architecture
            );
        }
        self.model.head_logits(hidden)
    }
}

impl DecodeCache for CpuRows<'_> {
    fn vocab(&self) -> usize {
        self.model.config.vocab_size
    }

    fn reserve(&self, _prompt: usize, _n: usize, _max_new: usize) -> Result<usize> {
        Ok(0)
    }

    fn capacity(&self) -> usize {
        usize::MAX
    }

    fn blocks(&self) -> Option<(usize, usize)> {
        None
    }

    fn adapters(&self) -> Option<std::sync::Arc<crate::Adapters>> {
        self.model.adapters()
    }

    fn encode_alone(&mut self, prompt: &[u32], adapter: Option<usize>) -> Result<Option<Vec<f32>>> {
        let mut cache = KvCache::default();
        let ids = Tensor::new(prompt, &self.model.device)?.unsqueeze(0)?;
        let input = Input::padded(&ids, None).cache(&mut cache).adapters(vec![adapter]);
        let h = self.model.hidden(input)?;
        let first = self.logits(&last_hidden(&h)?)?.squeeze(0)?.to_vec1()?;
        self.prompts.push(cache);
        Ok(Some(first))
    }

    fn push_prompt(&mut self) {
        self.prompts.push(KvCache::default());
    }

    fn drop_prompt(&mut self, i: usize) {
        self.prompts.remove(i);
    }

    fn keep_rows(&mut self, keep: &[usize]) -> Result<()> {
        match &mut self.rows {
            RowCaches::Own(cache) => cache.keep(keep),
            RowCaches::Shared(cache) => {
                *cache = if keep.is_empty() {
                    KvCache::default()
                } else {
                    let index = Tensor::new(keep.iter().map(|&k| k as u32).collect::<Vec<_>>(), &self.model.device)?;
                    cache.select(&index)?
                };
            }
        }
        self.len = keep.len();
        Ok(())
    }

    fn forward(
        &mut self,
        next: &[u32],
        chunks: &[&[u32]],
        adapters: &PassAdapters,
        finishing: usize,
        sample: &mut Sample,
    ) -> Result<()> {
        let dev = &self.model.device;
        let decoding = (!next.is_empty())
            .then(|| Tensor::new(next, dev)?.unsqueeze(1))
            .transpose()?;
        let chunk_ids = chunks
            .iter()
            .map(|c| Tensor::new(*c, dev)?.unsqueeze(0))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let mut parts = Vec::with_capacity(chunks.len() + 1);
        if let Some(ids) = &decoding {
            let cache = match &mut self.rows {
                RowCaches::Own(cache) => BatchCache::Rows(cache),
                RowCaches::Shared(cache) => BatchCache::Padded(cache),
            };
            parts.push(Input::padded(ids, None).cache(cache).adapters(adapters.rows.clone()));
        }
        for (i, (ids, cache)) in chunk_ids.iter().zip(self.prompts.iter_mut()).enumerate() {
            let adapter = adapters.prompts.get(i).copied().flatten();
            parts.push(Input::padded(ids, None).cache(cache).adapters(vec![adapter]));
        }
        let input = parts.into_iter().reduce(Input::and).expect("a step of at least one part");
        let mut hidden = self.model.hidden_parts(input)?.into_iter();
        // The rows that need logits: every row's, and each finishing prompt's last.
        let mut last = Vec::with_capacity(1 + finishing);
        if decoding.is_some() {
            last.push(last_hidden(&hidden.next().expect("the decoding rows' hidden states"))?);
        }
        for h in hidden.take(finishing) {
            last.push(last_hidden(&h)?);
        }
        if last.is_empty() {
            return Ok(());
        }
        // `[b, 1, hidden]` read at its one position, as a prompt's last is read.
        let logits = self.logits(&last_hidden(&Tensor::cat(&last, 0)?.unsqueeze(1)?)?)?;
        with_host_f32(&logits, sample)?
    }

    fn start(&mut self, i: usize, n: usize) -> Result<()> {
        let prefix = self.prompts.remove(i);
        match &mut self.rows {
            RowCaches::Own(cache) => cache.push_copies(&prefix, n)?,
            RowCaches::Shared(cache) => {
                let joining = prefix.repeat_batch(n)?;
                *cache = if self.len == 0 {
                    joining
                } else {
                    cache.concat_batch(&joining)?
                };
            }
        }
        self.len += n;
        Ok(())
    }
}

/// `f` over the values of an f32 tensor, read where they lie when it is contiguous on the CPU
/// (a decoding step's logits are tens of megabytes: copying them out was a visible share of
/// serving), else copied out first.
fn with_host_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    {
        let (storage, layout) = t.storage_and_layout();
        if let (candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)), Some((start, end))) =
            (&*storage, layout.contiguous_offsets())
        {
            return Ok(f(&v[start..end]));
        }
    }
    Ok(f(&t.flatten_all()?.to_vec1::<f32>()?))
}

/// The hidden state of each sequence's last position, `[b, hidden]`.
fn last_hidden(hidden: &Tensor) -> Result<Tensor> {
    let t = hidden.dim(1)?;
    Ok(hidden.i((.., t - 1, ..))?)
}
