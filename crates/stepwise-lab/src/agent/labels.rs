//! Labels for the policy's actions, and how well they agree with the oracle: the oracle's own
//! verdicts, Monte Carlo rollouts from each state (AgentPRM, Choudhury 2025), binary search for
//! the first dead action over the same rollouts (Luo et al. 2024), and TD(λ) from a
//! learned value (AgentPRM, Xi et al. 2026). The value is cross-fitted: the label worlds are
//! split in two, a value model trained on one half's discounted returns scores the other
//! half's states, so no trajectory's values come from a model that saw its return.

use super::Ctx;
use crate::stages::annotate::label_stage;
use anyhow::Result;
use serde::Serialize;
use stepwise_agent::labels::{Games, MonteCarlo, Oracle, TemporalDifference};
use stepwise_agent::quality::{agreement, agreement_by, progress, Agreement};
use stepwise_agent::BinarySearch;
use stepwise_core::seams::Annotator;
use stepwise_core::Solution;

/// One label source's agreement with the oracle and what it cost.
#[derive(Debug, Clone, Serialize)]
pub struct LabelCost {
    /// Agreement with the oracle (AUC of progress, good against bad actions).
    pub agreement: Agreement,
    /// Environment steps spent labelling, beyond playing the trajectories themselves.
    pub env_steps: u64,
    /// Policy tokens spent labelling.
    pub tokens: u64,
}

/// The labelled trajectories of the label split.
pub struct Labels {
    /// The oracle's verdicts (`meta.actions` names each).
    pub oracle: Vec<Solution>,
    /// Monte Carlo soft labels.
    pub mc: Vec<Solution>,
    /// TD(λ) labels from the cross-fitted value.
    pub td: Vec<Solution>,
    /// Each source's agreement and cost: `mc`, `binary` (binary search for the first dead
    /// action over Monte Carlo probes; it labels only the actions up to it, so
    /// `mc_on_binary_actions` is Monte Carlo's agreement on those same actions), `td`, and
    /// `return` (each action's discounted return in its own trajectory: TD with λ = 1, what the
    /// value learns from).
    pub costs: Vec<(String, LabelCost)>,
    /// Environment steps of the trajectories themselves.
    pub trajectory_steps: u64,
}

fn meta_sum(sols: &[Solution], key: &str) -> u64 {
    sols.iter()
        .filter_map(|s| s.meta.get(key).and_then(serde_json::Value::as_u64))
        .sum()
}

/// The agreement of `labelled`'s progress with `oracle` on only the actions `subset` labels (the
/// same trajectories labelled another way): two sources compared on the same actions.
fn same_actions(labelled: &[Solution], subset: &[Solution], oracle: &[Solution], v0: f32, gamma: f32) -> Agreement {
    let by_id: std::collections::HashMap<&str, &Solution> = labelled.iter().map(|t| (t.id.as_str(), t)).collect();
    agreement_by(subset, oracle, |t| {
        let gained = by_id
            .get(t.id.as_str())
            .map(|l| progress(l, v0, gamma))
            .unwrap_or_default();
        t.steps
            .iter()
            .enumerate()
            .map(|(i, st)| st.label.as_ref().and(gained.get(i).copied().flatten()))
            .collect()
    })
}

/// The mean outcome of trajectories: the value of a start state.
pub fn mean_outcome(ts: &[Solution]) -> f32 {
    let outcomes: Vec<f32> = ts
        .iter()
        .filter_map(|t| t.correct)
        .map(|c| f32::from(u8::from(c)))
        .collect();
    outcomes.iter().sum::<f32>() / outcomes.len().max(1) as f32
}

impl Ctx<'_> {
    /// Label `sols` with `annotator`, journalled in the run folder's `file`.
    pub fn label(&self, file: &str, sols: &[Solution], annotator: &dyn Annotator, what: &str) -> Result<Vec<Solution>> {
        Ok(label_stage(&self.out.join(file), sols, annotator, what)?.0)
    }

    /// Every label source on the label split's trajectories.
    pub fn labels(&self, games: &Games, trajs: &[Solution]) -> Result<Labels> {
        let a = &self.preset.agent;
        let oracle = self.label("oracle_label.jsonl", trajs, &Oracle(games), "oracle labels")?;
        let mc_annotator = MonteCarlo {
            games,
            policy: self.policy,
            rollouts: a.rollouts,
            seed: self.seed ^ 4,
            gamma: a.gamma,
        };
        let mc = self.label("mc.jsonl", trajs, &mc_annotator, "Monte Carlo labels")?;
        // Binary search probes states with the same rollouts (and draws) as Monte Carlo.
        let bs_annotator = BinarySearch {
            games,
            policy: self.policy,
            rollouts: a.rollouts,
            seed: self.seed ^ 4,
        };
        let binary = self.label("binary.jsonl", trajs, &bs_annotator, "binary-search labels")?;
        let v0 = mean_outcome(trajs);
        let returns = TemporalDifference {
            values: "value".into(),
            v0,
            gamma: a.gamma,
            lambda: 1.0,
        };
        let returns: Vec<Solution> = trajs
            .iter()
            .map(|t| Ok(returns.annotate(t)?.0))
            .collect::<Result<_>>()?;
        let valued = self.cross_fitted_values(&returns)?;
        let td = TemporalDifference {
            values: "value".into(),
            v0,
            gamma: a.gamma,
            lambda: a.lambda,
        };
        let td: Vec<Solution> = valued.iter().map(|t| Ok(td.annotate(t)?.0)).collect::<Result<_>>()?;
        let cost = |sols: &[Solution], env_steps: u64, tokens: u64| LabelCost {
            agreement: agreement(sols, &oracle, v0, a.gamma),
            env_steps,
            tokens,
        };
        let trajectory_steps: u64 = trajs.iter().map(|t| t.steps.len() as u64).sum();
        // A Monte Carlo record's `env_steps` counts its replay of the trajectory too; a binary
        // search's, where it probed (the trajectory failed).
        let mc_steps = meta_sum(&mc, "env_steps").saturating_sub(trajectory_steps);
        let probed: u64 = binary
            .iter()
            .filter(|t| t.correct != Some(true))
            .map(|t| t.steps.len() as u64)
            .sum();
        let binary_steps = meta_sum(&binary, "env_steps").saturating_sub(probed);
        let costs = vec![
            ("mc".to_string(), cost(&mc, mc_steps, meta_sum(&mc, "generated_tokens"))),
            (
                "binary".to_string(),
                cost(&binary, binary_steps, meta_sum(&binary, "generated_tokens")),
            ),
            (
                "mc_on_binary_actions".to_string(),
                LabelCost {
                    agreement: same_actions(&mc, &binary, &oracle, v0, a.gamma),
                    env_steps: mc_steps,
                    tokens: meta_sum(&mc, "generated_tokens"),
                },
            ),
            ("td".to_string(), cost(&td, 0, 0)),
            ("return".to_string(), cost(&returns, 0, 0)),
        ];
        Ok(Labels {
            oracle,
            mc,
            td,
            costs,
            trajectory_steps,
        })
    }

    /// `returns` (trajectories labelled with their discounted returns) scored under `value` by
    /// a value model that did not see them: worlds split by parity, each half scored by the
    /// model trained on the other's returns.
    fn cross_fitted_values(&self, returns: &[Solution]) -> Result<Vec<Solution>> {
        let half = |s: &Solution| crate::agent::parity(&s.problem_id);
        let mut out = returns.to_vec();
        for fold in [false, true] {
            let train: Vec<Solution> = returns.iter().filter(|s| half(s) != fold).cloned().collect();
            let model = self.verifiers().train_for(
                &format!("value-{}", u8::from(fold)),
                &format!("training value model {}/2", u8::from(fold) + 1),
                &train,
                false,
                self.preset.agent.verifier_steps,
            )?;
            let mut scored: Vec<Solution> = out.iter().filter(|s| half(s) == fold).cloned().collect();
            self.verifiers().score(
                &model,
                false,
                &mut scored,
                "value",
                "scoring states with the value model",
            )?;
            let by_id: std::collections::HashMap<String, Solution> =
                scored.into_iter().map(|s| (s.id.clone(), s)).collect();
            for s in out.iter_mut() {
                if let Some(v) = by_id.get(&s.id) {
                    *s = v.clone();
                }
            }
        }
        Ok(out)
    }
}
