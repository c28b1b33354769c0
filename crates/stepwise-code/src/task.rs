//! [`CodeTask`]: the [`Task`] of programming problems. A solution's steps are the lines of its
//! code (HumanEval: the function's body after the prompt; MBPP: the whole function); its
//! "answer" is that code, and it is correct when the problem's tests pass in the sandbox. The
//! gold answer of a solution is its problem's id, which names the tests to run. Annotators
//! (Monte Carlo, binary search, OmegaPRM) label code steps through it by execution: a prefix of
//! lines is good when completions of it pass the tests.

use crate::problems::{read_problems, CodeProblem};
use crate::sandbox::{Job, Outcome, Sandbox};
use anyhow::{Context, Result};
use std::collections::HashMap;
use std::path::Path;
use stepwise_core::seams::Task;
use stepwise_core::Problem;

/// The stop strings of completions from a function's prompt (the Codex paper's): a completion
/// ends where top-level code starts again.
pub const CODE_STOPS: [&str; 5] = ["\ndef ", "\nclass ", "\nif ", "\nprint(", "\n#"];

/// What a resumed run over the code problems of `path` must share with the run it resumes: the
/// problems' content (a fingerprint of the file) and the time a program may run.
pub fn resume_identity(path: &Path, timeout_seconds: f64) -> Result<serde_json::Value> {
    let text = stepwise_core::io::read_regular_file(path)?;
    Ok(serde_json::json!({
        "task": "code",
        "problems": stepwise_core::journal::fingerprint(&[text])?,
        "timeout": timeout_seconds,
    }))
}

/// Programming problems graded by running their tests (see the module's documentation).
pub struct CodeTask {
    problems: Vec<Problem>,
    by_id: HashMap<String, CodeProblem>,
    sandbox: Sandbox,
}

impl CodeTask {
    /// A task over `problems`, run in `sandbox`.
    pub fn new(problems: Vec<CodeProblem>, sandbox: Sandbox) -> Self {
        CodeTask {
            problems: problems
                .iter()
                .map(|p| Problem {
                    id: p.id.clone(),
                    question: p.prompt.clone(),
                    gold_answer: Some(p.id.clone()),
                    source: Some("code".into()),
                    meta: Default::default(),
                })
                .collect(),
            by_id: problems.into_iter().map(|p| (p.id.clone(), p)).collect(),
            sandbox,
        }
    }

    /// The problems of a HumanEval- or MBPP-shaped file, in the default sandbox.
    pub fn from_file(path: &Path) -> Result<Self> {
        Ok(Self::new(read_problems(path)?, Sandbox::new()?))
    }

    /// The problem `id`.
    pub fn problem(&self, id: &str) -> Option<&CodeProblem> {
        self.by_id.get(id)
    }

    /// The sandbox it runs programs in.
    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    /// Run the program that `steps` make for problem `id` against its tests, tracing
    /// `trace_function` when given.
    pub fn run(&self, id: &str, steps: &[String], trace_function: Option<&str>) -> Result<Outcome> {
        let p = self
            .problem(id)
            .with_context(|| format!("no problem `{id}` in the code task's problems"))?;
        let program = p.program(steps);
        self.sandbox.run(&Job {
            program: &program,
            tests: Some(&p.tests),
            trace_function,
            header: Some(&p.header),
        })
    }
}

impl Task for CodeTask {
    fn problems(&self) -> &[Problem] {
        &self.problems
    }

    fn answer(&self, steps: &[String]) -> Option<String> {
        (!steps.is_empty()).then(|| steps.join("\n"))
    }

    /// Whether the code `answer` passes the tests of the problem whose id is `gold`. A problem
    /// the task does not have, or a sandbox that cannot start, grades as not correct (and says
    /// why on stderr once).
    fn grade(&self, answer: &str, gold: &str) -> bool {
        let steps: Vec<String> = answer.lines().map(str::to_string).collect();
        match self.run(gold, &steps, None) {
            Ok(outcome) => outcome.passed(),
            Err(e) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| eprintln!("code task: {e:#}"));
                false
            }
        }
    }
}
