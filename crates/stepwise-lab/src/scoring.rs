//! Stage 5 beyond the trained verifiers: the held-out samples scored by the confidence
//! baselines (the policy's, the verifiers' base's), by every judge (sampled verdicts, and
//! weighed by likelihood where the preset asks), and by the PRMs of human labels in the studio.

use crate::run::LabOptions;
use crate::stages::evaluate::verifier;
use crate::stages::verifiers::Verifiers;
use crate::task::Domain;
use anyhow::Result;
use stepwise_core::Solution;
use stepwise_model::{Model, Tokenizer};

/// What scores the evaluation samples besides the trained verifiers.
pub(crate) struct MoreScorers<'a> {
    pub(crate) policy: &'a Model,
    pub(crate) base: Option<&'a Model>,
    pub(crate) judged: Option<&'a crate::stages::judge::Judged>,
    pub(crate) verifiers: &'a Verifiers<'a>,
    pub(crate) label_sols: &'a [Solution],
    pub(crate) oracle: &'a [Solution],
}

impl MoreScorers<'_> {
    /// The policy's confidence as a baseline, the judges, the verifiers' base's confidence, and
    /// (5b) the PRMs of human labels in the studio (simulated labellers through its HTTP API,
    /// by selection policy): each scores `scored`.
    pub(crate) fn score(
        &self,
        o: &LabOptions,
        tok: &Tokenizer,
        scored: &mut [Solution],
        clock: &mut crate::progress::Stopwatch,
    ) -> Result<(
        Option<crate::stages::evaluate::Generative>,
        Option<crate::stages::studio::StudioReport>,
    )> {
        let p = &o.preset;
        let mut baselines = vec![(self.policy, verifier::POLICY_CONFIDENCE)];
        baselines.extend(self.base.map(|model| (model, verifier::BASE_CONFIDENCE)));
        crate::stages::score_all_at_once(
            &baselines,
            scored,
            |(_, name)| name,
            |&(model, name), sols| {
                let confidence = crate::confidence::PolicyConfidence { model, tok };
                crate::stages::outcomes(&confidence, sols, &format!("scoring ({name})"))
            },
        )?;
        clock.lap("confidence baselines (scoring)");
        let generative = self.judged.map(|j| score_with_judges(o, tok, j, scored)).transpose()?;
        clock.lap("judges (training, scoring)");
        let studio = (p.studio.generations > 0)
            .then(|| {
                let inputs = crate::stages::studio::StudioInputs {
                    preset: p,
                    seed: o.seed,
                    out: &o.out,
                    verifiers: self.verifiers,
                    pool: self.label_sols,
                    oracle: self.oracle,
                };
                crate::stages::studio::studio_stage(&inputs, scored)
            })
            .transpose()?;
        clock.lap("studio (simulated labellers, PRMs)");
        Ok((generative, studio))
    }
}

/// The judge itself as a verifier (generative: it samples its verdicts), and, where the preset
/// trains them, the judge with a calculator (reading each equation step's value), the judge
/// that writes a verification chain, the judge asked at each step that works it again and its
/// control that does not, all trained alike on the same oracle labels: each scores `scored`,
/// and with `judge_likelihood` scores it again weighed by likelihood; what they wrote, per
/// solution.
fn score_with_judges(
    o: &LabOptions,
    tok: &Tokenizer,
    j: &crate::stages::judge::Judged,
    scored: &mut [Solution],
) -> Result<crate::stages::evaluate::Generative> {
    use crate::preset::JudgeAnswer;
    use crate::stages::evaluate::{CalculatorJudge, JudgeCost};
    use crate::stages::judge::{calculator_calls, train_judge, JudgeKind};
    let p = &o.preset;
    let solutions = scored.len().max(1) as f64;
    let mut judges = JudgeScoring {
        o,
        tok,
        weighed: Vec::new(),
    };
    let (tokens, seconds) = judges.score(&j.model, JudgeKind::of(p), verifier::JUDGE, scored)?;
    let human: Vec<&Solution> = j.human.iter().collect();
    let mut another = |kind: JudgeKind, dir: &str, scored: &mut [Solution]| -> Result<usize> {
        let model = train_judge(
            &o.out.join(dir),
            &o.out.join(p.verifier_start_dir()),
            p,
            o.seed,
            &human,
            tok,
            kind,
        )?;
        Ok(judges.score(&model, kind, dir, scored)?.0)
    };
    // The calculator and the worked steps are equations: the code domain has none (its judge
    // reads programs).
    let arithmetic = p.domain == Domain::Arithmetic;
    let calculator = if p.judge.calculator && arithmetic {
        let kind = JudgeKind::Whole {
            answer: p.judge.answer,
            calculator: true,
        };
        let tokens = another(kind, verifier::JUDGE_CALCULATOR, scored)?;
        let calls: usize = scored.iter().map(|s| calculator_calls(&s.step_strings())).sum();
        Some(CalculatorJudge {
            tokens_per_solution: tokens as f64 / solutions,
            calls_per_solution: calls as f64 / solutions,
        })
    } else {
        None
    };
    let mut cost = |on: bool, kind: JudgeKind, dir: &str| -> Result<Option<JudgeCost>> {
        if !(on && arithmetic) {
            return Ok(None);
        }
        let tokens = another(kind, dir, scored)?;
        Ok(Some(JudgeCost {
            tokens_per_solution: tokens as f64 / solutions,
        }))
    };
    let chain_judge = JudgeKind::Whole {
        answer: JudgeAnswer::Chain,
        calculator: false,
    };
    let chain = cost(p.judge.chain, chain_judge, verifier::JUDGE_CHAIN)?;
    let worked = cost(
        p.judge.worked,
        JudgeKind::EachStep { think: true },
        verifier::JUDGE_WORKED,
    )?;
    let direct = cost(
        p.judge.direct,
        JudgeKind::EachStep { think: false },
        verifier::JUDGE_DIRECT,
    )?;
    Ok(crate::stages::evaluate::Generative {
        labelled_solutions: j.human.len(),
        samples: p.judge.samples,
        tokens_per_solution: tokens as f64 / solutions,
        calculator,
        chain,
        worked,
        direct,
        seconds: Some(seconds),
        likelihood: judges.weighed,
    })
}

/// Scores the held-out samples with each judge, by sampled verdicts and, where the preset
/// weighs them, by likelihood too; keeps what the weighing cost.
struct JudgeScoring<'a> {
    o: &'a LabOptions,
    tok: &'a Tokenizer,
    weighed: Vec<crate::stages::evaluate::Weighed>,
}

impl JudgeScoring<'_> {
    /// Score `scored` with the judge `model` of `kind` under `name` (and its likelihood
    /// verifier): the tokens its sampled answers took and the seconds they took.
    fn score(
        &mut self,
        model: &Model,
        kind: crate::stages::judge::JudgeKind,
        name: &str,
        scored: &mut [Solution],
    ) -> Result<(usize, f64)> {
        use crate::stages::judge::{score_with_judge, weighable};
        let (p, seed) = (&self.o.preset, self.o.seed);
        let started = std::time::Instant::now();
        let tokens = score_with_judge(model, kind, false, p, seed, self.tok, scored, name)?;
        let votes_seconds = started.elapsed().as_secs_f64();
        if let Some(weighed) = verifier::likelihood_of(name).filter(|_| p.judge.likelihood && weighable(kind)) {
            let started = std::time::Instant::now();
            let written = score_with_judge(model, kind, true, p, seed, self.tok, scored, weighed)?;
            self.weighed.push(crate::stages::evaluate::Weighed {
                verifier: weighed.to_string(),
                seconds: started.elapsed().as_secs_f64(),
                votes_seconds,
                tokens_per_solution: written as f64 / scored.len().max(1) as f64,
            });
        }
        Ok((tokens, votes_seconds))
    }
}
