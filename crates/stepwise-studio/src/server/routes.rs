//! The JSON API (documented in docs/studio.md). Who may call what:
//!
//! | route | who |
//! |---|---|
//! | `POST /api/login`, `POST /api/logout` | anyone (logout ends the caller's session) |
//! | `GET /api/me`, `POST /api/projects/{p}/next`, `GET …/mine`, `GET …/guidelines` | any signed-in user (`mine`: their own) |
//! | `GET /api/records/{id}`, `PUT …/steps/{i}`, `POST …/finish` | the labeller it is assigned to |
//! | `GET /api/projects/{p}/dashboard`, `GET /api/records/{id}/review`, `PUT …/adjudication` | reviewers, admins |
//! | `GET /api/projects/{p}/export?to=FORMAT`, `PUT /api/projects/{p}/guidelines` | admins |

use super::{db, ApiError, Shared, User, COOKIE};
use crate::export::{export as export_records, Shape};
use crate::store::{LoginError, RatingInput};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use stepwise_core::formats::Format;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Login {
    name: String,
    password: String,
}

/// How long a login waits after `failures` failed ones in a row for that name: nothing for
/// the first three, then doubling from half a second up to 16 s.
fn backoff(failures: u32) -> Duration {
    match failures {
        0..=2 => Duration::ZERO,
        n => Duration::from_millis(500u64 << (n - 3).min(5)),
    }
}

pub(super) async fn login(State(s): State<Shared>, Json(l): Json<Login>) -> Result<Response, ApiError> {
    if l.name.len() > 64 || l.password.len() > 1024 {
        return Err(ApiError::new(StatusCode::UNAUTHORIZED, "wrong user name or password"));
    }
    let key = l.name.to_lowercase();
    let wait = {
        let f = s.failures.lock().unwrap_or_else(|p| p.into_inner());
        f.get(&key).map_or(Duration::ZERO, |(n, _)| backoff(*n))
    };
    tokio::time::sleep(wait).await;
    let (name, password) = (l.name.clone(), l.password);
    let result = db(&s, move |st| st.login(&name, &password)).await?;
    let mut f = s.failures.lock().unwrap_or_else(|p| p.into_inner());
    match result {
        Err(LoginError::Refused) => {
            if f.len() > 100_000 {
                // Bounded memory under a flood of made-up names: forget the stale ones.
                f.retain(|_, (_, at)| at.elapsed() < Duration::from_secs(900));
            }
            let e = f.entry(key).or_insert((0, Instant::now()));
            *e = (e.0.saturating_add(1), Instant::now());
            eprintln!(
                "stepwise studio: failed login for `{}` ({} in a row)",
                l.name.escape_debug(),
                e.0
            );
            Err(ApiError::new(StatusCode::UNAUTHORIZED, "wrong user name or password"))
        }
        Ok((token, user)) => {
            f.remove(&key);
            let cookie = format!(
                "{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{}",
                crate::store::SESSION_SECONDS as u64,
                if s.secure_cookie { "; Secure" } else { "" }
            );
            let mut res = Json(json!({ "name": user.name, "role": user.role, "token": token })).into_response();
            res.headers_mut().insert(
                header::SET_COOKIE,
                HeaderValue::from_str(&cookie).map_err(|e| ApiError::bad(e.to_string()))?,
            );
            Ok(res)
        }
    }
}

pub(super) async fn logout(State(s): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    let (mut parts, _) = axum::http::Request::new(()).into_parts();
    parts.headers = headers;
    if let Some(token) = super::token_of(&parts) {
        db(&s, move |st| st.logout(&token)).await?;
    }
    let mut res = Json(json!({ "signed_out": true })).into_response();
    res.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("stepwise_session=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
    );
    Ok(res)
}

pub(super) async fn me(State(s): State<Shared>, User(u): User) -> Result<Json<Value>, ApiError> {
    let projects = db(&s, |st| st.projects()).await?;
    let names: Vec<&str> = projects.iter().map(|p| p.name.as_str()).collect();
    Ok(Json(json!({ "name": u.name, "role": u.role, "projects": names })))
}

async fn project(s: &Shared, name: String) -> Result<crate::store::Project, ApiError> {
    db(s, move |st| st.project(&name))
        .await?
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "no such project"))
}

pub(super) async fn next(
    State(s): State<Shared>,
    User(u): User,
    Path(p): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let p = project(&s, p).await?;
    let record = db(&s, move |st| st.next_for(u.id, &p)).await?;
    Ok(Json(json!({ "record": record })))
}

/// The caller's own records in the project, the latest first.
pub(super) async fn mine(
    State(s): State<Shared>,
    User(u): User,
    Path(p): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let p = project(&s, p).await?;
    let records = db(&s, move |st| st.history(u.id, &p)).await?;
    Ok(Json(json!({ "records": records })))
}

pub(super) async fn record(State(s): State<Shared>, User(u): User, Path(id): Path<i64>) -> Result<Response, ApiError> {
    let view = db(&s, move |st| st.view(u.id, id))
        .await?
        .ok_or_else(ApiError::not_yours)?;
    Ok(Json(view).into_response())
}

pub(super) async fn rate(
    State(s): State<Shared>,
    User(u): User,
    Path((id, step)): Path<(i64, usize)>,
    Json(input): Json<RatingInput>,
) -> Result<Json<Value>, ApiError> {
    let saved = db(&s, move |st| st.rate(u.id, id, step, &input))
        .await?
        .ok_or_else(ApiError::not_yours)?;
    Ok(Json(json!(saved)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Finish {
    finish_reason: String,
}

pub(super) async fn finish(
    State(s): State<Shared>,
    User(u): User,
    Path(id): Path<i64>,
    Json(f): Json<Finish>,
) -> Result<Json<Value>, ApiError> {
    db(&s, move |st| st.finish(u.id, id, &f.finish_reason))
        .await?
        .ok_or_else(ApiError::not_yours)?;
    Ok(Json(json!({ "finished": true })))
}

pub(super) async fn dashboard(
    State(s): State<Shared>,
    User(u): User,
    Path(p): Path<String>,
) -> Result<Response, ApiError> {
    if !u.role.reviews() {
        return Err(ApiError::forbidden());
    }
    let p = project(&s, p).await?;
    Ok(Json(db(&s, move |st| st.dashboard(&p)).await?).into_response())
}

pub(super) async fn review(State(s): State<Shared>, User(u): User, Path(id): Path<i64>) -> Result<Response, ApiError> {
    if !u.role.reviews() {
        return Err(ApiError::forbidden());
    }
    let view = db(&s, move |st| st.review(id))
        .await?
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "no such record"))?;
    Ok(Json(view).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Adjudication {
    rating: i64,
}

pub(super) async fn adjudicate(
    State(s): State<Shared>,
    User(u): User,
    Path((id, step)): Path<(i64, usize)>,
    Json(a): Json<Adjudication>,
) -> Result<Json<Value>, ApiError> {
    if !u.role.reviews() {
        return Err(ApiError::forbidden());
    }
    db(&s, move |st| st.adjudicate(u.id, id, step, a.rating))
        .await?
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "no such record"))?;
    Ok(Json(json!({ "adjudicated": true })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ExportQuery {
    to: Option<String>,
    #[serde(default)]
    include_unlabelled: bool,
}

pub(super) async fn export(
    State(s): State<Shared>,
    User(u): User,
    Path(p): Path<String>,
    Query(q): Query<ExportQuery>,
) -> Result<Response, ApiError> {
    if u.role != crate::settings::Role::Admin {
        return Err(ApiError::forbidden());
    }
    let format: Format = q.to.as_deref().unwrap_or("stepwise").parse().map_err(ApiError::bad)?;
    let p = project(&s, p).await?;
    let body = db(&s, move |st| {
        let shape = if format == Format::Prm800k {
            Shape::PerLabelling
        } else {
            Shape::PerRecord
        };
        let records = export_records(st, &p, shape, q.include_unlabelled)?;
        crate::export::to_jsonl(&records, format)
    })
    .await?;
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson; charset=utf-8")], body).into_response())
}

pub(super) async fn guidelines(
    State(s): State<Shared>,
    User(_): User,
    Path(p): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let p = project(&s, p).await?;
    let g = db(&s, move |st| st.guidelines(&p)).await?;
    Ok(Json(match g {
        Some(g) => json!(g),
        None => json!({ "text": "", "updated": null, "set_by": null }),
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NewGuidelines {
    text: String,
}

pub(super) async fn set_guidelines(
    State(s): State<Shared>,
    User(u): User,
    Path(p): Path<String>,
    Json(g): Json<NewGuidelines>,
) -> Result<Json<Value>, ApiError> {
    if u.role != crate::settings::Role::Admin {
        return Err(ApiError::forbidden());
    }
    let p = project(&s, p).await?;
    let at = db(&s, move |st| st.set_guidelines(&p, &g.text, &u.name)).await?;
    Ok(Json(json!({ "updated": at })))
}
