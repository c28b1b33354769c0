use anyhow::{Context, Result};
use std::time::Duration;
use stepwise_remote::serve::{serve, Limits, ServeConfig};

/// Serve a policy and/or a PRM over an OpenAI-compatible HTTP API.
#[derive(clap::Args)]
#[command(after_help = "Endpoints:
  GET  /health                 200 when ready
  GET  /v1/models              the served models
  POST /v1/completions         prompt as text or token ids, or a list of prompts (n choices each,
                               in order); n, temperature, top_p, top_k, seed, max_tokens (default:
                               what the context leaves), stop, logprobs, echo (with logprobs, the
                               prompt's own log-probabilities; max_tokens 0 then generates
                               nothing), stream (server-sent events) with
                               stream_options.include_usage; the log-probabilities of every
                               request in flight are computed in one packed pass, and a max_tokens
                               1 request (lm-evaluation-harness's loglikelihood) is answered from
                               that pass
  POST /v1/chat/completions    the tokenizer's chat template; logprobs/top_logprobs, stream,
                               continue_final_message (vLLM's)
  POST /v1/score_steps         {\"inputs\": [{\"question\", \"steps\": [...]}]} -> one score per step,
                               laid out as the PRM was trained (every layout stepwise scores)
  POST /pooling                vLLM's STEP pooling shape: [p_bad, p_good] at each step tag
  POST /get_reward             OpenRLHF's remote reward model (--reward.remote_url
                               http://HOST:PORT/get_reward): {\"query\", \"prompts\", \"labels\"} ->
                               {\"rewards\", \"scores\", \"extra_logs\"}; a response's steps (split at
                               --reward-separator) scored by the PRM and aggregated, plus the
                               graded outcome when labels are sent; the question and the
                               response's end read by the policy's (else the PRM's) chat template
  POST /run_code               --sandbox: SandboxFusion's API (verl's sandbox_fusion_url):
                               {\"code\", \"stdin\", \"run_timeout\", \"memory_limit_MB\", \"files\",
                               \"fetch_files\"} -> {\"status\", \"run_result\": {\"status\",
                               \"return_code\", \"stdout\", \"stderr\", ...}}; Python scripts in the
                               kernel's jail, --sandbox-workers at once
  POST /tokenize               vLLM's: {\"prompt\"}, or {\"messages\"} through the chat template, ->
                               {\"tokens\", \"count\", \"max_model_len\"}; POST /detokenize {\"tokens\"}
                               -> {\"prompt\"}; GET /tokenizer_info (what lm-evaluation-harness's
                               tokenizer_backend=auto reads)
  GET  /metrics                Prometheus text: requests, tokens, latency histogram

Errors are OpenAI-shaped JSON with 4xx codes (unknown model or path 404, bad key 401, prompt
too long or a field of the wrong type 400, body too large 413, too slow 408); features it does
not have (tools, response_format, penalties) are refused by name, never ignored. With --api-key
every route but /health needs it. A request whose client disconnects stops being generated.
Connections are bounded: --idle-timeout, --body-timeout, --max-body-mb, --max-inputs,
--max-connections. SIGTERM or Ctrl-C lets requests in flight finish (--shutdown-timeout), then
stops.

Examples:
  stepwise serve --model fixtures/hf-tiny/qwen2-policy --port 8000
  stepwise serve --model POLICY --prm PRM --api-key secret --host 0.0.0.0
  # two adapters on one base, each request naming one (or the base) as `model`
  stepwise serve --model Qwen/Qwen2.5-0.5B --lora-modules math=ADAPTER1 code=ADAPTER2
  # verl: reward_model.sandbox_fusion.url=http://HOST:8080/run_code
  stepwise serve --sandbox --port 8080
  # then, from Python:  openai.OpenAI(base_url=\"http://localhost:8000/v1\", api_key=\"secret\")
  #  and from stepwise: stepwise search --policy http://host:8000 --prm http://host:8000 ...")]
pub struct Args {
    /// Policy checkpoint folder (or Hugging Face model id, or PEFT adapter) for completions and
    /// chat.
    #[arg(long, value_parser = super::named_model)]
    pub model: Option<super::NamedModel>,
    /// PRM checkpoint folder (or model id, or adapter) for /v1/score_steps and /pooling.
    #[arg(long, value_parser = super::named_model)]
    pub prm: Option<super::NamedModel>,
    /// The policy's name in requests (default: a model id as given, as vLLM names it; a
    /// folder's last name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// PEFT LoRA adapters served on the policy without merging, as NAME=ADAPTER (a folder or
    /// Hub id; vLLM's --lora-modules): a request whose `model` is NAME is decoded with that
    /// adapter, beside the base's and other adapters' requests in the same batch, the base's
    /// weights held once. CPU only; an adapter that replaces tensors (modules_to_save) is
    /// refused, to be served merged as --model ADAPTER.
    #[arg(long, num_args = 1.., value_name = "NAME=ADAPTER", value_parser = lora_module)]
    pub lora_modules: Vec<(String, std::path::PathBuf)>,
    /// Let clients change the adapters served while the server runs, as vLLM does with
    /// VLLM_ALLOW_RUNTIME_LORA_UPDATING: POST /v1/load_lora_adapter {"lora_name", "lora_path",
    /// "load_inplace"} serves the adapter in a folder (or Hub id) on the policy, and POST
    /// /v1/unload_lora_adapter {"lora_name"} stops; a request in flight keeps its adapter to its
    /// end. A client can then make the server read a folder of its choosing: beyond this
    /// machine (--host) it needs --api-key.
    #[arg(long)]
    pub allow_runtime_lora_updating: bool,
    /// The PRM's name in requests (default: as the policy's).
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
    /// `/get_reward` (OpenRLHF's --reward.remote_url): the text between a response's steps.
    #[arg(long, default_value = "\n\n")]
    pub reward_separator: String,
    /// `/get_reward`: how a response's step scores become its reward (min, product, last, mean).
    #[arg(long, default_value = "min", value_parser = super::aggregation_arg())]
    pub reward_aggregate: stepwise_search::Aggregation,
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
    /// Require `Authorization: Bearer KEY` on every request but /health (default:
    /// $STEPWISE_API_KEY, else open to whoever reaches the address).
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
    /// Largest request body, in MiB (413 past it).
    #[arg(long, default_value_t = 32.0)]
    pub max_body_mb: f64,
    /// Most texts or solutions in one /pooling, /v1/score_steps or /get_reward request.
    #[arg(long, default_value_t = 4096)]
    pub max_inputs: usize,
    /// Seconds a connection may take to send a request's headers, or stay silent between
    /// requests, before it is closed.
    #[arg(long, default_value_t = 30.0)]
    pub idle_timeout: f64,
    /// Seconds a request's body may take to arrive (408 past it).
    #[arg(long, default_value_t = 30.0)]
    pub body_timeout: f64,
    /// Most connections open at once (more wait to be accepted).
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Seconds the requests in flight get to finish after SIGTERM or Ctrl-C.
    #[arg(long, default_value_t = 30.0)]
    pub shutdown_timeout: f64,
    /// What loaded models compute in.
    #[command(flatten)]
    pub dtype: super::backend::DtypeArg,
    /// Serve POST /run_code (SandboxFusion's API, what verl's code reward calls): Python
    /// scripts run in the kernel's jail (namespaces, Landlock, seccomp, limits).
    #[arg(long)]
    pub sandbox: bool,
    /// /run_code: the longest a script may run, in seconds (a request's run_timeout can only
    /// shorten it).
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    pub sandbox_timeout: f64,
    /// /run_code: the most memory a script may use, in MiB (a request's memory_limit_MB can
    /// only lower it).
    #[arg(long, default_value_t = 1024, value_name = "MIB")]
    pub sandbox_memory_mb: u64,
    /// /run_code: scripts run at once (default: one per core); more requests wait their turn.
    #[arg(long)]
    pub sandbox_workers: Option<usize>,
    /// /run_code without the kernel's isolation, limits only (as `grade --insecure-sandbox`).
    #[arg(long)]
    pub insecure_sandbox: bool,
}

/// The API key: `--api-key`, else a non-empty $STEPWISE_API_KEY. An empty key is refused (it
/// would lock every client out), and an empty variable is said to leave the server open.
fn api_key(given: Option<String>) -> Result<Option<String>> {
    if let Some(k) = given {
        anyhow::ensure!(
            !k.trim().is_empty(),
            "--api-key is empty: give a key, or leave the option out to serve without one"
        );
        return Ok(Some(k));
    }
    match std::env::var("STEPWISE_API_KEY") {
        Ok(k) if !k.trim().is_empty() => Ok(Some(k)),
        Ok(_) => {
            eprintln!("stepwise serve: STEPWISE_API_KEY is set but empty: serving without an API key");
            Ok(None)
        }
        Err(_) => Ok(None),
    }
}

/// Whether `host` is reachable only from this machine.
fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Seconds as a duration, refusing what is not a positive number.
fn seconds(flag: &str, s: f64) -> Result<Duration> {
    anyhow::ensure!(
        s.is_finite() && s > 0.0,
        "--{flag} must be a positive number of seconds, not {s}"
    );
    Ok(Duration::from_secs_f64(s))
}

/// The sandbox /run_code uses, when --sandbox asks for one.
fn code_service(a: &Args) -> Result<Option<(stepwise_code::Sandbox, usize)>> {
    if !a.sandbox {
        anyhow::ensure!(!a.insecure_sandbox, "--insecure-sandbox goes with --sandbox");
        return Ok(None);
    }
    let isolation = if a.insecure_sandbox {
        stepwise_code::Isolation::Insecure
    } else {
        stepwise_code::Isolation::Kernel
    };
    let mut sandbox = stepwise_code::Sandbox::new_with(isolation).context("--sandbox runs scripts with python3")?;
    sandbox.timeout = stepwise_code::sandbox::timeout_from_secs(a.sandbox_timeout).context("--sandbox-timeout")?;
    anyhow::ensure!(a.sandbox_memory_mb >= 64, "--sandbox-memory-mb must be at least 64");
    sandbox.memory_bytes = a.sandbox_memory_mb << 20;
    let workers = stepwise_code::grading::check_threads(a.sandbox_workers.unwrap_or(0)).context("--sandbox-workers")?;
    Ok(Some((sandbox, workers)))
}

/// A `--lora-modules` entry: `NAME=ADAPTER`, the adapter a folder or a model id (found in the
/// cache or downloaded, not merged).
fn lora_module(arg: &str) -> Result<(String, std::path::PathBuf), String> {
    let (name, adapter) = arg
        .split_once('=')
        .filter(|(n, a)| !n.trim().is_empty() && !a.trim().is_empty())
        .ok_or_else(|| format!("`{arg}`: NAME=ADAPTER (a folder or model id)"))?;
    let dir = stepwise_model::hub::resolve_folder(adapter.trim()).map_err(|e| format!("{e:#}"))?;
    if !stepwise_model::hub::is_adapter(&dir) {
        return Err(format!(
            "{adapter}: not a PEFT adapter (no adapter_config.json, or weights of its own)"
        ));
    }
    Ok((name.trim().to_string(), dir))
}

pub fn run(a: Args) -> Result<()> {
    a.dtype.apply();
    let code = code_service(&a)?;
    let cfg = ServeConfig {
        model_name: a.served_model_name.or(a.model.as_ref().map(|m| m.name.clone())),
        prm_name: a.served_prm_name.or(a.prm.as_ref().map(|m| m.name.clone())),
        model: a.model.map(|m| m.dir),
        lora_modules: a.lora_modules,
        runtime_lora_updating: a.allow_runtime_lora_updating,
        prm: a.prm.map(|m| m.dir),
        address: format!("{}:{}", a.host, a.port),
        api_key: api_key(a.api_key)?,
        max_n: a.max_n.max(1),
        max_tokens: a.max_tokens.max(1),
        prefill_chunk_tokens: a.prefill_chunk_tokens,
        layout: a.layout,
        prm_device: a.prm_device,
        device: a.device,
        kv_budget: a.kv_budget_gb.map(|g| (g * (1u64 << 30) as f64) as usize),
        reward_rule: stepwise_remote::serve::openrlhf::RewardRule {
            separator: a.reward_separator,
            aggregation: a.reward_aggregate,
            outcome_weight: a.reward_outcome_weight,
            mode: stepwise_core::grader::GradeMode::Lenient,
            turns: None,
        },
        limits: Limits {
            max_body_bytes: {
                anyhow::ensure!(
                    a.max_body_mb.is_finite() && a.max_body_mb > 0.0,
                    "--max-body-mb must be positive"
                );
                (a.max_body_mb * (1u64 << 20) as f64) as usize
            },
            max_inputs: a.max_inputs.max(1),
            idle_timeout: seconds("idle-timeout", a.idle_timeout)?,
            body_timeout: seconds("body-timeout", a.body_timeout)?,
            max_connections: a.max_connections.max(1),
            shutdown_timeout: seconds("shutdown-timeout", a.shutdown_timeout)?,
        },
        code,
    };
    anyhow::ensure!(
        !cfg.runtime_lora_updating || cfg.api_key.is_some() || is_loopback(&a.host),
        "--allow-runtime-lora-updating on {}: a client could make the server read any folder; give --api-key",
        a.host
    );
    if cfg.api_key.is_none() && !is_loopback(&a.host) {
        eprintln!(
            "stepwise serve: no API key, listening on {}: anyone who reaches it can use the models (--api-key)",
            a.host
        );
    }
    serve(&cfg, |addr| eprintln!("stepwise serve: listening on http://{addr}"))?;
    eprintln!("stepwise serve: stopped");
    Ok(())
}
