//! `"stream": true` on `stepwise serve`: a stream sends each continuation's text while it is
//! being decoded (not all at the end), its text put together is the unstreamed reply's, a stop
//! string never leaks into it, and a client that leaves mid-stream stops its generation.

mod common;

use common::server::{counter, post, serve};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A server-sent event stream read as it comes, over a raw HTTP/1.1 connection.
struct Events {
    reader: BufReader<TcpStream>,
    /// Bytes of the body not yet cut into events.
    pending: String,
    ended: bool,
}

impl Events {
    /// POSTs `body` to `/v1/completions` or `/v1/chat/completions` (`path`) and reads the head.
    fn open(url: &str, path: &str, body: &Value) -> Self {
        let mut s = TcpStream::connect(url.trim_start_matches("http://")).unwrap();
        let body = body.to_string();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut reader = BufReader::new(s);
        let mut head = String::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
            head.push_str(&line);
        }
        let lower = head.to_lowercase();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(
            lower.contains("text/event-stream") && lower.contains("transfer-encoding: chunked"),
            "{head}"
        );
        Events {
            reader,
            pending: String::new(),
            ended: false,
        }
    }

    /// The next event's data (`None` after the last).
    fn next(&mut self) -> Option<String> {
        loop {
            if let Some(at) = self.pending.find("\n\n") {
                let event: String = self.pending.drain(..at + 2).collect();
                match event.lines().find_map(|l| l.strip_prefix("data: ")) {
                    Some(data) => return Some(data.to_string()),
                    None => continue, // a keep-alive comment
                }
            }
            if self.ended {
                return None;
            }
            // One chunk of the chunked body: its size in hex, the bytes, CRLF.
            let mut size = String::new();
            self.reader.read_line(&mut size).unwrap();
            let size = usize::from_str_radix(size.trim(), 16).unwrap_or_else(|_| panic!("chunk size `{size}`"));
            let mut chunk = vec![0u8; size + 2];
            self.reader.read_exact(&mut chunk).unwrap();
            self.ended = size == 0;
            self.pending.push_str(&String::from_utf8_lossy(&chunk[..size]));
        }
    }

    /// Every remaining event's JSON, up to `[DONE]`.
    fn rest(&mut self) -> Vec<Value> {
        let mut all = Vec::new();
        while let Some(data) = self.next() {
            if data == "[DONE]" {
                assert!(self.next().is_none(), "events after [DONE]");
                return all;
            }
            all.push(serde_json::from_str(&data).unwrap_or_else(|e| panic!("{e}: {data}")));
        }
        panic!("the stream ended without [DONE]: {all:?}");
    }
}

/// The events of `body`'s stream to `path`, read to its end, and how many decoding steps the
/// server had run since it was asked when `enough` first held of the events read so far.
fn stream_until(url: &str, path: &str, body: &Value, enough: impl Fn(&[Value]) -> bool) -> (Vec<Value>, u64) {
    let before = counter(url, "stepwise_decode_steps_total");
    let mut events = Events::open(url, path, body);
    let mut chunks = Vec::new();
    while !enough(&chunks) {
        chunks.push(serde_json::from_str(&events.next().unwrap()).unwrap());
    }
    let steps = counter(url, "stepwise_decode_steps_total") - before;
    chunks.extend(events.rest());
    (chunks, steps)
}

/// Each choice's text put together from `chunks` (completions' `text`, chat's `delta.content`),
/// and each one's finish reason.
fn joined(chunks: &[Value], n: usize) -> Vec<(String, String)> {
    let mut out = vec![(String::new(), String::new()); n];
    for c in chunks {
        for choice in c["choices"].as_array().unwrap() {
            let i = choice["index"].as_u64().unwrap() as usize;
            let piece = choice["text"].as_str().or(choice["delta"]["content"].as_str());
            out[i].0.push_str(piece.unwrap_or(""));
            if let Some(reason) = choice["finish_reason"].as_str() {
                out[i].1 = reason.to_string();
            }
        }
    }
    out
}

/// The unstreamed reply's choices: text (chat: the message's) and finish reason.
fn whole(reply: &Value) -> Vec<(String, String)> {
    let choices = reply["choices"].as_array().unwrap_or_else(|| panic!("{reply}"));
    choices
        .iter()
        .map(|c| {
            let text = c["text"].as_str().or(c["message"]["content"].as_str()).unwrap();
            (text.to_string(), c["finish_reason"].as_str().unwrap().to_string())
        })
        .collect()
}

#[test]
fn a_stream_sends_text_as_it_is_decoded_and_ends_as_the_whole_reply() {
    let server = serve(&[]);
    let url = &server.url;
    let ask = json!({"prompt": "What is 2 + 3?", "n": 2, "max_tokens": 400, "ignore_eos": true,
                     "temperature": 1.0, "seed": 4, "stream": true});
    let mut events = Events::open(url, "/v1/completions", &ask);
    let first: Value = serde_json::from_str(&events.next().unwrap()).unwrap();
    let steps = counter(url, "stepwise_decode_steps_total");
    assert!(steps < 200, "the first chunk came after {steps} of 400 steps");
    let mut chunks = vec![first];
    chunks.extend(events.rest());
    let mut unstreamed = ask.clone();
    unstreamed["stream"] = json!(false);
    let want = whole(&post(url, "/v1/completions", &unstreamed));
    assert_eq!(joined(&chunks, 2), want);
    assert!(chunks.len() > 20, "{} chunks: not sent as decoded", chunks.len());
    // A stop string taken from the middle of the text: cut there, never sent.
    let text = &want[0].0;
    let at = (20..text.len() - 4)
        .find(|&i| text.is_char_boundary(i) && text.is_char_boundary(i + 3))
        .unwrap();
    let stop = &text[at..at + 3];
    for (path, n) in [("/v1/completions", 2), ("/v1/chat/completions", 1)] {
        let mut ask = json!({"n": n, "max_tokens": 300, "temperature": 1.0, "seed": 4, "stop": [stop],
                             "stream": true, "stream_options": {"include_usage": true}});
        match path {
            "/v1/completions" => ask["prompt"] = json!("What is 2 + 3?"),
            _ => ask["messages"] = json!([{"role": "user", "content": "What is 2 + 3?"}]),
        }
        let chunks = Events::open(url, path, &ask).rest();
        let mut unstreamed = ask.clone();
        unstreamed["stream"] = json!(false);
        unstreamed.as_object_mut().unwrap().remove("stream_options");
        let reply = post(url, path, &unstreamed);
        let streamed = joined(&chunks, n);
        assert_eq!(streamed, whole(&reply), "{path}");
        assert!(streamed.iter().all(|(t, _)| !t.contains(stop)), "{path}: {streamed:?}");
        let last = chunks.last().unwrap();
        assert_eq!(last["usage"], reply["usage"], "{path}");
        if path == "/v1/chat/completions" {
            assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        }
    }
}

#[test]
fn a_stream_whose_client_leaves_stops_its_generation() {
    let server = serve(&[]);
    let ask = json!({"prompt": "What is 2 + 3?", "n": 64, "max_tokens": 480, "ignore_eos": true,
                     "temperature": 1.0, "seed": 1, "stream": true});
    let mut events = Events::open(&server.url, "/v1/completions", &ask);
    events.next().unwrap();
    drop(events);
    let cancelled = (0..600).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        counter(&server.url, "stepwise_requests_cancelled_total") == 1
    });
    assert!(cancelled, "the abandoned stream was not cancelled");
    let steps = counter(&server.url, "stepwise_decode_steps_total");
    assert!(
        steps < 480,
        "{steps} decoding steps: the abandoned stream ran to its end"
    );
}

/// Each choice's `logprobs` put together from `chunks`: completions' `tokens`, `token_logprobs`,
/// `top_logprobs` and `text_offset` lists, chat's `content`.
fn joined_logprobs(chunks: &[Value], n: usize) -> Vec<Value> {
    let mut out = vec![json!({}); n];
    for c in chunks {
        for choice in c["choices"].as_array().unwrap() {
            let i = choice["index"].as_u64().unwrap() as usize;
            let Some(lp) = choice["logprobs"].as_object() else {
                continue;
            };
            for (key, list) in lp {
                let all = out[i].as_object_mut().unwrap().entry(key.clone()).or_insert(json!([]));
                all.as_array_mut()
                    .unwrap()
                    .extend(list.as_array().unwrap().iter().cloned());
            }
        }
    }
    out
}

#[test]
fn a_streams_log_probabilities_come_as_decoded_and_together_are_the_replys() {
    let server = serve(&[]);
    let url = &server.url;
    for (path, n) in [("/v1/completions", 2), ("/v1/chat/completions", 1)] {
        let mut ask =
            json!({"n": n, "max_tokens": 300, "ignore_eos": true, "temperature": 1.0, "seed": 9, "stream": true});
        match path {
            "/v1/completions" => {
                ask["prompt"] = json!("What is 2 + 3?");
                ask["logprobs"] = json!(2);
            }
            _ => {
                ask["messages"] = json!([{"role": "user", "content": "What is 2 + 3?"}]);
                ask["logprobs"] = json!(true);
                ask["top_logprobs"] = json!(2);
            }
        }
        let (chunks, steps) = stream_until(url, path, &ask, |chunks| {
            chunks.iter().any(|c| !c["choices"][0]["logprobs"].is_null())
        });
        assert!(
            steps < 150,
            "{path}: the first log-probabilities came after {steps} of 300 steps"
        );
        let mut unstreamed = ask.clone();
        unstreamed["stream"] = json!(false);
        let reply = post(url, path, &unstreamed);
        assert_eq!(joined(&chunks, n), whole(&reply), "{path}");
        let want: Vec<Value> = reply["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["logprobs"].clone())
            .collect();
        assert_eq!(joined_logprobs(&chunks, n), want, "{path}");
        let tokens = want[0]
            .get("tokens")
            .or(want[0].get("content"))
            .unwrap()
            .as_array()
            .unwrap();
        assert_eq!(tokens.len(), 300, "{path}: one a generated token");
        let with = chunks.iter().filter(|c| !c["choices"][0]["logprobs"].is_null()).count();
        assert!(
            with > 20,
            "{path}: {with} chunks with log-probabilities: not sent as decoded"
        );
    }
}

#[test]
fn several_prompts_and_echo_stream_as_decoded_and_together_are_the_replys() {
    let server = serve(&[]);
    let url = &server.url;
    let prompts = ["What is 2 + 3?", "Name a prime."];
    for logprobs in [json!(1), Value::Null] {
        let ask = json!({"prompt": prompts, "n": 2, "max_tokens": 200, "ignore_eos": true, "echo": true,
                         "logprobs": logprobs, "temperature": 1.0, "seed": 5, "stream": true,
                         "stream_options": {"include_usage": true}});
        // Every choice of both prompts: its echoed prompt, then generated text.
        let seen = |chunks: &[Value], i: u64| chunks.iter().filter(|c| c["choices"][0]["index"] == i).count();
        let (chunks, steps) = stream_until(url, "/v1/completions", &ask, |chunks| {
            (0..4).all(|i| seen(chunks, i) >= 2)
        });
        assert!(
            steps < 100,
            "{logprobs}: every choice's text came after {steps} of 200 steps"
        );
        let mut unstreamed = ask.clone();
        unstreamed["stream"] = json!(false);
        unstreamed.as_object_mut().unwrap().remove("stream_options");
        let reply = post(url, "/v1/completions", &unstreamed);
        let streamed = joined(&chunks, 4);
        assert_eq!(streamed, whole(&reply), "{logprobs}");
        for (i, (text, _)) in streamed.iter().enumerate() {
            assert!(text.starts_with(prompts[i / 2]), "{logprobs}: choice {i} `{text}`");
            let first = chunks.iter().find(|c| c["choices"][0]["index"] == i as u64).unwrap();
            assert_eq!(first["choices"][0]["text"], prompts[i / 2], "the echo comes first");
        }
        let want: Vec<Value> = reply["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                if c["logprobs"].is_null() {
                    json!({})
                } else {
                    c["logprobs"].clone()
                }
            })
            .collect();
        assert_eq!(joined_logprobs(&chunks, 4), want, "{logprobs}");
        if !logprobs.is_null() {
            assert_eq!(want[2]["token_logprobs"][0], Value::Null, "the prompt's first token");
        }
        assert_eq!(chunks.last().unwrap()["usage"], reply["usage"], "{logprobs}");
    }
}
