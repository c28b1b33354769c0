//! bf16 weights multiplied in f32 (`Precision { bf16_products: false, .. }`, the CLI's
//! `--dtype bf16-weights`): held at two bytes a value and widened exactly inside the kernels,
//! they compute what the checkpoint converted to f32 computes, in every kernel. The choice is
//! the model's: another model in the same process keeps multiplying in bf16.

use candle_core::{DType, Device, Tensor};
use stepwise_model::{generate, Model, Precision, SamplingParams, WeightDtype};

/// Held as stored, multiplied in f32.
const F32_PRODUCTS: Precision = Precision {
    weights: WeightDtype::Auto,
    bf16_products: false,
};

mod common;
use common::{fixtures, max_diff, rewards, wide_checkpoint};

#[test]
fn a_bf16_checkpoint_held_in_bf16_scores_as_in_f32() {
    let dir = fixtures().join("qwen2-prm");
    let held = Model::load_as(&dir, &Device::Cpu, F32_PRODUCTS).unwrap();
    assert!(!held.precision().bf16_products);
    let wide = Model::load_as(&dir, &Device::Cpu, WeightDtype::F32).unwrap();
    assert_eq!(held.decoder.embeddings().dtype(), DType::BF16);
    let (a, b) = (rewards("qwen2-prm", &held), rewards("qwen2-prm", &wide));
    for ((x, t), (y, _)) in a.iter().zip(&b) {
        assert!((x - y).abs() < 1e-6, "held {x} vs widened {y}");
        assert!((x - t).abs() < 1e-4, "held {x} vs transformers {t}");
    }
}

#[test]
fn held_bf16_runs_every_kernel_as_widened_f32() {
    let dir_tmp = tempfile::tempdir().unwrap();
    let dir = dir_tmp.path().join("stepwise-held-f32");
    wide_checkpoint(&dir);
    let held = Model::load_as(&dir, &Device::Cpu, F32_PRODUCTS).unwrap();
    let wide = Model::load_as(&dir, &Device::Cpu, WeightDtype::F32).unwrap();
    // The same checkpoint in bf16 products, loaded beside it (the default).
    let bf16 = Model::load_as(&dir, &Device::Cpu, WeightDtype::Auto).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(held.decoder.embeddings().dtype(), DType::BF16);
    // Prefill/scoring: the CPU inference path (tiles or gemm on widened blocks).
    let ids = Tensor::new(&[[5u32, 17, 400, 9, 3, 77, 2, 15, 600, 31, 8, 4]], &Device::Cpu).unwrap();
    let (a, b) = (held.forward(&ids, None).unwrap(), wide.forward(&ids, None).unwrap());
    assert!(max_diff(&a, &b) < 1e-4, "all positions: {}", max_diff(&a, &b));
    if stepwise_model::bf16_products_available() {
        // The other model still multiplies in bf16: its numbers move by bf16's rounding.
        let c = bf16.forward(&ids, None).unwrap();
        assert!(max_diff(&c, &b) > 1e-4, "bf16 products: {}", max_diff(&c, &b));
        assert!(
            max_diff(&held.forward(&ids, None).unwrap(), &b) < 1e-4,
            "the first is unchanged"
        );
    }
    // Decoding: the weight-streaming kernel (up to 16 rows) and candle's matmul (more rows).
    for n in [3, 20] {
        let p = SamplingParams {
            temperature: 0.8,
            max_new_tokens: 12,
            seed: 11,
            ..Default::default()
        };
        let prompt = [5u32, 17, 400, 9, 3];
        let (x, y) = (
            generate(&held, None, &prompt, n, &p).unwrap(),
            generate(&wide, None, &prompt, n, &p).unwrap(),
        );
        assert_eq!(x, y, "{n} rows");
    }
}
