//! One run: the candidate started with the program, the checker given the tests, and the calls
//! between them relayed as lines (see `candidate.py` and `checker.py` for the messages), all
//! within the run's deadline.

use super::channel::{exchange, Event, Output, Reader};
use super::jail::{self, Jailed, Limits, Streams};
use super::view::View;
use super::{Job, Outcome, Sandbox, Status, Tests, TraceEvent};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

const CODEC: &str = include_str!("codec.py");
const CANDIDATE: &str = include_str!("candidate.py");
const CHECKER: &str = include_str!("checker.py");

/// The longest message either harness may send (a value, the tests' result, the trace).
pub(crate) const MESSAGE_LIMIT: usize = 32 << 20;
/// Idle checkers kept for later runs.
const IDLE_CHECKERS: usize = 64;

/// What the interpreter is started with: read the harness's compiled code from fd 3 (its length
/// on a line, then `marshal`'s bytes) and run it. Compiling the harness costs an interpreter
/// 2.8 ms a run; unmarshalling it a tenth of that.
pub(crate) const BOOT: &str = "import marshal, posix\nb = b''\nwhile not b.endswith(b'\\n'):\n    b += posix.read(3, 1) or 1 / 0\nn, d = int(b), b''\nwhile len(d) < n:\n    d += posix.read(3, n - len(d)) or 1 / 0\nexec(marshal.loads(d))\n";

/// Both harnesses compiled by the interpreter that runs them, each as [`BOOT`] reads it.
pub(crate) struct Compiled {
    pub(crate) candidate: Vec<u8>,
    checker: Vec<u8>,
}

/// Compile the harnesses with `python` (bytecode is the interpreter's own).
pub(crate) fn compile_harnesses(python: &Path) -> Result<Compiled> {
    use std::io::Write;
    let script = "import json, marshal, sys\nfor name, src in json.load(sys.stdin):\n    d = marshal.dumps(compile(src, '<stepwise-%s>' % name, 'exec'))\n    sys.stdout.buffer.write(b'%d\\n' % len(d) + d)\n";
    let sources = json!([
        ["candidate", format!("{CODEC}\n{CANDIDATE}")],
        ["checker", format!("{CODEC}\n{CHECKER}")]
    ]);
    let mut child = std::process::Command::new(python)
        .args(["-I", "-S", "-B", "-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", python.display()))?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(sources.to_string().as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{} could not compile the sandbox's harness: {}",
            python.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut blobs = Vec::new();
    let mut rest = &out.stdout[..];
    while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
        let n: usize = std::str::from_utf8(&rest[..nl])?.parse()?;
        let end = nl + 1 + n;
        anyhow::ensure!(rest.len() >= end, "the compiled harness was cut short");
        blobs.push(rest[..end].to_vec());
        rest = &rest[end..];
    }
    let [candidate, checker]: [Vec<u8>; 2] = blobs
        .try_into()
        .map_err(|_| anyhow!("expected two compiled harnesses"))?;
    Ok(Compiled { candidate, checker })
}

/// A checker's interpreter and its channel.
pub(crate) struct Checker {
    jailed: Jailed,
    replies: Reader,
    /// Whether it still waits for its compiled harness (sent with its first job).
    fresh: bool,
}

/// What the checker concluded.
#[derive(serde::Deserialize)]
struct Verdict {
    status: Status,
    #[serde(default)]
    tests: Vec<super::TestOutcome>,
    #[serde(default)]
    tests_dropped: usize,
    message: Option<String>,
    refused: Option<String>,
}

/// How the candidate's part ended.
struct Ending {
    status: Option<Status>,
    message: Option<String>,
    trace: Vec<TraceEvent>,
}

/// The candidate's final message: how its program ran, and its trace (data the program could
/// have written itself: never a verdict).
fn ending(line: &[u8]) -> Option<Ending> {
    let v: Value = serde_json::from_slice(line).ok()?;
    let ended = v.get("ended")?;
    let status = match ended.get("status").and_then(Value::as_str) {
        Some("ok") => None,
        Some("memory") => Some(Status::Memory),
        Some("refused") => Some(Status::Refused),
        _ => Some(Status::Error),
    };
    let message = ended.get("message").and_then(Value::as_str).map(str::to_string);
    let trace = v
        .get("trace")
        .cloned()
        .and_then(|t| serde_json::from_value(t).ok())
        .unwrap_or_default();
    Some(Ending { status, message, trace })
}

/// The kernel's walls for an interpreter, checked once a process: Landlock, the seccomp filter,
/// and a program started in the jail.
pub(crate) fn kernel_walls(python: &Path, dirs: &[PathBuf]) -> Result<Arc<jail::Isolation>> {
    type Cache = Mutex<HashMap<PathBuf, Result<Arc<jail::Isolation>, String>>>;
    static CHECKED: OnceLock<Cache> = OnceLock::new();
    let mut cache = CHECKED
        .get_or_init(Cache::default)
        .lock()
        .map_err(|_| anyhow!("the sandbox's check failed"))?;
    let walls = cache
        .entry(python.to_path_buf())
        .or_insert_with(|| probe(python, dirs).map_err(|e| format!("{e:#}")))
        .clone();
    walls.map_err(|e| anyhow!("{e}"))
}

const INSECURE_HINT: &str = "To run programs without kernel isolation anyway (they can then read what you can read and reach the network), pass --insecure-sandbox (Python: insecure_sandbox=True; or set STEPWISE_INSECURE_SANDBOX=1)";

fn probe(python: &Path, dirs: &[PathBuf]) -> Result<Arc<jail::Isolation>> {
    if let Err(e) = super::filter::landlock_available() {
        bail!("the sandbox needs Landlock (Linux 5.13 or later with the Landlock LSM enabled) to keep programs away from files, and this kernel does not enforce it: {e}. {INSECURE_HINT}");
    }
    super::filter::seccomp().with_context(|| format!("the sandbox needs a seccomp filter. {INSECURE_HINT}"))?;
    let walls = Arc::new(jail::Isolation::Kernel(Arc::new(View::new(python, dirs)?)));
    let mut sandbox = Sandbox {
        python: python.to_path_buf(),
        compiled: Arc::new(compile_harnesses(python)?),
        walls: walls.clone(),
        checkers: Arc::default(),
        timeout: Duration::from_secs(30),
        memory_bytes: 1 << 30,
        max_file_bytes: 1 << 20,
        work_bytes: 1 << 20,
        max_output_chars: 4096,
        max_tests: 1,
        max_trace_events: 0,
    };
    sandbox.timeout = Duration::from_secs(30);
    let o = sandbox.run(&Job {
        program: "x = 1\n",
        ..Default::default()
    })?;
    if o.status != Status::Passed {
        let why = o.message.unwrap_or_default();
        let hint = if why.contains("creating the namespaces") {
            " (unprivileged user namespaces are needed: sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 also kernel.apparmor_restrict_unprivileged_userns=0; in a container, a seccomp profile that allows them)"
        } else {
            ""
        };
        bail!("the sandbox cannot isolate programs on this machine: {why}{hint}. {INSECURE_HINT}");
    }
    Ok(walls)
}

impl Sandbox {
    pub(crate) fn limits(&self, checker: bool) -> Limits {
        if checker {
            Limits {
                memory_bytes: self.memory_bytes.max(4 << 30),
                file_bytes: 1 << 20,
                cpu_seconds: None,
                work_bytes: 1 << 20,
                threads: 64,
            }
        } else {
            Limits {
                memory_bytes: self.memory_bytes,
                file_bytes: self.max_file_bytes,
                cpu_seconds: Some(self.timeout.as_secs_f64().ceil() as u64),
                work_bytes: self.work_bytes,
                threads: 64,
            }
        }
    }

    fn checker(&self) -> Result<Checker> {
        if let Some(c) = self.checkers.lock().ok().and_then(|mut p| p.pop()) {
            return Ok(c);
        }
        let (mut jailed, _) = jail::spawn(&self.python, BOOT, &self.walls, &self.limits(true), Streams::Discard)?;
        let replies = Reader::new(jailed.take_replies(), MESSAGE_LIMIT);
        Ok(Checker {
            jailed,
            replies,
            fresh: true,
        })
    }

    fn give_back(&self, checker: Checker) {
        if let Ok(mut pool) = self.checkers.lock() {
            if pool.len() < IDLE_CHECKERS {
                pool.push(checker);
            }
        }
    }

    /// Run `job`. An error is the sandbox's own failure (no interpreter, a jail that would not
    /// start); whatever the program does is in the [`Outcome`].
    pub fn run(&self, job: &Job<'_>) -> Result<Outcome> {
        let started = Instant::now();
        let deadline = started + self.timeout;
        let (mut cand, _) = jail::spawn(&self.python, BOOT, &self.walls, &self.limits(false), Streams::Merged)?;
        let mut replies = Reader::new(cand.take_replies(), MESSAGE_LIMIT);
        let mut output = Output::new(cand.take_output(), self.max_output_chars);
        let request = json!({
            "program": job.program,
            "trace_function": job.trace_function,
            "max_trace_events": self.max_trace_events,
        });
        let mut run = Run {
            sandbox: self,
            cand: &mut cand,
            replies: &mut replies,
            output: &mut output,
            deadline,
        };
        let mut first = self.compiled.candidate.clone();
        first.extend_from_slice(format!("{request}\n").as_bytes());
        let mut outcome = match run.exchange(&first) {
            Event::Line(line) => run.ready(job, &line),
            Event::TimedOut => Err(Status::Timeout),
            Event::Closed | Event::TooLong => Ok(run.ended_without_word()),
        }
        .unwrap_or_else(|status| {
            let why = format!("ran past its {} s", self.timeout.as_secs_f64());
            Outcome::ended(status, why, 0.0)
        });
        cand.kill();
        output.finish(Instant::now() + Duration::from_millis(100));
        outcome.stdout = printed(output.kept(0), self.max_output_chars);
        outcome.seconds = started.elapsed().as_secs_f64();
        Ok(outcome)
    }
}

/// What the program printed, as text (cut at a character boundary).
pub(crate) fn printed(bytes: &[u8], limit: usize) -> String {
    let mut text = String::from_utf8_lossy(&bytes[..bytes.len().min(limit)]).into_owned();
    while text.len() > limit {
        text.pop();
    }
    text
}

/// One run in progress; `Err(status)` ends it without a result (a timeout).
struct Run<'a> {
    sandbox: &'a Sandbox,
    cand: &'a mut Jailed,
    replies: &'a mut Reader,
    output: &'a mut Output,
    deadline: Instant,
}

impl Run<'_> {
    fn exchange(&mut self, message: &[u8]) -> Event {
        exchange(
            Some((&self.cand.input, message)),
            self.replies,
            self.output,
            self.deadline,
        )
    }

    /// The candidate's first answer: ready for calls, or ended.
    fn ready(&mut self, job: &Job<'_>, line: &[u8]) -> Result<Outcome, Status> {
        if let Some(end) = ending(line) {
            let status = match end.status {
                None if job.tests.is_some() => Status::Error,
                None => Status::Passed,
                Some(s) => s,
            };
            let message = end
                .message
                .or_else(|| (status == Status::Error).then(|| "the program ended before its tests ran".to_string()));
            let mut outcome = finished(status, message, end.trace);
            if status == Status::Refused {
                outcome.refused = outcome.message.clone();
            }
            return Ok(outcome);
        }
        let functions: Option<Vec<String>> = serde_json::from_slice::<Value>(line)
            .ok()
            .and_then(|v| serde_json::from_value(v.get("ready")?.clone()).ok());
        let Some(functions) = functions else {
            return Ok(self.unreadable());
        };
        let verdict = match job.tests {
            Some(tests) => Some(self.check(job, tests, &functions)?),
            None => None,
        };
        let end = match self.exchange(b"{\"end\":true}\n") {
            Event::Line(line) => ending(&line),
            Event::TimedOut => return Err(Status::Timeout),
            _ => None,
        };
        let mut outcome = match verdict {
            Some(v) => Outcome {
                status: v.status,
                tests: v.tests,
                tests_dropped: v.tests_dropped,
                message: v.message,
                refused: v.refused,
                ..finished(Status::Passed, None, Vec::new())
            },
            None => match &end {
                Some(e) => finished(e.status.unwrap_or(Status::Passed), e.message.clone(), Vec::new()),
                None => self.ended_without_word(),
            },
        };
        if let Some(e) = end {
            outcome.trace = e.trace;
        }
        Ok(outcome)
    }

    /// The tests, run by a checker, its calls relayed to the candidate.
    fn check(&mut self, job: &Job<'_>, tests: &Tests, functions: &[String]) -> Result<Verdict, Status> {
        let mut checker = match self.sandbox.checker() {
            Ok(c) => c,
            Err(e) => return Ok(error_verdict(format!("the tests' checker did not start: {e:#}"))),
        };
        let request = json!({
            "header": job.header,
            "setup": tests.setup,
            "check": tests.check,
            "entry_point": tests.entry_point,
            "asserts": tests.asserts,
            "functions": functions,
            "max_tests": self.sandbox.max_tests,
        });
        let mut message = Vec::new();
        if checker.fresh {
            message.extend_from_slice(&self.sandbox.compiled.checker);
            checker.fresh = false;
        }
        message.extend_from_slice(format!("{request}\n").as_bytes());
        loop {
            let event = exchange(
                Some((&checker.jailed.input, &message)),
                &mut checker.replies,
                self.output,
                self.deadline,
            );
            let line = match event {
                Event::Line(line) => line,
                Event::TimedOut => return Err(Status::Timeout),
                Event::Closed | Event::TooLong => {
                    return Ok(error_verdict("the tests ended without a verdict".into()));
                }
            };
            if line.starts_with(b"{\"result\"") {
                let verdict = serde_json::from_slice::<Value>(&line)
                    .ok()
                    .and_then(|v| serde_json::from_value::<Verdict>(v.get("result")?.clone()).ok());
                self.sandbox.give_back(checker);
                return Ok(verdict.unwrap_or_else(|| error_verdict("the tests' verdict was unreadable".into())));
            }
            message = self.relay(&line)?;
        }
    }

    /// A call from the checker, sent to the candidate; its answer, or why there is none.
    fn relay(&mut self, call: &[u8]) -> Result<Vec<u8>, Status> {
        let mut call = call.to_vec();
        call.push(b'\n');
        let died = |why: &str| format!("{}\n", json!({ "died": why })).into_bytes();
        match self.exchange(&call) {
            Event::Line(mut reply) if serde_json::from_slice::<serde::de::IgnoredAny>(&reply).is_ok() => {
                reply.push(b'\n');
                Ok(reply)
            }
            Event::Line(_) => Ok(died("its answer was not plain data")),
            Event::TooLong => Ok(died("its answer was longer than 32 MiB")),
            Event::Closed => Ok(died(&self.why_ended())),
            Event::TimedOut => Err(Status::Timeout),
        }
    }

    /// Why the candidate's interpreter ended, from its exit.
    fn why_ended(&mut self) -> String {
        let wait_until = Instant::now() + Duration::from_millis(200);
        loop {
            if let Some(status) = self.cand.try_wait() {
                return match status.code() {
                    Some(c) if c > 128 => format!("it was killed by signal {}", c - 128),
                    Some(c) => format!("it exited with status {c}"),
                    None => "it was killed".into(),
                };
            }
            if Instant::now() > wait_until {
                return "it closed its channel".into();
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The candidate ended without a message: its exit, and what it printed last (the jail's own
    /// set-up failures are reported there).
    fn ended_without_word(&mut self) -> Outcome {
        let why = self.why_ended();
        self.output.finish(Instant::now() + Duration::from_millis(100));
        let kind = if why.contains("signal 24") || why.contains("signal 9") {
            Status::Timeout
        } else {
            Status::Error
        };
        let tail = String::from_utf8_lossy(self.output.kept(0)).into_owned();
        let tail = tail.trim();
        let tail = match tail.rfind("stepwise-sandbox: ") {
            Some(at) => &tail[at..],
            None => &tail[tail.len() - tail.len().min(400)..],
        };
        let tail = tail.trim_start_matches(|c: char| !c.is_ascii());
        let sep = if tail.is_empty() { "" } else { ": " };
        Outcome::ended(
            kind,
            format!("the program ended without a result: {why}{sep}{tail}"),
            0.0,
        )
    }

    fn unreadable(&mut self) -> Outcome {
        Outcome::ended(
            Status::Error,
            "the program's sandbox sent an unreadable message".into(),
            0.0,
        )
    }
}

fn finished(status: Status, message: Option<String>, trace: Vec<TraceEvent>) -> Outcome {
    Outcome {
        status,
        tests: Vec::new(),
        tests_dropped: 0,
        trace,
        stdout: String::new(),
        message,
        refused: None,
        seconds: 0.0,
    }
}

fn error_verdict(message: String) -> Verdict {
    Verdict {
        status: Status::Error,
        tests: Vec::new(),
        tests_dropped: 0,
        message: Some(message),
        refused: None,
    }
}
