//! Several PEFT LoRA adapters served unmerged on one base model (vLLM's `--lora-modules`,
//! S-LoRA's and Punica's design): the base's weights are held once, each adapter as its small
//! `A` and `B` matrices, and a forward pass whose rows belong to different adapters adds each
//! row's own `s·(x·Aᵀ)·Bᵀ` to every projection its adapter adapts (PEFT's unmerged forward,
//! `base_layer(x) + lora_B(lora_A(x))·s`). A row of no adapter is the base model's.
//!
//! The rows of a pass are cut into runs of one adapter each; each run's update is two thin
//! products, so a rank-16 adapter on a 0.5B model adds a few percent to a projection's arithmetic
//! instead of a second copy of the model (on two cores, serving three such adapters ran at 0.85×
//! the base's tokens/s: docs/benchmarks.md). Only what an adapter adds to the linear projections can
//! be served so: an adapter that replaces whole tensors (`modules_to_save`, trained biases) or
//! adapts the embeddings is refused, naming them, and is served merged (as `--model ADAPTER`).

use crate::checkpoint::to_f32;
use crate::config::ModelConfig;
use crate::peft::{AdapterConfig, Plan, ADAPTER_WEIGHTS};
use anyhow::{bail, ensure, Context, Result};
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// The projections an adapter may adapt, in [`Adapters`]' order.
const MODULES: [(&str, &str); 7] = [
    ("self_attn", "q_proj"),
    ("self_attn", "k_proj"),
    ("self_attn", "v_proj"),
    ("self_attn", "o_proj"),
    ("mlp", "gate_proj"),
    ("mlp", "up_proj"),
    ("mlp", "down_proj"),
];

/// A projection of a decoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Proj {
    Q = 0,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

/// Rows `start..start + len` of a pass, all of one adapter (`None`: the base model's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    pub start: usize,
    pub len: usize,
    pub adapter: Option<usize>,
}

/// Runs of `rows` rows a sequence, sequence `i` of `adapters[i]` (one entry: all of them; none:
/// the base's), after `start`, appended to `runs` with neighbours of one adapter joined.
pub(crate) fn push_runs(runs: &mut Vec<Run>, start: usize, seqs: usize, rows: usize, adapters: &[Option<usize>]) {
    for i in 0..seqs {
        let adapter = match adapters {
            [] => None,
            [one] => *one,
            each => each[i],
        };
        let at = start + i * rows;
        match runs.last_mut() {
            Some(last) if last.adapter == adapter && last.start + last.len == at => last.len += rows,
            _ => runs.push(Run {
                start: at,
                len: rows,
                adapter,
            }),
        }
    }
}

/// How an engine reads adapters: each holds only its own form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// bf16 host arrays, the operands of the packed engine's CPU backend's products.
    HostBf16,
    /// f32 host arrays, the reference backend's (the update's specification).
    HostF32,
    /// candle tensors, the CPU decoder's.
    Tensors,
}

/// One adapter's update of one projection, in its engine's [`Form`].
#[derive(Clone, Debug)]
enum Pair {
    /// f32 `A` `[r, in]` and `(s·B)ᵀ` `[r, out]` ([`Form::HostF32`]), or `A` and `s·B`
    /// `[out, r]` rounded to bf16 ([`Form::HostBf16`]); the other pair empty.
    Host {
        a: Vec<f32>,
        bt: Vec<f32>,
        a16: Vec<u16>,
        b16: Vec<u16>,
        r: usize,
    },
    /// `Aᵀ` `[in, r]` and `(s·B)ᵀ` `[r, out]`, f32.
    Tensors { at: Tensor, bt: Tensor },
}

/// An adapter's update of one projection as the packed engine reads it: `a` `[r, in]` and the
/// scaled `B` transposed, `bt` `[r, out]`, row-major.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostPair<'a> {
    pub a: &'a [f32],
    pub bt: &'a [f32],
    pub a16: &'a [u16],
    pub b16: &'a [u16],
    pub r: usize,
}

/// One adapter's updates, `[layer][projection]`.
#[derive(Debug)]
struct Adapter {
    layers: Vec<[Option<Pair>; 7]>,
}

/// An adapter read from its folder, not yet served (reading takes long; changing the set served
/// must not: [`AdapterTable::change`]).
#[derive(Debug)]
pub(crate) struct ReadAdapter {
    folder: PathBuf,
    adapter: Adapter,
}

impl ReadAdapter {
    /// The PEFT LoRA adapter in `dir` (to be served as `name`), checked against a base of `config`.
    pub(crate) fn read(config: &ModelConfig, name: &str, dir: &Path, form: Form) -> Result<Self> {
        let pairs = read_pairs(dir, &base_shapes(config), form)
            .with_context(|| format!("adapter `{name}` ({})", dir.display()))?;
        let mut layers: Vec<[Option<Pair>; 7]> = (0..config.num_hidden_layers).map(|_| Default::default()).collect();
        for ((li, proj), pair) in pairs {
            layers[li][proj] = Some(pair);
        }
        Ok(ReadAdapter {
            folder: dir.to_path_buf(),
            adapter: Adapter { layers },
        })
    }
}

/// A request's hold on the adapter it was admitted with ([`crate::Model::lease_adapter`]):
/// while one is held, the adapter's index stays its own, with its weights, unloaded or not.
#[derive(Debug)]
pub struct AdapterLease(Arc<AtomicUsize>);

impl Drop for AdapterLease {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A served adapter at its index: `name` is `None` once it is unloaded while leases on it are
/// held (it serves those requests and no new ones). `leases` counts the requests holding the
/// index, whatever weights a load in place has put there since they came.
#[derive(Clone, Debug)]
struct Slot {
    name: Option<String>,
    folder: PathBuf,
    adapter: Arc<Adapter>,
    leases: Arc<AtomicUsize>,
}

/// The adapters served on one base model, by index: those given in order at the start, then
/// each loaded later in the first free index ([`crate::Model::load_adapter`]). A set is never changed
/// in place; a load or an unload makes the next one, so a forward pass reads one set throughout.
#[derive(Clone, Debug, Default)]
pub struct Adapters {
    slots: Vec<Option<Slot>>,
}

impl Adapters {
    /// The adapters `(name, folder)` read for a base model of `config`: each folder a PEFT LoRA
    /// adapter whose matrices fit the base's projections (the base it names is not read; the
    /// shapes are checked).
    pub(crate) fn load(config: &ModelConfig, list: &[(String, PathBuf)], form: Form) -> Result<Self> {
        let mut set = Adapters::default();
        for (name, dir) in list {
            ensure!(set.index(name).is_none(), "two adapters are named `{name}`");
            set = set.with_read(name, ReadAdapter::read(config, name, dir, form)?, false)?;
        }
        Ok(set)
    }

    /// Refuses `name` where an adapter of that name is served, unless it is to be replaced.
    pub(crate) fn check_free(&self, name: &str, inplace: bool) -> Result<()> {
        ensure!(
            inplace || self.index(name).is_none(),
            "an adapter named `{name}` is already served (load it in place to replace it)"
        );
        Ok(())
    }

    /// This set with the adapter `read` served as `name`: in place of the adapter of that name
    /// where `inplace` (its requests decode on with the new weights), else refused if the name
    /// is served. Adapters unloaded whose last request has finished are let go.
    pub(crate) fn with_read(&self, name: &str, read: ReadAdapter, inplace: bool) -> Result<Self> {
        self.check_free(name, inplace)?;
        let at = self.index(name);
        let mut next = self.reaped();
        let slot = Slot {
            name: Some(name.to_string()),
            folder: read.folder,
            adapter: Arc::new(read.adapter),
            // Replacing an adapter in place, its requests' leases stay on the index.
            leases: at
                .and_then(|i| next.slots[i].as_ref())
                .map(|s| s.leases.clone())
                .unwrap_or_default(),
        };
        match at.or_else(|| next.slots.iter().position(Option::is_none)) {
            Some(i) => next.slots[i] = Some(slot),
            None => next.slots.push(Some(slot)),
        }
        Ok(next)
    }

    /// This set without the adapter named `name`: new requests cannot name it; those holding
    /// it decode on with it until they finish.
    pub fn without(&self, name: &str) -> Result<Self> {
        let at = self.index(name).with_context(|| format!("no adapter named `{name}` is served"))?;
        let mut next = self.clone();
        if let Some(slot) = &mut next.slots[at] {
            slot.name = None;
        }
        Ok(next.reaped())
    }

    /// This set less the adapters unloaded that no request holds.
    fn reaped(&self) -> Self {
        let mut next = self.clone();
        for slot in &mut next.slots {
            if slot.as_ref().is_some_and(|s| s.name.is_none() && s.leases.load(Ordering::Acquire) == 0) {
                *slot = None;
            }
        }
        while matches!(next.slots.last(), Some(None)) {
            next.slots.pop();
        }
        next
    }

    /// A hold on the adapter named `name`, with its index ([`AdapterLease`]).
    pub fn lease(&self, name: &str) -> Option<(usize, AdapterLease)> {
        let at = self.index(name)?;
        let leases = self.slots[at].as_ref()?.leases.clone();
        leases.fetch_add(1, Ordering::AcqRel);
        Some((at, AdapterLease(leases)))
    }

    /// The adapters served, `(index, name, folder)`, by index.
    pub fn served(&self) -> impl Iterator<Item = (usize, &str, &Path)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| {
            let s = s.as_ref()?;
            Some((i, s.name.as_deref()?, s.folder.as_path()))
        })
    }

    /// The served adapters' names, by index.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.served().map(|(_, name, _)| name)
    }

    /// The index of the adapter named `name`.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.served().find(|(_, n, _)| *n == name).map(|(i, _, _)| i)
    }

    /// Whether index `adapter` holds an adapter (served, or unloaded and still held).
    pub fn holds(&self, adapter: usize) -> bool {
        matches!(self.slots.get(adapter), Some(Some(_)))
    }

    /// How many adapters are served.
    pub fn len(&self) -> usize {
        self.served().count()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.served().next().is_none()
    }

    /// Adapter `adapter`'s update of projection `proj` of layer `layer`, if it adapts it.
    fn pair(&self, layer: usize, proj: Proj, adapter: usize) -> Option<&Pair> {
        let slot = self.slots.get(adapter)?.as_ref()?;
        slot.adapter.layers.get(layer)?[proj as usize].as_ref()
    }

    /// Adapter `adapter`'s update of projection `proj` of layer `layer`, if it adapts it.
    pub(crate) fn host(&self, layer: usize, proj: Proj, adapter: usize) -> Option<HostPair<'_>> {
        match self.pair(layer, proj, adapter)? {
            Pair::Host { a, bt, a16, b16, r } => Some(HostPair {
                a,
                bt,
                a16,
                b16,
                r: *r,
            }),
            Pair::Tensors { .. } => None,
        }
    }

    /// Each adapter's rows in `runs` (ascending; the base's left out), by adapter, each checked
    /// to be served.
    pub(crate) fn rows_by_adapter(&self, runs: &[Run]) -> Result<Vec<(usize, Vec<u32>)>> {
        let mut rows: std::collections::BTreeMap<usize, Vec<u32>> = Default::default();
        for r in runs {
            if let Some(a) = r.adapter {
                ensure!(self.holds(a), "adapter {a} is not served here");
                rows.entry(a).or_default().extend((r.start..r.start + r.len).map(|i| i as u32));
            }
        }
        Ok(rows.into_iter().collect())
    }

    /// The rows of each adapter in `runs` (those of no adapter left out), for [`Adapters::add_to`].
    pub(crate) fn groups(&self, runs: &[Run]) -> Result<Vec<Group>> {
        self.rows_by_adapter(runs)?
            .into_iter()
            .map(|(adapter, rows)| {
                let (first, n) = (rows[0] as usize, rows.len());
                let together = rows.iter().enumerate().all(|(k, &r)| r as usize == first + k);
                Ok(Group {
                    adapter,
                    together: together.then_some((first, n)),
                    index: Tensor::new(rows, &Device::Cpu)?,
                })
            })
            .collect()
    }

    /// `y` (a projection's output for the rows `x`, `[rows, out]`) plus, at each group's rows,
    /// its adapter's update of projection `proj` of layer `layer`: `(x·Aᵀ)·(s·Bᵀ)`, two thin
    /// products an adapter whatever the order of its rows.
    pub(crate) fn add_to(&self, layer: usize, proj: Proj, x: &Tensor, mut y: Tensor, groups: &[Group]) -> Result<Tensor> {
        for g in groups {
            let Some(Pair::Tensors { at, bt }) = self.pair(layer, proj, g.adapter) else {
                continue;
            };
            let xs = match g.together {
                Some((first, n)) => x.narrow(0, first, n)?,
                None => x.index_select(&g.index, 0)?,
            };
            let update = xs.matmul(at)?.matmul(bt)?;
            y = match g.together {
                Some((0, n)) if n == y.dim(0)? => (y + update)?,
                _ => y.index_add(&g.index, &update, 0)?,
            };
        }
        Ok(y)
    }
}

/// The adapters a model serves now, shared by the model, its clones and its decoders: a load
/// or an unload replaces the whole set (one at a time), a forward pass reads the set current
/// when it starts.
#[derive(Debug, Default)]
pub(crate) struct AdapterTable {
    now: RwLock<Option<Arc<Adapters>>>,
    changing: Mutex<()>,
}

impl AdapterTable {
    /// The set served now (`None`: no adapter).
    pub(crate) fn now(&self) -> Option<Arc<Adapters>> {
        self.now.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the set served by `change` of it, once `publish` (which hands it to the engine
    /// computing with it) accepts the new set. Leases wait for a change to end, so `change`
    /// must be quick: an adapter is read before ([`ReadAdapter`]).
    pub(crate) fn change(
        &self,
        change: impl FnOnce(&Adapters) -> Result<Adapters>,
        publish: impl FnOnce(Option<Arc<Adapters>>) -> Result<()>,
    ) -> Result<()> {
        let _one_at_a_time = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let next = change(&self.now().unwrap_or_default())?;
        let next = (!next.slots.is_empty()).then(|| Arc::new(next));
        publish(next.clone())?;
        *self.now.write().unwrap_or_else(|e| e.into_inner()) = next;
        Ok(())
    }

    /// A hold on the adapter served as `name`, with its index (taken while no change runs, so
    /// an unload cannot let it go between finding and holding it).
    pub(crate) fn lease(&self, name: &str) -> Option<(usize, AdapterLease)> {
        let _one_at_a_time = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        self.now()?.lease(name)
    }
}

/// The rows of a pass that run with one adapter.
#[derive(Debug)]
pub(crate) struct Group {
    adapter: usize,
    /// `(first, n)` where they are rows `first..first + n`.
    together: Option<(usize, usize)>,
    /// Their indices.
    index: Tensor,
}

/// The base tensors an adapter may name, by their checkpoint names, with their shapes.
fn base_shapes(cfg: &ModelConfig) -> HashMap<String, Vec<usize>> {
    let (h, d, inter, vocab) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size);
    let (q, kv) = (cfg.num_attention_heads * d, cfg.num_key_value_heads * d);
    let mut shapes = HashMap::new();
    for (name, shape) in [
        ("model.embed_tokens.weight", vec![vocab, h]),
        ("lm_head.weight", vec![vocab, h]),
        ("model.norm.weight", vec![h]),
    ] {
        shapes.insert(name.to_string(), shape);
    }
    for i in 0..cfg.num_hidden_layers {
        let at = |part: &str| format!("model.layers.{i}.{part}");
        for (name, shape) in [
            ("self_attn.q_proj.weight", vec![q, h]),
            ("self_attn.k_proj.weight", vec![kv, h]),
            ("self_attn.v_proj.weight", vec![kv, h]),
            ("self_attn.o_proj.weight", vec![h, q]),
            ("self_attn.q_proj.bias", vec![q]),
            ("self_attn.k_proj.bias", vec![kv]),
            ("self_attn.v_proj.bias", vec![kv]),
            ("mlp.gate_proj.weight", vec![inter, h]),
            ("mlp.up_proj.weight", vec![inter, h]),
            ("mlp.down_proj.weight", vec![h, inter]),
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
        ] {
            shapes.insert(at(name), shape);
        }
    }
    shapes
}

/// `(layer, projection)` of a base weight's name (`model.layers.3.mlp.up_proj.weight`).
fn projection_of(weight: &str) -> Option<(usize, usize)> {
    let rest = weight.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let module = rest.strip_suffix(".weight")?;
    let proj = MODULES.iter().position(|(block, m)| module == format!("{block}.{m}"))?;
    Some((layer.parse().ok()?, proj))
}

/// The adapter in `dir`'s updates by `(layer, projection)`, refused where it does more than add
/// to the projections.
fn read_pairs(dir: &Path, shapes: &HashMap<String, Vec<usize>>, form: Form) -> Result<Vec<((usize, usize), Pair)>> {
    ensure!(
        crate::peft::is_adapter(dir),
        "not a PEFT adapter folder (no adapter_config.json, or model weights of its own)"
    );
    let cfg = AdapterConfig::read(dir)?;
    let file = dir.join(ADAPTER_WEIGHTS);
    // A tensor at a time (crate::tensor_file): not the whole file in fresh memory, nor mapped.
    let mut st = crate::tensor_file::TensorFile::open(&file)?;
    let plan = Plan::new(&cfg, &st.shapes(), &file, shapes)?;
    if let Some((name, key)) = plan.replaced.iter().next() {
        bail!(
            "{}: tensor `{key}` replaces the base's `{name}` (modules_to_save or a trained bias); an \
             adapter that replaces tensors is served merged, as its own model (--model ADAPTER)",
            file.display()
        );
    }
    let mut out = Vec::with_capacity(plan.merged.len());
    let mut weights: Vec<_> = plan.merged.iter().collect();
    weights.sort_by(|a, b| a.0.cmp(b.0));
    for (weight, pair) in weights {
        let place = projection_of(weight).filter(|_| !pair.embedding).with_context(|| {
            format!(
                "{}: `{weight}` is adapted; served unmerged, an adapter adapts the layers' linear projections \
                 only (serve this one merged: --model ADAPTER)",
                file.display()
            )
        })?;
        let mut tensor = |key: &str| -> Result<(Vec<f32>, Vec<usize>)> {
            let view = st.tensor(key)?;
            let shape = view.shape().to_vec();
            Ok((to_f32(&view).with_context(|| format!("{}: tensor `{key}`", file.display()))?, shape))
        };
        let ((a, a_shape), (mut b, b_shape)) = (tensor(&pair.a)?, tensor(&pair.b)?);
        b.iter_mut().for_each(|v| *v *= pair.scale);
        let ((r, k), (n, _)) = ((a_shape[0], a_shape[1]), (b_shape[0], b_shape[1]));
        let pair = match form {
            Form::Tensors => Pair::Tensors {
                at: Tensor::from_vec(a, (r, k), &Device::Cpu)?.t()?.contiguous()?,
                bt: Tensor::from_vec(b, (n, r), &Device::Cpu)?.t()?.contiguous()?,
            },
            Form::HostBf16 | Form::HostF32 => host_pair(form, a, b, r),
        };
        out.push((place, pair));
    }
    Ok(out)
}

/// `A` `[r, in]` and `s·B` `[out, r]` in a host form: rounded to bf16 as they are, or f32 with
/// `s·B` transposed.
fn host_pair(form: Form, a: Vec<f32>, b: Vec<f32>, r: usize) -> Pair {
    if form == Form::HostBf16 {
        let bf16 = |v: &[f32]| -> Vec<u16> { v.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect() };
        return Pair::Host {
            a16: bf16(&a),
            b16: bf16(&b),
            a: Vec::new(),
            bt: Vec::new(),
            r,
        };
    }
    let n = b.len() / r.max(1);
    let mut bt = vec![0f32; r * n];
    for (o, row) in b.chunks_exact(r).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            bt[j * n + o] = v;
        }
    }
    Pair::Host {
        a,
        bt,
        a16: Vec::new(),
        b16: Vec::new(),
        r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_join_neighbours_of_one_adapter() {
        let mut runs = Vec::new();
        push_runs(&mut runs, 0, 3, 1, &[Some(1), Some(1), None]);
        push_runs(&mut runs, 3, 1, 4, &[None]);
        push_runs(&mut runs, 7, 2, 2, &[]);
        push_runs(&mut runs, 11, 1, 5, &[Some(0)]);
        let want = [(0, 2, Some(1)), (2, 9, None), (11, 5, Some(0))];
        let got: Vec<_> = runs.iter().map(|r| (r.start, r.len, r.adapter)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn projections_are_found_by_their_weights_names() {
        assert_eq!(projection_of("model.layers.3.mlp.up_proj.weight"), Some((3, Proj::Up as usize)));
        assert_eq!(projection_of("model.layers.0.self_attn.o_proj.weight"), Some((0, Proj::O as usize)));
        assert_eq!(projection_of("model.embed_tokens.weight"), None);
        assert_eq!(projection_of("model.layers.x.mlp.up_proj.weight"), None);
    }
}
