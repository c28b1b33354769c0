//! `cargo bench -p stepwise-model [-- --big] [-- --7b]`: scoring and generation throughput
//! (tokens/s) on the fixture checkpoints, incremental against whole scoring of a growing beam
//! (`search`); with `--big` on a randomly initialised model of Qwen2.5-0.5B's shape (with its
//! GFLOP/s), its weights held in f32 and then in bf16; with `--7b` on Qwen2.5-Math-PRM-7B's
//! shape with random weights held in bf16 (15 GB; the process's peak resident memory printed). `bench/reference_transformers.py` runs the same workloads with
//! PyTorch + transformers for the ratio.

use candle_core::{Device, Tensor};
use candle_nn::VarMap;
use std::path::PathBuf;
use std::time::Instant;
use stepwise_core::seams::{ScoreInput, StepScorer};
use stepwise_model::{
    generate, HeadKind, IncrementalScorer, Input, Model, ModelConfig, PrmLayout, PrmScorer, SamplingParams, Tokenizer,
    WeightDtype,
};

/// The allocator the `stepwise` binary uses (big activations are reused, not page-faulted in).
#[global_allocator]
static ALLOC: stepwise_model::alloc::CacheAligned<mimalloc::MiMalloc> =
    stepwise_model::alloc::CacheAligned(mimalloc::MiMalloc);

const BATCH: usize = 8;
const SEQ: usize = 256;
const NEW: usize = 64;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf-tiny")
}

/// Steps a scored solution has: the reward model reads one position per step.
const STEPS: usize = 8;

/// Forward passes over `BATCH × SEQ` tokens: tokens/s. `all_positions`: the decoder's hidden
/// states at every position (what transformers' `model(ids)` computes, the reference's workload);
/// else a PRM's scoring pass, which reads `STEPS` step ends per sequence and applies the head
/// there (an `Input` that reads rows: the last layer runs only for the rows read).
fn scoring(model: &Model, reps: usize, all_positions: bool, batch: usize) -> anyhow::Result<f64> {
    let ids: Vec<u32> = (0..batch * SEQ).map(|i| (i * 7 % 500) as u32 + 10).collect();
    let ids = Tensor::from_vec(ids, (batch, SEQ), &model.device)?;
    let step_ends: Vec<usize> = (1..=STEPS).map(|k| k * SEQ / STEPS - 1).collect();
    let rows = vec![step_ends; batch];
    let pass = || -> anyhow::Result<Tensor> {
        if all_positions {
            Ok(model.hidden(Input::padded(&ids, None))?)
        } else {
            model.head_logits(&model.hidden(Input::padded(&ids, None).read(&rows))?)
        }
    };
    let _ = pass()?;
    let t = Instant::now();
    for _ in 0..reps {
        let _ = pass()?;
    }
    Ok((reps * batch * SEQ) as f64 / t.elapsed().as_secs_f64())
}

/// Scoring a batch of `BATCH` sequences of mixed lengths (`SEQ / 8` to `SEQ` tokens, right-padded
/// with a mask, as `stepwise score` batches solutions), each read at its own step ends: real
/// tokens/s. Padded positions cost nothing in a pass that keeps no cache.
fn scoring_mixed(model: &Model, reps: usize) -> anyhow::Result<f64> {
    let lens: Vec<usize> = (1..=BATCH).map(|k| k * SEQ / BATCH).collect();
    let seqs: Vec<Vec<u32>> = lens
        .iter()
        .map(|&n| (0..n).map(|i| (i * 7 % 500) as u32 + 10).collect())
        .collect();
    let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    let (ids, mask, _) = stepwise_model::model::pad_batch(&refs, &model.device)?;
    let rows: Vec<Vec<usize>> = lens
        .iter()
        .map(|&n| (1..=STEPS).map(|k| (k * n / STEPS).max(1) - 1).collect())
        .collect();
    let pass = || model.head_logits(&model.hidden(Input::padded(&ids, mask.as_ref()).read(&rows))?);
    let _ = pass()?;
    let t = Instant::now();
    for _ in 0..reps {
        let _ = pass()?;
    }
    Ok((reps * lens.iter().sum::<usize>()) as f64 / t.elapsed().as_secs_f64())
}

/// Both scoring workloads of `model`, printed.
fn print_scoring(name: &str, model: &Model, reps: usize, flops_per_token: Option<f64>) -> anyhow::Result<()> {
    let gflops = |tps: f64| {
        flops_per_token.map_or(String::new(), |f| {
            format!(", {:.1} GFLOP/s in the decoder", f * tps / 1e9)
        })
    };
    // The last: one sequence at a time, which the threads share.
    for (all, what, batch) in [
        (true, "forward, all positions", BATCH),
        (false, "scoring, 8 step ends read", BATCH),
        (true, "forward, all positions", 1),
    ] {
        let tps = scoring(model, reps * BATCH / batch, all, batch)?;
        println!(
            "{name}: {what}: {tps:.0} tokens/s (batch {batch} × {SEQ}){}",
            gflops(tps)
        );
    }
    let tps = scoring_mixed(model, reps)?;
    println!(
        "{name}: scoring mixed lengths, 8 step ends read: {tps:.0} real tokens/s (batch {BATCH} of {}–{SEQ}, right-padded){}",
        SEQ / BATCH,
        gflops(tps)
    );
    Ok(())
}

/// Greedy decoding of `NEW` tokens for `BATCH` continuations of a 32-token prompt: new tokens/s,
/// the best of five calls (one call of the fixture takes a few milliseconds).
fn generation(model: &Model) -> anyhow::Result<f64> {
    let prompt: Vec<u32> = (0..32).map(|i| i * 3 + 10).collect();
    let p = SamplingParams {
        temperature: 0.0,
        max_new_tokens: NEW,
        ..Default::default()
    };
    let mut best = 0f64;
    for _ in 0..5 {
        let t = Instant::now();
        let outs = generate(model, None, &prompt, BATCH, &p)?;
        let n: usize = outs.iter().map(Vec::len).sum();
        best = best.max(n as f64 / t.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// How an agent's turns are decoded ([`agent_turns`]).
#[derive(Clone, Copy, Debug)]
enum Turns {
    /// Each episode's turn a `generate` call of its own, its whole history its prompt.
    Alone,
    /// Every episode's turn in one batch, each history fed whole.
    Together,
    /// One batch that keeps its prefixes: each turn feeds only the observation after what the
    /// episode wrote.
    Kept,
}

/// Multi-turn decoding as agent RL samples: `episodes` episodes of `turns` turns; each starts
/// from a 64-token task of its own, and each turn writes 8 tokens (greedy) and then reads a
/// 24-token observation. Seconds in all, and prompt tokens fed.
fn agent_turns(model: &Model, episodes: usize, turns: usize, how: Turns) -> anyhow::Result<(f64, usize)> {
    let p = SamplingParams {
        temperature: 0.0,
        max_new_tokens: 8,
        ..Default::default()
    };
    let mut history: Vec<Vec<u32>> = (0..episodes as u32)
        .map(|e| (0..64).map(|i| (e * 131 + i * 7) % 400 + 5).collect())
        .collect();
    let observation: Vec<u32> = (0..24).map(|i| i * 11 % 300 + 20).collect();
    let fed_before = model.encoded_tokens();
    let mut kept = stepwise_model::Decoding::new(model, None).keep_prefixes();
    let t = Instant::now();
    for _ in 0..turns {
        let outs: Vec<Vec<u32>> = match how {
            Turns::Alone => (history.iter())
                .map(|h| Ok(generate(model, None, h, 1, &p)?.remove(0)))
                .collect::<anyhow::Result<_>>()?,
            Turns::Together => {
                // Its cache made only as big as the turn needs (as `EnginePolicy::continue_each`).
                let mut fresh = (history.iter()).fold(stepwise_model::Decoding::new(model, None), |b, h| {
                    b.only_for(h.len(), 1, p.max_new_tokens)
                });
                decode_together(&mut fresh, &history, &p)?
            }
            Turns::Kept => decode_together(&mut kept, &history, &p)?,
        };
        for (h, out) in history.iter_mut().zip(outs) {
            h.extend(out);
            h.extend(&observation);
        }
    }
    // A turn feeds 7 of the 8 tokens it writes (the last is never fed).
    let fed = model.encoded_tokens() - fed_before - episodes * turns * 7;
    Ok((t.elapsed().as_secs_f64(), fed))
}

/// One continuation of each prompt, all joined to `batch` and decoded together.
fn decode_together(
    batch: &mut stepwise_model::Decoding,
    prompts: &[Vec<u32>],
    p: &SamplingParams,
) -> anyhow::Result<Vec<Vec<u32>>> {
    let ids: Vec<usize> = (prompts.iter())
        .map(|h| batch.join(h, 1, p.clone()))
        .collect::<anyhow::Result<_>>()?;
    let mut done = std::collections::HashMap::new();
    while !batch.is_idle() {
        done.extend(batch.step()?);
    }
    Ok(ids
        .iter()
        .map(|id| done.remove(id).expect("decoded").remove(0))
        .collect())
}

/// `agent`: [`agent_turns`] each way on the packed engine's CPU backend, on the policy folder
/// `STEPWISE_BENCH_POLICY` (a Qwen2.5-0.5B-shaped one: `bench/make_random_prm.py 0.5b DIR
/// --policy`) or the fixture policy.
fn print_agent_turns() -> anyhow::Result<()> {
    let dir = std::env::var("STEPWISE_BENCH_POLICY").map_or_else(|_| fixtures().join("qwen2-policy"), PathBuf::from);
    let model = Model::load_packed(&dir, stepwise_model::Placement::Cpu)?;
    let (episodes, turns) = (16, 8);
    for how in [Turns::Alone, Turns::Together, Turns::Kept] {
        let (seconds, fed) = agent_turns(&model, episodes, turns, how)?;
        println!(
            "{}: agent turns {how:?}: {episodes} episodes × {turns} turns of 8 tokens in {seconds:.2} s, {fed} prompt tokens fed",
            dir.display()
        );
    }
    Ok(())
}

/// Serving-shaped decoding, as `stepwise serve` runs `bench/load_serve.py`'s load without the
/// HTTP: `clients` requests in flight, each an 8-token prompt and `new` new tokens at
/// temperature 0.8, a finished one replaced at once by a new one joining the running batch
/// (chunked prefill). New tokens/s over 120 decoding steps, after `new + 8` to fill the batch.
fn serving(model: &Model, clients: usize, new: usize) -> anyhow::Result<f64> {
    let mut batch = stepwise_model::Decoding::new(model, None);
    let mut next = 0u32;
    let mut join = |batch: &mut stepwise_model::Decoding| -> anyhow::Result<()> {
        let prompt: Vec<u32> = (0..8).map(|j| (next * 31 + j * 7) % 1000 + 10).collect();
        let p = SamplingParams {
            temperature: 0.8,
            max_new_tokens: new,
            seed: u64::from(next),
            ..Default::default()
        };
        next += 1;
        batch.join(&prompt, 1, p).map(|_| ())
    };
    for _ in 0..clients {
        join(&mut batch)?;
    }
    let mut step = |batch: &mut stepwise_model::Decoding| -> anyhow::Result<usize> {
        for _ in batch.step()? {
            join(batch)?;
        }
        Ok(batch.last_step().continuations)
    };
    for _ in 0..new + 8 {
        step(&mut batch)?;
    }
    let t = Instant::now();
    let mut tokens = 0;
    for _ in 0..120 {
        tokens += step(&mut batch)?;
    }
    Ok(tokens as f64 / t.elapsed().as_secs_f64())
}

/// `sample_token` at temperature 0.8 on a row of Qwen2.5's 151,936 logits: `peaked` like a
/// trained model's (a bulk within ±3, one token in a thousand 28 above it), else the bulk alone
/// (a random model's): milliseconds a row; and `token_logprob` with the 5 likeliest (what a
/// request with `logprobs` adds to each of its rows).
fn sampling(peaked: bool) -> (f64, f64) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let logits: Vec<f32> = (0..151_936)
        .map(|i| (rng.random::<f32>() - 0.5) * 6.0 + if peaked && i % 1000 == 0 { 28.0 } else { 0.0 })
        .collect();
    let p = SamplingParams {
        temperature: 0.8,
        ..Default::default()
    };
    let rows = 200;
    let t = Instant::now();
    for _ in 0..rows {
        std::hint::black_box(stepwise_model::generate::sample_token(&logits, &p, &mut rng));
    }
    let sample = t.elapsed().as_secs_f64() * 1e3 / rows as f64;
    let t = Instant::now();
    for r in 0..rows {
        std::hint::black_box(stepwise_model::token_logprob(&logits, r as u32, 5));
    }
    (sample, t.elapsed().as_secs_f64() * 1e3 / rows as f64)
}

/// The products of one decoding step of `rows` rows at Qwen2.5-0.5B's shape, weights held in
/// bf16 (24 layers of q, k, v, o, gate, up and down, and the 151,936-row output layer: 0.99 GB,
/// far past any cache): milliseconds a step and the weights' bytes read per second. The floor of
/// a decoding step, which reads every weight once: bound by memory at 8 rows (8 clients), by
/// the tiles' arithmetic at 73 (64 clients: ~58 continuations and a prompt chunk) and 512.
fn decode_products(rows: usize) -> anyhow::Result<(f64, f64)> {
    use candle_core::{DType, Tensor};
    use stepwise_model::kernels::Linear;
    let dev = Device::Cpu;
    let (h, i, kv, vocab) = (896, 4864, 128, 151_936);
    let shapes = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)];
    let weight = |(out, inp): (usize, usize)| -> anyhow::Result<Linear> {
        Ok(Linear::new(
            Tensor::randn(0f32, 0.02, (out, inp), &dev)?.to_dtype(DType::BF16)?,
            None,
        ))
    };
    let mut layers = Vec::new();
    for _ in 0..24 {
        layers.push(shapes.iter().map(|&s| weight(s)).collect::<anyhow::Result<Vec<_>>>()?);
    }
    let head = weight((vocab, h))?;
    let bytes: usize = layers
        .iter()
        .flatten()
        .chain([&head])
        .map(|l| l.weight().elem_count() * 2)
        .sum();
    let xh = Tensor::randn(0f32, 1.0, (rows, h), &dev)?;
    let xi = Tensor::randn(0f32, 1.0, (rows, i), &dev)?;
    let step_here = || -> anyhow::Result<()> {
        for layer in &layers {
            for (l, &(_, inp)) in layer.iter().zip(&shapes) {
                std::hint::black_box(l.forward(if inp == h { &xh } else { &xi }, false)?);
            }
        }
        std::hint::black_box(head.forward(&xh, false)?);
        Ok(())
    };
    // On a pool thread, as `Decoding::step` runs its products.
    let step = || -> anyhow::Result<()> { rayon::scope(|_| step_here()) };
    step()?;
    // The best of five rounds of ten steps (the machine's noise only ever slows a round).
    let mut secs = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..10 {
            step()?;
        }
        secs = secs.min(t.elapsed().as_secs_f64() / 10.0);
    }
    Ok((secs * 1e3, bytes as f64 / secs / 1e9))
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

/// A beam growing for eight steps, four candidate steps scored per round (their shared prefix is
/// the beam): scored incrementally and whole. Returns (tokens, seconds) for each.
fn incremental_beam(model: &Model, tok: &Tokenizer, layout: PrmLayout) -> anyhow::Result<[(usize, f64); 2]> {
    let question = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?";
    let scorer = PrmScorer::new(model, tok, layout);
    let mut out = [(0, 0.0); 2];
    // Each way runs twice, the second timed: the first pays for warming the buffers and pool.
    for (k, round) in [0, 0, 1, 1].into_iter().enumerate() {
        let incremental = IncrementalScorer::new(scorer.clone());
        let s: &dyn StepScorer = if k < 2 { &incremental } else { &scorer };
        out[round] = (0, 0.0);
        let t = Instant::now();
        let mut beam: Vec<String> = Vec::new();
        for depth in 0..STEPS {
            let kids: Vec<Vec<String>> = (0..4)
                .map(|c| {
                    let mut b = beam.clone();
                    b.push(format!(
                        "Step {depth}: in month {c} she sold {} clips, so the total is {}.",
                        48 / (c + 1),
                        48 + depth * c
                    ));
                    b
                })
                .collect();
            let inputs: Vec<ScoreInput<'_>> = kids
                .iter()
                .map(|b| ScoreInput {
                    problem_id: "p",
                    question,
                    steps: b.iter().map(String::as_str).collect(),
                    partial: true,
                })
                .collect();
            out[round].0 += s.score(&inputs)?.tokens;
            beam = kids[depth % 4].clone();
        }
        out[round].1 = t.elapsed().as_secs_f64();
    }
    Ok(out)
}

fn print_incremental(name: &str, model: &Model, tok: &Tokenizer, layout: PrmLayout) -> anyhow::Result<()> {
    let [(inc_tokens, inc_secs), (whole_tokens, whole_secs)] = incremental_beam(model, tok, layout)?;
    println!(
        "{name}: beam of {STEPS} steps × 4 candidates: incremental {inc_tokens} tokens in {:.1} ms, whole {whole_tokens} tokens in {:.1} ms ({:.1}× fewer tokens, {:.2}× the speed)",
        inc_secs * 1e3,
        whole_secs * 1e3,
        whole_tokens as f64 / inc_tokens as f64,
        whole_secs / inc_secs
    );
    Ok(())
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

/// Qwen2.5-Math-PRM-7B's shape, random weights made and held in bf16 (never an f32 copy of the
/// model: 30 GB would not fit this machine): one scoring pass of 512 tokens, generation-shaped
/// decoding through the same decoder, and the process's peak resident memory.
fn seven_b(dev: &Device) -> anyhow::Result<()> {
    let mut cfg = ModelConfig::tiny(152064, 3584, 28, 28, 4, HeadKind::ProcessRewardMlp);
    cfg.intermediate_size = 18944;
    cfg.head_dim = 128;
    cfg.num_labels = 2;
    cfg.max_position_embeddings = 4096;
    let t = Instant::now();
    let m = Model::new(
        cfg.clone(),
        candle_nn::VarBuilder::from_backend(Box::new(RandomBf16), candle_core::DType::F32, dev.clone()),
    )?;
    println!(
        "qwen2.5-math-prm-7b shape (random, bf16-held): built in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    let ids: Vec<u32> = (0..512).map(|i| (i * 7 % 500) as u32 + 10).collect();
    let ids = Tensor::from_vec(ids, (1, 512), dev)?;
    let rows = vec![(1..=STEPS).map(|k| k * 512 / STEPS - 1).collect::<Vec<_>>()];
    let t = Instant::now();
    let _ = m.head_logits(&m.hidden(Input::padded(&ids, None).read(&rows))?)?;
    let tps = 512.0 / t.elapsed().as_secs_f64();
    println!(
        "qwen2.5-math-prm-7b shape (random, bf16-held): scoring {tps:.1} tokens/s (1 × 512), {:.1} GFLOP/s in the decoder",
        2.0 * params(&cfg) * tps / 1e9
    );
    println!(
        "qwen2.5-math-prm-7b shape (random, bf16-held): peak resident memory {:.2} GB",
        peak_rss_gb()
    );
    Ok(())
}

/// This process's peak resident memory (`VmHWM`), in GB.
fn peak_rss_gb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(str::to_string))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<f64>().ok()))
        .map_or(f64::NAN, |kb| kb * 1024.0 / 1e9)
}

/// Weights made on request: normal with std 0.02 in bf16 for matrices, ones for norms, zeros for
/// biases (f32), as the loader holds a bf16 checkpoint.
struct RandomBf16;

impl candle_nn::var_builder::SimpleBackend for RandomBf16 {
    fn get(
        &self,
        s: candle_core::Shape,
        name: &str,
        _: candle_nn::Init,
        _: candle_core::DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        if name.ends_with("bias") {
            return Tensor::zeros(s, candle_core::DType::F32, dev);
        }
        if s.rank() == 1 {
            return Tensor::ones(s, candle_core::DType::F32, dev);
        }
        // Row blocks, so the f32 draw never holds more than 256 MB.
        let (rows, cols) = s.dims2()?;
        let block = (1 << 26) / cols.max(1);
        let parts = (0..rows)
            .step_by(block.max(1))
            .map(|r| Tensor::randn(0f32, 0.02, (block.min(rows - r), cols), dev)?.to_dtype(candle_core::DType::BF16))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Tensor::cat(&parts, 0)
    }

    fn get_unchecked(&self, name: &str, _: candle_core::DType, _: &Device) -> candle_core::Result<Tensor> {
        candle_core::bail!("{name}: the random backend needs a shape")
    }

    fn contains_tensor(&self, _: &str) -> bool {
        true
    }
}

/// Whether a section runs: `cargo bench -p stepwise-model -- [scoring|generation|serving|training|search|sampling|decode|agent] [--big]`
/// (no section name: all of them).
fn wanted(section: &str) -> bool {
    let names: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| {
            [
                "scoring",
                "generation",
                "serving",
                "training",
                "search",
                "sampling",
                "decode",
                "agent",
            ]
            .contains(&a.as_str())
        })
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
            // What an RL run on the packed trainer samples with on the CPU.
            let packed = Model::load_packed(&fixtures().join(name), stepwise_model::Placement::Cpu)?;
            println!(
                "{name}: generation on the packed engine's CPU backend {:.0} new tokens/s (batch {BATCH}, shared prefix)",
                generation(&packed)?
            );
        }
    }
    if wanted("agent") {
        print_agent_turns()?;
    }
    if wanted("search") {
        for name in ["qwen2-prm", "qwen2-tokcls"] {
            let dir = fixtures().join(name);
            let m = Model::load(&dir, &dev)?;
            let tok = Tokenizer::from_dir(&dir)?;
            let layout = stepwise_model::layout::detect(&m, &tok)?;
            print_incremental(name, &m, &tok, layout)?;
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
    if wanted("decode") {
        // 512 rows: a prefill's or scoring's products (AMX's tiles where the CPU has them).
        for rows in [1, 4, 5, 8, 9, 16, 73, 512] {
            let (ms, gbs) = decode_products(rows)?;
            // Two bytes a weight, two FLOPs a weight a row.
            let gflops = gbs * rows as f64;
            println!(
                "decoding products, qwen2.5-0.5b shape in bf16 ({rows} rows, every matrix of a step): \
                 {ms:.1} ms a step, {gbs:.1} GB/s of weights, {gflops:.0} GFLOP/s"
            );
        }
    }
    if wanted("sampling") {
        for peaked in [true, false] {
            let (sample, logprob) = sampling(peaked);
            let kind = if peaked {
                "peaked, as a trained model's"
            } else {
                "flat, as a random model's"
            };
            println!("sampling 151,936 logits ({kind}): {sample:.3} ms a row, its log-probability and the 5 likeliest {logprob:.3} ms");
        }
    }
    if std::env::args().any(|a| a == "--big") {
        big(&dev)?;
    }
    if std::env::args().any(|a| a == "--7b") {
        seven_b(&dev)?;
    }
    Ok(())
}

/// `--big`: the sections on a randomly initialised model of Qwen2.5-0.5B's shape, its weights
/// held in f32 and then in bf16.
fn big(dev: &Device) -> anyhow::Result<()> {
    let dev = dev.clone();
    let mut cfg = ModelConfig::tiny(151936, 896, 24, 14, 2, HeadKind::CausalLm);
    cfg.intermediate_size = 4864;
    cfg.head_dim = 64;
    cfg.max_position_embeddings = 4096;
    let varmap = VarMap::new();
    let m = Model::fresh(cfg.clone(), &varmap, &dev, 0)?;
    if wanted("scoring") {
        print_scoring("qwen2.5-0.5b shape (random)", &m, 2, Some(2.0 * params(&cfg)))?;
    }
    if wanted("search") {
        // The same shape as a token-classification PRM, read with the fixture's tokenizer.
        let mut prm = cfg.clone();
        prm.head = HeadKind::TokenClassification;
        prm.num_labels = 2;
        let varmap = VarMap::new();
        let m = Model::fresh(prm, &varmap, &dev, 0)?;
        let tok = Tokenizer::from_dir(&fixtures().join("qwen2-tokcls"))?;
        print_incremental(
            "qwen2.5-0.5b shape PRM (random)",
            &m,
            &tok,
            PrmLayout::TokenClassifier { separator: "\n".into() },
        )?;
    }
    if wanted("generation") {
        println!(
            "qwen2.5-0.5b shape (random): generation {:.1} new tokens/s",
            generation(&m)?
        );
    }
    // The same weights rounded to bf16 and held so (half the bytes each product reads).
    let dir = std::env::temp_dir().join(format!("stepwise-bench-bf16-{}", std::process::id()));
    let mut bf16 = cfg.clone();
    bf16.dtype = candle_core::DType::BF16;
    stepwise_model::checkpoint::save_checkpoint(&dir, &bf16, &varmap)?;
    drop(m);
    let mut held = Model::load_as(&dir, &dev, WeightDtype::Auto)?;
    std::fs::remove_dir_all(&dir)?;
    if wanted("scoring") {
        // In bf16 products where the CPU has AVX512_BF16 (the default), then in f32 products
        // on the widened weights (the f32 run's numbers at half its memory).
        for bf16_products in [true, false] {
            held.set_bf16_products(bf16_products);
            let products = if bf16_products && stepwise_model::bf16_products_available() {
                "bf16"
            } else {
                "f32"
            };
            print_scoring(
                &format!("qwen2.5-0.5b shape (random, bf16-held, {products} products)"),
                &held,
                2,
                Some(2.0 * params(&cfg)),
            )?;
        }
        held.set_bf16_products(true);
    }
    if wanted("generation") {
        println!(
            "qwen2.5-0.5b shape (random, bf16-held): generation {:.1} new tokens/s",
            generation(&held)?
        );
    }
    if wanted("generation") || wanted("serving") {
        for (clients, new) in [(8, 32), (64, 32), (8, 512), (64, 256)] {
            println!(
                "qwen2.5-0.5b shape (random, bf16-held): serving-shaped decoding, {clients} requests of {new} new tokens in flight: {:.1} new tokens/s",
                serving(&held, clients, new)?
            );
        }
    }
    Ok(())
}
