//! `stepwise agent`: agents as a domain: rooms worlds to play, trajectories played by a policy,
//! and labels for their actions (oracle, Monte Carlo from each state, TD(λ)/GAE from values).

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use stepwise_agent::{Expert, Games, Rooms};
use stepwise_core::seams::Policy;
use stepwise_core::{Problem, Solution};
use stepwise_label::annotate_resumable;
use stepwise_remote::backend::PolicySettings;

/// Agents: play rooms worlds with a policy and label its actions.
#[derive(clap::Args)]
#[command(
    after_help = "A step of an agent's trajectory is one action; the environment's answer is its \
observation, which the policy and a PRM read as context (`action\\nObservation: text`) and which is never \
scored. The rooms worlds are a text world with an exact oracle: the goal (put an item in a container) needs a \
few prerequisite actions; some actions are useless, some regress but can be repaired, some are invalid and \
some ruin the goal.

  stepwise agent games --count 200 --seed 1 --output games.jsonl
  stepwise agent play --problems games.jsonl --expert 0.7 -n 4 --output trajectories.jsonl
  stepwise agent play --problems games.jsonl --policy http://vllm:8000 -n 4 \\
      --output trajectories.jsonl
  stepwise agent label --method oracle --problems games.jsonl --input trajectories.jsonl \\
      --output oracle.jsonl
  stepwise agent label --method mc --rollouts 8 --expert 0.7 --problems games.jsonl \\
      --input trajectories.jsonl --output mc.jsonl
  stepwise agent label --method binary --rollouts 4 --expert 0.7 --problems games.jsonl \\
      --input trajectories.jsonl --output binary.jsonl
  stepwise score --prm PRM --input trajectories.jsonl --output scored.jsonl
  stepwise agent label --method td --values prm --problems games.jsonl --input scored.jsonl \\
      --output td.jsonl
  stepwise agent rl --policy POLICY --problems games.jsonl --reward prm:PRM --updates 16 \\
      --out agent-rl/

With a local model on the packed engine (--device cuda) episodes play together: `agent play` 64 at a time, Monte \
Carlo and binary-search labels a state's rollouts at once, each turn one batch for all of them, each episode's \
history kept in the KV cache so a turn reads only the action and the observation. A server or the CPU decoder is \
asked one episode at a time, several at once; the trajectories are the same (each turn draws with its own seed).

Trajectories are stepwise records (steps with `observation`); `stepwise convert --to messages` or \
`--to conversations` writes them in OpenAI's chat layout or ShareGPT's (AgentInstruct, AgentBank), and both are \
read back. Output files are journals: run the same command again after an interruption and it goes on."
)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Write rooms worlds as problems (the world in `meta.world`).
    Games(GamesArgs),
    /// Play each problem n times with a policy: one trajectory per line.
    Play(PlayArgs),
    /// Label the actions of trajectories.
    Label(LabelArgs),
    /// How well labels separate the oracle's good actions from its bad ones: the AUC of each
    /// action's progress (the promise it gained), good against bad.
    Compare(CompareArgs),
    /// RL in the rooms worlds: GRPO over the policy's own trajectories, a reward per action
    /// (the oracle's, a PRM's), per trajectory (the goal) or PRIME's (the goal and an implicit
    /// PRM learning from it).
    Rl(super::agent_rl::Args),
}

#[derive(clap::Args)]
struct CompareArgs {
    /// Labelled trajectories (`agent label --method mc` or `td`).
    #[arg(long)]
    input: PathBuf,
    /// The same trajectories labelled by the oracle.
    #[arg(long)]
    reference: PathBuf,
    /// The discount the labels were made with.
    #[arg(long, default_value_t = 1.0)]
    gamma: f32,
}

#[derive(clap::Args)]
struct GamesArgs {
    /// How many worlds.
    #[arg(long, default_value_t = 100)]
    count: usize,
    /// The stream of worlds (the same seed gives the same worlds).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where to write them (JSONL).
    #[arg(long)]
    output: PathBuf,
}

/// Who plays: a model or server, or the fixture expert.
#[derive(clap::Args)]
struct Player {
    /// Policy: checkpoint folder, cached Hugging Face model id, or server URL(s). It writes one
    /// action per --separator (a line by default); its text stops where it would write the
    /// observation itself.
    #[arg(long, value_parser = super::backend::source, conflicts_with = "expert")]
    policy: Option<super::backend::Source>,
    /// Play with the fixture expert instead of a model: the best action with this probability,
    /// else any action the world's words allow (for runs without a model).
    #[arg(long)]
    expert: Option<f64>,
    /// How a model's actions are sampled.
    #[command(flatten)]
    sampling: super::SamplingArgs,
    /// Prompt layout: text (the task, separator, turns), chat (the tokenizer's chat template) or
    /// pieces (each piece tokenised on its own: the layout `agent rl` trains a policy in).
    #[arg(long, default_value = "text", value_parser = ["text", "chat", "pieces"])]
    prompt: String,
    /// Where a local policy runs, how one given by URL is reached, what it computes in.
    #[command(flatten)]
    models: super::backend::ModelArgs,
}

/// A player, opened: the expert, or a model's backend.
enum Opened {
    Expert(Expert),
    Model(Box<stepwise_remote::backend::PolicyBackend>, PolicySettings),
}

impl Opened {
    fn policy(&self) -> Box<dyn Policy + '_> {
        match self {
            Opened::Expert(e) => Box::new(Borrowed(e)),
            Opened::Model(b, settings) => b.policy(settings),
        }
    }
}

/// A policy lent out.
struct Borrowed<'a, P>(&'a P);

impl<P: Policy> Policy for Borrowed<'_, P> {
    fn continue_from(
        &self,
        question: &str,
        prefix: &[&str],
        n: usize,
        until: stepwise_core::seams::Until,
        seed: u64,
    ) -> Result<Vec<stepwise_core::seams::Continuation>> {
        self.0.continue_from(question, prefix, n, until, seed)
    }
}

impl Player {
    fn open(&self, problems: &[Problem]) -> Result<Opened> {
        match (&self.policy, self.expert) {
            (_, Some(skill)) if !(0.0..=1.0).contains(&skill) => bail!("--expert: {skill} is not in [0, 1]"),
            (_, Some(skill)) => Ok(Opened::Expert(Expert::new(problems, skill)?)),
            (Some(source), None) => {
                let backend = self.models.open_policy(source)?;
                let prompt = super::search::prompt_layout(&self.prompt)?;
                let settings = PolicySettings {
                    stop: vec!["Observation:".into()],
                    ..self.sampling.settings(prompt)
                };
                Ok(Opened::Model(Box::new(backend), settings))
            }
            (None, None) => bail!("give --policy (a model or server) or --expert SKILL: who plays"),
        }
    }

    fn identity(&self) -> Result<serde_json::Value> {
        let mut id = serde_json::json!({
            "policy": self.policy.as_ref().map(|p| p.identity()).transpose()?, "expert": self.expert,
            "temperature": self.sampling.temperature, "max_tokens": self.sampling.max_tokens,
            "separator": self.sampling.separator, "chat": self.prompt == "chat",
        });
        // Only where set, so that journals started before the flag resume as they were.
        if self.prompt == "pieces" {
            id["prompt"] = "pieces".into();
        }
        Ok(id)
    }
}

#[derive(clap::Args)]
struct PlayArgs {
    /// The problems (from `stepwise agent games`).
    #[arg(long)]
    problems: PathBuf,
    /// Trajectories per problem.
    #[arg(short, default_value_t = 4)]
    n: usize,
    #[command(flatten)]
    player: Player,
    /// Most actions an episode may take.
    #[arg(long, default_value_t = 30)]
    max_actions: usize,
    /// The world keeps the goal to itself (the lab's world): nothing says the goal is reached or
    /// lost, the player stops when it judges it done, and the outcome is whether it holds then.
    #[arg(long)]
    silent: bool,
    /// Seed (each trajectory derives its own).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where the trajectories go (stepwise JSONL, appended and resumed).
    #[arg(long)]
    output: PathBuf,
}

#[derive(clap::Args)]
struct LabelArgs {
    /// `oracle` (the world's exact verdicts), `mc` (rollouts from the state after each action),
    /// `binary` (binary search for the first action after which no rollout reaches the goal:
    /// log2(n) probed states instead of n; later actions unlabelled) or `td` (TD(λ) returns from
    /// the trajectories' value scores, no rollouts).
    #[arg(long, value_parser = ["oracle", "mc", "binary", "td"])]
    method: String,
    /// The problems the trajectories play.
    #[arg(long)]
    problems: PathBuf,
    /// Trajectories to label.
    #[arg(long)]
    input: PathBuf,
    /// Labelled trajectories (stepwise JSONL, appended and resumed).
    #[arg(long)]
    output: PathBuf,
    /// --method mc: rollouts from each state; binary: from each probed state.
    #[arg(long, default_value_t = 8)]
    rollouts: usize,
    /// --method mc and binary: who plays the rollouts.
    #[command(flatten)]
    player: Player,
    /// --method td: which of the trajectories' scores are the state values (`stepwise score`
    /// writes `prm`).
    #[arg(long, default_value = "prm")]
    values: String,
    /// --method td and mc: the discount of later success.
    #[arg(long, default_value_t = 1.0)]
    gamma: f32,
    /// --method td: λ (0: the next state's value; 1: the Monte Carlo return).
    #[arg(long, default_value_t = 0.5)]
    lambda: f32,
    /// Most actions an episode may take (rollouts stop there).
    #[arg(long, default_value_t = 30)]
    max_actions: usize,
    /// The world keeps the goal to itself (the lab's world): nothing says the goal is reached or
    /// lost, the player stops when it judges it done, and the outcome is whether it holds then.
    #[arg(long)]
    silent: bool,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

pub fn run(a: Args) -> Result<()> {
    match a.action {
        Action::Games(g) => games(g),
        Action::Play(p) => play(p),
        Action::Label(l) => label(l),
        Action::Compare(c) => compare(c),
        Action::Rl(r) => super::agent_rl::run(r),
    }
}

fn games(a: GamesArgs) -> Result<()> {
    let problems: Vec<Problem> = (0..a.count)
        .map(|i| stepwise_agent::rooms::problem(a.seed, i))
        .collect();
    let mut text = String::new();
    for p in &problems {
        text.push_str(&serde_json::to_string(p)?);
        text.push('\n');
    }
    std::fs::write(&a.output, text).with_context(|| format!("writing {}", a.output.display()))?;
    eprintln!("{} rooms worlds; {}", problems.len(), a.output.display());
    Ok(())
}

pub(crate) fn read_games(path: &Path) -> Result<Vec<Problem>> {
    let problems = stepwise_core::io::read_problems(path)?;
    for (i, p) in problems.iter().enumerate() {
        stepwise_agent::rooms::world_of(p).with_context(|| format!("{}: record {}", path.display(), i + 1))?;
    }
    Ok(problems)
}

fn play(a: PlayArgs) -> Result<()> {
    super::resumable_output(&a.problems, &a.output)?;
    let problems = read_games(&a.problems)?;
    let mut settings = serde_json::json!({"problems": stepwise_core::journal::fingerprint(&problems)?, "n": a.n,
        "player": a.player.identity()?, "max_actions": a.max_actions, "seed": a.seed});
    with_silent(&mut settings, a.silent);
    let _claim = stepwise_core::journal::claim(&a.output, &settings)?;
    let opened = a.player.open(&problems)?;
    let policy = opened.policy();
    let env = rooms(a.max_actions, a.silent);
    let bar = crate::progress::bar(Some((problems.len() * a.n) as u64), "playing");
    let kept = stepwise_agent::rollout::play_resumable(&a.output, &problems, a.n, &*policy, &env, a.seed, |d| {
        bar.set_position(d as u64)
    })?;
    bar.finish_and_clear();
    let wins = kept.iter().filter(|s| s.correct == Some(true)).count();
    let failed = kept.iter().filter(|s| s.meta.contains_key("error")).count();
    let actions: usize = kept.iter().map(|s| s.steps.len()).sum();
    eprintln!(
        "{} trajectories ({actions} actions): {wins} reached the goal ({:.1}%), {failed} failed; {}",
        kept.len(),
        100.0 * wins as f64 / kept.len().max(1) as f64,
        a.output.display()
    );
    Ok(())
}

fn label(a: LabelArgs) -> Result<()> {
    super::resumable_output(&a.input, &a.output)?;
    let problems = read_games(&a.problems)?;
    let sols: Vec<Solution> = stepwise_core::io::read_solution_set(&a.input, None)?;
    let mut settings = serde_json::json!({"input": stepwise_core::journal::fingerprint(&sols)?, "method": a.method,
        "rollouts": a.rollouts, "player": a.player.identity()?, "values": a.values, "gamma": a.gamma,
        "lambda": a.lambda, "max_actions": a.max_actions, "seed": a.seed});
    with_silent(&mut settings, a.silent);
    let _claim = stepwise_core::journal::claim(&a.output, &settings)?;
    let env = rooms(a.max_actions, a.silent);
    let games = Games::new(&env, problems.clone());
    let opened = match a.method.as_str() {
        "mc" | "binary" => Some(a.player.open(&problems)?),
        _ => None,
    };
    let policy = opened.as_ref().map(Opened::policy);
    let how = stepwise_agent::labels::How {
        rollouts: a.rollouts,
        values: a.values.clone(),
        gamma: a.gamma,
        lambda: a.lambda,
        seed: a.seed,
    };
    let annotator = stepwise_agent::labels::by_name(&a.method, &games, policy.as_deref(), &sols, &how)?;
    let bar = crate::progress::bar(Some(sols.len() as u64), "labelling");
    let (labelled, spent) = annotate_resumable(&a.output, &sols, &*annotator, |d| bar.set_position(d as u64))?;
    bar.finish_and_clear();
    let steps: usize = labelled.iter().map(|s| s.steps.len()).sum();
    eprintln!(
        "labelled {} trajectories ({steps} actions) by {}: {} rollouts, {} environment steps, {} tokens; {}",
        labelled.len(),
        a.method,
        spent.rollouts,
        spent.env_steps,
        spent.tokens,
        a.output.display()
    );
    Ok(())
}

fn compare(a: CompareArgs) -> Result<()> {
    let labelled: Vec<Solution> = stepwise_core::io::read_solution_set(&a.input, None)?;
    let oracle: Vec<Solution> = stepwise_core::io::read_solution_set(&a.reference, None)?;
    let outcomes: Vec<f32> = labelled
        .iter()
        .filter_map(|s| s.correct)
        .map(|c| f32::from(u8::from(c)))
        .collect();
    let v0 = outcomes.iter().sum::<f32>() / outcomes.len().max(1) as f32;
    let agreement = stepwise_agent::quality::agreement(&labelled, &oracle, v0, a.gamma);
    let env_steps: u64 = labelled
        .iter()
        .filter_map(|s| s.meta.get("env_steps").and_then(serde_json::Value::as_u64))
        .sum();
    let mut report = serde_json::to_value(&agreement)?;
    report["env_steps"] = env_steps.into();
    report["trajectories"] = labelled.len().into();
    println!("{report}");
    Ok(())
}

/// The rooms world: announcing (the default) or silent (`--silent`, the lab's).
pub(crate) fn rooms(max_actions: usize, silent: bool) -> Rooms {
    if silent {
        Rooms::silent(max_actions)
    } else {
        Rooms::new(max_actions)
    }
}

/// A journal's settings with `silent` only when set, so journals started before the flag
/// existed resume as they were.
fn with_silent(settings: &mut serde_json::Value, silent: bool) {
    if silent {
        settings["silent"] = true.into();
    }
}
