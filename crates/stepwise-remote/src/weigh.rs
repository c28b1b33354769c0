//! Fixed texts weighed by a served model ([`Policy::logprobs_after`] for a [`RemotePolicy`]):
//! each option is sent after its prompt to `/v1/completions` with `echo` and `logprobs`, and
//! the log-probabilities the server gives the prompt's own tokens are summed over the option's
//! (lm-evaluation-harness's loglikelihood request; vLLM, `stepwise serve` and OpenAI's legacy
//! completions answer it). One request an option, several in flight at once.
//!
//! With the policy's tokenizer the prompt goes as token ids laid out as the local engine lays
//! them out, the option's tokens (and the end of text) appended, so the sum is over exactly the
//! tokens a local engine sums. Without it the prompt goes as text, and the option's tokens are
//! found by their offsets in the echoed text (a token that straddles the prompt's end counts
//! with the option); the end of text cannot be written as text, so `end` then needs the
//! tokenizer. A chat prompt without the tokenizer cannot be echoed: no answer.
//!
//! [`Policy::logprobs_after`]: stepwise_core::seams::Policy::logprobs_after

use crate::policy::RemotePolicy;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use stepwise_core::seams::NextOptions;
use stepwise_text::Prompt;

/// One option to weigh: the prompt sent, and which of its tokens are the option's.
enum Weighed {
    /// Token ids: the option's tokens are those from `from` on.
    Ids { ids: Vec<u32>, from: usize },
    /// Text: the option's tokens are those that end after character `from`.
    Text { text: String, from: usize },
}

impl Weighed {
    fn prompt(&self) -> Value {
        match self {
            Weighed::Ids { ids, .. } => json!(ids),
            Weighed::Text { text, .. } => json!(text),
        }
    }

    /// The option's log-probability from the reply's echoed prompt.
    fn sum(&self, reply: &Value) -> Result<f64> {
        let lp = reply
            .pointer("/choices/0/logprobs")
            .filter(|v| !v.is_null())
            .context("the reply has no log-probabilities: the server does not echo the prompt's (`echo` with `logprobs`: vLLM, stepwise serve)")?;
        let logprobs = lp
            .get("token_logprobs")
            .and_then(Value::as_array)
            .context("the reply's log-probabilities have no `token_logprobs`")?;
        let value = |i: usize| -> Result<f64> {
            logprobs
                .get(i)
                .and_then(Value::as_f64)
                .with_context(|| format!("the reply gives no log-probability of the prompt's token {i}: the server does not echo the prompt's"))
        };
        match self {
            Weighed::Ids { ids, from } => (*from..ids.len()).map(value).sum(),
            Weighed::Text { text, from } => {
                let (tokens, offsets) = (
                    lp.get("tokens").and_then(Value::as_array),
                    lp.get("text_offset").and_then(Value::as_array),
                );
                let (Some(tokens), Some(offsets)) = (tokens, offsets) else {
                    bail!("the reply's log-probabilities have no `tokens` and `text_offset` to find the option by")
                };
                let prompt_chars = text.chars().count();
                let mut sum = 0.0;
                for (i, (t, at)) in tokens.iter().zip(offsets).enumerate() {
                    let (at, len) = (
                        at.as_u64().context("a `text_offset` is not a whole number")? as usize,
                        t.as_str().map_or(0, |t| t.chars().count()),
                    );
                    if at < prompt_chars && at + len > *from {
                        sum += value(i)?;
                    }
                }
                Ok(sum)
            }
        }
    }
}

/// What [`RemotePolicy`]'s `logprobs_after` answers: each ask's options' log-probabilities, or
/// `None` where this policy's prompt cannot be echoed (chat without the tokenizer).
pub(crate) fn logprobs_after(p: &RemotePolicy, asks: &[NextOptions<'_>], end: bool) -> Result<Option<Vec<Vec<f64>>>> {
    let Some(weighed) = prompts(p, asks, end)? else {
        return Ok(None);
    };
    let sums = in_flight(p, &weighed)?;
    let mut sums = sums.into_iter();
    Ok(Some(
        asks.iter()
            .map(|a| sums.by_ref().take(a.options.len()).collect())
            .collect(),
    ))
}

/// Each ask's options, in order, as prompts to echo.
fn prompts(p: &RemotePolicy, asks: &[NextOptions<'_>], end: bool) -> Result<Option<Vec<Weighed>>> {
    let mut out = Vec::new();
    for a in asks {
        match (p.tokenizer, p.prompt) {
            (Some(tok), layout) => {
                let context = layout.ids(tok, &p.separator, a.question, a.prefix)?;
                let end = match end {
                    true => Some(
                        tok.eos_id()
                            .context("the tokenizer has no end-of-text token to end an option with")?,
                    ),
                    false => None,
                };
                for o in a.options {
                    let option = tok.encode(o, false)?;
                    anyhow::ensure!(!option.is_empty(), "option `{o}` has no tokens");
                    let ids: Vec<u32> = context.iter().chain(&option).chain(&end).copied().collect();
                    out.push(Weighed::Ids {
                        ids,
                        from: context.len(),
                    });
                }
            }
            (None, Prompt::Text) => {
                if end {
                    bail!("weighing options that end the text needs the served model's tokenizer (--server-tokenizer; in Python, server_tokenizer=): the end of text cannot be sent as text");
                }
                let mut context = format!("{}{}", a.question, p.separator);
                for s in a.prefix {
                    context.push_str(s);
                    context.push_str(&p.separator);
                }
                let from = context.chars().count();
                for o in a.options {
                    out.push(Weighed::Text {
                        text: format!("{context}{o}"),
                        from,
                    });
                }
            }
            (None, Prompt::Chat) => return Ok(None),
            (None, Prompt::Pieces) => {
                bail!("the pieces prompt layout is built from token ids: pass the policy's tokenizer (--server-tokenizer)")
            }
        }
    }
    Ok(Some(out))
}

/// Every prompt's option log-probability, in order: one request each, at most as many in
/// flight as the client allows ([`stepwise_core::parallel::in_order`]); the first failure, in
/// order, stops the rest and is the answer.
fn in_flight(p: &RemotePolicy, weighed: &[Weighed]) -> Result<Vec<f64>> {
    let threads = p.client.concurrency().min(16);
    let ask = |w: &Weighed| -> Result<f64> {
        // One generated token: vLLM refuses `max_tokens: 0`; its log-probability is not read.
        let body = json!({
            "model": p.client.config().model, "prompt": w.prompt(), "max_tokens": 1,
            "temperature": 0.0, "echo": true, "logprobs": 1, "seed": 0,
        });
        w.sum(&p.client.post("/completions", &body)?)
    };
    let mut sums = Vec::with_capacity(weighed.len());
    stepwise_core::parallel::in_order(weighed, threads, ask, |_, r| {
        sums.push(r?);
        Ok(())
    })
    .context("weighing options by the served model's echoed log-probabilities")?;
    Ok(sums)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_option_sums_its_own_tokens_only() {
        let reply = json!({"choices": [{"logprobs": {
            "tokens": ["q", "|", " ye", "s", "!"],
            "token_logprobs": [null, -1.0, -0.5, -0.25, -9.0],
            "text_offset": [0, 1, 2, 5, 6],
        }}]});
        let ids = Weighed::Ids {
            ids: vec![1, 2, 3, 4],
            from: 2,
        };
        assert_eq!(ids.sum(&reply).unwrap(), -0.75);
        // "q|" then the option " yes": the generated "!" (after the prompt) is not counted.
        let text = Weighed::Text {
            text: "q| yes".into(),
            from: 2,
        };
        assert_eq!(text.sum(&reply).unwrap(), -0.75);
        let straddling = Weighed::Text {
            text: "q| yes".into(),
            from: 3,
        };
        assert_eq!(
            straddling.sum(&reply).unwrap(),
            -0.75,
            "a token across the prompt's end counts"
        );
        let short = json!({"choices": [{"logprobs": {"token_logprobs": [null, -1.0]}}]});
        let err = format!("{:#}", ids.sum(&short).unwrap_err());
        assert!(err.contains("does not echo"), "{err}");
        let none = json!({"choices": [{"text": "x", "logprobs": null}]});
        assert!(format!("{:#}", ids.sum(&none).unwrap_err()).contains("echo"));
    }
}
