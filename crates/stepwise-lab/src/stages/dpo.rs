//! Stage 9, DPO: the lab's policy trained offline by DPO on preference pairs from the samples
//! the label sources labelled, one run per source, then measured on the held-out problems as
//! the RL runs are. Step-DPO (Lai et al. 2024) pairs single steps after a shared sound prefix
//! (`stepwise pairs` on Monte Carlo labels, OmegaPRM's tree, the oracle's labels); outcome-level
//! DPO pairs a whole correct solution with a whole wrong one of the same problem, the same
//! samples graded by their final answers only. The question it answers: do step labels make
//! better preference data than outcomes, and how much does their noise cost?

use super::rl::{before_rl, sampled_measure, RlBase};
use crate::vocab::{EOS, SEP};
use anyhow::{Context, Result};
use candle_core::Device;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use stepwise_core::pairs::{step_pairs_and_unpaired, StepPair};
use stepwise_core::preference::{PairPrompt, PreferencePair};
use stepwise_core::Solution;
use stepwise_eval::paired::{paired_by_id, PairedDifference};
use stepwise_model::train::VarMap;
use stepwise_model::{Model, ModelConfig, Prompt};
use stepwise_rl::dpo::tokenize_pair;
use stepwise_rl::{train_dpo, CandleLearner, DpoConfig, DpoLog, DpoRun, Frozen};

/// The DPO stage's settings. (Flat preset keys: `--set dpo_epochs=...`.)
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DpoPreset {
    /// DPO (the `dpo` stage): passes over each source's pairs (0 skips the stage).
    #[serde(rename = "dpo_epochs", default)]
    pub epochs: usize,
    /// DPO: `β`.
    #[serde(rename = "dpo_beta", default = "beta")]
    pub beta: f32,
    /// DPO: peak learning rate.
    #[serde(rename = "dpo_lr", default = "lr")]
    pub lr: f64,
    /// DPO: pairs per optimiser step.
    #[serde(rename = "dpo_batch", default = "batch")]
    pub batch: usize,
    /// DPO: weight of the chosen completions' NLL added to the loss (RPO; 0: DPO alone).
    #[serde(rename = "dpo_rpo_alpha", default = "rpo_alpha")]
    pub rpo_alpha: f32,
}

fn beta() -> f32 {
    0.1
}

/// Chosen on seed 1 of the standard preset (2 epochs, β 0.1; docs/lab.md): DPO alone at 2e-4 and
/// 5e-5 left every source's policy below the start and at 1e-5 raised each alike; 5e-5 with
/// RPO's NLL term (`dpo_rpo_alpha` 1) raised them most.
fn lr() -> f64 {
    5e-5
}

fn rpo_alpha() -> f32 {
    1.0
}

fn batch() -> usize {
    32
}

impl DpoPreset {
    /// Off: the stage runs when `dpo_epochs` is set.
    pub fn off() -> Self {
        DpoPreset {
            epochs: 0,
            beta: beta(),
            lr: lr(),
            batch: batch(),
            rpo_alpha: rpo_alpha(),
        }
    }
}

/// One source's run and its result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DpoVariant {
    /// `outcome`, `step_mc`, `step_mc_sampled`, `step_mc_sampled_checked`, `step_omegaprm` or
    /// `step_oracle`.
    pub pairs_from: String,
    /// Pairs trained on.
    pub pairs: usize,
    /// Of the step pairs, the share whose chosen step the oracle calls right and rejected step
    /// wrong (outcome pairs: correct against wrong final answers, by construction).
    pub precision: Option<f64>,
    /// Of the pairs, those whose chosen step the starting policy sampled (Step-DPO's
    /// rectification of wrong steps with no right step beside them).
    #[serde(default)]
    pub sampled: usize,
    /// Those against the oracle: the share right on both sides, with a right chosen step, with a
    /// wrong rejected step.
    #[serde(default)]
    pub sampled_quality: Option<super::labels::PairQuality>,
    /// Single-sample accuracy on the held-out problems after DPO.
    pub accuracy_after: f64,
    /// Bootstrap 95% interval of it over problems.
    pub ci95: (f64, f64),
    /// Majority-vote accuracy after.
    pub majority_after: f64,
    /// Of the correct samples after, the share reached through a wrong step.
    pub lucky_correct_after: f64,
    /// The training loss and reward accuracy over the first and the last epoch's steps.
    pub loss_first_last: (f64, f64),
    /// The same for the reward accuracy (chosen reward above rejected).
    pub reward_accuracy_first_last: (f64, f64),
    /// Completion tokens learned from (both sides, all epochs).
    pub tokens: usize,
    /// Each held-out problem's accuracy after, by problem id.
    #[serde(skip)]
    pub per_problem: BTreeMap<String, f64>,
}

/// The DPO stage's results.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DpoReport {
    /// Its settings.
    pub settings: DpoPreset,
    /// Held-out samples per problem behind each measure.
    pub eval_samples: usize,
    /// The starting policy's single-sample accuracy (the RL stage's "before").
    pub accuracy_before: f64,
    /// Its majority-vote accuracy.
    #[serde(default)]
    pub majority_before: f64,
    /// Of its correct samples, the share reached through a wrong step.
    #[serde(default)]
    pub lucky_correct_before: f64,
    /// Continuations sampled from each place to rectify a wrong step (`step_mc_sampled`).
    #[serde(default)]
    pub rectify_samples: usize,
    /// One entry per pair source.
    pub variants: Vec<DpoVariant>,
    /// Each source against outcome-level DPO and against the starting policy, and the Monte Carlo
    /// pairs with sampled right steps against them alone, problem by problem.
    pub paired: Vec<PairedDifference>,
}

/// Outcome-level pairs: in each problem, every distinct wrong solution against a correct one
/// (taken in turn), whole, each ending its solution.
pub fn outcome_pairs(sols: &[Solution]) -> Vec<PreferencePair> {
    let mut order: Vec<&str> = Vec::new();
    let mut by_problem: HashMap<&str, (Vec<&Solution>, Vec<&Solution>)> = HashMap::new();
    for s in sols.iter().filter(|s| !s.steps.is_empty()) {
        let slot = by_problem.entry(&s.problem_id).or_insert_with(|| {
            order.push(&s.problem_id);
            Default::default()
        });
        let text = |x: &Solution| whole(x);
        match s.correct {
            Some(true) if !slot.0.iter().any(|r| text(r) == text(s)) => slot.0.push(s),
            Some(false) if !slot.1.iter().any(|w| text(w) == text(s)) => slot.1.push(s),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for p in order {
        let (right, wrong) = &by_problem[p];
        if right.is_empty() {
            continue;
        }
        for (k, w) in wrong.iter().enumerate() {
            out.push(PreferencePair {
                id: w.id.clone(),
                prompt: PairPrompt::Steps {
                    question: w.question.clone(),
                    prefix: Vec::new(),
                },
                chosen: whole(right[k % right.len()]),
                rejected: whole(w),
                chosen_ends: true,
                rejected_ends: true,
            });
        }
    }
    out
}

/// A solution's steps as one completion, the separator between them.
fn whole(s: &Solution) -> String {
    let steps: Vec<&str> = s.steps.iter().map(|st| st.text.as_str()).collect();
    steps.join(&format!(" {SEP} "))
}

/// What each source's pairs are mined from.
pub struct DpoSources<'a> {
    /// The annotated samples, graded (outcome pairs).
    pub graded: &'a [Solution],
    /// Their Monte Carlo labels.
    pub mc: &'a [Solution],
    /// OmegaPRM's labels on them and on its tree's rollouts.
    pub omegaprm: Vec<Solution>,
    /// The oracle's labels on them.
    pub oracle: &'a [Solution],
}

/// One DPO run per pair source from the policy (each resumable in `dpo_<source>/`), measured on
/// the held-out problems.
pub fn dpo_stage(b: &RlBase<'_>, s: &DpoSources<'_>) -> Result<DpoReport> {
    let p = &b.preset.dpo;
    let step = |name: &str, pairs: &[StepPair], sampled: &[StepPair]| -> Source {
        let all: Vec<StepPair> = pairs.iter().chain(sampled).cloned().collect();
        Source {
            name: name.to_string(),
            precision: Some(super::labels::quality_of_pairs(&all, b.task).precision),
            sampled: sampled.len(),
            sampled_quality: (!sampled.is_empty()).then(|| super::labels::quality_of_pairs(sampled, b.task)),
            pairs: all.into_iter().map(PreferencePair::from).collect(),
        }
    };
    let (mc, unpaired, _) = step_pairs_and_unpaired(s.mc, 0.5);
    let mc_sampled = rectify_mc(b, &unpaired, "step_mc_sampled", false)?;
    let mc_checked = rectify_mc(b, &unpaired, "step_mc_sampled_checked", true)?;
    let sources = vec![
        Source {
            name: "outcome".into(),
            pairs: outcome_pairs(s.graded),
            precision: None,
            sampled: 0,
            sampled_quality: None,
        },
        step("step_mc", &mc, &[]),
        step("step_mc_sampled", &mc, &mc_sampled),
        step("step_mc_sampled_checked", &mc, &mc_checked),
        step("step_omegaprm", &step_pairs_and_unpaired(&s.omegaprm, 0.5).0, &[]),
        step("step_oracle", &step_pairs_and_unpaired(s.oracle, 0.5).0, &[]),
    ];
    let before = before_rl(b)?;
    let variants = super::all_at_once(&sources, "DPO", |src| {
        let (name, pairs) = (&src.name, &src.pairs);
        let (log, after) = run_source(b, name, pairs)?;
        let epoch = |e: usize| log.iter().filter(|l| l.epoch.ceil() as usize == e).collect::<Vec<_>>();
        let mean =
            |ls: &[&DpoLog], f: fn(&DpoLog) -> f64| ls.iter().map(|l| f(l)).sum::<f64>() / ls.len().max(1) as f64;
        let (first, last) = (epoch(1), epoch(p.epochs));
        Ok(DpoVariant {
            pairs_from: name.to_string(),
            pairs: pairs.len(),
            precision: src.precision,
            sampled: src.sampled,
            sampled_quality: src.sampled_quality.clone(),
            accuracy_after: after.accuracy,
            ci95: after.ci95,
            majority_after: after.majority,
            lucky_correct_after: after.lucky_correct,
            loss_first_last: (mean(&first, |l| l.train.loss), mean(&last, |l| l.train.loss)),
            reward_accuracy_first_last: (mean(&first, |l| l.train.accuracy), mean(&last, |l| l.train.accuracy)),
            tokens: log.last().map_or(0, |l| l.tokens),
            per_problem: after.per_problem,
        })
    })?;
    let measure = format!("accuracy after DPO ({} samples a problem)", b.preset.rl.eval_samples);
    let mut paired = Vec::new();
    let outcome = variants.iter().find(|v| v.pairs_from == "outcome");
    let mined = variants.iter().find(|v| v.pairs_from == "step_mc");
    for v in &variants {
        // The sampled right steps against the pairs they were added to.
        if let (Some(m), true) = (mined, v.sampled > 0) {
            paired.push(paired_by_id(
                &measure,
                &format!("DPO on {} pairs", v.pairs_from),
                &v.per_problem,
                "DPO on step_mc pairs",
                &m.per_problem,
                b.seed ^ 9,
            ));
        }
        if let Some(o) = outcome.filter(|o| o.pairs_from != v.pairs_from) {
            let a = format!("DPO on {} pairs", v.pairs_from);
            paired.push(paired_by_id(
                &measure,
                &a,
                &v.per_problem,
                "DPO on outcome pairs",
                &o.per_problem,
                b.seed ^ 9,
            ));
        }
        let a = format!("DPO on {} pairs", v.pairs_from);
        paired.push(paired_by_id(
            &measure,
            &a,
            &v.per_problem,
            "the starting policy",
            &before.per_problem,
            b.seed ^ 9,
        ));
    }
    Ok(DpoReport {
        settings: p.clone(),
        eval_samples: b.preset.rl.eval_samples,
        accuracy_before: before.accuracy,
        majority_before: before.majority,
        lucky_correct_before: before.lucky_correct,
        rectify_samples: b.preset.annotation.rollouts,
        variants,
        paired,
    })
}

/// One source's pairs.
struct Source {
    name: String,
    pairs: Vec<PreferencePair>,
    precision: Option<f64>,
    sampled: usize,
    sampled_quality: Option<super::labels::PairQuality>,
}

/// Step-DPO's rectification of the Monte Carlo labels' wrong steps that have no right step beside
/// them: the starting policy samples `rollouts` continuations from each one's prefix, and the
/// first step of the first that reaches the gold answer is its chosen step; with `checked`, only
/// one whose own `rollouts` continuations reach the answer at least half of the time. Written to
/// `dpo_<name>/sampled_pairs.jsonl`.
fn rectify_mc(
    b: &RlBase<'_>,
    unpaired: &[stepwise_core::pairs::Unpaired],
    name: &str,
    checked: bool,
) -> Result<Vec<StepPair>> {
    let policy = super::policy::lab_policy(b.policy, b.tok, b.preset.policy.temperature);
    let places = stepwise_core::pairs::places_of(unpaired);
    let pb = crate::progress::bar(places as u64, &format!("DPO (sampling right steps, {name})"));
    let options = stepwise_label::RectifyOptions {
        samples: b.preset.annotation.rollouts,
        seed: b.seed ^ 11,
        together: 64,
        threads: 1,
        check_rollouts: if checked { b.preset.annotation.rollouts } else { 0 },
        check_min: 0.5,
    };
    let (pairs, _) = stepwise_label::rectify(unpaired, &policy, b.task, options, |n| pb.set_position(n as u64))?;
    pb.finish_and_clear();
    // As `stepwise pairs --complete-with` writes them (a test compares the two).
    let dir = b.out.join(format!("dpo_{name}"));
    std::fs::create_dir_all(&dir)?;
    let rows: Vec<_> = (pairs.iter())
        .map(|p| p.to_json(stepwise_core::pairs::Layout::Stepwise, "", SEP))
        .collect();
    stepwise_core::io::write_records(dir.join("sampled_pairs.jsonl"), &rows)?;
    Ok(pairs)
}

/// DPO from the policy on `pairs` into `dpo_<name>/`, and the policy it leaves measured.
fn run_source(b: &RlBase<'_>, name: &str, pairs: &[PreferencePair]) -> Result<(Vec<DpoLog>, super::rl::PolicyMeasure)> {
    let p = &b.preset.dpo;
    let eos = b.tok.token_id(EOS).context("the lab vocabulary's end token")?;
    let tokens = pairs
        .iter()
        .map(|q| tokenize_pair(b.tok, Prompt::Pieces, SEP, eos, q))
        .collect::<Result<Vec<_>>>()?;
    let dir = b.out.join(format!("dpo_{name}"));
    std::fs::create_dir_all(&dir)?;
    crate::vocab::save(&dir, b.preset.domain)?;
    let policy_dir = b.out.join("policy");
    let varmap = VarMap::new();
    let cfg = DpoConfig {
        beta: p.beta,
        rpo_alpha: p.rpo_alpha,
        epochs: p.epochs,
        batch_size: p.batch,
        minibatch_size: p.batch,
        lr: p.lr,
        seed: b.seed ^ 10,
        checkpoint_every: 20,
        ..Default::default()
    };
    let mut model = Model::load_trainable(
        &policy_dir,
        ModelConfig::from_dir(&policy_dir)?,
        &varmap,
        &Device::Cpu,
        cfg.seed,
    )?;
    let steps = cfg.steps_per_epoch(tokens.len()) * cfg.epochs;
    let pb = crate::progress::bar(steps as u64, &format!("DPO ({name})"));
    let log = match tokens.is_empty() {
        true => Vec::new(),
        false => train_dpo(
            DpoRun {
                learner: &mut CandleLearner::new(&mut model)?,
                reference: Frozen::Shared(b.policy),
                pairs: &tokens,
                eval: &[],
                out_dir: Some(dir.clone()),
            },
            &cfg,
            |l| {
                pb.set_position(l.step as u64);
                pb.set_prefix(format!("loss {:.3} acc {:.2}", l.train.loss, l.train.accuracy));
            },
        )?,
    };
    pb.finish_and_clear();
    let policy = super::policy::lab_policy(&model, b.tok, b.preset.policy.temperature);
    let after = sampled_measure(
        b,
        &policy,
        &dir.join("eval_samples.jsonl"),
        &format!("sampling (after DPO, {name})"),
    )?;
    Ok((log, after))
}

impl DpoReport {
    /// The report's section: each source's pairs and the policy DPO left.
    pub fn section(&self, s: &mut String) {
        use std::fmt::Write;
        let d = &self.settings;
        let _ = writeln!(s, "## DPO on each label source's pairs\n");
        let _ = writeln!(
            s,
            "The policy trained offline by DPO from the same start on preference pairs from the annotated samples ({} epochs, β = {}, learning rate {}, {} pairs a step{}; the reference is the starting policy), then sampled {} times on each held-out problem (the starting policy: accuracy {:.3}, majority {:.3}, lucky {:.1}%). *Step* pairs are Step-DPO's: a right next step against a wrong one after a shared sound prefix, as `stepwise pairs` mines them from each source's labels; *precision* is the share whose chosen step the oracle calls right and rejected step wrong. *step_mc_sampled* adds Step-DPO's rectification to the Monte Carlo pairs: a wrong step with no right step beside it gets one the starting policy samples from its prefix (the first step of the first of {} continuations reaching the gold answer); *step_mc_sampled_checked* keeps a sampled step only when {} further continuations from it reach the gold answer at least half of the time (its Monte Carlo value). *sampled* counts those pairs, with their own precision and the share of their chosen steps the oracle calls right and of their rejected steps it calls wrong. *Outcome* pairs put a whole correct solution against a whole wrong one of the same problem.\n",
            d.epochs,
            d.beta,
            d.lr,
            d.batch,
            if d.rpo_alpha > 0.0 { format!(", the chosen side's NLL added with weight {} (RPO)", d.rpo_alpha) } else { String::new() },
            self.eval_samples,
            self.accuracy_before,
            self.majority_before,
            100.0 * self.lucky_correct_before,
            self.rectify_samples,
            self.rectify_samples,
        );
        let _ = writeln!(
            s,
            "| pairs from | pairs | precision | sampled (precision; chosen right, rejected wrong) | accuracy after | 95% CI | majority after | lucky after | loss first → last epoch | reward accuracy first → last | tokens learned |\n|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for v in &self.variants {
            let precision = v.precision.map_or("–".to_string(), |p| format!("{p:.3}"));
            let sampled = v.sampled_quality.as_ref().map_or("–".to_string(), |q| {
                format!(
                    "{} ({:.3}; {:.3}, {:.3})",
                    v.sampled, q.precision, q.chosen_right, q.rejected_wrong
                )
            });
            let _ = writeln!(
                s,
                "| {} | {} | {precision} | {sampled} | {:.3} | [{:.3}, {:.3}] | {:.3} | {:.1}% | {:.3} → {:.3} | {:.2} → {:.2} | {} |",
                v.pairs_from,
                v.pairs,
                v.accuracy_after,
                v.ci95.0,
                v.ci95.1,
                v.majority_after,
                100.0 * v.lucky_correct_after,
                v.loss_first_last.0,
                v.loss_first_last.1,
                v.reward_accuracy_first_last.0,
                v.reward_accuracy_first_last.1,
                v.tokens
            );
        }
        let _ = writeln!(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepwise_core::Step;

    fn sol(problem: &str, k: usize, steps: &[&str], correct: bool) -> Solution {
        Solution {
            id: format!("{problem}-{k}"),
            problem_id: problem.into(),
            question: format!("question {problem}"),
            steps: steps.iter().map(|s| Step::new(*s)).collect(),
            correct: Some(correct),
            ..Default::default()
        }
    }

    #[test]
    fn outcome_pairs_put_each_wrong_solution_against_a_right_one() {
        let sols = [
            sol("p", 0, &["3 * 4 = 12", "12 + 2 = 14"], true),
            sol("p", 1, &["3 * 4 = 12", "12 + 2 = 15"], false),
            sol("p", 2, &["3 * 4 = 11", "11 + 2 = 13"], false),
            // The same wrong text again pairs once.
            sol("p", 3, &["3 * 4 = 11", "11 + 2 = 13"], false),
            // No right solution: no pair.
            sol("q", 0, &["1 + 1 = 3"], false),
        ];
        let pairs = outcome_pairs(&sols);
        let got: Vec<_> = pairs.iter().map(|p| (p.id.as_str(), p.rejected.as_str())).collect();
        assert_eq!(
            got,
            vec![("p-1", "3 * 4 = 12 | 12 + 2 = 15"), ("p-2", "3 * 4 = 11 | 11 + 2 = 13")]
        );
        assert!(pairs
            .iter()
            .all(|p| p.chosen == "3 * 4 = 12 | 12 + 2 = 14" && p.chosen_ends && p.rejected_ends));
        // Laid out as the policy was trained on whole solutions (the lab's LM examples).
        let tok = crate::vocab::tokenizer(crate::task::Domain::Arithmetic).unwrap();
        let eos = tok.token_id(EOS).unwrap();
        let t = tokenize_pair(&tok, Prompt::Pieces, SEP, eos, &pairs[0]).unwrap();
        let steps = ["3 * 4 = 12".to_string(), "12 + 2 = 14".to_string()];
        let lm = super::super::policy::lm_example(&tok, "question p", &steps).unwrap();
        assert_eq!((t.chosen, t.from), (lm.ids, lm.lm_from));
    }
}
