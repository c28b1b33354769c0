//! Fused CPU kernels that also record a backward pass, so inference and training share them.
//!
//! candle's fused kernels (`softmax_last_dim`, `rms_norm`) have no gradient, and the same maths
//! written as plain tensor ops makes five passes over the attention scores plus a broadcast mask.
//! [`masked_softmax`] does scale + causal/padding mask + softmax in one pass over the allowed
//! keys only (half the `exp` calls of a dense causal softmax), on every core; [`rms_norm`] and
//! [`rope`] are one pass each way instead of six and five ops.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor, D};
use rayon::prelude::*;
use std::sync::Arc;

pub(crate) mod attention;
mod bias;
pub(crate) mod cpu_inference;
mod linear;
pub(crate) mod sgemm;
pub(crate) mod simd;
pub(crate) mod swiglu;
pub(crate) mod tiles;
pub(crate) mod tiles_amx;
mod token_logprob;
pub(crate) mod weights;

pub use attention::attention;
pub(crate) use bias::add_bias;
pub use linear::{Linear, MAX_STREAMED_ROWS, MIN_STREAMED_DEPTH};
pub use sgemm::bf16_products_available;
pub use swiglu::swiglu;
pub(crate) use swiglu::swiglu_into;
pub use token_logprob::token_logprobs;

/// Work (multiply-adds) below which a kernel runs on the calling thread: handing a job to the
/// thread pool and waking its workers costs more than that (decoding steps of the lab's models).
pub(crate) const PARALLEL_MIN_WORK: usize = 1 << 16;

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

    /// Also hide the first `pads[b]` keys of each sequence `b` (left padding of a cache shared by
    /// sequences of different lengths), for `s` keys in all.
    pub fn pad_left(self, pads: &[usize], s: usize) -> Self {
        let valid = (0..pads.len() * s)
            .map(|i| i % s >= pads[i / s] && self.valid.as_ref().is_none_or(|v| v[i]))
            .collect();
        KeyMask {
            offset: self.offset,
            valid: Some(Arc::new(valid)),
        }
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

/// One row of [`masked_softmax`] over its causal window `x` (keys past it stay 0).
struct SoftmaxRow<'a> {
    x: &'a [f32],
    /// Which keys of the window are real tokens (`None`: all are).
    valid: Option<&'a [bool]>,
    scale: f32,
    y: &'a mut [f32],
}

impl simd::Kernel for SoftmaxRow<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        for (y, x) in self.y.iter_mut().zip(self.x) {
            *y = x * self.scale;
        }
        softmax_window::<FMA>(self.y, self.valid);
    }
}

/// Softmax in place over one query's causal window of scaled scores, skipping padding keys
/// (`valid`, `None`: all keys are real). A query whose visible keys are all padding (itself
/// padding) attends over the whole window, as an additive −1e9 mask would make it.
#[inline(always)]
fn softmax_window<const FMA: bool>(y: &mut [f32], valid: Option<&[bool]>) {
    let inv = 1.0 / exp_window::<FMA>(y, valid, false);
    for y in y.iter_mut() {
        *y *= inv;
    }
}

/// [`softmax_window`] before the division: `e^(y − max)` in place (0 for padding keys), and
/// returns their sum. `one_pass`: exponentials and sum in one pass over sixteen lanes (the
/// inference path); else in two passes (the training path, whose results stay bit for bit what
/// its tests were tuned on).
#[inline(always)]
pub(crate) fn exp_window<const FMA: bool>(y: &mut [f32], valid: Option<&[bool]>, one_pass: bool) -> f32 {
    if let Some(valid) = valid.filter(|v| v.iter().any(|&ok| ok)) {
        for (y, &ok) in y.iter_mut().zip(valid) {
            if !ok {
                *y = f32::NEG_INFINITY;
            }
        }
    }
    let max = simd::max(y);
    if one_pass {
        simd::exp_sub_sum_one_pass::<FMA>(y, max)
    } else {
        simd::exp_sub_sum::<FMA>(y, max)
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
        let x = f32_slice(storage, layout, "masked-softmax")?;
        let (_, h, t, s) = layout.shape().dims4()?;
        let mut out = vec![0f32; x.len()];
        let (offset, scale) = (self.mask.offset, self.scale);
        let valid = self.mask.valid.as_deref();
        out.par_chunks_mut(s).enumerate().for_each(|(row, y)| {
            let (bi, i) = (row / (h * t), row % t);
            let causal = (offset + i + 1).min(s);
            simd::dispatch(SoftmaxRow {
                x: &x[row * s..][..causal],
                valid: valid.map(|v| &v[bi * s..][..causal]),
                scale,
                y: &mut y[..causal],
            });
        });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let op = MaskedSoftmaxGrad {
            scale: self.scale,
            offset: self.mask.offset,
        };
        Ok(Some(res.apply_op2_no_bwd(&grad.contiguous()?, &op)?))
    }
}

/// [`MaskedSoftmax`]'s backward in one pass a row: `y = softmax(scale·x)` on the allowed keys,
/// `dx = scale · y ⊙ (dy − Σ dy ⊙ y)`. The arithmetic is that of the five tensor ops it replaces
/// (a product, a sum from the left, a difference, a product, `v · scale + 0`), so the gradients
/// are the same bits; the sum skips the keys past a row's causal window, whose `y` is exactly 0
/// (adding `±0` to a sum that starts at `+0` changes no bit), unless `dy` is not finite there.
struct MaskedSoftmaxGrad {
    scale: f32,
    offset: usize,
}

impl CustomOp2 for MaskedSoftmaxGrad {
    fn name(&self) -> &'static str {
        "masked-softmax-grad"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let y = f32_slice(s1, l1, self.name())?;
        let dy = f32_slice(s2, l2, self.name())?;
        if l1.shape() != l2.shape() {
            candle_core::bail!("{}: output {:?} and gradient {:?} differ", self.name(), l1.shape(), l2.shape());
        }
        let (_, _, t, s) = l1.shape().dims4()?;
        let mut dx = vec![0f32; y.len()];
        let scale = self.scale;
        dx.par_chunks_mut(s).enumerate().for_each(|(row, dx)| {
            let (y, dy) = (&y[row * s..][..s], &dy[row * s..][..s]);
            let window = (self.offset + row % t + 1).min(s);
            let mut dot = 0f32;
            for (&g, &p) in dy[..window].iter().zip(&y[..window]) {
                dot += g * p;
            }
            if dy[window..].iter().any(|g| !g.is_finite()) {
                for (&g, &p) in dy[window..].iter().zip(&y[window..]) {
                    dot += g * p;
                }
            }
            for ((d, &g), &p) in dx.iter_mut().zip(dy).zip(y) {
                *d = ((g - dot) * p) * scale + 0.0;
            }
        });
        Ok((CpuStorage::F32(dx), l1.shape().clone()))
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

/// A contiguous f32 view of a CPU storage.
fn f32_slice<'a>(storage: &'a CpuStorage, layout: &Layout, op: &str) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(data) = storage else {
        candle_core::bail!("{op}: f32 only");
    };
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("{op}: input must be contiguous")))?;
    Ok(&data[start..end])
}

fn fused_here(x: &Tensor) -> bool {
    x.device().is_cpu() && x.dtype() == candle_core::DType::F32
}

struct RmsNorm {
    eps: f32,
}

impl RmsNorm {
    fn inv_rms(&self, row: &[f32]) -> f32 {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / row.len() as f32;
        1.0 / (ms + self.eps).sqrt()
    }
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, w) = (f32_slice(s1, l1, "rms-norm")?, f32_slice(s2, l2, "rms-norm")?);
        let n = w.len();
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(n).zip(x.par_chunks(n)).for_each(|(y, xr)| {
            let r = self.inv_rms(xr);
            for ((y, x), w) in y.iter_mut().zip(xr).zip(w) {
                *y = x * r * w;
            }
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        // y = x·r·w with r = (mean x² + eps)^-½:
        // dx = r·(g⊙w) − x·r³·mean((g⊙w)⊙x),  dw = Σ_rows g⊙x·r.
        let xs: Vec<f32> = x.flatten_all()?.to_vec1()?;
        let ws: Vec<f32> = w.to_vec1()?;
        let gs: Vec<f32> = grad.flatten_all()?.to_vec1()?;
        let n = ws.len();
        let mut dx = vec![0f32; xs.len()];
        // Partial weight gradients over fixed blocks of rows, summed in order: the same bits on
        // every run whatever the thread scheduling (training must be reproducible).
        const BLOCK: usize = 64;
        let partials: Vec<Vec<f32>> = dx
            .par_chunks_mut(n * BLOCK)
            .zip(xs.par_chunks(n * BLOCK).zip(gs.par_chunks(n * BLOCK)))
            .map(|(dxb, (xb, gb))| {
                let mut dw = vec![0f32; n];
                for ((dxr, xr), gr) in dxb.chunks_mut(n).zip(xb.chunks(n)).zip(gb.chunks(n)) {
                    let r = self.inv_rms(xr);
                    let dot = xr.iter().zip(gr).zip(&ws).map(|((x, g), w)| g * w * x).sum::<f32>() / n as f32;
                    for k in 0..n {
                        dxr[k] = r * gr[k] * ws[k] - xr[k] * r * r * r * dot;
                        dw[k] += gr[k] * xr[k] * r;
                    }
                }
                dw
            })
            .collect();
        let mut dw = vec![0f32; n];
        for p in &partials {
            for (a, b) in dw.iter_mut().zip(p) {
                *a += b;
            }
        }
        Ok((
            Some(Tensor::from_vec(dx, x.shape(), x.device())?),
            Some(Tensor::from_vec(dw, n, w.device())?),
        ))
    }
}

/// RMSNorm over the last dimension with weight `w`: `x / sqrt(mean(x²) + eps) · w`.
/// Differentiable in `x` and `w`; fused on CPU.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    if fused_here(x) {
        return x.contiguous()?.apply_op2(&w.contiguous()?, RmsNorm { eps: eps as f32 });
    }
    let var = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(var + eps)?.sqrt()?)?.broadcast_mul(w)
}

/// Rotary position embedding of `x` `[b, h, t, d]` (the half-split layout of Qwen2/Llama) for
/// positions `offset..offset + t`, with tables `cos`, `sin` `[max_positions, d / 2]`.
struct Rope {
    cos: Arc<Vec<f32>>,
    sin: Arc<Vec<f32>>,
    offset: usize,
    /// Per batch row, how many positions its rotation lags `offset` (its left padding).
    shifts: Option<Arc<Vec<usize>>>,
    /// Rotate the other way (the backward pass).
    inverse: bool,
}

impl CustomOp1 for Rope {
    fn name(&self) -> &'static str {
        "rope"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = f32_slice(storage, layout, "rope")?;
        let (_, h, t, d) = layout.shape().dims4()?;
        let half = d / 2;
        let sign = if self.inverse { -1.0 } else { 1.0 };
        let shift = |row: usize| self.shifts.as_ref().map_or(0, |s| s[row / (h * t)]);
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(d)
            .zip(x.par_chunks(d))
            .enumerate()
            .for_each(|(row, (y, xr))| {
                let p = self.offset + row % t - shift(row);
                let (cos, sin) = (&self.cos[p * half..(p + 1) * half], &self.sin[p * half..(p + 1) * half]);
                for j in 0..half {
                    let (a, b, s) = (xr[j], xr[j + half], sign * sin[j]);
                    y[j] = a * cos[j] - b * s;
                    y[j + half] = b * cos[j] + a * s;
                }
            });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        // A rotation's transpose is the rotation by the opposite angle.
        Ok(Some(grad.contiguous()?.apply_op1(Rope {
            cos: self.cos.clone(),
            sin: self.sin.clone(),
            offset: self.offset,
            shifts: self.shifts.clone(),
            inverse: !self.inverse,
        })?))
    }
}

/// Rotary tables for [`rope`]: `cos`, `sin` `[max_positions, head_dim / 2]`.
#[derive(Clone, Debug)]
pub struct RopeTables {
    cos: Tensor,
    sin: Tensor,
    cos_host: Arc<Vec<f32>>,
    sin_host: Arc<Vec<f32>>,
}

impl RopeTables {
    /// The host copies `(cos, sin)`, `[max_positions, head_dim / 2]` each.
    pub(crate) fn host(&self) -> (&[f32], &[f32]) {
        (&self.cos_host, &self.sin_host)
    }

    /// From the tables as tensors.
    pub fn new(cos: Tensor, sin: Tensor) -> candle_core::Result<Self> {
        Ok(RopeTables {
            cos_host: Arc::new(cos.flatten_all()?.to_vec1()?),
            sin_host: Arc::new(sin.flatten_all()?.to_vec1()?),
            cos,
            sin,
        })
    }
}

/// Rotate `x` `[b, h, t, d]` for positions `offset..offset + t`. Differentiable; fused on CPU.
pub fn rope(x: &Tensor, tables: &RopeTables, offset: usize) -> candle_core::Result<Tensor> {
    rope_shifted(x, tables, offset, None)
}

/// [`rope`] with batch row `b` at positions `offset - shifts[b]..` (`shifts`: the left padding
/// of each row of a shared cache; each at most `offset`).
pub fn rope_shifted(
    x: &Tensor,
    tables: &RopeTables,
    offset: usize,
    shifts: Option<&Arc<Vec<usize>>>,
) -> candle_core::Result<Tensor> {
    if fused_here(x) {
        return x.contiguous()?.apply_op1(Rope {
            cos: tables.cos_host.clone(),
            sin: tables.sin_host.clone(),
            offset,
            shifts: shifts.cloned(),
            inverse: false,
        });
    }
    let t = x.dim(2)?;
    let rotate = |x: &Tensor, start: usize| {
        let (cos, sin) = (tables.cos.narrow(0, start, t)?, tables.sin.narrow(0, start, t)?);
        candle_nn::rotary_emb::rope_slow(&x.contiguous()?, &cos, &sin)
    };
    match shifts {
        None => rotate(x, offset),
        Some(shifts) => {
            let rows = (0..x.dim(0)?)
                .map(|b| rotate(&x.narrow(0, b, 1)?, offset - shifts[b]))
                .collect::<candle_core::Result<Vec<_>>>()?;
            Tensor::cat(&rows, 0)
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// A tensor's f32 values as bits, for tests that compare two computations exactly.
    pub(crate) fn bits(t: &Tensor) -> Vec<u32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
    }

    fn reference(x: &Tensor, scale: f64, mask: &KeyMask) -> Tensor {
        let (b, _, t, s) = x.dims4().unwrap();
        let m = mask.additive(b, t, s, x.device()).unwrap();
        candle_nn::ops::softmax(&(x * scale).unwrap().broadcast_add(&m).unwrap(), D::Minus1).unwrap()
    }

    /// The largest absolute difference of two tensors (shared by the kernels' tests).
    pub(super) fn close(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    /// Forward and gradients (w.r.t. every input) of `f` and `g` agree.
    fn same_with_grads(f: impl Fn(&[Var]) -> Tensor, g: impl Fn(&[Var]) -> Tensor, inputs: &[Tensor]) {
        let vars: Vec<Var> = inputs.iter().map(|t| Var::from_tensor(t).unwrap()).collect();
        let (a, b) = (f(&vars), g(&vars));
        assert!(close(&a, &b) < 1e-5, "forward differs by {}", close(&a, &b));
        let w = Tensor::randn(0f32, 1., a.shape(), a.device()).unwrap();
        let ga = (a * &w).unwrap().sum_all().unwrap().backward().unwrap();
        let gb = (b * &w).unwrap().sum_all().unwrap().backward().unwrap();
        for v in &vars {
            let (x, y) = (ga.get(v).unwrap(), gb.get(v).unwrap());
            assert!(close(x, y) < 1e-4, "gradient differs by {}", close(x, y));
        }
    }

    #[test]
    fn rms_norm_matches_the_unfused_ops() {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1., (2, 3, 8), &dev).unwrap();
        let w = Tensor::randn(1f32, 0.2, 8, &dev).unwrap();
        same_with_grads(
            |v| rms_norm(&v[0], &v[1], 1e-6).unwrap(),
            |v| {
                let var = v[0].sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
                let d = (var + 1e-6).unwrap().sqrt().unwrap();
                v[0].broadcast_div(&d).unwrap().broadcast_mul(&v[1]).unwrap()
            },
            &[x, w],
        );
    }

    #[test]
    fn swiglu_matches_the_unfused_ops() {
        let dev = Device::Cpu;
        let g = Tensor::randn(0f32, 3., (3, 5000), &dev).unwrap();
        let u = Tensor::randn(0f32, 1., (3, 5000), &dev).unwrap();
        same_with_grads(
            |v| swiglu(&v[0], &v[1]).unwrap(),
            |v| (candle_nn::ops::silu(&v[0]).unwrap() * v[1].as_tensor()).unwrap(),
            &[g, u],
        );
    }

    #[test]
    fn rope_matches_candle() {
        let dev = Device::Cpu;
        let (max, half) = (10, 4);
        let cos = Tensor::randn(0f32, 1., (max, half), &dev).unwrap();
        let sin = Tensor::randn(0f32, 1., (max, half), &dev).unwrap();
        let tables = RopeTables::new(cos.clone(), sin.clone()).unwrap();
        let x = Tensor::randn(0f32, 1., (2, 3, 4, 2 * half), &dev).unwrap();
        same_with_grads(
            |v| rope(&v[0], &tables, 3).unwrap(),
            |v| {
                let (c, s) = (cos.narrow(0, 3, 4).unwrap(), sin.narrow(0, 3, 4).unwrap());
                candle_nn::rotary_emb::rope_slow(&v[0], &c, &s).unwrap()
            },
            &[x],
        );
    }

    #[test]
    fn fused_attention_matches_softmax_between_matmuls() {
        let dev = Device::Cpu;
        let pad = Tensor::new(&[[1f32, 1., 1., 1., 1.], [0., 0., 1., 1., 1.]], &dev).unwrap();
        for (offset, t) in [(0, 5), (3, 2), (4, 1)] {
            let mask = KeyMask::new(offset, Some(&pad)).unwrap();
            let q = Tensor::randn(0f32, 1., (2, 4, t, 12), &dev).unwrap();
            let k = Tensor::randn(0f32, 1., (2, 2, 5, 12), &dev).unwrap();
            let v = Tensor::randn(0f32, 1., (2, 2, 5, 12), &dev).unwrap();
            let fused = attention(&q, &k, &v, 0.3, &mask).unwrap();
            // Reference: repeat kv heads, scores, masked softmax, weighted sum.
            let rep = |x: &Tensor| {
                x.unsqueeze(2)
                    .unwrap()
                    .repeat((1, 1, 2, 1, 1))
                    .unwrap()
                    .reshape((2, 4, 5, 12))
                    .unwrap()
            };
            let att = q.matmul(&rep(&k).t().unwrap()).unwrap();
            let p = masked_softmax(&att, 0.3, &mask).unwrap();
            let y = p
                .matmul(&rep(&v))
                .unwrap()
                .transpose(1, 2)
                .unwrap()
                .reshape((2, t, 48))
                .unwrap();
            assert!(close(&fused, &y) < 1e-5, "offset {offset}: {}", close(&fused, &y));
        }
    }

    #[test]
    fn masked_softmax_matches_the_unfused_ops() {
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

    /// candle's CPU matmul as vendored (vendor/candle-core.patch): its output is not zero-filled
    /// before the product, so every element must be written, for batched, broadcast (a stride-zero
    /// batch on either side, which 0.9.2 as published computed wrongly for the left one), empty
    /// (k = 0) and strided operands; each is checked against products computed one row at a time.
    #[test]
    fn candles_matmul_writes_every_element_of_every_batch() {
        let dev = Device::Cpu;
        let naive = |a: &Tensor, b: &Tensor, n: usize| -> Vec<f32> {
            let (a, b) = (a.to_vec3::<f32>().unwrap(), b.to_vec3::<f32>().unwrap());
            let mut out = Vec::new();
            for (x, y) in a.iter().zip(&b) {
                for row in x {
                    for j in 0..n {
                        out.push(row.iter().zip(y).map(|(v, r)| v * r[j]).sum::<f32>());
                    }
                }
            }
            out
        };
        for (batch, m, k, n) in [(3, 5, 7, 4), (4, 1, 9, 33), (2, 6, 0, 3), (5, 17, 3, 1)] {
            let a = Tensor::randn(0f32, 1., (batch, m, k), &dev).unwrap();
            let b = Tensor::randn(0f32, 1., (batch, k, n), &dev).unwrap();
            let a1 = Tensor::randn(0f32, 1., (1, m, k), &dev).unwrap().broadcast_as((batch, m, k)).unwrap();
            let b1 = Tensor::randn(0f32, 1., (1, k, n), &dev).unwrap().broadcast_as((batch, k, n)).unwrap();
            let bt = Tensor::randn(0f32, 1., (batch, n, k), &dev).unwrap().transpose(1, 2).unwrap();
            for (x, y) in [(&a, &b), (&a1, &b), (&a, &b1), (&a1, &b1), (&a, &bt)] {
                let got = x.matmul(y).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
                let want = naive(&x.contiguous().unwrap(), &y.contiguous().unwrap(), n);
                assert_eq!(got.len(), want.len());
                let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max);
                assert!(worst < 1e-4, "{batch}x{m}x{k}x{n}: off by {worst}");
            }
        }
    }

    /// The fused backward gives the same bits as the tensor ops it replaced, with padding keys,
    /// cached positions, and rows whose upstream gradient is zero.
    #[test]
    fn masked_softmax_grad_is_the_same_bits_as_its_tensor_ops() {
        let dev = Device::Cpu;
        let pad = Tensor::new(&[[1f32, 1., 1., 1., 1., 1., 1.], [0., 0., 1., 1., 1., 1., 1.]], &dev).unwrap();
        for (offset, t) in [(0, 7), (2, 5), (6, 1)] {
            let mask = KeyMask::new(offset, Some(&pad)).unwrap();
            let x = Var::from_tensor(&Tensor::randn(0f32, 3., (2, 3, t, 7), &dev).unwrap()).unwrap();
            let keep = Tensor::new((0..2 * 3 * t).map(|r| (r % 4 != 1) as u8 as f32).collect::<Vec<_>>(), &dev).unwrap();
            let w = Tensor::randn(0f32, 1., (2, 3, t, 7), &dev)
                .unwrap()
                .broadcast_mul(&keep.reshape((2, 3, t, 1)).unwrap())
                .unwrap();
            let y = masked_softmax(&x, 0.35, &mask).unwrap();
            let fused = (&y * &w).unwrap().sum_all().unwrap().backward().unwrap();
            let y = y.detach();
            let dot = (&w * &y).unwrap().sum_keepdim(D::Minus1).unwrap();
            let ops = ((w.broadcast_sub(&dot).unwrap() * &y).unwrap() * 0.35f32 as f64).unwrap();
            assert_eq!(bits(fused.get(&x).unwrap()), bits(&ops), "offset {offset}");
        }
    }
}
