//! Streamed replies (`"stream": true`) of `/v1/completions` and `/v1/chat/completions`, as
//! server-sent events in OpenAI's chunk shapes. A stream sends each continuation's text as it is
//! decoded: the generation worker hands the request's new tokens over after every decoding step
//! ([`super::batcher::Progress`]), and the text they complete goes out at once, but for what
//! could still turn into a stop string (held back until it cannot) or is an unfinished
//! character. With `logprobs`, each chunk carries the log-probabilities of the tokens sampled
//! since the last (recorded as they were sampled), so a stream's chunks together hold the
//! unstreamed reply's. A completions request of several prompts streams them all at once, each
//! choice's chunks as its tokens come; with `echo`, each choice's first chunk is its prompt's
//! text (and the prompt's log-probabilities, weighed by the log-probability worker meanwhile).
//! Only a stream of at most one token a continuation is sent whole at the end.

use super::batcher::{Generated, Update};
use super::choices::{choice, ended, stopped, submit, weigh_prompt, Choice};
use super::completions::{Prompt, Sampling};
use super::logprobs::{chars, chat_logprobs, completion_logprobs, texts, Echoed, TokenLogprob};
use super::{unix_now, ApiError, Shared};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::FuturesUnordered;
use serde_json::{json, Value};
use std::convert::Infallible;
use stepwise_model::LoadedPolicy;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::{StreamExt, StreamMap};

/// Which endpoint's chunks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    Completion,
    Chat,
}

/// A stream's chunks: one reply's id, time and model in each.
pub(super) struct Chunks {
    id: String,
    created: u64,
    model: String,
    shape: Shape,
}

impl Chunks {
    pub(super) fn new(id: String, model: String, shape: Shape) -> Self {
        Chunks {
            id,
            created: unix_now(),
            model,
            shape,
        }
    }

    /// A chunk of `choices`.
    fn chunk(&self, choices: Value) -> Value {
        let object = match self.shape {
            Shape::Completion => "text_completion",
            Shape::Chat => "chat.completion.chunk",
        };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model, "choices": choices})
    }

    /// What opens choice `i` (chat: the assistant's role).
    pub(super) fn start(&self, i: usize) -> Option<Value> {
        (self.shape == Shape::Chat).then(|| {
            self.chunk(json!([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]))
        })
    }

    /// Choice `i`'s next `text`, with its tokens' `logprobs` object (or `null`).
    pub(super) fn text(&self, i: usize, text: &str, logprobs: Value) -> Value {
        match self.shape {
            Shape::Completion => {
                self.chunk(json!([{"index": i, "text": text, "logprobs": logprobs, "finish_reason": null}]))
            }
            Shape::Chat => self
                .chunk(json!([{"index": i, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": null}])),
        }
    }

    /// The `logprobs` object of `tokens` in this endpoint's shape (a completion's text offsets
    /// counted from `offset`, the characters of the tokens before them).
    pub(super) fn logprobs(&self, tokens: &[TokenLogprob], offset: usize) -> Value {
        match self.shape {
            Shape::Completion => completion_logprobs(None, tokens, offset),
            Shape::Chat => chat_logprobs(tokens),
        }
    }

    /// Choice `i`'s end.
    pub(super) fn finish(&self, i: usize, c: &Choice) -> Value {
        let end = match self.shape {
            Shape::Completion => json!({"index": i, "text": ""}),
            Shape::Chat => json!({"index": i, "delta": {}}),
        };
        let mut end = end;
        end["logprobs"] = Value::Null;
        end["finish_reason"] = json!(c.finish_reason);
        end["stop_reason"] = c.stop_reason.clone();
        self.chunk(json!([end]))
    }

    /// The usage chunk (`stream_options.include_usage`).
    pub(super) fn usage(&self, prompt: usize, completion: usize) -> Value {
        let mut c = self.chunk(json!([]));
        c["usage"] = super::completions::usage(prompt, completion);
        c
    }
}

/// Whether a request's stream is sent as it is decoded (else whole at the end: a one-token
/// continuation, sampled from the pass that weighs its prompt, or none).
pub(super) fn live(sampling: &Sampling) -> bool {
    sampling.stream && sampling.max_tokens >= 2
}

/// How much of `text` (a continuation's text so far) can be sent: none of a stop string (the
/// reply's text ends before it) nor of what could still become one, and no character whose
/// bytes are not all there yet (decoded as U+FFFD at the end; one in the middle stays, its bytes
/// completed by no token).
fn sendable(text: &str, stops: &[String]) -> usize {
    let mut safe = text.trim_end_matches('\u{FFFD}').len();
    for st in stops {
        let could_begin = (1..st.len())
            .rev()
            .filter_map(|k| st.get(..k))
            .find(|start| text.ends_with(start))
            .map_or(0, str::len);
        safe = safe.min(text.find(st.as_str()).unwrap_or(text.len() - could_begin));
    }
    while !text.is_char_boundary(safe) {
        safe -= 1;
    }
    safe
}

/// One continuation of a live stream: its tokens so far and the text sent, and with
/// `logprobs` its tokens' log-probabilities so far and how many were sent.
#[derive(Default)]
struct Continuation {
    tokens: Vec<u32>,
    sent: String,
    weighed: Vec<TokenLogprob>,
    weighed_sent: usize,
    /// The characters of the sent tokens' texts (where the next token's text starts).
    offset: usize,
    /// Set once its text so far no longer starts with what was sent (a tokenizer whose
    /// decoding of a prefix changes later): the rest goes out at the end.
    unsteady: bool,
}

impl Continuation {
    /// The text its tokens complete that was not sent yet, held back where a stop string could
    /// still begin (stop strings are cut from the text) or a character is unfinished.
    fn advance(&mut self, p: &LoadedPolicy, stops: &[String]) -> Option<String> {
        if self.unsteady {
            return None;
        }
        let body = &self.tokens[..self.tokens.len() - usize::from(ended(p, &self.tokens))];
        let text = p.tokenizer.decode(body).ok()?;
        let safe = sendable(&text, stops);
        if !text.starts_with(&self.sent) {
            self.unsteady = true;
            return None;
        }
        let new = text.get(self.sent.len()..safe).filter(|t| !t.is_empty())?.to_string();
        self.sent.push_str(&new);
        Some(new)
    }

    /// The `logprobs` object of the tokens not sent yet of `finished` (the finished choice's),
    /// or of those so far, marked sent; `null` without `logprobs`.
    fn take_logprobs(&mut self, chunks: &Chunks, asked: bool, finished: Option<&[TokenLogprob]>) -> Value {
        if !asked {
            return Value::Null;
        }
        let all = finished.unwrap_or(&self.weighed);
        let new = &all[self.weighed_sent.min(all.len())..];
        let v = chunks.logprobs(new, self.offset);
        self.offset += chars(new);
        self.weighed_sent = all.len();
        v
    }

    /// What the finished choice `c` has past the text sent.
    fn rest<'c>(&self, c: &'c Choice) -> &'c str {
        c.text.strip_prefix(self.sent.as_str()).unwrap_or_else(|| {
            eprintln!("stepwise serve: a stream's text changed after it was sent; its end is left out");
            ""
        })
    }
}

/// A prompt of a live stream in decoding: where its new tokens come after each step, and where
/// its continuations will at the end.
type InFlight = (Updates, Answer);

/// The streamed reply to `prompts` (each already fitted to the context; several for a
/// completions request of a list of prompts), sent as it is decoded: every prompt's
/// continuations decoded side by side in the running batch, prompt `k`'s choice `j` being the
/// reply's choice `k * n + j`.
pub(super) fn stream(s: &Shared, prompts: Vec<Prompt>, chunks: Chunks) -> Result<Response, ApiError> {
    let mut in_flight = Vec::with_capacity(prompts.len());
    let mut prompts = prompts;
    for prompt in &mut prompts {
        super::choices::set_stop_tokens(s, &mut prompt.sampling);
        // The text goes out as it is decoded, not in pieces cut at the end.
        prompt.sampling.stream = false;
        let (progress, updates) = mpsc::unbounded_channel();
        // Should a later prompt be refused, the earlier ones' answers are dropped: cancelled.
        let answer = submit(s, &prompt.ids, &prompt.sampling, Some(progress))?;
        in_flight.push((updates, answer));
    }
    // A slow reader holds the task back, not the worker: its tokens wait in `updates`.
    let (events, out) = mpsc::channel::<Value>(64);
    let state = s.clone();
    tokio::spawn(async move {
        match send_as_decoded(&state, &chunks, &prompts, in_flight, &events).await {
            Ok((prompt, generated)) => state.metrics.tokens(prompt, generated),
            Err(e) => {
                let error = json!({"error": {"message": e.message, "type": e.kind, "code": e.status.as_u16()}});
                let _ = events.send(error).await;
            }
        }
    });
    let events = tokio_stream::wrappers::ReceiverStream::new(out)
        .map(|c| Ok::<_, Infallible>(Event::default().data(c.to_string())))
        .chain(tokio_stream::once(Ok(Event::default().data("[DONE]"))));
    Ok(Sse::new(events).keep_alive(KeepAlive::default()).into_response())
}

/// The client of a stream went away (its events have no reader).
fn client_gone() -> ApiError {
    ApiError::internal(anyhow::anyhow!("the client went away"))
}

fn gone(_: mpsc::error::SendError<Value>) -> ApiError {
    client_gone()
}

/// A streamed request's new tokens after each step, and its continuations at the end.
type Updates = mpsc::UnboundedReceiver<Vec<Update>>;
type Answer = tokio::sync::oneshot::Receiver<anyhow::Result<Generated>>;

/// Sends each continuation's text to `events` as its prompt's updates bring its tokens (after
/// the prompt's text, with `echo`), then a prompt's continuations' ends as soon as its answer
/// brings them whole, and the usage after the last; the prompts' tokens and those generated.
/// Returns early, sending nothing more, when the client has gone (`events` closed: dropping the
/// answers cancels the prompts in the worker).
async fn send_as_decoded(
    s: &Shared,
    chunks: &Chunks,
    prompts: &[Prompt],
    in_flight: Vec<InFlight>,
    events: &mpsc::Sender<Value>,
) -> Result<(usize, usize), ApiError> {
    let (_, p) = s.policy.as_ref().expect("checked");
    let first = &prompts[0].sampling;
    let (n, asked, include_usage) = (first.n, first.logprobs.is_some(), first.include_usage);
    let mut each: Vec<Continuation> = (0..n * prompts.len()).map(|_| Continuation::default()).collect();
    for i in 0..each.len() {
        if let Some(c) = chunks.start(i) {
            events.send(c).await.map_err(gone)?;
        }
    }
    send_echoes(s, chunks, prompts, &mut each, events).await?;
    let mut updates = StreamMap::new();
    let mut answers = FuturesUnordered::new();
    for (k, (u, answer)) in in_flight.into_iter().enumerate() {
        updates.insert(k, UnboundedReceiverStream::new(u));
        answers.push(async move { (k, answer.await) });
    }
    let mut generated = 0;
    while !answers.is_empty() {
        tokio::select! {
            biased;
            () = events.closed() => return Err(client_gone()),
            Some((k, update)) = updates.next() => {
                for Update { choice: j, tokens, logprobs } in update {
                    let Some(c) = each.get_mut(k * n + j).filter(|_| j < n) else { continue };
                    c.tokens.extend(tokens);
                    c.weighed.extend(texts(p, logprobs).map_err(ApiError::internal)?);
                    if let Some(text) = c.advance(p, &prompts[k].sampling.stop) {
                        let logprobs = c.take_logprobs(chunks, asked, None);
                        events.send(chunks.text(k * n + j, &text, logprobs)).await.map_err(gone)?;
                    }
                }
            }
            Some((k, outs)) = answers.next() => {
                // What it brought after its answer is in the answer.
                updates.remove(&k);
                let outs = outs.map_err(|_| stopped())?.map_err(ApiError::internal)?;
                let ends = (&prompts[k].sampling, &mut each[k * n..(k + 1) * n], k * n);
                generated += send_ends(p, chunks, ends, outs, events).await?;
            }
        }
    }
    let prompt_len = prompts.iter().map(|pr| pr.ids.len()).sum();
    if include_usage {
        events.send(chunks.usage(prompt_len, generated)).await.map_err(gone)?;
    }
    Ok((prompt_len, generated))
}

/// With `echo`, the first chunk of each prompt's continuations: its text, and with `logprobs`
/// its tokens' log-probabilities (weighed by the log-probability worker while decoding goes on:
/// the tokens sampled meanwhile wait in their channels).
async fn send_echoes(
    s: &Shared,
    chunks: &Chunks,
    prompts: &[Prompt],
    each: &mut [Continuation],
    events: &mpsc::Sender<Value>,
) -> Result<(), ApiError> {
    if prompts.iter().all(|pr| pr.echo.is_none()) {
        return Ok(());
    }
    let (_, p) = s.policy.as_ref().expect("checked");
    let weighing = prompts.iter().map(|pr| weigh_prompt(s, &pr.ids, &pr.sampling));
    let weighed = tokio::select! {
        biased;
        () = events.closed() => return Err(client_gone()),
        weighed = futures_util::future::try_join_all(weighing) => weighed?,
    };
    let n = each.len() / prompts.len();
    for (k, (prompt, weighed)) in prompts.iter().zip(weighed).enumerate() {
        let Some(text) = &prompt.echo else { continue };
        let echoed = weighed
            .map(|w| Echoed::of(p, &prompt.ids, w))
            .transpose()
            .map_err(ApiError::internal)?;
        let logprobs = echoed
            .as_ref()
            .map_or(Value::Null, |e| completion_logprobs(Some(e), &[], 0));
        // The generated tokens' text offsets run on after the prompt's.
        let offset = echoed.as_ref().map_or(0, Echoed::chars);
        for (j, c) in each[k * n..(k + 1) * n].iter_mut().enumerate() {
            c.offset = offset;
            events
                .send(chunks.text(k * n + j, text, logprobs.clone()))
                .await
                .map_err(gone)?;
        }
    }
    Ok(())
}

/// The end of each of a prompt's continuations `each` (the reply's choices from `base`), now
/// that `outs` brings them whole: what was not sent of its text and log-probabilities, then its
/// finish reason; the tokens generated.
async fn send_ends(
    p: &LoadedPolicy,
    chunks: &Chunks,
    (sampling, each, base): (&Sampling, &mut [Continuation], usize),
    outs: Generated,
    events: &mpsc::Sender<Value>,
) -> Result<usize, ApiError> {
    let asked = sampling.logprobs.is_some();
    let mut generated = 0;
    let outs = outs
        .tokens
        .into_iter()
        .zip(outs.logprobs.into_iter().map(|l| asked.then_some(l)));
    for (j, ((out, weighed), c)) in outs.zip(each).enumerate() {
        let done = choice(p, out, sampling, weighed).map_err(ApiError::internal)?;
        generated += done.generated;
        let rest = c.rest(&done).to_string();
        let unsent = asked && c.weighed_sent < done.tokens.len();
        let logprobs = c.take_logprobs(chunks, asked, Some(&done.tokens));
        if !rest.is_empty() || unsent {
            events
                .send(chunks.text(base + j, &rest, logprobs))
                .await
                .map_err(gone)?;
        }
        events.send(chunks.finish(base + j, &done)).await.map_err(gone)?;
    }
    Ok(generated)
}

#[cfg(test)]
mod tests {
    use super::sendable;

    #[test]
    fn text_is_held_back_where_a_stop_string_could_begin_or_a_character_is_unfinished() {
        let stops = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(sendable("hello wor", &stops(&["world"])), "hello ".len());
        assert_eq!(sendable("hello world and more", &stops(&["world"])), "hello ".len());
        assert_eq!(sendable("hello", &stops(&["world", "\n\n"])), 5);
        assert_eq!(sendable("line\n", &stops(&["\n\n"])), 4);
        assert_eq!(sendable("abc\u{FFFD}", &[]), 3);
        assert_eq!(sendable("a\u{FFFD}b", &[]), "a\u{FFFD}b".len());
        assert_eq!(sendable("café", &stops(&["é!"])), "caf".len());
        assert_eq!(sendable("", &stops(&["x"])), 0);
    }
}
