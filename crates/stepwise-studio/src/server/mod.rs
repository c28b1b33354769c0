//! The studio's HTTP server: the page and its assets, and the JSON API the page (and any
//! script) labels through. Every `/api` route but login checks the session; a labeller reaches
//! only their own assignments; reviewers and admins see more (see `routes`).

mod assets;
mod routes;

use crate::store::{SessionUser, Store};
use axum::extract::{FromRequestParts, Request};
use axum::http::{header, request::Parts, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The name of the session cookie.
pub const COOKIE: &str = "stepwise_session";

/// Most bytes in a request body (a rating is tens of bytes; a comment at most 4,000 characters).
pub const MAX_BODY: usize = 64 << 10;

/// What every handler shares.
pub struct AppState {
    store: Mutex<Store>,
    /// Failed logins per user name: (failures in a row, when the last one was).
    failures: Mutex<HashMap<String, (u32, Instant)>>,
    /// `Secure` on the cookie (set when served behind HTTPS).
    secure_cookie: bool,
}

type Shared = Arc<AppState>;

/// An API error: its status and a sentence for the page, as `{"error": "..."}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// A record that is not there or not this user's: one answer for both.
    fn not_yours() -> Self {
        Self::new(StatusCode::NOT_FOUND, "no such record among yours")
    }

    fn forbidden() -> Self {
        Self::new(StatusCode::FORBIDDEN, "your role may not do this")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({ "error": self.message }))).into_response()
    }
}

/// A store error: a locked database or a full disk is said as such (503, 507), in the log and
/// to the page; the transaction was rolled back, so nothing is half-written.
impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> Self {
        use rusqlite::ErrorCode;
        let code = e
            .chain()
            .find_map(|c| c.downcast_ref::<rusqlite::Error>())
            .and_then(rusqlite::Error::sqlite_error_code);
        let (status, message) = match code {
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "the database is locked by another process; nothing was saved, try again".to_string(),
            ),
            Some(ErrorCode::DiskFull) => (
                StatusCode::INSUFFICIENT_STORAGE,
                "the server's disk is full; nothing was saved".to_string(),
            ),
            Some(ErrorCode::ReadOnly | ErrorCode::CannotOpen | ErrorCode::SystemIoFailure) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the database cannot be written ({e:#}); nothing was saved"),
            ),
            _ if code.is_some() => (StatusCode::INTERNAL_SERVER_ERROR, format!("database: {e:#}")),
            // Not the store's: a rule the input broke (a rating out of range, a step past the end).
            _ => return ApiError::bad(format!("{e:#}")),
        };
        eprintln!("stepwise studio: {message} ({e:#})");
        ApiError::new(status, message)
    }
}

/// Runs `f` on the store on a blocking thread (SQLite calls block; one writer at a time).
async fn db<T: Send + 'static>(
    s: &Shared,
    f: impl FnOnce(&mut Store) -> anyhow::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    let s = s.clone();
    tokio::task::spawn_blocking(move || {
        let mut store = s.store.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut store)
    })
    .await
    .map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the store's thread failed: {e}"),
        )
    })?
    .map_err(ApiError::from)
}

/// The session token of a request: the cookie, or `Authorization: Bearer TOKEN` for scripts.
fn token_of(parts: &Parts) -> Option<String> {
    let bearer = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim().to_string());
    bearer.or_else(|| {
        parts
            .headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().split_once('='))
            .find(|(k, _)| *k == COOKIE)
            .map(|(_, v)| v.to_string())
    })
}

/// The signed-in user of a request; a request without an open session is a 401.
pub struct User(pub SessionUser);

impl FromRequestParts<Shared> for User {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &Shared) -> Result<Self, ApiError> {
        let unauthorized = || ApiError::new(StatusCode::UNAUTHORIZED, "sign in first");
        let token = token_of(parts).filter(|t| t.len() == 64).ok_or_else(unauthorized)?;
        db(s, move |st| st.session(&token))
            .await?
            .map(User)
            .ok_or_else(unauthorized)
    }
}

/// Refuses writes whose `Origin` is another site (with the `SameSite=Strict` cookie, no other
/// site can make a signed-in browser write), and sets the headers every answer carries: a
/// content security policy that runs only the studio's own scripts, no sniffing, no framing.
async fn guard(req: Request, next: Next) -> Response {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok());
        let origin = req.headers().get(header::ORIGIN).and_then(|h| h.to_str().ok());
        if let (Some(origin), Some(host)) = (origin, host) {
            let origin_host = origin.split_once("://").map_or(origin, |(_, h)| h);
            if origin_host != host {
                return ApiError::new(StatusCode::FORBIDDEN, "a request from another site").into_response();
            }
        }
    }
    let api = req.uri().path().starts_with("/api/");
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    let set = |h: &mut axum::http::HeaderMap, k: header::HeaderName, v: &'static str| {
        h.insert(k, HeaderValue::from_static(v));
    };
    set(
        h,
        header::CONTENT_SECURITY_POLICY,
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; font-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    );
    set(h, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(h, header::X_FRAME_OPTIONS, "DENY");
    set(h, header::REFERRER_POLICY, "no-referrer");
    if api {
        set(h, header::CACHE_CONTROL, "no-store");
    }
    res
}

/// The studio's router over `store`.
pub fn app(mut store: Store, secure_cookie: bool) -> Router {
    if let Err(e) = store.checkpoint_in_background() {
        eprintln!("stepwise studio: checkpoints stay on the committing request ({e:#})");
    }
    let state: Shared = Arc::new(AppState {
        store: Mutex::new(store),
        failures: Mutex::new(HashMap::new()),
        secure_cookie,
    });
    let api = Router::new()
        .route("/api/login", post(routes::login))
        .route("/api/logout", post(routes::logout))
        .route("/api/me", get(routes::me))
        .route("/api/projects/{project}/next", post(routes::next))
        .route("/api/projects/{project}/mine", get(routes::mine))
        .route("/api/projects/{project}/dashboard", get(routes::dashboard))
        .route("/api/projects/{project}/export", get(routes::export))
        .route(
            "/api/projects/{project}/guidelines",
            get(routes::guidelines).put(routes::set_guidelines),
        )
        .route("/api/records/{id}", get(routes::record))
        .route("/api/records/{id}/steps/{step}", put(routes::rate))
        .route("/api/records/{id}/finish", post(routes::finish))
        .route("/api/records/{id}/review", get(routes::review))
        .route("/api/records/{id}/steps/{step}/adjudication", put(routes::adjudicate))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such API route") });
    Router::new()
        .merge(assets::routes())
        .merge(api)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn(guard))
        .with_state(state)
}

/// A studio served on a thread of its own (for the lab's simulated labellers, Python and
/// tests); stopped and joined when dropped. `stepwise studio` serves through `stepwise serve`'s
/// hardened connection loop instead.
pub struct Running {
    /// Where it listens.
    pub addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Its base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serve `store` on `address` (`127.0.0.1:0` for a free port) on a thread of its own.
pub fn spawn(store: Store, address: &str) -> anyhow::Result<Running> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind(address))?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let router = app(store, false);
    let thread = std::thread::Builder::new()
        .name("stepwise-studio".into())
        .spawn(move || {
            runtime.block_on(async move {
                let _ = axum::serve(listener, router)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await;
            });
        })?;
    Ok(Running {
        addr,
        stop: Some(stop),
        thread: Some(thread),
    })
}
