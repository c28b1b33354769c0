use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use stepwise_core::seams::StepScorer;
use stepwise_core::Solution;
use stepwise_model::Prompt;
use stepwise_search::{compute_of, method, Aggregation, Job, SearchConfig, Searcher, Threshold, METHODS, SEARCH_ERROR};

/// Search for solutions step by step, guided by a PRM.
#[derive(clap::Args)]
#[command(after_help = "Methods (search-and-learn's, one file each in stepwise-search):
  bon        N whole solutions, the best by the aggregated step scores
  beam       N first steps; then keep the N/M best beams and extend each M ways, N steps per round
  dvts       N/M independent subtrees, each extended M ways per step, keeping its best child
  lookahead  beam search, each candidate valued by rolling it out --lookahead steps greedily
  resample   one solution; a step scored below τ is rejected and resampled (at most
             --max-resamples times per step, --resample-budget per problem); τ comes from
             `stepwise calibrate` (PRM/threshold.json) unless --threshold is given

The PRM scores each new step incrementally: only the tokens after a cached prefix are encoded
(the KV cache of every beam is remembered; the question is encoded once). Each problem's result
is appended to --output as soon as it is done (steps, `scores.NAME`, `meta.search`,
`meta.compute`: generated and encoded tokens, calls, seconds); run the same command again after
an interruption and it continues where it stopped.

Examples:
  stepwise search --policy POLICY --prm PRM --method beam -n 16 --width 4 \\
      --input problems.jsonl --output beam.jsonl
  stepwise calibrate --prm PRM --input labelled.jsonl --precision 0.8
  stepwise search --policy POLICY --prm PRM --method resample --input problems.jsonl \\
      --output resample.jsonl
  # servers: vLLM, SGLang, stepwise serve
  stepwise search --policy http://gpu1:8000 --prm http://gpu2:8000 --method dvts -n 16 \\
      --threads 16 --input problems.jsonl --output dvts.jsonl")]
pub struct Args {
    /// Policy checkpoint folder, cached Hugging Face model id, or server URL(s).
    #[arg(long, value_parser = super::backend::source)]
    pub policy: super::backend::Source,
    /// PRM checkpoint folder or cached Hugging Face model id (any layout `stepwise score`
    /// reads), or server URL(s) (scored whole, not incrementally).
    #[arg(long, value_parser = super::backend::source)]
    pub prm: super::backend::Source,
    /// PRM layout: auto, qwen-prm, step-tag, token-cls or log-ratio.
    #[arg(long, default_value = "auto")]
    pub layout: String,
    /// The name the step scores are recorded under (`scores.NAME`).
    #[arg(long, default_value = "prm")]
    pub name: String,
    /// The search method.
    #[arg(long, default_value = "beam", value_parser = clap::builder::PossibleValuesParser::new(METHODS))]
    pub method: String,
    /// N: samples per step (best-of-N: whole solutions).
    #[arg(short, default_value_t = 8)]
    pub n: usize,
    /// M: beam search keeps N/M beams and extends each M ways; DVTS grows N/M subtrees.
    #[arg(long, default_value_t = 4)]
    pub width: usize,
    /// How step scores rank candidates.
    #[arg(long, default_value = "min", value_parser = super::aggregation_arg())]
    pub aggregation: Aggregation,
    /// Most steps per solution.
    #[arg(long, default_value_t = 40)]
    pub max_steps: usize,
    /// Lookahead: greedy steps rolled out to value a candidate.
    #[arg(long, default_value_t = 1)]
    pub lookahead: usize,
    /// Resample: τ (default: the PRM folder's threshold.json from `stepwise calibrate`).
    #[arg(long)]
    pub threshold: Option<f32>,
    /// Resample: most resamples of one step.
    #[arg(long, default_value_t = 4)]
    pub max_resamples: usize,
    /// Resample: most resamples per problem.
    #[arg(long, default_value_t = 16)]
    pub resample_budget: usize,
    /// Problems (JSONL with `question`, optional `id` and gold answer).
    #[arg(long)]
    pub input: PathBuf,
    /// Output solutions (stepwise JSONL, appended to and resumed).
    #[arg(long)]
    pub output: PathBuf,
    /// How the policy samples.
    #[command(flatten)]
    pub sampling: super::SamplingArgs,
    /// Prompt layout: text (question, separator, steps), chat (the tokenizer's chat template) or
    /// pieces (each piece encoded on its own: the lab's policies).
    #[arg(long, default_value = "text", value_parser = ["text", "chat", "pieces"])]
    pub prompt: String,
    /// Seed of the policy's draws.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Which task grades the results (math answers, or code run against tests: the input is
    /// then HumanEval's or MBPP's JSONL).
    #[command(flatten)]
    pub task: super::task::TaskArgs,
    /// Problems searched at once.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// A problem whose search fails (a question longer than the policy reads, say): `raise` stops
    /// naming it, the problems searched before it kept in --output; `skip` writes a record
    /// without steps, the reason in its `meta.search_error`, and goes on. A server that still
    /// fails after its retries stops the run either way.
    #[arg(long, value_enum, default_value = "raise")]
    pub on_error: super::score::OnErrorArg,
    /// Score every candidate from scratch instead of incrementally (for comparison).
    #[arg(long)]
    pub whole: bool,
    /// Where local models run, how served ones are reached, what they compute in.
    #[command(flatten)]
    pub models: super::backend::ModelArgs,
}

/// A `--prompt` argument's layout.
pub(crate) fn prompt_layout(name: &str) -> Result<Prompt> {
    Ok(match name {
        "text" => Prompt::Text,
        "chat" => Prompt::Chat,
        "pieces" => Prompt::Pieces,
        other => bail!("--prompt {other}: use text, chat or pieces"),
    })
}

pub fn run(a: Args) -> Result<()> {
    super::resumable_output(&a.input, &a.output)?;
    let search = method(&a.method)?;
    let threshold = threshold(&a)?;
    let config = SearchConfig {
        n: a.n,
        width: a.width,
        max_steps: a.max_steps,
        aggregation: a.aggregation,
        lookahead: a.lookahead,
        threshold,
        max_resamples: a.max_resamples,
        resample_budget: a.resample_budget,
        seed: a.seed,
    };
    let task = a.task.open(Some(&a.input))?;
    let problems = a.task.problems(&*task, &a.input)?;
    // One process per output, and only the settings (and input, and models) it was started with.
    let _claim = stepwise_core::journal::claim(
        &a.output,
        &serde_json::json!({
            "input": stepwise_core::journal::fingerprint(&problems)?,
            "policy": a.policy.identity()?, "prm": a.prm.identity()?, "layout": a.layout, "name": a.name,
            "config": config, "temperature": a.sampling.temperature, "max_tokens": a.sampling.max_tokens,
            "separator": a.sampling.separator, "prompt": a.prompt, "whole": a.whole,
            "task": a.task.identity(Some(&a.input))?,
        }),
    )?;
    let policy_backend = a.models.open_policy(&a.policy)?;
    let policy = policy_backend.policy(&stepwise_remote::backend::PolicySettings {
        stop: a.task.stops(),
        ..a.sampling.settings(prompt_layout(&a.prompt)?)
    });
    let scorer_backend = a.models.open_scorer(&a.prm, &a.layout)?;
    let scorer = if a.whole {
        scorer_backend.scorer()
    } else {
        scorer_backend.search_scorer()
    };
    let scorer: &dyn StepScorer = &*scorer;
    let jobs: Vec<Job<'_>> = problems.iter().map(|p| Job::for_problem(p, &a.method)).collect();
    let bar = crate::progress::bar(Some(jobs.len() as u64), &format!("searching ({})", a.method));
    let sols = Searcher {
        method: &*search,
        config: &config,
        policy: &*policy,
        scorer,
        verifier: &a.name,
        task: &*task,
        threads: a.threads,
    }
    .run_all_with(&a.output, &jobs, a.on_error.into(), &|done| {
        bar.set_position(done as u64)
    })?;
    bar.finish_and_clear();
    let servers = stepwise_remote::backend::servers_summary(&[
        ("policy", policy_backend.client()),
        ("PRM", scorer_backend.client()),
    ]);
    summarise(&a, &sols, &servers);
    Ok(())
}

/// `--threshold`, or for `--method resample` the τ `stepwise calibrate` saved in the PRM's
/// folder; 0.5 for the others.
fn threshold(a: &Args) -> Result<f32> {
    Ok(match (a.threshold, a.method.as_str()) {
        (Some(t), _) => t,
        (None, "resample") => {
            let super::backend::Source::Dir(prm_dir) = &a.prm else {
                bail!("--method resample with a remote PRM needs --threshold (τ from `stepwise calibrate` on the PRM's folder)");
            };
            Threshold::load(prm_dir)?
                .with_context(|| {
                    format!(
                        "--method resample needs τ: run `stepwise calibrate --prm {}` on labelled data, or pass --threshold",
                        prm_dir.display()
                    )
                })?
                .tau
        }
        (None, _) => 0.5,
    })
}

/// What the run did, on stderr: problems skipped, accuracy where graded, compute per problem.
fn summarise(a: &Args, sols: &[Solution], servers: &str) {
    let skipped = sols.iter().filter(|s| s.meta.contains_key(SEARCH_ERROR)).count();
    if skipped > 0 {
        eprintln!(
            "{skipped} problems could not be searched and were written without steps (the reason in meta.search_error)"
        );
    }
    let computes: Vec<_> = sols.iter().filter_map(compute_of).collect();
    let per = |f: &dyn Fn(&stepwise_search::Compute) -> f64| {
        computes.iter().map(f).sum::<f64>() / computes.len().max(1) as f64
    };
    let graded: Vec<bool> = sols.iter().filter_map(|s| s.correct).collect();
    let accuracy = if graded.is_empty() {
        String::new()
    } else {
        format!(
            "accuracy {:.3} ({} of {}); ",
            graded.iter().filter(|&&c| c).count() as f64 / graded.len() as f64,
            graded.iter().filter(|&&c| c).count(),
            graded.len()
        )
    };
    eprintln!(
        "{} problems by {} (N = {}, M = {}): {accuracy}per problem {:.0} tokens generated, {:.0} encoded by the PRM, {:.2} steps rejected, {:.2}s{}; {}",
        sols.len(),
        a.method,
        a.n,
        a.width,
        per(&|c| c.generated_tokens as f64),
        per(&|c| c.encoded_tokens as f64),
        per(&|c| c.rejected_steps as f64),
        per(&|c| c.seconds),
        servers,
        a.output.display()
    );
}
