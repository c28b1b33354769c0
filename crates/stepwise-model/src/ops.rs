//! Fused CPU kernels that also record a backward pass, so inference and training share them.
//!
//! candle's fused kernels (`softmax_last_dim`, `rms_norm`) have no gradient, and the same maths
//! written as plain tensor ops makes five passes over the attention scores plus a broadcast mask.
//! [`masked_softmax`] does scale + causal/padding mask + softmax in one pass over the allowed
//! keys only (half the `exp` calls of a dense causal softmax), on every core.

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor, D};
use rayon::prelude::*;
use std::sync::Arc;

/// Which keys each query of an attention score tensor `[b, h, t, s]` may see.
#[derive(Debug, Clone)]
pub struct KeyMask {
    /// Cached positions before the first query: query `i` sees keys `0..=offset + i`.
    pub offset: usize,
    /// Per sequence and key (`[b * s]`): whether the key is a real token (`None`: all are).
    pub valid: Option<Arc<Vec<bool>>>,
}

impl KeyMask {
    /// From a padding mask `[b, s]` (1 = real token) and the number of cached positions.
    pub fn new(offset: usize, pad: Option<&Tensor>) -> candle_core::Result<Self> {
        let valid = match pad {
            None => None,
            Some(p) => {
                let v: Vec<f32> = p.to_dtype(candle_core::DType::F32)?.flatten_all()?.to_vec1()?;
                if v.iter().all(|&x| x > 0.5) {
                    None
                } else {
                    Some(Arc::new(v.into_iter().map(|x| x > 0.5).collect()))
                }
            }
        };
        Ok(KeyMask { offset, valid })
    }

    /// As an additive mask `[b, 1, t, s]` (0 allowed, −∞ causal, −1e9 padding), for devices
    /// without the fused kernel.
    fn additive(&self, b: usize, t: usize, s: usize, dev: &candle_core::Device) -> candle_core::Result<Tensor> {
        let mut m = Vec::with_capacity(b * t * s);
        for bi in 0..b {
            for i in 0..t {
                for j in 0..s {
                    m.push(if j > self.offset + i {
                        f32::NEG_INFINITY
                    } else if self.valid.as_ref().is_some_and(|v| !v[bi * s + j]) {
                        -1e9
                    } else {
                        0.0
                    });
                }
            }
        }
        Tensor::from_vec(m, (b, 1, t, s), dev)
    }
}

struct MaskedSoftmax {
    scale: f32,
    mask: KeyMask,
}

impl CustomOp1 for MaskedSoftmax {
    fn name(&self) -> &'static str {
        "masked-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("masked-softmax: f32 only");
        };
        let (start, end) = layout
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("masked-softmax: input must be contiguous".into()))?;
        let x = &data[start..end];
        let (_, h, t, s) = layout.shape().dims4()?;
        let mut out = vec![0f32; x.len()];
        let (offset, scale) = (self.mask.offset, self.scale);
        let valid = self.mask.valid.as_deref();
        out.par_chunks_mut(s).enumerate().for_each(|(row, y)| {
            let (bi, i) = (row / (h * t), row % t);
            let xs = &x[row * s..(row + 1) * s];
            let causal = (offset + i + 1).min(s);
            let ok = |j: usize| valid.is_none_or(|v| v[bi * s + j]);
            // A query whose visible keys are all padding (itself padding) attends uniformly
            // over the causal window, as an additive −1e9 mask would make it.
            let any = (0..causal).any(ok);
            let keep = |j: usize| !any || ok(j);
            let mut max = f32::NEG_INFINITY;
            for j in (0..causal).filter(|&j| keep(j)) {
                max = max.max(xs[j] * scale);
            }
            let mut sum = 0f32;
            for j in 0..causal {
                if keep(j) {
                    let e = (xs[j] * scale - max).exp();
                    y[j] = e;
                    sum += e;
                }
            }
            let inv = 1.0 / sum;
            for v in &mut y[..causal] {
                *v *= inv;
            }
        });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        // y = softmax(scale·x) on the allowed keys: dx = scale · y ⊙ (dy − Σ dy ⊙ y).
        let dot = (grad * res)?.sum_keepdim(D::Minus1)?;
        Ok(Some(((grad.broadcast_sub(&dot)? * res)? * self.scale as f64)?))
    }
}

/// `softmax(scale · scores)` over the keys `mask` allows, for scores `[b, h, t, s]`; masked
/// entries are exactly 0. Differentiable. Fused on CPU; plain tensor ops on other devices.
pub fn masked_softmax(scores: &Tensor, scale: f64, mask: &KeyMask) -> candle_core::Result<Tensor> {
    if scores.device().is_cpu() && scores.dtype() == candle_core::DType::F32 {
        return scores.contiguous()?.apply_op1(MaskedSoftmax {
            scale: scale as f32,
            mask: mask.clone(),
        });
    }
    let (b, _, t, s) = scores.dims4()?;
    let m = mask.additive(b, t, s, scores.device())?.to_dtype(scores.dtype())?;
    candle_nn::ops::softmax_last_dim(&(scores * scale)?.broadcast_add(&m)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn reference(x: &Tensor, scale: f64, mask: &KeyMask) -> Tensor {
        let (b, _, t, s) = x.dims4().unwrap();
        let m = mask.additive(b, t, s, x.device()).unwrap();
        candle_nn::ops::softmax(&(x * scale).unwrap().broadcast_add(&m).unwrap(), D::Minus1).unwrap()
    }

    fn close(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    #[test]
    fn matches_the_unfused_ops_forward_and_backward() {
        let dev = Device::Cpu;
        let pad = Tensor::new(&[[1f32, 1., 1., 1., 1.], [0., 1., 1., 1., 0.]], &dev).unwrap();
        for (offset, t) in [(0, 5), (2, 3), (4, 1)] {
            let mask = KeyMask::new(offset, Some(&pad)).unwrap();
            let x = Var::from_tensor(&Tensor::randn(0f32, 2., (2, 3, t, 5), &dev).unwrap()).unwrap();
            let w = Tensor::randn(0f32, 1., (2, 3, t, 5), &dev).unwrap();
            let (a, b) = (masked_softmax(&x, 0.7, &mask).unwrap(), reference(&x, 0.7, &mask));
            assert!(close(&a, &b) < 1e-6, "forward, offset {offset}");
            let ga = (a * &w).unwrap().sum_all().unwrap().backward().unwrap();
            let gb = (b * &w).unwrap().sum_all().unwrap().backward().unwrap();
            let (ga, gb) = (ga.get(&x).unwrap(), gb.get(&x).unwrap());
            assert!(close(ga, gb) < 1e-6, "backward, offset {offset}");
        }
    }
}
