//! Label sources side by side: per-step Monte Carlo (Math-Shepherd) and binary search for the
//! first error (OmegaPRM) on the same samples, with the same rollout seeds, each against the
//! oracle's labels and with what it cost.

use serde::{Deserialize, Serialize};
use stepwise_core::seams::Spent;
use stepwise_core::Solution;
use stepwise_eval::labels::label_quality;

/// One label source against the oracle.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LabelSource {
    /// `mc`, `binary_search`, `omegaprm`, `judge`, `consensus` or `oracle`.
    pub source: String,
    /// Labelled steps compared.
    pub steps: usize,
    /// Steps whose hard label (good when any rollout succeeded) is the oracle's.
    pub label_accuracy: f64,
    /// Of the oracle's bad steps, the fraction labelled bad.
    pub bad_recall: f64,
    /// Of the steps labelled bad, the fraction the oracle calls bad.
    pub bad_precision: f64,
    /// Solutions whose first labelled error is the oracle's first error (or both have none).
    pub first_error_agreement: f64,
    /// Rollouts sampled.
    pub rollouts: usize,
    /// Tokens those rollouts generated.
    pub generated_tokens: usize,
    /// Solutions labelled by hand (in the lab, by the oracle) that this source needed: the
    /// judge's training set, or every solution for `oracle`.
    #[serde(default)]
    pub human_labels: usize,
    /// New labelled solutions the annotation produced beside the samples (OmegaPRM's kept
    /// rollouts).
    #[serde(default)]
    pub new_solutions: usize,
    /// Their step labels' accuracy against the oracle.
    #[serde(default)]
    pub new_solutions_label_accuracy: Option<f64>,
    /// Fraction of the labelled solutions kept for training (1 unless filtered by consensus).
    #[serde(default)]
    pub retained_fraction: Option<f64>,
    /// ProcessBench F1 on the held-out samples of the PRM trained on these labels.
    #[serde(default)]
    pub processbench_f1: Option<f64>,
    /// Best-of-N accuracy (min aggregation) of that PRM, by N (`{"32": accuracy}`).
    #[serde(default)]
    pub bon: std::collections::BTreeMap<String, f64>,
    /// The step-level preference pairs (Step-DPO) these labels give, checked by the oracle.
    #[serde(default)]
    pub pairs: Option<PairQuality>,
}

/// Step-level preference pairs mined from one source's labels (`stepwise pairs`: a right next
/// step against a wrong one after the same sound prefix), each side checked by the oracle.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PairQuality {
    /// Pairs.
    pub pairs: usize,
    /// Problems with at least one pair.
    pub problems: usize,
    /// Pairs whose chosen step the oracle calls right and whose rejected step it calls wrong.
    pub precision: f64,
    /// Pairs whose chosen step is right.
    pub chosen_right: f64,
    /// Pairs whose rejected step is wrong.
    pub rejected_wrong: f64,
}

/// The pairs `labelled` gives (soft labels: chosen from 0.5, rejected at 0), against the
/// oracle's verdict on each side after the pair's prefix.
pub fn pair_quality(labelled: &[Solution], task: &crate::oracle::LabTask) -> PairQuality {
    quality_of_pairs(&stepwise_core::pairs::step_pairs(labelled, 0.5).0, task)
}

/// `pairs` against the oracle's verdict on each side after the pair's prefix.
pub fn quality_of_pairs(pairs: &[stepwise_core::pairs::StepPair], task: &crate::oracle::LabTask) -> PairQuality {
    use stepwise_core::seams::Task;
    let verdict = |p: &stepwise_core::pairs::StepPair, step: &str| -> bool {
        let mut steps = p.prefix.clone();
        steps.push(step.to_string());
        task.check_prefix(&p.problem_id, &steps)
            .and_then(|v| v.last().copied())
            .unwrap_or(false)
    };
    let (mut chosen, mut rejected, mut both) = (0usize, 0usize, 0usize);
    for p in pairs {
        let (c, r) = (verdict(p, &p.chosen), !verdict(p, &p.rejected));
        chosen += usize::from(c);
        rejected += usize::from(r);
        both += usize::from(c && r);
    }
    let n = pairs.len().max(1) as f64;
    let problems: std::collections::HashSet<&str> = pairs.iter().map(|p| p.problem_id.as_str()).collect();
    PairQuality {
        pairs: pairs.len(),
        problems: problems.len(),
        precision: both as f64 / n,
        chosen_right: chosen as f64 / n,
        rejected_wrong: rejected as f64 / n,
    }
}

/// Every label source of a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Labels {
    /// The model whose rollouts labelled the steps: `policy` or `verifier_base`.
    #[serde(default)]
    pub completer: String,
    /// The model the judge was fine-tuned from: `policy` or `verifier_base`.
    #[serde(default)]
    pub judge_start: String,
    /// In the order mc, binary_search, omegaprm, judge, consensus, oracle.
    pub sources: Vec<LabelSource>,
}

/// `labelled` (one labelled copy of each oracle-labelled solution) against `oracle`, on the
/// solutions that have labels.
pub fn compare(source: &str, labelled: &[Solution], oracle: &[Solution], spent: Spent) -> LabelSource {
    let mut pairs = Vec::new();
    let (mut agree, mut kept) = (0, 0);
    for (m, o) in labelled.iter().zip(oracle) {
        // A solution left without labels (consensus filtering dropped it) is not compared.
        if m.steps.iter().all(|st| st.label.is_none()) {
            continue;
        }
        kept += 1;
        for (a, b) in m.steps.iter().zip(&o.steps) {
            if let (Some(x), Some(y)) = (&a.label, &b.label) {
                pairs.push((x.prob(1.0), y.is_good()));
            }
        }
        agree += usize::from(m.first_error() == o.first_error());
    }
    let q = label_quality(&pairs, 0.0);
    LabelSource {
        source: source.into(),
        steps: q.steps,
        label_accuracy: q.hard_accuracy,
        bad_recall: q.bad_recall,
        bad_precision: q.bad_precision,
        first_error_agreement: agree as f64 / kept.max(1) as f64,
        rollouts: spent.rollouts,
        generated_tokens: spent.tokens,
        ..Default::default()
    }
}

impl LabelSource {
    /// Add what the PRM trained on these labels does on the held-out samples `scored` (its step
    /// scores under `verifier`): ProcessBench F1 and best-of-`n` accuracy with min aggregation,
    /// ranked among the candidates of each problem exactly as the report's curves are.
    pub fn with_prm(mut self, scored: &[Solution], verifier: &str, n: usize, seed: u64) -> anyhow::Result<Self> {
        use stepwise_eval::processbench::{predict_first_error, score};
        use stepwise_search::{group_candidates, Aggregation, Selector};
        let pairs: Vec<_> = scored
            .iter()
            .map(|s| {
                (
                    predict_first_error(&s.scores_of(verifier).unwrap_or_default(), 0.5),
                    s.first_error(),
                )
            })
            .collect();
        self.processbench_f1 = Some(score(&pairs).f1);
        let groups = group_candidates(scored, Some(verifier), None)?;
        let curve = stepwise_eval::bon::curve(verifier, &groups, Some(Selector::Prm(Aggregation::Min)), &[n], 32, seed);
        if let Some(point) = curve.points.first() {
            self.bon.insert(n.to_string(), point.accuracy);
        }
        self.retained_fraction = Some(1.0);
        Ok(self)
    }
}

/// What [`label_sources`] compares: every label source of the run on the same samples, the
/// oracle's verdicts on them, and the evaluation samples each source's PRM scored.
pub struct SourceInputs<'a> {
    /// Sizes and budgets.
    pub preset: &'a crate::preset::Preset,
    /// The run's seed.
    pub seed: u64,
    /// The evaluation samples, scored by every verifier.
    pub scored: &'a [Solution],
    /// The oracle's labels of the annotated samples.
    pub oracle: &'a [Solution],
    /// The lab's task (the oracle of the tree's new solutions).
    pub task: &'a crate::oracle::LabTask,
    /// Monte Carlo labels, and what they cost.
    pub mc: (&'a [Solution], Spent),
    /// Binary-search labels, and what they cost.
    pub binary_search: (&'a [Solution], Spent),
    /// OmegaPRM's labels of the samples, and what its tree cost.
    pub omegaprm: (&'a [Solution], Spent),
    /// The tree's completed rollouts, labelled.
    pub omegaprm_new: &'a [Solution],
    /// The judge's and consensus labels, where the run has a judge.
    pub judged: Option<&'a crate::stages::judge::Judged>,
}

/// Every label source against the oracle, each with its PRM's ProcessBench F1 and best-of-N at
/// the largest N, and what it cost.
pub fn label_sources(i: &SourceInputs<'_>) -> anyhow::Result<Labels> {
    use crate::stages::evaluate::verifier;
    let (p, seed, scored, oracle) = (i.preset, i.seed, i.scored, i.oracle);
    let mc_hard: Vec<Solution> = i.mc.0.iter().map(crate::stages::annotate::hard_mc).collect();
    // Each source's PRM at the largest N of the report's curves (32 in the standard preset).
    let n = p.evaluation.samples;
    let pairs = |labelled: &[Solution]| Some(pair_quality(labelled, i.task));
    let mut mc = compare("mc", &mc_hard, oracle, i.mc.1).with_prm(scored, verifier::PRM_MC, n, seed)?;
    mc.pairs = pairs(i.mc.0);
    let mut binary = compare("binary_search", i.binary_search.0, oracle, i.binary_search.1).with_prm(
        scored,
        verifier::PRM_BINARY_SEARCH,
        n,
        seed,
    )?;
    binary.pairs = pairs(i.binary_search.0);
    let mut sources = vec![mc, binary];
    let mut tree =
        compare("omegaprm", i.omegaprm.0, oracle, i.omegaprm.1).with_prm(scored, verifier::PRM_OMEGAPRM, n, seed)?;
    // The tree's new solutions' labels against the oracle's verdicts on their steps.
    let new = i.omegaprm_new;
    let new_oracle: Vec<Solution> = new.iter().map(|s| i.task.oracle_labelled(s)).collect();
    tree.new_solutions = new.len();
    tree.new_solutions_label_accuracy =
        (!new.is_empty()).then(|| compare("omegaprm", new, &new_oracle, Default::default()).label_accuracy);
    // The tree's pairs: its labelled samples and its kept rollouts, siblings of one another.
    tree.pairs = pairs(&[i.omegaprm.0, new].concat());
    sources.push(tree);
    if let Some(j) = i.judged {
        let mut judge = compare("judge", &j.labels, oracle, j.spent).with_prm(scored, verifier::PRM_JUDGE, n, seed)?;
        judge.human_labels = j.human.len();
        judge.pairs = pairs(&j.labels);
        // Compared on the solutions it kept; it paid for both annotations.
        let kept = j
            .consensus
            .iter()
            .filter(|s| s.meta.get("consensus") == Some(&true.into()));
        let retained = kept.count() as f64 / j.consensus.len().max(1) as f64;
        let mut both = i.mc.1;
        both += j.spent;
        let mut c =
            compare("consensus", &j.consensus, oracle, both).with_prm(scored, verifier::PRM_CONSENSUS, n, seed)?;
        c.retained_fraction = Some(retained);
        c.human_labels = j.human.len();
        c.pairs = pairs(&j.consensus);
        sources.extend([judge, c]);
    }
    let mut oracle_source =
        compare("oracle", oracle, oracle, Default::default()).with_prm(scored, verifier::PRM_ORACLE, n, seed)?;
    oracle_source.human_labels = oracle.len();
    oracle_source.pairs = pairs(oracle);
    sources.push(oracle_source);
    Ok(Labels {
        completer: p.annotation.completer.name().into(),
        judge_start: p.verifier_start_dir().into(),
        sources,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepwise_core::{Provenance, Step, StepLabel};

    fn labelled(good: &[bool]) -> Solution {
        Solution {
            steps: good
                .iter()
                .map(|&g| Step::labelled("x", StepLabel::from_bool(g, Provenance::BinarySearch)))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn compares_steps_and_first_errors_with_the_oracle() {
        let oracle = [labelled(&[true, false, false]), labelled(&[true, true])];
        let guess = [labelled(&[true, true, false]), labelled(&[true, true])];
        let spent = Spent {
            rollouts: 7,
            tokens: 70,
            env_steps: 0,
        };
        let l = compare("binary_search", &guess, &oracle, spent);
        assert_eq!(l.steps, 5);
        assert!((l.label_accuracy - 0.8).abs() < 1e-9);
        assert!((l.bad_recall - 0.5).abs() < 1e-9 && (l.bad_precision - 1.0).abs() < 1e-9);
        assert!((l.first_error_agreement - 0.5).abs() < 1e-9);
        assert_eq!((l.rollouts, l.generated_tokens), (7, 70));
        assert_eq!(
            compare("oracle", &oracle, &oracle, Spent::default()).label_accuracy,
            1.0
        );
    }

    #[test]
    fn pairs_are_checked_by_the_oracle_on_both_sides() {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let p = crate::problems::arithmetic(&mut rng, 0);
        let task = crate::oracle::LabTask::new([&p]);
        let right = crate::task::solution(&p, "right".into(), p.steps.clone(), "test");
        let mut steps = p.steps.clone();
        steps[1] = "1 * 1 = 1".into();
        let wrong = crate::task::solution(&p, "wrong".into(), steps, "test");
        let labelled: Vec<Solution> = [&right, &wrong].iter().map(|s| task.oracle_labelled(s)).collect();
        let q = pair_quality(&labelled, &task);
        assert_eq!((q.pairs, q.problems, q.precision), (1, 1, 1.0));
        // Labels that have it backwards: the pair is there, and both of its sides are wrong.
        let mut flipped = labelled.clone();
        for s in &mut flipped {
            let l = s.steps[1].label.as_mut().unwrap();
            *l = StepLabel::from_bool(!l.is_good(), Provenance::Human);
        }
        let q = pair_quality(&flipped, &task);
        assert_eq!(
            (q.pairs, q.precision, q.chosen_right, q.rejected_wrong),
            (1, 0.0, 0.0, 0.0)
        );
    }
}
