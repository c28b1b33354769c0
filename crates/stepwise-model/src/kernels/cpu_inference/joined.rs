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

use super::attention::attention;
use super::rows::{rms_norm_rows, rotate};
use super::{finish_block, qkv_products, sgemm, with_scratch, Scratch, Weights};
use crate::packed::Packed;

/// Sequences of at most this many tokens on average run joined (and at least two of them).
const MEAN_TOKENS: usize = 64;
/// Rows a joined pass holds at most: its buffers grow with them (a larger pass runs a sequence
/// a thread).
const MAX_ROWS: usize = 8192;

/// Whether `batch` runs joined: two sequences or more, short on average, not too many rows, of
/// a model wide enough for its products to run in the AVX-512 tiles. A narrow model's products
/// are too small to gain from more rows: its sequences run faster a thread each, with no
/// fork and join inside every product (the lab's models, 64 wide, scored 5% slower joined).
pub(super) fn suits(batch: &Packed, hidden: usize) -> bool {
    let (b, t) = (batch.len(), batch.tokens());
    hidden >= sgemm::MIN_DEPTH && b >= 2 && t <= MAX_ROWS && t < MEAN_TOKENS * b
}

/// The hidden states (after the final norm) at positions `read[i]` of each sequence `i` of
/// `batch`, stacked into `out` (`[Σ read, hidden]`), as [`super::forward_packed`] gives them.
pub(super) fn forward(w: &Weights, batch: &Packed, read: &[Vec<usize>], out: &mut [f32]) {
    with_scratch(|s| run(w, batch, read, out, s));
}

fn run(w: &Weights, batch: &Packed, read: &[Vec<usize>], out: &mut [f32], s: &mut Scratch) {
    let dims = w.dims;
    let (h, d, qkv_w) = (dims.hidden, dims.head_dim, dims.qkv_width());
    let (t, offsets) = (batch.tokens(), batch.offsets());
    let heads_width = dims.heads * d;
    // On a pool thread (passes run side by side) the products stay on it.
    let shared = rayon::current_thread_index().is_none();
    let parallelism = match shared {
        true => gemm::Parallelism::Rayon(rayon::current_num_threads()),
        false => gemm::Parallelism::None,
    };
    let mut x = std::mem::take(&mut s.x);
    x.resize(t * h, 0.0);
    for (row, &id) in x.chunks_exact_mut(h).zip(batch.ids()) {
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
        for span in offsets.windows(2) {
            let (from, len) = (span[0], span[1] - span[0]);
            let rows = &mut s.qkv[from * qkv_w..(from + len) * qkv_w];
            rotate(rows, qkv_w, (dims.heads + dims.kv_heads) * d, d, w.cos, w.sin);
            queries.clear();
            queries.extend(0..len);
            let keys = (&mut s.keys_t, &mut s.key_pairs);
            let rows = &s.qkv[from * qkv_w..(from + len) * qkv_w];
            attention(rows, len, &queries, dims, None, keys, &mut s.head, &mut s.attn, shared, bf16);
            attended[from * heads_width..][..len * heads_width].copy_from_slice(&s.attn[..len * heads_width]);
        }
        // The block's rest reads the attention outputs from `s.attn`: every row's, in order.
        std::mem::swap(&mut s.attn, &mut attended);
        finish_block(l, dims, &mut x, s, parallelism);
        std::mem::swap(&mut s.attn, &mut attended);
    }
    let mut rows_out = out.chunks_exact_mut(h);
    for (span, r) in offsets.windows(2).zip(read) {
        for &i in r {
            let dst = rows_out.next().expect("`out` holds a row for every position read");
            rms_norm_rows(&x[(span[0] + i) * h..][..h], w.norm, dims.eps, dst);
        }
    }
    (s.x, s.attended, s.queries) = (x, attended, queries);
}
