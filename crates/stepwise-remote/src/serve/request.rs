//! Reading a request's JSON fields strictly: a field of the wrong type is a 400 naming it, never
//! silently its default, and a feature this server does not have (tools, structured output,
//! penalties) is refused by name instead of being ignored.

use super::ApiError;
use axum::body::Bytes;
use serde_json::Value;

/// The body as a JSON object (a UTF-8 byte-order mark before it is allowed, as Python's and
/// Node's clients never send one but some tools do).
pub(crate) fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    let text = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    let v: Value =
        serde_json::from_slice(text).map_err(|e| ApiError::invalid(format!("the body is not JSON: {e}"), None))?;
    if !v.is_object() {
        return Err(ApiError::invalid("the body must be a JSON object", None));
    }
    Ok(v)
}

/// `model`, when given: a string.
pub(crate) fn model_field(v: &Value) -> Result<Option<&str>, ApiError> {
    match v.get("model") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(m)) => Ok(Some(m)),
        Some(other) => Err(ApiError::invalid(
            format!("`model` must be a string, not {other}"),
            Some("model"),
        )),
    }
}

/// A true/false field (`default` when absent or null).
pub(crate) fn flag(v: &Value, key: &'static str, default: bool) -> Result<bool, ApiError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ApiError::invalid(
            format!("`{key}` must be true or false, not {other}"),
            Some(key),
        )),
    }
}

/// A number field in `[lo, hi]` (`default` when absent or null).
pub(crate) fn number(v: &Value, key: &'static str, default: f64, lo: f64, hi: f64) -> Result<f64, ApiError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(x) => match x.as_f64() {
            Some(f) if f.is_finite() && (lo..=hi).contains(&f) => Ok(f),
            _ => Err(ApiError::invalid(
                format!("`{key}` must be a number in [{lo}, {hi}], not {x}"),
                Some(key),
            )),
        },
    }
}

/// A whole-number field in `[lo, hi]` (`default` when absent or null).
pub(crate) fn whole(v: &Value, key: &'static str, default: usize, lo: usize, hi: usize) -> Result<usize, ApiError> {
    let x = number(v, key, default as f64, lo as f64, hi as f64)?;
    if x.fract() != 0.0 {
        return Err(ApiError::invalid(format!("`{key}` must be a whole number"), Some(key)));
    }
    Ok(x as usize)
}

/// Fields of OpenAI's or vLLM's API this server does not implement: set to anything but their
/// neutral value, the request is refused naming the field (ignoring them would answer a
/// different question than the one asked).
const UNSUPPORTED: [(&str, &str); 15] = [
    ("tools", "tool calling"),
    ("tool_choice", "tool calling"),
    ("functions", "function calling"),
    ("function_call", "function calling"),
    ("response_format", "structured output"),
    ("guided_json", "guided decoding"),
    ("guided_regex", "guided decoding"),
    ("guided_choice", "guided decoding"),
    ("guided_grammar", "guided decoding"),
    ("structured_outputs", "structured output"),
    ("logit_bias", "logit bias"),
    ("presence_penalty", "a presence penalty"),
    ("frequency_penalty", "a frequency penalty"),
    ("repetition_penalty", "a repetition penalty"),
    ("min_p", "min-p sampling"),
];

/// Whether `key`'s value asks for nothing (absent, null, empty, zero, `none`, plain text, or a
/// repetition penalty of 1).
fn neutral(key: &str, x: &Value) -> bool {
    match x {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty() || (key == "response_format" && o.get("type") == Some(&Value::from("text"))),
        Value::String(t) => key == "tool_choice" && t == "none",
        Value::Number(n) => n.as_f64() == Some(if key == "repetition_penalty" { 1.0 } else { 0.0 }),
        Value::Bool(b) => !b,
    }
}

/// Refuse the request when it asks for something in [`UNSUPPORTED`].
pub(crate) fn refuse_unsupported(v: &Value) -> Result<(), ApiError> {
    for (key, what) in UNSUPPORTED {
        if let Some(x) = v.get(key) {
            if !neutral(key, x) {
                return Err(ApiError::invalid(
                    format!("`{key}`: stepwise serve does not support {what}; leave it out"),
                    Some(key),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wrong_types_and_unsupported_features_are_named() {
        let v = json!({"stream": "yes", "echo": 1, "model": 3, "n": 2.5, "tools": [{"type": "function"}],
                       "response_format": {"type": "text"}, "presence_penalty": 0.0, "tool_choice": "none"});
        assert_eq!(flag(&v, "stream", false).unwrap_err().param, Some("stream"));
        assert_eq!(flag(&v, "echo", false).unwrap_err().param, Some("echo"));
        assert!(flag(&v, "absent", true).unwrap());
        assert_eq!(model_field(&v).unwrap_err().param, Some("model"));
        assert_eq!(whole(&v, "n", 1, 1, 8).unwrap_err().param, Some("n"));
        assert_eq!(refuse_unsupported(&v).unwrap_err().param, Some("tools"));
        let neutral = json!({"tools": [], "response_format": {"type": "text"}, "presence_penalty": 0,
                             "repetition_penalty": 1.0, "tool_choice": "none", "logit_bias": {}});
        assert!(refuse_unsupported(&neutral).is_ok());
        let json_mode = json!({"response_format": {"type": "json_object"}});
        assert_eq!(
            refuse_unsupported(&json_mode).unwrap_err().param,
            Some("response_format")
        );
        assert!(parse_body(&Bytes::from_static(b"\xEF\xBB\xBF{\"a\": 1}")).is_ok());
        assert!(parse_body(&Bytes::from_static(b"[1]")).is_err());
    }
}
