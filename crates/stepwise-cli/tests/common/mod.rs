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

/// A random Qwen2 policy 512 wide (one layer), stored in bf16, with the fixture policy's
/// tokenizer: the smallest shape the CPU samples on the packed engine.
pub fn write_packed_policy(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let fixture = Path::new(&fixture("qwen2-policy")).to_path_buf();
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(fixture.join(f), dir.join(f)).unwrap();
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("config.json")).unwrap()).unwrap();
    let (hidden, inter, heads, kv, vocab) = (512usize, 1024usize, 8usize, 2usize, 601usize);
    for (k, v) in [
        ("hidden_size", hidden),
        ("intermediate_size", inter),
        ("num_attention_heads", heads),
        ("num_key_value_heads", kv),
        ("num_hidden_layers", 1),
    ] {
        config[k] = serde_json::json!(v);
    }
    config["layer_types"] = serde_json::json!(["full_attention"]);
    config["dtype"] = serde_json::json!("bfloat16");
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let kv_dim = kv * hidden / heads;
    let p = "model.layers.0.";
    let tensors: Vec<(String, Vec<usize>, f32)> = [
        ("model.embed_tokens.weight".to_string(), vec![vocab, hidden], 0.5),
        ("model.norm.weight".into(), vec![hidden], 0.0),
        (format!("{p}input_layernorm.weight"), vec![hidden], 0.0),
        (format!("{p}post_attention_layernorm.weight"), vec![hidden], 0.0),
        (format!("{p}self_attn.q_proj.weight"), vec![hidden, hidden], 0.05),
        (format!("{p}self_attn.q_proj.bias"), vec![hidden], 0.05),
        (format!("{p}self_attn.k_proj.weight"), vec![kv_dim, hidden], 0.05),
        (format!("{p}self_attn.k_proj.bias"), vec![kv_dim], 0.05),
        (format!("{p}self_attn.v_proj.weight"), vec![kv_dim, hidden], 0.05),
        (format!("{p}self_attn.v_proj.bias"), vec![kv_dim], 0.05),
        (format!("{p}self_attn.o_proj.weight"), vec![hidden, hidden], 0.05),
        (format!("{p}mlp.gate_proj.weight"), vec![inter, hidden], 0.05),
        (format!("{p}mlp.up_proj.weight"), vec![inter, hidden], 0.05),
        (format!("{p}mlp.down_proj.weight"), vec![hidden, inter], 0.05),
    ]
    .into_iter()
    .collect();
    write_bf16_safetensors(&dir.join("model.safetensors"), &tensors);
}

/// A safetensors file of bf16 tensors `(name, shape, scale)`: pseudo-random values in
/// [-scale, scale), or all ones where the scale is 0 (a norm's weight).
pub fn write_bf16_safetensors(path: &Path, tensors: &[(String, Vec<usize>, f32)]) {
    let (mut header, mut data) = (serde_json::Map::new(), Vec::<u8>::new());
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for (name, shape, scale) in tensors {
        let start = data.len();
        for _ in 0..shape.iter().product::<usize>() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let x = match scale {
                0.0 => 1.0f32,
                s => ((state >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * s,
            };
            data.extend_from_slice(&((x.to_bits() >> 16) as u16).to_le_bytes());
        }
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut head = serde_json::Value::Object(header).to_string().into_bytes();
    head.resize(head.len().next_multiple_of(8), b' ');
    let mut file = (head.len() as u64).to_le_bytes().to_vec();
    file.extend(head);
    file.extend(data);
    std::fs::write(path, file).unwrap();
}
