//! `cargo bench -p stepwise-model [-- --big]`: scoring and generation throughput (tokens/s) on
//! the fixture checkpoints and, with `--big`, on a randomly initialised model of Qwen2.5-0.5B's
//! shape (with its GFLOP/s). `bench/reference_transformers.py` runs the same workloads with
//! PyTorch + transformers for the ratio.

use candle_core::{Device, Tensor};
use candle_nn::VarMap;
use std::path::PathBuf;
use std::time::Instant;
use stepwise_model::{generate, HeadKind, Model, ModelConfig, SamplingParams};

/// The allocator the `stepwise` binary uses (big activations are reused, not page-faulted in).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCH: usize = 8;
const SEQ: usize = 256;
const NEW: usize = 64;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/hf-tiny")
}

/// Steps a scored solution has: the reward model reads one position per step.
const STEPS: usize = 8;

/// Forward passes over `BATCH × SEQ` tokens: tokens/s. `all_positions`: the decoder's hidden
/// states at every position (what transformers' `model(ids)` computes, the reference's workload);
/// else a PRM's scoring pass, which reads `STEPS` step ends per sequence and applies the head
/// there (`Model::hidden_rows`: the last layer runs only for the rows read).
fn scoring(model: &Model, reps: usize, all_positions: bool, batch: usize) -> anyhow::Result<f64> {
    let ids: Vec<u32> = (0..batch * SEQ).map(|i| (i * 7 % 500) as u32 + 10).collect();
    let ids = Tensor::from_vec(ids, (batch, SEQ), &model.device)?;
    let step_ends: Vec<usize> = (1..=STEPS).map(|k| k * SEQ / STEPS - 1).collect();
    let rows = vec![step_ends; batch];
    let pass = || -> anyhow::Result<Tensor> {
        if all_positions {
            Ok(model.hidden(&ids, None, None)?)
        } else {
            model.head_logits(&model.hidden_rows(&ids, None, &rows)?)
        }
    };
    let _ = pass()?;
    let t = Instant::now();
    for _ in 0..reps {
        let _ = pass()?;
    }
    Ok((reps * batch * SEQ) as f64 / t.elapsed().as_secs_f64())
}

/// Both scoring workloads of `model`, printed.
fn print_scoring(name: &str, model: &Model, reps: usize, flops_per_token: Option<f64>) -> anyhow::Result<()> {
    // The last: one sequence at a time, which the threads share.
    for (all, what, batch) in [
        (true, "forward, all positions", BATCH),
        (false, "scoring, 8 step ends read", BATCH),
        (true, "forward, all positions", 1),
    ] {
        let tps = scoring(model, reps * BATCH / batch, all, batch)?;
        let gflops = flops_per_token.map_or(String::new(), |f| {
            format!(", {:.1} GFLOP/s in the decoder", f * tps / 1e9)
        });
        println!("{name}: {what}: {tps:.0} tokens/s (batch {batch} × {SEQ}){gflops}");
    }
    Ok(())
}

/// Greedy decoding of `NEW` tokens for `BATCH` continuations of a 32-token prompt: new tokens/s.
fn generation(model: &Model) -> anyhow::Result<f64> {
    let prompt: Vec<u32> = (0..32).map(|i| i * 3 + 10).collect();
    let p = SamplingParams {
        temperature: 0.0,
        max_new_tokens: NEW,
        ..Default::default()
    };
    let t = Instant::now();
    let outs = generate(model, None, &prompt, BATCH, &p)?;
    let n: usize = outs.iter().map(Vec::len).sum();
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

/// Optimiser steps of the LM objective on a lab-sized model (`hidden`, `layers`, vocabulary 100,
/// 60-token sequences): trained tokens/s at each batch size.
fn training(hidden: usize, layers: usize, batch: usize) -> anyhow::Result<f64> {
    use stepwise_model::train::{train, Example, Objective, TrainConfig};
    let cfg = ModelConfig::tiny(100, hidden, layers, 4, 2, HeadKind::CausalLm);
    let varmap = VarMap::new();
    let mut m = Model::fresh(cfg, &varmap, &Device::Cpu, 0)?;
    let data: Vec<Example> = (0..512)
        .map(|k| Example {
            ids: (0..60).map(|i| ((i * 7 + k * 13) % 97) as u32 + 3).collect(),
            lm_from: 20,
            ..Default::default()
        })
        .collect();
    let tc = TrainConfig {
        steps: 6,
        batch_size: batch,
        eval_every: 0,
        ..Default::default()
    };
    train(&mut m, &varmap, &data, &[], Objective::Lm, &tc, |_, _| {})?;
    let t = Instant::now();
    let tc = TrainConfig { steps: 10, ..tc };
    train(&mut m, &varmap, &data, &[], Objective::Lm, &tc, |_, _| {})?;
    Ok((10 * batch * 60) as f64 / t.elapsed().as_secs_f64())
}

fn params(c: &ModelConfig) -> f64 {
    let (h, i, l) = (
        c.hidden_size as f64,
        c.intermediate_size as f64,
        c.num_hidden_layers as f64,
    );
    let kv = (c.num_key_value_heads * c.head_dim) as f64;
    l * (2.0 * h * h + 2.0 * h * kv + 3.0 * h * i)
}

/// Whether a section runs: `cargo bench -p stepwise-model -- [scoring|generation|training] [--big]`
/// (no section name: all of them).
fn wanted(section: &str) -> bool {
    let names: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| ["scoring", "generation", "training"].contains(&a.as_str()))
        .collect();
    names.is_empty() || names.iter().any(|n| n == section)
}

fn main() -> anyhow::Result<()> {
    let dev = Device::Cpu;
    println!(
        "threads: {}",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    for name in ["qwen2-prm", "qwen2-policy"] {
        let m = Model::load(&fixtures().join(name), &dev)?;
        if wanted("scoring") {
            print_scoring(name, &m, 100, None)?;
        }
        if name == "qwen2-policy" && wanted("generation") {
            println!(
                "{name}: generation {:.0} new tokens/s (batch {BATCH}, shared prefix)",
                generation(&m)?
            );
        }
    }
    if wanted("training") {
        for (h, l) in [(64, 2), (128, 4)] {
            for b in [32, 128] {
                println!(
                    "training LM {h}-wide {l}-layer: {:.0} tokens/s (batch {b} × 60)",
                    training(h, l, b)?
                );
            }
        }
    }
    if std::env::args().any(|a| a == "--big") {
        let mut cfg = ModelConfig::tiny(151936, 896, 24, 14, 2, HeadKind::CausalLm);
        cfg.intermediate_size = 4864;
        cfg.head_dim = 64;
        cfg.max_position_embeddings = 4096;
        let varmap = VarMap::new();
        let m = Model::fresh(cfg.clone(), &varmap, &dev, 0)?;
        if wanted("scoring") {
            print_scoring("qwen2.5-0.5b shape (random)", &m, 2, Some(2.0 * params(&cfg)))?;
        }
        if wanted("generation") {
            println!(
                "qwen2.5-0.5b shape (random): generation {:.1} new tokens/s",
                generation(&m)?
            );
        }
    }
    Ok(())
}
