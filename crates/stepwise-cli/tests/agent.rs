//! `stepwise agent`: worlds, trajectories played by the expert and by a model, labels by the
//! oracle, Monte Carlo and TD from a PRM's scores, resumed runs, and trajectories converted to
//! chat layouts and back.

use serde_json::Value;
use std::path::Path;

mod common;
use common::{fixture, stepwise};

fn lines(p: &Path) -> Vec<Value> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `count` rooms worlds of stream `seed` in `d/games.jsonl`.
fn games(d: &Path, count: usize, seed: u64) {
    let out = d.join("games.jsonl").display().to_string();
    let (count, seed) = (count.to_string(), seed.to_string());
    stepwise(&["agent", "games", "--count", &count, "--seed", &seed, "--output", &out]);
}

#[test]
fn games_play_label_score_and_convert() {
    let d_tmp = common::tmp("agent", "loop");
    let d = d_tmp.path();
    let s = |p: &str| d.join(p).display().to_string();
    games(d, 8, 5);
    assert_eq!(lines(&d.join("games.jsonl")).len(), 8);
    let play = [
        "agent",
        "play",
        "--problems",
        &s("games.jsonl"),
        "--expert",
        "0.6",
        "-n",
        "2",
        "--output",
        &s("trajs.jsonl"),
    ];
    let out = stepwise(&play);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("16 trajectories") && said.contains("reached the goal"),
        "{said}"
    );
    let trajs = lines(&d.join("trajs.jsonl"));
    assert_eq!(trajs.len(), 16);
    assert!(trajs.iter().all(|t| t["steps"][0]["observation"].is_string()));
    // Cut the journal mid-line, as a kill would: the run goes on, the records are the same.
    let text = std::fs::read_to_string(d.join("trajs.jsonl")).unwrap();
    let cut = text.len() - text.lines().last().unwrap().len() / 2 - 1;
    std::fs::write(d.join("trajs.jsonl"), &text[..cut]).unwrap();
    stepwise(&play);
    assert_eq!(std::fs::read_to_string(d.join("trajs.jsonl")).unwrap(), text);
    let oracle = oracle_mc_and_binary_search_label_actions(d);
    td_labels_from_a_prms_scores_and_a_progress_head(d);
    trajectories_convert_to_messages_and_conversations_and_back(d, &oracle);
}

/// A path inside `d`, as an argument.
fn at(d: &Path, p: &str) -> String {
    d.join(p).display().to_string()
}

/// `stepwise agent label --method METHOD` on the games of `d`; what it said.
fn label(d: &Path, method: &str, input: &str, output: &str, extra: &[&str]) -> String {
    let games = at(d, "games.jsonl");
    let mut args = vec![
        "agent",
        "label",
        "--method",
        method,
        "--problems",
        &games,
        "--input",
        input,
        "--output",
        output,
    ];
    args.extend_from_slice(extra);
    let out = stepwise(&args);
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// The oracle's, Monte Carlo's and binary search's labels of the played trajectories; the
/// oracle's, which the conversions start from.
fn oracle_mc_and_binary_search_label_actions(d: &Path) -> Vec<serde_json::Value> {
    let s = |p: &str| at(d, p);
    let (trajs_path, oracle_path, mc_path) = (s("trajs.jsonl"), s("oracle.jsonl"), s("mc.jsonl"));
    label(d, "oracle", &trajs_path, &oracle_path, &[]);
    let oracle = lines(&d.join("oracle.jsonl"));
    assert!(oracle.iter().all(|t| t["steps"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["label"]["source"]["kind"] == "oracle")));
    let said = label(d, "mc", &trajs_path, &mc_path, &["--expert", "0.8", "--rollouts", "3"]);
    assert!(said.contains("environment steps"), "{said}");
    let mc = lines(&d.join("mc.jsonl"));
    assert!(mc.iter().all(|t| t["meta"]["env_steps"].as_u64().unwrap() > 0));
    // Binary search: labels up to the first dead action, with fewer rollouts than Monte Carlo's.
    label(
        d,
        "binary",
        &trajs_path,
        &s("binary.jsonl"),
        &["--expert", "0.8", "--rollouts", "3"],
    );
    let binary = lines(&d.join("binary.jsonl"));
    let rollouts = |ts: &[serde_json::Value]| ts.iter().map(|t| t["meta"]["rollouts"].as_u64().unwrap()).sum::<u64>();
    assert!(
        rollouts(&binary) < rollouts(&mc),
        "{} against {}",
        rollouts(&binary),
        rollouts(&mc)
    );
    for t in &binary {
        let first_dead = t["meta"]["first_dead"].as_u64().map(|d| d as usize);
        for (i, step) in t["steps"].as_array().unwrap().iter().enumerate() {
            let want = match first_dead {
                Some(d) if i > d => None,
                Some(d) if i == d => Some(0.0),
                _ => Some(1.0),
            };
            assert_eq!(step["label"]["p"].as_f64(), want, "{t}");
        }
    }
    oracle
}

fn td_labels_from_a_prms_scores_and_a_progress_head(d: &Path) {
    let s = |p: &str| at(d, p);
    let (trajs_path, oracle_path) = (s("trajs.jsonl"), s("oracle.jsonl"));
    // A PRM's scores of the trajectories (observations read as context), then TD labels.
    let scored = s("scored.jsonl");
    stepwise(&[
        "score",
        "--model",
        &fixture("qwen2-prm"),
        "--input",
        &trajs_path,
        "--output",
        &scored,
    ]);
    let td_path = s("td.jsonl");
    label(d, "td", &scored, &td_path, &["--lambda", "0.5"]);
    for t in lines(&d.join("td.jsonl")) {
        for st in t["steps"].as_array().unwrap() {
            let src = &st["label"]["source"];
            assert_eq!(src["kind"], "td");
            assert!(src["progress"].is_number() && st["label"]["p"].as_f64().unwrap() <= 1.0);
        }
    }
    // A progress head: train-prm on the TD labels' progress; other labels are refused by name.
    let progress = |data: &str, out: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_stepwise"))
            .args(["train-prm", "--data", data, "--base", &fixture("qwen2-policy")])
            .args([
                "--target",
                "progress",
                "--steps",
                "2",
                "--batch-size",
                "4",
                "--out",
                out,
            ])
            .output()
            .unwrap()
    };
    let trained = progress(&td_path, &s("progress"));
    assert!(trained.status.success(), "{}", String::from_utf8_lossy(&trained.stderr));
    assert!(d.join("progress/model.safetensors").exists());
    let refused = progress(&oracle_path, &s("progress-bad"));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && said.contains("step 0: field `label.source.progress`: missing"),
        "{said}"
    );
    // Without scores, TD names what is missing.
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args([
            "agent",
            "label",
            "--method",
            "td",
            "--problems",
            &s("games.jsonl"),
            "--input",
            &trajs_path,
        ])
        .args(["--output", &s("td-bad.jsonl")])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("scores.prm"));
}

fn trajectories_convert_to_messages_and_conversations_and_back(d: &Path, oracle: &[serde_json::Value]) {
    let s = |p: &str| at(d, p);
    let oracle_path = s("oracle.jsonl");
    // Trajectories as OpenAI chat messages and as ShareGPT conversations, and back.
    for to in ["messages", "conversations"] {
        let conv = s(&format!("{to}.jsonl"));
        stepwise(&["convert", &oracle_path, &conv, "--to", to]);
        let back = s(&format!("{to}-back.jsonl"));
        stepwise(&["convert", &conv, &back]);
        let (a, b) = (oracle, lines(Path::new(&back)));
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(
                x["steps"].as_array().unwrap().len(),
                y["steps"].as_array().unwrap().len()
            );
            assert_eq!(x["steps"][0]["observation"], y["steps"][0]["observation"]);
            assert_eq!(x["correct"], y["correct"]);
        }
    }
}

#[test]
fn a_model_plays_and_a_problem_without_a_world_is_refused() {
    let d_tmp = common::tmp("agent", "model");
    let d = d_tmp.path();
    let s = |p: &str| d.join(p).display().to_string();
    games(d, 2, 0);
    stepwise(&[
        "agent",
        "play",
        "--problems",
        &s("games.jsonl"),
        "--policy",
        &fixture("qwen2-policy"),
        "-n",
        "1",
        "--max-actions",
        "3",
        "--max-tokens",
        "8",
        "--output",
        &s("trajs.jsonl"),
    ]);
    let trajs = lines(&d.join("trajs.jsonl"));
    assert_eq!(trajs.len(), 2);
    for t in &trajs {
        assert!(t["steps"].as_array().unwrap().len() <= 3);
        assert!(["stopped", "out_of_actions", "lost", "success"].contains(&t["meta"]["end"].as_str().unwrap()));
    }
    std::fs::write(
        d.join("plain.jsonl"),
        "{\"id\": \"p\", \"question\": \"What is 2 + 2?\"}\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args([
            "agent",
            "play",
            "--problems",
            &s("plain.jsonl"),
            "--expert",
            "0.5",
            "--output",
            &s("o.jsonl"),
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("record 1") && said.contains("meta.world"),
        "{said}"
    );
}

/// `--silent`: the lab's world, which never says whether the goal is reached; the expert stops
/// of its own accord and the outcome is where the item lies then. A journal started in one world
/// is not resumed in the other.
#[test]
fn the_silent_world_from_the_command_line() {
    let d_tmp = common::tmp("agent", "silent");
    let d = d_tmp.path();
    let s = |p: &str| d.join(p).display().to_string();
    games(d, 6, 2);
    let play = |silent: bool| {
        let mut args = vec![
            "agent",
            "play",
            "--problems",
            "",
            "--expert",
            "1.0",
            "-n",
            "1",
            "--output",
            "",
        ];
        let (games, out) = (s("games.jsonl"), s("trajs.jsonl"));
        args[3] = &games;
        args[9] = &out;
        if silent {
            args.push("--silent");
        }
        std::process::Command::new(env!("CARGO_BIN_EXE_stepwise"))
            .args(&args)
            .output()
            .unwrap()
    };
    assert!(play(true).status.success());
    let trajs = lines(&d.join("trajs.jsonl"));
    assert_eq!(trajs.len(), 6);
    for t in &trajs {
        assert_eq!(t["correct"], true, "{t}");
        assert_eq!(t["meta"]["end"], "stopped", "{t}");
        assert!(!t.to_string().contains("You have done it"), "{t}");
    }
    let other = play(false);
    assert!(!other.status.success());
    assert!(String::from_utf8_lossy(&other.stderr).contains("`silent`"));
}

/// The figures of an RL log that a resumed run must reproduce (timings aside).
fn rl_figures(p: &Path) -> Vec<Value> {
    lines(p)
        .iter()
        .map(|l| serde_json::json!([l["update"], l["reward"], l["accuracy"], l["kl"], l["watched"]]))
        .collect()
}

#[test]
fn agent_rl_rewards_actions_and_a_sigkilled_run_resumes_to_the_same_log() {
    let d_tmp = common::tmp("agent", "rl");
    let d = d_tmp.path();
    let s = |p: &str| d.join(p).display().to_string();
    games(d, 6, 2);
    let prm = format!("prm:{}", fixture("qwen2-prm"));
    let rl = |reward: &str, out: &str| agent_rl(d, reward, out);
    // A PRM's score of every action, the oracle's mean verdict logged beside it.
    let whole = rl(&prm, &s("a")).output().unwrap();
    assert!(whole.status.success(), "{}", String::from_utf8_lossy(&whole.stderr));
    let said = String::from_utf8_lossy(&whole.stderr);
    assert!(said.contains("6 updates") && said.contains("sample success"), "{said}");
    let a = rl_figures(&d.join("a/rl_log.jsonl"));
    assert_eq!(a.len(), 6);
    assert!(a.iter().all(|l| l[4]["oracle"].is_number()), "{a:?}");
    for f in ["model.safetensors", "tokenizer.json", "rl.png", "rl_state.json"] {
        assert!(d.join("a").join(f).exists(), "{f} missing");
    }

    a_killed_run_resumes_to_the_same_log(d, &|out| rl(&prm, out), &a);

    // The trained policy plays; a reward it does not know is named.
    stepwise(&[
        "agent",
        "play",
        "--problems",
        &s("games.jsonl"),
        "--policy",
        &s("a"),
        "--prompt",
        "pieces",
        "-n",
        "1",
        "--max-actions",
        "2",
        "--max-tokens",
        "4",
        "--output",
        &s("played.jsonl"),
    ]);
    assert_eq!(lines(&d.join("played.jsonl")).len(), 6);
    let bad = rl("orm:x", &s("c")).output().unwrap();
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && said.contains("--reward") && said.contains("goal, oracle, prm:DIR or prime"),
        "{said}"
    );

    prime_learns_beside_the_policy(d, &rl);
}

/// `stepwise agent rl` of the fixture policy in the games of `d`, rewarded by `reward`, into `out`:
/// 6 updates of 2 worlds × 2 episodes, checkpointed every update.
fn agent_rl(d: &Path, reward: &str, out: &str) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_stepwise"));
    c.args(["agent", "rl", "--policy", &fixture("qwen2-policy")])
        .args([
            "--problems",
            &d.join("games.jsonl").display().to_string(),
            "--reward",
            reward,
        ])
        .args([
            "--updates",
            "6",
            "--worlds",
            "2",
            "--group-size",
            "2",
            "--max-tokens",
            "4",
        ])
        .args([
            "--max-actions",
            "3",
            "--lr",
            "1e-4",
            "--checkpoint-every",
            "1",
            "--seed",
            "5",
        ])
        .args(["--out", out]);
    c
}

/// `--trainer packed` on the CPU (what a pretrained policy gets there): the packed engine's
/// trainer updates the policy and the policy plays from the trainer's own weights; a SIGKILLed
/// run resumes to the same log, and PRIME's implicit PRM trains on a second packed trainer.
#[test]
fn agent_rl_on_the_packed_trainer_resumes_and_trains_prime() {
    let d_tmp = common::tmp("agent", "rl-packed");
    let d = d_tmp.path();
    let s = |p: &str| d.join(p).display().to_string();
    games(d, 6, 2);
    let rl = |reward: &str, out: &str| {
        let mut c = agent_rl(d, reward, out);
        c.args(["--device", "cpu", "--trainer", "packed"]);
        c
    };
    // A PRM's scores differ between episodes where the fixture's oracle and goal give all 0.
    let prm = format!("prm:{}", fixture("qwen2-prm"));
    let whole = rl(&prm, &s("a")).output().unwrap();
    assert!(whole.status.success(), "{}", String::from_utf8_lossy(&whole.stderr));
    let a = rl_figures(&d.join("a/rl_log.jsonl"));
    assert_eq!(a.len(), 6);
    let logged = lines(&d.join("a/rl_log.jsonl"));
    assert!(
        logged.iter().all(|l| l["updated_tokens"].as_u64() > Some(0)),
        "{logged:?}"
    );
    assert_ne!(
        std::fs::read(d.join("a/model.safetensors")).unwrap(),
        std::fs::read(Path::new(&fixture("qwen2-policy")).join("model.safetensors")).unwrap(),
        "six updates left the policy as it started"
    );
    a_killed_run_resumes_to_the_same_log(d, &|out| rl(&prm, out), &a);
    prime_learns_beside_the_policy(d, &rl);
}

/// PRIME (`rl` run with reward `prime` into `d/p`): an implicit PRM learns from the goal beside
/// the policy, and is kept in the folder.
fn prime_learns_beside_the_policy(d: &Path, rl: &dyn Fn(&str, &str) -> std::process::Command) {
    let out = d.join("p").display().to_string();
    let prime = rl("prime", &out).args(["--prime-filter", "0,1"]).output().unwrap();
    assert!(prime.status.success(), "{}", String::from_utf8_lossy(&prime.stderr));
    let logged = lines(&d.join("p/rl_log.jsonl"));
    assert!(
        logged.iter().all(|l| l["implicit_prm"]["loss"].is_number()),
        "{logged:?}"
    );
    assert!(d.join("p/implicit_prm/model.safetensors").exists());
}

/// The run `rl` starts (in the folder it is given) killed once its first checkpoint is written,
/// then started again: the log of the uninterrupted run `a`, the updates before the kill kept.
fn a_killed_run_resumes_to_the_same_log(d: &Path, rl: &dyn Fn(&str) -> std::process::Command, a: &[Value]) {
    let s = |p: &str| d.join(p).display().to_string();
    // The same run killed once its first checkpoint is written, then started again.
    let mut child = rl(&s("b")).stderr(std::process::Stdio::null()).spawn().unwrap();
    let state = d.join("b/rl_state.json");
    let t0 = std::time::Instant::now();
    while !state.exists() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(120),
            "no checkpoint written"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run finished before it could be killed"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let kept: Value = serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    let kept = kept["log"].as_array().unwrap().clone();
    assert!(!kept.is_empty() && kept.len() < 6, "{} updates kept", kept.len());
    let resumed = rl(&s("b")).output().unwrap();
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    assert_eq!(rl_figures(&d.join("b/rl_log.jsonl")), a);
    // It went on from the checkpoint: the updates before the kill are the ones the killed run logged.
    let b = lines(&d.join("b/rl_log.jsonl"));
    for (x, y) in kept.iter().zip(&b) {
        assert_eq!(x["seconds"], y["seconds"], "update {} was run again", x["update"]);
    }
}
