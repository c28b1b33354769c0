//! The packed engine's kernels on the GPU: [`Backend`] for [`Gpu`], each method one launch of
//! the kernel of the same name in `kernels.cu` (or a cuBLAS product), on the GPU's one stream.

use super::{Arg, Gpu};
use crate::packed_engine::{Backend, BatchInts, Out, PagedInts};
use anyhow::{Context, Result};
use cudarc::driver::CudaSlice;

/// Blocks of 256 threads covering `n` values.
fn blocks(n: usize) -> u32 {
    n.div_ceil(256) as u32
}

impl Gpu {
    /// A product's output: its address, and whether it is f32 (else bf16).
    pub(crate) fn out(&self, y: Out<'_, Self>) -> (u64, bool) {
        match y {
            Out::F32(y) => (self.addr(y), true),
            Out::Bf16(y) => (self.addr(y), false),
        }
    }
}

#[allow(clippy::too_many_arguments)]
impl Backend for Gpu {
    type F32 = CudaSlice<f32>;
    type Bf16 = CudaSlice<u16>;
    type I32 = CudaSlice<i32>;

    fn name(&self) -> String {
        Gpu::name(self).to_string()
    }

    fn memory(&self) -> Result<(usize, usize)> {
        Gpu::memory(self)
    }

    fn zeros_f32(&self, n: usize) -> Result<CudaSlice<f32>> {
        self.zeros(n)
    }

    fn zeros_bf16(&self, n: usize) -> Result<CudaSlice<u16>> {
        self.zeros(n)
    }

    fn upload_f32(&self, host: &[f32]) -> Result<CudaSlice<f32>> {
        self.upload(host)
    }

    fn upload_i32(&self, host: &[i32]) -> Result<CudaSlice<i32>> {
        self.upload(host)
    }

    fn write_f32(&self, buf: &mut CudaSlice<f32>, at: usize, host: &[f32]) -> Result<()> {
        self.stream
            .memcpy_htod(host, &mut buf.slice_mut(at..at + host.len()))
            .context("copying to the GPU")?;
        // The host copy may be dropped once the stream has read it.
        self.synchronize()
    }

    fn write_bf16(&self, buf: &mut CudaSlice<u16>, at: usize, host: &[u16]) -> Result<()> {
        self.stream
            .memcpy_htod(host, &mut buf.slice_mut(at..at + host.len()))
            .context("copying to the GPU")?;
        self.synchronize()
    }

    fn read_f32(&self, buf: &CudaSlice<f32>, n: usize) -> Result<Vec<f32>> {
        self.download(buf, n)
    }

    fn len_f32(&self, buf: &CudaSlice<f32>) -> usize {
        buf.len()
    }

    fn len_bf16(&self, buf: &CudaSlice<u16>) -> usize {
        buf.len()
    }

    fn embed(
        &self,
        table: &CudaSlice<u16>,
        ids: &CudaSlice<i32>,
        x: &mut CudaSlice<f32>,
        rows: usize,
        hidden: usize,
    ) -> Result<()> {
        use Arg::{Ptr, I32};
        self.launch(
            "embed_rows",
            rows as u32,
            256,
            &[
                Ptr(self.addr(table)),
                Ptr(self.addr(ids)),
                Ptr(self.addr(x)),
                I32(hidden as i32),
            ],
        )
    }

    fn rms_norm(
        &self,
        x: &CudaSlice<f32>,
        rows: Option<&CudaSlice<i32>>,
        w: &CudaSlice<f32>,
        out: &mut CudaSlice<u16>,
        n: usize,
        hidden: usize,
        eps: f32,
    ) -> Result<()> {
        use Arg::{Ptr, F32, I32};
        self.launch(
            "rms_norm",
            n as u32,
            256,
            &[
                Ptr(self.addr(x)),
                Ptr(rows.map_or(0, |r| self.addr(r))),
                Ptr(self.addr(w)),
                Ptr(self.addr(out)),
                I32(hidden as i32),
                F32(eps),
            ],
        )
    }

    fn gemm(
        &self,
        x: &CudaSlice<u16>,
        w: &CudaSlice<u16>,
        y: Out<'_, Self>,
        rows: usize,
        n: usize,
        k: usize,
        accumulate: bool,
    ) -> Result<()> {
        let (out, out_f32) = self.out(y);
        Gpu::gemm(self, self.addr(x), self.addr(w), out, rows, n, k, out_f32, accumulate)
    }

    fn bias_rope(
        &self,
        y: &CudaSlice<f32>,
        bias: Option<&CudaSlice<f32>>,
        cos: &CudaSlice<f32>,
        sin: &CudaSlice<f32>,
        positions: &CudaSlice<i32>,
        qkv: &mut CudaSlice<u16>,
        rows: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        use Arg::{Ptr, I32};
        self.launch(
            "bias_rope",
            rows as u32,
            128,
            &[
                Ptr(self.addr(y)),
                Ptr(bias.map_or(0, |b| self.addr(b))),
                Ptr(self.addr(cos)),
                Ptr(self.addr(sin)),
                Ptr(self.addr(positions)),
                Ptr(self.addr(qkv)),
                I32(heads as i32),
                I32(kv_heads as i32),
                I32(head_dim as i32),
            ],
        )
    }

    fn attention(
        &self,
        qkv: &CudaSlice<u16>,
        out: &mut CudaSlice<u16>,
        batch: &BatchInts<Self>,
        rows: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        use Arg::{Ptr, F32, I32};
        let scale = 1.0 / (head_dim as f32).sqrt();
        match self.flash(head_dim)? {
            Some(f) => self.launch_flash(
                &f,
                batch.tiles as u32,
                heads as u32,
                &[
                    Ptr(self.addr(qkv)),
                    Ptr(self.addr(out)),
                    Ptr(self.addr(&batch.offsets)),
                    Ptr(self.addr(&batch.tile_seq)),
                    Ptr(self.addr(&batch.tile_start)),
                    I32(heads as i32),
                    I32(kv_heads as i32),
                    F32(scale * std::f32::consts::LOG2_E),
                ],
            ),
            None => self.launch(
                "attention_simple",
                (rows * heads).div_ceil(4) as u32,
                128,
                &[
                    Ptr(self.addr(qkv)),
                    Ptr(self.addr(out)),
                    Ptr(self.addr(&batch.seq_of_row)),
                    Ptr(self.addr(&batch.offsets)),
                    I32(rows as i32),
                    I32(heads as i32),
                    I32(kv_heads as i32),
                    I32(head_dim as i32),
                    F32(scale),
                ],
            ),
        }
    }

    fn swiglu(&self, gate_up: &CudaSlice<u16>, act: &mut CudaSlice<u16>, rows: usize, inter: usize) -> Result<()> {
        use Arg::{Ptr, I32, I64};
        self.launch(
            "swiglu",
            blocks(rows * inter),
            256,
            &[
                Ptr(self.addr(gate_up)),
                Ptr(self.addr(act)),
                I32(inter as i32),
                I64((rows * inter) as i64),
            ],
        )
    }

    fn bias_relu(
        &self,
        y: &CudaSlice<f32>,
        bias: &CudaSlice<f32>,
        out: &mut CudaSlice<u16>,
        rows: usize,
        width: usize,
    ) -> Result<()> {
        use Arg::{Ptr, I32, I64};
        self.launch(
            "bias_relu_bf16",
            blocks(rows * width),
            256,
            &[
                Ptr(self.addr(y)),
                Ptr(self.addr(bias)),
                Ptr(self.addr(out)),
                I32(width as i32),
                I64((rows * width) as i64),
            ],
        )
    }

    fn add_bias(&self, y: &mut CudaSlice<f32>, bias: &CudaSlice<f32>, rows: usize, width: usize) -> Result<()> {
        use Arg::{Ptr, I32, I64};
        self.launch(
            "add_bias",
            blocks(rows * width),
            256,
            &[
                Ptr(self.addr(y)),
                Ptr(self.addr(bias)),
                I32(width as i32),
                I64((rows * width) as i64),
            ],
        )
    }

    fn gather_rows(
        &self,
        src: &CudaSlice<u16>,
        idx: &CudaSlice<i32>,
        dst: &mut CudaSlice<u16>,
        n: usize,
        width: usize,
    ) -> Result<()> {
        use Arg::{Ptr, I32};
        self.launch(
            "gather_rows_bf16",
            n as u32,
            256,
            &[
                Ptr(self.addr(src)),
                Ptr(self.addr(idx)),
                Ptr(self.addr(dst)),
                I32(width as i32),
            ],
        )?;
        // `idx` may be dropped by the caller right after.
        self.synchronize()
    }

    fn cache_write(
        &self,
        qkv: &CudaSlice<u16>,
        k: &mut CudaSlice<u16>,
        v: &mut CudaSlice<u16>,
        slots: &CudaSlice<i32>,
        rows: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        use Arg::{Ptr, I32};
        self.launch(
            "cache_write",
            rows as u32,
            128,
            &[
                Ptr(self.addr(qkv)),
                Ptr(self.addr(k)),
                Ptr(self.addr(v)),
                Ptr(self.addr(slots)),
                I32(heads as i32),
                I32(kv_heads as i32),
                I32(head_dim as i32),
            ],
        )
    }

    fn paged_attention(
        &self,
        qkv: &CudaSlice<u16>,
        k: &CudaSlice<u16>,
        v: &CudaSlice<u16>,
        out: &mut CudaSlice<u16>,
        meta: &PagedInts<Self>,
        rows: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        use Arg::{Ptr, F32, I32};
        self.launch(
            "paged_attention",
            (rows * heads).div_ceil(4) as u32,
            128,
            &[
                Ptr(self.addr(qkv)),
                Ptr(self.addr(k)),
                Ptr(self.addr(v)),
                Ptr(self.addr(out)),
                Ptr(self.addr(&meta.seq_of_row)),
                Ptr(self.addr(&meta.positions)),
                Ptr(self.addr(&meta.block_table)),
                I32(meta.max_blocks as i32),
                I32(rows as i32),
                I32(heads as i32),
                I32(kv_heads as i32),
                I32(head_dim as i32),
                F32(1.0 / (head_dim as f32).sqrt()),
            ],
        )
    }

    fn copy_block(&self, buf: &mut CudaSlice<u16>, src: usize, dst: usize, block_values: usize) -> Result<()> {
        let bytes = block_values * std::mem::size_of::<u16>();
        let (from, to) = (self.ptr(buf, src * block_values), self.ptr(buf, dst * block_values));
        // SAFETY: two distinct blocks of one buffer (the caller's), on this stream.
        unsafe { cudarc::driver::result::memcpy_dtod_async(to, from, bytes, self.stream.cu_stream()) }
            .context("copying a KV cache block")?;
        Ok(())
    }
}
