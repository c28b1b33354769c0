//! The models [`crate::peft`] merged from adapters, kept in stepwise's cache
//! ([`crate::peft::cache_root`]`/merged/`): each folder records where it came from
//! ([`RECORD`]: the adapter, the base, when) and when it was last used (the record's modification
//! time, set each time a run finds it), so that `stepwise cache list` can say what the cache
//! holds and `stepwise cache remove` / `prune` (or `$STEPWISE_CACHE_MAX_GB`, after each merge) can
//! let the least recently used go. A model is removed by renaming it out of the way first: a run
//! that looks for it then merges it again instead of reading a half-removed folder (and one that
//! has its files open already reads on: Linux keeps removed files while they are mapped).

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The file in a merged model's folder that says where it came from.
pub const RECORD: &str = "stepwise-merge.json";

/// One merged model in the cache.
#[derive(Clone, Debug)]
pub struct Merged {
    /// Its folder's name under `merged/` (the adapter folder's name and a hash).
    pub name: String,
    /// Its folder.
    pub path: PathBuf,
    /// Bytes on disk, every file in the folder.
    pub bytes: u64,
    /// The adapter folder it was merged from (none for a model merged before the record was
    /// kept).
    pub adapter: Option<String>,
    /// The base model's folder it was merged onto (as `adapter`).
    pub base: Option<String>,
    /// When a run last found it (or made it).
    pub last_used: SystemTime,
    /// A merge not finished: by a process still at work (`Some(true)`), or by one that is gone
    /// (`Some(false)`: left over, removed by the next prune or merge of the same adapter).
    pub unfinished: Option<bool>,
}

/// What [`prune`] lets go, beside merges left unfinished by processes that are gone.
#[derive(Clone, Debug, Default)]
pub struct Prune {
    /// Models not used for longer than this.
    pub unused_for: Option<Duration>,
    /// Then the least recently used, until the merged models take at most this many bytes.
    pub max_bytes: Option<u64>,
    /// A model kept whatever its age (the one just merged).
    pub keep: Option<String>,
}

impl Prune {
    /// Down to `max_bytes`, keeping `keep`.
    pub fn to_size(max_bytes: u64, keep: &str) -> Self {
        Prune {
            max_bytes: Some(max_bytes),
            keep: Some(keep.to_string()),
            ..Prune::default()
        }
    }
}

/// `$STEPWISE_CACHE_MAX_GB` in bytes, when set: the merged models' most after a merge.
pub fn limit_from_env() -> Result<Option<u64>> {
    let Some(text) = std::env::var_os("STEPWISE_CACHE_MAX_GB").filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let text = text.to_string_lossy();
    let gb = text.trim().parse::<f64>().unwrap_or(f64::NAN);
    gib(gb).map(Some).with_context(|| format!("STEPWISE_CACHE_MAX_GB={text}"))
}

/// `gb` GiB in bytes; refused unless a number, 0 or more.
pub fn gib(gb: f64) -> Result<u64> {
    ensure!(gb.is_finite() && gb >= 0.0, "a number of GiB (0 or more) is needed");
    Ok((gb * (1u64 << 30) as f64) as u64)
}

/// Writes `folder`'s record: merged from `adapter` onto `base` (named `base_name` by the adapter).
pub(crate) fn record(folder: &Path, adapter: &Path, base: &Path, base_name: &str) -> Result<()> {
    let full = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let record = serde_json::json!({
        "adapter": full(adapter),
        "base": full(base),
        "base_model_name_or_path": base_name,
        "merged_at": now,
        "stepwise": env!("CARGO_PKG_VERSION"),
    });
    let path = folder.join(RECORD);
    std::fs::write(&path, serde_json::to_string_pretty(&record)?).with_context(|| format!("writing {}", path.display()))
}

/// Marks the merged model in `folder` used now (quietly not, in a cache this user cannot write).
pub(crate) fn touch(folder: &Path) {
    let path = folder.join(RECORD);
    if let Ok(file) = std::fs::File::options().append(true).open(&path) {
        let _ = file.set_modified(SystemTime::now());
    }
}

/// The merged models under `root/merged/`, most recently used first (none when it does not
/// exist yet).
pub fn list(root: &Path) -> Result<Vec<Merged>> {
    let merged = root.join("merged");
    let entries = match std::fs::read_dir(&merged) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", merged.display())),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", merged.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if !entry.file_type()?.is_dir() || name.contains(".removing-") {
            continue;
        }
        let unfinished = partial(&name).map(|(_, pid)| !gone(pid));
        if unfinished.is_none() && name.starts_with('.') {
            continue;
        }
        let record: Option<Value> = std::fs::read_to_string(path.join(RECORD))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok());
        let field = |k: &str| record.as_ref().and_then(|r| r[k].as_str()).map(str::to_string);
        let last_used = std::fs::metadata(path.join(RECORD))
            .or_else(|_| entry.metadata())
            .and_then(|m| m.modified())
            .unwrap_or(UNIX_EPOCH);
        found.push(Merged {
            bytes: size(&path),
            adapter: field("adapter"),
            base: field("base"),
            name,
            path,
            last_used,
            unfinished,
        });
    }
    found.sort_by(|a, b| b.last_used.cmp(&a.last_used).then(a.name.cmp(&b.name)));
    Ok(found)
}

/// Removes the merged model `name` (a folder name [`list`] gives); refused for anything else,
/// and for a merge still at work.
pub fn remove(root: &Path, name: &str) -> Result<Merged> {
    Ok(remove_all(root, &[name])?.remove(0))
}

/// [`remove`] for each of `names`, the cache listed once; none is removed when one is refused.
pub fn remove_all<S: AsRef<str>>(root: &Path, names: &[S]) -> Result<Vec<Merged>> {
    let merged = root.join("merged");
    let all = list(root)?;
    let found = names
        .iter()
        .map(|name| {
            let name = name.as_ref();
            ensure!(
                !name.is_empty() && !name.contains(['/', '\\']) && name != "." && name != "..",
                "{name:?}: not the name of a merged model (`stepwise cache list` names them)"
            );
            let Some(found) = all.iter().find(|m| m.name == name) else {
                bail!("{}: no merged model of that name", merged.join(name).display());
            };
            ensure!(
                found.unfinished != Some(true),
                "{}: a merge still at work (its process is running)",
                found.path.display()
            );
            Ok(found.clone())
        })
        .collect::<Result<Vec<_>>>()?;
    found.iter().try_for_each(|m| take_away(&merged, m))?;
    Ok(found)
}

/// Renames `m` aside in `merged`, then deletes it.
fn take_away(merged: &Path, m: &Merged) -> Result<()> {
    let aside = merged.join(format!(".{}.removing-{}", m.name, std::process::id()));
    std::fs::rename(&m.path, &aside).with_context(|| format!("moving {} aside", m.path.display()))?;
    std::fs::remove_dir_all(&aside).with_context(|| format!("removing {}", aside.display()))
}

/// Removes what `how` says, and merges left unfinished by processes that are gone; returns what
/// was removed.
pub fn prune(root: &Path, how: &Prune) -> Result<Vec<Merged>> {
    let all = list(root)?;
    let now = SystemTime::now();
    let kept = |m: &Merged| how.keep.as_deref() == Some(m.name.as_str()) || m.unfinished == Some(true);
    let mut total: u64 = all.iter().map(|m| m.bytes).sum();
    let mut removed = Vec::new();
    // Least recently used first.
    for m in all.iter().rev() {
        if kept(m) {
            continue;
        }
        let idle = now.duration_since(m.last_used).unwrap_or_default();
        let stale = m.unfinished == Some(false) || how.unused_for.is_some_and(|d| idle > d);
        let over = how.max_bytes.is_some_and(|max| total > max);
        if stale || over {
            take_away(&root.join("merged"), m)?;
            removed.push(m.clone());
            total -= m.bytes;
        }
    }
    Ok(removed)
}

/// Merges of `name` into `merged` left by a process killed part-way (its pid gone), and this
/// process's own.
pub(crate) fn remove_abandoned(merged: &Path, name: &str) {
    let Ok(entries) = std::fs::read_dir(merged) else {
        return;
    };
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        if let Some((of, pid)) = partial(&file) {
            if of == name && (pid == std::process::id() || gone(pid)) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// `(name, pid)` of a staging folder's name, `.NAME.partial-PID`.
fn partial(file: &str) -> Option<(&str, u32)> {
    let (name, pid) = file.strip_prefix('.')?.rsplit_once(".partial-")?;
    Some((name, pid.parse().ok()?))
}

/// Whether process `pid` has ended (on Linux; elsewhere it is taken to run on).
fn gone(pid: u32) -> bool {
    cfg!(target_os = "linux") && !Path::new(&format!("/proc/{pid}")).exists()
}

/// The bytes of every file under `dir` (links not followed).
fn size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => size(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}
