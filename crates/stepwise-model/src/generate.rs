//! Sampling with a KV cache. `n` continuations of one prefix encode the prefix ONCE and share its
//! cache (Monte Carlo rollouts and beams depend on this); rows that stop leave the batch.

use crate::engine::Batcher;
use crate::kv_rows::RowsCache;
use crate::model::{Head, Model};
pub use crate::sampling::{sample_token, SamplingParams};
use crate::tokenizer::Tokenizer;
use crate::input::{BatchCache, Input};
use crate::transformer::KvCache;
use anyhow::{bail, Result};
use candle_core::{IndexOp, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn last_logits(model: &Model, hidden: &Tensor) -> Result<Tensor> {
    if !matches!(model.head, Head::Lm(_)) {
        bail!(
            "generation needs a causal LM head (architecture {})",
            model.config.architecture
        );
    }
    let t = hidden.dim(1)?;
    model.head_logits(&hidden.i((.., t - 1, ..))?)
}

/// `n` continuations of `prompt`: the prompt is encoded once, its cache shared by all rows.
pub fn generate(
    model: &Model,
    tok: Option<&Tokenizer>,
    prompt: &[u32],
    n: usize,
    p: &SamplingParams,
) -> Result<Vec<Vec<u32>>> {
    let mut batch = Decoding::new(model, tok);
    batch.add(prompt, n, p.clone())?;
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
///   for each continuation;
/// - [`Decoding::join`]: its prompt is fed through the batch's own decoding steps, whole or (past
///   [`Decoding::prefill_chunk`] tokens a step) in chunks, as a batch of its own in the same pass
///   (chunked prefill, as vLLM's): the weights are read once for the step's rows and the
///   prompt's. After its last chunk it becomes its `n` continuations.
///
/// A request alone decodes exactly as [`generate`] (which is [`Decoding::add`]); beside others,
/// or joined, its rows compute the same values within float rounding.
///
/// On the CPU in inference each row keeps a cache of its own ([`RowsCache`]): a step writes one
/// position a row and a row leaving copies nothing, where one cache for the batch (left-padded to
/// its longest row, see [`KvCache`]; the path elsewhere) is copied whole by both. The values are
/// the same bit for bit.
///
/// A model loaded onto a GPU decodes on the packed engine instead
/// ([`crate::packed_engine::PagedDecoding`]: a paged KV cache on the device, bounded by the KV
/// budget, where requests wait for room), behind the same methods.
pub struct Decoding<'a> {
    model: &'a Model,
    tok: Option<&'a Tokenizer>,
    /// The packed engine's running batch, made on the first request (a model on a GPU).
    packed: Option<Box<dyn Batcher + 'a>>,
    /// The KV budget of a GPU's batch, in bytes (`None`: half the GPU's free memory).
    kv_budget: Option<usize>,
    cache: RowCaches,
    /// Live rows, in the cache's batch order.
    rows: Vec<Row>,
    /// Each live row's next input token.
    next: Vec<u32>,
    /// Prompts being fed through the decoding steps, first come first fed.
    prefills: Vec<Prefill>,
    /// Most prompt tokens fed in one step.
    prefill_chunk: usize,
    /// Requests by id (`None` once returned).
    requests: Vec<Option<Request>>,
    /// The last decoding step's rows: continuations, and prompt tokens fed.
    last_step: StepRows,
}

/// The decoding rows' keys and values.
enum RowCaches {
    /// A cache a row, where the CPU inference kernels run: a step writes one position a row,
    /// and a row leaving or joining copies no other row's.
    Own(RowsCache),
    /// One cache for all rows, left-padded (the candle path: another device, or a model being
    /// trained).
    Shared(KvCache),
}

impl RowCaches {
    /// An empty cache of the kind `model` reads.
    fn for_model(model: &Model) -> Self {
        if model.device.is_cpu() && !model.decoder.differentiable {
            RowCaches::Own(RowsCache::default())
        } else {
            RowCaches::Shared(KvCache::default())
        }
    }
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
}

/// A joining request's prompt: `fed` tokens of it are in `cache`.
struct Prefill {
    request: usize,
    tokens: Vec<u32>,
    fed: usize,
    cache: KvCache,
}

/// A request's settings and continuations so far.
struct Request {
    params: SamplingParams,
    outs: Vec<Vec<u32>>,
    live: usize,
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

/// Continuation `index`'s generator: the same for [`Decoding::add`] and [`Decoding::join`] (and
/// the GPU's [`crate::packed_engine::PagedDecoding`]).
pub(crate) fn continuation_rng(params: &SamplingParams, index: usize) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(params.seed.wrapping_mul(1_000_003).wrapping_add(index as u64))
}

/// Prompt tokens a decoding step feeds by default ([`Decoding::prefill_chunk`]): a few hundred
/// keep a step that carries them within a few times a plain step's time on a CPU.
pub const DEFAULT_PREFILL_CHUNK: usize = 256;

impl<'a> Decoding<'a> {
    /// An empty batch for `model` (`tok` decodes text for stop strings).
    pub fn new(model: &'a Model, tok: Option<&'a Tokenizer>) -> Self {
        Decoding {
            model,
            tok,
            packed: None,
            kv_budget: None,
            cache: RowCaches::for_model(model),
            rows: Vec::new(),
            next: Vec::new(),
            prefills: Vec::new(),
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            requests: Vec::new(),
            last_step: StepRows::default(),
        }
    }

    /// A model on a GPU keeps at most `bytes` of keys and values (its KV budget; default half the
    /// GPU's free memory when the first request comes): requests wait for room.
    pub fn kv_budget(mut self, bytes: Option<usize>) -> Self {
        self.kv_budget = bytes;
        self
    }

    /// The packed engine's running batch, made now if the model is on one; `None` on the CPU.
    fn on_packed(&mut self) -> Result<Option<&mut (dyn Batcher + 'a)>> {
        let model: &'a Model = self.model;
        let Some(engine) = model.packed() else {
            return Ok(None);
        };
        if self.packed.is_none() {
            self.packed = Some(engine.batcher(self.tok, self.kv_budget, self.prefill_chunk)?);
        }
        Ok(self.packed.as_deref_mut())
    }

    /// At most `tokens` (at least 1) of the joining prompts are fed in one decoding step; a
    /// longer prompt is fed over several, its chunks continuing its own cache.
    pub fn prefill_chunk(mut self, tokens: usize) -> Self {
        self.prefill_chunk = tokens.max(1);
        self
    }

    /// Continuations being decoded, and those the prompts being fed will start.
    pub fn live_rows(&self) -> usize {
        if let Some(g) = &self.packed {
            return g.live_rows();
        }
        let starting: usize = self
            .prefills
            .iter()
            .map(|p| self.requests[p.request].as_ref().map_or(0, |r| r.live))
            .sum();
        self.rows.len() + starting
    }

    /// The rows the last [`Decoding::step`] ran its forward pass on.
    pub fn last_step(&self) -> StepRows {
        if let Some(g) = &self.packed {
            return g.last_step();
        }
        self.last_step
    }

    /// Whether no request is waiting for [`Decoding::step`].
    pub fn is_idle(&self) -> bool {
        if let Some(g) = &self.packed {
            return g.is_idle();
        }
        self.requests.iter().all(Option::is_none)
    }

    /// The continuations a request for `n` of `prompt` will decode (none with no token budget),
    /// or why it cannot be decoded.
    fn live_continuations(prompt: &[u32], n: usize, params: &SamplingParams) -> Result<usize> {
        if prompt.is_empty() || n == 0 {
            bail!("generation needs a non-empty prompt and n > 0");
        }
        Ok(if params.max_new_tokens == 0 { 0 } else { n })
    }

    /// Registers a request; `live` continuations will be decoded.
    fn register(&mut self, params: SamplingParams, n: usize, live: usize) -> usize {
        self.requests.push(Some(Request {
            params,
            outs: vec![Vec::new(); n],
            live,
        }));
        self.requests.len() - 1
    }

    /// Add a request for `n` continuations of `prompt`: encodes the prompt and samples each
    /// continuation's first token. Returns the request's id, as [`Decoding::step`] reports it.
    pub fn add(&mut self, prompt: &[u32], n: usize, params: SamplingParams) -> Result<usize> {
        if let Some(g) = self.on_packed()? {
            return g.add(prompt, n, params);
        }
        let live = Self::live_continuations(prompt, n, &params)?;
        if live == 0 {
            return Ok(self.register(params, n, live));
        }
        let mut prefix_cache = KvCache::default();
        let ids = Tensor::new(prompt, &self.model.device)?.unsqueeze(0)?;
        let h = self.model.hidden(Input::padded(&ids, None).cache(&mut prefix_cache))?;
        let first: Vec<f32> = last_logits(self.model, &h)?.squeeze(0)?.to_vec1()?;
        let id = self.register(params, n, live);
        self.start_continuations(id, &prefix_cache, &first)?;
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
        if let Some(g) = self.on_packed()? {
            return g.join(prompt, n, params);
        }
        if self.rows.is_empty() && self.prefills.is_empty() {
            return self.add(prompt, n, params);
        }
        let live = Self::live_continuations(prompt, n, &params)?;
        let id = self.register(params, n, live);
        if live > 0 {
            self.prefills.push(Prefill {
                request: id,
                tokens: prompt.to_vec(),
                fed: 0,
                cache: KvCache::default(),
            });
        }
        Ok(id)
    }

    /// Request `id`'s continuations join the batch: each draws its first token from `logits`
    /// (the prompt's last), and shares the prompt's cache `prefix`.
    fn start_continuations(&mut self, id: usize, prefix: &KvCache, logits: &[f32]) -> Result<()> {
        let req = self.requests[id].as_ref().expect("a request being started");
        let (p, n) = (&req.params, req.outs.len());
        use rayon::prelude::*;
        let firsts: Vec<(Box<ChaCha8Rng>, u32)> = (0..n)
            .into_par_iter()
            .map(|index| {
                let mut rng = Box::new(continuation_rng(p, index));
                let first = sample_token(logits, p, &mut rng);
                (rng, first)
            })
            .collect();
        match &mut self.cache {
            RowCaches::Own(cache) => cache.push_copies(prefix, n)?,
            RowCaches::Shared(cache) => {
                let joining = prefix.repeat_batch(n)?;
                *cache = if self.rows.is_empty() {
                    joining
                } else {
                    cache.concat_batch(&joining)?
                };
            }
        }
        for (index, (rng, first)) in firsts.into_iter().enumerate() {
            self.next.push(first);
            self.rows.push(Row {
                request: id,
                index,
                rng,
            });
        }
        Ok(())
    }

    /// Drop request `id` (its client went away): its continuations leave the batch, its prompt
    /// stops being fed, and no step reports it. Nothing happens for an id that is not running.
    pub fn cancel(&mut self, id: usize) -> Result<()> {
        if let Some(g) = &mut self.packed {
            g.cancel(id);
            return Ok(());
        }
        if self.requests.get_mut(id).and_then(Option::take).is_none() {
            return Ok(());
        }
        self.prefills.retain(|p| p.request != id);
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
    /// or their token budget) leave the batch; every live row runs one decoding step, with the
    /// next chunk of the prompts being fed. Returns the requests whose continuations have all
    /// stopped, with those continuations (stop token included).
    pub fn step(&mut self) -> Result<Vec<(usize, Vec<Vec<u32>>)>> {
        if let Some(g) = &mut self.packed {
            return g.step();
        }
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
        for (k, row) in self.rows.iter().enumerate() {
            let req = self.requests[row.request].as_mut().expect("a live row's request");
            let out = &mut req.outs[row.index];
            out.push(self.next[k]);
            if stops(out, &req.params, self.tok) {
                req.live -= 1;
            } else {
                still.push(k);
            }
        }
        let done = self
            .requests
            .iter_mut()
            .enumerate()
            .filter(|(_, r)| r.as_ref().is_some_and(|r| r.live == 0))
            .map(|(id, r)| (id, r.take().expect("filtered").outs))
            .collect();
        if still.len() < self.rows.len() {
            self.keep_rows(&still)?;
        }
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

    /// One forward pass over every live row and the chunks of the first prompts being fed
    /// (`takes[i]` tokens of prompt `i`); samples each row's next token and starts the
    /// continuations of the prompts fed to their end.
    fn run_step(&mut self, takes: &[usize]) -> Result<()> {
        let dev = &self.model.device;
        let decoding = (!self.rows.is_empty())
            .then(|| Tensor::new(self.next.as_slice(), dev)?.unsqueeze(1))
            .transpose()?;
        let chunks = self
            .prefills
            .iter()
            .zip(takes)
            .map(|(p, &take)| Tensor::new(&p.tokens[p.fed..p.fed + take], dev)?.unsqueeze(0))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let mut parts = Vec::with_capacity(takes.len() + 1);
        if let Some(ids) = &decoding {
            let cache = match &mut self.cache {
                RowCaches::Own(cache) => BatchCache::Rows(cache),
                RowCaches::Shared(cache) => BatchCache::Padded(cache),
            };
            parts.push(Input::padded(ids, None).cache(cache));
        }
        for (ids, p) in chunks.iter().zip(self.prefills.iter_mut()) {
            parts.push(Input::padded(ids, None).cache(&mut p.cache));
        }
        let input = parts.into_iter().reduce(Input::and).expect("a step of at least one part");
        let mut hidden = self.model.hidden_parts(input)?.into_iter();
        for (p, &take) in self.prefills.iter_mut().zip(takes) {
            p.fed += take;
        }
        let finished = self.prefills[..takes.len()]
            .iter()
            .take_while(|p| p.fed == p.tokens.len())
            .count();
        // The rows that need logits: every continuation's, and each finished prompt's last.
        let mut last = Vec::with_capacity(1 + finished);
        if decoding.is_some() {
            last.push(last_hidden(
                &hidden.next().expect("the decoding batch's hidden states"),
            )?);
        }
        for h in hidden.take(finished) {
            last.push(last_hidden(&h)?);
        }
        if last.is_empty() {
            // Only a prompt's middle chunk ran: nothing to sample yet.
            return Ok(());
        }
        let logits = last_logits(self.model, &Tensor::cat(&last, 0)?.unsqueeze(1)?)?;
        let vocab = logits.dim(1)?;
        let next = with_host_f32(&logits, |all| -> Result<Vec<u32>> {
            let (row_logits, prompt_logits) = all.split_at(self.rows.len() * vocab);
            // Each row draws from its own generator, so the rows sample in parallel (a large
            // vocabulary's softmax is a real share of a decoding step).
            use rayon::prelude::*;
            let requests = &self.requests;
            let next = self
                .rows
                .par_iter_mut()
                .zip(row_logits.par_chunks_exact(vocab))
                .map(|(row, l)| {
                    let req = requests[row.request].as_ref().expect("a live row's request");
                    sample_token(l, &req.params, &mut row.rng)
                })
                .collect();
            let fed_whole: Vec<Prefill> = self.prefills.drain(..finished).collect();
            for (p, logits) in fed_whole.iter().zip(prompt_logits.chunks_exact(vocab)) {
                self.start_continuations(p.request, &p.cache, logits)?;
            }
            Ok(next)
        })??;
        // The rows started above come after the ones sampled here, with their first tokens.
        self.next.splice(..next.len(), next);
        Ok(())
    }

    /// Keeps only the rows `keep` (indices into the rows, ascending), with their caches.
    fn keep_rows(&mut self, keep: &[usize]) -> Result<()> {
        match &mut self.cache {
            RowCaches::Own(cache) => cache.keep(keep),
            RowCaches::Shared(cache) => {
                *cache = if keep.is_empty() {
                    KvCache::default()
                } else {
                    let index = Tensor::new(keep.iter().map(|&k| k as u32).collect::<Vec<_>>(), &self.model.device)?;
                    cache.select(&index)?
                };
            }
        }
        let mut rows = std::mem::take(&mut self.rows).into_iter().map(Some).collect::<Vec<_>>();
        self.rows = keep.iter().map(|&k| rows[k].take().expect("each kept once")).collect();
        self.next = keep.iter().map(|&k| self.next[k]).collect();
        Ok(())
    }
}

/// `f` over the values of an f32 tensor, read where they lie when it is contiguous on the CPU
/// (a decoding step's logits are tens of megabytes: copying them out was a visible share of
/// serving), else copied out first.
fn with_host_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    {
        let (storage, layout) = t.storage_and_layout();
        if let (candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)), Some((start, end))) =
            (&*storage, layout.contiguous_offsets())
        {
            return Ok(f(&v[start..end]));
        }
    }
    Ok(f(&t.flatten_all()?.to_vec1::<f32>()?))
}

/// The hidden state of each sequence's last position, `[b, hidden]`.
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

fn last_hidden(hidden: &Tensor) -> Result<Tensor> {
    let t = hidden.dim(1)?;
    Ok(hidden.i((.., t - 1, ..))?)
}
