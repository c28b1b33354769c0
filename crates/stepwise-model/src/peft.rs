//! PEFT LoRA adapter folders read as models: `adapter_config.json` and
//! `adapter_model.safetensors` without a model of their own, as `PeftModel.save_pretrained`,
//! TRL with a `peft_config` and the Hub's adapter repositories hold them. Every command and the
//! Python API take such a folder (or its model id) wherever they take a model: it is merged onto
//! its base (`base_model_name_or_path`, a folder or a model id) once, `W + s·B·A` in f32 with
//! PEFT's scale (`s = α/r`, `α/√r` with `use_rslora`, `rank_pattern` and `alpha_pattern` per
//! module), rounded to the base's dtype, and the merged model is kept in stepwise's cache
//! ([`cache_root`]) under a name of the adapter's and the base's contents, so a second run reads
//! it straight away and a changed adapter or base is merged again.
//!
//! `modules_to_save` (a classifier's `score`, or any whole module) and a trained `bias` replace
//! the base's tensors; a `score` the base lacks makes the model a classifier as the adapter's
//! `task_type` says (`SEQ_CLS`: `*ForSequenceClassification`, `TOKEN_CLS`:
//! `*ForTokenClassification`, with the head's rows as its labels), the base's LM head left out.
//! What cannot be merged into a plain model is refused, naming the field: another PEFT method,
//! DoRA, LoRA biases, `fan_in_fan_out`, a tensor that fits no base weight.

use crate::checkpoint::{to_f32, weight_files, Mapped};
use crate::config::{HeadKind, ModelConfig};
use anyhow::{bail, ensure, Context, Result};
use safetensors::tensor::{Dtype, TensorView, View};
use safetensors::SafeTensors;
use serde_json::Value;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hasher;
use std::path::{Path, PathBuf};

/// What the adapter in `dir` names as its base (`base_model_name_or_path`: a folder or a model
/// id), its settings checked.
pub fn base_model(dir: &Path) -> Result<String> {
    Ok(AdapterConfig::read(dir)?.base)
}

/// The adapter's settings file.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// The adapter's weights.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
/// Where PEFT's saved keys start.
const PREFIX: &str = "base_model.model.";
/// Bumped when the merge changes, so that models merged before are merged again.
const FORMAT: u64 = 1;

/// Whether a folder holds a PEFT adapter and no model weights of its own (a folder with both, as
/// `stepwise train-prm --lora-rank` writes it, is its merged model already; a `config.json`
/// beside an adapter, as some adapter repositories carry their base's, does not make a model).
pub use stepwise_text::hub::is_adapter;

/// Stepwise's cache folder: `$STEPWISE_CACHE`, else `$XDG_CACHE_HOME/stepwise`, else
/// `~/.cache/stepwise`.
pub fn cache_root() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("STEPWISE_CACHE")
        .or_else(|| var("XDG_CACHE_HOME").map(|c| c.join("stepwise")))
        .or_else(|| var("HOME").map(|h| h.join(".cache").join("stepwise")))
}

/// `dir` itself, or for an adapter folder ([`is_adapter`]) its merged model, made the first
/// time in [`cache_root`]`/merged/`; `resolve_base` finds the base that the adapter names.
pub fn resolve(dir: PathBuf, resolve_base: impl Fn(&str) -> Result<PathBuf>) -> Result<PathBuf> {
    if !is_adapter(&dir) {
        return Ok(dir);
    }
    let root = cache_root().context("no cache folder for the merged model: set STEPWISE_CACHE")?;
    resolve_in(dir, resolve_base, &root)
}

/// [`resolve`] with the merged models kept in `root/merged/` (found again there, its last use
/// recorded; with `$STEPWISE_CACHE_MAX_GB` set, the least recently used others removed past it).
pub fn resolve_in(dir: PathBuf, resolve_base: impl Fn(&str) -> Result<PathBuf>, root: &Path) -> Result<PathBuf> {
    if !is_adapter(&dir) {
        return Ok(dir);
    }
    let config = AdapterConfig::read(&dir)?;
    let base = base_of(&dir, &config, resolve_base)?;
    let name = format!("{}-{}", folder_name(&dir), fingerprint(&dir, &base)?);
    let merged = root.join("merged");
    let out = merged.join(&name);
    if out.join("config.json").is_file() {
        crate::merged_cache::touch(&out);
        return Ok(out);
    }
    eprintln!(
        "{}: merging the LoRA adapter onto {} into {}",
        dir.display(),
        base.display(),
        out.display()
    );
    let limit = crate::merged_cache::limit_from_env()?;
    merge_staged(&dir, &config, &base, &out)?;
    if let Some(limit) = limit {
        let prune = crate::merged_cache::Prune::to_size(limit, &name);
        match crate::merged_cache::prune(root, &prune) {
            Ok(removed) => removed.iter().for_each(|m| eprintln!("STEPWISE_CACHE_MAX_GB: removed {}", m.path.display())),
            Err(e) => eprintln!("STEPWISE_CACHE_MAX_GB: {e:#}"),
        }
    }
    Ok(out)
}

/// The adapter in `dir` merged onto `base` (else the base its `adapter_config.json` names, found
/// by `resolve_base`) into the new folder `out`: PEFT's `merge_and_unload` and `save_pretrained`,
/// for a model to hand to tools that read no adapters, or an adapter whose base was a folder on
/// another machine. Refused when `out` exists.
pub fn merge_to(
    dir: &Path,
    base: Option<&Path>,
    resolve_base: impl Fn(&str) -> Result<PathBuf>,
    out: &Path,
) -> Result<()> {
    ensure!(
        is_adapter(dir),
        "{}: not a PEFT adapter (no {ADAPTER_CONFIG}, or model weights of its own)",
        dir.display()
    );
    ensure!(!out.exists(), "{}: already exists (the merged model is written to a new folder)", out.display());
    let config = AdapterConfig::read(dir)?;
    let base = match base {
        Some(base) => base.to_path_buf(),
        None => base_of(dir, &config, resolve_base)?,
    };
    ensure!(!is_adapter(&base), "{}: an adapter, not a model to merge onto", base.display());
    merge_staged(dir, &config, &base, out)
}

/// The base model the adapter's `base_model_name_or_path` names: a folder (relative to the
/// current folder, then the adapter's), else what `resolve_base` finds for it.
fn base_of(dir: &Path, config: &AdapterConfig, resolve_base: impl Fn(&str) -> Result<PathBuf>) -> Result<PathBuf> {
    let base = match dir.join(&config.base) {
        _ if Path::new(&config.base).exists() => PathBuf::from(&config.base),
        beside if Path::new(&config.base).is_relative() && beside.exists() => beside,
        _ => resolve_base(&config.base).with_context(|| {
            format!(
                "{}: the base model `{}` (field `base_model_name_or_path`) is neither a folder nor a model id \
                 stepwise can find (`stepwise merge ADAPTER --base MODEL --out DIR` merges it onto another)",
                dir.join(ADAPTER_CONFIG).display(),
                config.base
            )
        })?,
    };
    ensure!(
        !is_adapter(&base),
        "{}: the base `{}` is an adapter itself (stepwise merges one adapter onto a model)",
        dir.join(ADAPTER_CONFIG).display(),
        base.display()
    );
    Ok(base)
}

/// [`merge`] into a hidden folder beside `out`, with its record, renamed into place when whole
/// (a merge cut off leaves no `out`; another process that made the same `out` meanwhile wins).
fn merge_staged(dir: &Path, config: &AdapterConfig, base: &Path, out: &Path) -> Result<()> {
    let name = out.file_name().context("the merged model's folder has a name")?.to_string_lossy();
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    crate::merged_cache::remove_abandoned(parent, &name);
    let staging = parent.join(format!(".{name}.partial-{}", std::process::id()));
    std::fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    let made = merge(dir, config, base, &staging)
        .and_then(|()| crate::merged_cache::record(&staging, dir, base, &config.base));
    if let Err(e) = made {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    if std::fs::rename(&staging, out).is_err() && out.join("config.json").is_file() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    ensure!(out.join("config.json").is_file(), "could not move the merged model into {}", out.display());
    Ok(())
}

/// The folder's last name, kept to letters, digits, `-`, `_` and `.`.
fn folder_name(dir: &Path) -> String {
    let canonical = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let name: String = canonical
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' })
        .take(64)
        .collect();
    if name.is_empty() {
        "adapter".into()
    } else {
        name
    }
}

/// The adapter's settings and weights with the base's fingerprint: the merged model's name.
fn fingerprint(dir: &Path, base: &Path) -> Result<String> {
    let mut h = twox_hash::XxHash64::with_seed(FORMAT);
    for f in [ADAPTER_CONFIG, ADAPTER_WEIGHTS] {
        let path = dir.join(f);
        h.write(&std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?);
    }
    h.write(crate::checkpoint::checkpoint_fingerprint(base)?.as_bytes());
    Ok(format!("{:016x}", h.finish()))
}

/// What `adapter_config.json` says that the merge needs.
pub(crate) struct AdapterConfig {
    pub(crate) base: String,
    rank: f64,
    alpha: f64,
    rslora: bool,
    rank_pattern: BTreeMap<String, f64>,
    alpha_pattern: BTreeMap<String, f64>,
    task: Option<String>,
}

impl AdapterConfig {
    /// The settings of the adapter in `dir`, refusing what cannot be merged into a plain model.
    pub(crate) fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(ADAPTER_CONFIG);
        let text = stepwise_core::io::read_regular_file(&path)?;
        let v: Value = serde_json::from_str(&text).with_context(|| format!("{}: invalid JSON", path.display()))?;
        let at = |field: &str| format!("{}: field `{field}`", path.display());
        let peft_type = v.get("peft_type").and_then(Value::as_str).unwrap_or("");
        ensure!(
            peft_type == "LORA",
            "{}: `{peft_type}` (stepwise reads LoRA adapters)",
            at("peft_type")
        );
        for (field, what) in [
            ("use_dora", "DoRA's magnitudes"),
            ("lora_bias", "LoRA's own biases"),
            ("fan_in_fan_out", "weights stored transposed (GPT-2's Conv1D)"),
        ] {
            ensure!(
                !v.get(field).and_then(Value::as_bool).unwrap_or(false),
                "{}: true ({what} are not supported)",
                at(field)
            );
        }
        let number = |field: &str| -> Result<f64> {
            v.get(field)
                .and_then(Value::as_f64)
                .filter(|x| x.is_finite() && *x > 0.0)
                .with_context(|| format!("{}: a positive number is needed", at(field)))
        };
        let pattern = |field: &str| -> Result<BTreeMap<String, f64>> {
            let Some(map) = v.get(field).and_then(Value::as_object) else {
                return Ok(BTreeMap::new());
            };
            map.iter()
                .map(|(k, x)| {
                    let x = x.as_f64().filter(|x| x.is_finite() && *x > 0.0);
                    Ok((k.clone(), x.with_context(|| format!("{}[{k:?}]: not a positive number", at(field)))?))
                })
                .collect()
        };
        Ok(AdapterConfig {
            base: v
                .get("base_model_name_or_path")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .with_context(|| format!("{}: the base model is needed", at("base_model_name_or_path")))?
                .to_string(),
            rank: number("r")?,
            alpha: number("lora_alpha")?,
            rslora: v.get("use_rslora").and_then(Value::as_bool).unwrap_or(false),
            rank_pattern: pattern("rank_pattern")?,
            alpha_pattern: pattern("alpha_pattern")?,
            task: v.get("task_type").and_then(Value::as_str).map(str::to_string),
        })
    }

    /// The rank and scale of the adapter on `module` (PEFT's: a pattern key names the module
    /// or its last dotted parts).
    fn scale(&self, module: &str) -> (f64, f64) {
        let pick = |map: &BTreeMap<String, f64>, default: f64| {
            map.iter()
                .find(|(k, _)| module == k.as_str() || module.ends_with(&format!(".{k}")))
                .map_or(default, |(_, &x)| x)
        };
        let (r, alpha) = (pick(&self.rank_pattern, self.rank), pick(&self.alpha_pattern, self.alpha));
        (r, if self.rslora { alpha / r.sqrt() } else { alpha / r })
    }
}

/// One LoRA pair of the adapter, on a base weight.
pub(crate) struct Pair {
    pub(crate) a: String,
    pub(crate) b: String,
    pub(crate) scale: f32,
    /// An embedding's (`lora_embedding_A` `[r, vocab]`, `lora_embedding_B` `[dim, r]`).
    pub(crate) embedding: bool,
}

/// What the adapter does to the base's tensors, by base tensor name.
#[derive(Default)]
pub(crate) struct Plan {
    pub(crate) merged: HashMap<String, Pair>,
    /// Whole tensors (`modules_to_save`, trained biases): base name to adapter key.
    pub(crate) replaced: BTreeMap<String, String>,
}

impl Plan {
    /// The plan of the adapter `file`'s tensors (`adapter`, their shapes by name) against the
    /// base's `shapes`.
    pub(crate) fn new(
        cfg: &AdapterConfig,
        adapter: &HashMap<String, Vec<usize>>,
        file: &Path,
        shapes: &HashMap<String, Vec<usize>>,
    ) -> Result<Self> {
        let mut plan = Plan::default();
        let present: std::collections::HashSet<&str> = adapter.keys().map(String::as_str).collect();
        let mut names: Vec<String> = present.iter().map(|n| n.to_string()).collect();
        names.sort();
        for key in &names {
            let at = || format!("{}: tensor `{key}`", file.display());
            let path = key.strip_prefix(PREFIX).with_context(|| format!("{}: not under `{PREFIX}`", at()))?;
            let (module, half, embedding) = match lora_part(path) {
                Some(found) => found,
                None => {
                    plan.replaced.insert(path.to_string(), key.clone());
                    continue;
                }
            };
            if half == 'B' {
                let a = key.replace("lora_B", "lora_A").replace("lora_embedding_B", "lora_embedding_A");
                ensure!(present.contains(a.as_str()), "{}: its `A` ({a}) is missing", at());
                continue;
            }
            let (b_part, weight) = match embedding {
                true => ("lora_embedding_B", format!("{module}.weight")),
                false => ("lora_B.weight", format!("{module}.weight")),
            };
            let b = format!("{PREFIX}{module}.{b_part}");
            ensure!(present.contains(b.as_str()), "{}: its `B` ({b}) is missing", at());
            let w = shapes
                .get(&weight)
                .with_context(|| format!("{}: the base model has no `{weight}` to adapt", at()))?;
            ensure!(w.len() == 2, "{}: `{weight}` {w:?} is not a matrix", at());
            let (r, scale) = cfg.scale(module);
            let (a_shape, b_shape) = (adapter[key].clone(), adapter[&b].clone());
            let want = match embedding {
                true => (vec![r as usize, w[0]], vec![w[1], r as usize]),
                false => (vec![r as usize, w[1]], vec![w[0], r as usize]),
            };
            ensure!(
                (a_shape.clone(), b_shape.clone()) == want,
                "{}: A {a_shape:?} and B {b_shape:?} do not make a rank-{r} update of `{weight}` {w:?}",
                at()
            );
            let pair = Pair {
                a: key.clone(),
                b,
                scale: scale as f32,
                embedding,
            };
            plan.merged.insert(weight, pair);
        }
        for (name, key) in &plan.replaced {
            let shape = &adapter[key];
            match shapes.get(name) {
                Some(w) => ensure!(
                    w == shape,
                    "{}: tensor `{key}` {shape:?} replaces `{name}` {w:?} of another shape",
                    file.display()
                ),
                // A classifier's new head (`modules_to_save=["score"]` on a causal LM).
                None => ensure!(
                    name.starts_with("score."),
                    "{}: tensor `{key}`: the base model has no `{name}`",
                    file.display()
                ),
            }
        }
        Ok(plan)
    }

    /// The head tensors the adapter brings that the base lacks.
    fn added<'p>(&'p self, shapes: &HashMap<String, Vec<usize>>) -> Vec<(&'p String, &'p String)> {
        self.replaced.iter().filter(|(name, _)| !shapes.contains_key(*name)).collect()
    }
}

/// `(module, 'A' | 'B', embedding)` of a LoRA key's path (`….q_proj.lora_A.weight`,
/// `….embed_tokens.lora_embedding_A`), or `None` for a whole tensor.
fn lora_part(path: &str) -> Option<(&str, char, bool)> {
    for (suffix, half, embedding) in [
        (".lora_A.weight", 'A', false),
        (".lora_B.weight", 'B', false),
        (".lora_embedding_A", 'A', true),
        (".lora_embedding_B", 'B', true),
    ] {
        if let Some(module) = path.strip_suffix(suffix) {
            return Some((module, half, embedding));
        }
    }
    None
}

/// A tensor of the merged model, its bytes made when written (one at a time: the base is never
/// held whole in memory).
struct Lazy<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    len: usize,
    make: Box<dyn Fn() -> Vec<u8> + 'a>,
}

impl View for Lazy<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned((self.make)())
    }
    fn data_len(&self) -> usize {
        self.len
    }
}

/// A tensor view as it is (its pages of `map` let go once copied).
fn as_is<'a>(view: TensorView<'a>, map: &'a Mapped) -> Lazy<'a> {
    Lazy {
        dtype: view.dtype(),
        shape: view.shape().to_vec(),
        len: view.data().len(),
        make: Box::new(move || {
            let bytes = view.data().to_vec();
            map.let_go(view.data());
            bytes
        }),
    }
}

/// `w + scale·B·A` (an embedding's: `+ scale·(B·A)ᵀ`) in f32, stored as `w` is (shapes
/// checked by [`Plan::new`]).
fn merged<'a>(w: TensorView<'a>, a: TensorView<'a>, b: TensorView<'a>, pair: &Pair, map: &'a Mapped) -> Result<Lazy<'a>> {
    for (what, v) in [("weight", &w), ("A", &a), ("B", &b)] {
        ensure!(
            matches!(v.dtype(), Dtype::F32 | Dtype::BF16 | Dtype::F16 | Dtype::F64),
            "the {what} is {:?}: a LoRA update is made of floats",
            v.dtype()
        );
    }
    let (scale, embedding) = (pair.scale, pair.embedding);
    let (dtype, shape, len) = (w.dtype(), w.shape().to_vec(), w.data().len());
    let (rows, cols) = (shape[0], shape[1]);
    let make = move || {
        let (a16, b16) = (floats(&a), floats(&b));
        let mut sum = floats(&w);
        map.let_go(w.data());
        let r = a.shape()[0];
        match embedding {
            // W[v, :] += s·Σ_j A[j, v]·Bᵀ[j, :]
            false => add_rows(&mut sum, cols, r, |i, j| scale * b16[i * r + j], &a16),
            true => {
                let vocab = rows;
                let bt: Vec<f32> = (0..r).flat_map(|j| (0..cols).map(move |d| (j, d))).map(|(j, d)| b16[d * r + j]).collect();
                add_rows(&mut sum, cols, r, |v, j| scale * a16[j * vocab + v], &bt)
            }
        }
        crate::checkpoint::encode_floats(&sum, dtype)
    };
    Ok(Lazy {
        dtype,
        shape,
        len,
        make: Box::new(make),
    })
}

/// A float tensor's values as f32 (its dtype checked before).
fn floats(v: &TensorView) -> Vec<f32> {
    to_f32(v).unwrap_or_default()
}

/// `sum[i, :] += Σ_j c(i, j)·rows[j, :]` for the `r` rows of `rows` (`cols` wide), blocks of
/// `sum`'s rows shared out over the threads, each in the engine's vector kernels (four of
/// `rows` a pass over a row of `sum`).
fn add_rows(sum: &mut [f32], cols: usize, r: usize, c: impl Fn(usize, usize) -> f32 + Sync, rows: &[f32]) {
    use rayon::prelude::*;
    const ROWS: usize = 64;
    sum.par_chunks_mut(cols * ROWS).enumerate().for_each(|(block, out)| {
        crate::kernels::simd::dispatch(RankUpdate {
            out,
            first: block * ROWS,
            cols,
            r,
            c: &c,
            rows,
        })
    });
}

/// [`add_rows`] on the rows of `sum` from `first`.
struct RankUpdate<'a, C> {
    out: &'a mut [f32],
    first: usize,
    cols: usize,
    r: usize,
    c: &'a C,
    rows: &'a [f32],
}

impl<C: Fn(usize, usize) -> f32> crate::kernels::simd::Kernel for RankUpdate<'_, C> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        use crate::kernels::simd::{axpy, axpy4};
        let (cols, rows) = (self.cols, self.rows);
        let row = |j: usize| &rows[j * cols..(j + 1) * cols];
        for (k, out) in self.out.chunks_exact_mut(cols).enumerate() {
            let i = self.first + k;
            let mut j = 0;
            while j + 4 <= self.r {
                let a = [0, 1, 2, 3].map(|d| (self.c)(i, j + d));
                axpy4::<FMA>(a, [row(j), row(j + 1), row(j + 2), row(j + 3)], out);
                j += 4;
            }
            for j in j..self.r {
                axpy::<FMA>((self.c)(i, j), row(j), out);
            }
        }
    }
}

/// The adapter in `dir` (settings `cfg`) merged onto the model in `base`, written into `out`:
/// the base's shards by the same names, a new head in the last, the configuration, and the
/// base's other files with the adapter folder's over them (its tokenizer, chat template).
fn merge(dir: &Path, cfg: &AdapterConfig, base: &Path, out: &Path) -> Result<()> {
    let adapter_file = dir.join(ADAPTER_WEIGHTS);
    ensure!(
        adapter_file.is_file(),
        "{}: missing (stepwise reads an adapter's weights as safetensors, not adapter_model.bin)",
        adapter_file.display()
    );
    let adapter_map = Mapped::open(&adapter_file)?;
    let adapter =
        SafeTensors::deserialize(&adapter_map).with_context(|| format!("reading {}", adapter_file.display()))?;
    let files = weight_files(base)?;
    let maps = files.iter().map(|f| Mapped::open(f)).collect::<Result<Vec<_>>>()?;
    let shards = maps
        .iter()
        .zip(&files)
        .map(|(m, f)| SafeTensors::deserialize(m).with_context(|| format!("reading {}", f.display())))
        .collect::<Result<Vec<_>>>()?;
    let shapes: HashMap<String, Vec<usize>> = shards
        .iter()
        .flat_map(|s| s.tensors())
        .map(|(name, view)| (name, view.shape().to_vec()))
        .collect();
    let adapter_shapes = adapter
        .tensors()
        .into_iter()
        .map(|(name, view)| (name, view.shape().to_vec()))
        .collect();
    let plan = Plan::new(cfg, &adapter_shapes, &adapter_file, &shapes)?;
    let (config, new_head) = merged_config(base, cfg, &plan, &adapter, &shapes)?;
    let mut weight_map = BTreeMap::new();
    for (k, (file, shard)) in files.iter().zip(&shards).enumerate() {
        let name = file.file_name().context("a shard has a file name")?.to_string_lossy().into_owned();
        let mut tensors = Vec::new();
        for (tensor, view) in shard.tensors() {
            if new_head && tensor == "lm_head.weight" {
                continue;
            }
            let lazy = match (plan.merged.get(&tensor), plan.replaced.get(&tensor)) {
                (Some(pair), _) => merged(view, adapter.tensor(&pair.a)?, adapter.tensor(&pair.b)?, pair, &maps[k])?,
                (None, Some(key)) => as_is(adapter.tensor(key)?, &adapter_map),
                (None, None) => as_is(view, &maps[k]),
            };
            weight_map.insert(tensor.clone(), name.clone());
            tensors.push((tensor, lazy));
        }
        if k + 1 == files.len() {
            for (tensor, key) in plan.added(&shapes) {
                weight_map.insert(tensor.clone(), name.clone());
                tensors.push((tensor.clone(), as_is(adapter.tensor(key)?, &adapter_map)));
            }
        }
        let metadata: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
        let path = out.join(&name);
        safetensors::serialize_to_file(tensors, Some(metadata), &path)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    // The base's layout: one `model.safetensors`, or shards named by an index (even of one).
    if !(files.len() == 1 && files[0].ends_with("model.safetensors")) {
        let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
        std::fs::write(out.join("model.safetensors.index.json"), serde_json::to_string_pretty(&index)?)?;
    }
    std::fs::write(out.join("config.json"), serde_json::to_string_pretty(&config)?)?;
    for from in [base, dir] {
        copy_side_files(from, out)?;
    }
    Ok(())
}

/// The base's `config.json`, made a classifier's where the adapter brings a `score` head the
/// base lacks (`task_type` says which); and whether it did (the LM head is then left out).
fn merged_config(
    base: &Path,
    cfg: &AdapterConfig,
    plan: &Plan,
    adapter: &SafeTensors,
    shapes: &HashMap<String, Vec<usize>>,
) -> Result<(Value, bool)> {
    let path = base.join("config.json");
    let mut v: Value = serde_json::from_str(&stepwise_core::io::read_regular_file(&path)?)
        .with_context(|| format!("{}: invalid JSON", path.display()))?;
    let Some((_, key)) = plan.added(shapes).into_iter().find(|(name, _)| name.as_str() == "score.weight") else {
        return Ok((v, false));
    };
    let head = match cfg.task.as_deref() {
        Some("SEQ_CLS") => HeadKind::SequenceClassification,
        Some("TOKEN_CLS") => HeadKind::TokenClassification,
        other => bail!(
            "{ADAPTER_CONFIG}: field `task_type` is {other:?}, but the adapter brings a `score` head: SEQ_CLS or \
             TOKEN_CLS says how it reads"
        ),
    };
    let mut config = ModelConfig::from_json(&v).with_context(|| format!("{}", path.display()))?;
    let shape = adapter.tensor(key)?.shape().to_vec();
    ensure!(
        shape.len() == 2 && shape[0] >= 1 && shape[1] == config.hidden_size,
        "{ADAPTER_CONFIG}: the head `{key}` {shape:?} is not [labels, {}]",
        config.hidden_size
    );
    config = config.with_head(head);
    config.num_labels = shape[0];
    let hf = config.to_hf_json();
    for field in ["architectures", "num_labels", "id2label", "label2id", "tie_word_embeddings", "pad_token_id"] {
        if let Some(x) = hf.get(field) {
            v[field] = x.clone();
        }
    }
    Ok((v, true))
}

/// The top-level files of `from` that a model folder holds besides its weights and
/// configuration (tokenizer, chat template, generation settings), copied into `to`.
fn copy_side_files(from: &Path, to: &Path) -> Result<()> {
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let side = stepwise_text::hub::wanted(&name)
            && !name.ends_with(".safetensors")
            && !name.starts_with("adapter_")
            && !["config.json", "model.safetensors.index.json", crate::merged_cache::RECORD].contains(&name.as_str());
        if side && entry.path().is_file() {
            std::fs::copy(entry.path(), to.join(&name))
                .with_context(|| format!("copying {} into {}", entry.path().display(), to.display()))?;
        }
    }
    Ok(())
}
