//! Append-only JSONL with resume: records are written one line at a time and flushed; after a
//! crash (even SIGKILL) a torn last line is dropped and the keys already written are skipped.

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
            let mut r = BufReader::new(File::open(path)?);
            let mut line = String::new();
            loop {
                line.clear();
                let n = r.read_line(&mut line)?;
                if n == 0 || !line.ends_with('\n') {
                    break; // end, or a torn last line
                }
                match serde_json::from_str::<T>(&line) {
                    Ok(v) => {
                        kept.push(v);
                        good_bytes += n as u64;
                    }
                    Err(_) => break,
                }
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

/// Put records resumed from a journal back in the order of `keys` (their input order).
pub fn sort_like<'a, T>(kept: &mut [T], keys: impl Iterator<Item = &'a str>, key: impl Fn(&T) -> &str) {
    let order: std::collections::HashMap<&str, usize> = keys.enumerate().map(|(i, k)| (k, i)).collect();
    kept.sort_by_key(|r| order.get(key(r)).copied().unwrap_or(usize::MAX));
}
