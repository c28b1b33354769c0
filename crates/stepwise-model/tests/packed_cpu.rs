//! The packed engine's CPU backend ([`Cpu`]) against its specification ([`Reference`]), kernel
//! by kernel on random data: the products (at a depth that takes the AVX-512 tiles where the CPU
//! has them, and a short one), causal attention forward and backward over packed sequences with
//! grouped heads, paged attention over a block table (decoding rows and a prompt's chunk, a
//! block shared by two sequences), and the element-wise kernels it runs in parallel (which must give Reference's
//! bits). The whole trainer on it is checked in `packed_train.rs`.

use stepwise_model::packed_engine::{AdamW, Backend, BatchInts, Cpu, Out, PagedInts, Reference, TrainBackend, BLOCK};

/// A deterministic stream of values in [-1, 1).
struct Values(u64);

impl Values {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn f32s(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
    fn bf16s(&mut self, n: usize, scale: f32) -> Vec<u16> {
        self.f32s(n, scale).into_iter().map(bits).collect()
    }
}

fn bits(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

fn widen(v: &[u16]) -> Vec<f32> {
    v.iter().map(|&b| half::bf16::from_bits(b).to_f32()).collect()
}

/// `got` against `want`: every value within `tol` of the largest magnitude of `want`.
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(
        worst <= tol * scale,
        "{what}: largest difference {worst} against values up to {scale}"
    );
    assert!(want.iter().any(|v| *v != 0.0), "{what}: nothing computed");
}

fn batch<B: Backend<I32 = Vec<i32>>>(lens: &[usize]) -> BatchInts<B> {
    BatchInts::of_lengths(lens)
}

#[test]
fn products_match_the_reference() {
    let mut r = Values(7);
    // Depth 600 takes the AVX-512 tiles where the CPU has them; 24 takes gemm's kernels.
    for (rows, n, k) in [(37, 40, 600), (9, 70, 24), (1, 5, 3)] {
        let (x, w) = (r.bf16s(rows * k, 1.0), r.bf16s(n * k, 0.5));
        let start = r.f32s(rows * n, 1.0);
        for accumulate in [false, true] {
            let (mut a, mut b) = (start.clone(), start.clone());
            Cpu.gemm(&x, &w, Out::F32(&mut a), rows, n, k, accumulate).unwrap();
            Reference
                .gemm(&x, &w, Out::F32(&mut b), rows, n, k, accumulate)
                .unwrap();
            assert_close(&format!("gemm {rows}x{n}x{k} {accumulate}"), &a, &b, 1e-5);
        }
        let (mut a, mut b) = (vec![0u16; rows * n], vec![0u16; rows * n]);
        Cpu.gemm(&x, &w, Out::Bf16(&mut a), rows, n, k, false).unwrap();
        Reference.gemm(&x, &w, Out::Bf16(&mut b), rows, n, k, false).unwrap();
        assert_close("gemm into bf16", &widen(&a), &widen(&b), 1e-2);
        // Through y = x · wᵀ: the input's gradient [rows, k] and the weight's [n, k].
        let dy = r.bf16s(rows * n, 1.0);
        let start = r.f32s(rows * k, 1.0);
        for accumulate in [false, true] {
            let (mut a, mut b) = (start.clone(), start.clone());
            Cpu.gemm_nn(&dy, &w, Out::F32(&mut a), rows, n, k, accumulate).unwrap();
            Reference
                .gemm_nn(&dy, &w, Out::F32(&mut b), rows, n, k, accumulate)
                .unwrap();
            assert_close(&format!("gemm_nn {rows}x{n}x{k}"), &a, &b, 1e-5);
        }
        let start = r.f32s(n * k, 1.0);
        let (mut a, mut b) = (start.clone(), start);
        Cpu.gemm_weight_grad(&dy, &x, &mut a, rows, n, k).unwrap();
        Reference.gemm_weight_grad(&dy, &x, &mut b, rows, n, k).unwrap();
        assert_close(&format!("gemm_weight_grad {rows}x{n}x{k}"), &a, &b, 1e-5);
    }
    // A batch of no rows adds nothing to a weight's gradient (and does not panic).
    let mut dw = vec![1f32; 6];
    Cpu.gemm_weight_grad(&Vec::new(), &Vec::new(), &mut dw, 0, 2, 3)
        .unwrap();
    assert_eq!(dw, vec![1f32; 6]);
}

#[test]
fn attention_matches_the_reference_forward_and_backward() {
    let mut r = Values(11);
    // Packed sequences of one row, a few and more than a block of queries (64: several blocks,
    // lengths padded to whole AMX steps); 6 query heads on 2 key/value heads; heads of 16 (the
    // scores' depth below AMX's 32 steps) and of 64 (every product on AMX where the CPU has it).
    for (lens, heads, kv_heads, d) in [(&[1, 5, 70, 131][..], 6, 2, 16), (&[33, 200][..], 6, 2, 64)] {
        let rows: usize = lens.iter().sum();
        let width = (heads + 2 * kv_heads) * d;
        let qkv = r.bf16s(rows * width, 2.0);
        let d_out = r.bf16s(rows * heads * d, 1.0);
        let (mut a, mut b) = (vec![0u16; rows * heads * d], vec![0u16; rows * heads * d]);
        Cpu.attention(&qkv, &mut a, &batch(lens), rows, heads, kv_heads, d)
            .unwrap();
        Reference
            .attention(&qkv, &mut b, &batch(lens), rows, heads, kv_heads, d)
            .unwrap();
        assert_close("attention", &widen(&a), &widen(&b), 1e-2);
        // Stale values in the gradient's buffer are overwritten, as Reference's are.
        let (mut a, mut b) = (r.f32s(rows * width, 5.0), r.f32s(rows * width, 5.0));
        Cpu.attention_backward(&qkv, &d_out, &mut a, &batch(lens), rows, heads, kv_heads, d)
            .unwrap();
        Reference
            .attention_backward(&qkv, &d_out, &mut b, &batch(lens), rows, heads, kv_heads, d)
            .unwrap();
        // The probabilities and the scores' gradient multiply in bf16 where the CPU can
        // (PyTorch's bf16 attention; the reference keeps them f32): within a bf16 rounding of
        // the largest.
        assert_close("attention_backward", &a, &b, 1e-2);
    }
    // A head count that cannot be grouped is refused, not a panic.
    let (lens, d) = ([1, 5, 70, 131], 16);
    let rows: usize = lens.iter().sum();
    let qkv = r.bf16s(rows * 10 * d, 2.0);
    let mut out = vec![0u16; rows * 5 * d];
    let err = Cpu.attention(&qkv, &mut out, &batch(&lens), rows, 5, 2, d).unwrap_err();
    assert!(err.to_string().contains("cannot share"), "{err}");
}

/// A decoding step's places in a paged cache, as backend `B` takes them.
fn paged<B: Backend<I32 = Vec<i32>>>(
    positions: &[i32],
    seq_of_row: &[i32],
    table: &[i32],
    max_blocks: usize,
) -> PagedInts<B> {
    PagedInts {
        positions: positions.to_vec(),
        seq_of_row: seq_of_row.to_vec(),
        slots: Vec::new(),
        block_table: table.to_vec(),
        max_blocks,
        read: Vec::new(),
    }
}

#[test]
fn paged_attention_matches_the_reference() {
    let mut r = Values(29);
    let (heads, kv_heads, d) = (6, 2, 16);
    let (width, kvw, pool) = ((heads + 2 * kv_heads) * d, kv_heads * d, 12);
    let (k, v) = (r.bf16s(pool * BLOCK * kvw, 2.0), r.bf16s(pool * BLOCK * kvw, 1.0));
    // Sequence 0 decodes at position 130 (three blocks); sequence 1 shares its first block and
    // feeds a chunk across a block's end (positions 58..70); sequence 2 decodes its first token.
    let max_blocks = 4;
    let block_table = vec![7, 2, 9, -1, 7, 4, -1, -1, 11, -1, -1, -1];
    let mut positions = vec![130];
    positions.extend(58..70);
    positions.push(0);
    let mut seq_of_row = vec![0];
    seq_of_row.extend(std::iter::repeat_n(1, 12));
    seq_of_row.push(2);
    let rows = positions.len();
    let qkv = r.bf16s(rows * width, 2.0);
    let (mut a, mut b) = (vec![0u16; rows * heads * d], vec![0u16; rows * heads * d]);
    Cpu.paged_attention(
        &qkv,
        &k,
        &v,
        &mut a,
        &paged(&positions, &seq_of_row, &block_table, max_blocks),
        rows,
        heads,
        kv_heads,
        d,
    )
    .unwrap();
    let reference = paged(&positions, &seq_of_row, &block_table, max_blocks);
    Reference
        .paged_attention(&qkv, &k, &v, &mut b, &reference, rows, heads, kv_heads, d)
        .unwrap();
    assert_close("paged attention", &widen(&a), &widen(&b), 1e-2);
    // A position without a block is an error, not a read past the table.
    let mut holed = block_table;
    holed[2] = -1;
    let err = Cpu
        .paged_attention(
            &qkv,
            &k,
            &v,
            &mut a,
            &paged(&positions, &seq_of_row, &holed, max_blocks),
            rows,
            heads,
            kv_heads,
            d,
        )
        .unwrap_err();
    assert!(err.to_string().contains("position 128 has no cache block"), "{err}");
}

/// SwiGLU's vector kernels (their own `exp`) give the reference's bf16 values or a neighbour
/// (one ulp apart), and the neighbour rarely: the f32 values before rounding differ by an ulp or two.
#[test]
fn swiglu_is_within_a_bf16_ulp_of_the_reference() {
    let mut r = Values(5);
    let (rows, inter) = (33, 96);
    let gate_up = r.bf16s(rows * 2 * inter, 3.0);
    let (mut a, mut b) = (vec![0u16; rows * inter], vec![0u16; rows * inter]);
    Cpu.swiglu(&gate_up, &mut a, rows, inter).unwrap();
    Reference.swiglu(&gate_up, &mut b, rows, inter).unwrap();
    assert_within_an_ulp(&a, &b, "swiglu");
    let d_act = r.f32s(rows * inter, 1.0);
    let (mut a, mut b) = (vec![0u16; rows * 2 * inter], vec![0u16; rows * 2 * inter]);
    Cpu.swiglu_backward(&gate_up, &d_act, &mut a, rows, inter).unwrap();
    Reference
        .swiglu_backward(&gate_up, &d_act, &mut b, rows, inter)
        .unwrap();
    assert_within_an_ulp(&a, &b, "swiglu_backward");
}

/// Every bf16 of `got` is `want`'s or its neighbour, and at most 2% are neighbours.
fn assert_within_an_ulp(got: &[u16], want: &[u16], what: &str) {
    let apart = |g: u16, w: u16| (g as i16 as i32 - w as i16 as i32).unsigned_abs();
    let mut neighbours = 0;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(apart(g, w) <= 1, "{what}[{i}]: {g:#06x} against {w:#06x}");
        neighbours += usize::from(g != w);
    }
    assert!(
        neighbours * 50 <= want.len(),
        "{what}: {neighbours} of {} values a ulp off",
        want.len()
    );
}

/// The token log-probabilities' rows (their own `exp`, in sixteen lanes) are within a few f32 ulp
/// of the reference's and their gradients within a bf16 ulp, −∞ logits and a tail past the lanes
/// included; AdamW and the sum of squares give the reference's bits.
#[test]
fn element_wise_kernels_give_the_reference_values() {
    let mut r = Values(5);
    let (rows, vocab) = (33, 300);
    let mut logits = r.f32s(rows * vocab, 8.0);
    logits.iter_mut().step_by(97).for_each(|z| *z = f32::NEG_INFINITY);
    let targets: Vec<i32> = (0..rows as i32).map(|i| (i * 37) % vocab as i32).collect();
    let mut got = (vec![0f32; rows], vec![0f32; rows]);
    let mut want = (vec![0f32; rows], vec![0f32; rows]);
    Cpu.token_logprobs(&logits, &targets, &mut got.0, &mut got.1, rows, vocab)
        .unwrap();
    Reference
        .token_logprobs(&logits, &targets, &mut want.0, &mut want.1, rows, vocab)
        .unwrap();
    for (g, w) in got.0.iter().chain(&got.1).zip(want.0.iter().chain(&want.1)) {
        assert!(
            g == w || (g - w).abs() <= 4.0 * f32::EPSILON * w.abs(),
            "token_logprobs: {g} against {w}"
        );
    }
    let coef = r.f32s(rows, 1.0);
    let (mut a, mut b) = (vec![0u16; rows * vocab], vec![0u16; rows * vocab]);
    Cpu.token_logprobs_backward(&logits, &targets, &want.1, &coef, &mut a, rows, vocab)
        .unwrap();
    Reference
        .token_logprobs_backward(&logits, &targets, &want.1, &coef, &mut b, rows, vocab)
        .unwrap();
    assert_within_an_ulp(&a, &b, "token_logprobs_backward");
    // AdamW over more values than one parallel task takes.
    let n = 200_003;
    let opt = AdamW {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        step: 3,
        grad_scale: 0.5,
    };
    let g = r.f32s(n, 1.0);
    let start = (
        r.f32s(n, 1.0),
        r.f32s(n, 0.1),
        r.f32s(n, 0.1).iter().map(|v| v.abs()).collect::<Vec<_>>(),
    );
    let (mut a, mut b) = (start.clone(), start);
    Cpu.adamw(&mut a.0, &g, &mut a.1, &mut a.2, n, opt).unwrap();
    Reference.adamw(&mut b.0, &g, &mut b.1, &mut b.2, n, opt).unwrap();
    assert!(a == b, "adamw");
    let (x, y) = (Cpu.sum_squares(&g, n).unwrap(), Reference.sum_squares(&g, n).unwrap());
    assert!((x - y).abs() < 1e-9 * y, "sum_squares {x} vs {y}");
}
