//! Stage 4, verifiers: a PRM on Monte Carlo labels, a PRM on oracle labels and an ORM on
//! outcomes, built by the same code as `stepwise train-prm` ([`VerifierSpec`]) with the same
//! head and budget, and scored by the same code as `stepwise score`.

use super::{done_marker, train_stage};
use crate::preset::{Preset, VerifierHead};
use crate::vocab::SEP;
use anyhow::Result;
use std::path::{Path, PathBuf};
use stepwise_core::seams::{apply_outcome, ScoreOutcome};
use stepwise_core::Solution;
use stepwise_model::layout::RewardSpec;
use stepwise_model::log_ratio::LogRatio;
use stepwise_model::train::examples::LabelOptions;
use stepwise_model::train::verifier::{self, Start, VerifierSpec};
use stepwise_model::{HeadKind, Model, PrmScorer, Tokenizer};

/// The lab's verifiers: trained with the same code, budget and head, scored the same way.
pub struct Verifiers<'a> {
    /// Sizes and budgets.
    pub preset: &'a Preset,
    /// The run folder.
    pub out: &'a Path,
    /// The model every verifier starts from (the policy, or the verifiers' own base LM; a
    /// log-ratio verifier's reference) ...
    pub base: &'a Model,
    /// ... and its folder's name in the run folder.
    pub base_dir: &'a str,
    /// The lab tokenizer.
    pub tok: &'a Tokenizer,
    /// The run's seed.
    pub seed: u64,
}

impl Verifiers<'_> {
    /// How a verifier trained on step labels, or on outcomes when `outcome`, is built.
    fn spec(&self, outcome: bool) -> VerifierSpec {
        let p = self.preset;
        let log_ratio = |reference_logprob| {
            verifier::VerifierHead::LogRatio(LogRatio {
                beta: p.verifiers.beta,
                // An ORM's score is the whole solution's: its last step's span starts at the first.
                cumulative: outcome,
                reference_logprob,
                last_tokens: (p.verifiers.last_tokens > 0 && !outcome).then_some(p.verifiers.last_tokens),
            })
        };
        let head = match p.verifiers.head {
            VerifierHead::LogRatio => log_ratio(None),
            VerifierHead::Likelihood => log_ratio(Some(p.verifiers.reference_logprob)),
            // PRMs are 2-class token classifiers (TRL's layout); the ORM is the usual scalar
            // value head read at the last token.
            VerifierHead::Classifier if outcome => verifier::VerifierHead::Value,
            VerifierHead::Classifier => verifier::VerifierHead::Classifier,
        };
        let start = if p.verifiers.from_policy {
            Start::Checkpoint(self.out.join(self.base_dir))
        } else {
            Start::Fresh(super::policy::shape(
                self.tok.vocab_size(),
                p.verifiers.shape,
                HeadKind::TokenClassification,
            ))
        };
        VerifierSpec {
            head,
            start,
            extra_layers: p.verifiers.extra_layers,
            labels: LabelOptions {
                separator: SEP.into(),
                outcome,
                stop_at_first_bad: p.verifiers.stop_at_first_bad,
                ..Default::default()
            },
        }
    }

    /// The verifier's `reward.json`: for a log-ratio or likelihood verifier, the base (one
    /// folder up) or a constant is its reference.
    fn reward_spec(&self, outcome: bool) -> RewardSpec {
        self.spec(outcome)
            .reward_spec(Some(&PathBuf::from("..").join(self.base_dir)))
    }

    /// Train (or reuse) the verifier in `dir` on step labels, or on outcomes when `outcome`.
    pub fn train(&self, dir: &str, what: &str, sols: &[Solution], outcome: bool) -> Result<Model> {
        self.train_for(dir, what, sols, outcome, self.preset.verifiers.steps)
    }

    /// [`Verifiers::train`] for `steps` batches instead of the preset's verifier budget.
    pub fn train_for(&self, dir: &str, what: &str, sols: &[Solution], outcome: bool, steps: usize) -> Result<Model> {
        let p = self.preset;
        let spec = self.spec(outcome);
        let cached = done_marker(&self.out.join(dir)).exists();
        // A cached verifier needs no examples, and no reference log-probabilities for them.
        let examples = if cached {
            Vec::new()
        } else {
            spec.examples(self.tok, sols, Some(self.base))?
        };
        let tc = super::fine_tuning(p.verifiers.lr, steps, self.seed ^ 5);
        let seed = tc.seed;
        let model = train_stage(
            &self.out.join(dir),
            p.domain,
            what,
            |varmap, dev| spec.build(varmap, dev, seed),
            &examples,
            &[],
            spec.objective(),
            tc,
        )?;
        self.reward_spec(outcome).save(&self.out.join(dir))?;
        Ok(model)
    }

    /// A verifier trained on step labels (or outcomes when `outcome`) as a step scorer.
    pub fn scorer<'m>(&'m self, model: &'m Model, outcome: bool) -> PrmScorer<'m> {
        let spec = self.reward_spec(outcome);
        PrmScorer::new(model, self.tok, spec.layout()).with_reference(spec.reference.is_some().then_some(self.base))
    }

    /// Score `sols` with a verifier trained on step labels (or outcomes when `outcome`), recording
    /// the scores under `name`.
    pub fn score(&self, model: &Model, outcome: bool, sols: &mut [Solution], name: &str, what: &str) -> Result<()> {
        let outcomes = self.outcomes(model, outcome, sols, what)?;
        for (s, scores) in sols.iter_mut().zip(outcomes) {
            apply_outcome(s, name, scores);
        }
        Ok(())
    }

    /// What [`Verifiers::score`] records, solution by solution, without recording it (so that
    /// several verifiers score the same solutions at once: `stages::score_all_at_once`).
    pub fn outcomes(&self, model: &Model, outcome: bool, sols: &[Solution], what: &str) -> Result<Vec<ScoreOutcome>> {
        super::outcomes(&self.scorer(model, outcome), sols, what)
    }
}
