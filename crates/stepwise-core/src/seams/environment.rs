//! [`Environment`]: where an agent's actions take effect, beside [`crate::Task`]. A step of an
//! agent's trajectory is one action; what the environment answers is the next observation.

use crate::Problem;
use anyhow::Result;

/// What the environment answers to one action.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Observation {
    /// What the agent sees next.
    pub text: String,
    /// Whether the episode is over (the goal reached, or lost for good).
    pub done: bool,
    /// Whether the goal is reached: the outcome an outcome reward model and the majority vote
    /// see. Only meaningful when `done`.
    pub success: bool,
}

/// How an action changed the distance to the goal, where the environment can tell exactly (the
/// lab's text world can; most environments cannot). The oracle's verdict on a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActionKind {
    /// The goal is nearer: the fewest actions still needed dropped.
    Progress,
    /// Valid, but the goal is no nearer (looking around, a detour's first move).
    Useless,
    /// Valid, and the goal is further away, yet still reachable (it can be repaired).
    Regress,
    /// Not something the environment can do here: nothing changed.
    Invalid,
    /// The goal can no longer be reached.
    Ruin,
}

impl ActionKind {
    /// The step rating this verdict stands for: progress is good, a harmless useless action is
    /// neutral (PRM800K's 0), the rest are bad.
    pub fn rating(self) -> crate::Rating {
        match self {
            ActionKind::Progress => crate::Rating::Good,
            ActionKind::Useless => crate::Rating::Neutral,
            ActionKind::Regress | ActionKind::Invalid | ActionKind::Ruin => crate::Rating::Bad,
        }
    }

    /// The name reports and records use.
    pub fn name(self) -> &'static str {
        match self {
            ActionKind::Progress => "progress",
            ActionKind::Useless => "useless",
            ActionKind::Regress => "regress",
            ActionKind::Invalid => "invalid",
            ActionKind::Ruin => "ruin",
        }
    }
}

/// One episode in progress: the state an agent acts on. Episodes are forked to branch from any
/// step (Monte Carlo rollouts from a state, search over actions), so a fork must continue
/// independently of its parent.
pub trait Episode: Send {
    /// Apply `action`; an `Err` is the environment failing (it raised, it hung, it answered
    /// something malformed), not the action being wrong: a wrong action is an observation.
    fn step(&mut self, action: &str) -> Result<Observation>;

    /// An independent copy of this episode's state, to act on without touching this one. An
    /// episode owns what it needs (an `Arc` of its world), so forks outlive their parent.
    fn fork(&self) -> Result<Box<dyn Episode>>;

    /// The oracle's verdict on `action` from this state, without taking it; `None` where the
    /// environment cannot tell (the default).
    fn judge(&self, action: &str) -> Option<ActionKind> {
        let _ = action;
        None
    }

    /// Whether the goal holds in the current state, for environments that judge where an
    /// episode ends rather than announce success (WebShop scores what was bought; the lab's
    /// silent rooms world checks where the item lies when the agent stops). `None` (the
    /// default): only an observation's `done` tells.
    fn outcome(&self) -> Option<bool> {
        None
    }
}

/// Anything an agent acts in: the lab's text world, a Python object wrapping TextWorld, a
/// remote simulator. `Sync`, so many episodes run at once.
pub trait Environment: Sync {
    /// Start an episode of `problem`: the episode, and the first observation (the room the agent
    /// starts in, the page it sees).
    fn reset(&self, problem: &Problem) -> Result<(Box<dyn Episode>, String)>;

    /// The most actions an episode may take before it counts as failed.
    fn max_actions(&self) -> usize {
        30
    }
}

/// Replays `actions` from a fresh episode of `problem`: the state after them, for environments
/// whose episodes cannot fork themselves (a deterministic environment behind a Python object
/// forks by replay). Fails where an action fails.
pub fn replay(
    env: &dyn Environment,
    problem: &Problem,
    actions: &[&str],
) -> Result<(Box<dyn Episode>, Option<Observation>)> {
    let (mut episode, _) = env.reset(problem)?;
    let mut last = None;
    for a in actions {
        last = Some(episode.step(a)?);
    }
    Ok((episode, last))
}
