//! An HTTP client for OpenAI-compatible servers that survives their failures: requests spread
//! over several servers (least outstanding requests first), a cap on requests in flight, a
//! timeout per request, and retries with exponential back-off and jitter on 429, 5xx, timeouts,
//! reset connections and unreadable replies, honouring `Retry-After`. A server that failed is
//! set aside for its back-off: the retry goes at once to another server when one is up, and new
//! requests avoid it until then, so one dead server in a fleet costs one failed try, not a
//! back-off per request. A request is only ever answered once to its caller, so a retried
//! request never yields a duplicated record.

use anyhow::{bail, Context, Result};
use rand::Rng;
use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Where and how to reach the servers.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Base URLs, e.g. `http://gpu1:8000/v1` (a trailing `/v1` is optional).
    pub urls: Vec<String>,
    /// The model name sent with each request (`--served-model-name` of the server).
    pub model: String,
    /// Bearer token (`--api-key`, else `OPENAI_API_KEY`).
    pub api_key: Option<String>,
    /// Time allowed for one request.
    pub timeout: Duration,
    /// Retries of a failed request before the run stops with the error.
    pub max_retries: usize,
    /// Requests in flight at once, over all servers.
    pub max_in_flight: usize,
    /// Back-off before the first retry; doubled each time (with jitter), capped at 60 s.
    pub backoff: Duration,
}

impl ServerConfig {
    /// Defaults for `urls` serving `model`: 600 s timeout, 8 retries, 64 requests in flight.
    pub fn new(urls: Vec<String>, model: &str) -> Self {
        ServerConfig {
            urls,
            model: model.to_string(),
            api_key: std::env::var("OPENAI_API_KEY").ok().filter(|k| !k.is_empty()),
            timeout: Duration::from_secs(600),
            max_retries: 8,
            max_in_flight: 64,
            backoff: Duration::from_millis(500),
        }
    }
}

/// The client: one per run, shared by every thread.
pub struct Client {
    config: ServerConfig,
    http: reqwest::blocking::Client,
    /// Requests in flight to each server.
    outstanding: Vec<AtomicUsize>,
    /// When each server that failed is worth trying again.
    down_until: Mutex<Vec<Option<Instant>>>,
    in_flight: Mutex<usize>,
    slot_freed: Condvar,
    /// Retries made (for the run's summary).
    pub retries: AtomicUsize,
}

/// Whether `s` is an HTTP(S) URL rather than a folder.
pub fn is_url(s: &str) -> bool {
    s.starts_with("http://") || s.starts_with("https://")
}

/// The base of an OpenAI-compatible API at `url`: with `/v1`, without a trailing slash.
fn api_base(url: &str) -> String {
    let u = url.trim_end_matches('/');
    if u.ends_with("/v1") {
        u.to_string()
    } else {
        format!("{u}/v1")
    }
}

/// A failure worth another try, or not.
enum Failure {
    Retry { why: String, after: Option<Duration> },
    Fatal(anyhow::Error),
}

impl Client {
    /// A client for `config` (at least one URL).
    pub fn new(config: ServerConfig) -> Result<Self> {
        if config.urls.is_empty() {
            bail!("no server URL given");
        }
        for u in &config.urls {
            if !is_url(u) {
                bail!("`{u}` is not an http:// or https:// URL");
            }
        }
        let http = reqwest::blocking::Client::builder()
            .timeout(config.timeout)
            .pool_max_idle_per_host(config.max_in_flight)
            .build()
            .context("building the HTTP client")?;
        Ok(Client {
            outstanding: config.urls.iter().map(|_| AtomicUsize::new(0)).collect(),
            down_until: Mutex::new(vec![None; config.urls.len()]),
            config,
            http,
            in_flight: Mutex::new(0),
            slot_freed: Condvar::new(),
            retries: AtomicUsize::new(0),
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

    /// POST `body` to `path` under the API base (`/completions`, `/chat/completions`; a path
    /// starting with `..` is relative to the server root, e.g. `../pooling`) and return the
    /// reply's JSON, retrying what can be retried.
    pub fn post(&self, path: &str, body: &Value) -> Result<Value> {
        let _slot = self.acquire();
        let mut attempt = 0;
        loop {
            let server = self.pick();
            self.outstanding[server].fetch_add(1, Ordering::SeqCst);
            let result = self.try_post(server, path, body);
            self.outstanding[server].fetch_sub(1, Ordering::SeqCst);
            match result {
                Ok(v) => {
                    self.down_until.lock().unwrap()[server] = None;
                    return Ok(v);
                }
                Err(Failure::Fatal(e)) => return Err(e),
                Err(Failure::Retry { why, after }) => {
                    if attempt >= self.config.max_retries {
                        bail!(
                            "{}{path}: {why} (gave up after {attempt} retries)",
                            self.config.urls[server]
                        );
                    }
                    attempt += 1;
                    self.retries.fetch_add(1, Ordering::Relaxed);
                    let wait = after.unwrap_or_else(|| self.backoff(attempt));
                    if !self.set_aside(server, wait) {
                        std::thread::sleep(wait);
                    }
                }
            }
        }
    }

    /// GET `path` under the API base of the first server (e.g. `/models`).
    pub fn get(&self, path: &str) -> Result<Value> {
        let url = format!("{}{path}", api_base(&self.config.urls[0]));
        let mut req = self.http.get(&url);
        if let Some(k) = &self.config.api_key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().with_context(|| format!("GET {url}"))?;
        let status = resp.status();
        let text = resp.text().with_context(|| format!("GET {url}: reading the reply"))?;
        if !status.is_success() {
            bail!("GET {url}: {status}: {}", error_message(&text));
        }
        serde_json::from_str(&text).with_context(|| format!("GET {url}: not JSON"))
    }

    fn try_post(&self, server: usize, path: &str, body: &Value) -> std::result::Result<Value, Failure> {
        let base = api_base(&self.config.urls[server]);
        let url = match path.strip_prefix("..") {
            Some(rest) => format!("{}{rest}", base.trim_end_matches("/v1")),
            None => format!("{base}{path}"),
        };
        let mut req = self.http.post(&url).json(body);
        if let Some(k) = &self.config.api_key {
            req = req.bearer_auth(k);
        }
        let resp = match req.send() {
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
        let text = match resp.text() {
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

    /// The server with the fewest requests in flight among those up (the first of those tied);
    /// when all are set aside, the one back soonest.
    fn pick(&self) -> usize {
        let now = Instant::now();
        let down = self.down_until.lock().unwrap();
        (0..self.outstanding.len())
            .min_by_key(|&i| {
                let back = down[i].filter(|t| *t > now);
                (back.is_some(), back, self.outstanding[i].load(Ordering::SeqCst))
            })
            .unwrap_or(0)
    }

    /// Set `server` aside for `wait` after a failure; whether another server is up to retry on
    /// at once.
    fn set_aside(&self, server: usize, wait: Duration) -> bool {
        let now = Instant::now();
        let mut down = self.down_until.lock().unwrap();
        down[server] = Some(now + wait);
        down.iter().any(|t| t.is_none_or(|t| t <= now))
    }

    /// Exponential back-off with full jitter: uniform in [b/2, b] for b = backoff · 2^(attempt−1).
    fn backoff(&self, attempt: usize) -> Duration {
        let b = self.config.backoff.as_secs_f64() * 2f64.powi(attempt.saturating_sub(1).min(16) as i32);
        let b = b.min(60.0);
        Duration::from_secs_f64(rand::rng().random_range(b / 2.0..=b.max(1e-3)))
    }

    /// Wait for a free request slot; the slot is freed when the guard drops.
    fn acquire(&self) -> SlotGuard<'_> {
        let mut n = self.in_flight.lock().unwrap();
        while *n >= self.config.max_in_flight.max(1) {
            n = self.slot_freed.wait(n).unwrap();
        }
        *n += 1;
        SlotGuard { client: self }
    }
}

struct SlotGuard<'a> {
    client: &'a Client,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        *self.client.in_flight.lock().unwrap() -= 1;
        self.client.slot_freed.notify_one();
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
