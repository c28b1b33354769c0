//! Step-level preference pairs from real PRM800K and OmegaPRM files and from hand-made records
//! that pin each rule down.

mod common;
use common::data;
use serde_json::json;
use stepwise_core::pairs::{step_pairs, Layout, Source};
use stepwise_core::read_solutions;
use stepwise_core::record::{Provenance, Rating, Solution, Step, StepLabel};

fn hard(text: &str, r: i64) -> Step {
    Step::labelled(text, StepLabel::hard(Rating::from_i64(r).unwrap(), Provenance::Human))
}

fn soft(text: &str, p: f32) -> Step {
    Step::labelled(text, StepLabel::soft(p, Provenance::Unknown))
}

fn record(id: &str, steps: Vec<Step>) -> Solution {
    Solution {
        id: id.into(),
        question: "What is 2 + 3 * 4?".into(),
        gold_answer: Some("14".into()),
        steps,
        ..Default::default()
    }
}

#[test]
fn prm800k_rated_completions_pair_at_the_step_they_share() {
    let recs = read_solutions(data("prm800k/samples_openr.jsonl"), None).unwrap();
    let (pairs, stats) = step_pairs(&recs, 0.5);
    assert_eq!(stats.records, 6);
    assert_eq!(pairs.len(), 15, "{pairs:#?}");
    assert_eq!(stats.wrong_steps, 15);
    // The first record's second step: its +1 chosen completion against the five rated -1.
    let first: Vec<_> = pairs
        .iter()
        .filter(|p| p.id == "0@1" || p.id.starts_with("0@1#"))
        .collect();
    assert_eq!(first.len(), 5);
    for p in &first {
        assert_eq!(p.chosen, "We have $3p+e=1.24$ and $5p+e=1.82$.");
        assert_eq!(p.prefix.len(), 1);
        assert_eq!(p.answer.as_deref(), Some("29"));
        assert_eq!((p.chosen_source, p.rejected_source), (Source::Step, Source::Completion));
    }
    assert_eq!(
        first[0].rejected,
        "The first equation is 3p + e = 124, and the second equation is 5p + e = 182."
    );
    let ids: std::collections::HashSet<_> = pairs.iter().map(|p| &p.id).collect();
    assert_eq!(ids.len(), pairs.len(), "ids are unique");
}

#[test]
fn omegaprm_tree_siblings_pair_by_their_mc_values() {
    let recs = read_solutions(data("openr/samples_math-aps-tree_openr.jsonl"), None).unwrap();
    let (pairs, stats) = step_pairs(&recs, 0.5);
    assert_eq!(pairs.len(), 7);
    assert_eq!(stats.without_chosen, 0);
    for p in &pairs {
        // Every pair is two children of one node: the same prefix, a chosen child with an MC
        // value of at least 0.5 and a rejected one at 0, found among the records by text.
        let value = |text: &str| {
            recs.iter()
                .filter(|r| r.question == p.question && r.steps.len() > p.prefix.len())
                .filter(|r| r.steps.iter().zip(&p.prefix).all(|(s, q)| s.text == *q))
                .find(|r| r.steps[p.prefix.len()].text == text)
                .and_then(|r| r.steps[p.prefix.len()].label.as_ref())
                .map(|l| l.prob(0.5))
        };
        assert!(value(&p.chosen).unwrap() >= 0.5, "{p:?}");
        assert_eq!(value(&p.rejected), Some(0.0), "{p:?}");
    }
}

#[test]
fn a_prefix_stops_at_its_first_wrong_or_unlabelled_step_and_passes_a_zero() {
    let recs = vec![
        record("a", vec![hard("2 + 3 = 5.", -1), hard("5 * 4 = 20.", 1)]),
        record("b", vec![hard("3 * 4 = 12.", 0), hard("12 + 2 = 14.", 1)]),
        record("c", vec![hard("3 * 4 = 12.", 0), hard("12 + 2 = 15.", -1)]),
        // After a wrong step nothing is paired: "5 * 4 = 20." has no sound prefix.
        record("d", vec![hard("2 + 3 = 5.", -1), hard("5 * 4 = 21.", -1)]),
        // An unlabelled step ends the prefix too.
        record("e", vec![Step::new("3 * 4 = 12."), hard("12 + 2 = 16.", -1)]),
    ];
    let (pairs, stats) = step_pairs(&recs, 0.5);
    let got: Vec<_> = pairs
        .iter()
        .map(|p| (p.prefix.len(), p.chosen.as_str(), p.rejected.as_str(), p.id.as_str()))
        .collect();
    // At the root no step is right (a 0 is neither side): "2 + 3 = 5." has no pair.
    assert_eq!(got, vec![(1, "12 + 2 = 14.", "12 + 2 = 15.", "c@1")]);
    assert_eq!((stats.wrong_steps, stats.without_chosen), (2, 1));
    // Both are their records' last steps: a policy stops after them.
    assert!(pairs[0].chosen_ends && pairs[0].rejected_ends);
    let (mid, _) = step_pairs(
        &[
            record("f", vec![hard("3 * 4 = 12.", 1), hard("12 + 2 = 14.", 1)]),
            record("g", vec![hard("3 * 5 = 15.", -1)]),
        ],
        0.5,
    );
    assert_eq!((mid[0].chosen_ends, mid[0].rejected_ends), (false, true));
}

#[test]
fn soft_labels_use_the_threshold_and_a_step_labelled_both_ways_is_left_out() {
    let recs = vec![
        record("a", vec![soft("3 * 4 = 12.", 0.75), soft("12 + 2 = 14.", 1.0)]),
        record("b", vec![soft("3 * 4 = 12.", 0.5), soft("12 + 2 = 15.", 0.0)]),
        record("c", vec![soft("3 * 4 = 12.", 0.5), soft("12 + 2 = 41.", 0.25)]),
        record("d", vec![soft("2 * 4 = 8.", 0.0)]),
        record("e", vec![hard("2 * 4 = 8.", 1)]),
    ];
    let (pairs, stats) = step_pairs(&recs, 0.5);
    let got: Vec<_> = pairs.iter().map(|p| (p.chosen.as_str(), p.rejected.as_str())).collect();
    assert_eq!(got, vec![("12 + 2 = 14.", "12 + 2 = 15.")]);
    assert_eq!(stats.conflicting, 1);
    // A higher bar: 0.75 is chosen at 0.75, so the pair stands; at 0.9 the root's step no
    // longer is, but it still extends the prefix (it is not wrong).
    assert_eq!(step_pairs(&recs, 0.9).0.len(), 1);
}

#[test]
fn a_studio_correction_is_chosen_first_and_each_layout_writes_its_columns() {
    let mut r = record("lin", vec![hard("3 * 4 = 12.", 1), hard("12 + 2 = 15.", -1)]);
    r.meta.insert(
        "studio".into(),
        json!({"labellings": [{"labeller": "lin", "corrections": {"1": "12 + 2 = 14."}}]}),
    );
    let other = record("b", vec![hard("3 * 4 = 12.", 1), hard("2 + 12 = 14.", 1)]);
    let (pairs, _) = step_pairs(&[r, other], 0.5);
    assert_eq!(pairs.len(), 1);
    let p = &pairs[0];
    assert_eq!((p.chosen.as_str(), p.chosen_source), ("12 + 2 = 14.", Source::Human));
    assert_eq!(p.to_json(Layout::Stepwise, "x", "\n")["prefix"], json!(["3 * 4 = 12."]));
    assert_eq!(
        p.to_json(Layout::StepDpo, "lab", "\n"),
        json!({"dataset": "lab", "prompt": "What is 2 + 3 * 4?", "initial_reason_steps": "3 * 4 = 12.\n",
               "chosen": "12 + 2 = 14.", "rejected": "12 + 2 = 15.", "full_chosen": "3 * 4 = 12.\n12 + 2 = 14.",
               "full_rejected": "3 * 4 = 12.\n12 + 2 = 15.", "answer": "14"})
    );
    assert_eq!(
        p.to_json(Layout::Trl, "", "\n\n"),
        json!({"prompt": "What is 2 + 3 * 4?\n\n3 * 4 = 12.\n\n", "chosen": "12 + 2 = 14.", "rejected": "12 + 2 = 15."})
    );
    assert_eq!("step-dpo".parse::<Layout>(), Ok(Layout::StepDpo));
    assert!("dpo".parse::<Layout>().unwrap_err().contains("step-dpo"));
}

/// Pairs written in each layout read back as a trainer takes them; labelled records are mined;
/// a record that is not a pair is named by line and field.
#[test]
fn pairs_read_back_from_every_layout_and_from_labelled_records() {
    use stepwise_core::preference::{read_preference_pairs, Origin, PairPrompt};
    let recs = vec![
        record("b", vec![hard("3 * 4 = 12.", 0), hard("12 + 2 = 14.", 1)]),
        record(
            "c",
            vec![hard("3 * 4 = 12.", 0), hard("12 + 2 = 15.", -1), hard("15.", 1)],
        ),
    ];
    let (pairs, _) = step_pairs(&recs, 0.5);
    let dir = tempfile::tempdir().unwrap();
    let steps = PairPrompt::Steps {
        question: "What is 2 + 3 * 4?".into(),
        prefix: vec!["3 * 4 = 12.".into()],
    };
    for (layout, file, name) in [
        (Layout::Stepwise, "p.jsonl", "stepwise"),
        (Layout::StepDpo, "p.parquet", "step-dpo"),
        (Layout::Trl, "p.json", "trl"),
    ] {
        let path = dir.path().join(file);
        let rows: Vec<_> = pairs.iter().map(|p| p.to_json(layout, "x", "\n")).collect();
        stepwise_core::io::write_records(&path, &rows).unwrap();
        let (back, origin) = read_preference_pairs(&path, 0.5, "\n").unwrap();
        assert_eq!(origin, Origin::Pairs(name));
        assert_eq!(
            (back.len(), back[0].chosen.as_str(), back[0].rejected.as_str()),
            (1, "12 + 2 = 14.", "12 + 2 = 15.")
        );
        let want = match layout {
            Layout::Trl => PairPrompt::Text("What is 2 + 3 * 4?\n3 * 4 = 12.\n".into()),
            _ => steps.clone(),
        };
        assert_eq!(back[0].prompt, want, "{name}");
        // Only stepwise's layout keeps whether a step ended its solution.
        assert_eq!(back[0].chosen_ends, layout == Layout::Stepwise, "{name}");
    }
    let labelled = dir.path().join("labels.jsonl");
    stepwise_core::write_solutions(&labelled, stepwise_core::Format::Stepwise, &recs).unwrap();
    let (mined, origin) = read_preference_pairs(&labelled, 0.5, "\n").unwrap();
    assert!(
        matches!(origin, Origin::Mined(ref s) if s.records == 2 && s.wrong_steps == 1),
        "{origin:?}"
    );
    assert_eq!((mined[0].id.as_str(), mined[0].prompt.clone()), ("c@1", steps));
    let bad = dir.path().join("bad.jsonl");
    let good = json!({"prompt": "q", "chosen": "a", "rejected": "b"});
    let text = format!(
        "{good}\n{}\n{}\n",
        json!({"prompt": "q", "chosen": 3, "rejected": "b"}),
        json!({"prompt": "q", "chosen": "a", "rejected": "a"})
    );
    std::fs::write(&bad, text).unwrap();
    let e = read_preference_pairs(&bad, 0.5, "\n").unwrap_err().to_string();
    assert!(e.contains("bad.jsonl:2: field `chosen`: expected a string"), "{e}");
    std::fs::write(
        &bad,
        format!("{good}\n{}\n", json!({"prompt": "q", "chosen": "a", "rejected": "a"})),
    )
    .unwrap();
    let e = read_preference_pairs(&bad, 0.5, "\n").unwrap_err().to_string();
    assert!(
        e.contains("bad.jsonl:2: field `rejected`: the same text as `chosen`"),
        "{e}"
    );
}

#[test]
fn chosen_min_outside_zero_one_is_refused_by_name() {
    use stepwise_core::pairs::check_chosen_min;
    assert!(check_chosen_min("--chosen-min", 1.0).is_ok());
    assert!(check_chosen_min("--chosen-min", 0.01).is_ok());
    for bad in [0.0, -0.5, 1.5, f32::NAN] {
        let e = check_chosen_min("--chosen-min", bad).unwrap_err();
        assert!(e.starts_with("--chosen-min must be in (0, 1], not"), "{e}");
    }
}
