use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::time::Instant;
use stepwise_core::{Format, SolutionReader, SolutionWriter};
use stepwise_model::log_ratio::{RewardSpec, REWARD_FILE};
use stepwise_model::scoring::QWEN_PRM_SYSTEM;
use stepwise_model::{default_device, Model, PrmLayout, StepScorer, Tokenizer};

/// Score every step of every solution with a PRM.
#[derive(clap::Args)]
#[command(
    after_help = "Layouts (detected from config.json and the tokenizer when --layout is auto):
  qwen-prm    Qwen2.5-Math-PRM: chat template, steps joined by <extra_0>, softmax class 1 there
  step-tag    Math-Shepherd / RLHFlow: `problem step ки\\n ...`, P(+) over {+,-} at each ки
  token-cls   TRL PRMTrainer output: softmax class 1 on the last token of each step + \"\\n\"
  log-ratio   a folder with reward.json (`stepwise train-prm --head log-ratio`, the lab's verifiers):
              sigmoid(β·Σ log π/π_ref) over each step's tokens, against the reference it names

Example:
  stepwise score --model ../shared/fixtures/hf-tiny/qwen2-prm \\
      --input ../shared/data/processbench/gsm8k.json --output scored.jsonl"
)]
pub struct Args {
    /// Checkpoint folder (config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    pub model: PathBuf,
    /// Solutions in any format stepwise reads.
    #[arg(long)]
    pub input: PathBuf,
    /// Output: stepwise JSONL (or .parquet) with `steps[i].score`.
    #[arg(long)]
    pub output: PathBuf,
    /// PRM layout: auto, qwen-prm, step-tag, token-cls or log-ratio.
    #[arg(long, default_value = "auto")]
    pub layout: String,
    /// Solutions per forward pass.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// Input format (detected when omitted).
    #[arg(long)]
    pub from: Option<Format>,
}

pub fn run(a: Args) -> Result<()> {
    let dev = default_device();
    let model = Model::load(&a.model, &dev)?;
    let tok = Tokenizer::from_dir(&a.model)?;
    // A log-ratio verifier names its reference model (unless its reference is a constant); it is
    // scored against it.
    let spec = RewardSpec::load(&a.model)?;
    let reference = match spec.as_ref().and_then(|s| s.reference_dir(&a.model)) {
        Some(dir) => Some(Model::load(&dir, &dev).with_context(|| {
            format!(
                "loading the reference model named in {}",
                a.model.join(REWARD_FILE).display()
            )
        })?),
        None => None,
    };
    let layout = match a.layout.as_str() {
        "auto" => match &spec {
            Some(s) => s.layout(),
            None => PrmLayout::detect(&model, &tok)?,
        },
        "qwen-prm" => PrmLayout::QwenPrm {
            system: QWEN_PRM_SYSTEM.into(),
            step_token: "<extra_0>".into(),
        },
        "step-tag" => PrmLayout::StepTag {
            tag: "ки".into(),
            good: "+".into(),
            bad: "-".into(),
        },
        "token-cls" => PrmLayout::TokenClassifier { separator: "\n".into() },
        "log-ratio" => spec
            .as_ref()
            .map(RewardSpec::layout)
            .with_context(|| format!("--layout log-ratio: {} has no {REWARD_FILE}", a.model.display()))?,
        other => bail!("unknown --layout `{other}`"),
    };
    let scorer = StepScorer {
        model: &model,
        tokenizer: &tok,
        layout,
        reference: reference.as_ref(),
    };
    let sols: Vec<_> = SolutionReader::open(&a.input, a.from)?.collect::<Result<_, _>>()?;
    let mut writer = SolutionWriter::create(&a.output, Format::Stepwise)?;
    let bar = crate::progress::bar(Some(sols.len() as u64), "scoring");
    let start = Instant::now();
    let mut tokens = 0usize;
    for chunk in sols.chunks(a.batch_size.max(1)) {
        let enc = chunk
            .iter()
            .map(|s| {
                scorer
                    .encode(&s.question, &s.step_texts())
                    .with_context(|| format!("solution {}", s.id))
            })
            .collect::<Result<Vec<_>>>()?;
        tokens += enc.iter().map(|e| e.ids.len()).sum::<usize>();
        let scores = scorer.score_batch(&enc).with_context(|| {
            let ids: Vec<&str> = chunk.iter().map(|s| s.id.as_str()).collect();
            format!("scoring solutions {}", ids.join(", "))
        })?;
        for (s, sc) in chunk.iter().zip(scores) {
            let mut s = s.clone();
            for (st, x) in s.steps.iter_mut().zip(sc) {
                st.score = Some(x);
            }
            writer.write(&s)?;
        }
        bar.inc(chunk.len() as u64);
    }
    writer.finish()?;
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "scored {} solutions ({tokens} tokens) in {secs:.1}s: {:.0} tokens/s, {:.1} solutions/s",
        sols.len(),
        tokens as f64 / secs,
        sols.len() as f64 / secs
    );
    Ok(())
}
