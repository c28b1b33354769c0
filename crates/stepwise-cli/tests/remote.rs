//! Remote backends end to end: `stepwise serve` on the fixture policy and PRM, and the commands
//! that take a URL (`generate`, `score`, `search`, `annotate`) giving exactly what they give on
//! the local folders (servers that fail: `tests/fleet.rs`).

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::server::{get, post, serve};
use common::{fixture, stepwise, write_jsonl};

fn tmp(name: &str) -> tempfile::TempDir {
    common::tmp("remote", name)
}

fn records(p: &Path) -> Vec<Value> {
    common::records_without_timing(p)
}

fn problems(d: &Path) -> PathBuf {
    let p = d.join("problems.jsonl");
    write_jsonl(
        &p,
        &[
            json!({"id": "p1", "question": "What is 2 + 3?", "answer": "5"}),
            json!({"id": "p2", "question": "What is 4 * 2?", "answer": "8"}),
        ],
    );
    p
}

#[test]
fn every_remote_command_gives_what_the_local_folder_gives() {
    let d_tmp = tmp("parity");
    let d = d_tmp.path();
    let server = serve(&[]);
    let probs = problems(d);
    let p = probs.to_str().unwrap();
    let policy = fixture("qwen2-policy");
    let prm = fixture("qwen2-prm");
    let url = server.url.as_str();
    // The same flags, with the local folders or the server.
    let sampling = ["-n", "3", "--max-tokens", "16", "--seed", "5", "--input", p];
    let beam = [
        "--method",
        "beam",
        "-n",
        "4",
        "--width",
        "2",
        "--max-steps",
        "3",
        "--max-tokens",
        "8",
        "--input",
        p,
    ];
    for (name, local, remote) in [
        (
            "generate",
            [&["generate", "--model", &policy][..], &sampling].concat(),
            [&["generate", "--model", url][..], &sampling].concat(),
        ),
        (
            "search",
            [&["search", "--policy", &policy, "--prm", &prm, "--whole"][..], &beam].concat(),
            [&["search", "--policy", url, "--prm", url][..], &beam].concat(),
        ),
    ] {
        let (a, b) = (
            d.join(format!("{name}-local.jsonl")),
            d.join(format!("{name}-remote.jsonl")),
        );
        stepwise(&[&local[..], &["--output", a.to_str().unwrap()]].concat());
        stepwise(&[&remote[..], &["--output", b.to_str().unwrap()]].concat());
        assert_eq!(records(&a), records(&b), "{name}");
        assert!(!records(&a).is_empty());
    }
    scoring_the_samples_gives_the_same_step_scores(d, url, &prm);
}

/// `score` on the generated samples with the local PRM, the server, and the server over vLLM's
/// `/pooling` protocol: the same step scores.
fn scoring_the_samples_gives_the_same_step_scores(d: &Path, url: &str, prm: &str) {
    // Scoring the generated samples: the same step scores from the server.
    let samples = d.join("generate-local.jsonl");
    let (a, b, c) = (
        d.join("score-local.jsonl"),
        d.join("score-remote.jsonl"),
        d.join("score-pooling.jsonl"),
    );
    for (model, out) in [(prm, &a), (url, &b)] {
        stepwise(&[
            "score",
            "--model",
            model,
            "--input",
            samples.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
        ]);
    }
    // vLLM's /pooling protocol: the inputs laid out here and sent as token ids.
    stepwise(&[
        "score",
        "--model",
        url,
        "--protocol",
        "pooling",
        "--layout",
        "qwen-prm",
        "--server-tokenizer",
        prm,
        "--input",
        samples.to_str().unwrap(),
        "--output",
        c.to_str().unwrap(),
    ]);
    let scores = |p: &Path| -> Vec<f64> {
        records(p)
            .iter()
            .flat_map(|r| {
                r["scores"]["prm"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap())
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let (sa, sb, sc) = (scores(&a), scores(&b), scores(&c));
    for other in [&sb, &sc] {
        assert_eq!(sa.len(), other.len());
        assert!(
            sa.iter().zip(other).all(|(x, y)| (x - y).abs() < 1e-6),
            "{sa:?} vs {other:?}"
        );
    }
}

/// Requests that arrive together are scored together, and each gets its own solutions' scores:
/// the same as one request holding them all.
#[test]
fn concurrent_score_requests_get_their_own_scores() {
    let server = serve(&[]);
    let inputs: Vec<Value> = (0..16)
        .map(|i| json!({"question": format!("What is {i} + 2?"), "steps": (0..=i % 4).map(|k| format!("step {k} of {i}")).collect::<Vec<_>>()}))
        .collect();
    let together = post(&server.url, "/v1/score_steps", &json!({"inputs": inputs}));
    let url = server.url.clone();
    let alone: Vec<Value> = std::thread::scope(|scope| {
        let handles: Vec<_> = inputs
            .iter()
            .map(|i| {
                let url = url.clone();
                scope.spawn(move || post(&url, "/v1/score_steps", &json!({"inputs": [i]}))["scores"][0].clone())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (k, (a, b)) in together["scores"].as_array().unwrap().iter().zip(&alone).enumerate() {
        let (a, b) = (a.as_array().unwrap(), b.as_array().unwrap());
        assert_eq!(a.len(), k % 4 + 1);
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!(
                (x.as_f64().unwrap() - y.as_f64().unwrap()).abs() < 1e-5,
                "input {k}: {a:?} vs {b:?}"
            );
        }
    }
}

/// OpenRLHF's remote reward model protocol: a response's reward is its steps' scores (as
/// /v1/score_steps gives them) aggregated by their minimum, plus 1 when its answer grades equal
/// to its label; the question is the templated prompt's user turn.
#[test]
fn get_reward_answers_openrlhf() {
    let server = serve(&["--reward-separator", "\n"]);
    let prompt = "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n";
    let responses = ["2 + 3 = 5.\nThe answer is \\boxed{5}.", "The answer is 6."];
    let queries: Vec<String> = responses.iter().map(|r| format!("{prompt}{r}<|im_end|>")).collect();
    let got = post(
        &server.url,
        "/get_reward",
        &json!({"query": queries, "prompts": [prompt, prompt], "labels": ["5", "5"]}),
    );
    let rewards: Vec<f64> = got["rewards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let steps = [
        vec!["2 + 3 = 5.", "The answer is \\boxed{5}."],
        vec!["The answer is 6."],
    ];
    let inputs: Vec<Value> = steps
        .iter()
        .map(|s| json!({"question": "What is 2+3?", "steps": s}))
        .collect();
    let scores = post(&server.url, "/v1/score_steps", &json!({"inputs": inputs}))["scores"].clone();
    let min = |k: usize| {
        scores[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::INFINITY, f64::min)
    };
    assert!((rewards[0] - (min(0) + 1.0)).abs() < 1e-5, "{got}");
    assert!((rewards[1] - min(1)).abs() < 1e-5, "{got}");
    assert_eq!(got["extra_logs"]["acc"], json!([1.0, 0.0]));
    assert_eq!(got["step_scores"], scores);
    // The legacy shape (queries only: each the response, with no question) is answered too,
    // without outcomes.
    let legacy = post(&server.url, "/get_reward", &json!({"query": [responses[1]]}));
    let alone = post(
        &server.url,
        "/v1/score_steps",
        &json!({"inputs": [{"question": "", "steps": [responses[1]]}]}),
    );
    assert_eq!(legacy["rewards"][0], alone["scores"][0][0], "{legacy}");
    assert_eq!(legacy["extra_logs"]["acc"], json!([0.0]));
}

/// Concurrent completion requests of different prompt lengths, `n` and `max_tokens` are decoded
/// together in one running batch, and each gets what it gets when sent alone.
/// A list of prompts in one request (OpenAI's completions take one): each prompt's `n`
/// choices after the previous prompt's, as each prompt alone gets them; echoed log-probabilities
/// each of its own prompt; more continuations than `--max-n` refused naming `prompt`.
#[test]
fn a_list_of_prompts_gets_what_each_prompt_gets_alone() {
    let server = serve(&["--max-n", "4"]);
    let prompts = [json!("What is 2 + 3?"), json!([30, 31, 32, 33, 34, 35])];
    let ask = |prompt: Value| {
        json!({"model": "qwen2-policy", "prompt": prompt, "n": 2, "max_tokens": 5, "seed": 11,
               "temperature": 0.9, "echo": true, "logprobs": 0})
    };
    let batch = post(&server.url, "/v1/completions", &ask(json!(prompts)));
    let choices = batch["choices"].as_array().unwrap_or_else(|| panic!("{batch}"));
    assert_eq!(choices.len(), 4, "{batch}");
    let mut prompt_tokens = 0;
    for (k, prompt) in prompts.iter().enumerate() {
        let alone = post(&server.url, "/v1/completions", &ask(prompt.clone()));
        prompt_tokens += alone["usage"]["prompt_tokens"].as_u64().unwrap();
        for j in 0..2 {
            let (a, b) = (&alone["choices"][j], &choices[2 * k + j]);
            assert_eq!(b["index"], 2 * k + j);
            assert_eq!(a["text"], b["text"], "prompt {k}, choice {j}");
            assert_eq!(
                a["logprobs"]["tokens"], b["logprobs"]["tokens"],
                "prompt {k}, choice {j}"
            );
            assert!(b["logprobs"]["token_logprobs"][0].is_null());
        }
    }
    assert_eq!(batch["usage"]["prompt_tokens"], prompt_tokens);
    let too_many = post(
        &server.url,
        "/v1/completions",
        &json!({"model": "qwen2-policy", "prompt": ["a", "b", "c"], "n": 2, "max_tokens": 2}),
    );
    assert_eq!(too_many["error"]["param"], "prompt", "{too_many}");
    let empty = post(&server.url, "/v1/completions", &json!({"prompt": [], "max_tokens": 2}));
    assert_eq!(empty["error"]["param"], "prompt", "{empty}");
}

#[test]
fn concurrent_completions_get_what_they_get_alone() {
    let server = serve(&[]);
    let requests: Vec<Value> = (0..12)
        .map(|i| {
            json!({"model": "qwen2-policy", "prompt": format!("What is {} + {i}?", "9".repeat(1 + i % 5)),
                   "n": 1 + i % 3, "max_tokens": 4 + 3 * (i % 4), "temperature": 0.0, "ignore_eos": true})
        })
        .collect();
    let alone: Vec<Value> = requests
        .iter()
        .map(|r| post(&server.url, "/v1/completions", r))
        .collect();
    let url = server.url.clone();
    let together: Vec<Value> = std::thread::scope(|scope| {
        let handles: Vec<_> = requests
            .iter()
            .map(|r| {
                let url = url.clone();
                scope.spawn(move || post(&url, "/v1/completions", r))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        let texts = |v: &Value| -> Vec<String> {
            v["choices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["text"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(texts(a).len(), 1 + i % 3, "request {i}: {a}");
        assert_eq!(texts(a), texts(b), "request {i}");
        assert_eq!(a["usage"]["completion_tokens"], json!((1 + i % 3) * (4 + 3 * (i % 4))));
        assert_eq!(a["usage"], b["usage"], "request {i}");
    }
    // Every generated token after a continuation's first came from a decoding step.
    let (_, metrics) = get(&server.url, "/metrics");
    let counter = |name: &str| -> u64 {
        let line = metrics.lines().find(|l| l.starts_with(name)).unwrap();
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let tokens = counter("stepwise_generation_tokens_total");
    let continuations: u64 = (0..12).map(|i| 2 * (1 + i % 3) as u64).sum();
    assert_eq!(counter("stepwise_decode_rows_total"), tokens - continuations);
    assert!(counter("stepwise_decode_steps_total") <= counter("stepwise_decode_rows_total"));
}

#[test]
fn the_api_key_and_request_errors_are_answered_as_openai_does() {
    let d_tmp = tmp("auth");
    let d = d_tmp.path();
    let server = serve(&["--api-key", "sekrit"]);
    let probs = problems(d);
    let out = d.join("out.jsonl");
    let base = [
        "generate",
        "--model",
        &server.url,
        "--input",
        probs.to_str().unwrap(),
        "--served-model",
        "qwen2-policy",
    ];
    // No key: refused at once (401 is not retried), with the server's message.
    let refused = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args(base)
        .args(["--output", out.to_str().unwrap()])
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("Incorrect API key"));
    stepwise(
        &[
            &base[..],
            &[
                "--api-key",
                "sekrit",
                "-n",
                "1",
                "--max-tokens",
                "4",
                "--output",
                out.to_str().unwrap(),
            ],
        ]
        .concat(),
    );
    assert_eq!(records(&out).len(), 2);
    // A prompt longer than the model reads: a 400 naming the limit, not retried.
    let long = d.join("long.jsonl");
    write_jsonl(
        &long,
        &[json!({"id": "x", "question": "2 + 2 ".repeat(400), "answer": "4"})],
    );
    let err = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args([
            "generate",
            "--model",
            &server.url,
            "--api-key",
            "sekrit",
            "--input",
            long.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&err.stderr);
    assert_eq!(err.status.code(), Some(1), "{said}");
    assert!(said.contains("maximum context length is 512 tokens"), "{said}");
}

/// The official `openai` Python package against `stepwise serve` (`tests/openai_client.py`):
/// completions with n, seed, logprobs, stop and streaming, chat, and the error cases. Runs
/// where STEPWISE_OPENAI_PYTHON names a Python that has `openai` (`.ci/run` makes one in a
/// throw-away virtual environment); elsewhere it says it did not run.
#[test]
fn the_openai_python_client_works_against_serve() {
    let Some(python) = std::env::var_os("STEPWISE_OPENAI_PYTHON") else {
        eprintln!("not run: set STEPWISE_OPENAI_PYTHON to a Python with `openai` installed (.ci/run does)");
        return;
    };
    let server = serve(&["--api-key", "sekrit"]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let out = Command::new(python)
        .arg(&script)
        .args([&server.url, "sekrit", "qwen2-policy"])
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    assert!(said.contains("checks passed"), "{said}");
    println!("{said}");
}

/// `/health` answers, `/metrics` counts what was served in Prometheus' text format, and SIGTERM
/// stops the server cleanly.
#[test]
fn health_metrics_and_a_clean_stop() {
    let mut server = serve(&[]);
    assert!(get(&server.url, "/health").0.contains("200"));
    post(
        &server.url,
        "/v1/score_steps",
        &json!({"inputs": [{"question": "q", "steps": ["a", "b"]}]}),
    );
    post(
        &server.url,
        "/v1/completions",
        &json!({"prompt": "What is 2 + 3?", "max_tokens": 3}),
    );
    post(&server.url, "/v1/completions", &json!({"model": "nope", "prompt": "x"}));
    let (status, metrics) = get(&server.url, "/metrics");
    assert!(status.contains("200"), "{status}");
    for want in [
        "stepwise_requests_total{endpoint=\"/v1/score_steps\",status=\"200\"} 1",
        "stepwise_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 1",
        "stepwise_requests_total{endpoint=\"/v1/completions\",status=\"404\"} 1",
        "stepwise_request_seconds_count 4",
        "# TYPE stepwise_request_seconds histogram",
    ] {
        assert!(metrics.contains(want), "missing `{want}` in\n{metrics}");
    }
    let generated: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("stepwise_generation_tokens_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert!((1..=3).contains(&generated), "{metrics}");
    // SIGTERM: stops accepting, finishes, exits 0.
    let pid = server.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

/// A chat request without `max_tokens` on a short-context model gets what the context leaves
/// (vLLM's default), not a refusal; an explicit value past the context, or a fractional one, is a
/// clear 400.
#[test]
fn max_tokens_defaults_to_what_the_context_leaves() {
    let server = serve(&["--max-tokens", "100000"]);
    let chat = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "What is 2+3?"}], "temperature": 0.0});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        post(&server.url, "/v1/chat/completions", &body)
    };
    let ok = chat(json!({}));
    assert!(ok["choices"][0]["message"]["content"].is_string(), "{ok}");
    let too_long = chat(json!({"max_tokens": 5000}));
    assert!(
        too_long["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length"),
        "{too_long}"
    );
    let fractional = chat(json!({"max_tokens": 2.9}));
    assert_eq!(fractional["error"]["param"], "max_tokens", "{fractional}");
}

#[test]
fn without_max_tokens_a_continuation_may_fill_what_the_context_leaves() {
    let d_tmp = tmp("context");
    let d = d_tmp.path();
    let server = serve(&[]);
    // A server asked for `max_tokens: null` (vLLM's reading) gives what the context leaves; left
    // out, OpenAI's completions default of 16.
    let ask = |max_tokens: Option<Value>| {
        let mut body = json!({"model": "qwen2-policy", "prompt": "What is 2 + 3?", "ignore_eos": true});
        if let Some(m) = max_tokens {
            body["max_tokens"] = m;
        }
        post(&server.url, "/v1/completions", &body)
    };
    let filled = ask(Some(Value::Null));
    let (prompt, completion) = (
        filled["usage"]["prompt_tokens"].as_u64().unwrap(),
        filled["usage"]["completion_tokens"].as_u64().unwrap(),
    );
    assert_eq!(prompt + completion, 512, "{filled}");
    assert_eq!(ask(None)["usage"]["completion_tokens"], 16);
    // `generate` without --max-tokens, against the server and locally, on the 512-token model
    // (it asked for 512 new tokens and was refused).
    let probs = problems(d);
    for model in [server.url.clone(), fixture("qwen2-policy")] {
        let out = d.join("out.jsonl");
        let _ = std::fs::remove_file(&out);
        stepwise(&[
            "generate",
            "--model",
            &model,
            "-n",
            "1",
            "--input",
            probs.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
        ]);
        assert_eq!(std::fs::read_to_string(&out).unwrap().lines().count(), 2, "{model}");
    }
}

/// A served policy's next-token log-probabilities (`logprobs`) give the local engine's
/// likelihood of each option that starts with one of the 20 likeliest tokens: what a generative
/// verifier reads a verdict's probability with (`P(correct)` against `P(incorrect)`).
#[test]
fn a_served_policy_gives_the_local_engines_next_token_likelihoods() {
    use stepwise_core::seams::Policy;
    let server = serve(&[]);
    let dir = PathBuf::from(fixture("qwen2-policy"));
    let tok = stepwise_model::Tokenizer::from_dir(&dir).unwrap();
    let model = stepwise_model::Model::load(&dir, &stepwise_model::default_device()).unwrap();
    let local = stepwise_model::EnginePolicy {
        model: &model,
        tokenizer: &tok,
        params: Default::default(),
        prompt: stepwise_model::Prompt::Text,
        separator: "\n".into(),
        adapter: None,
    };
    let client = stepwise_remote::client::Client::new(stepwise_remote::client::ServerConfig::new(
        vec![server.url.clone()],
        "qwen2-policy",
    ))
    .unwrap();
    let remote = stepwise_remote::policy::RemotePolicy {
        client: &client,
        tokenizer: Some(&tok),
        prompt: stepwise_model::Prompt::Text,
        separator: "\n".into(),
        temperature: 0.0,
        top_p: 1.0,
        max_tokens: None,
        stop: Vec::new(),
    };
    let (question, written) = ("What is 2 + 3?", "Step 1: 2 + 3 = 5 \\boxed{");
    // The server's likeliest next tokens whose text is one token again: the options.
    let mut ids = tok.encode(&format!("{question}\n"), false).unwrap();
    ids.extend(tok.encode(written, false).unwrap());
    let reply = post(
        &server.url,
        "/v1/completions",
        &json!({"model": "qwen2-policy", "prompt": ids, "max_tokens": 1, "temperature": 0.0, "logprobs": 20}),
    );
    let top = reply["choices"][0]["logprobs"]["top_logprobs"][0]
        .as_object()
        .unwrap()
        .clone();
    let options: Vec<String> = top
        .keys()
        .filter(|t| !t.trim().is_empty() && tok.encode(t, false).unwrap().len() == 1)
        .take(4)
        .cloned()
        .collect();
    assert!(options.len() >= 2, "{reply}");
    let options: Vec<&str> = options.iter().map(String::as_str).collect();
    let served = remote
        .continuation_logprobs(question, written, &options)
        .unwrap()
        .unwrap();
    let here = local
        .continuation_logprobs(question, written, &options)
        .unwrap()
        .unwrap();
    for ((o, a), b) in options.iter().zip(&served).zip(&here) {
        assert_eq!(
            Some(*a),
            top[*o].as_f64(),
            "{o:?}: its own alternative's log-probability"
        );
        assert!((a - b).abs() < 0.02, "{o:?}: served {a}, local {b}");
    }
    // Continuing its own text up to a stop string (a verifier with tools): the served policy
    // writes what the local engine writes, the stop string kept at the end of both.
    let local = stepwise_model::EnginePolicy {
        params: stepwise_model::SamplingParams {
            temperature: 0.0,
            max_new_tokens: 12,
            ..Default::default()
        },
        ..local
    };
    let remote = stepwise_remote::policy::RemotePolicy {
        max_tokens: Some(12),
        ..remote
    };
    let whole = local.continue_written(question, written, &[], 0).unwrap().unwrap();
    let chars: Vec<char> = whole.text.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let here = local
        .continue_written(question, written, &[stop.as_str()], 0)
        .unwrap()
        .unwrap();
    let served = remote
        .continue_written(question, written, &[stop.as_str()], 0)
        .unwrap()
        .unwrap();
    assert!(here.text.ends_with(&stop) && !here.finished, "{here:?}");
    assert_eq!(served.text, here.text);
    assert!(!served.finished);
    let served_whole = remote.continue_written(question, written, &[], 0).unwrap().unwrap();
    assert_eq!(served_whole.text, whole.text);
    assert!(served_whole.finished);
}

#[test]
fn the_tokenizer_routes_answer_as_vllm_does() {
    let server = serve(&[]);
    let dir = PathBuf::from(fixture("qwen2-policy"));
    let tok = stepwise_model::Tokenizer::from_dir(&dir).unwrap();
    let text = "What is 2 + 3?\n2 + 3 = 5";
    let r = post(
        &server.url,
        "/tokenize",
        &json!({"prompt": text, "return_token_strs": true}),
    );
    let ids = tok.encode(text, true).unwrap();
    assert_eq!(r["tokens"], json!(ids), "{r}");
    assert_eq!(r["count"], ids.len());
    assert_eq!(r["max_model_len"], 512);
    assert_eq!(r["token_strs"].as_array().unwrap().len(), ids.len());
    let back = post(&server.url, "/detokenize", &json!({"tokens": ids}));
    assert_eq!(back["prompt"], text, "{back}");
    // A conversation through the chat template: the ids a chat completion's prompt has.
    let messages = json!([{"role": "user", "content": "What is 2 + 3?"}]);
    let r = post(&server.url, "/tokenize", &json!({"messages": messages}));
    let chat = post(
        &server.url,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 1}),
    );
    assert_eq!(r["count"], chat["usage"]["prompt_tokens"], "{r} {chat}");
    let templated = tok
        .apply_chat_template(
            &[stepwise_model::tokenizer::Message::new("user", "What is 2 + 3?")],
            true,
        )
        .unwrap();
    assert_eq!(r["tokens"], json!(tok.encode(&templated, false).unwrap()));
    let info = get(&server.url, "/tokenizer_info").1;
    let info: Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["eos_token"], "<|im_end|>", "{info}");
    assert!(info["chat_template"].as_str().unwrap().contains("<|im_start|>"));
    // The PRM's tokenizer by its name; bad requests are 400s or 404s naming the field.
    let r = post(
        &server.url,
        "/tokenize",
        &json!({"model": "qwen2-prm", "prompt": "2 + 3"}),
    );
    assert!(r["tokens"].is_array(), "{r}");
    for (body, param) in [
        (json!({"tokens": [0, 1, 1_000_000]}), "tokens"),
        (json!({"tokens": "12"}), "tokens"),
        (json!({"model": "nope", "tokens": [1]}), "model"),
    ] {
        let r = post(&server.url, "/detokenize", &body);
        assert_eq!(r["error"]["param"], param, "{body}: {r}");
    }
    let r = post(&server.url, "/tokenize", &json!({"prompt": ["a"]}));
    assert_eq!(r["error"]["param"], "prompt", "{r}");
}
