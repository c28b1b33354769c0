use anyhow::Result;
use std::path::PathBuf;
use std::time::Instant;
use stepwise_core::seams::score_solutions;
use stepwise_core::{Format, SolutionWriter};

/// Score every step of every solution with a PRM.
#[derive(clap::Args)]
#[command(
    after_help = "Layouts (detected from config.json and the tokenizer when --layout is auto):
  qwen-prm    Qwen2.5-Math-PRM: chat template, steps joined by <extra_0>, softmax class 1 there
  step-tag    Math-Shepherd / RLHFlow: `problem step ки\\n ...`, P(+) over {+,-} at each ки
  token-cls   TRL PRMTrainer output: softmax class 1 on the last token of each step + \"\\n\"
  log-ratio   a folder with reward.json (`stepwise train-prm --head log-ratio`, the lab's verifiers):
              sigmoid(β·Σ log π/π_ref) over each step's tokens, against the reference it names

Examples:
  stepwise score --model ../shared/fixtures/hf-tiny/qwen2-prm \\
      --input ../shared/data/processbench/gsm8k.json --output scored.jsonl
  stepwise score --model orm/ --name orm --input scored.jsonl --output scored2.jsonl
  stepwise score --model http://gpu1:8000 --input steps.jsonl --output scored.jsonl        # stepwise serve --prm
  stepwise score --model http://gpu1:8000 --protocol pooling --layout qwen-prm --server-tokenizer PRM_DIR \\
      --input steps.jsonl --output scored.jsonl                                             # vLLM /pooling"
)]
pub struct Args {
    /// Checkpoint folder (config.json, model.safetensors, tokenizer.json), a Hugging Face model
    /// id (ORG/NAME[@REVISION]) found offline in the local cache (HF_HUB_CACHE, HF_HOME), or
    /// server URL(s).
    #[arg(long, value_parser = super::backend::source)]
    pub model: super::backend::Source,
    /// Solutions in any format stepwise reads.
    #[arg(long)]
    pub input: PathBuf,
    /// Output: stepwise JSONL (or .parquet) with the step scores in `scores.NAME`.
    #[arg(long)]
    pub output: PathBuf,
    /// The verifier's name in the output's `scores` (e.g. `prm`, `orm`): several verifiers can
    /// score one file in turn, and `stepwise bon` reads them by name.
    #[arg(long, default_value = "prm")]
    pub name: String,
    /// PRM layout: auto, qwen-prm, step-tag, token-cls or log-ratio.
    #[arg(long, default_value = "auto")]
    pub layout: String,
    /// Solutions handed to the scorer at once (a local PRM packs them into forward passes of at
    /// most --max-batch-tokens tokens; a server gets them as one request).
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// Where a local PRM runs, and the tokens of one forward pass.
    #[command(flatten)]
    pub device: super::backend::DeviceArgs,
    /// Input format (detected when omitted).
    #[arg(long)]
    pub from: Option<Format>,
    /// How to reach a PRM given by URL.
    #[command(flatten)]
    pub remote: super::backend::RemoteArgs,
    /// What loaded models compute in.
    #[command(flatten)]
    pub dtype: super::backend::DtypeArg,
}

pub fn run(a: Args) -> Result<()> {
    a.dtype.apply();
    stepwise_core::io::refuse_same_file(&a.input, &a.output)?;
    let backend = a.device.open_scorer(&a.model, &a.layout, &a.remote)?;
    let scorer = backend.scorer();
    let mut sols: Vec<_> = stepwise_core::io::read_solution_set(&a.input, a.from)?;
    let bar = crate::progress::bar(Some(sols.len() as u64), "scoring");
    let start = Instant::now();
    let tokens = score_solutions(&*scorer, &a.name, &mut sols, a.batch_size, |done| {
        bar.set_position(done as u64)
    })?;
    bar.finish_and_clear();
    let mut writer = SolutionWriter::create(&a.output, Format::Stepwise)?;
    for s in &sols {
        writer.write(s)?;
    }
    writer.finish()?;
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "scored {} solutions ({tokens} tokens) in {secs:.1}s: {:.0} tokens/s, {:.1} solutions/s",
        sols.len(),
        tokens as f64 / secs,
        sols.len() as f64 / secs
    );
    Ok(())
}
