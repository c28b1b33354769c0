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
//!
//! Likelihood ([`GenerativeVerifier::likelihood`]): where the verifier gives log-probabilities
//! ([`Policy::continuation_logprobs`]: a local engine), a chain's verdict on a step is not 1 or 0
//! but `P(correct) / (P(correct) + P(incorrect))` read at its `\boxed{`, what ThinkPRM scores
//! with; the score is the mean over the chains of that probability, so one chain already
//! gives a graded score.

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
    verdict_sites(chain, steps)
        .into_iter()
        .map(|v| v.map(|(correct, _)| correct))
        .collect()
}

/// As [`parse_step_verdicts`], with where each verdict's word starts in `chain` (the text
/// before it ends with `\boxed{`).
pub fn verdict_sites(chain: &str, steps: usize) -> Vec<Option<(bool, usize)>> {
    let mut verdicts = vec![None; steps];
    let (mut named, mut next) = (None::<usize>, 0usize);
    for cap in verdict_pattern().captures_iter(chain) {
        if let Some(k) = cap.get(1) {
            named = k.as_str().parse::<usize>().ok().and_then(|k| k.checked_sub(1));
            continue;
        }
        let Some(word) = cap.get(2) else { continue };
        let correct = word.as_str().eq_ignore_ascii_case("correct");
        let at = named.take().unwrap_or(next);
        if at < steps && verdicts[at].is_none() {
            verdicts[at] = Some((correct, word.start()));
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
        let values = chain_values(chain, &[], steps);
        for (vote, value) in votes.iter_mut().zip(values) {
            if let Some(v) = value {
                vote.0 += usize::from(v > 0.5);
                vote.1 += 1;
            }
        }
    }
    votes
}

/// One chain's value for each of `steps` steps: the probability of `correct` its verdict was
/// given (`likelihood[k]`, where there is one) or the verdict as 1 or 0; 0 from the chain's
/// first incorrect verdict on (that step keeps its own probability); `None` where the chain
/// does not reach the step.
pub fn chain_values(verdicts: &[Option<bool>], likelihood: &[Option<f32>], steps: usize) -> Vec<Option<f32>> {
    let first_bad = verdicts.iter().position(|v| *v == Some(false));
    (0..steps)
        .map(|k| {
            let own = verdicts
                .get(k)
                .copied()
                .flatten()
                .map(|ok| likelihood.get(k).copied().flatten().unwrap_or(f32::from(u8::from(ok))));
            match first_bad {
                Some(b) if k > b => Some(0.0),
                _ => own,
            }
        })
        .collect()
}

/// A policy that writes verification chains, as a step scorer.
pub struct GenerativeVerifier<'a> {
    /// The verifier model.
    pub policy: &'a dyn Policy,
    /// Chains sampled per solution.
    pub samples: usize,
    /// Seed of the draws (each solution's chains are drawn with it).
    pub seed: u64,
    /// Read each verdict's probability from the verifier's likelihood where it gives
    /// log-probabilities (else, and when off, each chain votes 1 or 0).
    pub likelihood: bool,
}

/// The verdict words whose likelihoods are compared.
const VERDICTS: [&str; 2] = ["correct", "incorrect"];

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
            let n = input.steps.len();
            let mut sums = vec![(0f32, 0usize); n];
            for c in &chains {
                let sites = verdict_sites(&c.text, n);
                let verdicts: Vec<Option<bool>> = sites.iter().map(|v| v.map(|(ok, _)| ok)).collect();
                let mut likelihood = vec![None; n];
                if self.likelihood {
                    for (k, site) in sites.iter().enumerate() {
                        let Some((_, at)) = site else { continue };
                        match self.policy.continuation_logprobs(&prompt, &c.text[..*at], &VERDICTS)? {
                            Some(lp) => likelihood[k] = Some(probability_of_first(&lp)),
                            None => break,
                        }
                    }
                }
                for (sum, value) in sums.iter_mut().zip(chain_values(&verdicts, &likelihood, n)) {
                    if let Some(v) = value {
                        sum.0 += v;
                        sum.1 += 1;
                    }
                }
            }
            scores.push(
                sums.into_iter()
                    .map(|(sum, n)| if n == 0 { 0.5 } else { sum / n as f32 })
                    .collect(),
            );
        }
        Ok(Scored { scores, tokens })
    }
}

/// `P(first) / (P(first) + P(second))` from two log-probabilities.
fn probability_of_first(logprobs: &[f64]) -> f32 {
    match logprobs {
        [a, b] => (1.0 / (1.0 + (b - a).exp())) as f32,
        _ => 0.5,
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
            likelihood: true,
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

    /// A verifier that writes the same chain every time and knows its verdicts' likelihoods.
    struct Confident;

    impl Policy for Confident {
        fn continue_from(
            &self,
            _: &str,
            _: &[&str],
            n: usize,
            _: Until,
            _: u64,
        ) -> Result<Vec<stepwise_core::seams::Continuation>> {
            let text = "Step 1: \\boxed{correct} Step 2: \\boxed{incorrect}".to_string();
            Ok(vec![
                stepwise_core::seams::Continuation {
                    text,
                    ..Default::default()
                };
                n
            ])
        }
        fn continuation_logprobs(&self, _: &str, written: &str, options: &[&str]) -> Result<Option<Vec<f64>>> {
            assert_eq!(options, VERDICTS);
            assert!(written.ends_with("\\boxed{"), "{written}");
            // Step 1: P(correct) = 0.8; step 2: 0.3.
            let p: f64 = if written.contains("Step 2") { 0.3 } else { 0.8 };
            Ok(Some(vec![p.ln(), (1.0 - p).ln()]))
        }
    }

    #[test]
    fn likelihood_scores_each_verdict_by_its_probability() {
        let input = ScoreInput {
            problem_id: "p",
            question: "q",
            steps: vec!["a", "b", "c"],
            partial: false,
        };
        let score = |likelihood| {
            GenerativeVerifier {
                policy: &Confident,
                samples: 2,
                seed: 0,
                likelihood,
            }
            .score(std::slice::from_ref(&input))
            .unwrap()
            .scores
            .remove(0)
        };
        // Step 3 comes after the chain's first incorrect verdict: 0 in every chain.
        for (got, want) in score(true).iter().zip([0.8, 0.3, 0.0]) {
            assert!((got - want).abs() < 1e-5, "{got} against {want}");
        }
        assert_eq!(score(false), [1.0, 0.0, 0.0], "votes: 1 or 0");
        assert_eq!(
            chain_values(&[Some(true), None], &[Some(0.7)], 3),
            [Some(0.7), None, None]
        );
    }
}
