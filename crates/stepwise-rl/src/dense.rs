//! Dense step rewards for RL engines that take a reward per response token (verl's
//! `token_level_rewards`, OpenRLHF's per-token rewards): each step's reward is written at the
//! token that ends the step, zero elsewhere, so that an estimator summing future rewards (GAE
//! with γ = λ = 1, REINFORCE++, RLOO over tokens) values each step as the credit rule says.

use anyhow::{bail, Result};

/// How step scores become the rewards placed at step ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TokenCredit {
    /// Each step's score at its end: the return from step `j` is the sum of the scores of step
    /// `j` and every later step (the sum-form credit of PRM-guided PPO).
    #[default]
    ReturnToGo,
    /// PURE's min-form credit: the rewards at step ends are differences chosen so that the
    /// return from step `j` is the lowest score from `j` on, `min(s_j..s_n)`: a bad step caps the
    /// value of everything before it, and no later step can make up for it.
    Min,
}

impl TokenCredit {
    /// `return_to_go` or `min`.
    pub fn by_name(name: &str) -> Result<Self> {
        Ok(match name {
            "return_to_go" | "return-to-go" => TokenCredit::ReturnToGo,
            "min" => TokenCredit::Min,
            other => bail!("unknown credit `{other}`: use return_to_go or min"),
        })
    }
}

/// The longest response [`token_rewards`] places rewards over: 2^24 tokens (64 MiB of rewards),
/// far past any model's context; a larger count is a mistake to report, not memory to take.
pub const MAX_RESPONSE_TOKENS: usize = 1 << 24;

/// The reward of every one of `tokens` response tokens: each step's reward at the token
/// `step_ends[j]` that ends step `j` (ascending, each below `tokens`), as `credit` says, plus
/// `outcome` (when given) at the last token; zero elsewhere.
pub fn token_rewards(
    tokens: usize,
    step_scores: &[f32],
    step_ends: &[usize],
    credit: TokenCredit,
    outcome: Option<f32>,
) -> Result<Vec<f32>> {
    if tokens > MAX_RESPONSE_TOKENS {
        bail!("a response of {tokens} tokens: at most {MAX_RESPONSE_TOKENS} (2^24) are placed");
    }
    if outcome.is_some_and(|o| !o.is_finite()) {
        bail!(
            "the outcome reward is {}, not a finite number",
            outcome.unwrap_or_default()
        );
    }
    if step_scores.len() != step_ends.len() {
        bail!(
            "{} step scores but {} step ends (one each)",
            step_scores.len(),
            step_ends.len()
        );
    }
    if let Some((j, &end)) = step_ends.iter().enumerate().find(|(_, &e)| e >= tokens) {
        bail!("step {j} ends at token {end}, past the response's {tokens} tokens");
    }
    if let Some(j) = (1..step_ends.len()).find(|&j| step_ends[j] <= step_ends[j - 1]) {
        bail!(
            "step ends must increase: step {j} ends at token {}, step {} at {}",
            step_ends[j],
            j - 1,
            step_ends[j - 1]
        );
    }
    if let Some(j) = step_scores.iter().position(|s| !s.is_finite()) {
        bail!("step {j}'s score is {}", step_scores[j]);
    }
    let placed: Vec<f32> = match credit {
        TokenCredit::ReturnToGo => step_scores.to_vec(),
        TokenCredit::Min => {
            // G_j = min(s_j..s_n); reward_j = G_j − G_{j+1} (G_{n+1} = 0): the rewards from j on
            // sum to G_j.
            let mut suffix_min = step_scores.to_vec();
            for j in (0..suffix_min.len().saturating_sub(1)).rev() {
                suffix_min[j] = suffix_min[j].min(suffix_min[j + 1]);
            }
            (0..suffix_min.len())
                .map(|j| suffix_min[j] - suffix_min.get(j + 1).copied().unwrap_or(0.0))
                .collect()
        }
    };
    let mut out = vec![0f32; tokens];
    for (&end, r) in step_ends.iter().zip(placed) {
        out[end] += r;
    }
    if let (Some(o), Some(last)) = (outcome, out.last_mut()) {
        *last += o;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_to_go_places_each_score_at_its_step_end() {
        let r = token_rewards(8, &[0.9, 0.2, 0.7], &[1, 4, 7], TokenCredit::ReturnToGo, None).unwrap();
        assert_eq!(r, vec![0.0, 0.9, 0.0, 0.0, 0.2, 0.0, 0.0, 0.7]);
        let with_outcome = token_rewards(8, &[0.9, 0.2, 0.7], &[1, 4, 6], TokenCredit::ReturnToGo, Some(1.0)).unwrap();
        assert_eq!(with_outcome[6], 0.7);
        assert_eq!(with_outcome[7], 1.0);
    }

    #[test]
    fn min_credit_returns_the_lowest_score_from_each_step_on() {
        let scores = [0.9, 0.2, 0.7, 0.5];
        let ends = [2, 3, 6, 9];
        let r = token_rewards(10, &scores, &ends, TokenCredit::Min, None).unwrap();
        let g = crate::advantage::returns_to_go(&r);
        for (j, &end) in ends.iter().enumerate() {
            let want = scores[j..].iter().copied().fold(f32::INFINITY, f32::min);
            assert!((g[end] - want).abs() < 1e-6, "step {j}: {} vs {want}", g[end]);
        }
        // Before the first step's end the return is the first step's.
        assert!((g[0] - 0.2).abs() < 1e-6);
    }

    #[test]
    fn bad_inputs_are_errors_naming_the_step() {
        let e = |r: Result<Vec<f32>>| r.unwrap_err().to_string();
        assert!(e(token_rewards(4, &[0.5], &[4], TokenCredit::ReturnToGo, None)).contains("step 0 ends at token 4"));
        assert!(e(token_rewards(9, &[0.5, 0.5], &[3, 3], TokenCredit::Min, None)).contains("must increase"));
        assert!(e(token_rewards(9, &[0.5], &[3, 5], TokenCredit::Min, None)).contains("one each"));
        assert!(e(token_rewards(9, &[f32::NAN], &[3], TokenCredit::Min, None)).contains("NaN"));
        assert!(TokenCredit::by_name("sum").is_err());
        assert_eq!(
            token_rewards(0, &[], &[], TokenCredit::Min, Some(1.0)).unwrap(),
            Vec::<f32>::new()
        );
    }
}
