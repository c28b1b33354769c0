//! Advantages for one group of solutions to the same prompt (GRPO): rewards are normalised over
//! the group, so a solution is pushed up or down by how it compares with its siblings.

use serde::{Deserialize, Serialize};
use stepwise_core::seams::RewardKind;

/// How process rewards become each step's advantage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Credit {
    /// DeepSeekMath's rule: normalise every step reward over the group (all steps of all
    /// solutions together), then a step's advantage is the sum of the normalised rewards of it
    /// and every later step (the return to go).
    #[default]
    ReturnToGo,
    /// A prefix is as good as its weakest step: step `j` is valued `min(r_0..=r_j)`, normalised
    /// over the group (PURE's min-form credit). A bad step and everything after it share the
    /// blame; nothing later can make up for it.
    MinSoFar,
}

impl std::str::FromStr for Credit {
    type Err = anyhow::Error;

    /// `return-to-go` or `min-so-far` (`_` for `-` too, as Python spells them).
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s.replace('_', "-").as_str() {
            "return-to-go" => Ok(Credit::ReturnToGo),
            "min-so-far" => Ok(Credit::MinSoFar),
            _ => anyhow::bail!("unknown credit `{s}`: use return-to-go or min-so-far"),
        }
    }
}

const EPS: f32 = 1e-6;

/// `(x - mean) / std` over `xs` (population std); all zeros when the values are equal, where the
/// group says nothing.
pub fn normalise(xs: &[f32]) -> Vec<f32> {
    if xs.is_empty() {
        return Vec::new();
    }
    let n = xs.len() as f32;
    let mean = xs.iter().sum::<f32>() / n;
    let std = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / n).sqrt();
    if std < EPS {
        return vec![0.0; xs.len()];
    }
    xs.iter().map(|x| (x - mean) / std).collect()
}

/// Each step's advantage, for every solution of one group. `rewards[i]` holds solution `i`'s
/// rewards: one per step for [`RewardKind::Process`], a single one for [`RewardKind::Outcome`];
/// `steps[i]` is its number of steps (an outcome advantage is given to every step).
pub fn step_advantages(rewards: &[Vec<f32>], steps: &[usize], kind: RewardKind, credit: Credit) -> Vec<Vec<f32>> {
    match kind {
        RewardKind::Outcome => {
            let r: Vec<f32> = rewards.iter().map(|r| r.last().copied().unwrap_or(0.0)).collect();
            normalise(&r)
                .into_iter()
                .zip(steps)
                .map(|(a, &n)| vec![a; n.max(1)])
                .collect()
        }
        RewardKind::Process => {
            let values: Vec<Vec<f32>> = match credit {
                Credit::ReturnToGo => rewards.to_vec(),
                Credit::MinSoFar => rewards
                    .iter()
                    .map(|r| {
                        r.iter()
                            .scan(f32::INFINITY, |m, &x| {
                                *m = m.min(x);
                                Some(*m)
                            })
                            .collect()
                    })
                    .collect(),
            };
            let flat: Vec<f32> = values.iter().flatten().copied().collect();
            let mut normed = normalise(&flat).into_iter();
            values
                .iter()
                .map(|v| {
                    let mine: Vec<f32> = normed.by_ref().take(v.len()).collect();
                    match credit {
                        Credit::MinSoFar => mine,
                        Credit::ReturnToGo => returns_to_go(&mine),
                    }
                })
                .collect()
        }
    }
}

/// The return from each position: the sum of the rewards from it on (undiscounted).
pub fn returns_to_go(rewards: &[f32]) -> Vec<f32> {
    let mut acc = 0.0;
    let mut out: Vec<f32> = rewards
        .iter()
        .rev()
        .map(|x| {
            acc += x;
            acc
        })
        .collect();
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[Vec<f32>], b: &[Vec<f32>]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x.len(), y.len(), "{a:?} vs {b:?}");
            for (u, v) in x.iter().zip(y) {
                assert!((u - v).abs() < 1e-4, "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn deepseekmath_return_to_go_by_hand() {
        // Step rewards 1, 0 | 1: mean 2/3, std sqrt(2)/3, so normalised 1/√2, −√2 | 1/√2.
        let r = vec![vec![1.0, 0.0], vec![1.0]];
        let a = step_advantages(&r, &[2, 1], RewardKind::Process, Credit::ReturnToGo);
        let (h, s) = (std::f32::consts::FRAC_1_SQRT_2, std::f32::consts::SQRT_2);
        close(&a, &[vec![h - s, -s], vec![h]]);
    }

    #[test]
    fn min_so_far_by_hand() {
        // Prefix values min(0.9) = 0.9, min(0.9, 0.1) = 0.1, min(.., 0.5) = 0.1 | 0.5:
        // mean 0.4, std 0.3317.
        let r = vec![vec![0.9, 0.1, 0.5], vec![0.5]];
        let a = step_advantages(&r, &[3, 1], RewardKind::Process, Credit::MinSoFar);
        let std = ((0.25f32 + 0.09 + 0.09 + 0.01) / 4.0).sqrt();
        let z = |x: f32| (x - 0.4) / std;
        close(&a, &[vec![z(0.9), z(0.1), z(0.1)], vec![z(0.5)]]);
    }

    #[test]
    fn outcome_advantages_are_grpo_and_shared_by_every_step() {
        let r = vec![vec![1.0], vec![0.0], vec![0.0], vec![1.0]];
        let a = step_advantages(&r, &[2, 1, 3, 1], RewardKind::Outcome, Credit::ReturnToGo);
        close(&a, &[vec![1.0, 1.0], vec![-1.0], vec![-1.0; 3], vec![1.0]]);
        let same = step_advantages(
            &[vec![1.0], vec![1.0]],
            &[1, 1],
            RewardKind::Outcome,
            Credit::ReturnToGo,
        );
        close(&same, &[vec![0.0], vec![0.0]]);
    }
}
