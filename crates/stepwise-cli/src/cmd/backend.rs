//! The command line's arguments for where a policy or PRM runs; the backends themselves are
//! [`stepwise_remote::backend`]'s, shared with the Python package.

use std::path::PathBuf;
pub use stepwise_remote::backend::{LocalOptions, PolicyBackend, RemoteOptions, ScorerBackend, Source};

/// Value parser of a [`Source`] argument.
pub fn source(arg: &str) -> std::result::Result<Source, String> {
    Source::parse(arg).map_err(|e| format!("{e:#}"))
}

/// How to reach servers given by URL.
#[derive(clap::Args, Debug, Clone)]
pub struct RemoteArgs {
    /// The model's name on the server(s) (default: the servers' only model, from /v1/models).
    #[arg(long)]
    pub served_model: Option<String>,
    /// The served model's tokenizer folder: prompts and PRM inputs are then sent as token ids,
    /// laid out exactly as the local engine lays them out (needed for `--prompt pieces` and the
    /// pooling protocol).
    #[arg(long)]
    pub server_tokenizer: Option<PathBuf>,
    /// Bearer token for the servers (default: $OPENAI_API_KEY).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Seconds allowed for one request before it is retried.
    #[arg(long, default_value_t = 600.0)]
    pub request_timeout: f64,
    /// Retries of a failing request (429, 5xx, timeouts, resets) before the run stops; an
    /// interrupted run resumes from its output.
    #[arg(long, default_value_t = 8)]
    pub retries: usize,
    /// Requests in flight at once to each server (vLLM batches what it is sent: raise it, and
    /// --threads, until each server's batch is full).
    #[arg(long, default_value_t = 64)]
    pub max_in_flight: usize,
    /// Seconds between health checks of a fleet (several servers, or a file of them, read again
    /// at each check so servers added to it join): a server silent that long (at least 2 s) is taken for dead
    /// or hung, and its requests in flight go to the others.
    #[arg(long, default_value_t = 5.0)]
    pub health_interval: f64,
    /// How a PRM server is asked: `stepwise` (`stepwise serve --prm`, every layout) or `pooling`
    /// (vLLM's /pooling with STEP pooling; needs --server-tokenizer and --layout qwen-prm or
    /// step-tag).
    #[arg(long, default_value = "stepwise", value_parser = ["stepwise", "pooling"])]
    pub protocol: String,
}

impl RemoteArgs {
    /// As the backends take them.
    pub fn options(&self) -> RemoteOptions {
        RemoteOptions {
            served_model: self.served_model.clone(),
            server_tokenizer: self.server_tokenizer.clone(),
            api_key: self.api_key.clone(),
            request_timeout: self.request_timeout,
            retries: self.retries,
            max_in_flight: self.max_in_flight,
            health_interval: self.health_interval,
            protocol: self.protocol.clone(),
        }
    }
}

/// Refuses, before anything runs, weighing a judge's answers by likelihood (`what`) where the
/// answers cannot end with the end of text: a served judge without `--server-tokenizer`.
pub fn check_weighable(judge: &Source, remote: &RemoteArgs, what: &str) -> anyhow::Result<()> {
    if !matches!(judge, Source::Dir(_)) && remote.server_tokenizer.is_none() {
        anyhow::bail!(
            "{what} from a server needs --server-tokenizer (the served judge's tokenizer folder): each answer is sent \
             after the solution as token ids ending with the end of text, and its log-probabilities read back with \
             `echo` (vLLM, stepwise serve); or use votes"
        );
    }
    Ok(())
}

/// `--dtype`: what models loaded for inference compute in, on the commands that load them.
#[derive(clap::Args, Debug, Clone)]
pub struct DtypeArg {
    /// What loaded models compute in: auto (as the checkpoint stores them), f32, bf16 or
    /// bf16-weights.
    ///
    /// `auto`: as the checkpoint stores its weights (a bf16 checkpoint is held in bf16, half the
    /// memory of f32, and multiplied in bf16 with f32 sums on CPUs with AVX512_BF16, as PyTorch
    /// and vLLM do; elsewhere its weights are widened inside the kernels). `f32`: weights widened
    /// at load, f32 arithmetic (within 1e-4 of transformers in f32). `bf16`: f32 checkpoints
    /// rounded to bf16 at load too. `bf16-weights`: weights held in bf16 but multiplied in f32 (a
    /// bf16 checkpoint then gives exactly the `f32` results at half the memory, at f32 speed).
    /// Training keeps f32 weights. [default: auto]
    #[arg(long, value_parser = DTYPES)]
    pub dtype: Option<String>,
}

/// The values of `--dtype`.
pub const DTYPES: [&str; 4] = stepwise_model::PRECISIONS;

impl DtypeArg {
    /// Make it, when given, the dtype of the models this process loads.
    pub fn apply(&self) {
        if let Some(d) = &self.dtype {
            apply_dtype(d);
        }
    }
}

/// Make `dtype` (one of [`DTYPES`]) the precision of the models this process loads from now on
/// (each loaded model keeps its own: [`stepwise_model::Model::precision`]).
pub fn apply_dtype(dtype: &str) {
    stepwise_model::set_default_precision(dtype.parse().expect("clap checked the value"));
}

/// Where a local checkpoint scores, and how much one forward pass takes.
#[derive(clap::Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Where local models run: `auto` (a CUDA GPU when this build has CUDA and the driver reports
    /// one, else the CPU), `cpu`, `cuda` or `cuda:N`. On a GPU, steps are scored and solutions
    /// sampled by the CUDA engine (packed batches, bf16 weights and a paged KV cache on the
    /// device).
    #[arg(long, default_value = "auto")]
    pub device: stepwise_model::Placement,
    /// Most tokens in one forward pass of a local PRM: solutions are packed up to this budget (a
    /// longer one runs alone), which bounds the memory a pass takes whatever the input.
    #[arg(long, default_value_t = stepwise_model::scoring::DEFAULT_MAX_BATCH_TOKENS)]
    pub max_batch_tokens: usize,
}

/// Which trainer updates a model (`train-prm`'s base, `rl`'s and `agent rl`'s policy).
#[derive(clap::Args, Clone, Debug)]
pub struct TrainerArg {
    /// Which trainer updates the model (in RL the policy, and PRIME's implicit PRM): `packed`
    /// (the packed engine's: bf16 products with f32 sums, f32 master weights, each layer
    /// recomputed in the backward, so memory holds the weights, AdamW's state and one layer's
    /// activations; on a GPU or the CPU, sampling from its own weights in RL), `autograd`
    /// (candle's f32 autograd, the CPU only: every operation's buffers kept, memory growing with
    /// batch × length), or `auto`: packed on a GPU and for a pretrained model (hidden size 512 or
    /// more) on the CPU, autograd for a small one.
    #[arg(long, default_value = "auto", value_parser = ["auto", "autograd", "packed"])]
    pub trainer: String,
}

impl TrainerArg {
    /// The trainer named.
    pub fn get(&self) -> anyhow::Result<stepwise_model::train::run::Trainer> {
        anyhow::Context::context(self.trainer.parse(), "--trainer")
    }
}

impl Default for DeviceArgs {
    fn default() -> Self {
        DeviceArgs {
            device: stepwise_model::Placement::Cpu,
            max_batch_tokens: stepwise_model::scoring::DEFAULT_MAX_BATCH_TOKENS,
        }
    }
}

impl DeviceArgs {
    /// As the backends take them.
    pub fn local(&self) -> LocalOptions {
        LocalOptions {
            placement: self.device,
            precision: stepwise_model::default_precision(),
            max_batch_tokens: self.max_batch_tokens,
        }
    }

    /// Opens the policy `source` where these arguments say (reporting where a local one runs).
    pub fn open_policy(&self, source: &Source, remote: &RemoteArgs) -> anyhow::Result<PolicyBackend> {
        let backend = PolicyBackend::open(source, &remote.options(), &self.local())?;
        if let (PolicyBackend::Local(p), Source::Dir(d)) = (&backend, source) {
            eprintln!("{}: {}", d.display(), p.model.placement_name());
        }
        Ok(backend)
    }

    /// Opens the PRM `source` where these arguments say (reporting where a local one runs).
    pub fn open_scorer(&self, source: &Source, layout: &str, remote: &RemoteArgs) -> anyhow::Result<ScorerBackend> {
        let backend = ScorerBackend::open(source, layout, &remote.options(), &self.local())?;
        if let (ScorerBackend::Local(v), Source::Dir(d)) = (&backend, source) {
            eprintln!("{}: {}", d.display(), v.model.placement_name());
        }
        Ok(backend)
    }
}

/// The option groups of a command that opens models: where local ones run, how served ones are
/// reached, what loaded ones compute in.
#[derive(clap::Args, Debug)]
pub struct ModelArgs {
    /// Where local models run, and the tokens of one forward pass.
    #[command(flatten)]
    pub device: DeviceArgs,
    /// How to reach a model given by URL.
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// What loaded models compute in.
    #[command(flatten)]
    pub dtype: DtypeArg,
}

impl ModelArgs {
    /// [`DeviceArgs::open_policy`] with these servers' options, loaded in `--dtype`.
    pub fn open_policy(&self, source: &Source) -> anyhow::Result<PolicyBackend> {
        self.dtype.apply();
        self.device.open_policy(source, &self.remote)
    }

    /// [`DeviceArgs::open_scorer`] with these servers' options, loaded in `--dtype`.
    pub fn open_scorer(&self, source: &Source, layout: &str) -> anyhow::Result<ScorerBackend> {
        self.dtype.apply();
        self.device.open_scorer(source, layout, &self.remote)
    }
}
