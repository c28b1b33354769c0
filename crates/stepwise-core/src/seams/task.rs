//! [`Task`]: what a problem's correct answer is and how an answer is graded.

use crate::answer::extract_answer;
use crate::grader::{grade, GradeMode};
use crate::{Problem, Solution};

/// Problems, gold answers and grading, with an optional exact step checker. The one place the
/// question "is this solution correct?" is answered.
pub trait Task: Sync {
    /// The task's problems (may be empty when the problems come with the solutions).
    fn problems(&self) -> &[Problem];

    /// The final answer that `steps` state, if any.
    fn answer(&self, steps: &[String]) -> Option<String>;

    /// Whether a given answer equals the gold one.
    fn grade(&self, answer: &str, gold: &str) -> bool;

    /// Whether a solution made of `steps` reaches `gold`.
    fn is_correct(&self, gold: &str, steps: &[String]) -> bool {
        self.answer(steps).is_some_and(|a| self.grade(&a, gold))
    }

    /// An exact verdict for every step of a solution to problem `problem_id`, where the task has
    /// an exact checker (the lab does; natural-language math does not).
    fn check_steps(&self, _problem_id: &str, _steps: &[String]) -> Option<Vec<bool>> {
        None
    }

    /// Exact verdicts for the steps of a solution still being written (a search's open beam):
    /// as [`Task::check_steps`], except that not having stated an answer yet is no error. By
    /// default the same as [`Task::check_steps`].
    fn check_prefix(&self, problem_id: &str, steps: &[String]) -> Option<Vec<bool>> {
        self.check_steps(problem_id, steps)
    }

    /// Fill a solution's `final_answer` and, when its gold answer is known, `correct`.
    fn grade_solution(&self, s: &mut Solution) {
        let steps = s.step_strings();
        s.final_answer = self.answer(&steps);
        if let Some(gold) = &s.gold_answer {
            s.correct = Some(s.final_answer.as_deref().is_some_and(|a| self.grade(a, gold)));
        }
    }
}

/// Natural-language math: the answer is extracted from the steps (`\boxed{}`, "The answer is",
/// GSM8K's `####`) and graded by stepwise's grader.
#[derive(Debug, Clone)]
pub struct MathTask {
    /// The problems (may be empty).
    pub problems: Vec<Problem>,
    /// How answers are compared.
    pub mode: GradeMode,
}

impl Default for MathTask {
    fn default() -> Self {
        MathTask {
            problems: Vec::new(),
            mode: GradeMode::Lenient,
        }
    }
}

impl Task for MathTask {
    fn problems(&self) -> &[Problem] {
        &self.problems
    }

    fn answer(&self, steps: &[String]) -> Option<String> {
        extract_answer(&steps.join("\n"))
    }

    fn grade(&self, answer: &str, gold: &str) -> bool {
        grade(answer, gold, self.mode)
    }
}
