//! RL throughput on a lab-sized policy (64 wide, 2 layers, a 400-word vocabulary, random
//! weights): sampled tokens/s while sampling, learned tokens/s while computing log-probabilities
//! and taking optimiser steps. `cargo bench -p stepwise-rl`.

use anyhow::Result;
use candle_core::Device;
use stepwise_core::seams::{Reward, RewardKind};
use stepwise_core::testing::PlainTask;
use stepwise_core::{Problem, Solution};
use stepwise_model::train::VarMap;
use stepwise_model::{HeadKind, Model, ModelConfig, Prompt, Tokenizer};
use stepwise_rl::trainer::RlRun;
use stepwise_rl::{train_rl, CandleLearner, RlConfig};

/// Every step earns its share of `w1` tokens: a dense reward with spread.
struct CountW1;

impl Reward for CountW1 {
    fn name(&self) -> &str {
        "count-w1"
    }
    fn kind(&self) -> RewardKind {
        RewardKind::Process
    }
    fn rewards(&self, sols: &[Solution]) -> Result<Vec<Vec<f32>>> {
        Ok(sols
            .iter()
            .map(|s| {
                s.steps
                    .iter()
                    .map(|st| {
                        let words: Vec<&str> = st.text.split_whitespace().collect();
                        words.iter().filter(|w| **w == "w1").count() as f32 / words.len().max(1) as f32
                    })
                    .collect()
            })
            .collect())
    }
}

fn main() -> Result<()> {
    let mut words = vec!["<pad>".to_string(), "<unk>".into(), "<eos>".into(), "|".into()];
    words.extend((0..396).map(|i| format!("w{i}")));
    let tok = Tokenizer::word_level(&words, "<unk>", Some("<eos>"))?;
    let cfg = ModelConfig::tiny(words.len(), 64, 2, 4, 2, HeadKind::CausalLm);
    let varmap = VarMap::new();
    let mut policy = Model::fresh(cfg.clone(), &varmap, &Device::Cpu, 1)?;
    let reference = Model::fresh(cfg, &VarMap::new(), &Device::Cpu, 1)?;
    let problems: Vec<Problem> = (0..16)
        .map(|i| Problem {
            id: format!("p{i}"),
            question: format!("w{} w{} w{} w{} w{}", i, i + 1, i + 2, i + 3, i + 4),
            gold_answer: Some("w1".into()),
            ..Default::default()
        })
        .collect();
    let rl = RlConfig {
        updates: 5,
        prompts_per_update: 16,
        group_size: 8,
        minibatch_size: 128,
        lr: 1e-3,
        max_new_tokens: 64,
        checkpoint_every: 0,
        ..Default::default()
    };
    let task = PlainTask::default();
    let log = train_rl(
        RlRun {
            learner: &mut CandleLearner::new(&mut policy)?,
            reference: stepwise_rl::Reference::Model(&reference),
            tokenizer: &tok,
            prompt: Prompt::Pieces,
            separator: "|".into(),
            stop_token_ids: vec![2],
            problems: &problems,
            task: &task,
            reward: &CountW1,
            watch: Vec::new(),
            out_dir: None,
            heldout: None,
            implicit_prm: None,
        },
        &rl,
        |_| {},
    )?;
    // The first update warms up; the rest are measured.
    let measured = &log[1..];
    let sampled = log.last().unwrap().sampled_tokens - log[0].sampled_tokens;
    let learned = log.last().unwrap().updated_tokens - log[0].updated_tokens;
    let sampling: f64 = measured.iter().map(|l| l.sampling_seconds).sum();
    let learning: f64 = measured.iter().map(|l| l.seconds - l.sampling_seconds).sum();
    println!(
        "rl, lab-sized policy (64x2), 16 prompts x 8 samples x <= 64 tokens per update, {} updates:",
        measured.len()
    );
    println!(
        "  sampling + rewards: {:.0} sampled tokens/s",
        sampled as f64 / sampling
    );
    println!(
        "  log-probs + updates: {:.0} learned tokens/s",
        learned as f64 / learning
    );
    println!(
        "  whole updates: {:.2} s each",
        measured.iter().map(|l| l.seconds).sum::<f64>() / measured.len() as f64
    );
    Ok(())
}
