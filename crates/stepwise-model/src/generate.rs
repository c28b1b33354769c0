//! Sampling with a KV cache. `n` continuations of one prefix encode the prefix ONCE and share its
//! cache (Monte Carlo rollouts and beams depend on this); rows that stop leave the batch.
//!
//! [`Decoding`] is the one continuous-batching scheduler, whatever the engine: it keeps the
//! requests, their rows and the prompts being fed, decides what each step runs, stops rows and
//! admits waiting requests against the cache's room; the keys and values and the forward pass
//! over them are a [`DecodeCache`] (the CPU decoder's or the packed engine's paged one), and
//! sampling is [`sample_token`] with each continuation's own generator.

use crate::decode_cache::{DecodeCache, PassAdapters};
use crate::engine::KvSize;
use crate::kept_prefixes::KeptPrefixes;
use crate::logprobs::{token_logprob, TokenLogprob};
use crate::model::Model;
pub use crate::sampling::{sample_token, SamplingParams};
use crate::tokenizer::Tokenizer;
use anyhow::{bail, Result};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;

/// `n` continuations of `prompt`: the prompt is encoded once, its cache shared by all rows.
pub fn generate(
    model: &Model,
    tok: Option<&Tokenizer>,
    prompt: &[u32],
    n: usize,
    p: &SamplingParams,
) -> Result<Vec<Vec<u32>>> {
    generate_with(model, tok, prompt, n, p, None)
}

/// [`generate`] with the served adapter `adapter` ([`Model::load_adapter`]; `None`: the base
/// model).
pub fn generate_with(
    model: &Model,
    tok: Option<&Tokenizer>,
    prompt: &[u32],
    n: usize,
    p: &SamplingParams,
    adapter: Option<usize>,
) -> Result<Vec<Vec<u32>>> {
    let mut batch = Decoding::new(model, tok).only_for(prompt.len(), n, p.max_new_tokens);
    batch.add_with(prompt, n, p.clone(), adapter)?;
    loop {
        if let Some((_, outs)) = batch.step()?.pop() {
            return Ok(outs);
        }
    }
}

/// Continuations of several prompts decoded together (continuous batching): a request joins at
/// any step and leaves when all its continuations have stopped; every decoding step is one
/// forward pass over every live row. A request joins in one of two ways:
/// - [`Decoding::add`]: its prompt is encoded at once, in a pass of its own, and its cache copied
///   for each continuation (where the cache feeds prompts only through the steps, a paged one,
///   this is [`Decoding::join`]);
/// - [`Decoding::join`]: its prompt is fed through the batch's own decoding steps, whole or (past
///   [`Decoding::prefill_chunk`] tokens a step) in chunks, as a batch of its own in the same pass
///   (chunked prefill, as vLLM's): the weights are read once for the step's rows and the
///   prompt's. After its last chunk it becomes its `n` continuations.
///
/// A request alone decodes exactly as [`generate`] (which is [`Decoding::add`]); beside others,
/// or joined, its rows compute the same values within float rounding.
///
/// The keys and values are the model's engine's [`DecodeCache`], made with the first request:
/// on the CPU a cache a row ([`crate::RowsCache`]: a step writes one position a row and a row
/// leaving copies nothing); on a packed engine (a GPU) a paged cache bounded by the KV budget,
/// where a request waits until its worst case fits.
pub struct Decoding<'a> {
    /// The model whose engine's cache the first request makes (`None`: given at the start).
    model: Option<&'a Model>,
    tok: Option<&'a Tokenizer>,
    /// How big a packed engine's cache is made.
    kv: KvSize,
    cache: Option<Box<dyn DecodeCache + 'a>>,
    /// Live rows, in the cache's row order.
    rows: Vec<Row>,
    /// Prompts being fed through the decoding steps, first come first fed (the cache's order).
    prefills: Vec<Prefill>,
    /// Requests waiting for room, first come first admitted.
    waiting: VecDeque<Prefill>,
    /// Room the admitted requests may need at worst, together.
    committed: usize,
    /// Most prompt tokens fed in one step.
    prefill_chunk: usize,
    /// Requests by id (`None` once returned).
    requests: Vec<Option<Request>>,
    /// The last decoding step's rows: continuations, and prompt tokens fed.
    last_step: StepRows,
    /// The rows kept after they left, for prompts to start from (`None`: none are kept).
    kept: Option<KeptPrefixes>,
    /// The log-probabilities of the requests the last step finished, by id.
    finished: Vec<(usize, Vec<Vec<TokenLogprob>>)>,
}

/// The rows of one decoding step's forward pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepRows {
    /// Rows continuing a sampled token.
    pub continuations: usize,
    /// Prompt tokens fed ([`Decoding::join`]).
    pub prompts: usize,
}

/// One continuation being decoded.
struct Row {
    request: usize,
    index: usize,
    rng: Box<ChaCha8Rng>,
    /// The token sampled last, fed next.
    next: u32,
    /// Its log-probability, where the request asks ([`SamplingParams::logprobs`]).
    weight: Option<TokenLogprob>,
}

/// A joining request's prompt: `fed` tokens of it are cached.
struct Prefill {
    request: usize,
    tokens: Vec<u32>,
    fed: usize,
}

/// A request's settings, continuations so far, and the room it may need at worst.
struct Request {
    params: SamplingParams,
    /// The served adapter it runs with (`None`: the base model).
    adapter: Option<usize>,
    /// Its prompt, where the batch keeps its rows' prefixes (else empty).
    prompt: Vec<u32>,
    outs: Vec<Vec<u32>>,
    /// Each continuation's tokens' log-probabilities, where asked.
    logprobs: Vec<Vec<TokenLogprob>>,
    live: usize,
    reserved: usize,
}

/// Whether a continuation whose tokens are `out` (its last just sampled) stops: a stop token,
/// its token budget, or a stop string its text ends with.
pub(crate) fn stops(out: &[u32], p: &SamplingParams, tok: Option<&Tokenizer>) -> bool {
    out.last().is_some_and(|t| p.stop_token_ids.contains(t))
        || out.len() >= p.max_new_tokens
        || (!p.stop_strings.is_empty()
            && tok
                .and_then(|t| t.decode(out).ok())
                .is_some_and(|text| p.stop_strings.iter().any(|s| text.ends_with(s.as_str()))))
}

/// Continuation `index`'s generator: the same however its request joined, on every engine.
pub(crate) fn continuation_rng(params: &SamplingParams, index: usize) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(params.seed.wrapping_mul(1_000_003).wrapping_add(index as u64))
}

/// Each of `n` continuations' first token drawn from the prompt's last `logits`, with the
/// generator it goes on with.
fn first_draws(logits: &[f32], p: &SamplingParams, n: usize) -> Vec<(Box<ChaCha8Rng>, u32)> {
    use rayon::prelude::*;
    (0..n)
        .into_par_iter()
        .map(|index| {
            let mut rng = Box::new(continuation_rng(p, index));
            let next = sample_token(logits, p, &mut rng);
            (rng, next)
        })
        .collect()
}

/// `next`'s log-probability under `logits`, where `p` asks for them.
fn weigh(logits: &[f32], next: u32, p: &SamplingParams) -> Option<TokenLogprob> {
    p.logprobs.map(|k| token_logprob(logits, next, k))
}

/// The first tokens of `n` continuations of a prompt whose last position gives `logits`: what
/// [`Decoding`] samples first for a request sampled by `p` (each continuation from its own
/// generator), for a caller that ran the prompt's pass itself (`stepwise serve` answers a
/// one-token request from the pass that reads its log-probabilities). Logits shifted by a
/// constant (log-probabilities) give the same draws up to rounding.
pub fn first_tokens(logits: &[f32], p: &SamplingParams, n: usize) -> Vec<u32> {
    first_draws(logits, p, n).into_iter().map(|(_, t)| t).collect()
}

/// Prompt tokens a decoding step feeds by default ([`Decoding::prefill_chunk`]): a few hundred
/// keep a step that carries them within a few times a plain step's time on a CPU.
pub const DEFAULT_PREFILL_CHUNK: usize = 256;

impl<'a> Decoding<'a> {
    /// An empty batch for `model` (`tok` decodes text for stop strings).
    pub fn new(model: &'a Model, tok: Option<&'a Tokenizer>) -> Self {
        Self::empty(Some(model), None, tok)
    }

    /// An empty batch over `cache` (a paged cache of a chosen size, say).
    pub fn with_cache(cache: Box<dyn DecodeCache + 'a>, tok: Option<&'a Tokenizer>) -> Self {
        Self::empty(None, Some(cache), tok)
    }

    fn empty(model: Option<&'a Model>, cache: Option<Box<dyn DecodeCache + 'a>>, tok: Option<&'a Tokenizer>) -> Self {
        Decoding {
            model,
            tok,
            kv: KvSize::default(),
            cache,
            rows: Vec::new(),
            prefills: Vec::new(),
            waiting: VecDeque::new(),
            committed: 0,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            requests: Vec::new(),
            last_step: StepRows::default(),
            kept: None,
            finished: Vec::new(),
        }
    }

    /// Each continuation that stops keeps its keys and values (on a cache that can keep them: a
    /// packed engine's), and a prompt that starts with a kept continuation's tokens (its own
    /// prompt, then what it wrote) starts from its cache, fed only the tokens after them: a
    /// conversation's next turn re-reads only what was said since. What is kept gives its room
    /// back to a request that needs it, the least recently used first.
    pub fn keep_prefixes(mut self) -> Self {
        self.kept = Some(KeptPrefixes::default());
        self
    }

    /// A model on a packed engine (a GPU) keeps at most `bytes` of keys and values (its KV
    /// budget; default half the device's free memory when the first request comes): requests
    /// wait for room.
    pub fn kv_budget(mut self, bytes: Option<usize>) -> Self {
        self.kv.budget = bytes;
        self
    }

    /// The batch will hold a request of `n` continuations of a `prompt`-token prompt with at
    /// most `max_new` new tokens each, and only the requests given so (one call a request, before
    /// the first is added: [`generate`]'s one, an RL update's prompts): a packed engine's cache
    /// is made no bigger than they need at worst together (within the budget), instead of the
    /// whole budget allocated and zeroed for them.
    pub fn only_for(mut self, prompt: usize, n: usize, max_new: usize) -> Self {
        self.kv.only_for.push((prompt, n, max_new));
        self
    }

    /// At most `tokens` (at least 1) of the joining prompts are fed in one decoding step; a
    /// longer prompt is fed over several, its chunks continuing its own cache.
    pub fn prefill_chunk(mut self, tokens: usize) -> Self {
        self.prefill_chunk = tokens.max(1);
        self
    }

    /// How many tokens of `prompt`, from its start, a kept prefix holds (0 where none are kept).
    pub fn kept_start(&self, prompt: &[u32]) -> usize {
        self.kept.as_ref().map_or(0, |k| k.most_shared(prompt))
    }

    /// The cache, made by the model's engine on the first call.
    fn cache(&mut self) -> Result<&mut (dyn DecodeCache + 'a)> {
        if self.cache.is_none() {
            let model = self.model.expect("a batch without a cache has a model");
            self.cache = Some(model.decode_cache(self.kv.clone())?);
        }
        Ok(self.cache.as_deref_mut().expect("made above"))
    }

    /// Continuations being decoded, and those the prompts being fed or waiting will start.
    pub fn live_rows(&self) -> usize {
        let starting: usize = self
            .prefills
            .iter()
            .chain(&self.waiting)
            .map(|p| self.requests[p.request].as_ref().map_or(0, |r| r.live))
            .sum();
        self.rows.len() + starting
    }

    /// Request `id`'s continuations so far (the tokens each has sampled before the last step;
    /// a stopped one whole), while the request is in the batch: what a stream sends as it goes.
    pub fn so_far(&self, id: usize) -> Option<&[Vec<u32>]> {
        self.requests.get(id)?.as_ref().map(|r| r.outs.as_slice())
    }

    /// Request `id`'s tokens' log-probabilities so far, one list a continuation, while it is in
    /// the batch and after the step that finished it (until the next step, or a request added:
    /// ids are reused once the batch is idle), where its sampling asks for them
    /// ([`SamplingParams::logprobs`]; else empty lists), the end token's included.
    pub fn logprobs(&self, id: usize) -> Option<&[Vec<TokenLogprob>]> {
        match self.requests.get(id) {
            Some(Some(r)) => Some(r.logprobs.as_slice()),
            _ => self.finished.iter().find(|(f, _)| *f == id).map(|(_, l)| l.as_slice()),
        }
    }

    /// The rows the last [`Decoding::step`] ran its forward pass on.
    pub fn last_step(&self) -> StepRows {
        self.last_step
    }

    /// Whether no request is waiting for [`Decoding::step`].
    pub fn is_idle(&self) -> bool {
        self.requests.iter().all(Option::is_none)
    }

    /// The cache's blocks free now and in all, where it is made of blocks (a packed engine's).
    pub fn cache_blocks(&self) -> Option<(usize, usize)> {
        self.cache.as_ref().and_then(|c| c.blocks())
    }

    /// The continuations a request for `n` of `prompt` will decode (none with no token budget)
    /// and the room it may need at worst; an error when it cannot be decoded.
    fn admissible(
        &mut self,
        prompt: &[u32],
        n: usize,
        params: &SamplingParams,
        adapter: Option<usize>,
    ) -> Result<(usize, usize)> {
        if prompt.is_empty() || n == 0 {
            bail!("generation needs a non-empty prompt and n > 0");
        }
        if let Some(a) = adapter {
            let served = self.cache()?.adapters();
            anyhow::ensure!(served.is_some_and(|s| s.holds(a)), "adapter {a} is not served by this model");
        }
        if params.max_new_tokens == 0 {
            return Ok((0, 0));
        }
        let cache = self.cache()?;
        // Checked now, not when a step feeds it: a bad prompt must not fail the others' step.
        let vocab = cache.vocab();
        if let Some(bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            bail!("token id {bad} is outside the model's vocabulary of {vocab}");
        }
        Ok((n, cache.reserve(prompt.len(), n, params.max_new_tokens)?))
    }

    /// Registers a request for `n` continuations of `prompt`, `live` of them to decode; its id.
    fn register(&mut self, prompt: &[u32], params: SamplingParams, adapter: Option<usize>, n: usize, room: (usize, usize)) -> usize {
        let (live, reserved) = room;
        let prompt = match self.kept {
            Some(_) => prompt.to_vec(),
            None => Vec::new(),
        };
        self.requests.push(Some(Request {
            params,
            adapter,
            prompt,
            outs: vec![Vec::new(); n],
            logprobs: vec![Vec::new(); n],
            live,
            reserved,
        }));
        self.requests.len() - 1
    }

    /// Add a request for `n` continuations of `prompt`: encodes the prompt and samples each
    /// continuation's first token. Returns the request's id, as [`Decoding::step`] reports it.
    /// A request that fails (a model without an LM head, a token outside the vocabulary) leaves
    /// nothing behind (so with [`Decoding::join`]).
    pub fn add(&mut self, prompt: &[u32], n: usize, params: SamplingParams) -> Result<usize> {
        self.add_with(prompt, n, params, None)
    }

    /// [`Decoding::add`] with the served adapter `adapter` ([`Model::serve_adapters`]; `None`:
    /// the base model): its rows run beside the others' in every step, each with its own.
    pub fn add_with(&mut self, prompt: &[u32], n: usize, params: SamplingParams, adapter: Option<usize>) -> Result<usize> {
        let room = self.admissible(prompt, n, &params, adapter)?;
        if room.0 == 0 {
            return Ok(self.register(prompt, params, adapter, n, room));
        }
        // Encoded (where the cache encodes prompts alone) as the cache's last prompt, after the
        // ones being fed.
        let first = self.cache()?.encode_alone(prompt, adapter)?;
        let id = self.register(prompt, params, adapter, n, room);
        match first {
            Some(first) => {
                if let Err(e) = self.start(id, self.prefills.len(), &first) {
                    self.requests[id] = None;
                    return Err(e);
                }
            }
            None => self.wait(id, prompt),
        }
        Ok(id)
    }

    /// Add a request for `n` continuations of `prompt` whose prompt is fed through the coming
    /// decoding steps (no forward pass of its own: its tokens join the step's rows in every
    /// product), at most [`Decoding::prefill_chunk`] prompt tokens a step; after its last one
    /// it becomes `n` continuations, each drawing its first token as [`Decoding::add`] would.
    /// Into an empty batch it is [`Decoding::add`]. Worth it while others are being decoded: a
    /// decoding step of a few rows is bound by reading the weights, so rows more cost little,
    /// where a pass of its own reads every weight again.
    pub fn join(&mut self, prompt: &[u32], n: usize, params: SamplingParams) -> Result<usize> {
        self.join_with(prompt, n, params, None)
    }

    /// [`Decoding::join`] with the served adapter `adapter` (see [`Decoding::add_with`]).
    pub fn join_with(&mut self, prompt: &[u32], n: usize, params: SamplingParams, adapter: Option<usize>) -> Result<usize> {
        if self.rows.is_empty() && self.prefills.is_empty() && self.waiting.is_empty() {
            return self.add_with(prompt, n, params, adapter);
        }
        let room = self.admissible(prompt, n, &params, adapter)?;
        let id = self.register(prompt, params, adapter, n, room);
        if room.0 > 0 {
            self.wait(id, prompt);
        }
        Ok(id)
    }

    /// Request `id`'s prompt waits to be admitted and fed.
    fn wait(&mut self, request: usize, prompt: &[u32]) {
        self.waiting.push_back(Prefill {
            request,
            tokens: prompt.to_vec(),
            fed: 0,
        });
    }

    /// Request `request`'s prompt, the cache's prompt `i`, fed whole, becomes its continuations
    /// after the rows: each draws its first token from `logits` (the prompt's last) and shares
    /// the prompt's cache.
    fn start(&mut self, request: usize, i: usize, logits: &[f32]) -> Result<()> {
        let req = self.requests[request].as_ref().expect("a request being started");
        let (p, n) = (&req.params, req.outs.len());
        let firsts: Vec<Row> = first_draws(logits, p, n)
            .into_iter()
            .enumerate()
            .map(|(index, (rng, next))| Row {
                request,
                index,
                rng,
                next,
                weight: weigh(logits, next, p),
            })
            .collect();
        let cache = self.cache.as_deref_mut().expect("a batch with rows has a cache");
        cache.start(i, n)?;
        self.rows.extend(firsts);
        Ok(())
    }

    /// Drop request `id` (its client went away): its continuations leave the batch, its prompt
    /// stops being fed (or waiting), its room is given back, and no step reports it. Nothing
    /// happens for an id that is not running.
    pub fn cancel(&mut self, id: usize) -> Result<()> {
        let Some(request) = self.requests.get_mut(id).and_then(Option::take) else {
            return Ok(());
        };
        let waited = self.waiting.len();
        self.waiting.retain(|p| p.request != id);
        if self.waiting.len() == waited {
            // Admitted: its worst case was committed.
            self.committed -= request.reserved;
        }
        if let Some(cache) = self.cache.as_deref_mut() {
            while let Some(i) = self.prefills.iter().position(|p| p.request == id) {
                cache.drop_prompt(i);
                self.prefills.remove(i);
            }
        }
        let keep: Vec<usize> = (0..self.rows.len()).filter(|&k| self.rows[k].request != id).collect();
        if keep.len() < self.rows.len() {
            self.keep_rows(&keep)?;
        }
        if self.is_idle() {
            self.requests.clear();
        }
        Ok(())
    }

    /// Append each continuation's next token; continuations that stop (a stop token or string,
    /// or their token budget) leave the batch; waiting requests that now fit are admitted; every
    /// live row runs one decoding step, with the next chunk of the prompts being fed. Returns
    /// the requests whose continuations have all stopped, with those continuations (stop token
    /// included).
    pub fn step(&mut self) -> Result<Vec<(usize, Vec<Vec<u32>>)>> {
        if rayon::current_thread_index().is_none() {
            // A step runs ~170 parallel products; called from outside the thread pool, each
            // would hand its work to the pool and put this thread to sleep until it is done
            // (futex waits and wake-ups were a fifth of a 0.5B model's serving time). On a pool
            // thread the step takes part in its own products. Same splits, same results.
            return rayon::scope(|_| self.step_on_pool());
        }
        self.step_on_pool()
    }

    /// [`Decoding::step`], on whatever thread calls it.
    fn step_on_pool(&mut self) -> Result<Vec<(usize, Vec<Vec<u32>>)>> {
        let mut still = Vec::with_capacity(self.rows.len());
        self.finished.clear();
        for (k, row) in self.rows.iter_mut().enumerate() {
            let req = self.requests[row.request].as_mut().expect("a live row's request");
            if let Some(w) = row.weight.take() {
                req.logprobs[row.index].push(w);
            }
            let out = &mut req.outs[row.index];
            out.push(row.next);
            if stops(out, &req.params, self.tok) {
                req.live -= 1;
                // A prefix is kept for requests of the base model (another adapter's keys differ).
                let kept = self.kept.as_mut().filter(|_| req.adapter.is_none());
                if let (Some(kept), Some(cache)) = (kept, self.cache.as_deref_mut()) {
                    if let Some((handle, room)) = cache.retain_row(k) {
                        // Cached: the prompt and every token written but the last (never fed).
                        let tokens = req.prompt.iter().chain(&out[..out.len() - 1]).copied().collect();
                        kept.keep(handle, tokens, room);
                    }
                }
            } else {
                still.push(k);
            }
        }
        let mut done = Vec::new();
        for (id, r) in self.requests.iter_mut().enumerate() {
            if r.as_ref().is_some_and(|r| r.live == 0) {
                let r = r.take().expect("checked");
                self.committed -= r.reserved;
                self.finished.push((id, r.logprobs));
                done.push((id, r.outs));
            }
        }
        if still.len() < self.rows.len() {
            self.keep_rows(&still)?;
        }
        self.admit();
        let takes = prefill_takes(self.prefills.iter().map(|p| p.tokens.len() - p.fed), self.prefill_chunk);
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

    /// Admits, first come first served, the waiting requests whose worst case fits the room left
    /// (the kept prefixes' room given back for it, the least recently used first); each starts
    /// from the kept prefix it shares the most tokens with.
    fn admit(&mut self) {
        let Some(cache) = self.cache.as_deref_mut() else {
            return;
        };
        while let Some(p) = self.waiting.front() {
            let need = self.requests[p.request].as_ref().map_or(0, |r| r.reserved);
            let (committed, capacity) = (self.committed, cache.capacity());
            let fits = |kept: &Option<KeptPrefixes>| {
                committed.saturating_add(need + kept.as_ref().map_or(0, KeptPrefixes::held)) <= capacity
            };
            while !fits(&self.kept) {
                match self.kept.as_mut().and_then(KeptPrefixes::forget_oldest) {
                    Some(handle) => cache.forget(handle),
                    None => break,
                }
            }
            if !fits(&self.kept) {
                break;
            }
            self.committed += need;
            cache.push_prompt();
            let mut p = self.waiting.pop_front().expect("checked");
            let base = self.requests[p.request].as_ref().is_some_and(|r| r.adapter.is_none());
            let kept = self.kept.as_mut().filter(|_| base);
            if let Some((handle, len)) = kept.and_then(|k| k.longest_shared(&p.tokens)) {
                // Fed from the start where the kept cache cannot be shared after all.
                if cache.prompt_from(handle, len).is_ok() {
                    p.fed = len;
                }
            }
            self.prefills.push(p);
        }
    }

    /// One forward pass over every live row and the chunks of the first prompts being fed
    /// (`takes[i]` tokens of prompt `i`); samples each row's next token and starts the
    /// continuations of the prompts fed to their end.
    fn run_step(&mut self, takes: &[usize]) -> Result<()> {
        let chunks: Vec<&[u32]> = self
            .prefills
            .iter()
            .zip(takes)
            .map(|(p, &take)| &p.tokens[p.fed..p.fed + take])
            .collect();
        // Only the last prompt taken can be fed in part: the ones fed whole come first.
        let finishing = self
            .prefills
            .iter()
            .zip(takes)
            .take_while(|(p, &take)| p.fed + take == p.tokens.len())
            .count();
        let next: Vec<u32> = self.rows.iter().map(|r| r.next).collect();
        let adapter = |request: usize| self.requests[request].as_ref().and_then(|r| r.adapter);
        let adapters = PassAdapters {
            rows: self.rows.iter().map(|r| adapter(r.request)).collect(),
            prompts: self.prefills.iter().take(chunks.len()).map(|p| adapter(p.request)).collect(),
        };
        let (rows, requests) = (&mut self.rows, &self.requests);
        let mut prompt_logits = Vec::new();
        let cache = self.cache.as_deref_mut().expect("a batch with rows has a cache");
        cache.forward(&next, &chunks, &adapters, finishing, &mut |all: &[f32]| {
            let vocab = all.len() / (rows.len() + finishing);
            let (row_logits, prompts) = all.split_at(rows.len() * vocab);
            // Each row draws from its own generator, so the rows sample in parallel (a large
            // vocabulary's softmax is a real share of a decoding step).
            use rayon::prelude::*;
            rows.par_iter_mut()
                .zip(row_logits.par_chunks_exact(vocab))
                .for_each(|(row, l)| {
                    let req = requests[row.request].as_ref().expect("a live row's request");
                    row.next = sample_token(l, &req.params, &mut row.rng);
                    row.weight = weigh(l, row.next, &req.params);
                });
            prompt_logits = prompts.to_vec();
            Ok(())
        })?;
        for (p, &take) in self.prefills.iter_mut().zip(takes) {
            p.fed += take;
        }
        if let Some(vocab) = prompt_logits.len().checked_div(finishing) {
            for logits in prompt_logits.chunks_exact(vocab) {
                let p = self.prefills.remove(0);
                self.start(p.request, 0, logits)?;
            }
        }
        Ok(())
    }

    /// Keeps only the rows `keep` (indices into the rows, ascending), with their caches.
    fn keep_rows(&mut self, keep: &[usize]) -> Result<()> {
        if let Some(cache) = self.cache.as_deref_mut() {
            cache.keep_rows(keep)?;
        }
        let mut rows = std::mem::take(&mut self.rows).into_iter().map(Some).collect::<Vec<_>>();
        self.rows = keep.iter().map(|&k| rows[k].take().expect("each kept once")).collect();
        Ok(())
    }
}

/// A step's chunk of each prompt being fed (`left`: the tokens each has still to feed), first
/// come first fed within `budget` tokens: tokens from each of the first prompts, all of them fed
/// to their end but perhaps the last.
pub(crate) fn prefill_takes(left: impl Iterator<Item = usize>, mut budget: usize) -> Vec<usize> {
    left.map_while(|left| {
        let take = left.min(budget);
        budget -= take;
        (take > 0).then_some(take)
    })
    .collect()
}
