//! Stage 8, RL: the lab's policy optimised against each reward source in turn — the outcome
//! (the grader), the ORM, PRM-MC, PRM-oracle, PRIME (the outcome with an implicit PRM learning
//! online from it, no step labels) and the oracle itself (the ceiling) — with the same
//! budget (updates × prompts × group), prompts and seeds, then measured on held-out problems
//! before and after: single-sample accuracy, majority vote, and how many correct answers were
//! reached through a wrong step (the reward hacking outcome rewards invite).

use super::sample::sample_stage;
use crate::oracle::LabTask;
use crate::preset::Preset;
use crate::progress::bar;
use crate::task::{oracle_labelled, LabProblem};
use crate::vocab::{EOS, SEP};
use anyhow::Result;
use candle_core::Device;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use stepwise_core::seams::{OracleReward, OutcomeReward, Reward, RewardKind, ScorerReward};
use stepwise_core::{Problem, Solution, StepScorer};
use stepwise_eval::bon::bootstrap;
use stepwise_eval::paired::{paired_by_id, PairedDifference};
use stepwise_model::train::VarMap;
use stepwise_model::{Model, ModelConfig, Prompt, Tokenizer};
use stepwise_rl::trainer::RlRun;
use stepwise_rl::{train_rl, CandleLearner, Credit, ImplicitPrm, PrimeConfig, Reference, RlConfig, UpdateLog};
use stepwise_search::{group_candidates, select, Selector};

/// The name of the PRIME variant.
const PRIME: &str = "prime";

/// How a policy does on the held-out problems.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PolicyMeasure {
    /// Single-sample accuracy (all samples of all problems).
    pub accuracy: f64,
    /// Bootstrap 95% interval of it over problems.
    pub ci95: (f64, f64),
    /// Accuracy of the majority answer of each problem's samples.
    pub majority: f64,
    /// Of the correct samples, the fraction the oracle says reached their answer through a wrong
    /// step.
    pub lucky_correct: f64,
    /// Each problem's fraction of correct samples, by problem id (for paired comparisons).
    #[serde(skip)]
    pub per_problem: BTreeMap<String, f64>,
}

/// One reward source's RL run and its result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RlVariant {
    /// The reward source: `outcome`, `orm`, `prm_mc`, `prm_oracle`, `prime` or `oracle`.
    pub reward: String,
    /// Single-sample accuracy of the starting policy on held-out problems.
    pub accuracy_before: f64,
    /// The same after RL.
    pub accuracy_after: f64,
    /// Bootstrap 95% interval of `accuracy_after` over problems.
    pub ci95: (f64, f64),
    /// Lucky-correct rate before.
    pub lucky_correct_before: f64,
    /// Lucky-correct rate after.
    pub lucky_correct_after: f64,
    /// Majority-vote accuracy over `eval_samples` samples, before.
    pub majority_before: f64,
    /// The same after.
    pub majority_after: f64,
    /// Tokens sampled during RL.
    pub sampled_tokens: usize,
    /// Updates made.
    pub updates: usize,
    /// KL estimate to the starting policy, mean over the last tenth of the updates.
    pub kl: f64,
    /// The optimised reward's mean over the samples, over the first and the last tenth of the
    /// updates (for a process reward, the mean step score).
    pub reward_first_last: (f64, f64),
    /// The oracle's mean step verdict on the same samples, first and last tenth: a verifier the
    /// policy learns to please rises while this does not.
    pub oracle_first_last: (f64, f64),
    /// PRIME only: how often its implicit PRM predicted the outcome of the update's samples
    /// before learning from them, over the first and the last tenth of the updates (the share
    /// of groups its prompt filter kept is in `kept_groups`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub implicit_prm_accuracy: Option<(f64, f64)>,
    /// PRIME only: the share of sampled groups its prompt filter kept (mixed outcomes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_groups: Option<f64>,
    /// Every update's log (`rl_<reward>/rl_state.json` keeps it too).
    #[serde(skip)]
    pub log: Vec<UpdateLog>,
    /// Each held-out problem's accuracy after RL, by problem id.
    #[serde(skip)]
    pub per_problem: BTreeMap<String, f64>,
}

/// An update's KL to the lab policy (every lab run has its reference: NaN were one missing).
pub(crate) fn kl(l: &UpdateLog) -> f64 {
    l.kl.unwrap_or(f64::NAN)
}

/// The mean of `f` over the first and the last tenth of `log`.
pub(crate) fn first_last(log: &[UpdateLog], f: impl Fn(&UpdateLog) -> f64) -> (f64, f64) {
    let k = (log.len() / 10).max(1).min(log.len());
    let mean = |xs: &[UpdateLog]| xs.iter().map(&f).sum::<f64>() / xs.len().max(1) as f64;
    (mean(&log[..k]), mean(&log[log.len() - k..]))
}

/// The RL stage's results.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RlReport {
    /// Held-out samples per problem behind each measure.
    pub eval_samples: usize,
    /// Updates × prompts × group of every run.
    pub budget: (usize, usize, usize),
    /// One entry per reward source.
    pub variants: Vec<RlVariant>,
    /// Each reward source against outcome-reward RL on the same held-out problems: accuracy
    /// after RL, mean per-problem difference with a paired bootstrap interval.
    #[serde(default)]
    pub paired: Vec<PairedDifference>,
    /// The PRIME variant's settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prime: Option<PrimeConfig>,
}

/// Measure `sols` (graded, oracle verdicts in meta), several per problem.
pub fn measure(sols: &[Solution], seed: u64) -> Result<PolicyMeasure> {
    let groups = group_candidates(sols, None, None)?;
    let per_problem: Vec<f64> = groups
        .iter()
        .map(|g| g.iter().filter(|c| c.correct).count() as f64 / g.len().max(1) as f64)
        .collect();
    let majority = groups
        .iter()
        .filter(|g| {
            let refs: Vec<_> = g.iter().collect();
            select(&refs, Selector::Majority).is_some_and(|i| g[i].correct)
        })
        .count() as f64
        / groups.len().max(1) as f64;
    let correct: Vec<Solution> = sols
        .iter()
        .filter(|s| s.correct == Some(true))
        .map(oracle_labelled)
        .collect();
    let lucky = correct.iter().filter(|s| s.first_error().is_some()).count();
    let mut tally: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for s in sols {
        let t = tally.entry(s.problem_id.clone()).or_default();
        t.0 += usize::from(s.correct == Some(true));
        t.1 += 1;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    Ok(PolicyMeasure {
        per_problem: tally.into_iter().map(|(k, (c, n))| (k, c as f64 / n as f64)).collect(),
        accuracy: correct.len() as f64 / sols.len().max(1) as f64,
        ci95: bootstrap(&per_problem, 1000, &mut rng),
        majority,
        lucky_correct: lucky as f64 / correct.len().max(1) as f64,
    })
}

/// What every RL run needs besides its reward: the policy, the problems, the task.
pub struct RlBase<'a> {
    /// Sizes and budgets.
    pub preset: &'a Preset,
    /// The run's seed.
    pub seed: u64,
    /// The run folder (the policy lives in `policy/`).
    pub out: &'a Path,
    /// The starting policy (also the KL reference).
    pub policy: &'a Model,
    /// The lab tokenizer.
    pub tok: &'a Tokenizer,
    /// Grading and the oracle.
    pub task: &'a LabTask,
    /// Training prompts.
    pub train: &'a [LabProblem],
    /// Held-out problems.
    pub eval: &'a [LabProblem],
}

/// Inputs of [`rl_stage`]: the runs' common inputs and the trained verifiers as rewards.
pub struct RlInputs<'a> {
    /// What every run needs.
    pub base: RlBase<'a>,
    /// The ORM.
    pub orm: &'a dyn StepScorer,
    /// PRM-MC.
    pub prm_mc: &'a dyn StepScorer,
    /// PRM-oracle.
    pub prm_oracle: &'a dyn StepScorer,
}

/// The reward sources that need no trained verifier: PRIME, the outcome and the oracle.
const WITHOUT_VERIFIERS: [&str; 3] = [PRIME, "outcome", "oracle"];

/// Run RL against every reward source (the runs train at once, one thread each) and measure the
/// policies. Each run's folder (`rl_<reward>/`) holds its checkpoints and resumes, so a run
/// [`without_verifiers`] finished earlier is read back.
pub fn rl_stage(i: &RlInputs<'_>) -> Result<RlReport> {
    let b = &i.base;
    let (outcome, oracle) = (OutcomeReward { task: b.task }, OracleReward { task: b.task });
    let scorer = |name: &str, scorer, kind| ScorerReward {
        name: name.into(),
        scorer,
        kind,
    };
    let (orm, prm_mc, prm_oracle) = (
        scorer("orm", i.orm, RewardKind::Outcome),
        scorer("prm_mc", i.prm_mc, RewardKind::Process),
        scorer("prm_oracle", i.prm_oracle, RewardKind::Process),
    );
    let sources: [(&str, &dyn Reward); 6] = [
        ("outcome", &outcome),
        ("orm", &orm),
        ("prm_mc", &prm_mc),
        ("prm_oracle", &prm_oracle),
        // PRIME optimises the outcome, with its implicit PRM's token rewards beside it.
        (PRIME, &outcome),
        ("oracle", &oracle),
    ];
    let before = before_rl(b)?;
    let variants = super::all_at_once(&sources, "RL", |&(name, reward)| run_variant(b, name, reward, &before))?;
    let p = b.preset;
    let paired = paired_with_outcome(&variants, p.rl.eval_samples, b.seed ^ 8);
    Ok(RlReport {
        eval_samples: p.rl.eval_samples,
        budget: (p.rl.updates, p.rl.prompts, p.rl.group),
        variants,
        paired,
        prime: Some(prime_config(p)),
    })
}

/// The RL runs whose rewards need no trained verifier (`WITHOUT_VERIFIERS`), one after
/// another on the calling thread, left in their folders for [`rl_stage`]: the lab starts them
/// beside the stages before RL, on the cores those leave idle. Their results are those of
/// [`rl_stage`]'s own runs (the same seeds, a run on a thread of its own either way). `stop`
/// ends it after the run it is on.
pub fn without_verifiers(b: &RlBase<'_>, stop: &std::sync::atomic::AtomicBool) -> Result<()> {
    let (outcome, oracle) = (OutcomeReward { task: b.task }, OracleReward { task: b.task });
    let before = before_rl(b)?;
    for name in WITHOUT_VERIFIERS {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        let reward: &dyn Reward = if name == "oracle" { &oracle } else { &outcome };
        run_variant(b, name, reward, &before)?;
    }
    Ok(())
}

/// The starting policy measured on the held-out problems (its samples kept, resumable).
pub(crate) fn before_rl(b: &RlBase<'_>) -> Result<PolicyMeasure> {
    let start = super::policy::lab_policy(b.policy, b.tok, b.preset.policy.temperature);
    sampled_measure(
        b,
        &start,
        &b.out.join("rl_before_samples.jsonl"),
        "sampling (before RL)",
    )
}

fn prime_config(p: &Preset) -> PrimeConfig {
    PrimeConfig {
        beta: p.rl.prime_beta,
        lr: p.rl.prime_lr,
        ..Default::default()
    }
}

/// One reward source's run from the policy (resumed from its folder, `rl_<name>/`), and the
/// policy it leaves measured on the held-out problems.
fn run_variant(b: &RlBase<'_>, name: &str, reward: &dyn Reward, before: &PolicyMeasure) -> Result<RlVariant> {
    let p = b.preset;
    let prompts: Vec<Problem> = b.train.iter().map(LabProblem::problem).collect();
    let oracle = OracleReward { task: b.task };
    let watch: &dyn Reward = &oracle;
    let dir = b.out.join(format!("rl_{name}"));
    let policy_dir = b.out.join("policy");
    let cfg = RlConfig {
        prime: (name == PRIME).then(|| prime_config(p)),
        ..rl_config(p, b.seed)
    };
    let load = |varmap: &VarMap| -> Result<Model> {
        let config = ModelConfig::from_dir(&policy_dir)?;
        Model::load_trainable(&policy_dir, config, varmap, &Device::Cpu, cfg.seed)
    };
    let varmap = VarMap::new();
    let mut model = load(&varmap)?;
    // PRIME's implicit PRM starts from the policy, as the policy does.
    let prm_varmap = VarMap::new();
    let mut prm = cfg.prime.map(|_| load(&prm_varmap)).transpose()?;
    std::fs::create_dir_all(&dir)?;
    crate::vocab::save(&dir, p.domain)?;
    let pb = bar(cfg.updates as u64, &format!("RL ({name})"));
    let log: Vec<UpdateLog> = train_rl(
        RlRun {
            learner: &mut CandleLearner::new(&mut model)?,
            reference: Reference::Model(b.policy),
            tokenizer: b.tok,
            prompt: Prompt::Pieces,
            separator: SEP.into(),
            stop_token_ids: b.tok.token_id(EOS).into_iter().collect(),
            problems: &prompts,
            task: b.task,
            reward,
            watch: vec![watch],
            out_dir: Some(dir.clone()),
            heldout: None,
            implicit_prm: prm.as_mut().map(ImplicitPrm::Candle),
        },
        &cfg,
        |l| {
            pb.set_position(l.update as u64);
            pb.set_prefix(format!("reward {:.2} acc {:.2} kl {:.3}", l.reward, l.accuracy, kl(l)));
        },
    )?;
    pb.finish_and_clear();
    let after_policy = super::policy::lab_policy(&model, b.tok, p.policy.temperature);
    let what = format!("sampling (after RL, {name})");
    let after = sampled_measure(b, &after_policy, &dir.join("eval_samples.jsonl"), &what)?;
    Ok(variant(name, log, before, after, &cfg))
}

/// `policy` measured on the held-out problems from its samples (kept at `path`, resumable; the
/// same seed for every policy).
pub(crate) fn sampled_measure(
    i: &RlBase<'_>,
    policy: &stepwise_model::EnginePolicy,
    path: &Path,
    what: &str,
) -> Result<PolicyMeasure> {
    let sols = sample_stage(path, what, i.eval, i.preset.rl.eval_samples, policy, i.seed ^ 7)?;
    measure(&sols, i.seed ^ 7)
}

/// The lab's RL settings (every reward source alike).
fn rl_config(p: &crate::preset::Preset, seed: u64) -> RlConfig {
    RlConfig {
        updates: p.rl.updates,
        prompts_per_update: p.rl.prompts,
        group_size: p.rl.group,
        epochs: 1,
        minibatch_size: p.rl.prompts * p.rl.group,
        lr: p.rl.lr,
        warmup: p.rl.updates / 10,
        kl_coef: p.rl.kl,
        credit: Credit::ReturnToGo,
        temperature: p.policy.temperature,
        max_new_tokens: 64,
        seed: seed ^ 6,
        checkpoint_every: 10,
        ..Default::default()
    }
}

/// One reward source's run summarised: the policy measured before and after, the log's first
/// and last updates, PRIME's implicit PRM.
fn variant(name: &str, log: Vec<UpdateLog>, before: &PolicyMeasure, after: PolicyMeasure, cfg: &RlConfig) -> RlVariant {
    let last = log.last().cloned().unwrap_or_default();
    let oracle_of = |l: &UpdateLog| l.watched.get("oracle").copied().unwrap_or(0.0);
    RlVariant {
        reward: name.into(),
        accuracy_before: before.accuracy,
        accuracy_after: after.accuracy,
        ci95: after.ci95,
        lucky_correct_before: before.lucky_correct,
        lucky_correct_after: after.lucky_correct,
        majority_before: before.majority,
        majority_after: after.majority,
        sampled_tokens: last.sampled_tokens,
        updates: log.len(),
        kl: first_last(&log, kl).1,
        reward_first_last: first_last(&log, |l| l.reward),
        oracle_first_last: first_last(&log, oracle_of),
        implicit_prm_accuracy: cfg
            .prime
            .map(|_| first_last(&log, |l| l.implicit_prm.map_or(0.0, |p| p.accuracy))),
        kept_groups: cfg.prime.map(|_| {
            log.iter()
                .map(|l| l.implicit_prm.map_or(0.0, |p| p.kept_groups))
                .sum::<f64>()
                / log.len().max(1) as f64
        }),
        log,
        per_problem: after.per_problem,
    }
}

/// Each source's accuracy after RL paired with outcome-only RL's, problem by problem.
fn paired_with_outcome(variants: &[RlVariant], samples: usize, seed: u64) -> Vec<PairedDifference> {
    let measure = format!("accuracy after RL ({samples} samples a problem)");
    match variants.iter().find(|v| v.reward == "outcome") {
        Some(outcome) => variants
            .iter()
            .filter(|v| v.reward != "outcome")
            .map(|v| {
                paired_by_id(
                    &measure,
                    &v.reward,
                    &v.per_problem,
                    "outcome",
                    &outcome.per_problem,
                    seed,
                )
            })
            .collect(),
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepwise_core::Step;

    fn sol(problem: &str, k: usize, answer: &str, correct: bool, verdicts: &[bool]) -> Solution {
        let mut meta = stepwise_core::Meta::new();
        meta.insert("oracle".into(), serde_json::json!(verdicts));
        Solution {
            id: format!("{problem}-{k}"),
            problem_id: problem.into(),
            steps: verdicts.iter().map(|_| Step::new("x")).collect(),
            final_answer: Some(answer.into()),
            correct: Some(correct),
            meta,
            ..Default::default()
        }
    }

    #[test]
    fn measure_counts_accuracy_majority_and_lucky_answers() {
        let sols = [
            // p: 2 of 3 correct, one of them through a wrong step; the majority (7) is right.
            sol("p", 0, "7", true, &[true, true]),
            sol("p", 1, "7", true, &[false, true]),
            sol("p", 2, "8", false, &[true, false]),
            // q: 1 of 3 correct; the majority (5) is wrong.
            sol("q", 0, "5", false, &[false, false]),
            sol("q", 1, "5", false, &[true, false]),
            sol("q", 2, "6", true, &[true, true]),
        ];
        let m = measure(&sols, 0).unwrap();
        assert!((m.accuracy - 0.5).abs() < 1e-12);
        assert!((m.majority - 0.5).abs() < 1e-12);
        assert!((m.lucky_correct - 1.0 / 3.0).abs() < 1e-12);
        assert!(m.ci95.0 <= m.accuracy && m.accuracy <= m.ci95.1);
    }
}
