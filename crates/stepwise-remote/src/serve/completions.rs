//! `/v1/completions` and `/v1/chat/completions` on the served policy, in the request and reply
//! shapes of OpenAI's API (and vLLM's extensions: `stop_reason`, `continue_final_message`,
//! token-id prompts), streaming as server-sent events when asked.

use super::choices::{run, Choice};
use super::logprobs::{chat_logprobs, completion_logprobs, Echoed};
use super::request::{flag, model_field, number, refuse_unsupported, whole};
use super::streaming::{self, live, Chunks, Shape};
use super::{off_async, unix_now, ApiError, Shared};
use anyhow::Result;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::convert::Infallible;
use stepwise_model::tokenizer::Message;
use stepwise_model::SamplingParams;

/// Sampling settings read from a request.
#[derive(Clone)]
pub(super) struct Sampling {
    pub(super) n: usize,
    pub(super) max_tokens: usize,
    /// Whether the request set `max_tokens`: a default is cut to what the context has left.
    pub(super) max_tokens_given: bool,
    pub(super) params: SamplingParams,
    /// The served adapter the request names (`None`: the policy itself).
    pub(super) adapter: Option<ServedAdapter>,
    /// The model's name as the request gave it (the policy's, or an adapter's).
    pub(super) model: String,
    pub(super) stop: Vec<String>,
    /// Log-probabilities of the sampled tokens, and of this many alternatives.
    pub(super) logprobs: Option<usize>,
    pub(super) stream: bool,
    /// A streamed reply ends with a chunk holding the usage (`stream_options.include_usage`).
    pub(super) include_usage: bool,
    /// The prompt's text leads each completion's text (`echo`).
    pub(super) echo: bool,
    /// vLLM's `ignore_eos`: generate `max_tokens` whatever the model says (benchmarks).
    pub(super) ignore_eos: bool,
}

/// A served adapter a request runs with: its index, held until the last of the request's work is
/// done (the batcher's or the weigher's, which may outlive the request's handler), so an unload
/// meanwhile cannot let the index go.
#[derive(Clone, Debug)]
pub(crate) struct ServedAdapter {
    pub(crate) index: usize,
    _lease: std::sync::Arc<stepwise_model::AdapterLease>,
}

/// The index of `adapter`, if any.
pub(crate) fn index_of(adapter: &Option<ServedAdapter>) -> Option<usize> {
    adapter.as_ref().map(|a| a.index)
}

/// The request's model: the served policy (`None`), or one of the adapters served on it
/// (`--lora-modules`, `/v1/load_lora_adapter`); with the name the reply gives.
fn check_model(s: &Shared, v: &Value) -> Result<(Option<ServedAdapter>, String), ApiError> {
    let Some((name, policy)) = s.policy.as_ref() else {
        return Err(ApiError::invalid(
            "this server has no policy (start it with --model)",
            Some("model"),
        ));
    };
    match model_field(v)? {
        None => Ok((None, name.clone())),
        Some(m) if m == name => Ok((None, name.clone())),
        Some(m) => match policy.model.lease_adapter(m) {
            Some((index, lease)) => Ok((
                Some(ServedAdapter {
                    index,
                    _lease: std::sync::Arc::new(lease),
                }),
                m.to_string(),
            )),
            None => {
                let adapters = policy.model.adapters();
                let mut served = vec![name.as_str()];
                served.extend(adapters.iter().flat_map(|a| a.names()));
                Err(ApiError::no_model(m, &served))
            }
        },
    }
}

fn sampling(s: &Shared, v: &Value, chat: bool) -> Result<Sampling, ApiError> {
    let (adapter, model) = check_model(s, v)?;
    refuse_unsupported(v)?;
    let n = whole(v, "n", 1, 1, s.max_n)?;
    if v.get("best_of")
        .is_some_and(|b| !b.is_null() && b.as_f64() != Some(n as f64))
    {
        return Err(ApiError::invalid(
            "`best_of` other than `n` is not supported: ask for `n` and pick with a verifier",
            Some("best_of"),
        ));
    }
    let max_key = if chat && v.get("max_completion_tokens").is_some() {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    // OpenAI's completions default to 16 tokens; chat, or an explicit `null` (vLLM's reading),
    // to what the context leaves.
    let default_max = if chat || v.get(max_key).is_some_and(Value::is_null) {
        s.max_tokens
    } else {
        16
    };
    // `max_tokens: 0` with `echo` generates nothing: the prompt's own log-probabilities alone
    // (OpenAI's legacy completions, lm-evaluation-harness's loglikelihood requests).
    let echo = !chat && flag(v, "echo", false)?;
    let max_tokens = whole(v, max_key, default_max, usize::from(!echo), s.max_tokens)?;
    let max_tokens_given = v.get(max_key).is_some_and(|x| !x.is_null());
    let temperature = number(v, "temperature", 1.0, 0.0, 2.0)?;
    let top_p = number(v, "top_p", 1.0, 1e-6, 1.0)?;
    // vLLM's `top_k`: -1 (or 0) keeps every token.
    let top_k = match v.get("top_k") {
        Some(x) if x.as_i64() == Some(-1) => 0,
        _ => whole(v, "top_k", 0, 0, u32::MAX as usize)?,
    };
    let seed = seed_field(v)?;
    let stop = stop_field(v)?;
    let logprobs = if chat {
        flag(v, "logprobs", false)?
            .then(|| whole(v, "top_logprobs", 0, 0, 20))
            .transpose()?
    } else {
        match v.get("logprobs") {
            None | Some(Value::Null) => None,
            Some(_) => Some(whole(v, "logprobs", 0, 0, 20)?),
        }
    };
    let stream = flag(v, "stream", false)?;
    let include_usage = include_usage_field(v, stream)?;
    Ok(Sampling {
        n,
        max_tokens,
        max_tokens_given,
        params: SamplingParams {
            temperature: temperature as f32,
            top_p: top_p as f32,
            top_k,
            max_new_tokens: max_tokens,
            seed,
            stop_token_ids: Vec::new(),
            stop_strings: stop.clone(),
            logprobs,
        },
        adapter,
        model,
        stop,
        logprobs,
        stream,
        include_usage,
        echo,
        ignore_eos: flag(v, "ignore_eos", false)?,
    })
}

/// `seed`: an integer (negative ones as their two's complement), or a random one when absent.
fn seed_field(v: &Value) -> Result<u64, ApiError> {
    Ok(match v.get("seed") {
        None | Some(Value::Null) => rand::random::<u64>(),
        Some(x) => x
            .as_i64()
            .map(|i| i as u64)
            .or_else(|| x.as_u64())
            .ok_or_else(|| ApiError::invalid("`seed` must be an integer", Some("seed")))?,
    })
}

/// `stop`: a string or a list of non-empty strings.
fn stop_field(v: &Value) -> Result<Vec<String>, ApiError> {
    let stop: Vec<String> = match v.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| ApiError::invalid("`stop` must be a string or a list of strings", Some("stop")))?,
        Some(_) => {
            return Err(ApiError::invalid(
                "`stop` must be a string or a list of strings",
                Some("stop"),
            ))
        }
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid("`stop` strings must not be empty", Some("stop")));
    }
    Ok(stop)
}

/// `stream_options.include_usage`, allowed only when streaming.
fn include_usage_field(v: &Value, stream: bool) -> Result<bool, ApiError> {
    Ok(match v.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) if stream => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ApiError::invalid(
                    "`stream_options.include_usage` must be true or false",
                    Some("stream_options"),
                ))
            }
        },
        Some(Value::Object(_)) => {
            return Err(ApiError::invalid(
                "`stream_options` is only allowed when `stream` is true",
                Some("stream_options"),
            ))
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "`stream_options` must be an object",
                Some("stream_options"),
            ))
        }
    })
}

/// The prompt's token ids and, when it was text, the text: a string (tokenized with the
/// tokenizer's special tokens, as vLLM does; one too long for the context is refused before
/// tokenizing), a list of token ids, or a list holding one of those. Tokenizes, so runs off the
/// async threads.
fn prompt_ids(s: &Shared, prompt: Option<Value>) -> Result<(Vec<u32>, Option<String>), ApiError> {
    let (_, p) = s.policy.as_ref().expect("checked");
    let vocab = p.model.config.vocab_size as u64;
    let prompt = match prompt {
        Some(Value::Array(mut a)) if a.len() == 1 && !a[0].is_number() => a.remove(0),
        Some(x) => x,
        None => return Err(ApiError::invalid("`prompt` is missing", Some("prompt"))),
    };
    match prompt {
        Value::String(text) => {
            let limit = p.model.config.max_position_embeddings;
            let ids = super::encode_within(&p.tokenizer, &text, true, limit, "prompt")?;
            Ok((ids, Some(text)))
        }
        Value::Array(ids) => ids
            .iter()
            .map(|x| x.as_u64().filter(|&i| i < vocab).map(|i| i as u32))
            .collect::<Option<Vec<u32>>>()
            .map(|ids| (ids, None))
            .ok_or_else(|| {
                ApiError::invalid(
                    format!("`prompt` token ids must be integers below {vocab}"),
                    Some("prompt"),
                )
            }),
        _ => Err(ApiError::invalid(
            "`prompt` must be a string, a list of token ids, or a list of those",
            Some("prompt"),
        )),
    }
}

/// Fit the continuation to the context: a default `max_tokens` is cut to what the prompt leaves
/// (as vLLM's is); a prompt that leaves nothing, or an explicit `max_tokens` past the context, is
/// refused.
fn fit_length(s: &Shared, prompt: usize, sampling: &mut Sampling) -> Result<(), ApiError> {
    let (_, p) = s.policy.as_ref().expect("checked");
    let limit = p.model.config.max_position_embeddings;
    if prompt == 0 {
        return Err(ApiError::invalid("the prompt is empty", Some("prompt")));
    }
    if !sampling.max_tokens_given && prompt < limit {
        sampling.max_tokens = sampling.max_tokens.min(limit - prompt);
        sampling.params.max_new_tokens = sampling.max_tokens;
    }
    let max_tokens = sampling.max_tokens;
    if prompt + max_tokens > limit {
        return Err(ApiError::invalid(
            format!(
                "This model's maximum context length is {limit} tokens. However, you requested {} tokens ({prompt} in the prompt, {max_tokens} for the completion). Please reduce the length of the prompt or the completion.",
                prompt + max_tokens
            ),
            Some("prompt"),
        ));
    }
    Ok(())
}

pub(super) fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

fn request_id(prefix: &str) -> String {
    format!("{prefix}-{:016x}", rand::random::<u64>())
}

/// A request's prompts: `prompt` itself, or each of a list of prompts (strings, or lists of
/// token ids), as OpenAI's completions take them.
fn prompt_list(prompt: Option<Value>) -> Result<Vec<Value>, ApiError> {
    match prompt {
        Some(Value::Array(a)) if a.len() > 1 && a.iter().all(|x| x.is_string() || x.is_array()) => Ok(a),
        Some(Value::Array(a)) if a.is_empty() => Err(ApiError::invalid("`prompt` is an empty list", Some("prompt"))),
        Some(x) => Ok(vec![x]),
        None => Err(ApiError::invalid("`prompt` is missing", Some("prompt"))),
    }
}

/// A request's prompt made ready: its token ids (fitted to the context), how its continuations
/// are sampled, and with `echo` its text (which leads each of them).
pub(super) struct Prompt {
    pub(super) ids: Vec<u32>,
    pub(super) sampling: Sampling,
    pub(super) echo: Option<String>,
}

impl Prompt {
    /// `prompt` (a string, or token ids) tokenized off the async threads and fitted.
    async fn of(s: &Shared, prompt: Value, mut sampling: Sampling) -> Result<Self, ApiError> {
        let state = s.clone();
        let (ids, text) = off_async(move || prompt_ids(&state, Some(prompt))).await?;
        fit_length(s, ids.len(), &mut sampling)?;
        let echo = match (sampling.echo, text) {
            (false, _) => None,
            (true, Some(text)) => Some(text),
            (true, None) => {
                let (_, p) = s.policy.as_ref().expect("checked");
                Some(p.tokenizer.decode(&ids).map_err(ApiError::internal)?)
            }
        };
        Ok(Prompt { ids, sampling, echo })
    }
}

/// One prompt's choices (the prompt's text before each where `echo` asks), and with `echo` and
/// `logprobs` the prompt's own tokens with their log-probabilities; and its length in tokens.
async fn one_prompt(s: &Shared, prompt: Prompt) -> Result<(Vec<Choice>, Option<Echoed>, usize), ApiError> {
    let (mut choices, echoed_logprobs, prompt_len) = run(s, prompt.ids, prompt.sampling).await?;
    if let Some(echoed) = prompt.echo.filter(|e| !e.is_empty()) {
        for c in &mut choices {
            c.text.insert_str(0, &echoed);
            c.pieces.insert(0, echoed.clone());
        }
    }
    Ok((choices, echoed_logprobs, prompt_len))
}

/// `POST /v1/completions`: one prompt, or a list of them, each prompt's `n` choices after the
/// previous prompt's (choice `i * n + j`), their continuations decoded side by side in the
/// running batch; at most `--max-n` continuations in all.
pub(crate) async fn completions(State(s): State<Shared>, body: Bytes) -> Result<Response, ApiError> {
    let mut v = super::request::parse_body(&body)?;
    drop(body);
    let sampling = sampling(&s, &v, false)?;
    let prompts = prompt_list(v.get_mut("prompt").map(Value::take))?;
    if prompts.len() * sampling.n > s.max_n {
        return Err(ApiError::invalid(
            format!(
                "{} prompts of `n` = {} continuations each is more than this server's {} continuations a request",
                prompts.len(),
                sampling.n,
                s.max_n
            ),
            Some("prompt"),
        ));
    }
    let each = prompts.into_iter().map(|p| Prompt::of(&s, p, sampling.clone()));
    let prompts = futures_util::future::try_join_all(each).await?;
    if live(&sampling) {
        let chunks = Chunks::new(request_id("cmpl"), sampling.model.clone(), Shape::Completion);
        return streaming::stream(&s, prompts, chunks);
    }
    let (stream, logprobs, include_usage) = (sampling.stream, sampling.logprobs, sampling.include_usage);
    let answered = futures_util::future::try_join_all(prompts.into_iter().map(|p| one_prompt(&s, p))).await?;
    let prompt_len: usize = answered.iter().map(|(_, _, len)| len).sum();
    let choices: Vec<(&Choice, Option<&Echoed>)> = answered
        .iter()
        .flat_map(|(cs, echoed, _)| cs.iter().map(move |c| (c, echoed.as_ref())))
        .collect();
    let generated: usize = choices.iter().map(|(c, _)| c.generated).sum();
    let model = sampling.model.clone();
    let (id, created) = (request_id("cmpl"), unix_now());
    if stream {
        let chunks = Chunks::new(id, model, Shape::Completion);
        let all: Vec<(&Choice, Value)> = choices
            .iter()
            .map(|(c, echoed)| {
                (
                    *c,
                    logprobs.map_or(Value::Null, |_| completion_logprobs(*echoed, &c.tokens, 0)),
                )
            })
            .collect();
        return Ok(sse(&chunks, &all, include_usage.then_some(prompt_len)));
    }
    let body = json!({
        "id": id, "object": "text_completion", "created": created, "model": model,
        "choices": choices.iter().enumerate().map(|(i, (c, echoed))| json!({
            "index": i, "text": c.text,
            "logprobs": logprobs.map(|_| completion_logprobs(*echoed, &c.tokens, 0)),
            "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
        })).collect::<Vec<_>>(),
        "usage": usage(prompt_len, generated),
    });
    Ok(Json(body).into_response())
}

/// A message's text: a string, or the text parts of a list of content parts.
fn content_text(m: &Value) -> Result<String, ApiError> {
    match m.get("content") {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => Ok(parts
            .iter()
            .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect()),
        Some(Value::Null) | None => Ok(String::new()),
        Some(_) => Err(ApiError::invalid(
            "a message's `content` must be text",
            Some("messages"),
        )),
    }
}

/// A chat request's conversation: its `messages`, and vLLM's `continue_final_message` (the last,
/// assistant, message continued in place) and `add_generation_prompt`.
pub(super) struct Conversation {
    msgs: Vec<Message>,
    continue_last: bool,
    add_generation_prompt: bool,
}

impl Conversation {
    /// The conversation of request `v`.
    pub(super) fn of(v: &Value) -> Result<Self, ApiError> {
        let messages = v
            .get("messages")
            .and_then(Value::as_array)
            .filter(|m| !m.is_empty())
            .ok_or_else(|| ApiError::invalid("`messages` must be a non-empty list", Some("messages")))?;
        let mut msgs = Vec::with_capacity(messages.len());
        for m in messages {
            let role = m
                .get("role")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::invalid("every message needs a `role`", Some("messages")))?;
            msgs.push(Message::new(role, &content_text(m)?));
        }
        let continue_last = flag(v, "continue_final_message", false)?;
        if continue_last && msgs.last().is_some_and(|m| m.role != "assistant") {
            return Err(ApiError::invalid(
                "`continue_final_message` needs an assistant message last",
                Some("messages"),
            ));
        }
        Ok(Conversation {
            msgs,
            continue_last,
            add_generation_prompt: flag(v, "add_generation_prompt", true)?,
        })
    }

    /// The text `tok`'s chat template makes of it (runs the template: off the async threads).
    pub(super) fn render(mut self, tok: &stepwise_model::Tokenizer) -> Result<String, ApiError> {
        let template = |msgs: &[Message], add: bool| {
            tok.apply_chat_template(msgs, add)
                .map_err(|e| ApiError::invalid(format!("{e:#}"), Some("messages")))
        };
        if self.continue_last {
            let last = self.msgs.pop().expect("non-empty");
            Ok(format!("{}{}", template(&self.msgs, true)?, last.content))
        } else {
            template(&self.msgs, self.add_generation_prompt)
        }
    }
}

/// `POST /v1/chat/completions`.
pub(crate) async fn chat(State(s): State<Shared>, body: Bytes) -> Result<Response, ApiError> {
    let v = super::request::parse_body(&body)?;
    let mut sampling = sampling(&s, &v, true)?;
    let conversation = Conversation::of(&v)?;
    // The template and the tokenizer run off the async threads.
    let state = s.clone();
    let ids = off_async(move || {
        let (_, p) = state.policy.as_ref().expect("checked");
        let text = conversation.render(&p.tokenizer)?;
        super::encode_within(
            &p.tokenizer,
            &text,
            false,
            p.model.config.max_position_embeddings,
            "messages",
        )
    })
    .await?;
    fit_length(&s, ids.len(), &mut sampling)?;
    let model = sampling.model.clone();
    let id = request_id("chatcmpl");
    if live(&sampling) {
        let prompt = Prompt {
            ids,
            sampling,
            echo: None,
        };
        return streaming::stream(&s, vec![prompt], Chunks::new(id, model, Shape::Chat));
    }
    let (stream, logprobs, include_usage) = (sampling.stream, sampling.logprobs, sampling.include_usage);
    let (choices, _, prompt_len) = run(&s, ids, sampling).await?;
    let created = unix_now();
    if stream {
        let chunks = Chunks::new(id, model, Shape::Chat);
        let all: Vec<(&Choice, Value)> = choices
            .iter()
            .map(|c| (c, logprobs.map_or(Value::Null, |_| chat_logprobs(&c.tokens))))
            .collect();
        return Ok(sse(&chunks, &all, include_usage.then_some(prompt_len)));
    }
    let logprobs_of = |c: &Choice| logprobs.map(|_| chat_logprobs(&c.tokens));
    let body = json!({
        "id": id, "object": "chat.completion", "created": created, "model": model,
        "choices": choices.iter().enumerate().map(|(i, c)| json!({
            "index": i, "message": {"role": "assistant", "content": c.text}, "logprobs": logprobs_of(c),
            "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
        })).collect::<Vec<_>>(),
        "usage": usage(prompt_len, choices.iter().map(|c| c.generated).sum()),
    });
    Ok(Json(body).into_response())
}

/// A stream sent whole once decoding ends (of one token a continuation, or none:
/// [`super::streaming::live`]): each choice's pieces (its `logprobs` object, or `null`, with the
/// first) and end, the usage where `usage_of` gives the prompt's length, then `[DONE]`.
fn sse(chunks: &Chunks, choices: &[(&Choice, Value)], usage_of: Option<usize>) -> Response {
    let mut all = Vec::new();
    for (i, (c, logprobs)) in choices.iter().enumerate() {
        all.extend(chunks.start(i));
        let mut logprobs = Some(logprobs.clone()).filter(|l| !l.is_null());
        for t in &c.pieces {
            all.push(chunks.text(i, t, logprobs.take().unwrap_or(Value::Null)));
        }
        // A choice without text still sends its log-probabilities.
        if let Some(l) = logprobs {
            all.push(chunks.text(i, "", l));
        }
        all.push(chunks.finish(i, c));
    }
    if let Some(prompt_len) = usage_of {
        all.push(chunks.usage(prompt_len, choices.iter().map(|(c, _)| c.generated).sum()));
    }
    let events = all
        .into_iter()
        .map(|c| Ok::<_, Infallible>(Event::default().data(c.to_string())))
        .chain(std::iter::once(Ok(Event::default().data("[DONE]"))));
    Sse::new(tokio_stream::iter(events)).into_response()
}
