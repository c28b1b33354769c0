//! `stepwise serve` for the tests: started on the fixture policy and PRM on a free port, and
//! spoken to in raw HTTP/1.1 (so the tests see exactly what a client would).

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use super::fixture;

/// `stepwise serve` on a free port; killed when dropped.
pub struct Server {
    pub child: Child,
    pub url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn serve(extra: &[&str]) -> Server {
    serve_at(0, extra)
}

/// `stepwise serve` at `port` (0: any free one), its output to /dev/null; killed when dropped.
pub fn serve_at(port: u16, extra: &[&str]) -> Server {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stepwise"));
    cmd.args([
        "serve",
        "--model",
        &fixture("qwen2-policy"),
        "--prm",
        &fixture("qwen2-prm"),
    ])
    .args(["--port", &port.to_string()])
    .args(extra)
    .stdout(Stdio::null());
    let (child, url) = spawn_until(cmd, "stepwise serve: listening on ");
    Server { child, url }
}

/// Start `cmd` and wait for the stderr line that starts with `prefix`: the child and the rest of
/// that line. Its stderr is drained from then on, so it never blocks on it.
pub fn spawn_until(mut cmd: Command, prefix: &str) -> (Child, String) {
    let mut child = cmd.stderr(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let rest = loop {
        let line = lines.next().expect("the server exited").unwrap();
        if let Some(rest) = line.strip_prefix(prefix) {
            break rest.to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (child, rest)
}

/// POST a JSON body to `url` + `path` and return the reply's JSON.
pub fn post(url: &str, path: &str, body: &Value) -> Value {
    let mut s = TcpStream::connect(url.trim_start_matches("http://")).unwrap();
    let text = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
        text.len()
    )
    .unwrap();
    let reply = read_http(&mut s).unwrap();
    let end = reply.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    serde_json::from_slice(&reply[end + 4..]).unwrap()
}

/// One HTTP message (head and a body of `content-length` bytes) from a stream.
pub fn read_http(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let n = s.read(&mut chunk).ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Some(buf);
        }
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The counter `name` of the server's Prometheus `/metrics`.
pub fn counter(url: &str, name: &str) -> u64 {
    let (_, metrics) = get(url, "/metrics");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
}

/// GET `path` from `url`: the status line and the body.
pub fn get(url: &str, path: &str) -> (String, String) {
    exchange(
        url,
        format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
    )
}

/// Send `request` (raw bytes) to `url` and read until the server closes: the status line and
/// the body (chunked bodies left as sent).
pub fn exchange(url: &str, request: &[u8]) -> (String, String) {
    let mut s = TcpStream::connect(url.trim_start_matches("http://")).unwrap();
    s.write_all(request).unwrap();
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let status = reply.lines().next().unwrap_or_default().to_string();
    let body = reply
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A POST of `body` with `connection: close` and extra header lines (each ending in `\r\n`).
pub fn post_request(path: &str, headers: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n{headers}\r\n{body}",
        body.len()
    )
    .into_bytes()
}
