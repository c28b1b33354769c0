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
    /// Each step by its own reward, normalised over the group's steps: no sum and no minimum,
    /// so a good step after a bad one still counts. For rewards that judge a step by itself (an
    /// oracle's verdict on an action).
    Own,
    /// Each step by the change it made: its reward minus the one before it (the first step's
    /// minus the group's mean first reward, the start state's value as the group sees it),
    /// normalised over the group's steps. For a PRM that scores the state each step leads to
    /// (a value), this is the step's progress `V(s') − V(s)` (Xi et al.'s advantage with γ = 1,
    /// potential-based shaping): reaching a high-valued state is worth nothing in itself, only
    /// moving up is.
    Progress,
}

impl std::str::FromStr for Credit {
    type Err = anyhow::Error;

    /// `return-to-go`, `min-so-far`, `own` or `progress` (`_` for `-` too, as Python spells
    /// them).
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s.replace('_', "-").as_str() {
            "return-to-go" => Ok(Credit::ReturnToGo),
            "min-so-far" => Ok(Credit::MinSoFar),
            "own" => Ok(Credit::Own),
            "progress" => Ok(Credit::Progress),
            _ => anyhow::bail!("unknown credit `{s}`: use return-to-go, min-so-far, own or progress"),
        }
    }
}

impl Credit {
    /// Its name as the command line spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Credit::ReturnToGo => "return-to-go",
            Credit::MinSoFar => "min-so-far",
            Credit::Own => "own",
            Credit::Progress => "progress",
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
            let values = step_values(rewards, credit);
            let flat: Vec<f32> = values.iter().flatten().copied().collect();
            let mut normed = normalise(&flat).into_iter();
            values
                .iter()
                .map(|v| {
                    let mine: Vec<f32> = normed.by_ref().take(v.len()).collect();
                    match credit {
                        Credit::ReturnToGo => returns_to_go(&mine),
                        Credit::MinSoFar | Credit::Own | Credit::Progress => mine,
                    }
                })
                .collect()
        }
    }
}

/// What each step is valued at before the group's normalisation, as `credit` says.
fn step_values(rewards: &[Vec<f32>], credit: Credit) -> Vec<Vec<f32>> {
    match credit {
        Credit::ReturnToGo | Credit::Own => rewards.to_vec(),
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
        Credit::Progress => {
            let firsts: Vec<f32> = rewards.iter().filter_map(|r| r.first().copied()).collect();
            let start = firsts.iter().sum::<f32>() / firsts.len().max(1) as f32;
            rewards
                .iter()
                .map(|r| {
                    let before = std::iter::once(start).chain(r.iter().copied());
                    r.iter().zip(before).map(|(x, b)| x - b).collect()
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
    fn own_credit_values_a_good_step_after_a_bad_one() {
        // Oracle verdicts 0, 1 | 1, 0.5: mean 0.625, std sqrt(0.671875)/2 ≈ 0.4146.
        let r = vec![vec![0.0, 1.0], vec![1.0, 0.5]];
        let a = step_advantages(&r, &[2, 2], RewardKind::Process, Credit::Own);
        let std = ((0.390625f32 + 0.140625 + 0.140625 + 0.015625) / 4.0).sqrt();
        let z = |x: f32| (x - 0.625) / std;
        close(&a, &[vec![z(0.0), z(1.0)], vec![z(1.0), z(0.5)]]);
        assert!(a[0][1] > 0.0, "the progress after the invalid action is pushed up");
    }

    #[test]
    fn progress_credit_is_the_change_in_value() {
        // Values 0.2, 0.6, 0.6 | 0.4, 0.1: the start is the mean first value 0.3, so the changes
        // are -0.1, 0.4, 0.0 | 0.1, -0.3 (mean 0.02, std 0.2315).
        let r = vec![vec![0.2, 0.6, 0.6], vec![0.4, 0.1]];
        let a = step_advantages(&r, &[3, 2], RewardKind::Process, Credit::Progress);
        let d = [-0.1f32, 0.4, 0.0, 0.1, -0.3];
        let std = (d.iter().map(|x| (x - 0.02).powi(2)).sum::<f32>() / 5.0).sqrt();
        let z = |x: f32| (x - 0.02) / std;
        close(&a, &[vec![z(-0.1), z(0.4), z(0.0)], vec![z(0.1), z(-0.3)]]);
        assert!(
            a[0][2] < a[0][1],
            "staying in a good state is worth less than reaching it"
        );
        for (name, c) in [
            ("own", Credit::Own),
            ("progress", Credit::Progress),
            ("min_so_far", Credit::MinSoFar),
        ] {
            assert_eq!(name.parse::<Credit>().unwrap(), c);
            assert_eq!(c.name().parse::<Credit>().unwrap(), c);
        }
        assert!("sum"
            .parse::<Credit>()
            .unwrap_err()
            .to_string()
            .contains("own or progress"));
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
