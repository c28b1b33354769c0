//! Best-of-N over held-out trajectories: the majority of outcomes (where the goal's item ended
//! up), the ORM, and PRMs on Monte Carlo and TD labels, as curves over N with paired
//! differences at the largest N; and lucky successes (the goal reached after an invalid or
//! regressing action), in the pool and among what each selector picks.

use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use stepwise_agent::rooms::world_of;
use stepwise_core::{Problem, Solution};
use stepwise_eval::bon::{curve, per_problem_accuracy, Curve};
use stepwise_eval::paired::{paired_difference, PairedDifference};
use stepwise_search::{select, Aggregation, Candidate, Selector};

/// Draws of N candidates per world at each point.
const DRAWS: usize = 64;

/// What best-of-N found.
#[derive(Debug, Clone, Serialize)]
pub struct BestOfN {
    /// Curves: pass@N, each selector.
    pub curves: Vec<Curve>,
    /// The same for clean success: the goal reached with no invalid or regressing action on the
    /// way (a lucky success counts as a failure). The outcome cannot tell the two apart; a
    /// verifier of actions can.
    pub clean_curves: Vec<Curve>,
    /// Paired differences at the largest N.
    pub paired: Vec<PairedDifference>,
    /// Share of successes with an invalid or regressing action: in the pool (`pool`), and among
    /// the successes each selector picks from all of a world's trajectories.
    pub lucky: BTreeMap<String, f64>,
    /// How far the ORM falls short of pass@N on success, the most over N: 0 when it picks a
    /// success whenever one exists (the outcome is readable from the trajectory), a ceiling no
    /// selector can pass on success; clean success is then where a verifier of actions can.
    pub orm_shortfall: f64,
}

/// Whether a trajectory is a lucky success: it reached the goal after an action the oracle
/// calls invalid or regress (`oracle` is the trajectory labelled by the oracle).
pub fn lucky(oracle: &Solution) -> bool {
    oracle.correct == Some(true)
        && oracle.meta.get("actions").and_then(|a| a.as_array()).is_some_and(|a| {
            a.iter()
                .any(|k| matches!(k.as_str(), Some("invalid") | Some("regress")))
        })
}

/// The ids of the lucky successes among trajectories labelled by the oracle.
pub fn lucky_ids(oracle: &[Solution]) -> std::collections::HashSet<&str> {
    oracle.iter().filter(|o| lucky(o)).map(|o| o.id.as_str()).collect()
}

/// Of the successes among `ts`, the share whose id is in `lucky` ([`lucky_ids`]).
pub fn lucky_share<'a>(ts: impl IntoIterator<Item = &'a Solution>, lucky: &std::collections::HashSet<&str>) -> f64 {
    let (wins, lucky_wins) = ts
        .into_iter()
        .filter(|t| t.correct == Some(true))
        .fold((0usize, 0usize), |(w, l), t| {
            (w + 1, l + usize::from(lucky.contains(t.id.as_str())))
        });
    lucky_wins as f64 / wins.max(1) as f64
}

/// Where the goal's item lies at the end of `t`: the outcome the majority vote counts.
fn end_place(problem: &Problem, t: &Solution) -> Result<String> {
    let w = world_of(problem)?;
    Ok(w.goal_place(&w.replay(t.steps.iter().map(|s| s.text.as_str()))))
}

/// A scorer's candidates, world by world: step scores from `scores[prm]`, the outcome score
/// from `scores[orm]`'s last, the answer where the item ended up.
fn candidates(groups: &[(Problem, Vec<Solution>)], prm: &str, orm: &str) -> Result<Vec<Vec<Candidate>>> {
    groups
        .iter()
        .map(|(p, ts)| {
            ts.iter()
                .map(|t| {
                    let scores = |name: &str| {
                        t.scores_of(name)
                            .with_context(|| format!("trajectory `{}`: no `{name}` scores", t.id))
                    };
                    Ok(Candidate {
                        answer: Some(end_place(p, t)?),
                        step_scores: scores(prm)?,
                        outcome_score: scores(orm)?.last().copied().unwrap_or(0.0),
                        correct: t.correct == Some(true),
                    })
                })
                .collect()
        })
        .collect()
}

/// A PRM's selector as reports name it: `prm_mc` by its lowest score is `PRM-MC-min`.
fn selector_label(prm: &str, agg: Aggregation) -> String {
    format!("{}-{}", prm.to_uppercase().replace('_', "-"), agg.name())
}

/// The selectors compared: (label, scorer whose step scores it reads, rule).
fn selectors(prms: &[&str]) -> Vec<(String, String, Option<Selector>)> {
    let mut out = vec![
        ("pass@N".to_string(), prms[0].to_string(), None),
        ("majority".into(), prms[0].into(), Some(Selector::Majority)),
        ("ORM".into(), prms[0].into(), Some(Selector::Orm)),
    ];
    for prm in prms {
        for agg in [Aggregation::Min, Aggregation::Mean, Aggregation::Last] {
            let label = selector_label(prm, agg);
            out.push((label, prm.to_string(), Some(Selector::Prm(agg))));
        }
    }
    out
}

/// Best-of-N on `groups` (each held-out world with its scored trajectories; `oracle` the same
/// trajectories labelled by the oracle) for the PRMs `prms` (score names; the first is the
/// headline's) and the ORM `orm`, at N = 1, 2, 4, … up to every trajectory.
pub fn best_of_n(
    groups: &[(Problem, Vec<Solution>)],
    oracle: &[Solution],
    prms: &[&str],
    orm: &str,
    seed: u64,
) -> Result<BestOfN> {
    let most = groups.iter().map(|(_, ts)| ts.len()).min().unwrap_or(1).max(1);
    let ns: Vec<usize> = std::iter::successors(Some(1usize), |n| Some(n * 2))
        .take_while(|&n| n < most)
        .chain([most])
        .collect();
    let by_prm: BTreeMap<String, Vec<Vec<Candidate>>> = prms
        .iter()
        .map(|p| Ok((p.to_string(), candidates(groups, p, orm)?)))
        .collect::<Result<_>>()?;
    let lucky_ids = lucky_ids(oracle);
    let clean = |cands: &[Vec<Candidate>]| -> Vec<Vec<Candidate>> {
        cands
            .iter()
            .zip(groups)
            .map(|(cs, (_, ts))| {
                cs.iter()
                    .zip(ts)
                    .map(|(c, t)| Candidate {
                        correct: c.correct && !lucky_ids.contains(t.id.as_str()),
                        ..c.clone()
                    })
                    .collect()
            })
            .collect()
    };
    let (mut clean_curves, mut clean_at_most) = (Vec::new(), BTreeMap::new());
    let (mut curves, mut at_most) = (Vec::new(), BTreeMap::new());
    let mut lucky_rate = BTreeMap::new();
    lucky_rate.insert(
        "pool".to_string(),
        lucky_share(groups.iter().flat_map(|(_, ts)| ts), &lucky_ids),
    );
    for (label, prm, how) in selectors(prms) {
        let cands = &by_prm[&prm];
        curves.push(curve(&label, cands, how, &ns, DRAWS, seed));
        at_most.insert(label.clone(), per_problem_accuracy(cands, how, most, DRAWS, seed));
        let cleaned = clean(cands);
        clean_curves.push(curve(&label, &cleaned, how, &ns, DRAWS, seed));
        clean_at_most.insert(label.clone(), per_problem_accuracy(&cleaned, how, most, DRAWS, seed));
        if let Some(sel) = how {
            lucky_rate.insert(label, picked_lucky_rate(groups, cands, sel, &lucky_ids));
        }
    }
    let paired = paired_at_most(prms, most, &at_most, &clean_at_most, seed);
    Ok(BestOfN {
        orm_shortfall: shortfall(&curves, "ORM"),
        curves,
        clean_curves,
        paired,
        lucky: lucky_rate,
    })
}

/// The most, over N, by which the curve `method` falls short of pass@N (0 without either).
fn shortfall(curves: &[Curve], method: &str) -> f64 {
    let find = |m: &str| curves.iter().find(|c| c.method == m);
    let (Some(pass), Some(c)) = (find("pass@N"), find(method)) else {
        return 0.0;
    };
    pass.points
        .iter()
        .zip(&c.points)
        .map(|(p, q)| p.accuracy - q.accuracy)
        .fold(0.0, f64::max)
}

/// The paired differences at the largest N (`most`), world by world: the headline PRM (the first
/// of `prms`) with its lowest action score against the majority of outcomes, and in each
/// aggregation (min, mean, last) against the ORM; the second PRM's min against the ORM; on
/// success (`at_most`) and on clean success (`clean_at_most`).
fn paired_at_most(
    prms: &[&str],
    most: usize,
    at_most: &BTreeMap<String, Vec<f64>>,
    clean_at_most: &BTreeMap<String, Vec<f64>>,
    seed: u64,
) -> Vec<PairedDifference> {
    let name = selector_label;
    let headline = name(prms[0], Aggregation::Min);
    let mut pairs = vec![(headline.clone(), "majority".to_string())];
    for agg in [Aggregation::Min, Aggregation::Mean, Aggregation::Last] {
        pairs.push((name(prms[0], agg), "ORM".into()));
    }
    let success: Vec<_> = pairs
        .iter()
        .cloned()
        .chain(prms.get(1).map(|p| (name(p, Aggregation::Min), "ORM".to_string())))
        .collect();
    let one = |measure: &str, table: &BTreeMap<String, Vec<f64>>, (a, b): &(String, String), salt: u64| {
        paired_difference(measure, a, &table[a], b, &table[b], seed ^ salt)
    };
    let (measure, clean_measure) = (
        format!("best-of-{most} success"),
        format!("best-of-{most} clean success"),
    );
    success
        .iter()
        .map(|p| one(&measure, at_most, p, 9))
        .chain(pairs.iter().map(|p| one(&clean_measure, clean_at_most, p, 12)))
        .collect()
}

/// Of the successes `sel` picks from all of each world's trajectories, the share that are lucky.
fn picked_lucky_rate(
    groups: &[(Problem, Vec<Solution>)],
    cands: &[Vec<Candidate>],
    sel: Selector,
    lucky_ids: &std::collections::HashSet<&str>,
) -> f64 {
    let (mut wins, mut lucky_wins) = (0usize, 0usize);
    for ((_, ts), cs) in groups.iter().zip(cands) {
        let refs: Vec<&Candidate> = cs.iter().collect();
        if let Some(k) = select(&refs, sel).filter(|&k| cs[k].correct) {
            wins += 1;
            lucky_wins += usize::from(lucky_ids.contains(ts[k].id.as_str()));
        }
    }
    lucky_wins as f64 / wins.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepwise_eval::bon::Point;

    fn curve(method: &str, accuracies: &[f64]) -> Curve {
        let points = accuracies
            .iter()
            .enumerate()
            .map(|(i, &accuracy)| Point {
                n: 1 << i,
                accuracy,
                lo: accuracy,
                hi: accuracy,
            })
            .collect();
        Curve {
            method: method.into(),
            points,
        }
    }

    #[test]
    fn the_orm_shortfall_is_the_largest_gap_to_pass_at_n() {
        let pass = curve("pass@N", &[0.2, 0.5, 0.9]);
        let curves = [pass.clone(), curve("ORM", &[0.2, 0.375, 0.85])];
        assert!((shortfall(&curves, "ORM") - 0.125).abs() < 1e-12);
        // An ORM at pass@N everywhere falls short by nothing; a missing curve reads as none.
        assert_eq!(shortfall(&[pass.clone(), curve("ORM", &[0.2, 0.5, 0.9])], "ORM"), 0.0);
        assert_eq!(shortfall(&[pass], "ORM"), 0.0);
    }
}
