//! A decoder plus its head, loaded from (and saved to) a Hugging Face checkpoint folder.

use crate::checkpoint;
use crate::config::{HeadKind, ModelConfig};
use crate::engine::PackedEngine;
use crate::kernels::Linear;
use crate::input::Input;
use crate::transformer::Transformer;
use crate::precision::{default_precision, Precision, WeightDtype};
use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor, D};
use candle_nn::{VarBuilder, VarMap};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// The head on top of the decoder.
#[derive(Clone, Debug)]
pub enum Head {
    /// Vocabulary logits.
    Lm(Linear),
    /// Qwen2.5-Math-PRM's `score`: Linear → ReLU → Linear.
    Mlp(Linear, Linear),
    /// A linear classifier (`score`); one output is a scalar value head.
    Classifier(Linear),
}

/// A decoder-only transformer with its head.
#[derive(Clone, Debug)]
pub struct Model {
    /// Hyper-parameters.
    pub config: ModelConfig,
    /// The decoder.
    pub decoder: Transformer,
    /// The head.
    pub head: Head,
    /// The device candle's tensors live on.
    pub device: Device,
    /// What it computes in (set at load; [`Model::set_bf16_products`] changes its products).
    precision: Precision,
    /// The packed engine holding the weights, where the model was loaded onto one (a GPU:
    /// [`Model::load_on`]; any backend: [`Model::on_packed`]): everything it computes runs
    /// there, and the CPU decoder holds no weights. Decided once, when the model is made.
    packed: Option<Arc<dyn PackedEngine>>,
    /// The variables holding its weights where it was made to be trained ([`Model::fresh`],
    /// [`Model::load_trainable`]): what a trainer updates and saves.
    trainable: Option<Trainable>,
}

/// A trainable model's variables (shared with the map they were made in).
#[derive(Clone)]
struct Trainable(VarMap);

impl std::fmt::Debug for Trainable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Trainable({} variables)", self.0.all_vars().len())
    }
}

impl Model {
    /// Build from a `VarBuilder` holding HF-named weights.
    pub fn new(config: ModelConfig, vb: VarBuilder) -> Result<Self> {
        let decoder = Transformer::new(&config, vb.pp("model"))?;
        let h = config.hidden_size;
        let head = match config.head {
            HeadKind::CausalLm if config.tie_word_embeddings => {
                Head::Lm(Linear::new(decoder.embeddings().clone(), None))
            }
            HeadKind::CausalLm => Head::Lm(Linear::load(vb.pp("lm_head"), h, config.vocab_size, false)?),
            HeadKind::ProcessRewardMlp => Head::Mlp(
                Linear::load(vb.pp("score.0"), h, h, true)?,
                Linear::load(vb.pp("score.2"), h, config.num_labels, true)?,
            ),
            HeadKind::TokenClassification => {
                Head::Classifier(Linear::load(vb.pp("score"), h, config.num_labels, true)?)
            }
            HeadKind::SequenceClassification => {
                Head::Classifier(Linear::load(vb.pp("score"), h, config.num_labels, false)?)
            }
        };
        Ok(Model {
            device: vb.device().clone(),
            config,
            decoder,
            head,
            precision: Precision::default(),
            packed: None,
            trainable: None,
        })
    }

    /// What it computes in: how its weights are held and whether bf16 ones multiply in bf16.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Whether its bf16 weights multiply in bf16 where the CPU can ([`Precision::bf16_products`]),
    /// for every layer, the head included.
    pub fn set_bf16_products(&mut self, on: bool) {
        self.precision.bf16_products = on;
        self.decoder.set_bf16_products(on);
        match &mut self.head {
            Head::Lm(l) | Head::Classifier(l) => l.set_bf16_products(on),
            Head::Mlp(a, b) => {
                a.set_bf16_products(on);
                b.set_bf16_products(on);
            }
        }
    }

    /// Load the checkpoint folder `dir` where `placement` says: on the CPU in `precision`
    /// ([`Model::load_as`]), or onto a CUDA GPU (weights bf16 on the device, bf16 tensor-core
    /// products; step scoring runs there).
    pub fn load_on(dir: &Path, placement: crate::Placement, precision: impl Into<Precision>) -> Result<Self> {
        match placement.resolve()? {
            crate::Placement::Cuda(ordinal) => Self::load_cuda(dir, ordinal),
            _ => Self::load_as(dir, &Device::Cpu, precision),
        }
    }

    /// Load the checkpoint folder `dir` onto the packed engine at `placement`: the CUDA engine
    /// on a GPU ([`Model::load_on`]), the packed engine's CPU backend
    /// ([`crate::packed_engine::Cpu`]: bf16 weights, bf16 products with f32 sums) on the CPU.
    /// What a policy the packed trainer updates computes with, so a KL reference loaded here
    /// gives the same log-probabilities as the untrained policy, bit for bit.
    pub fn load_packed(dir: &Path, placement: crate::Placement) -> Result<Self> {
        match placement.resolve()? {
            crate::Placement::Cuda(ordinal) => Self::load_cuda(dir, ordinal),
            _ => {
                let cpu = Arc::new(crate::packed_engine::Cpu);
                let engine = crate::packed_engine::PackedDecoder::load(dir, ModelConfig::from_dir(dir)?, cpu)
                    .with_context(|| format!("loading {} onto the packed engine's CPU backend", dir.display()))?;
                Self::on_packed(Arc::new(engine))
            }
        }
    }

    #[cfg(feature = "cuda")]
    fn load_cuda(dir: &Path, ordinal: usize) -> Result<Self> {
        let config = ModelConfig::from_dir(dir)?;
        let gpu = crate::cuda::open(ordinal)?;
        // The attention kernel for this head size is compiled now, not inside the first batch.
        gpu.flash(config.head_dim)?;
        let on_gpu = crate::cuda::GpuModel::load(dir, config, gpu)
            .with_context(|| format!("loading {} onto cuda:{ordinal}", dir.display()))?;
        Self::on_packed(Arc::new(on_gpu))
    }

    /// The model whose weights are `engine`'s (the packed engine runs everything it does; a
    /// trainer's model shares its weights this way with the sampler).
    pub fn on_packed(engine: Arc<dyn PackedEngine>) -> Result<Self> {
        let config = engine.config().clone();
        let empty = Tensor::zeros((0, config.hidden_size), DType::F32, &Device::Cpu)?;
        Ok(Model {
            decoder: Transformer::without_weights(&config)?,
            head: Head::Classifier(Linear::new(empty, None)),
            device: Device::Cpu,
            config,
            precision: WeightDtype::Bf16.into(),
            packed: Some(engine),
            trainable: None,
        })
    }

    #[cfg(not(feature = "cuda"))]
    fn load_cuda(_: &Path, _: usize) -> Result<Self> {
        unreachable!("Placement::resolve refuses CUDA in a build without it")
    }

    /// Whether its weights are on a packed engine (a GPU: [`Model::load_on`]) rather than in
    /// the CPU decoder.
    pub fn is_on_gpu(&self) -> bool {
        self.packed.is_some()
    }

    /// The packed engine holding its weights (`None`: the CPU decoder holds them).
    pub fn packed(&self) -> Option<&dyn PackedEngine> {
        self.packed.as_deref()
    }

    /// The KV cache of a running batch of generation ([`crate::Decoding`]) on the engine that
    /// holds the weights: a cache a row on the CPU; on a packed engine a paged cache as big as
    /// `size` says.
    pub fn decode_cache(&self, size: crate::engine::KvSize) -> Result<Box<dyn crate::DecodeCache + '_>> {
        match &self.packed {
            Some(g) => g.decode_cache(size),
            None => Ok(Box::new(crate::decode_cache::CpuRows::new(self))),
        }
    }

    /// Where its weights are: `cpu`, or the packed engine's device.
    pub fn placement_name(&self) -> String {
        match &self.packed {
            Some(g) => g.name(),
            None => "cpu".into(),
        }
    }

    /// An error unless the CPU decoder holds the weights (a model loaded onto a GPU runs there
    /// through step scoring only).
    fn on_cpu(&self) -> Result<()> {
        if let Some(g) = &self.packed {
            anyhow::bail!(
                "this model's weights are on {}, where the packed engine scores steps, generates, gives \
                 token log-probabilities and trains (`train-prm`/`rl --device cuda`); this call needs \
                 the CPU engine (--device cpu)",
                g.name()
            );
        }
        Ok(())
    }

    /// Load `config.json` and the safetensors weights of a checkpoint folder (single file or
    /// sharded with `model.safetensors.index.json`; f32, bf16 or f16), for inference, in the
    /// [`default_precision`] (by default: weights as stored, bf16 ones multiplied in bf16 where
    /// the CPU can; everything else f32).
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        let config = ModelConfig::from_dir(dir)?;
        Self::load_with_config(dir, config, device)
    }

    /// [`Model::load`] in `precision` (a [`Precision`], or a [`WeightDtype`] with bf16 products).
    pub fn load_as(dir: &Path, device: &Device, precision: impl Into<Precision>) -> Result<Self> {
        Self::load_held(dir, ModelConfig::from_dir(dir)?, device, precision.into())
    }

    /// Load weights with a given config (e.g. to override the head), for inference, in the
    /// [`default_precision`].
    pub fn load_with_config(dir: &Path, config: ModelConfig, device: &Device) -> Result<Self> {
        Self::load_held(dir, config, device, default_precision())
    }

    fn load_held(dir: &Path, config: ModelConfig, device: &Device, precision: Precision) -> Result<Self> {
        let vb = checkpoint::held_weights(dir, &config, device, precision.weights)?;
        let mut model =
            Self::new(config, vb).with_context(|| format!("building the model from {}", dir.display()))?;
        model.precision.weights = precision.weights;
        model.set_bf16_products(precision.bf16_products);
        Ok(model)
    }

    /// Load trainable: every weight becomes a variable in `varmap`; weights the folder lacks
    /// (a new classifier on a causal LM, extra layers) are initialised from `seed` as in
    /// [`Model::fresh`], so a fine-tuning run is reproducible.
    pub fn load_trainable(
        dir: &Path,
        config: ModelConfig,
        varmap: &VarMap,
        device: &Device,
        seed: u64,
    ) -> Result<Self> {
        let files = checkpoint::weight_files(dir)?;
        // Training updates f32 master weights, whatever the checkpoint stores.
        let mut tensors = checkpoint::load_tensors(&files, device, WeightDtype::F32)?;
        // Only what this model uses becomes a variable: another head's weights (a PRM's own
        // head under a new one, a causal LM's output layer under a classifier) are left out of
        // training and of the checkpoint, and the new head starts fresh.
        let wanted: HashMap<String, Vec<usize>> = checkpoint::expected_tensors(&config).into_iter().collect();
        tensors.retain(|name, t| name.starts_with("model.") || wanted.get(name).is_some_and(|s| s == t.dims()));
        let loaded: std::collections::HashSet<String> = tensors.keys().cloned().collect();
        {
            let mut data = varmap.data().lock().unwrap();
            for (name, t) in tensors {
                data.insert(name, candle_core::Var::from_tensor(&t)?);
            }
        }
        let vb = VarBuilder::from_varmap(varmap, DType::F32, device);
        let mut model = Self::new(config, vb)?;
        init_vars(varmap, |name| !loaded.contains(name), device, seed)?;
        model.trainable = Some(Trainable(varmap.clone()));
        Ok(model)
    }

    /// A freshly initialised model whose weights live in `varmap`, initialised as transformers
    /// does (normal with std 0.02, norms 1, biases 0) from `seed`, so runs are reproducible.
    pub fn fresh(config: ModelConfig, varmap: &VarMap, device: &Device, seed: u64) -> Result<Self> {
        let vb = VarBuilder::from_varmap(varmap, DType::F32, device);
        let mut model = Self::new(config, vb)?;
        init_vars(varmap, |_| true, device, seed)?;
        model.trainable = Some(Trainable(varmap.clone()));
        Ok(model)
    }

    /// The variables holding its weights, where it was made to be trained ([`Model::fresh`],
    /// [`Model::load_trainable`]; the same variables as the map given there): a trainer updates,
    /// saves and loads these, so it needs nothing but the model.
    pub fn varmap(&self) -> Option<&VarMap> {
        self.trainable.as_ref().map(|t| &t.0)
    }

    /// Serves the PEFT LoRA adapters `(name, folder)` unmerged on this model's weights, by index
    /// in that order ([`Input::adapters`], [`crate::Decoding::add_with`]), in place of any served
    /// before: each adapter holds only its `A` and `B` matrices. On the CPU (the CPU decoder or
    /// the packed engine's CPU backend) only; an empty list serves none.
    pub fn serve_adapters(&self, list: &[(String, std::path::PathBuf)]) -> Result<()> {
        let config = &self.config;
        // An empty list reads none: every engine serves it (the CUDA engine too).
        let form = match list {
            [] => crate::adapters::Form::Tensors,
            _ => self.adapter_form()?,
        };
        self.change_adapters(|_| crate::Adapters::load(config, list, form))
    }

    /// Serves the PEFT LoRA adapter in `dir` as `name` beside those served (the first free
    /// index; vLLM's `/v1/load_lora_adapter`): refused where `name` is served, unless `inplace`,
    /// where it replaces that adapter at its index and the requests decoding with it go on with
    /// the new weights from their next step.
    pub fn load_adapter(&self, name: &str, dir: &Path, inplace: bool) -> Result<()> {
        if let Some(now) = self.adapters() {
            now.check_free(name, inplace)?;
        }
        // Read before the change, which holds up requests naming adapters meanwhile.
        let read = crate::adapters::ReadAdapter::read(&self.config, name, dir, self.adapter_form()?)?;
        self.change_adapters(|now| now.with_read(name, read, inplace))
    }

    /// Stops serving the adapter named `name`: it cannot be named again, and is let go once no
    /// [`crate::AdapterLease`] on it is held (requests admitted with it decode to their end).
    pub fn unload_adapter(&self, name: &str) -> Result<()> {
        self.change_adapters(|now| now.without(name))
    }

    /// A hold on the adapter served as `name`, with its index: while held, that index stays its
    /// own, through unloads, so a request admitted with it runs to its end.
    pub fn lease_adapter(&self, name: &str) -> Option<(usize, crate::AdapterLease)> {
        self.decoder.adapter_table().lease(name)
    }

    /// How its engine reads adapters (the packed engine's backend's host arrays, the CPU
    /// decoder's tensors), or why it serves none: asked before an adapter is read.
    fn adapter_form(&self) -> Result<crate::adapters::Form> {
        match &self.packed {
            Some(g) => g.adapter_form(),
            None => Ok(crate::adapters::Form::Tensors),
        }
    }

    /// Replaces the set of adapters served by `change` of it, where its engine serves adapters.
    fn change_adapters(&self, change: impl FnOnce(&crate::Adapters) -> Result<crate::Adapters>) -> Result<()> {
        self.decoder.adapter_table().change(change, |next| match &self.packed {
            Some(g) => g.serve_adapters(next),
            None => Ok(()),
        })
    }

    /// The adapters served on this model now ([`Model::serve_adapters`], [`Model::load_adapter`]).
    pub fn adapters(&self) -> Option<Arc<crate::Adapters>> {
        self.decoder.adapters()
    }

    /// The hidden states (after the final norm) of a forward pass over `input`, an input of
    /// one part: `[b, t, hidden]` for padded ids, `[Σ read, hidden]` for the rows it reads (see
    /// [`Input`] and [`Transformer::forward`], which says which kernels run).
    pub fn hidden(&self, input: Input) -> Result<Tensor> {
        anyhow::ensure!(input.parts.len() == 1, "Model::hidden takes an input of one part");
        Ok(self.hidden_parts(input)?.remove(0))
    }

    /// The hidden states of each part of `input`, in order (several batches in one pass, each
    /// continuing its own cache: a decoding step with chunked prefill).
    pub fn hidden_parts(&self, input: Input) -> Result<Vec<Tensor>> {
        self.on_cpu()?;
        self.decoder.forward(input)
    }

    /// Vocabulary logits `[rows.len(), vocab]` at positions `rows` of the sequence `ids` (one
    /// pass over it, on the CPU or the GPU).
    pub fn vocab_logits(&self, ids: &[u32], rows: &[usize]) -> Result<Tensor> {
        if let Some(g) = &self.packed {
            let (values, width) = g.head_at(&crate::packed::Packed::new(&[ids]), rows, None)?;
            return Ok(Tensor::from_vec(values, (rows.len(), width), &Device::Cpu)?);
        }
        let t = Tensor::new(ids, &self.device)?.unsqueeze(0)?;
        let hidden = self.hidden(Input::padded(&t, None))?.squeeze(0)?;
        let idx = Tensor::new(rows.iter().map(|&r| r as u32).collect::<Vec<_>>(), &self.device)?;
        self.head_logits(&hidden.index_select(&idx, 0)?)
    }

    /// Head outputs at positions `read[i]` of each sequence `seqs[i]`, in order, as `(values,
    /// width)` row-major: every class of a classifier head, or the vocabulary columns `columns`
    /// of an LM head (all of them when `None`). One pass over the sequences packed end to end,
    /// on whichever engine holds the weights; the last layer and the head run at those rows only.
    pub fn head_at(&self, seqs: &[&[u32]], read: &[Vec<usize>], columns: Option<&[u32]>) -> Result<(Vec<f32>, usize)> {
        self.head_at_with(seqs, read, columns, Vec::new())
    }

    /// [`Model::head_at`] with each sequence's served adapter (`adapters[i]`, or one for all:
    /// [`Model::serve_adapters`]).
    pub fn head_at_with(
        &self,
        seqs: &[&[u32]],
        read: &[Vec<usize>],
        columns: Option<&[u32]>,
        adapters: Vec<Option<usize>>,
    ) -> Result<(Vec<f32>, usize)> {
        let packed = crate::packed::Packed::new(seqs);
        if let Some(g) = &self.packed {
            let rows: Vec<usize> = read
                .iter()
                .enumerate()
                .flat_map(|(i, r)| r.iter().map(move |&p| (i, p)))
                .map(|(i, p)| packed.row(i, p))
                .collect();
            return g.head_at_with(&packed, &rows, columns, &adapters);
        }
        let hidden = self.hidden(Input::packed(&packed).read(read).adapters(adapters))?;
        let columns = columns.map(|c| Tensor::new(c, &self.device)).transpose()?;
        let (mut values, mut width, mut first) = (Vec::new(), 0, 0);
        for r in read {
            // One head call a sequence.
            let mut logits = self.head_logits(&hidden.narrow(0, first, r.len())?)?;
            first += r.len();
            if let Some(c) = &columns {
                logits = logits.index_select(c, 1)?;
            }
            width = logits.dim(1)?;
            values.extend(logits.flatten_all()?.to_vec1::<f32>()?);
        }
        Ok((values, width))
    }

    /// Log-probabilities over the vocabulary at positions `rows` of the sequence `ids`, handed to
    /// `each` a slice of at most `rows_a_pass` rows at a time (with the index of its first row),
    /// so a long sequence's rows never sit in memory at once: on the CPU one pass over the
    /// sequence, the head run a slice at a time; on the packed engine one pass a slice.
    pub fn vocab_logprobs_each(
        &self,
        ids: &[u32],
        rows: &[usize],
        rows_a_pass: usize,
        each: impl FnMut(usize, Vec<Vec<f32>>) -> Result<()>,
    ) -> Result<()> {
        self.vocab_logprobs_each_with(ids, rows, rows_a_pass, None, each)
    }

    /// [`Model::vocab_logprobs_each`] with the served `adapter` ([`Model::serve_adapters`]).
    pub fn vocab_logprobs_each_with(
        &self,
        ids: &[u32],
        rows: &[usize],
        rows_a_pass: usize,
        adapter: Option<usize>,
        mut each: impl FnMut(usize, Vec<Vec<f32>>) -> Result<()>,
    ) -> Result<()> {
        let per = rows_a_pass.max(1);
        if self.packed.is_some() {
            if adapter.is_some() {
                for (k, slice) in rows.chunks(per).enumerate() {
                    let (logits, width) = self.head_at_with(&[ids], &[slice.to_vec()], None, vec![adapter])?;
                    let logits = Tensor::from_vec(logits, (slice.len(), width), &Device::Cpu)?;
                    each(k * per, candle_nn::ops::log_softmax(&logits, D::Minus1)?.to_vec2::<f32>()?)?;
                }
                return Ok(());
            }
            for (k, slice) in rows.chunks(per).enumerate() {
                each(k * per, self.vocab_logprobs(ids, slice)?)?;
            }
            return Ok(());
        }
        let t = Tensor::new(ids, &self.device)?.unsqueeze(0)?;
        let hidden = self.hidden(Input::padded(&t, None).adapters(vec![adapter]))?.squeeze(0)?;
        for (k, slice) in rows.chunks(per).enumerate() {
            let idx = Tensor::new(slice.iter().map(|&r| r as u32).collect::<Vec<_>>(), &self.device)?;
            let logits = self.head_logits(&hidden.index_select(&idx, 0)?)?;
            each(k * per, candle_nn::ops::log_softmax(&logits, D::Minus1)?.to_vec2::<f32>()?)?;
        }
        Ok(())
    }

    /// Log-probabilities over the vocabulary `[rows.len()][vocab]` at positions `rows` of the
    /// sequence `ids` ([`Model::vocab_logits`] through a log-softmax), on either engine.
    pub fn vocab_logprobs(&self, ids: &[u32], rows: &[usize]) -> Result<Vec<Vec<f32>>> {
        let logits = self.vocab_logits(ids, rows)?;
        Ok(candle_nn::ops::log_softmax(&logits, D::Minus1)?.to_vec2::<f32>()?)
    }

    /// Head outputs for hidden states `[.., hidden]`: vocabulary logits or class logits.
    pub fn head_logits(&self, hidden: &Tensor) -> Result<Tensor> {
        self.on_cpu()?;
        let diff = self.decoder.differentiable;
        Ok(match &self.head {
            Head::Lm(l) | Head::Classifier(l) => l.forward(hidden, diff)?,
            Head::Mlp(a, b) => b.forward(&a.forward(hidden, diff)?.relu()?, diff)?,
        })
    }

    /// Head outputs at every position `[b, t, classes or vocab]`.
    pub fn forward(&self, ids: &Tensor, pad_mask: Option<&Tensor>) -> Result<Tensor> {
        self.head_logits(&self.hidden(Input::padded(ids, pad_mask))?)
    }

    /// Switch between the inference kernels and the differentiable training path.
    pub fn set_training(&mut self, on: bool) {
        self.decoder.differentiable = on;
    }

    /// Number of positions encoded so far.
    pub fn encoded_tokens(&self) -> usize {
        if let Some(g) = &self.packed {
            return g.encoded_tokens();
        }
        self.decoder.encoded_tokens.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Initialise the variables of `varmap` that `which` selects, in name order, from `seed`:
/// normal with std 0.02, RMSNorm weights 1, biases 0 (transformers' scheme).
fn init_vars(varmap: &VarMap, which: impl Fn(&str) -> bool, device: &Device, seed: u64) -> Result<()> {
    let data = varmap.data().lock().unwrap();
    let mut names: Vec<&String> = data.keys().filter(|n| which(n)).collect();
    names.sort();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let normal = rand_distr::Normal::new(0.0f32, 0.02).unwrap();
    for name in names {
        let var = &data[name];
        let shape = var.as_tensor().shape().clone();
        let t = if name.ends_with("norm.weight") {
            Tensor::ones(shape, DType::F32, device)?
        } else if name.ends_with(".bias") {
            Tensor::zeros(shape, DType::F32, device)?
        } else {
            let v: Vec<f32> = (0..shape.elem_count()).map(|_| rng.sample(normal)).collect();
            Tensor::from_vec(v, shape, device)?
        };
        var.set(&t)?;
    }
    Ok(())
}

/// Pad token sequences into ids `[b, t]` and a padding mask (`None` when nothing is padded).
pub fn pad_batch(seqs: &[&[u32]], device: &Device) -> Result<(Tensor, Option<Tensor>, usize)> {
    let t = seqs.iter().map(|s| s.len()).max().unwrap_or(1).max(1);
    let mut ids = Vec::with_capacity(seqs.len() * t);
    let mut mask = Vec::with_capacity(seqs.len() * t);
    for s in seqs {
        ids.extend(s.iter().copied().chain(std::iter::repeat_n(0, t - s.len())));
        mask.extend((0..t).map(|i| if i < s.len() { 1f32 } else { 0.0 }));
    }
    let ids = Tensor::from_vec(ids, (seqs.len(), t), device)?;
    let padded = seqs.iter().any(|s| s.len() < t);
    let mask = if padded {
        Some(Tensor::from_vec(mask, (seqs.len(), t), device)?)
    } else {
        None
    };
    Ok((ids, mask, t))
}

/// Probability of "good" from head outputs `[.., classes]`: softmax class 1 of a 2-class head,
/// the sigmoid of a scalar value head.
pub fn good_prob(logits: &Tensor) -> Result<Tensor> {
    Ok(match logits.dim(D::Minus1)? {
        1 => candle_nn::ops::sigmoid(&logits.squeeze(D::Minus1)?)?,
        _ => candle_nn::ops::softmax_last_dim(logits)?
            .narrow(D::Minus1, 1, 1)?
            .squeeze(D::Minus1)?,
    })
}

/// The log-odds of "good" from head outputs `[.., classes]`: `logit₁ − logit₀` of a 2-class head
/// (so that its sigmoid is softmax class 1), the value itself of a scalar head.
pub fn good_logit(logits: &Tensor) -> Result<Tensor> {
    Ok(match logits.dim(D::Minus1)? {
        1 => logits.squeeze(D::Minus1)?,
        _ => (logits.narrow(D::Minus1, 1, 1)? - logits.narrow(D::Minus1, 0, 1)?)?.squeeze(D::Minus1)?,
    })
}
