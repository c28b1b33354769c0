//! A fuzzer over `config.json`: every field of every fixture checkpoint set to values that are
//! wrong, odd or extreme. Loading and scoring either work or fail with an error naming what is
//! wrong; nothing panics, and nothing is sized by a value before it is checked (sizes such as
//! 1e9, which pass as numbers, once allocated gigabytes and aborted).

use candle_core::{Device, Tensor};
use serde_json::{json, Value};
use stepwise_model::Model;

mod common;
use common::fixtures;

/// What a field is set to.
fn mutations() -> Vec<Value> {
    vec![
        json!(0),
        json!(1),
        json!(2),
        json!(3),
        json!(-1),
        json!(100_000),
        json!(1_000_000_000),
        json!(1e12),
        json!(0.5),
        json!(f64::MAX),
        json!("x"),
        json!(null),
        json!(true),
        json!([]),
        json!({}),
    ]
}

/// Load the fixture `name` with `config`, then run a short input through it.
fn load_and_run(name: &str, config: &Value, dir: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    for f in ["model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        let link = dir.join(f);
        if !link.exists() {
            std::os::unix::fs::symlink(fixtures().join(name).join(f), link)?;
        }
    }
    std::fs::write(dir.join("config.json"), config.to_string())?;
    let model = Model::load(dir, &Device::Cpu)?;
    let ids = Tensor::new(&[[1u32, 2, 3, 4]], &Device::Cpu)?;
    model.forward(&ids, None)?;
    Ok(())
}

#[test]
fn no_config_value_makes_loading_or_scoring_panic() {
    let root_tmp = tempfile::tempdir().unwrap();
    let root = root_tmp.path().join("stepwise-config-fuzz");
    let mut tried = 0;
    let mut rejected = 0;
    for name in ["qwen2-prm", "llama-shepherd", "qwen2-tokcls", "qwen2-policy"] {
        let original: Value =
            serde_json::from_str(&std::fs::read_to_string(fixtures().join(name).join("config.json")).unwrap()).unwrap();
        let fields: Vec<String> = original.as_object().unwrap().keys().cloned().collect();
        for field in &fields {
            for value in mutations() {
                let mut config = original.clone();
                config[field.as_str()] = value.clone();
                let dir = root.join(format!("{name}-{tried}"));
                let outcome = std::panic::catch_unwind(|| load_and_run(name, &config, &dir));
                match outcome {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        rejected += 1;
                        let msg = format!("{e:#}");
                        assert!(!msg.is_empty(), "{name}: {field} = {value}: an empty error");
                    }
                    Err(_) => panic!("{name}: field `{field}` = {value} panicked"),
                }
                let _ = std::fs::remove_dir_all(&dir);
                tried += 1;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&root);
    assert!(
        tried > 300 && rejected > 50,
        "{tried} configs tried, {rejected} rejected"
    );
}

/// The values no decoder can have are rejected with the field named.
#[test]
fn impossible_sizes_name_their_field() {
    let original: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("qwen2-policy").join("config.json")).unwrap())
            .unwrap();
    for (field, value) in [
        ("num_attention_heads", json!(0)),
        ("num_key_value_heads", json!(3)),
        ("hidden_size", json!(0)),
        ("num_hidden_layers", json!(0)),
        ("rms_norm_eps", json!(-1.0)),
        ("vocab_size", json!(0)),
        ("eos_token_id", json!(1_000_000)),
    ] {
        let mut config = original.clone();
        config[field] = value.clone();
        let err = stepwise_model::ModelConfig::from_json(&config).unwrap_err();
        assert!(format!("{err:#}").contains(field), "{field} = {value}: {err:#}");
    }
}

/// A sequence classifier (an ORM) made from a checkpoint without a padding id gets one, so that
/// transformers can batch it; its config.json says so.
#[test]
fn a_value_head_always_has_a_padding_id() {
    for name in ["qwen2-policy", "llama-shepherd"] {
        let mut v: Value =
            serde_json::from_str(&std::fs::read_to_string(fixtures().join(name).join("config.json")).unwrap()).unwrap();
        v["pad_token_id"] = Value::Null;
        let c = stepwise_model::ModelConfig::from_json(&v).unwrap().with_value_head();
        let pad = c.pad_token_id.expect("a padding id");
        assert!((pad as usize) < c.vocab_size);
        assert_eq!(c.to_hf_json()["pad_token_id"], json!(pad), "{name}");
    }
}

/// A text far longer than the model reads is refused before it is tokenized (the message is the
/// length check's; tokenizing first would fail elsewhere, after seconds).
#[test]
fn an_enormous_solution_is_refused_before_tokenizing() {
    let v = stepwise_model::scoring::LoadedVerifier::load(&fixtures().join("qwen2-prm"), "auto", &Device::Cpu).unwrap();
    let huge = "7 + 8 = 15. ".repeat(1 << 20);
    let err = v.scorer().score("q", &[huge.as_str()]).unwrap_err().to_string();
    assert!(err.contains("more than the model's"), "{err}");
}

/// A sharded checkpoint's index names files inside its folder only: `../x` or an absolute path
/// is refused naming the entry, never read.
#[test]
fn a_sharded_index_cannot_reach_outside_its_folder() {
    let root_tmp = tempfile::tempdir().unwrap();
    let root = root_tmp.path().join("stepwise-shard-index");
    for (k, shard) in ["../model.safetensors", "/etc/hostname", ""].into_iter().enumerate() {
        let dir = root.join(format!("m{k}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(fixtures().join("qwen2-prm/config.json"), dir.join("config.json")).unwrap();
        let index = json!({"metadata": {}, "weight_map": {"model.embed_tokens.weight": shard}});
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
        let err = format!("{:#}", Model::load(&dir, &Device::Cpu).unwrap_err());
        assert!(err.contains("outside the model folder"), "{shard}: {err}");
    }
    let _ = std::fs::remove_dir_all(&root);
}
