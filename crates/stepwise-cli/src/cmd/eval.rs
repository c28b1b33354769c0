use anyhow::Result;
use std::path::PathBuf;
use stepwise_core::Format;
use stepwise_eval::processbench::{predict_first_error, score};

/// Evaluate scored solutions.
#[derive(clap::Subcommand)]
pub enum Command {
    /// ProcessBench's metric: find the earliest wrong step (or that there is none).
    #[command(
        after_help = "Input: solutions whose steps carry both labels (the truth: ProcessBench's `label`, \
PRM800K ratings, oracle labels, …) and scores (from `stepwise score`). The predicted first error is the first step \
scoring below --threshold. Reports accuracy on erroneous solutions, on correct ones, and their harmonic mean (F1).

Example:
  stepwise score --model PRM --input ../shared/data/processbench/gsm8k.json --output scored.jsonl
  stepwise eval processbench --input scored.jsonl"
    )]
    Processbench(ProcessBenchArgs),
}

/// Arguments of `eval processbench`.
#[derive(clap::Args)]
pub struct ProcessBenchArgs {
    /// Scored, labelled solutions.
    #[arg(long)]
    pub input: PathBuf,
    /// A step scoring below this is predicted wrong.
    #[arg(long, default_value_t = 0.5)]
    pub threshold: f32,
    /// Whose step scores to read (`scores.NAME`; files without `scores` are read from
    /// `steps[].score`).
    #[arg(long, default_value = "prm")]
    pub verifier: String,
    /// Input format (detected when omitted).
    #[arg(long)]
    pub from: Option<Format>,
}

pub fn run(c: Command) -> Result<()> {
    match c {
        Command::Processbench(a) => processbench(a),
    }
}

fn processbench(a: ProcessBenchArgs) -> Result<()> {
    let mut pairs = Vec::new();
    for (i, s) in stepwise_core::io::read_solution_set(&a.input, a.from)?
        .into_iter()
        .enumerate()
    {
        let scores = super::step_scores(&s, &a.verifier, &a.input, i)?;
        if s.steps.is_empty() {
            anyhow::bail!(
                "{}: record {} (`{}`): field `steps`: empty (a solution with no step has no first error to find)",
                a.input.display(),
                i + 1,
                s.id
            );
        }
        if s.steps.iter().any(|st| st.label.is_none()) {
            anyhow::bail!("{}: record {}: a step without a label", a.input.display(), i + 1);
        }
        pairs.push((predict_first_error(&scores, a.threshold), s.first_error()));
    }
    let m = score(&pairs);
    outln!(
        "{} solutions ({} with an error, {} without): error accuracy {:.3}, correct accuracy {:.3}, F1 {:.3}",
        pairs.len(),
        m.counts.0,
        m.counts.1,
        m.error_accuracy,
        m.correct_accuracy,
        m.f1
    )?;
    outln!("{}", serde_json::to_string(&m)?)?;
    Ok(())
}
