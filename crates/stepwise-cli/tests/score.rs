//! `stepwise score` on files: a run killed mid-way (`kill -9`) resumes to the file an
//! uninterrupted run writes, an output started with other settings is refused, `--dtype` says
//! what is computed, progress shows in logs.

use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{fixture, step, stepwise, write_jsonl};

fn tmp(name: &str) -> tempfile::TempDir {
    common::tmp("score", name)
}

/// `count` ProcessBench-style records of two steps.
fn processbench_rows(p: &Path, count: usize) {
    let rows: Vec<Value> = (0..count)
        .map(|i| {
            json!({"id": format!("s{i}"), "problem": format!("What is {i} + 1?"),
                   "steps": [format!("{i} + 1 = {}.", i + 1), format!("The answer is {}.", i + 1)],
                   "label": -1, "final_answer_correct": true})
        })
        .collect();
    write_jsonl(p, &rows);
}

fn score_args<'a>(input: &'a Path, out: &'a Path, extra: &[&'a str]) -> Vec<String> {
    let prm = fixture("qwen2-prm");
    let mut args = vec!["score", "--model", &prm, "--input", input.to_str().unwrap()];
    args.extend(["--output", out.to_str().unwrap()]);
    args.extend(extra);
    args.into_iter().map(String::from).collect()
}

fn lines(p: &Path) -> usize {
    std::fs::read_to_string(p).map(|t| t.lines().count()).unwrap_or(0)
}

/// `score` killed with SIGKILL part-way, started again: it keeps what was written, drops a torn
/// last line, takes over the dead process's lock and scores only the rest, to the bytes an
/// uninterrupted run writes; the same output with another verifier name is refused, naming it.
#[test]
fn score_killed_mid_run_resumes_to_the_file_of_a_run_that_was_not() {
    let d_tmp = tmp("resume");
    let d = d_tmp.path();
    let input = d.join("in.jsonl");
    processbench_rows(&input, 3000);
    let whole = d.join("whole.jsonl");
    let said = stepwise(
        &score_args(&input, &whole, &["--batch-size", "1"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert!(said.status.success());
    assert_eq!(lines(&whole), 3000);

    let cut = d.join("cut.jsonl");
    let args = score_args(&input, &cut, &["--batch-size", "1"]);
    kill_once_written(&args, &cut);
    let kept = lines(&cut);
    assert!((100..3000).contains(&kept), "killed at {kept} lines: not part-way");
    // What else a kill can leave: a torn last line.
    let mut text = std::fs::read_to_string(&cut).unwrap();
    text.push_str(r#"{"id": "s"#);
    std::fs::write(&cut, text).unwrap();
    let said = stepwise(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let log = String::from_utf8_lossy(&said.stderr);
    assert!(log.contains(&format!("({kept} scored before were kept)")), "{log}");
    assert_eq!(
        std::fs::read(&whole).unwrap(),
        std::fs::read(&cut).unwrap(),
        "the resumed run lost, changed or doubled records"
    );

    let other = score_args(&input, &cut, &["--name", "orm"]);
    let refused = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args(&other)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        err.contains("was started with other settings (`name`: \"prm\" then, \"orm\" now"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&whole).unwrap(),
        std::fs::read(&cut).unwrap(),
        "the refused run wrote"
    );
    parquet_output_resumes_from_the_journal_beside_it(d, &input, &whole);
}

/// Run `stepwise` with `args` and kill it (SIGKILL) once `journal` holds 100 lines, or when it
/// ends first.
fn kill_once_written(args: &[String], journal: &Path) {
    let mut run = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args(args)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while lines(journal) < 100 && run.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(300) {
        std::thread::sleep(Duration::from_millis(5));
    }
    run.kill().unwrap();
    run.wait().unwrap();
}

/// A Parquet output is written at the end from `OUTPUT.partial.jsonl`, a journal that a run
/// killed part-way resumes like any other; a name stepwise cannot write is refused up front.
fn parquet_output_resumes_from_the_journal_beside_it(d: &Path, input: &Path, whole: &Path) {
    let parquet = d.join("cut.parquet");
    let partial = d.join("cut.parquet.partial.jsonl");
    let args = score_args(input, &parquet, &["--batch-size", "1"]);
    kill_once_written(&args, &partial);
    let kept = lines(&partial);
    assert!(
        (100..3000).contains(&kept) && !parquet.exists(),
        "killed at {kept} lines: not part-way"
    );
    let said = stepwise(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let log = String::from_utf8_lossy(&said.stderr);
    assert!(log.contains(&format!("({kept} scored before were kept)")), "{log}");
    assert!(!partial.exists(), "the journal outlived the output");
    assert_eq!(
        stepwise_core::read_solutions(whole, None).unwrap(),
        stepwise_core::read_solutions(&parquet, None).unwrap(),
        "the resumed Parquet output lost, changed or doubled records"
    );
    let csv = d.join("scores.csv");
    let err = common::refused(&score_args(input, &csv, &[]));
    assert!(err.contains("does not write `.csv`"), "{err}");
    assert!(!d.join("scores.csv.partial.jsonl").exists() && !csv.exists());
}

/// `--dtype` states what is computed: `f32` and `bf16-weights` (bf16 held, f32 products) give the
/// same scores for the bf16 PRM fixture; `auto` (bf16 held and, on AVX512_BF16 CPUs, multiplied
/// in bf16) stays within bf16's error of them; an unknown value is refused.
#[test]
fn dtype_states_what_is_computed() {
    let d_tmp = tmp("dtype");
    let d = d_tmp.path();
    let data = d.join("steps.jsonl");
    let rows: Vec<Value> = (0..3)
        .map(|i| {
            json!({"id": format!("s{i}"), "question": format!("What is {i} + 2?"),
                   "steps": [step(&format!("{i} + 2 = {}", i + 2), 0.0, true), step("So the answer is 4", 0.0, i == 2)]})
        })
        .collect();
    write_jsonl(&data, &rows);
    let prm = fixture("qwen2-prm");
    let scores = |dtype: &str| {
        let out = d.join(format!("{dtype}.jsonl"));
        let args = ["score", "--dtype", dtype, "--model", &prm, "--input"];
        stepwise(&[&args[..], &[data.to_str().unwrap(), "--output", out.to_str().unwrap()]].concat());
        common::step_scores(&std::fs::read_to_string(&out).unwrap(), "prm")
    };
    let (f32_scores, held, auto) = (scores("f32"), scores("bf16-weights"), scores("auto"));
    assert_eq!(f32_scores.len(), 6);
    for ((x, y), z) in f32_scores.iter().zip(&held).zip(&auto) {
        assert!((x - y).abs() < 1e-6, "bf16-weights {y} vs f32 {x}");
        assert!((x - z).abs() < 0.02, "auto {z} vs f32 {x}");
    }
    let refused = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args([
            "--dtype",
            "fp8",
            "score",
            "--model",
            &prm,
            "--input",
            data.to_str().unwrap(),
            "--output",
            "-",
        ])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("bf16-weights"));
}

/// In a log (stderr not a terminal), long commands print their progress as plain lines.
#[test]
fn progress_shows_in_logs() {
    let d_tmp = tmp("progress");
    let d = d_tmp.path();
    let input = d.join("many.jsonl");
    processbench_rows(&input, 400);
    let out = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args(["score", "--model", &fixture("qwen2-prm"), "--batch-size", "2"])
        .args([
            "--input",
            input.to_str().unwrap(),
            "--output",
            d.join("out.jsonl").to_str().unwrap(),
        ])
        .env("STEPWISE_PROGRESS_EVERY", "0.01")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(
        log.lines().any(|l| l.starts_with("scoring: ") && l.contains("/400")),
        "no progress line in\n{log}"
    );
}
