//! A policy behind an OpenAI-compatible server (vLLM, SGLang, llama.cpp, `stepwise serve`) as a
//! [`Policy`]: `/v1/completions` continues the question and the steps so far, one step (stopped
//! at the separator) or to the end.
//!
//! With the policy's tokenizer at hand the prompt is sent as token ids, built exactly as a local
//! policy builds them ([`Prompt::ids`]), so the server sees the input the local engine would;
//! without it the prompt is sent as text (`question + separator + step + separator …`), or with
//! [`Prompt::Chat`] through `/v1/chat/completions` and the server's own chat template.

use crate::client::Client;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use stepwise_core::seams::{split_steps_at, Continuation, Policy, Until};
use stepwise_model::{Prompt, Tokenizer};

/// A remote policy.
pub struct RemotePolicy<'a> {
    /// The servers.
    pub client: &'a Client,
    /// The policy's tokenizer, when known locally: prompts go as token ids.
    pub tokenizer: Option<&'a Tokenizer>,
    /// The prompt's layout.
    pub prompt: Prompt,
    /// Text between steps.
    pub separator: String,
    /// Sampling temperature.
    pub temperature: f32,
    /// Nucleus sampling mass.
    pub top_p: f32,
    /// Most new tokens per continuation.
    /// (`None`: sent as `null`, which vLLM and `stepwise serve` read as what the context leaves.)
    pub max_tokens: Option<usize>,
    /// Strings that end a continuation besides the end of sequence (and, for one step, the
    /// separator).
    pub stop: Vec<String>,
}

impl RemotePolicy<'_> {
    /// The request for `n` continuations.
    fn request(
        &self,
        question: &str,
        prefix: &[&str],
        n: usize,
        until: Until,
        seed: u64,
        temperature: f32,
    ) -> Result<(String, Value)> {
        let mut body = json!({
            "model": self.client.config().model,
            "n": n,
            "temperature": temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "seed": seed,
            // The sampled tokens' log-probabilities tell how many tokens each choice has.
            "logprobs": 0,
        });
        let mut stop = self.stop.clone();
        if until == Until::Step {
            stop.push(self.separator.clone());
        }
        if !stop.is_empty() {
            body["stop"] = json!(stop);
        }
        match (self.tokenizer, self.prompt) {
            (Some(tok), prompt) => {
                body["prompt"] = json!(prompt.ids(tok, &self.separator, question, prefix)?);
                Ok(("/completions".into(), body))
            }
            (None, Prompt::Chat) => {
                let mut messages = vec![json!({"role": "user", "content": question})];
                if !prefix.is_empty() {
                    let so_far: String = prefix.iter().map(|s| format!("{s}{}", self.separator)).collect();
                    messages.push(json!({"role": "assistant", "content": so_far}));
                    // vLLM's and SGLang's way to continue the assistant's message in place.
                    body["continue_final_message"] = json!(true);
                    body["add_generation_prompt"] = json!(false);
                }
                body["messages"] = json!(messages);
                body.as_object_mut().unwrap().remove("logprobs");
                body["logprobs"] = json!(true);
                body["top_logprobs"] = json!(0);
                Ok(("/chat/completions".into(), body))
            }
            (None, Prompt::Text) => {
                let mut text = format!("{question}{}", self.separator);
                for s in prefix {
                    text.push_str(s);
                    text.push_str(&self.separator);
                }
                body["prompt"] = json!(text);
                Ok(("/completions".into(), body))
            }
            (None, Prompt::Pieces) => {
                bail!("the pieces prompt layout is built from token ids: pass the policy's tokenizer (--tokenizer)")
            }
        }
    }

    fn continuations(&self, reply: &Value, n: usize, until: Until) -> Result<Vec<Continuation>> {
        let choices = reply
            .get("choices")
            .and_then(Value::as_array)
            .context("the reply has no `choices`")?;
        if choices.len() != n {
            bail!("asked for {n} continuations, the server returned {}", choices.len());
        }
        let usage = reply
            .pointer("/usage/completion_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0) as usize;
        let mut sorted: Vec<&Value> = choices.iter().collect();
        sorted.sort_by_key(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0));
        sorted
            .into_iter()
            .map(|c| {
                let text = c
                    .get("text")
                    .or_else(|| c.pointer("/message/content"))
                    .and_then(Value::as_str)
                    .context("a choice has no text")?
                    .to_string();
                let tokens = c
                    .pointer("/logprobs/tokens")
                    .or_else(|| c.pointer("/logprobs/content"))
                    .and_then(Value::as_array)
                    .map(Vec::len)
                    .unwrap_or(usage / n.max(1));
                let finish = c.get("finish_reason").and_then(Value::as_str).unwrap_or("");
                // vLLM and `stepwise serve` say which stop ended the text (`stop_reason`: the stop
                // string, or null for the end of sequence); a server that does not is taken to
                // have stopped at the separator whenever it stopped.
                let at_separator = finish == "stop"
                    && match c.get("stop_reason") {
                        Some(Value::String(s)) => *s == self.separator,
                        Some(Value::Null) => false,
                        Some(_) => false,
                        None => !text.is_empty(),
                    };
                let mut steps = split_steps_at(&text, &self.separator);
                if until == Until::Step {
                    steps.truncate(1);
                }
                Ok(Continuation {
                    steps,
                    finished: until == Until::End || !at_separator,
                    text,
                    tokens,
                    token_ids: Vec::new(),
                })
            })
            .collect()
    }

    fn call(
        &self,
        question: &str,
        prefix: &[&str],
        n: usize,
        until: Until,
        seed: u64,
        temperature: f32,
    ) -> Result<Vec<Continuation>> {
        let (path, body) = self.request(question, prefix, n, until, seed, temperature)?;
        let reply = self.client.post(&path, &body)?;
        self.continuations(&reply, n, until)
    }
}

impl Policy for RemotePolicy<'_> {
    fn continue_from(
        &self,
        question: &str,
        prefix: &[&str],
        n: usize,
        until: Until,
        seed: u64,
    ) -> Result<Vec<Continuation>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        self.call(question, prefix, n, until, seed, self.temperature)
    }

    fn continue_greedy(&self, question: &str, prefix: &[&str], until: Until) -> Result<Continuation> {
        let mut one = self.call(question, prefix, 1, until, 0, 0.0)?;
        one.pop().context("the server returned no continuation")
    }
}
