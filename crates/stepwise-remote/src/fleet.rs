//! The servers a [`crate::Client`] spreads its requests over: given as URLs or as a file of URLs
//! that is read again when it changes (a server added to it joins the run, one taken out gets no
//! new requests), each with its requests in flight, when it failed last, and the health check's
//! verdict. A server the health check finds not answering (refused, reset, or silent past the
//! check's timeout: dead or hung) is marked down, which moves its requests in flight to the
//! others at once; it rejoins when it answers again.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::watch;

/// Whether `s` is an HTTP(S) URL rather than a folder.
pub fn is_url(s: &str) -> bool {
    s.starts_with("http://") || s.starts_with("https://")
}

/// The URLs in a file of servers: one or more a line (split at commas or spaces), `#` starting a
/// comment, blank lines skipped. An entry that is not an `http(s)://` URL is an error naming the
/// file and line.
pub fn read_server_file(path: &Path) -> Result<Vec<String>> {
    let text = stepwise_core::io::read_regular_file(path).context("reading the server list")?;
    let mut urls = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default();
        for entry in line.split([',', ' ', '\t']).map(str::trim).filter(|e| !e.is_empty()) {
            if !is_url(entry) {
                bail!(
                    "{}:{}: `{entry}` is not an http:// or https:// URL",
                    path.display(),
                    i + 1
                );
            }
            urls.push(entry.trim_end_matches('/').to_string());
        }
    }
    Ok(urls)
}

/// One server.
pub(crate) struct Server {
    /// Its base URL as given.
    pub url: String,
    /// Requests in flight to it.
    pub outstanding: AtomicUsize,
    /// Requests it answered.
    pub served: AtomicUsize,
    /// Until when it is set aside after a failed request.
    aside_until: Mutex<Option<Instant>>,
    /// The health check's verdict: `true` while it does not answer.
    pub down: watch::Sender<bool>,
    /// Taken out of the server file.
    removed: AtomicBool,
}

impl Server {
    fn new(url: String) -> Arc<Self> {
        Arc::new(Server {
            url,
            outstanding: AtomicUsize::new(0),
            served: AtomicUsize::new(0),
            aside_until: Mutex::new(None),
            down: watch::Sender::new(false),
            removed: AtomicBool::new(false),
        })
    }

    /// Neither down, taken out, nor set aside at `now`.
    fn is_up(&self, now: Instant) -> bool {
        !*self.down.borrow() && !self.removed.load(Ordering::SeqCst) && self.back_at(now).is_none()
    }

    /// When it comes back from being set aside, if it is set aside at `now`.
    fn back_at(&self, now: Instant) -> Option<Instant> {
        self.aside_until.lock().unwrap().filter(|t| *t > now)
    }

    /// Set it aside until `until` (after a failure), or clear that (after an answer).
    pub fn set_aside(&self, until: Option<Instant>) {
        *self.aside_until.lock().unwrap() = until;
    }

    /// Record the health check's verdict; whether it changed.
    pub fn mark_down(&self, down: bool) -> bool {
        self.down.send_if_modified(|d| std::mem::replace(d, down) != down)
    }
}

/// A file's modification time and length when it was last read.
type Stamp = Mutex<Option<(SystemTime, u64)>>;

/// The fleet.
pub(crate) struct Fleet {
    servers: RwLock<Vec<Arc<Server>>>,
    /// The file the servers were read from, and its modification time and length when last read.
    file: Option<(PathBuf, Stamp)>,
}

impl Fleet {
    /// The servers at `urls`, and those in `file` when given (at least one in all).
    pub fn new(urls: &[String], file: Option<&Path>) -> Result<Self> {
        let fleet = Fleet {
            servers: RwLock::new(Vec::new()),
            file: file.map(|f| (f.to_path_buf(), Mutex::new(None))),
        };
        for u in urls {
            if !is_url(u) {
                bail!("`{u}` is not an http:// or https:// URL");
            }
            fleet.add(u.trim_end_matches('/'));
        }
        fleet.reload()?;
        if fleet.len() == 0 {
            match file {
                Some(f) => bail!("{}: no server URL in the file", f.display()),
                None => bail!("no server URL given"),
            }
        }
        Ok(fleet)
    }

    fn add(&self, url: &str) -> bool {
        let mut servers = self.servers.write().unwrap();
        if let Some(s) = servers.iter().find(|s| s.url == url) {
            return s.removed.swap(false, Ordering::SeqCst);
        }
        servers.push(Server::new(url.to_string()));
        true
    }

    /// Servers not taken out.
    pub fn len(&self) -> usize {
        let servers = self.servers.read().unwrap();
        servers.iter().filter(|s| !s.removed.load(Ordering::SeqCst)).count()
    }

    /// Every server ever in the fleet, in the order they joined.
    pub fn all(&self) -> Vec<Arc<Server>> {
        self.servers.read().unwrap().clone()
    }

    /// Whether the fleet can change or has more than one server: worth a health check.
    pub fn is_fleet(&self) -> bool {
        self.file.is_some() || self.len() > 1
    }

    /// Read the server file again if it changed: servers new in it join, servers no longer in it
    /// get no new requests. How many joined. A file that cannot be read or holds a bad entry
    /// leaves the fleet as it was (an error at the first read).
    pub fn reload(&self) -> Result<usize> {
        let Some((path, stamp)) = &self.file else { return Ok(0) };
        let meta = std::fs::metadata(path).with_context(|| format!("reading the server list {}", path.display()))?;
        let now = (meta.modified().unwrap_or(SystemTime::UNIX_EPOCH), meta.len());
        if *stamp.lock().unwrap() == Some(now) {
            return Ok(0);
        }
        let urls = read_server_file(path)?;
        *stamp.lock().unwrap() = Some(now);
        let joined = urls.iter().filter(|u| self.add(u)).count();
        for s in self.all() {
            if !urls.contains(&s.url) {
                s.removed.store(true, Ordering::SeqCst);
            }
        }
        Ok(joined)
    }

    /// The server for the next request: the one with the fewest requests in flight among those
    /// up (the first of those tied); when none is up, the set-aside one back soonest, else any
    /// not taken out. Whether it was up.
    pub fn pick(&self) -> (Arc<Server>, bool) {
        let now = Instant::now();
        let servers = self.servers.read().unwrap();
        let up = servers
            .iter()
            .filter(|s| s.is_up(now))
            .min_by_key(|s| s.outstanding.load(Ordering::SeqCst));
        if let Some(s) = up {
            return (s.clone(), true);
        }
        let present = || servers.iter().filter(|s| !s.removed.load(Ordering::SeqCst));
        let soonest = present()
            .filter(|s| !*s.down.borrow())
            .min_by_key(|s| s.back_at(now))
            .or_else(|| present().min_by_key(|s| s.outstanding.load(Ordering::SeqCst)))
            .or_else(|| servers.first())
            .expect("a fleet has a server");
        (soonest.clone(), false)
    }

    /// Whether a server other than `except` is up now.
    pub fn another_up(&self, except: &Server) -> bool {
        let now = Instant::now();
        self.servers
            .read()
            .unwrap()
            .iter()
            .any(|s| !std::ptr::eq(&**s, except) && s.is_up(now))
    }

    /// The first server that is up (else the first).
    pub fn first_up(&self) -> Arc<Server> {
        let now = Instant::now();
        let servers = self.servers.read().unwrap();
        servers.iter().find(|s| s.is_up(now)).unwrap_or(&servers[0]).clone()
    }

    /// Ask every server in the fleet whether it answers (`GET /health`: any HTTP reply counts,
    /// as OpenAI-compatible servers without that route answer 404), at most `timeout` each, and
    /// mark them up or down. The servers that answered.
    pub async fn check(&self, http: &reqwest::Client, timeout: Duration) -> Vec<(String, Result<(), String>)> {
        let mut set = tokio::task::JoinSet::new();
        for s in self.all().into_iter().filter(|s| !s.removed.load(Ordering::SeqCst)) {
            let http = http.clone();
            set.spawn(async move {
                let url = format!("{}/health", root(&s.url));
                let answer = http.get(&url).timeout(timeout).send().await;
                let verdict = answer.map(|_| ()).map_err(|e| format!("{e}"));
                s.mark_down(verdict.is_err());
                (s.url.clone(), verdict)
            });
        }
        let mut out = Vec::new();
        while let Some(r) = set.join_next().await {
            if let Ok(r) = r {
                out.push(r);
            }
        }
        out
    }

    /// Check the fleet every `every` (and read its file again), each server given `patience` to
    /// answer, until the client is dropped.
    pub async fn watch(
        self: Arc<Self>,
        http: reqwest::Client,
        every: Duration,
        patience: Duration,
        on_join: impl Fn(usize),
    ) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            if let Ok(n) = self.reload() {
                if n > 0 {
                    on_join(n);
                }
            }
            self.check(&http, patience).await;
        }
    }
}

/// The server root of a base URL: without a trailing slash or `/v1`.
pub(crate) fn root(url: &str) -> &str {
    let u = url.trim_end_matches('/');
    u.strip_suffix("/v1").unwrap_or(u)
}

/// Resolves when `rx`'s server is marked down (never, if the client goes away first).
pub(crate) async fn went_down(mut rx: watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_file_is_read_with_its_comments_and_errors_name_the_line() {
        let d_tmp = tempfile::tempdir().unwrap();
        let d = d_tmp.path().join("stepwise-fleet");
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("servers.txt");
        std::fs::write(
            &f,
            "# the fleet\nhttp://a:8000/, http://b:8000\n\nhttps://c/v1 # third\n",
        )
        .unwrap();
        assert_eq!(
            read_server_file(&f).unwrap(),
            ["http://a:8000", "http://b:8000", "https://c/v1"]
        );
        std::fs::write(&f, "http://a:8000\ngpu2:8000\n").unwrap();
        let e = read_server_file(&f).unwrap_err().to_string();
        assert!(e.contains("servers.txt:2: `gpu2:8000`"), "{e}");
    }

    #[test]
    fn requests_go_to_the_least_busy_server_that_is_up() {
        let fleet = Fleet::new(&["http://a".into(), "http://b".into(), "http://c".into()], None).unwrap();
        let s = fleet.all();
        s[0].outstanding.store(2, Ordering::SeqCst);
        s[1].outstanding.store(1, Ordering::SeqCst);
        s[2].outstanding.store(1, Ordering::SeqCst);
        assert_eq!(fleet.pick().0.url, "http://b");
        s[1].mark_down(true);
        assert_eq!(fleet.pick().0.url, "http://c");
        s[2].set_aside(Some(Instant::now() + Duration::from_secs(60)));
        let (busiest, up) = fleet.pick();
        assert_eq!((busiest.url.as_str(), up), ("http://a", true));
        s[0].set_aside(Some(Instant::now() + Duration::from_secs(30)));
        let (soonest, up) = fleet.pick();
        assert_eq!((soonest.url.as_str(), up), ("http://a", false));
        assert!(!fleet.another_up(&s[0]));
    }
}
