//! A pretrained-size policy held in bf16 samples on the packed engine's CPU backend, many
//! problems and solutions in one batch: `generate` gives each problem the samples it gets alone,
//! `annotate` labels every record and resumes, and `--dtype f32` keeps the CPU decoder.

mod common;
use common::*;
use serde_json::{json, Value};
use std::path::Path;

/// A random Qwen2 policy 512 wide (one layer), stored in bf16, with the fixture policy's
/// tokenizer: the smallest shape the CPU samples on the packed engine.
fn write_policy(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let fixture = Path::new(&fixture("qwen2-policy")).to_path_buf();
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(fixture.join(f), dir.join(f)).unwrap();
    }
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("config.json")).unwrap()).unwrap();
    let (hidden, inter, heads, kv, vocab) = (512usize, 1024usize, 8usize, 2usize, 601usize);
    for (k, v) in [
        ("hidden_size", hidden),
        ("intermediate_size", inter),
        ("num_attention_heads", heads),
        ("num_key_value_heads", kv),
        ("num_hidden_layers", 1),
    ] {
        config[k] = json!(v);
    }
    config["layer_types"] = json!(["full_attention"]);
    config["dtype"] = json!("bfloat16");
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
fn write_bf16_safetensors(path: &Path, tensors: &[(String, Vec<usize>, f32)]) {
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
            json!({"dtype": "BF16", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut head = Value::Object(header).to_string().into_bytes();
    head.resize(head.len().next_multiple_of(8), b' ');
    let mut file = (head.len() as u64).to_le_bytes().to_vec();
    file.extend(head);
    file.extend(data);
    std::fs::write(path, file).unwrap();
}

fn lines(path: &Path) -> Vec<Value> {
    (std::fs::read_to_string(path).unwrap().lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_pretrained_bf16_policy_samples_and_annotates_in_batches_on_the_packed_engine() {
    let dir_tmp = tmp("packed-sampling", "run");
    let dir = dir_tmp.path();
    let _ = std::fs::remove_dir_all(dir);
    let policy = dir.join("policy");
    write_policy(&policy);
    let policy = policy.to_str().unwrap();
    let questions = [
        "What is 2 + 3?",
        "Name a prime.",
        "Count to four.",
        "What is 7 - 5?",
        "Say done.",
    ];
    let problems: Vec<Value> = (questions.iter().enumerate())
        .map(|(i, q)| json!({"id": format!("p{i}"), "question": q, "answer": "5"}))
        .collect();
    let input = dir.join("problems.jsonl");
    write_jsonl(&input, &problems);
    let generate = |input: &Path, output: &Path, extra: &[&str]| {
        let (input, output) = (input.to_str().unwrap(), output.to_str().unwrap());
        let mut args = vec!["generate", "--model", policy, "--input", input, "--output", output];
        args.extend(["-n", "2", "--max-tokens", "6", "--temperature", "1", "--device", "cpu"]);
        args.extend(extra);
        String::from_utf8_lossy(&stepwise(&args).stderr).into_owned()
    };
    let all = dir.join("all.jsonl");
    let err = generate(&input, &all, &[]);
    assert!(err.contains(&format!("{policy}: cpu (packed engine)")), "{err}");
    let samples = lines(&all);
    let ids: Vec<&str> = samples.iter().map(|s| s["id"].as_str().unwrap()).collect();
    let want: Vec<String> = (0..5).flat_map(|i| [format!("p{i}-0"), format!("p{i}-1")]).collect();
    assert_eq!(ids, want);
    // Each problem alone draws the samples it drew in the batch.
    for (i, p) in problems.iter().enumerate() {
        let (one, out) = (dir.join(format!("one{i}.jsonl")), dir.join(format!("out{i}.jsonl")));
        write_jsonl(&one, std::slice::from_ref(p));
        generate(&one, &out, &[]);
        for (alone, together) in lines(&out).iter().zip(&samples[2 * i..2 * i + 2]) {
            assert_eq!((&alone["id"], &alone["steps"]), (&together["id"], &together["steps"]));
        }
    }
    // f32 weights keep the CPU decoder.
    let err = generate(&input, &dir.join("f32.jsonl"), &["--dtype", "f32"]);
    assert!(err.contains(&format!("{policy}: cpu\n")), "{err}");
    // Monte Carlo labels for every record (three steps each, wrong), resumed to the same file
    // after a cut.
    let solutions: Vec<Value> = (0..6)
        .map(|i| {
            let steps: Vec<Value> = ["First, 2 + 3.", "That is 6.", "The answer is 6."]
                .iter()
                .map(|t| json!({"text": t}))
                .collect();
            json!({"id": format!("s{i}"), "question": questions[i % 5], "steps": steps, "gold_answer": "5"})
        })
        .collect();
    let input = dir.join("solutions.jsonl");
    write_jsonl(&input, &solutions);
    let labelled = dir.join("labelled.jsonl");
    let annotate = || {
        let (input, labelled) = (input.to_str().unwrap(), labelled.to_str().unwrap());
        stepwise(&[
            "annotate",
            "--policy",
            policy,
            "--input",
            input,
            "--output",
            labelled,
            "--rollouts",
            "3",
            "--max-tokens",
            "4",
            "--device",
            "cpu",
        ]);
    };
    annotate();
    let text = std::fs::read_to_string(&labelled).unwrap();
    let records = lines(&labelled);
    assert_eq!(records.len(), 6);
    for r in &records {
        let steps = r["steps"].as_array().unwrap();
        assert!(steps.iter().all(|s| s["label"].is_object()), "{r}");
        assert!(r["meta"]["rollouts"].as_u64().unwrap() >= 3, "{r}");
    }
    let cut: String = text.lines().take(2).map(|l| format!("{l}\n")).collect();
    std::fs::write(&labelled, cut).unwrap();
    annotate();
    assert_eq!(std::fs::read_to_string(&labelled).unwrap(), text);
    let _ = std::fs::remove_dir_all(dir);
}
