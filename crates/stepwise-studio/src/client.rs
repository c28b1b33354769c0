//! A client of the studio's HTTP API, for scripts that label (and the lab's simulated
//! labellers): the same routes the page calls. Every call is idempotent (a rating is a PUT of
//! the step's value, `next` returns the open assignment again), so one that fails on the way
//! (a refused connection, a 5xx) is retried, never turned into a lost or a doubled rating.

use crate::store::RecordView;
use anyhow::{bail, Context, Result};
use reqwest::blocking::{Client as Http, RequestBuilder};
use serde_json::{json, Value};
use std::time::Duration;

/// A signed-in user of a studio.
pub struct Client {
    base: String,
    http: Http,
    token: String,
}

/// Tries per call.
const TRIES: u32 = 4;

fn send(what: &str, req: impl Fn() -> RequestBuilder) -> Result<Value> {
    let mut wait = Duration::from_millis(100);
    for attempt in 1..=TRIES {
        let last = attempt == TRIES;
        match req().send() {
            Ok(res) if res.status().is_server_error() && !last => {}
            Ok(res) => {
                let status = res.status();
                let body: Value = res.json().unwrap_or(Value::Null);
                if !status.is_success() {
                    let why = body["error"].as_str().unwrap_or("no reason given");
                    bail!("{what}: {status}: {why}");
                }
                return Ok(body);
            }
            Err(e) if last || !(e.is_connect() || e.is_timeout()) => {
                return Err(e).with_context(|| format!("{what}: no answer"));
            }
            Err(_) => {}
        }
        std::thread::sleep(wait);
        wait *= 2;
    }
    unreachable!("the last try returns")
}

impl Client {
    /// Signs in to the studio at `base` (`http://HOST:PORT`).
    pub fn login(base: &str, name: &str, password: &str) -> Result<Client> {
        stepwise_remote::client::tls_with_ring();
        let http = Http::builder().timeout(Duration::from_secs(60)).build()?;
        let base = base.trim_end_matches('/').to_string();
        let url = format!("{base}/api/login");
        let body = json!({"name": name, "password": password});
        let v = send("signing in", || http.post(&url).json(&body))?;
        let token = v["token"]
            .as_str()
            .context("signing in: no token in the answer")?
            .to_string();
        Ok(Client { base, http, token })
    }

    fn call(&self, what: &str, method: reqwest::Method, path: &str, body: Option<&Value>) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        send(what, || {
            let r = self.http.request(method.clone(), &url).bearer_auth(&self.token);
            match body {
                Some(b) => r.json(b),
                None => r,
            }
        })
    }

    /// The record to label next in `project` (row id), or `None` when the queue is done.
    pub fn next(&self, project: &str) -> Result<Option<i64>> {
        let v = self.call(
            "next record",
            reqwest::Method::POST,
            &format!("/api/projects/{project}/next"),
            None,
        )?;
        Ok(v["record"].as_i64())
    }

    /// A record of this user's, as the page shows it.
    pub fn record(&self, id: i64) -> Result<RecordView> {
        let v = self.call(
            "reading a record",
            reqwest::Method::GET,
            &format!("/api/records/{id}"),
            None,
        )?;
        Ok(serde_json::from_value(v)?)
    }

    /// Rates step `step` of record `id` (−1, 0, +1, or `None` to clear).
    pub fn rate(&self, id: i64, step: usize, rating: Option<i64>, comment: Option<&str>) -> Result<()> {
        self.put_step(id, step, json!({"rating": rating, "comment": comment}))
    }

    /// Writes step `step` of record `id` right (a correction, PRM800K's `human_completion`;
    /// `""` removes it), its rating given as `rating` (the same call saves both).
    pub fn correct(&self, id: i64, step: usize, rating: Option<i64>, text: &str) -> Result<()> {
        self.put_step(id, step, json!({"rating": rating, "correction": text}))
    }

    fn put_step(&self, id: i64, step: usize, body: serde_json::Value) -> Result<()> {
        self.call(
            "rating",
            reqwest::Method::PUT,
            &format!("/api/records/{id}/steps/{step}"),
            Some(&body),
        )?;
        Ok(())
    }

    /// Finishes record `id` with one of PRM800K's reasons.
    pub fn finish(&self, id: i64, reason: &str) -> Result<()> {
        let body = json!({"finish_reason": reason});
        self.call(
            "finishing",
            reqwest::Method::POST,
            &format!("/api/records/{id}/finish"),
            Some(&body),
        )?;
        Ok(())
    }
}
