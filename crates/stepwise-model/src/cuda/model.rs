//! A decoder and its head with their weights on the GPU, run over packed batches.
//!
//! One layer, for the `T` tokens of a batch (activations row by row, the residual stream `x` in
//! f32, what feeds a product in bf16):
//! 1. `normed = rms_norm(x)`;
//! 2. `y = normed · [q|k|v]ᵀ` (one product: the three projections' weights are stacked at load);
//! 3. `qkv = rope(y + bias)` at each token's position in its own sequence;
//! 4. `attn = attention(qkv)`, causal within each sequence (the flash kernel);
//! 5. `x += attn · oᵀ` (the product accumulates into the residual);
//! 6. `normed = rms_norm(x)`; `gu = normed · [gate|up]ᵀ`; `act = silu(gate) · up`;
//! 7. `x += act · downᵀ`.
//!
//! After the last layer only the rows read are normed and go through the head.

use super::{Arg, Gpu};
use crate::config::{HeadKind, ModelConfig};
use crate::packed::Packed;
use anyhow::{bail, Context, Result};
use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// One decoder layer's weights on the device (matrices bf16 `[out, in]`, vectors f32).
struct Layer {
    ln1: CudaSlice<f32>,
    ln2: CudaSlice<f32>,
    /// q, k and v stacked: `[(heads + 2·kv_heads)·head_dim, hidden]`.
    qkv: CudaSlice<u16>,
    /// Their biases stacked (Qwen2), or none (Llama).
    qkv_bias: Option<CudaSlice<f32>>,
    o: CudaSlice<u16>,
    /// gate and up stacked: `[2·intermediate, hidden]`.
    gate_up: CudaSlice<u16>,
    down: CudaSlice<u16>,
}

/// The head's weights on the device.
enum Head {
    /// Vocabulary logits: `lm_head`, or the embeddings when tied (`None`).
    Lm(Option<CudaSlice<u16>>),
    /// Qwen2.5-Math-PRM's Linear → ReLU → Linear.
    Mlp {
        w1: CudaSlice<u16>,
        b1: CudaSlice<f32>,
        w2: CudaSlice<u16>,
        b2: CudaSlice<f32>,
    },
    /// A linear classifier (with a bias for token classifiers).
    Classifier {
        w: CudaSlice<u16>,
        b: Option<CudaSlice<f32>>,
    },
}

/// Device buffers a forward pass reuses, grown to the largest batch seen (the token budget
/// bounds them).
#[derive(Default)]
struct Scratch {
    ids: Option<CudaSlice<u32>>,
    ints: Option<CudaSlice<i32>>,
    x: Option<CudaSlice<f32>>,
    normed: Option<CudaSlice<u16>>,
    y: Option<CudaSlice<f32>>,
    qkv: Option<CudaSlice<u16>>,
    attn: Option<CudaSlice<u16>>,
    gate_up: Option<CudaSlice<u16>>,
    act: Option<CudaSlice<u16>>,
    head_in: Option<CudaSlice<u16>>,
    head_mid: Option<CudaSlice<f32>>,
    head_out: Option<CudaSlice<f32>>,
    columns: Option<CudaSlice<u16>>,
}

/// A device buffer of at least `n` values in `slot` (reallocated when smaller).
fn grow<'s, T: DeviceRepr + ValidAsZeroBits>(
    gpu: &Gpu,
    slot: &'s mut Option<CudaSlice<T>>,
    n: usize,
) -> Result<&'s mut CudaSlice<T>> {
    if slot.as_ref().is_none_or(|b| b.len() < n) {
        *slot = None;
        *slot = Some(gpu.zeros::<T>(n)?);
    }
    Ok(slot.as_mut().expect("just set"))
}

/// A checkpoint's decoder and head on a GPU, for scoring packed batches.
pub struct GpuModel {
    gpu: Arc<Gpu>,
    /// Hyper-parameters.
    pub config: ModelConfig,
    embed: CudaSlice<u16>,
    layers: Vec<Layer>,
    norm: CudaSlice<f32>,
    head: Head,
    /// Rotary tables `[max_positions, head_dim / 2]`.
    cos: CudaSlice<f32>,
    sin: CudaSlice<f32>,
    max_positions: usize,
    scratch: Mutex<Scratch>,
    /// Tokens run through the decoder so far.
    pub encoded_tokens: AtomicUsize,
}

impl std::fmt::Debug for GpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuModel({}, {} layers)", self.gpu.name(), self.layers.len())
    }
}

/// Where each checkpoint tensor goes on the device while loading.
struct Plan {
    matrices: Vec<Option<CudaSlice<u16>>>,
    vectors: Vec<Option<CudaSlice<f32>>>,
    /// name → (matrix?, slot, offset in values, shape).
    at: HashMap<String, (bool, usize, usize, Vec<usize>)>,
}

impl Plan {
    fn matrix(&mut self, gpu: &Gpu, parts: &[(String, Vec<usize>)]) -> Result<usize> {
        self.slot(gpu, parts, true)
    }

    fn vector(&mut self, gpu: &Gpu, parts: &[(String, Vec<usize>)]) -> Result<usize> {
        self.slot(gpu, parts, false)
    }

    /// A buffer holding `parts` one after another.
    fn slot(&mut self, gpu: &Gpu, parts: &[(String, Vec<usize>)], matrix: bool) -> Result<usize> {
        let total: usize = parts.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
        let slot = if matrix {
            self.matrices.push(Some(gpu.zeros::<u16>(total)?));
            self.matrices.len() - 1
        } else {
            self.vectors.push(Some(gpu.zeros::<f32>(total)?));
            self.vectors.len() - 1
        };
        let mut offset = 0;
        for (name, shape) in parts {
            self.at.insert(name.clone(), (matrix, slot, offset, shape.clone()));
            offset += shape.iter().product::<usize>();
        }
        Ok(slot)
    }

    fn take_matrix(&mut self, slot: usize) -> CudaSlice<u16> {
        self.matrices[slot].take().expect("each slot taken once")
    }

    fn take_vector(&mut self, slot: usize) -> CudaSlice<f32> {
        self.vectors[slot].take().expect("each slot taken once")
    }
}

/// A tensor's values as bf16 bits (matrices) or f32 (vectors).
fn to_bf16_bits(view: &safetensors::tensor::TensorView) -> Result<Vec<u16>> {
    let b = view.data();
    Ok(match view.dtype() {
        safetensors::Dtype::BF16 => b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect(),
        _ => to_f32(view)?
            .into_iter()
            .map(|x| half::bf16::from_f32(x).to_bits())
            .collect(),
    })
}

fn to_f32(view: &safetensors::tensor::TensorView) -> Result<Vec<f32>> {
    let b = view.data();
    Ok(match view.dtype() {
        safetensors::Dtype::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        safetensors::Dtype::BF16 => b
            .chunks_exact(2)
            .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        safetensors::Dtype::F16 => b
            .chunks_exact(2)
            .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        safetensors::Dtype::F64 => b
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32)
            .collect(),
        other => bail!("dtype {other:?} (stepwise reads f32, bf16, f16 and f64 weights)"),
    })
}

impl GpuModel {
    /// Loads the checkpoint folder `dir` (whose config is `config`) onto `gpu`: matrices as bf16
    /// (bf16 checkpoints as stored; f32 and f16 rounded to bf16, the tensor cores' input),
    /// norms and biases as f32. Tensors are read from the memory-mapped files and copied to the
    /// device one at a time; a missing or mis-shaped tensor is an error naming it.
    pub fn load(dir: &Path, config: ModelConfig, gpu: Arc<Gpu>) -> Result<Self> {
        let cfg = &config;
        let (h, d, inter) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
        let (heads, kv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        if heads == 0 || kv == 0 || !heads.is_multiple_of(kv) || !d.is_multiple_of(2) {
            bail!("{}: {heads} attention heads over {kv} key/value heads of size {d}: the CUDA engine needs a whole number of query heads per key/value head and an even head size", dir.display());
        }
        let mut plan = Plan {
            matrices: Vec::new(),
            vectors: Vec::new(),
            at: HashMap::new(),
        };
        let named = |n: &str, s: Vec<usize>| (n.to_string(), s);
        let embed = plan.matrix(&gpu, &[named("model.embed_tokens.weight", vec![cfg.vocab_size, h])])?;
        let norm = plan.vector(&gpu, &[named("model.norm.weight", vec![h])])?;
        let mut layer_slots = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let w = |n: &str, s: Vec<usize>| (format!("{p}.{n}"), s);
            let proj = |x: &str| format!("self_attn.{x}_proj.weight");
            let bias = |x: &str| format!("self_attn.{x}_proj.bias");
            let qkv_bias = if cfg.attention_bias {
                Some(plan.vector(
                    &gpu,
                    &[
                        w(&bias("q"), vec![heads * d]),
                        w(&bias("k"), vec![kv * d]),
                        w(&bias("v"), vec![kv * d]),
                    ],
                )?)
            } else {
                None
            };
            layer_slots.push((
                plan.vector(&gpu, &[w("input_layernorm.weight", vec![h])])?,
                plan.vector(&gpu, &[w("post_attention_layernorm.weight", vec![h])])?,
                plan.matrix(
                    &gpu,
                    &[
                        w(&proj("q"), vec![heads * d, h]),
                        w(&proj("k"), vec![kv * d, h]),
                        w(&proj("v"), vec![kv * d, h]),
                    ],
                )?,
                qkv_bias,
                plan.matrix(&gpu, &[w(&proj("o"), vec![h, heads * d])])?,
                plan.matrix(
                    &gpu,
                    &[
                        w("mlp.gate_proj.weight", vec![inter, h]),
                        w("mlp.up_proj.weight", vec![inter, h]),
                    ],
                )?,
                plan.matrix(&gpu, &[w("mlp.down_proj.weight", vec![h, inter])])?,
            ));
        }
        let c = cfg.num_labels;
        enum HeadSlots {
            Lm(Option<usize>),
            Mlp(usize, usize, usize, usize),
            Classifier(usize, Option<usize>),
        }
        let head_slots = match cfg.head {
            HeadKind::CausalLm if cfg.tie_word_embeddings => HeadSlots::Lm(None),
            HeadKind::CausalLm => HeadSlots::Lm(Some(
                plan.matrix(&gpu, &[named("lm_head.weight", vec![cfg.vocab_size, h])])?,
            )),
            HeadKind::ProcessRewardMlp => HeadSlots::Mlp(
                plan.matrix(&gpu, &[named("score.0.weight", vec![h, h])])?,
                plan.vector(&gpu, &[named("score.0.bias", vec![h])])?,
                plan.matrix(&gpu, &[named("score.2.weight", vec![c, h])])?,
                plan.vector(&gpu, &[named("score.2.bias", vec![c])])?,
            ),
            HeadKind::TokenClassification => HeadSlots::Classifier(
                plan.matrix(&gpu, &[named("score.weight", vec![c, h])])?,
                Some(plan.vector(&gpu, &[named("score.bias", vec![c])])?),
            ),
            HeadKind::SequenceClassification => {
                HeadSlots::Classifier(plan.matrix(&gpu, &[named("score.weight", vec![c, h])])?, None)
            }
        };
        let mut missing: std::collections::HashSet<String> = plan.at.keys().cloned().collect();
        for file in crate::model::weight_files(dir)? {
            let handle = std::fs::File::open(&file).with_context(|| format!("reading {}", file.display()))?;
            // SAFETY: a read-only mapping that lives only for this loop (as in model.rs's loader).
            let map = unsafe { memmap2::Mmap::map(&handle) }.with_context(|| format!("mapping {}", file.display()))?;
            let st =
                safetensors::SafeTensors::deserialize(&map).with_context(|| format!("reading {}", file.display()))?;
            for (name, view) in st.tensors() {
                let Some((matrix, slot, offset, shape)) = plan.at.get(&name).cloned() else {
                    continue;
                };
                let at = || format!("{}: tensor `{name}`", file.display());
                if view.shape() != shape.as_slice() {
                    bail!("{}: shape {:?}, config.json implies {shape:?}", at(), view.shape());
                }
                let n: usize = shape.iter().product();
                if matrix {
                    let host = to_bf16_bits(&view).with_context(at)?;
                    let buf = plan.matrices[slot].as_mut().expect("slots are taken after loading");
                    gpu.stream.memcpy_htod(&host, &mut buf.slice_mut(offset..offset + n))?;
                } else {
                    let host = to_f32(&view).with_context(at)?;
                    let buf = plan.vectors[slot].as_mut().expect("slots are taken after loading");
                    gpu.stream.memcpy_htod(&host, &mut buf.slice_mut(offset..offset + n))?;
                }
                // The host copy is dropped after the stream has read it.
                gpu.synchronize()?;
                missing.remove(&name);
            }
        }
        if let Some(name) = missing.iter().min() {
            bail!(
                "{}: tensor `{name}` is missing (architecture {})",
                dir.display(),
                cfg.architecture
            );
        }
        let layers = layer_slots
            .into_iter()
            .map(|(ln1, ln2, qkv, qkv_bias, o, gate_up, down)| Layer {
                ln1: plan.take_vector(ln1),
                ln2: plan.take_vector(ln2),
                qkv: plan.take_matrix(qkv),
                qkv_bias: qkv_bias.map(|s| plan.take_vector(s)),
                o: plan.take_matrix(o),
                gate_up: plan.take_matrix(gate_up),
                down: plan.take_matrix(down),
            })
            .collect();
        let head = match head_slots {
            HeadSlots::Lm(w) => Head::Lm(w.map(|s| plan.take_matrix(s))),
            HeadSlots::Mlp(w1, b1, w2, b2) => Head::Mlp {
                w1: plan.take_matrix(w1),
                b1: plan.take_vector(b1),
                w2: plan.take_matrix(w2),
                b2: plan.take_vector(b2),
            },
            HeadSlots::Classifier(w, b) => Head::Classifier {
                w: plan.take_matrix(w),
                b: b.map(|s| plan.take_vector(s)),
            },
        };
        // Rotary tables as the CPU path computes them (f32 inverse frequencies, then cos/sin).
        let max_positions = cfg.max_position_embeddings.min(32768);
        let half = d / 2;
        let inv: Vec<f32> = (0..half)
            .map(|i| 1.0 / (cfg.rope_theta as f32).powf(2.0 * i as f32 / d as f32))
            .collect();
        let angles: Vec<f32> = (0..max_positions)
            .flat_map(|p| inv.iter().map(move |f| p as f32 * f))
            .collect();
        let cos = gpu.upload(&angles.iter().map(|a| a.cos()).collect::<Vec<_>>())?;
        let sin = gpu.upload(&angles.iter().map(|a| a.sin()).collect::<Vec<_>>())?;
        // The flash kernel for this head size is compiled now, not inside the first timed pass.
        gpu.flash(d)?;
        let model = GpuModel {
            embed: plan.take_matrix(embed),
            norm: plan.take_vector(norm),
            layers,
            head,
            cos,
            sin,
            max_positions,
            scratch: Mutex::new(Scratch::default()),
            encoded_tokens: AtomicUsize::new(0),
            config,
            gpu,
        };
        // One token through everything: cuBLAS picks its kernels and the scratch buffers exist.
        model.head_at(&Packed::new(&[&[0]]), &[0], Some(&[0]))?;
        model.encoded_tokens.store(0, Ordering::Relaxed);
        Ok(model)
    }

    /// The GPU it runs on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Head outputs at rows `read` of the packed `batch` (indices into all its tokens), row after
    /// row: every class of a classifier head, or the vocabulary logits of `columns` (all of the
    /// vocabulary when `None`) of an LM head. Returns the values and the number of columns.
    pub fn head_at(&self, batch: &Packed, read: &[usize], columns: Option<&[u32]>) -> Result<(Vec<f32>, usize)> {
        let cfg = &self.config;
        let t = batch.tokens();
        if let Some(&bad) = batch.ids().iter().find(|&&id| id as usize >= cfg.vocab_size) {
            bail!("token id {bad} is outside the model's vocabulary of {}", cfg.vocab_size);
        }
        if batch.longest() > self.max_positions {
            bail!(
                "a sequence of {} tokens exceeds the model's max_position_embeddings ({})",
                batch.longest(),
                self.max_positions
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
        self.encoded_tokens.fetch_add(t, Ordering::Relaxed);
        let mut guard = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let s = &mut *guard;
        self.decoder(batch, read, s)?;
        self.head(read.len(), columns, s)
    }

    /// Every layer over the batch; leaves the rows `read`, normed, in `s.head_in` (bf16).
    fn decoder(&self, batch: &Packed, read: &[usize], s: &mut Scratch) -> Result<()> {
        let gpu = &*self.gpu;
        let cfg = &self.config;
        let (t, h, d) = (batch.tokens(), cfg.hidden_size, cfg.head_dim);
        let (heads, kv, inter) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size);
        let width = (heads + 2 * kv) * d;
        let eps = cfg.rms_norm_eps as f32;

        // The batch's integers in one upload: positions, the sequence of each row, sequence
        // offsets, the attention tiles (sequence, first query) and the rows read.
        let offsets = batch.offsets();
        let mut seq_of_row = Vec::with_capacity(t);
        let mut tiles: Vec<(i32, i32)> = Vec::new();
        for (i, w) in offsets.windows(2).enumerate() {
            seq_of_row.extend(std::iter::repeat_n(i as i32, w[1] - w[0]));
            tiles.extend((0..w[1] - w[0]).step_by(64).map(|q0| (i as i32, q0 as i32)));
        }
        // Tiles with the most keys first, so the grid does not end on a long one.
        tiles.sort_by_key(|&(_, q0)| std::cmp::Reverse(q0));
        let ints: Vec<i32> = batch
            .positions()
            .into_iter()
            .map(|x| x as i32)
            .chain(seq_of_row)
            .chain(offsets.iter().map(|&o| o as i32))
            .chain(tiles.iter().map(|t| t.0))
            .chain(tiles.iter().map(|t| t.1))
            .chain(read.iter().map(|&r| r as i32))
            .collect();
        let ints_buf = grow(gpu, &mut s.ints, ints.len())?;
        gpu.stream.memcpy_htod(&ints, &mut ints_buf.slice_mut(..ints.len()))?;
        let base = gpu.addr(ints_buf);
        let at = |i: usize| base + 4 * i as u64;
        let (pos, seq_of, cu) = (at(0), at(t), at(2 * t));
        let (tile_seq, tile_start) = (at(2 * t + offsets.len()), at(2 * t + offsets.len() + tiles.len()));
        let read_rows = at(2 * t + offsets.len() + 2 * tiles.len());
        let ids_buf = grow(gpu, &mut s.ids, t)?;
        gpu.stream.memcpy_htod(batch.ids(), &mut ids_buf.slice_mut(..t))?;
        let ids = gpu.addr(ids_buf);

        let x = gpu.addr(grow(gpu, &mut s.x, t * h)?);
        let normed = gpu.addr(grow(gpu, &mut s.normed, t * h)?);
        let y = gpu.addr(grow(gpu, &mut s.y, t * width)?);
        let qkv = gpu.addr(grow(gpu, &mut s.qkv, t * width)?);
        let attn = gpu.addr(grow(gpu, &mut s.attn, t * heads * d)?);
        let gate_up = gpu.addr(grow(gpu, &mut s.gate_up, t * 2 * inter)?);
        let act = gpu.addr(grow(gpu, &mut s.act, t * inter)?);
        let rows = t as u32;
        use Arg::{Ptr, F32, I32, I64};
        gpu.launch(
            "embed_rows",
            rows,
            256,
            &[Ptr(gpu.addr(&self.embed)), Ptr(ids), Ptr(x), I32(h as i32)],
        )?;
        let flash = gpu.flash(d)?;
        let scale = 1.0 / (d as f32).sqrt();
        let elementwise = |n: usize| n.div_ceil(256) as u32;
        for l in &self.layers {
            gpu.launch(
                "rms_norm",
                rows,
                256,
                &[
                    Ptr(x),
                    Ptr(0),
                    Ptr(gpu.addr(&l.ln1)),
                    Ptr(normed),
                    I32(h as i32),
                    F32(eps),
                ],
            )?;
            gpu.gemm(normed, gpu.addr(&l.qkv), y, t, width, h, true, false)?;
            gpu.launch(
                "bias_rope",
                rows,
                128,
                &[
                    Ptr(y),
                    Ptr(l.qkv_bias.as_ref().map_or(0, |b| gpu.addr(b))),
                    Ptr(gpu.addr(&self.cos)),
                    Ptr(gpu.addr(&self.sin)),
                    Ptr(pos),
                    Ptr(qkv),
                    I32(heads as i32),
                    I32(kv as i32),
                    I32(d as i32),
                ],
            )?;
            match &flash {
                Some(f) => gpu.launch_flash(
                    f,
                    tiles.len() as u32,
                    heads as u32,
                    &[
                        Ptr(qkv),
                        Ptr(attn),
                        Ptr(cu),
                        Ptr(tile_seq),
                        Ptr(tile_start),
                        I32(heads as i32),
                        I32(kv as i32),
                        F32(scale * std::f32::consts::LOG2_E),
                    ],
                )?,
                None => gpu.launch(
                    "attention_simple",
                    (t * heads).div_ceil(4) as u32,
                    128,
                    &[
                        Ptr(qkv),
                        Ptr(attn),
                        Ptr(seq_of),
                        Ptr(cu),
                        I32(t as i32),
                        I32(heads as i32),
                        I32(kv as i32),
                        I32(d as i32),
                        F32(scale),
                    ],
                )?,
            }
            gpu.gemm(attn, gpu.addr(&l.o), x, t, h, heads * d, true, true)?;
            gpu.launch(
                "rms_norm",
                rows,
                256,
                &[
                    Ptr(x),
                    Ptr(0),
                    Ptr(gpu.addr(&l.ln2)),
                    Ptr(normed),
                    I32(h as i32),
                    F32(eps),
                ],
            )?;
            gpu.gemm(normed, gpu.addr(&l.gate_up), gate_up, t, 2 * inter, h, false, false)?;
            gpu.launch(
                "swiglu",
                elementwise(t * inter),
                256,
                &[Ptr(gate_up), Ptr(act), I32(inter as i32), I64((t * inter) as i64)],
            )?;
            gpu.gemm(act, gpu.addr(&l.down), x, t, h, inter, true, true)?;
        }
        let head_in = gpu.addr(grow(gpu, &mut s.head_in, read.len() * h)?);
        gpu.launch(
            "rms_norm",
            read.len() as u32,
            256,
            &[
                Ptr(x),
                Ptr(read_rows),
                Ptr(gpu.addr(&self.norm)),
                Ptr(head_in),
                I32(h as i32),
                F32(eps),
            ],
        )?;
        Ok(())
    }

    /// The head over the `r` normed rows in `s.head_in`, copied to the host.
    fn head(&self, r: usize, columns: Option<&[u32]>, s: &mut Scratch) -> Result<(Vec<f32>, usize)> {
        let gpu = &*self.gpu;
        let cfg = &self.config;
        let h = cfg.hidden_size;
        let head_in = gpu.addr(s.head_in.as_ref().expect("filled by the decoder"));
        use Arg::{Ptr, I32, I64};
        let add_bias = |out: u64, b: &CudaSlice<f32>, width: usize| {
            gpu.launch(
                "add_bias",
                (r * width).div_ceil(256) as u32,
                256,
                &[Ptr(out), Ptr(gpu.addr(b)), I32(width as i32), I64((r * width) as i64)],
            )
        };
        let (out, width) = match &self.head {
            Head::Mlp { w1, b1, w2, b2 } => {
                let c = cfg.num_labels;
                let mid = gpu.addr(grow(gpu, &mut s.head_mid, r * h)?);
                gpu.gemm(head_in, gpu.addr(w1), mid, r, h, h, true, false)?;
                // The ReLU's output feeds the second product in bf16: into `normed`'s buffer,
                // free after the decoder.
                let relu = gpu.addr(s.normed.as_ref().expect("filled by the decoder"));
                gpu.launch(
                    "bias_relu_bf16",
                    (r * h).div_ceil(256) as u32,
                    256,
                    &[
                        Ptr(mid),
                        Ptr(gpu.addr(b1)),
                        Ptr(relu),
                        I32(h as i32),
                        I64((r * h) as i64),
                    ],
                )?;
                let out = gpu.addr(grow(gpu, &mut s.head_out, r * c)?);
                gpu.gemm(relu, gpu.addr(w2), out, r, c, h, true, false)?;
                add_bias(out, b2, c)?;
                (out, c)
            }
            Head::Classifier { w, b } => {
                let c = cfg.num_labels;
                let out = gpu.addr(grow(gpu, &mut s.head_out, r * c)?);
                gpu.gemm(head_in, gpu.addr(w), out, r, c, h, true, false)?;
                if let Some(b) = b {
                    add_bias(out, b, c)?;
                }
                (out, c)
            }
            Head::Lm(w) => {
                let matrix = gpu.addr(w.as_ref().unwrap_or(&self.embed));
                match columns {
                    None => {
                        let v = cfg.vocab_size;
                        let out = gpu.addr(grow(gpu, &mut s.head_out, r * v)?);
                        gpu.gemm(head_in, matrix, out, r, v, h, true, false)?;
                        (out, v)
                    }
                    Some(cols) => {
                        // The rows of the LM head for these tokens, gathered, then one product.
                        let idx: Vec<i32> = cols.iter().map(|&c| c as i32).collect();
                        let idx_buf = gpu.upload(&idx)?;
                        let gathered = gpu.addr(grow(gpu, &mut s.columns, cols.len() * h)?);
                        gpu.launch(
                            "gather_rows_bf16",
                            cols.len() as u32,
                            256,
                            &[Ptr(matrix), Ptr(gpu.addr(&idx_buf)), Ptr(gathered), I32(h as i32)],
                        )?;
                        let out = gpu.addr(grow(gpu, &mut s.head_out, r * cols.len())?);
                        gpu.gemm(head_in, gathered, out, r, cols.len(), h, true, false)?;
                        gpu.synchronize()?;
                        (out, cols.len())
                    }
                }
            }
        };
        let _ = out;
        let values = gpu.download(s.head_out.as_ref().expect("the head's output"), r * width)?;
        Ok((values, width))
    }
}
