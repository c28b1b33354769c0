//! Small helpers to pull typed fields out of `serde_json::Value`s with errors that name the field.

use crate::error::FieldError;
use serde_json::{Map, Value};

/// The object at the top of a record.
pub fn object<'a>(v: &'a Value, field: &str) -> Result<&'a Map<String, Value>, FieldError> {
    v.as_object()
        .ok_or_else(|| FieldError::new(field, format!("expected an object, found {}", kind(v))))
}

/// A required field.
pub fn field<'a>(obj: &'a Map<String, Value>, name: &str) -> Result<&'a Value, FieldError> {
    obj.get(name).ok_or_else(|| FieldError::new(name, "missing"))
}

/// A required string field.
pub fn str_field<'a>(obj: &'a Map<String, Value>, name: &str) -> Result<&'a str, FieldError> {
    let v = field(obj, name)?;
    v.as_str()
        .ok_or_else(|| FieldError::new(name, format!("expected a string, found {}", kind(v))))
}

/// An optional string field (missing or null gives `None`).
pub fn opt_str(obj: &Map<String, Value>, name: &str) -> Result<Option<String>, FieldError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(v) => Err(FieldError::new(name, format!("expected a string, found {}", kind(v)))),
    }
}

/// An optional boolean field (missing or null gives `None`).
pub fn opt_bool(obj: &Map<String, Value>, name: &str) -> Result<Option<bool>, FieldError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(FieldError::new(name, format!("expected a boolean, found {}", kind(v)))),
    }
}

/// A required array field.
pub fn array_field<'a>(obj: &'a Map<String, Value>, name: &str) -> Result<&'a [Value], FieldError> {
    let v = field(obj, name)?;
    v.as_array()
        .map(|a| a.as_slice())
        .ok_or_else(|| FieldError::new(name, format!("expected an array, found {}", kind(v))))
}

/// A required array of strings.
pub fn str_array(obj: &Map<String, Value>, name: &str) -> Result<Vec<String>, FieldError> {
    array_field(obj, name)?
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| FieldError::new(format!("{name}[{i}]"), format!("expected a string, found {}", kind(v))))
        })
        .collect()
}

/// A required number field.
pub fn f64_field(obj: &Map<String, Value>, name: &str) -> Result<f64, FieldError> {
    let v = field(obj, name)?;
    v.as_f64()
        .ok_or_else(|| FieldError::new(name, format!("expected a number, found {}", kind(v))))
}

/// A required probability: a number in [0, 1].
pub fn probability_field(obj: &Map<String, Value>, name: &str) -> Result<f64, FieldError> {
    let p = f64_field(obj, name)?;
    if !(0.0..=1.0).contains(&p) {
        return Err(FieldError::new(name, format!("must lie in [0, 1], found {p}")));
    }
    Ok(p)
}

/// A required integer field.
pub fn i64_field(obj: &Map<String, Value>, name: &str) -> Result<i64, FieldError> {
    let v = field(obj, name)?;
    v.as_i64()
        .ok_or_else(|| FieldError::new(name, format!("expected an integer, found {}", kind(v))))
}

/// A short description of a value's JSON type, for error messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Copy every key of `obj` not in `known` into a new map (to keep unknown fields in `meta`).
pub fn rest(obj: &Map<String, Value>, known: &[&str]) -> Map<String, Value> {
    obj.iter()
        .filter(|(k, _)| !known.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}
