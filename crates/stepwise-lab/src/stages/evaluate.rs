//! Stage 6, evaluation on held-out problems: best-of-N curves (overall and by problem family),
//! first-error localisation with ProcessBench's metric, ranking quality, Monte Carlo label
//! quality and calibration. Writing them out is [`crate::report`]'s job.

use crate::preset::Preset;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use stepwise_core::Solution;
use stepwise_eval::bon::{curve, per_problem_accuracy, Curve, Method};
use stepwise_eval::labels::{calibration, label_quality, LabelQuality};
use stepwise_eval::paired::{paired_difference, PairedDifference};
use stepwise_eval::processbench::{predict_first_error, score, ProcessBenchScore};
use stepwise_eval::ranking::{discrimination, Discrimination};
use stepwise_search::{aggregate, group_candidates, Aggregation, Candidate, Selector};

fn arithmetic() -> String {
    "arithmetic".into()
}

/// Everything the lab measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// Preset name.
    pub preset: String,
    /// The reasoning domain (`arithmetic` or `code`).
    #[serde(default = "arithmetic")]
    pub domain: String,
    /// Seed.
    pub seed: u64,
    /// Held-out problems and samples per problem.
    pub eval_problems: usize,
    /// Samples per evaluation problem.
    pub eval_samples: usize,
    /// How the verifiers were built and trained.
    #[serde(default)]
    pub verifiers: String,
    /// Single-sample accuracy of the policy on held-out problems.
    pub policy_accuracy: f64,
    /// Of the samples with a correct final answer, the fraction whose process the oracle rejects.
    pub lucky_correct_rate: f64,
    /// Best-of-N curves.
    pub bon: Vec<Curve>,
    /// Best-of-N at the largest N on each problem family: where each method wins and loses.
    #[serde(default)]
    pub by_family: Vec<FamilyRow>,
    /// First-error localisation on held-out samples, by verifier.
    pub processbench: Vec<(String, ProcessBenchScore)>,
    /// Ranking quality on held-out samples, by verifier (PRMs ranked by their min step score).
    #[serde(default)]
    pub discrimination: Vec<(String, Discrimination)>,
    /// Monte Carlo labels against the oracle: hard (any rollout succeeded) and soft.
    pub mc_label_quality: LabelQuality,
    /// Rollouts spent per labelled step.
    pub rollouts_per_step: f64,
    /// Calibration bins of step scores against oracle labels, by verifier.
    pub calibration: Vec<stepwise_eval::labels::CalibrationSeries>,
    /// Plot files written (or why not).
    pub plots: Vec<String>,
    /// Test-time search with every method and verifier (absent when the preset skips it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<super::search::SearchReport>,
    /// Step labels from each source against the oracle, with their cost.
    #[serde(default)]
    pub labels: super::labels::Labels,
    /// RL against each reward source (absent when the preset skips it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rl: Option<super::rl::RlReport>,
    /// DPO on each label source's preference pairs (absent when the preset skips it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dpo: Option<super::dpo::DpoReport>,
    /// The judge as a generative verifier against a PRM trained on the same oracle labels
    /// (absent without a judge); their curves, ProcessBench rows and paired differences are
    /// with the others'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generative: Option<Generative>,
    /// Best-of-N at the largest N, method against method on the same problems: the mean
    /// per-problem difference with a paired bootstrap interval.
    #[serde(default)]
    pub paired: Vec<PairedDifference>,
    /// Human labels from simulated labellers in the studio, by selection policy (absent when
    /// the preset skips the stage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub studio: Option<super::studio::StudioReport>,
    /// Wall-clock seconds of each stage of the run that wrote the report.
    #[serde(default)]
    pub stage_seconds: Vec<crate::progress::StageSeconds>,
}

/// The judge as a generative verifier, at equal labels with a PRM.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Generative {
    /// Oracle-labelled solutions both were trained on.
    pub labelled_solutions: usize,
    /// Verdicts the judge samples per solution.
    pub samples: usize,
    /// Tokens the judge wrote per verified solution (a PRM writes none: one forward pass over
    /// the solution).
    pub tokens_per_solution: f64,
    /// The judge with a calculator, when the preset trains one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calculator: Option<CalculatorJudge>,
    /// The judge that writes a verification chain (each equation step worked again, a verdict
    /// on each step up to the first wrong one), when the preset trains one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<JudgeCost>,
    /// The judge asked at each step that works it again before its verdict, when the preset
    /// trains one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worked: Option<JudgeCost>,
    /// Its control, asked at each step, giving its verdict without working the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct: Option<JudgeCost>,
    /// Seconds the judge took to score the held-out samples by sampled verdicts, on the run's
    /// machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// The judges weighed by likelihood as well, when the preset weighs them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub likelihood: Vec<Weighed>,
}

/// A judge weighed by likelihood: what it cost beside its sampled verdicts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Weighed {
    /// The verifier its likelihood scores are kept under.
    pub verifier: String,
    /// Seconds it took to score the held-out samples by likelihood.
    pub seconds: f64,
    /// Seconds the same judge took by sampled verdicts.
    pub votes_seconds: f64,
    /// Tokens it wrote per verified solution (none, unless it works each step first).
    pub tokens_per_solution: f64,
}

/// What a judge wrote.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JudgeCost {
    /// Tokens it wrote per verified solution (every sample).
    pub tokens_per_solution: f64,
}

/// The judge with a calculator (a tool called once per equation step it reads).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CalculatorJudge {
    /// Tokens it wrote per verified solution.
    pub tokens_per_solution: f64,
    /// Calculator calls per verified solution (its equation steps).
    pub calls_per_solution: f64,
}

/// Best-of-N accuracy on one problem family, by method.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FamilyRow {
    /// Template family.
    pub family: String,
    /// Held-out problems of the family.
    pub problems: usize,
    /// Samples per problem the methods select from.
    pub n: usize,
    /// `(method, accuracy)` in the order of the best-of-N curves.
    pub accuracy: Vec<(String, f64)>,
}

/// Each method's best-of-`n` accuracy on the problems of each family (`families[i]` is problem
/// `i`'s), families in order of first appearance.
fn by_family(
    families: &[String],
    methods: &[(String, &[Vec<Candidate>], Method)],
    n: usize,
    draws: usize,
    seed: u64,
) -> Vec<FamilyRow> {
    let mut members: Vec<(&String, Vec<usize>)> = Vec::new();
    for (i, f) in families.iter().enumerate() {
        match members.iter_mut().find(|(name, _)| *name == f) {
            Some((_, idx)) => idx.push(i),
            None => members.push((f, vec![i])),
        }
    }
    members
        .into_iter()
        .map(|(family, idx)| {
            let accuracy = methods
                .iter()
                .map(|(name, g, how)| {
                    let subset: Vec<Vec<Candidate>> = idx.iter().map(|&i| g[i].clone()).collect();
                    let c = curve(name, &subset, *how, &[n], draws, seed);
                    (name.clone(), c.points[0].accuracy)
                })
                .collect();
            FamilyRow {
                family: family.clone(),
                problems: idx.len(),
                n,
                accuracy,
            }
        })
        .collect()
}

/// Verifier names under which the scored evaluation samples keep their step scores.
pub mod verifier {
    /// The PRM trained on Monte Carlo labels.
    pub const PRM_MC: &str = "prm_mc";
    /// The PRM trained on oracle labels.
    pub const PRM_ORACLE: &str = "prm_oracle";
    /// The PRM trained on binary-search (OmegaPRM) labels.
    pub const PRM_BINARY_SEARCH: &str = "prm_binary_search";
    /// The PRM trained on OmegaPRM's labels (the samples and the tree's new solutions).
    pub const PRM_OMEGAPRM: &str = "prm_omegaprm";
    /// The PRM trained on the judge's labels.
    pub const PRM_JUDGE: &str = "prm_judge";
    /// The PRM trained on consensus-filtered labels (MC kept where the judge agrees).
    pub const PRM_CONSENSUS: &str = "prm_consensus_judge";
    /// The PRM trained on exactly the oracle labels the judge was trained on (equal labels).
    pub const PRM_JUDGE_BUDGET: &str = "prm_oracle_judge_budget";
    /// The judge itself, a generative verifier (the share of its sampled verdicts).
    pub const JUDGE: &str = "judge";
    /// The judge with a calculator (each equation step's value shown), trained alike.
    pub const JUDGE_CALCULATOR: &str = "judge_calculator";
    /// The judge that writes a verification chain before its verdicts, trained alike.
    pub const JUDGE_CHAIN: &str = "judge_chain";
    /// The judge asked at each step, working it again before its verdict, trained alike.
    pub const JUDGE_WORKED: &str = "judge_worked";
    /// The judge asked at each step that gives its verdict without working the step (the
    /// control for the one that does).
    pub const JUDGE_DIRECT: &str = "judge_direct";
    /// The judge weighed by likelihood: the probability it gives each verdict, not sampled.
    pub const JUDGE_LIKELIHOOD: &str = "judge_likelihood";
    /// The judge with a calculator, weighed by likelihood.
    pub const JUDGE_CALCULATOR_LIKELIHOOD: &str = "judge_calculator_likelihood";
    /// The judge working each step, each of its sampled verdicts weighed by `P(yes)` after
    /// its working.
    pub const JUDGE_WORKED_LIKELIHOOD: &str = "judge_worked_likelihood";
    /// The judge at each step not working it, scored `P(yes)`: nothing sampled.
    pub const JUDGE_DIRECT_LIKELIHOOD: &str = "judge_direct_likelihood";

    /// The verifier under which a judge scored under `votes` keeps its likelihood scores.
    pub fn likelihood_of(votes: &str) -> Option<&'static str> {
        match votes {
            JUDGE => Some(JUDGE_LIKELIHOOD),
            JUDGE_CALCULATOR => Some(JUDGE_CALCULATOR_LIKELIHOOD),
            JUDGE_WORKED => Some(JUDGE_WORKED_LIKELIHOOD),
            JUDGE_DIRECT => Some(JUDGE_DIRECT_LIKELIHOOD),
            _ => None,
        }
    }
    /// The ORM (its last step's score is the solution's).
    pub const ORM: &str = "orm";
    /// The policy's confidence in each written result (a diagnostic baseline).
    pub const POLICY_CONFIDENCE: &str = "policy_confidence";
    /// The verifiers' own base LM's confidence, the same way (when they have one).
    pub const BASE_CONFIDENCE: &str = "base_confidence";
}

/// Each solution's step scores by `name` (checked present by [`group_candidates`]).
fn scores_by(scored: &[Solution], name: &str) -> Vec<Vec<f32>> {
    scored.iter().map(|s| s.scores_of(name).unwrap_or_default()).collect()
}

/// Compute the report from the evaluation samples (oracle-labelled, scored by every verifier),
/// the Monte Carlo and oracle labels of the annotation set, and the rollouts those cost.
pub fn evaluate(
    p: &Preset,
    seed: u64,
    eval_problems: usize,
    scored: &[Solution],
    mc: &[Solution],
    oracle: &[Solution],
    rollouts: usize,
) -> Result<Report> {
    use verifier::*;
    let groups = Groups::of(scored)?;
    let mut ns = vec![1];
    while ns.last().unwrap() * 2 <= p.evaluation.samples {
        ns.push(ns.last().unwrap() * 2);
    }
    let methods = groups.methods();
    let draws = 32;
    let bon: Vec<Curve> = methods
        .iter()
        .map(|(name, g, how)| curve(name, g, *how, &ns, draws, seed))
        .collect();
    let by_family = by_family(&families(scored), &methods, p.evaluation.samples, draws, seed);
    let (s_mc, s_or) = (scores_by(scored, PRM_MC), scores_by(scored, PRM_ORACLE));
    let calib = vec![
        ("PRM-MC".to_string(), calibration(&step_pairs(scored, &s_mc), 10)),
        ("PRM-oracle".to_string(), calibration(&step_pairs(scored, &s_or), 10)),
    ];
    let paired = paired_bon(p, seed, scored, &methods)?;
    let correct: Vec<&Solution> = scored.iter().filter(|s| s.correct == Some(true)).collect();
    let lucky = correct.iter().filter(|s| s.first_error().is_some()).count();
    let labelled_steps = mc.iter().map(|s| s.steps.len()).sum::<usize>().max(1);
    Ok(Report {
        preset: p.name.clone(),
        domain: p.domain.name().to_string(),
        seed,
        verifiers: p.verifier_summary(),
        eval_problems,
        eval_samples: p.evaluation.samples,
        policy_accuracy: correct.len() as f64 / scored.len().max(1) as f64,
        lucky_correct_rate: lucky as f64 / correct.len().max(1) as f64,
        bon,
        by_family,
        processbench: processbench_rows(scored, &groups),
        discrimination: groups.discrimination(scored),
        mc_label_quality: mc_label_quality(mc, oracle),
        rollouts_per_step: rollouts as f64 / labelled_steps as f64,
        calibration: calib,
        plots: Vec::new(),
        labels: Default::default(),
        search: None,
        rl: None,
        dpo: None,
        paired,
        generative: None,
        studio: None,
        stage_seconds: Vec::new(),
    })
}

/// The evaluation samples grouped by problem, each group ranked by one verifier: those every
/// run has, and those present only where the preset made them.
struct Groups {
    mc: Ranked,
    oracle: Ranked,
    policy: Ranked,
    /// The judge as a generative verifier, and the PRM on its oracle labels.
    judge: Option<(Ranked, Ranked)>,
    /// The other judges trained alike on the judge's labels, present where the preset trained
    /// them: `(verifier, best-of-N method, candidates)`, in [`OTHER_JUDGES`] order.
    others: Vec<(&'static str, &'static str, Ranked)>,
    /// What the verifiers' base knows before any label, when they have one.
    base: Option<Ranked>,
}

/// Candidates grouped by problem, scored by one verifier.
type Ranked = Vec<Vec<Candidate>>;

/// A best-of-N method: its name, the candidates it ranks (scored by which verifier) and how it
/// selects.
type BonMethod<'g> = (String, &'g [Vec<Candidate>], Method);

impl Groups {
    fn of(scored: &[Solution]) -> Result<Self> {
        use verifier::*;
        let by = |name: &str| group_candidates(scored, Some(name), Some(ORM));
        let present = |name: &str| scored.first().is_some_and(|s| s.scores_of(name).is_some());
        let if_present = |name: &str| present(name).then(|| by(name)).transpose();
        Ok(Groups {
            mc: by(PRM_MC)?,
            oracle: by(PRM_ORACLE)?,
            policy: by(POLICY_CONFIDENCE)?,
            judge: match if_present(JUDGE)? {
                Some(judge) => Some((judge, by(PRM_JUDGE_BUDGET)?)),
                None => None,
            },
            others: OTHER_JUDGES
                .iter()
                .filter_map(|&(verifier, method, _)| {
                    if_present(verifier)
                        .transpose()
                        .map(|r| r.map(|g| (verifier, method, g)))
                })
                .collect::<Result<_>>()?,
            base: if_present(BASE_CONFIDENCE)?,
        })
    }

    /// Every best-of-N method the run has.
    fn methods(&self) -> Vec<BonMethod<'_>> {
        let min = Some(Selector::Prm(Aggregation::Min));
        let mut methods: Vec<BonMethod> = Aggregation::ALL
            .iter()
            .map(|a| (format!("PRM-MC ({})", a.name()), &self.mc[..], Some(Selector::Prm(*a))))
            .collect();
        let vote = Some(Selector::PrmVote(Aggregation::Min));
        methods.extend([
            ("PRM-MC weighted vote".to_string(), &self.mc[..], vote),
            ("PRM-oracle (min)".to_string(), &self.oracle[..], min),
            ("PRM-oracle weighted vote".to_string(), &self.oracle[..], vote),
            ("ORM".to_string(), &self.mc[..], Some(Selector::Orm)),
            // A baseline, not a verifier: the policy's confidence in each written result, min over steps.
            ("policy confidence (min)".to_string(), &self.policy[..], min),
        ]);
        if let Some(base) = &self.base {
            methods.push(("verifiers' base confidence (min)".to_string(), &base[..], min));
        }
        if let Some((judge, budget)) = &self.judge {
            methods.push((JUDGE_METHOD.to_string(), &judge[..], min));
            methods.push((BUDGET_METHOD.to_string(), &budget[..], min));
        }
        for (_, method, ranked) in &self.others {
            methods.push((method.to_string(), &ranked[..], min));
        }
        methods.extend([
            ("majority vote".to_string(), &self.mc[..], Some(Selector::Majority)),
            ("pass@N".to_string(), &self.mc[..], None),
        ]);
        methods
    }

    /// Ranking quality by verifier (PRMs ranked by their min step score, and their step scores
    /// against the oracle's step labels).
    fn discrimination(&self, scored: &[Solution]) -> Vec<(String, Discrimination)> {
        use verifier::*;
        let labels: Vec<Vec<Option<bool>>> = scored
            .iter()
            .map(|s| {
                s.steps
                    .iter()
                    .map(|st| st.label.as_ref().map(|l| l.is_good()))
                    .collect()
            })
            .collect();
        let ranked = |groups: &[Vec<Candidate>], by: &dyn Fn(&Candidate) -> f32| -> Vec<Vec<(f32, bool)>> {
            groups
                .iter()
                .map(|g| g.iter().map(|c| (by(c), c.correct)).collect())
                .collect()
        };
        let by_min = |c: &Candidate| aggregate(&c.step_scores, Aggregation::Min);
        let steps = |name: &str, groups: &[Vec<Candidate>]| {
            discrimination(Some((&scores_by(scored, name), &labels)), &ranked(groups, &by_min))
        };
        let mut rows = vec![
            ("PRM-MC".to_string(), steps(PRM_MC, &self.mc)),
            ("PRM-oracle".to_string(), steps(PRM_ORACLE, &self.oracle)),
            (
                "ORM".to_string(),
                discrimination(None, &ranked(&self.mc, &|c| c.outcome_score)),
            ),
            (
                "policy confidence (diagnostic)".to_string(),
                steps(POLICY_CONFIDENCE, &self.policy),
            ),
        ];
        if let Some(base) = &self.base {
            rows.push((
                "verifiers' base confidence (diagnostic)".to_string(),
                steps(BASE_CONFIDENCE, base),
            ));
        }
        // The judges and the PRM on their labels, named as their best-of-N methods are.
        let named = |method: &str| method.trim_end_matches(" (min)").to_string();
        if let Some((judge, budget)) = &self.judge {
            rows.push((named(JUDGE_METHOD), steps(JUDGE, judge)));
            rows.push((named(BUDGET_METHOD), steps(PRM_JUDGE_BUDGET, budget)));
        }
        for (verifier, method, ranked) in &self.others {
            rows.push((named(method), steps(verifier, ranked)));
        }
        rows
    }
}

/// Each problem's family, in the order problems first appear.
fn families(scored: &[Solution]) -> Vec<String> {
    let mut families: Vec<String> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for s in scored {
        if seen.insert(s.problem_id.as_str()) {
            families.push(
                s.meta
                    .get("family")
                    .and_then(|f| f.as_str())
                    .unwrap_or("unknown")
                    .to_string(),
            );
        }
    }
    families
}

/// First-error localisation (ProcessBench's metric, threshold 0.5) by verifier.
fn processbench_rows(scored: &[Solution], groups: &Groups) -> Vec<(String, ProcessBenchScore)> {
    use verifier::*;
    let truth: Vec<Option<usize>> = scored.iter().map(|s| s.first_error()).collect();
    let pb = |name: &str| {
        score(
            &scores_by(scored, name)
                .iter()
                .zip(&truth)
                .map(|(s, t)| (predict_first_error(s, 0.5), *t))
                .collect::<Vec<_>>(),
        )
    };
    let mut rows = vec![
        ("PRM-MC".to_string(), pb(PRM_MC)),
        ("PRM-oracle".to_string(), pb(PRM_ORACLE)),
    ];
    if groups.judge.is_some() {
        rows.push((JUDGE_METHOD.into(), pb(JUDGE)));
        rows.push((BUDGET_METHOD.into(), pb(PRM_JUDGE_BUDGET)));
    }
    for &(verifier, method, _) in OTHER_JUDGES {
        if groups.others.iter().any(|(_, m, _)| *m == method) {
            rows.push((method.into(), pb(verifier)));
        }
    }
    rows
}

/// Monte Carlo labels of the annotation set against the oracle's, step by step.
fn mc_label_quality(mc: &[Solution], oracle: &[Solution]) -> LabelQuality {
    let mut pairs = Vec::new();
    for (m, o) in mc.iter().zip(oracle) {
        for (a, b) in m.steps.iter().zip(&o.steps) {
            if let (Some(x), Some(y)) = (&a.label, &b.label) {
                pairs.push((x.prob(1.0), y.is_good()));
            }
        }
    }
    label_quality(&pairs, 0.0)
}

/// `(score, oracle says good)` for every labelled step of the evaluation samples.
fn step_pairs(scored: &[Solution], scores: &[Vec<f32>]) -> Vec<(f32, bool)> {
    scored
        .iter()
        .zip(scores)
        .flat_map(|(s, sc)| {
            s.steps
                .iter()
                .zip(sc)
                .filter_map(|(st, &x)| st.label.as_ref().map(|l| (x, l.is_good())))
        })
        .collect()
}

/// The judge's best-of-N method and ProcessBench row.
const JUDGE_METHOD: &str = "judge, generative (min)";
/// The PRM on the judge's oracle labels.
const BUDGET_METHOD: &str = "PRM-oracle, judge's labels (min)";
/// The judges beside the judge: `(verifier, best-of-N method and ProcessBench row, the method
/// it is paired with besides the PRM on the judge's labels)`. Those trained alike on the
/// judge's labels (with a calculator, writing a verification chain, asked at each step working
/// it again, and that one's control not working it) are paired with the judge; each judge
/// weighed by likelihood with itself scored by sampled votes.
const OTHER_JUDGES: &[(&str, &str, &str)] = &[
    (verifier::JUDGE_CALCULATOR, CALCULATOR_METHOD, JUDGE_METHOD),
    (
        verifier::JUDGE_CHAIN,
        "judge writing a chain, generative (min)",
        JUDGE_METHOD,
    ),
    (verifier::JUDGE_WORKED, WORKED_METHOD, JUDGE_METHOD),
    (verifier::JUDGE_DIRECT, DIRECT_METHOD, JUDGE_METHOD),
    (verifier::JUDGE_LIKELIHOOD, "judge, likelihood (min)", JUDGE_METHOD),
    (
        verifier::JUDGE_CALCULATOR_LIKELIHOOD,
        "judge + calculator, likelihood (min)",
        CALCULATOR_METHOD,
    ),
    (
        verifier::JUDGE_WORKED_LIKELIHOOD,
        "judge working each step, likelihood (min)",
        WORKED_METHOD,
    ),
    (
        verifier::JUDGE_DIRECT_LIKELIHOOD,
        "judge at each step, not working it, likelihood (min)",
        DIRECT_METHOD,
    ),
];
const CALCULATOR_METHOD: &str = "judge + calculator, generative (min)";
const WORKED_METHOD: &str = "judge working each step, generative (min)";
const DIRECT_METHOD: &str = "judge at each step, not working it, generative (min)";

/// Best-of-`eval_samples` comparisons on the same problems: the PRM against the ORM and the
/// majority vote, the oracle-label PRM against the MC one, and each other label source's PRM
/// (consensus, judge, binary search, OmegaPRM) against PRM-MC, where the samples carry its scores.
fn paired_bon(
    p: &Preset,
    seed: u64,
    scored: &[Solution],
    methods: &[(String, &[Vec<Candidate>], Method)],
) -> Result<Vec<PairedDifference>> {
    use verifier::*;
    let n = p.evaluation.samples;
    let measure = format!("best-of-{n} accuracy");
    let draws = 32;
    let of = |name: &str| {
        methods
            .iter()
            .find(|(m, _, _)| m == name)
            .map(|(_, g, how)| per_problem_accuracy(g, *how, n, draws, seed))
    };
    let by_min = |verifier: &str| -> Result<Option<Vec<f64>>> {
        if scored.first().and_then(|s| s.scores_of(verifier)).is_none() {
            return Ok(None);
        }
        let groups = group_candidates(scored, Some(verifier), None)?;
        Ok(Some(per_problem_accuracy(
            &groups,
            Some(Selector::Prm(Aggregation::Min)),
            n,
            draws,
            seed,
        )))
    };
    let mut out = Vec::new();
    let mc = of("PRM-MC (min)").unwrap_or_default();
    for other in ["ORM", "majority vote"] {
        if let Some(ys) = of(other) {
            out.push(paired_difference(&measure, "PRM-MC (min)", &mc, other, &ys, seed ^ 11));
        }
    }
    if let (Some(judge), Some(budget)) = (of(JUDGE_METHOD), of(BUDGET_METHOD)) {
        // The judge against the PRM on its labels and PRM-MC; each other judge against the
        // judge and that PRM.
        let mut pair = |a: &str, xs: &[f64], b: &str, ys: &[f64], salt: u64| {
            out.push(paired_difference(&measure, a, xs, b, ys, seed ^ salt));
        };
        pair(JUDGE_METHOD, &judge, BUDGET_METHOD, &budget, 14);
        pair(JUDGE_METHOD, &judge, "PRM-MC (min)", &mc, 15);
        for (k, &(_, method, against)) in OTHER_JUDGES.iter().enumerate() {
            if let (Some(xs), Some(ys)) = (of(method), of(against)) {
                pair(method, &xs, against, &ys, 16 + 2 * k as u64);
                pair(method, &xs, BUDGET_METHOD, &budget, 17 + 2 * k as u64);
            }
        }
    }
    if let Some(xs) = of("PRM-oracle (min)") {
        out.push(paired_difference(
            &measure,
            "PRM-oracle (min)",
            &xs,
            "PRM-MC (min)",
            &mc,
            seed ^ 12,
        ));
    }
    for (verifier, name) in [
        (PRM_CONSENSUS, "PRM-consensus (min)"),
        (PRM_JUDGE, "PRM-judge (min)"),
        (PRM_BINARY_SEARCH, "PRM-binary-search (min)"),
        (PRM_OMEGAPRM, "PRM-OmegaPRM (min)"),
    ] {
        if let Some(xs) = by_min(verifier)? {
            out.push(paired_difference(&measure, name, &xs, "PRM-MC (min)", &mc, seed ^ 13));
        }
    }
    Ok(out)
}
