//! The agent lab's worlds: silent rooms worlds ([`stepwise_agent::Rooms::silent`]) in four
//! splits drawn from streams of their own, held-out worlds screened against the training ones;
//! and the words of the lab tokenizer for them.

use crate::task::{Domain, LabProblem};
use std::collections::{BTreeSet, HashSet};
use std::sync::OnceLock;
use stepwise_agent::rollout::play;
use stepwise_agent::rooms::problem;
use stepwise_agent::{Expert, Rooms};
use stepwise_core::Problem;

/// The worlds of a run.
pub struct Games {
    /// Played by the expert for the policy's demonstrations.
    pub demo: Vec<Problem>,
    /// Played by the policy for labelled trajectories (the verifiers' training data).
    pub label: Vec<Problem>,
    /// Held out: best-of-N over trajectories.
    pub eval: Vec<Problem>,
    /// Held out: step-level search.
    pub search: Vec<Problem>,
}

/// `n` worlds of stream `stream` of `seed`, ids `{prefix}00000`, …, none whose world is in
/// `seen` (which takes theirs).
fn draw(seed: u64, stream: u64, n: usize, prefix: &str, seen: &mut HashSet<String>) -> Vec<Problem> {
    (0..)
        .map(|i| problem(seed.wrapping_mul(16).wrapping_add(stream), i))
        .filter(|p| seen.insert(p.meta.get("world").map(|w| w.to_string()).unwrap_or_default()))
        .take(n)
        .enumerate()
        .map(|(i, p)| Problem {
            id: format!("{prefix}{i:05}"),
            ..p
        })
        .collect()
}

/// The splits of a run of `seed` with these sizes.
pub fn games(seed: u64, demo: usize, label: usize, eval: usize, search: usize) -> Games {
    let mut seen = HashSet::new();
    Games {
        demo: draw(seed, 1, demo, "d", &mut seen),
        label: draw(seed, 2, label, "l", &mut seen),
        eval: draw(seed, 3, eval, "e", &mut seen),
        search: draw(seed, 4, search, "t", &mut seen),
    }
}

/// World `index` of stream `seed` as a lab problem ([`Domain::generate`]): the task as the
/// question, no reference steps (the expert plays it).
pub fn lab_problem(seed: u64, index: usize) -> LabProblem {
    let p = problem(seed, index);
    LabProblem {
        id: p.id,
        family: "rooms".into(),
        question: p.question,
        gold: "success".into(),
        quantities: Vec::new(),
        names: Vec::new(),
        steps: Vec::new(),
        domain: Domain::Agent,
    }
}

/// Every word the rooms world writes and its actions use: what a half-skilled expert says
/// and meets in 400 worlds (any world's words are among them: the names, directions and
/// messages come from short fixed lists).
pub fn words() -> Vec<String> {
    static WORDS: OnceLock<Vec<String>> = OnceLock::new();
    WORDS
        .get_or_init(|| {
            let problems: Vec<Problem> = (0..400).map(|i| problem(0x5eed, i)).collect();
            let expert = Expert::new(&problems, 0.5).expect("generated worlds are valid");
            let env = Rooms::silent(24);
            let mut words = BTreeSet::new();
            for p in &problems {
                let t = play(&expert, &env, p, p.id.clone(), 7);
                let texts = std::iter::once(t.question.as_str())
                    .chain(t.steps.iter().map(|s| s.text.as_str()))
                    .chain(t.steps.iter().filter_map(|s| s.observation.as_deref()));
                words.extend(texts.flat_map(str::split_whitespace).map(str::to_string));
            }
            words.insert("Observation:".into());
            words.into_iter().collect()
        })
        .clone()
}
