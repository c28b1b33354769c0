//! Where a training step's time goes (forward, backward, optimiser) on a lab-sized model:
//! `cargo run --release -p stepwise-model --example train_phases [hidden layers batch]`.

use candle_core::Device;
use candle_nn::VarMap;
use std::time::Instant;
use stepwise_model::train::optim::AdamW;
use stepwise_model::train::{batch_loss, Example, Objective};
use stepwise_model::{HeadKind, Model, ModelConfig};

fn main() -> anyhow::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (hidden, layers, batch) = (
        *args.first().unwrap_or(&64),
        *args.get(1).unwrap_or(&2),
        *args.get(2).unwrap_or(&32),
    );
    let cfg = ModelConfig::tiny(100, hidden, layers, 4, 2, HeadKind::CausalLm);
    let varmap = VarMap::new();
    let mut m = Model::fresh(cfg, &varmap, &Device::Cpu, 0)?;
    m.set_training(true);
    let data: Vec<Example> = (0..batch)
        .map(|k| Example {
            ids: (0..60).map(|i| ((i * 7 + k * 13) % 97) as u32 + 3).collect(),
            lm_from: 20,
            ..Default::default()
        })
        .collect();
    let refs: Vec<&Example> = data.iter().collect();
    let named = stepwise_model::train::optim::named_vars(&varmap);
    let mut opt = AdamW::new(named, 1e-3, 0.01)?;
    let (mut f, mut b, mut o) = (0.0, 0.0, 0.0);
    let reps = 20;
    for _ in 0..reps {
        let t = Instant::now();
        let (loss, _) = batch_loss(&m, &refs, Objective::Lm)?;
        let t1 = Instant::now();
        let g = loss.backward()?;
        let t2 = Instant::now();
        opt.step(&g, 1.0)?;
        let t3 = Instant::now();
        f += (t1 - t).as_secs_f64();
        b += (t2 - t1).as_secs_f64();
        o += (t3 - t2).as_secs_f64();
    }
    let r = reps as f64 * 1e-3;
    println!(
        "{hidden}x{layers}, batch {batch}x60: forward {:.1} ms, backward {:.1} ms, optimiser {:.1} ms",
        f / r,
        b / r,
        o / r
    );
    Ok(())
}
