use anyhow::Result;
use std::path::PathBuf;

/// Merge a PEFT LoRA adapter onto its base into a model folder of its own.
#[derive(clap::Args)]
#[command(
    after_help = "Every command takes an adapter folder (or its model id) wherever it takes a model, merging it
into stepwise's cache the first time (see `stepwise cache --help`); this command writes the merged
model where you say, as PEFT's merge_and_unload() and save_pretrained() would: for transformers,
vLLM or anything else that reads no adapters, or for an adapter whose base_model_name_or_path
names a folder on another machine (--base). W + s·B·A in f32 with PEFT's scale (α/r, α/√r with
use_rslora, rank_pattern and alpha_pattern), rounded to the base's dtype; the base's shards and
side files (tokenizer, chat template, generation settings) kept, the adapter's own side files over
them; a classifier head the adapter brings (modules_to_save) makes the config the classifier its
task_type names. stepwise-merge.json records the adapter and the base.

Examples:
  stepwise merge runs/prm-lora --out models/prm-merged
  stepwise merge some-org/qwen-math-lora --base ~/models/Qwen2.5-Math-1.5B --out merged/"
)]
pub struct Args {
    /// The adapter: a folder with adapter_config.json and adapter_model.safetensors, or its
    /// model id on the Hugging Face Hub.
    pub adapter: String,
    /// The new folder for the merged model (refused when it exists).
    #[arg(long)]
    pub out: PathBuf,
    /// The model to merge onto instead of the adapter's base_model_name_or_path (a folder or a
    /// model id; it must have the base's shapes).
    #[arg(long, value_parser = super::model_dir)]
    pub base: Option<PathBuf>,
}

/// Merge the adapter and say where the model went.
pub fn run(a: Args) -> Result<()> {
    let started = std::time::Instant::now();
    stepwise_model::hub::merge_adapter(&a.adapter, a.base.as_deref(), &a.out)?;
    eprintln!(
        "merged {} into {} in {:.1} s",
        a.adapter,
        a.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
