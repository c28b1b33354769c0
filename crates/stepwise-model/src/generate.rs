//! Sampling with a KV cache. `n` continuations of one prefix encode the prefix ONCE and share its
//! cache (Monte Carlo rollouts and beams depend on this); rows that stop leave the batch.

use crate::model::{Head, Model};
use crate::tokenizer::Tokenizer;
use crate::transformer::KvCache;
use anyhow::{bail, Result};
use candle_core::{IndexOp, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// How to sample.
#[derive(Debug, Clone)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// Nucleus sampling mass (1.0 = off).
    pub top_p: f32,
    /// Keep only the k most likely tokens (0 = off).
    pub top_k: usize,
    /// Most new tokens per continuation.
    pub max_new_tokens: usize,
    /// Seed: the same seed gives the same samples.
    pub seed: u64,
    /// Token ids that end a continuation (kept in the output).
    pub stop_token_ids: Vec<u32>,
    /// Strings that end a continuation when the decoded new text ends with one (kept).
    pub stop_strings: Vec<String>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_new_tokens: 256,
            seed: 0,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
        }
    }
}

/// Pick a token from one row of logits: greedy at temperature 0, else a draw from the softmax at
/// the temperature (within the `top_k` most likely and the smallest set holding `top_p` of the
/// mass, when set), walking the tokens from the most likely down.
pub fn sample_token(logits: &[f32], p: &SamplingParams, rng: &mut ChaCha8Rng) -> u32 {
    if p.temperature <= 0.0 {
        return logits
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
            .0 as u32;
    }
    let r: f32 = rng.random();
    draw_among_likely(logits, p, r)
        .or_else(|| draw(logits, p, r, &descending_order(logits, 0..logits.len(), p.top_k), None))
        .expect("a draw over the whole order always picks a token")
}

/// Logits this far below the largest, times the temperature, weigh less than `exp(-20)`, under
/// half a unit in the last place of a softmax normaliser (which is at least 1).
const NEGLIGIBLE: f32 = 20.0;

/// [`sample_token`]'s draw `r` from the tokens whose logits lie within [`NEGLIGIBLE`] ×
/// temperature of the largest, sorted alone: what the whole order gives, bit for bit, or `None`
/// where that cannot be shown (few tokens left out, non-finite logits, or a draw reaching past
/// them). A trained model puts most of a 151,936-token vocabulary far below its top tokens.
fn draw_among_likely(logits: &[f32], p: &SamplingParams, r: f32) -> Option<u32> {
    let max = finite_max(logits)?;
    let floor = max - NEGLIGIBLE * p.temperature;
    // Counted before anything is collected: a flat row (a random model's) gives up here.
    if logits.iter().filter(|&&x| x >= floor).count() * 4 > logits.len() {
        return None;
    }
    let likely = logits.iter().enumerate().filter(|(_, &x)| x >= floor).map(|(i, _)| i);
    let order = descending_order(logits, likely, 0);
    // The largest logit below the floor (all are finite here).
    let rest = lane_max(logits, |x| if x < floor { x } else { f32::NEG_INFINITY });
    draw(logits, p, r, &order, Some(rest))
}

/// Lanes of the running maxima: independent chains the compiler turns into vector `max`es (one
/// chain of a 151,936-logit row was most of a trained model's draw).
const MAX_LANES: usize = 16;

/// The largest of `keep(x)` over `xs` (`-∞` when empty), none of them NaN.
fn lane_max(xs: &[f32], keep: impl Fn(f32) -> f32) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; MAX_LANES];
    let chunks = xs.chunks_exact(MAX_LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            let x = keep(x);
            *lane = if x > *lane { x } else { *lane };
        }
    }
    tail.iter()
        .map(|&x| keep(x))
        .chain(lanes)
        .fold(f32::NEG_INFINITY, f32::max)
}

/// The largest logit, or `None` when any is infinite or NaN.
fn finite_max(logits: &[f32]) -> Option<f32> {
    // Exponent bits all set: an infinity or a NaN.
    let non_finite = logits.iter().fold(0u32, |any, &x| {
        any | u32::from(x.to_bits() & 0x7f80_0000 == 0x7f80_0000)
    });
    (non_finite == 0).then(|| lane_max(logits, |x| x))
}

/// The draw `r` among the ids `idx`, in descending logit order: all of them, or (`rest`: the
/// largest logit after them) the leading part of the whole order, in which case `None` when the
/// part does not decide the draw as the whole order would.
fn draw(logits: &[f32], p: &SamplingParams, r: f32, idx: &[usize], rest: Option<f32>) -> Option<u32> {
    let (mut idx, rest) = match p.top_k {
        k if k > 0 && k <= idx.len() => (&idx[..k], None),
        _ => (idx, rest),
    };
    let max = logits[idx[0]];
    let weight = |logit: f32| ((logit - max) / p.temperature).exp();
    let mut probs: Vec<f32> = idx.iter().map(|&i| weight(logits[i])).collect();
    let total: f32 = probs.iter().sum();
    // The whole order adds the later weights to `total` one by one, largest first: when the
    // largest changes nothing, no later one does (rounding is monotonic), and `total` is exact.
    // (Below `NEGLIGIBLE` this holds by construction, as `total` ≥ 1; checked all the same.)
    if rest.is_some_and(|next| total + weight(next) != total) {
        return None;
    }
    if p.top_p >= 1.0 {
        return walk(&probs, total, r, idx, rest.is_none());
    }
    probs.iter_mut().for_each(|x| *x /= total);
    let mut acc = 0.0;
    let keep = probs.iter().position(|&x| {
        acc += x;
        acc >= p.top_p
    });
    let keep = match keep {
        Some(k) => k + 1,
        None if rest.is_none() => probs.len(),
        None => return None,
    };
    probs.truncate(keep);
    idx = &idx[..keep];
    let total: f32 = probs.iter().sum();
    walk(&probs, total, r, idx, true)
}

/// The draw `r` walking `weights` (of the ids `idx`, most likely first) divided by `total`, each
/// quotient taken only when the walk reaches it; past the end, the last id when the ids are
/// `complete`, else `None`.
fn walk(weights: &[f32], total: f32, mut r: f32, idx: &[usize], complete: bool) -> Option<u32> {
    for (&w, &id) in weights.iter().zip(idx) {
        let pr = w / total;
        if r < pr {
            return Some(id as u32);
        }
        r -= pr;
    }
    complete.then(|| idx[weights.len() - 1] as u32)
}

/// The token ids `ids` by descending logit (in `f32::total_cmp`'s order, equal logits by
/// ascending id), the first `top_k` only when it is not 0. Each id is sorted as one 64-bit key (the logit's
/// order-preserving bits above the id): a radix sort for a real vocabulary (a comparison sort of
/// 151,936 ids through their logits took milliseconds a row, most of a decoding step's time),
/// a selection first when only the top k are wanted.
fn descending_order(logits: &[f32], ids: impl Iterator<Item = usize>, top_k: usize) -> Vec<usize> {
    let mut keys: Vec<u64> = ids
        .map(|i| {
            let bits = logits[i].to_bits();
            // Ascending in total_cmp's order as unsigned integers; inverted for descending.
            let ascending = if bits >> 31 == 1 { !bits } else { bits | 1 << 31 };
            u64::from(!ascending) << 32 | i as u64
        })
        .collect();
    if top_k > 0 && top_k < keys.len() {
        keys.select_nth_unstable(top_k - 1);
        keys.truncate(top_k);
    }
    if keys.len() > 4096 {
        // Keys built from ascending ids are already in order in their low half (the id): a
        // stable sort of the high half (the logit) alone then finishes the job.
        let ids_ascending = keys.windows(2).all(|w| (w[0] as u32) < (w[1] as u32));
        radix_sort(&mut keys, if ids_ascending { 32 } else { 0 });
    } else {
        keys.sort_unstable();
    }
    keys.into_iter().map(|k| (k & u64::from(u32::MAX)) as usize).collect()
}

/// Sorts `keys` ascending by their bits from `low_bit` up, stably (keys equal there keep their
/// order): least significant digit first, 11 bits a pass, skipping the digits every key shares.
fn radix_sort(keys: &mut Vec<u64>, low_bit: u32) {
    const BITS: u32 = 11;
    let passes = (64 - low_bit).div_ceil(BITS) as usize;
    let digit = |k: u64, pass: usize| ((k >> (low_bit + pass as u32 * BITS)) & ((1 << BITS) - 1)) as usize;
    let mut counts = vec![[0usize; 1 << BITS]; passes];
    for &k in keys.iter() {
        for (pass, c) in counts.iter_mut().enumerate() {
            c[digit(k, pass)] += 1;
        }
    }
    let mut other = vec![0u64; keys.len()];
    for (pass, c) in counts.iter().enumerate() {
        if c.contains(&keys.len()) {
            continue;
        }
        let mut start = [0usize; 1 << BITS];
        let mut at = 0;
        for (s, &n) in start.iter_mut().zip(c.iter()) {
            *s = at;
            at += n;
        }
        for &k in keys.iter() {
            let d = digit(k, pass);
            other[start[d]] = k;
            start[d] += 1;
        }
        std::mem::swap(keys, &mut other);
    }
}

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
/// - [`Decoding::add`]: its prompt is encoded at once, in a pass of its own, and its cache joined
///   to the batch's with left padding (see [`KvCache`]);
/// - [`Decoding::join`]: its prompt is fed through the batch's own decoding steps, one token a
///   step in a row of its own (chunked prefill one token wide), so a short prompt costs no pass
///   over the weights of its own; at its last token the row becomes its `n` continuations.
///
/// A request alone decodes exactly as [`generate`] (which is [`Decoding::add`]); beside others,
/// or joined, its rows compute the same values within float rounding.
pub struct Decoding<'a> {
    model: &'a Model,
    tok: Option<&'a Tokenizer>,
    cache: KvCache,
    /// Live rows, in the cache's batch order.
    rows: Vec<Row>,
    /// Each live row's next input token (sampled, or the next prompt token).
    next: Vec<u32>,
    /// Requests by id (`None` once returned).
    requests: Vec<Option<Request>>,
    /// The last decoding step's rows: continuations, and prompts being fed.
    last_step: StepRows,
}

/// The rows of one decoding step's forward pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepRows {
    /// Rows continuing a sampled token.
    pub continuations: usize,
    /// Rows feeding a prompt token ([`Decoding::join`]).
    pub prompts: usize,
}

/// One row of the batch.
struct Row {
    request: usize,
    kind: RowKind,
}

enum RowKind {
    /// One continuation being decoded.
    Continuation { index: usize, rng: Box<ChaCha8Rng> },
    /// A joining request's prompt, fed one token a step; `fed` tokens are in the cache or in
    /// this step's input.
    Prompt { tokens: Vec<u32>, fed: usize },
}

/// A request's settings and continuations so far.
struct Request {
    params: SamplingParams,
    outs: Vec<Vec<u32>>,
    live: usize,
}

/// Continuation `index`'s generator: the same for [`Decoding::add`] and [`Decoding::join`].
fn continuation_rng(params: &SamplingParams, index: usize) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(params.seed.wrapping_mul(1_000_003).wrapping_add(index as u64))
}

/// What a row's logits of one step give.
enum Drawn {
    /// A continuation's next token.
    Token(u32),
    /// A prompt's next token to feed.
    Feed(u32),
    /// A prompt fed whole: its continuations, each with its generator and first token.
    Continuations(Vec<(Box<ChaCha8Rng>, u32)>),
}

impl<'a> Decoding<'a> {
    /// An empty batch for `model` (`tok` decodes text for stop strings).
    pub fn new(model: &'a Model, tok: Option<&'a Tokenizer>) -> Self {
        Decoding {
            model,
            tok,
            cache: KvCache::default(),
            rows: Vec::new(),
            next: Vec::new(),
            requests: Vec::new(),
            last_step: StepRows::default(),
        }
    }

    /// Rows being decoded: continuations, and prompts being fed.
    pub fn live_rows(&self) -> usize {
        self.rows.len()
    }

    /// The rows the last [`Decoding::step`] ran its forward pass on.
    pub fn last_step(&self) -> StepRows {
        self.last_step
    }

    /// Whether no request is waiting for [`Decoding::step`].
    pub fn is_idle(&self) -> bool {
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
        let live = Self::live_continuations(prompt, n, &params)?;
        if live > 0 {
            let mut prefix_cache = KvCache::default();
            let ids = Tensor::new(prompt, &self.model.device)?.unsqueeze(0)?;
            let h = self.model.hidden(&ids, None, Some(&mut prefix_cache))?;
            let first: Vec<f32> = last_logits(self.model, &h)?.squeeze(0)?.to_vec1()?;
            let joining = prefix_cache.repeat_batch(n)?;
            self.cache = if self.rows.is_empty() {
                joining
            } else {
                self.cache.concat_batch(&joining)?
            };
            let id = self.requests.len();
            for index in 0..n {
                let mut rng = Box::new(continuation_rng(&params, index));
                self.next.push(sample_token(&first, &params, &mut rng));
                self.rows.push(Row {
                    request: id,
                    kind: RowKind::Continuation { index, rng },
                });
            }
        }
        Ok(self.register(params, n, live))
    }

    /// Add a request for `n` continuations of `prompt` whose prompt is fed through the coming
    /// decoding steps, one token a step, in one row beside the others (no forward pass of its
    /// own); after its last prompt token the row becomes `n` continuations, each drawing its
    /// first token as [`Decoding::add`] would. Into an empty batch it is [`Decoding::add`].
    /// Worth it for short prompts joining a running batch: a decoding step of a few rows is
    /// bound by reading the weights, so a row more costs little, where a pass of its own reads
    /// every weight again.
    pub fn join(&mut self, prompt: &[u32], n: usize, params: SamplingParams) -> Result<usize> {
        if self.rows.is_empty() {
            return self.add(prompt, n, params);
        }
        let live = Self::live_continuations(prompt, n, &params)?;
        let id = self.register(params, n, live);
        if live > 0 {
            self.cache = self.cache.with_empty_row()?;
            self.next.push(prompt[0]);
            self.rows.push(Row {
                request: id,
                kind: RowKind::Prompt {
                    tokens: prompt.to_vec(),
                    fed: 1,
                },
            });
        }
        Ok(id)
    }

    /// Append each continuation's next token; continuations that stop (a stop token or string,
    /// or their token budget) leave the batch; every live row runs one decoding step. Returns
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
        for (k, row) in self.rows.iter().enumerate() {
            let RowKind::Continuation { index, .. } = row.kind else {
                still.push(k);
                continue;
            };
            let req = self.requests[row.request].as_mut().expect("a live row's request");
            let out = &mut req.outs[index];
            out.push(self.next[k]);
            let p = &req.params;
            let stopped = p.stop_token_ids.contains(&self.next[k])
                || out.len() >= p.max_new_tokens
                || (!p.stop_strings.is_empty()
                    && self
                        .tok
                        .and_then(|t| t.decode(out).ok())
                        .is_some_and(|text| p.stop_strings.iter().any(|s| text.ends_with(s.as_str()))));
            if stopped {
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
        let prompts = self
            .rows
            .iter()
            .filter(|r| matches!(r.kind, RowKind::Prompt { .. }))
            .count();
        self.last_step = StepRows {
            prompts,
            continuations: self.rows.len() - prompts,
        };
        if !self.rows.is_empty() {
            let ids = Tensor::new(self.next.as_slice(), &self.model.device)?.unsqueeze(1)?;
            let h = self.model.hidden(&ids, None, Some(&mut self.cache))?;
            let logits = last_logits(self.model, &h)?.to_vec2::<f32>()?;
            // Each row draws from its own generator, so the rows sample in parallel (a large
            // vocabulary's sort and softmax are a real share of a decoding step).
            use rayon::prelude::*;
            let requests = &self.requests;
            let drawn: Vec<Drawn> = self
                .rows
                .par_iter_mut()
                .zip(logits.par_iter())
                .map(|(row, l)| {
                    let req = requests[row.request].as_ref().expect("a live row's request");
                    let p = &req.params;
                    match &mut row.kind {
                        RowKind::Continuation { rng, .. } => Drawn::Token(sample_token(l, p, rng)),
                        RowKind::Prompt { tokens, fed } if *fed < tokens.len() => {
                            *fed += 1;
                            Drawn::Feed(tokens[*fed - 1])
                        }
                        RowKind::Prompt { .. } => Drawn::Continuations(
                            (0..req.outs.len())
                                .into_par_iter()
                                .map(|index| {
                                    let mut rng = Box::new(continuation_rng(p, index));
                                    let first = sample_token(l, p, &mut rng);
                                    (rng, first)
                                })
                                .collect(),
                        ),
                    }
                })
                .collect();
            self.apply(drawn)?;
        }
        if self.is_idle() {
            self.requests.clear();
        }
        Ok(done)
    }

    /// Keeps only the rows `keep` (indices into the rows, ascending), with their caches.
    fn keep_rows(&mut self, keep: &[usize]) -> Result<()> {
        self.select_cache(keep)?;
        let mut rows = std::mem::take(&mut self.rows).into_iter().map(Some).collect::<Vec<_>>();
        self.rows = keep.iter().map(|&k| rows[k].take().expect("each kept once")).collect();
        self.next = keep.iter().map(|&k| self.next[k]).collect();
        Ok(())
    }

    /// The cache of the rows `order` (indices into the rows, a row repeated to copy its cache),
    /// or an empty one for none.
    fn select_cache(&mut self, order: &[usize]) -> Result<()> {
        self.cache = if order.is_empty() {
            KvCache::default()
        } else {
            let index = Tensor::new(order.iter().map(|&k| k as u32).collect::<Vec<_>>(), &self.model.device)?;
            self.cache.select(&index)?
        };
        Ok(())
    }

    /// Sets each row's next token from what its logits gave, turning prompts fed whole into
    /// their continuations (the prompt row's cache repeated for each).
    fn apply(&mut self, drawn: Vec<Drawn>) -> Result<()> {
        let mut fanned = false;
        for (k, d) in drawn.iter().enumerate() {
            match d {
                Drawn::Token(t) | Drawn::Feed(t) => self.next[k] = *t,
                Drawn::Continuations(_) => fanned = true,
            }
        }
        if !fanned {
            return Ok(());
        }
        let mut order = Vec::with_capacity(self.rows.len());
        let mut rows = Vec::with_capacity(self.rows.len());
        let mut next = Vec::with_capacity(self.rows.len());
        for (k, (row, d)) in std::mem::take(&mut self.rows).into_iter().zip(drawn).enumerate() {
            match d {
                Drawn::Continuations(firsts) => {
                    for (index, (rng, first)) in firsts.into_iter().enumerate() {
                        order.push(k);
                        next.push(first);
                        rows.push(Row {
                            request: row.request,
                            kind: RowKind::Continuation { index, rng },
                        });
                    }
                }
                _ => {
                    order.push(k);
                    next.push(self.next[k]);
                    rows.push(row);
                }
            }
        }
        self.select_cache(&order)?;
        self.rows = rows;
        self.next = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The order by sorting ids through their logits: descending, equal logits by ascending id.
    fn by_comparison(logits: &[f32], top_k: usize) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if top_k > 0 {
            idx.truncate(top_k);
        }
        idx
    }

    #[test]
    fn descending_order_is_the_comparison_sort() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for n in [1, 7, 100, 5000, 151_936] {
            // Ties (values on a coarse grid), negative values, zeros of both signs, infinities.
            let mut logits: Vec<f32> = (0..n)
                .map(|_| (rng.random::<f32>() * 64.0 - 32.0).round() / 4.0)
                .collect();
            if n > 10 {
                logits[3] = -0.0;
                logits[5] = f32::NEG_INFINITY;
                logits[8] = f32::INFINITY;
            }
            for top_k in [0, 1, 50, n] {
                assert_eq!(
                    descending_order(&logits, 0..n, top_k),
                    by_comparison(&logits, top_k),
                    "{n} ids, top {top_k}"
                );
            }
        }
    }

    /// The draw as it was written before any shortcut: the whole vocabulary sorted by
    /// comparison, the softmax over it, the walk from the top.
    fn reference_draw(logits: &[f32], p: &SamplingParams, mut r: f32) -> u32 {
        let mut idx = by_comparison(logits, p.top_k);
        let max = logits[idx[0]];
        let mut probs: Vec<f32> = idx.iter().map(|&i| ((logits[i] - max) / p.temperature).exp()).collect();
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let keep = probs.iter().position(|&x| {
                acc += x;
                acc >= p.top_p
            });
            let keep = keep.map_or(probs.len(), |k| k + 1);
            probs.truncate(keep);
            idx.truncate(keep);
            let total: f32 = probs.iter().sum();
            probs.iter_mut().for_each(|x| *x /= total);
        }
        for (k, &pr) in probs.iter().enumerate() {
            if r < pr {
                return idx[k] as u32;
            }
            r -= pr;
        }
        idx[probs.len() - 1] as u32
    }

    /// Sampling draws exactly the token of the whole-vocabulary reference, for peaked logits
    /// (where only the likely tokens are sorted) and flat ones, every temperature, top-k and
    /// top-p, including draws at the very top of the unit interval.
    #[test]
    fn sampling_draws_what_the_whole_order_draws() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut shortcut = 0;
        for case in 0..30 {
            let n = [50, 5000, 151_936][case % 3];
            let peaked = case % 2 == 0;
            let logits: Vec<f32> = (0..n)
                .map(|i| {
                    let bulk = (rng.random::<f32>() - 0.5) * 6.0;
                    if peaked && i % 997 == 0 {
                        bulk + 28.0
                    } else {
                        bulk
                    }
                })
                .collect();
            for (temperature, top_k, top_p) in [
                (0.8, 0, 1.0),
                (0.3, 0, 0.9),
                (1.5, 20, 1.0),
                (1.0, 3, 0.5),
                (0.7, n, 1.0),
            ] {
                let p = SamplingParams {
                    temperature,
                    top_k,
                    top_p,
                    ..Default::default()
                };
                for r in [0.0, rng.random::<f32>(), rng.random::<f32>(), 0.999_999_9] {
                    let want = reference_draw(&logits, &p, r);
                    shortcut += usize::from(draw_among_likely(&logits, &p, r).is_some());
                    let got = draw_among_likely(&logits, &p, r)
                        .or_else(|| draw(&logits, &p, r, &descending_order(&logits, 0..n, top_k), None))
                        .unwrap();
                    assert_eq!(got, want, "{n} logits, peaked {peaked}, {p:?}, r {r}");
                }
            }
        }
        assert!(shortcut > 50, "the shortcut decided only {shortcut} draws");
    }
}
