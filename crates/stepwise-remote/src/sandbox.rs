//! Code run on remote sandboxes: SandboxFusion's `run_code` (`stepwise serve --sandbox`, or
//! SandboxFusion itself) on several servers through the same client as remote policies (least
//! outstanding requests first, retries with back-off, a request answered once), so a
//! verifier's tool calls spread over a fleet of sandboxes.

use crate::client::{Client, ServerConfig};
use anyhow::{bail, Result};
use serde_json::{json, Value};
use std::time::Duration;
use stepwise_core::seams::{chain_program, chain_reply, CodeRunner};

/// Sandboxes at `urls`, each script given `run_timeout` seconds.
pub struct RemoteSandbox {
    client: Client,
    run_timeout: f64,
}

/// What a script's run gave.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteRun {
    /// `Finished`, `TimeLimitExceeded` or `Error` (SandboxFusion's run status).
    pub status: String,
    /// Its exit status.
    pub return_code: Option<i64>,
    /// What it printed.
    pub stdout: String,
    /// Its errors.
    pub stderr: String,
}

impl RemoteSandbox {
    /// Servers at `urls` (`http://host:8080` or `.../run_code`).
    pub fn new(urls: &[String], run_timeout: f64) -> Result<Self> {
        if !(run_timeout.is_finite() && run_timeout > 0.0 && run_timeout <= 86_400.0) {
            bail!("a script's run_timeout must be above 0 and at most a day, not {run_timeout}");
        }
        let urls = urls
            .iter()
            .map(|u| u.trim_end_matches('/').trim_end_matches("/run_code").to_string())
            .collect();
        let mut config = ServerConfig::new(urls, "sandbox");
        config.timeout = Duration::from_secs_f64(run_timeout + 60.0);
        Ok(RemoteSandbox {
            client: Client::new(config)?,
            run_timeout,
        })
    }

    /// Run `code` as a Python script with `stdin` as its input.
    pub fn run(&self, code: &str, stdin: &str) -> Result<RemoteRun> {
        let body = json!({"code": code, "language": "python", "stdin": stdin, "run_timeout": self.run_timeout,
                          "compile_timeout": self.run_timeout, "files": {}, "fetch_files": []});
        let reply = self.client.post("../run_code", &body)?;
        if reply["status"] == "SandboxError" {
            bail!("the sandbox failed: {}", reply["message"].as_str().unwrap_or(""));
        }
        let run = &reply["run_result"];
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        Ok(RemoteRun {
            status: text(&run["status"]),
            return_code: run["return_code"].as_i64(),
            stdout: text(&run["stdout"]),
            stderr: text(&run["stderr"]),
        })
    }
}

/// A chain's block run remotely: the same program as the local sandbox runs, its output the
/// answer; an error reported as GenPRM's executor reports one (`Code execute Error: ...`, the
/// last line of the traceback).
impl CodeRunner for RemoteSandbox {
    fn execute(&self, earlier: &[String], code: &str) -> String {
        match self.run(&chain_program(earlier, code), "") {
            Ok(r) if r.status == "Finished" && r.return_code == Some(0) => chain_reply(&r.stdout, None),
            Ok(r) => {
                let why = match r.status.as_str() {
                    "TimeLimitExceeded" => format!("ran past its {} s", self.run_timeout),
                    _ => r.stderr.trim().lines().last().unwrap_or("it failed").to_string(),
                };
                chain_reply(&r.stdout, Some(&why))
            }
            Err(e) => chain_reply("", Some(&format!("{e:#}"))),
        }
    }
}
