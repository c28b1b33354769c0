//! Verify → accept / reject / resample: one solution, written step by step; each step is scored
//! as it is written, accepted when its score reaches the threshold `τ`, else rejected and
//! resampled from the same prefix — at most `R` times per step and within a budget per problem.
//! When no attempt passes, the best-scored one is kept and the rest of the solution is written in
//! one go (a verifier that rejects a step tends to reject what follows it, so resampling further
//! would only spend the budget). `τ` comes from calibration on labelled data
//! ([`fn@crate::calibrate`]), not from the user's guess.

use crate::method::{Partial, Run, SearchMethod};
use anyhow::Result;
use stepwise_core::seams::Until;

/// Verify → resample.
pub struct Resample;

impl SearchMethod for Resample {
    fn name(&self) -> &'static str {
        "resample"
    }

    fn candidates(&self, run: &mut Run<'_>) -> Result<Vec<Partial>> {
        let config = run.config;
        let mut solution = Partial::default();
        let mut budget = config.resample_budget;
        while !solution.finished {
            let mut best: Option<Partial> = None;
            for attempt in 0.. {
                let mut kid = run.expand(&solution, 1, Until::Step)?;
                run.score(&mut kid)?;
                let kid = kid.remove(0);
                let score = kid.scores.last().copied().unwrap_or(0.0);
                let better = best
                    .as_ref()
                    .is_none_or(|b| score > b.scores.last().copied().unwrap_or(0.0));
                if better {
                    best = Some(kid);
                }
                if score >= config.threshold || attempt >= config.max_resamples || budget == 0 {
                    break;
                }
                budget -= 1;
                run.compute.rejected_steps += 1;
            }
            let Some(best) = best else { break };
            let gave_up = best.scores.last().copied().unwrap_or(0.0) < config.threshold;
            solution = best;
            if gave_up && !solution.finished {
                // No attempt passed: the verifier will likely reject whatever follows a step it
                // rejects, so resampling further only spends the budget. The rest is written
                // in one go, unverified.
                let mut rest = run.expand(&solution, 1, Until::End)?;
                run.score(&mut rest)?;
                solution = rest.remove(0);
            }
        }
        Ok(vec![solution])
    }
}
