//! Beam search with lookahead (search-and-learn's `lookahead` option): a candidate step is
//! valued by rolling it out `k` more steps greedily (temperature 0) and scoring the rollout, so a
//! step that looks good but leads nowhere is caught one or more steps early. The rollouts cost
//! generated tokens (counted) and are thrown away; the candidate keeps only its own step.

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
            let mut rollouts = Vec::with_capacity(kids.len());
            for kid in kids.iter() {
                let mut r = kid.clone();
                for _ in 0..run.config.lookahead {
                    if r.finished {
                        break;
                    }
                    r = run.greedy_step(&r)?;
                }
                rollouts.push(r);
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
