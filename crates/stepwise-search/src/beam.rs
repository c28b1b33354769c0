//! PRM-guided beam search (search-and-learn's `beam_search`): the first step is sampled `N`
//! times; at every step the `N / M` best distinct open beams (by the aggregated scores of their
//! steps) are kept and each is extended `M` ways, so `N` steps are written per round (when fewer
//! distinct beams are open, each is extended more ways: the budget per round stays `N`). Finished
//! beams leave the beam; the search stops when `N` have finished or none is open.

use crate::method::{keep_best, Partial, Run, SearchMethod};
use anyhow::Result;
use stepwise_core::seams::Until;

/// Beam search; candidates are ranked by their own step scores.
pub struct BeamSearch;

impl SearchMethod for BeamSearch {
    fn name(&self) -> &'static str {
        "beam"
    }

    fn candidates(&self, run: &mut Run<'_>) -> Result<Vec<Partial>> {
        grow(run, |run, kids| {
            run.score(kids)?;
            let how = run.config.aggregation;
            Ok(kids.iter().map(|k| k.value(how)).collect())
        })
    }
}

/// The beam search loop, with `rank` giving each new candidate its value (and its step scores):
/// its own scores for [`BeamSearch`], a greedy rollout's for lookahead.
pub(crate) fn grow(
    run: &mut Run<'_>,
    mut rank: impl FnMut(&mut Run<'_>, &mut [Partial]) -> Result<Vec<f32>>,
) -> Result<Vec<Partial>> {
    let config = run.config;
    let keep = (config.n / config.width).max(1);
    let mut open = vec![Partial::default()];
    let mut done = Vec::new();
    for _ in 0..config.max_steps.max(1) {
        // N new steps per round, shared by the open beams: M each when N / M distinct beams are
        // open, more each when fewer are (samples that repeat a beam still explore it).
        let parents: Vec<(&Partial, usize)> = (open.iter().enumerate())
            .map(|(k, beam)| (beam, config.n / open.len() + usize::from(k < config.n % open.len())))
            .filter(|&(_, ways)| ways > 0)
            .collect();
        let mut kids: Vec<Partial> = run.expand_all(&parents, Until::Step)?.into_iter().flatten().collect();
        let value = rank(run, &mut kids)?;
        let (mut next, mut next_value) = (Vec::new(), Vec::new());
        for (kid, v) in kids.into_iter().zip(value) {
            if kid.finished {
                done.push(kid);
            } else {
                next.push(kid);
                next_value.push(v);
            }
        }
        if done.len() >= config.n || next.is_empty() {
            break;
        }
        open = keep_best(next, &next_value, keep);
    }
    Ok(done)
}
