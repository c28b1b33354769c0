//! Agent trajectories in the chat layouts the field's trajectory datasets use. A step is one
//! turn of the agent (its thought and action); the environment's answer after it is the step's
//! `observation`, context that is never scored.
//!
//! - `messages`: OpenAI chat messages with tool calls: `system`, one `user` turn (the task), then
//!   `assistant` turns (content and/or `tool_calls`) each answered by `tool` results or a `user`
//!   turn (text environments answer as the user).
//! - `conversations`: ShareGPT turns `{from, value}` as AgentInstruct and AgentBank (ALFWorld,
//!   WebShop) publish them: `human` (the task), then `gpt` actions and `human` observations.
//!
//! Step labels, when a trajectory has them, sit in a top-level `labels` list with one entry per
//! agent turn (`true`, `false` or `null`), as TRL's stepwise layout keeps them.

use super::{binary_labels, extend_with_meta, problem_id_for};
use crate::error::FieldError;
use crate::json::{self, object};
use crate::record::{Provenance, Solution, Step, StepLabel};
use serde_json::{json, Map, Value};

/// Which of the two layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    Messages,
    Conversations,
}

/// Who wrote a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    System,
    User,
    Agent,
    Tool,
}

impl Layout {
    fn key(self) -> &'static str {
        match self {
            Layout::Messages => "messages",
            Layout::Conversations => "conversations",
        }
    }

    /// A turn's role and text, naming the turn in errors.
    fn turn(self, v: &Value, at: &str) -> Result<(Role, String), FieldError> {
        let t = object(v, at)?;
        let (role_key, text_key) = match self {
            Layout::Messages => ("role", "content"),
            Layout::Conversations => ("from", "value"),
        };
        let r = json::str_field(t, role_key).map_err(|e| e.within(at))?;
        let role = match r {
            "system" => Role::System,
            "user" | "human" => Role::User,
            "assistant" | "gpt" => Role::Agent,
            "tool" | "function" | "observation" => Role::Tool,
            other => {
                return Err(FieldError::new(
                    format!("{at}.{role_key}"),
                    format!("unknown role `{other}` (expected system, user, assistant or tool)"),
                ))
            }
        };
        let text = match t.get(text_key) {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            // OpenAI's content parts: the text parts, in order.
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
            Some(v) => {
                return Err(FieldError::new(
                    format!("{at}.{text_key}"),
                    format!("expected a string, found {}", json::kind(v)),
                ))
            }
        };
        Ok((role, text))
    }
}

/// Whether a chat record is a trajectory (tool calls or results, or agent turns that are not
/// RLHFlow's `+`/`-` verdicts) rather than RLHFlow's step-verdict chat.
pub(super) fn is_trajectory(o: &Map<String, Value>) -> bool {
    let turns = o
        .get("messages")
        .or_else(|| o.get("conversations"))
        .and_then(Value::as_array);
    turns.is_some_and(|t| {
        t.iter().any(|m| {
            m.get("from").is_some()
                || m.get("tool_calls").is_some()
                || matches!(m.get("role").and_then(Value::as_str), Some("tool" | "system"))
                || (m.get("role").and_then(Value::as_str) == Some("assistant")
                    && !matches!(m.get("content").and_then(Value::as_str).map(str::trim), Some("+" | "-")))
        })
    })
}

/// `name(arguments)` for each of an assistant turn's tool calls, one per line.
fn render_calls(calls: &Value) -> String {
    calls
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    let f = c.get("function").unwrap_or(c);
                    let name = f.get("name").and_then(Value::as_str).unwrap_or("call");
                    let args = match f.get("arguments") {
                        Some(Value::String(s)) => s.clone(),
                        Some(v) => v.to_string(),
                        None => String::new(),
                    };
                    format!("{name}({args})")
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

pub(super) fn read(layout: Layout, v: &Value, index: usize) -> Result<Solution, FieldError> {
    let o = object(v, "")?;
    let key = layout.key();
    let turns = json::array_field(o, key)?;
    let mut system = Vec::new();
    let mut question: Option<String> = None;
    let mut steps: Vec<Step> = Vec::new();
    // Fields of a turn beyond its role and text (AgentInstruct's `loss`, a tool result's
    // `tool_call_id`), kept per turn so writing the record back loses nothing.
    let mut extras: Vec<Value> = Vec::with_capacity(turns.len());
    for (i, t) in turns.iter().enumerate() {
        let at = format!("{key}[{i}]");
        let (role, text) = layout.turn(t, &at)?;
        let own = match layout {
            Layout::Messages => ["role", "content", "tool_calls"],
            Layout::Conversations => ["from", "value", "tool_calls"],
        };
        extras.push(Value::Object(
            t.as_object().map(|o| json::rest(o, &own)).unwrap_or_default(),
        ));
        let found = match role {
            Role::System => "a system turn",
            Role::User => "a user turn",
            Role::Agent => "an assistant turn",
            Role::Tool => "a tool turn",
        };
        let expected = |want: &str| {
            FieldError::new(
                at.clone(),
                format!("the turns do not alternate: expected {want}, found {found}"),
            )
        };
        let last = steps.last().map(|s| (s.observation.is_some(), s.tool_calls.is_some()));
        match (role, question.is_some(), last) {
            (Role::System, false, _) => system.push(text),
            (Role::User, false, _) => question = Some(text),
            (_, false, _) => return Err(expected("the task (a user turn) first")),
            (Role::Agent, true, None | Some((true, _))) => {
                let calls = t.get("tool_calls").filter(|c| !c.is_null()).cloned();
                let text = match &calls {
                    Some(c) if text.is_empty() => render_calls(c),
                    Some(c) => format!("{text}\n{}", render_calls(c)),
                    None => text,
                };
                steps.push(Step {
                    text,
                    tool_calls: calls,
                    ..Default::default()
                });
            }
            (Role::Agent, true, Some((false, _))) => {
                return Err(expected("the environment's answer to the turn before"))
            }
            (Role::User | Role::Tool, true, Some((false, _))) => {
                steps.last_mut().unwrap().observation = Some(text);
            }
            // Several tool results answer the several calls of one turn.
            (Role::Tool, true, Some((true, true))) => {
                let o = steps.last_mut().unwrap().observation.as_mut().unwrap();
                o.push('\n');
                o.push_str(&text);
            }
            (_, true, Some(_)) => return Err(expected("the agent's next turn")),
            (_, true, None) => return Err(expected("the agent's first turn")),
        }
    }
    let question = question.ok_or_else(|| FieldError::new(key, "no user turn: the task is missing"))?;
    read_labels(o, &mut steps)?;
    let mut meta = json::rest(o, &[key, "labels", "correct", "id"]);
    if extras.iter().any(|e| e.as_object().is_some_and(|o| !o.is_empty())) {
        meta.insert("turn_fields".into(), Value::Array(extras));
    }
    match system.len() {
        0 => {}
        1 => drop(meta.insert("system".into(), json!(system[0]))),
        _ => drop(meta.insert("system".into(), json!(system))),
    }
    let correct = json::opt_bool(o, "correct")?;
    Ok(Solution {
        id: json::opt_str(o, "id")?.unwrap_or_else(|| index.to_string()),
        problem_id: problem_id_for(&question),
        question,
        steps,
        correct,
        meta,
        ..Default::default()
    })
}

/// The top-level `labels`: one per agent turn, `true`/`false`/`null`.
fn read_labels(o: &Map<String, Value>, steps: &mut [Step]) -> Result<(), FieldError> {
    let Some(labels) = o.get("labels").filter(|l| !l.is_null()) else {
        return Ok(());
    };
    let labels = labels
        .as_array()
        .ok_or_else(|| FieldError::new("labels", format!("expected an array, found {}", json::kind(labels))))?;
    if labels.len() != steps.len() {
        return Err(FieldError::new(
            "labels",
            format!("{} labels for {} agent turns", labels.len(), steps.len()),
        ));
    }
    for (i, (l, st)) in labels.iter().zip(steps.iter_mut()).enumerate() {
        st.label = match l {
            Value::Null => None,
            Value::Bool(g) => Some(StepLabel::from_bool(*g, Provenance::Unknown)),
            v => {
                return Err(FieldError::new(
                    format!("labels[{i}]"),
                    format!("expected true, false or null, found {}", json::kind(v)),
                ))
            }
        };
    }
    Ok(())
}

pub(super) fn write(layout: Layout, s: &Solution) -> Result<Value, FieldError> {
    let last = s.steps.len().saturating_sub(1);
    if let Some(i) = s.steps[..last].iter().position(|st| st.observation.is_none()) {
        return Err(FieldError::new(
            format!("steps[{i}].observation"),
            "missing: a chat trajectory alternates the agent's turns with the environment's answers \
             (write a solution without observations as trl, prm800k or stepwise)",
        ));
    }
    let mut turns = Vec::with_capacity(2 * s.steps.len() + 2);
    let system = match s.meta.get("system") {
        Some(Value::Array(a)) => a.clone(),
        Some(v @ Value::String(_)) => vec![v.clone()],
        _ => Vec::new(),
    };
    let message = |role: &str, text: &str| match layout {
        Layout::Messages => json!({"role": role, "content": text}),
        Layout::Conversations => {
            let from = match role {
                "user" => "human",
                "assistant" => "gpt",
                r => r,
            };
            json!({"from": from, "value": text})
        }
    };
    for sys in &system {
        turns.push(message("system", sys.as_str().unwrap_or_default()));
    }
    turns.push(message("user", &s.question));
    for st in &s.steps {
        turns.push(agent_turn(layout, st, &message));
        if let Some(obs) = &st.observation {
            let call_id = st
                .tool_calls
                .as_ref()
                .and_then(|c| c.get(0)?.get("id")?.as_str().map(str::to_string));
            match (layout, call_id) {
                (Layout::Messages, Some(id)) => {
                    turns.push(json!({"role": "tool", "tool_call_id": id, "content": obs}));
                }
                _ => turns.push(message("user", obs)),
            }
        }
    }
    if let Some(Value::Array(extras)) = s.meta.get("turn_fields") {
        if extras.len() == turns.len() {
            for (t, e) in turns.iter_mut().zip(extras) {
                for (k, v) in e.as_object().into_iter().flatten() {
                    t.as_object_mut().unwrap().entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
        }
    }
    let mut v = json!({ layout.key(): turns });
    if s.steps.iter().any(|st| st.label.is_some()) {
        let labels: Vec<Value> = s
            .steps
            .iter()
            .zip(binary_labels(s))
            .map(|(st, good)| st.label.as_ref().map_or(Value::Null, |_| json!(good)))
            .collect();
        v["labels"] = json!(labels);
    }
    if let Some(c) = s.correct {
        v["correct"] = json!(c);
    }
    v["id"] = json!(s.id);
    let obj = v.as_object_mut().unwrap();
    extend_with_meta(obj, s);
    obj.remove("system");
    obj.remove("turn_fields");
    Ok(v)
}

/// An agent turn: its text, and in `messages` its tool calls as they were read (the text less
/// the calls rendered at its end is the content).
fn agent_turn(layout: Layout, st: &Step, message: &dyn Fn(&str, &str) -> Value) -> Value {
    match (&st.tool_calls, layout) {
        (Some(calls), Layout::Messages) => {
            let rendered = render_calls(calls);
            let content = st
                .text
                .strip_suffix(rendered.as_str())
                .map(|c| c.strip_suffix('\n').unwrap_or(c))
                .unwrap_or(&st.text);
            let content = if content.is_empty() {
                Value::Null
            } else {
                json!(content)
            };
            json!({"role": "assistant", "content": content, "tool_calls": calls})
        }
        _ => message("assistant", &st.text),
    }
}
