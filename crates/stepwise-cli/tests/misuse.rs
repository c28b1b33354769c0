//! Misuse of whole commands: every subcommand that loads a model, on a checkpoint whose
//! `config.json` is fuzzed field by field, with its standard output closed, and every command
//! that prints onto a full disk (`/dev/full`). Each ends with status 0, 1 or 2 and a message,
//! never a panic (101), and never says one thing twice.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

mod common;
use common::write_jsonl;

fn tmp(name: &str) -> tempfile::TempDir {
    common::tmp("misuse", name)
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(common::fixture(name))
}

/// A copy of fixture `name` in `dir` (weights and tokenizer linked) with `config` as its
/// config.json.
fn checkpoint(name: &str, dir: &Path, config: &Value) -> String {
    std::fs::create_dir_all(dir).unwrap();
    for f in ["model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        let link = dir.join(f);
        if !link.exists() {
            std::os::unix::fs::symlink(fixture(name).join(f), link).unwrap();
        }
    }
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    dir.display().to_string()
}

fn config_of(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name).join("config.json")).unwrap()).unwrap()
}

/// Inputs shared by the model commands.
struct Inputs {
    problems: String,
    labelled: String,
}

fn inputs(d: &Path) -> Inputs {
    let problems = d.join("problems.jsonl");
    write_jsonl(
        &problems,
        &[json!({"id": "p1", "question": "What is 2 + 3?", "answer": "5"})],
    );
    let labelled = d.join("labelled.jsonl");
    let step = |t: &str, good: bool| json!({"text": t, "label": {"rating": if good {"good"} else {"bad"}}});
    write_jsonl(
        &labelled,
        &(0..4)
            .map(|i| {
                json!({"id": format!("s{i}"), "problem_id": "p1", "question": "What is 2 + 3?", "gold_answer": "5",
                       "correct": i % 2 == 0, "steps": [step("2 + 3 = 5", true), step("The answer is 5", i % 2 == 0)]})
            })
            .collect::<Vec<_>>(),
    );
    Inputs {
        problems: problems.display().to_string(),
        labelled: labelled.display().to_string(),
    }
}

/// Every subcommand that loads a checkpoint, on the policy `policy` and the PRM `prm`, writing
/// under `out` (kept small: a token or two, one step of training).
fn model_commands(policy: &str, prm: &str, i: &Inputs, out: &Path) -> Vec<Vec<String>> {
    let o = |name: &str| out.join(name).display().to_string();
    let few = ["--max-tokens", "3"];
    let cmds: Vec<Vec<&str>> = vec![
        vec!["score", "--model", prm, "--input", &i.labelled, "--output"],
        vec!["calibrate", "--prm", prm, "--input", &i.labelled, "--precision", "0.5"],
        vec![
            "generate",
            "--model",
            policy,
            "--input",
            &i.problems,
            "-n",
            "2",
            "--max-tokens",
            "3",
            "--output",
        ],
        vec![
            "annotate",
            "--policy",
            policy,
            "--input",
            &i.labelled,
            "--rollouts",
            "1",
            few[0],
            few[1],
            "--output",
        ],
        vec![
            "search",
            "--policy",
            policy,
            "--prm",
            prm,
            "--method",
            "beam",
            "-n",
            "2",
            "--width",
            "1",
            "--max-steps",
            "2",
            few[0],
            few[1],
            "--input",
            &i.problems,
            "--output",
        ],
        vec![
            "train-prm",
            "--data",
            &i.labelled,
            "--base",
            policy,
            "--steps",
            "1",
            "--batch-size",
            "2",
            "--out",
        ],
        vec![
            "rl",
            "--policy",
            policy,
            "--reward",
            "outcome",
            "--problems",
            &i.problems,
            "--updates",
            "1",
            "--prompts",
            "1",
            "--group-size",
            "2",
            few[0],
            few[1],
            "--out",
        ],
    ];
    cmds.into_iter()
        .enumerate()
        .map(|(k, c)| {
            let mut c: Vec<String> = c.into_iter().map(str::to_string).collect();
            match c[0].as_str() {
                "calibrate" => {}
                "train-prm" | "rl" => c.push(o(&format!("out{k}"))),
                _ => c.push(o(&format!("out{k}.jsonl"))),
            }
            c
        })
        .collect()
}

fn run(args: &[String], stdout: Stdio) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args(args)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

/// The status is 0, 1 or 2; a failure says why, once.
fn assert_clean_exit(args: &[String], out: &Output) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        matches!(out.status.code(), Some(0..=2)) && !err.contains("panicked"),
        "{args:?}: {:?}\n{err}",
        out.status
    );
    if let Some(line) = err.lines().find(|l| l.starts_with("error: ")) {
        let parts: Vec<&str> = line.split(": ").collect();
        for w in parts.windows(2) {
            assert_ne!(w[0], w[1], "{args:?}: said twice: {line}");
        }
    }
}

/// Every field of the policy's and the PRM's config.json set to values that cannot be right:
/// every model command ends cleanly (most refuse, naming the field).
#[test]
fn every_model_command_survives_a_fuzzed_config() {
    let d_tmp = tmp("fuzz");
    let d = d_tmp.path();
    let i = inputs(d);
    let values = [json!(0), json!(-1), json!("x"), json!(1e12)];
    let (mut runs, mut refused) = (0, 0);
    for (which, fixture_name) in [("policy", "qwen2-policy"), ("prm", "qwen2-tokcls")] {
        let original = config_of(fixture_name);
        for field in original.as_object().unwrap().keys() {
            for value in &values {
                let mut config = original.clone();
                config[field.as_str()] = value.clone();
                let case = d.join(format!("case{runs}"));
                let fuzzed = checkpoint(fixture_name, &case.join("model"), &config);
                let good_policy = checkpoint("qwen2-policy", &case.join("policy"), &config_of("qwen2-policy"));
                let good_prm = checkpoint("qwen2-tokcls", &case.join("prm"), &config_of("qwen2-tokcls"));
                let (policy, prm) = match which {
                    "policy" => (fuzzed.as_str(), good_prm.as_str()),
                    _ => (good_policy.as_str(), fuzzed.as_str()),
                };
                for args in model_commands(policy, prm, &i, &case) {
                    // Only the commands that load the fuzzed model.
                    let loads_fuzzed = match which {
                        "policy" => !matches!(args[0].as_str(), "score" | "calibrate"),
                        _ => matches!(args[0].as_str(), "score" | "calibrate" | "search"),
                    };
                    if !loads_fuzzed {
                        continue;
                    }
                    let out = run(&args, Stdio::null());
                    assert_clean_exit(&args, &out);
                    runs += 1;
                    if !out.status.success() {
                        refused += 1;
                        let err = String::from_utf8_lossy(&out.stderr);
                        assert!(err.contains("error: "), "{args:?}: failed without a message");
                    }
                }
                std::fs::remove_dir_all(&case).unwrap();
            }
        }
    }
    println!("{runs} runs on fuzzed configs: {refused} refused with a message, none panicked");
    assert!(refused > 0 && runs > 100);
    let _ = std::fs::remove_dir_all(d);
}

/// With its reader gone before it starts, every model command still finishes its work (it
/// writes files, not standard output) and ends with status 0.
#[test]
fn every_model_command_runs_with_stdout_closed() {
    let d_tmp = tmp("closed");
    let d = d_tmp.path();
    let i = inputs(d);
    let (policy, prm) = (fixture("qwen2-policy"), fixture("qwen2-tokcls"));
    // calibrate writes threshold.json into the PRM's folder: give it a copy.
    let prm_copy = checkpoint("qwen2-tokcls", &d.join("prm"), &config_of("qwen2-tokcls"));
    for mut args in model_commands(policy.to_str().unwrap(), prm.to_str().unwrap(), &i, d) {
        if args[0] == "calibrate" {
            args[2] = prm_copy.clone();
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_stepwise"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        assert_clean_exit(&args, &out);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let written = Path::new(args.last().unwrap());
        assert!(written.exists() || args[0] == "calibrate", "{args:?}: nothing written");
    }
    assert!(d.join("prm/threshold.json").exists());
    let _ = std::fs::remove_dir_all(d);
}

/// Printing onto a full disk: status 1 and the system's reason, once; help and version too.
#[test]
fn a_full_disk_ends_every_printing_command_with_a_message() {
    let d_tmp = tmp("full");
    let d = d_tmp.path();
    let scored = d.join("scored.jsonl");
    write_jsonl(
        &scored,
        &(0..50)
            .map(|k| {
                json!({"id": format!("s{k}"), "problem_id": format!("p{}", k % 5), "question": "q", "final_answer": "5",
                       "correct": k % 2 == 0, "scores": {"prm": [0.9, 0.1 * (k % 10) as f64]},
                       "steps": [{"text": "a", "label": {"rating": "good"}}, {"text": "b", "label": {"rating": if k % 2 == 0 {"good"} else {"bad"}}}]})
            })
            .collect::<Vec<_>>(),
    );
    let grades = d.join("grades.jsonl");
    write_jsonl(&grades, &[json!({"given": "5", "ground_truth": "5"})]);
    let pb = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/processbench/gsm8k.json");
    let (s, g, p) = (
        scored.display().to_string(),
        grades.display().to_string(),
        pb.display().to_string(),
    );
    for args in [
        vec!["stats", &p],
        vec!["convert", &p, "-"],
        vec!["grade", &g],
        vec!["bon", "--input", &s, "--ns", "1,2"],
        vec!["eval", "processbench", "--input", &s],
        vec!["--help"],
        vec!["score", "--help"],
        vec!["--version"],
    ] {
        let args: Vec<String> = args.into_iter().map(str::to_string).collect();
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let out = run(&args, Stdio::from(full));
        assert_clean_exit(&args, &out);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.matches("No space left on device").count(), 1, "{args:?}: {err}");
    }
    // A data error names file, line and field, once.
    let bad = d.join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"id\": \"a\", \"question\": \"q\", \"steps\": [{\"text\": 1}]}\n",
    )
    .unwrap();
    let args = vec!["stats".to_string(), bad.display().to_string()];
    let out = run(&args, Stdio::null());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(err.matches("invalid type").count(), 1, "{err}");
    assert!(err.contains("bad.jsonl:1"), "{err}");
    let _ = std::fs::remove_dir_all(d);
}

/// Outputs that are not regular files are written as a user expects: a device is written through
/// and stays a device (`/dev/null`, and `/dev/full` with a message naming it), a link stays a
/// link and the file it points to is updated, a name at the file system's limit is written.
#[test]
fn special_outputs_are_written_through_and_links_followed() {
    let d_tmp = tmp("special");
    let d = d_tmp.path();
    std::fs::create_dir_all(d).unwrap();
    let pb = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/processbench/gsm8k.json");
    let pb = pb.display().to_string();
    let convert = |out: &str| {
        run(
            &["convert".into(), pb.clone(), out.into(), "--to".into(), "trl".into()],
            Stdio::null(),
        )
    };
    let out = convert("/dev/null");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device());
    let out = convert("/dev/full");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("/dev/full") && err.contains("No space left"), "{err}");
    assert!(std::fs::metadata("/dev/full").unwrap().file_type().is_char_device());
    let target = d.join("real.jsonl");
    std::fs::write(&target, "old").unwrap();
    let link = d.join("link.jsonl");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    assert_eq!(convert(&link.display().to_string()).status.code(), Some(0));
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read_to_string(&target).unwrap().lines().count(), 400);
    let long = d.join(format!("{}.jsonl", "x".repeat(248)));
    assert_eq!(convert(&long.display().to_string()).status.code(), Some(0));
    // Nothing partial is left beside them.
    let left: Vec<_> = std::fs::read_dir(d)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".partial"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let _ = std::fs::remove_dir_all(d);
}

/// Inputs that are not records end with a message, in bounded memory: a device that never ends
/// a line (`/dev/zero`) stops at the longest line stepwise reads, naming the file and line, and
/// a named pipe (process substitution's `/dev/fd/N`) is read as a file; a checkpoint whose
/// `tokenizer.json` or `config.json` is a device is refused, naming the file.
#[test]
fn special_inputs_end_with_a_message_in_bounded_memory() {
    let stats = |path: &str| run(&["stats".into(), path.into()], Stdio::null());
    let out = stats("/dev/zero");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("/dev/zero:1") && err.contains("longer than 64 MiB"),
        "{err}"
    );
    let d_tmp = tmp("special-inputs");
    let d = d_tmp.path();
    std::fs::create_dir_all(d).unwrap();
    let fifo = d.join("records.fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::write(&fifo, "{\"given\": \"1\", \"ground_truth\": \"1\"}\n").unwrap())
    };
    let out = run(&["grade".into(), fifo.display().to_string()], Stdio::piped());
    writer.join().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"correct\":true"));
    // A checkpoint whose small files are devices: refused by name, not read without end.
    let fixture = PathBuf::from(common::fixture("qwen2-prm"));
    for file in ["tokenizer.json", "config.json"] {
        let model = d.join(format!("device-{file}"));
        std::fs::create_dir_all(&model).unwrap();
        for f in [
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "model.safetensors",
        ] {
            if f != file {
                std::fs::copy(fixture.join(f), model.join(f)).unwrap();
            }
        }
        std::os::unix::fs::symlink("/dev/zero", model.join(file)).unwrap();
        let (model, output) = (
            model.display().to_string(),
            d.join("scored.jsonl").display().to_string(),
        );
        let args = ["score", "--model", &model, "--input", "-", "--output", &output].map(String::from);
        let out = run(&args, Stdio::null());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(file) && err.contains("not a regular file"), "{err}");
    }
    let _ = std::fs::remove_dir_all(d);
}

/// Training settings no run can train with are refused before any work, naming the flag, and
/// leave no folder: `--lr nan` had trained a checkpoint of NaN weights (its scores null) and an
/// RL policy the same way; `--batch-size 0` said "a batch without targets".
#[test]
fn untrainable_settings_are_refused_before_any_work() {
    let d_tmp = tmp("untrainable");
    let d = d_tmp.path();
    std::fs::create_dir_all(d).unwrap();
    let data = d.join("labelled.jsonl");
    write_jsonl(
        &data,
        &[json!({"id": "s", "question": "What is 2 + 3?", "steps": [{"text": "5", "label": {"rating": "good"}}]})],
    );
    let problems = d.join("problems.jsonl");
    write_jsonl(
        &problems,
        &[json!({"id": "p", "question": "What is 2 + 3?", "answer": "5"})],
    );
    let (prm, policy) = (common::fixture("qwen2-prm"), common::fixture("qwen2-policy"));
    let (data, problems) = (data.display().to_string(), problems.display().to_string());
    let train = ["train-prm", "--data", &data, "--base", &prm, "--steps", "1"];
    let rl = ["rl", "--policy", &policy, "--problems", &problems, "--updates", "1"];
    for (command, bad, named) in [
        (&train[..], "--lr=nan", "--lr NaN"),
        (&train[..], "--batch-size=0", "--batch-size"),
        (&train[..], "--valid-fraction=1", "--valid-fraction 1"),
        (&rl[..], "--lr=nan", "--lr NaN"),
        (&rl[..], "--lr=-1", "--lr -1"),
    ] {
        let out_dir = d.join("out");
        let mut args: Vec<String> = command.iter().map(|s| s.to_string()).collect();
        args.extend([bad.to_string(), "--out".into(), out_dir.display().to_string()]);
        let out = run(&args, Stdio::null());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{bad}: {err}");
        assert!(err.contains(named), "{bad}: {err}");
        assert!(!out_dir.exists(), "{bad}: a folder was left");
    }
    let _ = std::fs::remove_dir_all(d);
}

/// `--on-error`: a record without a gold answer stops `raise` naming it (nothing written), and
/// under `skip` is written unlabelled with the reason while the others are labelled.
#[test]
fn annotate_on_error_names_or_skips_a_record_it_cannot_label() {
    let d_tmp = common::tmp("misuse", "annotate-on-error");
    let d = d_tmp.path();
    let input = d.join("samples.jsonl");
    let mut rows: Vec<Value> = (0..3)
        .map(|i| {
            json!({"id": format!("s{i}"), "problem_id": "p", "question": "What is 3 * 4?",
                   "steps": [{"text": "3 * 4 = 12"}, {"text": "The answer is 12"}], "gold_answer": "12"})
        })
        .collect();
    rows[1].as_object_mut().unwrap().remove("gold_answer");
    write_jsonl(&input, &rows);
    let out = d.join("labeled.jsonl");
    let (policy, input_s, out_s) = (
        common::fixture("qwen2-policy"),
        input.to_str().unwrap(),
        out.to_str().unwrap(),
    );
    let args = |on_error: &'static str| {
        let mut a = vec!["annotate", "--policy", &policy, "--input", input_s, "--output", out_s];
        a.extend(["--rollouts", "2", "--max-tokens", "8", "--on-error", on_error]);
        a
    };
    let refused = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args(args("raise"))
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("record 2 (`s1`): field `gold_answer`: missing"), "{err}");
    common::stepwise(&args("skip"));
    let recs: Vec<Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(recs.len(), 3);
    assert!(recs[1]["meta"]["annotate_error"]
        .as_str()
        .unwrap()
        .contains("gold_answer"));
    assert!(recs[1]["steps"][0].get("label").is_none());
    assert_eq!(recs[2]["steps"][0]["label"]["source"]["kind"], "monte_carlo");
}

/// A judge read by likelihood needs fixed answers and a model that gives log-probabilities: a
/// critique is refused before any work, with what to use instead.
#[test]
fn a_judge_read_by_likelihood_is_refused_where_it_cannot_be() {
    let d_tmp = common::tmp("misuse", "judge-likelihood");
    let d = d_tmp.path();
    let input = d.join("samples.jsonl");
    let row = json!({"id": "s", "problem_id": "p", "question": "What is 3 * 4?",
                     "steps": [{"text": "3 * 4 = 12"}], "gold_answer": "12"});
    write_jsonl(&input, &[row]);
    let policy = common::fixture("qwen2-policy");
    let out = d.join("labeled.jsonl");
    let annotate = [
        "annotate",
        "--method",
        "judge",
        "--judge-verdict",
        "likelihood",
        "--policy",
        &policy,
    ];
    for (args, says) in [
        (
            [&annotate[..], &["--judge", &policy]].concat(),
            "use --judge-format index or quote",
        ),
        (
            [
                &annotate[..],
                &["--judge-format", "index", "--judge", "http://127.0.0.1:9"],
            ]
            .concat(),
            "needs --server-tokenizer",
        ),
        (
            vec!["score", "--verifier", "judge", "--model", "http://127.0.0.1:9"],
            "needs --server-tokenizer",
        ),
    ] {
        let refused = Command::new(env!("CARGO_BIN_EXE_stepwise"))
            .args(&args)
            .arg("--input")
            .arg(&input)
            .arg("--output")
            .arg(&out)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(1), "{err}");
        assert!(err.contains(says), "{err}");
        assert!(!out.exists(), "a refused run wrote");
    }
}
