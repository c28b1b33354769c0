//! The packed engine's side of continuous batching ([`PagedRows`]): the decoding rows' and
//! prompts' places in the paged KV cache, and one forward pass over their new tokens (a packed
//! batch over the cache). The scheduler is [`crate::Decoding`], the same as on the CPU, so both
//! give the same samples for the same logits. The cache's blocks bound memory: a request is
//! admitted when the blocks its worst case needs are free, and one that could never fit is
//! refused.

use super::paged::{worst_case_blocks, PagedCache, PagedSeq};
use super::{Backend, PackedDecoder};
use crate::decode_cache::{DecodeCache, PassAdapters, Sample};
use anyhow::{bail, Result};

/// The paged cache of a running batch on the packed engine.
pub struct PagedRows<'a, B: Backend> {
    engine: &'a PackedDecoder<B>,
    cache: PagedCache<B>,
    /// Each decoding row's sequence, in the scheduler's row order.
    rows: Vec<PagedSeq>,
    /// Each prompt's sequence, in the scheduler's prefill order.
    prompts: Vec<PagedSeq>,
    /// Sequences kept after their rows left ([`DecodeCache::retain_row`]), by handle.
    kept: std::collections::HashMap<usize, PagedSeq>,
    /// The next handle.
    next_handle: usize,
}

impl<'a, B: Backend> PagedRows<'a, B> {
    /// An empty batch's cache on `engine`, of `blocks` blocks.
    pub fn new(engine: &'a PackedDecoder<B>, blocks: usize) -> Result<Self> {
        Ok(PagedRows {
            cache: PagedCache::new(engine, blocks)?,
            engine,
            rows: Vec::new(),
            prompts: Vec::new(),
            kept: std::collections::HashMap::new(),
            next_handle: 0,
        })
    }
}

impl<B: Backend> DecodeCache for PagedRows<'_, B> {
    fn vocab(&self) -> usize {
        self.engine.config.vocab_size
    }

    fn reserve(&self, prompt: usize, n: usize, max_new: usize) -> Result<usize> {
        let end = prompt + max_new;
        let positions = self.engine.config.max_position_embeddings;
        if end > positions {
            bail!("a prompt of {prompt} tokens and {max_new} new ones exceed the model's max_position_embeddings ({positions})");
        }
        let reserved = worst_case_blocks(prompt, n, max_new);
        if reserved > self.cache.total_blocks() {
            bail!(
                "{n} continuations of a {prompt}-token prompt with {max_new} new tokens each need {reserved} KV cache blocks at worst; the cache holds {} (raise the KV budget, or ask for fewer)",
                self.cache.total_blocks()
            );
        }
        Ok(reserved)
    }

    fn capacity(&self) -> usize {
        self.cache.total_blocks()
    }

    fn blocks(&self) -> Option<(usize, usize)> {
        Some((self.cache.free_blocks(), self.cache.total_blocks()))
    }

    fn adapters(&self) -> Option<std::sync::Arc<crate::Adapters>> {
        self.engine.served_adapters()
    }

    fn encode_alone(&mut self, _prompt: &[u32], _adapter: Option<usize>) -> Result<Option<Vec<f32>>> {
        // Prompts wait for blocks and are fed through the steps.
        Ok(None)
    }

    fn push_prompt(&mut self) {
        self.prompts.push(PagedSeq::default());
    }

    fn drop_prompt(&mut self, i: usize) {
        let mut seq = self.prompts.remove(i);
        self.cache.release(&mut seq);
    }

    fn keep_rows(&mut self, keep: &[usize]) -> Result<()> {
        let mut kept = Vec::with_capacity(keep.len());
        let mut keep = keep.iter().peekable();
        for (k, mut seq) in std::mem::take(&mut self.rows).into_iter().enumerate() {
            if keep.next_if_eq(&&k).is_some() {
                kept.push(seq);
            } else {
                self.cache.release(&mut seq);
            }
        }
        self.rows = kept;
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
        for seq in &mut self.rows {
            let len = seq.len + 1;
            self.cache.grow(seq, len)?;
        }
        for (seq, chunk) in self.prompts.iter_mut().zip(chunks) {
            let len = seq.len + chunk.len();
            self.cache.grow(seq, len)?;
        }
        // Rows read: every decoding row's token, and each finishing prompt's last.
        let mut read: Vec<usize> = (0..self.rows.len()).collect();
        let mut at = self.rows.len();
        for chunk in &chunks[..finishing] {
            at += chunk.len();
            read.push(at - 1);
        }
        let next_tokens: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
        let mut seqs: Vec<(&mut PagedSeq, &[u32])> = self
            .rows
            .iter_mut()
            .zip(&next_tokens)
            .map(|(seq, t)| (seq, t.as_slice()))
            .collect();
        seqs.extend(self.prompts.iter_mut().zip(chunks.iter().copied()));
        let each: Vec<Option<usize>> = match adapters.any() {
            true => adapters.rows.iter().chain(&adapters.prompts).copied().collect(),
            false => Vec::new(),
        };
        let logits = self.engine.logits_paged_with(&mut seqs, &mut self.cache, &read, &each)?;
        if read.is_empty() {
            return Ok(());
        }
        sample(&logits)
    }

    fn start(&mut self, i: usize, n: usize) -> Result<()> {
        let mut prompt = self.prompts.remove(i);
        for _ in 0..n {
            let seq = self.cache.fork(self.engine.backend(), &prompt)?;
            self.rows.push(seq);
        }
        self.cache.release(&mut prompt);
        Ok(())
    }

    fn retain_row(&mut self, k: usize) -> Option<(usize, usize)> {
        let seq = std::mem::take(self.rows.get_mut(k)?);
        let (handle, room) = (self.next_handle, seq.blocks.len());
        self.next_handle += 1;
        self.kept.insert(handle, seq);
        Some((handle, room))
    }

    fn prompt_from(&mut self, handle: usize, len: usize) -> Result<()> {
        let Some(kept) = self.kept.get(&handle) else {
            bail!("no sequence kept under handle {handle}");
        };
        if len > kept.len {
            bail!("a prompt cannot start from {len} positions of a sequence that cached {}", kept.len);
        }
        // Its full blocks shared, the one it ends inside copied (the prompt writes on from there).
        let prefix = PagedSeq {
            blocks: kept.blocks[..super::paged::blocks_for(len)].to_vec(),
            len,
        };
        let seq = self.cache.fork(self.engine.backend(), &prefix)?;
        let last = self.prompts.last_mut().expect("a prompt was pushed");
        self.cache.release(last);
        *last = seq;
        Ok(())
    }

    fn forget(&mut self, handle: usize) {
        if let Some(mut seq) = self.kept.remove(&handle) {
            self.cache.release(&mut seq);
        }
    }
}
