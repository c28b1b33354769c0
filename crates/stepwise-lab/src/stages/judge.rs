//! The lab's LLM judge: a generative verifier. The verifiers' starting model (their own base
//! LM, or the policy when there is none) is fine-tuned (next-token loss) to write, right after a
//! solution laid out as it was trained on (`question | step | … |`), the index of the first wrong
//! step or `- 1` for none ([`IndexAnswer`]). Its training budget is a
//! small "human" one: the oracle's first errors on `judge_solutions` of the samples drawn for
//! labelling (the lab's PRM800K), spread evenly over them. It then labels every sample through
//! the same [`stepwise_label::Judge`] annotator that asks a served model ProcessBench's critique
//! question, so the lab measures what a judge adds to Monte Carlo labels (consensus filtering).

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
}

/// The judge's training example for an oracle-labelled solution: the solution in the policy's
/// layout (each equation step with the calculator's value after it, for a judge with the
/// calculator), then the index of its first wrong step (`- 1` for none) and `<eos>`; the loss
/// covers the answer only.
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
/// base), on the oracle's verdicts for `human` (oracle-labelled solutions); with `calculator`,
/// the judge that reads the calculator's values ([`with_calculator`]), trained alike (same
/// seed, same examples otherwise).
pub fn train_judge(
    dir: &Path,
    base_dir: &Path,
    p: &Preset,
    seed: u64,
    human: &[&Solution],
    tok: &Tokenizer,
    calculator: bool,
) -> Result<Model> {
    let with_prefixes: Vec<Solution>;
    let human: Vec<&Solution> = if p.judge.prefixes {
        with_prefixes = human.iter().flat_map(|s| prefixes(s)).collect();
        with_prefixes.iter().collect()
    } else {
        human.to_vec()
    };
    let examples = human
        .iter()
        .map(|s| judge_example(tok, s, p.judge.answer, calculator))
        .collect::<Result<Vec<_>>>()?;
    let tc = super::fine_tuning(p.judge.lr, p.judge.steps, seed ^ 7);
    let train_seed = tc.seed;
    train_stage(
        dir,
        p.domain,
        if calculator {
            "training judge (calculator)"
        } else {
            "training judge"
        },
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
    let model = train_judge(
        &out.join("judge"),
        &out.join(p.verifier_start_dir()),
        p,
        seed,
        &human,
        tok,
        false,
    )?;
    let policy = judge_policy(&model, tok, p.policy.temperature, p.judge.answer);
    let judge = Judge {
        policy: &policy,
        samples: p.judge.samples,
        seed: seed ^ 6,
        format: p.judge.answer.format(),
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

/// Score `sols` with a judge `model` itself, a generative verifier (each step: the share of its
/// sampled verdicts that put the first error later), under `name`; `calculator` for the judge
/// that reads the calculator's values. Returns the tokens its answers took.
pub fn score_with_judge(
    model: &Model,
    calculator: bool,
    p: &Preset,
    seed: u64,
    tok: &Tokenizer,
    sols: &mut [Solution],
    name: &str,
) -> Result<usize> {
    let policy = judge_policy(model, tok, p.policy.temperature, p.judge.answer);
    let with_calculator = WithCalculator(p.judge.answer.format());
    let judge = Judge {
        policy: &policy,
        samples: p.judge.samples,
        seed: seed ^ 9,
        format: if calculator {
            &with_calculator
        } else {
            p.judge.answer.format()
        },
    };
    let what = if calculator {
        "scoring (the judge with a calculator, generative)"
    } else {
        "scoring (the judge, generative)"
    };
    let pb = crate::progress::bar(sols.len() as u64, what);
    let tokens = stepwise_core::seams::score_solutions(&judge, name, sols, 64, |done| pb.set_position(done as u64))?;
    pb.finish_and_clear();
    Ok(tokens)
}

/// The trained judge as a [`stepwise_core::Policy`]: the lab policy's layout and temperature,
/// a few tokens at most (an index and `<eos>`, or a step copied out and `<eos>`).
pub fn judge_policy<'a>(
    model: &'a Model,
    tok: &'a Tokenizer,
    temperature: f32,
    answer: JudgeAnswer,
) -> EnginePolicy<'a> {
    let mut policy = lab_policy(model, tok, temperature);
    policy.params.max_new_tokens = match answer {
        JudgeAnswer::Index => 4,
        JudgeAnswer::Quote => 12,
    };
    policy
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepwise_core::{Provenance, Step, StepLabel};

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
