//! A whole script run as `python3 script.py < input` runs it, in the same jail: its exit status,
//! its output and errors apart, within the sandbox's time. What SandboxFusion's `run_code`
//! answers (verl's code reward sends programs that read the test's input and print), and what
//! `stepwise serve --sandbox` serves.

use super::channel::{exchange, Event, Output, Reader};
use super::jail::{self, Streams};
use super::run::{BOOT, MESSAGE_LIMIT};
use super::Sandbox;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

/// How a script's run ended (SandboxFusion's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScriptStatus {
    /// It ran to its end (whatever its exit status).
    Finished,
    /// It ran past its time.
    TimeLimitExceeded,
    /// It ended without its harness's word: killed (its memory, a signal) or a sandbox failure.
    Error,
}

/// What a script's run gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScriptOutcome {
    /// How it ended.
    pub status: ScriptStatus,
    /// Its exit status (`None` past its time).
    pub return_code: Option<i32>,
    /// What it printed on standard output (bounded).
    pub stdout: String,
    /// What it printed on standard error (bounded).
    pub stderr: String,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// The files asked back, base64-encoded, by name (those that existed).
    #[serde(default)]
    pub files: BTreeMap<String, String>,
}

/// A script and what it is given.
#[derive(Debug, Clone, Default)]
pub struct Script<'a> {
    /// The program.
    pub program: &'a str,
    /// Its standard input.
    pub stdin: &'a [u8],
    /// Files written to its folder before it runs: name → base64 content.
    pub files: BTreeMap<String, String>,
    /// Files of its folder read back after it ran.
    pub fetch_files: Vec<String>,
}

/// Feed `input` to the script's fd 0 on a thread of its own (a script that never reads it
/// cannot block the run), closing it at the end.
fn feed(writer: Option<OwnedFd>, input: Vec<u8>) {
    let Some(fd) = writer else { return };
    std::thread::spawn(move || {
        let _ = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()));
        let _ = std::fs::File::from(fd).write_all(&input);
    });
}

impl Sandbox {
    /// Run `script`.
    pub fn run_script(&self, script: &Script<'_>) -> Result<ScriptOutcome> {
        let started = Instant::now();
        let deadline = started + self.timeout;
        let limits = self.limits(false);
        let (mut cand, writer) = jail::spawn(&self.python, BOOT, &self.walls, &limits, Streams::Apart)?;
        feed(writer, script.stdin.to_vec());
        let mut replies = Reader::new(cand.take_replies(), MESSAGE_LIMIT);
        let mut output = Output::new(cand.take_output(), self.max_output_chars);
        let mut first = self.compiled.candidate.clone();
        let job = json!({"program": script.program, "script": true, "files": script.files, "fetch_files": script.fetch_files});
        first.extend_from_slice(format!("{job}\n").as_bytes());
        let event = exchange(Some((&cand.input, &first)), &mut replies, &mut output, deadline);
        let mut files = BTreeMap::new();
        let mut ended = |line: &[u8]| -> Option<i32> {
            let v: Value = serde_json::from_slice(line).ok()?;
            let ended = v.get("ended")?;
            if let Some(f) = ended.get("files").and_then(|f| serde_json::from_value(f.clone()).ok()) {
                files = f;
            }
            ended.get("code")?.as_i64().map(|c| c as i32)
        };
        let (status, return_code) = match event {
            Event::Line(line) => match ended(&line) {
                Some(code) => (ScriptStatus::Finished, Some(code)),
                None => (ScriptStatus::Error, None),
            },
            Event::TimedOut => (ScriptStatus::TimeLimitExceeded, None),
            Event::Closed | Event::TooLong => {
                let waited = Instant::now() + Duration::from_millis(200);
                let mut code = None;
                while code.is_none() && Instant::now() < waited {
                    code = cand.try_wait().and_then(|s| s.code());
                    std::thread::sleep(Duration::from_millis(2));
                }
                (ScriptStatus::Error, code)
            }
        };
        cand.kill();
        output.finish(Instant::now() + Duration::from_millis(100));
        let text = |i: usize| super::run::printed(output.kept(i), self.max_output_chars);
        Ok(ScriptOutcome {
            status,
            return_code,
            stdout: text(0),
            stderr: text(1),
            seconds: started.elapsed().as_secs_f64(),
            files,
        })
    }
}
