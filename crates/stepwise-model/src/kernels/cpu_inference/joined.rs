//! A packed pass's short sequences, or long ones that share prefixes, through every layer
//! together: the norms, the projections and the MLP over all their rows at once (one product a
//! weight for the whole pass), rotary positions and attention per sequence. One sequence a
//! thread multiplies a few rows at a time: a 20-token answer is a 20-row product in tiles of 32
//! rows, each weight read again for every sequence. A loglikelihood request's answers, a
//! judge's options and short solutions are such passes; so are a few-shot prompt's answers and
//! best-of-N's samples of one problem, once what they share counts once. A pass of more rows
//! than a joined pass holds runs in groups of sequences, one after another.
//!
//! The last layer runs its queries, output projection and MLP for the rows read only (every
//! row's keys and values are still computed), as the per-sequence path does: a long prompt's
//! answers read a few rows each.
//!
//! A prefix that sequences of the pass share is computed once ([`shared`](super::shared)): a
//! sequence's later positions attend to the rows of the sequence it shares with.

use super::attention::attention;
use super::rows::{rms_norm_rows, rotate};
use super::shared::{self, Plan};
use super::{finish_block, qkv_products, sgemm, with_scratch, Scratch, Weights};
use crate::packed::Packed;

/// Sequences of at most this many tokens on average run joined (and at least two of them).
const MEAN_TOKENS: usize = 64;
/// Rows a joined pass holds at most: its buffers grow with them (a larger pass runs in groups
/// of sequences, one after another).
const MAX_ROWS: usize = 8192;

/// Sequences of a packed batch that run joined together, and how their rows are laid out.
pub(super) struct Group {
    /// The batch's sequences in the group, ascending.
    seqs: Vec<usize>,
    /// Their rows (of the group's sequences, in `seqs`' order).
    plan: Plan,
}

#[cfg(test)]
thread_local! {
    /// [`MAX_ROWS`] as this thread's passes take it (tests make groups with fewer).
    pub(super) static MAX_ROWS_HERE: std::cell::Cell<usize> = const { std::cell::Cell::new(MAX_ROWS) };
}

/// How `batch` runs joined ([`plan_within`] at most [`MAX_ROWS`] rows a group).
pub(super) fn plan(batch: &Packed, hidden: usize) -> Option<Vec<Group>> {
    #[cfg(test)]
    let max_rows = MAX_ROWS_HERE.with(std::cell::Cell::get);
    #[cfg(not(test))]
    let max_rows = MAX_ROWS;
    plan_within(batch, hidden, max_rows)
}

/// How `batch` runs joined, in groups of at most `max_rows` rows, or `None` for a sequence a
/// thread: two sequences or more, none longer than `max_rows`, of a model wide enough for its
/// products to run in the AVX-512 tiles, and either short on average once shared prefixes
/// count once, or long with at least a quarter of their positions shared (a few-shot prompt's
/// answers, best-of-N's samples of a long problem: a sequence a thread would compute the
/// prompt once for each). A narrow model's products are too small to gain from more rows: its
/// sequences run faster a thread each, with no fork and join inside every product (the lab's
/// models, 64 wide, scored 5% slower joined).
pub(super) fn plan_within(batch: &Packed, hidden: usize, max_rows: usize) -> Option<Vec<Group>> {
    let b = batch.len();
    if hidden < sgemm::MIN_DEPTH || b < 2 {
        return None;
    }
    let groups = shared::groups(batch, max_rows)?;
    let t: usize = groups.iter().map(|(_, rows)| rows).sum();
    let short = t < MEAN_TOKENS * b;
    let sharing = 4 * t <= 3 * batch.tokens();
    if !(short || sharing) {
        return None;
    }
    let groups = groups
        .into_iter()
        .map(|(mut seqs, _)| {
            // In the batch's order (the plan finds what they share whatever their order): a
            // group of the whole batch then writes its rows where they go.
            seqs.sort_unstable();
            let tokens: Vec<&[u32]> = seqs.iter().map(|&i| batch.sequence(i)).collect();
            let plan = Plan::new(&Packed::new(&tokens));
            Group { seqs, plan }
        })
        .collect();
    Some(groups)
}

/// The hidden states (after the final norm) at positions `read[i]` of each sequence `i` of
/// the batch, stacked into `out` (`[Σ read, hidden]`), as [`super::forward_packed`] gives them:
/// each group's pass in turn ([`plan`]).
pub(super) fn forward(w: &Weights, groups: &[Group], read: &[Vec<usize>], out: &mut [f32]) {
    let h = w.dims.hidden;
    // Where each sequence's rows go in `out`.
    let mut at = Vec::with_capacity(read.len());
    let mut next = 0;
    for r in read {
        at.push(next);
        next += r.len() * h;
    }
    with_scratch(|s| {
        for g in groups {
            if g.seqs.len() == read.len() {
                // The whole batch in one group (its sequences ascending: 0..n): rows in place.
                run(w, &g.plan, read, out, s);
                continue;
            }
            let reads: Vec<Vec<usize>> = g.seqs.iter().map(|&i| read[i].clone()).collect();
            let mut rows = vec![0f32; reads.iter().map(Vec::len).sum::<usize>() * h];
            run(w, &g.plan, &reads, &mut rows, s);
            let mut rows = rows.as_slice();
            for (&i, r) in g.seqs.iter().zip(&reads) {
                let (mine, rest) = rows.split_at(r.len() * h);
                out[at[i]..at[i] + mine.len()].copy_from_slice(mine);
                rows = rest;
            }
        }
    });
}

fn run(w: &Weights, plan: &Plan, read: &[Vec<usize>], out: &mut [f32], s: &mut Scratch) {
    let dims = w.dims;
    let (h, d, qkv_w) = (dims.hidden, dims.head_dim, dims.qkv_width());
    let t = plan.len();
    let heads_width = dims.heads * d;
    let half = d / 2;
    // On a pool thread (passes run side by side) the products stay on it.
    let shared = rayon::current_thread_index().is_none();
    let parallelism = match shared {
        true => gemm::Parallelism::Rayon(rayon::current_num_threads()),
        false => gemm::Parallelism::None,
    };
    let mut x = std::mem::take(&mut s.x);
    x.resize(t * h, 0.0);
    for (row, &id) in x.chunks_exact_mut(h).zip(&plan.ids) {
        w.embed.slice(id as usize * h..(id as usize + 1) * h).widen_into(row);
    }
    s.normed.resize(t * h, 0.0);
    s.qkv.resize(t * qkv_w, 0.0);
    s.mlp.resize(t * 2 * dims.intermediate, 0.0);
    // Every row's attention output; the scratch's `attn` holds one sequence's at a time.
    let mut attended = std::mem::take(&mut s.attended);
    attended.resize(t * heads_width, 0.0);
    let mut queries = std::mem::take(&mut s.queries);
    // The rows read, ascending: the last layer goes on for these only.
    let mut kept: Vec<usize> = plan.rows.iter().zip(read).flat_map(|(map, r)| r.iter().map(|&p| map[p])).collect();
    kept.sort_unstable();
    kept.dedup();
    let last = w.layers.len() - 1;
    for (li, l) in w.layers.iter().enumerate() {
        rms_norm_rows(&x, l.ln1, dims.eps, &mut s.normed);
        qkv_products(w, l, 0, s, parallelism);
        let bf16 = sgemm::multiplies_in_bf16(&l.qkv[0].0);
        // Every sequence's own rows at their positions first: a later one reads them.
        for (own, &start) in plan.own.iter().zip(&plan.start) {
            let rows = &mut s.qkv[own.start * qkv_w..own.end * qkv_w];
            let (cos, sin) = (&w.cos[start * half..], &w.sin[start * half..]);
            rotate(rows, qkv_w, (dims.heads + dims.kv_heads) * d, d, cos, sin);
        }
        // Attention outputs go to `attended` in the order of the rows (own rows are laid out in
        // order, and a sequence's queries ascend): in the last layer, `kept`'s order.
        let mut done = 0;
        for ((own, &start), map) in plan.own.iter().zip(&plan.start).zip(&plan.rows) {
            let len = map.len();
            queries.clear();
            match li == last {
                true => queries.extend((start..len).filter(|&q| kept.binary_search(&map[q]).is_ok())),
                false => queries.extend(start..len),
            }
            if queries.is_empty() {
                continue;
            }
            let keys = (&mut s.keys_t, &mut s.key_pairs);
            // Positions before `start` are another sequence's rows: gathered with its own.
            let rows = if start == 0 {
                &s.qkv[own.start * qkv_w..own.end * qkv_w]
            } else {
                s.gathered.clear();
                for &r in map {
                    s.gathered.extend_from_slice(&s.qkv[r * qkv_w..(r + 1) * qkv_w]);
                }
                &s.gathered
            };
            attention(rows, len, &queries, dims, None, keys, &mut s.head, &mut s.attn, shared, bf16);
            let n = queries.len() * heads_width;
            attended[done..done + n].copy_from_slice(&s.attn[..n]);
            done += n;
        }
        if li == last {
            // The rows read move to the front (`kept[i] >= i`, so none is overwritten first).
            for (i, &r) in kept.iter().enumerate() {
                x.copy_within(r * h..(r + 1) * h, i * h);
            }
            x.truncate(kept.len() * h);
        }
        // The block's rest reads the attention outputs from `s.attn`: every row's (in the last
        // layer every kept row's), in order.
        std::mem::swap(&mut s.attn, &mut attended);
        finish_block(l, dims, &mut x, s, parallelism);
        std::mem::swap(&mut s.attn, &mut attended);
    }
    let mut rows_out = out.chunks_exact_mut(h);
    for (map, r) in plan.rows.iter().zip(read) {
        for &p in r {
            let dst = rows_out.next().expect("`out` holds a row for every position read");
            let at = kept.binary_search(&map[p]).expect("a row read is kept");
            rms_norm_rows(&x[at * h..][..h], w.norm, dims.eps, dst);
        }
    }
    (s.x, s.attended, s.queries) = (x, attended, queries);
}
