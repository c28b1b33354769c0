//! A generative verifier as a [`StepScorer`]: a model that writes a verification chain of
//! thought with a verdict per step, as ThinkPRM and GenPRM do ("Step 2: ... the step is
//! \boxed{incorrect}"), sampled several times; a step's score is the share of the chains that
//! call it correct. Any [`Policy`] (a local checkpoint, a served model) can verify, so `score`,
//! `bon`, `search` and `eval` take it as they take a discriminative PRM.
//!
//! Reading a chain ([`parse_step_verdicts`]): each `\boxed{correct}` / `\boxed{incorrect}`
//! (also `\boxed{\text{...}}`, any case) belongs to the step named by the nearest `Step k`
//! before it (1-based), or to the step after the last one judged when no step is named. A chain
//! that stops (the model ends it at the first error, or runs out of tokens) leaves the later
//! steps without a verdict; a verdict for a step that does not exist, or a second verdict for
//! one step, is ignored. Voting ([`step_votes`]): within a chain every step from its first
//! incorrect one on counts as incorrect (a solution is wrong from its first error, PRM800K's
//! convention); a step no chain reaches has no vote and scores 0.5.

use anyhow::Result;
use regex::Regex;
use std::sync::OnceLock;
use stepwise_core::seams::{Policy, ScoreInput, Scored, StepScorer, Until};

/// The verification prompt for `question` and its `steps` (numbered from 1), asking for a
/// verdict per step in `\boxed{}` and to stop at the first incorrect step.
pub fn verification_prompt(question: &str, steps: &[&str]) -> String {
    let numbered: String = steps
        .iter()
        .enumerate()
        .map(|(i, s)| format!("Step {}: {}\n", i + 1, s.trim()))
        .collect();
    format!(
        "You are given a problem and a step-by-step solution. Verify the solution one step at a time. \
For each step, write \"Step k:\", check it carefully, and end with \\boxed{{correct}} or \\boxed{{incorrect}}. \
Stop after the first incorrect step.\n\n[Problem]\n{question}\n\n[Solution]\n{numbered}\n[Verification]\n"
    )
}

fn verdict_pattern() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"(?i)step\s*(\d+)|\\boxed\{\s*(?:\\text\{\s*)?(correct|incorrect)\s*\}?\s*\}")
            .expect("a valid pattern")
    })
}

/// Each of `steps` steps' verdict in one verification chain: `Some(true)` correct, `Some(false)`
/// incorrect, `None` not judged (see the module's documentation).
pub fn parse_step_verdicts(chain: &str, steps: usize) -> Vec<Option<bool>> {
    let mut verdicts = vec![None; steps];
    let (mut named, mut next) = (None::<usize>, 0usize);
    for cap in verdict_pattern().captures_iter(chain) {
        if let Some(k) = cap.get(1) {
            named = k.as_str().parse::<usize>().ok().and_then(|k| k.checked_sub(1));
            continue;
        }
        let correct = cap.get(2).is_some_and(|v| v.as_str().eq_ignore_ascii_case("correct"));
        let at = named.take().unwrap_or(next);
        if at < steps && verdicts[at].is_none() {
            verdicts[at] = Some(correct);
        }
        next = at + 1;
    }
    verdicts
}

/// Votes of several chains on each step: `(correct, voting)` per step, every step from a chain's
/// first incorrect one on counted incorrect in that chain.
pub fn step_votes(chains: &[Vec<Option<bool>>], steps: usize) -> Vec<(usize, usize)> {
    let mut votes = vec![(0usize, 0usize); steps];
    for chain in chains {
        let first_bad = chain.iter().position(|v| *v == Some(false));
        for (k, vote) in votes.iter_mut().enumerate() {
            let verdict = match first_bad {
                Some(b) if k >= b => Some(false),
                _ => chain.get(k).copied().flatten(),
            };
            if let Some(ok) = verdict {
                vote.0 += usize::from(ok);
                vote.1 += 1;
            }
        }
    }
    votes
}

/// A policy that writes verification chains, as a step scorer.
pub struct GenerativeVerifier<'a> {
    /// The verifier model.
    pub policy: &'a dyn Policy,
    /// Chains sampled per solution.
    pub samples: usize,
    /// Seed of the draws (each solution's chains are drawn with it).
    pub seed: u64,
}

impl StepScorer for GenerativeVerifier<'_> {
    fn score(&self, batch: &[ScoreInput<'_>]) -> Result<Scored> {
        let mut scores = Vec::with_capacity(batch.len());
        let mut tokens = 0usize;
        for input in batch {
            let prompt = verification_prompt(input.question, &input.steps);
            let chains = self
                .policy
                .continue_from(&prompt, &[], self.samples.max(1), Until::End, self.seed)?;
            tokens += chains.iter().map(|c| c.tokens).sum::<usize>();
            let verdicts: Vec<Vec<Option<bool>>> = chains
                .iter()
                .map(|c| parse_step_verdicts(&c.text, input.steps.len()))
                .collect();
            scores.push(
                step_votes(&verdicts, input.steps.len())
                    .into_iter()
                    .map(|(yes, n)| if n == 0 { 0.5 } else { yes as f32 / n as f32 })
                    .collect(),
            );
        }
        Ok(Scored { scores, tokens })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepwise_core::testing::ScriptedPolicy;

    #[test]
    fn chains_are_read_step_by_step_whatever_their_shape() {
        let chain = "Step 1: 3 * 4 = 12, right. \\boxed{correct}\nStep 2: 12 + 1 is 13, but the problem adds 2. \\boxed{Incorrect}";
        assert_eq!(parse_step_verdicts(chain, 3), [Some(true), Some(false), None]);
        // No step names: verdicts in order; \text{} inside the box.
        let plain = "ok \\boxed{\\text{correct}} fine \\boxed{correct} wrong \\boxed{incorrect}";
        assert_eq!(parse_step_verdicts(plain, 3), [Some(true), Some(true), Some(false)]);
        // Out of range, repeated, and a chain cut off mid-way.
        let odd = "Step 9: \\boxed{correct} Step 1: \\boxed{correct} Step 1: \\boxed{incorrect} Step 2: looks";
        assert_eq!(parse_step_verdicts(odd, 3), [Some(true), None, None]);
        assert_eq!(parse_step_verdicts("no verdict at all", 2), [None, None]);
        assert_eq!(parse_step_verdicts("\\boxed{7}", 1), [None]);
    }

    #[test]
    fn votes_count_everything_after_a_chains_first_error_as_incorrect() {
        let chains = vec![
            vec![Some(true), Some(false), None],
            vec![Some(true), Some(true), Some(true)],
            vec![None, None, None],
        ];
        assert_eq!(step_votes(&chains, 3), [(2, 2), (1, 2), (1, 2)]);
    }

    #[test]
    fn a_scripted_verifier_scores_each_step_by_its_votes() {
        // Three chains a solution: two call step 2 incorrect, one calls everything correct.
        let policy = ScriptedPolicy(|prompt: &str, _prefix: &[&str], j: usize| {
            assert!(prompt.contains("Step 2: 12 + 1 = 13"), "{prompt}");
            let chain = if j < 2 {
                "Step 1: fine \\boxed{correct} Step 2: wrong \\boxed{incorrect}"
            } else {
                "Step 1: \\boxed{correct} Step 2: \\boxed{correct} Step 3: \\boxed{correct}"
            };
            vec![chain.to_string()]
        });
        let verifier = GenerativeVerifier {
            policy: &policy,
            samples: 3,
            seed: 0,
        };
        let input = ScoreInput {
            problem_id: "p",
            question: "Ann has 3 bags of 4 apples and finds 2 more.",
            steps: vec!["3 * 4 = 12", "12 + 1 = 13", "The answer is 13."],
            partial: false,
        };
        let scored = verifier.score(&[input]).unwrap();
        let third = 1.0 / 3.0;
        for (got, want) in scored.scores[0].iter().zip([1.0, third, third]) {
            assert!((got - want).abs() < 1e-6, "{:?}", scored.scores[0]);
        }
    }
}
