//! RL with per-action rewards against outcome-only RL: the policy trained by GRPO over its own
//! trajectories in the demonstration worlds ([`stepwise_rl::train_agent_rl`]) against each
//! reward source in turn — the goal alone (`outcome`), PRM-MC's score of every action
//! (`prm_mc`, credited by the change it made), the oracle's verdict on every action (`oracle`,
//! the ceiling, credited by its own verdict), the progress head's score of every action
//! (`prm_progress`, its own: the head's reading is the action's advantage), each of the three
//! with the goal's advantage added, and PRIME (`prime`: the goal plus an implicit PRM learning
//! online from it) — with the same budget (updates × worlds × group), worlds and seeds, each
//! source run once per RL seed (`agent_rl_seeds`), then measured on the held-out worlds (the
//! runs pooled):
//! success, clean success (no invalid or regressing action on the way) and lucky successes,
//! paired world by world against outcome-only RL.

use super::evaluate::{lucky_ids, lucky_share};
use super::Ctx;
use crate::progress::bar;
use crate::stages::rl::first_last;
use crate::task::Domain;
use crate::vocab::{EOS, SEP};
use anyhow::Result;
use candle_core::Device;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use stepwise_agent::{Games, GoalReward, LabelReward, Oracle, Rooms};
use stepwise_core::seams::{Reward, RewardKind, ScorerReward};
use stepwise_core::{Problem, Solution};
use stepwise_eval::bon::bootstrap;
use stepwise_eval::paired::{paired_by_id, PairedDifference};
use stepwise_model::train::VarMap;
use stepwise_model::{Model, ModelConfig, Prompt};
use stepwise_rl::{
    train_agent_rl, AgentRlRun, CandleLearner, Credit, ImplicitPrm, PrimeConfig, Reference, RlConfig, UpdateLog,
};

/// How PRM-MC's score of every action becomes its advantage: the change it made (its score
/// minus the action's before), as PRM-MC values the state an action leads to.
const PRM_CREDIT: Credit = Credit::Progress;

/// One reward source's RL run and what its policy does on the held-out worlds.
#[derive(Debug, Clone, Serialize)]
pub struct AgentRlVariant {
    /// The reward source: `outcome`, `prm_mc`, `oracle`, `prime` or `prm_progress`.
    pub reward: String,
    /// How a process reward became each action's advantage (`None`: the goal alone, or PRIME's
    /// token rewards).
    pub credit: Option<Credit>,
    /// Runs (RL seeds) behind the measures, pooled.
    pub runs: usize,
    /// Share of held-out trajectories that reach the goal after RL, over all runs.
    pub success: f64,
    /// The same, run by run (RL seed 1, 2, …): the spread the training's randomness makes.
    pub success_by_run: Vec<f64>,
    /// Bootstrap 95% interval of `success` over worlds (each world's mean over the runs).
    pub ci95: (f64, f64),
    /// Share that reach it with no invalid or regressing action on the way.
    pub clean_success: f64,
    /// Share of the successes that are lucky.
    pub lucky_rate: f64,
    /// Share that stopped of the policy's own accord.
    pub stop_rate: f64,
    /// Mean actions per held-out trajectory.
    pub mean_actions: f64,
    /// Policy tokens sampled during RL, mean over the runs.
    pub sampled_tokens: usize,
    /// Updates made by each run.
    pub updates: usize,
    /// KL estimate to the starting policy, mean over the last tenth of the updates (and the runs).
    pub kl: f64,
    /// The optimised reward's mean over the update's trajectories, first and last tenth.
    pub reward_first_last: (f64, f64),
    /// The goal's rate among the update's trajectories, first and last tenth.
    pub success_first_last: (f64, f64),
    /// The oracle's mean verdict on the update's actions, first and last tenth.
    pub oracle_first_last: (f64, f64),
    /// Each held-out world's success (mean over the runs), by world id.
    #[serde(skip)]
    pub per_world: BTreeMap<String, f64>,
    /// Each held-out world's clean success, by world id.
    #[serde(skip)]
    pub per_world_clean: BTreeMap<String, f64>,
}

/// The RL stage's results.
#[derive(Debug, Clone, Serialize)]
pub struct AgentRlReport {
    /// Updates × worlds per update × trajectories per world, the same for every source and run.
    pub budget: (usize, usize, usize),
    /// Runs per source, each with its own RL seed; the same seeds for every source.
    pub seeds: usize,
    /// Trajectories per held-out world behind each measure.
    pub eval_samples: usize,
    /// One entry per reward source.
    pub variants: Vec<AgentRlVariant>,
    /// Each source against outcome-only RL, world by world: success and clean success.
    pub paired: Vec<PairedDifference>,
}

/// Each world's mean of `f` over its trajectories.
fn per_world(ts: &[&Solution], f: impl Fn(&Solution) -> bool) -> BTreeMap<String, f64> {
    let mut tally: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for t in ts {
        let e = tally.entry(t.problem_id.clone()).or_default();
        e.0 += usize::from(f(t));
        e.1 += 1;
    }
    tally
        .into_iter()
        .map(|(k, (a, n))| (k, a as f64 / n.max(1) as f64))
        .collect()
}

impl Ctx<'_> {
    /// RL against every reward source, the runs at once (one thread each), each in its folder
    /// `rl_<reward>/` (checkpoints, held-out trajectories), resumable; then the held-out
    /// measures. `train` are the worlds RL plays, `eval` the held-out ones; `prm_mc` scores
    /// actions. `None` where the preset asks for no updates.
    pub fn rl(
        &self,
        train: &[Problem],
        eval: &[Problem],
        prm_mc: &Model,
        progress_head: &Model,
    ) -> Result<Option<AgentRlReport>> {
        let a = &self.preset.agent;
        if a.rl_updates == 0 || train.is_empty() {
            return Ok(None);
        }
        let env = Rooms::silent(a.max_actions);
        let (train_games, eval_games) = (
            Games::new(&env, train.iter().cloned()),
            Games::new(&env, eval.iter().cloned()),
        );
        let v = self.verifiers();
        let scorer = v.scorer(prm_mc, false);
        let prm = ScorerReward {
            name: "prm_mc".into(),
            scorer: &scorer,
            kind: RewardKind::Process,
        };
        let head_scorer = v.scorer(progress_head, false);
        let head = ScorerReward {
            name: super::heads::PROGRESS_HEAD.into(),
            scorer: &head_scorer,
            kind: RewardKind::Process,
        };
        let oracle_annotator = Oracle(&train_games);
        let oracle = LabelReward {
            name: "oracle".into(),
            annotator: &oracle_annotator,
            neutral: 0.5,
        };
        let sources: [(&str, &dyn Reward, Option<Credit>); 5] = [
            ("outcome", &GoalReward, None),
            ("prm_mc", &prm, Some(PRM_CREDIT)),
            ("oracle", &oracle, Some(Credit::Own)),
            ("prime", &GoalReward, None),
            // The progress head's score is the action's advantage: a verdict on the action.
            (super::heads::PROGRESS_HEAD, &head, Some(Credit::Own)),
        ];
        // Every source's run with every RL seed at once (one thread each), source by source.
        let seeds = a.rl_seeds.max(1);
        let runs: Vec<(usize, usize)> = (0..sources.len())
            .flat_map(|i| (0..seeds).map(move |k| (i, k)))
            .collect();
        let results = crate::stages::all_at_once(&runs, "RL", |&(i, k)| {
            let (name, reward, credit) = sources[i];
            let cfg = self.rl_config(credit, name == "prime", k);
            let (log, model) = self.rl_run(name, k, reward, &[&GoalReward, &oracle], &env, train, &cfg)?;
            self.rl_measure(name, k, log, &model, eval, &eval_games)
        })?;
        let mut results = results.into_iter();
        let variants: Vec<AgentRlVariant> = sources
            .iter()
            .map(|&(name, _, credit)| self.rl_variant(name, credit, results.by_ref().take(seeds).collect()))
            .collect();
        let outcome = variants.iter().find(|v| v.reward == "outcome");
        let mut paired = Vec::new();
        for v in variants.iter().filter(|v| v.reward != "outcome") {
            let Some(o) = outcome else { break };
            let measure = format!("success after RL ({} trajectories a world)", a.rl_eval_samples);
            paired.push(paired_by_id(
                &measure,
                &v.reward,
                &v.per_world,
                "outcome",
                &o.per_world,
                self.seed ^ 10,
            ));
            let measure = format!("clean success after RL ({} trajectories a world)", a.rl_eval_samples);
            paired.push(paired_by_id(
                &measure,
                &v.reward,
                &v.per_world_clean,
                "outcome",
                &o.per_world_clean,
                self.seed ^ 11,
            ));
        }
        Ok(Some(AgentRlReport {
            budget: (a.rl_updates, a.rl_worlds, a.rl_group),
            seeds: a.rl_seeds.max(1),
            eval_samples: a.rl_eval_samples,
            variants,
            paired,
        }))
    }

    /// The RL settings every source shares (one optimiser step per update), with a process
    /// reward's `credit` and PRIME's implicit PRM where `prime`, for RL seed `k` (0: the seed
    /// runs made before there were several).
    fn rl_config(&self, credit: Option<Credit>, prime: bool, k: usize) -> RlConfig {
        let a = &self.preset.agent;
        RlConfig {
            updates: a.rl_updates,
            prompts_per_update: a.rl_worlds,
            group_size: a.rl_group,
            epochs: 1,
            minibatch_size: 32,
            lr: a.rl_lr,
            warmup: a.rl_updates / 10,
            kl_coef: a.rl_kl,
            // Unused by a reward per trajectory (kept as it was, so a run folder resumes).
            credit: credit.unwrap_or(Credit::MinSoFar),
            prime: prime.then(|| PrimeConfig {
                lr: a.rl_lr,
                ..Default::default()
            }),
            temperature: self.preset.policy.temperature,
            max_new_tokens: 12,
            seed: run_seed(self.seed ^ 0x61, k),
            checkpoint_every: 10,
            ..Default::default()
        }
        .one_step_per_update()
    }

    /// One source's RL run with RL seed `k` from the policy, in [`run_dir`]: its log and the
    /// policy after it.
    #[allow(clippy::too_many_arguments)]
    fn rl_run(
        &self,
        name: &str,
        k: usize,
        reward: &dyn Reward,
        watch: &[&dyn Reward],
        env: &Rooms,
        train: &[Problem],
        cfg: &RlConfig,
    ) -> Result<(Vec<UpdateLog>, Model)> {
        let dir = self.out.join(run_dir(name, k));
        std::fs::create_dir_all(&dir)?;
        crate::vocab::save(&dir, Domain::Agent)?;
        let policy_dir = self.out.join("policy");
        let varmap = VarMap::new();
        let config = ModelConfig::from_dir(&policy_dir)?;
        let mut model = Model::load_trainable(&policy_dir, config.clone(), &varmap, &Device::Cpu, cfg.seed)?;
        // PRIME's implicit PRM starts as the policy.
        let mut implicit = match cfg.prime {
            Some(_) => Some(Model::load_trainable(
                &policy_dir,
                config,
                &VarMap::new(),
                &Device::Cpu,
                cfg.seed,
            )?),
            None => None,
        };
        let params = super::policy::agent_policy(self.model, self.tok, 1.0).params;
        let pb = bar(
            cfg.updates as u64,
            &format!("RL in the rooms ({name}, RL seed {})", k + 1),
        );
        let log = train_agent_rl(
            AgentRlRun {
                learner: &mut CandleLearner::new(&mut model)?,
                reference: Reference::Model(self.model),
                tokenizer: self.tok,
                prompt: Prompt::Pieces,
                separator: SEP.into(),
                params,
                end: EOS.into(),
                env,
                problems: train,
                reward,
                goal_weight: 1.0,
                watch: watch.to_vec(),
                out_dir: Some(dir),
                heldout: None,
                implicit_prm: implicit.as_mut().map(ImplicitPrm::Candle),
            },
            cfg,
            |l| {
                pb.set_position(l.update as u64);
                pb.set_prefix(format!(
                    "reward {:.2} success {:.2} kl {:.3}",
                    l.reward,
                    l.accuracy,
                    crate::stages::rl::kl(l)
                ));
            },
        )?;
        pb.finish_and_clear();
        Ok((log, model))
    }

    /// The policy run `k` of `name` left (`model`) on the held-out worlds (the same seeds for
    /// every source), labelled by the oracle for lucky successes.
    fn rl_measure(
        &self,
        name: &str,
        k: usize,
        log: Vec<UpdateLog>,
        model: &Model,
        eval: &[Problem],
        games: &Games<'_>,
    ) -> Result<RunResult> {
        let a = &self.preset.agent;
        let dir = run_dir(name, k);
        let policy = super::policy::agent_policy(model, self.tok, self.preset.policy.temperature);
        let mut ts = self.play_with(
            &policy,
            &format!("{dir}/eval.jsonl"),
            eval,
            a.rl_eval_samples,
            &format!("held-out worlds after RL ({name}, RL seed {})", k + 1),
            run_seed(self.seed ^ 9, k),
        )?;
        let oracle = self.label(
            &format!("{dir}/eval_oracle.jsonl"),
            &ts,
            &Oracle(games),
            &format!("oracle labels after RL ({name}, RL seed {})", k + 1),
        )?;
        // Ids carry the run, so the runs' trajectories pool without clashing.
        let tag = |id: &str| format!("{id}@rl{}", k + 1);
        let lucky = lucky_ids(&oracle).into_iter().map(tag).collect();
        for t in &mut ts {
            t.id = tag(&t.id);
        }
        Ok(RunResult { log, ts, lucky })
    }

    /// A source's measures over its runs: trajectories pooled, a world's success the mean over
    /// the runs, the logs' figures averaged.
    fn rl_variant(&self, name: &str, credit: Option<Credit>, runs: Vec<RunResult>) -> AgentRlVariant {
        let ts: Vec<&Solution> = runs.iter().flat_map(|r| &r.ts).collect();
        let lucky_set: HashSet<&str> = runs.iter().flat_map(|r| r.lucky.iter().map(String::as_str)).collect();
        let won = |t: &Solution| t.correct == Some(true);
        let clean = |t: &Solution| won(t) && !lucky_set.contains(t.id.as_str());
        let share = |ts: &[&Solution], f: &dyn Fn(&Solution) -> f64| {
            ts.iter().map(|t| f(t)).sum::<f64>() / ts.len().max(1) as f64
        };
        let worlds = per_world(&ts, won);
        let scores: Vec<f64> = worlds.values().copied().collect();
        let over_runs = |f: &dyn Fn(&[UpdateLog]) -> (f64, f64)| {
            let n = runs.len().max(1) as f64;
            runs.iter()
                .map(|r| f(&r.log))
                .fold((0.0, 0.0), |(x, y), (a, b)| (x + a / n, y + b / n))
        };
        let watched = |key: &'static str| move |l: &UpdateLog| l.watched.get(key).copied().unwrap_or(0.0);
        let tokens = runs
            .iter()
            .map(|r| r.log.last().map_or(0, |l| l.sampled_tokens) as f64)
            .sum::<f64>()
            / runs.len().max(1) as f64;
        AgentRlVariant {
            reward: name.into(),
            credit,
            runs: runs.len(),
            success: share(&ts, &|t| f64::from(u8::from(won(t)))),
            success_by_run: runs
                .iter()
                .map(|r| r.ts.iter().filter(|t| won(t)).count() as f64 / r.ts.len().max(1) as f64)
                .collect(),
            ci95: bootstrap(&scores, 1000, &mut ChaCha8Rng::seed_from_u64(self.seed ^ 12)),
            clean_success: share(&ts, &|t| f64::from(u8::from(clean(t)))),
            lucky_rate: lucky_share(ts.iter().copied(), &lucky_set),
            stop_rate: share(&ts, &|t| f64::from(u8::from(super::policy::stopped(t)))),
            mean_actions: share(&ts, &|t| t.steps.len() as f64),
            sampled_tokens: tokens.round() as usize,
            updates: runs.first().map_or(0, |r| r.log.len()),
            kl: over_runs(&|log| first_last(log, crate::stages::rl::kl)).1,
            reward_first_last: over_runs(&|log| first_last(log, |l| l.reward)),
            success_first_last: over_runs(&|log| first_last(log, |l| l.accuracy)),
            oracle_first_last: over_runs(&|log| first_last(log, watched("oracle"))),
            per_world_clean: per_world(&ts, clean),
            per_world: worlds,
        }
    }
}

/// One RL run of one source: its log and what its policy did on the held-out worlds (ids
/// tagged with the run), with the lucky successes among them.
struct RunResult {
    log: Vec<UpdateLog>,
    ts: Vec<Solution>,
    lucky: HashSet<String>,
}

/// The seed of RL seed `k`'s run from `base` (the first run keeps `base`, as before there were
/// several).
fn run_seed(base: u64, k: usize) -> u64 {
    base ^ ((k as u64) << 20)
}

/// Run folder of `name`'s run with RL seed `k`: `rl_<name>` for the first (as before there were
/// several), `rl_<name>-seed<k+1>` for the others.
fn run_dir(name: &str, k: usize) -> String {
    match k {
        0 => format!("rl_{name}"),
        k => format!("rl_{name}-seed{}", k + 1),
    }
}
