//! Append-only JSONL with resume: records are written one line at a time and flushed; after a
//! crash (even SIGKILL) a torn last line is dropped and the keys already written are skipped. A
//! file that is not such a journal (another format, another command's output) is refused, never
//! truncated.

use anyhow::{Context, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

/// A resumable JSONL output.
pub struct Journal {
    path: PathBuf,
    file: File,
    done: HashSet<String>,
}

impl Journal {
    /// Open (or create) `path`; `key` names a record (e.g. its id). Returns the journal and the
    /// records already present.
    pub fn open<T: DeserializeOwned>(path: &Path, key: impl Fn(&T) -> String) -> Result<(Journal, Vec<T>)> {
        let mut kept = Vec::new();
        let mut good_bytes = 0u64;
        if path.exists() {
            let mut r = BufReader::new(File::open(path).with_context(|| format!("opening {}", path.display()))?);
            let mut line = Vec::new();
            for number in 1.. {
                line.clear();
                let n = r.read_until(b'\n', &mut line)?;
                if n == 0 || !line.ends_with(b"\n") {
                    break; // end, or a torn last line (a record is written with its newline at once)
                }
                // A whole line that is not a record is not a crash's doing: the file is something
                // else (another format, another command's output), and is left as it is.
                let v = serde_json::from_slice::<T>(&line).map_err(|e| {
                    anyhow::anyhow!(
                        "{}:{number}: not a record this command writes ({e}); the file is left as it is: choose another output",
                        path.display()
                    )
                })?;
                kept.push(v);
                good_bytes += n as u64;
            }
        }
        let file = OpenOptions::new()
            .create(true)
            .append(false)
            .write(true)
            .truncate(false)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        file.set_len(good_bytes)?;
        let mut file = file;
        use std::io::Seek;
        file.seek(std::io::SeekFrom::End(0))?;
        let done = kept.iter().map(&key).collect();
        Ok((
            Journal {
                path: path.to_path_buf(),
                file,
                done,
            },
            kept,
        ))
    }

    /// Whether a key is already written.
    pub fn contains(&self, key: &str) -> bool {
        self.done.contains(key)
    }

    /// Append one record under `key`.
    pub fn append<T: Serialize>(&mut self, key: String, rec: &T) -> Result<()> {
        let mut line = serde_json::to_string(rec)?;
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .with_context(|| format!("writing {}", self.path.display()))?;
        self.file.flush()?;
        self.done.insert(key);
        Ok(())
    }
}

/// Open the journal at `path` of a run that writes `sols` in their order (`score`): the records
/// an earlier run wrote must be the first of `sols`, id for id, else the file is refused and left
/// as it is. Returns the journal and those records.
pub fn open_in_order(path: &Path, sols: &[crate::Solution]) -> Result<(Journal, Vec<crate::Solution>)> {
    let (journal, kept) = Journal::open::<crate::Solution>(path, |s| s.id.clone())?;
    if kept.len() > sols.len() {
        anyhow::bail!(
            "{} holds {} records, the input {}: the file is left as it is; choose another output",
            path.display(),
            kept.len(),
            sols.len()
        );
    }
    if let Some(i) = kept.iter().zip(sols).position(|(k, s)| k.id != s.id) {
        anyhow::bail!(
            "{}: record {}: `{}` is not the input's record {} (`{}`): the file is left as it is; choose another output",
            path.display(),
            i + 1,
            kept[i].id,
            i + 1,
            sols[i].id
        );
    }
    Ok((journal, kept))
}

/// Where a run writing solutions to `output` keeps them as it goes: a `.jsonl` output is its
/// own journal; any other file (Parquet, a JSON array, written whole) gets one beside it,
/// `OUTPUT.partial.jsonl`, resumed like any other until [`finish_partial`] writes the output
/// from it; stdout (`-`) has none (it is streamed).
pub fn journal_of(output: &Path) -> Option<PathBuf> {
    if output == Path::new("-") {
        return None;
    }
    Some(match output.extension().is_some_and(|e| e == "jsonl") {
        true => output.to_path_buf(),
        false => beside(output, "partial.jsonl"),
    })
}

/// Whether `output` is written whole at the end from a journal beside it ([`journal_of`]).
pub fn is_written_whole(output: &Path) -> bool {
    journal_of(output).is_some_and(|j| j != output)
}

/// Write `records` (a finished run's, in order) to `output`, written whole, then remove the
/// journal they were kept in ([`journal_of`]) and its recorded settings. A name in a format
/// stepwise does not write is refused before the journal is touched.
pub fn finish_partial(output: &Path, records: &[crate::Solution]) -> Result<()> {
    let mut writer = crate::SolutionWriter::create(output, crate::Format::Stepwise)?;
    for r in records {
        writer.write(r)?;
    }
    writer.finish()?;
    if let Some(journal) = journal_of(output).filter(|j| j != output) {
        for done in [beside(&journal, "settings.json"), journal] {
            std::fs::remove_file(&done).with_context(|| format!("removing {}", done.display()))?;
        }
    }
    Ok(())
}

/// Put records resumed from a journal back in the order of `keys` (their input order).
pub fn sort_like<'a, T>(kept: &mut [T], keys: impl Iterator<Item = &'a str>, key: impl Fn(&T) -> &str) {
    let order: std::collections::HashMap<&str, usize> = keys.enumerate().map(|(i, k)| (k, i)).collect();
    kept.sort_by_key(|r| order.get(key(r)).copied().unwrap_or(usize::MAX));
}

/// A fingerprint of `items` (each as its JSON): equal for the same records, different when any
/// record's content, or their order or number, changes. Recorded with a resumable output's
/// settings, so a resume on an edited input is refused instead of keeping stale records.
pub fn fingerprint<T: Serialize>(items: &[T]) -> Result<String> {
    use std::hash::Hasher;
    let mut h = twox_hash::XxHash64::with_seed(0);
    for item in items {
        h.write(serde_json::to_string(item)?.as_bytes());
        h.write_u8(b'\n');
    }
    Ok(format!("{:016x}", h.finish()))
}

/// A claim on an output that a run appends to and resumes (a journal, a run folder's marker):
/// no other process writes it while the claim lives, and a run with other settings than the
/// output was started with is refused.
///
/// - `PATH.lock` holds the claiming process's id; a lock whose process is gone (killed, even by
///   `kill -9`) is taken over; one whose process lives is refused, naming it.
/// - `PATH.settings.json` records the settings of the run that started the output; a later run
///   whose settings differ is refused, naming the first setting that does.
#[derive(Debug)]
pub struct Claim {
    lock: PathBuf,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.lock);
    }
}

/// `path` with `suffix` appended to its file name.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!("{name}.{suffix}"))
}

/// Whether process `pid` is running (where the system says; elsewhere it is assumed to be).
fn process_lives(pid: u32) -> bool {
    let proc = Path::new("/proc");
    !proc.is_dir() || proc.join(pid.to_string()).exists()
}

/// Claim the output `path` for this process, for a run with `settings` (a JSON object of the
/// options that decide what the output holds).
pub fn claim(path: &Path, settings: &serde_json::Value) -> Result<Claim> {
    let claim = lock(path)?;
    let recorded = beside(path, "settings.json");
    let started = path.metadata().is_ok_and(|m| m.len() > 0);
    if started && recorded.exists() {
        let text = std::fs::read_to_string(&recorded).with_context(|| format!("reading {}", recorded.display()))?;
        let theirs: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{}: not JSON", recorded.display()))?;
        if &theirs != settings {
            let field = first_difference(&theirs, settings);
            anyhow::bail!(
                "{} was started with other settings ({field}; see {}): use another output, or delete both to start over",
                path.display(),
                recorded.display()
            );
        }
        return Ok(claim);
    }
    if started {
        anyhow::bail!(
            "{} exists and was not started by this command (it has no {}): it is left as it is; choose another output, or delete it",
            path.display(),
            recorded.display()
        );
    }
    std::fs::write(&recorded, serde_json::to_string_pretty(settings)?)
        .with_context(|| format!("writing {}", recorded.display()))?;
    Ok(claim)
}

/// The lock half of [`claim`]: `path` is written by this process only while the claim lives.
pub fn lock(path: &Path) -> Result<Claim> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let lock = beside(path, "lock");
    let me = std::process::id();
    loop {
        match OpenOptions::new().write(true).create_new(true).open(&lock) {
            Ok(mut f) => {
                f.write_all(me.to_string().as_bytes())?;
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let holder = std::fs::read_to_string(&lock).unwrap_or_default();
                match holder.trim().parse::<u32>() {
                    Ok(pid) if pid != me && process_lives(pid) => anyhow::bail!(
                        "{}: another stepwise process ({pid}) is writing it (lock {}); wait for it, or delete the lock if that process is not stepwise",
                        path.display(),
                        lock.display()
                    ),
                    // Left by a process that is gone (or torn): take it over.
                    _ => std::fs::remove_file(&lock).with_context(|| format!("removing {}", lock.display()))?,
                }
            }
            Err(e) => return Err(e).with_context(|| format!("creating {}", lock.display())),
        }
    }
    Ok(Claim { lock })
}

/// The first setting in which two settings objects differ, with both values.
fn first_difference(then: &serde_json::Value, now: &serde_json::Value) -> String {
    difference_at("", then, now).unwrap_or_else(|| "the settings differ".into())
}

/// The first setting that differs, named by its path into nested objects (`task.timeout`).
fn difference_at(at: &str, then: &serde_json::Value, now: &serde_json::Value) -> Option<String> {
    let (Some(a), Some(b)) = (then.as_object(), now.as_object()) else {
        return (then != now).then(|| format!("`{at}`: {then} then, {now} now"));
    };
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let null = serde_json::Value::Null;
    keys.into_iter().find_map(|k| {
        let path = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
        difference_at(&path, a.get(k).unwrap_or(&null), b.get(k).unwrap_or(&null))
    })
}

#[cfg(test)]
mod claim_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_process_and_one_set_of_settings_per_output() {
        let dir_tmp = tempfile::tempdir().unwrap();
        let dir = dir_tmp.path().join("stepwise-claim");
        let out = dir.join("labels.jsonl");
        let settings = json!({"rollouts": 16, "seed": 0});
        let held = claim(&out, &settings).unwrap();
        // A lock held by a living process (here: pid 1) is refused; this process's own is not.
        std::fs::write(beside(&out, "lock"), "1").unwrap();
        let err = claim(&out, &settings).unwrap_err().to_string();
        assert!(err.contains("another stepwise process (1)"), "{err}");
        // A lock left by a process that is gone is taken over.
        drop(held);
        std::fs::write(beside(&out, "lock"), "4000000000").unwrap();
        std::fs::write(&out, "{}\n").unwrap();
        let again = claim(&out, &settings).unwrap();
        drop(again);
        assert!(!beside(&out, "lock").exists(), "the lock goes with the claim");
        // Other settings on a started output: refused, naming the setting.
        let err = claim(&out, &json!({"rollouts": 4, "seed": 0})).unwrap_err().to_string();
        assert!(err.contains("`rollouts`: 16 then, 4 now"), "{err}");
        // An output not started yet takes any settings.
        std::fs::write(&out, "").unwrap();
        claim(&out, &json!({"rollouts": 4, "seed": 0})).unwrap();
        // A file this command did not start (no settings beside it) is refused, untouched.
        let theirs = dir.join("theirs.jsonl");
        std::fs::write(&theirs, "{\"id\": \"a\"}\n").unwrap();
        let err = claim(&theirs, &settings).unwrap_err().to_string();
        assert!(err.contains("was not started by this command"), "{err}");
        assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "{\"id\": \"a\"}\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Rec {
        id: String,
    }

    /// A torn last line is dropped; a file of another kind (another format's records, binary
    /// data) is refused, naming the line, and left byte for byte as it was.
    #[test]
    fn a_torn_line_is_dropped_and_another_file_is_never_truncated() {
        let dir_tmp = tempfile::tempdir().unwrap();
        let dir = dir_tmp.path().join("stepwise-journal");
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("out.jsonl");
        std::fs::write(&out, "{\"id\": \"a\"}\n{\"id\": \"b\"}\n{\"id\": \"c").unwrap();
        let (mut j, kept) = Journal::open::<Rec>(&out, |r| r.id.clone()).unwrap();
        assert_eq!(kept.len(), 2);
        j.append("c".into(), &Rec { id: "c".into() }).unwrap();
        drop(j);
        assert_eq!(std::fs::read_to_string(&out).unwrap().lines().count(), 3);
        for (name, bytes) in [
            (
                "trl.jsonl",
                &b"{\"prompt\": \"q\", \"completions\": [\"a\"], \"labels\": [true]}\n"[..],
            ),
            ("data.parquet.jsonl", &b"PAR1\x15\x04\x15\x10\n\x00\x00PAR1"[..]),
            ("second.jsonl", &b"{\"id\": \"a\"}\nnot json\n{\"id\": \"b\"}\n"[..]),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, bytes).unwrap();
            let err = Journal::open::<Rec>(&path, |r| r.id.clone())
                .err()
                .expect(name)
                .to_string();
            let line = if name == "second.jsonl" { ":2:" } else { ":1:" };
            assert!(err.contains(line) && err.contains("not a record"), "{name}: {err}");
            assert_eq!(std::fs::read(&path).unwrap(), bytes, "{name} was changed");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
