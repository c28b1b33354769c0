//! `stepwise serve --lora-modules NAME=ADAPTER …`: adapters served unmerged on one policy
//! (vLLM's multi-LoRA serving). A request naming an adapter is answered as a server of that
//! adapter merged answers it, and as it is alone when requests of the base and of the other
//! adapter share its decoding batch; `/v1/models` lists the adapters with their parent; a name nobody serves is a 404
//! that lists the names served.

mod common;

use common::fixture;
use common::server::{get, post, spawn_until};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A rank-`r` causal-LM adapter of `policy` (hidden `h`, k/v width `kv`, MLP `inter`, `layers`
/// layers) on q, v and down.
fn write_adapter(dir: &Path, policy: &Path, (h, kv, inter, layers): (usize, usize, usize, usize), r: usize, seed: u32) {
    let values = |n: usize, seed: u32| -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2654435761) ^ seed) % 1000)
            .map(|x| (x as f32 / 500.0 - 1.0) * 0.1)
            .collect()
    };
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for layer in 0..layers {
        for (k, (m, out, inp)) in [
            ("self_attn.q_proj", h, h),
            ("self_attn.v_proj", kv, h),
            ("mlp.down_proj", h, inter),
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
        "base_model_name_or_path": policy, "target_modules": ["q_proj", "v_proj", "down_proj"]});
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

/// A sampled completion request, the sampled tokens' log-probabilities with it.
fn request(model: &str, seed: u64) -> Value {
    json!({"model": model, "prompt": "Seven times six, and then", "max_tokens": 10, "n": 2,
           "temperature": 1.5, "seed": seed, "logprobs": 0})
}

/// Each choice's text, and its tokens' log-probabilities rounded to 1e-4.
fn texts(reply: &Value) -> Vec<(String, Vec<i64>)> {
    let list = reply["choices"].as_array().unwrap_or_else(|| panic!("{reply}"));
    let rounded = |c: &Value| -> Vec<i64> {
        let lp = c["logprobs"]["token_logprobs"].as_array().unwrap();
        lp.iter().map(|x| (x.as_f64().unwrap() * 1e4).round() as i64).collect()
    };
    list.iter()
        .map(|c| (c["text"].as_str().unwrap().to_string(), rounded(c)))
        .collect()
}

/// The prompt's own token log-probabilities by `model` (`echo`, nothing generated).
fn prompt_logprobs(url: &str, model: &str) -> Vec<f64> {
    let ask = json!({"model": model, "prompt": "What is 12 + 30? It is 42, and 7 * 6 is 42 too.",
                     "max_tokens": 0, "echo": true, "logprobs": 1});
    let reply = post(url, "/v1/completions", &ask);
    let lp = reply["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap_or_else(|| panic!("{reply}"));
    lp.iter().skip(1).map(|x| x.as_f64().unwrap()).collect()
}

fn mean_gap(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f64>() / a.len() as f64
}

/// A pretrained-size bf16 policy (the packed engine's CPU backend) serving two adapters: each
/// request is answered with its adapter's log-probabilities (those of a server of that adapter
/// merged, within the merged weights' bf16 rounding), requests of the three models asked at once
/// get what each gets alone, and `/v1/models` lists the adapters with their parent.
#[test]
fn adapters_served_unmerged_answer_as_their_merged_models_side_by_side() {
    let tmp = common::tmp("serve_adapters", "side_by_side");
    let (policy, cache) = (tmp.path().join("policy"), tmp.path().join("cache"));
    common::write_packed_policy(&policy);
    let (a, b) = (tmp.path().join("math-lora"), tmp.path().join("code-lora"));
    write_adapter(&a, &policy, (512, 128, 1024, 1), 4, 1);
    write_adapter(&b, &policy, (512, 128, 1024, 1), 2, 7);
    let (a_arg, b_arg) = (format!("math={}", a.display()), format!("code={}", b.display()));
    let multi = serve(
        &["--model", policy.to_str().unwrap(), "--lora-modules", &a_arg, &b_arg],
        &cache,
    );
    let (_, body) = get(&multi.1, "/v1/models");
    let models: Value = serde_json::from_str(&body).unwrap();
    let data = models["data"].as_array().unwrap();
    let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["policy", "math", "code"]);
    assert_eq!(data[1]["parent"], "policy");
    assert_eq!(data[2]["root"], b.display().to_string());
    // Each adapter's log-probabilities are its merged model's, and far from the base's.
    let base = prompt_logprobs(&multi.1, "policy");
    for (name, dir) in [("math", &a), ("code", &b)] {
        let served = prompt_logprobs(&multi.1, name);
        let merged = serve(&["--model", dir.to_str().unwrap()], &cache);
        let alone = prompt_logprobs(&merged.1, dir.file_name().unwrap().to_str().unwrap());
        let (apart, moved) = (mean_gap(&served, &alone), mean_gap(&alone, &base));
        assert!(
            moved > 0.05 && apart < 0.1 * moved,
            "{name}: {apart} from its merged model, which is {moved} from the base"
        );
    }
    // The three models' requests at once (they share the decoding batch) answer as each alone
    // (this random policy mostly repeats itself whatever the adapter: the side-by-side decoding
    // of distinct samples is tested on the fixture in crates/stepwise-model/tests/adapters.rs).
    let names = ["policy", "math", "code"];
    let alone: Vec<Vec<(String, Vec<i64>)>> = names
        .iter()
        .map(|m| texts(&post(&multi.1, "/v1/completions", &request(m, 5))))
        .collect();
    let together: Vec<Value> = std::thread::scope(|s| {
        let url = &multi.1;
        let asks: Vec<_> = names
            .iter()
            .map(|m| s.spawn(move || post(url, "/v1/completions", &request(m, 5))))
            .collect();
        asks.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((name, reply), want) in names.iter().zip(&together).zip(&alone) {
        assert_eq!(reply["model"], *name);
        assert_eq!(&texts(reply), want, "{name}");
    }
    // The adapters' names are models for /tokenize too; another name is a 404 listing them.
    let tokens = post(&multi.1, "/tokenize", &json!({"model": "code", "prompt": "1 + 1"}));
    assert!(tokens["count"].as_u64().unwrap() > 0, "{tokens}");
    let missing = post(&multi.1, "/v1/completions", &request("physics", 1));
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
    let policy = fixture("qwen2-policy");
    write_adapter(&a, Path::new(&policy), (64, 32, 160, 2), 2, 3);
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

/// `(status line, body)` of POST `path` with `body` (and `headers`, each ending in `\r\n`).
fn ask(url: &str, path: &str, headers: &str, body: &Value) -> (String, String) {
    common::server::exchange(url, &common::server::post_request(path, headers, &body.to_string()))
}

/// `--allow-runtime-lora-updating`: adapters loaded into a running server (vLLM's
/// `/v1/load_lora_adapter`) answer as those served from the start, a load in place swaps the
/// weights, an unloaded adapter is a 404 for new requests while a request decoding with it runs
/// to its end, and every refusal is vLLM's status with a message naming the field.
#[test]
fn adapters_load_and_unload_on_a_running_server() {
    let tmp = common::tmp("serve_adapters", "runtime");
    let (policy, cache) = (tmp.path().join("policy"), tmp.path().join("cache"));
    common::write_packed_policy(&policy);
    // Room for a request long enough to be unloaded under.
    let config = policy.join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    c["max_position_embeddings"] = json!(4096);
    std::fs::write(&config, c.to_string()).unwrap();
    let (a, b) = (tmp.path().join("math-lora"), tmp.path().join("code-lora"));
    write_adapter(&a, &policy, (512, 128, 1024, 1), 4, 1);
    write_adapter(&b, &policy, (512, 128, 1024, 1), 2, 7);
    let (a_arg, b_arg) = (format!("math={}", a.display()), format!("code={}", b.display()));
    let p = policy.to_str().unwrap();
    let fixed = serve(&["--model", p, "--lora-modules", &a_arg, &b_arg], &cache);
    let live = serve(&["--model", p, "--allow-runtime-lora-updating"], &cache);
    let url = &live.1;
    let load = |name: &str, dir: &Path, inplace: bool| {
        let body = json!({"lora_name": name, "lora_path": dir, "load_inplace": inplace});
        ask(url, "/v1/load_lora_adapter", "", &body)
    };
    let (status, said) = load("x", &a, false);
    assert!(
        status.contains(" 200 ") && said == "Success: LoRA adapter 'x' added successfully.",
        "{status} {said}"
    );
    assert_eq!(prompt_logprobs(url, "x"), prompt_logprobs(&fixed.1, "math"));
    let (status, said) = load("x", &b, false);
    assert!(
        status.contains(" 400 ") && said.contains("load_inplace"),
        "{status} {said}"
    );
    let (status, _) = load("x", &b, true);
    assert!(status.contains(" 200 "), "{status}");
    assert_eq!(prompt_logprobs(url, "x"), prompt_logprobs(&fixed.1, "code"));
    let (_, models) = get(url, "/v1/models");
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][1]["id"], "x");
    assert_eq!(models["data"][1]["root"], b.display().to_string());
    unload_under_a_running_request(url, "x");
    let gone = post(url, "/v1/completions", &request("x", 1));
    assert_eq!(gone["error"]["code"], 404, "{gone}");
    // Refusals: vLLM's statuses, naming the field.
    for (path, body, status, says) in [
        (
            "/v1/unload_lora_adapter",
            json!({"lora_name": "x"}),
            " 404 ",
            "cannot be found",
        ),
        (
            "/v1/load_lora_adapter",
            json!({"lora_name": "y"}),
            " 400 ",
            "`lora_path`",
        ),
        (
            "/v1/load_lora_adapter",
            json!({"lora_name": "policy", "lora_path": a}),
            " 400 ",
            "conflicts",
        ),
        (
            "/v1/load_lora_adapter",
            json!({"lora_name": "y", "lora_path": tmp.path().join("none")}),
            " 404 ",
            "no adapter found",
        ),
        (
            "/v1/load_lora_adapter",
            json!({"lora_name": "y", "lora_path": policy}),
            " 400 ",
            "not a PEFT adapter",
        ),
    ] {
        let (got, said) = ask(url, path, "", &body);
        assert!(got.contains(status) && said.contains(says), "{body}: {got} {said}");
    }
}

/// Unloads the adapter `name` while a long request with it decodes: the request runs to its end.
fn unload_under_a_running_request(url: &str, name: &str) {
    let long = json!({"model": name, "prompt": "Count:", "max_tokens": 2000, "n": 4, "ignore_eos": true});
    std::thread::scope(|s| {
        let running = s.spawn(|| post(url, "/v1/completions", &long));
        while common::server::counter(url, "stepwise_decode_steps_total") == 0 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let (status, said) = ask(url, "/v1/unload_lora_adapter", "", &json!({"lora_name": name}));
        assert!(
            status.contains(" 200 ") && said.contains("removed successfully"),
            "{status} {said}"
        );
        assert!(
            !running.is_finished(),
            "the request ended before the unload: the check proves nothing"
        );
        let reply = running.join().unwrap();
        assert_eq!(reply["usage"]["completion_tokens"], 4 * 2000, "{reply}");
    });
}

/// Runtime LoRA updating is there only when asked for, behind the API key where there is one,
/// and beyond this machine only with a key.
#[test]
fn runtime_lora_updating_is_opt_in_and_keyed() {
    let tmp = common::tmp("serve_adapters", "keyed");
    let cache = tmp.path().join("cache");
    let a = tmp.path().join("a");
    let policy = fixture("qwen2-policy");
    write_adapter(&a, Path::new(&policy), (64, 32, 160, 2), 2, 3);
    let p = policy.as_str();
    let fixed = serve(&["--model", p], &cache);
    // Without the flag the routes are not there; with an API key they need it.
    let (status, _) = ask(
        &fixed.1,
        "/v1/load_lora_adapter",
        "",
        &json!({"lora_name": "y", "lora_path": a}),
    );
    assert!(status.contains(" 404 "), "{status}");
    let keyed = serve(
        &["--model", p, "--allow-runtime-lora-updating", "--api-key", "k"],
        &cache,
    );
    let body = json!({"lora_name": "y", "lora_path": a});
    assert!(ask(&keyed.1, "/v1/load_lora_adapter", "", &body).0.contains(" 401 "));
    let with_key = ask(&keyed.1, "/v1/load_lora_adapter", "authorization: Bearer k\r\n", &body);
    assert!(with_key.0.contains(" 200 "), "{with_key:?}");
    // Beyond this machine without a key, the server refuses to start.
    let out = Command::new(env!("CARGO_BIN_EXE_stepwise"))
        .args([
            "serve",
            "--model",
            p,
            "--allow-runtime-lora-updating",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--api-key"));
}
