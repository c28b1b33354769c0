//! Helpers shared by the CLI's integration tests (each test file uses some of them).
#![allow(dead_code)]

pub mod server;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Run `stepwise` with `args` and insist that it succeeds.
pub fn stepwise(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stepwise {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Run `stepwise` with `args`, insist that it fails, and return what it said on stderr.
pub fn refused<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(args: &[S]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args(args)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "stepwise {args:?} succeeded: {said}");
    said
}

/// A scored step with its label, as the readers take it.
pub fn step(text: &str, score: f32, good: bool) -> Value {
    serde_json::json!({"text": text, "score": score, "label": {"rating": if good {"good"} else {"bad"}}})
}

/// A fresh, empty scratch folder for test `name` of the test file `file`, removed when it is
/// dropped (the test passed or failed).
pub fn tmp(file: &str, name: &str) -> tempfile::TempDir {
    tempfile::TempDir::with_prefix(format!("stepwise-{file}-{name}-")).unwrap()
}

/// The folder of the fixture checkpoint `name` (the repository's `fixtures/hf-tiny/NAME`).
pub fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/hf-tiny")
        .join(name)
        .display()
        .to_string()
}

/// Write `rows` as JSONL.
pub fn write_jsonl(p: &Path, rows: &[Value]) {
    std::fs::write(p, rows.iter().map(|r| format!("{r}\n")).collect::<String>()).unwrap();
}

/// Verifier `name`'s step scores (`scores.NAME`) of a stepwise JSONL file's solutions, in order.
pub fn step_scores(jsonl: &str, name: &str) -> Vec<f64> {
    jsonl
        .lines()
        .flat_map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            v["scores"][name]
                .as_array()
                .unwrap_or_else(|| panic!("no `scores.{name}` in {line}"))
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A JSONL file's records without the fields that name where they came from or how long they
/// took (`generator`, `meta.compute`), in the file's order.
pub fn records_without_timing(p: &Path) -> Vec<Value> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().remove("generator");
            if let Some(meta) = v.get_mut("meta").and_then(Value::as_object_mut) {
                meta.remove("compute");
            }
            v
        })
        .collect()
}

/// A safetensors file of f32 tensors, written by hand (the format: the header's length, the
/// JSON header, the data).
pub fn safetensors_bytes(tensors: &[(&str, Vec<usize>, Vec<f32>)]) -> Vec<u8> {
    let (mut header, mut data) = (serde_json::Map::new(), Vec::new());
    for (name, shape, values) in tensors {
        let start = data.len();
        data.extend(values.iter().flat_map(|x| x.to_le_bytes()));
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut header = serde_json::Value::Object(header).to_string().into_bytes();
    header.resize(header.len().div_ceil(8) * 8, b' ');
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header);
    out.extend(data);
    out
}
