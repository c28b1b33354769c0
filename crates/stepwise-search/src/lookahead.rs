//! Beam search with lookahead (search-and-learn's `lookahead` option): a candidate step is
//! valued by rolling it out `k` more steps greedily (temperature 0) and scoring the rollout, so a
//! step that looks good but leads nowhere is caught one or more steps early. The rollouts cost
//! generated tokens (counted) and are thrown away; the candidate keeps only its own step. A
//! round's rollouts step together (one batch call a step where the policy batches).

use crate::beam::grow;
use crate::method::{Partial, Run, SearchMethod};
use anyhow::Result;

/// Lookahead search.
pub struct Lookahead;

impl SearchMethod for Lookahead {
    fn name(&self) -> &'static str {
        "lookahead"
    }

    fn candidates(&self, run: &mut Run<'_>) -> Result<Vec<Partial>> {
        grow(run, |run, kids| {
            // Every kid's rollout a greedy step at a time, the unfinished ones together.
            let mut rollouts: Vec<Partial> = kids.to_vec();
            for _ in 0..run.config.lookahead {
                let going: Vec<usize> = (0..rollouts.len()).filter(|&i| !rollouts[i].finished).collect();
                if going.is_empty() {
                    break;
                }
                let parents: Vec<&Partial> = going.iter().map(|&i| &rollouts[i]).collect();
                let stepped = run.greedy_steps(&parents)?;
                for (i, r) in going.into_iter().zip(stepped) {
                    rollouts[i] = r;
                }
            }
            run.score(&mut rollouts)?;
            let how = run.config.aggregation;
            Ok(kids
                .iter_mut()
                .zip(&rollouts)
                .map(|(kid, r)| {
                    kid.scores = r.scores[..kid.steps.len()].to_vec();
                    r.value(how)
                })
                .collect())
        })
    }
}
