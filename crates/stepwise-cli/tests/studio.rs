//! `stepwise studio` as a user runs it: ratings that survive `kill -9`, a malformed import that
//! names its line and adds nothing, and labels exported, trained on and scored.

mod common;

use common::server::{exchange, spawn_until};
use common::{fixture, stepwise, tmp, write_jsonl};
use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};

fn add_user(db: &Path, name: &str, role: &str) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args([
            "studio",
            "user",
            "add",
            name,
            "--role",
            role,
            "--db",
            db.to_str().unwrap(),
        ])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{name}-password").unwrap();
    assert!(child.wait().unwrap().success());
}

/// `stepwise studio` on a free port: the child and its URL.
fn start(db: &Path, extra: &[&str]) -> (Child, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stepwise"));
    cmd.args(["studio", "--db", db.to_str().unwrap(), "--port", "0", "--qc-every", "0"])
        .args(extra);
    let (child, line) = spawn_until(cmd, "stepwise studio: ");
    let url = line.split('/').nth(2).unwrap().to_string();
    (child, format!("http://{url}"))
}

/// One API call with a bearer token: (status code, JSON body).
fn call(url: &str, method: &str, path: &str, token: &str, body: Option<Value>) -> (u16, Value) {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, text) = exchange(url, req.as_bytes());
    let code = status.split(' ').nth(1).unwrap().parse().unwrap();
    (code, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn login(url: &str, name: &str) -> String {
    let (code, v) = call(
        url,
        "POST",
        "/api/login",
        "",
        Some(json!({"name": name, "password": format!("{name}-password")})),
    );
    assert_eq!(code, 200, "{v}");
    v["token"].as_str().unwrap().to_string()
}

fn records(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            json!({"id": format!("r{i}"), "question": format!("count from {i}"), "gold_answer": format!("{}", i + 2),
                   "final_answer": format!("{}", i + 2 + i % 3),
                   "steps": [{"text": format!("{}", i + 1)}, {"text": format!("{}", i + 2 + i % 3)}]})
        })
        .collect()
}

#[test]
fn a_saved_rating_survives_kill_9() {
    let d_tmp = tmp("studio", "kill9");
    let d = d_tmp.path();
    let (db, input) = (d.join("labels.sqlite"), d.join("in.jsonl"));
    write_jsonl(&input, &records(3));
    add_user(&db, "alice", "labeller");
    let (mut server, url) = start(&db, &["--input", input.to_str().unwrap()]);
    let token = login(&url, "alice");
    let (_, next) = call(&url, "POST", "/api/projects/default/next", &token, None);
    let record = next["record"].as_i64().unwrap();
    for (i, r) in [1, -1].iter().enumerate() {
        let (code, v) = call(
            &url,
            "PUT",
            &format!("/api/records/{record}/steps/{i}"),
            &token,
            Some(json!({"rating": r, "comment": "hm"})),
        );
        assert_eq!(code, 200, "{v}");
    }
    server.kill().unwrap(); // SIGKILL: no shutdown, no flush
    server.wait().unwrap();
    let (mut server, url) = start(&db, &[]);
    let token = login(&url, "alice");
    let (code, view) = call(&url, "GET", &format!("/api/records/{record}"), &token, None);
    assert_eq!(code, 200);
    let got: Vec<(Value, Value)> = view["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["rating"].clone(), s["comment"].clone()))
        .collect();
    assert_eq!(got, [(json!(1), json!("hm")), (json!(-1), json!("hm"))]);
    // The same record is still hers to finish.
    let (_, next) = call(&url, "POST", "/api/projects/default/next", &token, None);
    assert_eq!(next["record"].as_i64(), Some(record));
    server.kill().unwrap();
}

/// `--guidelines FILE` on import sets a project's guidelines, a later start given another file
/// replaces them, and a project that does not exist is named.
#[test]
fn guidelines_from_a_file_reach_the_page() {
    let d_tmp = tmp("studio", "guidelines");
    let d = d_tmp.path();
    let (db, input, first, second) = (
        d.join("labels.sqlite"),
        d.join("in.jsonl"),
        d.join("g1.txt"),
        d.join("g2.txt"),
    );
    write_jsonl(&input, &records(2));
    std::fs::write(&first, "Rate each step.").unwrap();
    std::fs::write(&second, "Rate each step; a slip is −1: $3 \\times 4 = 13$.\n").unwrap();
    let arg = |p: &Path| p.to_str().unwrap().to_string();
    stepwise(&[
        "studio",
        "import",
        "--db",
        &arg(&db),
        "--input",
        &arg(&input),
        "--guidelines",
        &arg(&first),
    ]);
    add_user(&db, "alice", "labeller");
    let (mut server, url) = start(&db, &["--guidelines", &arg(&second)]);
    let token = login(&url, "alice");
    let (code, g) = call(&url, "GET", "/api/projects/default/guidelines", &token, None);
    assert_eq!(code, 200, "{g}");
    assert_eq!(
        g["text"].as_str(),
        Some(std::fs::read_to_string(&second).unwrap().as_str())
    );
    assert_eq!(g["set_by"], "command line");
    server.kill().unwrap();
    server.wait().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args([
            "studio",
            "--db",
            &arg(&db),
            "--project",
            "other",
            "--guidelines",
            &arg(&first),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no project `other`"), "{err}");
}

#[test]
fn a_malformed_import_names_its_line_and_adds_nothing() {
    let d_tmp = tmp("studio", "malformed");
    let d = d_tmp.path();
    let (db, input) = (d.join("labels.sqlite"), d.join("in.jsonl"));
    let mut rows = records(3);
    rows[1]["steps"] = json!("not a list");
    write_jsonl(&input, &rows);
    let out = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args([
            "studio",
            "import",
            "--db",
            db.to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in.jsonl:2: field `steps`"), "{err}");
    let listed = d.join("all.jsonl");
    stepwise(&[
        "studio",
        "export",
        "--db",
        db.to_str().unwrap(),
        "--include-unlabelled",
        "--output",
        listed.to_str().unwrap(),
    ]);
    assert_eq!(
        std::fs::read_to_string(&listed).unwrap(),
        "",
        "nothing of the file was added"
    );
}

/// Labels given through the API by a script, exported as PRM800K, train a PRM that `score`
/// reads back.
#[test]
fn exported_labels_train_a_prm_that_scores() {
    let d_tmp = tmp("studio", "train");
    let d = d_tmp.path();
    let (db, input) = (d.join("labels.sqlite"), d.join("in.jsonl"));
    write_jsonl(&input, &records(12));
    add_user(&db, "alice", "labeller");
    let (mut server, url) = start(&db, &["--input", input.to_str().unwrap()]);
    let token = login(&url, "alice");
    let mut labelled = 0;
    while let (200, Value::Object(next)) = call(&url, "POST", "/api/projects/default/next", &token, None) {
        let Some(record) = next["record"].as_i64() else { break };
        let (_, view) = call(&url, "GET", &format!("/api/records/{record}"), &token, None);
        let right = view["correct"] == json!(true);
        for (i, r) in [1, if right { 1 } else { -1 }].iter().enumerate() {
            call(
                &url,
                "PUT",
                &format!("/api/records/{record}/steps/{i}"),
                &token,
                Some(json!({"rating": r})),
            );
        }
        let reason = if right { "solution" } else { "found_error" };
        assert_eq!(
            call(
                &url,
                "POST",
                &format!("/api/records/{record}/finish"),
                &token,
                Some(json!({"finish_reason": reason}))
            )
            .0,
            200
        );
        labelled += 1;
    }
    assert_eq!(labelled, 12);
    server.kill().unwrap();
    let labels = d.join("labels.prm800k.jsonl");
    stepwise(&[
        "studio",
        "export",
        "--db",
        db.to_str().unwrap(),
        "--to",
        "prm800k",
        "--output",
        labels.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(&labels).unwrap();
    assert_eq!(text.lines().count(), 12);
    assert!(text
        .lines()
        .all(|l| serde_json::from_str::<Value>(l).unwrap()["labeler"] == "alice"));
    let prm = d.join("prm");
    stepwise(&[
        "train-prm",
        "--data",
        labels.to_str().unwrap(),
        "--base",
        &fixture("qwen2-policy"),
        "--steps",
        "3",
        "--batch-size",
        "4",
        "--out",
        prm.to_str().unwrap(),
    ]);
    let scored = d.join("scored.jsonl");
    stepwise(&[
        "score",
        "--model",
        prm.to_str().unwrap(),
        "--input",
        labels.to_str().unwrap(),
        "--output",
        scored.to_str().unwrap(),
    ]);
    let scores = common::step_scores(&std::fs::read_to_string(&scored).unwrap(), "prm");
    assert_eq!(scores.len(), 24);
    assert!(scores.iter().all(|s| (0.0..=1.0).contains(s)));
}
