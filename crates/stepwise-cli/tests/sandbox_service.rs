//! The sandbox from the command line: `stepwise serve --sandbox` answering SandboxFusion's
//! `run_code` as verl's code reward sends it, and `grade --task code` leaving nothing behind
//! when it is stopped.

use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::server::{exchange, post, post_request, serve};
use common::write_jsonl;

/// The body verl's `call_sandbox_api` sends.
fn verl_body(code: &str, stdin: &str, timeout: u64) -> Value {
    json!({"compile_timeout": timeout, "run_timeout": timeout, "code": code, "stdin": stdin,
           "language": "python", "files": {}, "fetch_files": []})
}

#[test]
fn run_code_answers_as_sandbox_fusion_does() {
    std::env::set_var("STEPWISE_SERVE_SECRET", "hunter2-serve");
    let server = serve(&["--sandbox", "--sandbox-timeout", "5"]);
    let url = &server.url;
    let r = post(
        url,
        "/run_code",
        &verl_body("a, b = map(int, input().split())\nprint(a + b)\n", "2 3\n", 10),
    );
    assert_eq!(r["status"], "Success", "{r}");
    assert_eq!(r["run_result"]["status"], "Finished");
    assert_eq!(r["run_result"]["return_code"], 0);
    assert_eq!(r["run_result"]["stdout"], "5\n");
    assert!(r["run_result"]["execution_time"].as_f64().unwrap() > 0.0);
    // A script that raises: Failed, with its traceback and status 1.
    let r = post(url, "/run_code", &verl_body("raise ValueError('no')\n", "", 10));
    assert_eq!(
        (r["status"].as_str(), r["run_result"]["return_code"].as_i64()),
        (Some("Failed"), Some(1))
    );
    assert!(
        r["run_result"]["stderr"].as_str().unwrap().contains("ValueError: no"),
        "{r}"
    );
    // Past its run_timeout (shorter than the server's).
    let started = Instant::now();
    let r = post(url, "/run_code", &verl_body("while True:\n    pass\n", "", 1));
    assert_eq!(r["run_result"]["status"], "TimeLimitExceeded", "{r}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "run_timeout 1 was not honoured"
    );
    // The server's secrets stay out of reach.
    let r = post(
        url,
        "/run_code",
        &verl_body("import glob, os\nfor p in glob.glob('/proc/*/environ'):\n    print(open(p).read())\nprint(dict(os.environ))\n", "", 10),
    );
    assert!(!r.to_string().contains("hunter2-serve"), "{r}");
    // Files in, files back.
    let r = post(
        url,
        "/run_code",
        &json!({"code": "open('b.txt', 'w').write(open('a.txt').read() * 2)", "language": "python",
                "files": {"a.txt": "aGk="}, "fetch_files": ["b.txt"]}),
    );
    assert_eq!(r["files"]["b.txt"], "aGloaQ==", "{r}");
    // Another language is refused by name.
    let (status, body) = exchange(
        url,
        &post_request(
            "/run_code",
            "",
            &json!({"code": "int main(){}", "language": "cpp"}).to_string(),
        ),
    );
    assert!(status.contains(" 400 ") && body.contains("cpp"), "{status} {body}");
}

#[test]
fn run_code_needs_the_flag_and_the_key() {
    let plain = serve(&[]);
    let (status, body) = exchange(
        &plain.url,
        &post_request("/run_code", "", &verl_body("print(1)", "", 5).to_string()),
    );
    assert!(
        status.contains(" 404 ") && body.contains("--sandbox"),
        "{status} {body}"
    );
    let keyed = serve(&["--sandbox", "--api-key", "k3y"]);
    let body = verl_body("print(1)", "", 5).to_string();
    let (status, _) = exchange(&keyed.url, &post_request("/run_code", "", &body));
    assert!(status.contains(" 401 "), "{status}");
    let (status, reply) = exchange(
        &keyed.url,
        &post_request("/run_code", "authorization: Bearer k3y\r\n", &body),
    );
    assert!(
        status.contains(" 200 ") && reply.contains("Success"),
        "{status} {reply}"
    );
}

/// Processes of this test's sandboxes: their command line names the process that started them.
fn sandboxes_of(pid: u32) -> usize {
    let tag = format!("stepwise-parent={pid}");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .filter(|c| String::from_utf8_lossy(c).contains(&tag))
        .count()
}

/// `grade` stopped by SIGTERM or SIGINT while programs run: every process of every sandbox
/// goes with it.
/// A problems file with one problem, `T/0`: `f()` returns 1.
fn one_problem(dir: &std::path::Path) -> std::path::PathBuf {
    let problems = dir.join("problems.jsonl");
    write_jsonl(
        &problems,
        &[
            json!({"task_id": "T/0", "prompt": "def f():\n", "entry_point": "f", "canonical_solution": "    return 1\n",
                 "test": "def check(candidate):\n    assert candidate() == 1\n"}),
        ],
    );
    problems
}

#[test]
fn a_stopped_grade_leaves_no_sandbox_behind() {
    let dir_tmp = common::tmp("sandbox_service", "stopped");
    let dir = dir_tmp.path();
    let problems = one_problem(dir);
    let samples = dir.join("samples.jsonl");
    let sleeper = "    import threading, time\n    threading.Thread(target=time.sleep, args=(600,)).start()\n    time.sleep(600)\n";
    write_jsonl(&samples, &vec![json!({"task_id": "T/0", "completion": sleeper}); 8]);
    for signal in [libc_signal::TERM, libc_signal::INT] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_stepwise"))
            .args([
                "grade",
                "--task",
                "code",
                "--code-timeout",
                "600",
                "--threads",
                "2",
                "--problems",
            ])
            .arg(&problems)
            .arg(&samples)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        let started = Instant::now();
        while sandboxes_of(pid) < 2 {
            assert!(started.elapsed() < Duration::from_secs(60), "no sandbox started");
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: sending a signal to our own child.
        unsafe {
            libc_signal::kill(pid as i32, signal);
        }
        let _ = child.wait();
        let gone = Instant::now();
        while sandboxes_of(pid) > 0 {
            assert!(gone.elapsed() < Duration::from_secs(10), "sandboxes outlived grade");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The two signals and `kill`, without a dependency for them.
mod libc_signal {
    pub const INT: i32 = 2;
    pub const TERM: i32 = 15;
    extern "C" {
        pub fn kill(pid: i32, sig: i32) -> i32;
    }
}

/// `grade --task code` refuses a timeout or a thread count it cannot honour, with a message that
/// names the flag's bound, before running anything.
#[test]
fn grade_refuses_unbounded_timeouts_and_threads() {
    let dir_tmp = common::tmp("sandbox_service", "bounds");
    let dir = dir_tmp.path();
    let problems = one_problem(dir);
    let samples = dir.join("samples.jsonl");
    write_jsonl(&samples, &[json!({"task_id": "T/0", "completion": "    return 1\n"})]);
    for (flag, value, says) in [
        ("--code-timeout", "1e300", "at most 86400"),
        ("--code-timeout", "0", "above 0"),
        ("--code-timeout", "NaN", "above 0"),
        ("--threads", "100000", "four per core"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_stepwise"))
            .args(["grade", "--task", "code", flag, value, "--problems"])
            .arg(&problems)
            .arg(&samples)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            matches!(out.status.code(), Some(1 | 2)) && err.contains(says),
            "{flag} {value}: {:?} {err}",
            out.status
        );
    }
}
