//! The scoring stage's policy for a solution its scorer cannot score: one bad solution never
//! costs the others; batches scored side by side (a scorer behind servers) come out as one at a
//! time gives them.

use anyhow::{bail, Result};
use stepwise_core::seams::{
    score_in_order, score_solutions_with, OnError, ScoreFailure, ScoreInput, Scored, StepScorer, SCORE_ERRORS,
};
use stepwise_core::{Solution, Step};

/// Scores every step 0.5, and refuses any batch holding a step longer than `limit` characters
/// (as a model refuses a solution longer than it reads).
struct Limited {
    limit: usize,
}

impl StepScorer for Limited {
    fn score(&self, batch: &[ScoreInput<'_>]) -> Result<Scored> {
        if let Some(long) = batch.iter().flat_map(|i| &i.steps).find(|s| s.len() > self.limit) {
            bail!(
                "{} characters: longer than the {} this scorer reads",
                long.len(),
                self.limit
            );
        }
        let scores = batch.iter().map(|i| vec![0.5; i.steps.len()]).collect();
        Ok(Scored {
            scores,
            tokens: batch.len(),
        })
    }
}

fn solutions() -> Vec<Solution> {
    (0..7)
        .map(|i| Solution {
            id: format!("s{i}"),
            question: "q".into(),
            steps: vec![Step::new(if i == 4 { "x".repeat(100) } else { "short".into() })],
            ..Default::default()
        })
        .collect()
}

#[test]
fn raise_names_the_solution_and_keeps_the_ones_before_it() {
    let mut sols = solutions();
    let err = score_solutions_with(&Limited { limit: 10 }, "prm", &mut sols, 3, OnError::Raise, |_| {}).unwrap_err();
    let failure = err.downcast_ref::<ScoreFailure>().expect("a ScoreFailure");
    assert_eq!((failure.index, failure.id.as_str(), failure.scored), (4, "s4", 4));
    let message = format!("{err:#}");
    assert!(message.contains("solution `s4` (record 5)"), "{message}");
    assert!(message.contains("100 characters"), "{message}");
    // The batch holding it (s3, s4, s5) was scored one by one: s3 keeps its scores.
    let scored: Vec<bool> = sols.iter().map(|s| s.scores.contains_key("prm")).collect();
    assert_eq!(scored, [true, true, true, true, false, false, false]);
}

#[test]
fn skip_records_why_and_scores_the_rest() {
    let mut sols = solutions();
    let mut seen = vec![];
    let run = score_solutions_with(&Limited { limit: 10 }, "prm", &mut sols, 3, OnError::Skip, |d| {
        seen.push(d)
    })
    .unwrap();
    assert_eq!(run.skipped, [4]);
    assert_eq!(run.scored, 6);
    assert_eq!(seen, [3, 6, 7]);
    for (i, s) in sols.iter().enumerate() {
        assert_eq!(s.scores.contains_key("prm"), i != 4, "solution {i}");
    }
    let why = sols[4].meta[SCORE_ERRORS]["prm"].as_str().unwrap();
    assert!(why.contains("longer than the 10"), "{why}");
    // A second verifier's reason sits beside the first.
    score_solutions_with(&Limited { limit: 20 }, "orm", &mut sols[4..5], 1, OnError::Skip, |_| {}).unwrap();
    assert!(sols[4].meta[SCORE_ERRORS]["orm"].is_string() && sols[4].meta[SCORE_ERRORS]["prm"].is_string());
}

/// [`Limited`] as a fleet would serve it: four batches in flight, later batches answered first
/// (each sleeps less than the one before it), and each batch scored as one part (the sizes of
/// the parts asked for are kept).
struct Concurrent(Limited, std::sync::Mutex<Vec<usize>>);

fn concurrent(limit: usize) -> Concurrent {
    Concurrent(Limited { limit }, Default::default())
}

impl StepScorer for Concurrent {
    fn score(&self, _: &[ScoreInput<'_>]) -> Result<Scored> {
        bail!("a scorer run side by side is asked through score_part")
    }

    fn in_flight(&self) -> usize {
        4
    }

    fn score_part(&self, batch: &[ScoreInput<'_>]) -> Result<Scored> {
        let first: u64 = batch[0].question.parse().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(40 - first));
        self.1.lock().unwrap().push(batch.len());
        self.0.score(batch)
    }
}

fn many() -> Vec<Solution> {
    (0..40)
        .map(|i| Solution {
            id: format!("s{i}"),
            question: i.to_string(),
            steps: vec![Step::new(if i == 13 || i == 31 {
                "x".repeat(100)
            } else {
                format!("step {i}")
            })],
            ..Default::default()
        })
        .collect()
}

#[test]
fn batches_in_flight_side_by_side_come_out_in_input_order() {
    let mut order = vec![];
    let run = score_in_order(&concurrent(10), &many(), 3, OnError::Skip, |i, outcome| {
        order.push((i, outcome.is_ok()));
        Ok(())
    })
    .unwrap();
    assert_eq!(order, (0..40).map(|i| (i, i != 13 && i != 31)).collect::<Vec<_>>());
    assert_eq!((run.scored, run.skipped.clone()), (38, vec![13, 31]));
    // The failing solution named is the first in input order, though a later batch failed first,
    // and every solution before it is handed on.
    let mut sols = many();
    let err = score_solutions_with(&concurrent(10), "prm", &mut sols, 3, OnError::Raise, |_| {}).unwrap_err();
    let failure = err.downcast_ref::<ScoreFailure>().expect("a ScoreFailure");
    assert_eq!((failure.index, failure.scored), (13, 13));
    let scored: Vec<usize> = (0..40).filter(|&i| sols[i].scores.contains_key("prm")).collect();
    assert_eq!(scored, (0..13).collect::<Vec<_>>());
    // A sink that fails stops the run with its error.
    let mut seen = 0;
    let err = score_in_order(&concurrent(1000), &many(), 3, OnError::Skip, |i, _| {
        seen += 1;
        anyhow::ensure!(i < 20, "the disk is full");
        Ok(())
    })
    .unwrap_err();
    assert_eq!((seen, err.to_string()), (21, "the disk is full".to_string()));
}

/// Too few batches to fill the scorer's slots: smaller ones, so every slot works (40 solutions
/// in batches of 64 over four slots go out as four parts of 10).
#[test]
fn a_short_run_is_cut_to_fill_every_slot() {
    let scorer = concurrent(1000);
    let run = score_in_order(&scorer, &many(), 64, OnError::Raise, |_, _| Ok(())).unwrap();
    assert_eq!(run.scored, 40);
    assert_eq!(*scorer.1.lock().unwrap(), [10, 10, 10, 10]);
}
