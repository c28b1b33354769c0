//! `train-prm` folders read back by `score` (validation, bf16 checkpoints) and `rl` on the
//! fixture policy.

use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

mod common;
use common::{fixture, step, stepwise, write_jsonl};

fn tmp(name: &str) -> tempfile::TempDir {
    common::tmp("train", name)
}

/// `stepwise score --model model --input input --output output`.
fn score(model: &Path, input: &Path, output: &Path) {
    let arg = |p: &Path| p.to_str().unwrap().to_string();
    let (model, input, output) = (arg(model), arg(input), arg(output));
    stepwise(&["score", "--model", &model, "--input", &input, "--output", &output]);
}

/// `train-prm` writes a folder `score` reads back, for the classifier head and for the
/// log-ratio head (whose reward.json names --base as the reference), with either CPU trainer
/// (candle's autograd, and the packed engine's).
#[test]
fn train_prm_folders_are_scored_by_score() {
    let d_tmp = tmp("train-prm");
    let d = d_tmp.path();
    let data = d.join("labeled.jsonl");
    let rows: Vec<Value> = (0..12)
        .map(|i| {
            json!({"id": format!("s{i}"), "question": format!("count from {i}"), "correct": i % 3 != 0,
                   "steps": [step(&format!("{}", i + 1), 0.0, true), step(&format!("{}", i + 2 + i % 3), 0.0, i % 3 != 0)]})
        })
        .collect();
    write_jsonl(&data, &rows);
    // The likelihood head is the log-ratio head against a constant reference: no model is kept.
    let likelihood = ["--reference-logprob", "-0.5"];
    // A classifier trained with its own separator is scored with it (read from reward.json).
    let tagged = ["--separator", " ки"];
    let runs = [
        ("classifier", &tagged[..]),
        ("log-ratio", &[][..]),
        ("log-ratio", &likelihood[..]),
    ];
    for (trainer, (head, extra)) in ["autograd", "packed"].into_iter().flat_map(|t| runs.map(|r| (t, r))) {
        let name = if head == "log-ratio" && !extra.is_empty() {
            format!("likelihood-{trainer}")
        } else {
            format!("{head}-{trainer}")
        };
        let out = d.join(&name);
        let args = [
            "train-prm",
            "--data",
            data.to_str().unwrap(),
            "--base",
            &fixture("qwen2-policy"),
        ];
        let rest = [
            "--head",
            head,
            "--steps",
            "3",
            "--batch-size",
            "4",
            "--out",
            out.to_str().unwrap(),
            "--trainer",
            trainer,
        ];
        let said = stepwise(&[&args[..], &rest[..], extra].concat()).stderr;
        // No --lr: the small fixture base trains at 1e-3, and the log says so.
        let said = String::from_utf8_lossy(&said);
        assert!(
            said.contains("learning rate 1e-3 (a small base (hidden size 64); --lr sets it)"),
            "{said}"
        );
        let device = if trainer == "packed" {
            "on cpu (packed engine)"
        } else {
            "on cpu in"
        };
        assert!(said.contains(device), "{name}: {said}");
        let spec: Value = serde_json::from_str(&std::fs::read_to_string(out.join("reward.json")).unwrap()).unwrap();
        if head == "classifier" {
            assert_eq!(spec, json!({"kind": "step_classifier", "separator": " ки"}));
        } else {
            if name.starts_with("likelihood") {
                assert_eq!(spec["reference_logprob"], json!(-0.5));
                assert!(spec.get("reference").is_none(), "{spec}");
            } else {
                // Named relative to the verifier's folder, so the two can move together.
                let reference = spec["reference"].as_str().unwrap();
                assert!(reference.starts_with(".."), "{spec}");
                assert!(out.join(reference).join("config.json").exists(), "{spec}");
            }
        }
        let scored = d.join(format!("{name}.jsonl"));
        score(&out, &data, &scored);
        let text = std::fs::read_to_string(&scored).unwrap();
        assert_eq!(text.lines().count(), rows.len());
        let scores = common::step_scores(&text, "prm");
        assert_eq!(scores.len(), 2 * rows.len());
        assert!(scores.iter().all(|x| (0.0..=1.0).contains(x)), "{name}: {scores:?}");
        assert!(
            scores.iter().any(|x| (x - 0.5).abs() > 1e-3),
            "{name}: training moved nothing"
        );
        if head == "classifier" {
            // The same folder told to read steps ending in "\n" scores differently: the
            // separator it was trained with is the one used.
            std::fs::write(
                out.join("reward.json"),
                json!({"kind": "step_classifier", "separator": "\n"}).to_string(),
            )
            .unwrap();
            let other = d.join(format!("newline-{trainer}.jsonl"));
            stepwise(&[
                "score",
                "--model",
                out.to_str().unwrap(),
                "--input",
                data.to_str().unwrap(),
                "--output",
                other.to_str().unwrap(),
            ]);
            let newline = common::step_scores(&std::fs::read_to_string(&other).unwrap(), "prm");
            assert_ne!(newline, scores, "the separator in reward.json was not used");
        }
    }
}

/// `train-prm` on a file sorted by outcome (as ProcessBench is): validation is drawn from whole
/// problems at random, so it holds both outcomes (the first lines held only correct ones, and
/// the ORM's validation AUROC was undefined); a run that fails before its first checkpoint
/// leaves no folder behind.
#[test]
fn train_prm_validates_on_random_problems_and_leaves_nothing_when_it_fails() {
    let d_tmp = tmp("train-split");
    let d = d_tmp.path();
    let data = d.join("sorted.jsonl");
    let rows: Vec<Value> = (0..40)
        .map(|i| {
            json!({"id": format!("s{i}"), "problem_id": format!("p{}", i / 2), "question": format!("count from {i}"),
                   "correct": i < 20, "steps": [step(&format!("{}", i + 1), 0.0, true), step(&format!("{}", i + 2), 0.0, i < 20)]})
        })
        .collect();
    write_jsonl(&data, &rows);
    let out = d.join("orm");
    let data_arg = data.to_str().unwrap().to_string();
    let out_arg = out.to_str().unwrap().to_string();
    let base = fixture("qwen2-policy");
    let args = [
        "train-prm",
        "--data",
        &data_arg,
        "--base",
        &base,
        "--outcome",
        "--steps",
        "3",
        "--batch-size",
        "4",
        "--valid-fraction",
        "0.25",
        "--out",
        &out_arg,
    ];
    stepwise(&args);
    let metrics: Value = serde_json::from_str(&std::fs::read_to_string(out.join("metrics.json")).unwrap()).unwrap();
    assert!(
        metrics["auroc"].is_number(),
        "validation holds one outcome only: {metrics}"
    );
    // Nothing to learn from: refused, and the folder it would have written is not left behind.
    let unlabelled = d.join("unlabelled.jsonl");
    write_jsonl(
        &unlabelled,
        &[json!({"id": "u", "question": "q", "steps": [{"text": "1"}]})],
    );
    let failed_out = d.join("failed");
    let failed = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args([
            "train-prm",
            "--data",
            unlabelled.to_str().unwrap(),
            "--base",
            &base,
            "--steps",
            "3",
        ])
        .args(["--out", failed_out.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(failed.status.code(), Some(1));
    assert!(!failed_out.exists(), "a failed run left {}", failed_out.display());
}

/// `--valid-data`: validation on a fixed file (here in another format, ProcessBench's) instead of
/// a fraction of --data: all of --data trains, every held-out solution validates, and the
/// validation's loss is that file's; with --valid-fraction too, refused; a bad file named.
#[test]
fn train_prm_validates_on_a_fixed_file() {
    let d_tmp = tmp("train-valid-data");
    let d = d_tmp.path();
    let data = d.join("train.jsonl");
    let rows: Vec<Value> = (0..12)
        .map(|i| {
            json!({"id": format!("s{i}"), "question": format!("count from {i}"),
                   "steps": [step(&format!("{}", i + 1), 0.0, true), step(&format!("{}", i + 2), 0.0, i % 2 == 0)]})
        })
        .collect();
    write_jsonl(&data, &rows);
    let held = d.join("held.json");
    let records: Vec<Value> = (0..5)
        .map(|i| json!({"id": format!("v{i}"), "problem": format!("count from {}", 50 + i), "steps": ["51", "53"], "label": i % 2}))
        .collect();
    std::fs::write(&held, serde_json::to_string(&records).unwrap()).unwrap();
    let (data, held, base) = (
        data.display().to_string(),
        held.display().to_string(),
        fixture("qwen2-policy"),
    );
    let train = |valid: &str, out: &str, extra: &[&str]| {
        let out = d.join(out).display().to_string();
        let mut args = vec![
            "train-prm",
            "--data",
            &data,
            "--base",
            &base,
            "--steps",
            "2",
            "--batch-size",
            "4",
        ];
        args.extend(["--valid-data", valid, "--out", &out]);
        args.extend_from_slice(extra);
        Command::new(env!("CARGO_BIN_EXE_stepwise"))
            .args(&args)
            .output()
            .unwrap()
    };
    let ok = train(&held, "prm", &["--stop-at-first-bad"]);
    let said = String::from_utf8_lossy(&ok.stderr);
    assert!(ok.status.success(), "{said}");
    assert!(said.contains("12 training sequences, 5 validation"), "{said}");
    let metrics: Value = serde_json::from_str(&std::fs::read_to_string(d.join("prm/metrics.json")).unwrap()).unwrap();
    assert!(metrics["loss"].as_f64().unwrap() > 0.0, "{metrics}");
    let both = train(&held, "both", &["--valid-fraction", "0.2"]);
    assert_eq!(both.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&both.stderr).contains("--valid-fraction"));
    let missing = d.join("missing.jsonl").display().to_string();
    let bad = train(&missing, "bad", &[]);
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && said.contains("missing.jsonl"), "{said}");
    assert!(!d.join("bad").exists(), "a failed run left its folder");
}

/// The tensors of a safetensors file: name → dtype, and its metadata.
fn safetensors_header(path: &Path) -> (std::collections::BTreeMap<String, String>, Value) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut tensors = std::collections::BTreeMap::new();
    for (name, t) in header.as_object().unwrap() {
        if name != "__metadata__" {
            tensors.insert(name.clone(), t["dtype"].as_str().unwrap().to_string());
        }
    }
    (tensors, header["__metadata__"].clone())
}

/// A verifier fine-tuned from Qwen2.5-Math-PRM's layout (a bf16 checkpoint with its own
/// two-layer head): the old head's tensors are gone, the new head is there, every tensor is
/// bf16 like the base, and `score` reads the folder back.
#[test]
fn train_prm_from_a_bf16_prm_drops_its_head_and_stays_bf16() {
    let d_tmp = tmp("from-prm");
    let d = d_tmp.path();
    let data = d.join("labeled.jsonl");
    let rows: Vec<Value> = (0..8)
        .map(|i| {
            json!({"id": format!("s{i}"), "question": format!("q{i}"), "correct": i % 2 == 0,
                        "steps": [step("a", 0.0, true), step("b", 0.0, i % 2 == 0)]})
        })
        .collect();
    write_jsonl(&data, &rows);
    let base = fixture("qwen2-prm");
    let (base_tensors, _) = safetensors_header(&Path::new(&base).join("model.safetensors"));
    assert!(base_tensors.contains_key("score.0.weight"));
    for (head, new_head) in [("classifier", "score.weight"), ("value", "score.weight")] {
        let out = d.join(head);
        stepwise(&[
            "train-prm",
            "--data",
            data.to_str().unwrap(),
            "--base",
            &base,
            "--head",
            head,
            "--steps",
            "2",
            "--batch-size",
            "4",
            "--out",
            out.to_str().unwrap(),
        ]);
        let (tensors, metadata) = safetensors_header(&out.join("model.safetensors"));
        assert_eq!(metadata, json!({"format": "pt"}));
        assert!(tensors.contains_key(new_head), "{head}: {tensors:?}");
        assert!(
            !tensors
                .keys()
                .any(|k| k.starts_with("score.0") || k.starts_with("score.2") || k == "lm_head.weight"),
            "{head}: the old head was kept: {tensors:?}"
        );
        let decoder: Vec<_> = base_tensors.keys().filter(|k| k.starts_with("model.")).collect();
        assert!(
            decoder.iter().all(|k| tensors.contains_key(*k)),
            "{head}: decoder tensors lost"
        );
        assert!(tensors.values().all(|t| t == "BF16"), "{head}: {tensors:?}");
        let config: Value = serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
        assert_eq!(config["torch_dtype"], json!("bfloat16"));
        let scored = d.join(format!("{head}.jsonl"));
        score(&out, &data, &scored);
        assert_eq!(
            common::step_scores(&std::fs::read_to_string(&scored).unwrap(), "prm").len(),
            16
        );
    }
}

/// `stepwise rl` on the fixture policy: outcome, PRM (on the packed trainer) and PRIME rewards, a per-update log, and a
/// checkpoint folder that loads back as the same architecture with changed weights; a second
/// run on the folder resumes (it has nothing left to do) instead of starting over. PRIME's
/// implicit PRM moved too, and `stepwise score` reads its folder as a verifier.
#[test]
fn rl_trains_the_fixture_policy_and_writes_a_loadable_checkpoint() {
    let d_tmp = tmp("rl");
    let d = d_tmp.path();
    let problems = d.join("problems.jsonl");
    write_jsonl(
        &problems,
        &[
            json!({"question": "What is 2 + 3?", "answer": "5"}),
            json!({"question": "What is 4 * 2?", "answer": "#### 8"}),
        ],
    );
    let policy = fixture("qwen2-policy");
    for (name, reward) in [
        ("outcome", "outcome".to_string()),
        ("prm", format!("prm:{}", fixture("qwen2-prm"))),
        ("prime", "prime".to_string()),
        // No KL penalty: no reference loaded or run, no `kl` logged (a PRM's rewards: the
        // always-wrong policy's outcomes alone would give it nothing to learn).
        ("no-kl", format!("prm:{}", fixture("qwen2-prm"))),
        // LoRA: the policy frozen, adapters trained; the merged policy and PEFT's files written.
        ("lora", format!("prm:{}", fixture("qwen2-prm"))),
    ] {
        let out = d.join(name);
        let args = |out: &Path| {
            // The random policy is always wrong: PRIME learns from every group here.
            let filter = if name == "prime" { "0,1" } else { "0.2,0.8" };
            let mut args: Vec<String> = vec![
                "rl".to_string(),
                "--prime-filter".into(),
                filter.into(),
                "--kl".into(),
                if name == "no-kl" { "0" } else { "0.04" }.into(),
                "--policy".into(),
                policy.clone(),
                "--reward".into(),
                reward.clone(),
                "--problems".into(),
                problems.display().to_string(),
                "--out".into(),
                out.display().to_string(),
                "--updates".into(),
                "2".into(),
                "--prompts".into(),
                "2".into(),
                "--group-size".into(),
                "3".into(),
                "--max-tokens".into(),
                "12".into(),
                "--lr".into(),
                "1e-3".into(),
                "--eval-problems".into(),
                problems.display().to_string(),
                "--eval-every".into(),
                "1".into(),
                "--eval-samples".into(),
                "2".into(),
                // The PRM's run on the packed trainer, whose engine samples an update's groups,
                // and the held-out problems, in one batch each.
                "--trainer".into(),
                if name == "prm" || name == "lora" {
                    "packed"
                } else {
                    "auto"
                }
                .into(),
            ];
            if name == "lora" {
                args.extend(LORA.map(String::from));
            }
            args
        };
        let a = args(&out);
        stepwise(&a.iter().map(String::as_str).collect::<Vec<_>>());
        let log: Vec<Value> = std::fs::read_to_string(out.join("rl_log.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(log.len(), 2, "{name}");
        assert!(log[1]["sampled_tokens"].as_u64().unwrap() > 0);
        match name {
            "no-kl" => assert!(log.iter().all(|l| l.get("kl").is_none()), "{log:?}"),
            _ => assert!(log[1]["kl"].as_f64().unwrap().is_finite(), "{name}"),
        }
        let heldout = log[1]["heldout_accuracy"]
            .as_f64()
            .expect("held-out accuracy is measured");
        assert!((0.0..=1.0).contains(&heldout));
        let config: Value = serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
        assert_eq!(config["architectures"][0], "Qwen2ForCausalLM", "{name}");
        let before = std::fs::read(Path::new(&policy).join("model.safetensors")).unwrap();
        let after = std::fs::read(out.join("model.safetensors")).unwrap();
        assert_ne!(before, after, "{name}: the weights did not move");
        if name == "prime" {
            prime_moved_its_implicit_prm_and_score_reads_it(d, &out, &log[1], &before);
        }
        if name == "lora" {
            lora_adapters_are_beside(&out);
        }
        let rerun: Vec<&str> = a.iter().map(String::as_str).collect();
        a_second_run_resumes_and_its_result_samples(d, &out, &problems, &rerun, &after, name);
    }
}

/// The LoRA case's settings.
const LORA: [&str; 4] = ["--lora-rank", "4", "--lora-targets", "q,v,down"];

/// `rl` with [`LORA`] wrote PEFT's adapter files beside the policy.
fn lora_adapters_are_beside(out: &Path) {
    let adapter: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(adapter["r"], 4);
    assert_eq!(adapter["target_modules"], json!(["q_proj", "v_proj", "down_proj"]));
    assert!(out.join("adapter_model.safetensors").is_file());
}

/// PRIME's implicit PRM moved in training, and `stepwise score` reads its folder as a verifier.
fn prime_moved_its_implicit_prm_and_score_reads_it(d: &Path, out: &Path, last: &Value, before: &[u8]) {
    let prm = out.join("implicit_prm");
    assert!(last["implicit_prm"]["loss"].as_f64().unwrap().is_finite());
    assert_ne!(std::fs::read(prm.join("model.safetensors")).unwrap(), before);
    let (steps, scored) = (d.join("steps.jsonl"), d.join("implicit_prm_scores.jsonl"));
    write_jsonl(
        &steps,
        &[
            json!({"id": "s", "problem_id": "p", "question": "What is 2 + 3?", "steps": [{"text": "2 + 3 = 5"}, {"text": "The answer is 5"}]}),
        ],
    );
    score(&prm, &steps, &scored);
    let scores = common::step_scores(&std::fs::read_to_string(&scored).unwrap(), "prm");
    assert!(scores.len() == 2 && scores.iter().all(|s| s.is_finite()), "{scores:?}");
}

/// Run again on the same folder: it resumes (nothing left to do); then sample from the result.
fn a_second_run_resumes_and_its_result_samples(
    d: &Path,
    out: &Path,
    problems: &Path,
    args: &[&str],
    after: &[u8],
    name: &str,
) {
    let again = stepwise(args);
    assert!(String::from_utf8_lossy(&again.stderr).contains("2 updates"), "{name}");
    assert_eq!(
        std::fs::read(out.join("model.safetensors")).unwrap(),
        after,
        "{name}: resumed, not retrained"
    );
    let generated = d.join(format!("{name}-samples.jsonl"));
    stepwise(&[
        "generate",
        "--model",
        &out.display().to_string(),
        "--input",
        &problems.display().to_string(),
        "-n",
        "2",
        "--max-tokens",
        "8",
        "--output",
        &generated.display().to_string(),
    ]);
    assert_eq!(std::fs::read_to_string(&generated).unwrap().lines().count(), 4);
}

/// `train-prm --lora-rank`: a new classifier head and LoRA's adapters trained on a frozen policy;
/// the base with its new head is written once beside the run, the folder is the merged model
/// (`score` reads it) with PEFT's adapter files, and the same command again resumes, not retrains.
#[test]
fn train_prm_with_lora_trains_a_new_head_on_a_frozen_base() {
    let d_tmp = tmp("train-prm-lora");
    let d = d_tmp.path();
    let data = d.join("labeled.jsonl");
    let rows: Vec<Value> = (0..12)
        .map(|i| json!({"id": format!("s{i}"), "question": format!("count from {i}"),
                        "steps": [step(&format!("{}", i + 1), 0.0, true), step(&format!("{}", i + 2 + i % 3), 0.0, i % 3 != 0)]}))
        .collect();
    write_jsonl(&data, &rows);
    let out = d.join("prm");
    let (data_arg, out_arg, base) = (
        data.display().to_string(),
        out.display().to_string(),
        fixture("qwen2-policy"),
    );
    let command = "train-prm --data DATA --base BASE --head classifier --steps 4 --batch-size 4 --lr 1e-2 --out OUT \
                   --trainer packed --lora-rank 4";
    let args: Vec<&str> = command
        .split_whitespace()
        .map(|a| match a {
            "DATA" => &data_arg,
            "BASE" => &base,
            "OUT" => &out_arg,
            _ => a,
        })
        .collect();
    stepwise(&args);
    let adapter: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(
        (adapter["r"].as_u64(), adapter["task_type"].as_str()),
        (Some(4), Some("TOKEN_CLS"))
    );
    assert_eq!(adapter["modules_to_save"], json!(["score"]));
    assert!(
        adapter["base_model_name_or_path"]
            .as_str()
            .unwrap()
            .ends_with("lora-base"),
        "{adapter}"
    );
    let (header, _) = safetensors_header(&out.join("adapter_model.safetensors"));
    assert!(header.contains_key("base_model.model.score.weight"), "{header:?}");
    assert!(header.contains_key("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"));
    // The embeddings are the base's, the head the run's.
    let tensor = |file: &Path, name: &str| {
        let bytes = std::fs::read(file).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        let at = |i: usize| header[name]["data_offsets"][i].as_u64().unwrap() as usize + 8 + n;
        bytes[at(0)..at(1)].to_vec()
    };
    let (ours, base_dir) = (out.join("model.safetensors"), out.join("lora-base"));
    let frozen = "model.embed_tokens.weight";
    let base_file = base_dir.join("model.safetensors");
    assert!(
        tensor(&ours, frozen) == tensor(&base_file, frozen),
        "a frozen tensor changed"
    );
    assert!(
        tensor(&ours, "score.weight") != tensor(&base_file, "score.weight"),
        "the head did not train"
    );
    let scored = d.join("scored.jsonl");
    score(&out, &data, &scored);
    let scores = common::step_scores(&std::fs::read_to_string(&scored).unwrap(), "prm");
    assert_eq!(scores.len(), 2 * rows.len());
    assert!(scores.iter().any(|x| (x - 0.5).abs() > 1e-3), "training moved nothing");
    let trained = std::fs::read(&ours).unwrap();
    stepwise(&args);
    assert_eq!(std::fs::read(&ours).unwrap(), trained, "resumed, not retrained");
    // The folder continued without LoRA would mix the two: refused.
    let said = common::refused(&args[..args.len() - 2]);
    assert!(said.contains("was trained with LoRA"), "{said}");
}
