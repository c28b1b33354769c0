//! The log-probability worker: the token log-probabilities that `/v1/completions` and
//! `/v1/chat/completions` replies carry (with `echo`, the prompt's own tokens'; the generated
//! tokens'), computed for every request in flight together. Requests that arrive while a pass
//! runs wait for the next one and are packed end to end into it (one forward pass, the head run
//! at the rows read only), as `/v1/score_steps` packs the solutions of concurrent requests: a
//! judge weighed by likelihood through a server, or lm-evaluation-harness's loglikelihood tasks,
//! send one short request per answer, many at once.
//!
//! Memory stays bounded whatever the clients ask: a pass reads at most about 64 MiB of
//! vocabulary rows and packs at most [`TOKENS_A_PASS`] tokens; one sequence with more rows than
//! that is run alone, its rows computed a slice at a time
//! ([`stepwise_model::Model::vocab_logprobs_each`]). Each row is cut down to the target's
//! log-probability and the likeliest `k` at once, so what a reply waits with is small.

use super::completions::{index_of, ServedAdapter};
use super::Shared;
use anyhow::{ensure, Result};
use std::sync::mpsc::Receiver;
use stepwise_model::Model;
use tokio::sync::oneshot;

/// Vocabulary floats read in one pass at most (64 MiB of `f32`).
const FLOATS_A_PASS: usize = 1 << 24;

/// Tokens packed into one pass at most (a sequence longer than this runs alone).
pub(crate) const TOKENS_A_PASS: usize = 16_384;

/// A token's log-probability given the tokens before it, and the likeliest `k` tokens there
/// (ids, likeliest first): what the generation worker records for a sampled token too.
pub(crate) use stepwise_model::TokenLogprob as Weighed;

/// A sequence to weigh: the tokens `ids[first + 1..]`, each given those before it, and with
/// `next` the logits of the token after the last (a one-token continuation is sampled from
/// them).
pub(crate) struct ToWeigh {
    pub ids: Vec<u32>,
    pub first: usize,
    pub next: bool,
    /// The served adapter it is weighed with (`None`: the base model), held until it is.
    pub adapter: Option<ServedAdapter>,
}

impl ToWeigh {
    /// Positions read (vocabulary rows computed): `first..read_end()`.
    fn rows(&self) -> usize {
        self.read_end().saturating_sub(self.first)
    }

    fn read_end(&self) -> usize {
        (self.ids.len() + usize::from(self.next)).saturating_sub(1)
    }
}

/// A sequence weighed: its tokens, and the next token's logits where asked.
#[derive(Debug, Clone, Default)]
pub(crate) struct Weighing {
    pub tokens: Vec<Weighed>,
    pub next: Option<Vec<f32>>,
}

/// A request's sequences (its choices), weighed in one job so that they always share a pass.
pub(crate) struct WeighJob {
    pub seqs: Vec<ToWeigh>,
    /// Likeliest alternatives wanted at each position.
    pub k: usize,
    pub reply: oneshot::Sender<Result<Vec<Weighing>>>,
}

/// One sequence of a pass, and the alternatives wanted.
type Seq<'a> = (&'a ToWeigh, usize);

/// What one pass may hold.
struct Budget {
    rows: usize,
    tokens: usize,
}

impl Budget {
    fn fits(&self, rows: usize, tokens: usize) -> bool {
        rows <= self.rows && tokens <= self.tokens
    }
}

/// Run until every sender of `jobs` is gone.
pub(crate) fn weigh_worker(state: Shared, jobs: Receiver<WeighJob>) {
    let Some((_, policy)) = state.policy.as_ref() else {
        return;
    };
    let model = &policy.model;
    let budget = Budget {
        rows: (FLOATS_A_PASS / model.config.vocab_size.max(1)).max(1),
        tokens: TOKENS_A_PASS,
    };
    let size = |j: &WeighJob| -> (usize, usize) {
        (
            j.seqs.iter().map(ToWeigh::rows).sum(),
            j.seqs.iter().map(|s| s.ids.len()).sum(),
        )
    };
    // A job that did not fit the pass before it.
    let mut held: Option<WeighJob> = None;
    loop {
        let first = match held.take().map(Ok).unwrap_or_else(|| jobs.recv()) {
            Ok(job) => job,
            Err(_) => return,
        };
        let (mut r, mut t) = size(&first);
        let mut batch = vec![first];
        while let Ok(job) = jobs.try_recv() {
            let (jr, jt) = size(&job);
            if !budget.fits(r + jr, t + jt) {
                held = Some(job);
                break;
            }
            (r, t) = (r + jr, t + jt);
            batch.push(job);
        }
        // A request whose client went away is not weighed.
        batch.retain(|j| !j.reply.is_closed());
        let seqs: Vec<Seq<'_>> = batch.iter().flat_map(|j| j.seqs.iter().map(|s| (s, j.k))).collect();
        let mut weighed = weigh_in_passes(model, &seqs, &budget, &state).into_iter();
        for job in batch {
            let mine: Result<Vec<Weighing>> = weighed.by_ref().take(job.seqs.len()).collect();
            let _ = job.reply.send(mine);
        }
    }
}

/// Each sequence weighed, in order: packed into passes within `budget` (a sequence with more
/// rows than a pass reads runs alone, a slice of rows at a time). A pass that fails is run again
/// a sequence at a time, so one bad sequence costs the others nothing.
fn weigh_in_passes(model: &Model, seqs: &[Seq<'_>], budget: &Budget, state: &Shared) -> Vec<Result<Weighing>> {
    let mut out = Vec::with_capacity(seqs.len());
    let mut start = 0;
    while start < seqs.len() {
        let (mut end, mut r, mut t) = (start, 0, 0);
        while end < seqs.len() && (end == start || budget.fits(r + seqs[end].0.rows(), t + seqs[end].0.ids.len())) {
            r += seqs[end].0.rows();
            t += seqs[end].0.ids.len();
            end += 1;
        }
        let pass = &seqs[start..end];
        state.metrics.weigh_pass(pass.len());
        match weigh(model, pass, budget.rows) {
            Ok(all) => out.extend(all.into_iter().map(Ok)),
            Err(_) if pass.len() > 1 => out.extend(
                pass.iter()
                    .map(|s| weigh(model, std::slice::from_ref(s), budget.rows).map(|mut w| w.remove(0))),
            ),
            Err(e) => out.push(Err(e)),
        }
        start = end;
    }
    out
}

/// Each sequence weighed: one packed pass over all of them, or, for one sequence with more rows
/// than a pass reads, its rows a slice at a time.
fn weigh(model: &Model, seqs: &[Seq<'_>], rows_a_pass: usize) -> Result<Vec<Weighing>> {
    let vocab = model.config.vocab_size;
    for (s, _) in seqs {
        ensure!(
            s.ids.iter().all(|&t| (t as usize) < vocab),
            "a token id is outside the model's vocabulary of {vocab}"
        );
        ensure!(s.rows() > 0, "nothing to weigh in a sequence of {} tokens", s.ids.len());
    }
    let mut out: Vec<Weighing> = seqs.iter().map(|_| Weighing::default()).collect();
    // Row `at` of sequence `i`: a token's log-probability, or the next token's logits.
    let mut take = |i: usize, at: usize, row: &[f32]| {
        let (s, k) = seqs[i];
        match s.ids.get(at + 1) {
            Some(&target) => out[i].tokens.push(stepwise_model::token_logprob(row, target, k)),
            None => out[i].next = Some(row.to_vec()),
        }
    };
    if let [(s, _)] = seqs {
        if s.rows() > rows_a_pass {
            let at: Vec<usize> = (s.first..s.read_end()).collect();
            model.vocab_logprobs_each_with(&s.ids, &at, rows_a_pass, index_of(&s.adapter), |from, logp| {
                for (j, row) in logp.iter().enumerate() {
                    take(0, s.first + from + j, row);
                }
                Ok(())
            })?;
            return Ok(out);
        }
    }
    let packed: Vec<&[u32]> = seqs.iter().map(|(s, _)| &s.ids[..]).collect();
    let read: Vec<Vec<usize>> = seqs.iter().map(|(s, _)| (s.first..s.read_end()).collect()).collect();
    let adapters: Vec<Option<usize>> = seqs.iter().map(|(s, _)| index_of(&s.adapter)).collect();
    let (logits, width) = model.head_at_with(&packed, &read, None, adapters)?;
    ensure!(
        width == vocab,
        "the head gave {width} columns for a vocabulary of {vocab}"
    );
    let mut rows = logits.chunks_exact(width);
    for (i, positions) in read.iter().enumerate() {
        for (&at, row) in positions.iter().zip(rows.by_ref()) {
            take(i, at, row);
        }
    }
    Ok(out)
}

/// Weigh `seqs` on the worker (`k` alternatives at each position), in one job: packed together
/// and with everything else in flight. A sequence with nothing to read gets nothing.
pub(crate) async fn weigh_all(s: &Shared, seqs: Vec<ToWeigh>, k: usize) -> Result<Vec<Weighing>> {
    let stopped = || anyhow::anyhow!("the log-probability worker stopped");
    let (read, empty): (Vec<_>, Vec<_>) = seqs.into_iter().enumerate().partition(|(_, s)| s.rows() > 0);
    let mut out: Vec<Weighing> = vec![Weighing::default(); read.len() + empty.len()];
    if read.is_empty() {
        return Ok(out);
    }
    let (at, seqs): (Vec<usize>, Vec<ToWeigh>) = read.into_iter().unzip();
    let (reply, answer) = oneshot::channel();
    s.weigh_queue
        .lock()
        .map_err(|_| stopped())?
        .send(WeighJob { seqs, k, reply })
        .map_err(|_| stopped())?;
    for (i, w) in at.into_iter().zip(answer.await.map_err(|_| stopped())??) {
        out[i] = w;
    }
    Ok(out)
}
