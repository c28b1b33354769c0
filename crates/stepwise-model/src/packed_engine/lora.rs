//! LoRA (Hu et al., 2021) on the packed trainer: each targeted projection `W` (`[out, in]`)
//! learns `W + (α/r)·B·A` with `A` `[r, in]` and `B` `[out, r]` while `W`, the embeddings, the
//! norms and a causal LM's head stay frozen (a reward model's head trains in full, as PEFT's
//! `modules_to_save`). Only the adapters (and that head) have f32 masters, gradients and AdamW
//! moments, so training holds the bf16 model, one bf16 copy of each adapted matrix and the
//! activations instead of 18 bytes a parameter.
//!
//! The forward reads the adapted weights merged, `bf16(W + (α/r)·B·A)`, remade after each update
//! from the frozen `W` (the same rounding the full trainer's bf16 copies of its f32 masters
//! take), so scoring, sampling and the backward's input gradients run the engine's kernels
//! unchanged. The adapters' gradients come from the layer's kept input `x` and output gradient
//! `dy` in three thin products: `dB = (α/r)·dyᵀ·(x·Aᵀ)`, `dA = (dy·(α/r)B)ᵀ·x`.
//!
//! The engine stacks q|k|v and gate|up in one matrix; an adapter on one of them covers the
//! projections targeted there, each with its own `A` and `B` (PEFT's layout, saved under PEFT's
//! names): their `A`s stacked (`[P·r, in]`) and their `B`s laid block-diagonally over the stacked
//! rows (`[out, P·r]`, zero where a row's projection is another's or not targeted).

use super::train::{PackedTrainer, Spec};
use super::train_backend::TrainBackend;
use super::{Backend, Head, Out, PackedDecoder};
use crate::config::ModelConfig;
use anyhow::{bail, ensure, Context, Result};
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use serde::{Deserialize, Serialize};

/// The projections LoRA may target, by their Hugging Face module names.
pub const LORA_MODULES: [&str; 7] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

/// Which adapters a run trains.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    /// Rank `r` of each adapter.
    pub rank: usize,
    /// `α`: the adapters' product is scaled by `α / r`.
    pub alpha: f32,
    /// The projections adapted in every layer (of [`LORA_MODULES`]).
    pub targets: Vec<String>,
    /// Seed of the `A` matrices' initialisation (`B` starts at zero).
    pub seed: u64,
}

impl LoraConfig {
    /// Rank `rank` with `α = 2r`, on every linear projection of every layer (PEFT's
    /// `target_modules="all-linear"` on a Qwen2 decoder).
    pub fn new(rank: usize) -> Self {
        LoraConfig {
            rank,
            alpha: 2.0 * rank as f32,
            targets: LORA_MODULES.iter().map(|s| s.to_string()).collect(),
            seed: 0,
        }
    }

    /// The projections of a comma-separated list (`all-linear` for every one), checked.
    pub fn parse_targets(list: &str) -> Result<Vec<String>> {
        if list.trim() == "all-linear" {
            return Ok(LORA_MODULES.iter().map(|s| s.to_string()).collect());
        }
        let mut out = Vec::new();
        for t in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let t = if t.ends_with("_proj") { t.to_string() } else { format!("{t}_proj") };
            ensure!(
                LORA_MODULES.contains(&t.as_str()),
                "LoRA target `{t}`: a projection of {} (or all-linear)",
                LORA_MODULES.join(", ")
            );
            if !out.contains(&t) {
                out.push(t);
            }
        }
        ensure!(!out.is_empty(), "no LoRA targets in `{list}`");
        Ok(out)
    }

    /// The configuration checked: a rank of at least 1, a positive finite `α`, known targets.
    pub fn check(&self) -> Result<()> {
        ensure!(self.rank >= 1, "a LoRA rank of at least 1 (0 trains every weight: no LoRA)");
        ensure!(self.alpha.is_finite() && self.alpha > 0.0, "LoRA alpha {} is not positive", self.alpha);
        Self::parse_targets(&self.targets.join(",")).map(|_| ())
    }

    /// `α / r`.
    pub fn scale(&self) -> f32 {
        self.alpha / self.rank as f32
    }
}

/// One of a layer's stacked matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Matrix {
    Qkv,
    O,
    GateUp,
    Down,
}

/// The adapter on one stacked matrix.
struct Adapted<B: Backend> {
    layer: usize,
    matrix: Matrix,
    /// Rows and columns of the matrix.
    n: usize,
    k: usize,
    /// Each adapted projection's first row and rows in the matrix (its block of `B` is the
    /// one at its place here).
    parts: Vec<(usize, usize)>,
    /// The frozen matrix.
    base: B::Bf16,
    /// `bf16(A)`, `[P·r, k]`.
    a16: B::Bf16,
    /// `bf16((α/r)·B)` block-diagonal, `[n, P·r]`.
    sb16: B::Bf16,
    /// The gradient of the block-diagonal `B` (over all its values), `[n, P·r]`.
    gb: B::F32,
    /// Where this adapter's `A` is among the trainer's adapter values (`B` is next).
    value: usize,
}

/// The adapters of a trainer.
pub(super) struct Adapters<B: Backend> {
    config: LoraConfig,
    /// The base model's folder (PEFT's `base_model_name_or_path`).
    base: String,
    /// The checkpoint names of the adapted projections' weights.
    adapted: std::collections::HashSet<String>,
    matrices: Vec<Adapted<B>>,
    /// `0, 1, 2, …`: the rows [`Backend::embed`] widens a matrix by.
    ids: B::I32,
}

/// The Hugging Face module names stacked in `m`, with the rows of each (`cfg`'s shapes).
fn modules(cfg: &ModelConfig, m: Matrix) -> Vec<(&'static str, usize)> {
    let (h, d, inter) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
    let (heads, kv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    match m {
        Matrix::Qkv => vec![("q_proj", heads * d), ("k_proj", kv * d), ("v_proj", kv * d)],
        Matrix::O => vec![("o_proj", h)],
        Matrix::GateUp => vec![("gate_proj", inter), ("up_proj", inter)],
        Matrix::Down => vec![("down_proj", h)],
    }
}

/// The checkpoint (PEFT) name of a module's adapter half (`A` or `B`) in layer `i`.
pub(super) fn peft_name(i: usize, module: &str, half: char) -> String {
    let weight = weight_name(i, module);
    format!("base_model.model.{}.lora_{half}.weight", weight.trim_end_matches(".weight"))
}

/// The checkpoint name of layer `i`'s `module` weight.
fn weight_name(i: usize, module: &str) -> String {
    let block = if ["gate_proj", "up_proj", "down_proj"].contains(&module) { "mlp" } else { "self_attn" };
    format!("model.layers.{i}.{block}.{module}.weight")
}

impl<B: TrainBackend> Adapters<B> {
    /// Adapters of `config` on `dec`'s layers, and the specs of their values (each adapter's
    /// `A` then `B`, B's projections stacked `[rows, r]`), the frozen matrices copied aside.
    pub(super) fn new(dec: &PackedDecoder<B>, config: LoraConfig, base: &std::path::Path) -> Result<(Self, Vec<Spec>)> {
        config.check()?;
        let (b, cfg, r) = (&*dec.backend, &dec.config, config.rank);
        let all = [Matrix::Qkv, Matrix::O, Matrix::GateUp, Matrix::Down];
        let rows = |m: Matrix| modules(cfg, m).iter().map(|p| p.1).sum::<usize>();
        let widest = all.map(rows).into_iter().max().unwrap_or(0);
        let ids = b.upload_i32(&(0..widest as i32).collect::<Vec<_>>())?;
        let largest = all.map(|m| rows(m) * held_k(cfg, m)).into_iter().max().unwrap_or(0);
        let mut wide = zeros(b, largest)?;
        let (mut matrices, mut specs, mut adapted) = (Vec::new(), Vec::new(), std::collections::HashSet::new());
        for (li, l) in dec.layers.iter().enumerate() {
            for (matrix, held) in [(Matrix::Qkv, &l.qkv), (Matrix::O, &l.o), (Matrix::GateUp, &l.gate_up), (Matrix::Down, &l.down)] {
                let (mut parts, mut a_spec, mut b_spec, mut row) = (Vec::new(), Vec::new(), Vec::new(), 0);
                for (module, rows) in modules(cfg, matrix) {
                    if config.targets.iter().any(|t| t == module) {
                        adapted.insert(weight_name(li, module));
                        parts.push((row, rows));
                        a_spec.push((peft_name(li, module, 'A'), vec![r, held_k(cfg, matrix)]));
                        b_spec.push((peft_name(li, module, 'B'), vec![rows, r]));
                    }
                    row += rows;
                }
                if parts.is_empty() {
                    continue;
                }
                let (n, k) = (row, held_k(cfg, matrix));
                ensure!(b.len_bf16(held) >= n * k, "layer {li}: a {matrix:?} matrix smaller than its shape");
                // A copy (widened and rounded back: exact).
                let mut base = b.zeros_bf16(n * k)?;
                b.embed(held, &ids, &mut wide, n, k)?;
                b.round_bf16(&wide, &mut base, 0, n * k)?;
                let pr = parts.len() * r;
                matrices.push(Adapted {
                    layer: li,
                    matrix,
                    n,
                    k,
                    base,
                    a16: b.zeros_bf16(pr * k)?,
                    sb16: b.zeros_bf16(n * pr)?,
                    gb: zeros(b, n * pr)?,
                    value: specs.len(),
                    parts,
                });
                specs.push(Spec::trained(a_spec));
                specs.push(Spec::trained(b_spec));
            }
        }
        ensure!(!matrices.is_empty(), "LoRA targets {:?} match no projection of the model", config.targets);
        let base = base.display().to_string();
        Ok((Adapters { config, base, adapted, matrices, ids }, specs))
    }

    /// The adapters' configuration.
    pub(super) fn config(&self) -> &LoraConfig {
        &self.config
    }

    /// The base model's folder.
    pub(super) fn base(&self) -> &std::path::Path {
        std::path::Path::new(&self.base)
    }

    /// Whether the checkpoint tensor `name` is an adapted projection's weight.
    pub(super) fn adapts(&self, name: &str) -> bool {
        self.adapted.contains(name)
    }

    /// PEFT's `adapter_config.json` for these adapters on a model of `cfg` (whose head trains
    /// in full with `head`: PEFT's `modules_to_save`).
    pub(super) fn peft_config(&self, cfg: &ModelConfig, head: bool) -> serde_json::Value {
        let task = match cfg.head {
            crate::config::HeadKind::CausalLm => "CAUSAL_LM",
            crate::config::HeadKind::SequenceClassification => "SEQ_CLS",
            _ => "TOKEN_CLS",
        };
        serde_json::json!({
            "peft_type": "LORA",
            "task_type": task,
            "base_model_name_or_path": self.base,
            "r": self.config.rank,
            "lora_alpha": self.config.alpha,
            "lora_dropout": 0.0,
            "target_modules": self.config.targets,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": false,
            "use_dora": false,
            "init_lora_weights": true,
            "inference_mode": true,
            "modules_to_save": if head { serde_json::json!(["score"]) } else { serde_json::Value::Null },
        })
    }

    /// Every `A` drawn as PEFT draws it (Kaiming-uniform, `±1/√in`, from the config's seed)
    /// and every `B` zero, so that the adapted model starts as the base.
    pub(super) fn init(&self, b: &B, values: &mut [B::F32]) -> Result<()> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(self.config.seed);
        for m in &self.matrices {
            let bound = 1.0 / (m.k as f32).sqrt();
            let a: Vec<f32> = (0..m.parts.len() * self.config.rank * m.k).map(|_| rng.random_range(-bound..bound)).collect();
            b.write_f32(&mut values[m.value], 0, &a)?;
            let rows: usize = m.parts.iter().map(|p| p.1).sum();
            b.zero_f32(&mut values[m.value + 1], rows * self.config.rank)?;
        }
        Ok(())
    }

    /// The decoder's adapted matrices remade from the frozen ones and the adapter masters
    /// `values`: `bf16(W + bf16((α/r)·B) · bf16(A))`, summed in f32.
    pub(super) fn merge(&mut self, dec: &mut PackedDecoder<B>, values: &[B::F32]) -> Result<()> {
        let b = Arc::clone(&dec.backend);
        let b = &*b;
        let (r, scale) = (self.config.rank, self.config.scale());
        let widest = self.matrices.iter().map(|m| m.n * m.k).max().unwrap_or(0);
        let mut sum = zeros(b, widest)?;
        for m in &mut self.matrices {
            let (n, k, pr) = (m.n, m.k, m.parts.len() * r);
            b.round_bf16(&values[m.value], &mut m.a16, 0, pr * k)?;
            let stacked = b.read_f32(&values[m.value + 1], m.parts.iter().map(|p| p.1).sum::<usize>() * r)?;
            let mut diag = vec![0u16; n * pr];
            let mut at = 0;
            for (j, &(first, rows)) in m.parts.iter().enumerate() {
                for i in 0..rows {
                    let src = &stacked[(at + i) * r..][..r];
                    let dst = &mut diag[(first + i) * pr + j * r..][..r];
                    for (d, &s) in dst.iter_mut().zip(src) {
                        *d = half::bf16::from_f32(scale * s).to_bits();
                    }
                }
                at += rows;
            }
            b.write_bf16(&mut m.sb16, 0, &diag)?;
            b.embed(&m.base, &self.ids, &mut sum, n, k)?;
            b.gemm_nn(&m.sb16, &m.a16, Out::F32(&mut sum), n, pr, k, true)?;
            b.round_bf16(&sum, held_mut(dec, m.layer, m.matrix), 0, n * k)?;
        }
        Ok(())
    }

    /// Each adapted matrix of `dec` and its frozen self traded places: done once, the decoder
    /// holds the base model (the merged matrices kept aside); done again, it is as it was.
    fn trade(&mut self, dec: &mut PackedDecoder<B>) {
        for m in &mut self.matrices {
            std::mem::swap(&mut m.base, held_mut(dec, m.layer, m.matrix));
        }
    }

    /// The adapter on layer `layer`'s `matrix` backward: for its input `x` (`[t, k]`) and its
    /// output's gradient `dy` (`[t, n]`), `dA` added to `grads`' and `dB` to the adapter's own
    /// (`xa`, `dyb`: scratch of at least `t × P·r` values).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn backward(
        &mut self,
        b: &B,
        layer: usize,
        matrix: Matrix,
        dy: &B::Bf16,
        x: &B::Bf16,
        t: usize,
        grads: &mut [B::F32],
        scratch: &mut (B::Bf16, B::Bf16),
    ) -> Result<()> {
        let r = self.config.rank;
        let Some(m) = self.matrices.iter_mut().find(|m| m.layer == layer && m.matrix == matrix) else {
            return Ok(());
        };
        let (n, k, pr) = (m.n, m.k, m.parts.len() * r);
        let (xa, dyb) = scratch;
        b.gemm(x, &m.a16, Out::Bf16(xa), t, pr, k, false)?;
        b.gemm_weight_grad(dy, xa, &mut m.gb, t, n, pr)?;
        b.gemm_nn(dy, &m.sb16, Out::Bf16(dyb), t, n, pr, false)?;
        b.gemm_weight_grad(dyb, x, &mut grads[m.value], t, pr, k)
    }

    /// Scratch for [`Adapters::backward`] over `t` tokens.
    pub(super) fn scratch(&self, b: &B, t: usize) -> Result<(B::Bf16, B::Bf16)> {
        let widest = self.matrices.iter().map(|m| m.parts.len()).max().unwrap_or(1) * self.config.rank;
        Ok((b.zeros_bf16(t * widest)?, b.zeros_bf16(t * widest)?))
    }

    /// Each `B`'s gradient, `(α/r)` times its blocks of the block-diagonal gradient, added to
    /// `grads`' (stacked as its values are), and the block-diagonal gradients zeroed.
    pub(super) fn gather(&mut self, b: &B, grads: &mut [B::F32]) -> Result<()> {
        let (r, scale) = (self.config.rank, self.config.scale());
        for m in &mut self.matrices {
            let pr = m.parts.len() * r;
            let diag = b.read_f32(&m.gb, m.n * pr)?;
            let stacked_len = m.parts.iter().map(|p| p.1).sum::<usize>() * r;
            let mut stacked = b.read_f32(&grads[m.value + 1], stacked_len)?;
            let mut at = 0;
            for (j, &(first, rows)) in m.parts.iter().enumerate() {
                for i in 0..rows {
                    let src = &diag[(first + i) * pr + j * r..][..r];
                    for (g, &d) in stacked[(at + i) * r..][..r].iter_mut().zip(src) {
                        *g += scale * d;
                    }
                }
                at += rows;
            }
            b.write_f32(&mut grads[m.value + 1], 0, &stacked)?;
            b.zero_f32(&mut m.gb, m.n * pr)?;
        }
        Ok(())
    }
}

/// Columns of `m`.
fn held_k(cfg: &ModelConfig, m: Matrix) -> usize {
    match m {
        Matrix::Qkv | Matrix::GateUp => cfg.hidden_size,
        Matrix::O => cfg.num_attention_heads * cfg.head_dim,
        Matrix::Down => cfg.intermediate_size,
    }
}

/// The decoder's copy of layer `li`'s `m`.
fn held_mut<B: Backend>(dec: &mut PackedDecoder<B>, li: usize, m: Matrix) -> &mut B::Bf16 {
    let l = &mut dec.layers[li];
    match m {
        Matrix::Qkv => &mut l.qkv,
        Matrix::O => &mut l.o,
        Matrix::GateUp => &mut l.gate_up,
        Matrix::Down => &mut l.down,
    }
}

/// `n` zeros, written (not only allocated).
fn zeros<B: TrainBackend>(b: &B, n: usize) -> Result<B::F32> {
    let mut buf = b.zeros_f32(n)?;
    b.zero_f32(&mut buf, n)?;
    Ok(buf)
}

/// Where a layer's weight gradients go: into each matrix's own (full training), or into its
/// adapter's (LoRA, the base frozen; nothing for a matrix without one).
pub(super) enum WeightGrads<'a, B: Backend> {
    Full,
    Lora {
        adapters: &'a mut Adapters<B>,
        scratch: (B::Bf16, B::Bf16),
        /// The adapters' gradients ([`super::train::Params::lora`]).
        grads: &'a mut [B::F32],
    },
}

impl<B: TrainBackend> WeightGrads<'_, B> {
    /// The gradient of layer `layer`'s `matrix` (`[n, k]`) through `y = x · matrixᵀ`, for its
    /// input `x` (`[t, k]`) and output gradient `dy` (`[t, n]`): added to `dw`, or its adapter's.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add(
        &mut self,
        b: &B,
        (layer, matrix): (usize, Matrix),
        dy: &B::Bf16,
        x: &B::Bf16,
        dw: &mut B::F32,
        t: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        match self {
            WeightGrads::Full => b.gemm_weight_grad(dy, x, dw, t, n, k),
            WeightGrads::Lora {
                adapters,
                scratch,
                grads,
            } => adapters.backward(b, layer, matrix, dy, x, t, grads, scratch),
        }
    }
}

impl<B: TrainBackend> PackedTrainer<B> {
    /// `work` on the frozen model LoRA's adapters sit on: the decoder with its adapted matrices
    /// traded for their frozen selves, and back after (PEFT's `disable_adapter()`: a buffer swap
    /// each, no copy). For a causal LM this is the starting policy, so an RL or DPO run takes
    /// its reference's log-probabilities here instead of from a second copy of the model.
    /// Refused without LoRA, where a reward model's head trains (the base has none of its own),
    /// and while a sampler holds the decoder.
    pub fn with_adapters_off<R>(&mut self, work: impl FnOnce(&PackedDecoder<B>) -> Result<R>) -> Result<R> {
        let Some(adapters) = self.adapters.as_mut() else {
            bail!("the trainer trains every weight: it has no frozen base (LoRA) to read");
        };
        ensure!(
            matches!(self.decoder.head, Head::Lm(_)),
            "the reward model's head trains in full with LoRA: with the adapters off it is not the base's"
        );
        let dec = Arc::get_mut(&mut self.decoder).context("the trainer's model is lent (to a sampler)")?;
        adapters.trade(dec);
        let out = work(dec);
        adapters.trade(dec);
        out
    }

    /// Whether [`PackedTrainer::with_adapters_off`] reads the frozen base: LoRA on a causal LM.
    pub fn has_frozen_base(&self) -> bool {
        self.adapters.is_some() && matches!(self.decoder.head, Head::Lm(_))
    }
}
