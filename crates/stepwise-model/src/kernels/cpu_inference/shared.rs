//! Shared prefixes in a joined pass: a position whose tokens up to it are those of another
//! sequence of the pass has that sequence's hidden states (attention is causal), so it is
//! computed once. A loglikelihood task's answers repeat their question (lm-evaluation-harness
//! sends each answer as the question followed by it), a judge's options their solution, and
//! best-of-N's samples their problem's prompt.
//!
//! Each sequence, in lexicographic order of its tokens, takes its prefix from the sequence just
//! before it: in that order the one before shares the longest prefix with it of all those
//! before (`lcp(a, c) ≤ lcp(b, c)` for `a ≤ b ≤ c`). It computes only its rows from there on,
//! and always its last (so every sequence has a row of its own, whatever it shares).

use crate::packed::Packed;
use std::ops::Range;

/// Where each sequence's positions are among the rows a joined pass computes.
pub(super) struct Plan {
    /// The token of each row computed.
    pub ids: Vec<u32>,
    /// Per sequence: the pass's rows it computes (positions `start..len`).
    pub own: Vec<Range<usize>>,
    /// Per sequence: its first position computed (positions before it are another's rows).
    pub start: Vec<usize>,
    /// Per sequence: the pass's row of each of its positions.
    pub rows: Vec<Vec<usize>>,
}

impl Plan {
    /// The batch's sequences, each prefix computed once.
    pub fn new(batch: &Packed) -> Self {
        Self::build(batch, true)
    }

    /// Every sequence computed whole, nothing shared (what [`Plan::new`] is checked against).
    #[cfg(test)]
    pub fn separate(batch: &Packed) -> Self {
        Self::build(batch, false)
    }

    fn build(batch: &Packed, share: bool) -> Self {
        let n = batch.len();
        let order: Vec<usize> = if share {
            batch.lexicographic_order()
        } else {
            (0..n).collect()
        };
        // Positions taken from the sequence before in `order`.
        let mut shared = vec![0usize; n];
        for w in order.windows(2) {
            if share {
                shared[w[1]] = taken(batch.sequence(w[0]), batch.sequence(w[1]));
            }
        }
        // Own rows are laid out in the batch's order; the row maps are built in sorted order,
        // so the map a sequence copies its prefix from is always built before its own.
        let mut own = Vec::with_capacity(n);
        let mut ids = Vec::with_capacity(batch.tokens());
        for (i, &from) in shared.iter().enumerate() {
            let seq = batch.sequence(i);
            own.push(ids.len()..ids.len() + seq.len() - from);
            ids.extend_from_slice(&seq[from..]);
        }
        let mut rows: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut before: Option<usize> = None;
        for &i in &order {
            let mut map = match (before, shared[i]) {
                (Some(b), from) if from > 0 => rows[b][..from].to_vec(),
                _ => Vec::new(),
            };
            map.extend(own[i].clone());
            rows[i] = map;
            before = Some(i);
        }
        Plan {
            ids,
            own,
            start: shared,
            rows,
        }
    }

    /// The number of rows the pass computes.
    pub fn len(&self) -> usize {
        self.ids.len()
    }
}

/// The positions of `seq` taken from `before` (their common prefix, short of `seq`'s last).
fn taken(before: &[u32], seq: &[u32]) -> usize {
    let common = before.iter().zip(seq).take_while(|(a, b)| a == b).count();
    common.min(seq.len().saturating_sub(1))
}

/// `batch`'s sequences in lexicographic order, cut into groups of at most `max_rows` rows
/// computed (a sequence's prefix shared with the one before it in its group counted once), each
/// with its number of rows; `None` when a sequence alone is longer. In that order the
/// sequences that share a prefix stand together, so a group loses only what it shares with the
/// group before.
pub(super) fn groups(batch: &Packed, max_rows: usize) -> Option<Vec<(Vec<usize>, usize)>> {
    let order = batch.lexicographic_order();
    let mut out: Vec<(Vec<usize>, usize)> = Vec::new();
    let mut before: &[u32] = &[];
    for i in order {
        let seq = batch.sequence(i);
        if seq.len() > max_rows {
            return None;
        }
        let own = seq.len() - taken(before, seq);
        match out.last_mut() {
            Some((seqs, rows)) if *rows + own <= max_rows => {
                seqs.push(i);
                *rows += own;
            }
            _ => out.push((vec![i], seq.len())),
        }
        before = seq;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_position_maps_to_a_row_with_its_token_and_prefixes_are_computed_once() {
        let seqs: [&[u32]; 6] = [
            &[1, 2, 3, 9],
            &[1, 2, 3, 4, 5],
            &[7, 7],
            &[1, 2, 3, 4],
            &[1, 2, 3, 4, 5],
            &[8],
        ];
        let batch = Packed::new(&seqs);
        let plan = Plan::new(&batch);
        for (i, seq) in seqs.iter().enumerate() {
            assert_eq!(plan.rows[i].len(), seq.len());
            for (p, &r) in plan.rows[i].iter().enumerate() {
                assert_eq!(plan.ids[r], seq[p], "sequence {i}, position {p}");
            }
            // Its own rows are its last positions, at least one.
            assert_eq!(plan.own[i].len(), seq.len() - plan.start[i]);
            assert!(!plan.own[i].is_empty());
            assert_eq!(plan.rows[i][plan.start[i]..], plan.own[i].clone().collect::<Vec<_>>()[..]);
        }
        // [1 2 3] once, [4] once more, [5] twice (the duplicate keeps its last row), 9, 7 7, 8.
        assert_eq!(plan.len(), 3 + 1 + 2 + 1 + 2 + 1);
        // A row of another sequence holds the same prefix: position p of both has tokens 0..=p.
        for (i, seq) in seqs.iter().enumerate() {
            for (j, other) in seqs.iter().enumerate() {
                for p in 0..seq.len().min(other.len()) {
                    if plan.rows[i][p] == plan.rows[j][p] {
                        assert_eq!(seq[..=p], other[..=p], "{i} and {j} at {p}");
                    }
                }
            }
        }
        let separate = Plan::separate(&batch);
        assert_eq!(separate.len(), batch.tokens());
        assert!(separate.start.iter().all(|&s| s == 0));
    }
}
