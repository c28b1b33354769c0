//! The code domain's main use: run programs against their problems' tests in the sandbox. Runs
//! the reference solution of the first HumanEval problems of a file, then one with its last line
//! removed, and prints each outcome with its per-assertion results.
//!
//! cargo run -p stepwise-code --example grade_humaneval -- data/humaneval/HumanEval.jsonl

use stepwise_code::problems::{read_problems, steps_of};
use stepwise_code::{CodeTask, Sandbox};

fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/humaneval/HumanEval.jsonl").into());
    let problems: Vec<_> = read_problems(path.as_ref())?.into_iter().take(3).collect();
    let task = CodeTask::new(problems.clone(), Sandbox::new()?);
    for p in &problems {
        let lines = steps_of(&p.reference);
        let whole = task.run(&p.id, &lines, None)?;
        let cut = task.run(&p.id, &lines[..lines.len() - 1], None)?;
        println!(
            "{}: reference {:?} ({} of {} assertions, {:.0} ms); without its last line {:?}",
            p.id,
            whole.status,
            whole.tests.iter().filter(|t| t.passed).count(),
            whole.tests.len(),
            whole.seconds * 1000.0,
            cut.status
        );
        assert!(whole.passed() && !cut.passed());
    }
    Ok(())
}
