//! Best-of-N: pick one of N candidate solutions by a PRM (with an aggregation of its step
//! scores), by PRM-weighted majority vote, by an ORM, or by plain majority vote.

use crate::aggregation::{aggregate, Aggregation};
use crate::method::{Partial, Run, SearchMethod};
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use stepwise_core::seams::Until;

/// Best-of-N as a search method: `N` whole solutions sampled at once, every step scored; the
/// search picks the best by the configured aggregation.
pub struct BestOfN;

impl SearchMethod for BestOfN {
    fn name(&self) -> &'static str {
        "bon"
    }

    fn candidates(&self, run: &mut Run<'_>) -> Result<Vec<Partial>> {
        let mut all = run.expand(&Partial::default(), run.config.n, Until::End)?;
        for a in &mut all {
            a.finished = true;
        }
        run.score(&mut all)?;
        Ok(all)
    }
}

/// One sampled solution as the selectors see it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Candidate {
    /// Its final answer (None when it gave none).
    pub answer: Option<String>,
    /// Step scores from a PRM.
    pub step_scores: Vec<f32>,
    /// Outcome score from an ORM.
    pub outcome_score: f32,
    /// Whether the answer is correct (for evaluation only; selectors never look at it).
    pub correct: bool,
}

/// A way to choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Selector {
    /// Highest aggregated PRM score.
    Prm(Aggregation),
    /// Answer with the largest sum of aggregated PRM scores.
    PrmVote(Aggregation),
    /// Highest ORM score.
    Orm,
    /// Most frequent answer (ties: first seen).
    Majority,
}

impl Selector {
    /// A short label for tables and plots.
    pub fn label(self) -> String {
        match self {
            Selector::Prm(a) => format!("PRM-{}", a.name()),
            Selector::PrmVote(a) => format!("PRM-vote-{}", a.name()),
            Selector::Orm => "ORM".into(),
            Selector::Majority => "majority".into(),
        }
    }
}

fn argmax(xs: impl Iterator<Item = f32>) -> Option<usize> {
    xs.enumerate()
        .fold(None, |best: Option<(usize, f32)>, (i, x)| match best {
            Some((_, b)) if b >= x => best,
            _ => Some((i, x)),
        })
        .map(|(i, _)| i)
}

fn vote(cands: &[&Candidate], weight: impl Fn(&Candidate) -> f32) -> Option<usize> {
    let mut tally: HashMap<&str, (f32, usize)> = HashMap::new();
    for (i, c) in cands.iter().enumerate() {
        if let Some(a) = &c.answer {
            let e = tally.entry(a.as_str()).or_insert((0.0, i));
            e.0 += weight(c);
        }
    }
    tally
        .into_values()
        .max_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)))
        .map(|(_, i)| i)
}

/// The index of the chosen candidate.
pub fn select(cands: &[&Candidate], how: Selector) -> Option<usize> {
    match how {
        Selector::Prm(a) => argmax(cands.iter().map(|c| aggregate(&c.step_scores, a))),
        Selector::PrmVote(a) => vote(cands, |c| aggregate(&c.step_scores, a)),
        Selector::Orm => argmax(cands.iter().map(|c| c.outcome_score)),
        Selector::Majority => vote(cands, |_| 1.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    fn c(a: &str, s: &[f32], o: f32, ok: bool) -> Candidate {
        Candidate {
            answer: Some(a.into()),
            step_scores: s.to_vec(),
            outcome_score: o,
            correct: ok,
        }
    }
    #[test]
    fn selectors() {
        let cs = [
            c("1", &[0.9, 0.2], 0.9, false),
            c("2", &[0.6, 0.6], 0.1, true),
            c("1", &[0.5, 0.3], 0.2, false),
        ];
        let r: Vec<&Candidate> = cs.iter().collect();
        assert_eq!(select(&r, Selector::Prm(Aggregation::Min)), Some(1));
        assert_eq!(select(&r, Selector::Prm(Aggregation::Last)), Some(1));
        assert_eq!(select(&r, Selector::Prm(Aggregation::Mean)), Some(1));
        assert_eq!(select(&r, Selector::Orm), Some(0));
        assert_eq!(select(&r, Selector::Majority), Some(0));
        assert_eq!(select(&r, Selector::PrmVote(Aggregation::Min)), Some(1));
        assert!((aggregate(&[0.5, 0.5], Aggregation::Product) - 0.25).abs() < 1e-6);
    }
}
