use anyhow::Result;
use std::path::PathBuf;
use stepwise_core::pairs::{step_pairs_and_unpaired, Layout, PairStats, StepPair, Unpaired};
use stepwise_core::{Format, SolutionReader};
use stepwise_label::{rectify, RectifyOptions, RectifyStats};
use stepwise_model::Prompt;
use stepwise_remote::backend::PolicySettings;
use stepwise_remote::Client;

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
    /// Step-DPO's rectification: a wrong step with no right step beside it gets one sampled by
    /// this policy (checkpoint folder, cached Hugging Face model id, or server URL(s)) from the
    /// question and the prefix before it: the first step of the first of --samples
    /// continuations whose final answer --task grades correct.
    #[arg(long, value_parser = super::backend::source, value_name = "POLICY")]
    pub complete_with: Option<super::backend::Source>,
    /// --complete-with: continuations sampled from each place (question and prefix).
    #[arg(long, default_value_t = 8)]
    pub samples: usize,
    /// --complete-with: keep a sampled right step only when this many further continuations
    /// from it reach the gold answer at least --chosen-min of the time (its Monte Carlo value;
    /// 0: keep every one).
    #[arg(long, default_value_t = 0)]
    pub check_rollouts: usize,
    /// --complete-with: the draws' seed (each place derives its own).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// --complete-with: wrap the question in the tokenizer's chat template.
    #[arg(long)]
    pub chat: bool,
    /// How --complete-with samples; --separator also follows each step of the prefix (and the
    /// question, in TRL's prompt) in the pairs written.
    #[command(flatten)]
    pub sampling: super::SamplingArgs,
    /// Which task grades --complete-with's continuations.
    #[command(flatten)]
    pub task: super::task::TaskArgs,
    /// Where local models run, how served ones are reached, what they compute in.
    #[command(flatten)]
    pub models: super::backend::ModelArgs,
}

const PAIRS_HELP: &str = "At each question and prefix of steps none of which is wrong, a right next step
(chosen: rated +1, a Monte Carlo value of at least --chosen-min, or written by a person) against
a wrong one (rejected: rated -1, or a Monte Carlo value of 0). The steps beside one another come
from records of the same question that share the prefix (an OmegaPRM tree, samples that agree so
far), PRM800K's other rated completions and human completions, and the studio's corrections
(a labeller's rewrite of a step; `stepwise studio export`). Each wrong step is paired once. With --complete-with, a wrong step no right step stands beside is
paired with one the policy samples from the prefix and that reaches the gold answer (Step-DPO's
rectification; chosen_source `sampled`).

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
      stepwise pairs labels.jsonl pairs.parquet --layout trl
  stepwise pairs labelled.jsonl pairs.jsonl --complete-with Qwen/Qwen2.5-Math-1.5B-Instruct \\
      --chat --samples 8 --temperature 0.8";

pub fn run(a: Args) -> Result<()> {
    stepwise_core::pairs::check_chosen_min("--chosen-min", a.chosen_min).map_err(anyhow::Error::msg)?;
    stepwise_core::io::refuse_same_file(&a.input, &a.output)?;
    let records = SolutionReader::open(&a.input, a.from)?.collect::<Result<Vec<_>, _>>()?;
    let (mut pairs, unpaired, mut stats) = step_pairs_and_unpaired(&records, a.chosen_min);
    let rectified = match &a.complete_with {
        Some(policy) => {
            let (sampled, r) = complete(&a, policy, &unpaired)?;
            *stats.chosen_from.entry("sampled".into()).or_default() += sampled.len();
            pairs.extend(sampled);
            Some(r)
        }
        None => None,
    };
    let dataset = a.dataset.clone().unwrap_or_else(|| {
        a.input
            .file_stem()
            .map_or(String::new(), |s| s.to_string_lossy().into_owned())
    });
    let rows: Vec<_> = pairs
        .iter()
        .map(|p| p.to_json(a.layout, &dataset, &a.sampling.separator))
        .collect();
    stepwise_core::io::write_records(&a.output, &rows)?;
    summarise(pairs.len(), &stats, rectified.as_ref());
    Ok(())
}

/// Pairs for the wrong steps in `unpaired`, their right steps sampled by `policy`.
fn complete(a: &Args, policy: &super::backend::Source, unpaired: &[Unpaired]) -> Result<(Vec<StepPair>, RectifyStats)> {
    if a.samples == 0 {
        anyhow::bail!("--samples must be at least 1");
    }
    let backend = a.models.open_policy(policy)?;
    let prompt = if a.chat { Prompt::Chat } else { Prompt::Text };
    let policy = backend.policy(&PolicySettings {
        stop: a.task.stops(),
        ..a.sampling.settings(prompt)
    });
    let task = a.task.open(Some(&a.input))?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = backend.client().map_or(cores, Client::concurrency);
    let places = stepwise_core::pairs::places_of(unpaired);
    let bar = crate::progress::bar(Some(places as u64), "sampling right steps");
    let options = RectifyOptions {
        samples: a.samples,
        seed: a.seed,
        together: 32,
        threads,
        check_rollouts: a.check_rollouts,
        check_min: a.chosen_min,
    };
    let out = rectify(unpaired, &*policy, &*task, options, |n| bar.set_position(n as u64))?;
    bar.finish_and_clear();
    Ok(out)
}

/// What was found, on stderr.
fn summarise(written: usize, stats: &PairStats, rectified: Option<&RectifyStats>) {
    let from: Vec<String> = stats.chosen_from.iter().map(|(k, n)| format!("{n} {k}")).collect();
    eprintln!(
        "{written} pairs from {} records ({} places with a labelled next step; chosen: {}); {} of {} wrong steps had no right step beside them{}",
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
    if let Some(r) = rectified {
        eprintln!(
            "sampled from {} places: {} of {} continuations reached the gold answer ({} tokens; {} right steps turned away by the check); {} wrong steps paired, {} left (no continuation reached the answer with another first step), {} without a gold answer",
            r.places, r.reached, r.sampled, r.tokens, r.checked_out, r.paired, r.none_reached, r.without_answer
        );
    }
}
