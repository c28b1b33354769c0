//! Stage 7, test-time search: every search method guided by PRM-oracle, PRM-MC and the oracle
//! itself (the ceiling a verifier can reach), on the same held-out problems (a split of their
//! own) with the same draws, at several budgets; accuracy against the tokens each generated. The
//! threshold `τ` of verify → resample is calibrated on the evaluation samples (other problems)
//! and written into each verifier's folder. Each configuration's results are journalled in
//! `search/`, so an interrupted run resumes.

use crate::oracle::LabTask;
use crate::preset::Preset;
use crate::progress::bar;
use crate::task::LabProblem;
use anyhow::Result;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Instant;
use stepwise_core::seams::{CheckerScorer, Policy, StepScorer};
use stepwise_core::Solution;
use stepwise_eval::bon::bootstrap;
use stepwise_eval::paired::{paired_by_id, PairedDifference};
use stepwise_model::{IncrementalScorer, PrmScorer};
use stepwise_search::calibrate::scored_steps;
use stepwise_search::{calibrate, compute_of, method, Aggregation, Job, SearchConfig, Searcher, Threshold};

/// The oracle's name as a verifier.
pub const ORACLE: &str = "oracle";

/// One method with one verifier at one budget.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SearchPoint {
    /// `sample` (one sample, no verifier), `bon`, `beam`, `dvts`, `lookahead` or `resample`.
    pub method: String,
    /// `prm_oracle`, `prm_mc` or `oracle` (`-` for a single sample).
    pub verifier: String,
    /// `N`.
    pub n: usize,
    /// `M`.
    pub width: usize,
    /// `N` times the tokens of one sample: the budget `N` stands for.
    pub budget_tokens: f64,
    /// Accuracy of the chosen solutions.
    pub accuracy: f64,
    /// Bootstrap 95% interval over problems.
    pub ci95: (f64, f64),
    /// Tokens generated per problem (mean).
    pub generated_tokens: f64,
    /// Tokens the verifier encoded per problem (mean).
    pub encoded_tokens: f64,
    /// Steps rejected per problem (verify → resample).
    pub rejected_steps: f64,
    /// Wall seconds per problem (two problems searched at once).
    pub seconds: f64,
}

/// Incremental scoring measured: the same beam search scored incrementally and from scratch.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct IncrementalMeasure {
    /// Problems searched.
    pub problems: usize,
    /// The search's `N`.
    pub n: usize,
    /// Tokens encoded incrementally.
    pub encoded_tokens: usize,
    /// Tokens encoded re-scoring every text whole.
    pub whole_tokens: usize,
    /// `whole_tokens / encoded_tokens`.
    pub ratio: f64,
    /// Wall seconds, incrementally and whole.
    pub seconds: (f64, f64),
    /// Problems whose chosen solution is the same both ways.
    pub same_choice: usize,
}

/// The search stage's results.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SearchReport {
    /// Problems searched.
    pub problems: usize,
    /// Problems (other than those searched) whose samples calibrated `τ`.
    pub calibration_problems: usize,
    /// Tokens of one sample (mean): the unit of `budget_tokens`.
    pub sample_tokens: f64,
    /// Verify → resample: most resamples per step.
    pub max_resamples: usize,
    /// `τ` of each verifier.
    pub thresholds: Vec<Threshold>,
    /// Every method, verifier and budget.
    pub methods: Vec<SearchPoint>,
    /// Incremental against whole scoring.
    pub incremental: Option<IncrementalMeasure>,
    /// At the largest budget, for each verifier, DVTS and beam search against best-of-N on the
    /// same problems: mean per-problem difference in accuracy with a paired bootstrap interval.
    #[serde(default)]
    pub paired: Vec<PairedDifference>,
}

/// What the search stage needs from the rest of the run.
pub struct SearchInputs<'a> {
    /// Sizes and budgets.
    pub preset: &'a Preset,
    /// The run's seed.
    pub seed: u64,
    /// The run folder.
    pub out: &'a Path,
    /// The policy.
    pub policy: &'a dyn Policy,
    /// Grading and the oracle.
    pub task: &'a LabTask,
    /// The problems searched.
    pub problems: &'a [LabProblem],
    /// Samples of other problems, oracle-labelled and scored by every verifier: `τ` is
    /// calibrated on them.
    pub calibration: &'a [Solution],
    /// PRM-MC and PRM-oracle, by name, with their folders.
    pub prms: [(&'a str, PrmScorer<'a>, &'a Path); 2],
}

/// Width `M` for budget `N`: about `√N`, at least 2.
fn width(n: usize) -> usize {
    ((n as f64).sqrt().round() as usize).max(2)
}

/// The threshold of `name`, calibrated on `calib` (oracle-labelled, scored under `name`).
fn threshold(calib: &[Solution], name: &str, precision: f64) -> Result<Threshold> {
    let steps = scored_steps(calib, name)?;
    Ok(calibrate(&steps, precision, name).unwrap_or(Threshold {
        // No threshold reaches the precision: verify → resample accepts every step.
        tau: 0.0,
        target_precision: precision,
        precision: 0.0,
        recall: 0.0,
        steps: steps.len(),
        bad_steps: steps.iter().filter(|s| s.1).count(),
        verifier: name.to_string(),
    }))
}

/// Run every configuration and measure incremental scoring.
pub fn search_stage(i: &SearchInputs<'_>) -> Result<SearchReport> {
    let p = i.preset;
    let searched = i.problems;
    let (calib, thresholds) = calibrated_thresholds(i)?;
    let oracle = CheckerScorer { task: i.task };
    let jobs: Vec<Job<'_>> = searched.iter().map(job).collect();
    let base = base_config(p, i.seed);
    let dir = i.out.join("search");
    std::fs::create_dir_all(&dir)?;
    let runner = Runner {
        i,
        jobs: &jobs,
        dir: &dir,
        oracle: &oracle,
    };
    let run = |name: &str, verifier: &str, config: &SearchConfig| runner.run(name, verifier, config);
    let mut rng_seed = i.seed ^ 9;
    let mut point = |name: &str, verifier: &str, config: &SearchConfig, sols: &[Solution]| -> Result<SearchPoint> {
        rng_seed += 1;
        Ok(search_point(name, verifier, config, sols, rng_seed))
    };

    // One sample: the unit of the budgets (no verifier chooses anything).
    let mut methods = Vec::new();
    let mut largest: Largest = Default::default();
    let single = run("bon", ORACLE, &base)?;
    let mut one = point("sample", "-", &base, &single)?;
    let sample_tokens = one.generated_tokens;
    one.budget_tokens = sample_tokens;
    methods.push(one);
    for verifier in [i.prms[0].0, i.prms[1].0, ORACLE] {
        for &n in &p.search.budgets {
            let config = SearchConfig {
                n,
                width: width(n),
                ..base.clone()
            };
            let mut names = vec!["bon", "beam", "dvts"];
            if n <= 16 {
                names.push("lookahead");
            }
            for name in names {
                let sols = run(name, verifier, &config)?;
                methods.push(point(name, verifier, &config, &sols)?);
                if Some(&n) == p.search.budgets.iter().max() {
                    let right = sols
                        .iter()
                        .map(|s| (s.problem_id.clone(), f64::from(u8::from(s.correct == Some(true)))))
                        .collect();
                    largest.insert((name, verifier), right);
                }
            }
        }
        let tau = thresholds
            .iter()
            .find(|t| t.verifier == verifier)
            .map_or(0.5, |t| t.tau);
        let config = SearchConfig {
            threshold: tau,
            ..base.clone()
        };
        let sols = run("resample", verifier, &config)?;
        methods.push(point("resample", verifier, &config, &sols)?);
    }
    for m in &mut methods {
        m.budget_tokens = m.n as f64 * sample_tokens;
    }
    let paired = paired_at_largest(i, &largest);
    let incremental = measure_incremental(i, &base, &jobs)?;
    Ok(SearchReport {
        problems: searched.len(),
        calibration_problems: calib
            .iter()
            .map(|s| s.problem_id.as_str())
            .collect::<std::collections::HashSet<_>>()
            .len(),
        sample_tokens,
        max_resamples: p.search.resamples,
        thresholds,
        methods,
        incremental,
        paired,
    })
}

/// Runs one search configuration over the problems, resumable in its own file.
struct Runner<'a> {
    i: &'a SearchInputs<'a>,
    jobs: &'a [Job<'a>],
    dir: &'a Path,
    oracle: &'a CheckerScorer<'a>,
}

impl Runner<'_> {
    /// Each configuration scores with a fresh cache, so that its encoded tokens are its own.
    fn run(&self, name: &str, verifier: &str, config: &SearchConfig) -> Result<Vec<Solution>> {
        let m = method(name)?;
        let prm = self.i.prms.iter().find(|(n, _, _)| *n == verifier);
        let incremental = prm.map(|(_, s, _)| IncrementalScorer::new(s.clone()));
        let scorer: &dyn StepScorer = match &incremental {
            Some(s) => s,
            None => self.oracle,
        };
        let label = format!("{name}-{verifier}-n{}", config.n);
        let pb = bar(
            self.jobs.len() as u64,
            &format!("search ({name}, {verifier}, N = {})", config.n),
        );
        let out = Searcher {
            method: &*m,
            config,
            policy: self.i.policy,
            scorer,
            verifier,
            task: self.i.task,
            threads: 2,
        }
        .run_all(&self.dir.join(format!("{label}.jsonl")), self.jobs, &|d| {
            pb.set_position(d as u64)
        })?;
        pb.finish_and_clear();
        Ok(out)
    }
}

/// The calibration samples (the oracle's verdicts as its scores: its τ is 0.5 at precision 1)
/// and each verifier's threshold τ at the preset's precision, saved in each PRM's folder.
fn calibrated_thresholds(i: &SearchInputs<'_>) -> Result<(Vec<Solution>, Vec<Threshold>)> {
    let p = i.preset;
    let mut calib = i.calibration.to_vec();
    for s in &mut calib {
        let verdicts: Vec<f32> = s
            .steps
            .iter()
            .map(|st| st.label.as_ref().map_or(0.0, |l| f32::from(u8::from(l.is_good()))))
            .collect();
        s.set_scores(ORACLE, verdicts);
    }
    let mut thresholds = Vec::new();
    for (name, _, dir) in &i.prms {
        let t = threshold(&calib, name, p.search.precision)?;
        t.save(dir)?;
        thresholds.push(t);
    }
    thresholds.push(threshold(&calib, ORACLE, p.search.precision)?);

    Ok((calib, thresholds))
}

/// A problem as a search job.
fn job(q: &LabProblem) -> Job<'_> {
    Job {
        id: q.id.clone(),
        problem_id: &q.id,
        question: &q.question,
        gold_answer: Some(&q.gold),
    }
}

/// The search settings every configuration starts from (one sample, min aggregation).
fn base_config(p: &Preset, seed: u64) -> SearchConfig {
    SearchConfig {
        n: 1,
        width: 1,
        max_steps: 16,
        aggregation: Aggregation::Min,
        lookahead: 1,
        threshold: 0.5,
        max_resamples: p.search.resamples,
        resample_budget: 4 * p.search.resamples,
        seed: seed ^ 8,
    }
}

/// One configuration's accuracy (with its bootstrap interval, drawn from `seed`) and compute per
/// problem.
fn search_point(name: &str, verifier: &str, config: &SearchConfig, sols: &[Solution], seed: u64) -> SearchPoint {
    let computes: Vec<_> = sols.iter().filter_map(compute_of).collect();
    let mean = |f: &dyn Fn(&stepwise_search::Compute) -> f64| {
        computes.iter().map(f).sum::<f64>() / computes.len().max(1) as f64
    };
    let correct: Vec<f64> = sols
        .iter()
        .map(|s| f64::from(u8::from(s.correct == Some(true))))
        .collect();
    SearchPoint {
        method: name.into(),
        verifier: verifier.into(),
        n: config.n,
        width: config.width,
        budget_tokens: 0.0,
        accuracy: correct.iter().sum::<f64>() / correct.len().max(1) as f64,
        ci95: bootstrap(&correct, 1000, &mut ChaCha8Rng::seed_from_u64(seed)),
        generated_tokens: mean(&|c| c.generated_tokens as f64),
        encoded_tokens: mean(&|c| c.encoded_tokens as f64),
        rejected_steps: mean(&|c| c.rejected_steps as f64),
        seconds: mean(&|c| c.seconds),
    }
}

/// Beam search and DVTS against best-of-N at the largest budget, problem by problem.
fn paired_at_largest(i: &SearchInputs<'_>, largest: &Largest) -> Vec<PairedDifference> {
    let p = i.preset;
    let mut paired = Vec::new();
    if let Some(n) = p.search.budgets.iter().max() {
        for verifier in [i.prms[0].0, i.prms[1].0, ORACLE] {
            for name in ["dvts", "beam"] {
                if let (Some(xs), Some(ys)) = (largest.get(&(name, verifier)), largest.get(&("bon", verifier))) {
                    let measure = format!("search accuracy at N = {n} ({verifier})");
                    paired.push(paired_by_id(&measure, name, xs, "bon", ys, i.seed ^ 10));
                }
            }
        }
    }
    paired
}

/// Each configuration's correctness per problem at the largest budget, by (method, verifier).
type Largest<'a> = std::collections::BTreeMap<(&'a str, &'a str), std::collections::BTreeMap<String, f64>>;

/// Beam search at the largest budget with PRM-oracle on up to ten problems, scored
/// incrementally and from scratch: tokens encoded, time, and whether the choices agree.
fn measure_incremental(
    i: &SearchInputs<'_>,
    base: &SearchConfig,
    jobs: &[Job<'_>],
) -> Result<Option<IncrementalMeasure>> {
    let Some(&n) = i.preset.search.budgets.iter().max() else {
        return Ok(None);
    };
    let config = SearchConfig {
        n,
        width: width(n),
        ..base.clone()
    };
    let jobs = &jobs[..jobs.len().min(10)];
    let (name, prm, _) = &i.prms[1];
    let incremental = IncrementalScorer::new(prm.clone());
    let beam = method("beam")?;
    let searcher = |scorer: &dyn StepScorer| -> Result<(Vec<Solution>, f64, usize)> {
        let clock = Instant::now();
        let s = Searcher {
            method: &*beam,
            config: &config,
            policy: i.policy,
            scorer,
            verifier: name,
            task: i.task,
            threads: 1,
        };
        let sols = jobs.iter().map(|j| s.record(j)).collect::<Result<Vec<_>>>()?;
        let tokens = sols.iter().filter_map(compute_of).map(|c| c.encoded_tokens).sum();
        Ok((sols, clock.elapsed().as_secs_f64(), tokens))
    };
    let pb = bar(2, "incremental vs whole scoring");
    let (inc, inc_secs, inc_tokens) = searcher(&incremental)?;
    pb.inc(1);
    let (whole, whole_secs, whole_tokens) = searcher(prm)?;
    pb.finish_and_clear();
    Ok(Some(IncrementalMeasure {
        problems: jobs.len(),
        n,
        encoded_tokens: inc_tokens,
        whole_tokens,
        ratio: whole_tokens as f64 / inc_tokens.max(1) as f64,
        seconds: (inc_secs, whole_secs),
        same_choice: inc.iter().zip(&whole).filter(|(a, b)| a.steps == b.steps).count(),
    }))
}
