//! The gated MLP activation `silu(gate) · up` of Qwen2/Llama in one pass each way.

use super::simd::{self, madd, Kernel};
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

/// Elements per parallel task.
const CHUNK: usize = 4096;

/// `1 / (1 + e^(−x))`.
#[inline(always)]
pub(crate) fn sigmoid<const FMA: bool>(x: f32) -> f32 {
    1.0 / (1.0 + simd::exp::<FMA>(-x))
}

/// `y = silu(g) · u` elementwise.
struct Forward<'a> {
    g: &'a [f32],
    u: &'a [f32],
    y: &'a mut [f32],
}

impl Kernel for Forward<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        for ((y, &g), &u) in self.y.iter_mut().zip(self.g).zip(self.u) {
            *y = g * sigmoid::<FMA>(g) * u;
        }
    }
}

/// `gate = silu(gate) · up` in place (inside a [`Kernel`]).
#[inline(always)]
pub(crate) fn swiglu_into<const FMA: bool>(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g * sigmoid::<FMA>(*g) * u;
    }
}

/// Gradients of `silu(g) · u`: `dg = dy · u · σ(g)(1 + g(1 − σ(g)))`, `du = dy · silu(g)`.
struct Backward<'a> {
    g: &'a [f32],
    u: &'a [f32],
    dy: &'a [f32],
    dg: &'a mut [f32],
    du: &'a mut [f32],
}

impl Kernel for Backward<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        for i in 0..self.dg.len() {
            let (g, u, dy) = (self.g[i], self.u[i], self.dy[i]);
            let s = sigmoid::<FMA>(g);
            self.dg[i] = dy * u * s * madd::<FMA>(g, 1.0 - s, 1.0);
            self.du[i] = dy * g * s;
        }
    }
}

struct SwiGlu;

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "swiglu"
    }

    fn cpu_fwd(
        &self,
        gs: &CpuStorage,
        gl: &Layout,
        us: &CpuStorage,
        ul: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (g, u) = (super::f32_slice(gs, gl, "swiglu")?, super::f32_slice(us, ul, "swiglu")?);
        if g.len() != u.len() {
            candle_core::bail!("swiglu: gate {:?} and up {:?} differ", gl.shape(), ul.shape());
        }
        let mut y = vec![0f32; g.len()];
        y.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)))
            .for_each(|(y, (g, u))| simd::dispatch(Forward { g, u, y }));
        Ok((CpuStorage::F32(y), gl.shape().clone()))
    }

    fn bwd(
        &self,
        g: &Tensor,
        u: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let both = g.apply_op3(u, &dy.contiguous()?, SwiGluGrad)?;
        Ok((Some(both.get(0)?), Some(both.get(1)?)))
    }
}

/// `(g, u, dy)` → `[2, …]`: the gradients with respect to `g` and `u`, stacked.
struct SwiGluGrad;

impl CustomOp3 for SwiGluGrad {
    fn name(&self) -> &'static str {
        "swiglu-grad"
    }

    fn cpu_fwd(
        &self,
        gs: &CpuStorage,
        gl: &Layout,
        us: &CpuStorage,
        ul: &Layout,
        ds: &CpuStorage,
        dl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (g, u, dy) = (
            super::f32_slice(gs, gl, "swiglu-grad")?,
            super::f32_slice(us, ul, "swiglu-grad")?,
            super::f32_slice(ds, dl, "swiglu-grad")?,
        );
        let n = g.len();
        let mut out = vec![0f32; 2 * n];
        let (dg, du) = out.split_at_mut(n);
        dg.par_chunks_mut(CHUNK)
            .zip(du.par_chunks_mut(CHUNK))
            .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)).zip(dy.par_chunks(CHUNK)))
            .for_each(|((dg, du), ((g, u), dy))| simd::dispatch(Backward { g, u, dy, dg, du }));
        let mut dims = vec![2];
        dims.extend_from_slice(gl.dims());
        Ok((CpuStorage::F32(out), Shape::from(dims)))
    }
}

/// `silu(gate) · up`, differentiable; fused on CPU, plain tensor ops elsewhere.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> candle_core::Result<Tensor> {
    if super::fused_here(gate) {
        return gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGlu);
    }
    candle_nn::ops::silu(gate)? * up
}
