//! [`Cpu`]: the packed engine on the CPU at speed, so that what a GPU trains with trains on a CPU
//! too: bf16 operands with f32 sums (PyTorch's bf16 autocast), memory holding the weights,
//! AdamW's state and each layer's activations (or, past the trainer's budget, one layer's,
//! recomputed in the backward), not every operation's buffers as candle's autograd does.
//!
//! Its buffers are [`Reference`]'s (host vectors) and so is the arithmetic of every kernel but
//! attention's, whose probabilities multiply in bf16 (`cpu_attention.rs`), and SwiGLU's, whose
//! `exp` is the vector kernels' (`cpu_elementwise.rs`, within a bf16 ulp). The products run on
//! the bf16 tiles (AMX, else AVX512_BF16; else the inference forward's f32 kernels,
//! [`crate::kernels::cpu_inference::product`]) from the activations' bf16 bits, a bf16 output
//! rounded as the tiles store it; the element-wise kernels that cost more than a pass over
//! memory (SwiGLU's, the vocabulary's log-probabilities, AdamW) run in parallel. The rest is
//! [`Reference`]'s own code. Tests check each kernel and whole training steps against
//! [`Reference`].

use super::{cpu_attention, cpu_paged};
use super::cpu_elementwise::{round_into, LogprobGradRow, LogprobRow, Swiglu, SwigluBackward};
use super::reference::widen;
use super::reference_train::adamw_update;
use super::train_backend::{AdamW, TrainBackend};
use super::{Backend, BatchInts, Out, PagedInts, Reference};
use crate::kernels::cpu_inference::product;
use crate::kernels::sgemm::{matmul_t_bf16_rows, matmul_t_bf16_rows_to_bf16, transposed_u16, Bf16Rows};
use crate::kernels::simd;
use crate::kernels::weights::WeightSlice;
use anyhow::{ensure, Result};
use half::slice::HalfBitsSliceExt;
use rayon::prelude::*;

/// The packed engine's CPU backend (see the module's documentation).
#[derive(Debug, Default, Clone, Copy)]
pub struct Cpu;

/// Values a parallel task of an element-wise kernel takes.
const CHUNK: usize = 1 << 16;

/// Rows of `width` values a parallel task of a row-wise kernel takes (about [`CHUNK`] values).
fn rows_a_task(width: usize) -> usize {
    (CHUNK / width.max(1)).max(1)
}

/// bf16 values as the kernels take them (multiplied in bf16 where the CPU can: every operand of
/// the packed engine's products is bf16 already, so this rounds nothing).
fn bf16_weight(v: &[u16]) -> WeightSlice<'_> {
    WeightSlice::bf16(v.reinterpret_cast(), true)
}

/// `y (+)= a · wᵀ` for the bf16 activations `a` `[rows, k]` (as [`Bf16Rows`] says where they
/// lie) and `w` bf16 `[n, k]`, into `y` as [`Out`] asks: packed for the bf16 tiles from their
/// bits where the CPU multiplies in bf16, else widened to f32 for the product kernels.
pub(super) fn product_into(y: Out<'_, Cpu>, a: Bf16Rows, w: &[u16], (rows, n, k): (usize, usize, usize), accumulate: bool) -> Result<()> {
    match y {
        Out::F32(y) => product_f32(y, a, w, (rows, n, k), accumulate, rayon::current_num_threads()),
        Out::Bf16(y) => {
            ensure!(!accumulate, "a bf16 product is written, never added to");
            ensure!(y.len() >= rows * n && w.len() >= n * k, "a buffer too short for [{rows}, {k}] · [{n}, {k}]ᵀ");
            let tasks = rayon::current_num_threads();
            if matmul_t_bf16_rows_to_bf16(&mut y[..rows * n], a, w[..n * k].reinterpret_cast(), (rows, n, k), tasks) {
                return Ok(());
            }
            let mut f = vec![0f32; rows * n];
            product_f32(&mut f, a, w, (rows, n, k), false, tasks)?;
            y[..rows * n]
                .par_chunks_mut(CHUNK)
                .zip(f.par_chunks(CHUNK))
                .for_each(|(y, f)| round_into(f, y));
            Ok(())
        }
    }
}

/// [`product_into`] into f32 rows `y` (any slice: a buffer's part too), in `tasks` parallel
/// blocks of `w`'s rows (1 where the caller runs in parallel itself).
pub(super) fn product_f32(
    y: &mut [f32],
    a: Bf16Rows,
    w: &[u16],
    (rows, n, k): (usize, usize, usize),
    accumulate: bool,
    tasks: usize,
) -> Result<()> {
    ensure!(w.len() >= n * k, "a weight of {} values for [{n}, {k}]", w.len());
    ensure!(y.len() >= rows * n, "writing past a buffer's end");
    let (w, y) = (&w[..n * k], &mut y[..rows * n]);
    if !matmul_t_bf16_rows(y, a, w.reinterpret_cast(), (rows, n, k), accumulate, tasks) {
        product(y, &widened_rows(a, rows, k), bf16_weight(w), (rows, n, k), accumulate, true);
    }
    Ok(())
}

/// The `[rows, k]` activations `a` widened to f32, row by row.
fn widened_rows(a: Bf16Rows, rows: usize, k: usize) -> Vec<f32> {
    match a {
        Bf16Rows::Rows(v, stride) => (0..rows).flat_map(|r| &v[r * stride..][..k]).map(|&b| widen(b)).collect(),
        Bf16Rows::Columns(v, stride) => {
            let t: Vec<u16> = (0..k).flat_map(|s| &v[s * stride..][..rows]).copied().collect();
            transposed_u16(&t, k, rows).into_iter().map(widen).collect()
        }
    }
}

/// The most bytes a paged KV cache takes on the CPU when none is asked for: 2 GiB hold 175k
/// positions of a 0.5B model's keys and values (37k of a 7B's), more than two cores sample in
/// an RL update.
pub const HOST_KV_BYTES: usize = 2 << 30;

/// Bytes of memory available and in all (`/proc/meminfo`; a nominal 1 GiB where it cannot be read).
fn host_memory() -> (usize, usize) {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
            .map(|kb| kb * 1024)
    };
    match (field("MemAvailable:"), field("MemTotal:")) {
        (Some(free), Some(total)) => (free, total),
        _ => (1 << 30, 1 << 30),
    }
}

/// Methods of [`Backend`] or [`TrainBackend`] that run as [`Reference`]'s own, one
/// `name(arg: Type, ..) -> Return;` each (element-wise passes over memory).
macro_rules! as_reference {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(fn $name(&self, $($arg: $ty),*) -> $ret {
            Reference.$name($($arg),*)
        })*
    };
}

#[allow(clippy::too_many_arguments)]
impl Backend for Cpu {
    type F32 = Vec<f32>;
    type Bf16 = Vec<u16>;
    type I32 = Vec<i32>;

    as_reference! {
        zeros_f32(n: usize) -> Result<Vec<f32>>;
        zeros_bf16(n: usize) -> Result<Vec<u16>>;
        upload_f32(host: &[f32]) -> Result<Vec<f32>>;
        upload_i32(host: &[i32]) -> Result<Vec<i32>>;
        write_f32(buf: &mut Vec<f32>, at: usize, host: &[f32]) -> Result<()>;
        write_bf16(buf: &mut Vec<u16>, at: usize, host: &[u16]) -> Result<()>;
        read_f32(buf: &Vec<f32>, n: usize) -> Result<Vec<f32>>;
        embed(table: &Vec<u16>, ids: &Vec<i32>, x: &mut Vec<f32>, rows: usize, hidden: usize) -> Result<()>;
        rms_norm(
            x: &Vec<f32>,
            rows: Option<&Vec<i32>>,
            w: &Vec<f32>,
            out: &mut Vec<u16>,
            n: usize,
            hidden: usize,
            eps: f32
        ) -> Result<()>;
        bias_rope(
            y: &Vec<f32>,
            bias: Option<&Vec<f32>>,
            cos: &Vec<f32>,
            sin: &Vec<f32>,
            positions: &Vec<i32>,
            qkv: &mut Vec<u16>,
            rows: usize,
            heads: usize,
            kv_heads: usize,
            head_dim: usize
        ) -> Result<()>;
        bias_relu(y: &Vec<f32>, bias: &Vec<f32>, out: &mut Vec<u16>, rows: usize, width: usize) -> Result<()>;
        add_bias(y: &mut Vec<f32>, bias: &Vec<f32>, rows: usize, width: usize) -> Result<()>;
        gather_rows(src: &Vec<u16>, idx: &Vec<i32>, dst: &mut Vec<u16>, n: usize, width: usize) -> Result<()>;
        cache_write(
            qkv: &Vec<u16>,
            k: &mut Vec<u16>,
            v: &mut Vec<u16>,
            slots: &Vec<i32>,
            rows: usize,
            heads: usize,
            kv_heads: usize,
            head_dim: usize
        ) -> Result<()>;
        copy_block(buf: &mut Vec<u16>, src: usize, dst: usize, block_values: usize) -> Result<()>;
    }

    fn adapter_form(&self) -> Option<crate::adapters::Form> {
        Some(crate::adapters::Form::HostBf16)
    }

    fn name(&self) -> String {
        "cpu (packed engine)".into()
    }

    fn memory(&self) -> Result<(usize, usize)> {
        Ok(host_memory())
    }

    /// Half the free memory, at most `HOST_KV_BYTES`: the host's memory is the process's and
    /// its neighbours', and a pool once allocated stays paid for (the allocator keeps freed
    /// memory and zeroes it again for the next pool: half the free memory cost an RL run on a
    /// 0.5B policy 7 GB).
    fn kv_budget(&self) -> Result<usize> {
        Ok((host_memory().0 / 2).min(HOST_KV_BYTES))
    }

    fn len_f32(&self, buf: &Vec<f32>) -> usize {
        buf.len()
    }

    fn len_bf16(&self, buf: &Vec<u16>) -> usize {
        buf.len()
    }

    /// Each part in two of the engine's bf16 products over the part's rows gathered: `T =
    /// X·Aᵀ` (f32 sums, rounded to bf16 as PEFT's bf16 forward rounds it) and `U = T·(s·B)ᵀ`,
    /// then `U` added to the rows (the reference backend's f32 update is their specification).
    /// The parts share the threads, each on one: a part is small (15 rows of a rank-16 adapter
    /// on a 0.5B model's projection take tens of microseconds), and splitting each product over
    /// the threads cost more in hand-overs than the products themselves (a sixth of a step).
    fn lora_add(&self, x: &Vec<u16>, y: Out<'_, Self>, k: usize, width: usize, parts: &[super::LoraPart<'_>]) -> Result<()> {
        use super::adapted::{add_rows, fits};
        let mut y: super::adapted::HostOut = y.into();
        let mut live = Vec::with_capacity(parts.len());
        for p in parts {
            if fits(p, x, &y, k, width, crate::adapters::Form::HostBf16)? {
                live.push(p);
            }
        }
        let update = |p: &&super::LoraPart<'_>| -> Result<Vec<f32>> {
            let m = p.rows.len();
            let xs: Vec<u16> = p.rows.iter().flat_map(|&r| &x[r as usize * k..][..k]).copied().collect();
            let mut t = vec![0f32; m * p.r];
            product_f32(&mut t, Bf16Rows::Rows(&xs, k), p.a16, (m, p.r, k), false, 1)?;
            let mut t16 = vec![0u16; t.len()];
            round_into(&t, &mut t16);
            let mut u = vec![0f32; m * p.n];
            product_f32(&mut u, Bf16Rows::Rows(&t16, p.r), p.b16, (m, p.n, p.r), false, 1)?;
            Ok(u)
        };
        let updates: Vec<Result<Vec<f32>>> = match live.as_slice() {
            [one] => vec![update(one)],
            _ => live.par_iter().map(update).collect(),
        };
        for (p, u) in live.iter().zip(updates) {
            add_rows(&mut y, p, width, 0, &u?);
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
        ensure!(x.len() >= rows * k, "reading past a buffer's end");
        product_into(y, Bf16Rows::Rows(x, k), w, (rows, n, k), accumulate)
    }

    fn attention(
        &self,
        qkv: &Vec<u16>,
        out: &mut Vec<u16>,
        batch: &BatchInts<Self>,
        rows: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        let shape = cpu_attention::Shape::new(&batch.offsets, rows, heads, kv_heads, head_dim)?;
        cpu_attention::forward(qkv, out, &shape)
    }

    fn swiglu(&self, gate_up: &Vec<u16>, act: &mut Vec<u16>, rows: usize, inter: usize) -> Result<()> {
        ensure!(gate_up.len() >= rows * 2 * inter && act.len() >= rows * inter, "a buffer too short");
        if rows * inter == 0 {
            return Ok(());
        }
        let per = rows_a_task(inter);
        act[..rows * inter]
            .par_chunks_mut(per * inter)
            .zip(gate_up.par_chunks(per * 2 * inter))
            .for_each(|(act, gu)| simd::dispatch(Swiglu { gu, act, inter }));
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
        head_dim: usize,
    ) -> Result<()> {
        let at = cpu_paged::Places {
            positions: &meta.positions,
            seq_of_row: &meta.seq_of_row,
            block_table: &meta.block_table,
            max_blocks: meta.max_blocks,
        };
        let h = cpu_paged::Heads { heads, kv_heads, d: head_dim };
        cpu_paged::forward(qkv, (k, v), out, &at, rows, h)
    }

}

#[allow(clippy::too_many_arguments)]
impl TrainBackend for Cpu {
    as_reference! {
        copy_f32(src: &Vec<f32>, dst: &mut Vec<f32>, n: usize) -> Result<()>;
        column_sums(dy: &Vec<f32>, db: &mut Vec<f32>, rows: usize, width: usize) -> Result<()>;
        rms_norm_backward(
            x: &Vec<f32>,
            rows: Option<&Vec<i32>>,
            w: &Vec<f32>,
            dy: &Vec<f32>,
            dx: &mut Vec<f32>,
            dw: &mut Vec<f32>,
            n: usize,
            hidden: usize,
            eps: f32
        ) -> Result<()>;
        relu_backward(out: &Vec<u16>, d: &mut Vec<f32>, n: usize) -> Result<()>;
        rope_backward(
            d_qkv: &Vec<f32>,
            cos: &Vec<f32>,
            sin: &Vec<f32>,
            positions: &Vec<i32>,
            dy: &mut Vec<u16>,
            d_bias: Option<&mut Vec<f32>>,
            rows: usize,
            heads: usize,
            kv_heads: usize,
            head_dim: usize
        ) -> Result<()>;
        embed_backward(
            ids: &Vec<i32>,
            dx: &Vec<f32>,
            d_table: &mut Vec<f32>,
            rows: usize,
            hidden: usize
        ) -> Result<()>;
    }

    fn zero_f32(&self, buf: &mut Vec<f32>, n: usize) -> Result<()> {
        ensure!(n <= buf.len(), "writing past a buffer's end");
        buf[..n].par_chunks_mut(CHUNK).for_each(|c| c.fill(0.0));
        Ok(())
    }

    fn round_bf16(&self, src: &Vec<f32>, dst: &mut Vec<u16>, at: usize, n: usize) -> Result<()> {
        ensure!(at + n <= dst.len() && n <= src.len(), "writing past a buffer's end");
        dst[at..at + n]
            .par_chunks_mut(CHUNK)
            .zip(src[..n].par_chunks(CHUNK))
            .for_each(|(d, s)| round_into(s, d));
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
        ensure!(dy.len() >= rows * n && w.len() >= n * k, "reading past a buffer's end");
        // dx = dy · w = dy · (wᵀ)ᵀ: the product kernels take the weight as [k, n].
        let wt = transposed_u16(&w[..n * k], n, k);
        product_into(dx, Bf16Rows::Rows(dy, n), &wt, (rows, k, n), accumulate)
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
        ensure!(dy.len() >= rows * n && x.len() >= rows * k, "reading past a buffer's end");
        // dw += dyᵀ · x = dyᵀ · (xᵀ)ᵀ: rows are the products' depth (dyᵀ read from dy as it lies).
        let xt = transposed_u16(&x[..rows * k], rows, k);
        product_into(Out::F32(dw), Bf16Rows::Columns(dy, n), &xt, (n, k, rows), true)
    }

    fn swiglu_backward(
        &self,
        gate_up: &Vec<u16>,
        d_act: &Vec<f32>,
        d_gate_up: &mut Vec<u16>,
        rows: usize,
        inter: usize,
    ) -> Result<()> {
        ensure!(
            gate_up.len() >= rows * 2 * inter && d_gate_up.len() >= rows * 2 * inter && d_act.len() >= rows * inter,
            "a buffer too short"
        );
        if rows * inter == 0 {
            return Ok(());
        }
        let per = rows_a_task(inter);
        d_gate_up[..rows * 2 * inter]
            .par_chunks_mut(per * 2 * inter)
            .zip(gate_up.par_chunks(per * 2 * inter))
            .zip(d_act.par_chunks(per * inter))
            .for_each(|((d_gu, gu), d_act)| simd::dispatch(SwigluBackward { gu, d_act, d_gu, inter }));
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
        head_dim: usize,
    ) -> Result<()> {
        let shape = cpu_attention::Shape::new(&batch.offsets, rows, heads, kv_heads, head_dim)?;
        cpu_attention::backward(qkv, d_out, d_qkv, &shape)
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
        ensure!(logits.len() >= rows * vocab && targets.len() >= rows, "a buffer too short");
        let each: Vec<(f32, f32)> = logits[..rows * vocab]
            .par_chunks(vocab)
            .zip(&targets[..rows])
            .map(|(row, &t)| {
                let mut out = (0.0, 0.0);
                simd::dispatch(LogprobRow {
                    row,
                    target: t as usize,
                    out: &mut out,
                });
                out
            })
            .collect();
        for (r, (p, l)) in each.into_iter().enumerate() {
            logp[r] = p;
            lse[r] = l;
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
        ensure!(logits.len() >= rows * vocab && d.len() >= rows * vocab, "a buffer too short");
        d[..rows * vocab]
            .par_chunks_mut(vocab)
            .zip(logits.par_chunks(vocab))
            .enumerate()
            .for_each(|(r, (d, row))| {
                simd::dispatch(LogprobGradRow {
                    row,
                    target: targets[r] as usize,
                    lse: lse[r],
                    coef: coef[r],
                    d,
                })
            });
        Ok(())
    }

    fn sum_squares(&self, g: &Vec<f32>, n: usize) -> Result<f64> {
        // In eight f64 lanes a chunk, so that the sum vectorises (a sum in one f64 cannot).
        let squares = |c: &[f32]| {
            let mut acc = [0f64; 8];
            let lanes = c.chunks_exact(8);
            let tail: f64 = lanes.remainder().iter().map(|&v| v as f64 * v as f64).sum();
            for l in lanes {
                for (a, &v) in acc.iter_mut().zip(l) {
                    *a += v as f64 * v as f64;
                }
            }
            acc.iter().sum::<f64>() + tail
        };
        Ok(g[..n].par_chunks(CHUNK).map(squares).sum())
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
        ensure!(w.len() >= n && g.len() >= n && m.len() >= n && v.len() >= n, "a buffer too short");
        // Reference's update value for value, a chunk of values a task.
        w[..n]
            .par_chunks_mut(CHUNK)
            .zip(m[..n].par_chunks_mut(CHUNK))
            .zip(v[..n].par_chunks_mut(CHUNK))
            .zip(g[..n].par_chunks(CHUNK))
            .for_each(|(((w, m), v), g)| adamw_update(w, g, m, v, opt));
        Ok(())
    }
}
