//! Fixed answers weighed by a served model: `stepwise serve` echoes the prompt's own
//! log-probabilities (`echo` with `logprobs`, lm-evaluation-harness's loglikelihood request), and
//! a judge weighed by likelihood through it (`RemotePolicy::logprobs_after`, `stepwise score
//! --verifier judge --verdict likelihood --model URL`) gives what the local engine gives.

use serde_json::json;
use std::path::PathBuf;
use stepwise_core::seams::{NextOptions, Policy};

mod common;
use common::server::{get, post, serve};
use common::{fixture, write_jsonl};

/// The fixture policy loaded here, and its tokenizer.
fn local() -> (stepwise_model::Model, stepwise_model::Tokenizer) {
    let dir = PathBuf::from(fixture("qwen2-policy"));
    let model = stepwise_model::Model::load(&dir, &stepwise_model::default_device()).unwrap();
    (model, stepwise_model::Tokenizer::from_dir(&dir).unwrap())
}

#[test]
fn the_served_prompt_log_probabilities_are_the_local_models() {
    let server = serve(&[]);
    let (model, tok) = local();
    let ids = tok.encode("What is 2 + 3?\n5", false).unwrap();
    let rows: Vec<usize> = (0..ids.len() - 1).collect();
    let here = model.vocab_logprobs(&ids, &rows).unwrap();
    for max_tokens in [0, 1] {
        let reply = post(
            &server.url,
            "/v1/completions",
            &json!({"model": "qwen2-policy", "prompt": ids, "echo": true, "logprobs": 2,
                "max_tokens": max_tokens, "temperature": 0.0}),
        );
        let lp = &reply["choices"][0]["logprobs"];
        let served = lp["token_logprobs"].as_array().unwrap();
        assert_eq!(served.len(), ids.len() + max_tokens, "{reply}");
        assert!(served[0].is_null() && lp["top_logprobs"][0].is_null(), "{reply}");
        for (i, row) in here.iter().enumerate() {
            let (a, b) = (served[i + 1].as_f64().unwrap(), row[ids[i + 1] as usize] as f64);
            assert!((a - b).abs() < 1e-4, "token {}: served {a}, here {b}", i + 1);
            let top = lp["top_logprobs"][i + 1].as_object().unwrap();
            let best = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            assert_eq!(top.len(), 2);
            let served_best = top
                .values()
                .map(|v| v.as_f64().unwrap())
                .fold(f64::NEG_INFINITY, f64::max);
            assert!((served_best - best).abs() < 1e-4, "{top:?} against {best}");
        }
        assert!(reply["choices"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("What is 2 + 3?\n5"));
        assert_eq!(reply["usage"]["completion_tokens"], max_tokens);
    }
    // `max_tokens: 0` means nothing only with `echo`.
    let refused = post(
        &server.url,
        "/v1/completions",
        &json!({"model": "qwen2-policy", "prompt": "x", "max_tokens": 0}),
    );
    assert_eq!(refused["error"]["param"], "max_tokens", "{refused}");
}

/// A counter of the server's `/metrics`.
fn counter(url: &str, name: &str) -> f64 {
    let (_, text) = get(url, "/metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[test]
fn a_requests_choices_are_weighed_as_sampled_its_prompt_in_one_pass_and_concurrent_requests_alike() {
    let server = serve(&[]);
    let (model, tok) = local();
    let ids = tok.encode("What is 4 * 2?\n", false).unwrap();
    // Greedy continuations, as the local engine picks them.
    let mut seq = ids.clone();
    for _ in 0..3 {
        let row = &model.vocab_logprobs(&seq, &[seq.len() - 1]).unwrap()[0];
        let best = (0..row.len()).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
        seq.push(best as u32);
    }
    let here = model
        .vocab_logprobs(&seq, &(0..seq.len() - 1).collect::<Vec<_>>())
        .unwrap();
    let expected: Vec<f64> = here.iter().zip(&seq[1..]).map(|(r, &t)| r[t as usize] as f64).collect();
    let (passes, seqs) = (
        counter(&server.url, "stepwise_logprob_passes_total"),
        counter(&server.url, "stepwise_logprob_sequences_total"),
    );
    let reply = post(
        &server.url,
        "/v1/completions",
        &json!({"prompt": ids, "echo": true, "logprobs": 1, "max_tokens": 3, "n": 4,
            "temperature": 0.0, "ignore_eos": true}),
    );
    // The echoed prompt is weighed in one pass; the choices' tokens were weighed as they were
    // sampled (from the decoding steps' logits: no pass of their own).
    assert_eq!(counter(&server.url, "stepwise_logprob_passes_total"), passes + 1.0);
    assert_eq!(counter(&server.url, "stepwise_logprob_sequences_total"), seqs + 1.0);
    for (c, choice) in reply["choices"].as_array().unwrap().iter().enumerate() {
        let served: Vec<f64> = choice["logprobs"]["token_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(serde_json::Value::as_f64)
            .collect();
        // Each choice echoes the prompt (read once, with the first choice's tokens; its first
        // token has none) before its own tokens.
        assert_eq!(served.len(), expected.len(), "choice {c}: {reply}");
        for (a, b) in served.iter().zip(&expected) {
            assert!((a - b).abs() < 1e-4, "choice {c}: served {served:?}, here {expected:?}");
        }
    }
    // A one-token request is sampled from the pass that weighs its prompt, as the decoding
    // batch samples a continuation's first token (each continuation its own generator).
    let sampled = |max_tokens: usize| {
        let reply = post(
            &server.url,
            "/v1/completions",
            &json!({"prompt": ids, "logprobs": 0, "max_tokens": max_tokens, "n": 6,
                "temperature": 1.0, "seed": 7, "ignore_eos": true}),
        );
        let firsts: Vec<(String, f64)> = reply["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let lp = &c["logprobs"];
                (
                    lp["tokens"][0].as_str().unwrap().to_string(),
                    lp["token_logprobs"][0].as_f64().unwrap(),
                )
            })
            .collect();
        assert_eq!(firsts.len(), 6, "{reply}");
        firsts
    };
    let (one, decoded) = (sampled(1), sampled(2));
    for ((a, la), (b, lb)) in one.iter().zip(&decoded) {
        assert_eq!(a, b, "one token {one:?}, decoded {decoded:?}");
        assert!((la - lb).abs() < 1e-4, "one token {one:?}, decoded {decoded:?}");
    }
    // Prompts sent at once, packed as they come: each is weighed as it is alone.
    let prompts: Vec<Vec<u32>> = (0..12)
        .map(|i| {
            tok.encode(&format!("What is {i} + {}?\n{}", 3 * i, 4 * i), false)
                .unwrap()
        })
        .collect();
    let replies: Vec<serde_json::Value> = std::thread::scope(|sc| {
        let asks: Vec<_> = prompts
            .iter()
            .map(|p| {
                let url = &server.url;
                sc.spawn(move || {
                    post(
                        url,
                        "/v1/completions",
                        &json!({"prompt": p, "echo": true, "logprobs": 0, "max_tokens": 0}),
                    )
                })
            })
            .collect();
        asks.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (p, reply) in prompts.iter().zip(&replies) {
        let here = model.vocab_logprobs(p, &(0..p.len() - 1).collect::<Vec<_>>()).unwrap();
        let served = reply["choices"][0]["logprobs"]["token_logprobs"].as_array().unwrap();
        assert_eq!(served.len(), p.len(), "{reply}");
        for (i, row) in here.iter().enumerate() {
            let (a, b) = (served[i + 1].as_f64().unwrap(), row[p[i + 1] as usize] as f64);
            assert!((a - b).abs() < 1e-4, "token {}: served {a}, here {b}", i + 1);
        }
    }
}

#[test]
fn a_served_judge_weighs_its_answers_as_the_local_engine_does() {
    let server = serve(&[]);
    let dir = PathBuf::from(fixture("qwen2-policy"));
    let loaded = stepwise_model::LoadedPolicy::load(&dir, &stepwise_model::default_device()).unwrap();
    let tok = &loaded.tokenizer;
    let client = stepwise_remote::Client::new(stepwise_remote::ServerConfig::new(
        vec![server.url.clone()],
        "qwen2-policy",
    ))
    .unwrap();
    let (answers, steps_a, steps_b) = (["-1", "0", "1", "10"], ["2 + 3 = 5"], ["4 * 2 = 6", "so 6"]);
    let asks = [
        NextOptions {
            question: "What is 2 + 3?",
            prefix: &steps_a,
            options: &answers,
        },
        NextOptions {
            question: "What is 4 * 2?",
            prefix: &steps_b,
            options: &answers,
        },
    ];
    for prompt in [stepwise_model::Prompt::Pieces, stepwise_model::Prompt::Text] {
        // As a user loads it: its end token the tokenizer's (the config names none).
        let here = loaded.policy(1.0, 16, prompt, " | ");
        let served = stepwise_remote::RemotePolicy {
            client: &client,
            tokenizer: Some(tok),
            prompt,
            separator: " | ".into(),
            temperature: 1.0,
            top_p: 1.0,
            max_tokens: None,
            stop: Vec::new(),
        };
        for end in [true, false] {
            let a = here.logprobs_after(&asks, end).unwrap().unwrap();
            let b = served.logprobs_after(&asks, end).unwrap().unwrap();
            close(&a, &b, &format!("{prompt:?}, end {end}"));
        }
        if prompt == stepwise_model::Prompt::Text {
            // Without the tokenizer: the prompt as text, tokenized whole by the server, the
            // answer found by its offsets. The local engine encodes the answer on its own: the
            // two read the same tokens where the separator ends a pre-token (a newline; after
            // " | " the server's text merges the space into the answer's first token).
            let by_text = stepwise_remote::RemotePolicy {
                tokenizer: None,
                separator: "\n".into(),
                ..served
            };
            let here = loaded.policy(1.0, 16, prompt, "\n");
            let a = here.logprobs_after(&asks, false).unwrap().unwrap();
            close(&a, &by_text.logprobs_after(&asks, false).unwrap().unwrap(), "as text");
            let err = format!("{:#}", by_text.logprobs_after(&asks, true).unwrap_err());
            assert!(err.contains("--server-tokenizer"), "{err}");
        }
    }
}

fn close(a: &[Vec<f64>], b: &[Vec<f64>], what: &str) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
        assert!((x - y).abs() < 1e-3, "{what}: local {a:?}, served {b:?}");
    }
}

#[test]
fn score_weighs_a_served_judge_as_a_local_one() {
    let server = serve(&[]);
    let d_tmp = common::tmp("remote_weigh", "score");
    let d = d_tmp.path();
    let input = d.join("in.jsonl");
    write_jsonl(
        &input,
        &[
            json!({"id": "a", "question": "What is 2 + 3?", "steps": [{"text": "2 + 3 = 5"}, {"text": "so 5"}]}),
            json!({"id": "b", "question": "What is 4 * 2?", "steps": [{"text": "4 * 2 = 6"}]}),
        ],
    );
    let policy = fixture("qwen2-policy");
    let score = |model: &str, extra: &[&str], out: &str| {
        let out = d.join(out);
        let mut args = vec![
            "score",
            "--verifier",
            "judge",
            "--verdict",
            "likelihood",
            "--separator",
            " | ",
            "--name",
            "judge",
            "--model",
            model,
            "--input",
            input.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
        ];
        args.extend(extra);
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_stepwise"))
            .args(&args)
            .output()
            .unwrap();
        (o, out)
    };
    let (o, here) = score(&policy, &[], "here.jsonl");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (o, served) = score(&server.url, &["--server-tokenizer", &policy], "served.jsonl");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let read = |p: PathBuf| common::step_scores(&std::fs::read_to_string(p).unwrap(), "judge");
    let (a, b) = (read(here), read(served));
    assert_eq!(a.len(), 3);
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() < 1e-3, "local {a:?}, served {b:?}");
    }
    // Without the tokenizer the answers cannot end with the end of text: refused up front.
    let (o, _) = score(&server.url, &[], "refused.jsonl");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--server-tokenizer"), "{err}");
}

#[test]
fn a_generated_end_token_is_listed_with_its_log_probability() {
    let server = serve(&[]);
    let (model, tok) = local();
    let end = tok.token_id("<|im_end|>").unwrap();
    // A prompt after which the fixture's greedy choice is the end token (lm-evaluation-harness
    // asked one of these: it reads the log-probabilities before the generated token's).
    let ids = (0..40)
        .flat_map(|c| [format!("What is 15 + 8?\nAnswer: {}", 15 + c), format!("Q{c}: 2 + {c}")])
        .map(|t| tok.encode(&t, false).unwrap())
        .find(|ids| {
            let row = &model.vocab_logprobs(ids, &[ids.len() - 1]).unwrap()[0];
            (0..row.len()).max_by(|&a, &b| row[a].total_cmp(&row[b])) == Some(end as usize)
        })
        .expect("a prompt the fixture ends greedily");
    for max_tokens in [1, 3] {
        let reply = post(
            &server.url,
            "/v1/completions",
            &json!({"prompt": ids, "echo": true, "logprobs": 1, "max_tokens": max_tokens, "temperature": 0.0}),
        );
        let c = &reply["choices"][0];
        assert_eq!(c["finish_reason"], "stop", "{reply}");
        // The prompt's tokens, then the end token: listed, though the text leaves it out.
        let lps = c["logprobs"]["token_logprobs"].as_array().unwrap();
        assert_eq!(lps.len(), ids.len() + 1, "{reply}");
        assert_eq!(c["logprobs"]["tokens"][ids.len()], "<|im_end|>", "{reply}");
        assert!(lps[ids.len()].as_f64().unwrap() < 0.0);
        assert!(!c["text"].as_str().unwrap().contains("<|im_end|>"), "{reply}");
    }
}
