//! Loading a checkpoint onto the packed engine: every tensor planned into stacked buffers by
//! name and shape, then copied in one at a time from the memory-mapped files.

use super::{Backend, Head, Layer, PackedDecoder, Scratch, LOGITS_BYTES};
use crate::config::{HeadKind, ModelConfig};
use crate::packed::Packed;
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

impl<B: Backend> PackedDecoder<B> {
    /// Loads the checkpoint folder `dir` (whose config is `config`) onto `backend`: matrices as
    /// bf16 (bf16 checkpoints as stored; f32 and f16 rounded to bf16), norms and biases as f32.
    /// Tensors are read from the memory-mapped files and copied one at a time into stacked
    /// buffers; a missing or mis-shaped tensor is an error naming it.
    pub fn load(dir: &Path, config: ModelConfig, backend: Arc<B>) -> Result<Self> {
        let b = &*backend;
        let cfg = &config;
        crate::checkpoint::check_layer_count(cfg, &crate::checkpoint::weight_files(dir)?)?;
        let (heads, kv, d) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
        if heads == 0 || kv == 0 || !heads.is_multiple_of(kv) || !d.is_multiple_of(2) {
            bail!("{}: {heads} attention heads over {kv} key/value heads of size {d}: the packed engine needs a whole number of query heads per key/value head and an even head size", dir.display());
        }
        let mut plan = Plan::<B> {
            matrices: Vec::new(),
            vectors: Vec::new(),
            at: HashMap::new(),
        };
        let named = |n: &str, s: Vec<usize>| (n.to_string(), s);
        let embed = plan.matrix(b, &[named("model.embed_tokens.weight", vec![cfg.vocab_size, cfg.hidden_size])])?;
        let norm = plan.vector(b, &[named("model.norm.weight", vec![cfg.hidden_size])])?;
        let layer_slots = (0..cfg.num_hidden_layers)
            .map(|i| LayerSlots::plan(&mut plan, b, cfg, i))
            .collect::<Result<Vec<_>>>()?;
        let head_slots = HeadSlots::plan(&mut plan, b, cfg)?;
        plan.fill(b, dir, &cfg.architecture)?;
        let layers = layer_slots.into_iter().map(|l| l.take(&mut plan)).collect();
        let head = head_slots.take(&mut plan);
        let (cos, sin, max_positions) = rope_tables(b, cfg)?;
        let model = PackedDecoder {
            embed: plan.take_matrix(embed),
            norm: plan.take_vector(norm),
            layers,
            head,
            cos,
            sin,
            max_positions,
            logits_bytes: LOGITS_BYTES,
            scratch: Mutex::new(Scratch::default()),
            encoded_tokens: AtomicUsize::new(0),
            adapters: Default::default(),
            config,
            backend,
        };
        // One token through everything: the backend's kernels and buffers are ready before the
        // first timed pass.
        model.head_at(&Packed::new(&[&[0]]), &[0], Some(&[0]))?;
        model.encoded_tokens.store(0, Ordering::Relaxed);
        Ok(model)
    }
}

/// Where each checkpoint tensor goes while loading.
struct Plan<B: Backend> {
    matrices: Vec<Option<B::Bf16>>,
    vectors: Vec<Option<B::F32>>,
    /// name → (matrix?, slot, offset in values, shape).
    at: HashMap<String, (bool, usize, usize, Vec<usize>)>,
}

impl<B: Backend> Plan<B> {
    /// A matrix buffer holding `parts` one after another.
    fn matrix(&mut self, b: &B, parts: &[(String, Vec<usize>)]) -> Result<usize> {
        self.matrices.push(Some(b.zeros_bf16(Self::place(
            &mut self.at,
            parts,
            true,
            self.matrices.len(),
        ))?));
        Ok(self.matrices.len() - 1)
    }

    /// A vector buffer holding `parts` one after another.
    fn vector(&mut self, b: &B, parts: &[(String, Vec<usize>)]) -> Result<usize> {
        self.vectors.push(Some(b.zeros_f32(Self::place(
            &mut self.at,
            parts,
            false,
            self.vectors.len(),
        ))?));
        Ok(self.vectors.len() - 1)
    }

    /// Records where each part goes in slot `slot`; returns the slot's size.
    fn place(
        at: &mut HashMap<String, (bool, usize, usize, Vec<usize>)>,
        parts: &[(String, Vec<usize>)],
        matrix: bool,
        slot: usize,
    ) -> usize {
        let mut offset = 0;
        for (name, shape) in parts {
            at.insert(name.clone(), (matrix, slot, offset, shape.clone()));
            offset += shape.iter().product::<usize>();
        }
        offset
    }

    fn take_matrix(&mut self, slot: usize) -> B::Bf16 {
        self.matrices[slot].take().expect("each slot taken once")
    }

    fn take_vector(&mut self, slot: usize) -> B::F32 {
        self.vectors[slot].take().expect("each slot taken once")
    }
}

/// A layer's slots in the load plan: its norms, fused projections and biases.
struct LayerSlots {
    ln1: usize,
    ln2: usize,
    qkv: usize,
    qkv_bias: Option<usize>,
    o: usize,
    gate_up: usize,
    down: usize,
}

impl LayerSlots {
    /// Layer `i`'s tensors, named and shaped as `cfg` says, in the plan.
    fn plan<B: Backend>(plan: &mut Plan<B>, b: &B, cfg: &ModelConfig, i: usize) -> Result<Self> {
        let (h, d, inter) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
        let (heads, kv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        let p = format!("model.layers.{i}");
        let w = |n: &str, s: Vec<usize>| (format!("{p}.{n}"), s);
        let proj = |x: &str| format!("self_attn.{x}_proj.weight");
        let bias = |x: &str| format!("self_attn.{x}_proj.bias");
        let qkv_bias = if cfg.attention_bias {
            let parts = [
                w(&bias("q"), vec![heads * d]),
                w(&bias("k"), vec![kv * d]),
                w(&bias("v"), vec![kv * d]),
            ];
            Some(plan.vector(b, &parts)?)
        } else {
            None
        };
        let qkv = [
            w(&proj("q"), vec![heads * d, h]),
            w(&proj("k"), vec![kv * d, h]),
            w(&proj("v"), vec![kv * d, h]),
        ];
        let gate_up = [w("mlp.gate_proj.weight", vec![inter, h]), w("mlp.up_proj.weight", vec![inter, h])];
        Ok(LayerSlots {
            ln1: plan.vector(b, &[w("input_layernorm.weight", vec![h])])?,
            ln2: plan.vector(b, &[w("post_attention_layernorm.weight", vec![h])])?,
            qkv: plan.matrix(b, &qkv)?,
            qkv_bias,
            o: plan.matrix(b, &[w(&proj("o"), vec![h, heads * d])])?,
            gate_up: plan.matrix(b, &gate_up)?,
            down: plan.matrix(b, &[w("mlp.down_proj.weight", vec![h, inter])])?,
        })
    }

    /// The layer, its buffers taken from the filled plan.
    fn take<B: Backend>(self, plan: &mut Plan<B>) -> Layer<B> {
        Layer {
            ln1: plan.take_vector(self.ln1),
            ln2: plan.take_vector(self.ln2),
            qkv: plan.take_matrix(self.qkv),
            qkv_bias: self.qkv_bias.map(|s| plan.take_vector(s)),
            o: plan.take_matrix(self.o),
            gate_up: plan.take_matrix(self.gate_up),
            down: plan.take_matrix(self.down),
        }
    }
}

/// The head's slots in the load plan.
enum HeadSlots {
    Lm(Option<usize>),
    Mlp(usize, usize, usize, usize),
    Classifier(usize, Option<usize>),
}

impl HeadSlots {
    /// The head `cfg` names, in the plan.
    fn plan<B: Backend>(plan: &mut Plan<B>, b: &B, cfg: &ModelConfig) -> Result<Self> {
        let (h, c) = (cfg.hidden_size, cfg.num_labels);
        let named = |n: &str, s: Vec<usize>| (n.to_string(), s);
        Ok(match cfg.head {
            HeadKind::CausalLm if cfg.tie_word_embeddings => HeadSlots::Lm(None),
            HeadKind::CausalLm => HeadSlots::Lm(Some(
                plan.matrix(b, &[named("lm_head.weight", vec![cfg.vocab_size, h])])?,
            )),
            HeadKind::ProcessRewardMlp => HeadSlots::Mlp(
                plan.matrix(b, &[named("score.0.weight", vec![h, h])])?,
                plan.vector(b, &[named("score.0.bias", vec![h])])?,
                plan.matrix(b, &[named("score.2.weight", vec![c, h])])?,
                plan.vector(b, &[named("score.2.bias", vec![c])])?,
            ),
            HeadKind::TokenClassification => HeadSlots::Classifier(
                plan.matrix(b, &[named("score.weight", vec![c, h])])?,
                Some(plan.vector(b, &[named("score.bias", vec![c])])?),
            ),
            HeadKind::SequenceClassification => {
                HeadSlots::Classifier(plan.matrix(b, &[named("score.weight", vec![c, h])])?, None)
            }
        })
    }

    /// The head, its buffers taken from the filled plan.
    fn take<B: Backend>(self, plan: &mut Plan<B>) -> Head<B> {
        match self {
            HeadSlots::Lm(w) => Head::Lm(w.map(|s| plan.take_matrix(s))),
            HeadSlots::Mlp(w1, b1, w2, b2) => Head::Mlp {
                w1: plan.take_matrix(w1),
                b1: plan.take_vector(b1),
                w2: plan.take_matrix(w2),
                b2: plan.take_vector(b2),
            },
            HeadSlots::Classifier(w, bias) => Head::Classifier {
                w: plan.take_matrix(w),
                b: bias.map(|s| plan.take_vector(s)),
            },
        }
    }
}

impl<B: Backend> Plan<B> {
    /// Copies every planned tensor of the checkpoint in `dir` into its buffer, one at a time
    /// from the memory-mapped files (each one's pages let go once copied); a missing or mis-shaped tensor is an error naming it.
    fn fill(&mut self, b: &B, dir: &Path, architecture: &str) -> Result<()> {
        let mut missing: std::collections::HashSet<String> = self.at.keys().cloned().collect();
        for file in crate::checkpoint::weight_files(dir)? {
            let map = crate::checkpoint::Mapped::open(&file)?;
            let st =
                safetensors::SafeTensors::deserialize(&map).with_context(|| format!("reading {}", file.display()))?;
            for (name, view) in st.tensors() {
                let Some((matrix, slot, offset, shape)) = self.at.get(&name).cloned() else {
                    continue;
                };
                let at = || format!("{}: tensor `{name}`", file.display());
                if view.shape() != shape.as_slice() {
                    bail!("{}: shape {:?}, config.json implies {shape:?}", at(), view.shape());
                }
                if matrix {
                    let host = crate::checkpoint::to_bf16_bits(&view).with_context(at)?;
                    let buf = self.matrices[slot].as_mut().expect("slots are taken after loading");
                    b.write_bf16(buf, offset, &host)?;
                } else {
                    let host = crate::checkpoint::to_f32(&view).with_context(at)?;
                    let buf = self.vectors[slot].as_mut().expect("slots are taken after loading");
                    b.write_f32(buf, offset, &host)?;
                }
                map.let_go(view.data());
                missing.remove(&name);
            }
        }
        if let Some(name) = missing.iter().min() {
            bail!("{}: tensor `{name}` is missing (architecture {architecture})", dir.display());
        }
        Ok(())
    }
}

/// Rotary tables as the CPU path computes them (f32 inverse frequencies, then cos/sin), for
/// every position a verifier reads: `(cos, sin, positions)`.
fn rope_tables<B: Backend>(b: &B, cfg: &ModelConfig) -> Result<(B::F32, B::F32, usize)> {
    let (max_positions, d) = (cfg.scoring_positions(), cfg.head_dim);
    let half = d / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| 1.0 / (cfg.rope_theta as f32).powf(2.0 * i as f32 / d as f32))
        .collect();
    let angles: Vec<f32> = (0..max_positions)
        .flat_map(|p| inv.iter().map(move |f| p as f32 * f))
        .collect();
    let cos = b.upload_f32(&angles.iter().map(|a| a.cos()).collect::<Vec<_>>())?;
    let sin = b.upload_f32(&angles.iter().map(|a| a.sin()).collect::<Vec<_>>())?;
    Ok((cos, sin, max_positions))
}
