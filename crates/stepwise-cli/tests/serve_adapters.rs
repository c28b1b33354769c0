//! `stepwise serve --lora-modules NAME=ADAPTER …`: adapters served unmerged on one policy
//! (vLLM's multi-LoRA serving). A request naming an adapter is answered as a server of that
//! adapter merged answers it, with requests of the base and of the other adapter decoded in the
//! same batch; `/v1/models` lists the adapters with their parent; a name nobody serves is a 404
//! that lists the names served.

mod common;

use common::fixture;
use common::server::{get, post, spawn_until};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A rank-`r` causal-LM adapter of the fixture policy on q, v and down of both layers.
fn write_adapter(dir: &Path, r: usize, seed: u32) {
    let values = |n: usize, seed: u32| -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2654435761) ^ seed) % 1000)
            .map(|x| (x as f32 / 500.0 - 1.0) * 0.3)
            .collect()
    };
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for layer in 0..2 {
        for (k, (m, out, inp)) in [
            ("self_attn.q_proj", 64, 64),
            ("self_attn.v_proj", 32, 64),
            ("mlp.down_proj", 64, 160),
        ]
        .into_iter()
        .enumerate()
        {
            let at = format!("base_model.model.model.layers.{layer}.{m}");
            let s = seed + 10 * (layer * 3 + k) as u32;
            tensors.push((format!("{at}.lora_A.weight"), vec![r, inp], values(r * inp, s)));
            tensors.push((format!("{at}.lora_B.weight"), vec![out, r], values(out * r, s + 5)));
        }
    }
    std::fs::create_dir_all(dir).unwrap();
    let config = json!({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": 2 * r,
        "base_model_name_or_path": fixture("qwen2-policy"), "target_modules": ["q_proj", "v_proj", "down_proj"]});
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).unwrap();
    let refs: Vec<(&str, Vec<usize>, Vec<f32>)> = tensors
        .iter()
        .map(|t| (t.0.as_str(), t.1.clone(), t.2.clone()))
        .collect();
    std::fs::write(dir.join("adapter_model.safetensors"), common::safetensors_bytes(&refs)).unwrap();
}

/// `stepwise serve ARGS` on a free port (merged models cached under `cache`).
struct Served(Child, String);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(args: &[&str], cache: &Path) -> Served {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stepwise"));
    cmd.arg("serve")
        .args(args)
        .args(["--port", "0"])
        .env("STEPWISE_CACHE", cache)
        .stdout(Stdio::null());
    let (child, url) = spawn_until(cmd, "stepwise serve: listening on ");
    Served(child, url)
}

/// A sampled completion request with log-probabilities.
fn request(model: &str) -> Value {
    json!({"model": model, "prompt": "12 + 30 = 42. 7 * 6 =", "max_tokens": 10, "n": 2,
           "temperature": 0.9, "seed": 11, "logprobs": 2})
}

/// Each choice's text and token log-probabilities.
fn choices(reply: &Value) -> Vec<(String, Vec<f64>)> {
    let list = reply["choices"].as_array().unwrap_or_else(|| panic!("{reply}"));
    list.iter()
        .map(|c| {
            let lp = c["logprobs"]["token_logprobs"].as_array().unwrap();
            (
                c["text"].as_str().unwrap().to_string(),
                lp.iter().map(|x| x.as_f64().unwrap()).collect(),
            )
        })
        .collect()
}

#[test]
fn adapters_served_unmerged_answer_as_their_merged_models_side_by_side() {
    let tmp = common::tmp("serve_adapters", "side_by_side");
    let (a, b, cache) = (
        tmp.path().join("math-lora"),
        tmp.path().join("code-lora"),
        tmp.path().join("cache"),
    );
    write_adapter(&a, 4, 1);
    write_adapter(&b, 2, 7);
    let (a_arg, b_arg) = (format!("math={}", a.display()), format!("code={}", b.display()));
    let policy = fixture("qwen2-policy");
    let multi = serve(&["--model", &policy, "--lora-modules", &a_arg, &b_arg], &cache);
    let (_, body) = get(&multi.1, "/v1/models");
    let models: Value = serde_json::from_str(&body).unwrap();
    let data = models["data"].as_array().unwrap();
    let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["qwen2-policy", "math", "code"]);
    assert_eq!(data[1]["parent"], "qwen2-policy");
    assert_eq!(data[2]["root"], b.display().to_string());
    // The three models' requests at once, so that they share the decoding batch.
    let names = ["qwen2-policy", "math", "code"];
    let replies: Vec<Value> = std::thread::scope(|s| {
        let url = &multi.1;
        let asks: Vec<_> = names
            .iter()
            .map(|m| s.spawn(move || post(url, "/v1/completions", &request(m))))
            .collect();
        asks.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Each against a server of that model alone (an adapter given as --model is merged).
    for ((name, reply), alone) in
        names
            .iter()
            .zip(&replies)
            .zip([policy.as_str(), a.to_str().unwrap(), b.to_str().unwrap()])
    {
        assert_eq!(reply["model"], *name);
        let single = serve(&["--model", alone], &cache);
        let own_name = if *name == "qwen2-policy" {
            "qwen2-policy"
        } else {
            Path::new(alone).file_name().unwrap().to_str().unwrap()
        };
        let want = post(&single.1, "/v1/completions", &request(own_name));
        let (got, want) = (choices(reply), choices(&want));
        assert_eq!(got.len(), 2);
        for ((gt, gl), (wt, wl)) in got.iter().zip(&want) {
            assert_eq!(gt, wt, "{name}");
            assert!(
                gl.iter().zip(wl).all(|(g, w)| (g - w).abs() < 1e-3),
                "{name}: {gl:?} against {wl:?}"
            );
        }
    }
    assert_ne!(
        choices(&replies[1]),
        choices(&replies[2]),
        "the two adapters answer differently"
    );
    assert_ne!(choices(&replies[0]), choices(&replies[1]), "an adapter moves the base");
    // The adapters' names are models for /tokenize too; another name is a 404 listing them.
    let tokens = post(&multi.1, "/tokenize", &json!({"model": "code", "prompt": "1 + 1"}));
    assert!(tokens["count"].as_u64().unwrap() > 0, "{tokens}");
    let missing = post(&multi.1, "/v1/completions", &request("physics"));
    let said = missing["error"]["message"].as_str().unwrap();
    assert!(
        said.contains("physics") && said.contains("math") && said.contains("code"),
        "{said}"
    );
}

#[test]
fn lora_modules_that_cannot_be_served_are_refused_at_start() {
    let tmp = common::tmp("serve_adapters", "refused");
    let a = tmp.path().join("a");
    write_adapter(&a, 2, 3);
    let policy = fixture("qwen2-policy");
    let a_arg = format!("a={}", a.display());
    let saved = format!("qwen2-policy={}", a.display());
    let not_adapter = format!("x={policy}");
    for (args, says) in [
        (vec!["--model", &policy, "--lora-modules", "nonsense"], "NAME=ADAPTER"),
        (
            vec!["--model", &policy, "--lora-modules", &not_adapter],
            "not a PEFT adapter",
        ),
        (
            vec!["--model", &policy, "--lora-modules", &a_arg, &a_arg],
            "two adapters are named `a`",
        ),
        (
            vec!["--model", &policy, "--lora-modules", &saved],
            "the policy's own name",
        ),
        (
            vec!["--prm", &fixture("qwen2-prm"), "--lora-modules", &a_arg],
            "pass --model",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_stepwise"))
            .arg("serve")
            .args(&args)
            .args(["--port", "0"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
