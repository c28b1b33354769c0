//! Turning labelled solutions into training sequences, with TRL's token-classification layout:
//! problem tokens, then each step's tokens and the separator; the label sits on the separator's
//! last token. The same layout serves PRMs (every step), `train_on_last_step_only`, and ORMs
//! (one outcome label on the last step).

use crate::layout::{encode_steps, EncodedSteps};
use crate::log_ratio::sequence_logprobs;
use crate::model::Model;
use crate::tokenizer::Tokenizer;
use crate::train::Example;
use anyhow::Result;
use stepwise_core::{Rating, Solution};

/// What to do with PRM800K's neutral (0) ratings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Neutral {
    /// Count as good (PRM800K's convention for training).
    #[default]
    Good,
    /// Count as bad.
    Bad,
    /// Leave out of the loss.
    Skip,
}

/// Options for [`label_examples`].
#[derive(Debug, Clone, Default)]
pub struct LabelOptions {
    /// Neutral ratings.
    pub neutral: Neutral,
    /// Only the last labelled step carries a target (TRL's `train_on_last_step_only`).
    pub last_step_only: bool,
    /// Step targets stop at the first bad one (a label below 0.5), as PRM800K's raters stop at
    /// the first error: later steps are bad only because an earlier one was, and training on
    /// them teaches where errors tend to be (late in long solutions) instead of what they are.
    pub stop_at_first_bad: bool,
    /// Outcome supervision: one target on the last step, from `Solution::correct`.
    pub outcome: bool,
    /// Separator after each step.
    pub separator: String,
    /// Longest sequence kept (longer ones are cut at a step boundary).
    pub max_len: usize,
    /// Put the separator after the problem too, as a policy writing `problem | step | …` reads
    /// its solutions (the log-ratio layout); TRL's layout has none there.
    pub separator_after_problem: bool,
}

/// Training examples from labelled solutions (solutions with nothing to learn are skipped).
pub fn label_examples(tok: &Tokenizer, sols: &[Solution], o: &LabelOptions) -> Result<Vec<Example>> {
    let sep = if o.separator.is_empty() {
        "\n"
    } else {
        o.separator.as_str()
    };
    let mut out = Vec::with_capacity(sols.len());
    for s in sols {
        // A trajectory's actions are learnt with the observations they led to.
        let turns = stepwise_core::seams::turns_of(s);
        let texts: Vec<&str> = match &turns {
            Some(t) => t.iter().map(String::as_str).collect(),
            None => s.step_texts(),
        };
        let EncodedSteps {
            mut ids,
            ends: pos,
            steps_from,
        } = encode_steps(tok, &s.question, &texts, sep, o.separator_after_problem)?;
        let mut targets: Vec<(usize, f32)> = if o.outcome {
            match (s.correct, pos.last()) {
                (Some(c), Some(&p)) => vec![(p, if c { 1.0 } else { 0.0 })],
                _ => Vec::new(),
            }
        } else {
            s.steps
                .iter()
                .zip(&pos)
                .filter_map(|(st, &p)| {
                    let l = st.label.as_ref()?;
                    match (l.rating(), o.neutral) {
                        (Some(Rating::Neutral), Neutral::Skip) => None,
                        (Some(Rating::Neutral), Neutral::Good) => Some((p, 1.0)),
                        (Some(Rating::Neutral), Neutral::Bad) => Some((p, 0.0)),
                        _ => Some((p, l.prob(1.0))),
                    }
                })
                .collect()
        };
        if o.stop_at_first_bad && !o.outcome {
            if let Some(k) = targets.iter().position(|&(_, y)| y < 0.5) {
                targets.truncate(k + 1);
            }
        }
        if o.last_step_only {
            targets = targets.last().copied().into_iter().collect();
        }
        if o.max_len > 0 && ids.len() > o.max_len {
            ids.truncate(o.max_len);
            targets.retain(|&(p, _)| p < o.max_len);
        }
        if !targets.is_empty() {
            out.push(Example {
                lm_from: steps_from,
                ids,
                targets,
                ..Default::default()
            });
        }
    }
    Ok(out)
}

/// Fill every example's `ref_logprobs` with the reference model's token log-probabilities, so
/// training needs no second forward pass.
pub fn attach_reference(reference: &Model, examples: &mut [Example], batch_size: usize) -> Result<()> {
    let seqs: Vec<&[u32]> = examples.iter().map(|e| e.ids.as_slice()).collect();
    let logprobs = sequence_logprobs(reference, &seqs, batch_size, crate::DEFAULT_MAX_BATCH_TOKENS)?;
    for (e, lp) in examples.iter_mut().zip(logprobs) {
        e.ref_logprobs = lp;
    }
    Ok(())
}
