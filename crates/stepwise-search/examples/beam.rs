//! Step-level beam search guided by a step scorer. The policy proposes a right or a wrong next
//! step at random; the scorer (standing in for a PRM) checks each step's arithmetic; beam search
//! keeps the best partial solutions at every step and ends with a right one.
//!
//! cargo run -p stepwise-search --example beam

use stepwise_core::seams::{Continuation, Policy, ScoreInput, Scored, StepScorer, Until};
use stepwise_search::{method, search, SearchConfig};

/// Proposes `k * 2 = 2k` (right) or `k * 2 = 2k + 1` (wrong) for step k, or the answer after 3.
struct Doubling;

impl Policy for Doubling {
    fn continue_from(
        &self,
        _q: &str,
        prefix: &[&str],
        n: usize,
        _until: Until,
        seed: u64,
    ) -> anyhow::Result<Vec<Continuation>> {
        Ok((0..n as u64)
            .map(|j| {
                let k = prefix.len() as u64 + 1;
                let wrong = (seed.wrapping_mul(31) + j * 7 + k).is_multiple_of(3);
                let step = if k > 3 {
                    "done".to_string()
                } else {
                    format!("{k} * 2 = {}", 2 * k + u64::from(wrong))
                };
                Continuation {
                    text: step.clone(),
                    steps: vec![step],
                    finished: k > 3,
                    tokens: 5,
                    token_ids: Vec::new(),
                }
            })
            .collect())
    }
}

/// 1 for a step whose arithmetic holds, 0 otherwise.
struct ArithmeticChecker;

impl StepScorer for ArithmeticChecker {
    fn score(&self, batch: &[ScoreInput<'_>]) -> anyhow::Result<Scored> {
        let ok = |s: &str| {
            let t: Vec<u64> = s
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|x| x.parse().ok())
                .collect();
            t.len() != 3 || t[0] * t[1] == t[2]
        };
        Ok(Scored {
            scores: batch
                .iter()
                .map(|i| i.steps.iter().map(|s| f32::from(u8::from(ok(s)))).collect())
                .collect(),
            tokens: 0,
        })
    }
}

fn main() -> anyhow::Result<()> {
    let config = SearchConfig {
        n: 8,
        width: 2,
        ..Default::default()
    };
    let found = search(
        &*method("beam")?,
        &config,
        "p1",
        "Double 1, 2 and 3.",
        &Doubling,
        &ArithmeticChecker,
    )?;
    println!("chosen: {:?} (of {} candidates)", found.chosen.steps, found.candidates);
    println!("compute: {:?}", found.compute);
    assert_eq!(
        found.chosen.scores.iter().copied().fold(1.0, f32::min),
        1.0,
        "every chosen step is right"
    );
    Ok(())
}
