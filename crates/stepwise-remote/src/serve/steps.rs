//! Step rewards from the served PRM: stepwise's `/v1/score_steps` (questions and steps as text,
//! laid out as the verifier was trained, any layout) and vLLM's `/pooling` shape (token ids or
//! text with step tags; one `[p_bad, p_good]` per step tag).

use super::{ApiError, Shared};
use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use stepwise_core::seams::{ScoreInput, Scored, StepScorer};
use stepwise_model::layout::Encoded;
use stepwise_model::PrmLayout;

fn parse(s: &Shared, body: &Bytes) -> Result<Value, ApiError> {
    let v = super::request::parse_body(body)?;
    let Some((name, _)) = &s.prm else {
        return Err(ApiError::invalid(
            "this server has no PRM (start it with --prm)",
            Some("model"),
        ));
    };
    match super::request::model_field(&v)? {
        Some(m) if m != name => Err(ApiError::no_model(m, &[name.as_str()])),
        _ => Ok(v),
    }
}

/// Refuse more than [`super::Limits::max_inputs`] items in one request.
pub(crate) fn check_count(s: &Shared, n: usize, param: &'static str) -> Result<(), ApiError> {
    let most = s.limits.max_inputs;
    if n > most {
        return Err(ApiError::invalid(
            format!("{n} items in `{param}`; this server takes at most {most} a request (--max-inputs)"),
            Some(param),
        ));
    }
    Ok(())
}

/// `POST /v1/score_steps`: `{"inputs": [{"question": …, "steps": [...], "partial": false}]}` →
/// `{"scores": [[…]], "usage": {"prompt_tokens": …}}`.
pub(crate) async fn score_steps(State(s): State<Shared>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let v = parse(&s, &body)?;
    let inputs = v
        .get("inputs")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::invalid("`inputs` must be a list of {question, steps}", Some("inputs")))?;
    check_count(&s, inputs.len(), "inputs")?;
    let mut owned = Vec::with_capacity(inputs.len());
    for (k, i) in inputs.iter().enumerate() {
        let question = i.get("question").and_then(Value::as_str);
        let steps: Option<Vec<String>> = i
            .get("steps")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(|x| x.as_str().map(str::to_string)).collect());
        match (question, steps) {
            (Some(q), Some(st)) => owned.push((
                q.to_string(),
                st,
                super::request::flag(i, "partial", false)
                    .map_err(|e| ApiError::invalid(format!("inputs[{k}]: {}", e.message), Some("inputs")))?,
            )),
            _ => {
                return Err(ApiError::invalid(
                    format!("inputs[{k}]: needs `question` (text) and `steps` (a list of texts)"),
                    Some("inputs"),
                ))
            }
        }
    }
    let scored = score_queued(&s, owned).await?;
    s.metrics.tokens(scored.tokens, 0);
    Ok(Json(
        json!({"object": "list", "scores": scored.scores, "usage": {"prompt_tokens": scored.tokens}}),
    ))
}

/// Scores `inputs` (question, steps, partial) on the scoring worker, batched with the requests
/// that arrive meanwhile.
pub(crate) async fn score_queued(s: &Shared, inputs: Vec<(String, Vec<String>, bool)>) -> Result<Scored, ApiError> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    s.score_queue
        .lock()
        .unwrap()
        .send(ScoreJob { inputs, reply })
        .map_err(|_| ApiError::internal(anyhow::anyhow!("the scoring worker stopped")))?;
    answer
        .await
        .map_err(|_| ApiError::internal(anyhow::anyhow!("the scoring worker stopped")))?
        // A solution the verifier cannot read (too long, a step holding the step tag) is the
        // request's fault.
        .map_err(|e| ApiError::invalid(format!("{e:#}"), Some("inputs")))
}

/// `POST /pooling` in vLLM's shape: `input` is a text, a list of token ids, or a list of either;
/// the result of each is one `[p_bad, p_good]` per step tag in it.
pub(crate) async fn pooling(State(s): State<Shared>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let v = parse(&s, &body)?;
    drop(body);
    let (_, verifier) = s.prm.as_ref().expect("checked");
    let tag = match &verifier.layout {
        PrmLayout::QwenPrm { step_token, .. } => step_token.clone(),
        PrmLayout::StepTag { tag, .. } => tag.clone(),
        _ => {
            return Err(ApiError::invalid(
                "this PRM's layout has no step tag token to pool at: use /v1/score_steps",
                Some("input"),
            ))
        }
    };
    let tag_id = verifier
        .tokenizer
        .token_id(&tag)
        .ok_or_else(|| ApiError::internal(anyhow::anyhow!("the tokenizer has no `{tag}` token")))?;
    let mut v = v;
    let input = v
        .get_mut("input")
        .map(Value::take)
        .ok_or_else(|| ApiError::invalid("`input` is missing", Some("input")))?;
    let single = input.is_string()
        || input
            .as_array()
            .is_some_and(|a| a.first().is_some_and(Value::is_number));
    let items: Vec<Value> = match input {
        one if single => vec![one],
        Value::Array(many) => many,
        _ => Vec::new(),
    };
    if items.is_empty() {
        return Err(ApiError::invalid(
            "`input` must be a text, token ids, or a non-empty list of them",
            Some("input"),
        ));
    }
    check_count(&s, items.len(), "input")?;
    let model = v.get("model").cloned().unwrap_or(Value::Null);
    drop(v);
    let state = s.clone();
    let batch = super::off_async(move || {
        let (_, verifier) = state.prm.as_ref().expect("checked");
        let vocab = verifier.model.config.vocab_size as u64;
        let limit = verifier.model.config.max_position_embeddings;
        items
            .into_iter()
            .enumerate()
            .map(|(k, item)| pooling_input(verifier, k, item, tag_id, vocab, limit))
            .collect::<Result<Vec<_>, ApiError>>()
    })
    .await?;
    let tokens: usize = batch.iter().map(|e| e.ids.len()).sum();
    let state = s.clone();
    let rewards = tokio::task::spawn_blocking(move || {
        let (_, verifier) = state.prm.as_ref().expect("checked");
        verifier.scorer().score_batch(&batch)
    })
    .await
    .map_err(|e| ApiError::internal(anyhow::anyhow!("{e}")))?
    .map_err(ApiError::internal)?;
    s.metrics.tokens(tokens, 0);
    let data: Vec<Value> = rewards
        .iter()
        .enumerate()
        .map(|(i, r)| json!({"index": i, "object": "pooling", "data": r.iter().map(|p| [1.0 - p, *p]).collect::<Vec<_>>()}))
        .collect();
    Ok(Json(json!({
        "id": format!("pool-{:016x}", rand::random::<u64>()), "object": "list",
        "created": super::unix_now(), "model": model,
        "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })))
}

/// Input `k` of a `/pooling` request (a text, or token ids below `vocab`; 1 to `limit` tokens),
/// read at every `tag_id`.
fn pooling_input(
    verifier: &stepwise_model::scoring::LoadedVerifier,
    k: usize,
    item: Value,
    tag_id: u32,
    vocab: u64,
    limit: usize,
) -> Result<Encoded, ApiError> {
    let ids: Vec<u32> = match item {
        Value::String(t) => super::encode_within(&verifier.tokenizer, &t, true, limit, "input")
            .map_err(|e| ApiError::invalid(format!("input[{k}]: {}", e.message), Some("input")))?,
        Value::Array(a) => a
            .iter()
            .map(|x| x.as_u64().filter(|&i| i < vocab).map(|i| i as u32))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                ApiError::invalid(
                    format!("input[{k}]: token ids must be integers below {vocab}"),
                    Some("input"),
                )
            })?,
        _ => {
            return Err(ApiError::invalid(
                format!("input[{k}]: a text or a list of token ids"),
                Some("input"),
            ))
        }
    };
    if ids.is_empty() || ids.len() > limit {
        return Err(ApiError::invalid(
            format!("input[{k}]: {} tokens; this model reads 1 to {limit}", ids.len()),
            Some("input"),
        ));
    }
    let positions = ids
        .iter()
        .enumerate()
        .filter(|(_, &t)| t == tag_id)
        .map(|(i, _)| i)
        .collect();
    Ok(Encoded {
        ids,
        positions,
        steps_from: 0,
    })
}

/// One `/v1/score_steps` request waiting for the scoring worker.
pub(crate) struct ScoreJob {
    inputs: Vec<(String, Vec<String>, bool)>,
    reply: tokio::sync::oneshot::Sender<anyhow::Result<Scored>>,
}

/// Most solutions scored in one forward pass by the worker.
const MAX_BATCH: usize = 64;

/// The scoring worker: requests that arrive while a batch is being scored are scored together in
/// the next forward pass (up to [`MAX_BATCH`] solutions). A batch that fails is scored request by
/// request, so an error reaches only the request that caused it.
pub(crate) fn score_worker(state: Shared, jobs: std::sync::mpsc::Receiver<ScoreJob>) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        let mut size = batch[0].inputs.len();
        while size < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => {
                    size += job.inputs.len();
                    batch.push(job);
                }
                Err(_) => break,
            }
        }
        let Some((_, verifier)) = state.prm.as_ref() else {
            return;
        };
        let scorer = verifier.scorer();
        let score = |jobs: &[&ScoreJob]| -> anyhow::Result<Scored> {
            let inputs: Vec<ScoreInput<'_>> = jobs
                .iter()
                .flat_map(|j| j.inputs.iter())
                .map(|(q, st, partial)| ScoreInput {
                    problem_id: "",
                    question: q,
                    steps: st.iter().map(String::as_str).collect(),
                    partial: *partial,
                })
                .collect();
            StepScorer::score(&scorer, &inputs)
        };
        let all: Vec<&ScoreJob> = batch.iter().collect();
        let results: Vec<anyhow::Result<Scored>> = match score(&all) {
            Ok(scored) => {
                // Split the batch's scores back by request; its tokens in proportion to the
                // solutions each sent.
                let mut scores = scored.scores.into_iter();
                all.iter()
                    .map(|j| {
                        Ok(Scored {
                            scores: scores.by_ref().take(j.inputs.len()).collect(),
                            tokens: scored.tokens * j.inputs.len() / size.max(1),
                        })
                    })
                    .collect()
            }
            Err(_) if all.len() > 1 => all.iter().map(|j| score(&[*j])).collect(),
            Err(e) => vec![Err(e)],
        };
        for (job, result) in batch.into_iter().zip(results) {
            let _ = job.reply.send(result);
        }
    }
}
