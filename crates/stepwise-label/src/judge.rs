//! An LLM judge as an annotator: any [`Policy`] (a local checkpoint or a served model) is asked
//! for the index of the earliest wrong step of a solution — `-1` when every step is right —
//! several times; the most frequent answer wins. Steps before the chosen index are labelled good,
//! it and every later step bad. An answer that cannot be read (not an integer, out of range) is
//! no verdict and does not vote; when no sample gives a verdict the solution is left unlabelled
//! (and reported so in `meta`).
//!
//! How the question is put and the answer read is a [`JudgeFormat`]: [`ProcessBenchCritique`]
//! (ProcessBench's critique prompt, the answer in `\boxed{k}`) for instruct models, and
//! [`IndexAnswer`] (the solution as the policy's own steps, the answer a bare index) or
//! [`QuoteAnswer`] (the same, the answer the first wrong step copied out) for a judge fine-tuned
//! to answer right after a solution, as the lab's generative verifier is.

use anyhow::{Context, Result};
use std::collections::BTreeMap;
use stepwise_core::seams::{Annotator, Done, NextOptions, Policy, ScoreInput, Scored, Spent, StepScorer, Until};
use stepwise_core::{Provenance, Solution};

/// ProcessBench's critique prompt (Zheng et al. 2024) for `question` and its `steps`.
pub fn critique_prompt(question: &str, steps: &[String]) -> String {
    let paragraphs: String = steps
        .iter()
        .enumerate()
        .map(|(i, s)| format!("<paragraph_{i}>\n{s}\n</paragraph_{i}>\n\n"))
        .collect();
    format!(
        "The following is a math problem and a solution (split into paragraphs, enclosed with tags and indexed from 0):\n\n\
[Math Problem]\n\n{question}\n\n[Solution]\n\n{paragraphs}\
Your task is to review and critique the solution paragraph by paragraph. Once you identify an error in a paragraph, \
return the index of the paragraph where the earliest error occurs. Otherwise, return the index of -1 (which typically \
denotes \"not found\").\n\nPlease put your final answer (i.e., the index) in \\boxed{{}}."
    )
}

/// The judge's verdict in `answer` for a solution of `steps` steps: `Some(None)` for "no error"
/// (`\boxed{-1}`), `Some(Some(k))` for "the first error is paragraph k", `None` when the answer
/// gives no readable verdict (the last `\boxed{}` decides).
pub fn parse_verdict(answer: &str, steps: usize) -> Option<Option<usize>> {
    let start = answer.rfind("\\boxed{")? + "\\boxed{".len();
    let end = start + answer[start..].find('}')?;
    let inner = answer[start..end].trim().trim_start_matches("paragraph_").trim();
    index_verdict(inner, steps)
}

/// How a judge is asked about a solution and how its answer is read.
pub trait JudgeFormat: Sync {
    /// The prompt and the pieces after it ([`Policy::continue_from`]'s first two arguments) that
    /// ask about `steps` of a solution to `question`.
    fn ask(&self, question: &str, steps: &[String]) -> (String, Vec<String>);
    /// The verdict in `answer` on a solution with these `steps`: `Some(None)` for "no error",
    /// `Some(Some(k))` for "the first error is step k", `None` when it gives no readable verdict.
    fn read(&self, answer: &str, steps: &[String]) -> Option<Option<usize>>;
    /// The answer that gives `first` as the verdict on `steps` (what [`JudgeFormat::read`]
    /// reads back as `first`), for weighing the verdicts by their likelihood; `None` where the
    /// answer is not one fixed text (a critique, a chain of the judge's own working).
    fn answer_for(&self, steps: &[String], first: Option<usize>) -> Option<String> {
        let _ = (steps, first);
        None
    }
}

/// ProcessBench's critique prompt ([`critique_prompt`]) as one prompt; the answer's last
/// `\boxed{}` holds the index ([`parse_verdict`]). For instruct models (local or served).
pub struct ProcessBenchCritique;

impl JudgeFormat for ProcessBenchCritique {
    fn ask(&self, question: &str, steps: &[String]) -> (String, Vec<String>) {
        (critique_prompt(question, steps), Vec::new())
    }

    fn read(&self, answer: &str, steps: &[String]) -> Option<Option<usize>> {
        parse_verdict(answer, steps.len())
    }
}

/// The question and the steps as the policy's own prompt and pieces (the layout the policy was
/// trained on), the answer a bare index: `k` for "the first error is step k", `-1` for none
/// (whitespace inside is ignored, so a word-level vocabulary may write `- 1`). For a judge
/// fine-tuned to write that index right after a solution, like the lab's generative verifier.
pub struct IndexAnswer;

impl IndexAnswer {
    /// The answer a judge of this format should write for a solution whose first error is
    /// `first` (its training target), with tokens separated by spaces.
    pub fn answer(first: Option<usize>) -> String {
        first.map_or_else(|| "- 1".to_string(), |k| k.to_string())
    }
}

impl JudgeFormat for IndexAnswer {
    fn ask(&self, question: &str, steps: &[String]) -> (String, Vec<String>) {
        (question.to_string(), steps.to_vec())
    }

    fn read(&self, answer: &str, steps: &[String]) -> Option<Option<usize>> {
        let compact: String = answer.split_whitespace().collect();
        index_verdict(&compact, steps.len())
    }

    fn answer_for(&self, _steps: &[String], first: Option<usize>) -> Option<String> {
        Some(IndexAnswer::answer(first))
    }
}

/// Like [`IndexAnswer`], but the answer quotes the first wrong step itself (its text, compared
/// with whitespace ignored; the first step with that text is meant) instead of counting to its
/// index, or is `-1` for none. Copying a step is what a small language model does well; counting
/// steps is not (the lab's judge; see the README).
pub struct QuoteAnswer;

impl QuoteAnswer {
    /// The answer a judge of this format should write for a solution with these `steps` whose
    /// first error is `first` (its training target).
    pub fn answer(steps: &[String], first: Option<usize>) -> String {
        first.map_or_else(|| IndexAnswer::answer(None), |k| steps[k].clone())
    }
}

impl JudgeFormat for QuoteAnswer {
    fn ask(&self, question: &str, steps: &[String]) -> (String, Vec<String>) {
        IndexAnswer.ask(question, steps)
    }

    fn read(&self, answer: &str, steps: &[String]) -> Option<Option<usize>> {
        let compact = |t: &str| t.split_whitespace().collect::<String>();
        let said = compact(answer);
        match said.as_str() {
            "-1" => Some(None),
            "" => None,
            _ => steps.iter().position(|s| compact(s) == said).map(Some),
        }
    }

    fn answer_for(&self, steps: &[String], first: Option<usize>) -> Option<String> {
        Some(QuoteAnswer::answer(steps, first))
    }
}

/// `-1` → no error, `0 ≤ k < steps` → step k, anything else → no verdict.
fn index_verdict(text: &str, steps: usize) -> Option<Option<usize>> {
    match text.parse::<i64>().ok()? {
        -1 => Some(None),
        k if k >= 0 && (k as usize) < steps => Some(Some(k as usize)),
        _ => None,
    }
}

/// Each verdict on a solution (`None`: no error; `Some(k)`: the first error at step k) with the
/// probability the judge gives it.
pub type Weighed = Vec<(Option<usize>, f64)>;

/// The judge annotator.
pub struct Judge<'a> {
    /// The model asked; its continuation of the critique prompt is the answer.
    pub policy: &'a dyn Policy,
    /// Answers sampled per solution; the most frequent verdict wins (ties: the earliest error).
    pub samples: usize,
    /// Base seed (each solution derives its own).
    pub seed: u64,
    /// How the question is put and the answer read.
    pub format: &'a dyn JudgeFormat,
    /// Weigh every verdict by the probability the judge gives its answer instead of sampling
    /// (GenRM's `P(yes)`): no answer is written, and `samples` is not read. Needs a format
    /// whose answers are fixed texts ([`JudgeFormat::answer_for`]) and a policy that gives
    /// log-probabilities ([`Policy::logprobs_after`]: a local engine).
    pub likelihood: bool,
}

impl Judge<'_> {
    /// Every readable verdict of the sampled answers on `steps` (`None`: no error; `Some(k)`:
    /// the first error at step `k`), and the cost; `key` names the solution in its seed.
    pub fn verdicts(&self, question: &str, steps: &[String], key: &str) -> Result<(Vec<Option<usize>>, Spent)> {
        let (prompt, pieces) = self.format.ask(question, steps);
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let answers =
            self.policy
                .continue_from(&prompt, &pieces, self.samples.max(1), Until::End, self.seed_of(key))?;
        Ok(self.read_answers(&answers, steps))
    }

    /// The seed of the answers on the solution `key` names.
    fn seed_of(&self, key: &str) -> u64 {
        crate::montecarlo::seed_for(self.seed, key, usize::MAX)
    }

    /// The readable verdicts of `answers` on `steps`, and their cost.
    fn read_answers(
        &self,
        answers: &[stepwise_core::seams::Continuation],
        steps: &[String],
    ) -> (Vec<Option<usize>>, Spent) {
        let spent = Spent {
            rollouts: answers.len(),
            tokens: answers.iter().map(|a| a.tokens).sum(),
            env_steps: 0,
        };
        let verdicts = answers
            .iter()
            .filter_map(|a| self.format.read(&a.text, steps))
            .collect();
        (verdicts, spent)
    }

    /// For each solution `(question, steps)`, each verdict on it (`None`, then the first error
    /// at step 0, 1, …) with the probability the judge gives its answer, normalised over the
    /// verdicts: forward passes, nothing sampled. A verdict whose answer is the same text as an
    /// earlier one's (a quoted step that occurs twice) is read as the earlier and gets no weight
    /// of its own.
    pub fn verdict_probabilities(&self, solutions: &[(&str, &[String])]) -> Result<Vec<Weighed>> {
        struct Asked {
            prompt: String,
            pieces: Vec<String>,
            verdicts: Vec<Option<usize>>,
            answers: Vec<String>,
        }
        let asked: Vec<Asked> = solutions
            .iter()
            .map(|&(question, steps)| {
                let mut verdicts = Vec::new();
                let mut answers: Vec<String> = Vec::new();
                for v in std::iter::once(None).chain((0..steps.len()).map(Some)) {
                    let answer = self.format.answer_for(steps, v).context(
                        "this judge format has no fixed answers to weigh (a critique or a chain): score it with sampled verdicts",
                    )?;
                    if !answers.contains(&answer) {
                        verdicts.push(v);
                        answers.push(answer);
                    }
                }
                let (prompt, pieces) = self.format.ask(question, steps);
                Ok(Asked {
                    prompt,
                    pieces,
                    verdicts,
                    answers,
                })
            })
            .collect::<Result<_>>()?;
        let pieces: Vec<Vec<&str>> = asked
            .iter()
            .map(|a| a.pieces.iter().map(String::as_str).collect())
            .collect();
        let options: Vec<Vec<&str>> = asked
            .iter()
            .map(|a| a.answers.iter().map(String::as_str).collect())
            .collect();
        let asks: Vec<NextOptions> = asked
            .iter()
            .zip(&pieces)
            .zip(&options)
            .map(|((a, prefix), options)| NextOptions {
                question: &a.prompt,
                prefix,
                options,
            })
            .collect();
        let logprobs = self
            .policy
            .logprobs_after(&asks, true)?
            .context("the judge's model gives no log-probabilities of its answers (a Python policy, or a chat prompt served without its tokenizer): score it with sampled verdicts")?;
        Ok(asked
            .iter()
            .zip(logprobs)
            .map(|(a, lps)| {
                let top = lps.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = lps.iter().map(|lp| (lp - top).exp()).collect();
                let total: f64 = weights.iter().sum();
                a.verdicts.iter().zip(weights).map(|(&v, w)| (v, w / total)).collect()
            })
            .collect())
    }

    /// The judge's first error (`Some(None)`: no error; `None`: no sample gave a verdict), the
    /// verdicts given, and the cost: the most frequent sampled verdict, or with `likelihood` the
    /// likeliest (one verdict given, nothing written).
    pub fn first_error(&self, sol: &Solution) -> Result<(Option<Option<usize>>, usize, Spent)> {
        if self.likelihood {
            let weighed = self.verdict_probabilities(&[(&sol.question, &sol.step_strings())])?;
            return Ok(by_likelihood(weighed.into_iter().next().unwrap_or_default()));
        }
        let (verdicts, spent) = self.verdicts(&sol.question, &sol.step_strings(), &sol.id)?;
        let (best, given) = vote(verdicts);
        Ok((best, given, spent))
    }
}

/// Most weight; among equals the earliest error first (`Some(k)` sorts after `None`, so "no
/// error" compares as the latest).
fn tie_key(v: &Option<usize>) -> usize {
    v.map_or(usize::MAX, |k| k)
}

/// The verdict with the most weight (ties: the earliest error).
fn likeliest(weighed: Weighed) -> Option<Option<usize>> {
    (weighed.into_iter())
        .max_by(|(va, pa), (vb, pb)| pa.total_cmp(pb).then(tie_key(vb).cmp(&tie_key(va))))
        .map(|(v, _)| v)
}

/// A solution's first error by likelihood: the likeliest of its `weighed` verdicts, one verdict
/// given, nothing written.
fn by_likelihood(weighed: Weighed) -> (Option<Option<usize>>, usize, Spent) {
    (likeliest(weighed), 1, Spent::default())
}

/// The most frequent of `verdicts` (ties: the earliest error), and how many were given.
fn vote(verdicts: Vec<Option<usize>>) -> (Option<Option<usize>>, usize) {
    let mut votes: BTreeMap<Option<usize>, usize> = BTreeMap::new();
    for v in verdicts {
        *votes.entry(v).or_default() += 1;
    }
    let given = votes.values().sum();
    let best = (votes.iter())
        .max_by(|(va, na), (vb, nb)| na.cmp(nb).then(tie_key(vb).cmp(&tie_key(va))))
        .map(|(v, _)| *v);
    (best, given)
}

/// `sol` labelled by the judge's first error `verdict` (`None`: no verdict, no labels; the
/// labels it came with are not the judge's), with the verdicts `given` in `meta`.
fn labelled(sol: &Solution, verdict: Option<Option<usize>>, given: usize, spent: Spent) -> (Solution, Spent) {
    let mut out = sol.clone();
    out.meta.insert("judge_verdicts".into(), given.into());
    match verdict {
        Some(first) => crate::label_by_first_error(&mut out, first, Provenance::Judge),
        None => out.steps.iter_mut().for_each(|st| st.label = None),
    }
    (out, spent)
}

/// The judge as a verifier (a generative one: it writes its verdict): a step's score is the
/// share of its readable verdicts that put the first error after the step (or find none); 0.5
/// where no sample gives a verdict. What it costs is the tokens its answers take. With
/// `likelihood`, the probability it gives those verdicts instead (nothing written).
impl StepScorer for Judge<'_> {
    fn score(&self, batch: &[ScoreInput<'_>]) -> Result<Scored> {
        let mut scores = Vec::with_capacity(batch.len());
        let mut tokens = 0;
        if self.likelihood {
            return self.weigh(batch);
        }
        for input in batch {
            let steps: Vec<String> = input.steps.iter().map(|s| s.to_string()).collect();
            let key = format!("{}\u{1f}{}", input.problem_id, steps.join("\u{1f}"));
            let (verdicts, spent) = self.verdicts(input.question, &steps, &key)?;
            tokens += spent.tokens;
            scores.push(
                (0..steps.len())
                    .map(|k| match verdicts.len() {
                        0 => 0.5,
                        n => verdicts.iter().filter(|v| v.is_none_or(|e| e > k)).count() as f32 / n as f32,
                    })
                    .collect(),
            );
        }
        Ok(Scored { scores, tokens })
    }
}

impl Judge<'_> {
    /// The batch scored by likelihood: each step's score is the probability of the verdicts
    /// that put the first error after it (or find none).
    fn weigh(&self, batch: &[ScoreInput<'_>]) -> Result<Scored> {
        let steps: Vec<Vec<String>> = batch
            .iter()
            .map(|input| input.steps.iter().map(|s| s.to_string()).collect())
            .collect();
        let solutions: Vec<(&str, &[String])> = batch.iter().zip(&steps).map(|(i, s)| (i.question, &s[..])).collect();
        let weighed = self.verdict_probabilities(&solutions)?;
        let scores = weighed
            .iter()
            .zip(&steps)
            .map(|(w, steps)| {
                let later =
                    |k: usize| -> f64 { w.iter().filter(|(v, _)| v.is_none_or(|e| e > k)).map(|(_, p)| p).sum() };
                (0..steps.len()).map(|k| later(k) as f32).collect()
            })
            .collect();
        Ok(Scored { scores, tokens: 0 })
    }
}

impl Annotator for Judge<'_> {
    fn name(&self) -> &str {
        "judge"
    }

    fn annotate(&self, sol: &Solution) -> Result<(Solution, Spent)> {
        let (verdict, given, spent) = self.first_error(sol)?;
        Ok(labelled(sol, verdict, given, spent))
    }

    /// Many solutions' answers sampled in one call where the policy batches (`together`).
    fn annotate_together(&self, sols: &[Solution], done: &mut Done<'_>) -> Option<Result<()>> {
        self.judge_together(sols, done)
    }
}

mod together;

#[cfg(test)]
mod tests {
    use super::*;
    use stepwise_core::testing::ScriptedPolicy;

    #[test]
    fn reads_processbench_style_answers_and_refuses_the_rest() {
        let cases: [(&str, Option<Option<usize>>); 12] = [
            ("The error is in paragraph 2. \\boxed{2}", Some(Some(2))),
            ("All correct. \\boxed{-1}", Some(None)),
            ("first \\boxed{0} then on reflection \\boxed{1}", Some(Some(1))),
            ("\\boxed{ 3 }", Some(Some(3))),
            ("\\boxed{paragraph_1}", Some(Some(1))),
            ("no box at all: 2", None),
            ("\\boxed{two}", None),
            ("\\boxed{7}", None),
            ("\\boxed{-2}", None),
            ("\\boxed{1", None),
            ("", None),
            ("\\boxed{99999999999999999999999}", None),
        ];
        for (answer, want) in cases {
            assert_eq!(parse_verdict(answer, 4), want, "{answer:?}");
        }
    }

    #[test]
    fn the_index_format_asks_with_the_steps_and_reads_a_bare_index() {
        let steps = ["1 + 1 = 2".to_string(), "2 * 3 = 7".to_string()];
        let (prompt, pieces) = IndexAnswer.ask("q", &steps);
        assert_eq!((prompt.as_str(), pieces.as_slice()), ("q", &steps[..]));
        for (answer, want) in [
            ("1", Some(Some(1))),
            (" 0 ", Some(Some(0))),
            ("- 1", Some(None)),
            ("-1", Some(None)),
            ("2", None),
            ("- 2", None),
            ("yes", None),
            ("", None),
            ("\\boxed{1}", None),
        ] {
            assert_eq!(IndexAnswer.read(answer, &steps), want, "{answer:?}");
        }
        for first in [None, Some(0), Some(1)] {
            assert_eq!(IndexAnswer.read(&IndexAnswer::answer(first), &steps), Some(first));
        }
        // The judge sees the policy's layout: the question as the prompt, the steps as pieces.
        fn echo(q: &str, p: &[&str], _j: usize) -> Vec<String> {
            vec![if q == "q" && p.len() == 2 { "1" } else { "- 1" }.to_string()]
        }
        let sol = Solution {
            id: "s".into(),
            question: "q".into(),
            steps: steps.iter().map(|t| stepwise_core::Step::new(t.as_str())).collect(),
            ..Default::default()
        };
        let judge = Judge {
            policy: &ScriptedPolicy(echo),
            samples: 3,
            seed: 0,
            format: &IndexAnswer,
            likelihood: false,
        };
        assert_eq!(judge.first_error(&sol).unwrap().0, Some(Some(1)));
    }

    #[test]
    fn the_quote_format_reads_a_copied_step_and_refuses_the_rest() {
        let steps = [
            "1 + 1 = 2".to_string(),
            "2 * 3 = 7".to_string(),
            "2 * 3 = 7".to_string(),
        ];
        assert_eq!(QuoteAnswer.ask("q", &steps), IndexAnswer.ask("q", &steps));
        for (answer, want) in [
            ("2 * 3 = 7", Some(Some(1))),
            (" 2  *  3 = 7 ", Some(Some(1))),
            ("1 + 1 = 2", Some(Some(0))),
            ("- 1", Some(None)),
            ("-1", Some(None)),
            ("2 * 3 = 6", None),
            ("1", None),
            ("", None),
        ] {
            assert_eq!(QuoteAnswer.read(answer, &steps), want, "{answer:?}");
        }
        for first in [None, Some(0), Some(1)] {
            assert_eq!(
                QuoteAnswer.read(&QuoteAnswer::answer(&steps, first), &steps),
                Some(first)
            );
        }
    }

    #[test]
    fn the_vote_labels_steps_and_no_verdict_leaves_them_unlabelled() {
        let sol = Solution {
            id: "s".into(),
            question: "q".into(),
            steps: ["a", "b", "c"].iter().map(|t| stepwise_core::Step::new(*t)).collect(),
            ..Default::default()
        };
        // Samples 0, 1, 2 say 1, 1, -1 (with garbage between): paragraph 1 wins.
        fn answers(_q: &str, _p: &[&str], j: usize) -> Vec<String> {
            vec![["\\boxed{1}", "hmm \\boxed{1}", "\\boxed{-1}", "\\boxed{x}"][j % 4].to_string()]
        }
        let judge = Judge {
            policy: &ScriptedPolicy(answers),
            samples: 4,
            seed: 0,
            format: &ProcessBenchCritique,
            likelihood: false,
        };
        let (l, spent) = judge.annotate(&sol).unwrap();
        let good: Vec<bool> = l.steps.iter().map(|s| s.label.as_ref().unwrap().is_good()).collect();
        assert_eq!(good, [true, false, false]);
        assert_eq!(spent.rollouts, 4);
        assert_eq!(l.meta["judge_verdicts"], 3);
        fn mute(_q: &str, _p: &[&str], _j: usize) -> Vec<String> {
            vec!["I cannot tell.".to_string()]
        }
        let silent = Judge {
            policy: &ScriptedPolicy(mute),
            samples: 2,
            seed: 0,
            format: &ProcessBenchCritique,
            likelihood: false,
        };
        let mut labelled = sol.clone();
        labelled.steps[0].label = Some(stepwise_core::StepLabel::from_bool(true, Provenance::Human));
        let (l, _) = silent.annotate(&labelled).unwrap();
        assert!(l.steps.iter().all(|s| s.label.is_none()), "no verdict, no labels");
        assert_eq!(l.meta["judge_verdicts"], 0);

        // As a verifier: each step's share of the readable verdicts that find it before the
        // first error (1, 1 and -1 read; `x` is none).
        let input = ScoreInput::of(&sol);
        let scored = judge.score(std::slice::from_ref(&input)).unwrap();
        let third = 1.0 / 3.0;
        for (got, want) in scored.scores[0].iter().zip([1.0, third, third]) {
            assert!((got - want).abs() < 1e-6, "{:?}", scored.scores[0]);
        }
        assert_eq!(silent.score(&[input]).unwrap().scores[0], [0.5, 0.5, 0.5]);
    }

    /// A judge whose answers have fixed weights: `-1` (no error) 0.5, step 0 0.1, step 1 0.3,
    /// step 2 0.1 (log-probabilities off by a constant, as a model's are before normalising).
    pub(super) struct Weights;

    impl Policy for Weights {
        fn continue_from(
            &self,
            _: &str,
            _: &[&str],
            _: usize,
            _: Until,
            _: u64,
        ) -> Result<Vec<stepwise_core::seams::Continuation>> {
            panic!("weighing samples nothing")
        }

        fn logprobs_after(&self, asks: &[NextOptions<'_>], end: bool) -> Result<Option<Vec<Vec<f64>>>> {
            assert!(end, "each answer ends");
            let weigh = |a: &NextOptions| {
                assert_eq!((a.question, a.prefix), ("q", &["a", "b", "a"][..]));
                a.options
                    .iter()
                    .map(|o| match *o {
                        "- 1" => 0.5f64,
                        "0" | "a" | "2" => 0.1,
                        "1" | "b" => 0.3,
                        other => panic!("option {other}"),
                    })
                    .map(|p| p.ln() - 3.0)
                    .collect()
            };
            Ok(Some(asks.iter().map(weigh).collect()))
        }
    }

    #[test]
    fn likelihood_weighs_every_verdict_by_the_probability_of_its_answer() {
        let sol = Solution {
            id: "s".into(),
            question: "q".into(),
            steps: ["a", "b", "a"].iter().map(|t| stepwise_core::Step::new(*t)).collect(),
            ..Default::default()
        };
        let judge = Judge {
            policy: &Weights,
            samples: 4,
            seed: 0,
            format: &IndexAnswer,
            likelihood: true,
        };
        // Step k scores P(no error) + P(first error after k).
        let scored = judge.score(&[ScoreInput::of(&sol), ScoreInput::of(&sol)]).unwrap();
        assert_eq!(scored.tokens, 0, "nothing written");
        assert_eq!(scored.scores[0], scored.scores[1], "a batch weighed at once");
        for (got, want) in scored.scores[0].iter().zip([0.9, 0.6, 0.5]) {
            assert!((got - want).abs() < 1e-6, "{:?}", scored.scores[0]);
        }
        // As an annotator: the likeliest verdict, no error, so every step good.
        let (l, spent) = judge.annotate(&sol).unwrap();
        assert!(l.steps.iter().all(|s| s.label.as_ref().unwrap().is_good()));
        assert_eq!((spent.rollouts, l.meta["judge_verdicts"].as_u64()), (0, Some(1)));
        // Quoting: step 2 reads as step 0 (the same text), so only `- 1`, `a` and `b` are
        // weighed: 0.5, 0.1, 0.3 of 0.9.
        let quoting = Judge {
            format: &QuoteAnswer,
            ..judge
        };
        let weighed = quoting
            .verdict_probabilities(&[("q", &sol.step_strings())])
            .unwrap()
            .remove(0);
        let want = [(None, 5.0 / 9.0), (Some(0), 1.0 / 9.0), (Some(1), 3.0 / 9.0)];
        assert_eq!(weighed.len(), 3);
        for ((v, p), (wv, wp)) in weighed.iter().zip(want) {
            assert!(*v == wv && (p - wp).abs() < 1e-9, "{weighed:?}");
        }
        // A critique has no fixed answers, and a model without log-probabilities cannot weigh.
        let critique = Judge {
            format: &ProcessBenchCritique,
            ..judge
        };
        let err = critique.score(&[ScoreInput::of(&sol)]).unwrap_err().to_string();
        assert!(err.contains("no fixed answers"), "{err}");
        let unweighable = Judge {
            policy: &ScriptedPolicy(|_: &str, _: &[&str], _: usize| vec!["1".to_string()]),
            ..judge
        };
        let err = unweighable.annotate(&sol).unwrap_err().to_string();
        assert!(err.contains("no log-probabilities"), "{err}");
    }
}
