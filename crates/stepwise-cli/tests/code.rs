//! The code domain from the command line: `grade --task code` runs HumanEval's programs in the
//! sandbox (the reference solutions pass, broken ones fail, pass@k is the unbiased estimate),
//! and `generate`/`search`/`annotate --task code` sample, search and label programs line by line
//! by execution.
//! Needs `python3` on PATH (as the Python package's build does).

use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;

mod common;
use common::{fixture, stepwise, write_jsonl};

fn tmp(name: &str) -> tempfile::TempDir {
    common::tmp("code", name)
}

fn humaneval_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/humaneval/HumanEval.jsonl")
}

fn humaneval() -> Vec<Value> {
    std::fs::read_to_string(humaneval_path())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn jsonl(text: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(text)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn grade_runs_every_reference_solution_and_reports_pass_at_k() {
    let dir_tmp = tmp("grade");
    let dir = dir_tmp.path();
    let problems = humaneval();
    let mut samples = Vec::new();
    for p in &problems {
        samples.push(json!({"task_id": p["task_id"], "completion": p["canonical_solution"]}));
        samples.push(json!({"task_id": p["task_id"], "completion": "    raise NotImplementedError\n"}));
    }
    // A stepwise solution: the reference's lines as steps.
    let lines: Vec<&str> = problems[2]["canonical_solution"]
        .as_str()
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    let record = json!({"id": "s", "problem_id": problems[2]["task_id"], "question": "", "steps": lines});
    let input = dir.join("samples.jsonl");
    write_jsonl(&input, &samples);
    let records = dir.join("records.jsonl");
    write_jsonl(&records, &[record]);
    let he = humaneval_path().display().to_string();

    let out = stepwise(&["grade", "--task", "code", "--problems", &he, input.to_str().unwrap()]);
    let graded = jsonl(&out.stdout);
    assert_eq!(graded.len(), 2 * problems.len());
    for (i, g) in graded.iter().enumerate() {
        let reference = i % 2 == 0;
        assert_eq!(g["passed"], json!(reference), "{g}");
        assert_eq!(g["task_id"], samples[i]["task_id"], "records keep their order");
        if reference {
            assert_eq!(g["result"], "passed");
            assert!(g["tests_run"].as_u64().unwrap() > 0, "{g}");
            assert_eq!(g["tests_passed"], g["tests_run"]);
        } else {
            let result = g["result"].as_str().unwrap();
            assert!(result.contains("NotImplementedError"), "{g}");
        }
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("164 problems") && stderr.contains("pass@1 50.0%"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("pass@10"),
        "two samples a problem: no pass@10: {stderr}"
    );

    let out = stepwise(&["grade", "--task", "code", "--problems", &he, records.to_str().unwrap()]);
    let graded = jsonl(&out.stdout);
    assert_eq!(graded[0]["passed"], true, "{}", graded[0]);
    assert_eq!(
        graded[0]["correct"], true,
        "stepwise records are graded in `correct` too"
    );

    // A problem that --problems does not have, and a record with no program, are named.
    for (bad, field) in [
        (
            json!({"task_id": "HumanEval/9999", "completion": "    pass\n"}),
            "task_id",
        ),
        (json!({"task_id": "HumanEval/0"}), "completion"),
    ] {
        let input = dir.join("bad.jsonl");
        write_jsonl(&input, &[samples[0].clone(), bad]);
        let out = Command::new(env!("CARGO_BIN_EXE_stepwise"))
            .args(["grade", "--task", "code", "--problems", &he, input.to_str().unwrap()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("bad.jsonl:2") && stderr.contains(&format!("`{field}`")),
            "{stderr}"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args(["grade", "--task", "code", input.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--problems"),
        "code grading needs the problems"
    );
}

/// `grade --task code --output FILE.jsonl` killed with SIGKILL part-way and started again runs
/// only the programs it lacks (a torn last line dropped): the file holds the records stdout gets
/// from an uninterrupted run, and pass@k counts the kept ones; other settings are refused.
#[test]
fn grade_killed_mid_run_resumes_to_the_records_of_a_run_that_was_not() {
    let dir_tmp = tmp("grade-resume");
    let dir = dir_tmp.path();
    let samples: Vec<Value> = humaneval()
        .iter()
        .flat_map(|p| {
            [
                json!({"task_id": p["task_id"], "completion": p["canonical_solution"]}),
                json!({"task_id": p["task_id"], "completion": "    return None\n"}),
            ]
        })
        .collect();
    let input = dir.join("samples.jsonl");
    write_jsonl(&input, &samples);
    let he = humaneval_path().display().to_string();
    let args = |out: &std::path::Path, timeout: &str| -> Vec<String> {
        let mut a = vec!["grade", "--task", "code", "--problems", &he, "--code-timeout", timeout];
        a.extend([
            "--threads",
            "2",
            input.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
        ]);
        a.into_iter().map(String::from).collect()
    };
    let whole = stepwise(&["grade", "--task", "code", "--problems", &he, input.to_str().unwrap()]);
    let cut = dir.join("cut.jsonl");
    let mut run = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args(args(&cut, "10"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let lines = || std::fs::read_to_string(&cut).map_or(0, |t| t.lines().count());
    while lines() < 40 && run.try_wait().unwrap().is_none() {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    run.kill().unwrap();
    run.wait().unwrap();
    let kept = lines();
    assert!(
        (40..samples.len()).contains(&kept),
        "killed at {kept} lines: not part-way"
    );
    let mut text = std::fs::read_to_string(&cut).unwrap();
    text.push_str(r#"{"task_id": "Hum"#);
    std::fs::write(&cut, text).unwrap();
    let again = args(&cut, "10");
    let resumed = stepwise(&again.iter().map(String::as_str).collect::<Vec<_>>());
    let said = String::from_utf8_lossy(&resumed.stderr);
    assert!(said.contains(&format!("({kept} graded before were kept)")), "{said}");
    assert!(
        said.contains("ran 328 programs of 164 problems") && said.contains("pass@1 50.0%"),
        "{said}"
    );
    assert_eq!(
        jsonl(&std::fs::read(&cut).unwrap()),
        jsonl(&whole.stdout),
        "the resumed run lost, changed or doubled records"
    );
    let other = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args(args(&cut, "5"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&other.stderr);
    assert_eq!(other.status.code(), Some(1), "{err}");
    assert!(err.contains("was started with other settings (`task.timeout`"), "{err}");
}

#[test]
fn generate_and_annotate_label_program_lines_by_execution() {
    let dir_tmp = tmp("annotate");
    let dir = dir_tmp.path();
    // The three shortest problems: the fixture policy reads 512 positions.
    let mut problems = humaneval();
    problems.sort_by_key(|p| p["prompt"].as_str().unwrap().len() + p["canonical_solution"].as_str().unwrap().len());
    problems.truncate(3);
    let he = dir.join("HumanEval-3.jsonl");
    write_jsonl(&he, &problems);
    let policy = fixture("qwen2-policy");

    // Samples: HumanEval's prompts continued, graded by the tests (a random tiny policy fails).
    let samples = dir.join("samples.jsonl");
    // A command on the code task over these problems, writing `out`.
    let on_code = |command: &str, model_flag: &str, extra: &[&str], out: &std::path::Path| {
        let mut args = vec![
            command,
            model_flag,
            policy.as_str(),
            "--task",
            "code",
            "--input",
            he.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        args.extend(["--output", out.to_str().unwrap()]);
        stepwise(&args)
    };
    on_code("generate", "--model", &["-n", "2", "--max-tokens", "12"], &samples);
    let generated = jsonl(&std::fs::read(&samples).unwrap());
    assert_eq!(generated.len(), 6);
    for (s, p) in generated.iter().zip(problems.iter().flat_map(|p| [p, p])) {
        assert_eq!(s["problem_id"], p["task_id"]);
        assert_eq!(
            s["gold_answer"], p["task_id"],
            "a code solution's gold answer is its problem"
        );
        assert_eq!(s["question"], p["prompt"]);
        assert_eq!(s["correct"], false, "random weights write no passing program: {s}");
    }

    // Step-level search over lines, its results graded by the tests.
    let searched = dir.join("beam.jsonl");
    let prm = fixture("qwen2-prm");
    on_code(
        "search",
        "--policy",
        &[
            "--prm",
            &prm,
            "--method",
            "beam",
            "-n",
            "2",
            "--width",
            "2",
            "--max-steps",
            "3",
            "--max-tokens",
            "6",
        ],
        &searched,
    );
    let found = jsonl(&std::fs::read(&searched).unwrap());
    assert_eq!(found.len(), 3);
    for (s, p) in found.iter().zip(&problems) {
        assert_eq!(s["gold_answer"], p["task_id"]);
        assert_eq!(s["correct"], false, "{s}");
    }

    // Labels of the reference solutions, read straight from HumanEval's file: every step is
    // labelled, and the last is good because the whole program passes its tests.
    let labelled = dir.join("labelled.jsonl");
    let out = on_code(
        "annotate",
        "--policy",
        &["--rollouts", "2", "--max-tokens", "8"],
        &labelled,
    );
    let rows = jsonl(&std::fs::read(&labelled).unwrap());
    assert_eq!(rows.len(), 3, "{}", String::from_utf8_lossy(&out.stderr));
    every_reference_line_is_a_labelled_step(&rows, &problems);

    // Solutions that are not the problems' file need --problems, and say so.
    let out = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args([
            "annotate",
            "--policy",
            &policy,
            "--task",
            "code",
            "--input",
            samples.to_str().unwrap(),
            "--output",
            dir.join("x.jsonl").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--problems"), "{stderr}");
}

/// The reference solutions' labels: a step per line, indentation kept, the last good (the whole
/// program passes its tests), every prefix rolled out.
fn every_reference_line_is_a_labelled_step(rows: &[Value], problems: &[Value]) {
    for (row, p) in rows.iter().zip(problems) {
        let steps = row["steps"].as_array().unwrap();
        let reference: Vec<&str> = p["canonical_solution"]
            .as_str()
            .unwrap()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect();
        let texts: Vec<&str> = steps.iter().map(|s| s["text"].as_str().unwrap()).collect();
        assert_eq!(texts, reference, "steps are the lines, indentation kept");
        assert!(
            steps.iter().all(|s| s["label"]["source"]["kind"] == "monte_carlo"),
            "{row}"
        );
        let last = &steps.last().unwrap()["label"];
        assert_eq!(last["p"], 1.0, "the reference passes its tests: {row}");
        let rolled: u64 = steps[..steps.len() - 1]
            .iter()
            .map(|s| s["label"]["source"]["rollouts"].as_u64().unwrap())
            .sum();
        assert_eq!(
            rolled,
            2 * (steps.len() as u64 - 1),
            "a correct program is rolled out at every prefix"
        );
    }
}
