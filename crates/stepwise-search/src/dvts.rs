//! Diverse verifier tree search (search-and-learn's `dvts`): `N / M` independent subtrees, each
//! grown greedily — its beam is extended `M` ways per step and the best-scored child is kept.
//! Subtrees never compete, so the `N / M` finished solutions stay diverse where beam search
//! would collapse onto one high-scoring prefix at large budgets.

use crate::method::{keep_best, Partial, Run, SearchMethod};
use anyhow::Result;
use stepwise_core::seams::Until;

/// DVTS.
pub struct Dvts;

impl SearchMethod for Dvts {
    fn name(&self) -> &'static str {
        "dvts"
    }

    fn candidates(&self, run: &mut Run<'_>) -> Result<Vec<Partial>> {
        let config = run.config;
        let trees = (config.n / config.width).max(1);
        let mut open: Vec<Option<Partial>> = vec![Some(Partial::default()); trees];
        let mut done = Vec::with_capacity(trees);
        for _ in 0..config.max_steps.max(1) {
            // Every open subtree's children are scored together.
            let (mut kids, mut owner) = (Vec::new(), Vec::new());
            let growing: Vec<(usize, &Partial)> = (open.iter().enumerate())
                .filter_map(|(t, beam)| Some((t, beam.as_ref()?)))
                .collect();
            let parents: Vec<(&Partial, usize)> = growing.iter().map(|&(_, b)| (b, config.width)).collect();
            for (&(t, _), new) in growing.iter().zip(run.expand_all(&parents, Until::Step)?) {
                owner.extend(std::iter::repeat_n(t, new.len()));
                kids.extend(new);
            }
            if kids.is_empty() {
                break;
            }
            run.score(&mut kids)?;
            for (t, slot) in open.iter_mut().enumerate() {
                let mine: Vec<Partial> = kids
                    .iter()
                    .zip(&owner)
                    .filter(|(_, &o)| o == t)
                    .map(|(k, _)| k.clone())
                    .collect();
                let value: Vec<f32> = mine.iter().map(|k| k.value(config.aggregation)).collect();
                if let Some(best) = keep_best(mine, &value, 1).pop() {
                    if best.finished {
                        done.push(best);
                        *slot = None;
                    } else {
                        *slot = Some(best);
                    }
                }
            }
        }
        // A subtree still open at the step limit ends there.
        done.extend(open.into_iter().flatten().map(|mut b| {
            b.finished = true;
            b
        }));
        Ok(done)
    }
}
