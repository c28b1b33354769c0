//! How a problem and its steps are laid out as model input: the policy's own layout
//! ([`encode_steps`]: problem, separator, then each step and separator, every piece encoded on
//! its own) and the four PRM layouts in use ([`PrmLayout`]), with where step rewards are read.

use crate::log_ratio::LogRatio;
use crate::tokenizer::{Message, Tokenizer};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use stepwise_core::record::OBSERVATION_MARK;
use stepwise_core::Solution;

/// A problem and its steps as token ids.
pub struct EncodedSteps {
    /// Token ids.
    pub ids: Vec<u32>,
    /// The position of each step's last (separator) token.
    pub ends: Vec<usize>,
    /// The first step's first token.
    pub steps_from: usize,
}

/// Token ids of a problem and its steps in TRL's token-classification layout (problem ids, then
/// each step's ids followed by the separator's, all encoded separately without special tokens),
/// optionally with the separator after the problem as well.
pub fn encode_steps(
    tok: &Tokenizer,
    question: &str,
    steps: &[&str],
    sep: &str,
    separator_after_problem: bool,
) -> Result<EncodedSteps> {
    let mut ids = tok.encode(question, false)?;
    let sep_ids = tok.encode(sep, false)?;
    if separator_after_problem {
        ids.extend(&sep_ids);
    }
    let steps_from = ids.len();
    let mut ends = Vec::with_capacity(steps.len());
    for s in steps {
        ids.extend(tok.encode(s, false)?);
        ids.extend(&sep_ids);
        ends.push(ids.len() - 1);
    }
    Ok(EncodedSteps { ids, ends, steps_from })
}

/// An agent's trajectory as its policy reads and writes it ([`encode_steps`] of the question
/// and the turns, each `action` + [`OBSERVATION_MARK`] + observation), with what the policy
/// wrote told apart from what the world answered.
pub struct EncodedTrajectory {
    /// Token ids: the question, its separator, each turn and its separator, and the end token
    /// where the policy stopped of its own accord.
    pub ids: Vec<u32>,
    /// The first turn's first token.
    pub steps_from: usize,
    /// Each turn's first token and its separator's position.
    pub turns: Vec<(usize, usize)>,
    /// Ranges `start..end` the policy read but did not write: each observation (after the
    /// mark) with the separator after it.
    pub read: Vec<(usize, usize)>,
}

/// `t`'s trajectory in the policy's layout with separator `sep`, `end` (the end token's text)
/// appended where the policy stopped of its own accord.
pub fn encode_trajectory(tok: &Tokenizer, t: &Solution, sep: &str, end: Option<&str>) -> Result<EncodedTrajectory> {
    let turns = t.turn_strings();
    let refs: Vec<&str> = turns.iter().map(String::as_str).collect();
    let encoded = encode_steps(tok, &t.question, &refs, sep, true)?;
    let mut read = Vec::with_capacity(t.steps.len());
    let mut spans = Vec::with_capacity(t.steps.len());
    let mut start = encoded.steps_from;
    let mark = OBSERVATION_MARK.trim_end();
    for (st, &last) in t.steps.iter().zip(&encoded.ends) {
        if st.observation.is_some() {
            // The action's tokens, then the mark: what follows up to the separator is the world's.
            let written = tok.encode(&format!("{}{mark}", st.text), false)?.len();
            read.push(((start + written).min(last + 1), last + 1));
        }
        spans.push((start, last));
        start = last + 1;
    }
    let mut ids = encoded.ids;
    if let Some(e) = end {
        ids.extend(tok.encode(e, false)?);
    }
    Ok(EncodedTrajectory {
        ids,
        steps_from: encoded.steps_from,
        turns: spans,
        read,
    })
}

/// How a PRM expects its input and yields step rewards.
#[derive(Debug, Clone, PartialEq)]
pub enum PrmLayout {
    /// Qwen2.5-Math-PRM: chat template, steps joined by `<extra_0>`; softmax class 1 there.
    QwenPrm {
        /// System prompt of the chat.
        system: String,
        /// The step separator token.
        step_token: String,
    },
    /// Math-Shepherd / RLHFlow: `problem + " " + step + " ки\n" ...`; P(`+`) over {`+`, `-`} at `ки`.
    StepTag {
        /// The step tag.
        tag: String,
        /// Token meaning "good".
        good: String,
        /// Token meaning "bad".
        bad: String,
    },
    /// TRL token classifier: problem ids, then each step's ids + separator ids (no special
    /// tokens); softmax class 1 at the last token of each step + separator.
    TokenClassifier {
        /// The separator after each step.
        separator: String,
    },
    /// A causal LM scored by its log-likelihood ratio against a reference over each step's
    /// tokens ([`crate::log_ratio`]); the input is laid out as the policy writes it (problem,
    /// separator, then each step and separator) and the step reward is
    /// `sigmoid(β · Σ log π_θ/π_ref)`. Needs a reference model's log-probabilities unless the reference is
    /// a constant.
    LogRatio {
        /// The separator after each step.
        separator: String,
        /// Span scoring.
        log_ratio: LogRatio,
    },
}

/// The file in a verifier folder that says how its step rewards are read: written by
/// `stepwise train-prm` and the lab, read by `stepwise_model::scoring::LoadedVerifier`, so a verifier
/// is scored with the layout and separator it was trained with.
pub const REWARD_FILE: &str = "reward.json";

/// What [`REWARD_FILE`] holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewardSpec {
    /// [`RewardSpec::STEP_CLASSIFIER`] or [`RewardSpec::LOG_LIKELIHOOD_RATIO`].
    pub kind: String,
    /// A log-ratio verifier's reference model folder, relative to the verifier's folder; absent
    /// when the reference is a constant (`reference_logprob`) and for classifiers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<PathBuf>,
    /// The separator after each step (and, for a log-ratio verifier, after the problem).
    pub separator: String,
    /// Span scoring of a log-ratio verifier.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub log_ratio: Option<LogRatio>,
}

impl RewardSpec {
    /// A classifier or value head read at the last token of each step and its separator
    /// ([`PrmLayout::TokenClassifier`]).
    pub const STEP_CLASSIFIER: &'static str = "step_classifier";
    /// A causal LM read by its log-likelihood ratio ([`PrmLayout::LogRatio`]).
    pub const LOG_LIKELIHOOD_RATIO: &'static str = "log_likelihood_ratio";

    /// A classifier (or value head) whose steps each end with `separator`.
    pub fn step_classifier(separator: &str) -> Self {
        RewardSpec {
            kind: Self::STEP_CLASSIFIER.into(),
            reference: None,
            separator: separator.into(),
            log_ratio: None,
        }
    }

    /// A log-ratio verifier whose reference model lives in `reference` (relative to the
    /// verifier), or, with `None`, whose reference is `log_ratio.reference_logprob`.
    pub fn log_ratio(reference: Option<PathBuf>, separator: &str, log_ratio: LogRatio) -> Self {
        RewardSpec {
            kind: Self::LOG_LIKELIHOOD_RATIO.into(),
            reference,
            separator: separator.into(),
            log_ratio: Some(log_ratio),
        }
    }

    /// The scoring layout it describes.
    pub fn layout(&self) -> PrmLayout {
        match self.log_ratio {
            Some(log_ratio) => PrmLayout::LogRatio {
                separator: self.separator.clone(),
                log_ratio,
            },
            None => PrmLayout::TokenClassifier {
                separator: self.separator.clone(),
            },
        }
    }

    /// Write it into the verifier folder `dir`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::write(dir.join(REWARD_FILE), serde_json::to_string_pretty(self)?)
            .with_context(|| format!("writing {}", dir.join(REWARD_FILE).display()))
    }

    /// Read the spec of the verifier folder `dir`, if it has one; a spec that cannot be right is
    /// an error naming the field.
    pub fn load(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join(REWARD_FILE);
        if !path.exists() {
            return Ok(None);
        }
        let text = stepwise_core::io::read_regular_file(&path)?;
        let spec: RewardSpec = serde_json::from_str(&text).with_context(|| format!("{}: invalid", path.display()))?;
        let at = path.display();
        match spec.kind.as_str() {
            Self::STEP_CLASSIFIER => {
                if spec.reference.is_some() || spec.log_ratio.is_some() {
                    bail!("{at}: fields `reference`, `beta`, `cumulative`: a step classifier has no reference or β");
                }
            }
            Self::LOG_LIKELIHOOD_RATIO => {
                let Some(lr) = spec.log_ratio else {
                    bail!("{at}: fields `beta` and `cumulative`: missing (a log-likelihood-ratio verifier needs both)");
                };
                match (&spec.reference, lr.reference_logprob) {
                    (Some(_), Some(_)) => {
                        bail!("{at}: fields `reference` and `reference_logprob`: give one reference, not both")
                    }
                    (None, None) => {
                        bail!("{at}: field `reference`: missing (a reference model's folder, or `reference_logprob`)")
                    }
                    _ => {}
                }
                lr.check().with_context(|| at.to_string())?;
            }
            other => bail!(
                "{at}: field `kind`: unknown reward kind `{other}` (use {} or {})",
                Self::STEP_CLASSIFIER,
                Self::LOG_LIKELIHOOD_RATIO
            ),
        }
        if spec.separator.is_empty() {
            bail!("{at}: field `separator`: empty (steps could not be told apart)");
        }
        Ok(Some(spec))
    }

    /// The reference model's folder, resolved against the verifier folder `dir` (`None` for a
    /// constant reference or a classifier).
    pub fn reference_dir(&self, dir: &Path) -> Option<PathBuf> {
        self.reference.as_ref().map(|r| dir.join(r))
    }
}

/// Qwen2.5-Math-PRM's system prompt.
pub const QWEN_PRM_SYSTEM: &str = "Please reason step by step, and put your final answer within \\boxed{}.";

impl PrmLayout {
    /// Its name, as `--layout` takes it.
    pub fn name(&self) -> &'static str {
        match self {
            PrmLayout::QwenPrm { .. } => "qwen-prm",
            PrmLayout::StepTag { .. } => "step-tag",
            PrmLayout::TokenClassifier { .. } => "token-cls",
            PrmLayout::LogRatio { .. } => "log-ratio",
        }
    }

    /// A fixed layout by name: `qwen-prm`, `step-tag` (Math-Shepherd's `ки` with `+`/`-`) or
    /// `token-cls` (TRL's token classifier, steps ending in `"\n"`).
    pub fn by_name(name: &str) -> Result<Self> {
        Ok(match name {
            "qwen-prm" => PrmLayout::QwenPrm {
                system: QWEN_PRM_SYSTEM.into(),
                step_token: "<extra_0>".into(),
            },
            "step-tag" => PrmLayout::StepTag {
                tag: "ки".into(),
                good: "+".into(),
                bad: "-".into(),
            },
            "token-cls" => PrmLayout::TokenClassifier { separator: "\n".into() },
            other => bail!("unknown layout `{other}`: use auto, qwen-prm, step-tag, token-cls or log-ratio"),
        })
    }

    /// Token ids for a problem and its steps, the positions where the step rewards are read, and
    /// where the first step starts (for the step layouts; 0 for the others). A step token or tag
    /// written inside the problem or a step is taken out: it would add a reward position.
    pub fn encode(&self, tok: &Tokenizer, problem: &str, steps: &[&str]) -> Result<Encoded> {
        match self {
            PrmLayout::QwenPrm { system, step_token } => {
                // The step token written inside the text (a policy may write it) would add reward
                // positions: it is taken out, so every step has exactly one.
                let problem = problem.replace(step_token.as_str(), "");
                let head =
                    tok.apply_chat_template(&[Message::new("system", system), Message::new("user", &problem)], true)?;
                let body: String = steps
                    .iter()
                    .map(|s| format!("{}{step_token}", s.replace(step_token.as_str(), "")))
                    .collect();
                let text = format!("{head}{body}<|im_end|><|endoftext|>");
                let ids = tok.encode(&text, true)?;
                let id = tok
                    .token_id(step_token)
                    .with_context(|| format!("the tokenizer has no `{step_token}` token"))?;
                Ok(positions_of(ids, id))
            }
            PrmLayout::StepTag { tag, .. } => {
                // As for the step token above: a tag inside the text is taken out.
                let body: String = steps
                    .iter()
                    .map(|s| format!("{} {tag}\n", s.replace(tag.as_str(), "")))
                    .collect();
                let ids = tok.encode(&format!("{} {body}", problem.replace(tag.as_str(), "")), true)?;
                let id = tok
                    .token_id(tag)
                    .with_context(|| format!("the tokenizer has no `{tag}` token"))?;
                Ok(positions_of(ids, id))
            }
            PrmLayout::TokenClassifier { separator } | PrmLayout::LogRatio { separator, .. } => {
                let after_problem = matches!(self, PrmLayout::LogRatio { .. });
                let e = encode_steps(tok, problem, steps, separator, after_problem)?;
                Ok(Encoded {
                    ids: e.ids,
                    positions: e.ends,
                    steps_from: e.steps_from,
                })
            }
        }
    }

    /// The vocabulary columns an LM head's rewards are read from, `[bad, good]` (Math-Shepherd's
    /// `-` and `+`), or `None` where the rewards read every class of a classifier head.
    pub fn head_columns(&self, tok: &Tokenizer) -> Result<Option<[u32; 2]>> {
        Ok(match self {
            PrmLayout::StepTag { good, bad, .. } => Some([
                tok.token_id(bad).with_context(|| format!("no `{bad}` token"))?,
                tok.token_id(good).with_context(|| format!("no `{good}` token"))?,
            ]),
            _ => None,
        })
    }
}

fn positions_of(ids: Vec<u32>, id: u32) -> Encoded {
    let positions = ids
        .iter()
        .enumerate()
        .filter(|(_, &t)| t == id)
        .map(|(i, _)| i)
        .collect();
    Encoded {
        ids,
        positions,
        steps_from: 0,
    }
}

/// One encoded solution ready for scoring.
pub struct Encoded {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Where the step rewards are read.
    pub positions: Vec<usize>,
    /// The first step's first token (0 where the layout does not say).
    pub steps_from: usize,
}
