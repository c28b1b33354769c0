//! `POST /run_code`: SandboxFusion's API over stepwise's sandbox (`stepwise serve --sandbox`), so
//! verl's code reward (`sandbox_fusion_url`) and other SandboxFusion clients run model-written
//! Python in the kernel's jail. A request's `run_timeout` and `memory_limit_MB` are honoured up
//! to the server's own limits; runs beyond `--sandbox-workers` wait their turn.

use super::{off_async, ApiError, Shared};
use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;
use stepwise_code::{Sandbox, Script, ScriptStatus};

/// The sandbox a server runs code in, and how many runs it takes at once.
pub struct CodeService {
    pub(crate) sandbox: Sandbox,
    pub(crate) slots: tokio::sync::Semaphore,
}

impl CodeService {
    /// `sandbox` (its limits the most a request may ask for), `workers` runs at once.
    pub fn new(sandbox: Sandbox, workers: usize) -> Self {
        CodeService {
            sandbox,
            slots: tokio::sync::Semaphore::new(workers.max(1)),
        }
    }
}

impl std::fmt::Debug for CodeService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodeService")
            .field("sandbox", &self.sandbox)
            .finish_non_exhaustive()
    }
}

/// SandboxFusion's request.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunCode {
    code: String,
    #[serde(default = "python")]
    language: String,
    #[serde(default)]
    compile_timeout: Option<f64>,
    #[serde(default)]
    run_timeout: Option<f64>,
    #[serde(default, rename = "memory_limit_MB")]
    memory_limit_mb: Option<f64>,
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    files: BTreeMap<String, String>,
    #[serde(default)]
    fetch_files: Vec<String>,
}

fn python() -> String {
    "python".into()
}

/// The sandbox for one request: the server's, with a shorter time or less memory when asked.
fn bounded(server: &Sandbox, r: &RunCode) -> Result<Sandbox, ApiError> {
    let mut s = server.clone();
    if let Some(t) = r.run_timeout {
        if !(t.is_finite() && t > 0.0) {
            return Err(ApiError::invalid(
                "run_timeout must be a positive number of seconds",
                Some("run_timeout"),
            ));
        }
        s.timeout = s.timeout.min(Duration::from_secs_f64(t.min(86_400.0)));
    }
    if let Some(mb) = r.memory_limit_mb.filter(|mb| *mb > 0.0) {
        if !mb.is_finite() {
            return Err(ApiError::invalid(
                "memory_limit_MB must be a number",
                Some("memory_limit_MB"),
            ));
        }
        s.memory_bytes = s.memory_bytes.min((mb * (1u64 << 20) as f64) as u64).max(64 << 20);
    }
    Ok(s)
}

/// Run one script and answer as SandboxFusion does: `status` Success (it finished with status
/// 0), Failed (it did not) or SandboxError (the sandbox did not run it).
pub(crate) async fn run_code(State(s): State<Shared>, Json(r): Json<RunCode>) -> Result<Json<Value>, ApiError> {
    let Some(service) = s.code.as_ref() else {
        return Err(ApiError {
            status: axum::http::StatusCode::NOT_FOUND,
            message: "this server runs no code: start it with --sandbox".into(),
            kind: "NotFoundError",
            param: None,
        });
    };
    if !matches!(r.language.as_str(), "python" | "python3") {
        return Err(ApiError::invalid(
            format!("language `{}`: stepwise's sandbox runs python", r.language),
            Some("language"),
        ));
    }
    let _ = r.compile_timeout;
    let sandbox = bounded(&service.sandbox, &r)?;
    let _slot = service
        .slots
        .acquire()
        .await
        .map_err(|e| ApiError::internal(anyhow::anyhow!("{e}")))?;
    let run = off_async(move || {
        let script = Script {
            program: &r.code,
            stdin: r.stdin.as_deref().unwrap_or("").as_bytes(),
            files: r.files,
            fetch_files: r.fetch_files,
        };
        Ok(sandbox.run_script(&script))
    })
    .await?;
    Ok(Json(match run {
        Ok(o) => {
            let status = match o.status {
                ScriptStatus::Finished => "Finished",
                ScriptStatus::TimeLimitExceeded => "TimeLimitExceeded",
                ScriptStatus::Error => "Error",
            };
            let success = o.status == ScriptStatus::Finished && o.return_code == Some(0);
            json!({
                "status": if success { "Success" } else { "Failed" },
                "message": "",
                "compile_result": null,
                "run_result": {"status": status, "execution_time": o.seconds, "return_code": o.return_code,
                               "stdout": o.stdout, "stderr": o.stderr},
                "executor_pod_name": null,
                "files": o.files,
            })
        }
        Err(e) => json!({
            "status": "SandboxError", "message": format!("{e:#}"), "compile_result": null,
            "run_result": null, "executor_pod_name": null, "files": {},
        }),
    }))
}
