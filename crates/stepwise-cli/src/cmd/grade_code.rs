//! `stepwise grade --task code`: read programs, run them against their problems' tests in the
//! sandbox ([`stepwise_code::grading`]), write each record with its result and report pass@k.
use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::Path;
use stepwise_code::grading::{graded_fields, pass_at_ks, Program};
use stepwise_code::CodeTask;
use stepwise_core::io::raw_records;
use stepwise_core::journal::{Claim, Journal};

/// Grade every program of `input` against the problems of `task`, writing each record with
/// `passed`, `result`, `tests_passed` and `tests_run` (in input order, as programs finish) to
/// `output` or stdout, and pass@k to stderr. A `.jsonl` output is a journal: a run cut off (even
/// by `kill -9`) and started again runs only the programs it lacks.
pub fn run(a: &super::grade::Args, task: &CodeTask) -> Result<()> {
    let (objects, programs, skipped) = read_programs(&a.input, task, a.skip_invalid)?;
    let mut out = Output::open(a, &objects)?;
    let resumed = out.resumed();
    // Pass@k counts every program, those graded by an earlier run included.
    let mut per_problem: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut count = |problem: &str, passed: bool| {
        let entry = per_problem.entry(problem.to_string()).or_default();
        entry.0 += 1;
        entry.1 += usize::from(passed);
    };
    for (p, &passed) in programs.iter().zip(out.passed()) {
        count(&p.problem, passed);
    }
    let bar = crate::progress::bar(Some(programs.len() as u64), "running tests");
    bar.set_position(resumed as u64);
    let todo = &programs[resumed..];
    let mut objects = objects.into_iter().skip(resumed);
    task.run_programs_in_order(todo, a.threads.unwrap_or(0), |i, o| {
        let mut obj = objects.next().context("a program without its record")?;
        count(&todo[i].problem, o.passed());
        if obj.contains_key("steps") {
            obj.insert("correct".into(), Value::Bool(o.passed()));
        }
        obj.extend(graded_fields(&o));
        out.write(&Value::Object(obj))?;
        bar.set_position((resumed + i + 1) as u64);
        Ok(())
    })?;
    bar.finish_and_clear();
    out.finish()?;
    report(&per_problem, resumed, skipped);
    Ok(())
}

/// The records of `input` with their programs (a record that is not one, or names no problem
/// of `task`, stops the run naming its line, or is counted and left out with `skip_invalid`).
type Read = (Vec<Map<String, Value>>, Vec<Program>, usize);

fn read_programs(input: &Path, task: &CodeTask, skip_invalid: bool) -> Result<Read> {
    let mut records = Vec::new();
    let mut skipped = 0usize;
    for (line, rec) in raw_records(input)? {
        let read = rec.map_err(|e| anyhow::anyhow!("{e}")).and_then(|v| {
            let Value::Object(obj) = v else {
                bail!("expected a JSON object")
            };
            let program = Program::of_record(&obj)?;
            if task.problem(&program.problem).is_none() {
                bail!("field `task_id`: no problem `{}` in --problems", program.problem);
            }
            Ok((obj, program))
        });
        match read {
            Ok(r) => records.push(r),
            Err(_) if skip_invalid => skipped += 1,
            Err(e) => bail!("{}:{line}: {e}", input.display()),
        }
    }
    let (objects, programs) = records.into_iter().unzip();
    Ok((objects, programs, skipped))
}

/// Where graded records go: a `.jsonl` file as a journal, else stdout (or a file of another
/// name), line by line.
enum Output {
    Journal {
        journal: Journal,
        /// Whether each program an earlier run graded passed.
        passed: Vec<bool>,
        _claim: Claim,
    },
    Stream(BufWriter<Box<dyn Write>>),
}

impl Output {
    fn open(a: &super::grade::Args, objects: &[Map<String, Value>]) -> Result<Self> {
        let Some(path) = a
            .output
            .as_deref()
            .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        else {
            return Ok(Output::Stream(a.written()?));
        };
        stepwise_core::io::refuse_same_file(&a.input, path)?;
        let claim = stepwise_core::journal::claim(
            path,
            &serde_json::json!({
                "input": stepwise_core::journal::fingerprint(objects)?, "task": a.task.identity(None)?,
            }),
        )?;
        let (journal, kept) = Journal::open::<Map<String, Value>>(path, |_| String::new())?;
        if kept.len() > objects.len() {
            bail!(
                "{} holds {} records, the input {}: the file is left as it is; choose another output",
                path.display(),
                kept.len(),
                objects.len()
            );
        }
        let passed = kept
            .iter()
            .map(|r| r.get("passed") == Some(&Value::Bool(true)))
            .collect();
        Ok(Output::Journal {
            journal,
            passed,
            _claim: claim,
        })
    }

    fn resumed(&self) -> usize {
        self.passed().len()
    }

    /// Whether each program an earlier run graded passed.
    fn passed(&self) -> &[bool] {
        match self {
            Output::Journal { passed, .. } => passed,
            Output::Stream(_) => &[],
        }
    }

    fn write(&mut self, record: &Value) -> Result<()> {
        match self {
            Output::Journal { journal, .. } => journal.append(String::new(), record),
            Output::Stream(out) => {
                serde_json::to_writer(&mut *out, record)?;
                Ok(out.write_all(b"\n")?)
            }
        }
    }

    fn finish(self) -> Result<()> {
        match self {
            Output::Journal { .. } => Ok(()),
            Output::Stream(mut out) => Ok(out.flush()?),
        }
    }
}

/// The closing lines: programs run, passed, pass@k.
fn report(per_problem: &BTreeMap<String, (usize, usize)>, resumed: usize, skipped: usize) {
    let (ran, passed) = per_problem.values().fold((0, 0), |(n, p), &(a, b)| (n + a, p + b));
    let kept = if resumed > 0 {
        format!(" ({resumed} graded before were kept)")
    } else {
        String::new()
    };
    let ks: Vec<String> = pass_at_ks(per_problem, &[1, 10, 100])
        .into_iter()
        .map(|(k, v)| format!("pass@{k} {:.1}%", 100.0 * v))
        .collect();
    eprintln!(
        "ran {ran} programs of {} problems{kept}: {passed} passed; {}",
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
}
