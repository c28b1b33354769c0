//! The lab from Rust: the whole process-supervision loop (a policy trained from scratch,
//! sampling, step labels by five methods, PRMs and an ORM, best-of-N, search, RL) on the quick
//! preset, in about a minute on two cores, into a temporary folder. `stepwise lab` is the same
//! with a command line; `--preset standard` is the measured one.
//!
//! cargo run --release -p stepwise-lab --example quick_lab

use stepwise_lab::{run, LabOptions, Preset};

fn main() -> anyhow::Result<()> {
    let out = std::env::temp_dir().join(format!("stepwise-quick-lab-{}", std::process::id()));
    let report = run(&LabOptions {
        preset: Preset::quick(),
        seed: 1,
        out: out.clone(),
    })?;
    println!("report: {}", out.join("report.md").display());
    println!(
        "{}",
        serde_json::to_string_pretty(&report.bon)?
            .lines()
            .take(12)
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(())
}
