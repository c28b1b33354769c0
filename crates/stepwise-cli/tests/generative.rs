//! `stepwise score --verifier generative`: a policy writes verification chains and each step is
//! scored by its verdicts, under `scores.NAME` like a PRM's, and `bon` reads them.

use serde_json::{json, Value};
use std::path::PathBuf;

mod common;
use common::{fixture, step_scores, stepwise, write_jsonl};

fn tmp(name: &str) -> PathBuf {
    common::tmp("generative", name)
}

#[test]
fn a_generative_verifier_scores_steps_that_bon_reads() {
    let dir = tmp("score");
    let input = dir.join("steps.jsonl");
    let rows: Vec<Value> = (0..3)
        .map(|i| {
            json!({"id": format!("s{i}"), "problem_id": "p", "question": "What is 2 + 3?", "gold_answer": "5",
                   "final_answer": if i == 0 { "5" } else { "6" }, "correct": i == 0,
                   "steps": [{"text": "2 + 3 = 5"}, {"text": format!("The answer is {}.", if i == 0 { 5 } else { 6 })}]})
        })
        .collect();
    write_jsonl(&input, &rows);
    let out = dir.join("scored.jsonl");
    let run = stepwise(&[
        "score",
        "--verifier",
        "generative",
        "--model",
        &fixture("qwen2-policy"),
        "--samples",
        "2",
        "--max-tokens",
        "16",
        "--name",
        "gen",
        "--input",
        input.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]);
    let scores = step_scores(&std::fs::read_to_string(&out).unwrap(), "gen");
    assert_eq!(scores.len(), 6, "{}", String::from_utf8_lossy(&run.stderr));
    // Random weights write no verdict: every step is unjudged, 0.5.
    assert!(scores.iter().all(|&s| s == 0.5), "{scores:?}");
    let bon = dir.join("bon");
    stepwise(&[
        "bon",
        "--input",
        out.to_str().unwrap(),
        "--prm",
        "gen",
        "--out",
        bon.to_str().unwrap(),
    ]);
    assert!(bon.join("bon.json").exists() || std::fs::read_dir(&bon).unwrap().count() > 0);
}
