//! `stepwise lab --domain agent` end to end through the binary, at a tiny size: every stage's
//! file, the report's sections and metrics keys, and a run killed with SIGKILL in the middle of
//! its Monte Carlo labels that, started again, writes the same labels and the same report (RL
//! included).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The quick preset made smaller: what is checked is the loop and its bookkeeping.
const TINY: [&str; 26] = [
    "--set",
    "agent_demo_games=30",
    "--set",
    "agent_policy_steps=10",
    "--set",
    "agent_label_games=3",
    "--set",
    "agent_eval_games=4",
    "--set",
    "agent_eval_samples=4",
    "--set",
    "agent_search_games=2",
    "--set",
    "agent_rollouts=2",
    "--set",
    "agent_verifier_steps=2",
    "--set",
    "agent_max_actions=6",
    "--set",
    "agent_beam=[2,2]",
    "--set",
    "agent_rl_updates=2",
    "--set",
    "agent_rl_eval_samples=2",
    "--set",
    "agent_rl_seeds=2",
];

fn lab(out: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_stepwise"));
    c.args(["lab", "--domain", "agent", "--preset", "quick", "--seed", "5"])
        .args(TINY)
        .arg("--out")
        .arg(out);
    c
}

fn read(p: PathBuf) -> String {
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn json(p: PathBuf) -> serde_json::Value {
    serde_json::from_str(&read(p)).unwrap()
}

/// Each MC-labelled record's id and labels, sorted by id.
fn mc_labels(dir: &Path) -> Vec<(String, serde_json::Value)> {
    let mut v: Vec<(String, serde_json::Value)> = read(dir.join("mc.jsonl"))
        .lines()
        .map(|l| {
            let r: serde_json::Value = serde_json::from_str(l).unwrap();
            let labels = r["steps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["label"].clone())
                .collect();
            (r["id"].as_str().unwrap().to_string(), labels)
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn the_agent_lab_runs_the_loop_and_a_sigkilled_run_resumes_to_the_same_report() {
    let root_tmp = tempfile::tempdir().unwrap();
    let root = root_tmp.path().join("stepwise-agent-lab");
    let (a, b) = (root.join("a"), root.join("b"));
    let done = lab(&a).output().unwrap();
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    assert!(String::from_utf8_lossy(&done.stdout).contains("agent lab (quick preset, seed 5)"));
    for f in [
        "metrics.json",
        "report.md",
        "report.html",
        "bon.png",
        "bon_clean.png",
        "games.jsonl",
        "demonstrations.jsonl",
        "trajectories_label.jsonl",
        "trajectories_eval.jsonl",
        "oracle_label.jsonl",
        "mc.jsonl",
        "binary.jsonl",
        "prm_progress/DONE",
        "rl_prm_progress/eval_oracle.jsonl",
        "trajectories_eval_scored.jsonl",
        "search_beam.jsonl",
        "policy/DONE",
        "prm_mc/DONE",
        "prm_td/DONE",
        "orm/DONE",
        "value-0/DONE",
        "value-1/DONE",
        "rl_outcome/rl_state.json",
        "rl_prm_mc/eval.jsonl",
        "rl_oracle/eval_oracle.jsonl",
        "rl_prime/implicit_prm/model.safetensors",
    ] {
        assert!(a.join(f).exists(), "{f} missing");
    }
    let m = check_labels_and_best_of_n(&a);
    check_rl_heads_and_report(&a, &m);
    a_sigkilled_run_resumes_to_the_same_report(&a, &b, &m);
    std::fs::remove_dir_all(&root).unwrap();
}

/// The labels' costs and agreement, best-of-N's curves and paired differences, search; the metrics.
fn check_labels_and_best_of_n(a: &Path) -> serde_json::Value {
    let m = json(a.join("metrics.json"));
    assert_eq!(m["domain"], "agent");
    assert_eq!(m["policy"]["trajectories"], 16);
    // Monte Carlo pays in environment steps; TD and the returns pay nothing beyond the trajectories.
    assert!(m["labels"]["mc"]["env_steps"].as_u64().unwrap() > 0, "{m}");
    assert_eq!(m["labels"]["td"]["env_steps"], 0);
    // Where the time went: each stage once, in order.
    let stages: Vec<&str> = m["stage_seconds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["stage"].as_str().unwrap())
        .collect();
    assert_eq!(stages.first(), Some(&"policy"), "{stages:?}");
    assert_eq!(stages.last(), Some(&"RL"), "{stages:?}");
    assert_eq!(stages.len(), 7, "{stages:?}");
    for source in ["mc", "binary", "td", "return"] {
        let auc = m["labels"][source]["agreement"]["auc"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&auc), "{source}: {auc}");
    }
    let curves = m["bon"]["curves"].as_array().unwrap();
    for method in ["pass@N", "majority", "ORM", "PRM-MC-min", "PRM-TD-min"] {
        let c = curves
            .iter()
            .find(|c| c["method"] == method)
            .unwrap_or_else(|| panic!("{method} missing"));
        assert_eq!(c["points"].as_array().unwrap().last().unwrap()["n"], 4);
    }
    assert!(m["bon"]["lucky"]["pool"].as_f64().is_some());
    let shortfall = m["bon"]["orm_shortfall"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&shortfall), "{shortfall}");
    let paired = m["bon"]["paired"].as_array().unwrap();
    assert!(paired.iter().any(|d| d["a"] == "PRM-MC-min" && d["b"] == "majority"));
    // The headline PRM in every aggregation against the ORM, on success and clean success.
    for agg in ["min", "mean", "last"] {
        let against_orm = |measure: &str| {
            paired.iter().any(|d| {
                d["a"] == format!("PRM-MC-{agg}").as_str()
                    && d["b"] == "ORM"
                    && d["measure"] == format!("best-of-4 {measure}").as_str()
            })
        };
        assert!(against_orm("success") && against_orm("clean success"), "{agg}");
    }
    assert_eq!(m["search"]["worlds"], 2);
    assert!(m["search"]["success"]["beam"].as_f64().is_some());
    m
}

/// RL's variants, pooled over their runs; the heads; the report's sections; the silent world's trajectories.
fn check_rl_heads_and_report(a: &Path, m: &serde_json::Value) {
    // RL: every reward source on the same budget, measured on every held-out world, paired
    // against outcome-only RL on success and clean success.
    let variants = m["rl"]["variants"].as_array().unwrap();
    let names: Vec<&str> = variants.iter().map(|v| v["reward"].as_str().unwrap()).collect();
    assert_eq!(names, ["outcome", "prm_mc", "oracle", "prime", "prm_progress"]);
    let credits: Vec<Option<&str>> = variants.iter().map(|v| v["credit"].as_str()).collect();
    assert_eq!(credits, [None, Some("progress"), Some("own"), None, Some("own")]);
    assert_eq!(m["rl"]["seeds"], 2);
    for v in variants {
        assert_eq!(v["updates"], 2, "{v}");
        // Two runs a source (RL seeds 1 and 2), pooled: with as many held-out trajectories
        // after each, the pooled success is the mean of the runs'.
        assert_eq!(v["runs"], 2, "{v}");
        let by_run: Vec<f64> = v["success_by_run"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(by_run.len(), 2, "{v}");
        let mean = (by_run[0] + by_run[1]) / 2.0;
        assert!((v["success"].as_f64().unwrap() - mean).abs() < 1e-9, "{v}");
        let name = v["reward"].as_str().unwrap();
        for dir in [format!("rl_{name}"), format!("rl_{name}-seed2")] {
            // Every held-out world (4) twice (agent_rl_eval_samples) after each run.
            assert_eq!(read_lines(&a.join(&dir).join("eval.jsonl")), 4 * 2, "{dir}");
        }
        assert!(v["sampled_tokens"].as_u64().unwrap() > 0, "{v}");
        assert!(
            v["clean_success"].as_f64().unwrap() <= v["success"].as_f64().unwrap(),
            "{v}"
        );
    }
    assert_eq!(m["rl"]["paired"].as_array().unwrap().len(), 8);
    // The promise and progress heads, read on the held-out actions.
    for reading in ["progress_head", "promise_change", "promise"] {
        let auc = m["heads"][reading]["auc"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&auc), "{reading}: {auc}");
    }
    let report = read(a.join("report.md"));
    for section in [
        "## The policy",
        "## Labels for actions",
        "## Promise and progress heads",
        "## Best-of-N over trajectories",
        "## Search over actions",
        "## RL with per-action rewards",
        "## Paired differences",
    ] {
        assert!(report.contains(section), "{section} missing");
    }
    // Trajectories keep the world's answers apart from the actions, and the world never says
    // whether the goal is reached.
    for line in read(a.join("trajectories_eval.jsonl")).lines() {
        let t: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(
            t["steps"]
                .as_array()
                .unwrap()
                .iter()
                .all(|s| s["observation"].is_string()),
            "{t}"
        );
        assert!(!line.contains("You have done it"), "{line}");
    }
}

fn a_sigkilled_run_resumes_to_the_same_report(a: &Path, b: &Path, m: &serde_json::Value) {
    // Killed with SIGKILL once Monte Carlo labels are being written, then run again: the same
    // labels and the same report.
    let mut child = lab(b)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    while read_lines(&b.join("mc.jsonl")) < 2 && Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap_or(());
    child.wait().unwrap();
    let again = lab(b).output().unwrap();
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    assert_eq!(mc_labels(a), mc_labels(b));
    let mb = json(b.join("metrics.json"));
    for key in ["policy", "labels", "bon", "search", "rl"] {
        assert_eq!(m[key], mb[key], "{key} differs after the resume");
    }
}

fn read_lines(p: &Path) -> usize {
    std::fs::read_to_string(p).map_or(0, |s| s.lines().count())
}
