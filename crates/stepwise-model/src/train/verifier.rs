//! Building a verifier (PRM or ORM) for training, written once for `stepwise train-prm` and the
//! lab: which decoder it starts from, which head it gets, its training examples and objective,
//! and its `reward.json` (how its steps are read when it is scored).

use super::examples::{attach_reference, label_examples, LabelOptions};
use super::{Example, Objective};
use crate::config::{HeadKind, ModelConfig};
use crate::layout::RewardSpec;
use crate::log_ratio::LogRatio;
use crate::model::Model;
use crate::tokenizer::Tokenizer;
use anyhow::{bail, Result};
use candle_core::Device;
use candle_nn::VarMap;
use std::path::{Path, PathBuf};
use stepwise_core::Solution;

/// How a verifier turns the decoder's output into a step score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum VerifierHead {
    /// A 2-class token classifier read at each step's separator (TRL's PRM layout,
    /// `AutoModelForTokenClassification`).
    Classifier,
    /// A scalar value head read through a sigmoid (the usual ORM,
    /// `AutoModelForSequenceClassification` with one label).
    Value,
    /// The starting causal LM itself, each step scored by its log-likelihood ratio against a
    /// reference ([`LogRatio`]: a reference model, or a constant log-probability per token).
    LogRatio(LogRatio),
}

/// Where a verifier's decoder comes from.
#[derive(Debug, Clone)]
pub enum Start {
    /// Fine-tuned from a checkpoint folder (a policy, a PRM): its decoder, the new head.
    Checkpoint(PathBuf),
    /// Trained from scratch with this shape (its head is replaced by the verifier's).
    Fresh(ModelConfig),
}

/// Everything that decides how a verifier is built and what it learns from.
#[derive(Debug, Clone)]
pub struct VerifierSpec {
    /// Its head.
    pub head: VerifierHead,
    /// Its decoder.
    pub start: Start,
    /// Fresh decoder layers stacked on a checkpoint's (classifier and value heads only).
    pub extra_layers: usize,
    /// How labelled solutions become training sequences. `separator_after_problem` is set for
    /// the log-ratio head, which reads solutions as the policy writes them.
    pub labels: LabelOptions,
}

impl VerifierSpec {
    /// The model's configuration: the start's decoder with the verifier's head.
    pub fn config(&self) -> Result<ModelConfig> {
        let mut c = match &self.start {
            Start::Checkpoint(dir) => ModelConfig::from_dir(dir)?,
            Start::Fresh(c) => c.clone(),
        };
        match self.head {
            VerifierHead::LogRatio(lr) => {
                lr.check()?;
                if !matches!(self.start, Start::Checkpoint(_)) {
                    bail!("the log-ratio head fine-tunes a causal LM: start from a checkpoint");
                }
                if c.head != HeadKind::CausalLm {
                    bail!(
                        "the log-ratio head needs a causal LM to start from, not a {:?} model",
                        c.head
                    );
                }
                if self.extra_layers > 0 {
                    bail!("extra layers are for the classifier and value heads: the log-ratio head is the LM itself");
                }
            }
            VerifierHead::Classifier => c = c.with_head(HeadKind::TokenClassification),
            VerifierHead::Value => c = c.with_value_head(),
        }
        if matches!(self.start, Start::Checkpoint(_)) {
            c.num_hidden_layers += self.extra_layers;
        }
        Ok(c)
    }

    /// What training minimises.
    pub fn objective(&self) -> Objective {
        match self.head {
            VerifierHead::LogRatio(lr) => Objective::LogRatio(lr),
            _ => Objective::Classify,
        }
    }

    /// Training sequences from labelled solutions (step labels, or outcomes when
    /// `labels.outcome`). A log-ratio verifier against a reference model needs `reference`,
    /// whose log-probabilities are attached once so training runs no second model.
    pub fn examples(&self, tok: &Tokenizer, sols: &[Solution], reference: Option<&Model>) -> Result<Vec<Example>> {
        let opts = LabelOptions {
            separator_after_problem: matches!(self.head, VerifierHead::LogRatio(_)),
            ..self.labels.clone()
        };
        let mut examples = label_examples(tok, sols, &opts)?;
        if let VerifierHead::LogRatio(LogRatio {
            reference_logprob: None,
            ..
        }) = self.head
        {
            match reference {
                Some(r) => attach_reference(r, &mut examples, 64)?,
                None => bail!("a log-ratio verifier against a reference model needs that model to build its examples"),
            }
        }
        Ok(examples)
    }

    /// The trainable model, its weights in `varmap`: the start checkpoint's (a head it does not
    /// use is dropped) with the new head and layers initialised from `seed`, or all fresh. A
    /// verifier started from a bf16 checkpoint is written in bf16.
    pub fn build(&self, varmap: &VarMap, device: &Device, seed: u64) -> Result<Model> {
        let config = self.config()?;
        match &self.start {
            Start::Fresh(_) => Model::fresh(config, varmap, device, seed),
            // The checkpoint's own head (a causal LM's output layer, a PRM's head) is left out
            // of the optimiser and the checkpoint when the verifier's differs.
            Start::Checkpoint(dir) => Model::load_trainable(dir, config, varmap, device, seed),
        }
    }

    /// The verifier's `reward.json`: how its steps are laid out and read. A log-ratio verifier's
    /// names its reference model's folder as given (relative to the verifier's folder, or
    /// absolute).
    pub fn reward_spec(&self, reference: Option<&Path>) -> RewardSpec {
        match self.head {
            VerifierHead::LogRatio(lr) => {
                let reference = lr
                    .reference_logprob
                    .is_none()
                    .then(|| reference.map(Path::to_path_buf))
                    .flatten();
                RewardSpec::log_ratio(reference, &self.labels.separator, lr)
            }
            VerifierHead::Classifier | VerifierHead::Value => RewardSpec::step_classifier(&self.labels.separator),
        }
    }
}
