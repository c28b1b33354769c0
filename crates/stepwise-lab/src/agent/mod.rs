//! The lab's third domain: an agent in the silent rooms world (`stepwise lab --domain agent`).
//! The whole loop on actions instead of steps: the expert's noisy demonstrations teach a policy
//! from scratch; it plays the label worlds, whose actions are labelled by the oracle, by Monte
//! Carlo rollouts and by TD(λ) from a learned value; PRMs on the two soft labels, a progress
//! head on TD's advantages and an ORM on outcomes are trained from the policy; best-of-N over held-out trajectories compares them
//! with the majority of outcomes; beam search over actions is guided by PRM-MC; RL in the
//! demonstration worlds optimises PRM-MC's or the oracle's per-action rewards against the goal
//! alone; the report says where each lucky success went.
//!
//! The world keeps the goal to itself ([`stepwise_agent::Rooms::silent`]): the policy stops when
//! it judges the item in place, and no observation says whether it is, so choosing among
//! trajectories is a real choice.

pub mod evaluate;
pub mod games;
pub mod heads;
pub mod labels;
pub mod policy;
pub mod preset;
pub mod report;
pub mod rl;
pub mod search;

use crate::preset::{Preset, VerifierHead};
use crate::progress::{bar, say};
use crate::run::{claim_run_folder, LabOptions};
use crate::stages::verifiers::Verifiers;
use crate::task::Domain;
use crate::vocab;
use anyhow::{Context, Result};
use std::path::Path;
use stepwise_agent::rollout::play_resumable;
use stepwise_agent::Rooms;
use stepwise_core::{Policy, Problem, Solution};
use stepwise_model::{Model, Tokenizer};

pub use report::AgentReport;

/// Which of the two halves a world's trajectories fall in for cross-fitting: the parity of
/// the id's hash.
pub(crate) fn parity(problem_id: &str) -> bool {
    problem_id
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b.into()))
        % 2
        == 1
}

/// What the stages share.
pub(crate) struct Ctx<'a> {
    /// The preset, with the verifiers set for actions (see [`verifier_preset`]).
    pub preset: &'a Preset,
    /// The run folder.
    pub out: &'a Path,
    /// The run's seed.
    pub seed: u64,
    /// The trained policy.
    pub policy: &'a dyn Policy,
    /// Its model: every verifier starts from it.
    pub model: &'a Model,
    /// The lab tokenizer of the agent domain.
    pub tok: &'a Tokenizer,
}

impl Ctx<'_> {
    /// The lab's verifiers, trained from the policy.
    pub fn verifiers(&self) -> Verifiers<'_> {
        Verifiers {
            preset: self.preset,
            out: self.out,
            base: self.model,
            base_dir: "policy",
            tok: self.tok,
            seed: self.seed,
        }
    }

    /// `n` trajectories of the policy on each of `games`, journalled in `file`.
    fn play(&self, file: &str, games: &[Problem], n: usize, what: &str, seed: u64) -> Result<Vec<Solution>> {
        self.play_with(self.policy, file, games, n, what, seed)
    }

    /// `n` trajectories of `policy` on each of `games`, journalled in `file`.
    fn play_with(
        &self,
        policy: &dyn Policy,
        file: &str,
        games: &[Problem],
        n: usize,
        what: &str,
        seed: u64,
    ) -> Result<Vec<Solution>> {
        let env = Rooms::silent(self.preset.agent.max_actions);
        let pb = bar((games.len() * n) as u64, what);
        let ts = play_resumable(&self.out.join(file), games, n, policy, &env, seed, |d| {
            pb.set_position(d as u64)
        })?;
        pb.finish_and_clear();
        let (won, stopped, out, failed) = policy::endings(&ts);
        say(&format!(
            "{what}: {} trajectories, {won} reached the goal; {stopped} stopped, {out} ran out of actions, {failed} failed",
            ts.len()
        ));
        Ok(ts)
    }
}

/// The verifiers later stages use.
struct Trained {
    prm_mc: Model,
    progress_head: Model,
}

impl Ctx<'_> {
    /// PRM-MC, PRM-TD (the promise head), the progress head and the ORM, each from the policy,
    /// and `eval` scored by each (written to `trajectories_eval_scored.jsonl`).
    fn verifiers_and_scores(
        &self,
        labels: &labels::Labels,
        label_trajs: &[Solution],
        eval: &[Solution],
    ) -> Result<(Trained, Vec<Solution>)> {
        let (v, steps) = (self.verifiers(), self.preset.agent.verifier_steps);
        let prm_mc = v.train_for("prm_mc", "training PRM-MC", &labels.mc, false, steps)?;
        let prm_td = v.train_for("prm_td", "training PRM-TD", &labels.td, false, steps)?;
        let orm = v.train_for("orm", "training ORM", label_trajs, true, steps)?;
        let progress_head = self.progress_head(&labels.td)?;
        let mut scored = eval.to_vec();
        let each = [
            (&prm_mc, false, "prm_mc", "scoring with PRM-MC"),
            (&prm_td, false, "prm_td", "scoring with PRM-TD"),
            (&orm, true, "orm", "scoring with the ORM"),
            (
                &progress_head,
                false,
                heads::PROGRESS_HEAD,
                "scoring with the progress head",
            ),
        ];
        crate::stages::score_all_at_once(
            &each,
            &mut scored,
            |(_, _, name, _)| name,
            |&(model, outcome, _, what), sols| v.outcomes(model, outcome, sols, what),
        )?;
        crate::stages::write_jsonl(&self.out.join("trajectories_eval_scored.jsonl"), &scored)?;
        Ok((Trained { prm_mc, progress_head }, scored))
    }
}

/// The preset the agent's verifiers train under: from the policy, a classifier head (a PRM
/// reads the value of the state each action led to; the ORM a value head at the end), and
/// every labelled action trained on (after a bad action a trajectory can still be repaired,
/// so later labels are not bad merely because an earlier one was).
fn verifier_preset(p: &Preset) -> Preset {
    let mut v = p.clone();
    v.domain = Domain::Agent;
    v.verifiers.from_policy = true;
    v.verifiers.head = VerifierHead::Classifier;
    v.verifiers.stop_at_first_bad = false;
    v.verifiers.base_steps = 0;
    v
}

/// Trajectories grouped by world, in the worlds' order.
fn by_world(games: &[Problem], ts: &[Solution]) -> Vec<(Problem, Vec<Solution>)> {
    games
        .iter()
        .map(|g| (g.clone(), ts.iter().filter(|t| t.problem_id == g.id).cloned().collect()))
        .collect()
}

/// Run the agent domain's loop; returns the report (also written to the run folder).
pub fn run(o: &LabOptions) -> Result<AgentReport> {
    let (p, a) = (&o.preset, &o.preset.agent);
    std::fs::create_dir_all(&o.out).with_context(|| format!("creating {}", o.out.display()))?;
    let _lock = stepwise_core::journal::lock(&o.out.join("run"))?;
    claim_run_folder(&o.out, p, o.seed)?;
    let started = std::time::Instant::now();
    let mut clock = crate::progress::Stopwatch::start();
    let tok = vocab::tokenizer(Domain::Agent)?;
    let g = games::games(o.seed, a.demo_games, a.label_games, a.eval_games, a.search_games);
    crate::stages::write_jsonl(
        &o.out.join("games.jsonl"),
        &g.label.iter().chain(&g.eval).chain(&g.search).collect::<Vec<_>>(),
    )?;

    // 1. The policy, from the expert's demonstrations.
    let demos = policy::demonstrations(&o.out.join("demonstrations.jsonl"), p, o.seed, &g.demo)?;
    let model = policy::train_policy(&o.out.join("policy"), p, o.seed, &demos, &tok)?;
    let lab_policy = policy::agent_policy(&model, &tok, p.policy.temperature);
    clock.lap("policy");
    let vp = verifier_preset(p);
    let ctx = Ctx {
        preset: &vp,
        out: &o.out,
        seed: o.seed,
        policy: &lab_policy,
        model: &model,
        tok: &tok,
    };

    // 2. Trajectories: the label split and the held-out split.
    let label_trajs = ctx.play(
        "trajectories_label.jsonl",
        &g.label,
        a.label_samples,
        "playing the label worlds",
        o.seed ^ 2,
    )?;
    let eval_trajs = ctx.play(
        "trajectories_eval.jsonl",
        &g.eval,
        a.eval_samples,
        "playing the held-out worlds",
        o.seed ^ 3,
    )?;
    clock.lap("trajectories");

    // 3. Labels for actions: oracle, Monte Carlo, TD(λ) from a cross-fitted value.
    let env = Rooms::silent(a.max_actions);
    let label_games = stepwise_agent::Games::new(&env, g.label.iter().cloned());
    let labels = ctx.labels(&label_games, &label_trajs)?;
    let eval_games = stepwise_agent::Games::new(&env, g.eval.iter().cloned());
    let eval_oracle = ctx.label(
        "oracle_eval.jsonl",
        &eval_trajs,
        &stepwise_agent::Oracle(&eval_games),
        "oracle labels (held out)",
    )?;
    clock.lap("labels (oracle, MC, binary search, TD)");

    // 4. Verifiers from the policy (PRMs on MC and TD labels, the progress head, the ORM), the
    // held-out trajectories scored by each.
    let (verifiers, scored) = ctx.verifiers_and_scores(&labels, &label_trajs, &eval_trajs)?;
    let v0 = labels::mean_outcome(&label_trajs);
    let heads = heads::heads(&scored, &eval_oracle, "prm_td", v0, a.gamma);
    clock.lap("verifiers (training, scoring)");

    // 5. Best-of-N over trajectories.
    let bon = evaluate::best_of_n(
        &by_world(&g.eval, &scored),
        &eval_oracle,
        &["prm_mc", "prm_td"],
        "orm",
        o.seed,
    )?;
    clock.lap("best-of-N");

    // 6. Beam search over actions, guided by PRM-MC, on worlds of its own.
    let search = ctx.search(&g.search, &verifiers.prm_mc)?;
    clock.lap("beam search");

    // 7. RL in the demonstration worlds: per-action rewards against the goal alone.
    let rl = ctx.rl(&g.demo, &g.eval, &verifiers.prm_mc, &verifiers.progress_head)?;
    clock.lap("RL");

    let stages = report::Stages {
        labels: &labels,
        heads,
        bon,
        search,
        rl,
    };
    let mut report = report::build(
        p,
        o.seed,
        &eval_trajs,
        &eval_oracle,
        stages,
        started.elapsed().as_secs_f64(),
    );
    report.stage_seconds = clock.laps();
    report::write(&o.out, &report)?;
    Ok(report)
}
