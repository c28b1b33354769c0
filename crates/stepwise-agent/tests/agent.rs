//! The agent domain end to end on rooms worlds: the oracle against the expert, every kind of
//! action, lucky successes, Monte Carlo labels from forked states, TD labels, and environments
//! that fail.

use anyhow::{bail, Result};
use std::collections::HashMap;
use stepwise_agent::rooms::{self, Rooms};
use stepwise_agent::{play, BinarySearch, Expert, Games, MonteCarlo, Oracle, TemporalDifference};
use stepwise_core::seams::{ActionKind, Annotator, Environment, Episode, Observation};
use stepwise_core::testing::Batching;
use stepwise_core::{LabelValue, Problem, Provenance, Rating, Solution};

fn problems(n: usize) -> Vec<Problem> {
    (0..n).map(|i| rooms::problem(11, i)).collect()
}

fn trajectories(ps: &[Problem], skill: f64, n: usize) -> Vec<Solution> {
    let expert = Expert::new(ps, skill).unwrap();
    let env = Rooms::default();
    ps.iter()
        .flat_map(|p| (0..n).map(move |j| (p, j)))
        .map(|(p, j)| play(&expert, &env, p, format!("{}-{j}", p.id), j as u64 * 7 + 1))
        .collect()
}

fn oracle_kinds(ps: &[Problem], sols: &[Solution]) -> Vec<Vec<String>> {
    let env = Rooms::default();
    let games = Games::new(&env, ps.to_vec());
    sols.iter()
        .map(|s| {
            let (l, _) = Oracle(&games).annotate(s).unwrap();
            let kinds = l.meta["actions"].as_array().unwrap();
            kinds.iter().map(|k| k.as_str().unwrap().to_string()).collect()
        })
        .collect()
}

#[test]
fn a_perfect_expert_always_wins_by_progress_alone_in_the_fewest_actions() {
    let ps = problems(60);
    let sols = trajectories(&ps, 1.0, 1);
    let env = Rooms::default();
    for (s, kinds) in sols.iter().zip(oracle_kinds(&ps, &sols)) {
        assert_eq!(s.correct, Some(true), "{}: {:?}", s.id, s.turn_strings());
        assert!(kinds.iter().all(|k| k == "progress"), "{}: {kinds:?}", s.id);
        // As many actions as the oracle's distance from the start.
        let p = ps.iter().find(|p| p.id == s.problem_id).unwrap();
        let (_, first) = env.reset(p).unwrap();
        assert!(first.starts_with("You are in the"));
        let w = rooms::world_of(p).unwrap();
        let d = rooms::rules::distance(&w, &w.initial(), &mut HashMap::new());
        assert_eq!(d, Some(s.steps.len() as u8), "{}", s.id);
        assert!(s.steps.iter().all(|st| st.observation.is_some()));
        assert!(s.question.starts_with("Put the ") && s.question.contains("\nObservation: You are in the"));
    }
    let lengths: Vec<usize> = sols.iter().map(|s| s.steps.len()).collect();
    assert!(
        lengths.iter().min() < lengths.iter().max(),
        "worlds differ in length: {lengths:?}"
    );
    assert!(*lengths.iter().max().unwrap() >= 6, "{lengths:?}");
}

#[test]
fn a_noisy_expert_shows_every_kind_of_action_and_lucky_successes() {
    let ps = problems(40);
    let sols = trajectories(&ps, 0.6, 3);
    let kinds = oracle_kinds(&ps, &sols);
    let mut seen: HashMap<String, usize> = HashMap::new();
    for k in kinds.iter().flatten() {
        *seen.entry(k.clone()).or_default() += 1;
    }
    for k in ["progress", "useless", "regress", "invalid", "ruin"] {
        assert!(seen.get(k).copied().unwrap_or(0) > 0, "no {k} action in {seen:?}");
    }
    // Lucky: the goal reached after a bad action the outcome cannot see.
    let lucky = sols
        .iter()
        .zip(&kinds)
        .filter(|(s, k)| s.correct == Some(true) && k.iter().any(|k| k == "regress" || k == "invalid"))
        .count();
    let wins = sols.iter().filter(|s| s.correct == Some(true)).count();
    assert!(lucky > 0 && lucky < wins, "{lucky} lucky of {wins} wins");
    // A ruin ends the episode there, as lost.
    for (s, k) in sols.iter().zip(&kinds) {
        if let Some(i) = k.iter().position(|k| k == "ruin") {
            assert_eq!(i + 1, s.steps.len(), "{}", s.id);
            assert_eq!(s.correct, Some(false));
            assert_eq!(s.meta["end"], "lost");
        }
    }
}

#[test]
fn monte_carlo_labels_come_from_forked_states_and_agree_with_the_oracle() {
    let ps = problems(12);
    let sols = trajectories(&ps, 0.6, 2);
    let env = Rooms::default();
    let games = Games::new(&env, ps.clone());
    let roller = Expert::new(&ps, 0.8).unwrap();
    let mc = MonteCarlo {
        games: &games,
        policy: &roller,
        rollouts: 6,
        seed: 3,
        gamma: 0.9,
    };
    let kinds = oracle_kinds(&ps, &sols);
    let (mut labelled, mut spent_steps) = (Vec::new(), 0);
    for (s, k) in sols.iter().zip(&kinds) {
        let (l, spent) = mc.annotate(s).unwrap();
        assert_eq!(mc.annotate(s).unwrap().0, l, "seeded: the same labels again");
        spent_steps += spent.env_steps;
        assert!(spent.rollouts > 0 || s.steps.len() == 1);
        for (st, kind) in l.steps.iter().zip(k) {
            let label = st.label.as_ref().expect("every action labelled");
            let LabelValue::Soft { p } = label.value else {
                panic!("soft labels")
            };
            assert!(matches!(label.source, Provenance::MonteCarlo { .. }));
            if kind == "ruin" {
                assert_eq!(p, 0.0, "{}: nothing wins after a ruin", s.id);
            }
        }
        labelled.push(l);
    }
    assert!(spent_steps > sols.iter().map(|s| s.steps.len()).sum::<usize>());
    // The progress the labels show separates the oracle's good actions from its bad ones (with
    // a discount: an expert that nearly always wins in the end wins as often after a wasted
    // action, only later).
    let oracle: Vec<Solution> = {
        let games = Games::new(&env, ps.clone());
        sols.iter().map(|s| Oracle(&games).annotate(s).unwrap().0).collect()
    };
    let agreement = stepwise_agent::quality::agreement(&labelled, &oracle, 0.5, 0.9);
    assert!(agreement.compared > 50 && agreement.auc > 0.6, "{agreement:?}");
    let chance = stepwise_agent::quality::agreement(&oracle, &oracle, 0.5, 1.0);
    assert_eq!(chance.compared, 0, "hard labels show no progress");
}

#[test]
fn td_labels_read_the_values_and_the_outcome() {
    let ps = problems(3);
    let mut sols = trajectories(&ps, 0.9, 1);
    for s in &mut sols {
        let n = s.steps.len();
        s.set_scores("prm", (0..n).map(|i| (i + 1) as f32 / n as f32).collect());
    }
    let td = TemporalDifference {
        values: "prm".into(),
        v0: 0.5,
        gamma: 1.0,
        lambda: 1.0,
    };
    for s in &sols {
        let (l, spent) = td.annotate(s).unwrap();
        assert_eq!(spent.env_steps, 0, "no rollouts, no environment");
        let outcome = f32::from(u8::from(s.correct == Some(true)));
        for st in &l.steps {
            // λ = 1, γ = 1: the outcome itself.
            assert_eq!(st.label.as_ref().unwrap().value, LabelValue::Soft { p: outcome });
            assert!(matches!(
                st.label.as_ref().unwrap().source,
                Provenance::TemporalDifference { .. }
            ));
        }
    }
    let mut unscored = sols[0].clone();
    unscored.scores.clear();
    // λ = 1 needs no values where the outcome is known; other λ read them.
    assert!(td.annotate(&unscored).is_ok());
    let td = TemporalDifference { lambda: 0.5, ..td };
    let e = td.annotate(&unscored).unwrap_err().to_string();
    assert!(e.contains("scores.prm") && e.contains(&sols[0].id), "{e}");
}

/// An environment that fails as untrusted ones do: it raises at its third action, or answers
/// with a NUL, or its problem is unknown.
struct Failing {
    how: &'static str,
}

struct FailingEpisode {
    how: &'static str,
    taken: usize,
}

impl Episode for FailingEpisode {
    fn step(&mut self, _action: &str) -> Result<Observation> {
        self.taken += 1;
        match (self.how, self.taken) {
            ("raises", 3) => bail!("TypeError: the simulator crashed"),
            ("nul", 2) => Ok(Observation {
                text: "bad\0text".into(),
                ..Default::default()
            }),
            _ => Ok(Observation {
                text: "fine".into(),
                ..Default::default()
            }),
        }
    }

    fn fork(&self) -> Result<Box<dyn Episode>> {
        Ok(Box::new(FailingEpisode {
            how: self.how,
            taken: self.taken,
        }))
    }
}

impl Environment for Failing {
    fn reset(&self, p: &Problem) -> Result<(Box<dyn Episode>, String)> {
        if p.id == "missing" {
            bail!("no such game");
        }
        Ok((
            Box::new(FailingEpisode {
                how: self.how,
                taken: 0,
            }),
            "start".into(),
        ))
    }
}

#[test]
fn a_failing_environment_ends_that_trajectory_with_a_named_error() {
    let policy = stepwise_core::testing::ScriptedPolicy(|_: &str, _: &[&str], _| vec!["wait".to_string()]);
    let p = Problem {
        id: "g".into(),
        question: "Wait.".into(),
        ..Default::default()
    };
    let raised = play(&policy, &Failing { how: "raises" }, &p, "a".into(), 0);
    assert_eq!(raised.meta["end"], "failed");
    assert!(raised.meta["error"]
        .as_str()
        .unwrap()
        .contains("environment: TypeError"));
    assert_eq!(
        raised.steps.len(),
        3,
        "the steps before it are kept, the failing action too"
    );
    assert_eq!(raised.correct, None);
    let nul = play(&policy, &Failing { how: "nul" }, &p, "b".into(), 0);
    assert!(
        nul.meta["error"].as_str().unwrap().contains("malformed observation"),
        "{:?}",
        nul.meta
    );
    let missing = Problem {
        id: "missing".into(),
        ..p.clone()
    };
    let gone = play(&policy, &Failing { how: "fine" }, &missing, "c".into(), 0);
    assert!(gone.meta["error"].as_str().unwrap().contains("no such game"));
    // Out of actions: lost, not failed.
    let long = play(&policy, &Failing { how: "fine" }, &p, "d".into(), 0);
    assert_eq!(
        (long.meta["end"].as_str(), long.correct),
        (Some("out_of_actions"), Some(false))
    );
    assert_eq!(long.steps.len(), 30);
}

#[test]
fn the_oracle_rates_progress_good_useless_neutral_and_the_rest_bad() {
    assert_eq!(ActionKind::Progress.rating(), Rating::Good);
    assert_eq!(ActionKind::Useless.rating(), Rating::Neutral);
    for k in [ActionKind::Regress, ActionKind::Invalid, ActionKind::Ruin] {
        assert_eq!(k.rating(), Rating::Bad);
    }
    // A hand-made walk through one world.
    let p = rooms::problem(11, 0);
    let world = rooms::world_of(&p).unwrap();
    let (ep, _) = Rooms::default().reset(&p).unwrap();
    assert_eq!(ep.judge("look"), Some(ActionKind::Useless));
    assert_eq!(ep.judge("dance wildly"), Some(ActionKind::Invalid));
    assert!(ep
        .judge(&format!("take {}", world.items[world.goal_item].name))
        .is_some());
}

/// The silent world says nothing of the goal: reaching it ends nothing, the player stops when
/// it judges the item in place, and the outcome is where the item lies then. A perfect expert
/// wins every silent world and stops right after the goal; an agent that stops early, or
/// keeps acting and takes the item out again, has failed.
#[test]
fn the_silent_world_judges_where_the_episode_ends() {
    let ps = problems(40);
    let env = Rooms::silent(30);
    let expert = Expert::new(&ps, 1.0).unwrap();
    for p in &ps {
        let s = play(&expert, &env, p, format!("{}-0", p.id), 3);
        assert_eq!(s.correct, Some(true), "{}: {:?}", s.id, s.turn_strings());
        assert_eq!(s.meta["end"], "stopped", "{}", s.id);
        let turns = s.turn_strings();
        assert!(turns.iter().all(|t| !t.contains("You have done it")), "{turns:?}");
        let w = rooms::world_of(p).unwrap();
        let end = w.replay(s.steps.iter().map(|st| st.text.as_str()));
        assert!(w.reached(&end));
        assert_eq!(
            w.goal_place(&end),
            format!("in the {}", w.containers[w.goal_container].name)
        );
        // One action short of the goal, stopping there is a failure.
        let (mut ep, _) = env.reset(p).unwrap();
        for st in &s.steps[..s.steps.len() - 1] {
            let o = ep.step(&st.text).unwrap();
            assert!(!o.done, "the silent world ends nothing: {o:?}");
        }
        assert_eq!(ep.outcome(), Some(false));
        let last = ep.step(&s.steps.last().unwrap().text).unwrap();
        assert!(!last.done && !last.success, "{last:?}");
        assert_eq!(ep.outcome(), Some(true));
        // Taking the item out again loses it.
        let item = &w.items[w.goal_item].name;
        ep.step(&format!("take {item}")).unwrap();
        assert_eq!(ep.outcome(), Some(false));
    }
    // A noisy expert on a short budget: some silent trajectories fail without the world ever
    // saying so.
    let noisy = Expert::new(&ps, 0.5).unwrap();
    let short = Rooms::silent(12);
    let outcomes: Vec<Option<bool>> = ps
        .iter()
        .map(|p| play(&noisy, &short, p, format!("{}-1", p.id), 5).correct)
        .collect();
    assert!(
        outcomes.contains(&Some(true)) && outcomes.contains(&Some(false)),
        "{outcomes:?}"
    );
}

/// Episodes played together (`play_all`) play as each alone: one batch call a turn carries
/// every episode still going, an episode whose world cannot start or whose ask fails ends alone
/// with its error, and the others go on.
#[test]
fn episodes_played_together_play_as_each_alone_one_batch_a_turn() {
    let ps = problems(6);
    let failing = ps[1].question.clone();
    let policy = Batching {
        fails: Box::new(move |a| a.question.starts_with(&failing) && a.prefix.len() == 1),
        ..Batching::new(Expert::new(&ps, 0.6).unwrap())
    };
    let env = Rooms::default();
    let missing = Problem {
        id: "missing".into(),
        question: "Put the gem in the box.".into(),
        ..Default::default()
    };
    let mut jobs: Vec<(&Problem, String, u64)> = (ps.iter())
        .flat_map(|p| (0..3).map(move |j| (p, format!("{}-{j}", p.id), j as u64 * 7 + 1)))
        .collect();
    jobs.insert(4, (&missing, "missing-0".into(), 3));
    let together = stepwise_agent::rollout::play_all(&policy, &env, &jobs);
    let calls = policy.calls();
    let alone: Vec<Solution> = (jobs.iter())
        .map(|(p, id, seed)| play(&policy.inner, &env, p, id.clone(), *seed))
        .collect();
    assert_eq!(together.len(), jobs.len());
    let failed_asks = together
        .iter()
        .filter(|t| {
            t.meta
                .get("error")
                .is_some_and(|e| e.as_str().unwrap().contains("policy: the server went away"))
        })
        .count();
    for (t, a) in together.iter().zip(&alone) {
        if t.meta
            .get("error")
            .is_some_and(|e| e.as_str().unwrap().contains("server went away"))
        {
            assert_eq!((t.steps.len(), t.correct), (1, None), "{}", t.id);
            assert_eq!(t.steps[..], a.steps[..1], "{}", t.id);
            continue;
        }
        assert_eq!(
            serde_json::to_value(t).unwrap(),
            serde_json::to_value(a).unwrap(),
            "{}",
            t.id
        );
    }
    assert!(together[4].meta["error"].as_str().unwrap().contains("environment:"));
    let same_task = jobs.iter().filter(|(p, _, _)| p.question == ps[1].question).count();
    assert_eq!(failed_asks, same_task, "the episodes of the second world's task");
    // One call a turn: as many calls as the longest episode's turns, the first with every
    // episode that started.
    let longest = together
        .iter()
        .map(|t| t.steps.len() + usize::from(t.meta["end"] == "stopped"))
        .max()
        .unwrap();
    assert_eq!(calls.len(), longest, "{calls:?}");
    assert_eq!(calls[0], jobs.len() - 1);
    assert!(calls.windows(2).all(|w| w[0] >= w[1]), "{calls:?}");
}

/// `together` labels `sols` together as `alone` labels each, errors included; the rollouts spent
/// and the errors met.
fn labelled_together_as_alone(together: &dyn Annotator, alone: &dyn Annotator, sols: &[Solution]) -> (usize, usize) {
    let mut got: Vec<Option<Result<(Solution, stepwise_core::seams::Spent)>>> = sols.iter().map(|_| None).collect();
    together
        .annotate_together(sols, &mut |i, r| {
            assert!(got[i].replace(r).is_none(), "trajectory {i} handed on twice");
            Ok(())
        })
        .expect("the policy batches")
        .unwrap();
    let (mut rollouts, mut errors) = (0, 0);
    for (i, (s, got)) in sols.iter().zip(got).enumerate() {
        let got = got.unwrap_or_else(|| panic!("trajectory {i} never handed on"));
        match (got, alone.annotate(s)) {
            (Ok(got), Ok(want)) => {
                assert_eq!(got, want, "{} {}", together.name(), s.id);
                rollouts += got.1.rollouts;
            }
            (Err(got), Err(want)) => {
                assert_eq!(got.to_string(), want.to_string());
                errors += 1;
            }
            (got, want) => panic!("{}: {:?} together, {:?} alone", s.id, got.is_ok(), want.is_ok()),
        }
    }
    (rollouts, errors)
}

/// Monte Carlo labels of many trajectories (every state's rollouts played together, one batch
/// a turn), and binary search's (every trajectory's next probe played together), are the labels
/// and costs each trajectory gets alone, in far fewer policy calls; a trajectory of an unknown
/// problem gets its error, and the others their labels.
#[test]
fn labels_of_trajectories_played_together_are_each_ones_alone() {
    let ps = problems(8);
    let mut sols = trajectories(&ps, 0.6, 3);
    sols[3].problem_id = "nowhere".into();
    let env = Rooms::default();
    let games = Games::new(&env, ps.clone());
    let policy = Batching::new(Expert::new(&ps, 0.8).unwrap());
    let mc = |policy| MonteCarlo {
        games: &games,
        policy,
        rollouts: 4,
        seed: 5,
        gamma: 0.9,
    };
    let (rollouts, errors) = labelled_together_as_alone(&mc(&policy), &mc(&policy.inner), &sols);
    let states = rollouts / 4;
    assert_eq!(errors, 1, "the trajectory of an unknown problem fails alone");
    let calls = policy.calls();
    assert!(calls.len() < states, "{} calls for {states} states", calls.len());
    assert!(calls.iter().max() > Some(&4), "several states a call: {calls:?}");
    let bs = |policy| BinarySearch {
        games: &games,
        policy,
        rollouts: 4,
        seed: 5,
    };
    // Poorer trajectories, for more of them to fail and be searched.
    let mut sols = trajectories(&ps, 0.05, 3);
    sols[3].problem_id = "nowhere".into();
    let before = policy.calls().len();
    let (rollouts, _) = labelled_together_as_alone(&bs(&policy), &bs(&policy.inner), &sols);
    let calls = policy.calls()[before..].to_vec();
    let one_by_one = Batching::new(Expert::new(&ps, 0.8).unwrap());
    for s in &sols {
        let _ = bs(&one_by_one).annotate(s);
    }
    let alone = one_by_one.calls().len();
    assert!(
        rollouts > 0 && calls.len() * 2 < alone,
        "{} calls together, {alone} alone",
        calls.len()
    );
    assert!(calls.iter().max() > Some(&4), "several trajectories a call: {calls:?}");
}
