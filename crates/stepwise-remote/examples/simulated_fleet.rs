//! A fleet of simulated OpenAI-compatible policy servers in one process, for measuring what one
//! driver (`stepwise generate`, `annotate`, `search` against servers) costs and whether it keeps a
//! fleet busy (`bench/fleet.py`), without GPUs.
//!
//! Each server models a vLLM-like H100 serving a 7B policy: up to `--capacity` sequences decode at
//! once (vLLM's `max_num_seqs`), each at `--tokens-per-second` after `--first-token-ms`; sequences
//! beyond the capacity wait for a slot. A continuation's text and length are a function of the
//! prompt, the request's seed and the choice's index only, as a seeded server's are, so a run
//! over any number of these servers gives the same records. The text is math-like steps ending in
//! `\boxed{N}`, so rollouts grade right or wrong.
//!
//! Each server also answers stepwise's scoring route `/v1/score_steps` as a 7B PRM would: scoring is
//! a prefill (no decoding), compute-bound, so a server runs one request's forward pass at a time,
//! taking `--forward-ms` plus the request's words at `--prefill-tokens-per-second`, and requests
//! queue for it; a step's score is a function of the question and the steps up to it only. Its
//! busy fraction (`prefill_busy` in `/stats`) is the share of time a forward pass runs.
//!
//! Routes: `/health`, `/v1/models`, `/v1/completions`, `/v1/score_steps`, `GET /stats` (each server's requests,
//! sequences and busy time since the last `POST /stats/reset`: the time-average of
//! min(running sequences, capacity) / capacity).
//!
//! ```text
//! cargo run --release -p stepwise-remote --example simulated_fleet -- --servers 8 --list servers.txt
//! ```

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

struct Args {
    servers: usize,
    capacity: usize,
    tokens_per_second: f64,
    first_token_ms: f64,
    mean_tokens: usize,
    prefill_tokens_per_second: f64,
    forward_ms: f64,
    list: Option<String>,
}

fn args() -> Args {
    let mut a = Args {
        servers: 8,
        capacity: 64,
        tokens_per_second: 50.0,
        first_token_ms: 40.0,
        mean_tokens: 120,
        prefill_tokens_per_second: 20000.0,
        forward_ms: 5.0,
        list: None,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let v = pair.get(1).map(String::as_str).unwrap_or("");
        let num = || {
            v.parse::<f64>()
                .unwrap_or_else(|_| panic!("{} takes a number, not `{v}`", pair[0]))
        };
        match pair[0].as_str() {
            "--servers" => a.servers = num() as usize,
            "--capacity" => a.capacity = num() as usize,
            "--tokens-per-second" => a.tokens_per_second = num(),
            "--first-token-ms" => a.first_token_ms = num(),
            "--mean-tokens" => a.mean_tokens = num() as usize,
            "--prefill-tokens-per-second" => a.prefill_tokens_per_second = num(),
            "--forward-ms" => a.forward_ms = num(),
            "--list" => a.list = Some(v.to_string()),
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

/// One server's accounting.
struct Load {
    since: Instant,
    last: Instant,
    running: usize,
    /// ∫ min(running, capacity) dt, in seconds.
    busy: f64,
    /// Seconds a scoring forward pass ran.
    prefill_busy: f64,
    requests: u64,
    sequences: u64,
    tokens: u64,
}

struct Server {
    capacity: usize,
    tokens_per_second: f64,
    first_token: Duration,
    mean_tokens: usize,
    prefill_tokens_per_second: f64,
    forward: Duration,
    /// One scoring forward pass at a time.
    prefill: tokio::sync::Mutex<()>,
    slots: Semaphore,
    load: Mutex<Load>,
}

impl Server {
    /// `delta` sequences start (+) or end (−) now.
    fn account(&self, delta: isize) {
        let mut l = self.load.lock().unwrap();
        let now = Instant::now();
        l.busy += (now - l.last).as_secs_f64() * l.running.min(self.capacity) as f64;
        l.last = now;
        l.running = l.running.saturating_add_signed(delta);
    }
}

/// FNV-1a: the text's dependence on prompt, seed and index.
fn hash(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in *p {
            h = (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        h = (h ^ 0xff).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A continuation of about `tokens` tokens (a token ≈ a word here), cut at the first stop string.
fn continuation(h: u64, tokens: usize, stop: &[String]) -> (String, usize, Option<String>) {
    let mut text = String::new();
    let mut x = h;
    let mut words = 0;
    let mut step = 1;
    while words + 12 < tokens {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let (a, b) = ((x >> 33) % 90 + 10, (x >> 45) % 90 + 10);
        text.push_str(&format!("Step {step}: we add {a} and {b} to get {} so far.\n", a + b));
        words += 11;
        step += 1;
    }
    text.push_str(&format!("The answer is \\boxed{{{}}}", (h >> 20) % 4 + 5));
    words += 4;
    for s in stop {
        if let Some(i) = text.find(s.as_str()) {
            let cut = text[..i].to_string();
            let n = cut.split_whitespace().count().max(1);
            return (cut, n, Some(s.clone()));
        }
    }
    (text, words, None)
}

async fn completions(State(s): State<Arc<Server>>, Json(body): Json<Value>) -> Json<Value> {
    let n = body["n"].as_u64().unwrap_or(1).max(1) as usize;
    let seed = body["seed"].as_u64().unwrap_or(0);
    let prompt = body["prompt"].to_string();
    let max_tokens = body["max_tokens"].as_u64().map_or(usize::MAX, |m| m as usize);
    let stop: Vec<String> = match &body["stop"] {
        Value::String(x) => vec![x.clone()],
        Value::Array(a) => a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect(),
        _ => Vec::new(),
    };
    let mut choices = Vec::new();
    let mut longest = 0;
    let mut total = 0;
    for i in 0..n {
        let h = hash(&[prompt.as_bytes(), &seed.to_le_bytes(), &i.to_le_bytes()]);
        let want = (s.mean_tokens / 2 + (h % s.mean_tokens as u64) as usize).min(max_tokens);
        let (text, tokens, stopped) = continuation(h, want, &stop);
        longest = longest.max(tokens);
        total += tokens;
        choices.push(json!({"index": i, "text": text, "finish_reason": "stop", "stop_reason": stopped}));
    }
    // The n sequences take n of the server's slots for the longest one's decoding.
    let secs = s.first_token.as_secs_f64() + longest as f64 / s.tokens_per_second;
    occupy(&s, n, secs, total).await;
    Json(
        json!({"object": "text_completion", "model": "sim-7b", "choices": choices,
                "usage": {"completion_tokens": total, "prompt_tokens": 0, "total_tokens": total}}),
    )
}

/// Hold `n` of the server's slots for `secs`, accounted as busy, then count the request.
async fn occupy(s: &Server, n: usize, secs: f64, tokens: usize) {
    let permits = s.slots.acquire_many(n.clamp(1, s.capacity) as u32).await.unwrap();
    s.account(n as isize);
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    s.account(-(n as isize));
    drop(permits);
    let mut l = s.load.lock().unwrap();
    l.requests += 1;
    l.sequences += n as u64;
    l.tokens += tokens as u64;
}

/// stepwise's scoring protocol: `{"inputs": [{"question", "steps"}]}` → `{"scores": [[..]]}`.
async fn score_steps(State(s): State<Arc<Server>>, Json(body): Json<Value>) -> Json<Value> {
    let empty = Vec::new();
    let inputs = body["inputs"].as_array().unwrap_or(&empty);
    let mut scores = Vec::new();
    let mut words = 0;
    for input in inputs {
        let question = input["question"].as_str().unwrap_or("");
        words += question.split_whitespace().count();
        let mut prefix = vec![question.as_bytes()];
        let mut row = Vec::new();
        for step in input["steps"].as_array().unwrap_or(&empty) {
            let text = step.as_str().unwrap_or("");
            words += text.split_whitespace().count();
            prefix.push(text.as_bytes());
            row.push((hash(&prefix) % 1000) as f64 / 1000.0);
        }
        scores.push(row);
    }
    let secs = s.forward.as_secs_f64() + words as f64 / s.prefill_tokens_per_second;
    {
        let _pass = s.prefill.lock().await;
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        let mut l = s.load.lock().unwrap();
        l.prefill_busy += secs;
        l.requests += 1;
        l.sequences += inputs.len() as u64;
        l.tokens += words as u64;
    }
    Json(json!({"object": "list", "model": "sim-prm-7b", "scores": scores,
                "usage": {"prompt_tokens": words, "total_tokens": words}}))
}

async fn stats(State(s): State<Arc<Server>>) -> Json<Value> {
    s.account(0);
    let l = s.load.lock().unwrap();
    let secs = (l.last - l.since).as_secs_f64();
    Json(
        json!({"seconds": secs, "busy": l.busy / (secs * s.capacity as f64).max(1e-9),
                "prefill_busy": l.prefill_busy / secs.max(1e-9),
                "requests": l.requests, "sequences": l.sequences, "tokens": l.tokens, "running": l.running}),
    )
}

async fn reset(State(s): State<Arc<Server>>) -> Json<Value> {
    s.account(0);
    let mut l = s.load.lock().unwrap();
    let now = Instant::now();
    (l.since, l.busy, l.prefill_busy, l.requests, l.sequences, l.tokens) = (now, 0.0, 0.0, 0, 0, 0);
    Json(json!({"reset": true}))
}

fn main() {
    let a = args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut urls = Vec::new();
        for _ in 0..a.servers {
            let now = Instant::now();
            let server = Arc::new(Server {
                capacity: a.capacity,
                tokens_per_second: a.tokens_per_second,
                first_token: Duration::from_secs_f64(a.first_token_ms / 1e3),
                mean_tokens: a.mean_tokens.max(16),
                prefill_tokens_per_second: a.prefill_tokens_per_second,
                forward: Duration::from_secs_f64(a.forward_ms / 1e3),
                prefill: tokio::sync::Mutex::new(()),
                slots: Semaphore::new(a.capacity),
                load: Mutex::new(Load {
                    since: now,
                    last: now,
                    running: 0,
                    busy: 0.0,
                    prefill_busy: 0.0,
                    requests: 0,
                    sequences: 0,
                    tokens: 0,
                }),
            });
            let app = Router::new()
                .route("/health", get(|| async { "ok" }))
                .route(
                    "/v1/models",
                    get(|| async { Json(json!({"data": [{"id": "sim-7b"}]})) }),
                )
                .route("/v1/completions", post(completions))
                .route("/score_steps", post(score_steps))
                .route("/v1/score_steps", post(score_steps))
                .route("/stats", get(stats))
                .route("/stats/reset", post(reset))
                .with_state(server);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            urls.push(format!("http://{}", listener.local_addr().unwrap()));
            tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        }
        if let Some(list) = &a.list {
            std::fs::write(list, urls.join("\n") + "\n").unwrap();
        }
        eprintln!("simulated fleet: listening on {}", urls.join(","));
        std::future::pending::<()>().await;
    });
}
