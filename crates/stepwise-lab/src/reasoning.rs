//! The reasoning loop (arithmetic or code), stage by stage ([`run`]): policy, samples, step
//! labels by every annotator, verifiers, scoring, evaluation, search and RL, in a run folder
//! that remembers its settings ([`mod@crate::run`]).

use crate::oracle::LabTask;
use crate::preset::{Completer, McLabels, Preset};
use crate::report::write_report;
use crate::run::{claim_run_folder, join_base, LabOptions};
use crate::splits::splits;
use crate::stages::evaluate::{verifier, Report};
use crate::stages::{annotate, policy, rl, sample, verifiers::Verifiers, write_jsonl};
use crate::task::{oracle_labelled, Domain, LabProblem};
use crate::vocab;
use anyhow::{Context, Result};
use stepwise_core::seams::Spent;
use stepwise_core::Solution;
use stepwise_label::{BinarySearch, McOptions, MonteCarlo, OmegaOptions, OmegaPrm};
use stepwise_model::{EnginePolicy, Model, Tokenizer};

/// Run the whole loop on a reasoning domain (arithmetic or code); returns the report (also
/// written to the run folder).
pub fn run(o: &LabOptions) -> Result<Report> {
    let p = &o.preset;
    check_reasoning_preset(p)?;
    // One process per run folder.
    let _lock = open_run_folder(o)?;
    let tok = vocab::tokenizer(p.domain)?;
    let sp = splits(p, o.seed);
    let held_out_first = sp.eval.iter().chain(&sp.label).map(LabProblem::problem);
    write_jsonl(&o.out.join("problems.jsonl"), &held_out_first.collect::<Vec<_>>())?;
    let task = LabTask::new(sp.label.iter().chain(&sp.eval).chain(&sp.search));
    let mut clock = crate::progress::Stopwatch::start();

    // 1. Policy: next-token LM on reference solutions, some with a slip. Beside it, the
    //    verifiers' own base LM when they have one: a training keeps about one core busy, and
    //    nothing needs the base before the annotation (when it completes the rollouts) or the
    //    judge.
    let base_training = spawn_base_training(o, &sp.policy);
    let policy_model = policy::train_policy(&o.out.join("policy"), p, o.seed, &sp.policy, &tok)?;
    clock.lap("policy");
    let l = Loop {
        o,
        tok: &tok,
        sp: &sp,
        task: &task,
        policy: &policy_model,
    };
    // RL against the rewards that need no trained verifier (PRIME, the outcome, the oracle)
    // starts now on a thread of its own: it takes the cores the stages before RL leave idle
    // (one, while the verifiers' base trains on), and the RL stage reads its runs back. Should
    // a stage fail, it stops after the run it is on.
    let rl_base = l.rl_base();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let early_rl = (p.rl.updates > 0)
            .then(|| s.spawn(|| crate::stages::on_own_thread(|| rl::without_verifiers(&rl_base, &stop))));
        let report = l.after_policy(base_training, early_rl, &mut clock);
        if report.is_err() {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        report
    })
}

/// What the loop's stages after the policy share.
struct Loop<'a> {
    o: &'a LabOptions,
    tok: &'a Tokenizer,
    sp: &'a crate::splits::Splits,
    task: &'a LabTask,
    policy: &'a Model,
}

/// The RL runs started early, on a thread of the loop's scope.
type EarlyRl<'s> = Option<std::thread::ScopedJoinHandle<'s, Result<()>>>;

impl Loop<'_> {
    /// What every RL run needs.
    fn rl_base(&self) -> rl::RlBase<'_> {
        rl::RlBase {
            preset: &self.o.preset,
            seed: self.o.seed,
            out: &self.o.out,
            policy: self.policy,
            tok: self.tok,
            task: self.task,
            train: &self.sp.label,
            eval: &self.sp.eval,
        }
    }

    /// Stages 2 to 9: samples, labels, verifiers, scoring, evaluation, search, RL and the report.
    fn after_policy(
        &self,
        base_training: Option<std::thread::JoinHandle<Result<Model>>>,
        early_rl: EarlyRl<'_>,
        clock: &mut crate::progress::Stopwatch,
    ) -> Result<Report> {
        let Loop {
            o,
            tok,
            sp,
            task,
            policy: policy_model,
        } = *self;
        let p = &o.preset;
        let lab_policy = policy::lab_policy(policy_model, tok, p.policy.temperature);

        // 2. Samples for annotation and for evaluation (shared-prefix KV cache).
        let (label_sols, eval_sols) = sample_sets(o, sp, &lab_policy)?;
        clock.lap("samples");

        // The verifiers' base is needed now when it completes the rollouts, else by the judge.
        let (early_base, base_training) = match p.annotation.completer {
            Completer::VerifierBase => (join_base(base_training)?, None),
            Completer::Policy => (None, base_training),
        };
        let completer_policy =
            policy::lab_policy(early_base.as_ref().unwrap_or(policy_model), tok, p.policy.temperature);
        clock.lap("waiting for the verifiers' base");

        // 3. Step labels: Monte Carlo rollouts, binary search, OmegaPRM, and the oracle.
        let labels = annotate_all(o, &completer_policy, task, &label_sols)?;
        clock.lap("annotation (MC, binary search, OmegaPRM)");

        // 3a. The model the verifiers and the judge start from: the policy, or their own base LM.
        let base_model = match early_base {
            Some(base) => Some(base),
            None => join_base(base_training)?,
        };
        let base = base_model.as_ref().unwrap_or(policy_model);
        clock.lap("waiting for the verifiers' base");

        // 3b. The judge (a generative verifier fine-tuned on a small "human" budget of oracle
        //     labels) labels the same samples; consensus keeps the MC labels where it agrees (the
        //     Qwen2.5-Math-PRM recipe).
        let (mc_train, omega_train) = labels.training_sets(p);
        let judged = (p.judge.solutions > 0)
            .then(|| crate::stages::judge::judge_stage(&o.out, p, o.seed, tok, &label_sols, &labels.oracle, &mc_train))
            .transpose()?;
        clock.lap("judge (training, labels)");

        // 4. Verifiers, same code and budget: a PRM on each label source, and an ORM.
        let verifiers = Verifiers {
            preset: p,
            out: &o.out,
            base,
            base_dir: p.verifier_start_dir(),
            tok,
            seed: o.seed,
        };
        let jobs = TrainingSets {
            mc: &mc_train,
            oracle: &labels.oracle,
            binary_search: &labels.bs,
            omegaprm: &omega_train,
            outcomes: &label_sols,
            judged: judged.as_ref(),
        }
        .jobs();
        let models = train_verifiers(&verifiers, &jobs)?;
        clock.lap("verifiers (training)");

        // 5. Score the evaluation samples (oracle-labelled) with every verifier, the policy's own
        //    confidence as a baseline, the judges; 5b. human labels in the studio.
        let mut scored: Vec<Solution> = eval_sols.iter().map(oracle_labelled).collect();
        score_with_verifiers(&verifiers, &jobs, &models, &mut scored)?;
        clock.lap("verifiers (scoring)");
        let more = crate::scoring::MoreScorers {
            policy: policy_model,
            base: base_model.as_ref(),
            judged: judged.as_ref(),
            verifiers: &verifiers,
            label_sols: &label_sols,
            oracle: &labels.oracle,
        };
        let (generative, studio) = more.score(o, tok, &mut scored, clock)?;
        write_jsonl(&o.out.join("scored_eval.jsonl"), &scored)?;

        // 6. Evaluate.
        let (mc, oracle, rollouts) = (&labels.mc, &labels.oracle, labels.mc_spent.rollouts);
        let mut report = crate::stages::evaluate::evaluate(p, o.seed, sp.eval.len(), &scored, mc, oracle, rollouts)?;
        report.generative = generative;
        report.studio = studio;
        report.labels = labels.compared(o, &scored, task, judged.as_ref())?;
        clock.lap("evaluation");

        // 7. Test-time search and 8. RL, with the PRMs and the ORM.
        let trained = Trained::of(&jobs, &models);
        let stages = LastStages {
            verifiers: &verifiers,
            trained: &trained,
            lab_policy: &lab_policy,
            scored: &scored,
            labels: &labels,
        };
        self.search_and_rl(&stages, &mut report, clock, early_rl)?;

        // 9. Report.
        report.stage_seconds = clock.laps();
        write_report(&o.out, &report)?;
        Ok(report)
    }
}

/// Makes the run folder, takes its lock (one process a folder) and checks that it was started
/// with these settings.
fn open_run_folder(o: &LabOptions) -> Result<stepwise_core::journal::Claim> {
    std::fs::create_dir_all(&o.out).with_context(|| format!("creating {}", o.out.display()))?;
    let lock = stepwise_core::journal::lock(&o.out.join("run"))?;
    claim_run_folder(&o.out, &o.preset, o.seed)?;
    Ok(lock)
}

/// Stage 2: the policy's samples for annotation and for evaluation (shared-prefix KV cache).
fn sample_sets(
    o: &LabOptions,
    sp: &crate::splits::Splits,
    policy: &EnginePolicy,
) -> Result<(Vec<Solution>, Vec<Solution>)> {
    let p = &o.preset;
    let sample = |path: &str, what: &str, problems: &[LabProblem], n: usize, seed: u64| {
        sample::sample_stage(&o.out.join(path), what, problems, n, policy, seed)
    };
    Ok((
        sample(
            "samples_label.jsonl",
            "sampling (label set)",
            &sp.label,
            p.annotation.samples,
            o.seed ^ 2,
        )?,
        sample(
            "samples_eval.jsonl",
            "sampling (eval set)",
            &sp.eval,
            p.evaluation.samples,
            o.seed ^ 3,
        )?,
    ))
}

/// The verifiers' own base LM trained on a thread of its own, when the preset gives them one.
fn spawn_base_training(o: &LabOptions, problems: &[LabProblem]) -> Option<std::thread::JoinHandle<Result<Model>>> {
    let p = &o.preset;
    (p.verifiers.base_steps > 0).then(|| {
        let (dir, p, seed, problems) = (o.out.join(p.verifier_start_dir()), p.clone(), o.seed, problems.to_vec());
        std::thread::spawn(move || {
            crate::stages::on_own_thread(|| {
                policy::train_verifier_base(&dir, &p, seed, &problems, &vocab::tokenizer(p.domain)?)
            })
        })
    })
}

/// Refuses a preset the reasoning loop cannot run.
fn check_reasoning_preset(p: &Preset) -> Result<()> {
    anyhow::ensure!(
        p.domain != Domain::Agent,
        "the agent domain runs a loop of its own: stepwise_lab::agent::run (or run_domain)"
    );
    anyhow::ensure!(
        p.annotation.completer == Completer::Policy || p.verifiers.base_steps > 0,
        "completer=verifier_base needs the verifiers' base: set verifier_base_steps above 0, or completer=policy"
    );
    Ok(())
}

/// The label samples' step labels by each annotator, with the rollouts each spent.
struct Labels {
    mc: Vec<Solution>,
    mc_spent: Spent,
    oracle: Vec<Solution>,
    bs: Vec<Solution>,
    bs_spent: Spent,
    omega: Vec<Solution>,
    omega_spent: Spent,
    /// The OmegaPRM tree's completed rollouts, labelled beside the samples.
    omega_new: Vec<Solution>,
}

impl Labels {
    /// What PRM-MC and PRM-omegaprm train on: the MC labels (hard or soft, as the preset says),
    /// and the tree's labels on the samples (and on its new solutions), hard as PRM-MC's are.
    fn training_sets(&self, p: &Preset) -> (Vec<Solution>, Vec<Solution>) {
        let mc = match p.annotation.mc_labels {
            McLabels::Hard => self.mc.iter().map(annotate::hard_mc).collect(),
            McLabels::Soft => self.mc.clone(),
        };
        let new_in_training = if p.annotation.omegaprm_train_on_new {
            &self.omega_new[..]
        } else {
            &[]
        };
        let omega = self
            .omega
            .iter()
            .chain(new_in_training)
            .map(annotate::hard_mc)
            .collect();
        (mc, omega)
    }

    /// The label sources compared (the report's labels section).
    fn compared(
        &self,
        o: &LabOptions,
        scored: &[Solution],
        task: &LabTask,
        judged: Option<&crate::stages::judge::Judged>,
    ) -> Result<crate::stages::labels::Labels> {
        crate::stages::labels::label_sources(&crate::stages::labels::SourceInputs {
            preset: &o.preset,
            seed: o.seed,
            scored,
            oracle: &self.oracle,
            task,
            mc: (&self.mc, self.mc_spent),
            binary_search: (&self.bs, self.bs_spent),
            omegaprm: (&self.omega, self.omega_spent),
            omegaprm_new: &self.omega_new,
            judged,
        })
    }
}

/// Stage 3: Monte Carlo rollouts, binary search for the first error and OmegaPRM's tree label
/// `label_sols` with `completer`'s rollouts (each resumable), and the oracle labels them too.
fn annotate_all(o: &LabOptions, completer: &EnginePolicy, task: &LabTask, label_sols: &[Solution]) -> Result<Labels> {
    let p = &o.preset;
    // The same rollout seeds for every annotator, so a prefix two probe gets the same rollouts.
    let options = McOptions {
        rollouts: p.annotation.rollouts,
        seed: o.seed ^ 4,
    };
    let mc_annotator = MonteCarlo {
        policy: completer,
        task,
        options: options.clone(),
    };
    let (mc, mc_spent) = annotate::label_stage(
        &o.out.join("labels_mc.jsonl"),
        label_sols,
        &mc_annotator,
        "annotating (MC)",
    )?;
    let oracle: Vec<Solution> = label_sols.iter().map(oracle_labelled).collect();
    write_jsonl(&o.out.join("labels_oracle.jsonl"), &oracle)?;
    // The same samples by binary search for the first error (OmegaPRM).
    let bs_annotator = BinarySearch {
        policy: completer,
        task,
        options: options.clone(),
    };
    let (bs, bs_spent) = annotate::label_stage(
        &o.out.join("labels_binary_search.jsonl"),
        label_sols,
        &bs_annotator,
        "annotating (binary search)",
    )?;
    // And by OmegaPRM: the same bisection over one rollout tree per problem, its 8 samples the
    // root's first rollouts (labels compared on the samples; the tree's rollouts counted).
    let omega_annotator = OmegaPrm {
        policy: completer,
        task,
        options: OmegaOptions {
            rollouts: options.rollouts,
            search_limit: p.annotation.omegaprm_search_limit,
            seed: options.seed,
            ..Default::default()
        },
    };
    let omega_path = o.out.join("labels_omegaprm.jsonl");
    let (omega, omega_spent) =
        annotate::label_stage(&omega_path, label_sols, &omega_annotator, "annotating (OmegaPRM tree)")?;
    let omega_new: Vec<Solution> =
        stepwise_core::io::read_solutions(&omega_path, Some(stepwise_core::Format::Stepwise))?
            .into_iter()
            .filter(|s| s.meta.contains_key("omegaprm_rollout"))
            .collect();
    Ok(Labels {
        mc,
        mc_spent,
        oracle,
        bs,
        bs_spent,
        omega,
        omega_spent,
        omega_new,
    })
}

/// What each verifier trains on.
struct TrainingSets<'a> {
    mc: &'a [Solution],
    oracle: &'a [Solution],
    binary_search: &'a [Solution],
    omegaprm: &'a [Solution],
    /// The label samples, for the ORM (their outcomes).
    outcomes: &'a [Solution],
    judged: Option<&'a crate::stages::judge::Judged>,
}

/// A verifier to train: its folder (and metrics name), what it is called in progress, its
/// training set, and whether it is an ORM.
type Job<'a> = (&'static str, &'static str, &'a [Solution], bool);

impl<'a> TrainingSets<'a> {
    /// Stage 4's verifiers: a PRM on each label source, and an ORM.
    fn jobs(&self) -> Vec<Job<'a>> {
        let mut jobs: Vec<Job<'a>> = vec![
            (verifier::PRM_MC, "PRM-MC", self.mc, false),
            (verifier::PRM_ORACLE, "PRM-oracle", self.oracle, false),
            (
                verifier::PRM_BINARY_SEARCH,
                "PRM-binary-search",
                self.binary_search,
                false,
            ),
            (verifier::PRM_OMEGAPRM, "PRM-omegaprm", self.omegaprm, false),
            (verifier::ORM, "ORM", self.outcomes, true),
        ];
        if let Some(j) = self.judged {
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
        jobs
    }
}

/// Stage 4: the verifiers trained at once (one training keeps about one core busy, its small ops
/// running one after another; each is seeded on its own, so the weights are those of one at a
/// time), one model a job.
fn train_verifiers(verifiers: &Verifiers, jobs: &[Job]) -> Result<Vec<Model>> {
    crate::stages::all_at_once(jobs, "training the verifiers", |&(dir, what, sols, outcome)| {
        verifiers.train(dir, &format!("training {what}"), sols, outcome)
    })
}

/// Stage 5: every trained verifier scores the evaluation samples, all at once.
fn score_with_verifiers(verifiers: &Verifiers, jobs: &[Job], models: &[Model], scored: &mut [Solution]) -> Result<()> {
    let each: Vec<(&Job, &Model)> = jobs.iter().zip(models).collect();
    crate::stages::score_all_at_once(
        &each,
        scored,
        |(job, _)| job.0,
        |&(&(_, what, _, outcome), model), sols| verifiers.outcomes(model, outcome, sols, &format!("scoring ({what})")),
    )
}

/// The verifiers search and RL use.
struct Trained<'a> {
    prm_mc: &'a Model,
    prm_oracle: &'a Model,
    orm: &'a Model,
}

impl<'a> Trained<'a> {
    /// Picked from the verifiers trained (`models`, one a job).
    fn of(jobs: &[Job], models: &'a [Model]) -> Self {
        let model_of = |name: &str| &models[jobs.iter().position(|j| j.0 == name).expect("a trained verifier")];
        Trained {
            prm_mc: model_of(verifier::PRM_MC),
            prm_oracle: model_of(verifier::PRM_ORACLE),
            orm: model_of(verifier::ORM),
        }
    }
}

/// What search and RL use of the stages before them.
struct LastStages<'a> {
    verifiers: &'a Verifiers<'a>,
    trained: &'a Trained<'a>,
    lab_policy: &'a EnginePolicy<'a>,
    scored: &'a [Solution],
    labels: &'a Labels,
}

impl Loop<'_> {
    /// Stages 7 to 9, where the preset asks for them: test-time search guided by each PRM and
    /// the oracle at matched budgets, RL against each reward source from the same policy
    /// with the same budget (the runs started early joined first), and DPO on each label
    /// source's preference pairs.
    fn search_and_rl(
        &self,
        l: &LastStages,
        report: &mut Report,
        clock: &mut crate::progress::Stopwatch,
        early_rl: EarlyRl<'_>,
    ) -> Result<()> {
        let (o, p, verifiers, trained) = (self.o, &self.o.preset, l.verifiers, l.trained);
        if p.search.problems > 0 {
            let dirs = (o.out.join("prm_mc"), o.out.join("prm_oracle"));
            report.search = Some(crate::stages::search::search_stage(
                &crate::stages::search::SearchInputs {
                    preset: p,
                    seed: o.seed,
                    out: &o.out,
                    policy: l.lab_policy,
                    task: self.task,
                    problems: &self.sp.search,
                    calibration: l.scored,
                    prms: [
                        (verifier::PRM_MC, verifiers.scorer(trained.prm_mc, false), &dirs.0),
                        (
                            verifier::PRM_ORACLE,
                            verifiers.scorer(trained.prm_oracle, false),
                            &dirs.1,
                        ),
                    ],
                },
            )?);
            clock.lap("test-time search");
        }
        if let Some(early) = early_rl {
            early
                .join()
                .map_err(|_| anyhow::anyhow!("the thread of the RL runs started early panicked"))??;
            clock.lap("RL (waiting for the runs started early)");
        }
        if p.rl.updates > 0 {
            let (orm, prm_mc, prm_oracle) = (
                verifiers.scorer(trained.orm, true),
                verifiers.scorer(trained.prm_mc, false),
                verifiers.scorer(trained.prm_oracle, false),
            );
            report.rl = Some(rl::rl_stage(&rl::RlInputs {
                base: self.rl_base(),
                orm: &orm,
                prm_mc: &prm_mc,
                prm_oracle: &prm_oracle,
            })?);
            clock.lap("RL");
        }
        if p.dpo.epochs > 0 {
            let labels = l.labels;
            let sources = crate::stages::dpo::DpoSources {
                graded: &labels.oracle,
                mc: &labels.mc,
                omegaprm: [&labels.omega[..], &labels.omega_new].concat(),
                oracle: &labels.oracle,
            };
            report.dpo = Some(crate::stages::dpo::dpo_stage(&self.rl_base(), &sources)?);
            clock.lap("DPO");
        }
        Ok(())
    }
}
