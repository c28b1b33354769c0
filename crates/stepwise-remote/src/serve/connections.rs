//! The server's connections, each bounded in time and in number, so no client, careless or
//! hostile, can hold the server: a connection that takes longer than
//! [`Limits::idle_timeout`] to send a request's headers (or sends nothing for that long between
//! requests) is closed; a request's body has [`Limits::body_timeout`] to arrive (then 408) and at
//! most [`Limits::max_body_bytes`] (then 413); at most [`Limits::max_connections`] are open at
//! once (the others wait to be accepted); and a stop signal lets the requests in flight finish
//! for at most [`Limits::shutdown_timeout`], then the server exits whatever is still open.

use super::{ApiError, Shared};
use anyhow::{Context, Result};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// What a client may ask of the server, and how long it may take to ask.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most bytes in a request body; a larger one gets a 413.
    pub max_body_bytes: usize,
    /// Most texts or solutions in one `/pooling`, `/v1/score_steps` or `/get_reward` request.
    pub max_inputs: usize,
    /// A connection that takes longer than this to send a request's headers, or sends nothing
    /// for this long after its last answer, is closed.
    pub idle_timeout: Duration,
    /// A request whose body takes longer than this to arrive gets a 408.
    pub body_timeout: Duration,
    /// Most connections open at once; more wait to be accepted.
    pub max_connections: usize,
    /// After SIGTERM or Ctrl-C, the requests in flight get this long to finish; then the server
    /// exits, closing what is still open.
    pub shutdown_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 32 << 20,
            max_inputs: 4096,
            idle_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
            max_connections: 1024,
            shutdown_timeout: Duration::from_secs(30),
        }
    }
}

/// Serve `router` on `listener` until `stop` completes, within `limits`.
pub(crate) async fn serve_connections(
    listener: TcpListener,
    router: Router,
    limits: &Limits,
    stop: impl Future<Output = ()>,
) -> Result<()> {
    // HTTP/1.1, as OpenAI's clients and vLLM's server speak it. (hyper's automatic HTTP/2
    // detection reads a connection's first bytes before any timeout runs: a silent connection
    // would be held for good.)
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout);
    let graceful = GracefulShutdown::new();
    let open = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let mut stop = std::pin::pin!(stop);
    loop {
        let permit = tokio::select! {
            permit = open.clone().acquire_owned() => permit.context("the connection limit closed")?,
            () = &mut stop => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait for connections to close.
                    eprintln!("stepwise serve: accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            // A connection's errors (a client gone, a timeout) are the client's; the server goes on.
            let _ = connection.await;
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(limits.shutdown_timeout) => {
            eprintln!(
                "stepwise serve: requests still running {} s after the stop signal; closing them",
                limits.shutdown_timeout.as_secs_f64()
            );
        }
    }
    Ok(())
}

/// Reads a request's whole body within [`Limits::body_timeout`] and [`Limits::max_body_bytes`]
/// before the handler runs: a body that drips in too slowly is a 408, one too large a 413 (told
/// by its `content-length` before reading any of it), both OpenAI-shaped.
pub(crate) async fn bounded_body(State(s): State<Shared>, req: Request, next: Next) -> Response {
    let limit = s.limits.max_body_bytes;
    let too_large = || ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        message: format!("The request body is larger than this server takes ({limit} bytes: --max-body-mb)."),
        kind: "invalid_request_error",
        param: None,
    };
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return too_large().into_response();
    }
    let (parts, body) = req.into_parts();
    let bytes = match tokio::time::timeout(s.limits.body_timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            let source = e.into_inner();
            if source.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                return too_large().into_response();
            }
            return ApiError::invalid(format!("reading the request body: {source}"), None).into_response();
        }
        Err(_) => {
            return ApiError {
                status: StatusCode::REQUEST_TIMEOUT,
                message: format!(
                    "The request body did not arrive within {} s.",
                    s.limits.body_timeout.as_secs_f64()
                ),
                kind: "invalid_request_error",
                param: None,
            }
            .into_response()
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}
