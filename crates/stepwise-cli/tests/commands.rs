//! The stage subcommands on files: `annotate` (resumable), `bon`, `eval processbench` and
//! `eval prmbench`, `search`; outputs that are inputs, closed stdout. `score` is in `score.rs`,
//! `train-prm` and `rl` in `train.rs`.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{fixture, step, stepwise, write_jsonl};

fn tmp(name: &str) -> tempfile::TempDir {
    common::tmp("cmd", name)
}

#[test]
fn annotate_labels_every_step_by_rollouts_and_resumes() {
    let d_tmp = tmp("annotate");
    let d = d_tmp.path();
    let input = d.join("samples.jsonl");
    let rows: Vec<Value> = (0..3)
        .map(|i| {
            json!({"id": format!("s{i}"), "problem_id": "p", "question": "What is 3 * 4?",
                   "steps": [{"text": "3 * 4 = 12"}, {"text": "The answer is 12"}], "gold_answer": "12"})
        })
        .collect();
    write_jsonl(&input, &rows);
    let out = d.join("labeled.jsonl");
    let args = [
        "annotate",
        "--policy",
        &fixture("qwen2-policy"),
        "--input",
        input.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--rollouts",
        "3",
        "--max-tokens",
        "12",
    ];
    stepwise(&args);
    let first = std::fs::read_to_string(&out).unwrap();
    let recs: Vec<Value> = first.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(recs.len(), 3);
    for r in &recs {
        let steps = r["steps"].as_array().unwrap();
        assert_eq!(steps[0]["label"]["source"]["kind"], "monte_carlo");
        assert_eq!(steps[0]["label"]["source"]["rollouts"], 3);
        assert!(r["meta"]["rollouts"].as_u64().unwrap() >= 3);
    }
    annotate_resumes_and_refuses_other_settings_inputs_or_checkpoints(d, &rows, &args, &first);
    annotate_by_binary_search(d, &args);
    annotate_by_omegaprm_trees(d, &rows, &args);
    annotate_by_judge_and_consensus(d, &args);
}

/// `annotate` run again, by another spelling of the checkpoint, with other settings, on an edited
/// input or on another checkpoint behind the same path.
fn annotate_resumes_and_refuses_other_settings_inputs_or_checkpoints(
    d: &Path,
    rows: &[Value],
    args: &[&str],
    first: &str,
) {
    let out = d.join("labeled.jsonl");
    // Run again: everything is already labelled, nothing changes.
    stepwise(args);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), first);
    // Resumed with other settings: refused, naming the setting, and nothing is written.
    let mut other = args.to_vec();
    other[8] = "4";
    let refused = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args(&other)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("`rollouts`: 3 then, 4 now"), "{err}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), first);
    assert!(!d.join("labeled.jsonl.lock").exists(), "the lock went with the run");
    // The same checkpoint by another spelling resumes (nothing left to do).
    let slashed = format!("{}/", fixture("qwen2-policy"));
    let mut respelled = args.to_vec();
    respelled[2] = &slashed;
    stepwise(&respelled);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), first);
    // An edited input, or another checkpoint behind the same path: refused, naming which.
    let refused_for = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_stepwise"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let mut edited = rows.to_vec();
    edited[1]["question"] = "What is 3 * 5?".into();
    let edited_input = d.join("edited.jsonl");
    write_jsonl(&edited_input, &edited);
    let mut on_edited = args.to_vec();
    on_edited[4] = edited_input.to_str().unwrap();
    let err = refused_for(&on_edited);
    assert!(err.contains("`input`"), "{err}");
    let copy = d.join("policy-copy");
    std::fs::create_dir_all(&copy).unwrap();
    for f in std::fs::read_dir(fixture("qwen2-policy")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, copy.join(f.file_name().unwrap())).unwrap();
    }
    let copied_out = d.join("copied.jsonl");
    let mut on_copy = args.to_vec();
    on_copy[2] = copy.to_str().unwrap();
    on_copy[6] = copied_out.to_str().unwrap();
    stepwise(&on_copy);
    // Retrained in place: same shapes, one weight changed.
    let weights = copy.join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let at = bytes.len() - 1000;
    bytes[at] ^= 0x40;
    std::fs::write(&weights, bytes).unwrap();
    let err = refused_for(&on_copy);
    assert!(err.contains("`policy.checkpoint`"), "{err}");
}

fn annotate_by_binary_search(d: &Path, args: &[&str]) {
    // Binary search for the first error: hard labels, fewer rollouts than a step-by-step run.
    let bs = d.join("bs.jsonl");
    let mut bs_args = args.to_vec();
    bs_args[6] = bs.to_str().unwrap();
    bs_args.extend(["--method", "binary-search"]);
    stepwise(&bs_args);
    let recs: Vec<Value> = std::fs::read_to_string(&bs)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(recs.len(), 3);
    for r in &recs {
        for st in r["steps"].as_array().unwrap() {
            assert_eq!(st["label"]["source"]["kind"], "binary_search", "{r}");
        }
        assert!(
            r["meta"]["rollouts"].as_u64().unwrap() <= 3,
            "one probe of 3 rollouts for 2 steps: {r}"
        );
    }
}

fn annotate_by_omegaprm_trees(d: &Path, rows: &[Value], args: &[&str]) {
    // OmegaPRM: the same bisection over one tree per problem; the rollouts are kept as new
    // labelled solutions, and the trees convert to OpenR's omegaprm-tree format.
    let tree_in = d.join("tree_in.jsonl");
    write_jsonl(
        &tree_in,
        &[
            rows[0].clone(),
            json!({"id": "wrong", "problem_id": "p", "question": "What is 3 * 4?",
                   "steps": [{"text": "3 * 4 = 13"}, {"text": "The answer is 13"}], "gold_answer": "12"}),
        ],
    );
    let tree = d.join("tree.jsonl");
    let mut tree_args = args.to_vec();
    tree_args[4] = tree_in.to_str().unwrap();
    tree_args[6] = tree.to_str().unwrap();
    tree_args.extend(["--method", "omegaprm", "--search-limit", "2"]);
    let out = stepwise(&tree_args);
    assert!(String::from_utf8_lossy(&out.stderr).contains("new solutions from the trees' rollouts"));
    let recs: Vec<Value> = std::fs::read_to_string(&tree)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let (given, new): (Vec<&Value>, Vec<&Value>) = recs.iter().partition(|r| r["meta"]["omegaprm_rollout"].is_null());
    assert_eq!(given.len(), 2);
    assert_eq!(given[0]["meta"]["rollouts"], 0, "a right solution costs nothing");
    // The random fixture policy never reaches 12: the first step of the wrong one is dead, found
    // by one probe of 3 rollouts, which become new solutions.
    assert_eq!(given[1]["meta"]["rollouts"], 3);
    let probed = &given[1]["steps"][0]["label"];
    assert_eq!(
        (probed["p"].as_f64(), &probed["source"]["hits"]),
        (Some(0.0), &json!(0)),
        "{}",
        given[1]
    );
    assert_eq!(given[1]["steps"][1]["label"]["rating"], "bad", "{}", given[1]);
    assert!(!new.is_empty() && new.len() <= 3, "{} new solutions", new.len());
    let converted = d.join("trees.jsonl");
    stepwise(&[
        "convert",
        tree.to_str().unwrap(),
        converted.to_str().unwrap(),
        "--to",
        "omegaprm-tree",
    ]);
    let trees = std::fs::read_to_string(&converted).unwrap();
    assert_eq!(trees.lines().count(), 1, "one tree for the one problem");
    assert!(trees.contains("\"children\""));
}

fn annotate_by_judge_and_consensus(d: &Path, args: &[&str]) {
    // A judge is needed for judge and consensus; the fixture policy as a judge gives no
    // readable verdict, so consensus keeps no labels and says so.
    let judged_out = d.join("judge.jsonl");
    let mut judged = args.to_vec();
    judged[6] = judged_out.to_str().unwrap();
    judged.extend(["--method", "judge"]);
    let refused = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args(&judged)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("needs --judge"));
    let consensus = d.join("consensus.jsonl");
    let mut both = args.to_vec();
    both[6] = consensus.to_str().unwrap();
    let judge = fixture("qwen2-policy");
    both.extend(["--method", "consensus", "--judge", &judge, "--judge-samples", "2"]);
    let out = stepwise(&both);
    assert!(String::from_utf8_lossy(&out.stderr).contains("% retained"));
    let lines = std::fs::read_to_string(&consensus).unwrap();
    assert_eq!(lines.lines().count(), 3);
    for line in lines.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        let kept = r["meta"]["consensus"].as_bool().unwrap();
        let labelled = r["steps"]
            .as_array()
            .unwrap()
            .iter()
            .all(|st| st.get("label").is_some());
        assert_eq!(kept, labelled, "{r}");
    }
}

#[test]
fn bon_and_processbench_on_scored_files() {
    let d_tmp = tmp("bon");
    let d = d_tmp.path();
    // Problem p1: the PRM prefers the correct sample, the majority is wrong.
    // Problem p2: one sample, correct.
    let rows = vec![
        json!({"id": "a", "problem_id": "p1", "question": "q1", "final_answer": "5", "correct": true,
               "steps": [step("x", 0.9, true), step("y", 0.8, true)]}),
        json!({"id": "b", "problem_id": "p1", "question": "q1", "final_answer": "6", "correct": false,
               "steps": [step("x", 0.9, true), step("z", 0.2, false)]}),
        json!({"id": "c", "problem_id": "p1", "question": "q1", "final_answer": "6", "correct": false,
               "steps": [step("w", 0.3, false), step("z", 0.6, false)]}),
        json!({"id": "e", "problem_id": "p2", "question": "q2", "final_answer": "1", "correct": true,
               "steps": [step("v", 0.7, true)]}),
    ];
    let scored = d.join("scored.jsonl");
    write_jsonl(&scored, &rows);
    let out = stepwise(&[
        "bon",
        "--input",
        scored.to_str().unwrap(),
        "--ns",
        "3",
        "--out",
        d.to_str().unwrap(),
    ]);
    let table = String::from_utf8(out.stdout).unwrap();
    let row = |m: &str| -> String {
        table
            .lines()
            .find(|l| l.starts_with(&format!("| {m} |")))
            .unwrap()
            .to_string()
    };
    assert!(row("PRM (min)").contains("| 1.000"), "{table}");
    assert!(row("majority vote").contains("| 0.500"), "{table}");
    assert!(row("pass@N").contains("| 1.000"), "{table}");
    assert!(d.join("bon.json").exists() && d.join("bon.png").exists());

    // First errors: a → none (predicted none), b → 1 (predicted 1), c → 0 (predicted 0),
    // e → none (predicted none): everything found.
    let out = stepwise(&["eval", "processbench", "--input", scored.to_str().unwrap()]);
    let text = String::from_utf8(out.stdout).unwrap();
    let m: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(m["f1"], 1.0, "{text}");
    assert_eq!(m["counts"], json!([2, 2]));
}

/// `stepwise search` with the fixture policy on `problems`, a step and token budget small
/// enough for a test, and `extra` flags.
fn search(policy: &str, problems: &Path, prm: &str, method: &str, out: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "search",
        "--policy",
        policy,
        "--prm",
        prm,
        "--method",
        method,
        "--max-steps",
        "3",
        "--max-tokens",
        "6",
        "--input",
        problems.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    stepwise(&args)
}

/// The records of a JSONL file.
fn records(p: &Path) -> Vec<Value> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `stepwise search`: every method with every PRM layout on the fixture checkpoints; records
/// carry each step's score and the method's compute; a second run resumes (nothing changes);
/// incremental and whole scoring choose the same; `calibrate` writes the τ `resample` reads.
#[test]
fn search_runs_every_method_with_every_prm_layout_and_resumes() {
    let d_tmp = tmp("search");
    let d = d_tmp.path();
    let problems = d.join("problems.jsonl");
    write_jsonl(
        &problems,
        &[
            json!({"id": "a", "question": "What is 2 + 3?", "answer": "5"}),
            json!({"id": "b", "question": "What is 4 * 2?", "answer": "8"}),
        ],
    );
    let policy = fixture("qwen2-policy");
    for prm in ["qwen2-prm", "llama-shepherd", "qwen2-tokcls"] {
        let prm = fixture(prm);
        every_method_searches_and_resumes_after_a_torn_write(d, &policy, &problems, &prm);
        incremental_scoring_is_whole_scoring_with_fewer_tokens(d, &policy, &problems, &prm);
    }
    calibrate_writes_the_threshold_resample_reads(d, &policy, &problems);
}

/// Every method with the PRM `prm`: its records, their compute, and resumed (after a torn
/// write too) to an uninterrupted run's file.
fn every_method_searches_and_resumes_after_a_torn_write(d: &Path, policy: &str, problems: &Path, prm: &str) {
    for method in ["bon", "beam", "dvts", "lookahead", "resample"] {
        let out = d.join(format!("{}-{method}.jsonl", prm.len()));
        let _ = std::fs::remove_file(&out);
        let args = ["-n", "4", "--width", "2", "--threshold", "0.5", "--temperature", "1.0"];
        search(policy, problems, prm, method, &out, &args);
        let recs = records(&out);
        assert_eq!(recs.len(), 2, "{prm} {method}");
        for r in &recs {
            let steps = r["steps"].as_array().unwrap().len();
            assert!((1..=3).contains(&steps), "{prm} {method}: {steps} steps");
            assert_eq!(r["scores"]["prm"].as_array().unwrap().len(), steps, "{prm} {method}");
            assert_eq!(r["meta"]["search"]["method"], method);
            let c = &r["meta"]["compute"];
            assert!(c["generated_tokens"].as_u64().unwrap() > 0, "{prm} {method}");
            assert!(c["encoded_tokens"].as_u64().unwrap() > 0, "{prm} {method}");
            assert!(r["correct"].is_boolean());
        }
        // Records without their wall time, which no two runs share.
        let timeless = |text: &str| -> Vec<Value> {
            text.lines()
                .map(|l| {
                    let mut v: Value = serde_json::from_str(l).unwrap();
                    v["meta"]["compute"]["seconds"] = json!(0);
                    v
                })
                .collect()
        };
        let first = std::fs::read_to_string(&out).unwrap();
        search(policy, problems, prm, method, &out, &args);
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            first,
            "resumed, not searched again"
        );
        // Killed while writing the second record: the torn line is dropped, the second
        // problem searched again, and the file ends as an uninterrupted run's.
        let second = first.find('\n').unwrap() + 1;
        std::fs::write(&out, &first[..second + (first.len() - second) / 2]).unwrap();
        search(policy, problems, prm, method, &out, &args);
        assert_eq!(
            timeless(&std::fs::read_to_string(&out).unwrap()),
            timeless(&first),
            "{method}: resumed after a torn write"
        );
    }
}

fn incremental_scoring_is_whole_scoring_with_fewer_tokens(d: &Path, policy: &str, problems: &Path, prm: &str) {
    // Incremental and whole scoring of greedy beams (no choice a near-tie could flip: the
    // random fixture PRMs score every step about 0.5): the same scores, fewer tokens encoded.
    let (inc, whole) = (d.join("inc.jsonl"), d.join("whole.jsonl"));
    let _ = (std::fs::remove_file(&inc), std::fs::remove_file(&whole));
    let greedy = ["-n", "2", "--width", "1", "--temperature", "0"];
    search(policy, problems, prm, "beam", &inc, &greedy);
    search(
        policy,
        problems,
        prm,
        "beam",
        &whole,
        &[&greedy[..], &["--whole"]].concat(),
    );
    let (a, b) = (records(&inc), records(&whole));
    let encoded = |recs: &[Value]| -> u64 {
        recs.iter()
            .map(|r| r["meta"]["compute"]["encoded_tokens"].as_u64().unwrap())
            .sum()
    };
    assert!(encoded(&a) < encoded(&b), "{prm}: {} vs {}", encoded(&a), encoded(&b));
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x["steps"], y["steps"], "{prm}");
        let (sx, sy) = (
            x["scores"]["prm"].as_array().unwrap(),
            y["scores"]["prm"].as_array().unwrap(),
        );
        for (u, v) in sx.iter().zip(sy) {
            assert!(
                (u.as_f64().unwrap() - v.as_f64().unwrap()).abs() < 1e-5,
                "{prm}: {u} vs {v}"
            );
        }
    }
}

fn calibrate_writes_the_threshold_resample_reads(d: &Path, policy: &str, problems: &Path) {
    // calibrate writes threshold.json into the PRM folder (a copy), which resample then reads.
    let prm_dir = d.join("prm");
    std::fs::create_dir_all(&prm_dir).unwrap();
    for f in std::fs::read_dir(fixture("qwen2-tokcls")).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), prm_dir.join(f.file_name())).unwrap();
    }
    let labelled = d.join("labelled.jsonl");
    let sol = |id: &str, good: bool| {
        json!({"id": id, "problem_id": "a", "question": "What is 2 + 3?",
               "steps": [{"text": "2 + 3 = 5", "label": {"rating": "good"}},
                         {"text": if good { "The answer is 5" } else { "The answer is 6" }, "label": {"rating": if good {"good"} else {"bad"}}}]})
    };
    write_jsonl(&labelled, &[sol("s1", true), sol("s2", false), sol("s3", true)]);
    let out = d.join("resample.jsonl");
    let missing = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args([
            "search",
            "--policy",
            policy,
            "--prm",
            prm_dir.to_str().unwrap(),
            "--method",
            "resample",
        ])
        .args(["--input", problems.to_str().unwrap(), "--output", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&missing.stderr).contains("stepwise calibrate"));
    stepwise(&[
        "calibrate",
        "--prm",
        prm_dir.to_str().unwrap(),
        "--input",
        labelled.to_str().unwrap(),
        "--precision",
        "0.3",
    ]);
    let t: Value = serde_json::from_str(&std::fs::read_to_string(prm_dir.join("threshold.json")).unwrap()).unwrap();
    let tau = t["tau"].as_f64().unwrap();
    search(
        policy,
        problems,
        prm_dir.to_str().unwrap(),
        "resample",
        &out,
        &["--temperature", "1.0"],
    );
    let recs = records(&out);
    assert!((recs[0]["meta"]["search"]["threshold"].as_f64().unwrap() - tau).abs() < 1e-6);
}

/// Nothing is lost by misuse: an output that is the input is refused before anything is written
/// (by any path to it), and a run that fails leaves an existing output as it was.
#[test]
fn an_output_that_is_the_input_is_refused_and_a_failed_run_keeps_the_old_output() {
    let d_tmp = tmp("same-file");
    let d = d_tmp.path();
    let input = d.join("in.jsonl");
    let rows: Vec<Value> = (0..50)
        .map(|i| json!({"id": format!("s{i}"), "problem_id": "p", "question": "q", "steps": [{"text": "a"}]}))
        .collect();
    write_jsonl(&input, &rows);
    let before = std::fs::read(&input).unwrap();
    let aliased = d.join(".").join("in.jsonl");
    for args in [
        vec!["convert", input.to_str().unwrap(), aliased.to_str().unwrap()],
        vec![
            "score",
            "--model",
            &fixture("qwen2-tokcls"),
            "--input",
            input.to_str().unwrap(),
            "--output",
            aliased.to_str().unwrap(),
        ],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_stepwise"))
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("the output is the input"),
            "{args:?}"
        );
        assert_eq!(std::fs::read(&input).unwrap(), before, "{args:?}: the input changed");
    }
    // Repeated ids: refused where records are matched by id, naming both.
    let twice = d.join("twice.jsonl");
    write_jsonl(&twice, &[rows[0].clone(), rows[1].clone(), rows[0].clone()]);
    for args in [
        vec!["eval", "processbench", "--input", twice.to_str().unwrap()],
        vec!["bon", "--input", twice.to_str().unwrap()],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_stepwise"))
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(
            err.contains("record 3: field `id`: `s0` is the id of record 1 too"),
            "{args:?}: {err}"
        );
    }
    // A solution with no step has no first error to find: eval says so instead of counting it.
    let empty = d.join("empty.jsonl");
    write_jsonl(
        &empty,
        &[json!({"id": "e", "problem_id": "p", "question": "q", "steps": [], "scores": {"prm": []}})],
    );
    let out = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args(["eval", "processbench", "--input", empty.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("field `steps`: empty"));
    // A conversion that fails half-way (a broken record) leaves the previous output untouched.
    let output = d.join("out.jsonl");
    std::fs::write(&output, "previous\n").unwrap();
    let broken = d.join("broken.jsonl");
    let mut text = std::fs::read_to_string(&input).unwrap();
    text.push_str("{not json\n");
    std::fs::write(&broken, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args(["convert", broken.to_str().unwrap(), output.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(std::fs::read_to_string(&output).unwrap(), "previous\n");
    let leftovers: Vec<_> = std::fs::read_dir(d)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".partial"))
        .collect();
    assert!(leftovers.is_empty(), "a partial file was left behind");
}

/// Every command that writes to standard output, with its reader gone (`| head` that stopped
/// reading): it ends quietly with status 0, never a panic.
#[test]
fn a_closed_stdout_ends_every_command_quietly() {
    let d_tmp = tmp("closed-stdout");
    let d = d_tmp.path();
    let rows: Vec<Value> = (0..400)
        .map(|i| {
            json!({"id": format!("s{i}"), "problem_id": format!("p{}", i % 40), "question": "q",
                   "final_answer": "5", "correct": i % 3 == 0,
                   "steps": [step("x", 0.9, true), step("y", 0.2, i % 2 == 0)]})
        })
        .collect();
    let scored = d.join("scored.jsonl");
    write_jsonl(&scored, &rows);
    let grades = d.join("grades.jsonl");
    write_jsonl(
        &grades,
        &(0..2000)
            .map(|i| json!({"given": format!("{i}"), "ground_truth": "5"}))
            .collect::<Vec<_>>(),
    );
    let pb = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/processbench/gsm8k.json");
    let (s, g, p) = (scored.to_str().unwrap(), grades.to_str().unwrap(), pb.to_str().unwrap());
    for args in [
        vec!["stats", p],
        vec!["stats", s, "--json"],
        vec!["convert", p, "-"],
        vec!["convert", s, "-", "--to", "trl"],
        vec!["grade", g],
        vec!["bon", "--input", s, "--ns", "1,2,4"],
        vec!["eval", "processbench", "--input", s],
        vec!["--help"],
        vec!["search", "--help"],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_stepwise"))
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(matches!(out.status.code(), Some(0)), "{args:?}: {:?} {err}", out.status);
    }
}

/// `eval prmbench` on PRMBench records scored by `score`: every error type present reported,
/// with every step counted and the error steps as the file marks them.
#[test]
fn eval_prmbench_reports_prm_score_by_error_type() {
    let d_tmp = tmp("prmbench");
    let d = d_tmp.path();
    let sample = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../stepwise-core/tests/data/prmbench_sample.jsonl");
    let scored = d.join("scored.jsonl");
    stepwise(&[
        "score",
        "--model",
        &fixture("qwen2-prm"),
        "--input",
        sample.to_str().unwrap(),
        "--output",
        scored.to_str().unwrap(),
    ]);
    let out = stepwise(&["eval", "prmbench", "--input", scored.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    for name in [
        "Non-Circular Logic (NCL)",
        "Non-Redundancy (NR)",
        "Empirical Soundness (ES)",
        "Step Consistency (SC)",
        "overall",
    ] {
        assert!(text.contains(name), "{name} missing in\n{text}");
    }
    let json: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(json["overall"]["steps"], 5 + 3 + 3 + 2);
    assert_eq!(json["overall"]["error_steps"], 2 + 1 + 2 + 1);
    assert_eq!(json["by_type"]["circular"]["error_steps"], 2);
    let p = json["overall"]["prm_score"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&p), "{json}");
    assert!(json["by_group"]["simplicity"].is_number(), "{json}");
}
