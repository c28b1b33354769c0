//! A process reward model behind a server as a [`StepScorer`], in one of two protocols:
//!
//! - **stepwise** (`POST /v1/score_steps`, what `stepwise serve --prm` offers): the question and
//!   the steps go as text and the server lays them out as its verifier was trained (any layout,
//!   log-ratio verifiers included); one score per step comes back.
//! - **pooling** (vLLM's `POST /pooling` with STEP pooling, `--runner pooling --pooler-config
//!   '{"step_tag_id": ID, "returned_token_ids": [...]}'`): the client lays the input out with the
//!   PRM's layout and tokenizer ([`PrmLayout::encode`]) and sends token ids, so the server reads
//!   exactly the tokens the local engine would; the server returns the probabilities at each
//!   step tag, the last of them the "good" one.

use crate::client::Client;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use stepwise_core::seams::{ScoreInput, Scored, StepScorer};
use stepwise_text::{PrmLayout, Tokenizer};

/// How the scorer talks to its server.
pub enum Protocol<'a> {
    /// `stepwise serve`'s `/v1/score_steps`.
    Stepwise,
    /// vLLM's `/pooling` with STEP pooling, inputs laid out here.
    Pooling {
        /// The PRM's tokenizer.
        tokenizer: &'a Tokenizer,
        /// The PRM's layout (qwen-prm or step-tag: the ones with a step tag token).
        layout: PrmLayout,
    },
}

/// A remote step scorer.
pub struct RemoteScorer<'a> {
    /// The servers.
    pub client: &'a Client,
    /// The protocol.
    pub protocol: Protocol<'a>,
}

impl StepScorer for RemoteScorer<'_> {
    /// One request; over several servers, the batch split into one request for each, sent at
    /// once, so a fleet scores a batch together.
    fn score(&self, batch: &[ScoreInput<'_>]) -> Result<Scored> {
        let servers = self.client.server_count();
        if servers < 2 || batch.len() < 2 {
            return self.score_part(batch);
        }
        let parts: Vec<Result<Scored>> = std::thread::scope(|s| {
            let started: Vec<_> = batch
                .chunks(batch.len().div_ceil(servers))
                .map(|part| s.spawn(move || self.score_part(part)))
                .collect();
            started
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a scoring request's thread panicked")))
                })
                .collect()
        });
        let mut all = Scored::default();
        for part in parts {
            let part = part?;
            all.scores.extend(part.scores);
            all.tokens += part.tokens;
        }
        Ok(all)
    }

    /// Two requests a server: each server computes one batch while the next waits in its queue,
    /// and the client sends the next as soon as a reply comes (each request goes to the server
    /// with the fewest in flight). Counted when a run starts; servers added later share the
    /// same requests.
    fn in_flight(&self) -> usize {
        2 * self.client.server_count().max(1)
    }

    /// One request, to the least busy server.
    fn score_part(&self, batch: &[ScoreInput<'_>]) -> Result<Scored> {
        if batch.is_empty() {
            return Ok(Scored::default());
        }
        match &self.protocol {
            Protocol::Stepwise => {
                let inputs: Vec<Value> = batch
                    .iter()
                    .map(|i| json!({"question": i.question, "steps": i.steps, "partial": i.partial}))
                    .collect();
                let reply = self.client.post(
                    "/score_steps",
                    &json!({"model": self.client.config().model, "inputs": inputs}),
                )?;
                let scores: Vec<Vec<f32>> = serde_json::from_value(reply.get("scores").cloned().unwrap_or(Value::Null))
                    .context("the reply's `scores` is not a list of lists of numbers")?;
                check_shape(batch, &scores)?;
                let tokens = reply
                    .pointer("/usage/prompt_tokens")
                    .and_then(Value::as_u64)
                    .unwrap_or(0) as usize;
                Ok(Scored { scores, tokens })
            }
            Protocol::Pooling { tokenizer, layout } => {
                let encoded = batch
                    .iter()
                    .map(|i| layout.encode(tokenizer, i.question, &i.steps))
                    .collect::<Result<Vec<_>>>()?;
                let tokens = encoded.iter().map(|e| e.ids.len()).sum();
                let input: Vec<&Vec<u32>> = encoded.iter().map(|e| &e.ids).collect();
                let reply = self.client.post(
                    "../pooling",
                    &json!({"model": self.client.config().model, "input": input}),
                )?;
                let data = reply
                    .get("data")
                    .and_then(Value::as_array)
                    .context("the reply has no `data` list")?;
                if data.len() != batch.len() {
                    bail!(
                        "sent {} inputs, the server returned {} results",
                        batch.len(),
                        data.len()
                    );
                }
                let scores = data
                    .iter()
                    .map(|d| {
                        let per_step = d
                            .get("data")
                            .and_then(Value::as_array)
                            .context("a result has no `data`")?;
                        per_step
                            .iter()
                            .map(|p| {
                                // One probability per returned token id; the last is "good".
                                let probs = p.as_array().map_or_else(|| vec![p.clone()], Clone::clone);
                                probs
                                    .last()
                                    .and_then(Value::as_f64)
                                    .map(|x| x as f32)
                                    .context("a step's result is not a probability")
                            })
                            .collect::<Result<Vec<f32>>>()
                    })
                    .collect::<Result<Vec<_>>>()?;
                check_shape(batch, &scores)?;
                Ok(Scored { scores, tokens })
            }
        }
    }
}

/// One score per step of each input, each a probability.
fn check_shape(batch: &[ScoreInput<'_>], scores: &[Vec<f32>]) -> Result<()> {
    if scores.len() != batch.len() {
        bail!("sent {} solutions, the server scored {}", batch.len(), scores.len());
    }
    for (k, (i, s)) in batch.iter().zip(scores).enumerate() {
        if s.len() != i.steps.len() {
            bail!(
                "solution {k} has {} steps, the server returned {} scores (does the server's step tag match the layout?)",
                i.steps.len(),
                s.len()
            );
        }
        if let Some(x) = s.iter().find(|x| !(0.0..=1.0).contains(*x)) {
            bail!("solution {k}: the server returned {x}, not a probability");
        }
    }
    Ok(())
}
