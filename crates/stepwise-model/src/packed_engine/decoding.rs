//! Continuous batching on the packed engine ([`PagedDecoding`]): requests join and leave a
//! running batch, every step is one forward pass over the decoding rows' new tokens and chunks of
//! the prompts being fed (a packed batch over the paged KV cache), and sampling draws from each
//! row's own generator as the CPU's [`crate::Decoding`] does, so both give the same samples for
//! the same logits. The KV budget bounds memory: a request waits until the blocks its worst case
//! needs are free, and one that could never fit is refused.

use super::paged::{blocks_for, PagedCache, PagedSeq, BLOCK};
use super::{Backend, PackedDecoder};
use crate::generate::{continuation_rng, sample_token, stops, SamplingParams, StepRows, DEFAULT_PREFILL_CHUNK};
use crate::tokenizer::Tokenizer;
use anyhow::{bail, Result};
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;

/// One continuation being decoded.
struct Row {
    request: usize,
    index: usize,
    rng: Box<ChaCha8Rng>,
    seq: PagedSeq,
    /// The token sampled last, fed next.
    next: u32,
}

/// A prompt being fed: `fed` of its tokens are in `seq`.
struct Prefill {
    request: usize,
    tokens: Vec<u32>,
    fed: usize,
    seq: PagedSeq,
}

/// A request's settings, continuations so far, and the blocks it may need at worst.
struct Request {
    params: SamplingParams,
    outs: Vec<Vec<u32>>,
    live: usize,
    reserved: usize,
}

/// A running batch of requests on the packed engine (see the module's documentation).
pub struct PagedDecoding<'a, B: Backend> {
    engine: &'a PackedDecoder<B>,
    tok: Option<&'a Tokenizer>,
    cache: PagedCache<B>,
    rows: Vec<Row>,
    prefills: Vec<Prefill>,
    /// Requests waiting for blocks: their ids and prompts, first come first admitted.
    waiting: VecDeque<(usize, Vec<u32>)>,
    /// Blocks the admitted requests may need at worst, together.
    committed: usize,
    prefill_chunk: usize,
    requests: Vec<Option<Request>>,
    last_step: StepRows,
}

impl<'a, B: Backend> PagedDecoding<'a, B> {
    /// An empty batch on `engine` with a KV cache of `blocks` blocks (`tok` decodes text for stop
    /// strings).
    pub fn new(engine: &'a PackedDecoder<B>, tok: Option<&'a Tokenizer>, blocks: usize) -> Result<Self> {
        Ok(PagedDecoding {
            cache: PagedCache::new(engine, blocks)?,
            engine,
            tok,
            rows: Vec::new(),
            prefills: Vec::new(),
            waiting: VecDeque::new(),
            committed: 0,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            requests: Vec::new(),
            last_step: StepRows::default(),
        })
    }

    /// At most `tokens` (at least 1) prompt tokens are fed in one step.
    pub fn prefill_chunk(mut self, tokens: usize) -> Self {
        self.prefill_chunk = tokens.max(1);
        self
    }

    /// Continuations being decoded, and those the prompts being fed or waiting will start.
    pub fn live_rows(&self) -> usize {
        let starting: usize = self
            .prefills
            .iter()
            .map(|p| p.request)
            .chain(self.waiting.iter().map(|(id, _)| *id))
            .map(|id| self.requests[id].as_ref().map_or(0, |r| r.live))
            .sum();
        self.rows.len() + starting
    }

    /// The rows the last step ran its forward pass on.
    pub fn last_step(&self) -> StepRows {
        self.last_step
    }

    /// Whether no request is waiting for [`PagedDecoding::step`].
    pub fn is_idle(&self) -> bool {
        self.requests.iter().all(Option::is_none)
    }

    /// The KV cache's blocks free now, and in all.
    pub fn cache_blocks(&self) -> (usize, usize) {
        (self.cache.free_blocks(), self.cache.total_blocks())
    }

    /// Add a request for `n` continuations of `prompt`; it runs as soon as the KV cache has
    /// room for its worst case (its prompt, and every continuation at its token budget).
    /// Returns the request's id, as [`PagedDecoding::step`] reports it.
    pub fn join(&mut self, prompt: &[u32], n: usize, params: SamplingParams) -> Result<usize> {
        if prompt.is_empty() || n == 0 {
            bail!("generation needs a non-empty prompt and n > 0");
        }
        let live = if params.max_new_tokens == 0 { 0 } else { n };
        let end = prompt.len() + params.max_new_tokens;
        let positions = self.engine.config.max_position_embeddings;
        if live > 0 && end > positions {
            bail!(
                "a prompt of {} tokens and {} new ones exceed the model's max_position_embeddings ({positions})",
                prompt.len(),
                params.max_new_tokens
            );
        }
        let reserved = if live == 0 {
            0
        } else {
            blocks_for(prompt.len()) + n * (blocks_for(end) - prompt.len() / BLOCK)
        };
        if reserved > self.cache.total_blocks() {
            bail!(
                "{n} continuations of a {}-token prompt with {} new tokens each need {reserved} KV cache blocks at worst; the cache holds {} (raise the KV budget, or ask for fewer)",
                prompt.len(),
                params.max_new_tokens,
                self.cache.total_blocks()
            );
        }
        self.requests.push(Some(Request {
            params,
            outs: vec![Vec::new(); n],
            live,
            reserved,
        }));
        let id = self.requests.len() - 1;
        if live > 0 {
            self.waiting.push_back((id, prompt.to_vec()));
        }
        Ok(id)
    }

    /// [`PagedDecoding::join`] (the prompt is fed by the coming steps either way).
    pub fn add(&mut self, prompt: &[u32], n: usize, params: SamplingParams) -> Result<usize> {
        self.join(prompt, n, params)
    }

    /// Drop request `id` (its client went away): its continuations leave the batch and give their
    /// blocks back, its prompt stops being fed (or waiting), and no step reports it. Nothing
    /// happens for an id that is not running.
    pub fn cancel(&mut self, id: usize) {
        let Some(request) = self.requests.get_mut(id).and_then(Option::take) else {
            return;
        };
        let waited = self.waiting.len();
        self.waiting.retain(|(w, _)| *w != id);
        if self.waiting.len() == waited {
            // Admitted: its worst case was committed.
            self.committed -= request.reserved;
        }
        for p in self.prefills.iter_mut().filter(|p| p.request == id) {
            self.cache.release(&mut p.seq);
        }
        self.prefills.retain(|p| p.request != id);
        for mut row in std::mem::take(&mut self.rows) {
            if row.request == id {
                self.cache.release(&mut row.seq);
            } else {
                self.rows.push(row);
            }
        }
        if self.is_idle() {
            self.requests.clear();
        }
    }

    /// Append each continuation's sampled token; continuations that stop leave the batch and give
    /// their blocks back; waiting requests that now fit are admitted; then one forward pass over
    /// every live row and the next chunks of the prompts being fed, and each row samples its next
    /// token. Returns the requests whose continuations have all stopped.
    pub fn step(&mut self) -> Result<Vec<(usize, Vec<Vec<u32>>)>> {
        let mut still = Vec::with_capacity(self.rows.len());
        for mut row in std::mem::take(&mut self.rows) {
            let req = self.requests[row.request].as_mut().expect("a live row's request");
            let out = &mut req.outs[row.index];
            out.push(row.next);
            if stops(out, &req.params, self.tok) {
                req.live -= 1;
                self.cache.release(&mut row.seq);
            } else {
                still.push(row);
            }
        }
        self.rows = still;
        let mut done = Vec::new();
        for (id, r) in self.requests.iter_mut().enumerate() {
            if r.as_ref().is_some_and(|r| r.live == 0) {
                let r = r.take().expect("checked");
                self.committed -= r.reserved;
                done.push((id, r.outs));
            }
        }
        // Admit, first come first served, what fits the KV budget at worst.
        while let Some((id, _)) = self.waiting.front() {
            let need = self.requests[*id].as_ref().map_or(0, |r| r.reserved);
            if self.committed + need > self.cache.total_blocks() {
                break;
            }
            let (id, tokens) = self.waiting.pop_front().expect("checked");
            self.committed += need;
            self.prefills.push(Prefill {
                request: id,
                tokens,
                fed: 0,
                seq: PagedSeq::default(),
            });
        }
        let takes = crate::generate::prefill_takes(
            self.prefills.iter().map(|p| p.tokens.len() - p.fed),
            self.prefill_chunk,
        );
        self.last_step = StepRows {
            continuations: self.rows.len(),
            prompts: takes.iter().sum(),
        };
        if !self.rows.is_empty() || !takes.is_empty() {
            self.run_step(&takes)?;
        }
        if self.is_idle() {
            self.requests.clear();
        }
        Ok(done)
    }

    /// One forward pass over the live rows and `takes[i]` tokens of prompt `i`; samples every
    /// row's next token and starts the continuations of the prompts fed to their end.
    fn run_step(&mut self, takes: &[usize]) -> Result<()> {
        let rows_n = self.rows.len();
        for row in &mut self.rows {
            let len = row.seq.len + 1;
            self.cache.grow(&mut row.seq, len)?;
        }
        for (p, &take) in self.prefills.iter_mut().zip(takes) {
            let len = p.fed + take;
            self.cache.grow(&mut p.seq, len)?;
        }
        // Rows read: every decoding row's token, and each prompt's last when it is fed whole.
        let mut read: Vec<usize> = (0..rows_n).collect();
        let mut at = rows_n;
        let mut finishing = Vec::new();
        for (i, (p, &take)) in self.prefills.iter().zip(takes).enumerate() {
            at += take;
            if p.fed + take == p.tokens.len() {
                read.push(at - 1);
                finishing.push(i);
            }
        }
        let next_tokens: Vec<[u32; 1]> = self.rows.iter().map(|r| [r.next]).collect();
        let logits = {
            let mut seqs: Vec<(&mut PagedSeq, &[u32])> = self
                .rows
                .iter_mut()
                .zip(&next_tokens)
                .map(|(r, t)| (&mut r.seq, t.as_slice()))
                .collect();
            for (p, &take) in self.prefills.iter_mut().zip(takes) {
                seqs.push((&mut p.seq, &p.tokens[p.fed..p.fed + take]));
            }
            self.engine.logits_paged(&mut seqs, &mut self.cache, &read)?
        };
        for (p, &take) in self.prefills.iter_mut().zip(takes) {
            p.fed += take;
        }
        let vocab = self.engine.config.vocab_size;
        let (row_logits, prompt_logits) = logits.split_at(rows_n * vocab);
        {
            use rayon::prelude::*;
            let requests = &self.requests;
            self.rows
                .par_iter_mut()
                .zip(row_logits.par_chunks_exact(vocab))
                .for_each(|(row, l)| {
                    let req = requests[row.request].as_ref().expect("a live row's request");
                    row.next = sample_token(l, &req.params, &mut row.rng);
                });
        }
        // Prompts fed whole become their continuations, in order.
        let mut whole: Vec<Prefill> = Vec::new();
        for (k, i) in finishing.into_iter().enumerate() {
            whole.push(self.prefills.remove(i - k));
        }
        for (mut p, logits) in whole.into_iter().zip(prompt_logits.chunks_exact(vocab)) {
            let req = self.requests[p.request].as_ref().expect("a request being started");
            let (params, n) = (req.params.clone(), req.outs.len());
            for index in 0..n {
                let mut rng = Box::new(continuation_rng(&params, index));
                let first = sample_token(logits, &params, &mut rng);
                let seq = self.cache.fork(self.engine.backend(), &p.seq)?;
                self.rows.push(Row {
                    request: p.request,
                    index,
                    rng,
                    seq,
                    next: first,
                });
            }
            self.cache.release(&mut p.seq);
        }
        Ok(())
    }
}
