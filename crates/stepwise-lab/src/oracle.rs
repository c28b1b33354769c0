//! The lab domain behind the seams: [`LabTask`], grading and the exact step checker (as a step
//! scorer, `stepwise_core::seams::CheckerScorer` over it: the ceiling any PRM is measured against).

use crate::task::{self, Domain, LabProblem};
use std::collections::HashMap;
use stepwise_core::seams::Task;
use stepwise_core::{Problem, Provenance, Solution, StepLabel};

/// The lab's problems as a [`Task`]: a solution's answer is what it states (`The answer is X`),
/// or what its program returns in the code domain, graded by equality; every step has an exact
/// verdict ([`task::check_steps`]).
pub struct LabTask {
    problems: Vec<Problem>,
    by_id: HashMap<String, LabProblem>,
    domain: Domain,
}

impl LabTask {
    /// A task over these problems (all of one domain: the first one's).
    pub fn new<'a>(problems: impl IntoIterator<Item = &'a LabProblem>) -> Self {
        let by_id: HashMap<String, LabProblem> = problems.into_iter().map(|p| (p.id.clone(), p.clone())).collect();
        let mut problems: Vec<Problem> = by_id.values().map(LabProblem::problem).collect();
        problems.sort_by(|a, b| a.id.cmp(&b.id));
        let domain = by_id.values().next().map_or(Domain::Arithmetic, |p| p.domain);
        assert!(
            by_id.values().all(|p| p.domain == domain),
            "a lab task's problems are of one domain"
        );
        LabTask {
            problems,
            by_id,
            domain,
        }
    }

    /// A problem by id.
    pub fn problem(&self, id: &str) -> Option<&LabProblem> {
        self.by_id.get(id)
    }

    /// `s` with every step labelled by the exact checker (for solutions made after sampling,
    /// such as OmegaPRM's rollouts, which carry no `meta.oracle`; steps of an unknown problem
    /// stay unlabelled).
    pub fn oracle_labelled(&self, s: &Solution) -> Solution {
        let mut out = s.clone();
        let verdicts = self.check_steps(&s.problem_id, &s.step_strings()).unwrap_or_default();
        for (st, ok) in out.steps.iter_mut().zip(verdicts) {
            st.label = Some(StepLabel::from_bool(ok, Provenance::Oracle));
        }
        out
    }
}

impl Task for LabTask {
    fn problems(&self) -> &[Problem] {
        &self.problems
    }
    fn answer(&self, steps: &[String]) -> Option<String> {
        self.domain.answer(steps)
    }
    fn grade(&self, answer: &str, gold: &str) -> bool {
        answer == gold
    }
    fn check_steps(&self, problem_id: &str, steps: &[String]) -> Option<Vec<bool>> {
        Some(task::check_steps(self.by_id.get(problem_id)?, steps))
    }
    fn check_prefix(&self, problem_id: &str, steps: &[String]) -> Option<Vec<bool>> {
        Some(task::check_prefix(self.by_id.get(problem_id)?, steps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use stepwise_core::seams::{CheckerScorer, ScoreInput, StepScorer};

    #[test]
    fn the_oracle_scorer_and_the_task_agree_with_the_checker() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let problems: Vec<LabProblem> = (0..20).map(|i| crate::problems::arithmetic(&mut rng, i)).collect();
        let lab = LabTask::new(&problems);
        for p in &problems {
            let mut wrong = p.steps.clone();
            wrong[0] = "1 * 1 = 1".into();
            for steps in [&p.steps, &wrong] {
                let verdicts = task::check_steps(p, steps);
                let refs: Vec<&str> = steps.iter().map(String::as_str).collect();
                let input = ScoreInput {
                    problem_id: &p.id,
                    question: &p.question,
                    steps: refs,
                    partial: false,
                };
                let s = CheckerScorer { task: &lab }.score(&[input]).unwrap();
                let want: Vec<f32> = verdicts.iter().map(|&ok| if ok { 1.0 } else { 0.0 }).collect();
                assert_eq!(s.scores[0], want);
                if verdicts.iter().all(|&ok| ok) {
                    assert!(
                        lab.is_correct(&p.gold, steps),
                        "{}: every step correct, wrong answer",
                        p.id
                    );
                }
            }
            assert!(
                lab.is_correct(&p.gold, &p.steps),
                "{}: the reference solution is correct",
                p.id
            );
            assert!(
                !task::check_steps(p, &wrong)[0],
                "{}: `1 * 1 = 1` is no first step",
                p.id
            );
            // A search's open beam: the correct steps before the answer are correct as a prefix,
            // while as a complete solution its last step fails to state an answer.
            let open: Vec<&str> = p.steps[..p.steps.len() - 1].iter().map(String::as_str).collect();
            let as_prefix = ScoreInput {
                problem_id: &p.id,
                question: &p.question,
                steps: open.clone(),
                partial: true,
            };
            let s = CheckerScorer { task: &lab }
                .score(&[
                    as_prefix.clone(),
                    ScoreInput {
                        partial: false,
                        ..as_prefix
                    },
                ])
                .unwrap();
            assert!(s.scores[0].iter().all(|&v| v == 1.0), "{}: {:?}", p.id, s.scores[0]);
            assert_eq!(s.scores[1].last(), Some(&0.0));
        }
        let missing = ScoreInput {
            problem_id: "nope",
            question: "",
            steps: vec![],
            partial: false,
        };
        assert!(CheckerScorer { task: &lab }.score(&[missing]).is_err());
    }
}
