//! Finding NVIDIA's libraries at run time, so that one CUDA build of stepwise starts on any
//! machine and runs wherever a driver is.
//!
//! cudarc loads the driver (`libcuda.so.1`), NVRTC and cuBLAS by name on first use, from the
//! dynamic loader's search path. The driver is always there where a driver is installed; NVRTC
//! and cuBLAS often are not on that path: they come with a CUDA toolkit (`/usr/local/cuda`) or as
//! Python wheels beside PyTorch (`site-packages/nvidia/...`). Before cudarc's first call, this
//! looks for each in those places and opens it by its full path: the dynamic loader then answers
//! cudarc's later lookup by name with the library already open (it matches the library's
//! soname). A library found nowhere is a clear error naming what to install, not cudarc's panic.

use anyhow::{bail, Result};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The libraries the engine calls, each with those it needs opened before it (in order).
const LIBRARIES: &[(&str, &[&str])] = &[
    ("nvrtc", &["nvrtc-builtins"]),
    ("cublasLt", &[]),
    ("cublas", &["cublasLt"]),
];

/// Where a library not on the loader's path is looked for, beside what `STEPWISE_CUDA_LIBS`
/// (folders separated by `:`) names first.
fn search_folders() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Ok(list) = std::env::var("STEPWISE_CUDA_LIBS") {
        dirs.extend(std::env::split_paths(&list));
    }
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDA_TOOLKIT_ROOT_DIR"] {
        if let Ok(root) = std::env::var(var) {
            let root = PathBuf::from(root);
            dirs.extend([
                root.join("lib64"),
                root.join("lib"),
                root.join("targets/x86_64-linux/lib"),
            ]);
        }
    }
    dirs.extend(
        [
            "/usr/local/cuda/lib64",
            "/usr/local/cuda/targets/x86_64-linux/lib",
            "/opt/cuda/lib64",
        ]
        .map(PathBuf::from),
    );
    // NVIDIA's Python wheels (what PyTorch installs): site-packages/nvidia/{cu13,cublas,...}/lib.
    for site in python_site_packages() {
        let nvidia = site.join("nvidia");
        if let Ok(entries) = std::fs::read_dir(&nvidia) {
            let mut found: Vec<PathBuf> = entries.flatten().map(|e| e.path().join("lib")).collect();
            found.sort();
            // Newer CUDA first (cu13 before cu12), then the per-library wheels.
            found.reverse();
            dirs.extend(found);
        }
    }
    dirs.retain(|d| d.is_dir());
    dirs.dedup();
    dirs
}

/// The site-packages folders of the Python environments in reach: the active virtual or conda
/// environment's, and those `python3` reports.
fn python_site_packages() -> Vec<PathBuf> {
    let mut prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .iter()
        .filter_map(|v| std::env::var_os(v).map(PathBuf::from))
        .collect();
    prefixes.extend(["/usr", "/usr/local", "/opt/conda"].map(PathBuf::from));
    let mut sites: Vec<PathBuf> = Vec::new();
    for prefix in prefixes {
        if let Ok(entries) = std::fs::read_dir(prefix.join("lib")) {
            for e in entries.flatten() {
                let name = e.file_name();
                if name.to_string_lossy().starts_with("python3") {
                    sites.push(e.path().join("site-packages"));
                    sites.push(e.path().join("dist-packages"));
                }
            }
        }
    }
    let asked = std::process::Command::new("python3")
        .args([
            "-c",
            "import site; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()]))",
        ])
        .output();
    if let Ok(out) = asked {
        sites.extend(String::from_utf8_lossy(&out.stdout).lines().map(PathBuf::from));
    }
    sites
}

/// The library files named `lib{name}.so*` in `dir`, newest-looking (longest name) first.
fn files_named(dir: &Path, name: &str) -> Vec<PathBuf> {
    let prefix = format!("lib{name}.so");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n == prefix || n.starts_with(&format!("{prefix}.")))
        })
        .collect();
    files.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    files
}

/// Whether the loader finds `name` by one of the names cudarc asks for.
fn on_loader_path(name: &str) -> bool {
    cudarc::get_lib_name_candidates(name).iter().any(|candidate| {
        // SAFETY: opening NVIDIA's own libraries, whose initialisers have no preconditions.
        match unsafe { libloading::Library::new(candidate) } {
            Ok(lib) => {
                // Kept open for the life of the process, as cudarc keeps it.
                std::mem::forget(lib);
                true
            }
            Err(_) => false,
        }
    })
}

/// Opens `name` (after what it needs) from the first search folder holding it; whether it did.
fn open_from(dirs: &[PathBuf], name: &str, needs: &[&str]) -> bool {
    for dir in dirs {
        let Some(file) = files_named(dir, name).into_iter().next() else {
            continue;
        };
        for need in needs {
            if let Some(dep) = files_named(dir, need).into_iter().next() {
                // SAFETY: as in `on_loader_path`.
                if let Ok(lib) = unsafe { libloading::Library::new(&dep) } {
                    std::mem::forget(lib);
                }
            }
        }
        // SAFETY: as in `on_loader_path`.
        if let Ok(lib) = unsafe { libloading::Library::new(&file) } {
            std::mem::forget(lib);
            if on_loader_path(name) {
                return true;
            }
        }
    }
    false
}

/// Makes the driver, NVRTC and cuBLAS reachable for cudarc, once per process; an error names
/// what is missing and how to provide it.
pub(crate) fn ensure() -> Result<()> {
    static DONE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    match DONE.get_or_init(find_all) {
        Ok(()) => Ok(()),
        Err(e) => bail!("{e}"),
    }
}

/// Makes NVRTC alone reachable (compiling the kernels needs no driver).
pub(crate) fn ensure_nvrtc() -> Result<()> {
    static DONE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    match DONE.get_or_init(|| find(&LIBRARIES[..1])) {
        Ok(()) => Ok(()),
        Err(e) => bail!("{e}"),
    }
}

fn find_all() -> std::result::Result<(), String> {
    if !on_loader_path("cuda") {
        return Err("no NVIDIA driver found (libcuda.so.1 is not on the library path): \
                    the CUDA engine needs a machine with an NVIDIA GPU and its driver"
            .into());
    }
    find(LIBRARIES)
}

/// Makes each of `libraries` reachable (see the module's documentation).
fn find(libraries: &[(&str, &[&str])]) -> std::result::Result<(), String> {
    let mut dirs: Option<Vec<PathBuf>> = None;
    for (name, needs) in libraries {
        if on_loader_path(name) {
            continue;
        }
        let dirs = dirs.get_or_insert_with(search_folders);
        if !open_from(dirs, name, needs) {
            return Err(format!(
                "lib{name}.so was found neither on the library path nor in {} \
                 (the CUDA engine needs NVRTC and cuBLAS of CUDA 12 or 13: a CUDA toolkit, or \
                 `pip install nvidia-cuda-nvrtc nvidia-cublas`; or set STEPWISE_CUDA_LIBS to the \
                 folder holding them)",
                if dirs.is_empty() {
                    "any CUDA or Python folder".to_string()
                } else {
                    dirs.iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ));
        }
    }
    Ok(())
}
