//! `config.json` of Hugging Face Qwen2/Qwen2.5, Llama and Mistral checkpoints, in both the form
//! released checkpoints use (top-level `rope_theta`, integer `sliding_window`) and the form
//! transformers 5 writes (`rope_parameters`, `"sliding_window": null`).

use anyhow::{bail, Context, Result};
use candle_core::DType;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::path::Path;

/// The decoder family, which decides the attention biases and the weight names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Qwen2 / Qwen2.5: biases on q, k, v.
    Qwen2,
    /// Llama (and Mistral, which has the same weights): no biases unless `attention_bias`.
    Llama,
}

/// What sits on top of the decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadKind {
    /// Causal LM head (`lm_head`, or the embeddings when tied).
    CausalLm,
    /// Qwen2.5-Math-PRM: `score` = Linear-ReLU-Linear to 2 classes.
    ProcessRewardMlp,
    /// Linear token classifier `score` (TRL's PRMTrainer output; our PRMs). With one label it
    /// is a scalar value head read through a sigmoid.
    TokenClassification,
    /// `*ForSequenceClassification`: linear `score` without bias, read at the last token (the
    /// usual outcome reward model). With one label it is a scalar value head (sigmoid); read at
    /// every step's end it gives the value of each solution prefix in the same forward pass.
    SequenceClassification,
}

/// The model hyper-parameters stepwise needs (read from and written as `config.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Decoder family.
    pub family: Family,
    /// Head on top.
    pub head: HeadKind,
    /// `architectures[0]` as written in the file.
    pub architecture: String,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden size.
    pub hidden_size: usize,
    /// MLP inner size.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention).
    pub num_key_value_heads: usize,
    /// Per-head dimension.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// Longest supported sequence.
    pub max_position_embeddings: usize,
    /// Whether the LM head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Biases on q, k, v projections.
    pub attention_bias: bool,
    /// Number of classes of a classification head.
    pub num_labels: usize,
    /// End-of-sequence token ids from the config, if any.
    pub eos_token_ids: Vec<u32>,
    /// Padding token id (transformers' sequence classifiers find the last real token with it).
    pub pad_token_id: Option<u32>,
    /// The dtype the weights are stored in (`torch_dtype`, or `dtype` as transformers 5 writes
    /// it): computed in f32, written back in it, so a bf16 model stays bf16 on disk.
    pub dtype: DType,
}

/// The decoder family (`model_type`) and the head (`architectures`' first entry).
fn family_and_head(v: &Value, architecture: &str) -> Result<(Family, HeadKind)> {
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
    let family = match model_type {
        "qwen2" => Family::Qwen2,
        "llama" | "mistral" => Family::Llama,
        other => {
            bail!("field `model_type`: unsupported architecture `{other}` (stepwise reads qwen2, llama, mistral)")
        }
    };
    let head = if architecture.ends_with("ForProcessRewardModel") {
        HeadKind::ProcessRewardMlp
    } else if architecture.ends_with("ForTokenClassification") {
        HeadKind::TokenClassification
    } else if architecture.ends_with("ForSequenceClassification") {
        HeadKind::SequenceClassification
    } else if architecture.ends_with("ForCausalLM") || architecture.is_empty() {
        HeadKind::CausalLm
    } else {
        bail!("field `architectures`: unsupported head `{architecture}`");
    };
    Ok((family, head))
}

/// Refuses settings stepwise does not implement, rather than computing something else.
fn refuse_unsupported(v: &Value) -> Result<()> {
    if let Some(t) = v.pointer("/rope_parameters/rope_type").and_then(Value::as_str) {
        if t != "default" {
            bail!("field `rope_parameters.rope_type`: `{t}` scaling is not supported");
        }
    }
    // Settings stepwise does not implement are refused, not silently computed otherwise.
    if let Some(scaling) = v.get("rope_scaling").filter(|s| !s.is_null()) {
        let kind = scaling
            .get("rope_type")
            .or_else(|| scaling.get("type"))
            .and_then(Value::as_str);
        if kind != Some("default") {
            bail!("field `rope_scaling`: {scaling} is not supported (stepwise implements plain rotary positions)");
        }
    }
    if let Some(act) = v.get("hidden_act").filter(|a| !a.is_null()) {
        if !matches!(act.as_str(), Some("silu" | "swish")) {
            bail!("field `hidden_act`: {act} is not supported (Qwen2 and Llama decoders use silu)");
        }
    }
    if v.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
        bail!("field `use_sliding_window`: true is not supported (stepwise attends to the whole sequence)");
    }
    Ok(())
}

/// The weights' dtype (`torch_dtype`, or transformers 5's `dtype`).
fn weight_dtype(v: &Value) -> Result<DType> {
    Ok(match v.get("torch_dtype").or_else(|| v.get("dtype")) {
        None | Some(Value::Null) => DType::F32,
        Some(Value::String(name)) => match name.as_str() {
            "float32" | "auto" => DType::F32,
            "bfloat16" => DType::BF16,
            "float16" => DType::F16,
            other => bail!("field `torch_dtype`: `{other}` (stepwise reads float32, bfloat16 and float16 weights)"),
        },
        Some(other) => bail!("field `torch_dtype`: {other} is not a dtype name such as \"bfloat16\""),
    })
}


/// The name transformers gives a dtype in `config.json`.
fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        _ => "float32",
    }
}

fn get_usize(v: &Value, k: &str) -> Result<usize> {
    v.get(k)
        .and_then(Value::as_u64)
        .map(|x| x as usize)
        .with_context(|| format!("field `{k}`: missing or not an integer"))
}

impl ModelConfig {
    /// The longest sequence a verifier scores: four times the trained context
    /// (`max_position_embeddings`), at most 32768 positions (at least the trained context).
    /// Past the trained context the rotary positions are extrapolated, as transformers computes
    /// them: ProcessBench's MATH split has solutions of 4,461 tokens for a PRM trained on 4,096
    /// (Qwen2.5-Math-PRM-7B), scored by transformers and reported by its authors. Generation
    /// stays within the trained context.
    pub fn scoring_positions(&self) -> usize {
        self.max_position_embeddings
            .saturating_mul(4)
            .min(32768)
            .max(self.max_position_embeddings.min(32768))
    }

    /// Read `config.json` from a checkpoint folder.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = stepwise_core::io::read_regular_file(&path)?;
        let v: Value = serde_json::from_str(&text).with_context(|| format!("{}: invalid JSON", path.display()))?;
        Self::from_json(&v).with_context(|| format!("{}", path.display()))
    }

    /// Parse a `config.json` value.
    pub fn from_json(v: &Value) -> Result<Self> {
        let architecture = v
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let (family, head) = family_and_head(v, &architecture)?;
        let hidden_size = get_usize(v, "hidden_size")?;
        let num_attention_heads = get_usize(v, "num_attention_heads")?;
        if num_attention_heads == 0 {
            bail!("field `num_attention_heads`: 0 (a decoder needs at least one attention head)");
        }
        let rope_theta = v
            .get("rope_theta")
            .and_then(Value::as_f64)
            .or_else(|| v.pointer("/rope_parameters/rope_theta").and_then(Value::as_f64))
            .unwrap_or(10000.0);
        refuse_unsupported(v)?;
        let num_labels = v
            .get("num_labels")
            .and_then(Value::as_u64)
            .map(|x| x as usize)
            .or_else(|| v.get("id2label").and_then(Value::as_object).map(|m| m.len()))
            .unwrap_or(2);
        let eos_token_ids = match v.get("eos_token_id") {
            Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|x| x as u32).collect(),
            _ => Vec::new(),
        };
        let dtype = weight_dtype(v)?;
        let config = ModelConfig {
            dtype,
            family,
            head,
            architecture,
            vocab_size: get_usize(v, "vocab_size")?,
            hidden_size,
            intermediate_size: get_usize(v, "intermediate_size")?,
            num_hidden_layers: get_usize(v, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: v
                .get("num_key_value_heads")
                .and_then(Value::as_u64)
                .map_or(num_attention_heads, |x| x as usize),
            head_dim: v
                .get("head_dim")
                .and_then(Value::as_u64)
                .map_or(hidden_size / num_attention_heads, |x| x as usize),
            rms_norm_eps: v.get("rms_norm_eps").and_then(Value::as_f64).unwrap_or(1e-6),
            rope_theta,
            max_position_embeddings: v
                .get("max_position_embeddings")
                .and_then(Value::as_u64)
                .map_or(32768, |x| x as usize),
            tie_word_embeddings: v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false),
            attention_bias: match family {
                Family::Qwen2 => true,
                Family::Llama => v.get("attention_bias").and_then(Value::as_bool).unwrap_or(false),
            },
            num_labels,
            eos_token_ids,
            pad_token_id: v.get("pad_token_id").and_then(Value::as_u64).map(|x| x as u32),
        };
        config.check()?;
        Ok(config)
    }

    /// Rejects values no decoder can have, naming the field: sizes of zero, key/value heads
    /// that do not divide the query heads, an odd head size (rotary positions pair values),
    /// norms and rotary bases that are not positive numbers, token ids outside the vocabulary.
    pub fn check(&self) -> Result<()> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
            ("num_labels", self.num_labels),
        ];
        for (field, value) in positive {
            if value == 0 {
                bail!("field `{field}`: 0 (it must be at least 1)");
            }
        }
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            bail!(
                "field `num_key_value_heads`: {} does not divide num_attention_heads ({})",
                self.num_key_value_heads,
                self.num_attention_heads
            );
        }
        if !self.head_dim.is_multiple_of(2) {
            bail!(
                "field `head_dim`: {} is odd (rotary positions rotate pairs of values)",
                self.head_dim
            );
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            bail!(
                "field `rms_norm_eps`: {} (it must be a positive number)",
                self.rms_norm_eps
            );
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            bail!("field `rope_theta`: {} (it must be a number above 1)", self.rope_theta);
        }
        let vocab = self.vocab_size as u64;
        for (field, id) in self
            .eos_token_ids
            .iter()
            .map(|&i| ("eos_token_id", i))
            .chain(self.pad_token_id.map(|i| ("pad_token_id", i)))
        {
            if u64::from(id) >= vocab {
                bail!("field `{field}`: {id} is outside the vocabulary of {vocab} tokens");
            }
        }
        Ok(())
    }

    /// A config for a model trained from scratch, Qwen2 shape.
    pub fn tiny(
        vocab_size: usize,
        hidden: usize,
        layers: usize,
        heads: usize,
        kv_heads: usize,
        head: HeadKind,
    ) -> Self {
        ModelConfig {
            family: Family::Qwen2,
            head,
            architecture: String::new(),
            vocab_size,
            hidden_size: hidden,
            intermediate_size: hidden * 8 / 3 / 8 * 8,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim: hidden / heads,
            rms_norm_eps: 1e-6,
            rope_theta: 10000.0,
            max_position_embeddings: 2048,
            tie_word_embeddings: head == HeadKind::CausalLm,
            attention_bias: true,
            num_labels: 2,
            eos_token_ids: Vec::new(),
            pad_token_id: Some(0),
            dtype: DType::F32,
        }
        .with_head(head)
    }

    /// The same decoder with a scalar value head (`*ForSequenceClassification`, one label).
    pub fn with_value_head(self) -> Self {
        let mut c = self.with_head(HeadKind::SequenceClassification);
        c.num_labels = 1;
        c
    }

    /// The same decoder with another head.
    pub fn with_head(mut self, head: HeadKind) -> Self {
        self.head = head;
        let prefix = match self.family {
            Family::Qwen2 => "Qwen2",
            Family::Llama => "Llama",
        };
        self.architecture = format!(
            "{prefix}{}",
            match head {
                HeadKind::CausalLm => "ForCausalLM",
                HeadKind::ProcessRewardMlp => "ForProcessRewardModel",
                HeadKind::TokenClassification => "ForTokenClassification",
                HeadKind::SequenceClassification => "ForSequenceClassification",
            }
        );
        if head != HeadKind::CausalLm {
            self.tie_word_embeddings = false;
        }
        if head == HeadKind::SequenceClassification && self.pad_token_id.is_none() {
            // transformers finds each sequence's last token by its padding id and refuses a
            // batch without one: the end-of-sequence id pads, as for Qwen2 and Llama releases.
            self.pad_token_id = Some(self.eos_token_ids.first().copied().unwrap_or(0));
        }
        self
    }

    /// `config.json` as transformers writes it, so that `AutoModel*.from_pretrained` loads it.
    pub fn to_hf_json(&self) -> Value {
        let model_type = match self.family {
            Family::Qwen2 => "qwen2",
            Family::Llama => "llama",
        };
        let mut v = json!({
            "architectures": [self.architecture],
            "model_type": model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": dtype_name(self.dtype),
            "dtype": dtype_name(self.dtype),
            "use_sliding_window": false,
            "sliding_window": null,
        });
        if self.family == Family::Llama {
            v["attention_bias"] = json!(self.attention_bias);
        }
        if self.head != HeadKind::CausalLm {
            v["num_labels"] = json!(self.num_labels);
            v["id2label"] = json!((0..self.num_labels)
                .map(|i| (i.to_string(), json!(format!("LABEL_{i}"))))
                .collect::<serde_json::Map<_, _>>());
            v["label2id"] = json!((0..self.num_labels)
                .map(|i| (format!("LABEL_{i}"), json!(i)))
                .collect::<serde_json::Map<_, _>>());
        }
        if let Some(&e) = self.eos_token_ids.first() {
            v["eos_token_id"] = json!(e);
        }
        if let Some(p) = self.pad_token_id {
            v["pad_token_id"] = json!(p);
        }
        v
    }
}
