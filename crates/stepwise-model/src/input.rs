//! What one forward pass of the decoder takes ([`Input`]) — the only argument of
//! [`crate::transformer::Transformer::forward`] and [`crate::Model::hidden`].
//!
//! An input is one or more *parts* run through the decoder together (their rows go through every
//! product at once, so the weights are read once for all of them; each part attends only to its
//! own tokens and cache), and the positions to read back:
//!
//! | input | used by |
//! |---|---|
//! | `Input::padded(&ids, mask)` | training, log-ratio verifiers, the lab's confidence |
//! | `Input::packed(&batch).read(&rows)` | step scoring: every PRM and ORM |
//! | `Input::padded(&ids, None).cache(&mut kv)` | a prompt's prefill; incremental scoring |
//! | `Input::padded(&step, None).cache(&mut rows).and(Input::padded(&chunk, None).cache(&mut kv))` | a decoding step with chunked prefill |
//!
//! Which kernels run is decided in one place from the input alone
//! ([`crate::transformer::Transformer::forward`]'s table).

use crate::kv_cache::KvCache;
use crate::kv_rows::{RowsCache, RowsLayer};
use crate::packed::Packed;
use candle_core::Tensor;

/// The tokens of one part of an input.
#[derive(Clone, Copy, Debug)]
pub enum Tokens<'a> {
    /// Token ids `[b, t]`, right-padded where `pad_mask` (`[b, cached + t]`, 1 = real token,
    /// 0 = padding, covering the cached positions and the new ones) says so.
    Padded {
        /// The ids, `[b, t]`.
        ids: &'a Tensor,
        /// Which positions are tokens (`None`: all of them).
        pad_mask: Option<&'a Tensor>,
    },
    /// Sequences laid end to end, no padding (no cache).
    Packed(&'a Packed),
}

/// The cache a part continues (and extends by its tokens).
pub enum BatchCache<'c> {
    /// One cache for the part's sequences, left-padded to the longest.
    Padded(&'c mut KvCache),
    /// A cache a sequence, each continued by one new token (a decoding step's rows on the CPU,
    /// in inference: see [`RowsCache`]).
    Rows(&'c mut RowsCache),
}

impl<'c> From<&'c mut KvCache> for BatchCache<'c> {
    fn from(c: &'c mut KvCache) -> Self {
        BatchCache::Padded(c)
    }
}

impl<'c> From<&'c mut RowsCache> for BatchCache<'c> {
    fn from(c: &'c mut RowsCache) -> Self {
        BatchCache::Rows(c)
    }
}

impl BatchCache<'_> {
    /// The same cache, borrowed for a shorter while.
    pub(crate) fn reborrow(&mut self) -> BatchCache<'_> {
        match self {
            BatchCache::Padded(c) => BatchCache::Padded(c),
            BatchCache::Rows(c) => BatchCache::Rows(c),
        }
    }

    /// Each layer's part of the cache, in order.
    pub(crate) fn layer_views(&mut self) -> Vec<LayerView<'_>> {
        match self {
            BatchCache::Padded(c) => c.layers.iter_mut().map(LayerView::Padded).collect(),
            BatchCache::Rows(c) => c.layer_views().into_iter().map(LayerView::Rows).collect(),
        }
    }
}

/// One layer's keys and values of one part, `[b, kv_heads, s, head_dim]` each.
pub(crate) type LayerCache = Option<(Tensor, Tensor)>;

/// One layer's part of a cache during a forward pass.
pub(crate) enum LayerView<'c> {
    Padded(&'c mut LayerCache),
    Rows(RowsLayer<'c>),
}

/// One part of an input: tokens and, optionally, the cache they continue.
pub struct Part<'a> {
    /// The tokens.
    pub tokens: Tokens<'a>,
    /// The cache they continue and extend (`None`: they start at position 0 and nothing is kept).
    pub cache: Option<BatchCache<'a>>,
    /// The served adapter ([`crate::Adapters`]) each sequence runs with: one entry for all of
    /// them, none (or `None`) for the base model.
    pub adapters: Vec<Option<usize>>,
}

/// The input of one forward pass: one or more parts, and the positions read back (all of them,
/// or the rows a reward model reads).
pub struct Input<'a> {
    /// The parts, in the order their hidden states come back.
    pub parts: Vec<Part<'a>>,
    /// Positions `read[i]` of each sequence `i` (of the one part), or `None` for every position.
    pub read: Option<&'a [Vec<usize>]>,
}

impl<'a> Input<'a> {
    fn one(tokens: Tokens<'a>) -> Self {
        Input {
            parts: vec![Part {
                tokens,
                cache: None,
                adapters: Vec::new(),
            }],
            read: None,
        }
    }

    /// Token ids `[b, t]`, right-padded where `pad_mask` is 0.
    pub fn padded(ids: &'a Tensor, pad_mask: Option<&'a Tensor>) -> Self {
        Self::one(Tokens::Padded { ids, pad_mask })
    }

    /// A packed batch (sequences end to end, no padding).
    pub fn packed(batch: &'a Packed) -> Self {
        Self::one(Tokens::Packed(batch))
    }

    /// The tokens (of the last part) continue `cache`, which grows by them; an empty cache is
    /// filled from position 0.
    pub fn cache(mut self, cache: impl Into<BatchCache<'a>>) -> Self {
        if let Some(last) = self.parts.last_mut() {
            last.cache = Some(cache.into());
        }
        self
    }

    /// The sequences (of the last part) run with the served adapters `adapters`
    /// ([`crate::Model::serve_adapters`]): `adapters[i]` for sequence `i`, or one for all of
    /// them; `None` is the base model.
    pub fn adapters(mut self, adapters: Vec<Option<usize>>) -> Self {
        if let Some(last) = self.parts.last_mut() {
            last.adapters = adapters;
        }
        self
    }

    /// Whether a sequence of any part runs with an adapter.
    pub(crate) fn adapted(&self) -> bool {
        self.parts.iter().any(|p| p.adapters.iter().any(Option::is_some))
    }

    /// Only positions `rows[i]` of each sequence `i` are read back, stacked `[Σ rows, hidden]`:
    /// what a reward model reads (the last layer then runs for these rows only, where the CPU
    /// kernels take the input). For an input of one part.
    pub fn read(mut self, rows: &'a [Vec<usize>]) -> Self {
        self.read = Some(rows);
        self
    }

    /// `other`'s parts run in the same pass, after these.
    pub fn and(mut self, other: Input<'a>) -> Self {
        self.parts.extend(other.parts);
        self
    }
}
