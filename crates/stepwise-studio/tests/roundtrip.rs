//! The studio's export as other tools read it: a PRM800K file imported and exported again is
//! the same data; a labelling exported as PRM800K reads back with its labeller and ratings.

use serde_json::Value;
use std::path::PathBuf;
use stepwise_core::formats::Format;
use stepwise_studio::export::{export, to_jsonl, Shape};
use stepwise_studio::{NewRecord, Role, Settings, Store};

/// A file of the repository (`data/...`).
fn repo(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

/// A fresh store, and its folder (removed when dropped).
fn store(name: &str) -> (tempfile::TempDir, Store) {
    let d = tempfile::TempDir::with_prefix(format!("stepwise-studio-rt-{name}-")).unwrap();
    let store = Store::open(&d.path().join("labels.sqlite")).unwrap();
    (d, store)
}

#[test]
fn a_prm800k_file_imported_and_exported_is_the_same_data() {
    let path = repo("data/prm800k/phase2_test_example_tongyx361.json");
    let original: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let originals: Vec<Value> = match original {
        Value::Array(v) => v,
        one => vec![one],
    };
    let sols = stepwise_core::io::read_solution_set(&path, Some(Format::Prm800k)).unwrap();
    let (_dir, mut st) = store("import");
    let p = st.project_or_create("p", &Settings::default(), 0).unwrap();
    let records = NewRecord::each(sols, false);
    st.add_records(&p, records).unwrap();
    let back = export(&st, &p, Shape::PerRecord, true).unwrap();
    let lines = to_jsonl(&back, Format::Prm800k).unwrap();
    let again: Vec<Value> = lines.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(again, originals);
}

#[test]
fn a_labelling_exported_as_prm800k_reads_back() {
    let path = repo("data/prm800k/phase2_test_example_tongyx361.json");
    let sols = stepwise_core::io::read_solution_set(&path, Some(Format::Prm800k)).unwrap();
    let n = sols[0].steps.len();
    let (_dir, mut st) = store("label");
    let settings = Settings {
        stop_at_first_bad: true,
        qc_every: 0,
        ..Default::default()
    };
    let p = st.project_or_create("p", &settings, 0).unwrap();
    let records = NewRecord::each(sols, false);
    st.add_records(&p, records).unwrap();
    st.set_user("alice", Role::Labeller, "alice-password").unwrap();
    let alice = st.users().unwrap();
    assert_eq!(alice.len(), 1);
    let (_, user) = st.login("alice", "alice-password").unwrap().unwrap();
    let r = st.next_for(user.id, &p).unwrap().unwrap();
    // Good, good, then the error: a phase-2 labelling stops there.
    let ratings = [1, 1, -1];
    assert!(n > ratings.len());
    for (i, x) in ratings.iter().enumerate() {
        let input = serde_json::from_value(serde_json::json!({"rating": x})).unwrap();
        st.rate(user.id, r, i, &input).unwrap().unwrap();
    }
    st.finish(user.id, r, "found_error").unwrap().unwrap();
    let out = export(&st, &p, Shape::PerLabelling, false).unwrap();
    let text = to_jsonl(&out, Format::Prm800k).unwrap();
    let line: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(line["labeler"], "alice");
    assert_eq!(line["label"]["finish_reason"], "found_error");
    assert_eq!(line["generation"], 0);
    assert!(line["timestamp"].as_str().unwrap().starts_with("20"));
    // Read back by stepwise's PRM800K reader: three steps with the ratings given.
    let back = Format::Prm800k.read(&line, 0).unwrap();
    let got: Vec<i64> = back[0]
        .steps
        .iter()
        .map(|s| s.label.as_ref().unwrap().rating().unwrap().as_i64())
        .collect();
    assert_eq!(got, ratings);
}
