//! A packed batch: sequences laid end to end with their offsets, no padding. It is the input of
//! step scoring on every device (the CPU kernels run each sequence alone, or, for many short
//! sequences of a model at least 512 wide, every product over all their rows at once as the
//! CUDA engine always does, attention within each sequence), and batches are made
//! by a token budget ([`token_batches`]), never by a count, so memory is bounded for any input.

/// Sequences of token ids laid end to end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Packed {
    ids: Vec<u32>,
    /// Where each sequence starts, and where the last ends (`len() + 1` entries).
    offsets: Vec<usize>,
}

impl Packed {
    /// The sequences `seqs`, in order.
    pub fn new(seqs: &[&[u32]]) -> Self {
        let mut ids = Vec::with_capacity(seqs.iter().map(|s| s.len()).sum());
        let mut offsets = Vec::with_capacity(seqs.len() + 1);
        offsets.push(0);
        for s in seqs {
            ids.extend_from_slice(s);
            offsets.push(ids.len());
        }
        Packed { ids, offsets }
    }

    /// Every token id, sequence after sequence.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Where each sequence starts, then where the last ends (`len() + 1` entries).
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    /// The number of sequences.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Whether it holds no sequence.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The number of tokens of all sequences.
    pub fn tokens(&self) -> usize {
        self.ids.len()
    }

    /// Sequence `i`'s token ids.
    pub fn sequence(&self, i: usize) -> &[u32] {
        &self.ids[self.offsets[i]..self.offsets[i + 1]]
    }

    /// The sequences' indices in lexicographic order of their tokens ([`lexicographic_order`]).
    pub fn lexicographic_order(&self) -> Vec<usize> {
        lexicographic_order(self.len(), |i| self.sequence(i))
    }

    /// Every sequence, in order.
    pub fn sequences(&self) -> impl Iterator<Item = &[u32]> {
        (0..self.len()).map(|i| self.sequence(i))
    }

    /// The longest sequence's length (0 when empty).
    pub fn longest(&self) -> usize {
        self.offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0)
    }

    /// Each token's position within its sequence (its rotary position).
    pub fn positions(&self) -> Vec<u32> {
        self.offsets.windows(2).flat_map(|w| 0..(w[1] - w[0]) as u32).collect()
    }

    /// The row of the whole batch that is position `at` of sequence `i`.
    pub fn row(&self, i: usize, at: usize) -> usize {
        debug_assert!(self.offsets[i] + at < self.offsets[i + 1]);
        self.offsets[i] + at
    }

    /// Each sequence's tokens from position `from(i)` on (at least its second) as `(row,
    /// token)`: the row before the token, which predicts it, and the token; sequence after
    /// sequence, what an LM objective learns from.
    pub fn next_tokens(&self, from: impl Fn(usize) -> usize) -> Vec<(usize, u32)> {
        (0..self.len())
            .flat_map(|i| {
                let start = self.offsets[i];
                (from(i).max(1)..self.offsets[i + 1] - start).map(move |p| (start + p - 1, self.ids[start + p]))
            })
            .collect()
    }
}

/// The indices `0..n` in lexicographic order of `seq(i)`'s tokens, equal sequences in index
/// order: sequences that share a prefix stand together, each next to the one it shares most
/// with (how passes and batches find what they can compute once).
pub fn lexicographic_order<'a>(n: usize, seq: impl Fn(usize) -> &'a [u32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| seq(a).cmp(seq(b)));
    order
}

/// The indices of `seqs` grouped into batches of at most `max_tokens` tokens each: in
/// lexicographic order of their tokens, each batch filled until the next would not fit, so
/// sequences that share a prefix (a question's answers, a problem's samples) stand in one batch
/// and a joined pass computes the prefix once; a sequence longer than the budget is a batch of
/// its own. Every index appears once, and each batch lists its indices in ascending order (all
/// of them, in order, when they fit in one).
pub fn token_batches(seqs: &[&[u32]], max_tokens: usize) -> Vec<Vec<usize>> {
    let order = lexicographic_order(seqs.len(), |i| seqs[i]);
    let mut batches: Vec<(usize, Vec<usize>)> = Vec::new();
    for i in order {
        let n = seqs[i].len();
        match batches.last_mut() {
            Some((used, batch)) if *used + n <= max_tokens => {
                *used += n;
                batch.push(i);
            }
            _ => batches.push((n, vec![i])),
        }
    }
    batches
        .into_iter()
        .map(|(_, mut b)| {
            b.sort_unstable();
            b
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_sequences_end_to_end() {
        let p = Packed::new(&[&[5, 6, 7], &[], &[8, 9]]);
        assert_eq!(p.ids(), &[5, 6, 7, 8, 9]);
        assert_eq!(p.offsets(), &[0, 3, 3, 5]);
        assert_eq!((p.len(), p.tokens(), p.longest()), (3, 5, 3));
        assert_eq!(p.sequence(2), &[8, 9]);
        assert_eq!(p.positions(), vec![0, 1, 2, 0, 1]);
        assert_eq!(p.row(2, 1), 4);
    }

    #[test]
    fn next_tokens_pair_each_learned_token_with_the_row_before_it() {
        let p = Packed::new(&[&[5, 6, 7], &[8], &[9, 10, 11, 12]]);
        // From position 0 (taken as 1), 5 (past the end: nothing) and 2.
        let from = [0, 5, 2];
        assert_eq!(p.next_tokens(|i| from[i]), vec![(0, 6), (1, 7), (5, 11), (6, 12)]);
    }

    #[test]
    fn token_batches_keep_to_the_budget_take_everything_once_and_keep_prefixes_together() {
        let p: Vec<Vec<u32>> = vec![vec![1; 20], vec![2; 20], vec![3; 20]];
        let with = |k: usize, tail: &[u32]| p[k].iter().chain(tail).copied().collect::<Vec<u32>>();
        let seqs: Vec<Vec<u32>> = vec![
            with(0, &[5]),
            with(1, &[5]),
            vec![9; 100],
            with(2, &[5]),
            with(0, &[6]),
            with(1, &[6]),
            vec![],
            with(2, &[6]),
            with(0, &[7, 8]),
        ];
        let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
        let batches = token_batches(&refs, 64);
        let mut seen: Vec<usize> = batches.iter().flatten().copied().collect();
        seen.sort();
        assert_eq!(seen, (0..seqs.len()).collect::<Vec<_>>());
        for b in &batches {
            let total: usize = b.iter().map(|&i| seqs[i].len()).sum();
            assert!(total <= 64 || b.len() == 1, "{b:?}: {total} tokens");
            assert!(b.windows(2).all(|w| w[0] < w[1]), "{b:?} ascending");
        }
        // The empty sequence and the first prompt's three answers (64 tokens); the second's two
        // and the third's first (63); the third's second; the 100-token sequence alone.
        assert_eq!(batches, vec![vec![0, 4, 6, 8], vec![1, 3, 5], vec![7], vec![2]]);
        assert!(token_batches(&[], 10).is_empty());
        let all: Vec<&[u32]> = refs[..2].to_vec();
        assert_eq!(token_batches(&all, 1000), vec![vec![0, 1]], "all in one, in order");
    }
}
