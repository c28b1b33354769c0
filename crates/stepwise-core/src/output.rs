//! Where an output file is written, as a user expects of each kind of path:
//! - a regular file (new or replaced) is written beside itself under a short temporary name and
//!   renamed into place when complete, keeping the old file's mode (and owner, where allowed):
//!   a run that fails leaves the old file as it was, and a partial output never looks complete;
//! - a symbolic link stays a link: the file it points to is replaced that way;
//! - a special file (`/dev/null`, a device, a FIFO, a socket) is written through, never replaced
//!   by a regular file;
//! - `-` is standard output; a directory is refused.

use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// An output being written.
pub struct Output {
    /// The path the user gave (for messages).
    path: PathBuf,
    /// Where the bytes go now.
    writing: PathBuf,
    /// The file renamed into place at the end (`None`: written in place, or standard output).
    rename_to: Option<PathBuf>,
    /// The replaced file's metadata, whose mode and owner the new one keeps.
    old: Option<std::fs::Metadata>,
}

/// A temporary name beside `target`, short whatever the target's name (a name of 250 bytes plus
/// a suffix would pass the file system's limit).
fn temporary_beside(target: &Path) -> PathBuf {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    target.with_file_name(format!(".stepwise-{}-{n}.partial", std::process::id()))
}

fn is_special(t: &std::fs::FileType) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        t.is_char_device() || t.is_block_device() || t.is_fifo() || t.is_socket()
    }
    #[cfg(not(unix))]
    {
        let _ = t;
        false
    }
}

impl Output {
    /// Prepares `path` for writing (see the module's documentation); its parent folder is made
    /// when missing.
    pub fn prepare(path: &Path) -> Result<Output> {
        let io_err = |source| Error::Io {
            file: path.to_path_buf(),
            source,
        };
        if path == Path::new("-") {
            return Ok(Output {
                path: path.into(),
                writing: path.into(),
                rename_to: None,
                old: None,
            });
        }
        // A link is followed to the file it names (however many links deep).
        let target = match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => match path.canonicalize() {
                Ok(t) => t,
                // A dangling link: the file it names is created.
                Err(_) => {
                    let to = std::fs::read_link(path).map_err(io_err)?;
                    match path.parent() {
                        Some(dir) if to.is_relative() => dir.join(to),
                        _ => to,
                    }
                }
            },
            _ => path.to_path_buf(),
        };
        match std::fs::metadata(&target) {
            Ok(m) if m.is_dir() => Err(Error::Other {
                file: path.into(),
                message: "is a folder: name a file to write".into(),
            }),
            Ok(m) if is_special(&m.file_type()) => Ok(Output {
                path: path.into(),
                writing: target,
                rename_to: None,
                old: None,
            }),
            found => {
                if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|source| Error::Io {
                        file: dir.to_path_buf(),
                        source,
                    })?;
                }
                Ok(Output {
                    path: path.into(),
                    writing: temporary_beside(&target),
                    rename_to: Some(target),
                    old: found.ok(),
                })
            }
        }
    }

    /// Where to write the bytes (a temporary file, the special file itself, or `-`).
    pub fn writing(&self) -> &Path {
        &self.writing
    }

    /// Opens [`Output::writing`] for writing (standard output for `-`).
    pub fn open(&self) -> Result<Box<dyn Write>> {
        if self.writing == Path::new("-") {
            return Ok(Box::new(io::stdout()));
        }
        let f = if self.rename_to.is_some() {
            File::create(&self.writing)
        } else {
            // A device or FIFO: written through, never truncated or replaced.
            OpenOptions::new().write(true).open(&self.writing)
        }
        .map_err(|source| Error::Io {
            file: self.path.clone(),
            source,
        })?;
        Ok(Box::new(f))
    }

    /// The output complete: the temporary file takes the old one's mode and owner and is renamed
    /// into place. On failure the temporary file is removed and the old file left as it was.
    pub fn commit(mut self) -> Result<()> {
        let Some(target) = self.rename_to.take() else {
            return Ok(());
        };
        let result = (|| -> io::Result<()> {
            if let Some(old) = &self.old {
                std::fs::set_permissions(&self.writing, old.permissions())?;
                #[cfg(unix)]
                {
                    use std::os::unix::fs::MetadataExt;
                    // Only root may give a file away; anyone else keeps their own.
                    let _ = std::os::unix::fs::chown(&self.writing, Some(old.uid()), Some(old.gid()));
                }
            }
            std::fs::rename(&self.writing, &target)
        })();
        if let Err(source) = result {
            let _ = std::fs::remove_file(&self.writing);
            return Err(Error::Io {
                file: self.path.clone(),
                source,
            });
        }
        Ok(())
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        // Not committed: the partial file goes, the old output (if any) stays.
        if self.rename_to.is_some() {
            let _ = std::fs::remove_file(&self.writing);
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::io::Read;

    fn dir(name: &str) -> tempfile::TempDir {
        tempfile::TempDir::with_prefix(format!("stepwise-output-{name}-")).unwrap()
    }

    fn write(path: &Path, text: &str) -> Result<()> {
        let out = Output::prepare(path)?;
        out.open()?.write_all(text.as_bytes()).unwrap();
        out.commit()
    }

    #[test]
    fn a_regular_file_is_replaced_whole_keeping_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let d_tmp = dir("regular");
        let d = d_tmp.path();
        let p = d.join("out.jsonl");
        write(&p, "one\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        write(&p, "two\n").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "two\n");
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o640);
        // Not committed: the old file stays and no partial file is left behind.
        let out = Output::prepare(&p).unwrap();
        out.open().unwrap().write_all(b"half").unwrap();
        drop(out);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "two\n");
        assert_eq!(std::fs::read_dir(d).unwrap().count(), 1);
        // A name at the file system's limit still gets a temporary name beside it.
        let long = d.join(format!("{}.jsonl", "n".repeat(249)));
        write(&long, "long\n").unwrap();
        assert_eq!(std::fs::read_to_string(&long).unwrap(), "long\n");
    }

    #[test]
    fn a_link_stays_a_link_and_its_target_is_updated() {
        let d_tmp = dir("link");
        let d = d_tmp.path();
        let target = d.join("real.jsonl");
        std::fs::write(&target, "old\n").unwrap();
        let link = d.join("link.jsonl");
        std::os::unix::fs::symlink("real.jsonl", &link).unwrap();
        write(&link, "new\n").unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new\n");
        // A dangling link creates the file it names.
        let dangling = d.join("dangling.jsonl");
        std::os::unix::fs::symlink("made.jsonl", &dangling).unwrap();
        write(&dangling, "made\n").unwrap();
        assert_eq!(std::fs::read_to_string(d.join("made.jsonl")).unwrap(), "made\n");
    }

    #[test]
    fn special_files_are_written_through() {
        // /dev/null stays a device.
        write(Path::new("/dev/null"), "gone\n").unwrap();
        assert!(!std::fs::metadata("/dev/null").unwrap().is_file());
        // A FIFO is written into, and stays a FIFO.
        let d_tmp = dir("fifo");
        let d = d_tmp.path();
        let fifo = d.join("pipe.jsonl");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                let mut s = String::new();
                File::open(&fifo).unwrap().read_to_string(&mut s).unwrap();
                s
            })
        };
        write(&fifo, "through\n").unwrap();
        assert_eq!(reader.join().unwrap(), "through\n");
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
        // A folder is refused with its name.
        let err = write(d, "x").unwrap_err().to_string();
        assert!(err.contains("is a folder"), "{err}");
    }
}
