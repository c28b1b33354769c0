use anyhow::Result;

/// Download models (and an adapter's base) from the Hugging Face Hub into the local cache.
#[derive(clap::Args)]
#[command(
    after_help = "Every command downloads a model id it is given that the cache lacks; this one fetches ahead, for
machines that will run without a network (HF_HUB_OFFLINE=1): on a login node, say, into a cache
the compute nodes share. Only what stepwise reads is fetched (safetensors weights, JSON configs,
tokenizer files, chat templates), not the .bin, .pth or GGUF copies a repository may also hold,
into the same cache as `hf download` and transformers ($HF_HUB_CACHE, else $HF_HOME/hub, else
~/.cache/huggingface/hub), from $HF_ENDPOINT with $HF_TOKEN. A file already there is not fetched
again; a download cut off resumes. For a PEFT adapter, its base (base_model_name_or_path) too
when that is a model id. Prints each snapshot's folder.

Examples:
  stepwise download Qwen/Qwen2.5-Math-PRM-7B Qwen/Qwen2.5-Math-7B-Instruct
  stepwise download some-org/math-prm-lora@v2     # a revision: branch, tag or commit
  HF_HUB_CACHE=/shared/hf stepwise download Qwen/Qwen2.5-Math-PRM-7B"
)]
pub struct Args {
    /// Model ids (`ORG/NAME`, optionally `@REVISION`).
    #[arg(required = true)]
    pub ids: Vec<String>,
}

/// Fetch each id and say where it is.
pub fn run(a: Args) -> Result<()> {
    for id in &a.ids {
        for (id, dir) in stepwise_model::hub::download(id)? {
            println!("{id}\t{}", dir.display());
        }
    }
    Ok(())
}
