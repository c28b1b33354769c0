//! A pretrained-size policy held in bf16 samples on the packed engine's CPU backend, many
//! problems and solutions in one batch: `generate` gives each problem the samples it gets alone,
//! `annotate` labels every record and resumes, and `--dtype f32` keeps the CPU decoder.

mod common;
use common::*;
use serde_json::{json, Value};
use std::path::Path;

fn lines(path: &Path) -> Vec<Value> {
    (std::fs::read_to_string(path).unwrap().lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_pretrained_bf16_policy_samples_and_annotates_in_batches_on_the_packed_engine() {
    let dir_tmp = tmp("packed-sampling", "run");
    let dir = dir_tmp.path();
    let _ = std::fs::remove_dir_all(dir);
    let policy = dir.join("policy");
    write_packed_policy(&policy);
    let policy = policy.to_str().unwrap();
    let questions = [
        "What is 2 + 3?",
        "Name a prime.",
        "Count to four.",
        "What is 7 - 5?",
        "Say done.",
    ];
    let problems: Vec<Value> = (questions.iter().enumerate())
        .map(|(i, q)| json!({"id": format!("p{i}"), "question": q, "answer": "5"}))
        .collect();
    let input = dir.join("problems.jsonl");
    write_jsonl(&input, &problems);
    let generate = |input: &Path, output: &Path, extra: &[&str]| {
        let (input, output) = (input.to_str().unwrap(), output.to_str().unwrap());
        let mut args = vec!["generate", "--model", policy, "--input", input, "--output", output];
        args.extend(["-n", "2", "--max-tokens", "6", "--temperature", "1", "--device", "cpu"]);
        args.extend(extra);
        String::from_utf8_lossy(&stepwise(&args).stderr).into_owned()
    };
    let all = dir.join("all.jsonl");
    let err = generate(&input, &all, &[]);
    assert!(err.contains(&format!("{policy}: cpu (packed engine)")), "{err}");
    let samples = lines(&all);
    let ids: Vec<&str> = samples.iter().map(|s| s["id"].as_str().unwrap()).collect();
    let want: Vec<String> = (0..5).flat_map(|i| [format!("p{i}-0"), format!("p{i}-1")]).collect();
    assert_eq!(ids, want);
    // Each problem alone draws the samples it drew in the batch.
    for (i, p) in problems.iter().enumerate() {
        let (one, out) = (dir.join(format!("one{i}.jsonl")), dir.join(format!("out{i}.jsonl")));
        write_jsonl(&one, std::slice::from_ref(p));
        generate(&one, &out, &[]);
        for (alone, together) in lines(&out).iter().zip(&samples[2 * i..2 * i + 2]) {
            assert_eq!((&alone["id"], &alone["steps"]), (&together["id"], &together["steps"]));
        }
    }
    // f32 weights keep the CPU decoder.
    let err = generate(&input, &dir.join("f32.jsonl"), &["--dtype", "f32"]);
    assert!(err.contains(&format!("{policy}: cpu\n")), "{err}");
    // Monte Carlo labels for every record (three steps each, wrong), resumed to the same file
    // after a cut.
    let solutions: Vec<Value> = (0..6)
        .map(|i| {
            let steps: Vec<Value> = ["First, 2 + 3.", "That is 6.", "The answer is 6."]
                .iter()
                .map(|t| json!({"text": t}))
                .collect();
            json!({"id": format!("s{i}"), "question": questions[i % 5], "steps": steps, "gold_answer": "5"})
        })
        .collect();
    let input = dir.join("solutions.jsonl");
    write_jsonl(&input, &solutions);
    let labelled = dir.join("labelled.jsonl");
    let annotate = || {
        let (input, labelled) = (input.to_str().unwrap(), labelled.to_str().unwrap());
        stepwise(&[
            "annotate",
            "--policy",
            policy,
            "--input",
            input,
            "--output",
            labelled,
            "--rollouts",
            "3",
            "--max-tokens",
            "4",
            "--device",
            "cpu",
        ]);
    };
    annotate();
    let text = std::fs::read_to_string(&labelled).unwrap();
    let records = lines(&labelled);
    assert_eq!(records.len(), 6);
    for r in &records {
        let steps = r["steps"].as_array().unwrap();
        assert!(steps.iter().all(|s| s["label"].is_object()), "{r}");
        assert!(r["meta"]["rollouts"].as_u64().unwrap() >= 3, "{r}");
    }
    let cut: String = text.lines().take(2).map(|l| format!("{l}\n")).collect();
    std::fs::write(&labelled, cut).unwrap();
    annotate();
    assert_eq!(std::fs::read_to_string(&labelled).unwrap(), text);
    let _ = std::fs::remove_dir_all(dir);
}
