//! RLHFlow chat layout (e.g. RLHFlow/Mistral-PRM-Data): `conversations` alternating user turns
//! (the first holds the question and step 1, each later one a step) and assistant turns `+`/`-`.

use super::{binary_labels, extend_with_meta, needs_question_field, problem_id_for, split_first};
use crate::error::FieldError;
use crate::json::{self, object};
use crate::record::{Provenance, Solution, Step, StepLabel};
use serde_json::{json, Value};

pub(super) fn read(v: &Value, index: usize) -> Result<Solution, FieldError> {
    let o = object(v, "")?;
    let key = if o.contains_key("conversations") {
        "conversations"
    } else {
        "messages"
    };
    let turns = json::array_field(o, key)?;
    if turns.len() % 2 != 0 {
        return Err(FieldError::new(
            key,
            format!("expected user/assistant pairs, found {} turns", turns.len()),
        ));
    }
    let mut question = String::new();
    let mut steps = Vec::with_capacity(turns.len() / 2);
    for (i, pair) in turns.chunks(2).enumerate() {
        let turn = |j: usize, role: &str| -> Result<String, FieldError> {
            let at = format!("{key}[{}]", 2 * i + j);
            let t = object(&pair[j], &at)?;
            let r = json::str_field(t, "role").map_err(|e| e.within(&at))?;
            if r != role {
                return Err(FieldError::new(
                    format!("{at}.role"),
                    format!("expected `{role}`, found `{r}`"),
                ));
            }
            Ok(json::str_field(t, "content").map_err(|e| e.within(&at))?.to_string())
        };
        let mut text = turn(0, "user")?;
        if i == 0 {
            let (q, first) = split_first(o, &text)?;
            question = q;
            text = first;
        }
        let good = match turn(1, "assistant")?.trim() {
            "+" => true,
            "-" => false,
            other => {
                return Err(FieldError::new(
                    format!("{key}[{}].content", 2 * i + 1),
                    format!("expected `+` or `-`, found {other:?}"),
                ))
            }
        };
        steps.push(Step::labelled(text, StepLabel::from_bool(good, Provenance::Unknown)));
    }
    Ok(Solution {
        id: json::opt_str(o, "id")?.unwrap_or_else(|| index.to_string()),
        problem_id: problem_id_for(&question),
        question,
        steps,
        meta: json::rest(o, &[key, "question"]),
        ..Default::default()
    })
}

pub(super) fn write(s: &Solution) -> Value {
    let mut turns = Vec::with_capacity(2 * s.steps.len());
    for (i, (st, good)) in s.steps.iter().zip(binary_labels(s)).enumerate() {
        let content = if i == 0 && !s.question.is_empty() {
            format!("{} {}", s.question, st.text)
        } else {
            st.text.clone()
        };
        turns.push(json!({"role": "user", "content": content}));
        turns.push(json!({"role": "assistant", "content": if good { "+" } else { "-" }}));
    }
    let mut v = json!({ "conversations": turns });
    if needs_question_field(s) {
        v["question"] = json!(s.question);
    }
    extend_with_meta(v.as_object_mut().unwrap(), s);
    v
}
