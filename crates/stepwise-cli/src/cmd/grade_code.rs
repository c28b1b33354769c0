//! `stepwise grade --task code`: read programs, run them against their problems' tests in the
//! sandbox ([`stepwise_code::grading`]), write each record with its result and report pass@k.
use anyhow::{bail, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use stepwise_code::grading::{graded_fields, pass_at_ks, Program};
use stepwise_code::CodeTask;
use stepwise_core::io::raw_records;

/// Grade every program of `input` against the problems of `task`, writing each record with
/// `passed`, `result`, `tests_passed` and `tests_run` to stdout, and pass@k to stderr.
pub fn run(input: &std::path::Path, task: &CodeTask, threads: Option<usize>, skip_invalid: bool) -> Result<()> {
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
    let (objects, programs): (Vec<_>, Vec<Program>) = records.into_iter().unzip();
    let bar = crate::progress::bar(Some(programs.len() as u64), "running tests");
    let outcomes = task.run_programs(&programs, threads.unwrap_or(0), &|done| bar.set_position(done as u64))?;
    bar.finish_and_clear();
    let out = std::io::stdout();
    let mut out = BufWriter::new(out.lock());
    let mut per_problem: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for ((mut obj, p), o) in objects.into_iter().zip(programs).zip(&outcomes) {
        let entry = per_problem.entry(p.problem).or_default();
        entry.0 += 1;
        entry.1 += usize::from(o.passed());
        if obj.contains_key("steps") {
            obj.insert("correct".into(), Value::Bool(o.passed()));
        }
        obj.extend(graded_fields(o));
        serde_json::to_writer(&mut out, &Value::Object(obj))?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    let passed = outcomes.iter().filter(|o| o.passed()).count();
    let ks: Vec<String> = pass_at_ks(&per_problem, &[1, 10, 100])
        .into_iter()
        .map(|(k, v)| format!("pass@{k} {:.1}%", 100.0 * v))
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
