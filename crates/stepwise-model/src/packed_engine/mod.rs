//! The packed engine: a decoder and its head run over packed batches (sequences end to end, no
//! padding) on a [`Backend`] that owns the buffers and the kernels. The CUDA engine is this
//! engine on the GPU (`crate::cuda::Gpu`, with the `cuda` feature); [`Reference`] is the same engine in plain Rust on the
//! CPU, the executable specification of every kernel, with which the tests check the engine's
//! design (buffers, offsets, the load plan, the head) without a GPU.
//!
//! One layer, for the `T` tokens of a batch (activations row by row, the residual stream `x` in
//! f32, what feeds a product in bf16):
//! 1. `normed = rms_norm(x)`;
//! 2. `y = normed · [q|k|v]ᵀ` (one product: the three projections' weights are stacked at load);
//! 3. `qkv = rope(y + bias)` at each token's position in its own sequence;
//! 4. `attn = attention(qkv)`, causal within each sequence;
//! 5. `x += attn · oᵀ` (the product accumulates into the residual);
//! 6. `normed = rms_norm(x)`; `gu = normed · [gate|up]ᵀ`; `act = silu(gate) · up`;
//! 7. `x += act · downᵀ`.
//!
//! After the last layer only the rows read are normed and go through the head.

mod adapted;
mod backward;
mod cpu;
mod cpu_attention;
pub(crate) mod cpu_elementwise;
mod cpu_paged;
mod decoding;
mod files;
mod layer;
mod lm_head;
mod lora;
mod load;
mod open;
mod options;
pub(crate) mod paged;
mod reference;
mod reference_train;
pub(crate) mod train;
mod train_backend;

pub use adapted::LoraPart;
pub use cpu::Cpu;
pub use decoding::PagedRows;
pub use open::{with_trainer, WithTrainer};
pub use paged::{worst_case_blocks, PagedCache, PagedSeq, BLOCK};
pub use options::{check_queries, log_normalizer, logprob_at, Query};
pub use reference::Reference;
pub use lm_head::{TokenLossFn, LOGITS_BYTES};
pub use lora::{LoraConfig, LORA_MODULES};
pub use files::Snapshot;
pub use train::{PackedTrainer, Targets, TrainStep};
pub use train_backend::{AdamW, TrainBackend};

use crate::config::ModelConfig;
use crate::packed::Packed;
use anyhow::{bail, Context, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Queries a block of the attention kernel takes (the tiles of a sequence start every this many).
pub const QUERY_TILE: usize = 64;

/// How a forward pass attends.
enum Attend<'a, B: Backend> {
    /// Within each sequence of a packed batch (scoring: no cache).
    Packed(&'a BatchInts<B>),
    /// Over each sequence's cached keys and values (generation: the new tokens' keys and values
    /// are written into the cache first).
    Paged {
        meta: &'a PagedInts<B>,
        cache: &'a mut PagedCache<B>,
    },
}

/// Where a product's output goes.
pub enum Out<'a, B: Backend + ?Sized> {
    /// An f32 buffer (written, or added to).
    F32(&'a mut B::F32),
    /// A bf16 buffer (written).
    Bf16(&'a mut B::Bf16),
}

/// A batch's integers on the device.
pub struct BatchInts<B: Backend + ?Sized> {
    /// Each token's position in its sequence.
    pub positions: B::I32,
    /// Each token's sequence.
    pub seq_of_row: B::I32,
    /// Where each sequence starts, then where the last ends.
    pub offsets: B::I32,
    /// The attention tiles: each one's sequence and first query (most keys first).
    pub tile_seq: B::I32,
    /// See `tile_seq`.
    pub tile_start: B::I32,
    /// How many tiles.
    pub tiles: usize,
    /// The rows read after the last layer.
    pub read: B::I32,
}

impl<B: Backend<I32 = Vec<i32>> + ?Sized> BatchInts<B> {
    /// The integers of sequences of `lens` tokens packed end to end, for a backend whose
    /// integers live on the host (what the kernels' tests and benches attend within): positions,
    /// sequences and offsets; no attention tiles and no rows read.
    pub fn of_lengths(lens: &[usize]) -> Self {
        let mut offsets = vec![0i32];
        let (mut positions, mut seq_of_row) = (Vec::new(), Vec::new());
        for (s, &l) in lens.iter().enumerate() {
            offsets.push(offsets[s] + l as i32);
            positions.extend(0..l as i32);
            seq_of_row.extend(std::iter::repeat_n(s as i32, l));
        }
        BatchInts {
            positions,
            seq_of_row,
            offsets,
            tile_seq: Vec::new(),
            tile_start: Vec::new(),
            tiles: 0,
            read: Vec::new(),
        }
    }
}

/// A paged batch's integers on the device: each new token's position, sequence and cache slot,
/// and every sequence's block table.
pub struct PagedInts<B: Backend + ?Sized> {
    /// Each new token's position in its sequence.
    pub positions: B::I32,
    /// Each new token's sequence.
    pub seq_of_row: B::I32,
    /// Each new token's slot in the cache (`block · BLOCK + position % BLOCK`).
    pub slots: B::I32,
    /// Every sequence's blocks, `max_blocks` a sequence (unused entries -1).
    pub block_table: B::I32,
    /// Entries a sequence in `block_table`.
    pub max_blocks: usize,
    /// The rows read after the last layer.
    pub read: B::I32,
}

/// Buffers and kernels of a device. Each kernel is specified by [`Reference`]'s plain Rust.
/// Matrices are bf16 (as `u16` bits), row-major; products accumulate in f32.
#[allow(clippy::too_many_arguments)]
pub trait Backend: Send + Sync {
    /// A buffer of f32 values.
    type F32: Send + Sync;
    /// A buffer of bf16 values.
    type Bf16: Send + Sync;
    /// A buffer of i32 values.
    type I32: Send + Sync;

    /// Its name, for reports.
    fn name(&self) -> String;
    /// Bytes of its memory free and in all.
    fn memory(&self) -> Result<(usize, usize)>;
    /// Bytes a paged KV cache takes when none is asked for: half the free memory (vLLM's way
    /// on a GPU, whose memory serves the model alone).
    fn kv_budget(&self) -> Result<usize> {
        Ok(self.memory()?.0 / 2)
    }
    /// `n` zeros.
    fn zeros_f32(&self, n: usize) -> Result<Self::F32>;
    /// `n` zeros.
    fn zeros_bf16(&self, n: usize) -> Result<Self::Bf16>;
    /// A copy of `host`.
    fn upload_f32(&self, host: &[f32]) -> Result<Self::F32>;
    /// A copy of `host`.
    fn upload_i32(&self, host: &[i32]) -> Result<Self::I32>;
    /// `host` written into `buf` from value `at` on.
    fn write_f32(&self, buf: &mut Self::F32, at: usize, host: &[f32]) -> Result<()>;
    /// `host` written into `buf` from value `at` on.
    fn write_bf16(&self, buf: &mut Self::Bf16, at: usize, host: &[u16]) -> Result<()>;
    /// The values of `buf` (its first `n`), once everything queued is done.
    fn read_f32(&self, buf: &Self::F32, n: usize) -> Result<Vec<f32>>;
    /// How many values `buf` holds.
    fn len_f32(&self, buf: &Self::F32) -> usize;
    /// How many values `buf` holds.
    fn len_bf16(&self, buf: &Self::Bf16) -> usize;

    /// `x[r] = table[ids[r]]` widened, for `rows` rows of `hidden`.
    fn embed(&self, table: &Self::Bf16, ids: &Self::I32, x: &mut Self::F32, rows: usize, hidden: usize) -> Result<()>;
    /// `out[i] = bf16(x[r] / rms(x[r]) · w)` for `r = rows[i]` (or `i`), `n` rows.
    fn rms_norm(
        &self,
        x: &Self::F32,
        rows: Option<&Self::I32>,
        w: &Self::F32,
        out: &mut Self::Bf16,
        n: usize,
        hidden: usize,
        eps: f32,
    ) -> Result<()>;
    /// `y[rows, n] = x[rows, k] · w[n, k]ᵀ` (or `+=` with `accumulate`, f32 output only).
    fn gemm(
        &self,
        x: &Self::Bf16,
        w: &Self::Bf16,
        y: Out<'_, Self>,
        rows: usize,
        n: usize,
        k: usize,
        accumulate: bool,
    ) -> Result<()>;
    /// The q|k|v rows `y` plus `bias`, q and k rotated to each row's position, into `qkv`.
    fn bias_rope(
        &self,
        y: &Self::F32,
        bias: Option<&Self::F32>,
        cos: &Self::F32,
        sin: &Self::F32,
        positions: &Self::I32,
        qkv: &mut Self::Bf16,
        rows: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()>;
    /// Causal attention of every row over the rows of its own sequence, into `out`
    /// (`[rows, heads · head_dim]`).
    fn attention(
        &self,
        qkv: &Self::Bf16,
        out: &mut Self::Bf16,
        batch: &BatchInts<Self>,
        rows: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()>;
    /// `act[r, j] = silu(gu[r, j]) · gu[r, inter + j]`.
    fn swiglu(&self, gate_up: &Self::Bf16, act: &mut Self::Bf16, rows: usize, inter: usize) -> Result<()>;
    /// `out = bf16(relu(y + bias))` per column.
    fn bias_relu(&self, y: &Self::F32, bias: &Self::F32, out: &mut Self::Bf16, rows: usize, width: usize)
        -> Result<()>;
    /// `y += bias` per column.
    fn add_bias(&self, y: &mut Self::F32, bias: &Self::F32, rows: usize, width: usize) -> Result<()>;
    /// `dst[i] = src[idx[i]]`, `n` rows of `width`.
    fn gather_rows(
        &self,
        src: &Self::Bf16,
        idx: &Self::I32,
        dst: &mut Self::Bf16,
        n: usize,
        width: usize,
    ) -> Result<()>;
    /// Each row's keys and values (the k and v parts of its q|k|v row) into the cache at its
    /// slot: `k[slots[r]] = k(qkv[r])`, `v[slots[r]] = v(qkv[r])`, rows of `kv_heads · head_dim`.
    fn cache_write(
        &self,
        qkv: &Self::Bf16,
        k: &mut Self::Bf16,
        v: &mut Self::Bf16,
        slots: &Self::I32,
        rows: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()>;
    /// Causal attention of every row's query over its sequence's cached keys and values, the
    /// row's own position included (found through the block table), into `out`.
    fn paged_attention(
        &self,
        qkv: &Self::Bf16,
        k: &Self::Bf16,
        v: &Self::Bf16,
        out: &mut Self::Bf16,
        meta: &PagedInts<Self>,
        rows: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()>;
    /// Block `src`'s values copied over block `dst`'s in `buf` (`block_values` a block).
    fn copy_block(&self, buf: &mut Self::Bf16, src: usize, dst: usize, block_values: usize) -> Result<()>;
    /// The form it reads LoRA adapters served unmerged in ([`Backend::lora_add`]); `None`: it
    /// serves none.
    fn adapter_form(&self) -> Option<crate::adapters::Form> {
        None
    }
    /// Each part's low-rank update added to its rows of `y` (rows of `width`), from the bf16
    /// rows `x` (of `k`) that the product read: [`LoraPart`]. None by default.
    fn lora_add(&self, x: &Self::Bf16, y: Out<'_, Self>, k: usize, width: usize, parts: &[LoraPart<'_>]) -> Result<()> {
        let _ = (x, y, k, width, parts);
        bail!("{} serves no unmerged adapters", self.name())
    }
}

/// One decoder layer's weights (matrices bf16 `[out, in]`, vectors f32).
struct Layer<B: Backend> {
    ln1: B::F32,
    ln2: B::F32,
    /// q, k and v stacked: `[(heads + 2·kv_heads)·head_dim, hidden]`.
    qkv: B::Bf16,
    /// Their biases stacked (Qwen2), or none (Llama).
    qkv_bias: Option<B::F32>,
    o: B::Bf16,
    /// gate and up stacked: `[2·intermediate, hidden]`.
    gate_up: B::Bf16,
    down: B::Bf16,
}

/// The head's weights.
enum Head<B: Backend> {
    /// Vocabulary logits: `lm_head`, or the embeddings when tied (`None`).
    Lm(Option<B::Bf16>),
    /// Qwen2.5-Math-PRM's Linear → ReLU → Linear.
    Mlp {
        w1: B::Bf16,
        b1: B::F32,
        w2: B::Bf16,
        b2: B::F32,
    },
    /// A linear classifier (with a bias for token classifiers).
    Classifier { w: B::Bf16, b: Option<B::F32> },
}

/// Buffers a forward pass reuses, grown to the largest batch seen (the token budget bounds them).
struct Scratch<B: Backend> {
    x: Option<B::F32>,
    normed: Option<B::Bf16>,
    y: Option<B::F32>,
    qkv: Option<B::Bf16>,
    attn: Option<B::Bf16>,
    gate_up: Option<B::Bf16>,
    act: Option<B::Bf16>,
    head_in: Option<B::Bf16>,
    head_mid: Option<B::F32>,
    head_out: Option<B::F32>,
    columns: Option<B::Bf16>,
    /// The adapters the next pass's rows run with (taken by the pass).
    lora: Option<adapted::RowAdapters>,
}

impl<B: Backend> Default for Scratch<B> {
    fn default() -> Self {
        Scratch {
            x: None,
            normed: None,
            y: None,
            qkv: None,
            attn: None,
            gate_up: None,
            act: None,
            head_in: None,
            head_mid: None,
            head_out: None,
            columns: None,
            lora: None,
        }
    }
}

/// An f32 buffer of at least `n` values in `slot` (reallocated when smaller).
fn grow_f32<'s, B: Backend>(b: &B, slot: &'s mut Option<B::F32>, n: usize) -> Result<&'s mut B::F32> {
    if slot.as_ref().is_none_or(|x| b.len_f32(x) < n) {
        *slot = None;
        *slot = Some(b.zeros_f32(n.max(1))?);
    }
    Ok(slot.as_mut().expect("just set"))
}

/// A bf16 buffer of at least `n` values in `slot` (reallocated when smaller).
fn grow_bf16<'s, B: Backend>(b: &B, slot: &'s mut Option<B::Bf16>, n: usize) -> Result<&'s mut B::Bf16> {
    if slot.as_ref().is_none_or(|x| b.len_bf16(x) < n) {
        *slot = None;
        *slot = Some(b.zeros_bf16(n.max(1))?);
    }
    Ok(slot.as_mut().expect("just set"))
}

/// A checkpoint's decoder and head on a [`Backend`], for scoring packed batches.
pub struct PackedDecoder<B: Backend> {
    backend: Arc<B>,
    /// Hyper-parameters.
    pub config: ModelConfig,
    embed: B::Bf16,
    layers: Vec<Layer<B>>,
    norm: B::F32,
    head: Head<B>,
    /// Rotary tables `[max_positions, head_dim / 2]`.
    cos: B::F32,
    sin: B::F32,
    max_positions: usize,
    /// Most bytes of one chunk of the LM head's logits in training and log-probabilities
    /// ([`LOGITS_BYTES`] unless set).
    logits_bytes: usize,
    scratch: Mutex<Scratch<B>>,
    /// Tokens run through the decoder so far.
    pub encoded_tokens: AtomicUsize,
    /// LoRA adapters served unmerged on its weights ([`PackedDecoder::serve_adapters`]).
    adapters: std::sync::RwLock<Option<Arc<crate::Adapters>>>,
}

impl<B: Backend> std::fmt::Debug for PackedDecoder<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PackedDecoder({}, {} layers)",
            self.backend.name(),
            self.layers.len()
        )
    }
}


/// The integers of a packed batch for the backend (and how many attention tiles it has).
fn batch_ints<B: Backend>(b: &B, batch: &Packed, read: &[usize]) -> Result<BatchInts<B>> {
    let offsets = batch.offsets();
    let mut seq_of_row = Vec::with_capacity(batch.tokens());
    let mut tiles: Vec<(i32, i32)> = Vec::new();
    for (i, w) in offsets.windows(2).enumerate() {
        seq_of_row.extend(std::iter::repeat_n(i as i32, w[1] - w[0]));
        tiles.extend((0..w[1] - w[0]).step_by(QUERY_TILE).map(|q0| (i as i32, q0 as i32)));
    }
    // Tiles with the most keys first, so the grid does not end on a long one.
    tiles.sort_by_key(|&(_, q0)| std::cmp::Reverse(q0));
    let ints = |v: Vec<i32>| b.upload_i32(&v);
    Ok(BatchInts {
        positions: ints(batch.positions().into_iter().map(|p| p as i32).collect())?,
        seq_of_row: ints(seq_of_row)?,
        offsets: ints(offsets.iter().map(|&o| o as i32).collect())?,
        tile_seq: ints(tiles.iter().map(|t| t.0).collect())?,
        tile_start: ints(tiles.iter().map(|t| t.1).collect())?,
        tiles: tiles.len(),
        read: ints(read.iter().map(|&r| r as i32).collect())?,
    })
}

impl<B: Backend> PackedDecoder<B> {

    /// The backend it runs on.
    pub fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    /// The form its backend reads served adapters in, or why it serves none.
    pub fn adapter_form(&self) -> Result<crate::adapters::Form> {
        self.backend.adapter_form().with_context(|| {
            format!(
                "adapters are served unmerged on the CPU; on {} serve each merged, as a model of its own",
                self.backend.name()
            )
        })
    }

    /// Serves `adapters` unmerged on its weights (`None`: none), where the backend can.
    pub fn serve_adapters(&self, adapters: Option<Arc<crate::Adapters>>) -> Result<()> {
        if adapters.is_some() {
            self.adapter_form()?;
        }
        *self.adapters.write().unwrap_or_else(|e| e.into_inner()) = adapters;
        Ok(())
    }

    /// The adapters served on its weights.
    pub fn served_adapters(&self) -> Option<Arc<crate::Adapters>> {
        self.adapters.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The adapters its sequences `lens` (packed end to end) run with, `each[i]` (or one for
    /// all); `None` where none does.
    fn row_adapters(&self, lens: &[usize], each: &[Option<usize>]) -> Result<Option<adapted::RowAdapters>> {
        if each.iter().all(Option::is_none) {
            return Ok(None);
        }
        match self.served_adapters() {
            Some(a) => adapted::RowAdapters::of(&a, lens, each),
            None => bail!("no adapters are served on this model"),
        }
    }

    /// Head outputs at rows `read` of the packed `batch` (indices into all its tokens), row after
    /// row: every class of a classifier head, or the vocabulary logits of `columns` (all of the
    /// vocabulary when `None`) of an LM head. Returns the values and the number of columns.
    pub fn head_at(&self, batch: &Packed, read: &[usize], columns: Option<&[u32]>) -> Result<(Vec<f32>, usize)> {
        self.head_at_with(batch, read, columns, &[])
    }

    /// [`PackedDecoder::head_at`] with each sequence's served adapter (`adapters[i]`, or one
    /// for all; [`PackedDecoder::serve_adapters`]).
    pub fn head_at_with(
        &self,
        batch: &Packed,
        read: &[usize],
        columns: Option<&[u32]>,
        adapters: &[Option<usize>],
    ) -> Result<(Vec<f32>, usize)> {
        let cfg = &self.config;
        let t = batch.tokens();
        if let Some(&bad) = batch.ids().iter().find(|&&id| id as usize >= cfg.vocab_size) {
            bail!("token id {bad} is outside the model's vocabulary of {}", cfg.vocab_size);
        }
        if batch.longest() > self.max_positions {
            bail!(
                "a sequence of {} tokens exceeds the {} positions read for a model of max_position_embeddings {} (four times it, at most 32768)",
                batch.longest(),
                self.max_positions,
                cfg.max_position_embeddings
            );
        }
        if let Some(&r) = read.iter().find(|&&r| r >= t) {
            bail!("row {r} is past the end of a batch of {t} tokens");
        }
        if let Some(&c) = columns.into_iter().flatten().find(|&&c| c as usize >= cfg.vocab_size) {
            bail!("column {c} is outside the vocabulary of {}", cfg.vocab_size);
        }
        if t == 0 || read.is_empty() {
            return Ok((Vec::new(), 0));
        }
        let lens: Vec<usize> = batch.sequences().map(<[u32]>::len).collect();
        let lora = self.row_adapters(&lens, adapters)?;
        self.encoded_tokens.fetch_add(t, Ordering::Relaxed);
        self.with_scratch(|s| {
            s.lora = lora;
            self.decoder(batch, read, s)?;
            self.head(read.len(), columns, s)
        })
    }

    /// `f` with the engine's scratch buffers, or with new ones where another call holds them:
    /// calls from several threads run at once, and one that the thread pool starts inside
    /// another's parallel kernel (rayon lets a waiting worker take up another job) must not
    /// wait for a lock its own thread holds.
    fn with_scratch<R>(&self, f: impl FnOnce(&mut Scratch<B>) -> R) -> R {
        match self.scratch.try_lock() {
            Ok(mut held) => f(&mut held),
            Err(std::sync::TryLockError::Poisoned(e)) => f(&mut e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => f(&mut Scratch::default()),
        }
    }

    /// Every layer over the batch; leaves the rows `read`, normed, in `s.head_in` (bf16).
    fn decoder(&self, batch: &Packed, read: &[usize], s: &mut Scratch<B>) -> Result<()> {
        let b = &*self.backend;
        let ints = batch_ints(b, batch, read)?;
        self.layers_over(
            batch.ids(),
            &ints.positions,
            &ints.read,
            read.len(),
            &mut Attend::Packed(&ints),
            s,
        )
    }

    /// The head over the `r` normed rows in `s.head_in`, read back.
    fn head(&self, r: usize, columns: Option<&[u32]>, s: &mut Scratch<B>) -> Result<(Vec<f32>, usize)> {
        let b = &*self.backend;
        let cfg = &self.config;
        let h = cfg.hidden_size;
        let width = match (&self.head, columns) {
            (Head::Lm(_), Some(cols)) => cols.len(),
            (Head::Lm(_), None) => cfg.vocab_size,
            _ => cfg.num_labels,
        };
        grow_f32(b, &mut s.head_out, r * width)?;
        grow_f32(b, &mut s.head_mid, r * h)?;
        if let Some(cols) = columns {
            grow_bf16(b, &mut s.columns, cols.len() * h)?;
        }
        let head_in = s.head_in.as_ref().expect("filled by the decoder");
        let out = s.head_out.as_mut().expect("grown above");
        match &self.head {
            Head::Mlp { w1, b1, w2, b2 } => {
                let mid = s.head_mid.as_mut().expect("grown above");
                b.gemm(head_in, w1, Out::F32(mid), r, h, h, false)?;
                // The ReLU's output feeds the second product in bf16: into `normed`'s buffer,
                // free after the decoder.
                let relu = s.normed.as_mut().expect("filled by the decoder");
                b.bias_relu(mid, b1, relu, r, h)?;
                b.gemm(relu, w2, Out::F32(out), r, width, h, false)?;
                b.add_bias(out, b2, r, width)?;
            }
            Head::Classifier { w, b: bias } => {
                b.gemm(head_in, w, Out::F32(out), r, width, h, false)?;
                if let Some(bias) = bias {
                    b.add_bias(out, bias, r, width)?;
                }
            }
            Head::Lm(w) => {
                let matrix = w.as_ref().unwrap_or(&self.embed);
                match columns {
                    None => b.gemm(head_in, matrix, Out::F32(out), r, width, h, false)?,
                    Some(cols) => {
                        // The LM head's rows for these tokens, gathered, then one product.
                        let idx = b.upload_i32(&cols.iter().map(|&c| c as i32).collect::<Vec<_>>())?;
                        let gathered = s.columns.as_mut().expect("grown above");
                        b.gather_rows(matrix, &idx, gathered, cols.len(), h)?;
                        b.gemm(head_in, gathered, Out::F32(out), r, width, h, false)?;
                    }
                }
            }
        }
        Ok((b.read_f32(out, r * width)?, width))
    }
}
