//! Training's kernels on the GPU: [`TrainBackend`] for [`Gpu`], each method one launch of the
//! kernel of the same name in `train_kernels.cu` (attention's backward: two, the queries' and the
//! keys'; products: cuBLAS), specified by the reference backend's plain Rust
//! (`packed_engine/reference_train.rs`).

use super::{Arg, Gpu};
use crate::packed_engine::{AdamW, BatchInts, Out, TrainBackend};
use anyhow::Result;
use cudarc::driver::CudaSlice;

/// Blocks of 256 threads covering `n` values.
fn blocks(n: usize) -> u32 {
    n.div_ceil(256) as u32
}

/// The blocks `sum_squares` reduces into (each grid-strides over the values).
const SUM_BLOCKS: usize = 1024;

impl Gpu {
    /// Launches the elementwise kernel `name` over `n` values with `args` then `n`.
    fn elementwise(&self, name: &str, n: usize, args: &[Arg]) -> Result<()> {
        let mut all = args.to_vec();
        all.push(Arg::I64(n as i64));
        self.launch(name, blocks(n), 256, &all)
    }
}

#[allow(clippy::too_many_arguments)]
impl TrainBackend for Gpu {
    fn copy_f32(&self, src: &CudaSlice<f32>, dst: &mut CudaSlice<f32>, n: usize) -> Result<()> {
        self.elementwise("copy_f32", n, &[Arg::Ptr(self.addr(src)), Arg::Ptr(self.addr(dst))])
    }

    fn round_bf16(&self, src: &CudaSlice<f32>, dst: &mut CudaSlice<u16>, at: usize, n: usize) -> Result<()> {
        anyhow::ensure!(at + n <= dst.len(), "writing past a buffer's end");
        self.elementwise(
            "round_bf16",
            n,
            &[Arg::Ptr(self.addr(src)), Arg::Ptr(self.ptr(dst, at))],
        )
    }

    fn zero_f32(&self, buf: &mut CudaSlice<f32>, n: usize) -> Result<()> {
        self.elementwise("zero_f32", n, &[Arg::Ptr(self.addr(buf))])
    }

    fn gemm_nn(
        &self,
        dy: &CudaSlice<u16>,
        w: &CudaSlice<u16>,
        dx: Out<'_, Self>,
        rows: usize,
        n: usize,
        k: usize,
        accumulate: bool,
    ) -> Result<()> {
        let (out, out_f32) = self.out(dx);
        // Row-major dx = dy·w is column-major dxᵀ = wᵀ·dyᵀ: w is k×n column-major, dy n×rows.
        let what = || format!("cuBLAS product [{rows}, {n}] × [{n}, {k}]");
        let (w, dy) = (self.addr(w), self.addr(dy));
        self.blas_gemm(
            (false, w, k),
            (false, dy, n),
            (out, k),
            (k, rows, n),
            out_f32,
            accumulate,
            what,
        )
    }

    fn gemm_weight_grad(
        &self,
        dy: &CudaSlice<u16>,
        x: &CudaSlice<u16>,
        dw: &mut CudaSlice<f32>,
        rows: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        // Row-major dw += dyᵀ·x is column-major dwᵀ += xᵀ·dy: x is k×rows column-major, dy
        // n×rows taken transposed.
        let what = || format!("cuBLAS product [{rows}, {n}]ᵀ × [{rows}, {k}]");
        let (x, dy, dw) = (self.addr(x), self.addr(dy), self.addr(dw));
        self.blas_gemm((false, x, k), (true, dy, n), (dw, k), (k, n, rows), true, true, what)
    }

    fn column_sums(&self, dy: &CudaSlice<f32>, db: &mut CudaSlice<f32>, rows: usize, width: usize) -> Result<()> {
        use Arg::{Ptr, I32};
        let args = [
            Ptr(self.addr(dy)),
            Ptr(self.addr(db)),
            I32(rows as i32),
            I32(width as i32),
        ];
        self.launch("column_sums", width as u32, 256, &args)
    }

    fn rms_norm_backward(
        &self,
        x: &CudaSlice<f32>,
        rows: Option<&CudaSlice<i32>>,
        w: &CudaSlice<f32>,
        dy: &CudaSlice<f32>,
        dx: &mut CudaSlice<f32>,
        dw: &mut CudaSlice<f32>,
        n: usize,
        hidden: usize,
        eps: f32,
    ) -> Result<()> {
        use Arg::{Ptr, F32, I32};
        let args = [
            Ptr(self.addr(x)),
            Ptr(rows.map_or(0, |r| self.addr(r))),
            Ptr(self.addr(w)),
            Ptr(self.addr(dy)),
            Ptr(self.addr(dx)),
            Ptr(self.addr(dw)),
            I32(hidden as i32),
            F32(eps),
        ];
        self.launch("rms_norm_backward", n as u32, 256, &args)
    }

    fn swiglu_backward(
        &self,
        gate_up: &CudaSlice<u16>,
        d_act: &CudaSlice<f32>,
        d_gate_up: &mut CudaSlice<u16>,
        rows: usize,
        inter: usize,
    ) -> Result<()> {
        use Arg::{Ptr, I32};
        let args = [
            Ptr(self.addr(gate_up)),
            Ptr(self.addr(d_act)),
            Ptr(self.addr(d_gate_up)),
            I32(inter as i32),
        ];
        self.elementwise("swiglu_backward", rows * inter, &args)
    }

    fn relu_backward(&self, out: &CudaSlice<u16>, d: &mut CudaSlice<f32>, n: usize) -> Result<()> {
        self.elementwise("relu_backward", n, &[Arg::Ptr(self.addr(out)), Arg::Ptr(self.addr(d))])
    }

    fn rope_backward(
        &self,
        d_qkv: &CudaSlice<f32>,
        cos: &CudaSlice<f32>,
        sin: &CudaSlice<f32>,
        positions: &CudaSlice<i32>,
        dy: &mut CudaSlice<u16>,
        d_bias: Option<&mut CudaSlice<f32>>,
        rows: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        use Arg::{Ptr, I32};
        let args = [
            Ptr(self.addr(d_qkv)),
            Ptr(self.addr(cos)),
            Ptr(self.addr(sin)),
            Ptr(self.addr(positions)),
            Ptr(self.addr(dy)),
            Ptr(d_bias.map_or(0, |b| self.addr(b))),
            I32(heads as i32),
            I32(kv_heads as i32),
            I32(head_dim as i32),
        ];
        self.launch("rope_backward", rows as u32, 256, &args)
    }

    fn attention_backward(
        &self,
        qkv: &CudaSlice<u16>,
        d_out: &CudaSlice<u16>,
        d_qkv: &mut CudaSlice<f32>,
        batch: &BatchInts<Self>,
        rows: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        use Arg::{Ptr, F32, I32};
        anyhow::ensure!(
            head_dim <= 256,
            "the attention backward takes heads of at most 256, not {head_dim}"
        );
        let stats = self.zeros::<f32>(rows * heads * 3)?;
        let (seq_of_row, offsets) = (self.addr(&batch.seq_of_row), self.addr(&batch.offsets));
        let args = [
            Ptr(self.addr(qkv)),
            Ptr(self.addr(d_out)),
            Ptr(self.addr(d_qkv)),
            Ptr(self.addr(&stats)),
            Ptr(seq_of_row),
            Ptr(offsets),
            I32(rows as i32),
            I32(heads as i32),
            I32(kv_heads as i32),
            I32(head_dim as i32),
            F32(1.0 / (head_dim as f32).sqrt()),
        ];
        // Four warps a block: one a (row, head) for the queries, one a (row, kv head) for the
        // keys, which reads the queries' softmax statistics.
        self.launch("attention_backward_dq", (rows * heads).div_ceil(4) as u32, 128, &args)?;
        self.launch(
            "attention_backward_dkv",
            (rows * kv_heads).div_ceil(4) as u32,
            128,
            &args,
        )
    }

    fn embed_backward(
        &self,
        ids: &CudaSlice<i32>,
        dx: &CudaSlice<f32>,
        d_table: &mut CudaSlice<f32>,
        rows: usize,
        hidden: usize,
    ) -> Result<()> {
        use Arg::{Ptr, I32};
        let args = [
            Ptr(self.addr(ids)),
            Ptr(self.addr(dx)),
            Ptr(self.addr(d_table)),
            I32(hidden as i32),
        ];
        self.launch("embed_backward", rows as u32, 256, &args)
    }

    fn token_logprobs(
        &self,
        logits: &CudaSlice<f32>,
        targets: &CudaSlice<i32>,
        logp: &mut CudaSlice<f32>,
        lse: &mut CudaSlice<f32>,
        rows: usize,
        vocab: usize,
    ) -> Result<()> {
        use Arg::{Ptr, I32};
        let args = [
            Ptr(self.addr(logits)),
            Ptr(self.addr(targets)),
            Ptr(self.addr(logp)),
            Ptr(self.addr(lse)),
            I32(vocab as i32),
        ];
        self.launch("token_logprobs", rows as u32, 1024, &args)
    }

    fn token_logprobs_backward(
        &self,
        logits: &CudaSlice<f32>,
        targets: &CudaSlice<i32>,
        lse: &CudaSlice<f32>,
        coef: &CudaSlice<f32>,
        d: &mut CudaSlice<u16>,
        rows: usize,
        vocab: usize,
    ) -> Result<()> {
        use Arg::{Ptr, I32};
        let args = [
            Ptr(self.addr(logits)),
            Ptr(self.addr(targets)),
            Ptr(self.addr(lse)),
            Ptr(self.addr(coef)),
            Ptr(self.addr(d)),
            I32(vocab as i32),
        ];
        self.launch("token_logprobs_backward", rows as u32, 1024, &args)
    }

    fn sum_squares(&self, g: &CudaSlice<f32>, n: usize) -> Result<f64> {
        let grid = blocks(n).clamp(1, SUM_BLOCKS as u32) as usize;
        let partial = self.zeros::<f32>(grid)?;
        let args = [
            Arg::Ptr(self.addr(g)),
            Arg::Ptr(self.addr(&partial)),
            Arg::I64(n as i64),
        ];
        self.launch("sum_squares", grid as u32, 256, &args)?;
        Ok(self.download(&partial, grid)?.iter().map(|&v| v as f64).sum())
    }

    fn adamw(
        &self,
        w: &mut CudaSlice<f32>,
        g: &CudaSlice<f32>,
        m: &mut CudaSlice<f32>,
        v: &mut CudaSlice<f32>,
        n: usize,
        opt: AdamW,
    ) -> Result<()> {
        use Arg::{Ptr, F32, I64};
        let (c1, c2) = (
            1.0 - opt.beta1.powi(opt.step as i32),
            1.0 - opt.beta2.powi(opt.step as i32),
        );
        let args = [
            Ptr(self.addr(w)),
            Ptr(self.addr(g)),
            Ptr(self.addr(m)),
            Ptr(self.addr(v)),
            I64(n as i64),
            F32(opt.lr),
            F32(opt.beta1),
            F32(opt.beta2),
            F32(opt.eps),
            F32(opt.weight_decay),
            F32(c1),
            F32(c2),
            F32(opt.grad_scale),
        ];
        self.launch("adamw", blocks(n), 256, &args)
    }
}
