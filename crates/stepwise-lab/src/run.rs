//! The whole loop, stage by stage ([`run`]), in a run folder that remembers its settings.

use crate::oracle::LabTask;
use crate::preset::{Completer, McLabels, Preset};
use crate::report::write_report;
use crate::splits::splits;
use crate::stages::evaluate::{verifier, Report};
use crate::stages::{annotate, policy, rl, sample, verifiers::Verifiers, write_jsonl};
use crate::task::{oracle_labelled, Domain, LabProblem};
use crate::vocab;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use stepwise_core::seams::score_solutions;
use stepwise_core::Solution;
use stepwise_label::{BinarySearch, McOptions, MonteCarlo, OmegaOptions, OmegaPrm};
use stepwise_model::Model;

/// Options of [`run`].
#[derive(Debug, Clone)]
pub struct LabOptions {
    /// Sizes and budgets.
    pub preset: Preset,
    /// Seed of everything.
    pub seed: u64,
    /// Run folder.
    pub out: PathBuf,
}

/// The run folder a run gets when none is named: `runs/PRESET-seedN`, or
/// `runs/PRESET-DOMAIN-seedN` outside the arithmetic domain.
pub fn default_run_folder(p: &Preset, seed: u64) -> PathBuf {
    PathBuf::from(match p.domain {
        Domain::Arithmetic => format!("runs/{}-seed{seed}", p.name),
        domain => format!("runs/{}-{}-seed{seed}", p.name, domain.name()),
    })
}

/// Record the preset and seed in `out/preset.json`, or check that they are those the folder was
/// started with: its cached stages belong to that run, and reusing them under other settings
/// would mix two runs without a word.
pub(crate) fn claim_run_folder(out: &Path, p: &Preset, seed: u64) -> Result<()> {
    let path = out.join("preset.json");
    let ours = serde_json::to_value((p, seed))?;
    if path.exists() {
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let mut theirs: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
        // A folder started by an earlier version lacks the settings of stages added since; they
        // govern only those stages, so the folder takes them on.
        let added = add_missing_fields(&mut theirs, &ours);
        if theirs != ours {
            let field = differing_field(&theirs, &ours);
            anyhow::bail!(
                "{} was started with other settings ({field} differs; see {}): its cached stages belong to that run. Use another --out, or delete the folder to start over",
                out.display(),
                path.display()
            );
        }
        if !added.is_empty() {
            crate::progress::say(&format!(
                "{}: settings of newer stages added ({})",
                path.display(),
                added.join(", ")
            ));
            std::fs::write(&path, serde_json::to_string_pretty(&ours)?)?;
        }
        return Ok(());
    }
    std::fs::write(&path, serde_json::to_string_pretty(&ours)?)?;
    Ok(())
}

/// Wait for the verifiers' base LM's training thread, if there is one.
fn join_base(training: Option<std::thread::JoinHandle<Result<Model>>>) -> Result<Option<Model>> {
    training
        .map(|h| {
            h.join()
                .map_err(|_| anyhow::anyhow!("the verifiers' base training thread panicked"))?
        })
        .transpose()
}

/// Settings added after run folders existed that change what earlier stages made (the
/// verifiers' starting model): a folder that lacks them made its stages with their serde
/// defaults, so it keeps those instead of taking on the current ones.
const CHANGE_EARLIER_STAGES: &[&str] = &[
    "domain",
    "verifier_base_steps",
    "verifier_base_shape",
    "completer",
    "verifier_last_tokens",
    "verifier_stop_at_first_bad",
];

/// Copy into the preset of `theirs` (`[preset, seed]`) the fields of `ours` it lacks (those in
/// [`CHANGE_EARLIER_STAGES`] with their serde defaults instead); returns their names.
fn add_missing_fields(theirs: &mut serde_json::Value, ours: &serde_json::Value) -> Vec<String> {
    let as_made = serde_json::from_value::<Preset>(theirs[0].clone())
        .ok()
        .and_then(|p| serde_json::to_value(p).ok());
    let (Some(t), Some(o)) = (theirs.get_mut(0).and_then(|v| v.as_object_mut()), ours[0].as_object()) else {
        return Vec::new();
    };
    let mut added = Vec::new();
    for (k, v) in o {
        if !t.contains_key(k) {
            let v = match &as_made {
                Some(made) if CHANGE_EARLIER_STAGES.contains(&k.as_str()) => made[k].clone(),
                _ => v.clone(),
            };
            t.insert(k.clone(), v);
            added.push(k.clone());
        }
    }
    added
}

/// The first preset field (or `seed`) in which two `[preset, seed]` records differ.
fn differing_field(a: &serde_json::Value, b: &serde_json::Value) -> String {
    if a.get(1) != b.get(1) {
        return "seed".into();
    }
    let (pa, pb) = (&a[0], &b[0]);
    pb.as_object()
        .and_then(|o| o.keys().find(|k| pa.get(k.as_str()) != pb.get(k.as_str())).cloned())
        .unwrap_or_else(|| "the preset".into())
}

/// Run the loop of the preset's domain, its report written to the run folder: the agent
/// domain's own ([`crate::agent::run`]) or the reasoning loop ([`run`]).
pub fn run_domain(o: &LabOptions) -> Result<()> {
    match o.preset.domain {
        Domain::Agent => crate::agent::run(o).map(drop),
        _ => run(o).map(drop),
    }
}

/// Run the whole loop on a reasoning domain (arithmetic or code); returns the report (also
/// written to the run folder).
pub fn run(o: &LabOptions) -> Result<Report> {
    let p = &o.preset;
    anyhow::ensure!(
        p.domain != Domain::Agent,
        "the agent domain runs a loop of its own: stepwise_lab::agent::run (or run_domain)"
    );
    anyhow::ensure!(
        p.annotation.completer == Completer::Policy || p.verifiers.base_steps > 0,
        "completer=verifier_base needs the verifiers' base: set verifier_base_steps above 0, or completer=policy"
    );
    std::fs::create_dir_all(&o.out).with_context(|| format!("creating {}", o.out.display()))?;
    // One process per run folder.
    let _lock = stepwise_core::journal::lock(&o.out.join("run"))?;
    claim_run_folder(&o.out, p, o.seed)?;
    let tok = vocab::tokenizer(p.domain)?;
    let sp = splits(p, o.seed);
    write_jsonl(
        &o.out.join("problems.jsonl"),
        &sp.eval
            .iter()
            .chain(&sp.label)
            .map(LabProblem::problem)
            .collect::<Vec<_>>(),
    )?;
    let task = LabTask::new(sp.label.iter().chain(&sp.eval).chain(&sp.search));

    // 1. Policy: next-token LM on reference solutions, some with a slip. Beside it, the
    //    verifiers' own base LM when they have one: a training keeps about one core busy, and
    //    nothing needs the base before the annotation (when it completes the rollouts) or the
    //    judge.
    let base_training = (p.verifiers.base_steps > 0).then(|| {
        let (dir, p, seed, problems) = (o.out.join(p.verifier_start_dir()), p.clone(), o.seed, sp.policy.clone());
        std::thread::spawn(move || {
            crate::stages::on_own_thread(|| {
                policy::train_verifier_base(&dir, &p, seed, &problems, &vocab::tokenizer(p.domain)?)
            })
        })
    });
    let policy_model = policy::train_policy(&o.out.join("policy"), p, o.seed, &sp.policy, &tok)?;
    let lab_policy = policy::lab_policy(&policy_model, &tok, p.policy.temperature);

    // 2. Samples for annotation and for evaluation (shared-prefix KV cache).
    let label_sols = sample::sample_stage(
        &o.out.join("samples_label.jsonl"),
        "sampling (label set)",
        &sp.label,
        p.annotation.samples,
        &lab_policy,
        o.seed ^ 2,
    )?;
    let eval_sols = sample::sample_stage(
        &o.out.join("samples_eval.jsonl"),
        "sampling (eval set)",
        &sp.eval,
        p.evaluation.samples,
        &lab_policy,
        o.seed ^ 3,
    )?;

    // The verifiers' base is needed now when it completes the rollouts, else by the judge.
    let (early_base, base_training) = match p.annotation.completer {
        Completer::VerifierBase => (join_base(base_training)?, None),
        Completer::Policy => (None, base_training),
    };
    let completer_policy = policy::lab_policy(early_base.as_ref().unwrap_or(&policy_model), &tok, p.policy.temperature);

    // 3. Step labels: Monte Carlo rollouts, and the oracle for comparison.
    // The same rollout seeds for both, so a prefix both probe gets the same rollouts.
    let options = McOptions {
        rollouts: p.annotation.rollouts,
        seed: o.seed ^ 4,
    };
    let mc_annotator = MonteCarlo {
        policy: &completer_policy,
        task: &task,
        options: options.clone(),
    };
    let (mc, spent) = annotate::label_stage(
        &o.out.join("labels_mc.jsonl"),
        &label_sols,
        &mc_annotator,
        "annotating (MC)",
    )?;
    let oracle: Vec<Solution> = label_sols.iter().map(oracle_labelled).collect();
    write_jsonl(&o.out.join("labels_oracle.jsonl"), &oracle)?;
    // The same samples by binary search for the first error (OmegaPRM).
    let bs_annotator = BinarySearch {
        policy: &completer_policy,
        task: &task,
        options: options.clone(),
    };
    let (bs, bs_spent) = annotate::label_stage(
        &o.out.join("labels_binary_search.jsonl"),
        &label_sols,
        &bs_annotator,
        "annotating (binary search)",
    )?;
    // And by OmegaPRM: the same bisection over one rollout tree per problem, its 8 samples the
    // root's first rollouts (labels compared on the samples; the tree's rollouts counted).
    let omega_annotator = OmegaPrm {
        policy: &completer_policy,
        task: &task,
        options: OmegaOptions {
            rollouts: options.rollouts,
            search_limit: p.annotation.omegaprm_search_limit,
            seed: options.seed,
            ..Default::default()
        },
    };
    let omega_path = o.out.join("labels_omegaprm.jsonl");
    let (omega, omega_spent) =
        annotate::label_stage(&omega_path, &label_sols, &omega_annotator, "annotating (OmegaPRM tree)")?;
    // The tree's completed rollouts, labelled beside the samples.
    let omega_new: Vec<Solution> =
        stepwise_core::io::read_solutions(&omega_path, Some(stepwise_core::Format::Stepwise))?
            .into_iter()
            .filter(|s| s.meta.contains_key("omegaprm_rollout"))
            .collect();

    // 3a. The model the verifiers and the judge start from: the policy, or their own base LM.
    let base_model = match early_base {
        Some(base) => Some(base),
        None => join_base(base_training)?,
    };
    let base = base_model.as_ref().unwrap_or(&policy_model);
    let base_dir = p.verifier_start_dir();

    // 3b. The judge (a generative verifier fine-tuned on a small "human" budget of oracle
    //     labels) labels the same samples; consensus keeps the MC labels where it agrees (the
    //     Qwen2.5-Math-PRM recipe).
    let mc_train: Vec<Solution> = match p.annotation.mc_labels {
        McLabels::Hard => mc.iter().map(annotate::hard_mc).collect(),
        McLabels::Soft => mc.clone(),
    };
    let judged = (p.judge.solutions > 0)
        .then(|| crate::stages::judge::judge_stage(&o.out, p, o.seed, &tok, &label_sols, &oracle, &mc_train))
        .transpose()?;

    // The tree's labels on the samples (and on its new solutions), hard as PRM-MC's are.
    let new_in_training = if p.annotation.omegaprm_train_on_new {
        &omega_new[..]
    } else {
        &[]
    };
    let omega_train: Vec<Solution> = omega.iter().chain(new_in_training).map(annotate::hard_mc).collect();

    // 4. Verifiers, same code and budget: a PRM on each label source, and an ORM.
    let verifiers = Verifiers {
        preset: p,
        out: &o.out,
        base,
        base_dir,
        tok: &tok,
        seed: o.seed,
    };
    let mut jobs: Vec<(&str, &str, &[Solution], bool)> = vec![
        (verifier::PRM_MC, "PRM-MC", &mc_train, false),
        (verifier::PRM_ORACLE, "PRM-oracle", &oracle, false),
        (verifier::PRM_BINARY_SEARCH, "PRM-binary-search", &bs, false),
        (verifier::PRM_OMEGAPRM, "PRM-omegaprm", &omega_train, false),
        (verifier::ORM, "ORM", &label_sols, true),
    ];
    if let Some(j) = &judged {
        jobs.push((verifier::PRM_JUDGE, "PRM-judge", &j.labels, false));
        jobs.push((verifier::PRM_CONSENSUS, "PRM-consensus", &j.consensus, false));
        // A PRM on exactly the judge's oracle labels: the two kinds of verifier at equal labels.
        jobs.push((
            verifier::PRM_JUDGE_BUDGET,
            "PRM-oracle (judge's budget)",
            &j.human,
            false,
        ));
    }
    // They train at once: one training keeps about one core busy (its small ops run one after
    // another), and each is seeded on its own, so the weights are those of one at a time.
    let models: Vec<Model> =
        crate::stages::all_at_once(&jobs, "training the verifiers", |&(dir, what, sols, outcome)| {
            verifiers.train(dir, &format!("training {what}"), sols, outcome)
        })?;
    let model_of = |name: &str| &models[jobs.iter().position(|j| j.0 == name).expect("a trained verifier")];
    let (prm_mc, prm_or, orm) = (
        model_of(verifier::PRM_MC),
        model_of(verifier::PRM_ORACLE),
        model_of(verifier::ORM),
    );

    // 5. Score the evaluation samples (oracle-labelled) with every verifier, and the policy's
    //    own confidence as a baseline.
    let mut scored: Vec<Solution> = eval_sols.iter().map(oracle_labelled).collect();
    for (&(name, what, _, outcome), model) in jobs.iter().zip(&models) {
        verifiers.score(model, outcome, &mut scored, name, &format!("scoring ({what})"))?;
    }
    let confidence = crate::confidence::PolicyConfidence {
        model: &policy_model,
        tok: &tok,
    };
    score_solutions(&confidence, verifier::POLICY_CONFIDENCE, &mut scored, 64, |_| {})?;
    // The judge itself as a verifier (generative: it samples its verdicts), and the judge with a
    // calculator (trained alike on the same oracle labels, reading each equation step's value).
    let judge_tokens = judged
        .as_ref()
        .map(|j| crate::stages::judge::score_with_judge(&j.model, false, p, o.seed, &tok, &mut scored, verifier::JUDGE))
        .transpose()?;
    // The calculator reads equations: the code domain has none (its judge reads programs).
    let calculator_tokens = match &judged {
        Some(j) if p.judge.calculator && p.domain == Domain::Arithmetic => {
            let human: Vec<&Solution> = j.human.iter().collect();
            let model = crate::stages::judge::train_judge(
                &o.out.join("judge_calculator"),
                &o.out.join(base_dir),
                p,
                o.seed,
                &human,
                &tok,
                true,
            )?;
            Some(crate::stages::judge::score_with_judge(
                &model,
                true,
                p,
                o.seed,
                &tok,
                &mut scored,
                verifier::JUDGE_CALCULATOR,
            )?)
        }
        _ => None,
    };
    if let Some(model) = &base_model {
        let confidence = crate::confidence::PolicyConfidence { model, tok: &tok };
        score_solutions(&confidence, verifier::BASE_CONFIDENCE, &mut scored, 64, |_| {})?;
    }
    // 5b. Human labels in the studio (simulated labellers through its HTTP API), by selection
    //     policy, each policy's PRM scoring the evaluation samples too.
    let studio = (p.studio.generations > 0)
        .then(|| {
            let inputs = crate::stages::studio::StudioInputs {
                preset: p,
                seed: o.seed,
                out: &o.out,
                verifiers: &verifiers,
                pool: &label_sols,
                oracle: &oracle,
            };
            crate::stages::studio::studio_stage(&inputs, &mut scored)
        })
        .transpose()?;
    write_jsonl(&o.out.join("scored_eval.jsonl"), &scored)?;

    // 6. Evaluate.
    let mut report =
        crate::stages::evaluate::evaluate(p, o.seed, sp.eval.len(), &scored, &mc, &oracle, spent.rollouts)?;
    if let (Some(j), Some(tokens)) = (&judged, judge_tokens) {
        report.generative = Some(crate::stages::evaluate::Generative {
            labelled_solutions: j.human.len(),
            samples: p.judge.samples,
            tokens_per_solution: tokens as f64 / scored.len().max(1) as f64,
            calculator: calculator_tokens.map(|tokens| crate::stages::evaluate::CalculatorJudge {
                tokens_per_solution: tokens as f64 / scored.len().max(1) as f64,
                calls_per_solution: scored
                    .iter()
                    .map(|s| crate::stages::judge::calculator_calls(&s.step_strings()))
                    .sum::<usize>() as f64
                    / scored.len().max(1) as f64,
            }),
        });
    }
    report.studio = studio;
    report.labels = crate::stages::labels::label_sources(&crate::stages::labels::SourceInputs {
        preset: p,
        seed: o.seed,
        scored: &scored,
        oracle: &oracle,
        task: &task,
        mc: (&mc, spent),
        binary_search: (&bs, bs_spent),
        omegaprm: (&omega, omega_spent),
        omegaprm_new: &omega_new,
        judged: judged.as_ref(),
    })?;

    // 7. Test-time search guided by each PRM and the oracle, at matched budgets.
    if p.search.problems > 0 {
        let dirs = (o.out.join("prm_mc"), o.out.join("prm_oracle"));
        report.search = Some(crate::stages::search::search_stage(
            &crate::stages::search::SearchInputs {
                preset: p,
                seed: o.seed,
                out: &o.out,
                policy: &lab_policy,
                task: &task,
                problems: &sp.search,
                calibration: &scored,
                prms: [
                    (verifier::PRM_MC, verifiers.scorer(prm_mc, false), &dirs.0),
                    (verifier::PRM_ORACLE, verifiers.scorer(prm_or, false), &dirs.1),
                ],
            },
        )?);
    }

    // 8. RL against each reward source, from the same policy with the same budget.
    if p.rl.updates > 0 {
        let (orm, prm_mc, prm_oracle) = (
            verifiers.scorer(orm, true),
            verifiers.scorer(prm_mc, false),
            verifiers.scorer(prm_or, false),
        );
        report.rl = Some(rl::rl_stage(&rl::RlInputs {
            preset: p,
            seed: o.seed,
            out: &o.out,
            policy: &policy_model,
            tok: &tok,
            task: &task,
            train: &sp.label,
            eval: &sp.eval,
            orm: &orm,
            prm_mc: &prm_mc,
            prm_oracle: &prm_oracle,
        })?);
    }

    // 9. Report.
    write_report(&o.out, &report)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_folder_refuses_other_settings() {
        let dir = std::env::temp_dir().join(format!("stepwise-claim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = Preset::quick();
        claim_run_folder(&dir, &p, 1).unwrap();
        claim_run_folder(&dir, &p, 1).expect("the same settings resume");
        let err = format!("{:#}", claim_run_folder(&dir, &p, 2).unwrap_err());
        assert!(err.contains("seed differs") && err.contains("--out"), "{err}");
        let other = Preset::quick().with_overrides(&["rollouts=3".into()]).unwrap();
        let err = format!("{:#}", claim_run_folder(&dir, &other, 1).unwrap_err());
        assert!(err.contains("rollouts differs"), "{err}");
        // A folder from before a stage existed takes on that stage's settings.
        let path = dir.join("preset.json");
        let mut old: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        old[0].as_object_mut().unwrap().remove("search_budgets");
        std::fs::write(&path, old.to_string()).unwrap();
        claim_run_folder(&dir, &p, 1).expect("an older folder resumes");
        assert!(std::fs::read_to_string(&path).unwrap().contains("search_budgets"));
        // But one whose verifiers started from the policy does not take on their own base.
        let mut old: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        old[0].as_object_mut().unwrap().remove("verifier_base_steps");
        std::fs::write(&path, old.to_string()).unwrap();
        let based = Preset::quick()
            .with_overrides(&["verifier_base_steps=50".into()])
            .unwrap();
        let err = format!("{:#}", claim_run_folder(&dir, &based, 1).unwrap_err());
        assert!(err.contains("verifier_base_steps differs"), "{err}");
        let from_policy = Preset::quick()
            .with_overrides(&["verifier_base_steps=0".into()])
            .unwrap();
        claim_run_folder(&dir, &from_policy, 1).expect("the folder's own setting resumes");
        // Nor does one whose rollouts were the policy's take on another completer.
        let mut old: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        old[0].as_object_mut().unwrap().remove("completer");
        std::fs::write(&path, old.to_string()).unwrap();
        let err = format!("{:#}", claim_run_folder(&dir, &from_policy, 1).unwrap_err());
        assert!(err.contains("completer differs"), "{err}");
        let policy_rollouts = from_policy.with_overrides(&["completer=policy".into()]).unwrap();
        claim_run_folder(&dir, &policy_rollouts, 1).expect("the folder's own completer resumes");
        // Nor does one whose PRMs trained on every step take on stopping at the first bad one.
        let mut old: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        old[0].as_object_mut().unwrap().remove("verifier_stop_at_first_bad");
        std::fs::write(&path, old.to_string()).unwrap();
        assert!(policy_rollouts.verifiers.stop_at_first_bad);
        let err = format!("{:#}", claim_run_folder(&dir, &policy_rollouts, 1).unwrap_err());
        assert!(err.contains("verifier_stop_at_first_bad differs"), "{err}");
        let every_step = policy_rollouts
            .with_overrides(&["verifier_stop_at_first_bad=false".into()])
            .unwrap();
        claim_run_folder(&dir, &every_step, 1).expect("the folder's own verifier labels resume");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
