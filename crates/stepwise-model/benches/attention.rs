//! `cargo bench -p stepwise-model --bench attention [-- LEN [SEQS]]`: the packed trainer's causal
//! attention on the CPU backend, forward and backward, at Qwen2.5-0.5B's heads (14 query heads
//! sharing 2 key/value heads of 64), over SEQS packed sequences of LEN tokens (default 4 × 631:
//! `bench/train_steady_cpu.sh`'s batch of the median ProcessBench GSM8K record), as a training
//! step with its activations kept runs it: 24 layers, each forward and backward once (where
//! they are not kept, the forward runs again). Prints milliseconds a layer and the
//! GFLOP/s of the products the causal half needs (forward 2, backward 5 of `len² · d / 2`
//! multiply-adds each).

use std::time::Instant;
use stepwise_model::packed_engine::{Backend, BatchInts, Cpu, TrainBackend};

/// The cache-aligned allocator the `stepwise` binary uses.
#[global_allocator]
static ALLOC: stepwise_model::alloc::CacheAligned<mimalloc::MiMalloc> =
    stepwise_model::alloc::CacheAligned(mimalloc::MiMalloc);

const HEADS: usize = 14;
const KV_HEADS: usize = 2;
const D: usize = 64;
const LAYERS: usize = 24;

/// Values of a bf16's size and sign spread over `(-scale, scale)`, from a small generator.
fn bf16s(n: usize, seed: u64, scale: f32) -> Vec<u16> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale;
            half::bf16::from_f32(v).to_bits()
        })
        .collect()
}

fn main() -> anyhow::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (len, seqs) = (args.first().copied().unwrap_or(631), args.get(1).copied().unwrap_or(4));
    let lens = vec![len; seqs];
    let rows = len * seqs;
    let width = (HEADS + 2 * KV_HEADS) * D;
    let (qkv, d_out) = (bf16s(rows * width, 1, 2.0), bf16s(rows * HEADS * D, 2, 1.0));
    let (mut out, mut d_qkv) = (vec![0u16; rows * HEADS * D], vec![0f32; rows * width]);
    let meta = BatchInts::<Cpu>::of_lengths(&lens);
    // One layer's worth first, to fault the buffers in.
    Cpu.attention(&qkv, &mut out, &meta, rows, HEADS, KV_HEADS, D)?;
    Cpu.attention_backward(&qkv, &d_out, &mut d_qkv, &meta, rows, HEADS, KV_HEADS, D)?;
    let (mut forward, mut backward) = (0.0, 0.0);
    for _ in 0..LAYERS {
        let t = Instant::now();
        Cpu.attention(&qkv, &mut out, &meta, rows, HEADS, KV_HEADS, D)?;
        forward += t.elapsed().as_secs_f64();
        let t = Instant::now();
        Cpu.attention_backward(&qkv, &d_out, &mut d_qkv, &meta, rows, HEADS, KV_HEADS, D)?;
        backward += t.elapsed().as_secs_f64();
    }
    let (forward, backward) = (forward / LAYERS as f64, backward / LAYERS as f64);
    // Multiply-adds of one `[len, len] × d` product's causal half, every head and sequence.
    let half = (len * (len + 1) / 2 * D * HEADS * seqs) as f64 * 2.0;
    let step = LAYERS as f64 * (forward + backward);
    println!(
        "causal attention, {seqs} × {len} tokens, {HEADS} heads on {KV_HEADS} of {D}: forward {:.1} ms a layer \
         ({:.0} GFLOP/s), backward {:.1} ms ({:.0} GFLOP/s); a step's 24 layers {step:.2} s",
        forward * 1e3,
        2.0 * half / forward / 1e9,
        backward * 1e3,
        5.0 * half / backward / 1e9,
    );
    Ok(())
}
