//! [`super::Cpu`]'s element-wise kernels that compute more than a pass over memory costs:
//! SwiGLU forward and backward and the token log-probabilities' rows, in the vector kernels
//! ([`simd::dispatch`]: AVX-512 where the CPU has it) with [`simd::exp`] (within 2 ulp of libm's
//! `expf`, which does not vectorise and was a twentieth of a training step) and bf16 rounding
//! without branches. Results are within one bf16 ulp of [`super::Reference`]'s (the same
//! formulas, libm's `expf`), the log-probabilities within a few f32 ulp.

use crate::kernels::simd;
use crate::kernels::swiglu::sigmoid;

/// bf16 bits widened to f32 (`reference::widen`'s values but for a signalling NaN, which
/// `half` quiets in a branch that keeps the loop scalar).
#[inline(always)]
fn widen(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// `x` rounded to the nearest bf16 (ties to even), NaN kept quiet: `half::bf16::from_f32`'s
/// bits, without branches so that loops over it vectorise.
#[inline(always)]
pub(crate) fn round(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    if x.is_nan() {
        (b >> 16) as u16 | 0x40
    } else {
        rounded
    }
}

/// `dst[i] = round(src[i])` for every value of `src` (f32 sums to bf16 bits), in the vector
/// kernels ([`simd::dispatch`]): `half`'s scalar conversion had been a twentieth of a training
/// step.
pub(crate) fn round_into(src: &[f32], dst: &mut [u16]) {
    simd::dispatch(Rounded { src, dst });
}

struct Rounded<'a> {
    src: &'a [f32],
    dst: &'a mut [u16],
}

impl simd::Kernel for Rounded<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        self.dst.iter_mut().zip(self.src).for_each(|(d, &s)| *d = round(s));
    }
}

/// SwiGLU over rows of `[gate | up]` (`gu`, `2 · inter` values a row): `act = bf16(silu(g) · u)`.
pub(super) struct Swiglu<'a> {
    pub gu: &'a [u16],
    pub act: &'a mut [u16],
    pub inter: usize,
}

impl simd::Kernel for Swiglu<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        for (act, gu) in self.act.chunks_exact_mut(self.inter).zip(self.gu.chunks_exact(2 * self.inter)) {
            let (gate, up) = gu.split_at(self.inter);
            for ((a, &g), &u) in act.iter_mut().zip(gate).zip(up) {
                let (g, u) = (widen(g), widen(u));
                *a = round(g / (1.0 + simd::exp::<FMA>(-g)) * u);
            }
        }
    }
}

/// SwiGLU's backward over rows: from `d_act` (f32, `inter` a row) the gradients of gate and up
/// (`d_gu`, bf16, `2 · inter` a row): `dg = da · u · σ(g) · (1 + g · (1 − σ(g)))`,
/// `du = da · g · σ(g)`.
pub(super) struct SwigluBackward<'a> {
    pub gu: &'a [u16],
    pub d_act: &'a [f32],
    pub d_gu: &'a mut [u16],
    pub inter: usize,
}

impl simd::Kernel for SwigluBackward<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        let rows = self.d_gu.chunks_exact_mut(2 * self.inter).zip(self.gu.chunks_exact(2 * self.inter));
        for ((d_gu, gu), da) in rows.zip(self.d_act.chunks_exact(self.inter)) {
            let (gate, up) = gu.split_at(self.inter);
            let (dg, du) = d_gu.split_at_mut(self.inter);
            for ((((dg, du), &g), &u), &da) in dg.iter_mut().zip(du).zip(gate).zip(up).zip(da) {
                let (g, u) = (widen(g), widen(u));
                let sig = sigmoid::<FMA>(g);
                *dg = round(da * u * sig * (1.0 + g * (1.0 - sig)));
                *du = round(da * g * sig);
            }
        }
    }
}

/// One row of logits' log-probability of `target` and log-sum-exp, into `out`: the
/// reference's `token_logprob_row` with [`simd::exp`] in sixteen lanes (libm's `expf` over the
/// vocabulary had been a twentieth of an RL update).
pub(super) struct LogprobRow<'a> {
    pub row: &'a [f32],
    pub target: usize,
    pub out: &'a mut (f32, f32),
}

impl simd::Kernel for LogprobRow<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        const WIDE: usize = 16;
        let max = simd::max(self.row);
        let mut acc = [0f32; WIDE];
        let chunks = self.row.chunks_exact(WIDE);
        let tail: f32 = chunks.remainder().iter().map(|&z| simd::exp::<FMA>(z - max)).sum();
        for c in chunks {
            for l in 0..WIDE {
                acc[l] += simd::exp::<FMA>(c[l] - max);
            }
        }
        let lse = max + (simd::sum(&acc) + tail).ln();
        *self.out = (self.row[self.target] - lse, lse);
    }
}

/// One row of the token log-probabilities' backward: `d[j] = bf16(coef · ([j = target] −
/// exp(row[j] − lse)))`, as the reference's `token_logprob_grad_row` with [`simd::exp`].
pub(super) struct LogprobGradRow<'a> {
    pub row: &'a [f32],
    pub target: usize,
    pub lse: f32,
    pub coef: f32,
    pub d: &'a mut [u16],
}

impl simd::Kernel for LogprobGradRow<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        let (lse, coef) = (self.lse, self.coef);
        for (o, &z) in self.d.iter_mut().zip(self.row) {
            *o = round(coef * (0.0 - simd::exp::<FMA>(z - lse)));
        }
        self.d[self.target] = round(coef * (1.0 - simd::exp::<FMA>(self.row[self.target] - lse)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The branch-free rounding gives `half`'s bits for every kind of value: ties both ways,
    /// carries into the exponent, the largest finite values (to infinity), infinities, NaNs.
    #[test]
    fn rounding_is_halfs() {
        let specials = [0x7f7f_ffff, 0xff7f_ffff, 0x7f80_0000, 0xff80_0000, 0x7fc0_0001, 0xffa0_0000, 0x7f80_0001, 0, 0x8000_0000];
        let ties = (0..4u32).map(|i| (i << 16) | 0x8000);
        let sweep = (0..u32::MAX / 65_521).map(|i| i.wrapping_mul(65_521));
        for b in specials.into_iter().chain(ties).chain(sweep) {
            let x = f32::from_bits(b);
            assert_eq!(round(x), half::bf16::from_f32(x).to_bits(), "{b:#x}");
        }
    }
}
