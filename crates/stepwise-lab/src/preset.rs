//! The lab's sizes and budgets ([`Preset`]): the measured `standard` setting, the `quick` one,
//! and `--set FIELD=VALUE` overrides.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// Sizes and budgets of a lab run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Preset {
    /// Name.
    pub name: String,
    /// Policy shape: hidden size, layers.
    pub policy_shape: (usize, usize),
    /// Policy training steps and batch size.
    pub policy_steps: usize,
    /// Problems the policy is trained on (reference solutions with slips).
    pub policy_problems: usize,
    /// Probability that a training solution carries one arithmetic slip.
    pub slip: f64,
    /// Problems whose samples are annotated to train the verifiers.
    pub label_problems: usize,
    /// Samples per annotation problem.
    pub label_samples: usize,
    /// Monte Carlo rollouts per step prefix.
    pub rollouts: usize,
    /// Which Math-Shepherd estimate of the rollouts PRM-MC learns.
    #[serde(default)]
    pub mc_labels: McLabels,
    /// The model whose rollouts estimate a step's label (Monte Carlo, binary search and the
    /// OmegaPRM tree alike): Math-Shepherd's *completer*. A rollout's success rate is the value
    /// of a prefix *for the completer*, so a weak completer calls correct prefixes bad.
    #[serde(default)]
    pub completer: Completer,
    /// Held-out evaluation problems.
    pub eval_problems: usize,
    /// Samples per evaluation problem (the largest N of best-of-N).
    pub eval_samples: usize,
    /// Start every verifier from a language model — the policy, or the verifiers' own base when
    /// `verifier_base_steps` > 0 — as real PRMs and ORMs are fine-tuned from one (they need its
    /// arithmetic to judge a step); `false` trains classifier-head verifiers from scratch with
    /// `verifier_shape`.
    pub verifiers_from_policy: bool,
    /// Training steps of the verifiers' own base LM (`verifier_base_shape`, trained like the
    /// policy but on the reference solutions without slips); every verifier and the judge start
    /// from it instead of the policy. 0: they start from the policy.
    #[serde(default)]
    pub verifier_base_steps: usize,
    /// The verifiers' base LM's shape: hidden size, layers.
    #[serde(default = "policy_shape_default")]
    pub verifier_base_shape: (usize, usize),
    /// Fresh decoder layers stacked on the policy's for the classifier head (the log-ratio head
    /// is the policy's own LM and takes none). One or two did not help (see the README).
    pub verifier_extra_layers: usize,
    /// Verifier shape when trained from scratch (the same for PRMs and the ORM).
    pub verifier_shape: (usize, usize),
    /// How every verifier turns the decoder's output into a step score.
    pub verifier_head: VerifierHead,
    /// `β` of the log-ratio and likelihood heads.
    pub verifier_beta: f32,
    /// The likelihood head's constant reference: the log-probability per token at which a
    /// step is neither good nor bad.
    pub verifier_reference_logprob: f32,
    /// The likelihood and log-ratio heads of the PRMs score only each step's last this many
    /// tokens, its separator counted (2: the step's result and the separator); 0 scores every
    /// token. The ORM's span is always the whole solution.
    #[serde(default)]
    pub verifier_last_tokens: usize,
    /// The PRMs train on each solution's steps up to its first bad one only (PRM800K's
    /// convention), not on the steps after it.
    #[serde(default)]
    pub verifier_stop_at_first_bad: bool,
    /// Verifier training steps.
    pub verifier_steps: usize,
    /// Verifier peak learning rate.
    pub verifier_lr: f64,
    /// Sampling temperature.
    pub temperature: f32,
    /// OmegaPRM: searches over each problem's tree of new rollouts after its samples'.
    #[serde(default)]
    pub omegaprm_search_limit: usize,
    /// Whether the PRM on OmegaPRM's labels also trains on the tree's new solutions (else on
    /// the samples' labels only, the default: the new solutions' labels are less accurate and
    /// made that PRM worse on every seed; see the README).
    #[serde(default)]
    pub omegaprm_train_on_new: bool,
    /// The judge (a generative verifier): oracle-labelled samples it is fine-tuned on, the
    /// lab's small "human" budget (0 skips the judge and the consensus filter).
    #[serde(default)]
    pub judge_solutions: usize,
    /// Judge fine-tuning steps (batches of 32).
    #[serde(default)]
    pub judge_steps: usize,
    /// Judge peak learning rate.
    #[serde(default)]
    pub judge_lr: f64,
    /// Answers sampled from the judge per solution (the most frequent verdict wins).
    #[serde(default)]
    pub judge_samples: usize,
    /// The judge also trains on every prefix of its oracle-labelled solutions, each with the
    /// first error the labels imply for it (none before the error, the same index from it on):
    /// more examples from the same human budget.
    #[serde(default)]
    pub judge_prefixes: bool,
    /// What the judge writes after a solution: the index of its first wrong step (`index`) or
    /// that step copied out (`quote`); `- 1` for none either way.
    #[serde(default)]
    pub judge_answer: JudgeAnswer,
    /// RL (the `rl` stage): policy updates per reward source (0 skips the stage).
    pub rl_updates: usize,
    /// RL: prompts per update.
    pub rl_prompts: usize,
    /// RL: solutions sampled per prompt (the group).
    pub rl_group: usize,
    /// RL: peak learning rate.
    pub rl_lr: f64,
    /// RL: weight of the KL penalty to the starting policy.
    pub rl_kl: f32,
    /// RL: samples per held-out problem to measure each policy before and after.
    pub rl_eval_samples: usize,
    /// Test-time search (the `search` stage): held-out problems searched by every method (0
    /// skips the stage); the samples of the other held-out problems calibrate `τ`.
    #[serde(default)]
    pub search_problems: usize,
    /// Search budgets `N` (samples per step); each method runs at each, with width `√N`.
    #[serde(default)]
    pub search_budgets: Vec<usize>,
    /// Verify → resample: the precision of "bad step" calls `τ` is calibrated to.
    #[serde(default)]
    pub search_precision: f64,
    /// Verify → resample: most resamples of one step (four times as many per problem).
    #[serde(default)]
    pub search_resamples: usize,
}

/// The lab policy's shape, the verifiers' base's when a run folder predates it.
fn policy_shape_default() -> (usize, usize) {
    (64, 2)
}

/// Math-Shepherd's two estimates of a step's label from its rollouts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum McLabels {
    /// Good when any rollout reached the gold answer (hard estimation).
    #[default]
    Hard,
    /// The fraction of rollouts that reached it (soft estimation), learned with BCE.
    Soft,
}

/// What the lab's judge writes after a solution.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JudgeAnswer {
    /// The index of the first wrong step ([`stepwise_label::judge::IndexAnswer`]).
    #[default]
    Index,
    /// The first wrong step itself, copied out ([`stepwise_label::judge::QuoteAnswer`]).
    Quote,
}

impl JudgeAnswer {
    /// The format that asks and reads it.
    pub fn format(self) -> &'static dyn stepwise_label::judge::JudgeFormat {
        match self {
            JudgeAnswer::Index => &stepwise_label::judge::IndexAnswer,
            JudgeAnswer::Quote => &stepwise_label::judge::QuoteAnswer,
        }
    }

    /// The training target for a solution with these `steps` whose first error is `first`.
    pub fn answer(self, steps: &[String], first: Option<usize>) -> String {
        match self {
            JudgeAnswer::Index => stepwise_label::judge::IndexAnswer::answer(first),
            JudgeAnswer::Quote => stepwise_label::judge::QuoteAnswer::answer(steps, first),
        }
    }
}

/// Which model completes the rollouts that label steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Completer {
    /// The policy whose samples are labelled (on-policy labels; the setting before the
    /// verifiers' base existed).
    #[default]
    Policy,
    /// The verifiers' base LM (needs `verifier_base_steps` > 0): a stronger completer, as
    /// Math-Shepherd and OmegaPRM roll out with a model stronger than the one they label.
    VerifierBase,
}

impl Completer {
    /// As the preset spells it.
    pub fn name(self) -> &'static str {
        match self {
            Completer::Policy => "policy",
            Completer::VerifierBase => "verifier_base",
        }
    }
}

/// How a lab verifier scores a step (the same for PRMs and the ORM).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerifierHead {
    /// The policy's own LM, scored by its log-likelihood ratio against the policy over each
    /// step (implicit-PRM parameterisation, `stepwise_model::log_ratio`). The check a verifier
    /// needs — is the written result what the policy would compute? — is the LM's next-token
    /// distribution, so fine-tuning only has to learn to weigh it.
    LogRatio,
    /// The policy's own LM, scored by its log-likelihood of each step against a constant
    /// reference (`verifier_reference_logprob` per token). It starts as the policy's confidence
    /// in each step; fine-tuning raises good steps and lowers bad ones. A ratio against the
    /// policy instead can call a wrong step good when both models give it a tiny probability
    /// and the fine-tuned one's is less tiny (see the README).
    Likelihood,
    /// A fresh 2-class head on the decoder read at each step's separator (TRL's token
    /// classifier; a scalar value head for the ORM). With the lab's budget it learns priors
    /// over step kinds and numbers, not the arithmetic check (see the README).
    Classifier,
}

impl Preset {
    /// Every stage on a small budget (about a minute on 2 cores): a policy right about half the
    /// time, verifiers that tell some steps apart, curves with wide intervals.
    pub fn quick() -> Self {
        Preset {
            name: "quick".into(),
            policy_shape: (64, 2),
            policy_steps: 800,
            policy_problems: 4000,
            slip: 0.25,
            label_problems: 12,
            label_samples: 4,
            rollouts: 2,
            mc_labels: McLabels::Hard,
            completer: Completer::VerifierBase,
            eval_problems: 10,
            eval_samples: 8,
            verifiers_from_policy: true,
            verifier_base_steps: 400,
            verifier_base_shape: (48, 2),
            verifier_extra_layers: 0,
            verifier_shape: (32, 1),
            verifier_head: VerifierHead::Likelihood,
            verifier_beta: 1.0,
            verifier_reference_logprob: -0.5,
            verifier_last_tokens: 0,
            verifier_stop_at_first_bad: true,
            verifier_steps: 20,
            verifier_lr: 1e-3,
            temperature: 1.0,
            omegaprm_search_limit: 0,
            omegaprm_train_on_new: false,
            judge_solutions: 16,
            judge_steps: 20,
            judge_lr: 1e-3,
            judge_samples: 3,
            judge_prefixes: false,
            judge_answer: JudgeAnswer::Index,
            rl_updates: 4,
            rl_prompts: 4,
            rl_group: 4,
            rl_lr: 3e-4,
            rl_kl: 0.04,
            rl_eval_samples: 4,
            search_problems: 4,
            search_budgets: vec![2, 4],
            search_precision: 0.8,
            search_resamples: 2,
        }
    }

    /// The measured setting: 600 held-out problems, search and RL included (8-9 minutes on 2 cores).
    pub fn standard() -> Self {
        Preset {
            name: "standard".into(),
            policy_shape: (64, 2),
            policy_steps: 1400,
            policy_problems: 8000,
            slip: 0.25,
            label_problems: 800,
            label_samples: 8,
            rollouts: 8,
            mc_labels: McLabels::Hard,
            completer: Completer::VerifierBase,
            eval_problems: 600,
            eval_samples: 32,
            verifiers_from_policy: true,
            verifier_base_steps: 3000,
            verifier_base_shape: (64, 2),
            verifier_extra_layers: 0,
            verifier_shape: (32, 1),
            verifier_head: VerifierHead::Likelihood,
            verifier_beta: 1.0,
            verifier_reference_logprob: -0.5,
            verifier_last_tokens: 0,
            verifier_stop_at_first_bad: true,
            verifier_steps: 600,
            verifier_lr: 3e-4,
            temperature: 1.0,
            omegaprm_search_limit: 0,
            omegaprm_train_on_new: false,
            judge_solutions: 200,
            judge_steps: 300,
            judge_lr: 1e-3,
            judge_samples: 5,
            judge_prefixes: false,
            judge_answer: JudgeAnswer::Index,
            rl_updates: 150,
            rl_prompts: 16,
            rl_group: 8,
            rl_lr: 1e-3,
            rl_kl: 0.04,
            rl_eval_samples: 8,
            search_problems: 200,
            search_budgets: vec![4, 16, 64],
            search_precision: 0.8,
            search_resamples: 4,
        }
    }

    /// Override fields by name, e.g. `policy_steps=2000` or `policy_shape=[128,4]` (values are
    /// JSON; a bare word is read as a string).
    pub fn with_overrides(self, sets: &[String]) -> Result<Self> {
        let mut v = serde_json::to_value(&self)?;
        for s in sets {
            let (key, val) = s
                .split_once('=')
                .with_context(|| format!("--set `{s}`: expected FIELD=VALUE"))?;
            let slot = v
                .get_mut(key)
                .with_context(|| format!("--set `{s}`: the preset has no field `{key}`"))?;
            *slot = serde_json::from_str(val).unwrap_or_else(|_| serde_json::Value::String(val.into()));
        }
        serde_json::from_value(v).context("--set: a value has the wrong type for its field")
    }

    /// How the verifiers are built and trained, in words (for the report).
    pub fn verifier_summary(&self) -> String {
        let start = if self.verifier_base_steps > 0 {
            format!(
                "their own {}×{} LM (trained {} steps on the reference solutions without slips)",
                self.verifier_base_shape.0, self.verifier_base_shape.1, self.verifier_base_steps
            )
        } else {
            "the policy".to_string()
        };
        let head = match (self.verifier_head, self.verifiers_from_policy) {
            (VerifierHead::LogRatio, _) => format!(
                "{start} fine-tuned, each step scored by its log-likelihood ratio against {start} (β = {})",
                self.verifier_beta
            ),
            (VerifierHead::Likelihood, _) => format!(
                "{start} fine-tuned, each step scored by its own log-likelihood against a constant {} per token (β = {})",
                self.verifier_reference_logprob, self.verifier_beta
            ),
            (VerifierHead::Classifier, true) => {
                format!("{start}'s decoder with a fresh classifier head (a value head for the ORM)")
            }
            (VerifierHead::Classifier, false) => format!(
                "a {}×{} decoder trained from scratch with a classifier head (a value head for the ORM)",
                self.verifier_shape.0, self.verifier_shape.1
            ),
        };
        let span = match (self.verifier_head, self.verifier_last_tokens) {
            (VerifierHead::Classifier, _) | (_, 0) => String::new(),
            (_, n) => format!(" (PRMs: each step's last {n} tokens only, its separator counted)"),
        };
        let stop = if self.verifier_stop_at_first_bad {
            "; PRMs trained on each solution's steps up to its first bad one"
        } else {
            ""
        };
        format!(
            "{head}{span}{stop}; {} steps of 32 solutions, peak learning rate {}",
            self.verifier_steps, self.verifier_lr
        )
    }

    /// The run-folder entry of the model every verifier and the judge start from: the
    /// verifiers' own base LM when it is trained (`verifier_base_steps` > 0), else the policy.
    pub fn verifier_start_dir(&self) -> &'static str {
        if self.verifier_base_steps > 0 {
            "verifier_base"
        } else {
            "policy"
        }
    }

    /// By name.
    pub fn by_name(name: &str) -> Result<Self> {
        match name {
            "quick" => Ok(Self::quick()),
            "standard" => Ok(Self::standard()),
            o => anyhow::bail!("unknown preset `{o}`: use quick or standard"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_set_fields_by_name_and_name_what_is_wrong() {
        let sets = [
            "mc_labels=soft",
            "verifier_head=log_ratio",
            "verifier_lr=0.001",
            "policy_shape=[32,1]",
        ];
        let p = Preset::standard().with_overrides(&sets.map(String::from)).unwrap();
        assert_eq!(p.mc_labels, McLabels::Soft);
        assert_eq!(p.verifier_head, VerifierHead::LogRatio);
        assert_eq!((p.verifier_lr, p.policy_shape), (0.001, (32, 1)));
        let err = format!(
            "{:#}",
            Preset::quick().with_overrides(&["rollout=3".into()]).unwrap_err()
        );
        assert!(err.contains("rollout"), "{err}");
        assert!(Preset::quick().with_overrides(&["mc_labels=medium".into()]).is_err());
    }
}
