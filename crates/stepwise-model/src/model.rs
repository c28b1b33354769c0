//! A decoder plus its head, loaded from (and saved to) a Hugging Face checkpoint folder.

use crate::config::{HeadKind, ModelConfig};
use crate::kernels::Linear;
use crate::input::Input;
use crate::transformer::Transformer;
use crate::precision::{default_precision, Precision, WeightDtype};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor, D};
use candle_nn::{VarBuilder, VarMap};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

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
    /// The weights on a GPU, where the model was loaded onto one ([`Model::load_on`]): step
    /// scoring then runs there, and the CPU decoder holds no weights.
    #[cfg(feature = "cuda")]
    pub gpu: Option<std::sync::Arc<crate::cuda::GpuModel>>,
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
            #[cfg(feature = "cuda")]
            gpu: None,
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

    #[cfg(feature = "cuda")]
    fn load_cuda(dir: &Path, ordinal: usize) -> Result<Self> {
        let config = ModelConfig::from_dir(dir)?;
        let gpu = crate::cuda::open(ordinal)?;
        // The attention kernel for this head size is compiled now, not inside the first batch.
        gpu.flash(config.head_dim)?;
        let on_gpu = crate::cuda::GpuModel::load(dir, config, gpu)
            .with_context(|| format!("loading {} onto cuda:{ordinal}", dir.display()))?;
        Self::on_gpu(std::sync::Arc::new(on_gpu))
    }

    /// The model whose weights are `engine`'s on a GPU (the packed engine runs everything it
    /// does; a trainer's model shares its weights this way with the sampler).
    #[cfg(feature = "cuda")]
    pub fn on_gpu(engine: std::sync::Arc<crate::cuda::GpuModel>) -> Result<Self> {
        let config = engine.config.clone();
        let empty = Tensor::zeros((0, config.hidden_size), DType::F32, &Device::Cpu)?;
        Ok(Model {
            decoder: Transformer::without_weights(&config)?,
            head: Head::Classifier(Linear::new(empty, None)),
            device: Device::Cpu,
            config,
            precision: WeightDtype::Bf16.into(),
            gpu: Some(engine),
        })
    }

    #[cfg(not(feature = "cuda"))]
    fn load_cuda(_: &Path, _: usize) -> Result<Self> {
        unreachable!("Placement::resolve refuses CUDA in a build without it")
    }

    /// Whether its weights are on a GPU ([`Model::load_on`]).
    pub fn is_on_gpu(&self) -> bool {
        #[cfg(feature = "cuda")]
        if self.gpu.is_some() {
            return true;
        }
        false
    }

    /// Where its weights are: `cpu`, or the GPU's name.
    pub fn placement_name(&self) -> String {
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.gpu {
            return crate::packed_engine::Backend::name(&**g.backend());
        }
        "cpu".into()
    }

    /// An error unless the CPU decoder holds the weights (a model loaded onto a GPU runs there
    /// through step scoring only).
    fn on_cpu(&self) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.gpu {
            bail!(
                "this model's weights are on {}, where the packed engine scores steps, generates, gives \
                 token log-probabilities and trains (`train-prm`/`rl --device cuda`); this call needs \
                 the CPU engine (--device cpu)",
                crate::packed_engine::Backend::name(&**g.backend())
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
        let files = weight_files(dir)?;
        check_layer_count(&config, &files)?;
        let tensors = load_tensors(&files, device, precision.weights)?;
        check_tensors(&config, &tensors, &files)?;
        let vb = VarBuilder::from_backend(Box::new(HeldTensors(tensors)), DType::F32, device.clone());
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
        let files = weight_files(dir)?;
        // Training updates f32 master weights, whatever the checkpoint stores.
        let mut tensors = load_tensors(&files, device, WeightDtype::F32)?;
        // Only what this model uses becomes a variable: another head's weights (a PRM's own
        // head under a new one, a causal LM's output layer under a classifier) are left out of
        // training and of the checkpoint, and the new head starts fresh.
        let wanted: HashMap<String, Vec<usize>> = expected_tensors(&config).into_iter().collect();
        tensors.retain(|name, t| name.starts_with("model.") || wanted.get(name).is_some_and(|s| s == t.dims()));
        let loaded: std::collections::HashSet<String> = tensors.keys().cloned().collect();
        {
            let mut data = varmap.data().lock().unwrap();
            for (name, t) in tensors {
                data.insert(name, candle_core::Var::from_tensor(&t)?);
            }
        }
        let vb = VarBuilder::from_varmap(varmap, DType::F32, device);
        let model = Self::new(config, vb)?;
        init_vars(varmap, |name| !loaded.contains(name), device, seed)?;
        Ok(model)
    }

    /// A freshly initialised model whose weights live in `varmap`, initialised as transformers
    /// does (normal with std 0.02, norms 1, biases 0) from `seed`, so runs are reproducible.
    pub fn fresh(config: ModelConfig, varmap: &VarMap, device: &Device, seed: u64) -> Result<Self> {
        let vb = VarBuilder::from_varmap(varmap, DType::F32, device);
        let model = Self::new(config, vb)?;
        init_vars(varmap, |_| true, device, seed)?;
        Ok(model)
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
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.gpu {
            let (values, width) = g.head_at(&crate::packed::Packed::new(&[ids]), rows, None)?;
            return Ok(Tensor::from_vec(values, (rows.len(), width), &Device::Cpu)?);
        }
        let t = Tensor::new(ids, &self.device)?.unsqueeze(0)?;
        let hidden = self.hidden(Input::padded(&t, None))?.squeeze(0)?;
        let idx = Tensor::new(rows.iter().map(|&r| r as u32).collect::<Vec<_>>(), &self.device)?;
        self.head_logits(&hidden.index_select(&idx, 0)?)
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
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.gpu {
            return g.encoded_tokens.load(std::sync::atomic::Ordering::Relaxed);
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

/// Refuses a `config.json` whose `num_hidden_layers` asks for more layers than the checkpoint
/// holds, reading only the files' headers: before anything is sized by the layer count (a
/// `num_hidden_layers` of 1e9 allocated gigabytes before this).
pub(crate) fn check_layer_count(cfg: &ModelConfig, files: &[PathBuf]) -> Result<()> {
    let mut layers = 0;
    for f in files {
        let file = std::fs::File::open(f).with_context(|| format!("opening {}", f.display()))?;
        // SAFETY: the map is read-only and dropped before returning; a file changed meanwhile
        // at worst gives a wrong header, which is an error.
        let map = unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("mapping {}", f.display()))?;
        let (_, meta) =
            safetensors::SafeTensors::read_metadata(&map).with_context(|| format!("reading {}", f.display()))?;
        for name in meta.tensors().keys() {
            if let Some(i) = name
                .strip_prefix("model.layers.")
                .and_then(|r| r.split('.').next())
                .and_then(|i| i.parse::<usize>().ok())
            {
                layers = layers.max(i + 1);
            }
        }
    }
    if cfg.num_hidden_layers > layers {
        let names = files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        bail!(
            "{names}: config.json's num_hidden_layers is {}, but the checkpoint holds {layers} layers: tensor `model.layers.{}.self_attn.q_proj.weight` is missing",
            cfg.num_hidden_layers,
            cfg.num_hidden_layers - 1
        );
    }
    Ok(())
}

/// What identifies a checkpoint's contents, cheaply: its `config.json`, and every weight file's
/// size, safetensors header (names, dtypes, shapes, offsets) and 16 blocks of 64 KiB sampled
/// across its data, hashed (xxHash64). The same files at another path give the same
/// fingerprint; a checkpoint retrained in place, even to the same shapes, another (every block
/// of its weights differs). Recorded with resumable outputs, so a resume with another model
/// behind the same path is refused.
pub fn checkpoint_fingerprint(dir: &Path) -> Result<String> {
    use std::hash::Hasher;
    use std::io::{Read, Seek, SeekFrom};
    const BLOCKS: u64 = 16;
    const BLOCK: u64 = 64 << 10;
    let mut h = twox_hash::XxHash64::with_seed(0);
    let config = dir.join("config.json");
    h.write(&std::fs::read(&config).with_context(|| format!("reading {}", config.display()))?);
    let mut block = vec![0u8; BLOCK as usize];
    for f in weight_files(dir)? {
        let mut file = std::fs::File::open(&f).with_context(|| format!("opening {}", f.display()))?;
        let size = file.metadata()?.len();
        h.write_u64(size);
        let mut len = [0u8; 8];
        file.read_exact(&mut len)
            .with_context(|| format!("reading {}", f.display()))?;
        let header = u64::from_le_bytes(len).min(size.saturating_sub(8));
        let mut head = vec![0u8; header as usize];
        file.read_exact(&mut head)
            .with_context(|| format!("reading {}", f.display()))?;
        h.write(&head);
        let data = size - 8 - header;
        for k in 0..BLOCKS {
            let at = 8 + header + data.saturating_sub(BLOCK) * k / (BLOCKS - 1);
            let n = BLOCK.min(size - at) as usize;
            file.seek(SeekFrom::Start(at))?;
            file.read_exact(&mut block[..n])
                .with_context(|| format!("reading {}", f.display()))?;
            h.write(&block[..n]);
        }
    }
    Ok(format!("{:016x}", h.finish()))
}

/// The safetensors files of a checkpoint folder.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&index)?)
            .with_context(|| format!("{}: invalid JSON", index.display()))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .with_context(|| format!("{}: field `weight_map` missing", index.display()))?;
        let mut files = Vec::with_capacity(map.len());
        for (tensor, f) in map {
            let f = f
                .as_str()
                .with_context(|| format!("{}: weight_map[{tensor:?}] is not a file name", index.display()))?;
            // A shard is a file inside the folder: never `../x` or `/etc/hostname`.
            let inside = !f.is_empty()
                && Path::new(f)
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !inside {
                bail!(
                    "{}: weight_map[{tensor:?}] names `{f}`, outside the model folder (shards are files inside it)",
                    index.display()
                );
            }
            files.push(dir.join(f));
        }
        files.sort();
        files.dedup();
        return Ok(files);
    }
    bail!(
        "{}: no model.safetensors or model.safetensors.index.json",
        dir.display()
    )
}

fn load_tensors(files: &[PathBuf], device: &Device, hold: WeightDtype) -> Result<HashMap<String, Tensor>> {
    let mut all = HashMap::new();
    for f in files {
        let file = std::fs::File::open(f).with_context(|| format!("reading {}", f.display()))?;
        // Memory-mapped, one file (shard) at a time, each tensor copied out once in the
        // precision it is held in; the file pages it came from then leave this process's
        // resident memory (they stay in the page cache), so loading never holds the model twice.
        // SAFETY: a read-only mapping that lives only for this loop; as with every
        // memory-mapped loader (candle's, safetensors'), a checkpoint rewritten on disk while it
        // loads is not supported.
        let map = unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("mapping {}", f.display()))?;
        let st = safetensors::SafeTensors::deserialize(&map).with_context(|| format!("reading {}", f.display()))?;
        for (k, view) in st.tensors() {
            let stored = match view.dtype() {
                safetensors::Dtype::F32 => DType::F32,
                safetensors::Dtype::BF16 => DType::BF16,
                safetensors::Dtype::F16 => DType::F16,
                safetensors::Dtype::F64 => DType::F64,
                other => bail!(
                    "{}: tensor `{k}`: dtype {other:?} (stepwise reads f32, bf16, f16 and f64 weights)",
                    f.display()
                ),
            };
            let v = Tensor::from_raw_buffer(view.data(), stored, view.shape(), device)
                .with_context(|| format!("{}: tensor `{k}`", f.display()))?;
            let at = view.data().as_ptr() as usize - map.as_ptr() as usize;
            // SAFETY: the range lies inside the mapping, which is read-only and file-backed:
            // dropping its pages only makes a later read fetch them from the file again.
            let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, at, view.data().len()) };
            let held = match (hold, v.dtype(), v.rank()) {
                // Only CPU kernels widen bf16/f16 weights as they go.
                _ if !device.is_cpu() => DType::F32,
                (WeightDtype::Auto | WeightDtype::Bf16, DType::BF16 | DType::F16, 2) => v.dtype(),
                (WeightDtype::Bf16, DType::F32, 2) => DType::BF16,
                // Norm weights and biases (a few KiB) are f32 for the kernels that read them.
                _ => DType::F32,
            };
            let v = v
                .to_dtype(held)
                .with_context(|| format!("{}: tensor `{k}`: cannot convert to {held:?}", f.display()))?;
            all.insert(k, v);
        }
    }
    Ok(all)
}

/// Loaded tensors handed to the model as they are held: bf16/f16 matrices are not widened
/// (candle's own map would convert every tensor to the builder's dtype).
struct HeldTensors(HashMap<String, Tensor>);

impl HeldTensors {
    fn held(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let t = self
            .0
            .get(name)
            .ok_or_else(|| candle_core::Error::CannotFindTensor { path: name.to_string() }.bt())?
            .to_device(dev)?;
        match t.dtype() {
            DType::BF16 | DType::F16 => Ok(t),
            _ => t.to_dtype(dtype),
        }
    }
}

impl candle_nn::var_builder::SimpleBackend for HeldTensors {
    fn get(
        &self,
        s: candle_core::Shape,
        name: &str,
        _: candle_nn::Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let t = self.held(name, dtype, dev)?;
        if t.shape() != &s {
            return Err(candle_core::Error::UnexpectedShape {
                msg: format!("shape mismatch for {name}"),
                expected: s,
                got: t.shape().clone(),
            }
            .bt());
        }
        Ok(t)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        self.held(name, dtype, dev)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }
}

/// Every tensor a model of `cfg` reads, with its shape.
pub(crate) fn expected_tensors(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, d) = (cfg.hidden_size, cfg.head_dim);
    let mut want: Vec<(String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), vec![cfg.vocab_size, h]),
        ("model.norm.weight".into(), vec![h]),
    ];
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        want.push((
            format!("{p}.self_attn.q_proj.weight"),
            vec![cfg.num_attention_heads * d, h],
        ));
        want.push((
            format!("{p}.self_attn.k_proj.weight"),
            vec![cfg.num_key_value_heads * d, h],
        ));
        want.push((
            format!("{p}.self_attn.v_proj.weight"),
            vec![cfg.num_key_value_heads * d, h],
        ));
        want.push((
            format!("{p}.self_attn.o_proj.weight"),
            vec![h, cfg.num_attention_heads * d],
        ));
        want.push((format!("{p}.mlp.gate_proj.weight"), vec![cfg.intermediate_size, h]));
        want.push((format!("{p}.mlp.up_proj.weight"), vec![cfg.intermediate_size, h]));
        want.push((format!("{p}.mlp.down_proj.weight"), vec![h, cfg.intermediate_size]));
    }
    match cfg.head {
        HeadKind::CausalLm if !cfg.tie_word_embeddings => want.push(("lm_head.weight".into(), vec![cfg.vocab_size, h])),
        HeadKind::ProcessRewardMlp => {
            want.push(("score.0.weight".into(), vec![h, h]));
            want.push(("score.0.bias".into(), vec![h]));
            want.push(("score.2.weight".into(), vec![cfg.num_labels, h]));
            want.push(("score.2.bias".into(), vec![cfg.num_labels]));
        }
        HeadKind::TokenClassification => {
            want.push(("score.weight".into(), vec![cfg.num_labels, h]));
            want.push(("score.bias".into(), vec![cfg.num_labels]));
        }
        HeadKind::SequenceClassification => want.push(("score.weight".into(), vec![cfg.num_labels, h])),
        HeadKind::CausalLm => {}
    }
    want
}

/// Name every missing or mis-shaped tensor before candle would fail on the first one.
fn check_tensors(cfg: &ModelConfig, t: &HashMap<String, Tensor>, files: &[PathBuf]) -> Result<()> {
    let want = expected_tensors(cfg);
    let names = files
        .iter()
        .map(|f| f.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    for (name, shape) in want {
        match t.get(&name) {
            None => bail!(
                "{names}: tensor `{name}` is missing (architecture {})",
                cfg.architecture
            ),
            Some(x) if x.dims() != shape.as_slice() => {
                bail!(
                    "{names}: tensor `{name}` has shape {:?}, config.json implies {:?}",
                    x.dims(),
                    shape
                )
            }
            _ => {}
        }
    }
    Ok(())
}

/// Set the variables of `varmap` from a safetensors file (names must match).
pub fn load_into(varmap: &VarMap, path: &Path) -> Result<()> {
    let tensors =
        candle_core::safetensors::load(path, &Device::Cpu).with_context(|| format!("reading {}", path.display()))?;
    let data = varmap.data().lock().unwrap();
    for (name, var) in data.iter() {
        let t = tensors
            .get(name)
            .with_context(|| format!("{}: tensor `{name}` is missing", path.display()))?;
        var.set(&t.to_dtype(DType::F32)?.to_device(var.device())?)
            .with_context(|| format!("{}: tensor `{name}`", path.display()))?;
    }
    Ok(())
}

/// Write the model as a Hugging Face folder: `config.json` + `model.safetensors`, the weights in
/// the config's dtype (a model fine-tuned from a bf16 checkpoint is written in bf16, as
/// transformers would).
pub fn save_checkpoint(dir: &Path, config: &ModelConfig, varmap: &VarMap) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config.to_hf_json())?,
    )?;
    let tensors = varmap_tensors(config, varmap, config.dtype)?;
    // Write to a temporary name, then rename: an interrupted save never leaves a torn file.
    write_safetensors_atomically(&tensors, &dir.join("model.safetensors"))
}

/// The f32 weights a training run resumes from when the checkpoint itself is stored in a
/// narrower dtype (resuming from rounded weights would not continue the same run).
pub const TRAINING_WEIGHTS: &str = "training_weights.safetensors";

/// [`save_checkpoint`], plus the exact f32 weights ([`TRAINING_WEIGHTS`]) when the checkpoint
/// is stored in another dtype: what the trainers write at each checkpoint.
pub fn save_training_checkpoint(dir: &Path, config: &ModelConfig, varmap: &VarMap) -> Result<()> {
    save_checkpoint(dir, config, varmap)?;
    let exact = dir.join(TRAINING_WEIGHTS);
    if config.dtype == DType::F32 {
        if exact.exists() {
            std::fs::remove_file(&exact)?;
        }
        return Ok(());
    }
    write_safetensors_atomically(&varmap_tensors(config, varmap, DType::F32)?, &exact)
}

/// The last training step's exact weights, kept beside a checkpoint that holds the best
/// validation's instead (see `TrainConfig::keep_best`).
pub const LAST_WEIGHTS: &str = "last_weights.safetensors";

/// Set `varmap` from the checkpoint in `dir` that [`save_training_checkpoint`] wrote, to resume
/// training: the last step's weights ([`LAST_WEIGHTS`]) when the checkpoint holds the best ones,
/// else its exact f32 weights when it has them, else `model.safetensors`.
pub fn load_training_checkpoint(varmap: &VarMap, dir: &Path) -> Result<()> {
    let last = dir.join(LAST_WEIGHTS);
    let exact = dir.join(TRAINING_WEIGHTS);
    load_into(
        varmap,
        &if last.exists() {
            last
        } else if exact.exists() {
            exact
        } else {
            dir.join("model.safetensors")
        },
    )
}

/// `varmap`'s weights, exactly (f32), into one safetensors file at `path`.
pub fn save_exact_weights(config: &ModelConfig, varmap: &VarMap, path: &Path) -> Result<()> {
    write_safetensors_atomically(&varmap_tensors(config, varmap, DType::F32)?, path)
}

/// The checkpoint's tensors from `varmap` in `dtype` (a tied output layer left out).
fn varmap_tensors(config: &ModelConfig, varmap: &VarMap, dtype: DType) -> Result<HashMap<String, Tensor>> {
    let data = varmap.data().lock().unwrap();
    let mut tensors = HashMap::with_capacity(data.len());
    for (name, var) in data.iter() {
        if config.tie_word_embeddings && name == "lm_head.weight" {
            continue;
        }
        tensors.insert(name.clone(), var.as_tensor().to_dtype(dtype)?);
    }
    Ok(tensors)
}

/// [`write_safetensors`] under a temporary name, renamed into place when complete.
fn write_safetensors_atomically(tensors: &HashMap<String, Tensor>, path: &Path) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    write_safetensors(tensors, &tmp)?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Write tensors as safetensors with the `{"format": "pt"}` metadata transformers writes and
/// expects (some versions refuse a file without it).
pub fn write_safetensors(tensors: &HashMap<String, Tensor>, path: &Path) -> Result<()> {
    let metadata: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    safetensors::serialize_to_file(tensors, Some(metadata), path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
