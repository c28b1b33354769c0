//! Fleets of servers: `annotate --method mc`, `search --method beam` and `score` against three
//! `stepwise serve` processes named in a file give the same records as against one server, also when, mid
//! run, one server is killed and restarted and another hangs (SIGSTOP) and comes back; a server
//! added to the file joins the run; a file with a bad entry is refused naming its line; and one
//! server behind a proxy that fails on purpose (429 with Retry-After, 500, a hang past the
//! timeout, a reply that is not JSON, a dropped connection): every record is written once, none
//! lost.

use serde_json::{json, Value};
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::server::{read_http, serve, Server};
use common::{fixture, stepwise, write_jsonl};

fn tmp(name: &str) -> tempfile::TempDir {
    common::tmp("fleet", name)
}

/// Records without timing fields, in the order of their ids (a fleet finishes them in any order).
fn records(p: &Path) -> Vec<Value> {
    let mut out = common::records_without_timing(p);
    out.sort_by_key(|v| v["id"].to_string());
    out
}

fn serve_at(port: u16) -> Server {
    common::server::serve_at(port, &[])
}

fn port_of(url: &str) -> u16 {
    url.rsplit(':').next().unwrap().trim_end_matches('/').parse().unwrap()
}

/// Lines in `p` so far.
fn lines(p: &Path) -> usize {
    std::fs::read_to_string(p).map(|t| t.lines().count()).unwrap_or(0)
}

/// Wait until `p` has at least `n` lines or `run` ends; whether it got there first.
fn wait_for(p: &Path, n: usize, run: &mut Child) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(300) {
        if lines(p) >= n {
            return true;
        }
        if run.try_wait().unwrap().is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{} did not reach {n} lines", p.display());
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

fn solutions(d: &Path, count: usize) -> PathBuf {
    let p = d.join("solutions.jsonl");
    let rows: Vec<Value> = (0..count)
        .map(|i| {
            json!({"id": format!("s{i}"), "problem_id": format!("p{}", i % 5), "question": format!("What is {i} + 3?"),
                   "gold_answer": (i + 3).to_string(),
                   "steps": [{"text": format!("{i} + 3 = {}", i + 3)}, {"text": format!("The answer is {}", i + 3)}]})
        })
        .collect();
    write_jsonl(&p, &rows);
    p
}

fn problems(d: &Path, count: usize) -> PathBuf {
    let p = d.join("problems.jsonl");
    let rows: Vec<Value> = (0..count)
        .map(|i| json!({"id": format!("p{i}"), "question": format!("What is {i} + 2?"), "answer": (i + 2).to_string()}))
        .collect();
    write_jsonl(&p, &rows);
    p
}

/// The command's arguments for a policy (and PRM) at `servers`.
fn command(kind: &str, servers: &str, input: &Path, output: &Path) -> Vec<String> {
    let mut args: Vec<String> = match kind {
        "annotate" => ["annotate", "--method", "mc", "--policy", servers, "--rollouts", "4"]
            .map(String::from)
            .to_vec(),
        "score" => ["score", "--model", servers, "--batch-size", "1"]
            .map(String::from)
            .to_vec(),
        _ => [
            "search",
            "--method",
            "beam",
            "--policy",
            servers,
            "--prm",
            servers,
            "-n",
            "4",
            "--width",
            "2",
            "--max-steps",
            "3",
        ]
        .map(String::from)
        .to_vec(),
    };
    if kind != "score" {
        args.extend(["--max-tokens", "8", "--threads", "6"].map(String::from));
    }
    args.extend(["--health-interval", "0.3", "--request-timeout", "20", "--retries", "30"].map(String::from));
    args.extend([
        "--input".into(),
        input.display().to_string(),
        "--output".into(),
        output.display().to_string(),
    ]);
    if kind == "annotate" {
        args.extend(["--served-model".into(), "qwen2-policy".into()]);
    }
    args
}

/// `stepwise` with `args` started, its stderr kept for the end.
fn spawn(args: &[String]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn run_to_end(args: &[String]) -> String {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    String::from_utf8_lossy(&stepwise(&refs).stderr).into_owned()
}

#[test]
fn a_fleet_that_loses_servers_mid_run_gives_the_records_one_server_gives() {
    let mut fleet: Vec<Server> = (0..3).map(|_| serve_at(0)).collect();
    for kind in ["annotate", "search", "score"] {
        let d_tmp = tmp(kind);
        let d = d_tmp.path();
        let (input, total) = match kind {
            "annotate" => (solutions(d, 240), 240),
            "score" => (solutions(d, 2000), 2000),
            _ => (problems(d, 120), 120),
        };
        let one = d.join("one.jsonl");
        run_to_end(&command(kind, &fleet[0].url, &input, &one));
        let file = d.join("servers.txt");
        let urls: Vec<&str> = fleet.iter().map(|s| s.url.as_str()).collect();
        std::fs::write(&file, format!("# three servers\n{}\n", urls.join("\n"))).unwrap();
        let out = d.join("fleet.jsonl");
        let args = command(kind, file.to_str().unwrap(), &input, &out);
        let mut run = spawn(&args);
        // A quarter in: the second server dies; half-way: the third hangs; three quarters: the
        // second is back on its port and the third wakes.
        let mid_run = wait_for(&out, total / 4, &mut run);
        fleet[1].child.kill().unwrap();
        fleet[1].child.wait().unwrap();
        wait_for(&out, total / 2, &mut run);
        signal(&fleet[2].child, "-STOP");
        wait_for(&out, 3 * total / 4, &mut run);
        fleet[1] = serve_at(port_of(&fleet[1].url));
        signal(&fleet[2].child, "-CONT");
        let done = run.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&done.stderr);
        assert!(done.status.success(), "{said}");
        eprintln!("{kind} over the fleet: {said}");
        assert!(mid_run, "{kind} ended before the first kill: make its input longer");
        assert_eq!(records(&one).len(), total, "{kind}");
        assert_eq!(
            records(&one),
            records(&out),
            "{kind}: the fleet's faults changed, lost or doubled records"
        );
        assert!(
            said.contains("requests retried") && said.contains("requests per server"),
            "{said}"
        );
    }
}

#[test]
fn a_server_added_to_the_file_joins_and_a_bad_entry_is_refused_by_line() {
    let d_tmp = tmp("join");
    let d = d_tmp.path();
    let (a, b) = (serve_at(0), serve_at(0));
    let file = d.join("servers.txt");
    std::fs::write(&file, format!("{}\n", a.url)).unwrap();
    let input = solutions(d, 400);
    let out = d.join("out.jsonl");
    let args = command("annotate", file.to_str().unwrap(), &input, &out);
    let mut run = spawn(&args);
    assert!(wait_for(&out, 4, &mut run), "the run ended before a server could join");
    std::fs::write(&file, format!("{}\n{}\n", a.url, b.url)).unwrap();
    let done = run.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success(), "{said}");
    let share = said
        .split(&format!("{} ", b.url))
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or_else(|| panic!("no count for the added server: {said}"));
    assert!(share > 0, "the added server got no requests: {said}");
    drop((a, b));
    // What annotate says when it fails on the servers the file lists.
    let refused = |listing: &str| {
        std::fs::write(&file, listing).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_stepwise"))
            .args(command(
                "annotate",
                file.to_str().unwrap(),
                &input,
                &d.join("bad.jsonl"),
            ))
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let said = refused("http://127.0.0.1:1\ngpu2:8000\n");
    assert!(
        said.contains("servers.txt:2: `gpu2:8000` is not an http:// or https:// URL"),
        "{said}"
    );
    // A fleet none of whose servers answers is refused before any work, naming them.
    let said = refused("http://127.0.0.1:1\nhttp://127.0.0.1:2\n");
    assert!(
        said.contains("none of the 2 servers answers") && said.contains("127.0.0.1:2"),
        "{said}"
    );
}

/// A proxy in front of `upstream` that answers request k (1-based, counting every attempt)
/// with a failure when `fail(k)` says so, and forwards the rest.
fn flaky_proxy(upstream: String, fail: fn(usize) -> Option<&'static str>) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    let upstream = upstream.trim_start_matches("http://").to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let k = seen.fetch_add(1, Ordering::SeqCst) + 1;
            let upstream = upstream.clone();
            std::thread::spawn(move || {
                let Some(request) = read_http(&mut conn) else { return };
                let reply: Vec<u8> = match fail(k) {
                    Some("429") => b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 0.05\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}".to_vec(),
                    Some("500") => b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_vec(),
                    Some("hang") => {
                        std::thread::sleep(Duration::from_secs(3));
                        return;
                    }
                    Some("garbage") => b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 9\r\nconnection: close\r\n\r\n{not json".to_vec(),
                    Some(_) => return, // drop the connection without a word
                    None => {
                        let mut up = TcpStream::connect(&upstream).unwrap();
                        up.write_all(&request).unwrap();
                        let Some(reply) = read_http(&mut up) else { return };
                        // One request per connection.
                        let text = String::from_utf8_lossy(&reply).replacen("\r\n", "\r\nconnection: close\r\n", 1);
                        text.into_bytes()
                    }
                };
                let _ = conn.write_all(&reply);
            });
        }
    });
    (url, count)
}

#[test]
fn annotate_through_a_failing_server_writes_every_record_once() {
    let d_tmp = tmp("faults");
    let d = d_tmp.path();
    let server = serve(&[]);
    let (proxy, attempts) = flaky_proxy(server.url.clone(), |k| match k % 7 {
        1 => Some("429"),
        2 => Some("500"),
        3 => Some("hang"),
        4 => Some("garbage"),
        5 => Some("reset"),
        _ => None,
    });
    let input = d.join("samples.jsonl");
    write_jsonl(
        &input,
        &(0..4)
            .map(|i| {
                json!({"id": format!("s{i}"), "problem_id": "p", "question": "What is 3 * 4?", "gold_answer": "12",
                       "steps": [{"text": "3 * 4 = 12"}, {"text": "The answer is 12"}]})
            })
            .collect::<Vec<_>>(),
    );
    let run = |policy: &str, out: &Path| {
        stepwise(&[
            "annotate",
            "--policy",
            policy,
            "--served-model",
            "qwen2-policy",
            "--input",
            input.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--rollouts",
            "2",
            "--max-tokens",
            "6",
            "--request-timeout",
            "1",
            "--retries",
            "12",
        ])
    };
    let (local, remote) = (d.join("local.jsonl"), d.join("remote.jsonl"));
    run(&fixture("qwen2-policy"), &local);
    let out = run(&proxy, &remote);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("requests retried"), "{said}");
    let (a, b) = (records(&local), records(&remote));
    assert_eq!(a.len(), 4);
    assert_eq!(a, b, "the flaky server changed, lost or duplicated records");
    assert!(attempts.load(Ordering::SeqCst) > 7, "every kind of failure was met");
}

/// `score` keeps two requests a server in flight, a batch each: over two servers both score, and
/// the file is the one a single server gives.
#[test]
fn score_spreads_its_batches_over_the_servers_and_gives_one_servers_scores() {
    let d_tmp = tmp("score-spread");
    let d = d_tmp.path();
    let (a, b) = (serve_at(0), serve_at(0));
    let input = solutions(d, 30);
    let score = |servers: &str, out: &Path| {
        let said = stepwise(&[
            "score",
            "--model",
            servers,
            "--batch-size",
            "3",
            "--input",
            input.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
        ])
        .stderr;
        String::from_utf8_lossy(&said).into_owned()
    };
    let (one, two) = (d.join("one.jsonl"), d.join("two.jsonl"));
    score(&a.url, &one);
    let said = score(&format!("{},{}", a.url, b.url), &two);
    assert_eq!(
        common::step_scores(&std::fs::read_to_string(&one).unwrap(), "prm").len(),
        60
    );
    assert_eq!(std::fs::read(&one).unwrap(), std::fs::read(&two).unwrap());
    let served = |url: &str| -> usize {
        let at = said
            .find(&format!("{url} "))
            .unwrap_or_else(|| panic!("{url} not in {said}"));
        said[at + url.len() + 1..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let (by_a, by_b) = (served(&a.url), served(&b.url));
    assert_eq!(by_a + by_b, 10, "{said}");
    assert!(by_a > 0 && by_b > 0, "one server scored nothing: {said}");
}

#[test]
fn generate_killed_mid_run_resumes_to_the_records_of_a_run_that_was_not() {
    let d_tmp = tmp("generate");
    let d = d_tmp.path();
    let server = serve_at(0);
    let input = problems(d, 150);
    let args = |out: &Path| -> Vec<String> {
        [
            "generate",
            "--model",
            &server.url,
            "-n",
            "2",
            "--max-tokens",
            "8",
            "--threads",
            "4",
            "--seed",
            "3",
        ]
        .map(String::from)
        .into_iter()
        .chain([
            "--input".into(),
            input.display().to_string(),
            "--output".into(),
            out.display().to_string(),
        ])
        .collect()
    };
    let whole = d.join("whole.jsonl");
    run_to_end(&args(&whole));
    let cut = d.join("cut.jsonl");
    let mut run = spawn(&args(&cut));
    assert!(wait_for(&cut, 60, &mut run), "generate ended before it could be killed");
    run.kill().unwrap();
    run.wait().unwrap();
    assert!(lines(&cut) < 300, "killed after the end");
    let said = run_to_end(&args(&cut));
    assert_eq!(records(&whole).len(), 300, "{said}");
    assert_eq!(
        records(&whole),
        records(&cut),
        "the resumed run lost, changed or doubled records"
    );
    // A Parquet output resumes the same way: its journal is kept beside it until the end.
    let parquet = d.join("cut.parquet");
    let partial = d.join("cut.parquet.partial.jsonl");
    let mut run = spawn(&args(&parquet));
    assert!(
        wait_for(&partial, 60, &mut run),
        "generate ended before it could be killed"
    );
    run.kill().unwrap();
    run.wait().unwrap();
    assert!(!parquet.exists() && lines(&partial) < 300, "killed after the end");
    let said = run_to_end(&args(&parquet));
    assert!(!partial.exists(), "the journal outlived the output: {said}");
    assert!(!d.join("cut.parquet.partial.jsonl.settings.json").exists());
    assert_eq!(
        records(&whole),
        parquet_records(&parquet),
        "the resumed Parquet output lost, changed or doubled records"
    );
}

/// A Parquet file's records as [`records`] gives a JSONL file's.
fn parquet_records(p: &Path) -> Vec<Value> {
    let mut out: Vec<Value> = stepwise_core::read_solutions(p, None)
        .unwrap()
        .iter()
        .map(|s| {
            let mut v = serde_json::to_value(s).unwrap();
            v.as_object_mut().unwrap().remove("generator");
            if let Some(meta) = v.get_mut("meta").and_then(Value::as_object_mut) {
                meta.remove("compute");
            }
            v
        })
        .collect();
    out.sort_by_key(|v| v["id"].to_string());
    out
}
