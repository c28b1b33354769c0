//! Log-likelihood-ratio rewards: a causal LM π_θ fine-tuned from a reference LM π_ref scores a
//! span of tokens `y` by `β · Σ log π_θ(yᵢ | y<ᵢ) / π_ref(yᵢ | y<ᵢ)`, read as the log-odds that the
//! span is good. This is the implicit PRM of Yuan et al. 2024 ("Free Process Rewards without
//! Process Labels", used by PRIME): trained on outcome labels over the whole solution it is an
//! ORM whose partial sums are process rewards; trained on step labels with one span per step it
//! is a PRM.
//!
//! Why it matters: a verifier fine-tuned from the policy starts from a model that already
//! predicts every token. A fresh classifier head must rebuild from scratch the check "is the
//! written result what I would have computed"; here the check is the LM's own next-token
//! distribution, so training only has to learn how to weigh it (see the README's lab section).
//!
//! The reference can also be a constant: every token is compared with one log-probability
//! `log p₀`, so a span scores `β · (Σ log π_θ(yᵢ | y<ᵢ) − n · log p₀)`, the verifier's own
//! log-likelihood of the step. Fine-tuned from the policy, it starts as the policy's confidence in
//! each step. Unlike a ratio against the policy, it cannot call a step good only because the
//! verifier's and the reference's tiny probabilities of it moved apart (see the README's lab
//! section).
//!
//! A folder holding such a verifier carries a `reward.json` ([`crate::layout::RewardSpec`])
//! naming its reference and `β`. This is the spec; the forward passes that compute the
//! log-probabilities are `stepwise_model::log_ratio`'s.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// How span log-odds are formed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LogRatio {
    /// Scale `β` of the summed log-ratio.
    pub beta: f32,
    /// Step `k`'s span runs from the first step's start (implicit PRM's `q_k`, what an ORM
    /// trained on whole solutions yields) instead of from the end of step `k − 1`.
    pub cumulative: bool,
    /// A constant reference: every token's log-probability under it (`log p₀`). `None`: a
    /// reference model gives each token's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_logprob: Option<f32>,
    /// Score only each step's last `n` tokens, its separator counted (`Some(2)`: the token that
    /// ends the step, usually its written result, and the separator). `None`: every token of
    /// the span. A step's first tokens choose what to compute next (which number, which
    /// operation); its last say what came out, which is what a step label judges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_tokens: Option<usize>,
}

impl LogRatio {
    /// Checks that a constant reference is a log-probability (finite, at most 0).
    fn check_reference(&self) -> Result<()> {
        match self.reference_logprob {
            Some(c) if !(c.is_finite() && c <= 0.0) => {
                bail!("field `reference_logprob`: {c} is not a log-probability (finite, at most 0)")
            }
            _ => Ok(()),
        }
    }

    /// The token span scored for each step ([`spans`], cut to the last
    /// [`LogRatio::last_tokens`] tokens when set).
    pub fn step_spans(&self, first: usize, ends: &[usize]) -> Vec<(usize, usize)> {
        let mut all = spans(first, ends, self.cumulative);
        if let Some(n) = self.last_tokens {
            for (start, end) in &mut all {
                *start = (*start).max((*end + 1).saturating_sub(n.max(1)));
            }
        }
        all
    }

    /// Checks that a constant reference is a log-probability and that a tail is not empty.
    pub fn check(&self) -> Result<()> {
        self.check_reference()?;
        if self.last_tokens == Some(0) {
            bail!("field `last_tokens`: 0 (a step needs at least one scored token)");
        }
        Ok(())
    }

    /// The reference's log-probability summed over positions `start..=end`, from a constant
    /// reference or from `ref_logprobs` (one per token of the sequence).
    pub fn reference_sum(&self, ref_logprobs: &[f32], start: usize, end: usize) -> Result<f32> {
        match self.reference_logprob {
            Some(c) => Ok(c * (end + 1 - start) as f32),
            None => match ref_logprobs.get(start..=end) {
                Some(span) => Ok(span.iter().sum()),
                None => bail!("the log-ratio objective needs the reference log-probabilities of every token"),
            },
        }
    }
}

/// The token span of each step: step `k` ends at `ends[k]` (inclusive) and starts after the end
/// of step `k − 1`, or at `first` (the first step's first token) when `cumulative` or `k = 0`.
pub fn spans(first: usize, ends: &[usize], cumulative: bool) -> Vec<(usize, usize)> {
    let mut start = first;
    ends.iter()
        .map(|&end| {
            let span = (start, end);
            if !cumulative {
                start = end + 1;
            }
            span
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_keeps_each_steps_last_tokens_and_never_reaches_into_the_step_before() {
        let whole = LogRatio {
            beta: 1.0,
            cumulative: false,
            reference_logprob: Some(-0.5),
            last_tokens: None,
        };
        let ends = [5, 9, 10];
        assert_eq!(whole.step_spans(2, &ends), [(2, 5), (6, 9), (10, 10)]);
        let tail = LogRatio {
            last_tokens: Some(2),
            ..whole
        };
        assert_eq!(tail.step_spans(2, &ends), [(4, 5), (8, 9), (10, 10)]);
        let cumulative = LogRatio {
            cumulative: true,
            ..tail
        };
        assert_eq!(cumulative.step_spans(2, &ends), [(4, 5), (8, 9), (9, 10)]);
        assert!(LogRatio {
            last_tokens: Some(0),
            ..whole
        }
        .check()
        .is_err());
        assert!(tail.check().is_ok());
    }
}
