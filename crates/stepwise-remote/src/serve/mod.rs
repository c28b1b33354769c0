//! `stepwise serve`: a local policy and/or PRM behind an OpenAI-compatible HTTP API, so any
//! OpenAI client (and stepwise's own remote backends on other machines) can use them.
//!
//! | endpoint | what |
//! |---|---|
//! | `GET /health` | 200 when ready |
//! | `GET /v1/models` | the served models |
//! | `POST /v1/completions` | text or token-id prompts; `n`, `temperature`, `top_p`, `seed`, `max_tokens`, `stop`, `logprobs`, `stream` |
//! | `POST /v1/chat/completions` | the tokenizer's chat template; `continue_final_message` as in vLLM |
//! | `POST /v1/score_steps` | stepwise's step scoring: `{inputs: [{question, steps}]}` → one score per step, any PRM layout; concurrent requests are scored together in one forward pass |
//! | `POST /pooling` | vLLM's STEP pooling shape: per step-tag position `[p_bad, p_good]` |
//! | `GET /metrics` | Prometheus text: requests, tokens, latency histogram |
//!
//! Errors are OpenAI-shaped (`{"error": {"message", "type", "param", "code"}}`) with 4xx codes;
//! with an API key every `/v1` and `/pooling` request needs `Authorization: Bearer KEY`. SIGTERM
//! or Ctrl-C stops accepting requests and lets those in flight finish.

mod batcher;
mod completions;
mod metrics;
pub mod openrlhf;
mod steps;

use anyhow::{Context, Result};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use stepwise_model::scoring::LoadedVerifier;
use stepwise_model::LoadedPolicy;

pub use metrics::Metrics;

/// What to serve and how.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Policy checkpoint folder (completions and chat).
    pub model: Option<PathBuf>,
    /// PRM checkpoint folder (`/v1/score_steps`, `/pooling`).
    pub prm: Option<PathBuf>,
    /// The policy's name in requests and `/v1/models` (default: its folder's name).
    pub model_name: Option<String>,
    /// The PRM's name (default: its folder's name).
    pub prm_name: Option<String>,
    /// Host and port to listen on (`127.0.0.1:8000`; port 0 picks a free one).
    pub address: String,
    /// Bearer token required on the API (none: open).
    pub api_key: Option<String>,
    /// Most continuations per request.
    pub max_n: usize,
    /// Most new tokens per continuation.
    pub max_tokens: usize,
    /// Prompt tokens fed through a decoding step (chunked prefill,
    /// [`stepwise_model::Decoding::join`]) for prompts that arrive while others are decoded;
    /// 0: each such prompt is encoded in a pass of its own.
    pub prefill_chunk_tokens: usize,
    /// PRM layout (`auto` or a name, as `stepwise score --layout`).
    pub layout: String,
    /// Where the PRM runs (the CPU, or a CUDA GPU).
    pub prm_device: stepwise_model::Placement,
    /// Where the policy runs (the CPU, or a CUDA GPU: a paged KV cache on the device).
    pub device: stepwise_model::Placement,
    /// A GPU policy's KV budget in bytes (`None`: half the GPU's free memory).
    pub kv_budget: Option<usize>,
    /// How `/get_reward` (OpenRLHF's remote reward model) turns step scores into one reward.
    pub reward_rule: openrlhf::RewardRule,
}

/// Everything a handler needs.
pub(crate) struct AppState {
    pub policy: Option<(String, LoadedPolicy)>,
    pub prm: Option<(String, LoadedVerifier)>,
    pub api_key: Option<String>,
    pub max_n: usize,
    pub max_tokens: usize,
    pub prefill_chunk_tokens: usize,
    pub kv_budget: Option<usize>,
    pub reward_rule: openrlhf::RewardRule,
    pub metrics: Metrics,
    pub started: u64,
    /// Where `/v1/score_steps` requests queue for the scoring worker ([`steps::score_worker`]).
    pub score_queue: std::sync::Mutex<std::sync::mpsc::Sender<steps::ScoreJob>>,
    /// Where completion requests queue for the generation worker ([`batcher::generate_worker`]).
    pub generate_queue: std::sync::Mutex<std::sync::mpsc::Sender<batcher::GenerateJob>>,
}

pub(crate) type Shared = Arc<AppState>;

/// An error answered as OpenAI does.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
}

impl ApiError {
    /// A request that cannot be served as sent (400).
    pub fn invalid(message: impl Into<String>, param: Option<&'static str>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
        }
    }

    /// A model name nobody serves here (404).
    pub fn no_model(name: &str, served: &[&str]) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "The model `{name}` does not exist (served here: {}).",
                served.join(", ")
            ),
            kind: "NotFoundError",
            param: Some("model"),
        }
    }

    /// The server failed (500).
    pub fn internal(e: anyhow::Error) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: format!("{e:#}"),
            kind: "internal_server_error",
            param: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status.as_u16()}});
        (self.status, Json(body)).into_response()
    }
}

/// The folder's name as a model name.
fn folder_name(dir: &std::path::Path) -> String {
    std::fs::canonicalize(dir)
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| dir.display().to_string())
}

/// Load the models and build the router.
pub fn app(cfg: &ServeConfig) -> Result<Router> {
    let policy = match &cfg.model {
        Some(dir) => Some((
            cfg.model_name.clone().unwrap_or_else(|| folder_name(dir)),
            LoadedPolicy::load_on(dir, cfg.device, stepwise_model::weight_dtype())
                .with_context(|| format!("loading the policy {}", dir.display()))?,
        )),
        None => None,
    };
    let prm = match &cfg.prm {
        Some(dir) => Some((
            cfg.prm_name.clone().unwrap_or_else(|| folder_name(dir)),
            LoadedVerifier::load_on(dir, &cfg.layout, cfg.prm_device, stepwise_model::weight_dtype())
                .with_context(|| format!("loading the PRM {}", dir.display()))?,
        )),
        None => None,
    };
    anyhow::ensure!(
        policy.is_some() || prm.is_some(),
        "nothing to serve: pass --model and/or --prm"
    );
    let (queue, jobs) = std::sync::mpsc::channel();
    let (generate_queue, generate_jobs) = std::sync::mpsc::channel();
    let state: Shared = Arc::new(AppState {
        policy,
        prm,
        api_key: cfg.api_key.clone(),
        max_n: cfg.max_n,
        max_tokens: cfg.max_tokens,
        prefill_chunk_tokens: cfg.prefill_chunk_tokens,
        kv_budget: cfg.kv_budget,
        reward_rule: cfg.reward_rule.clone(),
        metrics: Metrics::default(),
        started: unix_now(),
        score_queue: std::sync::Mutex::new(queue),
        generate_queue: std::sync::Mutex::new(generate_queue),
    });
    let worker_state = state.clone();
    std::thread::Builder::new()
        .name("stepwise-score".into())
        .spawn(move || steps::score_worker(worker_state, jobs))
        .context("starting the scoring worker")?;
    let worker_state = state.clone();
    std::thread::Builder::new()
        .name("stepwise-generate".into())
        .spawn(move || batcher::generate_worker(worker_state, generate_jobs))
        .context("starting the generation worker")?;
    let api = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(completions::chat))
        .route("/v1/score_steps", post(steps::score_steps))
        .route("/pooling", post(steps::pooling))
        .route("/get_reward", post(openrlhf::get_reward))
        .layer(axum::middleware::from_fn_with_state(state.clone(), authorize));
    Ok(Router::new()
        .route("/health", get(|| async { StatusCode::OK }))
        .route(
            "/metrics",
            get(|State(s): State<Shared>| async move { s.metrics.render() }),
        )
        .merge(api)
        .layer(axum::middleware::from_fn_with_state(state.clone(), count))
        .with_state(state))
}

/// Serve until SIGTERM or Ctrl-C; `ready(address)` is called once listening.
pub fn serve(cfg: &ServeConfig, ready: impl FnOnce(std::net::SocketAddr)) -> Result<()> {
    let router = app(cfg)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&cfg.address)
            .await
            .with_context(|| format!("listening on {}", cfg.address))?;
        ready(listener.local_addr()?);
        axum::serve(listener, router)
            .with_graceful_shutdown(shutdown_signal())
            .await
            .context("serving")
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Refuse API requests without the key, when one is set.
async fn authorize(State(s): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &s.api_key {
        let given = req
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            return ApiError {
                status: StatusCode::UNAUTHORIZED,
                message: "Incorrect API key provided.".into(),
                kind: "invalid_api_key",
                param: None,
            }
            .into_response();
        }
    }
    next.run(req).await
}

/// Count every request and its latency.
async fn count(State(s): State<Shared>, req: Request, next: Next) -> Response {
    let endpoint = req.uri().path().to_string();
    let start = Instant::now();
    let resp = next.run(req).await;
    if endpoint != "/metrics" {
        s.metrics
            .request(&endpoint, resp.status().as_u16(), start.elapsed().as_secs_f64());
    }
    resp
}

async fn models(State(s): State<Shared>) -> Json<serde_json::Value> {
    // `stepwise_role` lets a client find the policy or the PRM on a server that serves both.
    let data: Vec<_> = s
        .policy
        .iter()
        .map(|(n, p)| (n, p.model.config.max_position_embeddings, "policy"))
        .chain(
            s.prm
                .iter()
                .map(|(n, v)| (n, v.model.config.max_position_embeddings, "prm")),
        )
        .map(|(name, len, role)| {
            json!({"id": name, "object": "model", "created": s.started, "owned_by": "stepwise", "max_model_len": len,
                   "stepwise_role": role})
        })
        .collect();
    Json(json!({"object": "list", "data": data}))
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
