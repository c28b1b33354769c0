//! The decoder's layers over a batch (the module documentation's steps 1–7), as two blocks a
//! layer: attention (steps 1–5) and the MLP (6–7). Inference runs them back to back over one set
//! of buffers; training ([`super::PackedTrainer`]) runs them into buffers of its own, to keep
//! what the backward pass reads.

use super::adapted::{Product, RowAdapters};
use super::{grow_bf16, grow_f32, Attend, Backend, Out, PackedDecoder, Scratch};
use anyhow::Result;

/// One attention block's buffers, `t` rows each.
pub(super) struct AttentionBuffers<'a, B: Backend> {
    /// `rms_norm(x)` (bf16).
    pub normed: &'a mut B::Bf16,
    /// The q|k|v product before the bias and rotation (f32).
    pub y: &'a mut B::F32,
    /// q|k|v with the bias added, q and k rotated (bf16).
    pub qkv: &'a mut B::Bf16,
    /// The attention's output (bf16).
    pub attn: &'a mut B::Bf16,
    /// The adapters the rows run with, if any (inference).
    pub lora: Option<&'a RowAdapters>,
}

/// One MLP block's buffers, `t` rows each.
pub(super) struct MlpBuffers<'a, B: Backend> {
    /// `rms_norm(x)` (bf16).
    pub normed: &'a mut B::Bf16,
    /// gate|up (bf16).
    pub gate_up: &'a mut B::Bf16,
    /// `silu(gate) · up` (bf16).
    pub act: &'a mut B::Bf16,
    /// The adapters the rows run with, if any (inference).
    pub lora: Option<&'a RowAdapters>,
}

impl<B: Backend> PackedDecoder<B> {
    /// Every layer over the `tokens` (at `positions`), attending as `attend` says; then the rows
    /// `read` (`n_read` of them) normed into `s.head_in` (bf16).
    pub(super) fn layers_over(
        &self,
        tokens: &[u32],
        positions: &B::I32,
        read: &B::I32,
        n_read: usize,
        attend: &mut Attend<'_, B>,
        s: &mut Scratch<B>,
    ) -> Result<()> {
        let b = &*self.backend;
        let cfg = &self.config;
        let (t, h, d) = (tokens.len(), cfg.hidden_size, cfg.head_dim);
        let (heads, kv, inter) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size);
        let width = (heads + 2 * kv) * d;
        let ids = b.upload_i32(&tokens.iter().map(|&i| i as i32).collect::<Vec<_>>())?;
        grow_f32(b, &mut s.x, t * h)?;
        grow_bf16(b, &mut s.normed, t * h)?;
        grow_f32(b, &mut s.y, t * width)?;
        grow_bf16(b, &mut s.qkv, t * width)?;
        grow_bf16(b, &mut s.attn, t * heads * d)?;
        grow_bf16(b, &mut s.gate_up, t * 2 * inter)?;
        grow_bf16(b, &mut s.act, t * inter)?;
        grow_bf16(b, &mut s.head_in, n_read * h)?;
        let (Some(x), Some(normed), Some(y), Some(qkv), Some(attn), Some(gate_up), Some(act), Some(head_in)) = (
            s.x.as_mut(),
            s.normed.as_mut(),
            s.y.as_mut(),
            s.qkv.as_mut(),
            s.attn.as_mut(),
            s.gate_up.as_mut(),
            s.act.as_mut(),
            s.head_in.as_mut(),
        ) else {
            unreachable!("every buffer was grown above")
        };
        let lora = s.lora.take();
        b.embed(&self.embed, &ids, x, t, h)?;
        for li in 0..self.layers.len() {
            let bufs = AttentionBuffers {
                normed: &mut *normed,
                y: &mut *y,
                qkv: &mut *qkv,
                attn: &mut *attn,
                lora: lora.as_ref(),
            };
            self.attention_block(li, x, bufs, positions, attend, t)?;
            let bufs = MlpBuffers {
                normed: &mut *normed,
                gate_up: &mut *gate_up,
                act: &mut *act,
                lora: lora.as_ref(),
            };
            self.mlp_block(li, x, bufs, t)?;
        }
        b.rms_norm(x, Some(read), &self.norm, head_in, n_read, h, self.config.rms_norm_eps as f32)
    }

    /// Steps 1–5 of layer `li` over the `t` rows of `x`: `x += attention(rope(norm(x) ·
    /// [q|k|v]ᵀ + bias)) · oᵀ`, attending as `attend` says.
    pub(super) fn attention_block(
        &self,
        li: usize,
        x: &mut B::F32,
        bufs: AttentionBuffers<'_, B>,
        positions: &B::I32,
        attend: &mut Attend<'_, B>,
        t: usize,
    ) -> Result<()> {
        let (b, cfg, l) = (&*self.backend, &self.config, &self.layers[li]);
        let (h, d, heads, kv) = (cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads);
        let width = (heads + 2 * kv) * d;
        b.rms_norm(x, None, &l.ln1, bufs.normed, t, h, cfg.rms_norm_eps as f32)?;
        b.gemm(bufs.normed, &l.qkv, Out::F32(bufs.y), t, width, h, false)?;
        self.add_adapters(bufs.lora, li, Product::Qkv, bufs.normed, Out::F32(bufs.y))?;
        let (cos, sin) = (&self.cos, &self.sin);
        b.bias_rope(bufs.y, l.qkv_bias.as_ref(), cos, sin, positions, bufs.qkv, t, heads, kv, d)?;
        match attend {
            Attend::Packed(ints) => b.attention(bufs.qkv, bufs.attn, ints, t, heads, kv, d)?,
            Attend::Paged { meta, cache } => {
                let (k, v) = (&mut cache.k[li], &mut cache.v[li]);
                b.cache_write(bufs.qkv, k, v, &meta.slots, t, heads, kv, d)?;
                b.paged_attention(bufs.qkv, k, v, bufs.attn, meta, t, heads, kv, d)?;
            }
        }
        b.gemm(bufs.attn, &l.o, Out::F32(x), t, h, heads * d, true)?;
        self.add_adapters(bufs.lora, li, Product::O, bufs.attn, Out::F32(x))
    }

    /// Steps 6–7 of layer `li` over the `t` rows of `x`: `x += swiglu(norm(x) · [gate|up]ᵀ) ·
    /// downᵀ`.
    pub(super) fn mlp_block(&self, li: usize, x: &mut B::F32, bufs: MlpBuffers<'_, B>, t: usize) -> Result<()> {
        let (b, cfg, l) = (&*self.backend, &self.config, &self.layers[li]);
        let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
        b.rms_norm(x, None, &l.ln2, bufs.normed, t, h, cfg.rms_norm_eps as f32)?;
        b.gemm(bufs.normed, &l.gate_up, Out::Bf16(bufs.gate_up), t, 2 * inter, h, false)?;
        self.add_adapters(bufs.lora, li, Product::GateUp, bufs.normed, Out::Bf16(bufs.gate_up))?;
        b.swiglu(bufs.gate_up, bufs.act, t, inter)?;
        b.gemm(bufs.act, &l.down, Out::F32(x), t, h, inter, true)?;
        self.add_adapters(bufs.lora, li, Product::Down, bufs.act, Out::F32(x))
    }
}
