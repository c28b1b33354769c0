//! A prompt's choices for `/v1/completions` and `/v1/chat/completions`: continuations decoded
//! by the generation worker ([`super::batcher`]) or, for one token, sampled from the
//! log-probability worker's pass ([`super::weigher`]), their tokens weighed where the request
//! asks, and each turned into a reply's choice (end token and stop strings cut off).

use super::batcher::{GenerateJob, Generated, Progress};
use super::completions::Sampling;
use super::logprobs::{texts, Echoed, TokenLogprob};
use super::weigher::{self, ToWeigh, Weighed};
use super::{off_async, ApiError, Shared};
use anyhow::Result;
use serde_json::{json, Value};

/// One finished continuation.
pub(super) struct Choice {
    pub(super) text: String,
    /// Each generated token's text, its log-probability and the best alternatives.
    pub(super) tokens: Vec<TokenLogprob>,
    pub(super) finish_reason: &'static str,
    pub(super) stop_reason: Value,
    pub(super) generated: usize,
    /// The text in the pieces a stream sends, one per token (empty unless streaming).
    pub(super) pieces: Vec<String>,
}

/// A prompt's continuations and, with `logprobs`, their tokens' log-probabilities (with `echo`,
/// the prompt's own too), and the prompt's length; the replies are built on a blocking thread.
pub(super) async fn run(
    s: &Shared,
    ids: Vec<u32>,
    mut sampling: Sampling,
) -> Result<(Vec<Choice>, Option<Echoed>, usize), ApiError> {
    set_stop_tokens(s, &mut sampling);
    let (outs, weighed) = match sampling.max_tokens {
        1 => one_token(s, &ids, &sampling).await?,
        _ => continuations(s, &ids, &sampling).await?,
    };
    let state = s.clone();
    let prompt_len = ids.len();
    let (choices, echoed) = tokio::task::spawn_blocking(move || -> Result<(Vec<Choice>, Option<Echoed>)> {
        let (_, p) = state.policy.as_ref().expect("checked");
        let echoed = weighed.prompt.map(|w| Echoed::of(p, &ids, w)).transpose()?;
        let choices = outs
            .into_iter()
            .zip(weighed.choices)
            .map(|(out, w)| choice(p, out, &sampling, w))
            .collect::<Result<_>>()?;
        Ok((choices, echoed))
    })
    .await
    .map_err(|e| ApiError::internal(anyhow::anyhow!("{e}")))?
    .map_err(ApiError::internal)?;
    let generated: usize = choices.iter().map(|c| c.generated).sum();
    s.metrics.tokens(prompt_len, generated);
    Ok((choices, echoed, prompt_len))
}

/// The policy's stop tokens end the continuations (unless `ignore_eos`).
pub(super) fn set_stop_tokens(s: &Shared, sampling: &mut Sampling) {
    let (_, p) = s.policy.as_ref().expect("checked");
    if !sampling.ignore_eos {
        sampling.params.stop_token_ids = p.stop_token_ids.clone();
    }
}

/// The weighed tokens of a prompt's choices: with `echo` and `logprobs`, the prompt's own (its
/// first token has none); with `logprobs`, each choice's generated tokens, the end token that
/// stopped it included (as vLLM and OpenAI list it, though the text leaves it out: a client
/// that reads a one-token reply's log-probabilities, as lm-evaluation-harness does, finds the
/// generated token last whatever it is).
struct Weighings {
    prompt: Option<Vec<Weighed>>,
    choices: Vec<Option<Vec<Weighed>>>,
}

/// The continuations of `ids` (none with `max_tokens: 0`) decoded by the generation worker in
/// its running batch ([`super::batcher`]), their tokens' log-probabilities where the request
/// asks read from the logits they were sampled from (as vLLM's sampler gives them: no second
/// pass); with `echo`, the prompt's own weighed by the log-probability worker, packed with every
/// other request in flight ([`super::weigher`]).
async fn continuations(s: &Shared, ids: &[u32], sampling: &Sampling) -> Result<(Vec<Vec<u32>>, Weighings), ApiError> {
    let generated = async {
        match sampling.max_tokens {
            0 => Ok(Generated {
                tokens: vec![Vec::new(); sampling.n],
                logprobs: vec![Vec::new(); sampling.n],
            }),
            _ => generate(s, ids, sampling).await,
        }
    };
    let (prompt, generated) = tokio::try_join!(weigh_prompt(s, ids, sampling), generated)?;
    let choices = generated
        .logprobs
        .into_iter()
        .map(|l| sampling.logprobs.map(|_| l))
        .collect();
    Ok((generated.tokens, Weighings { prompt, choices }))
}

/// With `echo` and `logprobs`, the prompt's tokens after the first weighed by the
/// log-probability worker, packed with every other request in flight ([`super::weigher`]).
pub(super) async fn weigh_prompt(
    s: &Shared,
    ids: &[u32],
    sampling: &Sampling,
) -> Result<Option<Vec<Weighed>>, ApiError> {
    let Some(k) = sampling.logprobs.filter(|_| sampling.echo) else {
        return Ok(None);
    };
    let prompt = ToWeigh {
        ids: ids.to_vec(),
        first: 0,
        next: false,
        adapter: sampling.adapter.clone(),
    };
    let mut w = weigher::weigh_all(s, vec![prompt], k)
        .await
        .map_err(ApiError::internal)?;
    Ok(Some(w.remove(0).tokens))
}

/// A one-token request's continuations, sampled from the last row of the pass that weighs the
/// prompt (the log-probability worker's, packed with every other request in flight) as the
/// decoding batch would sample them ([`stepwise_model::first_tokens`]): one pass, no trip
/// through the decoding batch. lm-evaluation-harness's and a served judge's loglikelihood
/// requests (`echo`, `logprobs`, `max_tokens: 1`) are all of this kind.
async fn one_token(s: &Shared, ids: &[u32], sampling: &Sampling) -> Result<(Vec<Vec<u32>>, Weighings), ApiError> {
    let echo = sampling.echo && sampling.logprobs.is_some();
    let seq = ToWeigh {
        ids: ids.to_vec(),
        first: if echo { 0 } else { ids.len().saturating_sub(1) },
        next: true,
        adapter: sampling.adapter.clone(),
    };
    let k = sampling.logprobs.unwrap_or(0);
    let mut w = weigher::weigh_all(s, vec![seq], k)
        .await
        .map_err(ApiError::internal)?
        .remove(0);
    let row = w
        .next
        .take()
        .ok_or_else(|| ApiError::internal(anyhow::anyhow!("the prompt's last row was not read")))?;
    let sampling = sampling.clone();
    off_async(move || {
        let outs: Vec<Vec<u32>> = stepwise_model::first_tokens(&row, &sampling.params, sampling.n)
            .into_iter()
            .map(|t| vec![t])
            .collect();
        let choices = outs
            .iter()
            .map(|out| {
                sampling
                    .logprobs
                    .map(|k| out.iter().map(|&t| stepwise_model::token_logprob(&row, t, k)).collect())
            })
            .collect();
        let prompt = echo.then_some(w.tokens);
        Ok((outs, Weighings { prompt, choices }))
    })
    .await
}

/// The continuations of `ids` (generated ids, stop token included, and their log-probabilities
/// where asked), decoded by the generation worker in its running batch.
async fn generate(s: &Shared, ids: &[u32], sampling: &Sampling) -> Result<Generated, ApiError> {
    let answer = submit(s, ids, sampling, None)?;
    answer.await.map_err(|_| stopped())?.map_err(ApiError::internal)
}

/// The generation worker is gone.
pub(super) fn stopped() -> ApiError {
    ApiError::internal(anyhow::anyhow!("the generation worker stopped"))
}

/// Hands `ids` to the generation worker: where its continuations will come, and with
/// `progress` where its new tokens go after each step.
pub(super) fn submit(
    s: &Shared,
    ids: &[u32],
    sampling: &Sampling,
    progress: Option<Progress>,
) -> Result<tokio::sync::oneshot::Receiver<Result<Generated>>, ApiError> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    s.generate_queue
        .lock()
        .map_err(|_| stopped())?
        .send(GenerateJob {
            prompt: ids.to_vec(),
            n: sampling.n,
            params: sampling.params.clone(),
            adapter: sampling.adapter.clone(),
            reply,
            progress,
        })
        .map_err(|_| stopped())?;
    Ok(answer)
}

/// Whether a generated sequence ends with a stop token.
pub(super) fn ended(p: &stepwise_model::LoadedPolicy, out: &[u32]) -> bool {
    out.last().is_some_and(|t| p.stop_token_ids.contains(t))
}

/// A generated sequence as a reply's choice: the end token left out of the text, a stop string
/// cut off (as OpenAI does) and named in `stop_reason` (as vLLM does); `weighed`, its tokens'
/// log-probabilities where the request asked for them.
pub(super) fn choice(
    p: &stepwise_model::LoadedPolicy,
    out: Vec<u32>,
    s: &Sampling,
    weighed: Option<Vec<Weighed>>,
) -> Result<Choice> {
    let generated = out.len();
    let ended = ended(p, &out);
    let body = &out[..out.len() - usize::from(ended)];
    let mut text = p.tokenizer.decode(body)?;
    let mut finish_reason = if ended { "stop" } else { "length" };
    let mut stop_reason = Value::Null;
    // The text ends before the first stop string in it (a token can carry text past it).
    let first_stop = s
        .stop
        .iter()
        .filter_map(|st| text.find(st.as_str()).map(|at| (at, st)))
        .min_by_key(|(at, _)| *at);
    if let Some((at, stop)) = first_stop {
        text.truncate(at);
        finish_reason = "stop";
        stop_reason = json!(stop);
    } else if !ended && generated < s.max_tokens {
        finish_reason = "stop";
    }
    let tokens = match weighed {
        Some(w) => texts(p, w)?,
        None => body
            .iter()
            .map(|&t| Ok((p.tokenizer.decode(&[t])?, 0.0, Vec::new())))
            .collect::<Result<_>>()?,
    };
    let pieces = if s.stream {
        stream_pieces(p, body, &text)?
    } else {
        Vec::new()
    };
    Ok(Choice {
        text,
        tokens,
        finish_reason,
        stop_reason,
        generated,
        pieces,
    })
}

/// `text` (a prefix of `body`'s decoding) cut where each token's text begins: decoded prefix by
/// prefix, so characters spread over several tokens arrive whole.
fn stream_pieces(p: &stepwise_model::LoadedPolicy, body: &[u32], text: &str) -> Result<Vec<String>> {
    let mut pieces = Vec::new();
    let mut sent = 0;
    for i in 1..=body.len() {
        let so_far = p.tokenizer.decode(&body[..i])?;
        let upto = so_far.len().min(text.len());
        if upto > sent && text.is_char_boundary(upto) && so_far.starts_with(&text[..upto]) {
            pieces.push(text[sent..upto].to_string());
            sent = upto;
        }
        if sent == text.len() {
            break;
        }
    }
    if sent < text.len() {
        pieces.push(text[sent..].to_string());
    }
    Ok(pieces)
}
