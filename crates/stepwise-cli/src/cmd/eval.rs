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
  stepwise score --model PRM --input data/processbench/gsm8k.json --output scored.jsonl
  stepwise eval processbench --input scored.jsonl"
    )]
    Processbench(ScoredArgs),
    /// PRMBench's PRMScore: every step's verdict (correct or erroneous), by error type.
    #[command(
        after_help = "Input: PRMBench records (`{idx, modified_question, modified_process, error_steps, \
classification}`) scored by `stepwise score`. A step is predicted correct when its score reaches --threshold. \
For each error type, and over every step: the F1 of the correct steps, the F1 of the erroneous ones, and their mean, \
PRMScore; each group (simplicity, soundness, sensitivity) is the mean PRMScore of its types.

Example:
  stepwise score --model PRM --input prmbench_preview.jsonl --output scored.jsonl
  stepwise eval prmbench --input scored.jsonl"
    )]
    Prmbench(ScoredArgs),
}

/// Arguments of `eval processbench` and `eval prmbench`.
#[derive(clap::Args)]
pub struct ScoredArgs {
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
        Command::Prmbench(a) => prmbench(a),
    }
}

fn processbench(a: ScoredArgs) -> Result<()> {
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

fn prmbench(a: ScoredArgs) -> Result<()> {
    use stepwise_eval::prmbench::{display_name, predict, score, Judged};
    let sols = stepwise_core::io::read_solution_set(&a.input, a.from)?;
    let mut judged = Vec::with_capacity(sols.len());
    for (i, s) in sols.iter().enumerate() {
        let scores = super::step_scores(s, &a.verifier, &a.input, i)?;
        let error_type = s.meta.get("classification").and_then(|c| c.as_str()).ok_or_else(|| {
            anyhow::anyhow!(
                "{}: record {} (`{}`): field `classification`: missing (PRMBench's error type)",
                a.input.display(),
                i + 1,
                s.id
            )
        })?;
        let truth: Option<Vec<bool>> = s
            .steps
            .iter()
            .map(|st| st.label.as_ref().map(|l| l.is_good()))
            .collect();
        let truth =
            truth.ok_or_else(|| anyhow::anyhow!("{}: record {}: a step without a label", a.input.display(), i + 1))?;
        judged.push(Judged {
            error_type,
            steps: predict(&scores, a.threshold).into_iter().zip(truth).collect(),
        });
    }
    let r = score(&judged);
    let cell = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.1}", 100.0 * v));
    outln!(
        "{:<34} {:>9} {:>7} {:>7} {:>7} {:>9}",
        "error type",
        "solutions",
        "F1",
        "F1 neg",
        "PRMScore",
        "accuracy"
    )?;
    for (t, m) in &r.by_type {
        outln!(
            "{:<34} {:>9} {:>7} {:>7} {:>7} {:>9}",
            display_name(t),
            m.solutions,
            cell(m.f1),
            cell(m.negative_f1),
            cell(m.prm_score),
            cell(m.accuracy)
        )?;
    }
    let o = &r.overall;
    outln!(
        "{:<34} {:>9} {:>7} {:>7} {:>7} {:>9}",
        "overall",
        o.solutions,
        cell(o.f1),
        cell(o.negative_f1),
        cell(o.prm_score),
        cell(o.accuracy)
    )?;
    for (g, v) in &r.by_group {
        outln!("{g}: PRMScore {:.1}", 100.0 * v)?;
    }
    outln!("{}", serde_json::to_string(&r)?)?;
    Ok(())
}
