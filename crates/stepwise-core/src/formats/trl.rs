//! TRL's stepwise supervision layout (`PRMTrainer`): `{prompt, completions: [str], labels: [bool]}`,
//! with `id` and, when known, `generator` and the outcome `correct` as extra columns (TRL
//! ignores columns it does not use), so a ProcessBench record survives a round trip. A record
//! read without `id` is written with its index as its `id`. TRL's conversational layout is read
//! too: `prompt` as messages (`[{role, content}]`: the question is the last user message, the
//! messages kept in `meta.prompt_messages` and written back as they were) and completions as
//! assistant messages.

use super::{binary_labels, extend_with_meta, problem_id_for};
use crate::error::FieldError;
use crate::json::{self, object};
use crate::record::{Provenance, Solution, Step, StepLabel};
use serde_json::{json, Value};

const KNOWN: &[&str] = &["prompt", "completions", "labels", "id", "generator", "correct"];

pub(super) fn read(v: &Value, index: usize) -> Result<Solution, FieldError> {
    let o = object(v, "")?;
    let (question, messages) = match o.get("prompt") {
        Some(Value::Array(messages)) => (last_user_message(messages)?, Some(Value::Array(messages.clone()))),
        _ => (json::str_field(o, "prompt")?.to_string(), None),
    };
    let texts = completions(o)?;
    let labels = json::array_field(o, "labels")?;
    if labels.len() != texts.len() {
        return Err(FieldError::new(
            "labels",
            format!("has {} entries but `completions` has {}", labels.len(), texts.len()),
        ));
    }
    let steps = texts
        .into_iter()
        .zip(labels)
        .enumerate()
        .map(|(i, (text, l))| {
            let good = match l {
                Value::Bool(b) => *b,
                Value::Number(n) if n.as_i64() == Some(1) => true,
                Value::Number(n) if n.as_i64() == Some(0) => false,
                other => {
                    return Err(FieldError::new(
                        format!("labels[{i}]"),
                        format!("expected a boolean, found {}", json::kind(other)),
                    ))
                }
            };
            Ok(Step::labelled(text, StepLabel::from_bool(good, Provenance::Unknown)))
        })
        .collect::<Result<_, _>>()?;
    let correct = json::opt_bool(o, "correct")?;
    Ok(Solution {
        id: json::opt_str(o, "id")?.unwrap_or_else(|| index.to_string()),
        problem_id: problem_id_for(&question),
        question,
        steps,
        correct,
        generator: json::opt_str(o, "generator")?,
        meta: {
            let mut meta = json::rest(o, KNOWN);
            if let Some(m) = messages {
                meta.insert(PROMPT_MESSAGES.into(), m);
            }
            meta
        },
        ..Default::default()
    })
}

/// Where a conversational prompt's messages are kept.
const PROMPT_MESSAGES: &str = "prompt_messages";

/// A message's text: `content` as a string, or the `text` of its parts (`[{type, text}]`).
fn message_text(m: &Value) -> Option<String> {
    match m.get("content")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text")?.as_str())
                .collect::<Vec<_>>()
                .join(""),
        ),
        _ => None,
    }
}

/// The question of a conversational prompt: its last user message.
fn last_user_message(messages: &[Value]) -> Result<String, FieldError> {
    messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .and_then(message_text)
        .ok_or_else(|| {
            FieldError::new(
                "prompt",
                "a conversational prompt needs a user message with text content",
            )
        })
}

/// The step texts: strings, or (conversational) assistant messages, one or a list a step.
fn completions(o: &serde_json::Map<String, Value>) -> Result<Vec<String>, FieldError> {
    let items = json::array_field(o, "completions")?;
    items
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let text = match c {
                Value::String(s) => Some(s.clone()),
                Value::Object(_) => message_text(c),
                Value::Array(messages) => messages
                    .iter()
                    .map(message_text)
                    .collect::<Option<Vec<_>>>()
                    .map(|t| t.join("")),
                _ => None,
            };
            text.ok_or_else(|| {
                FieldError::new(
                    format!("completions[{i}]"),
                    format!("expected a string or an assistant message, found {}", json::kind(c)),
                )
            })
        })
        .collect()
}

pub(super) fn write(s: &Solution) -> Value {
    let mut v = json!({
        "prompt": s.question,
        "completions": s.step_texts(),
        "labels": binary_labels(s),
        "id": s.id,
    });
    let o = v.as_object_mut().unwrap();
    if let Some(g) = &s.generator {
        o.insert("generator".into(), json!(g));
    }
    if let Some(c) = s.correct {
        o.insert("correct".into(), json!(c));
    }
    // A conversational prompt goes back as its messages while its question is unchanged.
    if let Some(Value::Array(m)) = s.meta.get(PROMPT_MESSAGES) {
        if last_user_message(m).ok().as_deref() == Some(s.question.as_str()) {
            o.insert("prompt".into(), Value::Array(m.clone()));
        }
    }
    extend_with_meta(o, s);
    o.remove(PROMPT_MESSAGES);
    v
}
