//! What a jailed process sees of the file system: a fresh root (a small tmpfs) holding read-only
//! bind mounts of `/usr` and the interpreter's own directories, the links of a merged-/usr system
//! (`/bin`, `/lib`, ...), the loader's cache, four harmless devices, its own `/proc`, and a
//! writable `/tmp` of bounded size — nothing else of the machine. Computed once per interpreter
//! in the parent (where allocating is allowed); the jail's child only reads it.

use anyhow::{Context, Result};
use nix::mount::MsFlags;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One bind mount.
pub(crate) struct Bind {
    /// The host path.
    pub source: CString,
    /// Where it appears, under the mount point (before the root is pivoted).
    pub target: CString,
    /// The read-only remount's flags (those the source's mount locks included), or `None` for a
    /// device, which stays as it is.
    pub read_only: Option<MsFlags>,
}

/// A path inside the new root and what Landlock lets the program do beneath it.
pub(crate) struct Rule {
    pub path: CString,
    pub kind: RuleKind,
}

/// The kinds of access the Landlock ruleset grants.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum RuleKind {
    /// Read files and list directories (the interpreter's and the libraries' directories).
    ReadOnly,
    /// Read and execute one file (the interpreter and its ELF loader: nothing else runs).
    Executable,
    /// Read a file.
    ReadFile,
    /// Read and write a device node.
    Device,
    /// Everything but executing (the writable `/tmp`).
    Work,
}

/// The prepared file-system view (see the module's documentation).
pub(crate) struct View {
    /// The host directory the new root is mounted on (in the jail's own mount namespace only).
    pub mount_point: CString,
    /// Directories to create in the new root, parents first.
    pub dirs: Vec<CString>,
    /// Empty files to create as the targets of file binds.
    pub files: Vec<CString>,
    pub binds: Vec<Bind>,
    /// Symbolic links to create: (the link, what it points to).
    pub links: Vec<(CString, CString)>,
    /// `/proc` and `/tmp` under the mount point.
    pub proc_dir: CString,
    pub work_dir: CString,
    /// Landlock's rules, by paths inside the new root.
    pub rules: Vec<Rule>,
}

/// Top-level entries of `/` that a merged-/usr system makes links into `/usr`.
const TOP_LINKS: [&str; 6] = ["/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"];
/// Device nodes a program may use.
const DEVICES: [&str; 4] = ["/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"];
/// Files of `/etc` the loader and the interpreter read.
const ETC_FILES: [&str; 1] = ["/etc/ld.so.cache"];

fn cstring(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).with_context(|| format!("{}: a path with a NUL byte", p.display()))
}

/// The host directory new roots are mounted on: one per user, empty, never removed (each jail
/// mounts over it in a mount namespace of its own, so the host never sees what is mounted).
pub(crate) fn mount_point() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(".stepwise-sandbox-{}", nix::unistd::geteuid()));
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
    }
    let meta = std::fs::symlink_metadata(&dir).with_context(|| format!("reading {}", dir.display()))?;
    anyhow::ensure!(
        meta.is_dir(),
        "{}: expected a directory (the sandbox mounts its roots there)",
        dir.display()
    );
    Ok(dir)
}

/// The flags a read-only remount of a bind of `source` needs: read-only, no set-uid, no devices,
/// and the flags its mount already has, which a user namespace may not clear.
fn locked_flags(source: &Path) -> MsFlags {
    use nix::sys::statvfs::{statvfs, FsFlags};
    let mut flags =
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if let Ok(s) = statvfs(source) {
        let f = s.flags();
        for (has, flag) in [
            (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
            (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
            (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
            (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
        ] {
            if f.contains(has) {
                flags |= flag;
            }
        }
    }
    flags
}

/// The directories an interpreter needs to be bound read-only: `/usr`, and each of `own` (its
/// prefixes and its binary's directory) not already beneath another.
fn read_only_roots(own: &[PathBuf]) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = vec![PathBuf::from("/usr")];
    for p in TOP_LINKS {
        let p = Path::new(p);
        if p.is_dir() && !p.is_symlink() {
            roots.push(p.to_path_buf());
        }
    }
    let mut own: Vec<PathBuf> = own.iter().filter(|p| p.is_dir()).cloned().collect();
    own.sort_by_key(|p| p.components().count());
    for p in own {
        if p.parent().is_some() && !roots.iter().any(|r| p.starts_with(r)) {
            roots.push(p);
        }
    }
    roots
}

impl View {
    /// The view for the interpreter `executable`, whose prefixes and binary's directory are
    /// `own`.
    pub fn new(executable: &Path, own: &[PathBuf]) -> Result<View> {
        let mp = mount_point()?;
        let under = |p: &Path| mp.join(p.strip_prefix("/").unwrap_or(p));
        let mut dirs: Vec<PathBuf> = Vec::new();
        let want_dir = |dirs: &mut Vec<PathBuf>, p: &Path| {
            for a in p.ancestors().collect::<Vec<_>>().into_iter().rev() {
                if a != Path::new("/") && !dirs.iter().any(|d| d == a) {
                    dirs.push(a.to_path_buf());
                }
            }
        };
        let mut view = View {
            mount_point: cstring(&mp)?,
            dirs: Vec::new(),
            files: Vec::new(),
            binds: Vec::new(),
            links: Vec::new(),
            proc_dir: cstring(&under(Path::new("/proc")))?,
            work_dir: cstring(&under(Path::new("/tmp")))?,
            rules: Vec::new(),
        };
        for root in read_only_roots(own) {
            want_dir(&mut dirs, &root);
            view.binds.push(Bind {
                source: cstring(&root)?,
                target: cstring(&under(&root))?,
                read_only: Some(locked_flags(&root)),
            });
            view.rules.push(Rule {
                path: cstring(&root)?,
                kind: RuleKind::ReadOnly,
            });
        }
        for link in TOP_LINKS {
            if let Ok(to) = std::fs::read_link(link) {
                view.links.push((cstring(&under(Path::new(link)))?, cstring(&to)?));
            }
        }
        for (files, kind) in [(&ETC_FILES[..], RuleKind::ReadFile), (&DEVICES[..], RuleKind::Device)] {
            for f in files {
                let f = Path::new(f);
                if !f.exists() {
                    continue;
                }
                want_dir(&mut dirs, f.parent().unwrap_or(Path::new("/")));
                view.files.push(cstring(&under(f))?);
                view.binds.push(Bind {
                    source: cstring(f)?,
                    target: cstring(&under(f))?,
                    read_only: (kind == RuleKind::ReadFile).then(|| locked_flags(f)),
                });
                view.rules.push(Rule {
                    path: cstring(f)?,
                    kind,
                });
            }
        }
        for file in [Some(executable.to_path_buf()), elf_interpreter(executable)]
            .into_iter()
            .flatten()
        {
            view.rules.push(Rule {
                path: cstring(&file)?,
                kind: RuleKind::Executable,
            });
        }
        for (dir, kind) in [("/proc", RuleKind::ReadOnly), ("/tmp", RuleKind::Work)] {
            want_dir(&mut dirs, Path::new(dir));
            view.rules.push(Rule {
                path: CString::new(dir)?,
                kind,
            });
        }
        view.dirs = dirs.iter().map(|d| cstring(&under(d))).collect::<Result<_>>()?;
        Ok(view)
    }
}

/// The ELF loader a binary names (its `PT_INTERP`), resolved: the one other file the kernel
/// executes to start it. `None` for a static binary or a file this cannot read.
fn elf_interpreter(binary: &Path) -> Option<PathBuf> {
    let bytes = std::fs::read(binary).ok()?;
    let at = |off: usize, len: usize| bytes.get(off..off + len);
    let u16_at = |off: usize| at(off, 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let u64_at = |off: usize| at(off, 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as usize);
    // 64-bit little-endian ELF only (x86-64, aarch64, riscv64).
    if at(0, 6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let (phoff, phentsize, phnum) = (u64_at(0x20)?, u16_at(0x36)?, u16_at(0x38)?);
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        if at(ph, 4)? == 3u32.to_le_bytes() {
            let (offset, size) = (u64_at(ph + 8)?, u64_at(ph + 32)?);
            let path = at(offset, size)?.split(|&b| b == 0).next()?;
            let path = Path::new(std::ffi::OsStr::from_bytes(path));
            return std::fs::canonicalize(path).ok();
        }
    }
    None
}
