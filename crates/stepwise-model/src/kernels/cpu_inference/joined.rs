//! A packed pass's short sequences through every layer together: the norms, the projections and
//! the MLP over all their rows at once (one product a weight for the whole pass), rotary
//! positions and attention per sequence. One sequence a thread multiplies a few rows at a time:
//! a 20-token answer is a 20-row product in tiles of 32 rows, each weight read again for every
//! sequence. A loglikelihood request's answers, a judge's options and short solutions are such
//! passes.
//!
//! Every row goes through the last layer (the per-sequence path runs it for the rows read
//! only): with short sequences the last layer is a small share, and the rows read are most of
//! them when a pass weighs every token.
//!
//! A prefix that sequences of the pass share is computed once ([`shared`](super::shared)): a
//! sequence's later positions attend to the rows of the sequence it shares with.

use super::attention::attention;
use super::rows::{rms_norm_rows, rotate};
use super::shared::Plan;
use super::{finish_block, qkv_products, sgemm, with_scratch, Scratch, Weights};
use crate::packed::Packed;

/// Sequences of at most this many tokens on average run joined (and at least two of them).
const MEAN_TOKENS: usize = 64;
/// Rows a joined pass holds at most: its buffers grow with them (a larger pass runs a sequence
/// a thread).
const MAX_ROWS: usize = 8192;

/// How `batch` runs joined, or `None` for a sequence a thread: two sequences or more, short on
/// average once shared prefixes count once, not too many rows, of a model wide enough for its
/// products to run in the AVX-512 tiles. A narrow model's products are too small to gain from
/// more rows: its sequences run faster a thread each, with no fork and join inside every
/// product (the lab's models, 64 wide, scored 5% slower joined).
pub(super) fn plan(batch: &Packed, hidden: usize) -> Option<Plan> {
    let b = batch.len();
    if hidden < sgemm::MIN_DEPTH || b < 2 {
        return None;
    }
    let plan = Plan::new(batch);
    let t = plan.len();
    (t <= MAX_ROWS && t < MEAN_TOKENS * b).then_some(plan)
}

/// The hidden states (after the final norm) at positions `read[i]` of each sequence `i` of
/// `batch`, stacked into `out` (`[Σ read, hidden]`), as [`super::forward_packed`] gives them.
/// `plan` lays out `batch`'s rows ([`plan`]).
pub(super) fn forward(w: &Weights, plan: &Plan, read: &[Vec<usize>], out: &mut [f32]) {
    with_scratch(|s| run(w, plan, read, out, s));
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
    for l in &w.layers {
        rms_norm_rows(&x, l.ln1, dims.eps, &mut s.normed);
        qkv_products(w, l, 0, s, parallelism);
        let bf16 = sgemm::multiplies_in_bf16(&l.qkv[0].0);
        // Every sequence's own rows at their positions first: a later one reads them.
        for (own, &start) in plan.own.iter().zip(&plan.start) {
            let rows = &mut s.qkv[own.start * qkv_w..own.end * qkv_w];
            let (cos, sin) = (&w.cos[start * half..], &w.sin[start * half..]);
            rotate(rows, qkv_w, (dims.heads + dims.kv_heads) * d, d, cos, sin);
        }
        for ((own, &start), map) in plan.own.iter().zip(&plan.start).zip(&plan.rows) {
            let len = map.len();
            queries.clear();
            queries.extend(start..len);
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
            attended[own.start * heads_width..own.end * heads_width].copy_from_slice(&s.attn[..own.len() * heads_width]);
        }
        // The block's rest reads the attention outputs from `s.attn`: every row's, in order.
        std::mem::swap(&mut s.attn, &mut attended);
        finish_block(l, dims, &mut x, s, parallelism);
        std::mem::swap(&mut s.attn, &mut attended);
    }
    let mut rows_out = out.chunks_exact_mut(h);
    for (map, r) in plan.rows.iter().zip(read) {
        for &p in r {
            let dst = rows_out.next().expect("`out` holds a row for every position read");
            rms_norm_rows(&x[map[p] * h..][..h], w.norm, dims.eps, dst);
        }
    }
    (s.x, s.attended, s.queries) = (x, attended, queries);
}
