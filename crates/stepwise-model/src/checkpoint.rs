//! Checkpoint folders on disk: which weight files a folder holds, what identifies them, reading
//! them (checked against the configuration before anything is sized by it) and writing them
//! atomically. Every engine reads its weights through here: the candle model, the packed
//! engine and the GPU.

use crate::config::{HeadKind, ModelConfig};
use crate::precision::WeightDtype;
use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarMap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

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
    h.write(stepwise_core::io::read_regular_file(&config)?.as_bytes());
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
        let v: serde_json::Value = serde_json::from_str(&stepwise_core::io::read_regular_file(&index)?)
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

/// A safetensors file mapped read-only, whose pages leave this process's resident memory once
/// a tensor is copied out ([`Mapped::let_go`]; they stay in the page cache): a loader reading a
/// tensor at a time never holds the model twice (the packed engine's 0.5B policy peaked at
/// 2.8 GB, its bf16 copy beside every page of the 1.26 GB file).
pub(crate) struct Mapped(memmap2::Mmap);

impl Mapped {
    /// `file`, mapped.
    pub(crate) fn open(file: &Path) -> Result<Self> {
        let handle = std::fs::File::open(file).with_context(|| format!("reading {}", file.display()))?;
        // SAFETY: a read-only mapping; as with every memory-mapped loader (candle's,
        // safetensors'), a checkpoint rewritten on disk while it is read is not supported.
        let map = unsafe { memmap2::Mmap::map(&handle) }.with_context(|| format!("mapping {}", file.display()))?;
        Ok(Mapped(map))
    }

    /// The pages holding `data` (a tensor's bytes in this mapping) dropped from resident memory.
    pub(crate) fn let_go(&self, data: &[u8]) {
        let at = (data.as_ptr() as usize).wrapping_sub(self.0.as_ptr() as usize);
        if data.is_empty() || at.checked_add(data.len()).is_none_or(|end| end > self.0.len()) {
            return;
        }
        // SAFETY: the range lies inside the mapping, which is read-only and file-backed:
        // dropping its pages only makes a later read fetch them from the file again.
        let _ = unsafe { self.0.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, at, data.len()) };
    }
}

impl std::ops::Deref for Mapped {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

pub(crate) fn load_tensors(files: &[PathBuf], device: &Device, hold: WeightDtype) -> Result<HashMap<String, Tensor>> {
    let mut all = HashMap::new();
    for f in files {
        // One file (shard) at a time, each tensor copied out once in the precision it is held
        // in, its pages then let go.
        let map = Mapped::open(f)?;
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
            map.let_go(view.data());
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


/// The weights of the checkpoint in `dir`, checked against `config` (its layer count from the
/// files' headers before anything is sized by it, then every tensor's shape), held as `hold`
/// says, behind a `VarBuilder` that widens a tensor to what a layer asks for when it is built.
pub(crate) fn held_weights(
    dir: &Path,
    config: &ModelConfig,
    device: &Device,
    hold: WeightDtype,
) -> Result<candle_nn::VarBuilder<'static>> {
    let files = weight_files(dir)?;
    check_layer_count(config, &files)?;
    let tensors = load_tensors(&files, device, hold)?;
    check_tensors(config, &tensors, &files)?;
    Ok(candle_nn::VarBuilder::from_backend(Box::new(HeldTensors(tensors)), DType::F32, device.clone()))
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

/// A tensor's values as bf16 bits (matrices: bf16 as stored, others rounded to nearest).
pub(crate) fn to_bf16_bits(view: &safetensors::tensor::TensorView) -> Result<Vec<u16>> {
    let b = view.data();
    Ok(match view.dtype() {
        safetensors::Dtype::BF16 => b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect(),
        _ => to_f32(view)?
            .into_iter()
            .map(|x| half::bf16::from_f32(x).to_bits())
            .collect(),
    })
}

/// Values converted a block at a time, the blocks shared out over the threads.
const BLOCK: usize = 1 << 16;

/// A tensor's values as f32 (bf16 widened exactly, a signalling NaN kept as it is), converted in
/// loops that vectorise, a block a thread.
pub(crate) fn to_f32(view: &safetensors::tensor::TensorView) -> Result<Vec<f32>> {
    use rayon::prelude::*;
    let b = view.data();
    let width = match view.dtype() {
        safetensors::Dtype::F32 => 4,
        safetensors::Dtype::BF16 | safetensors::Dtype::F16 => 2,
        safetensors::Dtype::F64 => 8,
        other => bail!("dtype {other:?} (stepwise reads f32, bf16, f16 and f64 weights)"),
    };
    let dtype = view.dtype();
    let mut out = vec![0f32; b.len() / width];
    out.par_chunks_mut(BLOCK)
        .zip(b.par_chunks(BLOCK * width))
        .for_each(|(out, b)| {
            let values = out.iter_mut().zip(b.chunks_exact(width));
            match dtype {
                safetensors::Dtype::F32 => values.for_each(|(o, c)| *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                safetensors::Dtype::BF16 => {
                    values.for_each(|(o, c)| *o = f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
                }
                safetensors::Dtype::F16 => {
                    values.for_each(|(o, c)| *o = half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                }
                _ => values.for_each(|(o, c)| *o = f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32),
            }
        });
    Ok(out)
}

/// f32 values stored as `dtype` (little-endian bytes; bf16 rounded to the nearest, ties to even,
/// as `half` rounds), a block a thread in the engine's vector kernels.
pub(crate) fn encode_floats(values: &[f32], dtype: safetensors::Dtype) -> Vec<u8> {
    use rayon::prelude::*;
    let width = match dtype {
        safetensors::Dtype::BF16 | safetensors::Dtype::F16 => 2,
        safetensors::Dtype::F64 => 8,
        _ => 4,
    };
    let mut out = vec![0u8; values.len() * width];
    out.par_chunks_mut(BLOCK * width)
        .zip(values.par_chunks(BLOCK))
        .for_each(|(out, values)| match dtype {
            safetensors::Dtype::BF16 => {
                let mut bits = vec![0u16; values.len()];
                crate::packed_engine::cpu_elementwise::round_into(values, &mut bits);
                for (o, b) in out.chunks_exact_mut(2).zip(&bits) {
                    o.copy_from_slice(&b.to_le_bytes());
                }
            }
            safetensors::Dtype::F16 => {
                for (o, &x) in out.chunks_exact_mut(2).zip(values) {
                    o.copy_from_slice(&half::f16::from_f32(x).to_le_bytes());
                }
            }
            safetensors::Dtype::F64 => {
                for (o, &x) in out.chunks_exact_mut(8).zip(values) {
                    o.copy_from_slice(&f64::from(x).to_le_bytes());
                }
            }
            _ => {
                for (o, &x) in out.chunks_exact_mut(4).zip(values) {
                    o.copy_from_slice(&x.to_le_bytes());
                }
            }
        });
    out
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::Mapped;

    /// This process's resident file-backed memory, in KiB.
    fn rss_file_kib() -> usize {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("RssFile:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// A tensor read from a mapped file holds its pages resident until it is let go, and then
    /// no longer: a loader that lets each go never holds the file beside its copy.
    #[test]
    fn a_tensor_let_go_leaves_resident_memory() {
        let n = 12 << 20; // 48 MiB of f32
        let values: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![n], &values).unwrap();
        let path_tmp = tempfile::tempdir().unwrap();
        let path = path_tmp.path().join("stepwise-let-go.safetensors");
        safetensors::serialize_to_file([("w", view)], None, &path).unwrap();
        drop(values);
        let before = rss_file_kib();
        let map = Mapped::open(&path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&map).unwrap();
        let data = st.tensor("w").unwrap().data();
        std::hint::black_box(data.iter().step_by(4096).map(|&b| b as u64).sum::<u64>());
        let read = rss_file_kib();
        map.let_go(data);
        let after = rss_file_kib();
        std::fs::remove_file(&path).unwrap();
        assert!(read >= before + 40 * 1024, "reading made {} KiB resident", read - before);
        assert!(after < before + 8 * 1024, "{} KiB still resident after letting go", after.saturating_sub(before));
    }
}

#[cfg(test)]
mod conversion_tests {
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;

    /// Edge values (bf16 ties rounding down and up to even, the largest finite values, infinities, NaN, subnormals) and
    /// 300,000 others (more than one block), each bit pattern by a multiplicative hash.
    fn values() -> Vec<f32> {
        let mut v = vec![
            0.0, -0.0, 1.0, f32::from_bits(0x3f80_8000), f32::from_bits(0x3f81_8000), f32::MAX, f32::MIN, f32::INFINITY, f32::NEG_INFINITY,
            f32::NAN, 1e-40, -1e-45, 3.3895314e38,
        ];
        v.extend((0..300_000u32).map(|i| f32::from_bits(i.wrapping_mul(2654435761))));
        v
    }

    /// One value's bytes.
    type Encode = fn(f32) -> Vec<u8>;

    /// bf16, f16, f32 and f64 bytes as `half` and the standard library write them, and read back
    /// as they read them (NaN as NaN).
    #[test]
    fn values_are_encoded_and_decoded_as_half_does() {
        let v = values();
        let cases: [(Dtype, Encode); 4] = [
            (Dtype::BF16, |x| half::bf16::from_f32(x).to_le_bytes().to_vec()),
            (Dtype::F16, |x| half::f16::from_f32(x).to_le_bytes().to_vec()),
            (Dtype::F32, |x| x.to_le_bytes().to_vec()),
            (Dtype::F64, |x| f64::from(x).to_le_bytes().to_vec()),
        ];
        for (dtype, one) in cases {
            let want: Vec<u8> = v.iter().flat_map(|&x| one(x)).collect();
            let got = super::encode_floats(&v, dtype);
            assert!(got == want, "{dtype:?}");
            let view = TensorView::new(dtype, vec![v.len()], &got).unwrap();
            let back = super::to_f32(&view).unwrap();
            let width = want.len() / v.len();
            for (k, (&b, bytes)) in back.iter().zip(want.chunks_exact(width)).enumerate() {
                let expected = match dtype {
                    Dtype::BF16 => half::bf16::from_le_bytes([bytes[0], bytes[1]]).to_f32(),
                    Dtype::F16 => half::f16::from_le_bytes([bytes[0], bytes[1]]).to_f32(),
                    Dtype::F32 => f32::from_le_bytes(bytes.try_into().unwrap()),
                    _ => f64::from_le_bytes(bytes.try_into().unwrap()) as f32,
                };
                assert!(b == expected || (b.is_nan() && expected.is_nan()), "{dtype:?} {k}: {b} {expected}");
            }
        }
    }
}
