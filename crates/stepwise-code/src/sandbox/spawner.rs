//! Every sandbox is started from one long-lived thread. `PR_SET_PDEATHSIG` fires when the thread
//! that forked a process ends, not the process: started from a worker thread that later exits
//! (a rayon pool dropped, a Python thread returning), a long-lived checker would be killed under
//! its users. From this thread, which lives as long as the process, it fires exactly when the
//! process dies — by `kill -9` too — and takes the whole sandbox with it.

use anyhow::{anyhow, Context, Result};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock};

type Request = (Command, Sender<std::io::Result<Child>>);

fn requests() -> &'static Mutex<Sender<Request>> {
    static SPAWNER: OnceLock<Mutex<Sender<Request>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = channel::<Request>();
        std::thread::Builder::new()
            .name("stepwise-sandbox-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("starting the sandbox's spawner thread");
        Mutex::new(tx)
    })
}

/// `cmd.spawn()` on the spawner thread.
pub(crate) fn spawn(cmd: Command) -> Result<Child> {
    let (tx, rx) = channel();
    requests()
        .lock()
        .map_err(|_| anyhow!("the sandbox's spawner failed earlier"))?
        .send((cmd, tx))
        .map_err(|_| anyhow!("the sandbox's spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| anyhow!("the sandbox's spawner thread is gone"))?
        .context("spawning the interpreter")
}

/// A fresh host directory for one run in the insecure mode.
pub(crate) fn scratch_dir() -> Result<PathBuf> {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "stepwise-sandbox-{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}
