//! Timing of one training step's parts on a tiny model (for profiling).
use candle_core::{Device, Tensor};
use candle_nn::VarMap;
use std::time::Instant;
use stepwise_model::train::{batch_loss, Example, Objective};
use stepwise_model::{HeadKind, Model, ModelConfig};

fn main() -> anyhow::Result<()> {
    let varmap = VarMap::new();
    let cfg = ModelConfig::tiny(80, 64, 2, 4, 2, HeadKind::CausalLm);
    let mut model = Model::fresh(cfg, &varmap, &Device::Cpu, 0)?;
    model.set_training(true);
    let ex: Vec<Example> = (0..32)
        .map(|i| Example {
            ids: (0..60).map(|j| ((i + j) % 80) as u32).collect(),
            targets: vec![],
            lm_from: 20,
        })
        .collect();
    let refs: Vec<&Example> = ex.iter().collect();
    for _ in 0..3 {
        let t = Instant::now();
        let (loss, _) = batch_loss(&model, &refs, Objective::Lm)?;
        let f = t.elapsed();
        let g = loss.backward()?;
        let b = t.elapsed();
        println!("forward {:?} backward {:?} grads {}", f, b - f, g.get_ids().count());
    }
    model.set_training(false);
    let ids = Tensor::zeros((32, 60), candle_core::DType::U32, &Device::Cpu)?;
    let t = Instant::now();
    let _ = model.hidden(&ids, None, None)?;
    println!("inference forward {:?}", t.elapsed());
    Ok(())
}
