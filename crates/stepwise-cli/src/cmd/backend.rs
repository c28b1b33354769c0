//! Where a command's policy or PRM runs: a local checkpoint folder (or cached model id), or one or
//! more OpenAI-compatible servers given by URL (`http://gpu1:8000,http://gpu2:8000`).

use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::time::Duration;
use stepwise_core::seams::{Policy, StepScorer};
use stepwise_model::scoring::LoadedVerifier;
use stepwise_model::{LoadedPolicy, Prompt, Tokenizer};
use stepwise_remote::{is_url, Client, Protocol, RemotePolicy, RemoteScorer, ServerConfig};

/// A checkpoint argument that may also be a server: folder, cached model id, or URL(s).
#[derive(Debug, Clone)]
pub enum Source {
    /// A checkpoint folder.
    Dir(PathBuf),
    /// Base URLs of servers serving the same model.
    Urls(Vec<String>),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Dir(d) => write!(f, "{}", d.display()),
            Source::Urls(u) => write!(f, "{}", u.join(",")),
        }
    }
}

impl serde::Serialize for Source {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

/// Value parser of a [`Source`] argument.
pub fn source(arg: &str) -> std::result::Result<Source, String> {
    if is_url(arg) {
        let urls: Vec<String> = arg
            .split(',')
            .map(|u| u.trim().to_string())
            .filter(|u| !u.is_empty())
            .collect();
        if let Some(bad) = urls.iter().find(|u| !is_url(u)) {
            return Err(format!("`{bad}` is not an http:// or https:// URL"));
        }
        return Ok(Source::Urls(urls));
    }
    super::model_dir(arg).map(Source::Dir)
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
    /// Requests in flight at once, over all servers.
    #[arg(long, default_value_t = 64)]
    pub max_in_flight: usize,
    /// How a PRM server is asked: `stepwise` (`stepwise serve --prm`, every layout) or `pooling`
    /// (vLLM's /pooling with STEP pooling; needs --server-tokenizer and --layout qwen-prm or
    /// step-tag).
    #[arg(long, default_value = "stepwise", value_parser = ["stepwise", "pooling"])]
    pub protocol: String,
}

impl RemoteArgs {
    /// A client for `urls`, for the model playing `role` (`policy` or `prm`) there.
    pub fn client(&self, urls: &[String], role: &str) -> Result<Client> {
        let mut cfg = ServerConfig::new(urls.to_vec(), self.served_model.as_deref().unwrap_or(""));
        if let Some(k) = &self.api_key {
            cfg.api_key = Some(k.clone());
        }
        if !(self.request_timeout.is_finite() && self.request_timeout > 0.0) {
            bail!("--request-timeout must be a positive number of seconds");
        }
        cfg.timeout = Duration::from_secs_f64(self.request_timeout);
        cfg.max_retries = self.retries;
        cfg.max_in_flight = self.max_in_flight.max(1);
        let client = Client::new(cfg)?;
        if self.served_model.is_none() {
            // The servers' only model, as the OpenAI client's users would look it up.
            let models = client
                .get("/models")
                .context("asking the server for its models (or pass --served-model)")?;
            let listed: Vec<(String, Option<String>)> = models
                .get("data")
                .and_then(|d| d.as_array())
                .map(|d| {
                    d.iter()
                        .filter_map(|m| {
                            let id = m.get("id")?.as_str()?.to_string();
                            Some((id, m.get("stepwise_role").and_then(|r| r.as_str()).map(str::to_string)))
                        })
                        .collect()
                })
                .unwrap_or_default();
            // The only model, or the only one in this role (`stepwise serve` names roles).
            let in_role: Vec<&String> = listed
                .iter()
                .filter(|(_, r)| r.as_deref() == Some(role))
                .map(|(n, _)| n)
                .collect();
            match (listed.as_slice(), in_role.as_slice()) {
                ([(one, _)], _) => return client.with_model(one),
                (_, [one]) => return client.with_model(one),
                _ => bail!(
                    "{} serves {:?}: name the {role} with --served-model",
                    urls[0],
                    listed.iter().map(|(n, _)| n).collect::<Vec<_>>()
                ),
            }
        }
        Ok(client)
    }

    fn tokenizer(&self) -> Result<Option<Tokenizer>> {
        self.server_tokenizer.as_deref().map(Tokenizer::from_dir).transpose()
    }
}

/// A policy to sample from, local or remote.
pub enum PolicyBackend {
    /// A checkpoint loaded here.
    Local(LoadedPolicy),
    /// Servers, and the model's tokenizer when given.
    Remote(Client, Option<Tokenizer>),
}

impl PolicyBackend {
    /// Load the checkpoint, or connect to the servers.
    pub fn open(source: &Source, remote: &RemoteArgs) -> Result<Self> {
        Ok(match source {
            Source::Dir(d) => PolicyBackend::Local(LoadedPolicy::load(d, &stepwise_model::default_device())?),
            Source::Urls(urls) => PolicyBackend::Remote(remote.client(urls, "policy")?, remote.tokenizer()?),
        })
    }

    /// It as a [`Policy`]: `top_p` and extra `stop` strings as given.
    pub fn policy(
        &self,
        temperature: f32,
        max_tokens: usize,
        prompt: Prompt,
        separator: &str,
        top_p: f32,
        stop: &[String],
    ) -> Box<dyn Policy + '_> {
        match self {
            PolicyBackend::Local(p) => {
                let mut policy = p.policy(temperature, max_tokens, prompt, separator);
                policy.params.top_p = top_p;
                policy.params.stop_strings = stop.to_vec();
                Box::new(policy)
            }
            PolicyBackend::Remote(client, tokenizer) => Box::new(RemotePolicy {
                client,
                tokenizer: tokenizer.as_ref(),
                prompt,
                separator: separator.to_string(),
                temperature,
                top_p,
                max_tokens,
                stop: stop.to_vec(),
            }),
        }
    }

    /// Retries the servers needed so far (0 for a local policy).
    pub fn retries(&self) -> usize {
        match self {
            PolicyBackend::Local(_) => 0,
            PolicyBackend::Remote(c, _) => c.retries.load(std::sync::atomic::Ordering::Relaxed),
        }
    }
}

/// Where a local checkpoint scores, and how much one forward pass takes.
#[derive(clap::Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Where a local PRM runs: `auto` (a CUDA GPU when this build has CUDA and the driver reports
    /// one, else the CPU), `cpu`, `cuda` or `cuda:N`. On a GPU, steps are scored by the CUDA engine
    /// (packed batches, bf16 weights on the device).
    #[arg(long, default_value = "auto")]
    pub device: stepwise_model::Placement,
    /// Most tokens in one forward pass of a local PRM: solutions are packed up to this budget (a
    /// longer one runs alone), which bounds the memory a pass takes whatever the input.
    #[arg(long, default_value_t = stepwise_model::scoring::DEFAULT_MAX_BATCH_TOKENS)]
    pub max_batch_tokens: usize,
}

impl Default for DeviceArgs {
    fn default() -> Self {
        DeviceArgs {
            device: stepwise_model::Placement::Cpu,
            max_batch_tokens: stepwise_model::scoring::DEFAULT_MAX_BATCH_TOKENS,
        }
    }
}

/// A PRM to score with, local or remote.
pub enum ScorerBackend {
    /// A verifier loaded here, and the tokens one forward pass takes.
    Local(Box<LoadedVerifier>, usize),
    /// Servers.
    Remote(Box<RemotePrm>),
}

/// A PRM behind servers.
pub struct RemotePrm {
    client: Client,
    /// With the pooling protocol: the PRM's tokenizer and layout, to lay inputs out here.
    pooling: Option<(Tokenizer, stepwise_model::PrmLayout)>,
}

impl ScorerBackend {
    /// Load the verifier where `device` says (`layout` as `stepwise score --layout`), or connect
    /// to the servers.
    pub fn open(source: &Source, layout: &str, remote: &RemoteArgs, device: &DeviceArgs) -> Result<Self> {
        Ok(match source {
            Source::Dir(d) => {
                let v = LoadedVerifier::load_on(d, layout, device.device)?;
                eprintln!("{}: {}", d.display(), v.model.placement_name());
                ScorerBackend::Local(Box::new(v), device.max_batch_tokens)
            }
            Source::Urls(urls) => {
                let client = remote.client(urls, "prm")?;
                let pooling = match remote.protocol.as_str() {
                    "pooling" => {
                        let tok = remote
                            .tokenizer()?
                            .context("--protocol pooling lays inputs out here: pass --server-tokenizer")?;
                        if !matches!(layout, "qwen-prm" | "step-tag") {
                            bail!("--protocol pooling reads rewards at step tags: pass --layout qwen-prm or step-tag");
                        }
                        Some((tok, stepwise_model::PrmLayout::by_name(layout)?))
                    }
                    _ => None,
                };
                ScorerBackend::Remote(Box::new(RemotePrm { client, pooling }))
            }
        })
    }

    /// It as a [`StepScorer`].
    pub fn scorer(&self) -> Box<dyn StepScorer + '_> {
        match self {
            ScorerBackend::Local(v, tokens) => Box::new(v.scorer().with_max_batch_tokens(*tokens)),
            ScorerBackend::Remote(remote) => Box::new(RemoteScorer {
                client: &remote.client,
                protocol: match &remote.pooling {
                    Some((tokenizer, layout)) => Protocol::Pooling {
                        tokenizer,
                        layout: layout.clone(),
                    },
                    None => Protocol::Stepwise,
                },
            }),
        }
    }
}
