//! Checkpoints named by Hugging Face model id (`Qwen/Qwen2.5-Math-PRM-7B`), found offline in the
//! local Hugging Face cache that `huggingface-cli download` and transformers fill:
//! `$HF_HUB_CACHE` (default `$HF_HOME/hub`, `HF_HOME` default `~/.cache/huggingface`) holds
//! `models--ORG--NAME/` with `refs/REF` (a commit hash) and `snapshots/COMMIT/` (the files).
//! stepwise never downloads.

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
    resolve_in(arg, &cache)
}

/// [`resolve`] for a model id, in the cache folder `cache`.
pub fn resolve_in(id: &str, cache: &Path) -> Result<PathBuf> {
    let (name, revision) = id.split_once('@').unwrap_or((id, "main"));
    let repo = cache.join(format!("models--{}", name.replace('/', "--")));
    if !repo.is_dir() {
        bail!(
            "{id}: neither a folder nor a model in the Hugging Face cache ({} is missing; stepwise works \
offline: fetch it first with `huggingface-cli download {name}`, or set HF_HUB_CACHE / HF_HOME)",
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
    use super::looks_like_model_id;

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
