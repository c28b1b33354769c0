//! The lab's LLM judge: a generative verifier. The verifiers' starting model (their own base
//! LM, or the policy when there is none) is fine-tuned (next-token loss) to write, right after a
//! solution laid out as it was trained on (`question | step | … |`), the index of the first wrong
//! step or `- 1` for none ([`stepwise_label::judge::IndexAnswer`]). Its training budget is a
//! small "human" one: the oracle's first errors on `judge_solutions` of the samples drawn for
//! labelling (the lab's PRM800K), spread evenly over them. It then labels every sample through
//! the same [`stepwise_label::Judge`] annotator that asks a served model ProcessBench's critique
//! question, so the lab measures what a judge adds to Monte Carlo labels (consensus filtering).
//! More judges are trained alike on the same labels to verify beside it ([`JudgeKind`]): one
//! that reads a calculator's values ([`WithCalculator`]), one that writes a verification chain
//! before its verdicts ([`ChainAnswer`]), and one asked at each step, with and without working
//! the step again first ([`super::worked`]).

use super::annotate::label_stage;
use super::policy::lab_policy;
use super::train_stage;
use crate::preset::{JudgeAnswer, Preset};
use crate::vocab::{EOS, SEP};
use anyhow::Result;
use std::path::Path;
use stepwise_core::seams::Spent;
use stepwise_core::Solution;
use stepwise_label::consensus::keep_if_agreeing;
use stepwise_label::judge::JudgeFormat;
use stepwise_label::Judge;
use stepwise_model::layout::encode_steps;
use stepwise_model::train::{Example, Objective};
use stepwise_model::{EnginePolicy, Model, ModelConfig, Tokenizer};

/// At most `n` of `sols`, evenly spaced (so they come from as many problems as possible).
pub fn human_budget(sols: &[Solution], n: usize) -> Vec<&Solution> {
    if n == 0 || sols.is_empty() {
        return Vec::new();
    }
    let n = n.min(sols.len());
    (0..n).map(|i| &sols[i * sols.len() / n]).collect()
}

/// `step` as a judge with a calculator reads it: an equation step with the calculator's value of
/// its left side written after it (`36 - 13 = 24 = 23`); any other step, or a value the lab's
/// vocabulary has no word for (below 0 or above [`crate::vocab::MAX_NUMBER`]), as it is.
pub fn with_calculator(step: &str) -> String {
    match crate::task::calculator(step) {
        Some(v) if (0..=crate::vocab::MAX_NUMBER as i64).contains(&v) => format!("{} = {v}", step.trim_end()),
        _ => step.to_string(),
    }
}

/// Calls of the calculator in `steps` (its equation steps).
pub fn calculator_calls(steps: &[String]) -> usize {
    steps.iter().filter(|s| crate::task::calculator(s).is_some()).count()
}

/// A judge format whose solutions show the calculator's value after each equation step
/// ([`with_calculator`]); asked and read as the format it wraps.
pub struct WithCalculator(pub &'static dyn JudgeFormat);

impl JudgeFormat for WithCalculator {
    fn ask(&self, question: &str, steps: &[String]) -> (String, Vec<String>) {
        let shown: Vec<String> = steps.iter().map(|s| with_calculator(s)).collect();
        self.0.ask(question, &shown)
    }

    fn read(&self, answer: &str, steps: &[String]) -> Option<Option<usize>> {
        let shown: Vec<String> = steps.iter().map(|s| with_calculator(s)).collect();
        self.0.read(answer, &shown)
    }

    fn answer_for(&self, steps: &[String], first: Option<usize>) -> Option<String> {
        let shown: Vec<String> = steps.iter().map(|s| with_calculator(s)).collect();
        self.0.answer_for(&shown, first)
    }
}

/// Which judge: what it reads and writes.
#[derive(Debug, Clone, Copy)]
pub enum JudgeKind {
    /// It reads the whole solution and writes `answer` after it; with `calculator`, each
    /// equation step it reads shows the calculator's value ([`with_calculator`]).
    Whole {
        /// What it writes (an index, a quoted step, or a chain of verdicts).
        answer: JudgeAnswer,
        /// It reads the calculator's values.
        calculator: bool,
    },
    /// It is asked after each step and gives it a verdict, working the step again first with
    /// `think` ([`super::worked`]).
    EachStep {
        /// It works each equation step again before its verdict.
        think: bool,
    },
}

impl JudgeKind {
    /// The preset's judge, reading the steps as they are.
    pub fn of(p: &Preset) -> Self {
        JudgeKind::Whole {
            answer: p.judge.answer,
            calculator: false,
        }
    }

    /// How it is named in progress lines.
    fn what(self) -> &'static str {
        match self {
            JudgeKind::Whole { calculator: true, .. } => "judge (calculator)",
            JudgeKind::Whole {
                answer: JudgeAnswer::Chain,
                ..
            } => "judge (chain)",
            JudgeKind::Whole { .. } => "judge",
            JudgeKind::EachStep { think: true } => "judge (each step worked)",
            JudgeKind::EachStep { think: false } => "judge (each step)",
        }
    }
}

/// The format that asks a judge writing `answer` after a solution and reads it, with or
/// without the calculator's values.
fn format_of(answer: JudgeAnswer, calculator: bool) -> &'static dyn JudgeFormat {
    match calculator {
        true => match answer {
            JudgeAnswer::Index => &WithCalculator(&stepwise_label::judge::IndexAnswer),
            JudgeAnswer::Quote => &WithCalculator(&stepwise_label::judge::QuoteAnswer),
            JudgeAnswer::Chain => &WithCalculator(&ChainAnswer),
        },
        false => answer.format(),
    }
}

/// A judge's training examples for an oracle-labelled solution: one for a judge that reads
/// the whole solution ([`judge_example`]), one a step for the judge asked at each step
/// ([`super::worked::worked_examples`]).
fn judge_examples(tok: &Tokenizer, sol: &Solution, kind: JudgeKind) -> Result<Vec<Example>> {
    match kind {
        JudgeKind::Whole { answer, calculator } => Ok(vec![judge_example(tok, sol, answer, calculator)?]),
        JudgeKind::EachStep { think } => super::worked::worked_examples(tok, sol, think),
    }
}

/// The judge's training example for an oracle-labelled solution: the solution in the policy's
/// layout (each equation step with the calculator's value after it, for a judge with the
/// calculator), then what the judge writes for its first wrong step (`- 1` for none, or the
/// chain of verdicts) and `<eos>`; the loss covers the answer only.
pub fn judge_example(tok: &Tokenizer, sol: &Solution, answer: JudgeAnswer, calculator: bool) -> Result<Example> {
    let steps = sol.step_strings();
    let shown: Vec<String> = if calculator {
        steps.iter().map(|s| with_calculator(s)).collect()
    } else {
        steps
    };
    let refs: Vec<&str> = shown.iter().map(String::as_str).collect();
    let mut ids = encode_steps(tok, &sol.question, &refs, SEP, true)?.ids;
    let lm_from = ids.len();
    ids.extend(tok.encode(&answer.answer(&shown, sol.first_error()), false)?);
    ids.extend(tok.encode(EOS, false)?);
    Ok(Example {
        ids,
        lm_from,
        ..Default::default()
    })
}

/// A thinking judge's verdict on a right step (the lab's arithmetic vocabulary has both words:
/// its comparison questions are answered yes or no).
pub(crate) const RIGHT: &str = "yes";
/// A thinking judge's verdict on a wrong step.
pub(crate) const WRONG: &str = "no";

/// A judge that thinks before each verdict, ThinkPRM's form in the lab's vocabulary: after the
/// solution it goes through the steps in turn, works each equation step again (the left side
/// copied and its value computed: `36 - 13 = 23` for `36 - 13 = 24`) and gives the step its
/// verdict, `yes` or `no`; any other step gets its verdict alone (`verdict_piece`). The pieces
/// are separated by the step separator and the chain ends at the first `no` (`2 * 3 = 6 yes |
/// 6 + 1 = 7 no`). Read: the first piece ending in `no` is the first error; a `yes` ending a
/// piece for every step is none; a piece without a verdict, more pieces than steps or a chain
/// cut short gives no verdict.
pub struct ChainAnswer;

impl ChainAnswer {
    /// The chain a judge of this format should write for a solution with these `steps` whose
    /// first error is `first` (its training target), tokens separated by spaces.
    pub fn answer(steps: &[String], first: Option<usize>) -> String {
        let through = first.map_or(steps.len(), |k| k + 1);
        let pieces: Vec<String> = steps[..through.min(steps.len())]
            .iter()
            .enumerate()
            .map(|(k, step)| verdict_piece(step, Some(k) != first))
            .collect();
        pieces.join(&format!(" {SEP} "))
    }
}

/// What a thinking judge writes about `step`, whose verdict is `good`: an equation step worked
/// again, then `yes` or `no` (`6 + 1 = 7 no` for `6 + 1 = 8`); any other step its verdict
/// alone. (Two other forms set the stated value beside the worked one, `6 + 1 = 7 < 8 no` and
/// `6 + 1 = 8 > 7 no`; on seed 1 of the standard preset neither judge did better with them: the
/// lab's model copies the first number it wrote into the second place — see docs/lab.md.)
pub(crate) fn verdict_piece(step: &str, good: bool) -> String {
    let verdict = if good { RIGHT } else { WRONG };
    match worked_again(step) {
        Some(work) => format!("{work} {verdict}"),
        None => verdict.to_string(),
    }
}

/// An equation step's left side with the value it has (`36 - 13 = 24` → `36 - 13 = 23`), when
/// that value has a word in the lab's vocabulary; `None` for any other step.
fn worked_again(step: &str) -> Option<String> {
    let value = crate::task::calculator(step)?;
    let (left, _) = step.rsplit_once('=')?;
    (0..=crate::vocab::MAX_NUMBER as i64)
        .contains(&value)
        .then(|| format!("{} = {value}", left.trim()))
}

impl JudgeFormat for ChainAnswer {
    fn ask(&self, question: &str, steps: &[String]) -> (String, Vec<String>) {
        stepwise_label::judge::IndexAnswer.ask(question, steps)
    }

    fn read(&self, answer: &str, steps: &[String]) -> Option<Option<usize>> {
        let pieces: Vec<&str> = answer.split(SEP).collect();
        if pieces.len() > steps.len() {
            return None;
        }
        for (k, piece) in pieces.iter().enumerate() {
            match piece.split_whitespace().last() {
                Some(WRONG) => return Some(Some(k)),
                Some(RIGHT) => {}
                _ => return None,
            }
        }
        (pieces.len() == steps.len()).then_some(None)
    }
}

/// A labelled solution and each of its shorter prefixes (one step or more), labels kept: a
/// prefix that stops before the first error has none, one that reaches it has it at the same
/// step.
pub fn prefixes(sol: &Solution) -> Vec<Solution> {
    (1..=sol.steps.len())
        .rev()
        .map(|n| Solution {
            steps: sol.steps[..n].to_vec(),
            ..sol.clone()
        })
        .collect()
}

/// Train (or reuse) the judge in `dir` from the LM in `base_dir` (the policy, or the verifiers'
/// base), on the oracle's verdicts for `human` (oracle-labelled solutions), writing and reading
/// as `kind` says; every kind is trained alike (same seed, same solutions, steps and learning
/// rate), so the judges differ only in what they read and write.
pub fn train_judge(
    dir: &Path,
    base_dir: &Path,
    p: &Preset,
    seed: u64,
    human: &[&Solution],
    tok: &Tokenizer,
    kind: JudgeKind,
) -> Result<Model> {
    let with_prefixes: Vec<Solution>;
    let human: Vec<&Solution> = if p.judge.prefixes {
        with_prefixes = human.iter().flat_map(|s| prefixes(s)).collect();
        with_prefixes.iter().collect()
    } else {
        human.to_vec()
    };
    let mut examples = Vec::new();
    for s in &human {
        examples.extend(judge_examples(tok, s, kind)?);
    }
    let tc = super::fine_tuning(p.judge.lr, p.judge.steps, seed ^ 7);
    let train_seed = tc.seed;
    train_stage(
        dir,
        p.domain,
        &format!("training {}", kind.what()),
        |varmap, dev| {
            let config = ModelConfig::from_dir(base_dir)?;
            Model::load_trainable(base_dir, config, varmap, dev, train_seed)
        },
        &examples,
        &[],
        Objective::Lm,
        tc,
    )
}

/// What the judge stage gives.
pub struct Judged {
    /// Its labels of the samples (a sample it gave no verdict on stays unlabelled).
    pub labels: Vec<Solution>,
    /// Its answers sampled and their tokens.
    pub spent: Spent,
    /// The MC labels kept where the judge puts the first error on the same step.
    pub consensus: Vec<Solution>,
    /// The oracle-labelled samples it was trained on (its "human" budget).
    pub human: Vec<Solution>,
    /// The trained judge.
    pub model: Model,
}

/// Train (or reuse) the judge in `out/judge` from the verifiers' starting model
/// ([`Preset::verifier_start_dir`]) on `p.judge.solutions` of the oracle-labelled samples, label the samples `label_sols` with it (resumable, `out/labels_judge.jsonl`), and
/// filter the MC labels `mc` (one per sample) by agreement with it (the Qwen2.5-Math-PRM
/// recipe).
pub fn judge_stage(
    out: &Path,
    p: &Preset,
    seed: u64,
    tok: &Tokenizer,
    label_sols: &[Solution],
    oracle: &[Solution],
    mc: &[Solution],
) -> Result<Judged> {
    let human = human_budget(oracle, p.judge.solutions);
    let kind = JudgeKind::of(p);
    let model = train_judge(
        &out.join("judge"),
        &out.join(p.verifier_start_dir()),
        p,
        seed,
        &human,
        tok,
        kind,
    )?;
    let policy = judge_policy(&model, tok, p.policy.temperature, kind);
    let judge = Judge {
        policy: &policy,
        samples: p.judge.samples,
        seed: seed ^ 6,
        format: p.judge.answer.format(),
        likelihood: false,
    };
    let (labels, spent) = label_stage(
        &out.join("labels_judge.jsonl"),
        label_sols,
        &judge,
        "annotating (judge)",
    )?;
    let consensus = mc
        .iter()
        .cloned()
        .zip(&labels)
        .map(|(a, b)| keep_if_agreeing(a, b))
        .collect();
    Ok(Judged {
        labels,
        spent,
        consensus,
        human: human.into_iter().cloned().collect(),
        model,
    })
}

/// Whether a judge of `kind` can be weighed by likelihood: its answers are fixed texts (an
/// index or a quoted step), or it is asked at each step (`yes` against `no`); the chain judge's
/// answer is its own working.
pub fn weighable(kind: JudgeKind) -> bool {
    !matches!(
        kind,
        JudgeKind::Whole {
            answer: JudgeAnswer::Chain,
            ..
        }
    )
}

/// Score `sols` with a judge `model` of `kind` itself, a generative verifier, under `name`:
/// each step's score is the share of its sampled verdicts that put the first error later, or
/// with `likelihood` ([`weighable`] kinds) the probability it gives those verdicts. Returns the
/// tokens its answers took.
#[allow(clippy::too_many_arguments)]
pub fn score_with_judge(
    model: &Model,
    kind: JudgeKind,
    likelihood: bool,
    p: &Preset,
    seed: u64,
    tok: &Tokenizer,
    sols: &mut [Solution],
    name: &str,
) -> Result<usize> {
    let policy = judge_policy(model, tok, p.policy.temperature, kind);
    let how = if likelihood { "likelihood" } else { "generative" };
    let what = format!("scoring (the {}, {how})", kind.what());
    let pb = crate::progress::bar(sols.len() as u64, &what);
    let progress = |done: usize| pb.set_position(done as u64);
    let tokens = match kind {
        JudgeKind::Whole { answer, calculator } => {
            let judge = Judge {
                policy: &policy,
                samples: p.judge.samples,
                seed: seed ^ 9,
                format: format_of(answer, calculator),
                likelihood,
            };
            stepwise_core::seams::score_solutions(&judge, name, sols, 64, progress)?
        }
        JudgeKind::EachStep { think } => {
            let judge = super::worked::WorkedJudge {
                policy: &policy,
                samples: p.judge.samples,
                seed: seed ^ 9,
                think,
                likelihood,
            };
            stepwise_core::seams::score_solutions(&judge, name, sols, 64, progress)?
        }
    };
    pb.finish_and_clear();
    Ok(tokens)
}

/// The trained judge as a [`stepwise_core::Policy`]: the lab policy's layout and temperature,
/// a few tokens at most (an index and `<eos>`, a step copied out or worked again and `<eos>`,
/// or a chain of up to about a dozen verdicts).
pub fn judge_policy<'a>(model: &'a Model, tok: &'a Tokenizer, temperature: f32, kind: JudgeKind) -> EnginePolicy<'a> {
    let mut policy = lab_policy(model, tok, temperature);
    policy.params.max_new_tokens = match kind {
        JudgeKind::Whole {
            answer: JudgeAnswer::Index,
            ..
        } => 4,
        JudgeKind::Whole {
            answer: JudgeAnswer::Quote,
            ..
        }
        | JudgeKind::EachStep { .. } => 12,
        JudgeKind::Whole {
            answer: JudgeAnswer::Chain,
            ..
        } => 96,
    };
    policy
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepwise_core::{Provenance, Step, StepLabel};

    fn solution(steps: &[(&str, bool)]) -> Solution {
        Solution {
            question: "Ann has 2 boxes of 3 apples . How many apples does Ann have now ?".into(),
            steps: steps
                .iter()
                .map(|&(t, good)| Step::labelled(t, StepLabel::from_bool(good, Provenance::Oracle)))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_chain_works_each_equation_again_and_stops_at_the_first_no() {
        let tok = crate::vocab::tokenizer(crate::task::Domain::Arithmetic).unwrap();
        // A slip at step 1: the chain works steps 0 and 1 again and stops there.
        let sol = solution(&[("2 * 3 = 6", true), ("6 + 1 = 8", false), ("The answer is 8", false)]);
        let e = judge_example(&tok, &sol, JudgeAnswer::Chain, false).unwrap();
        assert_eq!(
            tok.decode(&e.ids[e.lm_from..]).unwrap(),
            "2 * 3 = 6 yes | 6 + 1 = 7 no <eos>"
        );
        assert!(!e.ids.contains(&tok.token_id(crate::vocab::UNK).unwrap()));
        // No error: a verdict on every step, the answer step's alone; a comparison step and a
        // value without a word in the vocabulary are not worked again.
        let right = solution(&[("2 * 3 = 6", true), ("6 > 4", true), ("The answer is 6", true)]);
        let steps = right.step_strings();
        assert_eq!(ChainAnswer::answer(&steps, None), "2 * 3 = 6 yes | yes | yes");
        assert_eq!(verdict_piece("6 - 4 = 1", false), "6 - 4 = 2 no");
        assert_eq!(ChainAnswer::answer(&["4 - 9 = 5".to_string()], Some(0)), "no");

        // Read back: the first `no`; a `yes` on every step is none; the rest no verdict.
        let cases: [(&str, Option<Option<usize>>); 9] = [
            ("2 * 3 = 6 yes | yes | yes", Some(None)),
            ("2 * 3 = 6 yes | no", Some(Some(1))),
            ("no", Some(Some(0))),
            ("2 * 3 = 7 yes | yes | no", Some(Some(2))),
            ("2 * 3 = 6 yes | yes", None),
            ("yes | yes | yes | yes", None),
            ("yes | 6 > 4 | no", None),
            ("yes | | yes", None),
            ("", None),
        ];
        for (answer, want) in cases {
            assert_eq!(ChainAnswer.read(answer, &steps), want, "{answer:?}");
        }
        let (prompt, pieces) = ChainAnswer.ask(&right.question, &steps);
        assert_eq!((prompt.as_str(), pieces), (right.question.as_str(), steps));
    }

    #[test]
    fn the_budget_spreads_over_the_samples_and_the_example_ends_with_the_index() {
        let sols: Vec<Solution> = (0..10)
            .map(|i| Solution {
                id: i.to_string(),
                ..Default::default()
            })
            .collect();
        let ids: Vec<&str> = human_budget(&sols, 4).iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["0", "2", "5", "7"]);
        assert_eq!(human_budget(&sols, 50).len(), 10);
        assert!(human_budget(&sols, 0).is_empty());

        let tok = crate::vocab::tokenizer(crate::task::Domain::Arithmetic).unwrap();
        let step = |t: &str, good| Step::labelled(t, StepLabel::from_bool(good, Provenance::Oracle));
        let sol = Solution {
            question: "Ann has 2 boxes of 3 apples . How many apples does Ann have now ?".into(),
            steps: vec![step("2 * 3 = 6", true), step("6 + 1 = 8", false)],
            ..Default::default()
        };
        let e = judge_example(&tok, &sol, JudgeAnswer::Index, false).unwrap();
        assert_eq!(tok.decode(&e.ids[e.lm_from..]).unwrap(), "1 <eos>");
        let quoted = judge_example(&tok, &sol, JudgeAnswer::Quote, false).unwrap();
        assert_eq!(tok.decode(&quoted.ids[quoted.lm_from..]).unwrap(), "6 + 1 = 8 <eos>");
        assert_eq!(tok.decode(&e.ids[e.lm_from - 1..e.lm_from]).unwrap(), SEP);
        let mut right = sol.clone();
        right.steps[1] = step("6 + 1 = 7", true);
        let e = judge_example(&tok, &right, JudgeAnswer::Index, false).unwrap();
        assert_eq!(tok.decode(&e.ids[e.lm_from..]).unwrap(), "- 1 <eos>");
        assert!(!e.ids.contains(&tok.token_id(crate::vocab::UNK).unwrap()));

        // Its prefixes: the first error where the labels put it, none before it.
        let three = Solution {
            steps: vec![
                step("2 * 3 = 6", true),
                step("6 + 1 = 8", false),
                step("The answer is 8", false),
            ],
            ..sol.clone()
        };
        let firsts: Vec<(usize, Option<usize>)> = prefixes(&three)
            .iter()
            .map(|s| (s.steps.len(), s.first_error()))
            .collect();
        assert_eq!(firsts, [(3, Some(1)), (2, Some(1)), (1, None)]);

        // The judge with a calculator reads each equation step's value after it, and its
        // example is the same answer after those steps, every word in the lab's vocabulary.
        assert_eq!(with_calculator("6 + 1 = 8"), "6 + 1 = 8 = 7");
        assert_eq!(with_calculator("13 - 20 = 7"), "13 - 20 = 7", "no word for -7");
        assert_eq!(with_calculator("The answer is 8"), "The answer is 8");
        assert_eq!(with_calculator("12 > 7"), "12 > 7");
        assert_eq!(calculator_calls(&three.step_strings()), 2);
        let e = judge_example(&tok, &sol, JudgeAnswer::Index, true).unwrap();
        assert_eq!(tok.decode(&e.ids[e.lm_from..]).unwrap(), "1 <eos>");
        assert!(tok.decode(&e.ids[..e.lm_from]).unwrap().contains("6 + 1 = 8 = 7"));
        assert!(!e.ids.contains(&tok.token_id(crate::vocab::UNK).unwrap()));
        let format = WithCalculator(JudgeAnswer::Index.format());
        let (_, pieces) = format.ask(&sol.question, &sol.step_strings());
        assert!(pieces.iter().any(|p| p.contains("= 7")), "{pieces:?}");
        assert_eq!(format.read("1", &sol.step_strings()), Some(Some(1)));
    }
}
