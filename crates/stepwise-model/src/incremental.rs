//! Incremental scoring for step-level search: when a beam grows by one step, the PRM encodes only
//! the new tokens on top of the cached prefix.
//!
//! [`IncrementalScorer`] wraps a [`PrmScorer`] and remembers every sequence it scored: its token
//! ids, its KV cache (and the reference model's, for a log-ratio verifier) and what was read at
//! each position. A new input is matched with the remembered sequence of the same problem that
//! shares its longest token prefix (its parent beam, or a sibling); only the tokens after that
//! prefix run through the model, so what a problem costs does not depend on the problems scored
//! beside it. Inputs that continue the same prefix from the same point
//! run as one batch on a shared copy of its cache. The scores are those of scoring the whole text
//! at once (causal attention: a position never sees what follows), whatever the layout:
//! classifier layouts read the new reward positions, a log-ratio verifier the new tokens'
//! log-probabilities (it starts one token back, to predict the first new token).
//!
//! Memory is bounded: the least recently used sequences are forgotten past
//! [`IncrementalScorer::with_capacity`] bytes of cache.

use crate::kv_cache::KvCache;
use crate::layout::{Encoded, PrmLayout};
use crate::model::{pad_batch, Model};
use crate::scoring::PrmScorer;
use anyhow::{ensure, Context, Result};
use candle_core::{Tensor, D};
use std::collections::BTreeMap;
use std::sync::Mutex;
use stepwise_core::seams::{ScoreInput, Scored, StepScorer};

/// Default bound on the cached keys and values: 512 MiB.
pub const DEFAULT_CAPACITY: usize = 512 << 20;

/// A [`PrmScorer`] that encodes only what it has not seen (see the module docs).
pub struct IncrementalScorer<'a> {
    scorer: PrmScorer<'a>,
    store: Mutex<Store>,
}

/// One remembered sequence.
struct Entry {
    /// The problem it belongs to: only its own problem's inputs reuse it, so what a problem's
    /// scoring costs does not depend on which problems were scored beside it.
    problem: String,
    ids: Vec<u32>,
    /// The verifier's cache of `ids`, then the reference model's (log-ratio against a model).
    kv: Vec<KvCache>,
    /// What was read at each position: a classifier layout's P(good) at its reward positions
    /// (NaN elsewhere); a log-ratio verifier's log-ratio of each token (0 at position 0).
    values: Vec<f32>,
    used: u64,
    bytes: usize,
}

#[derive(Default)]
struct Store {
    entries: Vec<Entry>,
    clock: u64,
    bytes: usize,
    capacity: usize,
}

/// How one input is scored: positions `..start` come from a remembered sequence (`values` holds
/// what was read there), positions `start..` are encoded.
struct Plan {
    start: usize,
    values: Vec<f32>,
    /// The caches of the first `start` positions (empty when `start` is 0).
    kv: Vec<KvCache>,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Store {
    /// Where to start encoding `e`, and what can be reused.
    fn plan(&mut self, problem: &str, e: &Encoded, log_ratio: bool, models: usize) -> Result<Plan> {
        let t = e.ids.len();
        let best = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, en)| en.problem == problem)
            .map(|(k, en)| (common_prefix(&en.ids, &e.ids), en.used, k))
            .max();
        let Some((shared, _, k)) = best.filter(|b| b.0 > 0) else {
            return Ok(Plan {
                start: 0,
                values: vec![f32::NAN; t],
                kv: Vec::new(),
            });
        };
        self.clock += 1;
        let entry = &mut self.entries[k];
        entry.used = self.clock;
        let reusable = shared.min(t);
        let start = if reusable == t {
            // Everything was seen (the input is a prefix of a remembered sequence).
            t
        } else if log_ratio {
            // The first new token's log-probability is read at the position before it.
            shared - 1
        } else {
            // A reward position the remembered sequence did not read is encoded again.
            (0..shared)
                .find(|&p| e.positions.contains(&p) && entry.values[p].is_nan())
                .unwrap_or(shared)
        };
        let mut values = vec![f32::NAN; t];
        values[..reusable].copy_from_slice(&entry.values[..reusable]);
        let kv = if start == 0 || start == t {
            Vec::new()
        } else {
            entry.kv.iter().map(|c| c.row_prefix(0, start)).collect::<Result<_>>()?
        };
        ensure!(
            start == t || start == 0 || kv.len() == models,
            "a remembered sequence lacks a cache"
        );
        Ok(Plan { start, values, kv })
    }

    /// Remember a scored sequence, forgetting the least recently used past the capacity.
    fn insert(&mut self, problem: &str, ids: Vec<u32>, kv: Vec<KvCache>, values: Vec<f32>) {
        if self.entries.iter().any(|en| en.problem == problem && en.ids == ids) {
            return;
        }
        self.clock += 1;
        let bytes = kv.iter().map(KvCache::bytes).sum::<usize>() + 4 * (ids.len() + values.len());
        self.bytes += bytes;
        self.entries.push(Entry {
            problem: problem.to_string(),
            ids,
            kv,
            values,
            used: self.clock,
            bytes,
        });
        while self.bytes > self.capacity && !self.entries.is_empty() {
            let oldest = (0..self.entries.len())
                .min_by_key(|&k| self.entries[k].used)
                .unwrap_or(0);
            self.bytes -= self.entries.swap_remove(oldest).bytes;
        }
    }
}

impl<'a> IncrementalScorer<'a> {
    /// Incremental scoring with `scorer`, remembering up to [`DEFAULT_CAPACITY`] bytes of cache.
    pub fn new(scorer: PrmScorer<'a>) -> Self {
        Self::with_capacity(scorer, DEFAULT_CAPACITY)
    }

    /// Incremental scoring remembering up to `bytes` of keys and values.
    pub fn with_capacity(scorer: PrmScorer<'a>, bytes: usize) -> Self {
        IncrementalScorer {
            scorer,
            store: Mutex::new(Store {
                capacity: bytes,
                ..Default::default()
            }),
        }
    }

    /// The models that read each input: the verifier, then its reference model if it has one.
    fn models(&self) -> Vec<&Model> {
        let mut m = vec![self.scorer.model];
        if let PrmLayout::LogRatio { log_ratio, .. } = &self.scorer.layout {
            if log_ratio.reference_logprob.is_none() {
                m.extend(self.scorer.reference);
            }
        }
        m
    }

    /// Encode `ids[start..]` of the `members` (which share `kv`, the caches of their first
    /// `start` positions) and fill in their values; returns each member's full caches.
    fn encode_group(
        &self,
        enc: &[Encoded],
        plans: &mut [Plan],
        members: &[usize],
        start: usize,
        kv: &[KvCache],
    ) -> Result<Vec<Vec<KvCache>>> {
        let models = self.models();
        let tails: Vec<&[u32]> = members.iter().map(|&i| &enc[i].ids[start..]).collect();
        let dev = &self.scorer.model.device;
        let (ids, _, width) = pad_batch(&tails, dev)?;
        let padded = tails.iter().any(|t| t.len() < width);
        let mask = if padded {
            let m: Vec<f32> = tails
                .iter()
                .flat_map(|t| (0..start + width).map(move |p| f32::from(u8::from(p < start + t.len()))))
                .collect();
            Some(Tensor::from_vec(m, (tails.len(), start + width), dev)?)
        } else {
            None
        };
        let mut caches = Vec::with_capacity(models.len());
        let mut hidden = Vec::with_capacity(models.len());
        for (k, model) in models.iter().enumerate() {
            let mut cache = match kv.get(k) {
                Some(c) => c.repeat_batch(members.len())?,
                None => KvCache::default(),
            };
            hidden.push(model.hidden(crate::Input::padded(&ids, mask.as_ref()).cache(&mut cache))?);
            caches.push(cache);
        }
        match &self.scorer.layout {
            PrmLayout::LogRatio { log_ratio, .. } => {
                // Row q of member i predicts token start + q + 1.
                let next: Vec<u32> = members
                    .iter()
                    .flat_map(|&i| {
                        let ids = &enc[i].ids;
                        (0..width).map(move |q| ids.get(start + q + 1).copied().unwrap_or(0))
                    })
                    .collect();
                let next = Tensor::from_vec(next, (members.len(), width, 1), dev)?;
                let logprob = |model: &Model, h: &Tensor| -> Result<Vec<Vec<f32>>> {
                    let lp = candle_nn::ops::log_softmax(&model.head_logits(h)?, D::Minus1)?;
                    Ok(lp.gather(&next, 2)?.squeeze(2)?.to_vec2()?)
                };
                let own = logprob(models[0], &hidden[0])?;
                let reference = match log_ratio.reference_logprob {
                    Some(_) => None,
                    None => Some(logprob(models[1], &hidden[1])?),
                };
                for (row, &i) in members.iter().enumerate() {
                    let t = enc[i].ids.len();
                    for q in 0..t - start - 1 {
                        let r = match (&reference, log_ratio.reference_logprob) {
                            (Some(r), _) => r[row][q],
                            (None, c) => c.unwrap_or(0.0),
                        };
                        plans[i].values[start + q + 1] = own[row][q] - r;
                    }
                    if start == 0 {
                        plans[i].values[0] = 0.0;
                    }
                }
            }
            layout => {
                // Read the reward positions this group encoded, all in one head call.
                let mut rows = Vec::new();
                let mut at = Vec::new();
                for (row, &i) in members.iter().enumerate() {
                    for &p in enc[i].positions.iter().filter(|&&p| p >= start) {
                        rows.push(hidden[0].get(row)?.get(p - start)?);
                        at.push((i, p));
                    }
                }
                if !rows.is_empty() {
                    let mut logits = self.scorer.model.head_logits(&Tensor::stack(&rows, 0)?)?;
                    if let Some(c) = layout.head_columns(self.scorer.tokenizer)? {
                        logits = logits.index_select(&Tensor::new(&c, logits.device())?, 1)?;
                    }
                    let width = logits.dim(1)?;
                    let rewards = crate::pooler::good_probs(logits.flatten_all()?.to_vec1()?, width)?;
                    for ((i, p), r) in at.into_iter().zip(rewards) {
                        plans[i].values[p] = r;
                    }
                }
            }
        }
        members
            .iter()
            .enumerate()
            .map(|(row, &i)| {
                caches
                    .iter()
                    .map(|c| c.row_prefix(row, enc[i].ids.len()))
                    .collect::<Result<Vec<_>>>()
            })
            .collect()
    }

    /// Step scores from the values read at every position.
    fn scores(&self, e: &Encoded, values: &[f32]) -> Result<Vec<f32>> {
        let scores: Vec<f32> = match &self.scorer.layout {
            PrmLayout::LogRatio { log_ratio, .. } => log_ratio
                .step_spans(e.steps_from.max(1), &e.positions)
                .into_iter()
                .map(|(s, end)| {
                    let sum: f32 = values[s..=end].iter().sum();
                    1.0 / (1.0 + (-log_ratio.beta * sum).exp())
                })
                .collect(),
            _ => e.positions.iter().map(|&p| values[p]).collect(),
        };
        ensure!(
            scores.iter().all(|s| !s.is_nan()),
            "incremental scoring left a step unread (a bug: please report it)"
        );
        Ok(scores)
    }
}

impl IncrementalScorer<'_> {
    /// Score encoded inputs: reuse what is remembered, encode the rest, remember the results.
    /// Returns the scores and the tokens encoded.
    fn score_encoded(&self, problems: &[&str], enc: &[Encoded]) -> Result<(Vec<Vec<f32>>, usize)> {
        let log_ratio = matches!(self.scorer.layout, PrmLayout::LogRatio { .. });
        let models = self.models().len();
        let mut plans = {
            let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
            enc.iter()
                .zip(problems)
                .map(|(e, problem)| store.plan(problem, e, log_ratio, models))
                .collect::<Result<Vec<_>>>()?
        };
        // Inputs that continue the same cached prefix from the same point form one batch.
        let mut groups: BTreeMap<(usize, Vec<u32>), Vec<usize>> = BTreeMap::new();
        for (i, (e, p)) in enc.iter().zip(&plans).enumerate() {
            if p.start < e.ids.len() {
                groups.entry((p.start, e.ids[..p.start].to_vec())).or_default().push(i);
            }
        }
        let mut tokens = 0;
        let mut fresh = Vec::new();
        for ((start, _), members) in groups {
            let kv = std::mem::take(&mut plans[members[0]].kv);
            let caches = self
                .encode_group(enc, &mut plans, &members, start, &kv)
                .with_context(|| format!("encoding {} inputs from position {start}", members.len()))?;
            tokens += members.iter().map(|&i| enc[i].ids.len() - start).sum::<usize>();
            fresh.extend(members.into_iter().zip(caches));
        }
        let scores = enc
            .iter()
            .zip(&plans)
            .map(|(e, p)| self.scores(e, &p.values))
            .collect::<Result<Vec<_>>>()?;
        let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
        for (i, kv) in fresh {
            store.insert(
                problems[i],
                enc[i].ids.clone(),
                kv,
                std::mem::take(&mut plans[i].values),
            );
        }
        Ok((scores, tokens))
    }

    /// When the inputs of a batch share a prefix that nothing remembered covers (the first step
    /// of a search: every candidate repeats the question), encode it once first. Returns the
    /// tokens encoded.
    fn encode_shared_prefix(&self, problems: &[&str], enc: &[Encoded]) -> Result<usize> {
        let Some((first, rest)) = enc.split_first() else {
            return Ok(0);
        };
        if rest.is_empty() || problems.iter().any(|p| *p != problems[0]) {
            return Ok(0);
        }
        let shared = rest
            .iter()
            .fold(first.ids.len(), |n, e| common_prefix(&first.ids[..n], &e.ids));
        let known = {
            let store = self.store.lock().unwrap_or_else(|p| p.into_inner());
            store
                .entries
                .iter()
                .filter(|en| en.problem == problems[0])
                .map(|en| common_prefix(&en.ids, &first.ids[..shared]))
                .max()
                .unwrap_or(0)
        };
        // Worth it when it saves more than the token a log-ratio verifier re-reads.
        if shared < known + 2 {
            return Ok(0);
        }
        let prefix = Encoded {
            ids: first.ids[..shared].to_vec(),
            positions: first.positions.iter().copied().filter(|&p| p < shared).collect(),
            steps_from: first.steps_from.min(shared),
        };
        Ok(self.score_encoded(&problems[..1], std::slice::from_ref(&prefix))?.1)
    }
}

impl StepScorer for IncrementalScorer<'_> {
    fn score(&self, batch: &[ScoreInput<'_>]) -> Result<Scored> {
        let enc = batch
            .iter()
            .map(|s| self.scorer.encode(s.question, &s.steps))
            .collect::<Result<Vec<_>>>()?;
        let problems: Vec<&str> = batch.iter().map(|s| s.problem_id).collect();
        let warm = self.encode_shared_prefix(&problems, &enc)?;
        let (scores, tokens) = self.score_encoded(&problems, &enc)?;
        Ok(Scored {
            scores,
            tokens: warm + tokens,
        })
    }
}
