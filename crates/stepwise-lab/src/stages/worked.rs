//! The judge that works each step again where it stands: a generative verifier asked after
//! every step of a solution (the question and the steps up to it, in the policy's layout) to
//! work that step's equation again and give it a verdict (`36 - 13 = 23 no` for `36 - 13 = 24`;
//! a step without an equation gets its verdict alone). It thinks before each verdict as ThinkPRM's chain does, but
//! the step it checks is the last thing it read, so it never has to find step k inside the
//! solution — what the lab's one-pass chain judge ([`super::judge::ChainAnswer`]) fails at.
//! Trained alike on the same oracle-labelled solutions (one example a step, up to and
//! including the first wrong one); a step's score is the share of its sampled verdicts that
//! say `yes`. Its control is the same judge that gives its verdict without working the step
//! (`think: false`): what thinking adds, all else equal.

use super::judge::{verdict_piece, RIGHT, WRONG};
use crate::vocab::{EOS, SEP};
use anyhow::{Context, Result};
use stepwise_core::seams::{NextOptions, Policy, ScoreInput, Scored, StepScorer, Until};
use stepwise_core::Solution;
use stepwise_label::montecarlo::seed_for;
use stepwise_model::layout::encode_steps;
use stepwise_model::train::Example;
use stepwise_model::Tokenizer;

/// The judge's training examples for an oracle-labelled solution: one a step, up to and
/// including its first wrong one (a solution is wrong from there on, PRM800K's convention):
/// the question and the steps up to it in the policy's layout, then what the judge writes about
/// it (with `think`, `verdict_piece`: the step worked again, then `yes` or `no`; else the
/// verdict alone) and `<eos>`; the loss covers the answer only.
pub fn worked_examples(tok: &Tokenizer, sol: &Solution, think: bool) -> Result<Vec<Example>> {
    let steps = sol.step_strings();
    let through = sol.first_error().map_or(steps.len(), |k| k + 1);
    (0..through)
        .map(|k| {
            let refs: Vec<&str> = steps[..=k].iter().map(String::as_str).collect();
            let mut ids = encode_steps(tok, &sol.question, &refs, SEP, true)?.ids;
            let lm_from = ids.len();
            let good = sol.first_error() != Some(k);
            let answer = match think {
                true => verdict_piece(&steps[k], good),
                false => (if good { RIGHT } else { WRONG }).to_string(),
            };
            ids.extend(tok.encode(&answer, false)?);
            ids.extend(tok.encode(EOS, false)?);
            Ok(Example {
                ids,
                lm_from,
                ..Default::default()
            })
        })
        .collect()
}

/// The verdict an answer ends with: `Some(true)` for `yes`, `Some(false)` for `no`, `None` for
/// anything else (an empty answer, one cut short, another word).
pub fn read_verdict(answer: &str) -> Option<bool> {
    match answer.split_whitespace().last()? {
        RIGHT => Some(true),
        WRONG => Some(false),
        _ => None,
    }
}

/// The judge as a verifier: each step of each solution asked `samples` times (seeded by the
/// solution and the step), its score the share of readable verdicts that say `yes` (0.5 when
/// none is readable). With `likelihood`, each readable verdict counts as the probability the
/// judge gives `yes` against `no` after what it wrote before it (ThinkPRM's score); a judge
/// that does not `think` writes nothing before it, so nothing is sampled.
pub struct WorkedJudge<'a> {
    /// The fine-tuned judge, in the policy's layout.
    pub policy: &'a dyn Policy,
    /// Answers sampled a step.
    pub samples: usize,
    /// Base seed.
    pub seed: u64,
    /// It works each step again before its verdict.
    pub think: bool,
    /// Weigh each verdict by its probability instead of counting it.
    pub likelihood: bool,
}

/// What the judge said about a step in one answer: its verdict and the working before it.
type Reading = (bool, String);

impl WorkedJudge<'_> {
    /// The readable verdicts of each step of each solution (with the working before each), and
    /// the tokens written. A judge weighed by likelihood that does not think writes nothing: one
    /// reading a step, with no working.
    fn read_steps(&self, batch: &[ScoreInput<'_>]) -> Result<(Vec<Vec<Vec<Reading>>>, usize)> {
        let mut tokens = 0;
        let mut readings = Vec::with_capacity(batch.len());
        for input in batch {
            let key = format!("{}\u{1f}{}", input.problem_id, input.steps.join("\u{1f}"));
            let mut row = Vec::with_capacity(input.steps.len());
            for k in 0..input.steps.len() {
                if self.likelihood && !self.think {
                    row.push(vec![(true, String::new())]);
                    continue;
                }
                let answers = self.policy.continue_from(
                    input.question,
                    &input.steps[..=k],
                    self.samples.max(1),
                    Until::End,
                    seed_for(self.seed, &key, k),
                )?;
                tokens += answers.iter().map(|a| a.tokens).sum::<usize>();
                row.push(
                    answers
                        .iter()
                        .filter_map(|a| {
                            let right = read_verdict(&a.text)?;
                            let words: Vec<&str> = a.text.split_whitespace().collect();
                            Some((right, words[..words.len() - 1].join(" ")))
                        })
                        .collect(),
                );
            }
            readings.push(row);
        }
        Ok((readings, tokens))
    }

    /// Each reading's `P(yes) / (P(yes) + P(no))` after its working, in one batch.
    fn weigh(&self, batch: &[ScoreInput<'_>], readings: &[Vec<Vec<Reading>>]) -> Result<Vec<Vec<Vec<f32>>>> {
        let option = |working: &str, verdict: &str| match working {
            "" => verdict.to_string(),
            w => format!("{w} {verdict}"),
        };
        // Every reading's two answers, in reading order, with the step each reads after.
        let mut asked: Vec<(&ScoreInput<'_>, usize, [String; 2])> = Vec::new();
        for (input, row) in batch.iter().zip(readings) {
            for (k, said) in row.iter().enumerate() {
                asked.extend(
                    said.iter()
                        .map(|(_, w)| (input, k, [option(w, RIGHT), option(w, WRONG)])),
                );
            }
        }
        let pairs: Vec<[&str; 2]> = asked.iter().map(|(_, _, [a, b])| [a.as_str(), b.as_str()]).collect();
        let asks: Vec<NextOptions<'_>> = asked
            .iter()
            .zip(&pairs)
            .map(|((input, k, _), options)| NextOptions {
                question: input.question,
                prefix: &input.steps[..=*k],
                options,
            })
            .collect();
        let mut lps = self
            .policy
            .logprobs_after(&asks, true)?
            .context("the judge's model gives no log-probabilities (a Python policy, or a chat prompt served without its tokenizer): score it with sampled verdicts")?
            .into_iter();
        let mut next = || -> Result<f32> {
            let lp = lps.next().context("the policy weighed fewer asks than it was given")?;
            Ok((1.0 / (1.0 + (lp[1] - lp[0]).exp())) as f32)
        };
        readings
            .iter()
            .map(|row| row.iter().map(|said| said.iter().map(|_| next()).collect()).collect())
            .collect()
    }
}

/// The mean of `xs`, 0.5 when there are none.
fn mean_or_half(xs: &[f32]) -> f32 {
    match xs.len() {
        0 => 0.5,
        n => xs.iter().sum::<f32>() / n as f32,
    }
}

impl StepScorer for WorkedJudge<'_> {
    fn score(&self, batch: &[ScoreInput<'_>]) -> Result<Scored> {
        let (readings, tokens) = self.read_steps(batch)?;
        let values: Vec<Vec<Vec<f32>>> = match self.likelihood {
            true => self.weigh(batch, &readings)?,
            false => readings
                .iter()
                .map(|row| {
                    row.iter()
                        .map(|said| said.iter().map(|(right, _)| f32::from(u8::from(*right))).collect())
                        .collect()
                })
                .collect(),
        };
        let scores = values
            .iter()
            .map(|row| row.iter().map(|v| mean_or_half(v)).collect())
            .collect();
        Ok(Scored { scores, tokens })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepwise_core::seams::Continuation;
    use stepwise_core::testing::ScriptedPolicy;
    use stepwise_core::{Provenance, Step, StepLabel};

    #[test]
    fn one_example_a_step_up_to_the_first_error_each_step_worked_where_it_stands() {
        let tok = crate::vocab::tokenizer(crate::task::Domain::Arithmetic).unwrap();
        let step = |t: &str, good| Step::labelled(t, StepLabel::from_bool(good, Provenance::Oracle));
        let sol = Solution {
            question: "Ann has 2 boxes of 3 apples . How many apples does Ann have now ?".into(),
            steps: vec![
                step("2 * 3 = 6", true),
                step("6 + 1 = 8", false),
                step("The answer is 8", false),
            ],
            ..Default::default()
        };
        let examples = worked_examples(&tok, &sol, true).unwrap();
        let text = |e: &Example| {
            (
                tok.decode(&e.ids[..e.lm_from]).unwrap(),
                tok.decode(&e.ids[e.lm_from..]).unwrap(),
            )
        };
        assert_eq!(examples.len(), 2, "none after the first error");
        let (read, written) = text(&examples[0]);
        assert!(read.ends_with("? | 2 * 3 = 6 |"), "{read}");
        assert_eq!(written, "2 * 3 = 6 yes <eos>");
        let (read, written) = text(&examples[1]);
        assert!(read.ends_with("| 2 * 3 = 6 | 6 + 1 = 8 |"), "{read}");
        assert_eq!(written, "6 + 1 = 7 no <eos>");
        assert_eq!(verdict_piece("The answer is 7", true), "yes");
        for e in &examples {
            assert!(!e.ids.contains(&tok.token_id(crate::vocab::UNK).unwrap()));
        }
        // Without thinking: the same examples, the verdict alone.
        let direct = worked_examples(&tok, &sol, false).unwrap();
        assert_eq!(text(&direct[1]).0, text(&examples[1]).0);
        assert_eq!(text(&direct[1]).1, "no <eos>");

        assert_eq!(read_verdict("6 + 1 = 7 no"), Some(false));
        assert_eq!(read_verdict("yes"), Some(true));
        assert_eq!(read_verdict("6 + 1 ="), None);
        assert_eq!(read_verdict(""), None);
    }

    #[test]
    fn a_steps_score_is_the_share_of_its_verdicts_that_say_yes() {
        // Three answers a step: the first step all yes, the second one no in three, the third
        // nothing readable.
        let answers = [
            ["2 * 3 = 6 yes", "yes", "2 * 3 = 6 yes"],
            ["6 + 1 = 7 no", "yes", "yes"],
            ["6 + 1 =", "", "maybe"],
        ];
        let policy = ScriptedPolicy(|_: &str, prefix: &[&str], j: usize| {
            answers[prefix.len() - 1][j]
                .split(' ')
                .map(String::from)
                .collect::<Vec<_>>()
        });
        let judge = WorkedJudge {
            policy: &policy,
            samples: 3,
            seed: 1,
            think: true,
            likelihood: false,
        };
        let input = ScoreInput {
            problem_id: "p",
            question: "q ?",
            steps: vec!["2 * 3 = 6", "6 + 1 = 8", "The answer is 8"],
            partial: false,
        };
        let scored = judge.score(std::slice::from_ref(&input)).unwrap();
        assert_eq!(scored.scores, vec![vec![1.0, 2.0 / 3.0, 0.5]]);

        // Weighed: each readable verdict counts as P(yes) / (P(yes) + P(no)) after the working
        // the judge wrote before it; here the judge leans to `yes` (log-odds 2) after a working
        // that ends as the step does, to `no` (log-odds -1) otherwise.
        struct Weighing<'p>(&'p dyn Policy);
        impl Policy for Weighing<'_> {
            fn continue_from(&self, q: &str, p: &[&str], n: usize, u: Until, s: u64) -> Result<Vec<Continuation>> {
                self.0.continue_from(q, p, n, u, s)
            }
            fn logprobs_after(&self, asks: &[NextOptions<'_>], end: bool) -> Result<Option<Vec<Vec<f64>>>> {
                assert!(end);
                let weigh = |a: &NextOptions| {
                    assert_eq!(a.options.len(), 2);
                    let working = a.options[0].strip_suffix(RIGHT).unwrap().trim();
                    assert_eq!(a.options[1], format!("{working} {WRONG}").trim());
                    let odds = if a.prefix.last().unwrap().starts_with(working) {
                        2.0
                    } else {
                        -1.0
                    };
                    vec![odds - 5.0, -5.0]
                };
                Ok(Some(asks.iter().map(weigh).collect()))
            }
        }
        let sigmoid = |x: f32| 1.0 / (1.0 + (-x).exp());
        let weighed = WorkedJudge {
            policy: &Weighing(&policy),
            likelihood: true,
            ..judge
        };
        let scored = weighed.score(std::slice::from_ref(&input)).unwrap();
        // Step 0: `2 * 3 = 6 yes` (working as the step), `yes` (no working: as the step too),
        // `2 * 3 = 6 yes`. Step 1: `6 + 1 = 7 no` (not the step), then `yes` twice (empty).
        let want = [sigmoid(2.0), (sigmoid(-1.0) + 2.0 * sigmoid(2.0)) / 3.0, 0.5];
        for (got, want) in scored.scores[0].iter().zip(want) {
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
        // Without thinking nothing is sampled: one weighing a step, no working.
        let direct = WorkedJudge {
            think: false,
            ..weighed
        };
        let scored = direct.score(std::slice::from_ref(&input)).unwrap();
        assert_eq!(scored.tokens, 0);
        assert!(scored.scores[0].iter().all(|&s| (s - sigmoid(2.0)).abs() < 1e-6));
    }
}
