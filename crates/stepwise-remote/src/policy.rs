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
use stepwise_core::seams::{split_steps_at, Continuation, NextOptions, Policy, Until};
use stepwise_text::{Prompt, Tokenizer};

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

    /// The request for the next token's 20 likeliest log-probabilities after `question` laid out
    /// as a prompt and then `written`.
    fn next_token_request(&self, question: &str, written: &str) -> Result<(String, Value)> {
        let (path, mut body) = self.request(question, &[], 1, Until::End, 0, 0.0)?;
        body["max_tokens"] = json!(1);
        body.as_object_mut().unwrap().remove("stop");
        let chat = self.extend_written(&mut body, written)?;
        body[if chat { "top_logprobs" } else { "logprobs" }] = json!(NEXT_TOKEN_CANDIDATES);
        Ok((path, body))
    }

    /// `body` (a request with no steps) continues `written` as the model's own text: appended
    /// to the prompt, or as an assistant message continued in place. Whether it is a chat
    /// request.
    fn extend_written(&self, body: &mut Value, written: &str) -> Result<bool> {
        if let Some(messages) = body.get_mut("messages").and_then(Value::as_array_mut) {
            messages.push(json!({"role": "assistant", "content": written}));
            body["continue_final_message"] = json!(true);
            body["add_generation_prompt"] = json!(false);
            return Ok(true);
        }
        match (&mut body["prompt"], self.tokenizer) {
            (Value::Array(ids), Some(tok)) => ids.extend(tok.encode(written, false)?.into_iter().map(|t| json!(t))),
            (Value::String(text), _) => text.push_str(written),
            _ => bail!("cannot extend this prompt"),
        }
        Ok(false)
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

/// How many of the next token's likeliest alternatives are asked for (OpenAI's and vLLM's
/// default limit).
const NEXT_TOKEN_CANDIDATES: usize = 20;

/// The next token's alternatives in a reply, `(text, log-probability)`: `/completions`'
/// `top_logprobs[0]` (an object) or `/chat/completions`' `content[0].top_logprobs` (a list).
fn next_token_alternatives(reply: &Value) -> Result<Vec<(String, f64)>> {
    let choice = reply.pointer("/choices/0").context("the reply has no choice")?;
    if let Some(top) = choice.pointer("/logprobs/top_logprobs/0").and_then(Value::as_object) {
        return Ok(top
            .iter()
            .filter_map(|(t, lp)| Some((t.clone(), lp.as_f64()?)))
            .collect());
    }
    if let Some(top) = choice
        .pointer("/logprobs/content/0/top_logprobs")
        .and_then(Value::as_array)
    {
        return Ok(top
            .iter()
            .filter_map(|e| Some((e.get("token")?.as_str()?.to_string(), e.get("logprob")?.as_f64()?)))
            .collect());
    }
    bail!("the reply has no log-probabilities of the next token: the server does not give them")
}

/// Each option's log-probability from the next token's alternatives: that of the longest
/// alternative its text starts with (leading spaces ignored), or, where none matches, the
/// smallest listed (an upper bound: it was not among the likeliest).
fn option_logprobs(alternatives: &[(String, f64)], options: &[&str]) -> Vec<f64> {
    let floor = alternatives.iter().map(|a| a.1).fold(f64::INFINITY, f64::min);
    options
        .iter()
        .map(|o| {
            let o = o.trim_start();
            alternatives
                .iter()
                .filter(|(t, _)| !t.trim_start().is_empty() && o.starts_with(t.trim_start()))
                .max_by_key(|(t, _)| t.trim_start().len())
                .map_or(floor, |a| a.1)
        })
        .collect()
}

impl Policy for RemotePolicy<'_> {
    /// Read from the next token's 20 likeliest alternatives (`logprobs`): only an option's first
    /// token counts, so options should differ in it (`correct` / `incorrect` do).
    fn continuation_logprobs(&self, question: &str, written: &str, options: &[&str]) -> Result<Option<Vec<f64>>> {
        let (path, body) = self.next_token_request(question, written)?;
        let reply = self.client.post(&path, &body)?;
        Ok(Some(option_logprobs(&next_token_alternatives(&reply)?, options)))
    }

    /// Each option sent after its prompt with `echo` and `logprobs`, its tokens' log-probabilities
    /// summed (`weigh.rs`): exact where the tokenizer is at hand, `None` for a chat
    /// prompt without it.
    fn logprobs_after(&self, asks: &[NextOptions<'_>], end: bool) -> Result<Option<Vec<Vec<f64>>>> {
        crate::weigh::logprobs_after(self, asks, end)
    }

    /// The server's stop string is put back at the end of the text where the reply names it
    /// (`stop_reason`, as vLLM and `stepwise serve` do). A server that does not say
    /// which stop ended the text (OpenAI's API) gives it without the stop string, as finished: a
    /// verifier with tools then reads its chain without running the code.
    fn continue_written(
        &self,
        question: &str,
        written: &str,
        stop: &[&str],
        seed: u64,
    ) -> Result<Option<Continuation>> {
        let (path, mut body) = self.request(question, &[], 1, Until::End, seed, self.temperature)?;
        self.extend_written(&mut body, written)?;
        let stops: Vec<String> = self
            .stop
            .iter()
            .cloned()
            .chain(stop.iter().map(|s| s.to_string()))
            .collect();
        if !stops.is_empty() {
            body["stop"] = json!(stops);
        }
        let reply = self.client.post(&path, &body)?;
        let mut one = self
            .continuations(&reply, 1, Until::End)?
            .pop()
            .context("the server returned no continuation")?;
        let choice = reply.pointer("/choices/0").unwrap_or(&Value::Null);
        if let Some(s) = choice
            .get("stop_reason")
            .and_then(Value::as_str)
            .filter(|s| stop.contains(s))
        {
            if !one.text.ends_with(s) {
                one.text.push_str(s);
            }
        }
        one.finished = !stop.iter().any(|s| one.text.ends_with(s));
        one.steps.clear();
        Ok(Some(one))
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_take_the_longest_alternative_they_start_with() {
        let completions = json!({"choices": [{"logprobs": {"top_logprobs": [{"correct": -0.2, "in": -1.5, "incorrect": -1.9, " c": -3.0}]}}]});
        let alts = next_token_alternatives(&completions).unwrap();
        assert_eq!(
            option_logprobs(&alts, &["correct", "incorrect", "wrong"]),
            [-0.2, -1.9, -3.0]
        );
        let chat = json!({"choices": [{"logprobs": {"content": [{"token": "x", "logprob": -9.0,
            "top_logprobs": [{"token": "inc", "logprob": -0.1}, {"token": "cor", "logprob": -2.3}]}]}}]});
        let alts = next_token_alternatives(&chat).unwrap();
        assert_eq!(option_logprobs(&alts, &["correct", "incorrect"]), [-2.3, -0.1]);
        assert!(next_token_alternatives(&json!({"choices": [{"text": "a"}]})).is_err());
    }
}
