use anyhow::Result;
use std::path::PathBuf;
use stepwise_remote::serve::{serve, ServeConfig};

/// Serve a policy and/or a PRM over an OpenAI-compatible HTTP API.
#[derive(clap::Args)]
#[command(after_help = "Endpoints:
  GET  /health                 200 when ready
  GET  /v1/models              the served models
  POST /v1/completions         prompt as text or token ids; n, temperature, top_p, seed, max_tokens,
                               stop, logprobs, stream (server-sent events)
  POST /v1/chat/completions    the tokenizer's chat template; logprobs/top_logprobs, stream,
                               continue_final_message (vLLM's)
  POST /v1/score_steps         {\"inputs\": [{\"question\", \"steps\": [...]}]} -> one score per step, laid
                               out as the PRM was trained (every layout stepwise scores)
  POST /pooling                vLLM's STEP pooling shape: [p_bad, p_good] at each step tag
  POST /get_reward             OpenRLHF's remote reward model (--remote_rm_url http://HOST:PORT/get_reward):
                               {\"query\", \"prompts\", \"labels\"} -> {\"rewards\", \"scores\", \"extra_logs\"};
                               a response's steps (split at --reward-separator) scored by the PRM and
                               aggregated, plus the graded outcome when labels are sent
  GET  /metrics                Prometheus text: requests, tokens, latency histogram

Errors are OpenAI-shaped JSON with 4xx codes (unknown model 404, bad key 401, prompt too long
400). SIGTERM or Ctrl-C lets requests in flight finish, then stops.

Examples:
  stepwise serve --model ../shared/fixtures/hf-tiny/qwen2-policy --port 8000
  stepwise serve --model POLICY --prm PRM --api-key secret --host 0.0.0.0
  # then, from Python:  openai.OpenAI(base_url=\"http://localhost:8000/v1\", api_key=\"secret\")
  #  and from stepwise: stepwise search --policy http://host:8000 --prm http://host:8000 ...")]
pub struct Args {
    /// Policy checkpoint folder (or cached Hugging Face model id) for completions and chat.
    #[arg(long, value_parser = super::model_dir)]
    pub model: Option<PathBuf>,
    /// PRM checkpoint folder (or cached model id) for /v1/score_steps and /pooling.
    #[arg(long, value_parser = super::model_dir)]
    pub prm: Option<PathBuf>,
    /// The policy's name in requests (default: its folder's name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// The PRM's name in requests (default: its folder's name).
    #[arg(long)]
    pub served_prm_name: Option<String>,
    /// PRM layout: auto, qwen-prm, step-tag, token-cls or log-ratio.
    #[arg(long, default_value = "auto")]
    pub layout: String,
    /// Where the policy runs: auto (a CUDA GPU when this build has CUDA and one answers), cpu,
    /// cuda or cuda:N. On a GPU its KV cache lives on the device, in blocks, within --kv-budget-gb.
    #[arg(long, default_value = "auto")]
    pub device: stepwise_model::Placement,
    /// Where the PRM runs (as --device).
    #[arg(long, default_value = "auto")]
    pub prm_device: stepwise_model::Placement,
    /// A GPU policy's KV cache, in GiB (default: half the GPU's free memory when the first
    /// request comes). Requests wait when it is full; none fails for it.
    #[arg(long)]
    pub kv_budget_gb: Option<f64>,
    /// `/get_reward` (OpenRLHF's --remote_rm_url): the text between a response's steps.
    #[arg(long, default_value = "\n\n")]
    pub reward_separator: String,
    /// `/get_reward`: how a response's step scores become its reward (min, product, last, mean).
    #[arg(long, default_value = "min", value_parser = ["min", "product", "last", "mean"])]
    pub reward_aggregate: String,
    /// `/get_reward`: weight of the graded outcome (1 when the answer equals the label) added to
    /// the aggregated step scores (0: process reward only).
    #[arg(long, default_value_t = 1.0)]
    pub reward_outcome_weight: f32,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on the API (default: $STEPWISE_API_KEY, else open).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Most continuations per request (`n`).
    #[arg(long, default_value_t = 64)]
    pub max_n: usize,
    /// Most new tokens per continuation (`max_tokens`).
    #[arg(long, default_value_t = 4096)]
    pub max_tokens: usize,
    /// Chunked prefill: a prompt that arrives while others are being decoded is fed through
    /// the running decoding steps, at most this many prompt tokens a step, its tokens joining
    /// the step's rows in every product, instead of a forward pass of its own that reads every
    /// weight again (and holds the others back meanwhile). Smaller chunks keep the others'
    /// tokens flowing during a long prompt; 0 encodes every prompt in a pass of its own.
    #[arg(long, default_value_t = stepwise_model::generate::DEFAULT_PREFILL_CHUNK, alias = "join-prompt-tokens")]
    pub prefill_chunk_tokens: usize,
}

pub fn run(a: Args) -> Result<()> {
    let cfg = ServeConfig {
        model: a.model,
        prm: a.prm,
        model_name: a.served_model_name,
        prm_name: a.served_prm_name,
        address: format!("{}:{}", a.host, a.port),
        api_key: a
            .api_key
            .or_else(|| std::env::var("STEPWISE_API_KEY").ok().filter(|k| !k.is_empty())),
        max_n: a.max_n.max(1),
        max_tokens: a.max_tokens.max(1),
        prefill_chunk_tokens: a.prefill_chunk_tokens,
        layout: a.layout,
        prm_device: a.prm_device,
        device: a.device,
        kv_budget: a.kv_budget_gb.map(|g| (g * (1u64 << 30) as f64) as usize),
        reward_rule: stepwise_remote::serve::openrlhf::RewardRule {
            separator: a.reward_separator,
            aggregation: stepwise_search::Aggregation::by_name(&a.reward_aggregate)?,
            outcome_weight: a.reward_outcome_weight,
            mode: stepwise_core::grader::GradeMode::Lenient,
        },
    };
    serve(&cfg, |addr| eprintln!("stepwise serve: listening on http://{addr}"))?;
    eprintln!("stepwise serve: stopped");
    Ok(())
}
