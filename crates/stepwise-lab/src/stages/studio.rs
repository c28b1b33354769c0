//! The `studio` stage: human step labels, simulated. Labellers rate steps through the labelling
//! studio's own HTTP API (stepwise-studio), PRM800K's phase-2 way (each labelling stops at its
//! first −1), with the oracle's verdicts wrong at a set rate. Generation 0 is a uniform sample
//! shared by every selection policy; then each policy (uniform, PRM800K's convincing wrong
//! answers, ActPRM-style uncertainty) ranks what is left with the PRM trained on its own labels
//! so far (`next_generation`), the labellers label as many steps again, and a PRM is trained on
//! everything it has. At equal numbers of labelled steps, the PRMs are compared on the held-out
//! samples: ProcessBench F1 and best-of-N, paired on the same problems.

use super::verifiers::Verifiers;
use crate::preset::Preset;
use crate::progress::say;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use stepwise_core::Solution;
use stepwise_eval::paired::{paired_difference, PairedDifference};
use stepwise_model::Model;
use stepwise_studio::client::Client;
use stepwise_studio::export::{export, Shape};
use stepwise_studio::{NewRecord, Policy, Role, Settings, Store};

/// The selection policies compared.
pub const POLICIES: [Policy; 3] = [Policy::Uniform, Policy::ConvincingWrong, Policy::Uncertainty];
const PASSWORD: &str = "simulated-labeller";

/// What one generation of one policy labelled.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GenerationStats {
    /// 0 for the shared uniform sample.
    pub generation: usize,
    /// Solutions labelled.
    pub solutions: usize,
    /// Steps rated.
    pub steps: usize,
    /// Of those solutions, the share whose final answer is wrong.
    pub wrong_answer_fraction: f64,
    /// Of those solutions, the share where the labeller found an error (ended `found_error`).
    pub error_found_fraction: f64,
    /// Of the steps rated, the share the oracle calls bad (what a PRM most needs to see).
    pub oracle_bad_fraction: f64,
    /// Of the steps rated, the share rated as the oracle says.
    pub label_accuracy: f64,
    /// Simulated labelling time: 20 s a solution and 4 s + 50 ms a character a rated step.
    pub labeller_minutes: f64,
}

/// One selection policy: its generations and the PRM trained on all its labels.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PolicyArm {
    /// `uniform`, `convincing-wrong` or `uncertainty`.
    pub policy: String,
    /// Generation by generation (the first shared).
    pub generations: Vec<GenerationStats>,
    /// Steps rated in all.
    pub labelled_steps: usize,
    /// Solutions labelled in all.
    pub labelled_solutions: usize,
    /// ProcessBench F1 of its PRM on the held-out samples.
    pub processbench_f1: f64,
    /// Best-of-N accuracy (min aggregation) of its PRM, by N.
    pub bon: BTreeMap<String, f64>,
}

/// The stage's measurements (`metrics.json` key `studio`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StudioReport {
    /// Generations, the first shared.
    pub generations: usize,
    /// Steps labelled per generation and policy.
    pub steps_per_generation: usize,
    /// Simulated labellers.
    pub labellers: usize,
    /// Their rate of ratings against the oracle.
    pub error_rate: f64,
    /// One per selection policy.
    pub arms: Vec<PolicyArm>,
    /// Each policy against uniform selection, best-of-N on the same problems.
    pub paired: Vec<PairedDifference>,
}

/// What [`studio_stage`] works on.
pub struct StudioInputs<'a> {
    /// Sizes and budgets.
    pub preset: &'a Preset,
    /// The run's seed.
    pub seed: u64,
    /// The run folder.
    pub out: &'a Path,
    /// Trains and scores the PRMs as every other verifier is.
    pub verifiers: &'a Verifiers<'a>,
    /// The pool of samples to label (graded).
    pub pool: &'a [Solution],
    /// The oracle's labels of the pool, same order.
    pub oracle: &'a [Solution],
}

/// The simulated labellers' plan for a solution: each step rated as the oracle says, wrong at
/// `rate` (the same slip for a step whoever labels it), stopping at the first −1.
fn plan(id: &str, truth: &[bool], rate: f64, seed: u64) -> Vec<i64> {
    let mut out = Vec::new();
    for (i, &good) in truth.iter().enumerate() {
        let slip = stepwise_studio::select::shuffle_key(seed ^ 0x5eed, &format!("{id}#{i}")) < rate;
        let seen_good = good != slip;
        out.push(if seen_good { 1 } else { -1 });
        if !seen_good {
            break;
        }
    }
    out
}

struct Stage<'a> {
    i: &'a StudioInputs<'a>,
    dir: PathBuf,
    truth: HashMap<String, Vec<bool>>,
}

fn settings(policy: Policy) -> Settings {
    Settings {
        overlap: 1,
        stop_at_first_bad: true,
        assist: true,
        policy,
        qc_every: 0,
        code: false,
    }
}

/// The generation an exported record was labelled in.
fn generation_of(s: &Solution) -> Option<i64> {
    s.meta.get("studio")?.pointer("/labellings/0/generation")?.as_i64()
}

impl Stage<'_> {
    /// A fresh store at `name.sqlite` with the simulated labellers' accounts and a project
    /// `name` holding `records` under `policy`.
    fn create(&self, name: &str, policy: Policy, records: Vec<Solution>) -> Result<PathBuf> {
        let db = self.dir.join(format!("{name}.sqlite"));
        for ext in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{ext}", db.display()));
        }
        let mut store = Store::open(&db)?;
        for k in 0..self.i.preset.studio.labellers.max(1) {
            store.set_user(&format!("sim-{k}"), Role::Labeller, PASSWORD)?;
        }
        let project = store.project_or_create(name, &settings(policy), self.i.seed)?;
        store.add_records(&project, NewRecord::each(records, false))?;
        Ok(db)
    }

    /// Serves `db`, has the simulated labellers label `steps` steps of project `name` through
    /// the HTTP API, and returns the records labelled in `generation`.
    fn label(&self, db: &Path, name: &str, generation: i64) -> Result<Vec<Solution>> {
        let running = stepwise_studio::server::spawn(Store::open(db)?, "127.0.0.1:0")?;
        let (url, budget, used) = (running.url(), self.i.preset.studio.steps, Mutex::new(0usize));
        let p = &self.i.preset.studio;
        std::thread::scope(|scope| -> Result<()> {
            let handles: Vec<_> = (0..p.labellers.max(1))
                .map(|k| {
                    let (url, used) = (&url, &used);
                    scope.spawn(move || -> Result<()> {
                        let c = Client::login(url, &format!("sim-{k}"), PASSWORD)?;
                        loop {
                            // Records are claimed one at a time in queue order, so the labelled
                            // set is the same however the threads interleave.
                            let (id, ratings) = {
                                let mut used = used.lock().unwrap_or_else(|e| e.into_inner());
                                if *used >= budget {
                                    return Ok(());
                                }
                                let Some(id) = c.next(name)? else { return Ok(()) };
                                let view = c.record(id)?;
                                let truth = self
                                    .truth
                                    .get(&view.ext_id)
                                    .context("a record the oracle has not seen")?;
                                let ratings = plan(&view.ext_id, truth, p.error_rate, self.i.seed);
                                *used += ratings.len();
                                (id, ratings)
                            };
                            for (step, r) in ratings.iter().enumerate() {
                                c.rate(id, step, Some(*r), None)?;
                            }
                            c.finish(
                                id,
                                if ratings.last() == Some(&-1) {
                                    "found_error"
                                } else {
                                    "solution"
                                },
                            )?;
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a simulated labeller panicked"))??;
            }
            Ok(())
        })?;
        drop(running);
        let store = Store::open(db)?;
        let project = store.project(name)?.context("the studio project")?;
        let all = export(&store, &project, Shape::PerRecord, false)?;
        Ok(all
            .into_iter()
            .filter(|s| generation_of(s) == Some(generation))
            .collect())
    }

    fn stats(&self, generation: usize, labelled: &[Solution]) -> GenerationStats {
        let (mut steps, mut right, mut bad, mut seconds) = (0usize, 0usize, 0usize, 0f64);
        for s in labelled {
            let truth = &self.truth[&s.id];
            seconds += 20.0;
            for (st, &good) in s.steps.iter().zip(truth) {
                let Some(label) = &st.label else { continue };
                steps += 1;
                right += usize::from(label.is_good() == good);
                bad += usize::from(!good);
                seconds += 4.0 + 0.05 * st.text.chars().count() as f64;
            }
        }
        let n = labelled.len().max(1) as f64;
        GenerationStats {
            generation,
            solutions: labelled.len(),
            steps,
            wrong_answer_fraction: labelled.iter().filter(|s| s.correct == Some(false)).count() as f64 / n,
            error_found_fraction: labelled.iter().filter(|s| s.first_error().is_some()).count() as f64 / n,
            oracle_bad_fraction: bad as f64 / steps.max(1) as f64,
            label_accuracy: right as f64 / steps.max(1) as f64,
            labeller_minutes: seconds / 60.0,
        }
    }

    /// One policy's generations after the shared one: its PRM and what it labelled.
    fn arm(&self, policy: Policy, shared: &[Solution], prm0: &Model) -> Result<(PolicyArm, Model)> {
        let name = policy.to_string();
        let v = self.i.verifiers;
        let taken: HashSet<&str> = shared.iter().map(|s| s.id.as_str()).collect();
        let mut rest: Vec<Solution> = self
            .pool()
            .into_iter()
            .filter(|s| !taken.contains(s.id.as_str()))
            .collect();
        let what = format!("scoring the {name} queue");
        if policy != Policy::Uniform {
            v.score(prm0, false, &mut rest, "prm", &what)?;
        }
        let db = self.create(&name, policy, rest)?;
        let mut labelled = shared.to_vec();
        let mut generations = vec![self.stats(0, shared)];
        let mut model = None;
        for g in 1..self.i.preset.studio.generations {
            if let Some(m) = &model {
                // The next generation: what nobody has had yet, ranked by this policy's new PRM.
                let mut store = Store::open(&db)?;
                let project = store.project(&name)?.context("the studio project")?;
                let mut left = store.unassigned(&project)?;
                if policy != Policy::Uniform {
                    let mut sols: Vec<Solution> = left.iter().map(|(_, s)| s.clone()).collect();
                    v.score(m, false, &mut sols, "prm", &what)?;
                    for ((_, old), new) in left.iter_mut().zip(sols) {
                        *old = new;
                    }
                }
                store.next_generation(&project, &left)?;
            }
            let new = self.label(&db, &name, g as i64 - 1)?;
            generations.push(self.stats(g, &new));
            labelled.extend(new);
            let dir = format!("studio_{}_gen{g}", name.replace('-', "_"));
            let what = format!("training PRM-studio ({name}, generation {g})");
            model = Some(v.train_for(&dir, &what, &labelled, false, self.verifier_steps())?);
        }
        let model = model.context("studio_generations must be 2 or more: one shared, one selected")?;
        let arm = PolicyArm {
            policy: name,
            labelled_steps: generations.iter().map(|g| g.steps).sum(),
            labelled_solutions: generations.iter().map(|g| g.solutions).sum(),
            generations,
            ..Default::default()
        };
        Ok((arm, model))
    }

    /// Training batches of a studio PRM.
    fn verifier_steps(&self) -> usize {
        let p = self.i.preset;
        match p.studio.verifier_steps {
            0 => p.verifiers.steps,
            n => n,
        }
    }

    /// The pool as the studio gets it: no oracle verdicts, no scores.
    fn pool(&self) -> Vec<Solution> {
        self.i
            .pool
            .iter()
            .map(|s| {
                let mut s = s.clone();
                s.meta.remove("oracle");
                s.scores.clear();
                s
            })
            .collect()
    }
}

/// The verifier name a policy's PRM scores under.
pub fn verifier_name(policy: &str) -> String {
    format!("prm_studio_{}", policy.replace('-', "_"))
}

/// Runs the stage; `scored` (the held-out samples) gets each policy's PRM's scores.
pub fn studio_stage(i: &StudioInputs<'_>, scored: &mut [Solution]) -> Result<StudioReport> {
    let p = &i.preset.studio;
    anyhow::ensure!(
        p.generations >= 2,
        "studio_generations must be 2 or more: one shared, one selected"
    );
    let dir = i.out.join("studio");
    std::fs::create_dir_all(&dir)?;
    let truth = i
        .oracle
        .iter()
        .map(|s| {
            (
                s.id.clone(),
                s.steps
                    .iter()
                    .map(|st| st.label.as_ref().is_some_and(|l| l.is_good()))
                    .collect(),
            )
        })
        .collect();
    let stage = Stage { i, dir, truth };
    let started = std::time::Instant::now();
    say("studio: generation 0 (uniform, shared by every policy)");
    let db = stage.create("gen0", Policy::Uniform, stage.pool())?;
    // The shared generation is labelled under the project's generation 0.
    let shared = stage.label(&db, "gen0", 0)?;
    let steps = stage.verifier_steps();
    let prm0 = i.verifiers.train_for(
        "studio_gen0",
        "training PRM-studio (generation 0)",
        &shared,
        false,
        steps,
    )?;
    let arms = super::all_at_once(&POLICIES, "the studio's selection policies", |&policy| {
        stage.arm(policy, &shared, &prm0)
    })?;
    let n = i.preset.evaluation.samples;
    let mut report = StudioReport {
        generations: p.generations,
        steps_per_generation: p.steps,
        labellers: p.labellers,
        error_rate: p.error_rate,
        ..Default::default()
    };
    let mut per_problem = Vec::new();
    for (arm, model) in &arms {
        let name = verifier_name(&arm.policy);
        i.verifiers.score(
            model,
            false,
            scored,
            &name,
            &format!("scoring (PRM-studio {})", arm.policy),
        )?;
        let measured = super::labels::LabelSource::default().with_prm(scored, &name, n, i.seed)?;
        let mut arm = arm.clone();
        arm.processbench_f1 = measured.processbench_f1.unwrap_or_default();
        arm.bon = measured.bon;
        report.arms.push(arm);
        let groups = stepwise_search::group_candidates(scored, Some(&name), None)?;
        let selector = Some(stepwise_search::Selector::Prm(stepwise_search::Aggregation::Min));
        per_problem.push(stepwise_eval::bon::per_problem_accuracy(
            &groups, selector, n, 32, i.seed,
        ));
    }
    say(&format!("studio: {:.0} s", started.elapsed().as_secs_f64()));
    let measure = format!("best-of-{n} accuracy");
    for k in 1..report.arms.len() {
        let (a, b) = (&report.arms[k].policy, &report.arms[0].policy);
        let (a, b) = (format!("PRM-studio {a} (min)"), format!("PRM-studio {b} (min)"));
        report.paired.push(paired_difference(
            &measure,
            &a,
            &per_problem[k],
            &b,
            &per_problem[0],
            i.seed ^ 21,
        ));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_plan_stops_at_the_first_step_seen_bad() {
        let truth = [true, true, false, true];
        assert_eq!(super::plan("x", &truth, 0.0, 1), [1, 1, -1]);
        assert_eq!(super::plan("x", &truth, 1.0, 1), [-1]);
        let slips = (0..2000)
            .filter(|k| super::plan(&format!("r{k}"), &[true], 0.1, 3) == [-1])
            .count();
        assert!((150..250).contains(&slips), "{slips} of 2000 at a 10% rate");
    }
}
