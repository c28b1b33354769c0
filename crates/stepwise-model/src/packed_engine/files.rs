//! A [`PackedTrainer`]'s checkpoint and optimiser state, written and read a tensor at a time:
//! each tensor is read from its buffer (on the device, or the CPU backend's) only when the file
//! writer asks for its bytes, and read back from the memory-mapped file one tensor at a time, so
//! saving or resuming holds one tensor's host copy beside the trainer, never a second copy of the
//! model or of AdamW's moments (at 0.5B those copies were 7 GB on top of the trainer's 9). The
//! files are the ones [`crate::checkpoint::save_training_checkpoint`] and the CPU trainer write,
//! so either trainer and every reader takes them.

use super::train::{held_ref, places, read_master_files, read_named, Held, PackedTrainer, Params, Spec};
use super::{Backend, TrainBackend};
use crate::checkpoint::{to_f32, Mapped, TRAINING_WEIGHTS};
use anyhow::{ensure, Context, Result};
use candle_core::DType;
use safetensors::{Dtype, View};
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A copy of a [`PackedTrainer`]'s f32 weights on its device ([`PackedTrainer::snapshot`]).
pub struct Snapshot<B: TrainBackend>(Params<B::F32>);

/// Every value of `src` (laid out as `specs`) copied into `dst`.
fn copy_values<B: TrainBackend>(b: &B, specs: &Params<Spec>, src: &Params<B::F32>, dst: &mut Params<B::F32>) -> Result<()> {
    for ((s, from), to) in specs.all().into_iter().zip(src.all()).zip(dst.all_mut()) {
        if !s.frozen {
            b.copy_f32(from, to, s.len())?;
        }
    }
    Ok(())
}

/// Where a tensor's values come from.
enum Source<'a, B: Backend> {
    /// Values `at..` of a buffer, as many as the shape holds (f32, stored as `dtype`).
    Buffer { buf: &'a B::F32, at: usize },
    /// Values `at..` of a bf16 matrix (a frozen one's decoder copy), widened through `ids`
    /// (`0, 1, 2, …`) a row at a time.
    Widened { table: &'a B::Bf16, ids: &'a B::I32, at: usize },
    /// The tensor `name` of a mapped checkpoint file, as stored there (a frozen tensor's own).
    Stored { map: &'a Mapped, name: String },
    /// Bytes as they are stored.
    Bytes(Vec<u8>),
}

/// One tensor of a file being written.
struct Part<'a, B: Backend> {
    backend: &'a B,
    source: Source<'a, B>,
    shape: Vec<usize>,
    dtype: Dtype,
    /// The first read that failed (its tensor is written as zeros, and the file is discarded).
    failed: &'a RefCell<Option<anyhow::Error>>,
}


impl<B: Backend> Part<'_, B> {
    /// The values from `at` as stored, or zeros with the failure kept.
    fn bytes_or_zeros(&self, values: Result<Vec<f32>>, at: usize) -> Cow<'_, [u8]> {
        match values {
            Ok(host) => Cow::Owned(crate::checkpoint::encode_floats(&host[at..], self.dtype)),
            Err(e) => {
                self.failed.borrow_mut().get_or_insert(e);
                Cow::Owned(vec![0; self.data_len()])
            }
        }
    }
}

impl<B: Backend> View for Part<'_, B> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        match &self.source {
            Source::Bytes(b) => Cow::Borrowed(b),
            Source::Buffer { buf, at } => {
                let n: usize = self.shape.iter().product();
                self.bytes_or_zeros(self.backend.read_f32(buf, at + n), *at)
            }
            Source::Widened { table, ids, at } => {
                let (n, cols) = (self.shape.iter().product::<usize>(), *self.shape.last().unwrap_or(&1));
                let rows = (at + n).div_ceil(cols);
                let widened = self.backend.zeros_f32(rows * cols).and_then(|mut wide| {
                    self.backend.embed(table, ids, &mut wide, rows, cols)?;
                    self.backend.read_f32(&wide, at + n)
                });
                self.bytes_or_zeros(widened, *at)
            }
            Source::Stored { map, name } => {
                let stored = safetensors::SafeTensors::deserialize(map).map_err(anyhow::Error::from).and_then(|st| {
                    let view = st.tensor(name)?;
                    let bytes = match view.dtype() == self.dtype {
                        true => view.data().to_vec(),
                        false => crate::checkpoint::encode_floats(&to_f32(&view)?, self.dtype),
                    };
                    map.let_go(view.data());
                    Ok(bytes)
                });
                match stored {
                    Ok(bytes) => Cow::Owned(bytes),
                    Err(e) => {
                        self.failed.borrow_mut().get_or_insert(e.context(format!("tensor `{name}`")));
                        Cow::Owned(vec![0; self.data_len()])
                    }
                }
            }
        }
    }

    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.bitsize() / 8
    }
}

/// `parts` written to `path` (under a temporary name, renamed when complete; nothing is left
/// when a read fails).
fn write<B: Backend>(path: &Path, parts: Vec<(String, Part<'_, B>)>, failed: &RefCell<Option<anyhow::Error>>) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let metadata: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    let written = safetensors::serialize_to_file(parts, Some(metadata), &tmp);
    if let Some(e) = failed.borrow_mut().take() {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.context(format!("reading the weights to write {}", path.display())));
    }
    written.with_context(|| format!("writing {}", path.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// A LoRA trainer's base checkpoint, mapped: where its frozen tensors are written from as stored
/// (the decoder holds them in bf16).
struct Base {
    maps: Vec<Mapped>,
    /// Each tensor's file.
    at: HashMap<String, usize>,
}

impl Base {
    fn open(dir: &Path) -> Result<Self> {
        let (mut maps, mut at) = (Vec::new(), HashMap::new());
        for file in crate::checkpoint::weight_files(dir)? {
            let map = Mapped::open(&file)?;
            let st = safetensors::SafeTensors::deserialize(&map).with_context(|| format!("reading {}", file.display()))?;
            at.extend(st.names().into_iter().map(|n| (n.to_string(), maps.len())));
            maps.push(map);
        }
        Ok(Base { maps, at })
    }
}

/// Where a LoRA trainer's frozen tensors are written from: their base checkpoint as stored, the
/// decoder's copies for the adapted (merged) ones.
struct Frozen<'a, B: Backend> {
    /// `0, 1, 2, …`, as many as the rows of the tallest matrix.
    ids: B::I32,
    base: Base,
    adapters: &'a super::lora::Adapters<B>,
}

impl<'a, B: TrainBackend> Frozen<'a, B> {
    /// The source of the frozen tensor `name`, values `at..` of the decoder's `copy`.
    fn source(&'a self, name: &str, copy: Held<&'a B::Bf16, &'a B::F32>, at: usize) -> Source<'a, B> {
        match (self.base.at.get(name), copy) {
            (Some(&i), _) if !self.adapters.adapts(name) => Source::Stored {
                map: &self.base.maps[i],
                name: name.to_string(),
            },
            (_, Held::Matrix(table)) => Source::Widened { table, ids: &self.ids, at },
            (_, Held::Vector(buf)) => Source::Buffer { buf, at },
        }
    }
}

/// Which of a trainer's values a file holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Which {
    /// The model's (a frozen tensor as its base stores it, an adapted one merged from the
    /// decoder's copy): `model.safetensors`.
    Model,
    /// Every trained value (the masters, LoRA's adapters among them): a resume's.
    Trained,
    /// LoRA's adapters and a trained head, under PEFT's names: `adapter_model.safetensors`.
    Adapter,
}

impl<B: TrainBackend> PackedTrainer<B> {
    /// The checkpoint tensors of `values` (the masters, or a moment) that `which` selects, named
    /// with `prefix`, stored as `dtype` (a frozen one's from the decoder's copy, widened
    /// through `ids`).
    fn parts<'a>(
        &'a self,
        values: &'a Params<B::F32>,
        (prefix, which): (&str, Which),
        dtype: Dtype,
        frozen: Option<&'a Frozen<'a, B>>,
        failed: &'a RefCell<Option<anyhow::Error>>,
    ) -> Vec<(String, Part<'a, B>)> {
        let backend = &*self.decoder.backend;
        let first_lora = self.specs.all().len() - self.specs.lora.len();
        let copies = held_ref(&self.decoder).into_iter().map(Some).chain(std::iter::repeat_with(|| None));
        let mut out = Vec::new();
        for (i, ((s, buf), copy)) in self.specs.all().into_iter().zip(values.all()).zip(copies).enumerate() {
            let lora = i >= first_lora;
            let wanted = match which {
                Which::Model => !lora,
                Which::Trained => !s.frozen,
                Which::Adapter => !s.frozen && (lora || self.adapters.is_some()),
            };
            if !wanted {
                continue;
            }
            let mut at = 0;
            for (name, shape) in &s.parts {
                let source = match (s.frozen, copy, frozen) {
                    (true, Some(copy), Some(frozen)) => frozen.source(name, copy, at),
                    _ => Source::Buffer { buf, at },
                };
                let shape = shape.clone();
                at += shape.iter().product::<usize>();
                let part = Part {
                    backend,
                    source,
                    shape,
                    dtype,
                    failed,
                };
                // PEFT names a trained head `base_model.model.` + its name in the adapter.
                let name = match which {
                    Which::Adapter if !lora => format!("base_model.model.{name}"),
                    _ => format!("{prefix}{name}"),
                };
                out.push((name, part));
            }
        }
        out
    }

    /// Where the frozen tensors are written from (none without LoRA).
    fn frozen(&self) -> Result<Option<Frozen<'_, B>>> {
        let Some(adapters) = &self.adapters else {
            return Ok(None);
        };
        let rows = self.specs.all().iter().flat_map(|s| &s.parts).map(|(_, shape)| shape[0]).max().unwrap_or(1);
        Ok(Some(Frozen {
            ids: self.decoder.backend.upload_i32(&(0..rows as i32).collect::<Vec<_>>())?,
            base: Base::open(adapters.base())?,
            adapters,
        }))
    }

    /// Writes the model to the checkpoint folder `dir` as
    /// [`crate::checkpoint::save_training_checkpoint`] does: `config.json`, `model.safetensors`
    /// in the checkpoint's dtype and, when that is not f32, the exact f32 masters
    /// ([`TRAINING_WEIGHTS`]) a run resumes from.
    pub fn save_checkpoint(&self, dir: &Path) -> Result<()> {
        let config = &self.decoder.config;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config.to_hf_json())?)?;
        let stored = match config.dtype {
            DType::BF16 => Dtype::BF16,
            DType::F16 => Dtype::F16,
            _ => Dtype::F32,
        };
        let (failed, frozen) = (RefCell::new(None), self.frozen()?);
        let parts = self.parts(&self.master, ("", Which::Model), stored, frozen.as_ref(), &failed);
        write(&dir.join("model.safetensors"), parts, &failed)?;
        let exact = dir.join(TRAINING_WEIGHTS);
        if let Some(a) = &self.adapters {
            // The adapters (and a trained head) beside the merged model: PEFT's files, and the
            // exact values a resumed run continues from.
            let parts = self.parts(&self.master, ("", Which::Adapter), Dtype::F32, None, &failed);
            write(&dir.join("adapter_model.safetensors"), parts, &failed)?;
            let head = self.specs.head.first().is_some_and(|s| !s.frozen);
            let json = a.peft_config(&self.decoder.config, head);
            std::fs::write(dir.join("adapter_config.json"), serde_json::to_string_pretty(&json)?)?;
            return self.save_weights(&exact);
        }
        if stored == Dtype::F32 {
            if exact.exists() {
                std::fs::remove_file(&exact)?;
            }
            return Ok(());
        }
        self.save_weights(&exact)
    }

    /// Writes the f32 masters, exactly, to the one safetensors file `path` by checkpoint name
    /// (what [`crate::checkpoint::save_exact_weights`] writes of the CPU trainer's weights).
    pub fn save_weights(&self, path: &Path) -> Result<()> {
        let failed = RefCell::new(None);
        write(path, self.parts(&self.master, ("", Which::Trained), Dtype::F32, None, &failed), &failed)
    }

    /// Sets the masters from the safetensors file `path` (every trainable tensor, by checkpoint
    /// name: what [`PackedTrainer::save_weights`] wrote) and refreshes the decoder's copies.
    pub fn load_weights_file(&mut self, path: &Path) -> Result<()> {
        let b = std::sync::Arc::clone(&self.decoder.backend);
        let lora = self.adapters.is_some();
        read_master_files(&*b, &self.specs, &mut self.master, &[path.to_path_buf()], path, lora)?;
        self.refresh_copies()
    }

    /// A copy of the masters where they live (on the device): what [`PackedTrainer::restore`]
    /// puts back.
    pub fn snapshot(&self) -> Result<Snapshot<B>> {
        let b = &*self.decoder.backend;
        let mut copy = self.specs.map(|s| b.zeros_f32(s.len()))?;
        copy_values(b, &self.specs, &self.master, &mut copy)?;
        Ok(Snapshot(copy))
    }

    /// The masters set to `snapshot`'s values (AdamW's state is left as it is) and the decoder's
    /// copies refreshed.
    pub fn restore(&mut self, snapshot: &Snapshot<B>) -> Result<()> {
        copy_values(&*self.decoder.backend, &self.specs, &snapshot.0, &mut self.master)?;
        self.refresh_copies()
    }

    /// Writes AdamW's moments and step count to `path` in the CPU trainer's layout (`m.NAME`,
    /// `v.NAME` by checkpoint name and shape, `step`), so that either trainer continues a run
    /// the other checkpointed.
    pub fn save_optimizer(&self, path: &Path) -> Result<()> {
        let failed = RefCell::new(None);
        let mut parts = self.parts(&self.m, ("m.", Which::Trained), Dtype::F32, None, &failed);
        parts.extend(self.parts(&self.v, ("v.", Which::Trained), Dtype::F32, None, &failed));
        let step = Part {
            backend: &*self.decoder.backend,
            source: Source::Bytes(self.updates.to_le_bytes().to_vec()),
            shape: vec![1],
            dtype: Dtype::U32,
            failed: &failed,
        };
        parts.push(("step".into(), step));
        write(path, parts, &failed)
    }

    /// Restores what [`PackedTrainer::save_optimizer`] (or the CPU trainer) wrote, a tensor at a
    /// time from the mapped file; a tensor it does not hold keeps zero moments.
    pub fn load_optimizer(&mut self, path: &Path) -> Result<()> {
        let map = crate::checkpoint::Mapped::open(path)?;
        let b = std::sync::Arc::clone(&self.decoder.backend);
        let at = places(&self.specs, true);
        for (prefix, values) in [("m.", &mut self.m), ("v.", &mut self.v)] {
            read_named(&*b, &at, &mut values.all_mut(), &map, prefix, path)?;
        }
        let st = safetensors::SafeTensors::deserialize(&map).with_context(|| format!("reading {}", path.display()))?;
        if let Ok(step) = st.tensor("step") {
            let bytes = step.data();
            ensure!(
                step.dtype() == Dtype::U32 && bytes.len() == 4,
                "{}: `step` is not one u32",
                path.display()
            );
            self.updates = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        }
        Ok(())
    }
}
