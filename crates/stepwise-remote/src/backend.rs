//! Where a policy or PRM runs: a local checkpoint folder (or cached model id), or one or more
//! OpenAI-compatible servers given by URL (`http://gpu1:8000,http://gpu2:8000`) or in a file of
//! URLs that may change during the run (a fleet). The command line and the Python package open
//! their models here.

use crate::{is_url, Client, Protocol, RemotePolicy, RemoteScorer, ServerConfig};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::time::Duration;
use stepwise_core::seams::{Policy, StepScorer};
use stepwise_model::scoring::LoadedVerifier;
use stepwise_model::{LoadedPolicy, Prompt, Tokenizer};

/// A checkpoint argument that may also be a server: folder, cached model id, or URL(s).
#[derive(Debug, Clone)]
pub enum Source {
    /// A checkpoint folder.
    Dir(PathBuf),
    /// Base URLs of servers serving the same model.
    Urls(Vec<String>),
    /// A file of such URLs, read again when it changes ([`crate::client::read_server_file`]).
    ServerFile(PathBuf),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Dir(d) => write!(f, "{}", d.display()),
            Source::Urls(u) => write!(f, "{}", u.join(",")),
            Source::ServerFile(p) => write!(f, "{}", p.display()),
        }
    }
}

impl serde::Serialize for Source {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl Source {
    /// What a resumed output records of this model, to refuse a resume with another: a
    /// checkpoint folder's contents ([`stepwise_model::checkpoint_fingerprint`]: the same
    /// checkpoint by any path matches, another behind the same path does not), or the servers'
    /// URLs (without trailing slashes).
    pub fn identity(&self) -> Result<serde_json::Value> {
        Ok(match self {
            Source::Dir(d) => serde_json::json!({ "checkpoint": stepwise_model::checkpoint_fingerprint(d)? }),
            Source::Urls(u) => serde_json::json!(u.iter().map(|u| u.trim_end_matches('/')).collect::<Vec<_>>()),
            // Servers come and go in a fleet: the file names it.
            Source::ServerFile(p) => {
                serde_json::json!({ "servers": std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()) })
            }
        })
    }

    /// Server URL(s) (comma-separated `http(s)://`), a file listing server URLs (one or more a
    /// line, `#` comments), else a checkpoint folder or a Hugging Face model id found in the
    /// local cache.
    pub fn parse(arg: &str) -> Result<Source> {
        Self::parse_str(arg).map_err(|e| anyhow::anyhow!(e))
    }

    fn parse_str(arg: &str) -> std::result::Result<Source, String> {
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
        if Path::new(arg).is_file() {
            return crate::client::read_server_file(Path::new(arg))
                .and_then(|urls| match urls.is_empty() {
                    true => anyhow::bail!("no server URL in it"),
                    false => Ok(Source::ServerFile(arg.into())),
                })
                .map_err(|e| {
                    format!("`{arg}` is a file, read as a list of server URLs (a checkpoint is a folder): {e:#}")
                });
        }
        stepwise_model::hub::resolve(arg)
            .map(Source::Dir)
            .map_err(|e| format!("{e:#}"))
    }
}

/// How to reach servers given by URL.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// The model's name on the server(s) (`None`: the servers' only model, from /v1/models).
    pub served_model: Option<String>,
    /// The served model's tokenizer folder: prompts and PRM inputs are then sent as token ids,
    /// laid out exactly as the local engine lays them out.
    pub server_tokenizer: Option<PathBuf>,
    /// Bearer token for the servers.
    pub api_key: Option<String>,
    /// Seconds allowed for one request before it is retried.
    pub request_timeout: f64,
    /// Retries of a failing request (429, 5xx, timeouts, resets) before giving up.
    pub retries: usize,
    /// Requests in flight at once to each server.
    pub max_in_flight: usize,
    /// Seconds between checks of a fleet (several servers, or a file of them); a server silent
    /// that long (at least 2 s) is taken for dead or hung and its requests go to the others.
    pub health_interval: f64,
    /// How a PRM server is asked: `stepwise` or `pooling` (vLLM's /pooling).
    pub protocol: String,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            served_model: None,
            server_tokenizer: None,
            api_key: None,
            request_timeout: 600.0,
            retries: 8,
            max_in_flight: 64,
            health_interval: 5.0,
            protocol: "stepwise".into(),
        }
    }
}

impl RemoteOptions {
    /// A client for the servers `source` names (URLs or a file of them), for the model playing
    /// `role` (`policy` or `prm`) there.
    pub fn client(&self, source: &Source, role: &str) -> Result<Client> {
        let (urls, file) = match source {
            Source::Urls(u) => (u.clone(), None),
            Source::ServerFile(f) => (Vec::new(), Some(f.clone())),
            Source::Dir(d) => bail!("{} is a checkpoint, not a server", d.display()),
        };
        let mut cfg = ServerConfig::new(urls, self.served_model.as_deref().unwrap_or(""));
        cfg.servers_file = file;
        if !(self.health_interval.is_finite() && self.health_interval > 0.0) {
            bail!("the health check interval must be a positive number of seconds");
        }
        cfg.health_interval = Duration::from_secs_f64(self.health_interval);
        if let Some(k) = &self.api_key {
            cfg.api_key = Some(k.clone());
        }
        if !(self.request_timeout.is_finite() && self.request_timeout > 0.0) {
            bail!("the request timeout must be a positive number of seconds");
        }
        cfg.timeout = Duration::from_secs_f64(self.request_timeout);
        cfg.max_retries = self.retries;
        cfg.max_in_flight = self.max_in_flight.max(1);
        let client = Client::new(cfg)?;
        if self.served_model.is_none() {
            // The servers' only model, as the OpenAI client's users would look it up.
            let models = client
                .get("/models")
                .context("asking the server for its models (or name the served model)")?;
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
                    "{source} serves {:?}: name the {role} (--served-model)",
                    listed.iter().map(|(n, _)| n).collect::<Vec<_>>()
                ),
            }
        }
        Ok(client)
    }

    /// The served model's tokenizer, when given.
    pub fn tokenizer(&self) -> Result<Option<Tokenizer>> {
        self.server_tokenizer.as_deref().map(Tokenizer::from_dir).transpose()
    }
}

/// How a [`PolicyBackend`]'s policy samples and lays out its prompts.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicySettings {
    /// Sampling temperature (0: greedy).
    pub temperature: f32,
    /// Most new tokens per continuation; `None`: what the model's context leaves after the
    /// prompt (vLLM's default).
    pub max_tokens: Option<usize>,
    /// How the question and the steps so far become the prompt.
    pub prompt: Prompt,
    /// Text between steps: continuations are split at it, one step stops at it.
    pub separator: String,
    /// Nucleus mass.
    pub top_p: f32,
    /// Strings that end a continuation besides the end of sequence.
    pub stop: Vec<String>,
}

impl Default for PolicySettings {
    /// Temperature 0.7, 512 new tokens, the question as plain text, steps one a line, no
    /// nucleus cut, no stop strings.
    fn default() -> Self {
        PolicySettings {
            temperature: 0.7,
            max_tokens: Some(512),
            prompt: Prompt::Text,
            separator: "\n".into(),
            top_p: 1.0,
            stop: Vec::new(),
        }
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
    pub fn open(source: &Source, remote: &RemoteOptions, local: &LocalOptions) -> Result<Self> {
        Ok(match source {
            Source::Dir(d) => PolicyBackend::Local(LoadedPolicy::load_on(d, local.placement, local.precision)?),
            servers => PolicyBackend::Remote(remote.client(servers, "policy")?, remote.tokenizer()?),
        })
    }

    /// It as a [`Policy`] that samples and lays out its prompts as `s` says.
    pub fn policy(&self, s: &PolicySettings) -> Box<dyn Policy + '_> {
        self.policy_with(s, None)
    }

    /// [`PolicyBackend::policy`] sampling and weighing with a local model's served adapter at
    /// index `adapter` (`stepwise_model::Model::lease_adapter`: the caller holds the lease
    /// meanwhile). Servers name their adapters as models (`RemoteOptions::served_model`): there
    /// it is not given.
    pub fn policy_with(&self, s: &PolicySettings, adapter: Option<usize>) -> Box<dyn Policy + '_> {
        match self {
            PolicyBackend::Local(p) => {
                let mut policy = p.policy(
                    s.temperature,
                    s.max_tokens.unwrap_or(usize::MAX),
                    s.prompt,
                    &s.separator,
                );
                policy.params.top_p = s.top_p;
                policy.params.stop_strings = s.stop.clone();
                policy.adapter = adapter;
                Box::new(policy)
            }
            PolicyBackend::Remote(client, tokenizer) => Box::new(RemotePolicy {
                client,
                tokenizer: tokenizer.as_ref(),
                prompt: s.prompt,
                separator: s.separator.clone(),
                temperature: s.temperature,
                top_p: s.top_p,
                max_tokens: s.max_tokens,
                stop: s.stop.clone(),
            }),
        }
    }

    /// The servers' client (`None` for a local policy).
    pub fn client(&self) -> Option<&Client> {
        match self {
            PolicyBackend::Local(_) => None,
            PolicyBackend::Remote(c, _) => Some(c),
        }
    }
}

/// What servers did for a run, for its closing line: `" (3 requests retried; requests per
/// server: http://a 120, http://b 118)"`, the second part with several servers, each model's
/// part named when there are several (`("PRM", client)`); empty when there is nothing to say
/// (local models).
pub fn servers_summary(clients: &[(&str, Option<&Client>)]) -> String {
    let named = clients.iter().filter(|(_, c)| c.is_some()).count() > 1;
    let mut parts = Vec::new();
    for (name, c) in clients {
        let Some(c) = c else { continue };
        let mut said = Vec::new();
        let retried = c.retries.load(std::sync::atomic::Ordering::Relaxed);
        if retried > 0 {
            said.push(format!("{retried} requests retried"));
        }
        let served = c.served();
        if served.len() > 1 {
            let each: Vec<String> = served.iter().map(|(u, n)| format!("{u} {n}")).collect();
            said.push(format!("requests per server: {}", each.join(", ")));
        }
        if !said.is_empty() {
            let name = if named { format!("{name}: ") } else { String::new() };
            parts.push(format!("{name}{}", said.join("; ")));
        }
    }
    match parts.is_empty() {
        true => String::new(),
        false => format!(" ({})", parts.join("; ")),
    }
}

/// How a local checkpoint is loaded and run.
#[derive(Debug, Clone, Copy)]
pub struct LocalOptions {
    /// Where it runs.
    pub placement: stepwise_model::Placement,
    /// What it computes in on the CPU: how its weight matrices are held, whether bf16 ones
    /// multiply in bf16.
    pub precision: stepwise_model::Precision,
    /// Most tokens in one forward pass of scoring.
    pub max_batch_tokens: usize,
}

impl Default for LocalOptions {
    fn default() -> Self {
        LocalOptions {
            placement: stepwise_model::Placement::Auto,
            precision: stepwise_model::Precision::default(),
            max_batch_tokens: stepwise_model::scoring::DEFAULT_MAX_BATCH_TOKENS,
        }
    }
}

/// A PRM to score with, local or remote.
pub enum ScorerBackend {
    /// A verifier loaded here (with the tokens one forward pass takes).
    Local(Box<LoadedVerifier>),
    /// Servers.
    Remote(Box<RemotePrm>),
}

impl ScorerBackend {
    /// The servers' client (`None` for a local verifier).
    pub fn client(&self) -> Option<&Client> {
        match self {
            ScorerBackend::Local(..) => None,
            ScorerBackend::Remote(r) => Some(&r.client),
        }
    }

    /// The tokenizer this PRM lays its inputs out with, when it is known here (a local verifier,
    /// or a server read through the pooling protocol).
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        match self {
            ScorerBackend::Local(v) => Some(&v.tokenizer),
            ScorerBackend::Remote(r) => r.pooling.as_ref().map(|(t, _)| t),
        }
    }
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
    pub fn open(source: &Source, layout: &str, remote: &RemoteOptions, local: &LocalOptions) -> Result<Self> {
        Ok(match source {
            Source::Dir(d) => {
                let v = LoadedVerifier::load_on(d, layout, local.placement, local.precision)?;
                ScorerBackend::Local(Box::new(v.with_max_batch_tokens(local.max_batch_tokens)))
            }
            servers => {
                let client = remote.client(servers, "prm")?;
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

    /// It as a [`StepScorer`] for step-level search: a local PRM on the CPU scores each new step
    /// incrementally, on the KV cache of its beam ([`stepwise_model::IncrementalScorer`]); a PRM
    /// on a GPU or behind servers scores each beam's whole text (in packed passes on a GPU).
    pub fn search_scorer(&self) -> Box<dyn StepScorer + '_> {
        match self {
            ScorerBackend::Local(v) if !v.model.is_on_gpu() => {
                Box::new(stepwise_model::IncrementalScorer::new(v.scorer()))
            }
            _ => self.scorer(),
        }
    }

    /// It as a [`StepScorer`].
    pub fn scorer(&self) -> Box<dyn StepScorer + '_> {
        match self {
            ScorerBackend::Local(v) => Box::new(v.scorer()),
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
