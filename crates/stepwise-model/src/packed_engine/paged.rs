//! The KV cache of generation on the packed engine, in blocks of [`BLOCK`] positions taken from
//! one pool per layer (paged, as vLLM's): a sequence holds a list of blocks; continuations of one
//! prompt share its full blocks (counted references) and copy only its last, partly filled one;
//! a finished sequence gives its blocks back. The pool's size is the KV budget: generation admits
//! a request only when its blocks are free, so memory never grows past it.

use super::{Attend, Backend, PackedDecoder, PagedInts};
use anyhow::{bail, ensure, Result};

/// Positions a block of the cache holds (the attention kernels' key tile).
pub const BLOCK: usize = 64;

/// One sequence's place in the cache: its blocks, and how many positions they hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PagedSeq {
    /// The cache blocks holding its positions, in order.
    pub blocks: Vec<u32>,
    /// Positions cached.
    pub len: usize,
}

/// Blocks that hold `positions` positions.
pub fn blocks_for(positions: usize) -> usize {
    positions.div_ceil(BLOCK)
}

/// The blocks `n` continuations of a `prompt`-token prompt with `max_new` new tokens each need
/// at worst: the prompt's, shared, and each continuation's from the prompt's last, partly
/// filled block (copied) to its end.
pub fn worst_case_blocks(prompt: usize, n: usize, max_new: usize) -> usize {
    blocks_for(prompt) + n * (blocks_for(prompt + max_new) - prompt / BLOCK)
}

/// The keys and values of every layer, in a pool of blocks.
pub struct PagedCache<B: Backend> {
    pub(super) k: Vec<B::Bf16>,
    pub(super) v: Vec<B::Bf16>,
    /// Values a position holds in one layer's keys (`kv_heads · head_dim`).
    width: usize,
    free: Vec<u32>,
    /// References to each block (0: free).
    refs: Vec<u32>,
}

impl<B: Backend> PagedCache<B> {
    /// A pool of `blocks` blocks for `engine`'s layers.
    pub fn new(engine: &PackedDecoder<B>, blocks: usize) -> Result<Self> {
        ensure!(blocks > 0, "a KV cache of no blocks");
        let cfg = &engine.config;
        let width = cfg.num_key_value_heads * cfg.head_dim;
        let b = &**engine.backend();
        let pool = || b.zeros_bf16(blocks * BLOCK * width);
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for _ in 0..cfg.num_hidden_layers {
            k.push(pool()?);
            v.push(pool()?);
        }
        Ok(PagedCache {
            k,
            v,
            width,
            free: (0..blocks as u32).rev().collect(),
            refs: vec![0; blocks],
        })
    }

    /// The blocks a KV budget of `bytes` holds for `engine` (keys and values, bf16, every layer).
    pub fn blocks_in(engine: &PackedDecoder<B>, bytes: usize) -> usize {
        let cfg = &engine.config;
        let per_block = 2 * 2 * BLOCK * cfg.num_key_value_heads * cfg.head_dim * cfg.num_hidden_layers.max(1);
        bytes / per_block
    }

    /// Blocks free now.
    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Blocks in all.
    pub fn total_blocks(&self) -> usize {
        self.refs.len()
    }

    fn take(&mut self) -> Result<u32> {
        match self.free.pop() {
            Some(b) => {
                self.refs[b as usize] = 1;
                Ok(b)
            }
            None => bail!("the KV cache is full ({} blocks)", self.refs.len()),
        }
    }

    /// Blocks enough for `seq` to hold `positions` positions (its own, new ones).
    pub fn grow(&mut self, seq: &mut PagedSeq, positions: usize) -> Result<()> {
        while seq.blocks.len() < blocks_for(positions) {
            let b = self.take()?;
            seq.blocks.push(b);
        }
        Ok(())
    }

    /// `seq`'s blocks given back (a shared block once its last holder gives it back).
    pub fn release(&mut self, seq: &mut PagedSeq) {
        for b in seq.blocks.drain(..) {
            let r = &mut self.refs[b as usize];
            *r = r.saturating_sub(1);
            if *r == 0 {
                self.free.push(b);
            }
        }
        seq.len = 0;
    }

    /// A continuation of `seq`: its full blocks shared, its last partly filled block copied into
    /// a block of the continuation's own (which the continuation goes on writing into).
    pub fn fork(&mut self, backend: &B, seq: &PagedSeq) -> Result<PagedSeq> {
        let full = seq.len / BLOCK;
        let mut blocks: Vec<u32> = seq.blocks[..full].to_vec();
        for &b in &blocks {
            self.refs[b as usize] += 1;
        }
        if !seq.len.is_multiple_of(BLOCK) {
            let own = self.take()?;
            let (src, values) = (seq.blocks[full] as usize, BLOCK * self.width);
            for layer in self.k.iter_mut().chain(self.v.iter_mut()) {
                backend.copy_block(layer, src, own as usize, values)?;
            }
            blocks.push(own);
        }
        Ok(PagedSeq { blocks, len: seq.len })
    }
}

impl<B: Backend> PackedDecoder<B> {
    /// Vocabulary logits at rows `read` of a paged batch: each sequence `seqs[i].0` (its cache)
    /// continued by the tokens `seqs[i].1`, whose keys and values are written into the cache
    /// (the caller has grown each sequence to hold them; their lengths are advanced here). Rows
    /// index the new tokens of all sequences, in order. Returns `[read.len(), vocab]` values.
    pub fn logits_paged(
        &self,
        seqs: &mut [(&mut PagedSeq, &[u32])],
        cache: &mut PagedCache<B>,
        read: &[usize],
    ) -> Result<Vec<f32>> {
        self.logits_paged_with(seqs, cache, read, &[])
    }

    /// [`PackedDecoder::logits_paged`] with each sequence's served adapter (`adapters[i]`, or
    /// one for all; [`PackedDecoder::serve_adapters`]).
    pub fn logits_paged_with(
        &self,
        seqs: &mut [(&mut PagedSeq, &[u32])],
        cache: &mut PagedCache<B>,
        read: &[usize],
        adapters: &[Option<usize>],
    ) -> Result<Vec<f32>> {
        let b = &*self.backend;
        let cfg = &self.config;
        if !matches!(self.head, super::Head::Lm(_)) {
            bail!("generation needs a causal LM head (architecture {})", cfg.architecture);
        }
        let mut tokens = Vec::new();
        let (mut positions, mut seq_of_row, mut slots) = (Vec::new(), Vec::new(), Vec::new());
        let max_blocks = seqs
            .iter()
            .map(|(s, new)| blocks_for(s.len + new.len()))
            .max()
            .unwrap_or(0);
        let mut block_table = vec![-1i32; seqs.len() * max_blocks.max(1)];
        for (i, (seq, new)) in seqs.iter().enumerate() {
            let end = seq.len + new.len();
            if end > self.config.max_position_embeddings {
                bail!(
                    "a sequence of {end} tokens exceeds the model's max_position_embeddings ({})",
                    self.config.max_position_embeddings
                );
            }
            ensure!(
                seq.blocks.len() >= blocks_for(end),
                "a sequence's blocks do not hold its new tokens"
            );
            if let Some(&bad) = new.iter().find(|&&id| id as usize >= cfg.vocab_size) {
                bail!("token id {bad} is outside the model's vocabulary of {}", cfg.vocab_size);
            }
            for (k, &blk) in seq.blocks.iter().enumerate().take(max_blocks) {
                block_table[i * max_blocks + k] = blk as i32;
            }
            for p in seq.len..end {
                positions.push(p as i32);
                seq_of_row.push(i as i32);
                slots.push((seq.blocks[p / super::paged::BLOCK] as usize * BLOCK + p % BLOCK) as i32);
            }
            tokens.extend_from_slice(new);
        }
        if let Some(&r) = read.iter().find(|&&r| r >= tokens.len()) {
            bail!("row {r} is past the end of a batch of {} new tokens", tokens.len());
        }
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let meta = PagedInts {
            positions: b.upload_i32(&positions)?,
            seq_of_row: b.upload_i32(&seq_of_row)?,
            slots: b.upload_i32(&slots)?,
            block_table: b.upload_i32(&block_table)?,
            max_blocks,
            read: b.upload_i32(&read.iter().map(|&r| r as i32).collect::<Vec<_>>())?,
        };
        let lens: Vec<usize> = seqs.iter().map(|(_, new)| new.len()).collect();
        let lora = self.row_adapters(&lens, adapters)?;
        self.encoded_tokens
            .fetch_add(tokens.len(), std::sync::atomic::Ordering::Relaxed);
        self.with_scratch(|s| {
            s.lora = lora;
            self.layers_over(
                &tokens,
                &meta.positions,
                &meta.read,
                read.len(),
                &mut Attend::Paged { meta: &meta, cache },
                s,
            )?;
            for (seq, new) in seqs.iter_mut() {
                seq.len += new.len();
            }
            if read.is_empty() {
                // A prompt's middle chunk: its keys and values are cached, nothing is read.
                return Ok(Vec::new());
            }
            Ok(self.head(read.len(), None, s)?.0)
        })
    }
}
