//! vLLM's tokenizer routes: `POST /tokenize` (a text, or a conversation through the chat
//! template), `POST /detokenize` and `GET /tokenizer_info`, on the served policy's tokenizer (or
//! the PRM's, by `model`). lm-evaluation-harness's `local-completions` finds a server's
//! tokenizer through them (`tokenizer_backend=auto`), so a client needs no copy of the
//! checkpoint's tokenizer files.
//!
//! A text is tokenized whatever its length (a document to be cut into windows is longer than the
//! context): the body limit bounds it (`--max-body-mb`).

use super::completions::Conversation;
use super::request::{flag, model_field, parse_body};
use super::{off_async, ApiError, Shared};
use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use stepwise_model::Tokenizer;

/// The tokenizer a request names (`model`: the policy's, an adapter's served on it, or the
/// PRM's name), by default the policy's, and its model's context length.
fn tokenizer<'a>(s: &'a Shared, model: Option<&str>) -> Result<(&'a Tokenizer, usize), ApiError> {
    let mut served: Vec<(String, &Tokenizer, usize)> = Vec::new();
    if let Some((n, p)) = &s.policy {
        let len = p.model.config.max_position_embeddings;
        served.push((n.clone(), &p.tokenizer, len));
        let adapters = p.model.adapters();
        served.extend(
            adapters
                .iter()
                .flat_map(|a| a.names())
                .map(|a| (a.to_string(), &p.tokenizer, len)),
        );
    }
    if let Some((n, v)) = &s.prm {
        served.push((n.clone(), &v.tokenizer, v.model.config.max_position_embeddings));
    }
    let names: Vec<&str> = served.iter().map(|(n, _, _)| n.as_str()).collect();
    match model {
        Some(m) => served.iter().find(|(n, _, _)| n == m),
        None => served.first(),
    }
    .map(|&(_, t, len)| (t, len))
    .ok_or_else(|| match model {
        Some(m) => ApiError::no_model(m, &names),
        None => ApiError::invalid("this server serves no model", Some("model")),
    })
}

/// `POST /tokenize`: `{"prompt": TEXT, "add_special_tokens": true}` or `{"messages": [...],
/// "add_generation_prompt": true, "continue_final_message": false, "add_special_tokens": false}`
/// → `{"count", "max_model_len", "tokens", "token_strs"}` (the tokens' own strings with
/// `"return_token_strs": true`), as vLLM answers.
pub(crate) async fn tokenize(State(s): State<Shared>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let v = parse_body(&body)?;
    drop(body);
    tokenizer(&s, model_field(&v)?)?;
    let chat = v.get("messages").is_some();
    let special = flag(&v, "add_special_tokens", !chat)?;
    let strs = flag(&v, "return_token_strs", false)?;
    let text = match (chat, v.get("prompt")) {
        (true, _) => None,
        (false, Some(Value::String(t))) => Some(t.clone()),
        (false, _) => {
            return Err(ApiError::invalid(
                "`prompt` (a text) or `messages` (a conversation) is needed",
                Some("prompt"),
            ))
        }
    };
    let conversation = chat.then(|| Conversation::of(&v)).transpose()?;
    let state = s.clone();
    off_async(move || {
        let (tok, max_len) = tokenizer(&state, model_field(&v)?)?;
        let text = match conversation {
            Some(c) => c.render(tok)?,
            None => text.unwrap_or_default(),
        };
        let ids = tok
            .encode(&text, special)
            .map_err(|e| ApiError::invalid(format!("{e:#}"), Some("prompt")))?;
        let token_strs = strs.then(|| {
            ids.iter()
                .map(|&t| tok.inner().id_to_token(t).unwrap_or_default())
                .collect::<Vec<_>>()
        });
        Ok(Json(
            json!({"count": ids.len(), "max_model_len": max_len, "tokens": ids, "token_strs": token_strs}),
        ))
    })
    .await
}

/// `POST /detokenize`: `{"tokens": [ids]}` → `{"prompt": TEXT}`.
pub(crate) async fn detokenize(State(s): State<Shared>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let v = parse_body(&body)?;
    drop(body);
    let (tok, _) = tokenizer(&s, model_field(&v)?)?;
    let vocab = tok.vocab_size() as u64;
    let ids = v
        .get("tokens")
        .and_then(Value::as_array)
        .and_then(|a| {
            a.iter()
                .map(|x| x.as_u64().filter(|&i| i < vocab).map(|i| i as u32))
                .collect::<Option<Vec<u32>>>()
        })
        .ok_or_else(|| {
            ApiError::invalid(
                format!("`tokens` must be a list of token ids below {vocab}"),
                Some("tokens"),
            )
        })?;
    let state = s.clone();
    off_async(move || {
        let (tok, _) = tokenizer(&state, model_field(&v)?)?;
        let text = tok.decode(&ids).map_err(ApiError::internal)?;
        Ok(Json(json!({"prompt": text})))
    })
    .await
}

/// `GET /tokenizer_info`: the tokenizer's special tokens, chat template and context length, in
/// the fields of vLLM's (`tokenizer_class`, `eos_token`, `bos_token`, `pad_token`,
/// `chat_template`, `model_max_length`), for the policy (or the PRM on a server with no policy).
pub(crate) async fn tokenizer_info(State(s): State<Shared>) -> Result<Json<Value>, ApiError> {
    let (tok, max_len) = tokenizer(&s, None)?;
    Ok(Json(json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": tok.eos_token, "bos_token": tok.bos_token, "pad_token": tok.pad_token,
        "chat_template": tok.chat_template(), "model_max_length": max_len,
    })))
}
