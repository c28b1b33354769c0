//! `stepwise score --verifier generative`: a policy writes verification chains and each step is
//! scored by its verdicts, under `scores.NAME` like a PRM's, and `bon` reads them.

use serde_json::{json, Value};
use std::io::Write;
use std::net::TcpListener;

mod common;
use common::server::read_http;
use common::{fixture, step_scores, stepwise, write_jsonl};

fn tmp(name: &str) -> tempfile::TempDir {
    common::tmp("generative", name)
}

#[test]
fn a_generative_verifier_scores_steps_that_bon_reads() {
    let dir_tmp = tmp("score");
    let dir = dir_tmp.path();
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

/// A completions server scripted as a GenPRM-like verifier: it checks step 2 with Python and
/// judges it by what the code printed, which only the tool can have put in its prompt. It
/// answers as vLLM does: a stop string left out of the text and named in `stop_reason`.
fn scripted_verifier() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let Some(request) = read_http(&mut conn) else { continue };
            let text = String::from_utf8_lossy(&request);
            let body: Value = serde_json::from_str(&text[text.find("\r\n\r\n").unwrap() + 4..]).unwrap();
            let prompt = body["prompt"].as_str().unwrap_or_default();
            let (reply, stop_reason) = if !prompt.contains("[Code Output]") {
                // With tools, the chain is asked to stop after a code block.
                let tools = prompt.contains("```python block");
                assert_eq!(
                    tools,
                    body["stop"].as_array().is_some_and(|s| s.contains(&json!("\n```\n"))),
                    "{body}"
                );
                (
                    "Step 1: fine. \\boxed{correct}\nStep 2: let us check.\n```python\nprint(2 + 3)",
                    json!("\n```\n"),
                )
            } else if prompt.ends_with("[Code Output]\n\n```\n5\n```\n") {
                ("The code prints 5, not 6: \\boxed{incorrect}", Value::Null)
            } else {
                ("\\boxed{correct}", Value::Null)
            };
            let out =
                json!({"choices": [{"index": 0, "text": reply, "finish_reason": "stop", "stop_reason": stop_reason}],
                             "usage": {"completion_tokens": 7}})
                .to_string();
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{out}",
                out.len()
            );
        }
    });
    url
}

/// `stepwise score --verifier generative --verdict votes` with the served verifier at `url`,
/// scores named `gen`, and `extra` arguments.
fn score(url: &str, extra: &[&str], input: &std::path::Path, out: &std::path::Path) -> std::process::Output {
    let mut args = vec![
        "score",
        "--verifier",
        "generative",
        "--verdict",
        "votes",
        "--model",
        url,
    ];
    args.extend(["--served-model", "genprm", "--name", "gen"]);
    args.extend(extra);
    args.extend(["--input", input.to_str().unwrap(), "--output", out.to_str().unwrap()]);
    stepwise(&args)
}

/// One solution whose second step gets 2 + 3 wrong, in `dir`.
fn wrong_sum(dir: &std::path::Path) -> std::path::PathBuf {
    let input = dir.join("steps.jsonl");
    write_jsonl(
        &input,
        &[
            json!({"id": "s0", "problem_id": "p", "question": "What is 2 + 3?", "gold_answer": "5",
                  "steps": [{"text": "We add 2 and 3."}, {"text": "2 + 3 = 6"}, {"text": "The answer is 6."}]}),
        ],
    );
    input
}

#[test]
fn a_generative_verifier_with_python_tools_judges_by_what_its_code_printed() {
    let dir_tmp = tmp("tools");
    let dir = dir_tmp.path();
    let input = wrong_sum(dir);
    let out = dir.join("scored.jsonl");
    let url = scripted_verifier();
    let run = score(&url, &["--tools", "python", "--samples", "2"], &input, &out);
    let scores = step_scores(&std::fs::read_to_string(&out).unwrap(), "gen");
    assert_eq!(scores, [1.0, 0.0, 0.0], "{}", String::from_utf8_lossy(&run.stderr));
    // Without tools the same server's chains stop at the code block: no verdict on step 2.
    let plain = dir.join("plain.jsonl");
    score(&url, &["--samples", "1"], &input, &plain);
    let scores = step_scores(&std::fs::read_to_string(&plain).unwrap(), "gen");
    assert_eq!(scores, [1.0, 0.5, 0.5]);
}

/// The same chains with their code run on remote sandboxes (`serve --sandbox`): two URLs, one of
/// them dead, so every block that went there is retried on the live one.
#[test]
fn python_tools_run_on_remote_sandboxes() {
    let dir_tmp = tmp("remote_tools");
    let dir = dir_tmp.path();
    let input = wrong_sum(dir);
    let sandbox = common::server::serve(&["--sandbox"]);
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let urls = format!("{dead},{}/run_code", sandbox.url.trim_end_matches('/'));
    let out = dir.join("scored.jsonl");
    let url = scripted_verifier();
    let run = score(
        &url,
        &["--tools", "python", "--samples", "2", "--sandbox-url", &urls],
        &input,
        &out,
    );
    let scores = step_scores(&std::fs::read_to_string(&out).unwrap(), "gen");
    assert_eq!(scores, [1.0, 0.0, 0.0], "{}", String::from_utf8_lossy(&run.stderr));
}
