//! Math-Shepherd (`input` with the step tag ` ки` after each step, `label` with `+`/`-` in the
//! tags' places) and OpenR's training layout of the same data (`{question, process, labels}`).

use super::{binary_labels, extend_with_meta, needs_question_field, problem_id_for, split_first};
use crate::error::FieldError;
use crate::json::{self, object};
use crate::record::{Provenance, Solution, Step, StepLabel};
use serde_json::{json, Value};

/// The step tag Math-Shepherd puts after every step.
pub const STEP_TAG: &str = "ки";

/// Key under which the exact original `input` is kept when it does not follow the canonical
/// `question + " " + "step ки\n..."` spacing.
const RAW_INPUT: &str = "_math_shepherd_input";

/// Split text containing step tags into trimmed step texts; the part before the first tag
/// includes the question when `with_question` is set. Text after the last tag must be blank.
fn split_tagged(text: &str, field: &str) -> Result<Vec<String>, FieldError> {
    let mut parts: Vec<&str> = text.split(STEP_TAG).collect();
    let tail = parts.pop().unwrap_or("");
    if !tail.trim().is_empty() {
        return Err(FieldError::new(
            field,
            format!("text after the last `{STEP_TAG}` tag: {:?}", tail.trim()),
        ));
    }
    if parts.is_empty() {
        return Err(FieldError::new(field, format!("no `{STEP_TAG}` step tag")));
    }
    Ok(parts.iter().map(|p| p.trim().to_string()).collect())
}

/// The canonical tagged text: steps each followed by ` ки`, joined by newlines.
fn tagged(steps: &[&str]) -> String {
    steps
        .iter()
        .map(|s| format!("{s} {STEP_TAG}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn canonical_input(question: &str, steps: &[&str]) -> String {
    if question.is_empty() {
        tagged(steps)
    } else {
        format!("{question} {}", tagged(steps))
    }
}

pub(super) fn read(v: &Value, index: usize) -> Result<Solution, FieldError> {
    let o = object(v, "")?;
    let input = json::str_field(o, "input")?;
    let label = json::str_field(o, "label")?;
    let mut parts = split_tagged(input, "input")?;
    let (question, first) = split_first(o, &parts[0])?;
    parts[0] = first;
    // Walk `label`: it is `input` with each tag replaced by one `+` or `-`.
    let segments: Vec<&str> = input.split(STEP_TAG).collect();
    let mut rest = label;
    let mut goods = Vec::with_capacity(parts.len());
    for (i, seg) in segments[..segments.len() - 1].iter().enumerate() {
        rest = rest
            .strip_prefix(seg)
            .ok_or_else(|| FieldError::new("label", format!("does not match `input` before step tag {}", i + 1)))?;
        let mut chars = rest.chars();
        goods.push(match chars.next() {
            Some('+') => true,
            Some('-') => false,
            other => {
                return Err(FieldError::new(
                    "label",
                    format!("expected `+` or `-` in place of step tag {}, found {other:?}", i + 1),
                ))
            }
        });
        rest = chars.as_str();
    }
    let steps: Vec<Step> = parts
        .into_iter()
        .zip(goods)
        .map(|(t, g)| Step::labelled(t, StepLabel::from_bool(g, Provenance::Unknown)))
        .collect();
    let mut meta = json::rest(o, &["input", "label", "question"]);
    let texts: Vec<&str> = steps.iter().map(|s| s.text.as_str()).collect();
    if canonical_input(&question, &texts) != input {
        meta.insert(RAW_INPUT.into(), Value::String(input.to_string()));
    }
    Ok(Solution {
        id: json::opt_str(o, "id")?.unwrap_or_else(|| index.to_string()),
        problem_id: problem_id_for(&question),
        question,
        steps,
        meta,
        ..Default::default()
    })
}

pub(super) fn write(s: &Solution) -> Value {
    let texts = s.step_texts();
    // Use the exact original input when it still holds the same steps.
    let input = match s.meta.get(RAW_INPUT).and_then(Value::as_str) {
        Some(raw)
            if split_tagged(raw, "input").is_ok_and(|p| {
                let (q, first) = split_first(&s.meta, &p[0]).unwrap_or_default();
                q == s.question && p.len() == texts.len() && first == texts[0] && p[1..] == texts[1..]
            }) =>
        {
            raw.to_string()
        }
        _ => canonical_input(&s.question, &texts),
    };
    let mut label = String::with_capacity(input.len());
    let mut goods = binary_labels(s).into_iter();
    let mut segs = input.split(STEP_TAG).peekable();
    while let Some(seg) = segs.next() {
        label.push_str(seg);
        if segs.peek().is_some() {
            label.push(if goods.next().unwrap_or(true) { '+' } else { '-' });
        }
    }
    let mut v = json!({ "input": input, "label": label });
    let o = v.as_object_mut().unwrap();
    if needs_question_field(s) {
        o.insert("question".into(), json!(s.question));
    }
    extend_with_meta(o, s);
    v
}

pub(super) fn read_openr(v: &Value, index: usize) -> Result<Solution, FieldError> {
    let o = object(v, "")?;
    let question = json::str_field(o, "question")?.to_string();
    let process = json::str_field(o, "process")?;
    let texts = split_tagged(process, "process")?;
    let labels = json::array_field(o, "labels")?;
    if labels.len() != texts.len() {
        return Err(FieldError::new(
            "labels",
            format!("has {} entries but `process` has {} steps", labels.len(), texts.len()),
        ));
    }
    let steps = texts
        .into_iter()
        .zip(labels)
        .enumerate()
        .map(|(i, (t, l))| match l.as_i64() {
            Some(v @ (0 | 1)) => Ok(Step::labelled(t, StepLabel::from_bool(v == 1, Provenance::Unknown))),
            _ => Err(FieldError::new(
                format!("labels[{i}]"),
                format!("expected 0 or 1, found {l}"),
            )),
        })
        .collect::<Result<_, _>>()?;
    Ok(Solution {
        id: json::opt_str(o, "id")?.unwrap_or_else(|| index.to_string()),
        problem_id: problem_id_for(&question),
        question,
        steps,
        meta: json::rest(o, &["question", "process", "labels"]),
        ..Default::default()
    })
}

pub(super) fn write_openr(s: &Solution) -> Value {
    let labels: Vec<u8> = binary_labels(s).into_iter().map(u8::from).collect();
    let mut v = json!({ "question": s.question, "process": tagged(&s.step_texts()), "labels": labels });
    extend_with_meta(v.as_object_mut().unwrap(), s);
    v
}
