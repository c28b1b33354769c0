//! The decoder shared by Qwen2/Qwen2.5 and Llama/Mistral: embeddings, pre-norm blocks with
//! grouped-query attention and rotary positions, SwiGLU MLPs, a final RMSNorm. Read top to
//! bottom: [`Transformer::forward`] → `Block::forward` → `Attention::forward`.
//!
//! One forward ([`Transformer::forward`], taking an [`Input`]) over two numerically equivalent
//! paths chosen from the input: the fused CPU inference kernels (`kernels/cpu_inference/`), and
//! candle's ops around the engine's kernels, differentiable for training (candle's fused
//! `rms_norm`, `softmax_last_dim` and `rope` have no gradient, so training uses the engine's own).

use crate::config::ModelConfig;
use crate::kernels::cpu_inference;
use crate::kernels::{self, masked_softmax, KeyMask, Linear, RopeTables};
use crate::adapters::{push_runs, AdapterTable, Adapters, Group, Proj, Run};
use crate::input::{BatchCache, Input, LayerView, Tokens};
use anyhow::Result;
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Embedding, VarBuilder};

pub use crate::kv_cache::KvCache;

mod fused;

fn rms_norm(x: &Tensor, w: &Tensor, eps: f64, diff: bool) -> Result<Tensor> {
    if !diff && !x.device().is_cpu() {
        return Ok(candle_nn::ops::rms_norm(&x.contiguous()?, w, eps as f32)?);
    }
    Ok(kernels::rms_norm(x, w, eps)?)
}

/// Rotary embedding tables for every position a sequence may take
/// ([`ModelConfig::scoring_positions`]).
fn rope_tables(cfg: &ModelConfig, dev: &Device) -> Result<RopeTables> {
    let d = cfg.head_dim;
    let max = cfg.scoring_positions();
    let inv: Vec<f32> = (0..d / 2)
        .map(|i| 1.0 / (cfg.rope_theta as f32).powf(2.0 * i as f32 / d as f32))
        .collect();
    let inv = Tensor::from_vec(inv, (1, d / 2), dev)?;
    let t = Tensor::arange(0u32, max as u32, dev)?
        .to_dtype(DType::F32)?
        .reshape((max, 1))?;
    let freqs = t.matmul(&inv)?;
    Ok(RopeTables::new(freqs.cos()?, freqs.sin()?)?)
}

/// What every layer needs to know about the current forward pass.
struct Pass<'a> {
    rope: &'a RopeTables,
    eps: f64,
    diff: bool,
    /// The batches whose rows the pass runs, in order.
    batches: &'a [Batch],
    /// The served adapters and each one's rows, where a row of the pass is one's
    /// ([`crate::Adapters`]).
    adapters: Option<(&'a Adapters, Vec<Group>)>,
}

impl Pass<'_> {
    /// Projection `proj` of layer `li` over the rows `x`: `lin`, plus each row's adapter's update.
    fn proj(&self, li: usize, proj: Proj, lin: &Linear, x: &Tensor) -> Result<Tensor> {
        let y = lin.forward(x, self.diff)?;
        match &self.adapters {
            Some((a, groups)) => a.add_to(li, proj, x, y, groups),
            None => Ok(y),
        }
    }
}

/// One batch of a forward pass: `b` sequences of `t` new tokens each, continuing a cache of
/// `offset` positions. A pass runs one batch, or several (an [`Input`] of several parts):
/// their rows go through every product together, and each batch attends to its own cache.
struct Batch {
    b: usize,
    t: usize,
    mask: KeyMask,
    offset: usize,
    /// Per batch row, how far its rotary positions lag its cache positions (its left padding).
    shifts: Option<std::sync::Arc<Vec<usize>>>,
}

impl Batch {
    /// The batch of token ids `[b, t]` continuing `cache` (padding mask `[b, t_total]`).
    fn new(ids: &Tensor, pad_mask: Option<&Tensor>, cache: &KvCache) -> Result<Self> {
        let (b, t) = ids.dims2()?;
        let offset = cache.len();
        let shifts = cache.pads().map(|p| std::sync::Arc::new(p.to_vec()));
        let mut mask = KeyMask::new(offset, pad_mask)?;
        if let Some(pads) = &shifts {
            mask = mask.pad_left(pads, offset + t);
        }
        Ok(Batch {
            b,
            t,
            mask,
            offset,
            shifts,
        })
    }
}

#[derive(Clone, Debug)]
struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Attention {
    fn new(cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        let (h, d, kv) = (cfg.hidden_size, cfg.head_dim, cfg.num_key_value_heads);
        let heads = cfg.num_attention_heads;
        Ok(Attention {
            q: Linear::load(vb.pp("q_proj"), h, heads * d, cfg.attention_bias)?,
            k: Linear::load(vb.pp("k_proj"), h, kv * d, cfg.attention_bias)?,
            v: Linear::load(vb.pp("v_proj"), h, kv * d, cfg.attention_bias)?,
            o: Linear::load(vb.pp("o_proj"), heads * d, h, false)?,
            heads,
            kv_heads: kv,
            head_dim: d,
        })
    }

    /// Attention over the rows `x` `[Σ b·t, hidden]` of every batch of the pass: the
    /// projections take all rows at once, each batch attends to its own `caches` entry
    /// (extended here).
    fn forward(&self, li: usize, x: &Tensor, pass: &Pass, caches: &mut [LayerView]) -> Result<Tensor> {
        let batches = pass.batches;
        let (q, k, v) = (
            pass.proj(li, Proj::Q, &self.q, x)?,
            pass.proj(li, Proj::K, &self.k, x)?,
            pass.proj(li, Proj::V, &self.v, x)?,
        );
        if let ([batch], [cache]) = (batches, &mut *caches) {
            let y = self.attend(q, k, v, pass, batch, cache)?;
            return pass.proj(li, Proj::O, &self.o, &y);
        }
        let mut ys = Vec::with_capacity(batches.len());
        let mut start = 0;
        for (batch, cache) in batches.iter().zip(caches.iter_mut()) {
            let rows = batch.b * batch.t;
            let pick = |y: &Tensor| y.narrow(0, start, rows);
            ys.push(self.attend(pick(&q)?, pick(&k)?, pick(&v)?, pass, batch, cache)?);
            start += rows;
        }
        pass.proj(li, Proj::O, &self.o, &Tensor::cat(&ys, 0)?)
    }

    /// One batch's attention, from its projected rows `[b·t, heads·head_dim]` (queries) and
    /// `[b·t, kv_heads·head_dim]` (keys, values) to `[b·t, heads·head_dim]`; `cache` gains the
    /// new keys and values.
    fn attend(
        &self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        pass: &Pass,
        batch: &Batch,
        cache: &mut LayerView,
    ) -> Result<Tensor> {
        let (b, t) = (batch.b, batch.t);
        let split =
            |y: Tensor, n: usize| -> Result<Tensor> { Ok(y.reshape((b, t, n, self.head_dim))?.transpose(1, 2)?) };
        let rope = |y: Tensor| kernels::rope_shifted(&y, pass.rope, batch.offset, batch.shifts.as_ref());
        let q = rope(split(q, self.heads)?)?;
        let mut k = rope(split(k, self.kv_heads)?)?;
        let mut v = split(v, self.kv_heads)?.contiguous()?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let rows = (b * t, self.heads * self.head_dim);
        let cache = match cache {
            LayerView::Padded(cache) => cache,
            LayerView::Rows(cache) => {
                // One new position a sequence (checked by `Transformer::batch`), on the CPU.
                let host = |t: &Tensor| -> Result<Vec<f32>> { Ok(t.flatten_all()?.to_vec1()?) };
                let keys = cache.append(&host(&k)?, &host(&v)?, self.head_dim);
                let dims = (self.heads, self.kv_heads, self.head_dim);
                let y = kernels::attention::attention_rows(&host(&q)?, &keys, dims, batch.offset + 1, scale as f32);
                return Ok(Tensor::from_vec(y, rows, q.device())?);
            }
        };
        if let Some((pk, pv)) = cache.as_ref() {
            k = Tensor::cat(&[pk, &k], 2)?;
            v = Tensor::cat(&[pv, &v], 2)?;
        }
        **cache = Some((k.clone(), v.clone()));
        if !pass.diff && q.device().is_cpu() {
            return Ok(kernels::attention(&q, &k, &v, scale, &batch.mask)?.reshape(rows)?);
        }
        // Grouped-query attention: each kv head serves `heads / kv_heads` query heads.
        let group = self.heads / self.kv_heads;
        let s = k.dim(2)?;
        let q = q.reshape((b, self.kv_heads, group * t, self.head_dim))?;
        let att = q.matmul(&k.t()?)?.reshape((b, self.heads, t, s))?;
        let att = masked_softmax(&att, scale, &batch.mask)?;
        let y = att.reshape((b, self.kv_heads, group * t, s))?.matmul(&v)?;
        Ok(y.reshape((b, self.heads, t, self.head_dim))?
            .transpose(1, 2)?
            .reshape(rows)?)
    }
}

#[derive(Clone, Debug)]
struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Mlp {
    fn new(cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Mlp {
            gate: Linear::load(vb.pp("gate_proj"), h, i, false)?,
            up: Linear::load(vb.pp("up_proj"), h, i, false)?,
            down: Linear::load(vb.pp("down_proj"), i, h, false)?,
        })
    }
    fn forward(&self, li: usize, x: &Tensor, pass: &Pass) -> Result<Tensor> {
        let (gate, up) = (pass.proj(li, Proj::Gate, &self.gate, x)?, pass.proj(li, Proj::Up, &self.up, x)?);
        pass.proj(li, Proj::Down, &self.down, &kernels::swiglu(&gate, &up)?)
    }
}

#[derive(Clone, Debug)]
struct Block {
    attn: Attention,
    mlp: Mlp,
    ln1: Tensor,
    ln2: Tensor,
}

impl Block {
    /// The block over the rows `x` `[Σ b·t, hidden]` of every batch of the pass, each with its
    /// layer cache.
    fn forward(&self, li: usize, x: &Tensor, pass: &Pass, caches: &mut [LayerView]) -> Result<Tensor> {
        let h = self
            .attn
            .forward(li, &rms_norm(x, &self.ln1, pass.eps, pass.diff)?, pass, caches)?;
        let x = (x + h)?;
        let h = self
            .mlp
            .forward(li, &rms_norm(&x, &self.ln2, pass.eps, pass.diff)?, pass)?;
        Ok((x + h)?)
    }
}

/// The decoder stack (`model.*` weights).
#[derive(Clone, Debug)]
pub struct Transformer {
    embed: Embedding,
    blocks: Vec<Block>,
    norm: Tensor,
    rope: RopeTables,
    eps: f64,
    max_positions: usize,
    /// Use the differentiable (training) path.
    pub differentiable: bool,
    /// Number of token positions run through the decoder so far (for shared-prefix tests and
    /// throughput reports).
    pub encoded_tokens: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// LoRA adapters served unmerged on these weights ([`Input::adapters`] picks them), shared
    /// with its clones.
    adapters: std::sync::Arc<AdapterTable>,
}

impl Transformer {
    /// Build from weights under `vb` (the `model.` prefix).
    pub fn new(cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        let embed = candle_nn::embedding(cfg.vocab_size, cfg.hidden_size, vb.pp("embed_tokens"))?;
        let blocks = (0..cfg.num_hidden_layers)
            .map(|i| {
                let vb = vb.pp(format!("layers.{i}"));
                Ok(Block {
                    attn: Attention::new(cfg, vb.pp("self_attn"))?,
                    mlp: Mlp::new(cfg, vb.pp("mlp"))?,
                    ln1: vb.pp("input_layernorm").get_with_hints(
                        cfg.hidden_size,
                        "weight",
                        candle_nn::Init::Const(1.0),
                    )?,
                    ln2: vb.pp("post_attention_layernorm").get_with_hints(
                        cfg.hidden_size,
                        "weight",
                        candle_nn::Init::Const(1.0),
                    )?,
                })
            })
            .collect::<Result<_>>()?;
        let norm = vb
            .pp("norm")
            .get_with_hints(cfg.hidden_size, "weight", candle_nn::Init::Const(1.0))?;
        Ok(Transformer {
            rope: rope_tables(cfg, vb.device())?,
            embed,
            blocks,
            norm,
            eps: cfg.rms_norm_eps,
            max_positions: cfg.scoring_positions(),
            differentiable: false,
            encoded_tokens: Default::default(),
            adapters: Default::default(),
        })
    }

    /// A decoder of `cfg`'s shape holding no weights: the CPU side of a model whose weights live
    /// on a GPU (every forward pass on it is refused by its [`crate::Model`]).
    pub fn without_weights(cfg: &ModelConfig) -> Result<Self> {
        let dev = Device::Cpu;
        Ok(Transformer {
            embed: Embedding::new(Tensor::zeros((0, cfg.hidden_size), DType::F32, &dev)?, cfg.hidden_size),
            blocks: Vec::new(),
            norm: Tensor::ones(cfg.hidden_size, DType::F32, &dev)?,
            rope: rope_tables(cfg, &dev)?,
            eps: cfg.rms_norm_eps,
            max_positions: cfg.scoring_positions(),
            differentiable: false,
            encoded_tokens: Default::default(),
            adapters: Default::default(),
        })
    }

    /// The adapters it serves, and how they change ([`crate::Model::load_adapter`]).
    pub(crate) fn adapter_table(&self) -> &AdapterTable {
        &self.adapters
    }

    /// The adapters served on these weights now.
    pub fn adapters(&self) -> Option<std::sync::Arc<Adapters>> {
        self.adapters.now()
    }

    /// The token embedding matrix (for tied LM heads).
    pub fn embeddings(&self) -> &Tensor {
        self.embed.embeddings()
    }

    /// Whether every projection's bf16 weight multiplies in bf16 where the CPU can
    /// ([`crate::Precision::bf16_products`]).
    pub fn set_bf16_products(&mut self, on: bool) {
        for b in &mut self.blocks {
            for l in [
                &mut b.attn.q,
                &mut b.attn.k,
                &mut b.attn.v,
                &mut b.attn.o,
                &mut b.mlp.gate,
                &mut b.mlp.up,
                &mut b.mlp.down,
            ] {
                l.set_bf16_products(on);
            }
        }
    }

    /// The decoder's one forward pass: the hidden states (after the final norm) of each part of
    /// `input`, in order, `[b, t, hidden]` for a part of padded ids and `[Σ read, hidden]` for
    /// the rows `input.read` names (a packed part is read at every position when no rows are
    /// named). Caches the parts continue grow by their tokens.
    ///
    /// Which kernels run follows from the input alone:
    ///
    /// | input | runs on |
    /// |---|---|
    /// | a model being trained ([`Transformer::differentiable`]) | candle's ops, which record the backward pass |
    /// | several parts; a part continuing a [`BatchCache::Rows`] cache; a part continuing a cache by one token a sequence; rows read from a part that keeps a cache | candle's ops around the engine's product kernels (`kernels/linear.rs` streams each weight row once for a decoding step's few rows) and attention kernels (`attention_rows` for a cache a sequence) |
    /// | anything else: a packed batch; padded ids, filling a cache or not; a cache without left padding continued by several tokens a sequence | the fused CPU inference kernels (`kernels/cpu_inference/`), where the weights are held for them; else candle's ops |
    ///
    /// The paths give the same values within float rounding (tested on the fixtures). A
    /// decoding step stays on candle's ops because the fused kernels would copy its whole
    /// cache to read it; generation's decoding steps, and the lab's recorded samples, run there.
    pub fn forward(&self, mut input: Input) -> Result<Vec<Tensor>> {
        self.check(&input)?;
        if !input.adapted() && self.takes_fused(&input) {
            if let Some(x) = self.forward_fused(&mut input)? {
                return Ok(vec![x]);
            }
        }
        self.forward_candle(input)
    }

    /// Checks `input` against the model (rows in range, ids in the vocabulary, positions that
    /// fit) and counts its positions.
    fn check(&self, input: &Input) -> Result<()> {
        anyhow::ensure!(!input.parts.is_empty(), "a forward pass of no parts");
        let vocab = self.embed.embeddings().dim(0)?;
        let in_vocab = |ids: &[u32]| -> Result<()> {
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                anyhow::bail!("token id {bad} is outside the model's vocabulary of {vocab}");
            }
            Ok(())
        };
        let mut lengths = Vec::new();
        for part in &input.parts {
            lengths.clear();
            match part.tokens {
                Tokens::Padded { ids, .. } => {
                    let (b, t) = ids.dims2()?;
                    let offset = match &part.cache {
                        None => 0,
                        Some(BatchCache::Padded(c)) => c.len(),
                        Some(BatchCache::Rows(c)) => c.len(),
                    };
                    let host: Vec<u32> = ids.to_dtype(DType::U32)?.flatten_all()?.to_vec1()?;
                    in_vocab(&host)?;
                    self.count_and_check(b, offset, t)?;
                    lengths.resize(b, t);
                }
                Tokens::Packed(batch) => {
                    anyhow::ensure!(part.cache.is_none(), "a packed batch continues no cache");
                    in_vocab(batch.ids())?;
                    for seq in batch.sequences() {
                        self.count_and_check(1, 0, seq.len())?;
                        lengths.push(seq.len());
                    }
                }
            }
            self.check_adapters(&part.adapters, lengths.len())?;
        }
        if let Some(read) = input.read {
            anyhow::ensure!(input.parts.len() == 1, "rows are read from an input of one part");
            anyhow::ensure!(
                read.len() == lengths.len(),
                "{} lists of rows for a batch of {}",
                read.len(),
                lengths.len()
            );
            for (rows, &len) in read.iter().zip(&lengths) {
                if let Some(p) = rows.iter().find(|&&p| p >= len) {
                    anyhow::bail!("row {p} is past the end of a sequence of {len} tokens");
                }
            }
        }
        Ok(())
    }

    /// Checks a part's adapters: one, or one a sequence, each of the adapters served.
    fn check_adapters(&self, adapters: &[Option<usize>], seqs: usize) -> Result<()> {
        anyhow::ensure!(
            adapters.len() <= 1 || adapters.len() == seqs,
            "{} adapters for a part of {seqs} sequences",
            adapters.len()
        );
        let served = self.adapters.now();
        if let Some(a) = adapters.iter().flatten().find(|&&a| !served.as_ref().is_some_and(|s| s.holds(a))) {
            anyhow::bail!("adapter {a} is not served here");
        }
        Ok(())
    }

    /// Whether `input` goes to the fused CPU inference kernels ([`Transformer::forward`]'s table).
    fn takes_fused(&self, input: &Input) -> bool {
        let [part] = input.parts.as_slice() else {
            return false;
        };
        if self.differentiable {
            return false;
        }
        match (part.tokens, &part.cache) {
            (Tokens::Packed(_), _) => true,
            (Tokens::Padded { ids, .. }, cache) => {
                let t = ids.dim(1).unwrap_or(0);
                ids.device().is_cpu()
                    && t > 0
                    && match cache {
                        None => true,
                        Some(BatchCache::Rows(_)) => false,
                        Some(BatchCache::Padded(c)) => {
                            input.read.is_none()
                                && (c.is_empty()
                                    || (t > 1 && c.pads().is_none() && c.layers.len() == self.blocks.len()))
                        }
                    }
            }
        }
    }

    /// [`Transformer::forward`] of an input of one part on [`cpu_inference`]; `None` when the
    /// weights are not held for it.
    fn forward_fused(&self, input: &mut Input) -> Result<Option<Tensor>> {
        let read = input.read;
        let part = &mut input.parts[0];
        match part.tokens {
            Tokens::Packed(batch) => {
                let Some(decoder) = self.cpu_decoder()? else {
                    return Ok(None);
                };
                let every: Vec<Vec<usize>>;
                let read = match read {
                    Some(r) => r,
                    None => {
                        every = batch.sequences().map(|s| (0..s.len()).collect()).collect();
                        &every
                    }
                };
                let Some(x) = cpu_inference::forward_packed(&decoder, batch, read) else {
                    return Ok(None);
                };
                let rows = read.iter().map(Vec::len).sum::<usize>();
                Ok(Some(Tensor::from_vec(x, (rows, decoder.dims.hidden), &Device::Cpu)?))
            }
            Tokens::Padded { ids, pad_mask } => {
                let cache = match &mut part.cache {
                    Some(BatchCache::Padded(c)) => Some(&mut **c),
                    _ => None,
                };
                let offset = cache.as_ref().map_or(0, |c| c.len());
                self.forward_cpu(ids, &KeyMask::new(offset, pad_mask)?, cache, read)
            }
        }
    }

    /// [`Transformer::forward`] on candle's ops: the parts' rows go through every product
    /// together and each part attends to its own cache (a packed part is padded first).
    fn forward_candle(&self, mut input: Input) -> Result<Vec<Tensor>> {
        let dev = self.embed.embeddings().device();
        let padded = input
            .parts
            .iter()
            .map(|p| match p.tokens {
                Tokens::Packed(batch) => {
                    let seqs: Vec<&[u32]> = batch.sequences().collect();
                    let (ids, mask, _) = crate::model::pad_batch(&seqs, dev)?;
                    Ok(Some((ids, mask)))
                }
                Tokens::Padded { .. } => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        let tokens: Vec<(&Tensor, Option<&Tensor>)> = input
            .parts
            .iter()
            .zip(&padded)
            .map(|(p, own)| match (p.tokens, own) {
                (_, Some((ids, mask))) => (ids, mask.as_ref()),
                (Tokens::Padded { ids, pad_mask }, None) => (ids, pad_mask),
                (Tokens::Packed(_), None) => unreachable!("a packed part is padded above"),
            })
            .collect();
        let adapters: Vec<Vec<Option<usize>>> = input.parts.iter_mut().map(|p| std::mem::take(&mut p.adapters)).collect();
        // A part that keeps no cache gets one for the pass.
        let mut scratch: Vec<KvCache> = input.parts.iter().map(|_| KvCache::default()).collect();
        let mut caches: Vec<BatchCache> = input
            .parts
            .iter_mut()
            .zip(scratch.iter_mut())
            .map(|(p, own)| match &mut p.cache {
                Some(c) => c.reborrow(),
                None => BatchCache::Padded(own),
            })
            .collect();
        let batches = tokens
            .iter()
            .zip(caches.iter_mut())
            .map(|((ids, mask), cache)| self.batch(ids, *mask, cache))
            .collect::<Result<Vec<_>>>()?;
        let ids: Vec<&Tensor> = tokens.iter().map(|(ids, _)| *ids).collect();
        let mut runs = Vec::new();
        let mut start = 0;
        for (b, adapters) in batches.iter().zip(&adapters) {
            push_runs(&mut runs, start, b.b, b.t, adapters);
            start += b.b * b.t;
        }
        let x = self.run(&ids, &batches, &mut caches, &runs)?;
        if let Some(read) = input.read {
            let t = batches[0].t;
            let rows: Vec<u32> = read
                .iter()
                .enumerate()
                .flat_map(|(i, r)| r.iter().map(move |&p| (i * t + p) as u32))
                .collect();
            return Ok(vec![x.index_select(&Tensor::new(rows, dev)?, 0)?]);
        }
        let mut start = 0;
        batches
            .iter()
            .zip(&input.parts)
            .map(|(p, part)| {
                let rows = x.narrow(0, start, p.b * p.t)?;
                start += p.b * p.t;
                Ok(match part.tokens {
                    // A packed part comes back as its tokens, without the padding.
                    Tokens::Packed(batch) => {
                        let real: Vec<u32> = (0..batch.len())
                            .flat_map(|i| (0..batch.sequence(i).len()).map(move |j| (i * p.t + j) as u32))
                            .collect();
                        rows.index_select(&Tensor::new(real, dev)?, 0)?
                    }
                    Tokens::Padded { .. } => rows.reshape((p.b, p.t, x.dim(1)?))?,
                })
            })
            .collect()
    }

    /// The batch of `ids` continuing `cache` (given a layer entry each here), its positions
    /// counted and checked against the model's.
    fn batch(&self, ids: &Tensor, pad_mask: Option<&Tensor>, cache: &mut BatchCache) -> Result<Batch> {
        let batch = match cache {
            BatchCache::Padded(cache) => {
                if cache.layers.len() != self.blocks.len() {
                    cache.layers = vec![None; self.blocks.len()];
                }
                Batch::new(ids, pad_mask, cache)?
            }
            BatchCache::Rows(cache) => {
                let (b, t) = ids.dims2()?;
                anyhow::ensure!(
                    t == 1 && b == cache.rows() && cache.layers() == self.blocks.len() && pad_mask.is_none(),
                    "a cache a sequence continues each of its {} sequences by one token, not [{b}, {t}]",
                    cache.rows()
                );
                anyhow::ensure!(
                    !self.differentiable && ids.device().is_cpu(),
                    "a cache a sequence is read by the CPU inference kernels only"
                );
                let offset = cache.len();
                let pads = cache.pads();
                Batch {
                    b,
                    t,
                    mask: KeyMask::new(offset, None)?,
                    offset,
                    shifts: pads.iter().any(|&p| p > 0).then(|| std::sync::Arc::new(pads)),
                }
            }
        };
        Ok(batch)
    }

    /// The decoder over `batches` (token ids `ids`, caches `caches`, one each) on the candle
    /// path: hidden states after the final norm, every batch's rows `[Σ b·t, hidden]` in order.
    fn run(&self, ids: &[&Tensor], batches: &[Batch], caches: &mut [BatchCache], runs: &[Run]) -> Result<Tensor> {
        let served = self.adapters.now();
        let pass = Pass {
            rope: &self.rope,
            eps: self.eps,
            diff: self.differentiable,
            batches,
            adapters: match served.as_deref() {
                Some(a) if runs.iter().any(|r| r.adapter.is_some()) => Some((a, a.groups(runs)?)),
                _ => None,
            },
        };
        let flat = ids
            .iter()
            .map(|i| i.flatten_all())
            .collect::<candle_core::Result<Vec<_>>>()?;
        let ids = match flat.as_slice() {
            [one] => one.clone(),
            _ => Tensor::cat(&flat, 0)?,
        };
        // Embeddings held in bf16/f16 are widened for the rows looked up.
        let mut x = self.embed.forward(&ids)?.to_dtype(DType::F32)?;
        let mut views: Vec<_> = caches.iter_mut().map(|c| c.layer_views().into_iter()).collect();
        for (li, block) in self.blocks.iter().enumerate() {
            let mut layer: Vec<_> = views
                .iter_mut()
                .map(|v| v.next().expect("a cache entry a layer"))
                .collect();
            x = block.forward(li, &x, &pass, &mut layer)?;
        }
        drop(views);
        for cache in caches {
            if let BatchCache::Rows(cache) = cache {
                cache.advance();
            }
        }
        rms_norm(&x, &self.norm, self.eps, self.differentiable)
    }

    /// Counts `b × t` new positions after `offset` cached ones, and checks they fit the model.
    fn count_and_check(&self, b: usize, offset: usize, t: usize) -> Result<()> {
        self.encoded_tokens
            .fetch_add(b * t, std::sync::atomic::Ordering::Relaxed);
        if offset + t > self.max_positions {
            anyhow::bail!(
                "a sequence of {} tokens exceeds the {} positions this model reads (four times its max_position_embeddings, at most 32768)",
                offset + t,
                self.max_positions
            );
        }
        Ok(())
    }
}
