//! `log softmax(logits)[target]` of every row, differentiable, in one pass each way: what
//! training's next-token loss, a log-ratio verifier's spans and RL's token log-probabilities
//! read from the head's logits.
//!
//! candle's `log_softmax` followed by `gather` makes three full `[rows, vocab]` tensors forward and
//! about twenty backward (each gradient starts as a tensor of zeros that the op's share is added
//! to), for one value a row. Here the forward keeps one value a row and the backward writes the
//! logits' gradient once. The arithmetic is candle's, operation for operation and in its order
//! (max, `x − max`, `exp`, a sum from the left, `ln`; backward through the same chain, the max's
//! share included), so the values and gradients are the same bits as candle's composition:
//! switching a training run to this op leaves its weights unchanged, only faster (tested).

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor, D};
use rayon::prelude::*;
use std::sync::Arc;

/// `log softmax(logits)[r, targets[r]]` for logits `[rows, vocab]`: `[rows]`. Fused on the CPU
/// in f32; candle's `log_softmax` and `gather` elsewhere (the same values).
pub fn token_logprobs(logits: &Tensor, targets: &[u32]) -> candle_core::Result<Tensor> {
    let (rows, vocab) = logits.dims2()?;
    if targets.len() != rows {
        candle_core::bail!("token log-probabilities: {} targets for {rows} rows", targets.len());
    }
    if let Some(&t) = targets.iter().find(|&&t| t as usize >= vocab) {
        candle_core::bail!("token log-probabilities: token {t} outside a vocabulary of {vocab}");
    }
    if super::fused_here(logits) && vocab > 0 {
        let op = TokenLogprob {
            targets: Arc::new(targets.to_vec()),
        };
        return logits.contiguous()?.apply_op1(op);
    }
    composed(logits, targets)
}

/// candle's composition: what the fused op computes, on any device.
pub(crate) fn composed(logits: &Tensor, targets: &[u32]) -> candle_core::Result<Tensor> {
    let logp = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    let idx = Tensor::new(targets, logits.device())?.unsqueeze(1)?;
    logp.gather(&idx, 1)?.squeeze(1)
}

/// The sum of `exp(x − max)` over a row, from the left as candle's sum is; each term is handed to
/// `each` with its index as it is added (the backward keeps them).
fn exp_sum(x: &[f32], max: f32, mut each: impl FnMut(usize, f32)) -> f32 {
    let mut sum = 0f32;
    for (j, &v) in x.iter().enumerate() {
        let e = (v - max).exp();
        each(j, e);
        sum += e;
    }
    sum
}

/// The largest value of a row, scanned from the left as candle's max is.
fn max_of(x: &[f32]) -> f32 {
    let mut max = x[0];
    for &v in &x[1..] {
        if v > max {
            max = v;
        }
    }
    max
}

struct TokenLogprob {
    targets: Arc<Vec<u32>>,
}

impl CustomOp1 for TokenLogprob {
    fn name(&self) -> &'static str {
        "token-logprob"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = super::f32_slice(storage, layout, self.name())?;
        let (rows, vocab) = layout.shape().dims2()?;
        let mut out = vec![0f32; rows];
        out.par_iter_mut().enumerate().for_each(|(r, y)| {
            let row = &x[r * vocab..][..vocab];
            let max = max_of(row);
            let sum = exp_sum(row, max, |_, _| {});
            *y = (row[self.targets[r] as usize] - max) - sum.ln();
        });
        Ok((CpuStorage::F32(out), Shape::from(rows)))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let op = TokenLogprobGrad {
            targets: self.targets.clone(),
        };
        Ok(Some(arg.apply_op2_no_bwd(&grad.contiguous()?, &op)?))
    }
}

/// The logits' gradient from the rows' upstream gradients.
struct TokenLogprobGrad {
    targets: Arc<Vec<u32>>,
}

impl CustomOp2 for TokenLogprobGrad {
    fn name(&self) -> &'static str {
        "token-logprob-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = super::f32_slice(s1, l1, self.name())?;
        let upstream = super::f32_slice(s2, l2, self.name())?;
        let (_, vocab) = l1.shape().dims2()?;
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(vocab).enumerate().for_each(|(r, dx)| {
            let row = &x[r * vocab..][..vocab];
            row_grad(row, self.targets[r] as usize, upstream[r], dx);
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

/// One row's gradient, through candle's chain in its order (`0.0 +` where candle adds a share
/// to a gradient that starts as zeros, so even the zeros' signs agree):
/// `logp = d − ln s`, `d = x − max`, `s = Σ exp d`, and the max's share `−Σ ∂d` at its entries.
fn row_grad(x: &[f32], target: usize, g: f32, dx: &mut [f32]) {
    // `exp(x − max)` into `dx` while summing (as the forward sums), read again below.
    let max = max_of(x);
    let sum = exp_sum(x, max, |j, e| dx[j] = e);
    // Into `ln s`: −Σ of the gathered gradient (one entry is g, the rest zeros).
    let into_log = 0.0 + (0.0 - g);
    let into_sum = 0.0 + into_log / sum;
    let into_exp = 0.0 + into_sum;
    // ∂d, and the max's share −Σ ∂d, summed from the left as candle sums.
    let mut into_max = 0f32;
    for (j, d) in dx.iter_mut().enumerate() {
        let gathered = if j == target { 0.0 + (0.0 + g) } else { 0.0 };
        *d = (0.0 + gathered) + into_exp * *d;
        into_max += 0.0 - *d;
    }
    let into_max = 0.0 + into_max;
    for (d, &v) in dx.iter_mut().zip(x) {
        let mask = if max == v { 1f32 } else { 0f32 };
        *d = (0.0 + (0.0 + (0.0 + *d))) + mask * into_max;
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::bits;
    use super::*;
    use candle_core::{Device, Var};
    use rand::{Rng, SeedableRng};

    /// The fused op and candle's composition give the same bits, forward and backward, through
    /// a product before them (the weight's gradient) and a weighted sum after them, with rows
    /// whose maximum is tied and rows whose upstream gradient is zero.
    #[test]
    fn the_same_bits_as_candles_log_softmax_and_gather() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for (rows, hidden, vocab, scale) in [(37, 16, 360, 1.0f32), (5, 8, 601, 8.0), (64, 24, 13, 0.01), (3, 4, 1, 1.0)] {
            let h: Vec<f32> = (0..rows * hidden).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut w: Vec<f32> = (0..vocab * hidden).map(|_| rng.random_range(-scale..scale)).collect();
            // Two vocabulary rows alike: tied maxima in some rows.
            if vocab > 2 {
                let (a, b) = w.split_at_mut(hidden);
                b[..hidden].copy_from_slice(a);
            }
            let targets: Vec<u32> = (0..rows).map(|r| if r % 3 == 0 && vocab > 1 { 1 } else { rng.random_range(0..vocab as u32) }).collect();
            let upstream: Vec<f32> = (0..rows).map(|r| if r % 4 == 1 { 0.0 } else { rng.random_range(-2.0..2.0) }).collect();
            let run = |fused: bool| {
                let dev = Device::Cpu;
                let hv = Var::from_vec(h.clone(), (rows, hidden), &dev).unwrap();
                let wv = Var::from_vec(w.clone(), (vocab, hidden), &dev).unwrap();
                let logits = hv.as_tensor().matmul(&wv.as_tensor().t().unwrap()).unwrap();
                let lp = match fused {
                    true => token_logprobs(&logits, &targets).unwrap(),
                    false => composed(&logits, &targets).unwrap(),
                };
                let up = Tensor::new(upstream.as_slice(), &dev).unwrap();
                let loss = (&lp * &up).unwrap().sum_all().unwrap();
                let grads = loss.backward().unwrap();
                (bits(&lp), bits(grads.get(&wv).unwrap()), bits(grads.get(&hv).unwrap()))
            };
            let (fused, candle) = (run(true), run(false));
            let same = |a: &[u32], b: &[u32], what: &str| {
                let differ = a.iter().zip(b).filter(|(x, y)| x != y).count();
                assert!(a.len() == b.len() && differ == 0, "{what}, vocab {vocab}: {differ} of {} differ", a.len());
            };
            same(&fused.0, &candle.0, "values");
            same(&fused.1, &candle.1, "the weight's gradient");
            same(&fused.2, &candle.2, "the input's gradient");
        }
    }

    #[test]
    fn a_target_outside_the_vocabulary_is_an_error() {
        let logits = Tensor::zeros((2, 5), candle_core::DType::F32, &Device::Cpu).unwrap();
        let err = token_logprobs(&logits, &[0, 5]).unwrap_err().to_string();
        assert!(err.contains("token 5 outside a vocabulary of 5"), "{err}");
        assert!(token_logprobs(&logits, &[0]).is_err());
    }
}
