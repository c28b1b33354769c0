use anyhow::Result;
use std::path::PathBuf;
use stepwise_core::pairs::{step_pairs, Layout};
use stepwise_core::{Format, SolutionReader};

/// Step-level preference pairs (Step-DPO) from step-labelled records.
#[derive(clap::Args)]
#[command(after_help = PAIRS_HELP)]
pub struct Args {
    /// Step-labelled records in any format stepwise reads (`-` for stdin).
    pub input: PathBuf,
    /// Output: .jsonl, .json (one array) or .parquet (`-` for stdout).
    pub output: PathBuf,
    /// How the pairs are written: stepwise, step-dpo or trl.
    #[arg(long, default_value = "stepwise")]
    pub layout: Layout,
    /// Input format (detected from the first record when omitted).
    #[arg(long)]
    pub from: Option<Format>,
    /// A step with a soft (Monte Carlo) label is a chosen step from this value up; one at 0 is
    /// rejected, one between is neither.
    #[arg(long, default_value_t = 0.5)]
    pub chosen_min: f32,
    /// Step-DPO's `dataset` column (default: the input file's name without extension).
    #[arg(long)]
    pub dataset: Option<String>,
    /// What follows each step of the prefix (and the question, in TRL's prompt).
    #[arg(long, default_value = "\n")]
    pub separator: String,
}

const PAIRS_HELP: &str = "At each question and prefix of steps none of which is wrong, a right next step
(chosen: rated +1, a Monte Carlo value of at least --chosen-min, or written by a person) against
a wrong one (rejected: rated -1, or a Monte Carlo value of 0). The steps beside one another come
from records of the same question that share the prefix (an OmegaPRM tree, samples that agree so
far), PRM800K's other rated completions and human completions, and the studio's corrections
(a labeller's rewrite of a step; `stepwise studio export`). Each wrong step is paired once.

Layouts:
  stepwise  {id, problem_id, question, prefix: [steps], chosen, rejected, answer, chosen_source,
            rejected_source, chosen_ends, rejected_ends} (`*_ends`: the step ended its solution,
            so `stepwise dpo` ends it with the end token, not the separator)
  step-dpo  Step-DPO's columns {dataset, prompt, initial_reason_steps, chosen, rejected,
            full_chosen, full_rejected, answer}
  trl       TRL DPOTrainer's {prompt, chosen, rejected}: prompt = question and prefix

Examples:
  stepwise pairs data/prm800k/samples_openr.jsonl pairs.jsonl
  stepwise studio export --db labels.sqlite --output labels.jsonl && \\
      stepwise pairs labels.jsonl pairs.parquet --layout trl";

pub fn run(a: Args) -> Result<()> {
    if !(a.chosen_min > 0.0 && a.chosen_min <= 1.0) {
        anyhow::bail!("--chosen-min must be in (0, 1], not {}", a.chosen_min);
    }
    stepwise_core::io::refuse_same_file(&a.input, &a.output)?;
    let records = SolutionReader::open(&a.input, a.from)?.collect::<Result<Vec<_>, _>>()?;
    let (pairs, stats) = step_pairs(&records, a.chosen_min);
    let dataset = a.dataset.clone().unwrap_or_else(|| {
        a.input
            .file_stem()
            .map_or(String::new(), |s| s.to_string_lossy().into_owned())
    });
    let rows: Vec<_> = pairs
        .iter()
        .map(|p| p.to_json(a.layout, &dataset, &a.separator))
        .collect();
    stepwise_core::io::write_records(&a.output, &rows)?;
    let from: Vec<String> = stats.chosen_from.iter().map(|(k, n)| format!("{n} {k}")).collect();
    eprintln!(
        "{} pairs from {} records ({} places with a labelled next step; chosen: {}); {} of {} wrong steps had no right step beside them{}",
        pairs.len(),
        stats.records,
        stats.prefixes,
        if from.is_empty() { "none".into() } else { from.join(", ") },
        stats.without_chosen,
        stats.wrong_steps,
        if stats.conflicting > 0 {
            format!("; {} steps labelled both right and wrong left out", stats.conflicting)
        } else {
            String::new()
        }
    );
    Ok(())
}
