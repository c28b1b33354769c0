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
//!
//! Tools ([`GenerativeVerifier::tools`]): as GenPRM verifies, a chain may check a step by
//! writing Python in a ` ```python ` block. Each chain is written with
//! [`Policy::continue_written`], stopping after a code block closes (`"\n```\n"`); the block
//! runs (after the chain's earlier blocks, one namespace, [`CodeRunner`]) and what it prints is
//! put in the chain as GenPRM's executor puts it (`[Code Output]` and the output in a fence),
//! then the chain goes on, at most [`MAX_TOOL_CALLS`] times. Verdicts may also be GenPRM's
//! `\boxed{Yes}` / `\boxed{No}` and name a `Paragraph k` instead of a `Step k`.

use anyhow::{Context, Result};
use regex::Regex;
use std::sync::OnceLock;
use stepwise_core::seams::{CodeRunner, Continuation, Policy, ScoreInput, Scored, StepScorer, Until};

/// The verification prompt for `question` and its `steps` (numbered from 1), asking for a
/// verdict per step in `\boxed{}` and to stop at the first incorrect step.
pub fn verification_prompt(question: &str, steps: &[&str]) -> String {
    prompt_with(question, steps, "")
}

/// [`verification_prompt`] for a verifier with tools: it may check a step with Python, whose
/// output it is shown.
pub fn verification_prompt_with_code(question: &str, steps: &[&str]) -> String {
    prompt_with(
        question,
        steps,
        "To check a calculation, write Python in a ```python block that prints the result; its output is shown to you after the block. ",
    )
}

fn prompt_with(question: &str, steps: &[&str], tools: &str) -> String {
    let numbered: String = steps
        .iter()
        .enumerate()
        .map(|(i, s)| format!("Step {}: {}\n", i + 1, s.trim()))
        .collect();
    format!(
        "You are given a problem and a step-by-step solution. Verify the solution one step at a time. \
For each step, write \"Step k:\", check it carefully, and end with \\boxed{{correct}} or \\boxed{{incorrect}}. \
{tools}Stop after the first incorrect step.\n\n[Problem]\n{question}\n\n[Solution]\n{numbered}\n[Verification]\n"
    )
}

/// Most code blocks one chain may have run ([`GenerativeVerifier::tools`]).
pub const MAX_TOOL_CALLS: usize = 8;

/// Where a chain stops to have its code run: a fence closing a block.
const CODE_BLOCK_END: &str = "\n```\n";

fn python_block() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r"(?s)```python[ \t]*\n(.*?)\n```").expect("a valid pattern"))
}

/// The ` ```python ` blocks of `chain`, in order.
pub fn python_blocks(chain: &str) -> Vec<String> {
    python_block().captures_iter(chain).map(|c| c[1].to_string()).collect()
}

/// One chain for `prompt` written with `tools`: generation stops after each code block, whose
/// output is put in the chain before it goes on. The whole chain and the tokens the verifier
/// wrote.
pub fn chain_with_tools(policy: &dyn Policy, tools: &dyn CodeRunner, prompt: &str, seed: u64) -> Result<Continuation> {
    let (mut text, mut tokens, mut ran) = (String::new(), 0usize, 0usize);
    // Stops at fences that close no Python block count too, so the chain ends whatever it writes.
    for round in 0.. {
        let more = ran < MAX_TOOL_CALLS && round < 2 * MAX_TOOL_CALLS;
        let stop: &[&str] = if more { &[CODE_BLOCK_END] } else { &[] };
        let part = policy
            .continue_written(prompt, &text, stop, seed.wrapping_add(round as u64))?
            .context("this verifier cannot continue its own text, which a verifier with tools needs (a local checkpoint or a completions server can)")?;
        text.push_str(&part.text);
        tokens += part.tokens;
        if part.finished || !more {
            break;
        }
        let blocks = python_blocks(&text);
        // A fence that closed something else than a new Python block: nothing to run.
        if blocks.len() > ran {
            let output = tools.execute(&blocks[..ran], &blocks[ran]);
            text.push_str(&format!("[Code Output]\n\n```\n{}\n```\n", output.trim_end()));
            ran = blocks.len();
        } else if part.text.is_empty() {
            break;
        }
    }
    Ok(Continuation {
        text,
        tokens,
        finished: true,
        ..Default::default()
    })
}

fn verdict_pattern() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"(?i)(?:step|paragraph)\s*(\d+)|\\boxed\{\s*(?:\\text\{\s*)?(correct|incorrect|yes|no)\s*\}?\s*\}")
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
        let correct = ["correct", "yes"].iter().any(|w| word.as_str().eq_ignore_ascii_case(w));
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
    /// Runs the code the chains write (see the module's documentation); `None`: no tools.
    pub tools: Option<&'a dyn CodeRunner>,
}

/// The verdict words whose likelihoods are compared, for the verdict written at the start of
/// `at`: `correct` / `incorrect`, or GenPRM's `Yes` / `No` (in the case written).
fn verdict_words(at: &str) -> &'static [&'static str] {
    let first = at.chars().next().unwrap_or('c');
    match first {
        'Y' | 'N' => &["Yes", "No"],
        'y' | 'n' => &["yes", "no"],
        _ => &["correct", "incorrect"],
    }
}

impl StepScorer for GenerativeVerifier<'_> {
    fn score(&self, batch: &[ScoreInput<'_>]) -> Result<Scored> {
        let mut scores = Vec::with_capacity(batch.len());
        let mut tokens = 0usize;
        for input in batch {
            let (prompt, chains) = match self.tools {
                None => {
                    let prompt = verification_prompt(input.question, &input.steps);
                    let chains = self
                        .policy
                        .continue_from(&prompt, &[], self.samples.max(1), Until::End, self.seed)?;
                    (prompt, chains)
                }
                Some(tools) => {
                    let prompt = verification_prompt_with_code(input.question, &input.steps);
                    let chains = (0..self.samples.max(1) as u64)
                        .map(|j| chain_with_tools(self.policy, tools, &prompt, self.seed.wrapping_add(j << 32)))
                        .collect::<Result<Vec<_>>>()?;
                    (prompt, chains)
                }
            };
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
                        match self.policy.continuation_logprobs(
                            &prompt,
                            &c.text[..*at],
                            verdict_words(&c.text[*at..]),
                        )? {
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
            tools: None,
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
            assert_eq!(options, ["correct", "incorrect"]);
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
                tools: None,
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

    /// A verifier that checks step 2 with code, as GenPRM does: its verdict follows what the
    /// code printed, and a second block uses a name the first defined.
    struct Coder;

    impl Policy for Coder {
        fn continue_from(&self, _: &str, _: &[&str], _: usize, _: Until, _: u64) -> Result<Vec<Continuation>> {
            unreachable!("a verifier with tools continues its own text")
        }
        fn continue_written(&self, prompt: &str, written: &str, stop: &[&str], _: u64) -> Result<Option<Continuation>> {
            assert!(prompt.contains("```python"), "the prompt offers the tool: {prompt}");
            assert_eq!(stop, [CODE_BLOCK_END]);
            let part = if written.is_empty() {
                "Step 1: \\boxed{Yes}\nParagraph 2: let us compute.\n```python\nx = 12 + 1\nprint(x)\n```\n"
            } else if !written.contains("print(x * 2)") {
                "And twice it:\n```python\nprint(x * 2)\n```\n"
            } else if written.ends_with("[Code Output]\n\n```\n26\n```\n") {
                // The code says 12 + 1 = 13: the step claiming 14 is wrong.
                "So step 2 is \\boxed{No}"
            } else {
                "\\boxed{Yes}"
            };
            Ok(Some(Continuation {
                text: part.to_string(),
                finished: !part.ends_with(CODE_BLOCK_END),
                tokens: 5,
                ..Default::default()
            }))
        }
    }

    /// Runs the two blocks `Coder` writes, the second only after the first.
    struct Calculator;

    impl CodeRunner for Calculator {
        fn execute(&self, earlier: &[String], code: &str) -> String {
            match (earlier, code) {
                ([], "x = 12 + 1\nprint(x)") => "13".into(),
                ([first], "print(x * 2)") if first == "x = 12 + 1\nprint(x)" => "26".into(),
                _ => panic!("unexpected run: {earlier:?} then {code:?}"),
            }
        }
    }

    #[test]
    fn a_verifier_with_tools_reads_its_codes_output_before_its_verdict() {
        let chain = chain_with_tools(&Coder, &Calculator, &verification_prompt_with_code("q", &["a"]), 0).unwrap();
        assert!(chain.text.contains("[Code Output]\n\n```\n13\n```\n"), "{}", chain.text);
        assert!(chain.text.ends_with("So step 2 is \\boxed{No}"), "{}", chain.text);
        assert_eq!(chain.tokens, 15);
        let verifier = GenerativeVerifier {
            policy: &Coder,
            samples: 2,
            seed: 0,
            likelihood: false,
            tools: Some(&Calculator),
        };
        let input = ScoreInput {
            problem_id: "p",
            question: "Ann has 12 apples and gets 1 more.",
            steps: vec!["She has 12.", "12 + 1 = 14", "The answer is 14."],
            partial: false,
        };
        let scored = verifier.score(&[input]).unwrap();
        assert_eq!(scored.scores[0], [1.0, 0.0, 0.0]);
        assert_eq!(scored.tokens, 30);
        // Without a way to continue its own text, a verifier with tools is a clear error.
        let plain = ScriptedPolicy(|_: &str, _: &[&str], _: usize| vec!["x".to_string()]);
        let err = chain_with_tools(&plain, &Calculator, "q", 0).unwrap_err().to_string();
        assert!(err.contains("cannot continue its own text"), "{err}");
        // A verifier that keeps closing fences with no code in them still ends: 16 stops, then
        // one continuation to the end.
        let chain = chain_with_tools(&Fencer, &Calculator, "q", 0).unwrap();
        assert_eq!(chain.tokens, 17);
    }

    /// Writes a fence with no Python in it, every time.
    struct Fencer;

    impl Policy for Fencer {
        fn continue_from(&self, _: &str, _: &[&str], _: usize, _: Until, _: u64) -> Result<Vec<Continuation>> {
            unreachable!()
        }
        fn continue_written(&self, _: &str, _: &str, _: &[&str], _: u64) -> Result<Option<Continuation>> {
            Ok(Some(Continuation {
                text: "```\nnothing\n```\n".into(),
                tokens: 1,
                ..Default::default()
            }))
        }
    }
}
