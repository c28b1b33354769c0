//! `stepwise serve` against careless and hostile clients: connections that send nothing, half a
//! request or a body that drips in are closed or answered within their timeouts; bodies and
//! batches past their limits, wrong-typed fields, unsupported features, unknown paths and
//! methods get OpenAI-shaped errors naming what was wrong; `/metrics` labels by route whatever
//! paths are sent; the API key is read as clients send it; a client that disconnects stops its
//! generation; a stop signal does not wait on idle connections.

mod common;

use common::server::{counter, exchange, get, post, post_request, serve};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

/// Whether the server closes `s` (reads reach the end) before `within` passes.
fn closed_by_server(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).is_ok()
}

fn connect(url: &str) -> TcpStream {
    TcpStream::connect(url.trim_start_matches("http://")).unwrap()
}

fn error_of(body: &str) -> Value {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    v["error"].clone()
}

#[test]
fn slow_silent_and_oversized_clients_are_bounded() {
    let server = serve(&[
        "--idle-timeout",
        "1",
        "--body-timeout",
        "1",
        "--max-body-mb",
        "0.01",
        "--max-inputs",
        "3",
    ]);
    // A connection that says nothing, and one that stops halfway through its headers.
    let mut silent = connect(&server.url);
    let mut half = connect(&server.url);
    half.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n").unwrap();
    assert!(
        closed_by_server(&mut silent, Duration::from_secs(30)),
        "an idle connection stays open"
    );
    assert!(
        closed_by_server(&mut half, Duration::from_secs(30)),
        "half-sent headers hold the connection"
    );
    // A body that stops arriving: 408.
    let mut dripping = connect(&server.url);
    dripping
        .write_all(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\nconnection: close\r\n\r\n{\"prompt\"",
        )
        .unwrap();
    let mut reply = String::new();
    dripping.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = dripping.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    // Too large, by its content-length or as it arrives (chunked): 413.
    let big = json!({"prompt": "x".repeat(20_000)}).to_string();
    let (status, body) = exchange(&server.url, &post_request("/v1/completions", "", &big));
    assert!(status.contains("413"), "{status}");
    assert_eq!(error_of(&body)["code"], 413);
    let chunked = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{big}\r\n0\r\n\r\n",
        big.len()
    );
    assert!(exchange(&server.url, chunked.as_bytes()).0.contains("413"));
    // Too many items in one request.
    let pooled = post(&server.url, "/pooling", &json!({"input": ["a", "b", "c", "d"]}));
    assert!(
        pooled["error"]["message"].as_str().unwrap().contains("--max-inputs"),
        "{pooled}"
    );
    let scored = post(
        &server.url,
        "/v1/score_steps",
        &json!({"inputs": vec![json!({"question": "q", "steps": ["a"]}); 4]}),
    );
    assert_eq!(scored["error"]["param"], "inputs", "{scored}");
    // The server still answers.
    assert!(get(&server.url, "/health").0.contains("200"));
}

#[test]
fn requests_are_read_strictly_and_errors_are_openai_shaped() {
    let server = serve(&[]);
    let complete = |extra: Value| {
        let mut body = json!({"prompt": "What is 2 + 3?", "max_tokens": 3, "temperature": 0.0});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        post(&server.url, "/v1/completions", &body)
    };
    for (field, value) in [
        ("stream", json!("yes")),
        ("ignore_eos", json!(1)),
        ("model", json!(3)),
        ("echo", json!("true")),
        ("max_tokens", json!(2.9)),
        ("tools", json!([{"type": "function", "function": {"name": "f"}}])),
        ("response_format", json!({"type": "json_object"})),
        ("presence_penalty", json!(0.5)),
        ("stream_options", json!({"include_usage": true})),
    ] {
        let reply = complete(json!({ field: value }));
        assert_eq!(reply["error"]["param"], field, "{field}: {reply}");
    }
    let chat = post(
        &server.url,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "logprobs": "yes"}),
    );
    assert_eq!(chat["error"]["param"], "logprobs", "{chat}");
    let partial = post(
        &server.url,
        "/v1/score_steps",
        &json!({"inputs": [{"question": "q", "steps": ["a"], "partial": "no"}]}),
    );
    assert_eq!(partial["error"]["param"], "inputs", "{partial}");
    // Neutral values of unsupported features are fine, and so is a byte-order mark.
    let neutral = complete(json!({"tools": [], "response_format": {"type": "text"}, "presence_penalty": 0}));
    assert!(neutral["choices"][0]["text"].is_string(), "{neutral}");
    let bom = format!("\u{feff}{}", json!({"prompt": "What is 2 + 3?", "max_tokens": 2}));
    let (status, _) = exchange(&server.url, &post_request("/v1/completions", "", &bom));
    assert!(status.contains("200"), "{status}");
    // echo puts the prompt before the completion; include_usage ends the stream with usage.
    let echoed = complete(json!({"echo": true}));
    assert!(
        echoed["choices"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("What is 2 + 3?"),
        "{echoed}"
    );
    let streamed = json!({"prompt": "What is 2 + 3?", "max_tokens": 3, "stream": true,
                          "stream_options": {"include_usage": true}});
    let (status, body) = exchange(&server.url, &post_request("/v1/completions", "", &streamed.to_string()));
    assert!(status.contains("200"), "{status}");
    let chunks: Vec<Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]), "{last}");
    assert!(last["usage"]["completion_tokens"].as_u64().unwrap() >= 1, "{last}");
    // Unknown paths and wrong methods: OpenAI-shaped too.
    let (status, body) = get(&server.url, "/v1/nope");
    assert!(status.contains("404"), "{status}");
    assert_eq!(error_of(&body)["code"], 404);
    let (status, body) = get(&server.url, "/v1/completions");
    assert!(status.contains("405"), "{status}");
    assert_eq!(error_of(&body)["code"], 405);
    // Metrics by route: a hostile path is counted as `unmatched`, never echoed.
    let _ = get(&server.url, "/a\"b");
    for k in 0..50 {
        let _ = get(&server.url, &format!("/junk/{k}"));
    }
    let (_, metrics) = get(&server.url, "/metrics");
    assert!(!metrics.contains("a\"b") && !metrics.contains("/junk/"), "{metrics}");
    assert!(
        metrics.contains("stepwise_requests_total{endpoint=\"unmatched\",status=\"404\"} 52"),
        "{metrics}"
    );
    assert!(
        metrics.contains("endpoint=\"/v1/completions\",status=\"405\""),
        "{metrics}"
    );
}

#[test]
fn the_api_key_guards_everything_but_health_and_is_read_as_clients_send_it() {
    let server = serve(&["--api-key", "sekrit"]);
    let body = json!({"inputs": [{"question": "q", "steps": ["a"]}]}).to_string();
    for (header, ok) in [
        ("authorization: Bearer sekrit\r\n", true),
        ("authorization: bearer sekrit\r\n", true),
        ("authorization: BEARER  sekrit \r\n", true),
        ("authorization: Bearer sekri\r\n", false),
        ("authorization: Basic sekrit\r\n", false),
        ("", false),
    ] {
        let (status, _) = exchange(&server.url, &post_request("/v1/score_steps", header, &body));
        assert_eq!(status.contains("200"), ok, "{header:?}: {status}");
    }
    assert!(get(&server.url, "/health").0.contains("200"));
    assert!(get(&server.url, "/metrics").0.contains("401"));
    let (status, _) = exchange(
        &server.url,
        b"GET /metrics HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sekrit\r\nconnection: close\r\n\r\n",
    );
    assert!(status.contains("200"), "{status}");
    // An empty key would lock everyone out: refused at start.
    let out = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args([
            "serve",
            "--model",
            &common::fixture("qwen2-policy"),
            "--api-key",
            "",
            "--port",
            "0",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--api-key is empty"));
}

#[test]
fn a_client_that_disconnects_stops_its_generation() {
    let server = serve(&[]);
    // 64 continuations of 480 tokens each, whatever the model says: 480 decoding steps when
    // generated to the end.
    let big = json!({"prompt": "What is 2 + 3?", "n": 64, "max_tokens": 480, "ignore_eos": true,
                     "temperature": 1.0, "seed": 1});
    // Sent as a keep-alive request (as OpenAI's clients send): after one marked `connection:
    // close` a server reads no more of the connection, so it cannot see the client leave.
    let body = big.to_string();
    let mut s = connect(&server.url);
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Leave once it is being decoded.
    let decoding = (0..6000).any(|_| {
        std::thread::sleep(Duration::from_millis(10));
        counter(&server.url, "stepwise_decode_steps_total") > 0
    });
    assert!(decoding, "the request was never decoded");
    drop(s);
    let cancelled = (0..600).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        counter(&server.url, "stepwise_requests_cancelled_total") == 1
    });
    assert!(cancelled, "the abandoned request was not cancelled");
    let steps = counter(&server.url, "stepwise_decode_steps_total");
    assert!(
        steps < 480,
        "{steps} decoding steps: the abandoned request ran to its end"
    );
    // The server goes on serving.
    let small = post(
        &server.url,
        "/v1/completions",
        &json!({"prompt": "What is 2 + 3?", "max_tokens": 2}),
    );
    assert!(small["choices"][0]["text"].is_string(), "{small}");
}

#[test]
fn a_stop_signal_does_not_wait_on_idle_or_half_sent_connections() {
    let mut server = serve(&["--shutdown-timeout", "2"]);
    let _idle = connect(&server.url);
    let mut half = connect(&server.url);
    half.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 50\r\n\r\n{")
        .unwrap();
    // A keep-alive connection that has been answered once.
    let mut kept = connect(&server.url);
    kept.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
    let mut buf = [0u8; 256];
    let _ = kept.read(&mut buf).unwrap();
    let pid = server.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    // A watchdog, not a timing target: a server that waited on these would never exit.
    let started = Instant::now();
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "the server did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
}
