//! `stepwise serve`: a local policy and/or PRM behind an OpenAI-compatible HTTP API, so any
//! OpenAI client (and stepwise's own remote backends on other machines) can use them.
//!
//! | endpoint | what |
//! |---|---|
//! | `GET /health` | 200 when ready |
//! | `GET /v1/models` | the served models |
//! | `POST /v1/completions` | text or token-id prompts, one or a list; `n`, `temperature`, `top_p`, `seed`, `max_tokens`, `stop`, `logprobs`, `echo` (with `logprobs`: the prompt's own), `stream` |
//! | `POST /v1/chat/completions` | the tokenizer's chat template; `continue_final_message` as in vLLM |
//! | `POST /v1/score_steps` | stepwise's step scoring: `{inputs: [{question, steps}]}` → one score per step, any PRM layout; concurrent requests are scored together in one forward pass |
//! | `POST /pooling` | vLLM's STEP pooling shape: per step-tag position `[p_bad, p_good]` |
//! | `POST /run_code` | SandboxFusion's API (`--sandbox`): a Python script run in the kernel's jail, its stdout, stderr and exit status |
//! | `POST /tokenize`, `POST /detokenize`, `GET /tokenizer_info` | vLLM's tokenizer routes (a text, or a conversation through the chat template), on the policy's tokenizer or the PRM's by `model` |
//! | `GET /metrics` | Prometheus text: requests, tokens, latency histogram |
//!
//! Errors are OpenAI-shaped (`{"error": {"message", "type", "param", "code"}}`) with 4xx codes,
//! unknown paths and methods included; with an API key every request but `/health` needs
//! `Authorization: Bearer KEY`. Every connection is bounded in time and size ([`Limits`]); a
//! request whose client goes away stops being generated. SIGTERM or Ctrl-C stops accepting
//! requests and lets those in flight finish, within [`Limits::shutdown_timeout`].

mod batcher;
mod choices;
mod completions;
mod connections;
mod logprobs;
mod lora;
mod metrics;
pub mod openrlhf;
mod request;
pub mod sandbox;
mod steps;
mod streaming;
mod tokenize;
mod weigher;

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

pub use connections::Limits;
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
    /// PEFT LoRA adapters served unmerged on the policy, `(name, folder)`: a request naming
    /// one is decoded with it, beside the others' in the same batch (vLLM's `--lora-modules`).
    pub lora_modules: Vec<(String, PathBuf)>,
    /// `/v1/load_lora_adapter` and `/v1/unload_lora_adapter` change the adapters served while
    /// the server runs (vLLM's `VLLM_ALLOW_RUNTIME_LORA_UPDATING`); off, those routes are 404s.
    pub runtime_lora_updating: bool,
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
    /// Sizes and timeouts that bound what one client can take.
    pub limits: Limits,
    /// The sandbox `/run_code` runs programs in (`--sandbox`), and runs at once.
    pub code: Option<(stepwise_code::Sandbox, usize)>,
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
    pub limits: Limits,
    pub code: Option<sandbox::CodeService>,
    pub metrics: Metrics,
    pub started: u64,
    /// Where `/v1/score_steps` requests queue for the scoring worker ([`steps::score_worker`]).
    pub score_queue: std::sync::Mutex<std::sync::mpsc::Sender<steps::ScoreJob>>,
    /// Where completion requests queue for the generation worker ([`batcher::generate_worker`]).
    pub generate_queue: std::sync::Mutex<std::sync::mpsc::Sender<batcher::GenerateJob>>,
    /// Where token log-probabilities queue for the log-probability worker
    /// ([`weigher::weigh_worker`]).
    pub weigh_queue: std::sync::Mutex<std::sync::mpsc::Sender<weigher::WeighJob>>,
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

/// Run `f` (tokenizing, templating: work in proportion to a request's size) on a blocking
/// thread, so a large request never holds the async threads that answer everyone else.
pub(crate) async fn off_async<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(anyhow::anyhow!("{e}")))?
}

/// `text`'s token ids, when they fit `limit` tokens: a text longer than `limit` times the
/// vocabulary's longest token is refused without tokenizing it (its tokens could not fit).
pub(crate) fn encode_within(
    tok: &stepwise_model::Tokenizer,
    text: &str,
    special: bool,
    limit: usize,
    param: &'static str,
) -> Result<Vec<u32>, ApiError> {
    let too_long = |tokens: String| {
        ApiError::invalid(
            format!("This model's maximum context length is {limit} tokens; the {param} has {tokens} tokens."),
            Some(param),
        )
    };
    if text.len() > limit.saturating_mul(tok.longest_token_bytes()) {
        return Err(too_long(format!("more than {limit}")));
    }
    let ids = tok
        .encode(text, special)
        .map_err(|e| ApiError::invalid(format!("{e:#}"), Some(param)))?;
    if ids.len() > limit {
        return Err(too_long(ids.len().to_string()));
    }
    Ok(ids)
}

/// The folder's name as a model name.
fn folder_name(dir: &std::path::Path) -> String {
    std::fs::canonicalize(dir)
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| dir.display().to_string())
}

/// The policy to serve, with its name and the adapters served on it (`--lora-modules`).
fn load_policy(cfg: &ServeConfig) -> Result<Option<(String, LoadedPolicy)>> {
    let Some(dir) = &cfg.model else {
        anyhow::ensure!(
            cfg.lora_modules.is_empty(),
            "--lora-modules are served on a policy: pass --model"
        );
        anyhow::ensure!(
            !cfg.runtime_lora_updating,
            "runtime LoRA updating serves adapters on a policy: pass --model"
        );
        return Ok(None);
    };
    let name = cfg.model_name.clone().unwrap_or_else(|| folder_name(dir));
    if let Some((same, _)) = cfg.lora_modules.iter().find(|(n, _)| *n == name) {
        anyhow::bail!("--lora-modules: `{same}` is the policy's own name");
    }
    let policy = LoadedPolicy::load_on(dir, cfg.device, stepwise_model::default_precision())
        .with_context(|| format!("loading the policy {}", dir.display()))?;
    policy
        .model
        .serve_adapters(&cfg.lora_modules)
        .context("--lora-modules")?;
    Ok(Some((name, policy)))
}

/// Load the models and build the router.
pub fn app(cfg: &ServeConfig) -> Result<Router> {
    let policy = load_policy(cfg)?;
    let prm = match &cfg.prm {
        Some(dir) => Some((
            cfg.prm_name.clone().unwrap_or_else(|| folder_name(dir)),
            LoadedVerifier::load_on(dir, &cfg.layout, cfg.prm_device, stepwise_model::default_precision())
                .with_context(|| format!("loading the PRM {}", dir.display()))?,
        )),
        None => None,
    };
    anyhow::ensure!(
        policy.is_some() || prm.is_some() || cfg.code.is_some(),
        "nothing to serve: pass --model, --prm and/or --sandbox"
    );
    // `/get_reward` reads OpenRLHF's templated queries by the served policy's chat template (the
    // one that wrote them), else the PRM's.
    let mut reward_rule = cfg.reward_rule.clone();
    if reward_rule.turns.is_none() {
        let tokenizers = policy
            .iter()
            .map(|(_, p)| &p.tokenizer)
            .chain(prm.iter().map(|(_, v)| &v.tokenizer));
        reward_rule.turns = tokenizers
            .filter_map(|t| stepwise_model::chat_turns::ChatTurns::of(t).ok())
            .next();
    }
    let (queue, jobs) = std::sync::mpsc::channel();
    let (generate_queue, generate_jobs) = std::sync::mpsc::channel();
    let (weigh_queue, weigh_jobs) = std::sync::mpsc::channel();
    let state: Shared = Arc::new(AppState {
        policy,
        prm,
        api_key: cfg.api_key.clone(),
        max_n: cfg.max_n,
        max_tokens: cfg.max_tokens,
        prefill_chunk_tokens: cfg.prefill_chunk_tokens,
        kv_budget: cfg.kv_budget,
        reward_rule,
        limits: cfg.limits.clone(),
        code: cfg
            .code
            .clone()
            .map(|(s, workers)| sandbox::CodeService::new(s, workers)),
        metrics: Metrics::default(),
        started: unix_now(),
        score_queue: std::sync::Mutex::new(queue),
        generate_queue: std::sync::Mutex::new(generate_queue),
        weigh_queue: std::sync::Mutex::new(weigh_queue),
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
    let worker_state = state.clone();
    std::thread::Builder::new()
        .name("stepwise-logprobs".into())
        .spawn(move || weigher::weigh_worker(worker_state, weigh_jobs))
        .context("starting the log-probability worker")?;
    let mut api = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(completions::chat))
        .route("/v1/score_steps", post(steps::score_steps))
        .route("/pooling", post(steps::pooling))
        .route("/get_reward", post(openrlhf::get_reward))
        .route("/run_code", post(sandbox::run_code))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/tokenizer_info", get(tokenize::tokenizer_info))
        .route(
            "/metrics",
            get(|State(s): State<Shared>| async move { s.metrics.render() }),
        );
    if cfg.runtime_lora_updating {
        api = api
            .route("/v1/load_lora_adapter", post(lora::load))
            .route("/v1/unload_lora_adapter", post(lora::unload));
    }
    let api = api
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            connections::bounded_body,
        ))
        .layer(axum::middleware::from_fn_with_state(state.clone(), authorize));
    Ok(Router::new()
        .route("/health", get(|| async { StatusCode::OK }))
        .merge(api)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::extract::DefaultBodyLimit::max(cfg.limits.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(state.clone(), count))
        .with_state(state))
}

/// Any path this server does not serve: an OpenAI-shaped 404.
async fn not_found(req: Request) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!("Not found: {} {}", req.method(), req.uri().path()),
        kind: "NotFoundError",
        param: None,
    }
}

/// A served path asked with the wrong method: an OpenAI-shaped 405.
async fn method_not_allowed(req: Request) -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: format!("Method not allowed: {} {}", req.method(), req.uri().path()),
        kind: "invalid_request_error",
        param: None,
    }
}

/// Serve until SIGTERM or Ctrl-C; `ready(address)` is called once listening.
pub fn serve(cfg: &ServeConfig, ready: impl FnOnce(std::net::SocketAddr)) -> Result<()> {
    serve_router(app(cfg)?, &cfg.address, &cfg.limits, ready)
}

/// Serve any `router` on `address` with this server's hardened connections (header and idle
/// timeouts, a connection limit, a graceful stop on SIGTERM or Ctrl-C); `ready(address)` is
/// called once listening. `stepwise studio` serves its pages this way.
pub fn serve_router(
    router: Router,
    address: &str,
    limits: &Limits,
    ready: impl FnOnce(std::net::SocketAddr),
) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let served = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .with_context(|| format!("listening on {address}"))?;
        ready(listener.local_addr()?);
        connections::serve_connections(listener, router, limits, shutdown_signal())
            .await
            .context("serving")
    });
    // Work still running on blocking threads (a request past the shutdown deadline) is left.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    served
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

/// Refuse API requests (and `/metrics`) without the key, when one is set: `Authorization:
/// Bearer KEY`, the scheme in any case, the key compared in constant time.
async fn authorize(State(s): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &s.api_key {
        let given = req
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, k)| k.trim());
        if !given.is_some_and(|g| same_key(g.as_bytes(), key.as_bytes())) {
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

/// Whether two keys are equal, in time that depends only on their lengths.
fn same_key(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Count every request and its latency, by route (the path pattern served, so the labels are
/// bounded whatever paths clients send; `unmatched` for paths not served).
async fn count(State(s): State<Shared>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or("unmatched", |m| m.as_str())
        .to_string();
    let start = Instant::now();
    let resp = next.run(req).await;
    if route != "/metrics" {
        s.metrics
            .request(&route, resp.status().as_u16(), start.elapsed().as_secs_f64());
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
        .chain(s.policy.iter().flat_map(|(base, p)| {
            let created = s.started;
            // vLLM lists a LoRA module with its folder as `root` and the base as `parent`.
            let len = p.model.config.max_position_embeddings;
            let adapters = p.model.adapters();
            let cards: Vec<_> = adapters
                .iter()
                .flat_map(|a| a.served())
                .map(|(_, name, dir)| {
                    json!({"id": name, "object": "model", "created": created, "owned_by": "stepwise",
                       "max_model_len": len, "root": dir, "parent": base, "stepwise_role": "policy"})
                })
                .collect();
            cards
        }))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
