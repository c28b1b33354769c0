use super::*;
use crate::test_support::{solution, toy};
use crate::{BinarySearch, McOptions};
use std::sync::Mutex;
use stepwise_core::seams::{Continuation, Until};
use stepwise_core::testing::{PlainTask, ScriptedPolicy};

/// A policy that records the prefixes it is asked to continue and the rollouts it returns.
struct Recording<P> {
    inner: P,
    asked: Mutex<Vec<Vec<String>>>,
    returned: Mutex<usize>,
}

impl<P: Policy> Recording<P> {
    fn new(inner: P) -> Self {
        Recording {
            inner,
            asked: Mutex::new(Vec::new()),
            returned: Mutex::new(0),
        }
    }
}

impl<P: Policy> Policy for Recording<P> {
    fn continue_from(
        &self,
        question: &str,
        prefix: &[&str],
        n: usize,
        until: Until,
        seed: u64,
    ) -> Result<Vec<Continuation>> {
        self.asked
            .lock()
            .unwrap()
            .push(prefix.iter().map(|s| s.to_string()).collect());
        let out = self.inner.continue_from(question, prefix, n, until, seed)?;
        *self.returned.lock().unwrap() += out.len();
        Ok(out)
    }
}

fn omega<'a>(policy: &'a dyn Policy, task: &'a PlainTask, search_limit: usize) -> OmegaPrm<'a> {
    OmegaPrm {
        policy,
        task,
        options: OmegaOptions {
            rollouts: 4,
            search_limit,
            ..Default::default()
        },
    }
}

/// Alone, a solution is bisected exactly as binary search does it: the known first error in
/// ⌊log₂ T⌋ to ⌈log₂ T⌉ batches of rollouts.
#[test]
fn finds_the_known_first_error_in_log_many_batches() {
    let task = PlainTask::default();
    let policy = ScriptedPolicy(toy);
    let o = omega(&policy, &task, 0);
    for t in 1..=17usize {
        for first in 0..t {
            let mut steps: Vec<&str> = vec!["good"; t];
            steps[first] = "bad";
            steps[t - 1] = if first == t - 1 { "answer 2" } else { "bad" };
            let (l, spent) = o.annotate(&solution("s", &steps)).unwrap();
            assert_eq!(l.first_error(), Some(first), "T = {t}, first error {first}");
            assert!(
                l.steps.iter().all(|s| s.label.is_some()),
                "T = {t}: every step labelled"
            );
            // A step the tree rolled out from says how; the others are the tree's own.
            for s in &l.steps {
                let source = &s.label.as_ref().unwrap().source;
                assert!(
                    matches!(source, Provenance::OmegaPrm | Provenance::MonteCarlo { .. }),
                    "T = {t}: {source:?}"
                );
            }
            let (least, most) = ((t as f64).log2().floor() as usize, (t as f64).log2().ceil() as usize);
            assert!(
                (4 * least..=4 * most).contains(&spent.rollouts),
                "T = {t}: {}",
                spent.rollouts
            );
        }
    }
}

/// A problem's solutions share the tree: a prefix probed for one is not rolled out again for
/// another, a right solution costs nothing, the labels are binary search's, and every rollout
/// is counted.
#[test]
fn solutions_of_a_problem_reuse_each_others_rollouts() {
    let task = PlainTask::default();
    let sols = [
        solution("a", &["good", "good", "good", "bad", "bad", "answer 2"]),
        solution("b", &["good", "good", "good", "bad", "x", "answer 2"]),
        solution("c", &["good", "good", "good", "good", "bad", "answer 2"]),
        solution("d", &["good", "answer 1"]),
    ];
    let policy = Recording::new(ScriptedPolicy(toy));
    let out = omega(&policy, &task, 0).annotate_problem(&sols).unwrap();
    // The given solutions first, then the probes' completed rollouts, kept as solutions.
    assert!(out[4..]
        .iter()
        .all(|(s, spent)| s.meta["omegaprm_rollout"] == true && spent.rollouts == 0));
    assert!(out.len() > sols.len());
    let bs = BinarySearch {
        policy: &ScriptedPolicy(toy),
        task: &task,
        options: McOptions { rollouts: 4, seed: 0 },
    };
    let mut alone = 0;
    for ((l, _), s) in out.iter().zip(&sols) {
        assert_eq!(l.id, s.id);
        let (b, spent) = bs.annotate(s).unwrap();
        alone += spent.rollouts;
        let good =
            |x: &Solution| -> Vec<bool> { x.steps.iter().map(|s| s.label.as_ref().unwrap().is_good()).collect() };
        assert_eq!(good(l), good(&b), "{}", s.id);
    }
    let tree: usize = out.iter().map(|(_, s)| s.rollouts).sum();
    assert_eq!(tree, *policy.returned.lock().unwrap(), "every rollout counted");
    assert!(
        tree < alone,
        "the tree spent {tree} rollouts, one search per solution {alone}"
    );
    let asked = policy.asked.lock().unwrap();
    let mut distinct = asked.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), asked.len(), "a prefix rolled out twice: {asked:?}");
    assert_eq!(out[3].1.rollouts, 0, "a right solution costs nothing");
}

/// Searches over the tree's own wrong rollouts label them as new solutions, consistent with
/// what the task's checker says of every step.
#[test]
fn extra_searches_label_new_rollouts() {
    fn slips(_q: &str, prefix: &[&str], j: usize) -> Vec<String> {
        let ok = !prefix.contains(&"bad");
        let rest: &[&str] = match (ok, j % 2) {
            (true, 0) => &["good", "answer 1"],
            _ => &["good", "bad", "good", "answer 2"],
        };
        rest.iter().map(|s| s.to_string()).collect()
    }
    let task = PlainTask::default();
    let sols = [solution("a", &["good", "good", "bad", "good", "answer 2"])];
    let policy = Recording::new(ScriptedPolicy(slips));
    let out = omega(&policy, &task, 3).annotate_problem(&sols).unwrap();
    let extra: Vec<&Solution> = out[1..].iter().map(|(s, _)| s).collect();
    assert!(!extra.is_empty());
    assert!(extra
        .iter()
        .all(|s| s.meta["omegaprm_rollout"] == true && s.id.contains("-omegaprm-")));
    let total: usize = out.iter().map(|(_, s)| s.rollouts).sum();
    assert_eq!(total, *policy.returned.lock().unwrap(), "every rollout counted");
    let mut searched = 0;
    for s in out.iter().map(|(s, _)| s) {
        let mut prefix_ok = true;
        for st in &s.steps {
            prefix_ok &= !st.text.contains("bad");
            if let Some(l) = &st.label {
                assert_eq!(l.is_good(), prefix_ok, "{}: {:?}", s.id, s.step_strings());
            }
        }
        searched += usize::from(s.correct == Some(false) && s.steps.iter().all(|st| st.label.is_some()));
    }
    assert!(
        searched >= 2,
        "the given solution and at least one new rollout fully labelled"
    );
    // Every extra search bisects a rollout the tree did not know about yet: with a larger
    // limit, more steps are labelled, and a limit past what is left changes nothing.
    let labelled = |limit: usize| -> usize {
        let out = omega(&ScriptedPolicy(slips), &task, limit)
            .annotate_problem(&sols)
            .unwrap();
        out.iter()
            .map(|(s, _)| s.steps.iter().filter(|st| st.label.is_some()).count())
            .sum()
    };
    assert!(labelled(3) > labelled(0));
    assert_eq!(labelled(1000), labelled(2000));
}

/// Among equals, MCTS searches the shorter wrong solution first (`β^(len/L)`), and a state
/// already searched from weighs less (`U`).
#[test]
fn selection_prefers_short_solutions_from_unvisited_likely_right_prefixes() {
    let task = PlainTask::default();
    let sols = [
        solution("long", &["good", "good", "good", "good", "bad", "answer 2"]),
        solution("short", &["good", "bad", "answer 2"]),
    ];
    let policy = Recording::new(ScriptedPolicy(toy));
    omega(&policy, &task, 0).annotate_problem(&sols).unwrap();
    let asked = policy.asked.lock().unwrap();
    assert_eq!(asked[0], ["good"], "the short solution's midpoint first: {asked:?}");

    let o = omega(&policy, &task, 0);
    let mut search = o.search_of(&sols).unwrap();
    search.tree = Tree::new();
    let (likely, unlikely) = (
        search.tree.insert(0, &["x".into()]),
        search.tree.insert(0, &["y".into()]),
    );
    let (l1, l2) = (
        search.tree.insert(likely, &["z".into()]),
        search.tree.insert(unlikely, &["z".into()]),
    );
    for (n, hits) in [(likely, 3), (unlikely, 1)] {
        search.tree.nodes[n].rollouts = 4;
        search.tree.nodes[n].hits = hits;
    }
    let pool = [
        Candidate {
            from: unlikely,
            leaf: l2,
            given: None,
        },
        Candidate {
            from: likely,
            leaf: l1,
            given: None,
        },
    ];
    assert_eq!(search.select(&pool), Some(1), "the likelier prefix first");
    search.tree.nodes[likely].visits = 20;
    search.tree.nodes[unlikely].visits = 0;
    assert_eq!(
        search.select(&pool),
        Some(0),
        "exploration turns to the unvisited prefix"
    );
}

/// Many problems searched together on a batching policy (every live problem's next probe in one
/// call a round) give each problem what `annotate_problem` gives it alone, new rollouts and
/// costs included, in far fewer calls than probes; a problem without a gold answer and one the
/// batch fails get their errors, and the others their labels.
#[test]
fn problems_searched_together_are_searched_as_each_alone() {
    use stepwise_core::testing::Batching;
    let task = PlainTask::default();
    let problems: Vec<Vec<Solution>> = (0..70)
        .map(|p| {
            (0..3)
                .map(|j| {
                    let t = 2 + (p + j) % 5;
                    let mut steps = vec!["good"; t];
                    steps[(p * 7 + j) % t] = "bad";
                    steps[t - 1] = if (p + j) % 4 == 0 { "answer 1" } else { "answer 2" };
                    let mut s = solution(&format!("p{p}-{j}"), &steps);
                    s.problem_id = format!("p{p}");
                    s
                })
                .collect()
        })
        .collect();
    let mut problems = problems;
    for s in &mut problems[4] {
        s.gold_answer = None;
    }
    for s in &mut problems[9] {
        s.question = "fail".into();
    }
    let policy = Batching {
        fails: Box::new(|a| a.question == "fail"),
        ..Batching::new(ScriptedPolicy(toy))
    };
    let together = omega(&policy, &task, 2);
    let alone = omega(&policy.inner, &task, 2);
    type Labelled = Vec<(Solution, Spent)>;
    let mut got: Vec<Option<Result<Labelled>>> = problems.iter().map(|_| None).collect();
    together
        .annotate_problems_together(&problems, &mut |i, r| {
            assert!(got[i].replace(r).is_none(), "problem {i} handed on twice");
            Ok(())
        })
        .expect("the policy batches")
        .unwrap();
    let mut probes = 0;
    for (i, (sols, got)) in problems.iter().zip(got).enumerate() {
        match (i, got.unwrap_or_else(|| panic!("problem {i} never handed on"))) {
            (4, Err(e)) => assert!(e.to_string().contains("gold_answer"), "{e}"),
            (9, Err(e)) => assert!(e.to_string().contains("went away"), "{e}"),
            (_, Ok(labelled)) => {
                assert_eq!(labelled, alone.annotate_problem(sols).unwrap(), "problem {i}");
                probes += labelled.iter().map(|(_, s)| s.rollouts).sum::<usize>() / 4;
            }
            (_, Err(e)) => panic!("problem {i}: {e}"),
        }
    }
    let calls = policy.calls();
    assert!(calls.len() * 4 < probes, "{} calls for {probes} probes", calls.len());
    assert!(
        calls.iter().all(|&n| n <= crate::probes::LABELLED_TOGETHER),
        "{calls:?}"
    );
}
