//! What one sandboxed run costs, by layer: `cargo bench -p stepwise-code --bench sandbox`.
//! Runs a trivial program and HumanEval/0's reference against its tests, one at a time, in the
//! kernel's jail and in the insecure mode (limits only), and prints milliseconds per run.

use std::path::PathBuf;
use std::time::Instant;
use stepwise_code::grading::Program;
use stepwise_code::problems::read_problems;
use stepwise_code::{CodeTask, Isolation, Job, Sandbox};

fn main() -> anyhow::Result<()> {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data");
    let problems = read_problems(&data.join("humaneval/HumanEval.jsonl"))?;
    let runs = 60;
    for isolation in [Isolation::Insecure, Isolation::Kernel] {
        let sandbox = Sandbox::new_with(isolation)?;
        let task = CodeTask::new(problems.clone(), sandbox.clone());
        let reference = Program {
            problem: "HumanEval/0".into(),
            code: problems[0].reference.clone(),
        };
        task.run_program(&reference)?;
        let started = Instant::now();
        for _ in 0..runs {
            sandbox.run(&Job {
                program: "x = 1\n",
                ..Default::default()
            })?;
        }
        let bare = started.elapsed().as_secs_f64() * 1e3 / runs as f64;
        let started = Instant::now();
        for _ in 0..runs {
            assert!(task.run_program(&reference)?.passed());
        }
        let tested = started.elapsed().as_secs_f64() * 1e3 / runs as f64;
        println!("{isolation:?}: {bare:.1} ms a run without tests, {tested:.1} ms with HumanEval/0's tests");
    }
    Ok(())
}
