//! Sampled solutions as training sequences: the prompt and exactly the tokens the policy drew,
//! each completion token carrying the advantage of the step it belongs to.

pub use stepwise_model::log_ratio::sequence_logprobs;

/// One sampled solution as RL trains on it.
#[derive(Debug, Clone, Default)]
pub struct Sequence {
    /// Prompt and completion token ids.
    pub ids: Vec<u32>,
    /// The first completion token: the loss covers positions `learn_from..` (but `skip`).
    pub learn_from: usize,
    /// Position ranges `start..end` past `learn_from` the loss leaves out: text the policy
    /// read but did not write (an environment's observations in an agent's trajectory).
    pub skip: Vec<(usize, usize)>,
    /// Each token's advantage (0 on the prompt).
    pub advantages: Vec<f32>,
    /// Each token's log-probability under the policy that sampled it; empty when the loss is
    /// taken before the policy moves (one pass, one optimiser step): the loss then holds the
    /// log-probabilities it computes constant in their place (a ratio of exactly 1, TRL's GRPO
    /// with one iteration).
    pub old_logprobs: Vec<f32>,
    /// Each token's log-probability under the frozen reference.
    pub ref_logprobs: Vec<f32>,
}

impl Sequence {
    /// Whether the loss covers position `i`: a completion token outside every `skip` range.
    pub fn learns(&self, i: usize) -> bool {
        i >= self.learn_from && i < self.ids.len() && !self.skip.iter().any(|&(a, b)| (a..b).contains(&i))
    }

    /// The positions the loss covers, in order ([`Sequence::learns`]).
    pub fn learned(&self) -> impl Iterator<Item = usize> + '_ {
        (self.learn_from..self.ids.len()).filter(|&i| self.learns(i))
    }
}

/// Each completion token's advantage, given which tokens are separators (their text holds the
/// step separator): a step's tokens, its separator included, get that step's advantage. Steps are counted as [`stepwise_core::seams::split_steps_at`] counts them: a
/// separator with nothing before it starts no step. Tokens past the last step (the end token)
/// get the last step's.
pub fn token_advantages(is_separator: &[bool], step_advantages: &[f32]) -> Vec<f32> {
    let last = step_advantages.len().saturating_sub(1);
    let (mut step, mut in_step) = (0, false);
    is_separator
        .iter()
        .map(|&sep| {
            let a = step_advantages.get(step.min(last)).copied().unwrap_or(0.0);
            if !sep {
                in_step = true;
            } else if in_step {
                step += 1;
                in_step = false;
            }
            a
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(tokens: &[u32], sep: u32) -> Vec<bool> {
        tokens.iter().map(|&t| t == sep).collect()
    }

    #[test]
    fn each_token_gets_its_steps_advantage() {
        // step 0: 5 6 |, step 1: 7 |, step 2: 8 <eos>
        let sep = 1;
        let completion = [5, 6, sep, 7, sep, 8, 2];
        let a = token_advantages(&flags(&completion, sep), &[0.5, -1.0, 2.0]);
        assert_eq!(a, vec![0.5, 0.5, 0.5, -1.0, -1.0, 2.0, 2.0]);
        // An empty step is no step (as in the step texts): its separator joins the next step.
        let a = token_advantages(&flags(&[5, sep, sep, 6, sep, 7], sep), &[1.0, 3.0, 4.0]);
        assert_eq!(a, vec![1.0, 1.0, 3.0, 3.0, 3.0, 4.0]);
        let a = token_advantages(&flags(&[sep, 9, sep, 9, sep, 9], sep), &[1.0, 3.0]);
        assert_eq!(
            a,
            vec![1.0, 1.0, 1.0, 3.0, 3.0, 3.0],
            "past the last step: the last step's"
        );
    }
}
