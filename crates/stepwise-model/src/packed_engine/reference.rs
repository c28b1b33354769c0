//! [`Reference`]: the packed engine's kernels in plain Rust on the CPU, written for reading, not
//! speed. Each is what the CUDA kernel of the same name computes (`src/cuda/kernels.cu`), to
//! rounding: bf16 values are rounded to nearest even where the GPU rounds them, arithmetic is
//! f32. The tests run the whole packed engine on it against the CPU engine.

use super::{Backend, BatchInts, Out, PagedInts, BLOCK};
use anyhow::{ensure, Result};

/// The packed engine's reference backend (see the module's documentation).
#[derive(Debug, Default, Clone, Copy)]
pub struct Reference;

pub(super) fn widen(b: u16) -> f32 {
    half::bf16::from_bits(b).to_f32()
}

pub(super) fn round(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

pub(super) fn int(x: i32) -> usize {
    x as usize
}

/// `act[j] = bf16(silu(gate[j]) · up[j])` for one row `gu = [gate | up]`.
pub(super) fn swiglu_row(gu: &[u16], act: &mut [u16]) {
    let (gate, up) = gu.split_at(act.len());
    for ((a, &g), &u) in act.iter_mut().zip(gate).zip(up) {
        let (g, u) = (widen(g), widen(u));
        *a = round(g / (1.0 + (-g).exp()) * u);
    }
}

/// `y[r, c] = value(r, c)` over `rows × cols` (or `+=` with `accumulate`, f32 only; bf16
/// rounded): where a product's output goes.
pub(super) fn write_product(
    y: Out<'_, Reference>,
    rows: usize,
    cols: usize,
    accumulate: bool,
    value: impl Fn(usize, usize) -> f32,
) -> Result<()> {
    match y {
        Out::F32(y) => {
            for r in 0..rows {
                for c in 0..cols {
                    let v = value(r, c);
                    y[r * cols + c] = if accumulate { y[r * cols + c] + v } else { v };
                }
            }
        }
        Out::Bf16(y) => {
            ensure!(!accumulate, "a bf16 product is written, never added to");
            for r in 0..rows {
                for c in 0..cols {
                    y[r * cols + c] = round(value(r, c));
                }
            }
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
impl Backend for Reference {
    type F32 = Vec<f32>;
    type Bf16 = Vec<u16>;
    type I32 = Vec<i32>;

    fn name(&self) -> String {
        "reference (cpu)".into()
    }

    /// A nominal 1 GiB: the reference backend's buffers are host vectors.
    fn memory(&self) -> Result<(usize, usize)> {
        Ok((1 << 30, 1 << 30))
    }

    fn zeros_f32(&self, n: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; n])
    }

    fn zeros_bf16(&self, n: usize) -> Result<Vec<u16>> {
        Ok(vec![0; n])
    }

    fn upload_f32(&self, host: &[f32]) -> Result<Vec<f32>> {
        Ok(host.to_vec())
    }

    fn upload_i32(&self, host: &[i32]) -> Result<Vec<i32>> {
        Ok(host.to_vec())
    }

    fn write_f32(&self, buf: &mut Vec<f32>, at: usize, host: &[f32]) -> Result<()> {
        ensure!(at + host.len() <= buf.len(), "writing past a buffer's end");
        buf[at..at + host.len()].copy_from_slice(host);
        Ok(())
    }

    fn write_bf16(&self, buf: &mut Vec<u16>, at: usize, host: &[u16]) -> Result<()> {
        ensure!(at + host.len() <= buf.len(), "writing past a buffer's end");
        buf[at..at + host.len()].copy_from_slice(host);
        Ok(())
    }

    fn read_f32(&self, buf: &Vec<f32>, n: usize) -> Result<Vec<f32>> {
        Ok(buf[..n].to_vec())
    }

    fn len_f32(&self, buf: &Vec<f32>) -> usize {
        buf.len()
    }

    fn len_bf16(&self, buf: &Vec<u16>) -> usize {
        buf.len()
    }

    fn embed(&self, table: &Vec<u16>, ids: &Vec<i32>, x: &mut Vec<f32>, rows: usize, hidden: usize) -> Result<()> {
        for r in 0..rows {
            let src = &table[int(ids[r]) * hidden..][..hidden];
            for (dst, &v) in x[r * hidden..][..hidden].iter_mut().zip(src) {
                *dst = widen(v);
            }
        }
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &Vec<f32>,
        rows: Option<&Vec<i32>>,
        w: &Vec<f32>,
        out: &mut Vec<u16>,
        n: usize,
        hidden: usize,
        eps: f32,
    ) -> Result<()> {
        for i in 0..n {
            let r = rows.map_or(i, |rows| int(rows[i]));
            let row = &x[r * hidden..][..hidden];
            let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / hidden as f32 + eps).sqrt();
            for ((o, v), w) in out[i * hidden..][..hidden].iter_mut().zip(row).zip(w) {
                *o = round(v * inv * w);
            }
        }
        Ok(())
    }

    fn gemm(
        &self,
        x: &Vec<u16>,
        w: &Vec<u16>,
        y: Out<'_, Self>,
        rows: usize,
        n: usize,
        k: usize,
        accumulate: bool,
    ) -> Result<()> {
        let dot = |r: usize, c: usize| -> f32 {
            x[r * k..][..k]
                .iter()
                .zip(&w[c * k..][..k])
                .map(|(&a, &b)| widen(a) * widen(b))
                .sum()
        };
        write_product(y, rows, n, accumulate, dot)
    }

    fn bias_rope(
        &self,
        y: &Vec<f32>,
        bias: Option<&Vec<f32>>,
        cos: &Vec<f32>,
        sin: &Vec<f32>,
        positions: &Vec<i32>,
        qkv: &mut Vec<u16>,
        rows: usize,
        heads: usize,
        kv_heads: usize,
        d: usize,
    ) -> Result<()> {
        let (half, width) = (d / 2, (heads + 2 * kv_heads) * d);
        let b = |i: usize| bias.map_or(0.0, |b| b[i]);
        for r in 0..rows {
            let (row, out) = (&y[r * width..][..width], &mut qkv[r * width..][..width]);
            let p = int(positions[r]);
            let (c, s) = (&cos[p * half..][..half], &sin[p * half..][..half]);
            for head in 0..heads + kv_heads {
                for j in 0..half {
                    let (a, bb) = (head * d + j, head * d + j + half);
                    let (xa, xb) = (row[a] + b(a), row[bb] + b(bb));
                    out[a] = round(xa * c[j] - xb * s[j]);
                    out[bb] = round(xb * c[j] + xa * s[j]);
                }
            }
            for i in (heads + kv_heads) * d..width {
                out[i] = round(row[i] + b(i));
            }
        }
        Ok(())
    }

    fn attention(
        &self,
        qkv: &Vec<u16>,
        out: &mut Vec<u16>,
        batch: &BatchInts<Self>,
        rows: usize,
        heads: usize,
        kv_heads: usize,
        d: usize,
    ) -> Result<()> {
        let width = (heads + 2 * kv_heads) * d;
        let scale = 1.0 / (d as f32).sqrt();
        let at = |row: usize, col: usize| widen(qkv[row * width + col]);
        for row in 0..rows {
            let start = int(batch.offsets[int(batch.seq_of_row[row])]);
            for h in 0..heads {
                let g = h / (heads / kv_heads);
                let scores: Vec<f32> = (start..=row)
                    .map(|key| {
                        (0..d)
                            .map(|j| at(row, h * d + j) * at(key, (heads + g) * d + j))
                            .sum::<f32>()
                            * scale
                    })
                    .collect();
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f32 = weights.iter().sum();
                for j in 0..d {
                    let v: f32 = (start..=row)
                        .zip(&weights)
                        .map(|(key, w)| w * at(key, (heads + kv_heads + g) * d + j))
                        .sum();
                    out[row * heads * d + h * d + j] = round(v / total);
                }
            }
        }
        Ok(())
    }

    fn swiglu(&self, gate_up: &Vec<u16>, act: &mut Vec<u16>, rows: usize, inter: usize) -> Result<()> {
        for r in 0..rows {
            swiglu_row(&gate_up[r * 2 * inter..][..2 * inter], &mut act[r * inter..][..inter]);
        }
        Ok(())
    }

    fn bias_relu(&self, y: &Vec<f32>, bias: &Vec<f32>, out: &mut Vec<u16>, rows: usize, width: usize) -> Result<()> {
        for i in 0..rows * width {
            out[i] = round((y[i] + bias[i % width]).max(0.0));
        }
        Ok(())
    }

    fn add_bias(&self, y: &mut Vec<f32>, bias: &Vec<f32>, rows: usize, width: usize) -> Result<()> {
        for i in 0..rows * width {
            y[i] += bias[i % width];
        }
        Ok(())
    }

    fn gather_rows(&self, src: &Vec<u16>, idx: &Vec<i32>, dst: &mut Vec<u16>, n: usize, width: usize) -> Result<()> {
        for i in 0..n {
            dst[i * width..][..width].copy_from_slice(&src[int(idx[i]) * width..][..width]);
        }
        Ok(())
    }

    fn cache_write(
        &self,
        qkv: &Vec<u16>,
        k: &mut Vec<u16>,
        v: &mut Vec<u16>,
        slots: &Vec<i32>,
        rows: usize,
        heads: usize,
        kv_heads: usize,
        d: usize,
    ) -> Result<()> {
        let (width, kvw) = ((heads + 2 * kv_heads) * d, kv_heads * d);
        for r in 0..rows {
            let row = &qkv[r * width..][..width];
            let at = int(slots[r]) * kvw;
            k[at..at + kvw].copy_from_slice(&row[heads * d..][..kvw]);
            v[at..at + kvw].copy_from_slice(&row[(heads + kv_heads) * d..][..kvw]);
        }
        Ok(())
    }

    fn paged_attention(
        &self,
        qkv: &Vec<u16>,
        k: &Vec<u16>,
        v: &Vec<u16>,
        out: &mut Vec<u16>,
        meta: &PagedInts<Self>,
        rows: usize,
        heads: usize,
        kv_heads: usize,
        d: usize,
    ) -> Result<()> {
        let (width, kvw) = ((heads + 2 * kv_heads) * d, kv_heads * d);
        let scale = 1.0 / (d as f32).sqrt();
        for row in 0..rows {
            let (seq, pos) = (int(meta.seq_of_row[row]), int(meta.positions[row]));
            let slot = |key: usize| int(meta.block_table[seq * meta.max_blocks + key / BLOCK]) * BLOCK + key % BLOCK;
            for h in 0..heads {
                let g = h / (heads / kv_heads);
                let q = |j: usize| widen(qkv[row * width + h * d + j]);
                let scores: Vec<f32> = (0..=pos)
                    .map(|key| {
                        (0..d)
                            .map(|j| q(j) * widen(k[slot(key) * kvw + g * d + j]))
                            .sum::<f32>()
                            * scale
                    })
                    .collect();
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f32 = weights.iter().sum();
                for j in 0..d {
                    let val: f32 = (0..=pos)
                        .zip(&weights)
                        .map(|(key, w)| w * widen(v[slot(key) * kvw + g * d + j]))
                        .sum();
                    out[row * heads * d + h * d + j] = round(val / total);
                }
            }
        }
        Ok(())
    }

    fn copy_block(&self, buf: &mut Vec<u16>, src: usize, dst: usize, block_values: usize) -> Result<()> {
        buf.copy_within(src * block_values..(src + 1) * block_values, dst * block_values);
        Ok(())
    }

    fn adapter_form(&self) -> Option<crate::adapters::Form> {
        Some(crate::adapters::Form::HostF32)
    }

    fn lora_add(&self, x: &Vec<u16>, y: Out<'_, Self>, k: usize, width: usize, parts: &[super::LoraPart<'_>]) -> Result<()> {
        super::adapted::host_lora_add(x, y.into(), k, width, parts)
    }
}
