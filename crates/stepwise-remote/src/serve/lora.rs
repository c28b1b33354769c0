//! vLLM's runtime LoRA routes, there only with `--allow-runtime-lora-updating`:
//! `POST /v1/load_lora_adapter` `{"lora_name", "lora_path", "load_inplace"}` serves a PEFT
//! adapter on the policy while the server runs (beside those of `--lora-modules`), and
//! `POST /v1/unload_lora_adapter` `{"lora_name"}` stops serving one. An RL loop that trains a LoRA
//! hands each new adapter to the server that samples its rollouts this way (in place, or under a
//! new name), without a restart and without a second copy of the base.
//!
//! Requests in flight keep the adapter they were admitted with to their end
//! ([`stepwise_model::AdapterLease`]); a load in place changes an adapter's weights from its
//! requests' next step. The answers are vLLM's: `200` with a line of text, `400`/`404` as JSON
//! errors.

use super::request::parse_body;
use super::{off_async, ApiError, Shared};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::Value;

/// A required string field (`param`), not empty.
fn name_field(v: &Value, param: &'static str) -> Result<String, ApiError> {
    match v.get(param) {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
        None | Some(Value::Null) | Some(Value::String(_)) => Err(ApiError::invalid(
            format!("`{param}` must be given (a non-empty string)"),
            Some(param),
        )),
        Some(other) => Err(ApiError::invalid(
            format!("`{param}` must be a string, not {other}"),
            Some(param),
        )),
    }
}

/// The served policy, or a 400 where the server has none.
fn policy(s: &Shared) -> Result<(&str, &stepwise_model::Model), ApiError> {
    match &s.policy {
        Some((name, p)) => Ok((name, &p.model)),
        None => Err(ApiError::invalid(
            "this server has no policy to serve adapters on (start it with --model)",
            None,
        )),
    }
}

/// A 404 in the shape of vLLM's.
fn not_found(message: String, param: &'static str) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message,
        kind: "NotFoundError",
        param: Some(param),
    }
}

/// `POST /v1/load_lora_adapter`: the adapter in `lora_path` (a folder, or a Hub id found in the
/// cache or downloaded) served as `lora_name`.
pub(crate) async fn load(State(s): State<Shared>, body: Bytes) -> Result<String, ApiError> {
    let v = parse_body(&body)?;
    let name = name_field(&v, "lora_name")?;
    let path = name_field(&v, "lora_path")?;
    let inplace = super::request::flag(&v, "load_inplace", false)?;
    let (base, model) = policy(&s)?;
    let taken = [Some(base), s.prm.as_ref().map(|(n, _)| n.as_str())];
    if taken.contains(&Some(name.as_str())) {
        return Err(ApiError::invalid(
            format!("the adapter `{name}` conflicts with a served model's name"),
            Some("lora_name"),
        ));
    }
    if !inplace && model.adapters().is_some_and(|a| a.index(&name).is_some()) {
        return Err(ApiError::invalid(
            format!("the adapter `{name}` has already been loaded; to replace it, set `load_inplace` to true"),
            Some("lora_name"),
        ));
    }
    let state = s.clone();
    off_async(move || {
        let dir = stepwise_model::hub::resolve_folder(&path)
            .map_err(|e| not_found(format!("no adapter found at `{path}`: {e:#}"), "lora_path"))?;
        let model = &state.policy.as_ref().expect("checked above").1.model;
        model
            .load_adapter(&name, &dir, inplace)
            .map_err(|e| ApiError::invalid(format!("loading the adapter `{name}` failed: {e:#}"), Some("lora_path")))?;
        eprintln!("stepwise serve: serving the adapter `{name}` from {}", dir.display());
        Ok(format!("Success: LoRA adapter '{name}' added successfully."))
    })
    .await
}

/// `POST /v1/unload_lora_adapter`: `lora_name` no longer served.
pub(crate) async fn unload(State(s): State<Shared>, body: Bytes) -> Result<String, ApiError> {
    let v = parse_body(&body)?;
    let name = name_field(&v, "lora_name")?;
    let (_, model) = policy(&s)?;
    if model.adapters().is_none_or(|a| a.index(&name).is_none()) {
        return Err(not_found(format!("the adapter `{name}` cannot be found"), "lora_name"));
    }
    model
        .unload_adapter(&name)
        .map_err(|e| not_found(format!("{e:#}"), "lora_name"))?;
    eprintln!("stepwise serve: no longer serving the adapter `{name}`");
    Ok(format!("Success: LoRA adapter '{name}' removed successfully."))
}
