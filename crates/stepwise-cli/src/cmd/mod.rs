//! One module per subcommand.
pub mod agent;
pub mod agent_rl;
pub mod annotate;
pub mod backend;
pub mod bon;
pub mod cache;
pub mod calibrate;
pub mod convert;
pub mod download;
pub mod dpo;
pub mod eval;
pub mod generate;
pub mod grade;
pub mod grade_code;
pub mod lab;
pub mod merge;
pub mod pairs;
pub mod rl;
pub mod score;
pub mod search;
pub mod serve;
pub mod stats;
pub mod studio;
pub mod task;
pub mod train_prm;

/// How a policy samples: shared by the commands that continue solutions step by step.
#[derive(clap::Args, Debug)]
pub struct SamplingArgs {
    /// Sampling temperature.
    #[arg(long, default_value_t = 0.7)]
    pub temperature: f32,
    /// Most new tokens per continuation (a rollout, a step; a whole solution for best-of-N).
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
    /// Text between steps in the prompt and in completions: completions are split at it.
    #[arg(long, default_value = "\n")]
    pub separator: String,
}

impl SamplingArgs {
    /// These settings for a policy laying out its prompts as `prompt` (no nucleus cut, no stop
    /// strings).
    pub fn settings(&self, prompt: stepwise_model::Prompt) -> stepwise_remote::backend::PolicySettings {
        stepwise_remote::backend::PolicySettings {
            temperature: self.temperature,
            max_tokens: Some(self.max_tokens),
            prompt,
            separator: self.separator.clone(),
            ..Default::default()
        }
    }
}

/// `--aggregation`-like options: one of [`stepwise_search::Aggregation`]'s names, parsed into it
/// (the names listed in `--help`).
pub fn aggregation_arg() -> impl clap::builder::TypedValueParser<Value = stepwise_search::Aggregation> {
    use clap::builder::TypedValueParser;
    use stepwise_search::Aggregation;
    clap::builder::PossibleValuesParser::new(Aggregation::ALL.map(Aggregation::name))
        .try_map(|name: String| Aggregation::by_name(&name).map_err(|e| e.to_string()))
}

/// A checkpoint argument: a folder, or a Hugging Face model id found in the local cache
/// ([`stepwise_model::hub`]).
pub fn model_dir(arg: &str) -> Result<std::path::PathBuf, String> {
    stepwise_model::hub::resolve(arg).map_err(|e| format!("{e:#}"))
}

/// A model argument resolved ([`model_dir`]) with the name a server gives it: a model id as
/// written (`Qwen/Qwen2.5-Math-PRM-7B`, as vLLM names it, not its snapshot's commit), a folder by
/// its last name (an adapter folder by its own, not its merged model's).
#[derive(Clone, Debug)]
pub struct NamedModel {
    /// The name clients send as `model`.
    pub name: String,
    /// The checkpoint folder.
    pub dir: std::path::PathBuf,
}

/// [`model_dir`] with the name a server answers to ([`NamedModel`]).
pub fn named_model(arg: &str) -> Result<NamedModel, String> {
    let dir = model_dir(arg)?;
    let given = std::path::Path::new(arg);
    let name = match given.exists() {
        true => std::fs::canonicalize(given)
            .ok()
            .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| arg.to_string()),
        false => arg.to_string(),
    };
    Ok(NamedModel { name, dir })
}

/// Check a resumable output before a run: not the input, and JSONL (it is appended to and
/// resumed).
pub fn resumable_output(input: &std::path::Path, output: &std::path::Path) -> anyhow::Result<()> {
    stepwise_core::io::refuse_same_file(input, output)?;
    if output.extension().is_some_and(|e| e != "jsonl") {
        anyhow::bail!(
            "{}: --output must be a .jsonl file (it is appended to and resumed)",
            output.display()
        );
    }
    Ok(())
}

/// Verifier `name`'s step scores of record `i` (0-based) of `path`.
pub fn step_scores(
    s: &stepwise_core::Solution,
    name: &str,
    path: &std::path::Path,
    i: usize,
) -> anyhow::Result<Vec<f32>> {
    match s.scores_of(name) {
        Some(v) => Ok(v),
        None => anyhow::bail!(
            "{}: record {}: field `scores.{name}`: missing or not one per step (run `stepwise score --name {name}`)",
            path.display(),
            i + 1
        ),
    }
}

/// LoRA's settings, which `--lora-rank` turns on: what `rl`, `agent rl` and `dpo` share.
#[derive(clap::Args, Debug)]
pub struct LoraArgs {
    /// Train LoRA adapters of this rank on the policy's projections, the policy itself frozen
    /// (the packed trainer; about a third of full training's memory at 0.5B). The output
    /// folder holds the merged policy, which every command reads, and PEFT's
    /// adapter_model.safetensors and adapter_config.json beside it. 0: every weight trains.
    #[arg(long, default_value_t = 0)]
    pub lora_rank: usize,
    /// LoRA's α: the adapters' product is scaled by α / rank (default 2 × rank).
    #[arg(long)]
    pub lora_alpha: Option<f32>,
    /// The projections adapted, comma-separated (q_proj, k_proj, v_proj, o_proj, gate_proj,
    /// up_proj, down_proj; `q,v` for short), or all-linear.
    #[arg(long, default_value = "all-linear", value_parser = lora_targets)]
    pub lora_targets: LoraTargets,
}

/// The projections `--lora-targets` names.
#[derive(Clone, Debug)]
pub struct LoraTargets(Vec<String>);

fn lora_targets(list: &str) -> Result<LoraTargets, String> {
    stepwise_model::packed_engine::LoraConfig::parse_targets(list)
        .map(LoraTargets)
        .map_err(|e| e.to_string())
}

impl LoraArgs {
    /// The adapters' configuration (none without `--lora-rank`), initialised from `seed`.
    pub fn config(&self, seed: u64) -> Option<stepwise_model::packed_engine::LoraConfig> {
        (self.lora_rank > 0).then(|| {
            let mut c = stepwise_model::packed_engine::LoraConfig::new(self.lora_rank);
            c.alpha = self.lora_alpha.unwrap_or(c.alpha);
            c.targets = self.lora_targets.0.clone();
            c.seed = seed;
            c
        })
    }
}
