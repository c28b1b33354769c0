//! Fixed continuations weighed after their contexts on the packed engine
//! ([`PackedDecoder::options_after`]): what a judge's verdicts are weighed with, and a served
//! model's `echo` log-probabilities. Each context is fed once into a paged KV cache; its options
//! then go on from it (the cache forked, as generation's continuations of one prompt), so `k`
//! options after a long prompt cost the prompt once and their own few tokens, not the prompt `k`
//! times. Every option's first token is read from its context's last row, shared. A start of
//! 8 tokens or more that two or more contexts share (the judge's prompts of one question's
//! solutions) is fed once too, as generation's primers are ([`crate::primers`]).

use super::paged::{blocks_for, PagedCache, PagedSeq, BLOCK};
use super::{Backend, PackedDecoder};
use crate::primers::shared_starts;
use anyhow::{bail, Context, Result};
use std::ops::Range;

/// One query: a context, and each option's token ids after it.
pub type Query<'a> = (&'a [u32], &'a [Vec<u32>]);

/// `log Σ exp(logits)`, in f64: a row's log-softmax at `t` is `logits[t]` less it.
pub fn log_normalizer(logits: &[f32]) -> f64 {
    let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let total: f64 = logits.iter().map(|&x| (x as f64 - top).exp()).sum();
    top + total.ln()
}

/// `logits[token]` less the row's normalizer, or an error naming a token past the vocabulary.
pub fn logprob_at(logits: &[f32], norm: f64, token: u32) -> Result<f64> {
    let at = logits
        .get(token as usize)
        .with_context(|| format!("token {token} is past the model's vocabulary ({})", logits.len()))?;
    Ok(*at as f64 - norm)
}

/// Consecutive runs of items whose costs `(tokens, rows)` sum to at most `most` in both (an
/// item costing more is a run alone), covering every item in order.
fn runs(costs: impl Iterator<Item = (usize, usize)>, most: (usize, usize)) -> Vec<Range<usize>> {
    let (mut out, mut start, mut sum) = (Vec::new(), 0, (0, 0));
    let mut n = 0;
    for (i, c) in costs.enumerate() {
        if sum != (0, 0) && (sum.0 + c.0 > most.0 || sum.1 + c.1 > most.1) {
            out.push(start..i);
            (start, sum) = (i, (0, 0));
        }
        sum = (sum.0 + c.0, sum.1 + c.1);
        n = i + 1;
    }
    if n > start {
        out.push(start..n);
    }
    out
}

/// Refuses a query that cannot be weighed: an empty context, an option of no tokens, or a
/// context and option past the model's `positions`.
pub fn check_queries(queries: &[Query<'_>], positions: usize) -> Result<()> {
    for &(context, options) in queries {
        if context.is_empty() {
            bail!("an empty prompt: there is no position to read the options' first token at");
        }
        if options.iter().any(Vec::is_empty) {
            bail!("an option of no tokens");
        }
        if let Some(o) = options.iter().find(|o| context.len() + o.len() > positions) {
            bail!(
                "the prompt, the text written and an option make {} tokens: more than the model's context ({positions})",
                context.len() + o.len()
            );
        }
    }
    Ok(())
}

/// One option that goes on past its first token: its query, its index there, and its tokens.
struct Fork<'a> {
    query: usize,
    option: usize,
    tokens: &'a [u32],
}

impl Fork<'_> {
    /// The tokens fed after the context (all but the last, which only is read).
    fn fed(&self) -> &[u32] {
        &self.tokens[..self.tokens.len() - 1]
    }

    /// The cache blocks of its own it needs after a context of `context` tokens.
    fn blocks(&self, context: usize) -> usize {
        blocks_for(context + self.fed().len()) - context / BLOCK
    }
}

impl<B: Backend> PackedDecoder<B> {
    /// For each query `(context, options)`, each option's log-probability after the context
    /// (its tokens' summed). Contexts are fed in groups of at most `max_tokens` tokens (a longer
    /// one alone) and kept in a paged cache; the options that go on past their first token are
    /// fed from forks of it, as many at once as the LM head's logits budget holds.
    pub fn options_after(&self, queries: &[Query<'_>], max_tokens: usize) -> Result<Vec<Vec<f64>>> {
        check_queries(queries, self.config.max_position_embeddings)?;
        let rows_a_pass = (self.logits_bytes / (4 * self.config.vocab_size.max(1))).max(1);
        let most = (max_tokens.max(1), rows_a_pass);
        let mut out: Vec<Vec<f64>> = queries.iter().map(|q| vec![0.0; q.1.len()]).collect();
        for group in runs(queries.iter().map(|q| (q.0.len(), 1)), most) {
            self.options_of_group(&queries[group.clone()], most, &mut out[group])?;
        }
        Ok(out)
    }

    /// [`Self::options_after`] for one group of queries, into `out` (zeros, each option's slot).
    /// `most`: the tokens fed and rows read a pass at most.
    fn options_of_group(&self, group: &[Query<'_>], most: (usize, usize), out: &mut [Vec<f64>]) -> Result<()> {
        let forks: Vec<Fork> = (group.iter().enumerate())
            .flat_map(|(query, q)| {
                (q.1.iter().enumerate())
                    .filter(|(_, o)| o.len() > 1)
                    .map(move |(option, o)| Fork { query, option, tokens: o })
            })
            .collect();
        // Passes of forks: each fed token's row is read.
        let passes = runs(forks.iter().map(|f| (f.fed().len(), f.fed().len())), most);
        let fork_blocks = (passes.iter())
            .map(|pass| forks[pass.clone()].iter().map(|f| f.blocks(group[f.query].0.len())).sum::<usize>())
            .max()
            .unwrap_or(0);
        // Starts two or more contexts share, fed once (each context's last token is its own: its
        // row is read).
        let heads: Vec<&[u32]> = group.iter().map(|q| &q.0[..q.0.len() - 1]).collect();
        let starts = shared_starts(&heads, |_| false);
        let start_blocks: usize = starts.iter().flatten().map(|(s, _)| blocks_for(s.len())).sum();
        let context_blocks: usize = group.iter().map(|q| blocks_for(q.0.len())).sum();
        let mut cache = PagedCache::new(self, start_blocks + context_blocks + fork_blocks)?;
        let (contexts, logits) = self.contexts_fed(group, &starts, &mut cache)?;
        let vocab = self.config.vocab_size;
        for ((row, q), sums) in logits.chunks(vocab).zip(group).zip(out.iter_mut()) {
            let norm = log_normalizer(row);
            for (sum, o) in sums.iter_mut().zip(q.1) {
                *sum += logprob_at(row, norm, o[0])?;
            }
        }
        // The rest of each option, from a fork of its context.
        for pass in passes {
            let pass = &forks[pass];
            let mut seqs = Vec::with_capacity(pass.len());
            for f in pass {
                let mut seq = cache.fork(self.backend(), &contexts[f.query])?;
                let len = seq.len + f.fed().len();
                cache.grow(&mut seq, len)?;
                seqs.push(seq);
            }
            let read: Vec<usize> = (0..pass.iter().map(|f| f.fed().len()).sum()).collect();
            let mut fed: Vec<(&mut PagedSeq, &[u32])> = seqs.iter_mut().zip(pass.iter().map(Fork::fed)).collect();
            let logits = self.logits_paged(&mut fed, &mut cache, &read)?;
            let mut rows = logits.chunks(vocab);
            for f in pass {
                for &token in &f.tokens[1..] {
                    let row = rows.next().context("the engine read fewer rows than asked")?;
                    out[f.query][f.option] += logprob_at(row, log_normalizer(row), token)?;
                }
            }
            for seq in &mut seqs {
                cache.release(seq);
            }
        }
        Ok(())
    }

    /// The contexts of `group` fed into `cache`, their `starts` first (level by level, each from
    /// the longest fed start it begins with), then each context from the longest start it
    /// begins with: their sequences, and the logits of each one's last row.
    fn contexts_fed(
        &self,
        group: &[Query<'_>],
        starts: &[Vec<(&[u32], usize)>],
        cache: &mut PagedCache<B>,
    ) -> Result<(Vec<PagedSeq>, Vec<f32>)> {
        let mut fed: Vec<(&[u32], PagedSeq)> = Vec::new();
        for level in starts {
            let mut seqs = Vec::with_capacity(level.len());
            for &(start, _) in level {
                seqs.push(self.seq_after_longest(cache, &fed, start)?);
            }
            let mut feed: Vec<(&mut PagedSeq, &[u32])> =
                (seqs.iter_mut().zip(level)).map(|((seq, from), (start, _))| (seq, &start[*from..])).collect();
            self.logits_paged(&mut feed, cache, &[])?;
            fed.extend(level.iter().map(|(start, _)| *start).zip(seqs.into_iter().map(|(seq, _)| seq)));
        }
        let mut contexts = Vec::with_capacity(group.len());
        for q in group {
            contexts.push(self.seq_after_longest(cache, &fed, q.0)?);
        }
        let (mut read, mut at) = (Vec::with_capacity(group.len()), 0);
        for (q, (_, from)) in group.iter().zip(&contexts) {
            at += q.0.len() - from;
            read.push(at - 1);
        }
        let mut feed: Vec<(&mut PagedSeq, &[u32])> =
            (contexts.iter_mut().zip(group)).map(|((seq, from), q)| (seq, &q.0[*from..])).collect();
        let logits = self.logits_paged(&mut feed, cache, &read)?;
        for (_, seq) in &mut fed {
            cache.release(seq);
        }
        Ok((contexts.into_iter().map(|(seq, _)| seq).collect(), logits))
    }

    /// A sequence for `tokens` grown to hold them all: a fork of the longest of `fed` that
    /// `tokens` begins with (or a new one), with how many of them it holds already.
    fn seq_after_longest(&self, cache: &mut PagedCache<B>, fed: &[(&[u32], PagedSeq)], tokens: &[u32]) -> Result<(PagedSeq, usize)> {
        let longest = (fed.iter())
            .filter(|(start, _)| start.len() < tokens.len() && tokens.starts_with(start))
            .max_by_key(|(start, _)| start.len());
        let mut seq = match longest {
            Some((_, seq)) => cache.fork(self.backend(), seq)?,
            None => PagedSeq::default(),
        };
        let from = seq.len;
        cache.grow(&mut seq, tokens.len())?;
        Ok((seq, from))
    }
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn runs_break_before_the_sum_passes_the_most_and_keep_a_big_item_alone() {
        let tokens = |c: &[usize]| c.iter().map(|&t| (t, 1)).collect::<Vec<_>>().into_iter();
        assert_eq!(runs(tokens(&[3, 3, 3, 3]), (6, 9)), vec![0..2, 2..4]);
        assert_eq!(runs(tokens(&[10, 1, 1]), (4, 9)), vec![0..1, 1..3]);
        assert_eq!(runs(tokens(&[1, 10, 1]), (4, 9)), vec![0..1, 1..2, 2..3]);
        // The rows bind as well as the tokens.
        assert_eq!(runs(tokens(&[1, 1, 1, 1, 1]), (100, 2)), vec![0..2, 2..4, 4..5]);
        assert!(runs(std::iter::empty(), (4, 4)).is_empty());
    }
}
