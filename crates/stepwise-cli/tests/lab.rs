//! `stepwise lab --preset quick` end to end through the binary: a well-formed report, and a run
//! killed with SIGKILL in the middle of annotation that, started again, writes the same records
//! and the same curves as the uninterrupted run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
#[path = "lab/dpo.rs"]
mod dpo;
use dpo::{check_dpo, the_command_line_rectifies_as_the_lab_does};

/// The code lab's policy trained 300 steps instead of the quick preset's 800: the same stages and
/// files in less time (what its test checks is the loop and its bookkeeping). The arithmetic lab
/// keeps the preset as it is: its test compares the command line's Monte Carlo labels with the
/// lab's, which a weaker policy's samples put one sampled rollout apart (2 hits of 2 against 1 of
/// 2 on one step of 48 solutions), the batched and the one-by-one forward passes differing in the
/// last bits of a near-tie.
const SHORT: [&str; 2] = ["--set", "policy_steps=300"];

fn lab(out: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_stepwise"));
    c.args(["lab", "--preset", "quick", "--seed", "7", "--out"]).arg(out);
    c
}

fn read(p: PathBuf) -> String {
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn lines(p: &Path) -> usize {
    std::fs::read_to_string(p).map_or(0, |s| s.lines().count())
}

/// Each record of a JSONL file of solutions as `[id, its steps' labels, meta[meta_key]]`, by id.
fn labels_by_id(text: &str, meta_key: Option<&str>) -> Vec<serde_json::Value> {
    let mut records: Vec<serde_json::Value> = text
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let labels: Vec<&serde_json::Value> = v["steps"].as_array().unwrap().iter().map(|s| &s["label"]).collect();
            let meta = meta_key.map_or(serde_json::Value::Null, |k| v["meta"][k].clone());
            serde_json::json!([v["id"], labels, meta])
        })
        .collect();
    records.sort_by_key(|r| r[0].to_string());
    records
}

#[test]
fn quick_lab_reports_and_a_sigkilled_run_resumes_to_the_same_records() {
    let root_tmp = tempfile::tempdir().unwrap();
    let root = root_tmp.path().join("stepwise-lab-cli");
    let (a, b) = (root.join("a"), root.join("b"));

    // The uninterrupted run.
    let status = lab(&a).status().unwrap();
    assert!(status.success());
    // Its folder refuses another seed instead of mixing two runs' stages.
    let other = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args(["lab", "--preset", "quick", "--seed", "8", "--out"])
        .arg(&a)
        .output()
        .unwrap();
    assert!(!other.status.success());
    let err = String::from_utf8_lossy(&other.stderr);
    assert!(err.contains("seed differs"), "{err}");
    let m: serde_json::Value = serde_json::from_str(&read(a.join("metrics.json"))).unwrap();
    check_files_bon_and_search(&a, &m);
    check_paired_and_families(&a, &m);
    check_verifiers_and_label_sources(&a, &m);
    the_command_line_reproduces_the_labs_judge_and_mc_labels(&root, &a, &m);
    check_judges_weighed(&a, &m);
    check_dpo(&a, &m);
    the_command_line_rectifies_as_the_lab_does(&root, &a);
    the_command_line_weighs_the_judge_as_the_lab_does(&root, &a);
    the_command_line_reproduces_the_labs_prm_scores(&root, &a);
    a_sigkilled_run_resumes_to_the_same_records(&a, &b, &m);
    let _ = std::fs::remove_dir_all(&root);
}

/// The run's files; best-of-N's curves inside their intervals; every search method with its compute.
fn check_files_bon_and_search(a: &Path, m: &serde_json::Value) {
    for f in [
        "metrics.json",
        "report.md",
        "report.html",
        "bon.png",
        "bon.svg",
        "problems.jsonl",
        "samples_eval.jsonl",
        "labels_mc.jsonl",
        "scored_eval.jsonl",
    ] {
        assert!(a.join(f).exists(), "{f} missing");
    }
    assert_eq!(m["domain"], "arithmetic", "the default domain");
    let bon = m["bon"].as_array().unwrap();
    assert!(bon.iter().any(|c| c["method"] == "ORM") && bon.iter().any(|c| c["method"] == "majority vote"));
    for c in bon {
        let points = c["points"].as_array().unwrap();
        assert_eq!(points.last().unwrap()["n"], 8);
        for p in points {
            let x = p["accuracy"].as_f64().unwrap();
            assert!(
                (0.0..=1.0).contains(&x)
                    && p["lo"].as_f64().unwrap() <= x + 1e-9
                    && x <= p["hi"].as_f64().unwrap() + 1e-9
            );
        }
    }
    assert!(read(a.join("report.md")).contains("Best-of-N"));
    // Test-time search: every method with every verifier, its compute, τ in the PRMs' folders.
    assert!(read(a.join("report.md")).contains("Test-time search"));
    let search = &m["search"];
    let methods = search["methods"].as_array().unwrap();
    for name in ["sample", "bon", "beam", "dvts", "lookahead", "resample"] {
        assert!(methods.iter().any(|x| x["method"] == name), "{name} missing");
    }
    for x in methods {
        let acc = x["accuracy"].as_f64().unwrap();
        assert!(
            (0.0..=1.0).contains(&acc) && x["ci95"][0].as_f64().unwrap() <= acc + 1e-9,
            "{x}"
        );
        assert!(x["generated_tokens"].as_f64().unwrap() > 0.0, "{x}");
        assert!(x["budget_tokens"].as_f64().unwrap() > 0.0, "{x}");
        if x["verifier"] == "prm_mc" || x["verifier"] == "prm_oracle" {
            assert!(x["encoded_tokens"].as_f64().unwrap() > 0.0, "{x}");
        }
    }
    assert!(search["incremental"]["ratio"].as_f64().unwrap() > 1.0);
    // Where the time went: every stage the quick preset runs, once each, in order.
    let stages: Vec<&str> = m["stage_seconds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            assert!(l["seconds"].as_f64().unwrap() >= 0.0, "{l}");
            l["stage"].as_str().unwrap()
        })
        .collect();
    let expected = [
        "policy",
        "samples",
        "annotation",
        "judge (",
        "verifiers (training)",
        "studio",
        "evaluation",
    ];
    let at = |name: &str| stages.iter().position(|s| s.starts_with(name));
    let found: Vec<Option<usize>> = expected.iter().map(|name| at(name)).collect();
    assert!(
        found.windows(2).all(|w| w[0] < w[1]) && found[0].is_some(),
        "{stages:?}"
    );
    assert_eq!(
        &stages[stages.len() - 4..],
        [
            "test-time search",
            "RL (waiting for the runs started early)",
            "RL",
            "DPO"
        ],
        "{stages:?}"
    );
    assert!(read(a.join("report.md")).contains("## Where the time went"));
}

/// Paired differences inside their intervals; best-of-8 per problem family; the diagnostics.
fn check_paired_and_families(a: &Path, m: &serde_json::Value) {
    let bon = m["bon"].as_array().unwrap();
    let search = &m["search"];
    // Paired differences on the same problems: best-of-N, search and RL, each inside its interval.
    let paired: Vec<&serde_json::Value> = m["paired"]
        .as_array()
        .unwrap()
        .iter()
        .chain(search["paired"].as_array().unwrap())
        .chain(m["rl"]["paired"].as_array().unwrap())
        .collect();
    for (a_name, b_name) in [
        ("PRM-MC (min)", "ORM"),
        ("PRM-consensus (min)", "PRM-MC (min)"),
        ("dvts", "bon"),
        ("prm_oracle", "outcome"),
    ] {
        assert!(
            paired.iter().any(|d| d["a"] == a_name && d["b"] == b_name),
            "{a_name} vs {b_name} missing"
        );
    }
    for d in &paired {
        let (x, lo, hi) = (
            d["difference"].as_f64().unwrap(),
            d["ci95"][0].as_f64().unwrap(),
            d["ci95"][1].as_f64().unwrap(),
        );
        assert!(lo <= x + 1e-9 && x <= hi + 1e-9 && (-1.0..=1.0).contains(&x), "{d}");
        assert!(d["problems"].as_u64().unwrap() > 0, "{d}");
    }
    assert!(read(a.join("report.md")).contains("## Paired differences"));
    for v in ["prm_mc", "prm_oracle"] {
        assert!(a.join(v).join("threshold.json").exists(), "{v}: no calibrated τ");
    }
    assert!(a.join("search.png").exists() && a.join("search.svg").exists());
    // Best-of-8 per problem family: every family of the held-out problems, every method.
    let families = m["by_family"].as_array().unwrap();
    assert!(!families.is_empty());
    let problems: u64 = families.iter().map(|f| f["problems"].as_u64().unwrap()).sum();
    assert_eq!(problems, m["eval_problems"].as_u64().unwrap());
    for f in families {
        let acc = f["accuracy"].as_array().unwrap();
        assert_eq!(acc.len(), bon.len());
        assert!(acc.iter().all(|a| (0.0..=1.0).contains(&a[1].as_f64().unwrap())), "{f}");
    }
    assert!(read(a.join("report.md")).contains("by problem family"));
    let confidence = m["discrimination"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d[0] == "policy confidence (diagnostic)")
        .expect("the policy-confidence diagnostic is reported");
    assert!((0.0..=1.0).contains(&confidence[1]["step_auroc"].as_f64().unwrap()));
}

/// The verifiers' own base LM, and every label source with its PRM's figures and costs.
fn check_verifiers_and_label_sources(a: &Path, m: &serde_json::Value) {
    // The verifiers and the judge start from their own base LM (48 wide; the policy is 64), not
    // the policy; what it knows
    // before any label is reported beside the policy's confidence.
    assert!(a.join("verifier_base/DONE").exists());
    assert!(
        m["verifiers"].as_str().unwrap().contains("their own 48×2 LM"),
        "{}",
        m["verifiers"]
    );
    let weights = |dir: &str| std::fs::read(a.join(dir).join("model.safetensors")).unwrap();
    for started in ["prm_mc", "orm", "judge"] {
        assert_eq!(
            read(a.join(started).join("config.json")),
            read(a.join("verifier_base/config.json"))
        );
        assert_ne!(
            weights(started),
            weights("verifier_base"),
            "{started} was not fine-tuned"
        );
    }
    assert_ne!(weights("verifier_base"), weights("policy"));
    assert!(m["discrimination"]
        .as_array()
        .unwrap()
        .iter()
        .any(|d| d[0] == "verifiers' base confidence (diagnostic)"));
    // Every label source, with its PRM's ProcessBench F1 and best-of-8; consensus (MC × judge)
    // keeps a fraction of the solutions and pays for both annotators' rollouts; the judge was
    // trained on the quick preset's 16 oracle-labelled solutions.
    let sources = m["labels"]["sources"].as_array().unwrap();
    let names: Vec<&str> = sources.iter().map(|x| x["source"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["mc", "binary_search", "omegaprm", "judge", "consensus", "oracle"]
    );
    for x in sources {
        assert!((0.0..=1.0).contains(&x["label_accuracy"].as_f64().unwrap()), "{x}");
        for key in ["processbench_f1", "retained_fraction"] {
            assert!((0.0..=1.0).contains(&x[key].as_f64().unwrap()), "{key}: {x}");
        }
        assert!((0.0..=1.0).contains(&x["bon"]["8"].as_f64().unwrap()), "{x}");
    }
    let rollouts = |i: usize| sources[i]["rollouts"].as_u64().unwrap();
    assert_eq!(rollouts(4), rollouts(0) + rollouts(3));
    let label_set = lines(&a.join("labels_oracle.jsonl")) as u64;
    assert_eq!(rollouts(3), 3 * label_set, "three judge answers per solution");
    let human = |i: usize| sources[i]["human_labels"].as_u64().unwrap();
    assert_eq!((human(0), human(3), human(4), human(5)), (0, 16, 16, label_set));
    // The tree's completed rollouts are kept beside the samples it labelled.
    let kept = lines(&a.join("labels_omegaprm.jsonl")) as u64;
    assert_eq!(sources[2]["new_solutions"].as_u64().unwrap(), kept - label_set);
    let report = read(a.join("report.md"));
    assert!(report.contains("| judge |") && report.contains("| consensus |"));
    // Four more judges verify beside it, fine-tuned alike from the same base: one reads the
    // calculator's values, one writes a verification chain, one is asked at each step and works
    // it again, and its control does not; each a best-of-N method, a ProcessBench row and a
    // paired difference against the judge.
    let g = &m["generative"];
    for (dir, method, written) in [
        (
            "judge_calculator",
            "judge + calculator, generative (min)",
            &g["calculator"],
        ),
        ("judge_chain", "judge writing a chain, generative (min)", &g["chain"]),
        (
            "judge_worked",
            "judge working each step, generative (min)",
            &g["worked"],
        ),
        (
            "judge_direct",
            "judge at each step, not working it, generative (min)",
            &g["direct"],
        ),
    ] {
        assert!(a.join(dir).join("DONE").exists(), "{dir}");
        assert!(written["tokens_per_solution"].as_f64().unwrap() > 0.0, "{g}");
        assert!(
            m["bon"].as_array().unwrap().iter().any(|c| c["method"] == method),
            "{method}"
        );
        assert!(report.contains(&format!("| {method} |")), "{method}");
        let paired = m["paired"].as_array().unwrap();
        assert!(
            paired
                .iter()
                .any(|d| d["a"] == method && d["b"] == "judge, generative (min)"),
            "{method}"
        );
    }
    assert!(report.contains("*A judge that thinks*") && report.contains("*A judge that thinks where the step stands*"));
}

fn the_command_line_reproduces_the_labs_judge_and_mc_labels(root: &Path, a: &Path, m: &serde_json::Value) {
    // The lab's judge is a checkpoint `stepwise annotate --method judge --judge-format index`
    // asks as it is: with the lab's seed for it (seed ^ 6), the same verdicts on every sample
    // (the oracle-labelled copies: the judge's labels replace the oracle's).
    let judged = root.join("judged.jsonl");
    let oracle = a.join("labels_oracle.jsonl");
    let flags = ["--judge-samples", "3", "--temperature", "1", "--seed", "1"];
    annotate_with_the_labs_judge(a, &oracle, &judged, &flags);
    assert_eq!(
        labels_by_id(&read(judged), Some("judge_verdicts")),
        labels_by_id(&read(a.join("labels_judge.jsonl")), Some("judge_verdicts")),
        "the command line's judge labels differ from the lab's"
    );

    // The rollouts that labelled the samples are the verifiers' base's (the completer), and
    // `stepwise annotate --method mc --policy verifier_base` with the lab's seed for them
    // (seed ^ 4) gives exactly the lab's Monte Carlo labels (on the oracle-labelled copies of the
    // samples: every step's label is replaced).
    assert_eq!(m["labels"]["completer"], "verifier_base");
    let mc_cli = root.join("mc.jsonl");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stepwise"));
    cmd.args(["annotate", "--method", "mc", "--rollouts", "2", "--seed", "3"])
        .args(["--separator", " | ", "--temperature", "1", "--max-tokens", "64"])
        .arg("--policy")
        .arg(a.join("verifier_base"));
    run_on(cmd, a.join("labels_oracle.jsonl"), &mc_cli);
    assert_eq!(
        labels_by_id(&read(mc_cli), None),
        labels_by_id(&read(a.join("labels_mc.jsonl")), None),
        "the command line's MC labels with the verifiers' base differ from the lab's"
    );
}

/// Run `cmd` on `input`, writing `output`; it must succeed.
fn run_on(mut cmd: Command, input: impl AsRef<std::ffi::OsStr>, output: impl AsRef<std::ffi::OsStr>) {
    let out = cmd
        .arg("--input")
        .arg(input)
        .arg("--output")
        .arg(output)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `stepwise annotate --method judge` with the lab's judge in run folder `a`, asked as the lab
/// asks it (the index after the solution, the lab's separator, 4 tokens at most), with `flags`.
fn annotate_with_the_labs_judge(a: &Path, input: &Path, output: &Path, flags: &[&str]) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stepwise"));
    cmd.args(["annotate", "--method", "judge", "--judge-format", "index"])
        .args(["--separator", " | ", "--max-tokens", "4"])
        .args(flags)
        .arg("--policy")
        .arg(a.join("policy"))
        .arg("--judge")
        .arg(a.join("judge"));
    run_on(cmd, input, output);
}

fn check_judges_weighed(a: &Path, m: &serde_json::Value) {
    // Each judge whose answer is a fixed text is weighed by likelihood as well: its own
    // verifier, best-of-N method and ProcessBench row, paired with the same judge's sampled
    // verdicts, and (but the one that works each step first) nothing written.
    let report = read(a.join("report.md"));
    let weighed = m["generative"]["likelihood"].as_array().unwrap();
    let names: Vec<&str> = weighed.iter().map(|w| w["verifier"].as_str().unwrap()).collect();
    let paired = m["paired"].as_array().unwrap();
    for (verifier, method, against) in [
        ("judge_likelihood", "judge, likelihood (min)", "judge, generative (min)"),
        (
            "judge_calculator_likelihood",
            "judge + calculator, likelihood (min)",
            "judge + calculator, generative (min)",
        ),
        (
            "judge_worked_likelihood",
            "judge working each step, likelihood (min)",
            "judge working each step, generative (min)",
        ),
        (
            "judge_direct_likelihood",
            "judge at each step, not working it, likelihood (min)",
            "judge at each step, not working it, generative (min)",
        ),
    ] {
        let w = &weighed[names
            .iter()
            .position(|n| *n == verifier)
            .unwrap_or_else(|| panic!("{verifier}"))];
        let written = w["tokens_per_solution"].as_f64().unwrap();
        assert_eq!(written > 0.0, verifier == "judge_worked_likelihood", "{w}");
        assert!(w["seconds"].as_f64().unwrap() > 0.0, "{w}");
        assert!(report.contains(&format!("| {method} |")), "{method}");
        assert!(paired.iter().any(|d| d["a"] == method && d["b"] == against), "{method}");
    }
    assert!(
        !names.iter().any(|n| n.contains("chain")),
        "a chain is not a fixed answer"
    );
    assert!(report.contains("*Verdicts weighed, not sampled*"));
}

fn the_command_line_weighs_the_judge_as_the_lab_does(root: &Path, a: &Path) {
    // `stepwise annotate --judge-verdict likelihood` labels each held-out sample by the verdict
    // the lab's judge gives the highest probability; the lab's `judge_likelihood` step scores
    // hold those probabilities (step k: the verdicts after it), so they name the same verdict.
    let weighed = root.join("weighed.jsonl");
    let held_out = a.join("scored_eval.jsonl");
    annotate_with_the_labs_judge(a, &held_out, &weighed, &["--judge-verdict", "likelihood"]);
    let lab = read(a.join("scored_eval.jsonl"));
    let mut compared = 0;
    for (line, lab_line) in read(weighed).lines().zip(lab.lines()) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let at_lab: serde_json::Value = serde_json::from_str(lab_line).unwrap();
        assert_eq!(v["id"], at_lab["id"]);
        let scores: Vec<f64> = at_lab["scores"]["judge_likelihood"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let steps = v["steps"].as_array().unwrap();
        let said = steps.iter().position(|s| s["label"]["rating"] != "good");
        // The probability of each verdict: none, then the first error at step k.
        let mut p = vec![*scores.last().unwrap()];
        p.extend((0..scores.len()).map(|k| if k == 0 { 1.0 } else { scores[k - 1] } - scores[k]));
        let mut order: Vec<usize> = (0..p.len()).collect();
        order.sort_by(|&i, &j| p[j].total_cmp(&p[i]));
        if p[order[0]] - p[order[1]] < 1e-3 {
            continue; // a near-tie the scores' f32 rounding cannot settle
        }
        let best = order[0].checked_sub(1);
        assert_eq!(said, best, "{} scores {scores:?}", v["id"]);
        compared += 1;
    }
    let total = lab.lines().count();
    assert!(
        compared * 4 >= total * 3 && compared >= 40,
        "{compared} of {total} compared"
    );

    // `stepwise score --verifier judge` gives the lab's judge scores themselves: weighed by
    // likelihood, and by 3 sampled answers with the lab's seed for them (seed ^ 9).
    for (name, verdict) in [("judge_likelihood", "likelihood"), ("judge", "votes")] {
        let rescored = root.join(format!("{name}.jsonl"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_stepwise"));
        cmd.args(["score", "--verifier", "judge", "--name", "cli", "--verdict", verdict])
            .args([
                "--separator",
                " | ",
                "--samples",
                "3",
                "--seed",
                "14",
                "--temperature",
                "1",
            ])
            .args(["--max-tokens", "4", "--model"])
            .arg(a.join("judge"));
        run_on(cmd, a.join("scored_eval.jsonl"), &rescored);
        let lab_scores = common::step_scores(&lab, name);
        let cli_scores = common::step_scores(&read(rescored), "cli");
        assert_eq!(lab_scores.len(), cli_scores.len());
        for (x, y) in lab_scores.iter().zip(&cli_scores) {
            assert!((x - y).abs() < 1e-5, "{name}: {x} vs {y}");
        }
    }
}

fn the_command_line_reproduces_the_labs_prm_scores(root: &Path, a: &Path) {
    // The verifiers are folders `stepwise score` reads on its own (reward.json gives the
    // likelihood head's constant reference): it reproduces the PRM-MC scores the lab wrote.
    let spec: serde_json::Value = serde_json::from_str(&read(a.join("prm_mc/reward.json"))).unwrap();
    assert!(spec["reference_logprob"].as_f64().unwrap() < 0.0, "{spec}");
    let rescored = root.join("rescored.jsonl");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stepwise"));
    cmd.args(["score", "--name", "cli", "--model"]).arg(a.join("prm_mc"));
    run_on(cmd, a.join("scored_eval.jsonl"), &rescored);
    let lab_scores = common::step_scores(&read(a.join("scored_eval.jsonl")), "prm_mc");
    let cli_scores = common::step_scores(&read(rescored), "cli");
    assert_eq!(lab_scores.len(), cli_scores.len());
    for (x, y) in lab_scores.iter().zip(&cli_scores) {
        assert!((x - y).abs() < 1e-5, "{x} vs {y}");
    }
}

fn a_sigkilled_run_resumes_to_the_same_records(a: &Path, b: &Path, m: &serde_json::Value) {
    // Same seed, the policy, the verifiers' base and the samples already there (cached stages),
    // killed with SIGKILL once a few annotated solutions are on disk.
    std::fs::create_dir_all(b).unwrap();
    for f in ["samples_label.jsonl", "samples_eval.jsonl"] {
        std::fs::copy(a.join(f), b.join(f)).unwrap();
    }
    for model in ["policy", "verifier_base"] {
        std::fs::create_dir_all(b.join(model)).unwrap();
        for e in std::fs::read_dir(a.join(model)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), b.join(model).join(e.file_name())).unwrap();
        }
    }
    let total = lines(&a.join("labels_mc.jsonl"));
    let mut child = lab(b).stderr(std::process::Stdio::null()).spawn().unwrap();
    let start = Instant::now();
    while lines(&b.join("labels_mc.jsonl")) < 3 {
        assert!(start.elapsed() < Duration::from_secs(120), "annotation never started");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run finished before it could be killed"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let done = lines(&b.join("labels_mc.jsonl"));
    assert!(done < total, "killed after annotation finished ({done} of {total})");
    assert!(!b.join("metrics.json").exists());

    let status = lab(b).status().unwrap();
    assert!(status.success());
    assert_eq!(
        read(b.join("labels_mc.jsonl")),
        read(a.join("labels_mc.jsonl")),
        "resumed annotation differs"
    );
    let mb: serde_json::Value = serde_json::from_str(&read(b.join("metrics.json"))).unwrap();
    assert_eq!(m["bon"], mb["bon"], "resumed run's curves differ");
}

/// `stepwise lab --domain code`: the same loop and report on straight-line programs, every
/// sample's lines checked by executing them; its folder refuses the arithmetic domain.
#[test]
fn quick_code_lab_runs_the_loop_on_programs() {
    let out_tmp = tempfile::tempdir().unwrap();
    let out = out_tmp.path().join("stepwise-lab-code");
    let run = |domain: &str| {
        Command::new(env!("CARGO_BIN_EXE_stepwise"))
            .args(["lab", "--preset", "quick", "--domain", domain, "--seed", "3"])
            .args(["--set", "search_problems=2", "--set", "rl_updates=2"])
            .args(SHORT)
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap()
    };
    let done = run("code");
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let m: serde_json::Value = serde_json::from_str(&read(out.join("metrics.json"))).unwrap();
    assert_eq!(m["domain"], "code");
    assert!(read(out.join("report.md")).contains("domain `code`"));
    // The same sections and keys as arithmetic.
    for key in [
        "bon",
        "by_family",
        "processbench",
        "mc_label_quality",
        "labels",
        "search",
        "rl",
    ] {
        assert!(!m[key].is_null(), "metrics.json lacks {key}");
    }
    let hard = m["mc_label_quality"]["hard_accuracy"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&hard));
    // No calculator for programs: its judge reads lines, not equations.
    assert!(m["generative"]["calculator"].is_null());
    for judge in ["chain", "worked", "direct"] {
        assert!(m["generative"][judge].is_null(), "{judge}");
    }
    // Samples are programs: their answer is what they return on the five calls, graded against
    // the reference's, and the oracle judged every line.
    let samples = read(out.join("labels_oracle.jsonl"));
    let mut programs = 0;
    for line in samples.lines() {
        let s: serde_json::Value = serde_json::from_str(line).unwrap();
        let steps = s["steps"].as_array().unwrap();
        assert!(steps.iter().all(|st| st["label"]["source"]["kind"] == "oracle"), "{s}");
        if let Some(answer) = s["final_answer"].as_str() {
            assert_eq!(answer.split(' ').count(), 5, "{s}");
            assert_eq!(s["correct"], s["final_answer"] == s["gold_answer"], "{s}");
            programs += 1;
        }
        assert_eq!(s["gold_answer"].as_str().unwrap().split(' ').count(), 5, "{s}");
    }
    assert!(programs > 0);
    let problems = read(out.join("problems.jsonl"));
    assert!(problems.lines().all(|l| l.contains(r#""domain":"code""#)), "{problems}");
    // A code folder is not resumed as arithmetic.
    let other = run("arithmetic");
    assert!(!other.status.success());
    assert!(String::from_utf8_lossy(&other.stderr).contains("domain differs"));
    std::fs::remove_dir_all(&out).unwrap();
}
