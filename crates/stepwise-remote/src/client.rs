//! An HTTP client for OpenAI-compatible servers that survives their failures: requests spread
//! over a fleet of servers ([`crate::fleet`]: least outstanding requests first; a file of URLs read
//! again as it changes), a cap on requests in flight to each, a timeout per request, and retries
//! with exponential back-off and jitter on 429, 5xx, timeouts, reset connections and unreadable
//! replies, honouring `Retry-After`. A server that failed is set aside for its back-off: the retry
//! goes at once to another server when one is up, and new requests avoid it until then, so one
//! dead server in a fleet costs one failed try, not a back-off per request. A fleet is checked
//! every few seconds; a server that stops answering (dead or hung) has its requests in flight sent
//! to the others at once. A request is only ever answered once to its caller, and carries its own
//! seed, so a retried or moved request never yields a lost, changed or duplicated record.

use crate::fleet::{root, went_down, Fleet, Server};
use anyhow::{bail, Context, Result};
use rand::Rng;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::fleet::{is_url, read_server_file};

/// Where and how to reach the servers.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Base URLs, e.g. `http://gpu1:8000/v1` (a trailing `/v1` is optional).
    pub urls: Vec<String>,
    /// A file of more URLs, one or more a line, read again whenever it changes: servers added
    /// to it join the run, servers taken out of it get no new requests.
    pub servers_file: Option<PathBuf>,
    /// The model name sent with each request (`--served-model-name` of the server).
    pub model: String,
    /// Bearer token (`--api-key`, else `OPENAI_API_KEY`).
    pub api_key: Option<String>,
    /// Time allowed for one request.
    pub timeout: Duration,
    /// Retries of a failed request before the run stops with the error.
    pub max_retries: usize,
    /// Requests in flight at once to each server.
    pub max_in_flight: usize,
    /// Back-off before the first retry; doubled each time (with jitter), capped at 60 s.
    pub backoff: Duration,
    /// How often a fleet (several servers, or a file) is checked and its file read again; a
    /// server silent for this long (at least 2 s) is taken for dead or hung.
    pub health_interval: Duration,
}

impl ServerConfig {
    /// Defaults for `urls` serving `model`: 600 s timeout, 8 retries, 64 requests in flight to
    /// each server, a fleet checked every 5 s.
    pub fn new(urls: Vec<String>, model: &str) -> Self {
        ServerConfig {
            urls,
            servers_file: None,
            model: model.to_string(),
            api_key: std::env::var("OPENAI_API_KEY").ok().filter(|k| !k.is_empty()),
            timeout: Duration::from_secs(600),
            max_retries: 8,
            max_in_flight: 64,
            backoff: Duration::from_millis(500),
            health_interval: Duration::from_secs(5),
        }
    }
}

/// The client: one per run, shared by every thread. Callers block; the requests themselves run
/// on the client's own two I/O threads, so thousands in flight cost no thread each.
pub struct Client {
    config: ServerConfig,
    http: reqwest::Client,
    fleet: Arc<Fleet>,
    /// Free request slots: `max_in_flight` for each server that has joined.
    slots: Arc<tokio::sync::Semaphore>,
    /// Retries made (for the run's summary).
    pub retries: AtomicUsize,
    /// Last: dropping it stops the health check.
    runtime: tokio::runtime::Runtime,
}

/// The base of an OpenAI-compatible API at `url`: with `/v1`, without a trailing slash.
fn api_base(url: &str) -> String {
    format!("{}/v1", root(url))
}

/// A failure worth another try, or not.
enum Failure {
    Retry {
        why: String,
        after: Option<Duration>,
    },
    /// The health check found the server not answering: the request goes to another at once,
    /// not counted against its retries (the request did nothing wrong).
    Moved,
    Fatal(anyhow::Error),
}

/// A server's requests in flight, counted down however the try ends.
struct InFlight(Arc<Server>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Installs *ring* as the process's rustls cryptography, once, before an HTTP client is built
/// (reqwest is compiled without a provider of its own, and building a client without one
/// panics). A provider installed earlier by someone else stays and serves as well.
pub fn tls_with_ring() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

impl Client {
    /// A client for `config` (at least one URL, given or in the file). A fleet is checked once
    /// before the first request: servers that do not answer are set aside (an error when none
    /// does), and checked again every `health_interval`.
    pub fn new(config: ServerConfig) -> Result<Self> {
        let fleet = Arc::new(Fleet::new(&config.urls, config.servers_file.as_deref())?);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("stepwise-http")
            .enable_all()
            .build()
            .context("starting the HTTP client's threads")?;
        tls_with_ring();
        let http = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout.min(Duration::from_secs(10)))
            .pool_max_idle_per_host(config.max_in_flight)
            .build()
            .context("building the HTTP client")?;
        let per_server = config.max_in_flight.max(1);
        let slots = Arc::new(tokio::sync::Semaphore::new(per_server * fleet.all().len()));
        if fleet.is_fleet() {
            let every = config.health_interval.max(Duration::from_millis(100));
            // A server busy with a full batch still answers /health within a second or two; one
            // silent past this is taken for hung.
            let patience = every.max(Duration::from_secs(2)).min(config.timeout);
            let answers = runtime.block_on(fleet.check(&http, patience));
            if answers.iter().all(|(_, a)| a.is_err()) {
                let why: Vec<String> = answers
                    .iter()
                    .map(|(u, a)| format!("{u}: {}", a.as_ref().err().map_or("", |e| e.as_str())))
                    .collect();
                bail!("none of the {} servers answers: {}", answers.len(), why.join("; "));
            }
            for (url, answer) in &answers {
                if let Err(e) = answer {
                    eprintln!("stepwise: {url} does not answer ({e}); it joins when it does");
                }
            }
            let (fleet, http, slots) = (fleet.clone(), http.clone(), slots.clone());
            runtime.spawn(fleet.watch(http, every, patience, move |joined| {
                slots.add_permits(joined * per_server)
            }));
        }
        Ok(Client {
            config,
            http,
            fleet,
            slots,
            retries: AtomicUsize::new(0),
            runtime,
        })
    }

    /// The same client for the model named `model`.
    pub fn with_model(mut self, model: &str) -> Result<Self> {
        self.config.model = model.to_string();
        Ok(self)
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// How many servers it spreads requests over: those in its list or file (a server set aside
    /// while it does not answer still counts; one taken out of the file does not).
    pub fn server_count(&self) -> usize {
        self.fleet.len()
    }

    /// How many requests it keeps in flight at most: `max_in_flight` for each server (one server
    /// when its file is empty for now); the threads a caller that asks one request a thread uses.
    pub fn concurrency(&self) -> usize {
        self.config.max_in_flight * self.server_count().max(1)
    }

    /// Each server's URL and the requests it answered, in the order they joined.
    pub fn served(&self) -> Vec<(String, usize)> {
        self.fleet
            .all()
            .iter()
            .map(|s| (s.url.clone(), s.served.load(Ordering::Relaxed)))
            .collect()
    }

    /// POST `body` to `path` under the API base (`/completions`, `/chat/completions`; a path
    /// starting with `..` is relative to the server root, e.g. `../pooling`) and return the
    /// reply's JSON, retrying what can be retried. Blocks the calling thread (which must not be
    /// one of an async runtime's).
    pub fn post(&self, path: &str, body: &Value) -> Result<Value> {
        self.runtime.block_on(self.post_async(path, body))
    }

    async fn post_async(&self, path: &str, body: &Value) -> Result<Value> {
        let _slot = self.slots.acquire().await.context("the client is closing")?;
        let mut attempt = 0;
        loop {
            let (server, up) = self.fleet.pick();
            server.outstanding.fetch_add(1, Ordering::SeqCst);
            let in_flight = InFlight(server.clone());
            let down = server.down.subscribe();
            let result = tokio::select! {
                r = self.try_post(&server, path, body) => r,
                // A server found dead or hung: its requests go to the others at once.
                _ = went_down(down), if up => Err(Failure::Moved),
            };
            drop(in_flight);
            match result {
                Ok(v) => {
                    server.set_aside(None);
                    server.served.fetch_add(1, Ordering::Relaxed);
                    return Ok(v);
                }
                Err(Failure::Fatal(e)) => return Err(e),
                Err(Failure::Moved) => {
                    self.retries.fetch_add(1, Ordering::Relaxed);
                }
                Err(Failure::Retry { why, after }) => {
                    if attempt >= self.config.max_retries {
                        return Err(anyhow::Error::new(stepwise_core::seams::Unavailable(format!(
                            "{}{path}: {why} (gave up after {attempt} retries)",
                            server.url
                        ))));
                    }
                    attempt += 1;
                    self.retries.fetch_add(1, Ordering::Relaxed);
                    let wait = after.unwrap_or_else(|| self.backoff(attempt));
                    server.set_aside(Some(Instant::now() + wait));
                    if !self.fleet.another_up(&server) {
                        tokio::time::sleep(wait).await;
                    }
                }
            }
        }
    }

    /// GET `path` under the API base of the first server up (e.g. `/models`).
    pub fn get(&self, path: &str) -> Result<Value> {
        let url = format!("{}{path}", api_base(&self.fleet.first_up().url));
        self.runtime.block_on(async {
            let mut req = self.http.get(&url);
            if let Some(k) = &self.config.api_key {
                req = req.bearer_auth(k);
            }
            let resp = req.send().await.with_context(|| format!("GET {url}"))?;
            let status = resp.status();
            let text = resp
                .text()
                .await
                .with_context(|| format!("GET {url}: reading the reply"))?;
            if !status.is_success() {
                bail!("GET {url}: {status}: {}", error_message(&text));
            }
            serde_json::from_str(&text).with_context(|| format!("GET {url}: not JSON"))
        })
    }

    async fn try_post(&self, server: &Server, path: &str, body: &Value) -> std::result::Result<Value, Failure> {
        let url = match path.strip_prefix("..") {
            Some(rest) => format!("{}{rest}", root(&server.url)),
            None => format!("{}{path}", api_base(&server.url)),
        };
        let mut req = self.http.post(&url).json(body);
        if let Some(k) = &self.config.api_key {
            req = req.bearer_auth(k);
        }
        let resp = match req.send().await {
            Ok(r) => r,
            // Timeouts, refused and reset connections: the server may come back.
            Err(e) => {
                return Err(Failure::Retry {
                    why: format!("{e}"),
                    after: None,
                })
            }
        };
        let status = resp.status();
        let after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| Duration::from_secs_f64(s.min(600.0)));
        let text = match resp.text().await {
            Ok(t) => t,
            Err(e) => {
                return Err(Failure::Retry {
                    why: format!("reading the reply: {e}"),
                    after: None,
                })
            }
        };
        if status.as_u16() == 429 || status.is_server_error() {
            return Err(Failure::Retry {
                why: format!("{status}: {}", error_message(&text)),
                after,
            });
        }
        if !status.is_success() {
            // A request the server refuses (bad model name, bad key, prompt too long) fails the
            // same way every time.
            return Err(Failure::Fatal(anyhow::anyhow!(
                "{url}: {status}: {}",
                error_message(&text)
            )));
        }
        serde_json::from_str(&text).map_err(|e| Failure::Retry {
            why: format!(
                "the reply is not JSON ({e}): {}",
                text.chars().take(120).collect::<String>()
            ),
            after: None,
        })
    }

    /// Exponential back-off with full jitter: uniform in [b/2, b] for b = backoff · 2^(attempt−1).
    fn backoff(&self, attempt: usize) -> Duration {
        let b = self.config.backoff.as_secs_f64() * 2f64.powi(attempt.saturating_sub(1).min(16) as i32);
        let b = b.min(60.0);
        Duration::from_secs_f64(rand::rng().random_range(b / 2.0..=b.max(1e-3)))
    }
}

/// The message of an OpenAI-shaped error reply (`{"error": {"message": …}}`), else the text.
fn error_message(text: &str) -> String {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .or_else(|| v.get("message"))
                .or_else(|| v.get("detail"))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_else(|| text.chars().take(200).collect())
}
