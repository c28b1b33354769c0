//! LoRA adapters served unmerged on one base (`src/adapters.rs`): a row with an adapter computes
//! what the adapter merged into its own model computes, rows of different adapters (and of none)
//! decode side by side in one batch each as its own model alone, and what cannot be served
//! unmerged is refused by name.

mod common;

use candle_core::{Device, Tensor};
use common::{fixtures, max_diff};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use stepwise_model::peft::resolve_in;
use stepwise_model::{Decoding, Input, Model, ModelConfig, SamplingParams};

/// Every projection an adapter may adapt (PEFT's `all-linear`).
const ALL: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

fn policy() -> PathBuf {
    fixtures().join("qwen2-policy")
}

/// Deterministic values in [-scale/2, scale/2).
fn values(n: usize, seed: u32, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 1000.0 - 0.5) * scale)
        .collect()
}

/// A rank-`r` adapter on `modules` of every layer of the fixture policy, plus `extra` tensors
/// (name under the model, shape, values).
fn adapter(dir: &Path, r: usize, modules: &[&str], seed: u32, extra: &[(&str, Vec<usize>, Vec<f32>)]) -> PathBuf {
    let cfg = ModelConfig::from_dir(&policy()).unwrap();
    let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
    let (q, kv) = (
        cfg.num_attention_heads * cfg.head_dim,
        cfg.num_key_value_heads * cfg.head_dim,
    );
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for layer in 0..cfg.num_hidden_layers {
        for (k, m) in modules.iter().enumerate() {
            let (block, out, inp) = match *m {
                "q_proj" => ("self_attn", q, h),
                "k_proj" | "v_proj" => ("self_attn", kv, h),
                "o_proj" => ("self_attn", h, q),
                "gate_proj" | "up_proj" => ("mlp", inter, h),
                "down_proj" => ("mlp", h, inter),
                other => panic!("{other}"),
            };
            let at = format!("model.layers.{layer}.{block}.{m}");
            let s = seed + 31 * (layer * 7 + k) as u32;
            tensors.push((format!("{at}.lora_A.weight"), vec![r, inp], values(r * inp, s, 0.4)));
            tensors.push((
                format!("{at}.lora_B.weight"),
                vec![out, r],
                values(out * r, s ^ 77, 0.4),
            ));
        }
    }
    tensors.extend(extra.iter().map(|(n, s, v)| (n.to_string(), s.clone(), v.clone())));
    let config = serde_json::json!({"r": r, "lora_alpha": 2 * r, "target_modules": modules});
    let refs: Vec<(&str, Vec<usize>, Vec<f32>)> = tensors
        .iter()
        .map(|t| (t.0.as_str(), t.1.clone(), t.2.clone()))
        .collect();
    common::write_adapter(dir, &policy(), config, &refs);
    dir.to_path_buf()
}

fn no_base(id: &str) -> anyhow::Result<PathBuf> {
    anyhow::bail!("{id}: not found")
}

/// The fixture policy serving `(name, folder)` adapters.
fn serving(list: &[(String, PathBuf)]) -> Model {
    let m = Model::load(&policy(), &Device::Cpu).unwrap();
    m.serve_adapters(list).unwrap();
    m
}

/// Hidden states of `ids` (one sequence) with `adapter`.
fn hidden(m: &Model, ids: &[u32], adapter: Option<usize>) -> Tensor {
    let t = Tensor::new(ids, &Device::Cpu).unwrap().unsqueeze(0).unwrap();
    m.hidden(Input::padded(&t, None).adapters(vec![adapter])).unwrap()
}

/// Two adapters of the fixture policy in `dir` (rank 4 on every projection; rank 2 on q, v and
/// down), each with its merged model.
fn two_adapters(dir: &Path) -> ((PathBuf, Model), (PathBuf, Model)) {
    let a = adapter(&dir.join("a"), 4, &ALL, 1, &[]);
    let b = adapter(&dir.join("b"), 2, &["q_proj", "v_proj", "down_proj"], 9, &[]);
    let cache = dir.join("cache");
    let merged = |x: &PathBuf| Model::load(&resolve_in(x.clone(), no_base, &cache).unwrap(), &Device::Cpu).unwrap();
    let (merged_a, merged_b) = (merged(&a), merged(&b));
    ((a, merged_a), (b, merged_b))
}

/// Each adapter's rows compute what its merged model computes, in a padded pass, a packed pass
/// of several sequences with one adapter each, and a prefill continued token by token; rows of
/// no adapter are the base's.
#[test]
fn an_adapter_served_unmerged_computes_what_its_merged_model_computes() {
    let tmp = tempfile::tempdir().unwrap();
    let ((a, merged_a), (b, merged_b)) = two_adapters(tmp.path());
    let base = Model::load(&policy(), &Device::Cpu).unwrap();
    let served = serving(&[("a".into(), a), ("b".into(), b)]);
    assert_eq!(served.adapters().unwrap().names().collect::<Vec<_>>(), ["a", "b"]);
    let ids: Vec<u32> = (0..23).map(|i| (i * 37 + 5) % 600).collect();
    for (adapter, want) in [(None, &base), (Some(0), &merged_a), (Some(1), &merged_b)] {
        let (got, want) = (hidden(&served, &ids, adapter), hidden(want, &ids, None));
        assert!(max_diff(&got, &want) < 1e-4, "{adapter:?}: {}", max_diff(&got, &want));
    }
    // The adapters moved the model (or the comparisons above would prove nothing).
    assert!(max_diff(&hidden(&served, &ids, Some(0)), &hidden(&base, &ids, None)) > 0.05);
    assert!(max_diff(&hidden(&served, &ids, Some(1)), &hidden(&base, &ids, None)) > 0.05);
    // A packed batch of three sequences, one a model.
    let seqs: Vec<Vec<u32>> = vec![ids[..9].to_vec(), ids[4..].to_vec(), ids[2..15].to_vec()];
    let batch = stepwise_model::Packed::new(&seqs.iter().map(Vec::as_slice).collect::<Vec<_>>());
    let got = served
        .hidden(Input::packed(&batch).adapters(vec![Some(1), None, Some(0)]))
        .unwrap();
    let mut at = 0;
    for (seq, want) in seqs.iter().zip([&merged_b, &base, &merged_a]) {
        let part = got.narrow(0, at, seq.len()).unwrap();
        let want = hidden(want, seq, None).squeeze(0).unwrap();
        assert!(max_diff(&part, &want) < 1e-4);
        at += seq.len();
    }
    // An adapter index that is not served is refused.
    let t = Tensor::new(ids.as_slice(), &Device::Cpu).unwrap().unsqueeze(0).unwrap();
    let err = served
        .hidden(Input::padded(&t, None).adapters(vec![Some(2)]))
        .unwrap_err();
    assert!(format!("{err:#}").contains("adapter 2 is not served"), "{err:#}");
}

/// Sampling for request `seed`: 12 tokens at temperature 0.8.
fn params(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        max_new_tokens: 12,
        seed,
        ..SamplingParams::default()
    }
}

/// Three prompts of 7, 12 and 17 tokens.
fn prompts() -> Vec<Vec<u32>> {
    (0..3)
        .map(|k| (0..7 + 5 * k).map(|i| ((i * 13 + k * 101) % 600) as u32).collect())
        .collect()
}

/// Two continuations of each request `(prompt k, adapter)` of `which`, decoded in one batch
/// (added, or joined through the running steps), in order.
fn decode_together(m: &Model, which: &[(usize, Option<usize>)], joined: bool) -> Vec<Vec<Vec<u32>>> {
    let prompts = prompts();
    let mut batch = Decoding::new(m, None).prefill_chunk(4);
    let ids: Vec<usize> = which
        .iter()
        .map(|&(k, adapter)| match joined {
            false => batch.add_with(&prompts[k], 2, params(k as u64), adapter).unwrap(),
            true => batch.join_with(&prompts[k], 2, params(k as u64), adapter).unwrap(),
        })
        .collect();
    let mut outs = vec![Vec::new(); which.len()];
    let mut left = which.len();
    while left > 0 {
        for (id, out) in batch.step().unwrap() {
            outs[ids.iter().position(|&i| i == id).unwrap()] = out;
            left -= 1;
        }
    }
    outs
}

/// Requests of two adapters and of the base decode in one continuous batch (added alone, or
/// joined and fed through the others' steps), each exactly as its own model decodes it alone.
#[test]
fn requests_of_different_adapters_decode_side_by_side_as_each_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let a = adapter(&tmp.path().join("a"), 4, &["q_proj", "o_proj", "up_proj"], 3, &[]);
    let b = adapter(&tmp.path().join("b"), 8, &["k_proj", "gate_proj", "down_proj"], 5, &[]);
    let cache = tmp.path().join("cache");
    let models = [
        Model::load(&policy(), &Device::Cpu).unwrap(),
        Model::load(&resolve_in(a.clone(), no_base, &cache).unwrap(), &Device::Cpu).unwrap(),
        Model::load(&resolve_in(b.clone(), no_base, &cache).unwrap(), &Device::Cpu).unwrap(),
    ];
    let served = serving(&[("a".into(), a), ("b".into(), b)]);
    let alone: Vec<Vec<Vec<u32>>> = (0..3)
        .map(|k| decode_together(&models[k], &[(k, None)], false).remove(0))
        .collect();
    let all = [(0, None), (1, Some(0)), (2, Some(1))];
    for joined in [false, true] {
        assert_eq!(decode_together(&served, &all, joined), alone, "joined: {joined}");
    }
    assert_ne!(alone[0], alone[1]);
    // An adapter the model does not serve is refused when the request comes.
    let mut batch = Decoding::new(&served, None);
    let err = batch.add_with(&prompts()[0], 1, params(0), Some(5)).unwrap_err();
    assert!(format!("{err:#}").contains("adapter 5 is not served"), "{err:#}");
}

/// What an adapter does beyond adding to the projections (a `modules_to_save` head, an
/// embedding's pair) is refused, naming the tensor and the way to serve it (merged).
#[test]
fn adapters_that_replace_tensors_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = ModelConfig::from_dir(&policy()).unwrap();
    let h = cfg.hidden_size;
    let norm = [("model.norm.weight", vec![h], vec![1.0; h])];
    let saved = adapter(&tmp.path().join("saved"), 2, &["q_proj"], 1, &norm);
    let m = Model::load(&policy(), &Device::Cpu).unwrap();
    let err = format!("{:#}", m.serve_adapters(&[("saved".into(), saved)]).unwrap_err());
    assert!(
        err.contains("adapter `saved`") && err.contains("model.norm.weight") && err.contains("--model ADAPTER"),
        "{err}"
    );
    let v = cfg.vocab_size;
    let emb = [
        ("model.embed_tokens.lora_embedding_A", vec![2, v], vec![0.1; 2 * v]),
        ("model.embed_tokens.lora_embedding_B", vec![h, 2], vec![0.1; 2 * h]),
    ];
    let embedding = adapter(&tmp.path().join("emb"), 2, &["q_proj"], 1, &emb);
    let err = format!("{:#}", m.serve_adapters(&[("emb".into(), embedding)]).unwrap_err());
    assert!(
        err.contains("model.embed_tokens.weight") && err.contains("linear projections"),
        "{err}"
    );
    let twice = adapter(&tmp.path().join("x"), 2, &["q_proj"], 1, &[]);
    let err = format!(
        "{:#}",
        m.serve_adapters(&[("x".into(), twice.clone()), ("x".into(), twice)])
            .unwrap_err()
    );
    assert!(err.contains("two adapters are named `x`"), "{err}");
    assert!(m.adapters().is_none(), "a refused list serves none");
}

/// On the packed engine's CPU backend (where `stepwise serve` runs a pretrained bf16 policy):
/// each adapter's logits are its merged model's within the merged weights' bf16 rounding, and
/// requests of the base and two adapters decode in one paged batch, added or joined through the
/// running steps, token for token as each alone.
#[test]
fn the_packed_engine_serves_adapters_side_by_side() {
    let tmp = tempfile::tempdir().unwrap();
    let a = adapter(&tmp.path().join("a"), 4, &ALL, 3, &[]);
    let b = adapter(&tmp.path().join("b"), 8, &["k_proj", "gate_proj", "down_proj"], 5, &[]);
    let cache = tmp.path().join("cache");
    let packed = |dir: &Path| Model::load_packed(dir, stepwise_model::Placement::Cpu).unwrap();
    let merged_a = packed(&resolve_in(a.clone(), no_base, &cache).unwrap());
    let served = packed(&policy());
    served.serve_adapters(&[("a".into(), a), ("b".into(), b)]).unwrap();
    let ids: Vec<u32> = (0..31).map(|i| (i * 37 + 5) % 600).collect();
    let rows: Vec<usize> = (0..ids.len()).collect();
    let logits = |m: &Model, adapter| {
        m.head_at_with(&[&ids], std::slice::from_ref(&rows), None, vec![adapter])
            .unwrap()
            .0
    };
    let gap = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| (p - q).abs()).sum::<f32>() / x.len() as f32;
    let (base, with_a, merged) = (logits(&served, None), logits(&served, Some(0)), logits(&merged_a, None));
    let (apart, moved) = (gap(&with_a, &merged), gap(&merged, &base));
    assert!(
        moved > 0.05 && apart < 0.1 * moved,
        "{apart} from the merged model, which is {moved} from the base"
    );
    // The reference backend reads its adapters in f32 (the CPU backend in bf16): the same update.
    let reference = {
        use stepwise_model::packed_engine::{PackedDecoder, Reference};
        let dir = policy();
        let engine = PackedDecoder::load(&dir, ModelConfig::from_dir(&dir).unwrap(), Arc::new(Reference)).unwrap();
        Model::on_packed(Arc::new(engine)).unwrap()
    };
    reference.serve_adapters(&[("a".into(), tmp.path().join("a"))]).unwrap();
    let on_reference = gap(&logits(&reference, Some(0)), &merged);
    assert!(
        on_reference < 0.1 * moved,
        "the reference backend's: {on_reference} from the merged model"
    );
    let alone: Vec<Vec<Vec<u32>>> = (0..3)
        .map(|k| decode_together(&served, &[(k, [None, Some(0), Some(1)][k])], false).remove(0))
        .collect();
    assert!(
        alone[0] != alone[1] && alone[1] != alone[2],
        "the adapters change the samples"
    );
    let all = [(0, None), (1, Some(0)), (2, Some(1))];
    for joined in [false, true] {
        assert_eq!(decode_together(&served, &all, joined), alone, "joined: {joined}");
    }
}

/// Adapters loaded and unloaded while the model serves (`/v1/load_lora_adapter`): a loaded one
/// computes its merged model's states, in place of its namesake only when asked; an unloaded one
/// is no longer found by name, yet a request holding it (through a reload in place too) decodes
/// to its end with it, and its index is reused only once no one holds it.
#[test]
fn adapters_load_and_unload_while_requests_run() {
    let tmp = tempfile::tempdir().unwrap();
    let ((a, merged_a), (b, merged_b)) = two_adapters(tmp.path());
    let served = serving(&[]);
    assert!(served.adapters().is_none());
    served.load_adapter("x", &a, false).unwrap();
    let ids: Vec<u32> = (0..19).map(|i| (i * 41 + 3) % 600).collect();
    assert!(max_diff(&hidden(&served, &ids, Some(0)), &hidden(&merged_a, &ids, None)) < 1e-4);
    let err = served.load_adapter("x", &b, false).unwrap_err();
    assert!(format!("{err:#}").contains("already served"), "{err:#}");
    served.load_adapter("x", &b, true).unwrap();
    assert!(max_diff(&hidden(&served, &ids, Some(0)), &hidden(&merged_b, &ids, None)) < 1e-4);
    served.load_adapter("x", &a, true).unwrap();
    // A request with `x` starts, `x` is unloaded mid-way: it ends as merged `a` decodes it alone.
    let (index, lease) = served.lease_adapter("x").unwrap();
    let mut batch = Decoding::new(&served, None).prefill_chunk(4);
    let id = batch.join_with(&prompts()[1], 2, params(1), Some(index)).unwrap();
    batch.step().unwrap();
    // Reloaded in place (the same weights) while held, then unloaded: the index stays held.
    served.load_adapter("x", &a, true).unwrap();
    served.unload_adapter("x").unwrap();
    assert!(served.lease_adapter("x").is_none() && served.adapters().unwrap().is_empty());
    served.load_adapter("y", &b, false).unwrap();
    assert_eq!(served.adapters().unwrap().index("y"), Some(1), "index 0 is still held");
    let mut out = None;
    while out.is_none() {
        out = batch
            .step()
            .unwrap()
            .into_iter()
            .find(|(i, _)| *i == id)
            .map(|(_, o)| o);
    }
    let alone = decode_together(&merged_a, &[(1, None)], true).remove(0);
    assert_eq!(out.unwrap(), alone);
    drop(lease);
    served.load_adapter("z", &a, false).unwrap();
    assert_eq!(
        served.adapters().unwrap().index("z"),
        Some(0),
        "index 0 is let go once no one holds it"
    );
    let err = served.unload_adapter("x").unwrap_err();
    assert!(format!("{err:#}").contains("no adapter named `x`"), "{err:#}");
    // The packed engine's CPU backend takes them the same way.
    let packed = Model::load_packed(&policy(), stepwise_model::Placement::Cpu).unwrap();
    packed.load_adapter("y", &b, false).unwrap();
    let at_start = Model::load_packed(&policy(), stepwise_model::Placement::Cpu).unwrap();
    at_start.serve_adapters(&[("y".into(), b)]).unwrap();
    let rows: Vec<usize> = (0..ids.len()).collect();
    let logits = |m: &Model| {
        m.head_at_with(&[&ids], std::slice::from_ref(&rows), None, vec![Some(0)])
            .unwrap()
            .0
    };
    assert_eq!(logits(&packed), logits(&at_start));
}

/// A policy with a served adapter (`EnginePolicy::adapter`, Python's `Policy.with_adapter`)
/// weighs options and samples as the adapter merged into its own model, on the CPU decoder and
/// on the packed engine (which feeds the base's contexts once and keeps the base's prefixes:
/// an adapter's go end to end, unprimed); its batch decodes as it does one ask at a time. The
/// packed engine multiplies in bf16: its sums over an option's tokens come within 1% of the
/// merged model's.
#[test]
fn a_policy_samples_and_weighs_with_its_adapter() {
    use stepwise_core::seams::{NextOptions, NextSteps, Policy, Until};
    use stepwise_model::{EnginePolicy, Placement, Prompt, Tokenizer};
    let tmp = tempfile::tempdir().unwrap();
    let a = adapter(&tmp.path().join("a"), 4, &ALL, 3, &[]);
    let merged_dir = resolve_in(a.clone(), no_base, &tmp.path().join("cache")).unwrap();
    let tokenizer = Tokenizer::from_dir(&policy()).unwrap();
    let load = |dir: &Path, packed: bool| match packed {
        true => Model::load_packed(dir, Placement::Cpu).unwrap(),
        false => Model::load(dir, &Device::Cpu).unwrap(),
    };
    let (question, prefix) = ("What is 2 + 3?", ["2 + 3 = 5."]);
    let options = ["5.", "6.", "The answer is 5."];
    for packed in [false, true] {
        let (served, merged) = (load(&policy(), packed), load(&merged_dir, packed));
        served.load_adapter("a", &a, false).unwrap();
        let (index, _lease) = served.lease_adapter("a").unwrap();
        let policy_of = |model, adapter| EnginePolicy {
            model,
            tokenizer: &tokenizer,
            params: SamplingParams {
                temperature: 0.8,
                max_new_tokens: 10,
                ..Default::default()
            },
            prompt: Prompt::Text,
            separator: "\n".into(),
            adapter,
        };
        let (with_a, base, merged) = (
            policy_of(&served, Some(index)),
            policy_of(&served, None),
            policy_of(&merged, None),
        );
        let ask = [NextOptions {
            question,
            prefix: &prefix,
            options: &options,
        }];
        let weigh = |p: &EnginePolicy| p.logprobs_after(&ask, false).unwrap().unwrap().remove(0);
        let gap = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(p, q)| (p - q).abs()).fold(0.0, f64::max);
        let (got, want, far) = (weigh(&with_a), weigh(&merged), weigh(&base));
        let (apart, moved) = (gap(&got, &want), gap(&far, &want));
        assert!(
            moved > 0.1 && apart < 0.1 * moved,
            "packed {packed}: {apart} from the merged model, which is {moved} from the base"
        );
        let sample = |p: &EnginePolicy, seed| p.continue_from(question, &[], 3, Until::End, seed).unwrap();
        let ids = |c: Vec<stepwise_core::seams::Continuation>| c.into_iter().map(|c| c.token_ids).collect::<Vec<_>>();
        let one_by_one: Vec<_> = (0..2).map(|seed| ids(sample(&with_a, seed))).collect();
        assert_ne!(
            one_by_one[0],
            ids(sample(&base, 0)),
            "packed {packed}: the adapter changes the samples"
        );
        if !packed {
            // f32 on the decoder: the merged model samples the same tokens.
            assert_eq!(one_by_one[0], ids(sample(&merged, 0)));
            continue;
        }
        let mut batch = with_a.batch().expect("the packed engine batches");
        for _ in 0..2 {
            let asks: Vec<NextSteps> = (0..2)
                .map(|seed| NextSteps {
                    question,
                    prefix: &[],
                    n: 3,
                    seed,
                })
                .collect();
            let together: Vec<_> = (batch.continue_all(&asks, Until::End).into_iter())
                .map(|r| ids(r.unwrap()))
                .collect();
            assert_eq!(together, one_by_one, "a batch's asks as each alone");
        }
    }
}
