//! [`TrainBackend`] for [`Reference`]: the training kernels in plain Rust, the specification a
//! device's kernels follow (bf16 rounded to nearest even where a device rounds, f32 arithmetic).

use super::reference::{int, round, widen, write_product};
use super::train_backend::{AdamW, TrainBackend};
use super::{BatchInts, Out, Reference};
use anyhow::{ensure, Result};

#[allow(clippy::too_many_arguments)]
impl TrainBackend for Reference {
    fn copy_f32(&self, src: &Vec<f32>, dst: &mut Vec<f32>, n: usize) -> Result<()> {
        dst[..n].copy_from_slice(&src[..n]);
        Ok(())
    }

    fn round_bf16(&self, src: &Vec<f32>, dst: &mut Vec<u16>, at: usize, n: usize) -> Result<()> {
        ensure!(at + n <= dst.len(), "writing past a buffer's end");
        for (d, &s) in dst[at..at + n].iter_mut().zip(&src[..n]) {
            *d = round(s);
        }
        Ok(())
    }

    fn zero_f32(&self, buf: &mut Vec<f32>, n: usize) -> Result<()> {
        buf[..n].fill(0.0);
        Ok(())
    }

    fn gemm_nn(
        &self,
        dy: &Vec<u16>,
        w: &Vec<u16>,
        dx: Out<'_, Self>,
        rows: usize,
        n: usize,
        k: usize,
        accumulate: bool,
    ) -> Result<()> {
        let dot = |r: usize, col: usize| -> f32 { (0..n).map(|c| widen(dy[r * n + c]) * widen(w[c * k + col])).sum() };
        write_product(dx, rows, k, accumulate, dot)
    }

    fn gemm_weight_grad(
        &self,
        dy: &Vec<u16>,
        x: &Vec<u16>,
        dw: &mut Vec<f32>,
        rows: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        for c in 0..n {
            for col in 0..k {
                let s: f32 = (0..rows).map(|r| widen(dy[r * n + c]) * widen(x[r * k + col])).sum();
                dw[c * k + col] += s;
            }
        }
        Ok(())
    }

    fn column_sums(&self, dy: &Vec<f32>, db: &mut Vec<f32>, rows: usize, width: usize) -> Result<()> {
        for c in 0..width {
            db[c] += (0..rows).map(|r| dy[r * width + c]).sum::<f32>();
        }
        Ok(())
    }

    fn rms_norm_backward(
        &self,
        x: &Vec<f32>,
        rows: Option<&Vec<i32>>,
        w: &Vec<f32>,
        dy: &Vec<f32>,
        dx: &mut Vec<f32>,
        dw: &mut Vec<f32>,
        n: usize,
        hidden: usize,
        eps: f32,
    ) -> Result<()> {
        for i in 0..n {
            let r = rows.map_or(i, |rows| int(rows[i]));
            let row = &x[r * hidden..][..hidden];
            let g = &dy[i * hidden..][..hidden];
            let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / hidden as f32 + eps).sqrt();
            // Σ_k dy_k · w_k · x_k, the part every component shares through the rms.
            let shared: f32 = (0..hidden).map(|k| g[k] * w[k] * row[k]).sum();
            for j in 0..hidden {
                dw[j] += g[j] * row[j] * inv;
                dx[r * hidden + j] += inv * g[j] * w[j] - row[j] * inv * inv * inv * shared / hidden as f32;
            }
        }
        Ok(())
    }

    fn swiglu_backward(
        &self,
        gate_up: &Vec<u16>,
        d_act: &Vec<f32>,
        d_gate_up: &mut Vec<u16>,
        rows: usize,
        inter: usize,
    ) -> Result<()> {
        for r in 0..rows {
            let gu = &gate_up[r * 2 * inter..][..2 * inter];
            swiglu_backward_row(gu, &d_act[r * inter..][..inter], &mut d_gate_up[r * 2 * inter..][..2 * inter]);
        }
        Ok(())
    }

    fn relu_backward(&self, out: &Vec<u16>, d: &mut Vec<f32>, n: usize) -> Result<()> {
        for (d, &o) in d[..n].iter_mut().zip(&out[..n]) {
            if widen(o) <= 0.0 {
                *d = 0.0;
            }
        }
        Ok(())
    }

    fn rope_backward(
        &self,
        d_qkv: &Vec<f32>,
        cos: &Vec<f32>,
        sin: &Vec<f32>,
        positions: &Vec<i32>,
        dy: &mut Vec<u16>,
        mut d_bias: Option<&mut Vec<f32>>,
        rows: usize,
        heads: usize,
        kv_heads: usize,
        d: usize,
    ) -> Result<()> {
        let (half, width) = (d / 2, (heads + 2 * kv_heads) * d);
        let mut row_grad = vec![0f32; width];
        for r in 0..rows {
            let g = &d_qkv[r * width..][..width];
            let p = int(positions[r]);
            let (c, s) = (&cos[p * half..][..half], &sin[p * half..][..half]);
            row_grad.copy_from_slice(g);
            for head in 0..heads + kv_heads {
                for j in 0..half {
                    let (a, b) = (head * d + j, head * d + j + half);
                    row_grad[a] = g[a] * c[j] + g[b] * s[j];
                    row_grad[b] = g[b] * c[j] - g[a] * s[j];
                }
            }
            for (i, &v) in row_grad.iter().enumerate() {
                dy[r * width + i] = round(v);
            }
            if let Some(db) = d_bias.as_deref_mut() {
                for (b, v) in db.iter_mut().zip(&row_grad) {
                    *b += v;
                }
            }
        }
        Ok(())
    }

    fn attention_backward(
        &self,
        qkv: &Vec<u16>,
        d_out: &Vec<u16>,
        d_qkv: &mut Vec<f32>,
        batch: &BatchInts<Self>,
        rows: usize,
        heads: usize,
        kv_heads: usize,
        d: usize,
    ) -> Result<()> {
        let width = (heads + 2 * kv_heads) * d;
        let scale = 1.0 / (d as f32).sqrt();
        let at = |row: usize, col: usize| widen(qkv[row * width + col]);
        d_qkv[..rows * width].fill(0.0);
        for row in 0..rows {
            let start = int(batch.offsets[int(batch.seq_of_row[row])]);
            for h in 0..heads {
                let g = h / (heads / kv_heads);
                let (q, k, v) = (h * d, (heads + g) * d, (heads + kv_heads + g) * d);
                let scores: Vec<f32> = (start..=row)
                    .map(|key| (0..d).map(|j| at(row, q + j) * at(key, k + j)).sum::<f32>() * scale)
                    .collect();
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f32 = weights.iter().sum();
                let p: Vec<f32> = weights.iter().map(|w| w / total).collect();
                let d_o: Vec<f32> = (0..d).map(|j| widen(d_out[row * heads * d + h * d + j])).collect();
                // dP_j = dO · v_j; dS_j = P_j (dP_j − Σ P·dP).
                let dp: Vec<f32> = (start..=row)
                    .map(|key| (0..d).map(|j| d_o[j] * at(key, v + j)).sum())
                    .collect();
                let mean: f32 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for (i, key) in (start..=row).enumerate() {
                    let ds = p[i] * (dp[i] - mean) * scale;
                    for j in 0..d {
                        d_qkv[row * width + q + j] += ds * at(key, k + j);
                        d_qkv[key * width + k + j] += ds * at(row, q + j);
                        d_qkv[key * width + v + j] += p[i] * d_o[j];
                    }
                }
            }
        }
        Ok(())
    }

    fn embed_backward(
        &self,
        ids: &Vec<i32>,
        dx: &Vec<f32>,
        d_table: &mut Vec<f32>,
        rows: usize,
        hidden: usize,
    ) -> Result<()> {
        for r in 0..rows {
            let dst = &mut d_table[int(ids[r]) * hidden..][..hidden];
            for (t, g) in dst.iter_mut().zip(&dx[r * hidden..][..hidden]) {
                *t += g;
            }
        }
        Ok(())
    }

    fn token_logprobs(
        &self,
        logits: &Vec<f32>,
        targets: &Vec<i32>,
        logp: &mut Vec<f32>,
        lse: &mut Vec<f32>,
        rows: usize,
        vocab: usize,
    ) -> Result<()> {
        for r in 0..rows {
            (logp[r], lse[r]) = token_logprob_row(&logits[r * vocab..][..vocab], int(targets[r]));
        }
        Ok(())
    }

    fn token_logprobs_backward(
        &self,
        logits: &Vec<f32>,
        targets: &Vec<i32>,
        lse: &Vec<f32>,
        coef: &Vec<f32>,
        d: &mut Vec<u16>,
        rows: usize,
        vocab: usize,
    ) -> Result<()> {
        for r in 0..rows {
            let (row, out) = (&logits[r * vocab..][..vocab], &mut d[r * vocab..][..vocab]);
            token_logprob_grad_row(row, int(targets[r]), lse[r], coef[r], out);
        }
        Ok(())
    }

    fn sum_squares(&self, g: &Vec<f32>, n: usize) -> Result<f64> {
        Ok(g[..n].iter().map(|&v| v as f64 * v as f64).sum())
    }

    fn adamw(
        &self,
        w: &mut Vec<f32>,
        g: &Vec<f32>,
        m: &mut Vec<f32>,
        v: &mut Vec<f32>,
        n: usize,
        opt: AdamW,
    ) -> Result<()> {
        adamw_update(&mut w[..n], &g[..n], &mut m[..n], &mut v[..n], opt);
        Ok(())
    }
}

/// Through SwiGLU for one row: `gu` the row's `[gate | up]`, `da` its output's gradient, into
/// `dgu` (`[∂/∂gate | ∂/∂up]`, bf16).
pub(super) fn swiglu_backward_row(gu: &[u16], da: &[f32], dgu: &mut [u16]) {
    let inter = da.len();
    let (dg, du) = dgu.split_at_mut(inter);
    for j in 0..inter {
        let (g, u) = (widen(gu[j]), widen(gu[inter + j]));
        let sig = 1.0 / (1.0 + (-g).exp());
        dg[j] = round(da[j] * u * sig * (1.0 + g * (1.0 - sig)));
        du[j] = round(da[j] * g * sig);
    }
}

/// One row of logits' log-probability of `target` and log-sum-exp.
pub(super) fn token_logprob_row(row: &[f32], target: usize) -> (f32, f32) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let l = max + row.iter().map(|&z| (z - max).exp()).sum::<f32>().ln();
    (row[target] - l, l)
}

/// One row of [`TrainBackend::token_logprobs_backward`]: `d[j] = bf16(coef · ([j = target] −
/// exp(row[j] − lse)))`.
pub(super) fn token_logprob_grad_row(row: &[f32], target: usize, lse: f32, coef: f32, d: &mut [u16]) {
    for (j, (o, &z)) in d.iter_mut().zip(row).enumerate() {
        let onehot = if j == target { 1.0 } else { 0.0 };
        *o = round(coef * (onehot - (z - lse).exp()));
    }
}

/// AdamW on the values of `w` (as [`TrainBackend::adamw`]), each by its own gradient and moments.
pub(super) fn adamw_update(w: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], opt: AdamW) {
    let (c1, c2) = (
        1.0 - opt.beta1.powi(opt.step as i32),
        1.0 - opt.beta2.powi(opt.step as i32),
    );
    for i in 0..w.len() {
        let gi = g[i] * opt.grad_scale;
        m[i] = opt.beta1 * m[i] + (1.0 - opt.beta1) * gi;
        v[i] = opt.beta2 * v[i] + (1.0 - opt.beta2) * gi * gi;
        let (mh, vh) = (m[i] / c1, v[i] / c2);
        w[i] = w[i] * (1.0 - opt.lr * opt.weight_decay) - opt.lr * mh / (vh.sqrt() + opt.eps);
    }
}
