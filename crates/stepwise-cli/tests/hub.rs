//! Model ids (`ORG/NAME[@REVISION]`) wherever a checkpoint is named: found in the local Hugging
//! Face cache, and downloaded into it when missing (from a Hub lookalike on the loopback, as
//! `HF_ENDPOINT` points mirrors), only the files stepwise reads, resumed when cut off; offline,
//! the error names the cache and `hf download`.

use serde_json::json;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

mod common;
use common::{fixture, write_jsonl};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// Score one record with `--model model`, the cache at `cache`, `env` added.
fn score(d: &Path, model: &str, out: &str, env: &[(&str, &str)]) -> Output {
    let input = d.join("in.jsonl");
    write_jsonl(
        &input,
        &[json!({"id": "a", "question": "2 + 3", "steps": [{"text": "2 + 3 = 5"}, {"text": "The answer is 5"}]})],
    );
    let mut c = Command::new(env!("CARGO_BIN_EXE_stepwise"));
    c.args(["score", "--model", model, "--input"])
        .arg(&input)
        .arg("--output")
        .arg(d.join(out))
        .env("HF_HUB_CACHE", d.join("hub"))
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_ENDPOINT")
        .env_remove("HF_TOKEN");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// The fixture token classifier as `test-org/tiny-prm` in a Hugging Face cache at `d/hub`
/// (blobs, a snapshot of links, `refs/main`), as `hf download` leaves it; returns the fixture.
fn cache_tiny_prm(d: &Path) -> PathBuf {
    let repo = d.join("hub/models--test-org--tiny-prm");
    let snapshot = repo.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), COMMIT).unwrap();
    let folder = PathBuf::from(fixture("qwen2-tokcls"));
    for (i, entry) in std::fs::read_dir(&folder).unwrap().enumerate() {
        let entry = entry.unwrap();
        let blob = format!("blob{i}");
        std::fs::copy(entry.path(), repo.join("blobs").join(&blob)).unwrap();
        std::os::unix::fs::symlink(Path::new("../../blobs").join(&blob), snapshot.join(entry.file_name())).unwrap();
    }
    folder
}

/// `stepwise serve` answers to a model id as it was given (as vLLM does: clients send
/// `"model": "test-org/tiny-prm"`, not its snapshot's commit) and to an adapter folder by the
/// adapter's name (not its merged model's); `--served-prm-name` still wins.
#[test]
fn served_models_are_named_as_they_were_given() {
    let d_tmp = common::tmp("hub", "names");
    let d = d_tmp.path();
    cache_tiny_prm(d);
    let adapter = d.join("my-prm-lora");
    write_folder(&adapter, &adapter_files(&fixture("qwen2-tokcls"), 3));
    for (prm, extra, name) in [
        ("test-org/tiny-prm", None, "test-org/tiny-prm"),
        (adapter.to_str().unwrap(), None, "my-prm-lora"),
        ("test-org/tiny-prm", Some("scorer"), "scorer"),
    ] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_stepwise"));
        cmd.args(["serve", "--prm", prm, "--port", "0"])
            .args(extra.map(|n| ["--served-prm-name", n]).iter().flatten())
            .env("HF_HUB_CACHE", d.join("hub"))
            .env("HF_HUB_OFFLINE", "1")
            .env("STEPWISE_CACHE", d.join("cache"))
            .stdout(std::process::Stdio::null());
        let (mut child, url) = common::server::spawn_until(cmd, "stepwise serve: listening on ");
        let (_, body) = common::server::get(&url, "/v1/models");
        let _ = child.kill();
        let _ = child.wait();
        let models: serde_json::Value = serde_json::from_str(&body).unwrap();
        let ids: Vec<&str> = models["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, [name], "{prm}");
    }
}

#[test]
fn a_model_id_is_resolved_from_the_local_hugging_face_cache() {
    let d_tmp = common::tmp("hub", "cache");
    let d = d_tmp.path();
    let folder = cache_tiny_prm(d);
    let offline = [("HF_HUB_OFFLINE", "1")];
    let by_folder = score(d, folder.to_str().unwrap(), "folder.jsonl", &offline);
    assert!(by_folder.status.success());
    let want = std::fs::read_to_string(d.join("folder.jsonl")).unwrap();
    for id in [
        "test-org/tiny-prm",
        &format!("test-org/tiny-prm@{COMMIT}"),
        "test-org/tiny-prm@main",
    ] {
        let out = score(d, id, "id.jsonl", &offline);
        assert!(out.status.success(), "{id}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(std::fs::read_to_string(d.join("id.jsonl")).unwrap(), want, "{id}");
    }
    for (id, says) in [
        ("test-org/other", "models--test-org--other"),
        ("test-org/other", "`hf download test-org/other`"),
        ("test-org/tiny-prm@v9", "revision `v9`"),
    ] {
        let out = score(d, id, "never.jsonl", &offline);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{id}: {err}");
        assert!(err.contains(says), "{id}: {err}");
        assert!(!d.join("never.jsonl").exists());
    }
}

/// A Hub lookalike: the model API's file list and `resolve/` downloads with the headers the Hub
/// sends (commit, etag, content range), for one repository holding `files`; every request path
/// is logged.
struct Hub {
    url: String,
    log: Arc<Mutex<Vec<String>>>,
}

fn hub(repo: &'static str, files: Vec<(String, Vec<u8>)>) -> Hub {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let log = Arc::new(Mutex::new(Vec::new()));
    let seen = log.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(200) {
            let Ok(stream) = stream else { continue };
            answer(stream, repo, &files, &seen);
        }
    });
    Hub { url, log }
}

fn answer(mut s: TcpStream, repo: &str, files: &[(String, Vec<u8>)], log: &Mutex<Vec<String>>) {
    let Some(request) = common::server::read_http(&mut s) else {
        return;
    };
    let head = String::from_utf8_lossy(&request).to_string();
    let path = head.split(' ').nth(1).unwrap_or("").to_string();
    log.lock().unwrap().push(path.clone());
    let range = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("range: bytes=").map(str::to_string));
    let info = format!("/api/models/{repo}/revision/main");
    let (status, headers, body) = if path == info {
        let siblings: Vec<_> = files
            .iter()
            .map(|(f, _)| json!({ "rfilename": f }))
            .chain([
                json!({"rfilename": "pytorch_model.bin"}),
                json!({"rfilename": "onnx/model.onnx"}),
            ])
            .collect();
        let body = json!({"sha": COMMIT, "siblings": siblings}).to_string().into_bytes();
        ("200 OK", String::new(), body)
    } else if let Some((name, bytes)) = files.iter().find(|(f, _)| path == format!("/{repo}/resolve/main/{f}")) {
        let (from, to) = match range.as_deref().and_then(|r| r.split_once('-')) {
            Some((a, b)) => (a.parse().unwrap_or(0), b.parse().unwrap_or(bytes.len() - 1)),
            None => (0, bytes.len() - 1),
        };
        let etag = format!("{:016x}{}", fnv(bytes), name.len());
        let headers = format!(
            "etag: \"{etag}\"\r\nx-repo-commit: {COMMIT}\r\ncontent-range: bytes {from}-{to}/{}\r\n",
            bytes.len()
        );
        ("206 Partial Content", headers, bytes[from..=to].to_vec())
    } else {
        (
            "404 Not Found",
            String::new(),
            b"{\"error\":\"Repository not found\"}".to_vec(),
        )
    };
    let _ = write!(
        s,
        "HTTP/1.1 {status}\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(&body);
    let _ = s.flush();
}

/// A content hash (FNV-1a) for the lookalike's etags.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100000001b3)
    })
}

#[test]
fn a_model_id_not_in_the_cache_is_downloaded_once_and_resumes() {
    let d_tmp = common::tmp("hub", "download");
    let d = d_tmp.path();
    let folder = PathBuf::from(fixture("qwen2-tokcls"));
    let files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    let hub = hub("test-org/tiny-prm", files.clone());
    let online = [("HF_ENDPOINT", hub.url.as_str())];
    assert!(score(d, folder.to_str().unwrap(), "folder.jsonl", &online)
        .status
        .success());
    let want = std::fs::read_to_string(d.join("folder.jsonl")).unwrap();

    // Not cached: downloaded (only what stepwise reads), then scored as the folder is.
    let out = score(d, "test-org/tiny-prm", "first.jsonl", &online);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(d.join("first.jsonl")).unwrap(), want);
    let snapshot = d.join("hub/models--test-org--tiny-prm/snapshots").join(COMMIT);
    for (name, bytes) in &files {
        assert_eq!(&std::fs::read(snapshot.join(name)).unwrap(), bytes, "{name}");
    }
    let asked = hub.log.lock().unwrap().clone();
    assert!(
        asked.iter().all(|p| !p.ends_with(".bin") && !p.contains("onnx")),
        "{asked:?}"
    );

    // Cached: nothing asked of the Hub, online or offline.
    let before = hub.log.lock().unwrap().len();
    for env in [&online[..], &[("HF_HUB_OFFLINE", "1")]] {
        let out = score(d, "test-org/tiny-prm", "again.jsonl", env);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(std::fs::read_to_string(d.join("again.jsonl")).unwrap(), want);
    }
    assert_eq!(
        hub.log.lock().unwrap().len(),
        before,
        "a cached model was fetched again"
    );

    // Cut off before the weights: the next run fetches just them.
    std::fs::remove_file(snapshot.join("model.safetensors")).unwrap();
    let out = score(d, "test-org/tiny-prm", "resumed.jsonl", &online);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(d.join("resumed.jsonl")).unwrap(), want);
    let fetched: Vec<String> = hub.log.lock().unwrap()[before..]
        .iter()
        .filter(|p| p.contains("/resolve/"))
        .cloned()
        .collect();
    assert!(fetched.iter().all(|p| p.ends_with("model.safetensors")), "{fetched:?}");

    // A repository the Hub does not have: the error says what failed and what to do.
    let out = score(d, "test-org/missing", "never.jsonl", &online);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for says in [
        "test-org/missing",
        "listing its files",
        &hub.url,
        "HF_TOKEN",
        "hf download",
    ] {
        assert!(err.contains(says), "{says}: {err}");
    }
    assert!(!d.join("never.jsonl").exists());
}

/// A PEFT LoRA adapter's two files: rank 4 on layer 0's `q_proj` of the token classifier
/// `base`, its values drawn by `seed`.
fn adapter_files(base: &str, seed: u32) -> Vec<(String, Vec<u8>)> {
    let values = |n: usize, seed: u32| -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2654435761) ^ seed) % 1000)
            .map(|x| x as f32 / 500.0 - 1.0)
            .collect()
    };
    let q = "base_model.model.model.layers.0.self_attn.q_proj";
    let config = json!({"peft_type": "LORA", "task_type": "TOKEN_CLS", "r": 4, "lora_alpha": 16,
        "base_model_name_or_path": base, "target_modules": ["q_proj"]});
    vec![
        ("adapter_config.json".to_string(), config.to_string().into_bytes()),
        (
            "adapter_model.safetensors".to_string(),
            common::safetensors_bytes(&[
                (&format!("{q}.lora_A.weight"), vec![4, 64], values(256, 1 + seed)),
                (&format!("{q}.lora_B.weight"), vec![64, 4], values(256, 2 + seed)),
            ]),
        ),
    ]
}

/// A PEFT LoRA adapter's id (a repository of `adapter_config.json` and
/// `adapter_model.safetensors` on a local base): downloaded, merged onto its base once, and
/// scored as the same adapter in a folder scores; found again offline, nothing fetched.
#[test]
fn a_peft_adapters_id_is_downloaded_and_merged_onto_its_base() {
    let d_tmp = common::tmp("hub", "adapter");
    let d = d_tmp.path();
    let base = PathBuf::from(fixture("qwen2-tokcls"));
    let mut files = adapter_files(&base.display().to_string(), 0);
    files.push(("README.md".to_string(), b"# an adapter".to_vec()));
    let folder = d.join("adapter-folder");
    std::fs::create_dir_all(&folder).unwrap();
    for (name, bytes) in &files {
        std::fs::write(folder.join(name), bytes).unwrap();
    }
    let hub = hub("test-org/prm-lora", files);
    let cache = d.join("stepwise-cache");
    let env = |offline: bool| {
        let mut env = vec![("STEPWISE_CACHE", cache.to_str().unwrap().to_string())];
        match offline {
            true => env.push(("HF_HUB_OFFLINE", "1".into())),
            false => env.push(("HF_ENDPOINT", hub.url.clone())),
        }
        env
    };
    let run = |model: &str, out: &str, offline: bool| {
        let env = env(offline);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let o = score(d, model, out, &env);
        assert!(o.status.success(), "{model}: {}", String::from_utf8_lossy(&o.stderr));
        std::fs::read_to_string(d.join(out)).unwrap()
    };
    let by_folder = run(folder.to_str().unwrap(), "folder.jsonl", true);
    assert_ne!(
        by_folder,
        run(base.to_str().unwrap(), "base.jsonl", true),
        "the adapter changes the scores"
    );
    assert_eq!(run("test-org/prm-lora", "id.jsonl", false), by_folder);
    let asked = hub.log.lock().unwrap().clone();
    assert!(asked.iter().all(|p| !p.ends_with("README.md")), "{asked:?}");
    let merged: Vec<_> = std::fs::read_dir(cache.join("merged")).unwrap().flatten().collect();
    assert_eq!(merged.len(), 2, "the folder's merge and the id's (its snapshot's name)");
    let before = hub.log.lock().unwrap().len();
    assert_eq!(run("test-org/prm-lora", "again.jsonl", true), by_folder);
    assert_eq!(hub.log.lock().unwrap().len(), before, "nothing fetched again");
}

/// Writes `files` into the new folder `dir`.
fn write_folder(dir: &Path, files: &[(String, Vec<u8>)]) {
    std::fs::create_dir_all(dir).unwrap();
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

/// `stepwise merge`: an adapter whose base is a folder of another machine is refused naming the
/// way out, merged onto `--base` into a folder of its own that scores as the same adapter merged
/// in the cache does; an existing folder is not written over. `stepwise cache`: with
/// `STEPWISE_CACHE_MAX_GB=0` a merge lets the model merged before it go, `list --json` names
/// what is left, `remove --all` empties it.
#[test]
fn merge_writes_a_model_folder_and_the_cache_is_listed_and_kept_small() {
    let d_tmp = common::tmp("hub", "merge");
    let d = d_tmp.path();
    let base = fixture("qwen2-tokcls");
    let elsewhere = d.join("adapter-from-elsewhere");
    write_folder(&elsewhere, &adapter_files("/home/someone/models/qwen2-tokcls", 0));
    let cache = d.join("cache");
    let env = [
        ("STEPWISE_CACHE", cache.to_str().unwrap()),
        ("STEPWISE_CACHE_MAX_GB", "0"),
    ];
    let o = score(d, elsewhere.to_str().unwrap(), "refused.jsonl", &env);
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && said.contains("base_model_name_or_path") && said.contains("stepwise merge"),
        "{said}"
    );

    let out = d.join("merged-here");
    let merge = |out: &Path| {
        Command::new(env!("CARGO_BIN_EXE_stepwise"))
            .args(["merge", elsewhere.to_str().unwrap(), "--base", &base, "--out"])
            .arg(out)
            .output()
            .unwrap()
    };
    let o = merge(&out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for file in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "stepwise-merge.json",
    ] {
        assert!(out.join(file).is_file(), "{file}");
    }
    let said = String::from_utf8_lossy(&merge(&out).stderr).into_owned();
    assert!(said.contains("already exists"), "{said}");

    let scores = |model: &Path, file: &str| {
        let o = score(d, model.to_str().unwrap(), file, &env);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        (
            std::fs::read_to_string(d.join(file)).unwrap(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (here, _) = scores(&out, "here.jsonl");
    let (same, first) = (d.join("same-adapter"), d.join("another-adapter"));
    write_folder(&same, &adapter_files(&base, 0));
    write_folder(&first, &adapter_files(&base, 7));
    let (_, said) = scores(&first, "first.jsonl");
    assert!(!said.contains("removed"), "{said}");
    let (cached, said) = scores(&same, "cached.jsonl");
    assert_eq!(cached, here, "merged here and in the cache alike");
    assert!(
        said.contains("STEPWISE_CACHE_MAX_GB: removed") && said.contains("another-adapter-"),
        "{said}"
    );

    let cache_cmd = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_stepwise"))
            .arg("cache")
            .args(args)
            .env("STEPWISE_CACHE", &cache)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let listed: Vec<serde_json::Value> = cache_cmd(&["list", "--json"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(listed[0]["name"].as_str().unwrap().starts_with("same-adapter-"));
    assert!(listed[0]["bytes"].as_u64().unwrap() > 100_000);
    let table = cache_cmd(&["list"]);
    assert!(
        table.contains("same-adapter-") && table.contains("1 merged models"),
        "{table}"
    );
    assert!(cache_cmd(&["remove", "--all"]).contains("1 merged models removed"));
    assert_eq!(cache_cmd(&["list", "--json"]), "");
}

/// `stepwise download`: an adapter's id is fetched (its two files, not its README) and its base,
/// a model id (here found in the cache, as a second repository the lookalike does not serve), is
/// resolved too, each snapshot printed; the adapter then scores offline as the same adapter in a
/// folder does. A folder is refused (nothing to download).
#[test]
fn download_fetches_an_adapter_and_its_base_for_an_offline_run() {
    let d_tmp = common::tmp("hub", "download");
    let d = d_tmp.path();
    cache_tiny_prm(d);
    let mut files = adapter_files("test-org/tiny-prm", 5);
    files.push(("README.md".to_string(), b"# an adapter".to_vec()));
    let hub = hub("test-org/prm-lora", files.clone());
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_stepwise"))
            .args(args)
            .env("HF_HUB_CACHE", d.join("hub"))
            .env("HF_ENDPOINT", &hub.url)
            .env_remove("HF_HUB_OFFLINE")
            .output()
            .unwrap()
    };
    let o = run(&["download", "test-org/prm-lora"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let printed = String::from_utf8_lossy(&o.stdout).into_owned();
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), 2, "{printed}");
    assert!(lines[0].starts_with("test-org/prm-lora\t") && lines[1].starts_with("test-org/tiny-prm\t"));
    let snapshot = PathBuf::from(lines[0].split('\t').nth(1).unwrap());
    assert!(snapshot.join("adapter_model.safetensors").is_file() && !snapshot.join("README.md").exists());
    let asked = hub.log.lock().unwrap().clone();
    assert!(asked.iter().all(|p| !p.ends_with("README.md")), "{asked:?}");

    let folder = d.join("adapter-folder");
    write_folder(&folder, &files);
    let cache = d.join("cache");
    let env = [("HF_HUB_OFFLINE", "1"), ("STEPWISE_CACHE", cache.to_str().unwrap())];
    let scored = |model: &str, out: &str| {
        let o = score(d, model, out, &env);
        assert!(o.status.success(), "{model}: {}", String::from_utf8_lossy(&o.stderr));
        std::fs::read_to_string(d.join(out)).unwrap()
    };
    assert_eq!(
        scored("test-org/prm-lora", "id.jsonl"),
        scored(folder.to_str().unwrap(), "folder.jsonl")
    );
    let said = String::from_utf8_lossy(&run(&["download", folder.to_str().unwrap()]).stderr).into_owned();
    assert!(said.contains("a folder here"), "{said}");
}
