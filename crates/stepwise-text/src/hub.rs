//! Checkpoints named by Hugging Face model id (`Qwen/Qwen2.5-Math-PRM-7B`), found in the local
//! Hugging Face cache that `hf download` and transformers fill: `$HF_HUB_CACHE` (default
//! `$HF_HOME/hub`, `HF_HOME` default `~/.cache/huggingface`) holds `models--ORG--NAME/` with
//! `refs/REF` (a commit hash) and `snapshots/COMMIT/` (the files). An id that is not there is
//! downloaded into that cache with the Hub's own client (hf-hub), from `HF_ENDPOINT` (default
//! huggingface.co) with `HF_TOKEN` (or the token `hf auth login` saved), unless `HF_HUB_OFFLINE`
//! is set; only what stepwise reads is fetched (safetensors weights, JSON configs, tokenizer
//! files, chat templates).

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// The Hugging Face hub cache folder the environment names.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("HF_HUB_CACHE")
        .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
        .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| var("XDG_CACHE_HOME").map(|c| c.join("huggingface").join("hub")))
        .or_else(|| var("HOME").map(|h| h.join(".cache").join("huggingface").join("hub")))
}

/// A checkpoint folder from a command-line argument: the folder itself when it exists, else a
/// model id (`ORG/NAME`, optionally `@REVISION`: a branch, tag or commit) resolved in the cache
/// of [`cache_dir`].
pub fn resolve(arg: &str) -> Result<PathBuf> {
    let path = Path::new(arg);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    if !looks_like_model_id(arg) {
        bail!("{arg}: no such folder");
    }
    let cache = cache_dir().context("no Hugging Face cache: set HF_HUB_CACHE or HF_HOME")?;
    match resolve_in(arg, &cache) {
        // A download cut off between two files left a snapshot without all its weights.
        #[cfg(feature = "download")]
        Ok(found) if !offline() && !complete(&found) => download(arg, &cache),
        Ok(found) => Ok(found),
        #[cfg(feature = "download")]
        Err(_) if !offline() => download(arg, &cache),
        Err(missing) => Err(missing),
    }
}

/// A snapshot with its config and every weight file: those its safetensors index names, or one;
/// or a PEFT adapter's, with its settings and weights.
pub fn complete(snapshot: &Path) -> bool {
    if is_adapter(snapshot) {
        return snapshot.join("adapter_model.safetensors").is_file();
    }
    if !snapshot.join("config.json").is_file() {
        return false;
    }
    let index = std::fs::read_to_string(snapshot.join("model.safetensors.index.json")).ok();
    match index.and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok()) {
        Some(index) => index["weight_map"].as_object().is_some_and(|map| {
            map.values()
                .filter_map(|f| f.as_str())
                .all(|f| snapshot.join(f).is_file())
        }),
        None => std::fs::read_dir(snapshot).is_ok_and(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .any(|f| f.ends_with(".safetensors") && f != "adapter_model.safetensors")
        }),
    }
}

/// Whether `dir` holds a PEFT adapter (`adapter_config.json`) and no model weights of its own
/// (`model.safetensors` or a safetensors index).
pub fn is_adapter(dir: &Path) -> bool {
    dir.join("adapter_config.json").is_file()
        && !dir.join("model.safetensors").exists()
        && !dir.join("model.safetensors.index.json").exists()
}

/// `HF_HUB_OFFLINE` set to anything but empty, 0, false or no (as huggingface_hub reads it).
pub fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .map(|v| {
            !matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "" | "0" | "false" | "no" | "off"
            )
        })
        .unwrap_or(false)
}

/// The files of a model repository that stepwise reads: weights as safetensors, configs,
/// tokenizer files and chat templates, at the top level (not PyTorch `.bin`, ONNX, GGUF).
pub fn wanted(file: &str) -> bool {
    !file.contains('/')
        && [".safetensors", ".json", ".txt", ".model", ".jinja", ".tiktoken"]
            .iter()
            .any(|ext| file.ends_with(ext))
}

/// Download model `id` (`ORG/NAME[@REVISION]`) into the Hugging Face cache `cache` and return
/// its snapshot folder. A file already in the cache is not fetched again; a file cut off half-way
/// resumes.
#[cfg(feature = "download")]
pub fn download(id: &str, cache: &Path) -> Result<PathBuf> {
    use hf_hub::{api::sync::ApiBuilder, Cache, Repo, RepoType};
    use std::io::IsTerminal;
    let (name, revision) = id.split_once('@').unwrap_or((id, "main"));
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let endpoint = var("HF_ENDPOINT").unwrap_or_else(|| "https://huggingface.co".into());
    let mut builder = ApiBuilder::from_cache(Cache::new(cache.to_path_buf()))
        .with_endpoint(endpoint.clone())
        .with_progress(std::io::stderr().is_terminal());
    if let Some(token) = var("HF_TOKEN") {
        builder = builder.with_token(Some(token));
    }
    let failed = |what: String| {
        format!(
            "{id}: not in the Hugging Face cache ({}), and {what} from {endpoint} failed (a gated or \
private model needs HF_TOKEN; offline, fetch it where the network allows with `stepwise download {name}` \
(or `hf download {name}`) and point HF_HUB_CACHE or HF_HOME at that cache, or set HF_HUB_OFFLINE=1 to never download)",
            cache.display()
        )
    };
    let api = builder
        .build()
        .with_context(|| failed("starting the download".into()))?;
    let repo = api.repo(Repo::with_revision(name.into(), RepoType::Model, revision.into()));
    let info = repo.info().with_context(|| failed("listing its files".into()))?;
    let files: Vec<&str> = info
        .siblings
        .iter()
        .map(|s| s.rfilename.as_str())
        .filter(|f| wanted(f))
        .collect();
    if !files.iter().any(|f| f.ends_with(".safetensors")) {
        bail!(
            "{id}: the repository at revision {} has no safetensors weights, which is all stepwise \
loads (its files: {})",
            info.sha,
            info.siblings
                .iter()
                .map(|s| s.rfilename.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    eprintln!("{id}: downloading {} files into {}", files.len(), cache.display());
    for file in files {
        repo.get(file).with_context(|| failed(format!("downloading {file}")))?;
    }
    resolve_in(&format!("{name}@{}", info.sha), cache)
}

/// [`resolve`] for a model id, in the cache folder `cache`.
pub fn resolve_in(id: &str, cache: &Path) -> Result<PathBuf> {
    let (name, revision) = id.split_once('@').unwrap_or((id, "main"));
    let repo = cache.join(format!("models--{}", name.replace('/', "--")));
    if !repo.is_dir() {
        bail!(
            "{id}: neither a folder nor a model in the Hugging Face cache ({} is missing; with \
HF_HUB_OFFLINE set, or without the engine, stepwise does not download: fetch it with `stepwise download \
{name}` (or `hf download {name}`), or point HF_HUB_CACHE / HF_HOME at the cache that has it)",
            repo.display()
        );
    }
    let snapshots = repo.join("snapshots");
    // A branch or tag names a commit in refs/; a commit is a snapshot's own name.
    let commit = match std::fs::read_to_string(repo.join("refs").join(revision)) {
        Ok(text) => text.trim().to_string(),
        Err(_) => revision.to_string(),
    };
    let snapshot = snapshots.join(&commit);
    if snapshot.is_dir() {
        return Ok(snapshot);
    }
    let mut available: Vec<String> = std::fs::read_dir(&snapshots)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    available.sort();
    // Without a named revision, a cache holding one snapshot is unambiguous.
    if !id.contains('@') && available.len() == 1 {
        return Ok(snapshots.join(&available[0]));
    }
    bail!(
        "{id}: revision `{revision}` is not in the Hugging Face cache ({} has {})",
        snapshots.display(),
        if available.is_empty() {
            "no snapshots".to_string()
        } else {
            format!("snapshots {}", available.join(", "))
        }
    )
}

/// `ORG/NAME` or `NAME`, optionally `@REVISION`, in the characters the hub allows.
fn looks_like_model_id(arg: &str) -> bool {
    let name = arg.split_once('@').map_or(arg, |(n, _)| n);
    let parts: Vec<&str> = name.split('/').collect();
    parts.len() <= 2
        && parts.iter().all(|p| {
            !p.is_empty() && !p.starts_with('.') && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
}

#[cfg(test)]
mod tests {
    use super::{complete, looks_like_model_id};

    #[test]
    fn a_peft_adapters_snapshot_is_complete_with_its_settings_and_weights() {
        let dir = std::env::temp_dir().join(format!("stepwise-hub-adapter-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("adapter_config.json"), "{}").unwrap();
        assert!(!complete(&dir), "the weights are missing");
        std::fs::write(dir.join("adapter_model.safetensors"), "").unwrap();
        assert!(complete(&dir));
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        assert!(
            complete(&dir),
            "a base's config beside an adapter does not make a model"
        );
        std::fs::write(dir.join("model.safetensors.index.json"), "{}").unwrap();
        assert!(!complete(&dir), "a model folder needs its own weights");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn model_ids_and_paths_are_told_apart() {
        for id in [
            "Qwen/Qwen2.5-Math-PRM-7B",
            "gpt2",
            "org/name@v1.0",
            "peiyi9979/math-shepherd-mistral-7b-prm",
        ] {
            assert!(looks_like_model_id(id), "{id}");
        }
        for path in ["./prm", "../policy", "/abs/path", "a/b/c", "out/", ".hidden/x", ""] {
            assert!(!looks_like_model_id(path), "{path}");
        }
    }
}
