//! Running a program against its tests with the kernel between them: the program runs in one
//! jailed interpreter (the *candidate*), the tests in another (the *checker*), and stepwise relays
//! plain data between the two. What the program does to its own interpreter — builtins, frames,
//! modules, its output, the harness's code — changes only what it answers, never the verdict.
//!
//! What it guarantees (each tested in `tests/sandbox.rs` and `tests/hostile.rs`; the list and its
//! tests are in docs/reliability.md):
//! - **isolation by the kernel** (`jail.rs`): new user, PID, mount, network, IPC, UTS and cgroup
//!   namespaces; a root of its own holding read-only binds of `/usr` and the interpreter, its own
//!   `/proc`, four devices and a writable `/tmp` of bounded size (a tmpfs that dies with it); an
//!   unprivileged user (`nobody` on the host when the caller is root); Landlock (reads of the
//!   interpreter's files, writes to `/tmp` only, no signals or abstract sockets past the sandbox);
//!   seccomp (no sockets, no new processes, no ptrace, mounts, namespaces, BPF, keyrings, kexec,
//!   modules, io_uring, ...); limits on memory, file size, CPU time and threads. A kernel
//!   without one of these layers refuses to run programs, naming it, unless the caller asked
//!   for [`Isolation::Insecure`];
//! - **verdicts out of reach**: assertions run in the checker, whose calls of the program's
//!   functions cross as plain data ([`codec.py`](codec.py)); a forged, unreadable or missing answer
//!   is that program's error;
//! - **time**: the whole sandbox (every process in it) is killed at [`Sandbox::timeout`] (wall
//!   clock) and with the process that started it (`kill -9` included);
//! - **output**: what the program prints is read by stepwise and bounded; it is never parsed.

mod channel;
mod filter;
mod jail;
mod raw;
mod run;
mod script;
mod spawner;
mod view;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use script::{Script, ScriptOutcome, ScriptStatus};

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

    pub(crate) fn ended(status: Status, message: String, seconds: f64) -> Self {
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
    /// Trusted code the tests may use (a HumanEval prompt's helpers, such as `encode_cyclic`),
    /// run by the checker before the tests; the program usually starts with it too. A name it
    /// defines is the checker's own, never the program's (except the function under test).
    pub header: Option<&'a str>,
}

/// How programs are walled off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Isolation {
    /// By the kernel (see the module's documentation); refused where a layer is missing.
    #[default]
    Kernel,
    /// Resource limits, an empty environment and the checker's separate process only: a program
    /// can read what the caller can read and reach the network. For machines without user
    /// namespaces or Landlock, on code that is trusted; the flags that choose it say `insecure`.
    Insecure,
}

impl Isolation {
    /// `Insecure` when `STEPWISE_INSECURE_SANDBOX` is `1` (for integrations configured by the
    /// environment, such as verl's reward function), else `Kernel`.
    pub fn from_env() -> Self {
        match std::env::var("STEPWISE_INSECURE_SANDBOX").as_deref() {
            Ok("1") | Ok("true") | Ok("yes") => Isolation::Insecure,
            _ => Isolation::Kernel,
        }
    }
}

/// The longest time a run may be given: a day.
pub const MAX_TIMEOUT_SECONDS: f64 = 86_400.0;

/// A run's time from seconds, refused unless finite, positive and at most a day.
pub fn timeout_from_secs(seconds: f64) -> Result<Duration> {
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= MAX_TIMEOUT_SECONDS) {
        bail!("a program's timeout must be a number of seconds above 0 and at most {MAX_TIMEOUT_SECONDS} (a day), not {seconds}");
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// A `python3` that runs programs bounded and walled off (see the module's documentation).
/// Clones share their checkers.
#[derive(Clone)]
pub struct Sandbox {
    python: PathBuf,
    compiled: Arc<run::Compiled>,
    walls: Arc<jail::Isolation>,
    checkers: Arc<Mutex<Vec<run::Checker>>>,
    /// Wall-clock time a run may take.
    pub timeout: Duration,
    /// Address space a run may use.
    pub memory_bytes: u64,
    /// Largest file a run may write.
    pub max_file_bytes: u64,
    /// Size of the writable `/tmp` a run gets (all its files together).
    pub work_bytes: u64,
    /// Bytes of printed output kept.
    pub max_output_chars: usize,
    /// Assertions recorded (more are counted).
    pub max_tests: usize,
    /// Trace events recorded.
    pub max_trace_events: usize,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("python", &self.python)
            .field("isolation", &self.isolation())
            .field("timeout", &self.timeout)
            .field("memory_bytes", &self.memory_bytes)
            .finish_non_exhaustive()
    }
}

/// What an interpreter says of itself: its binary and the directories it needs.
struct Interpreter {
    executable: PathBuf,
    dirs: Vec<PathBuf>,
}

fn ask(given: &Path) -> Result<Interpreter> {
    const SCRIPT: &str = "import os, sys\nprint(sys.version_info[0])\nprint(os.path.realpath(sys.executable))\nprint(sys.base_prefix)\nprint(sys.base_exec_prefix)";
    let asked = Command::new(given)
        .args(["-I", "-S", "-c", SCRIPT])
        .stdin(Stdio::null())
        .output();
    let text = match asked {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        _ => bail!(
            "{}: no Python interpreter runs there (the code task runs programs with python3)",
            given.display()
        ),
    };
    let lines: Vec<&str> = text.lines().collect();
    if lines.first() != Some(&"3") || lines.len() < 4 {
        bail!(
            "{}: not a Python 3 interpreter (the code task runs programs with python3)",
            given.display()
        );
    }
    let executable = PathBuf::from(lines[1]);
    if !executable.is_file() {
        bail!(
            "{}: its interpreter {} is not a file",
            given.display(),
            executable.display()
        );
    }
    let mut dirs: Vec<PathBuf> = lines[2..4].iter().map(PathBuf::from).collect();
    dirs.extend(executable.parent().map(Path::to_path_buf));
    Ok(Interpreter { executable, dirs })
}

/// What an interpreter says of itself and the harnesses it compiled, asked once a process for each
/// interpreter path: a caller that makes a sandbox a call (`stepwise.run_tests` from Python, a
/// Ray worker a shard) would otherwise start the interpreter twice a call (through a launcher
/// such as pyenv's shim, ~0.1 s).
fn prepared(given: &Path) -> Result<(Arc<Interpreter>, Arc<run::Compiled>)> {
    type Cache = Mutex<std::collections::HashMap<PathBuf, (Arc<Interpreter>, Arc<run::Compiled>)>>;
    static PREPARED: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
    let cache = PREPARED.get_or_init(Cache::default);
    if let Some(found) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(given) {
        return Ok(found.clone());
    }
    let interpreter = Arc::new(ask(given)?);
    let compiled = Arc::new(run::compile_harnesses(&interpreter.executable)?);
    let found = (interpreter, compiled);
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(given.to_path_buf(), found.clone());
    Ok(found)
}

impl Sandbox {
    /// The `python3` on `PATH` (or `$STEPWISE_PYTHON`) with the default limits (10 s, 1 GiB of
    /// address space, files of 16 MiB, a `/tmp` of 64 MiB), isolated as
    /// [`Isolation::from_env`] says.
    pub fn new() -> Result<Self> {
        Self::new_with(Isolation::from_env())
    }

    /// As [`Sandbox::new`], isolated as `isolation` says (or insecurely when the environment
    /// asks for it).
    pub fn new_with(isolation: Isolation) -> Result<Self> {
        let isolation = match Isolation::from_env() {
            Isolation::Insecure => Isolation::Insecure,
            Isolation::Kernel => isolation,
        };
        let python = match std::env::var_os("STEPWISE_PYTHON") {
            Some(p) => PathBuf::from(p),
            None => find_on_path("python3").context(
                "the code task runs programs with python3, which is not on PATH (install it, or set STEPWISE_PYTHON to a Python 3 interpreter)",
            )?,
        };
        Self::with_isolation(python, isolation)
    }

    /// The interpreter at `python` (a launcher such as pyenv's shim, or a virtual environment's
    /// `python`, is resolved to the interpreter it starts), isolated by the kernel.
    pub fn with_python(python: impl Into<PathBuf>) -> Result<Self> {
        Self::with_isolation(python, Isolation::Kernel)
    }

    /// The interpreter at `python`, isolated as `isolation` says. With [`Isolation::Kernel`], a
    /// machine that lacks a layer is an error naming it (checked once a process).
    pub fn with_isolation(python: impl Into<PathBuf>, isolation: Isolation) -> Result<Self> {
        let (interpreter, compiled) = prepared(&python.into())?;
        let walls = match isolation {
            Isolation::Insecure => Arc::new(jail::Isolation::Insecure),
            Isolation::Kernel => run::kernel_walls(&interpreter.executable, &interpreter.dirs)?,
        };
        Ok(Sandbox {
            compiled,
            python: interpreter.executable.clone(),
            walls,
            checkers: Arc::default(),
            timeout: Duration::from_secs(10),
            memory_bytes: 1 << 30,
            max_file_bytes: 16 << 20,
            work_bytes: 64 << 20,
            max_output_chars: 64 << 10,
            max_tests: 1000,
            max_trace_events: 2000,
        })
    }

    /// The interpreter it runs.
    pub fn python(&self) -> &Path {
        &self.python
    }

    /// How it walls programs off.
    pub fn isolation(&self) -> Isolation {
        match *self.walls {
            jail::Isolation::Kernel(_) => Isolation::Kernel,
            jail::Isolation::Insecure => Isolation::Insecure,
        }
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
        let program = stepwise_core::seams::chain_program(earlier, code);
        let job = Job {
            program: &program,
            ..Default::default()
        };
        use stepwise_core::seams::chain_reply;
        match Sandbox::run(self, &job) {
            Ok(out) if out.status == Status::Passed => chain_reply(&out.stdout, None),
            Ok(out) => {
                let why = out
                    .refused
                    .or(out.message)
                    .unwrap_or_else(|| format!("{:?}", out.status));
                chain_reply(&out.stdout, Some(&why))
            }
            Err(e) => chain_reply("", Some(&format!("{e:#}"))),
        }
    }
}
