//! PEFT LoRA adapter folders read as models (`src/peft.rs`): the merge is `W + s·B·A` with
//! PEFT's scales, a classifier's new head turns the causal LM into the classifier its task type
//! names, the merged model is kept and found again, and what cannot be merged is refused by
//! name. (PEFT itself, as pip installs it, writes the adapters of python/tests/test_peft_lora.py.)

mod common;

use common::{fixtures, lm_examples};
use safetensors::tensor::{Dtype, TensorView};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use stepwise_model::packed_engine::{Cpu, LoraConfig, PackedTrainer, Targets};
use stepwise_model::peft::{is_adapter, resolve_in};
use stepwise_model::train::packed::TokenBatch;
use stepwise_model::train::Objective;
use stepwise_model::{HeadKind, ModelConfig};

fn policy() -> PathBuf {
    fixtures().join("qwen2-policy")
}

/// A tensor's shape and values.
type Shaped = (Vec<usize>, Vec<f32>);

/// Every tensor of the folder's weights, as f32, with its shape.
fn tensors(dir: &Path) -> HashMap<String, Shaped> {
    tensors_of(&dir.join("model.safetensors"))
}

/// Every tensor of a safetensors file, as f32, with its shape.
fn tensors_of(file: &Path) -> HashMap<String, Shaped> {
    let bytes = std::fs::read(file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, v)| {
            let values = match v.dtype() {
                Dtype::F32 => v
                    .data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
                Dtype::BF16 => v
                    .data()
                    .chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                other => panic!("{other:?}"),
            };
            (name, (v.shape().to_vec(), values))
        })
        .collect()
}

/// An adapter folder on the fixture policy: `config` (merged over LoRA defaults) and f32 `tensors`.
fn adapter(dir: &Path, config: serde_json::Value, tensors: &[(&str, Vec<usize>, Vec<f32>)]) {
    common::write_adapter(dir, &policy(), config, tensors)
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

/// `w + s·B·A` in f64.
fn expected(w: &[f32], a: &[f32], b: &[f32], (n, r, k): (usize, usize, usize), s: f64) -> Vec<f64> {
    (0..n * k)
        .map(|ij| {
            let (i, j) = (ij / k, ij % k);
            w[ij] as f64 + s * (0..r).map(|l| b[i * r + l] as f64 * a[l * k + j] as f64).sum::<f64>()
        })
        .collect()
}

fn no_base(id: &str) -> anyhow::Result<PathBuf> {
    anyhow::bail!("{id}: not found")
}

/// Two LoRA pairs (one with its own rank and alpha by `rank_pattern`/`alpha_pattern`, rsLoRA's
/// scale), an embedding's pair, and a new `score` head with its bias (PEFT's TOKEN_CLS
/// `modules_to_save`): the merged folder is a token classifier whose weights are the base's
/// with these updates, every other tensor as it was; a second call finds it again.
#[test]
fn an_adapter_merges_onto_its_base_with_peft_scales() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("my-prm-adapter");
    let (q, down) = ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj");
    adapter(
        &dir,
        serde_json::json!({"use_rslora": true, "rank_pattern": {"down_proj": 3}, "alpha_pattern": {"layers.1.mlp.down_proj": 6},
            "task_type": "TOKEN_CLS", "modules_to_save": ["score"]}),
        &[
            (&format!("{q}.lora_A.weight"), vec![2, 64], values(128, 1)),
            (&format!("{q}.lora_B.weight"), vec![64, 2], values(128, 2)),
            (&format!("{down}.lora_A.weight"), vec![3, 160], values(480, 3)),
            (&format!("{down}.lora_B.weight"), vec![64, 3], values(192, 4)),
            ("model.embed_tokens.lora_embedding_A", vec![2, 601], values(1202, 5)),
            ("model.embed_tokens.lora_embedding_B", vec![64, 2], values(128, 6)),
            ("score.weight", vec![2, 64], values(128, 7)),
            ("score.bias", vec![2], vec![0.25, -0.5]),
        ],
    );
    // Some adapter repositories carry their base's config.json: still an adapter.
    std::fs::copy(policy().join("config.json"), dir.join("config.json")).unwrap();
    assert!(is_adapter(&dir));
    let cache = tmp.path().join("cache");
    let merged = resolve_in(dir.clone(), no_base, &cache).unwrap();
    assert!(merged.starts_with(cache.join("merged")) && !is_adapter(&merged));
    assert!(merged
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("my-prm-adapter-"));
    let config = ModelConfig::from_dir(&merged).unwrap();
    assert_eq!((config.head, config.num_labels), (HeadKind::TokenClassification, 2));
    assert!(merged.join("tokenizer.json").is_file());

    let (base, got) = (tensors(&policy()), tensors(&merged));
    let w = |name: &str| &base[&format!("{name}.weight")].1;
    let close = |got: &[f32], want: &[f64]| got.iter().zip(want).all(|(&g, &w)| (g as f64 - w).abs() < 1e-5);
    let want_q = expected(w(q), &values(128, 1), &values(128, 2), (64, 2, 64), 8.0 / 2f64.sqrt());
    assert!(close(&got[&format!("{q}.weight")].1, &want_q));
    let want_down = expected(
        w(down),
        &values(480, 3),
        &values(192, 4),
        (64, 3, 160),
        6.0 / 3f64.sqrt(),
    );
    assert!(close(&got[&format!("{down}.weight")].1, &want_down));
    // An embedding's update is (B·A)ᵀ: [601, 64] from B [64, 2] and A [2, 601].
    let (ea, eb) = (values(1202, 5), values(128, 6));
    let embed = &got["model.embed_tokens.weight"].1;
    let want = w("model.embed_tokens")[7 * 64 + 3] as f64
        + 8.0 / 2f64.sqrt()
            * (0..2)
                .map(|l| eb[3 * 2 + l] as f64 * ea[l * 601 + 7] as f64)
                .sum::<f64>();
    assert!((embed[7 * 64 + 3] as f64 - want).abs() < 1e-5);
    assert_eq!(got["score.bias"].1, vec![0.25, -0.5]);
    assert!(!got.contains_key("lm_head.weight"));
    for (name, (shape, v)) in &base {
        if ![q, down, "model.embed_tokens"].iter().any(|m| name.starts_with(m)) {
            assert_eq!(&got[name], &(shape.clone(), v.clone()), "{name}");
        }
    }
    // Found again, not merged again.
    let written = std::fs::metadata(merged.join("model.safetensors"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(resolve_in(dir.clone(), no_base, &cache).unwrap(), merged);
    assert_eq!(
        std::fs::metadata(merged.join("model.safetensors"))
            .unwrap()
            .modified()
            .unwrap(),
        written
    );
    // A merge killed part-way (its process gone) is cleared away by the next.
    let stale = cache.join("merged").join(format!(
        ".{}.partial-4000000",
        merged.file_name().unwrap().to_string_lossy()
    ));
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::remove_dir_all(&merged).unwrap();
    assert_eq!(resolve_in(dir.clone(), no_base, &cache).unwrap(), merged);
    assert!(!stale.exists() && merged.join("config.json").is_file());
    // And it scores as any token classifier does.
    let model = stepwise_model::Model::load(&merged, &candle_core::Device::Cpu).unwrap();
    assert_eq!(model.config.num_labels, 2);
}

/// `policy()` laid out in `n` shards named by an index, in `dir`.
fn shard(dir: &Path, n: usize) {
    std::fs::create_dir_all(dir).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(policy().join(f), dir.join(f)).unwrap();
    }
    let mut all: Vec<(String, Shaped)> = tensors(&policy()).into_iter().collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let mut map = serde_json::Map::new();
    for (k, part) in all.chunks(all.len().div_ceil(n)).enumerate() {
        let file = format!("model-{:05}-of-{n:05}.safetensors", k + 1);
        let bytes: Vec<Vec<u8>> = part
            .iter()
            .map(|t| t.1 .1.iter().flat_map(|x| x.to_le_bytes()).collect())
            .collect();
        let views: Vec<(String, TensorView)> = part
            .iter()
            .zip(&bytes)
            .map(|(t, b)| (t.0.clone(), TensorView::new(Dtype::F32, t.1 .0.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join(&file)).unwrap();
        for t in part {
            map.insert(t.0.clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

/// A base in shards named by an index (as most Hub models are; one shard too) merges shard by
/// shard into the same layout, to the weights the single-file base gives.
#[test]
fn a_sharded_base_merges_into_the_same_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let (q, down) = ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj");
    let lora = [
        (format!("{q}.lora_A.weight"), vec![2, 64], values(128, 1)),
        (format!("{q}.lora_B.weight"), vec![64, 2], values(128, 2)),
        (format!("{down}.lora_A.weight"), vec![2, 160], values(320, 3)),
        (format!("{down}.lora_B.weight"), vec![64, 2], values(128, 4)),
    ];
    let lora: Vec<(&str, Vec<usize>, Vec<f32>)> = lora
        .iter()
        .map(|(n, s, v)| (n.as_str(), s.clone(), v.clone()))
        .collect();
    let cache = tmp.path().join("cache");
    let merge = |name: &str, base: &Path| {
        adapter(
            &tmp.path().join(name),
            serde_json::json!({"base_model_name_or_path": base}),
            &lora,
        );
        resolve_in(tmp.path().join(name), no_base, &cache).unwrap()
    };
    let read = |dir: &Path| -> HashMap<String, Shaped> {
        let files = stepwise_model::checkpoint::weight_files(dir).unwrap();
        files.iter().flat_map(|f| tensors_of(f)).collect()
    };
    let on_one = read(&merge("on-one", &policy()));
    assert_ne!(
        on_one[&format!("{down}.weight")],
        tensors(&policy())[&format!("{down}.weight")]
    );
    for n in [1, 2] {
        let base = tmp.path().join(format!("shards-{n}"));
        shard(&base, n);
        let merged = merge(&format!("on-{n}-shards"), &base);
        assert!(merged.join("model.safetensors.index.json").is_file() && !merged.join("model.safetensors").exists());
        assert!(merged.join(format!("model-{n:05}-of-{n:05}.safetensors")).is_file());
        assert!(read(&merged) == on_one, "{n} shards: the same weights");
        ModelConfig::from_dir(&merged).unwrap();
    }
}

/// The adapters stepwise's own LoRA training writes (PEFT's names and settings), alone in a
/// folder, merge to the model that training wrote beside them: within a bf16 step of each
/// tensor's largest weight (the engine rounds `s·B`, `A` and the sum to bf16), and the same
/// log-probabilities to within that.
#[test]
fn stepwise_trained_adapters_alone_merge_to_the_trained_model() {
    let tmp = tempfile::tempdir().unwrap();
    let mut t = PackedTrainer::load_with(
        &policy(),
        ModelConfig::from_dir(&policy()).unwrap(),
        Arc::new(Cpu),
        Some(LoraConfig::new(4)),
    )
    .unwrap();
    let examples = lm_examples(8, 3);
    let refs: Vec<_> = examples.iter().collect();
    let tokens = TokenBatch::new(&refs, Objective::Lm).unwrap();
    for _ in 0..3 {
        let mut loss = |logp: &[f32]| tokens.loss(Objective::Lm, logp).map(|l| (l.value, l.derivative));
        let targets = Targets::Tokens {
            pairs: &tokens.pairs,
            loss: &mut loss,
        };
        t.backward(&tokens.packed, targets).unwrap();
        t.update(5e-3, 0.0, None, 1).unwrap();
    }
    let trained = tmp.path().join("trained");
    t.save_checkpoint(&trained).unwrap();
    let alone = tmp.path().join("alone");
    std::fs::create_dir_all(&alone).unwrap();
    for f in ["adapter_config.json", "adapter_model.safetensors"] {
        std::fs::copy(trained.join(f), alone.join(f)).unwrap();
    }
    let merged = resolve_in(alone, no_base, &tmp.path().join("cache")).unwrap();
    let (ours, theirs, base) = (tensors(&trained), tensors(&merged), tensors(&policy()));
    let mut moved = 0f32;
    for (name, (shape, want)) in &ours {
        let (got_shape, got) = &theirs[name];
        assert_eq!(shape, got_shape, "{name}");
        // One bf16 step of the tensor's largest weight (as python/tests/test_peft_lora.py).
        let step = want.iter().fold(0f32, |m, w| m.max(w.abs())) * 2f32.powi(-7);
        for ((&g, &w), &b) in got.iter().zip(want).zip(&base[name].1) {
            assert!((g - w).abs() <= step, "{name}: {g} against {w}");
            moved = moved.max((w - b).abs());
        }
    }
    assert!(moved > 1e-2, "training moved the adapted weights ({moved})");
    // The merge itself, exactly: W + (α/r)·B·A from the adapter file's f32 values.
    let adapter = tensors_of(&tmp.path().join("alone/adapter_model.safetensors"));
    let q = "model.layers.1.self_attn.q_proj";
    let a = &adapter[&format!("base_model.model.{q}.lora_A.weight")].1;
    let b = &adapter[&format!("base_model.model.{q}.lora_B.weight")].1;
    let want = expected(&base[&format!("{q}.weight")].1, a, b, (64, 4, 64), 2.0);
    let got = &theirs[&format!("{q}.weight")].1;
    assert!(got.iter().zip(&want).all(|(&g, &w)| (g as f64 - w).abs() < 1e-5));
    // The same model to the engine: log-probabilities apart by a small share of how far
    // training moved them (the engine rounds the base, `s·B` and `A` to bf16 first).
    let seqs: Vec<&[u32]> = examples.iter().map(|e| e.ids.as_slice()).collect();
    let logp = |dir: &Path| {
        let dec =
            stepwise_model::packed_engine::PackedDecoder::load(dir, ModelConfig::from_dir(dir).unwrap(), Arc::new(Cpu))
                .unwrap();
        stepwise_model::train::packed::sequence_logprobs(&dec, &seqs, 4096).unwrap()
    };
    let mean_gap = |x: &[Vec<f32>], y: &[Vec<f32>]| {
        let gaps: Vec<f32> = x
            .iter()
            .flatten()
            .zip(y.iter().flatten())
            .map(|(p, q)| (p - q).abs())
            .collect();
        gaps.iter().sum::<f32>() / gaps.len() as f32
    };
    let (trained_lp, merged_lp) = (logp(&trained), logp(&merged));
    let (apart, moved) = (
        mean_gap(&trained_lp, &merged_lp),
        mean_gap(&trained_lp, &logp(&policy())),
    );
    assert!(
        apart < 0.05 * moved,
        "log-probabilities apart by {apart}, moved by {moved}"
    );
}

/// An adapter tensor: its name under the model, shape and values.
type Owned = (String, Vec<usize>, Vec<f32>);

/// What cannot be merged into a plain model is refused, naming the file and the field or tensor.
#[test]
fn adapters_that_cannot_be_merged_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let q = "model.layers.0.self_attn.q_proj";
    let pair = |r: usize| {
        vec![
            (format!("{q}.lora_A.weight"), vec![r, 64], values(r * 64, 1)),
            (format!("{q}.lora_B.weight"), vec![64, r], values(r * 64, 2)),
        ]
    };
    let cases: Vec<(&str, serde_json::Value, Vec<Owned>, &str)> = vec![
        ("dora", serde_json::json!({"use_dora": true}), pair(2), "use_dora"),
        (
            "prefix",
            serde_json::json!({"peft_type": "PREFIX_TUNING"}),
            pair(2),
            "peft_type",
        ),
        ("rank", serde_json::json!({}), pair(3), "rank-2 update"),
        ("no-b", serde_json::json!({}), pair(2)[..1].to_vec(), "its `B`"),
        ("no-a", serde_json::json!({}), pair(2)[1..].to_vec(), "its `A`"),
        (
            "no-base",
            serde_json::json!({"base_model_name_or_path": "nobody/nothing"}),
            pair(2),
            "base_model_name_or_path",
        ),
        (
            "stranger",
            serde_json::json!({}),
            vec![("model.layers.0.self_attn.x_proj.weight".into(), vec![2], vec![0.0, 1.0])],
            "x_proj",
        ),
        (
            "head",
            serde_json::json!({"task_type": "CAUSAL_LM"}),
            vec![("score.weight".into(), vec![1, 64], values(64, 3))],
            "task_type",
        ),
    ];
    for (name, config, t, want) in cases {
        let dir = tmp.path().join(name);
        let t: Vec<(&str, Vec<usize>, Vec<f32>)> =
            t.iter().map(|(n, s, v)| (n.as_str(), s.clone(), v.clone())).collect();
        adapter(&dir, config, &t);
        let err = format!("{:#}", resolve_in(dir, no_base, &tmp.path().join("cache")).unwrap_err());
        assert!(err.contains(want), "{name}: {err}");
    }
    assert!(
        !tmp.path().join("cache/merged").exists()
            || std::fs::read_dir(tmp.path().join("cache/merged"))
                .unwrap()
                .next()
                .is_none()
    );
}

/// The merged models in the cache: listed with where they came from and their size, marked
/// used when a run finds them, removed by name (a name that is not one refused), and pruned by
/// age and then by size, least recently used first; a merge left by a process that is gone is
/// pruned, one still at work is not; a removed model is merged again when asked for.
#[test]
fn merged_models_are_listed_marked_used_and_pruned_least_recent_first() {
    use std::time::{Duration, SystemTime};
    use stepwise_model::merged_cache::{list, prune, remove, Prune, RECORD};
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let q = "model.layers.0.self_attn.q_proj";
    let dirs: Vec<PathBuf> = (0..3u32)
        .map(|k| {
            let dir = tmp.path().join(format!("adapter-{k}"));
            let a = (format!("{q}.lora_A.weight"), vec![2, 64], values(128, 10 + k));
            let b = (format!("{q}.lora_B.weight"), vec![64, 2], values(128, 20 + k));
            adapter(&dir, serde_json::json!({}), &[(&a.0, a.1, a.2), (&b.0, b.1, b.2)]);
            dir
        })
        .collect();
    let merged: Vec<PathBuf> = dirs
        .iter()
        .map(|d| resolve_in(d.clone(), no_base, &cache).unwrap())
        .collect();
    let name = |k: usize| merged[k].file_name().unwrap().to_string_lossy().into_owned();
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap().display().to_string();
    // Last used 3, 2 and 1 days ago; then a run finds the oldest again.
    let day = Duration::from_secs(86400);
    for (k, dir) in merged.iter().enumerate() {
        let record = std::fs::File::options().append(true).open(dir.join(RECORD)).unwrap();
        record.set_modified(SystemTime::now() - day * (3 - k as u32)).unwrap();
    }
    assert_eq!(resolve_in(dirs[0].clone(), no_base, &cache).unwrap(), merged[0]);
    let listed = list(&cache).unwrap();
    let names: Vec<&str> = listed.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, [name(0), name(2), name(1)]);
    let weights = std::fs::metadata(merged[0].join("model.safetensors")).unwrap().len();
    for m in &listed {
        let k = merged.iter().position(|p| *p == m.path).unwrap();
        assert_eq!(m.adapter.as_deref(), Some(canonical(&dirs[k]).as_str()));
        assert_eq!(m.base.as_deref(), Some(canonical(&policy()).as_str()));
        assert!(m.bytes > weights && m.bytes < weights + (1 << 20), "{} bytes", m.bytes);
        assert_eq!(m.unfinished, None);
    }
    // Refused: not a name of the cache's, and a merge still at work (this process's).
    for bad in ["../cache", "", "nope", ".."] {
        assert!(remove(&cache, bad).is_err(), "{bad:?}");
    }
    let at_work = cache.join("merged").join(format!(".x.partial-{}", std::process::id()));
    let left = cache.join("merged").join(".y.partial-4000000");
    for dir in [&at_work, &left] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let unfinished: Vec<_> = list(&cache)
        .unwrap()
        .into_iter()
        .filter_map(|m| m.unfinished.map(|u| (m.name, u)))
        .collect();
    assert_eq!(unfinished.len(), 2);
    assert!(unfinished.contains(&(".y.partial-4000000".into(), false)));
    assert!(remove(&cache, &format!(".x.partial-{}", std::process::id())).is_err());
    // By age: the one unused for two days (and the merge whose process is gone).
    let by_age = Prune {
        unused_for: Some(day + day / 2),
        ..Prune::default()
    };
    let gone: Vec<String> = prune(&cache, &by_age).unwrap().into_iter().map(|m| m.name).collect();
    assert_eq!(gone, [name(1), ".y.partial-4000000".to_string()]);
    assert!(!merged[1].exists() && !left.exists() && at_work.exists());
    // By size: the least recently used goes until one model's bytes are left (the first listed
    // may be the merge at work, newer by a clock tick or not).
    let kept = list(&cache).unwrap().into_iter().find(|m| m.name == name(0)).unwrap();
    let by_size = Prune {
        max_bytes: Some(kept.bytes + 4096),
        ..Prune::default()
    };
    let gone: Vec<String> = prune(&cache, &by_size).unwrap().into_iter().map(|m| m.name).collect();
    assert_eq!(gone, [name(2)]);
    assert!(merged[0].exists() && !merged[2].exists());
    // Removed by name, then merged again when a run asks for it.
    assert_eq!(remove(&cache, &name(0)).unwrap().path, merged[0]);
    assert!(!merged[0].exists());
    assert_eq!(resolve_in(dirs[0].clone(), no_base, &cache).unwrap(), merged[0]);
    assert!(merged[0].join("config.json").is_file());
}
