//! The generation worker: continuous batching of `/v1/completions` and `/v1/chat/completions`.
//!
//! Every request joins the running batch at the next decoding step, every step is one forward
//! pass over the rows of every request in flight, and a request is answered as soon as its own
//! continuations stop. A request's prompt is encoded on its own and its cache joined to the
//! batch's, or, when others are being decoded, fed through the running steps in chunks of at most
//! `prefill_chunk_tokens` tokens a step (chunked prefill, see [`stepwise_model::Decoding`]). One
//! request alone is decoded exactly as the local engine decodes it. A request whose client goes away
//! leaves the batch at the next step.

use super::completions::{index_of, ServedAdapter};
use super::Shared;
use anyhow::Result;
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, TryRecvError};
use stepwise_model::{Decoding, SamplingParams, TokenLogprob};
use tokio::sync::oneshot;

/// One generation request waiting for the worker.
pub(crate) struct GenerateJob {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Continuations wanted.
    pub n: usize,
    /// How to sample them.
    pub params: SamplingParams,
    /// The served adapter they are decoded with (`None`: the base model), held until they are
    /// done.
    pub adapter: Option<ServedAdapter>,
    /// Where the continuations go.
    pub reply: Reply,
    /// Where a streamed request's new tokens go after each step.
    pub progress: Option<Progress>,
}

/// A request's continuations: each one's generated ids (stop token included) and, where its
/// sampling asks ([`SamplingParams::logprobs`]), their log-probabilities as they were sampled
/// (else empty lists).
#[derive(Debug, Default)]
pub(crate) struct Generated {
    pub tokens: Vec<Vec<u32>>,
    pub logprobs: Vec<Vec<TokenLogprob>>,
}

/// Where a request's continuations go.
pub(crate) type Reply = oneshot::Sender<Result<Generated>>;

/// A streamed choice's tokens sampled since the last update, and their log-probabilities where
/// asked.
pub(crate) struct Update {
    pub choice: usize,
    pub tokens: Vec<u32>,
    pub logprobs: Vec<TokenLogprob>,
}

/// Where a streamed request's tokens go as they are sampled.
pub(crate) type Progress = tokio::sync::mpsc::UnboundedSender<Vec<Update>>;

/// A request in the batch: where its answer goes, its adapter held till then, and for a stream
/// where its tokens go and how many of each continuation's went.
struct InBatch {
    reply: Reply,
    _adapter: Option<ServedAdapter>,
    progress: Option<(Progress, Vec<usize>)>,
}

impl InBatch {
    /// Sends the tokens of `so_far` (the request's continuations) not sent yet, with their
    /// log-probabilities in `logprobs` (empty lists where not asked).
    fn send_new(&mut self, so_far: &[Vec<u32>], logprobs: &[Vec<TokenLogprob>]) {
        let Some((progress, sent)) = &mut self.progress else {
            return;
        };
        sent.resize(so_far.len(), 0);
        let new: Vec<Update> = so_far
            .iter()
            .zip(sent.iter_mut())
            .enumerate()
            .filter(|(_, (out, sent))| out.len() > **sent)
            .map(|(choice, (out, sent))| {
                let weighed = logprobs
                    .get(choice)
                    .map_or(&[][..], |l| l.get(*sent..).unwrap_or_default());
                let update = Update {
                    choice,
                    tokens: out[*sent..].to_vec(),
                    logprobs: weighed.to_vec(),
                };
                *sent = out.len();
                update
            })
            .collect();
        // A stream whose client went away is cancelled by its closed reply.
        if !new.is_empty() {
            let _ = progress.send(new);
        }
    }
}

/// Answers every request in `waiting` with `e` (a step failed for all of them).
fn fail_all(waiting: &mut HashMap<usize, InBatch>, e: &anyhow::Error) {
    for (_, r) in waiting.drain() {
        let _ = r.reply.send(Err(anyhow::anyhow!("{e:#}")));
    }
}

/// Most continuations decoded together; a request that would pass it waits for rows to finish
/// (one larger than this alone still runs, alone).
pub(crate) const MAX_ROWS: usize = 256;

/// Run until every sender of `jobs` is gone.
pub(crate) fn generate_worker(state: Shared, jobs: Receiver<GenerateJob>) {
    let Some((_, policy)) = state.policy.as_ref() else {
        return;
    };
    let new_batch = || {
        Decoding::new(&policy.model, Some(&policy.tokenizer))
            .prefill_chunk(state.prefill_chunk_tokens)
            .kv_budget(state.kv_budget)
    };
    let mut batch = new_batch();
    let mut waiting: HashMap<usize, InBatch> = HashMap::new();
    // A request that did not fit the batch yet.
    let mut held: Option<GenerateJob> = None;
    loop {
        if batch.is_idle() && held.is_none() {
            match jobs.recv() {
                Ok(job) => held = Some(job),
                Err(_) => return,
            }
        }
        loop {
            let job = match held.take().map(Ok).unwrap_or_else(|| jobs.try_recv()) {
                Ok(job) if job.reply.is_closed() => {
                    state.metrics.cancelled();
                    continue;
                }
                Ok(job) => job,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) if batch.is_idle() => return,
                Err(TryRecvError::Disconnected) => break,
            };
            if !batch.is_idle() && batch.live_rows() + job.n > MAX_ROWS {
                held = Some(job);
                break;
            }
            let added = if state.prefill_chunk_tokens > 0 {
                batch.join_with(&job.prompt, job.n, job.params, index_of(&job.adapter))
            } else {
                batch.add_with(&job.prompt, job.n, job.params, index_of(&job.adapter))
            };
            match added {
                Ok(id) => {
                    let progress = job.progress.map(|p| (p, Vec::new()));
                    waiting.insert(
                        id,
                        InBatch {
                            reply: job.reply,
                            _adapter: job.adapter,
                            progress,
                        },
                    );
                }
                Err(e) => {
                    let _ = job.reply.send(Err(e));
                }
            }
        }
        // A request whose client went away (its handler, dropped, closed the reply) stops
        // being decoded: its rows leave the batch and its cache is freed.
        let gone: Vec<usize> = waiting
            .iter()
            .filter(|(_, r)| r.reply.is_closed())
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            waiting.remove(&id);
            state.metrics.cancelled();
            if let Err(e) = batch.cancel(id) {
                fail_all(&mut waiting, &e);
                batch = new_batch();
                break;
            }
        }
        match batch.step() {
            Ok(done) => {
                let rows = batch.last_step();
                if rows.continuations + rows.prompts > 0 {
                    state.metrics.decode_step(rows.continuations, rows.prompts);
                }
                for (id, tokens) in done {
                    if let Some(mut r) = waiting.remove(&id) {
                        let logprobs = batch.logprobs(id).unwrap_or_default().to_vec();
                        r.send_new(&tokens, &logprobs);
                        let _ = r.reply.send(Ok(Generated { tokens, logprobs }));
                    }
                }
                for (id, r) in waiting.iter_mut().filter(|(_, r)| r.progress.is_some()) {
                    r.send_new(
                        batch.so_far(*id).unwrap_or_default(),
                        batch.logprobs(*id).unwrap_or_default(),
                    );
                }
            }
            Err(e) => {
                // A step fails for every row in it: answer them all and start a fresh batch.
                fail_all(&mut waiting, &e);
                batch = new_batch();
            }
        }
    }
}
