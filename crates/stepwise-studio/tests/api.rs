//! The studio's HTTP API as a page or a script calls it: sessions and roles on every route,
//! labellers kept apart, quality-control records, agreement, export.

use reqwest::blocking::{Client, Response};
use reqwest::StatusCode;
use serde_json::{json, Value};
use stepwise_core::formats::Format;
use stepwise_core::pairs::step_pairs;
use stepwise_core::record::{Provenance, Rating, Solution, Step, StepLabel};
use stepwise_studio::{NewRecord, Policy, Role, Settings, Store};

struct Studio {
    base: String,
    _dir: tempfile::TempDir,
}

fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::TempDir::with_prefix(format!("stepwise-studio-api-{name}-")).unwrap()
}

fn record(id: &str, steps: usize, gold: Option<&[Rating]>) -> Solution {
    Solution {
        id: id.into(),
        question: format!("question {id}"),
        gold_answer: Some("4".into()),
        final_answer: Some("4".into()),
        steps: (0..steps)
            .map(|i| match gold {
                Some(g) => Step::labelled(format!("step {i} of {id}"), StepLabel::hard(g[i], Provenance::Human)),
                None => Step::new(format!("step {i} of {id}")),
            })
            .collect(),
        ..Default::default()
    }
}

impl Studio {
    /// A studio on a fresh database with `records` (and `gold` ones) under `settings`, and the
    /// users alice, bob (labellers), rita (reviewer) and root (admin).
    fn start(name: &str, settings: Settings, records: Vec<Solution>, gold: Vec<Solution>) -> Studio {
        let dir = scratch(name);
        let mut store = Store::open(&dir.path().join("labels.sqlite")).unwrap();
        let project = store.project_or_create("p", &settings, 7).unwrap();
        let new = records
            .into_iter()
            .map(|solution| NewRecord { solution, gold: false })
            .chain(gold.into_iter().map(|solution| NewRecord { solution, gold: true }))
            .collect();
        store.add_records(&project, new).unwrap();
        for (user, role) in [
            ("alice", Role::Labeller),
            ("bob", Role::Labeller),
            ("rita", Role::Reviewer),
            ("root", Role::Admin),
        ] {
            store.set_user(user, role, &format!("{user}-password")).unwrap();
        }
        let app = stepwise_studio::server::app(store, false);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap()).unwrap();
                axum::serve(listener, app).await.unwrap();
            });
        });
        Studio {
            base: format!("http://{}", rx.recv().unwrap()),
            _dir: dir,
        }
    }

    fn anonymous(&self) -> Client {
        stepwise_remote::client::tls_with_ring();
        Client::builder().cookie_store(true).build().unwrap()
    }

    fn signed_in(&self, user: &str) -> Client {
        let c = self.anonymous();
        let r = c
            .post(format!("{}/api/login", self.base))
            .json(&json!({"name": user, "password": format!("{user}-password")}))
            .send()
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        c
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// GET `path` as `c`: the answer's JSON.
    fn json(&self, c: &Client, path: &str) -> Value {
        c.get(self.url(path)).send().unwrap().json().unwrap()
    }

    /// GET `path` as `c`: the status.
    fn status(&self, c: &Client, path: &str) -> StatusCode {
        c.get(self.url(path)).send().unwrap().status()
    }

    fn next(&self, c: &Client) -> Option<i64> {
        let r: Value = c.post(self.url("/api/projects/p/next")).send().unwrap().json().unwrap();
        r["record"].as_i64()
    }

    fn rate(&self, c: &Client, record: i64, step: usize, rating: i64) -> Response {
        c.put(self.url(&format!("/api/records/{record}/steps/{step}")))
            .json(&json!({ "rating": rating }))
            .send()
            .unwrap()
    }

    fn finish(&self, c: &Client, record: i64, reason: &str) -> Response {
        c.post(self.url(&format!("/api/records/{record}/finish")))
            .json(&json!({ "finish_reason": reason }))
            .send()
            .unwrap()
    }
}

fn settings(overlap: u32, qc_every: u32) -> Settings {
    Settings {
        overlap,
        qc_every,
        policy: Policy::Uniform,
        ..Default::default()
    }
}

/// Every route but login answers 401 without a session, whatever is asked.
#[test]
fn every_route_needs_a_session() {
    let s = Studio::start("session", settings(1, 0), vec![record("a", 2, None)], vec![]);
    let c = s.anonymous();
    let body = json!({"rating": 1});
    let routes: Vec<(&str, &str, Option<Value>)> = vec![
        ("GET", "/api/me", None),
        ("POST", "/api/projects/p/next", None),
        ("GET", "/api/projects/p/dashboard", None),
        ("GET", "/api/projects/p/export?to=prm800k", None),
        ("GET", "/api/records/1", None),
        ("PUT", "/api/records/1/steps/0", Some(body.clone())),
        (
            "POST",
            "/api/records/1/finish",
            Some(json!({"finish_reason": "solution"})),
        ),
        ("GET", "/api/records/1/review", None),
        ("PUT", "/api/records/1/steps/0/adjudication", Some(body)),
        ("GET", "/api/projects/p/mine", None),
        ("GET", "/api/projects/p/guidelines", None),
        (
            "PUT",
            "/api/projects/p/guidelines",
            Some(json!({"text": "rate kindly"})),
        ),
    ];
    for (method, path, body) in &routes {
        let mut req = c.request(method.parse().unwrap(), s.url(path));
        if let Some(b) = body {
            req = req.json(b);
        }
        let r = req.try_clone().unwrap().send().unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{method} {path}");
        // A made-up token is no better than none.
        let r = req.bearer_auth("ab".repeat(32)).send().unwrap();
        assert_eq!(
            r.status(),
            StatusCode::UNAUTHORIZED,
            "{method} {path} with a forged token"
        );
    }
    // A signed-out session is closed.
    let alice = s.signed_in("alice");
    assert_eq!(s.status(&alice, "/api/me"), StatusCode::OK);
    alice.post(s.url("/api/logout")).send().unwrap();
    assert_eq!(s.status(&alice, "/api/me"), StatusCode::UNAUTHORIZED);
}

/// A labeller reaches their own assignments only; reviewing is for reviewers, export for admins.
#[test]
fn a_labeller_reaches_only_their_own_assignments() {
    let s = Studio::start(
        "roles",
        settings(1, 0),
        vec![record("a", 2, None), record("b", 2, None)],
        vec![],
    );
    let (alice, bob, rita, root) = (
        s.signed_in("alice"),
        s.signed_in("bob"),
        s.signed_in("rita"),
        s.signed_in("root"),
    );
    let mine = s.next(&alice).unwrap();
    assert_eq!(s.rate(&alice, mine, 0, 1).status(), StatusCode::OK);
    // Bob gets the other record, and nothing of Alice's.
    let his = s.next(&bob).unwrap();
    assert_ne!(his, mine);
    assert_eq!(s.status(&bob, &format!("/api/records/{mine}")), StatusCode::NOT_FOUND);
    assert_eq!(s.rate(&bob, mine, 0, -1).status(), StatusCode::NOT_FOUND);
    assert_eq!(s.finish(&bob, mine, "give_up").status(), StatusCode::NOT_FOUND);
    // Reviewing and export are refused to labellers; export to reviewers.
    for c in [&alice, &bob] {
        assert_eq!(s.status(c, "/api/projects/p/dashboard"), StatusCode::FORBIDDEN);
        assert_eq!(
            s.status(c, &format!("/api/records/{mine}/review")),
            StatusCode::FORBIDDEN
        );
        let adj = c
            .put(s.url(&format!("/api/records/{mine}/steps/0/adjudication")))
            .json(&json!({"rating": -1}))
            .send()
            .unwrap();
        assert_eq!(adj.status(), StatusCode::FORBIDDEN);
    }
    for c in [&alice, &bob, &rita] {
        assert_eq!(s.status(c, "/api/projects/p/export"), StatusCode::FORBIDDEN);
    }
    let review: Value = s.json(&rita, &format!("/api/records/{mine}/review"));
    assert_eq!(review["labellings"][0]["user"], "alice");
    assert_eq!(s.status(&root, "/api/projects/p/export"), StatusCode::OK);
    // Alice's record still holds only her rating.
    let view: Value = s.json(&alice, &format!("/api/records/{mine}"));
    assert_eq!(view["steps"][0]["rating"], 1);
}

/// With an overlap of 2, two labellers rate the same record at once; each keeps their own
/// ratings, the dashboard measures their agreement, export keeps both.
#[test]
fn two_labellers_on_one_record_never_overwrite_each_other() {
    let s = Studio::start("overlap", settings(2, 0), vec![record("a", 3, None)], vec![]);
    let (alice, bob) = (s.signed_in("alice"), s.signed_in("bob"));
    let (ra, rb) = (s.next(&alice).unwrap(), s.next(&bob).unwrap());
    assert_eq!(ra, rb);
    std::thread::scope(|scope| {
        for (c, ratings) in [(&alice, [1, 1, -1]), (&bob, [1, -1, -1])] {
            let s = &s;
            scope.spawn(move || {
                for (i, r) in ratings.iter().enumerate() {
                    assert_eq!(s.rate(c, ra, i, *r).status(), StatusCode::OK);
                }
                assert_eq!(s.finish(c, ra, "found_error").status(), StatusCode::OK);
            });
        }
    });
    let mine = |c: &Client| -> Vec<i64> {
        let v: Value = s.json(c, &format!("/api/records/{ra}"));
        v["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["rating"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(mine(&alice), [1, 1, -1]);
    assert_eq!(mine(&bob), [1, -1, -1]);
    // The record has had its two labellers: a third gets nothing.
    assert_eq!(s.next(&s.signed_in("rita")), None);
    let d: Value = s
        .signed_in("rita")
        .get(s.url("/api/projects/p/dashboard"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(d["first_error_agreement"], json!([0.0, 1]));
    assert_eq!(d["to_review"][0][1], "a");
    // Fleiss: items [+1,+1], [+1,-1], [-1,-1]: P̄ = 2/3, p = (1/2, 1/2), κ = 1/3.
    assert!((d["fleiss_kappa"][0].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-9, "{d}");
    // A reviewer settles step 1; export takes the adjudication and keeps both labellers.
    let root = s.signed_in("root");
    let adj = root
        .put(s.url(&format!("/api/records/{ra}/steps/1/adjudication")))
        .json(&json!({"rating": 0}))
        .send()
        .unwrap();
    assert_eq!(adj.status(), StatusCode::OK);
    let text = root
        .get(s.url("/api/projects/p/export?to=stepwise"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    let v: Value = serde_json::from_str(text.trim()).unwrap();
    let labels: Vec<&str> = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["label"]["rating"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["good", "neutral", "bad"]);
    assert_eq!(v["meta"]["studio"]["labellings"].as_array().unwrap().len(), 2);
    let prm800k = root
        .get(s.url("/api/projects/p/export?to=prm800k"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert_eq!(prm800k.lines().count(), 2);
}

/// Gold records come once in every `qc_every`, and each labeller's agreement with them shows.
#[test]
fn gold_records_measure_each_labeller() {
    use Rating::{Bad, Good};
    let gold = record("g", 3, Some(&[Good, Bad, Bad]));
    let s = Studio::start(
        "gold",
        settings(1, 2),
        vec![record("a", 2, None), record("b", 2, None)],
        vec![gold],
    );
    let alice = s.signed_in("alice");
    let first = s.next(&alice).unwrap();
    for i in 0..2 {
        s.rate(&alice, first, i, 1);
    }
    assert_eq!(s.finish(&alice, first, "solution").status(), StatusCode::OK);
    let second = s.next(&alice).unwrap();
    let view: Value = s.json(&alice, &format!("/api/records/{second}"));
    assert_eq!(view["ext_id"], "g", "the second record is the gold one");
    assert!(
        view.get("gold").is_none(),
        "a labeller is not told which records are gold"
    );
    for (i, r) in [1, 1, -1].into_iter().enumerate() {
        s.rate(&alice, second, i, r);
    }
    s.finish(&alice, second, "found_error");
    let d: Value = s
        .signed_in("root")
        .get(s.url("/api/projects/p/dashboard"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let me = &d["labellers"][0];
    assert_eq!(me["user"], "alice");
    assert!(
        (me["gold_step_agreement"][0].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-9,
        "{d}"
    );
    assert_eq!(me["gold_first_error_agreement"], json!([0.0, 1]));
}

/// Input the page or a script gets wrong is a 4xx naming the rule, and nothing is saved.
#[test]
fn bad_input_is_refused_and_saves_nothing() {
    let s = Studio::start("bad", settings(1, 0), vec![record("a", 2, None)], vec![]);
    let alice = s.signed_in("alice");
    let r = s.next(&alice).unwrap();
    for (step, body) in [
        (0, json!({"rating": 5})),
        (9, json!({"rating": 1})),
        (0, json!({"rating": 1, "extra": true})),
        (0, json!({"rating": 1, "comment": "x".repeat(5000)})),
    ] {
        let res = alice
            .put(s.url(&format!("/api/records/{r}/steps/{step}")))
            .json(&body)
            .send()
            .unwrap();
        assert!(res.status().is_client_error(), "{body}: {}", res.status());
    }
    let res = s.finish(&alice, r, "solution");
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert!(res.text().unwrap().contains("every step rated"));
    assert_eq!(s.finish(&alice, r, "found_error").status(), StatusCode::BAD_REQUEST);
    assert_eq!(s.finish(&alice, r, "bored").status(), StatusCode::BAD_REQUEST);
    let view: Value = s.json(&alice, &format!("/api/records/{r}"));
    assert!(view["steps"].as_array().unwrap().iter().all(|x| x["rating"].is_null()));
    // A write from another site is refused even with a session; an oversized body too.
    let cross = alice
        .put(s.url(&format!("/api/records/{r}/steps/0")))
        .header("Origin", "http://evil.example")
        .json(&json!({"rating": 1}))
        .send()
        .unwrap();
    assert_eq!(cross.status(), StatusCode::FORBIDDEN);
    // The oversized body gets a 413, or, when the server has answered and closed before the
    // client finished sending, a connection cut mid-body (a broken pipe): refused either way.
    let huge = alice
        .put(s.url(&format!("/api/records/{r}/steps/0")))
        .header("content-type", "application/json")
        .body(vec![b' '; 1 << 20])
        .send();
    match huge {
        Ok(huge) => assert_eq!(huge.status(), StatusCode::PAYLOAD_TOO_LARGE),
        Err(e) => assert!(e.is_request() || e.is_body(), "{e:?}"),
    }
    // Read back on a fresh connection: the server closes the one it refused mid-body, and a
    // client that pooled it may write its next request into the closed socket (a broken pipe:
    // seen once in CI), which says nothing about what was saved.
    let again = s.signed_in("alice");
    let view: Value = s.json(&again, &format!("/api/records/{r}"));
    assert!(view["steps"].as_array().unwrap().iter().all(|x| x["rating"].is_null()));
}

/// A labeller corrects a finished record: the same rating again or a comment leaves it
/// finished; a changed rating opens it again, `next` serves it before anything new, and it is
/// finished once more. Their history lists their own records only, the latest first.
#[test]
fn a_finished_record_is_corrected_and_opened_again() {
    let s = Studio::start(
        "reopen",
        settings(1, 0),
        vec![record("a", 2, None), record("b", 2, None)],
        vec![],
    );
    let (alice, bob) = (s.signed_in("alice"), s.signed_in("bob"));
    let first = s.next(&alice).unwrap();
    for i in 0..2 {
        s.rate(&alice, first, i, 1);
    }
    assert_eq!(s.finish(&alice, first, "solution").status(), StatusCode::OK);
    let second = s.next(&alice).unwrap();
    assert_ne!(second, first);
    let saved: Value = s.rate(&alice, first, 1, 1).json().unwrap();
    assert_eq!(saved["reopened"], false);
    let comment = alice
        .put(s.url(&format!("/api/records/{first}/steps/1")))
        .json(&json!({"rating": 1, "comment": "fine"}))
        .send()
        .unwrap();
    assert_eq!(comment.json::<Value>().unwrap()["reopened"], false);
    let mine = s.json(&alice, "/api/projects/p/mine")["records"].clone();
    assert_eq!(mine[0]["record"].as_i64(), Some(second));
    assert_eq!(
        (mine[1]["record"].as_i64(), mine[1]["finish_reason"].as_str()),
        (Some(first), Some("solution"))
    );
    assert_eq!(mine[1]["rated"], 2);
    // The second step was wrong after all: the labelling is open again, and served first.
    let saved: Value = s.rate(&alice, first, 1, -1).json().unwrap();
    assert_eq!(saved["reopened"], true);
    assert!(s.json(&alice, &format!("/api/records/{first}"))["finish_reason"].is_null());
    assert!(s.json(&alice, "/api/projects/p/mine")["records"][1]["finished"].is_null());
    assert_eq!(s.next(&alice), Some(first));
    assert_eq!(s.finish(&alice, first, "solution").status(), StatusCode::OK);
    assert_eq!(s.finish(&alice, first, "found_error").status(), StatusCode::OK);
    assert_eq!(s.next(&alice), Some(second));
    // Bob's history holds nothing of Alice's.
    assert_eq!(s.json(&bob, "/api/projects/p/mine")["records"], json!([]));
}

/// Every signed-in user reads the guidelines; only admins set them, within their size, from
/// this site; blank text removes them.
#[test]
fn guidelines_are_read_by_everyone_and_set_by_admins() {
    let s = Studio::start("guidelines", settings(1, 0), vec![record("a", 2, None)], vec![]);
    let (alice, rita, root) = (s.signed_in("alice"), s.signed_in("rita"), s.signed_in("root"));
    let path = "/api/projects/p/guidelines";
    let put = |c: &Client, body: Value| c.put(s.url(path)).json(&body).send().unwrap();
    assert_eq!(
        s.json(&alice, path),
        json!({"text": "", "updated": null, "set_by": null})
    );
    for c in [&alice, &rita] {
        assert_eq!(put(c, json!({"text": "anything goes"})).status(), StatusCode::FORBIDDEN);
    }
    let text = "A step is −1 when it is wrong: $2 + 2 = 5$.\n<script>alert(1)</script>";
    let set = put(&root, json!({ "text": text }));
    assert_eq!(set.status(), StatusCode::OK);
    let when = set.json::<Value>().unwrap()["updated"].as_f64().unwrap();
    for c in [&alice, &rita, &root] {
        let g = s.json(c, path);
        assert_eq!(
            (g["text"].as_str(), g["updated"].as_f64(), g["set_by"].as_str()),
            (Some(text), Some(when), Some("root"))
        );
    }
    // Refused, and the guidelines kept: too long, an unknown field, another site, no project.
    let long = "x".repeat(stepwise_studio::store::MAX_GUIDELINES_BYTES + 1);
    assert_eq!(put(&root, json!({ "text": long })).status(), StatusCode::BAD_REQUEST);
    assert!(put(&root, json!({"text": "t", "html": true}))
        .status()
        .is_client_error());
    let cross = root
        .put(s.url(path))
        .header("Origin", "http://evil.example")
        .json(&json!({"text": "forged"}))
        .send()
        .unwrap();
    assert_eq!(cross.status(), StatusCode::FORBIDDEN);
    assert_eq!(s.status(&alice, "/api/projects/nope/guidelines"), StatusCode::NOT_FOUND);
    assert_eq!(s.json(&alice, path)["text"], text);
    assert_eq!(put(&root, json!({"text": "  \n"})).status(), StatusCode::OK);
    assert_eq!(s.json(&alice, path)["text"], "");
}

/// A wrong password and an unknown user get the same answer, and repeated failures wait.
#[test]
fn logins_are_refused_alike_and_slowed() {
    let s = Studio::start("login", settings(1, 0), vec![record("a", 1, None)], vec![]);
    let c = s.anonymous();
    let try_login = |name: &str, pw: &str| {
        let t = std::time::Instant::now();
        let r = c
            .post(s.url("/api/login"))
            .json(&json!({"name": name, "password": pw}))
            .send()
            .unwrap();
        (r.status(), r.text().unwrap(), t.elapsed())
    };
    let wrong_pw = try_login("alice", "nope-nope");
    let no_user = try_login("mallory", "nope-nope");
    assert_eq!(wrong_pw.0, StatusCode::UNAUTHORIZED);
    assert_eq!((wrong_pw.0, &wrong_pw.1), (no_user.0, &no_user.1));
    try_login("alice", "nope-nope");
    try_login("alice", "nope-nope");
    // The fourth failure in a row waits at least half a second before it is answered.
    let slowed = try_login("alice", "alice-password");
    assert!(slowed.2 >= std::time::Duration::from_millis(500), "{:?}", slowed.2);
    assert_eq!(slowed.0, StatusCode::OK, "the right password still works");
}

/// A database another process holds locked: the rating is refused with a 503 that says so,
/// nothing is half-written, and the same rating saves once the lock is gone.
#[test]
fn a_locked_database_is_an_error_on_the_page() {
    let s = Studio::start("locked", settings(1, 0), vec![record("a", 2, None)], vec![]);
    let alice = s.signed_in("alice");
    let r = s.next(&alice).unwrap();
    let other = rusqlite::Connection::open(s._dir.path().join("labels.sqlite")).unwrap();
    other.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let res = s.rate(&alice, r, 0, 1);
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res
        .text()
        .unwrap()
        .contains("locked by another process; nothing was saved"));
    other.execute_batch("ROLLBACK").unwrap();
    let view: Value = s.json(&alice, &format!("/api/records/{r}"));
    assert!(view["steps"][0]["rating"].is_null());
    assert_eq!(s.rate(&alice, r, 0, 1).status(), StatusCode::OK);
}

/// A labeller writes a wrong step right (PRM800K's `human_completion`): kept with their
/// rating, shown back to them only, never reopening a finished record, and exported both
/// ways; `stepwise pairs` makes it the chosen step against the model's.
#[test]
fn a_wrong_step_written_right_leaves_as_a_human_completion_and_a_pair() {
    let s = Studio::start("correct", settings(2, 0), vec![record("a", 3, None)], vec![]);
    let (alice, bob, root) = (s.signed_in("alice"), s.signed_in("bob"), s.signed_in("root"));
    let id = s.next(&alice).unwrap();
    assert_eq!(s.next(&bob), Some(id));
    let put = |c: &Client, body: Value| {
        c.put(s.url(&format!("/api/records/{id}/steps/1")))
            .json(&body)
            .send()
            .unwrap()
    };
    for c in [&alice, &bob] {
        s.rate(c, id, 0, 1);
        s.rate(c, id, 1, -1);
        assert_eq!(s.finish(c, id, "found_error").status(), StatusCode::OK);
    }
    let fix = "step 1 of a, <b>done</b> right: $2 + 2 = 4$";
    let saved: Value = put(&alice, json!({"rating": -1, "correction": format!("  {fix}\n")}))
        .json()
        .unwrap();
    assert_eq!(saved["reopened"], false, "a correction does not reopen");
    let too_long = put(&alice, json!({"rating": -1, "correction": "x".repeat(4001)}));
    assert_eq!(too_long.status(), StatusCode::BAD_REQUEST);
    let view = s.json(&alice, &format!("/api/records/{id}"));
    assert_eq!(view["steps"][1]["correction"], fix, "kept trimmed, as text");
    assert_eq!(view["steps"][1]["rating"], -1);
    assert_eq!(view["finish_reason"], "found_error");
    assert!(s.json(&bob, &format!("/api/records/{id}"))["steps"][1]["correction"].is_null());
    // Bob writes one and takes it back, through the Rust client.
    let script = stepwise_studio::client::Client::login(&s.base, "bob", "bob-password").unwrap();
    script.correct(id, 1, Some(-1), "bob's").unwrap();
    assert_eq!(script.record(id).unwrap().steps[1].correction.as_deref(), Some("bob's"));
    script.correct(id, 1, Some(-1), " ").unwrap();
    assert!(s.json(&bob, &format!("/api/records/{id}"))["steps"][1]["correction"].is_null());
    // The step as it stands, sent back unedited, is no correction either.
    script.correct(id, 1, Some(-1), "step 1 of a\n").unwrap();
    assert!(s.json(&bob, &format!("/api/records/{id}"))["steps"][1]["correction"].is_null());
    assert_eq!(s.json(&bob, &format!("/api/records/{id}"))["steps"][1]["rating"], -1);
    let review = s.json(&s.signed_in("rita"), &format!("/api/records/{id}/review"));
    assert_eq!(review["labellings"][0]["corrections"], json!({"1": fix}));

    let export = |to: &str| -> Vec<Value> {
        let body = root
            .get(s.url(&format!("/api/projects/p/export?to={to}")))
            .send()
            .unwrap()
            .text()
            .unwrap();
        body.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let lines = export("prm800k");
    let human: Vec<&Value> = lines
        .iter()
        .map(|l| &l["label"]["steps"][1]["human_completion"])
        .collect();
    assert_eq!(
        human[0],
        &json!({"text": fix, "rating": null, "source": "human", "flagged": false, "corrected_rating": null})
    );
    assert!(human[1].is_null());
    assert_eq!(lines[0]["label"]["steps"][1]["chosen_completion"], 0);
    let records = export("stepwise");
    assert_eq!(
        records[0]["meta"]["studio"]["labellings"][0]["corrections"],
        json!({"1": fix})
    );
    // Both exports give the one pair: the labeller's step against the model's.
    for (to, format) in [("stepwise", Format::Stepwise), ("prm800k", Format::Prm800k)] {
        let sols: Vec<Solution> = export(to)
            .iter()
            .enumerate()
            .flat_map(|(i, v)| format.read(v, i).unwrap())
            .collect();
        let (pairs, _) = step_pairs(&sols, 0.5);
        assert_eq!(pairs.len(), 1, "{to}: {pairs:?}");
        assert_eq!(
            (pairs[0].chosen.as_str(), pairs[0].rejected.as_str()),
            (fix, "step 1 of a")
        );
        assert_eq!(pairs[0].prefix, vec!["step 0 of a".to_string()]);
    }
}
