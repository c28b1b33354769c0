//! The transformer's fused CPU path: its tensors lent to [`cpu_inference`]'s kernels, which
//! take whole sequences through every layer on buffers each thread keeps.

use super::*;

impl Transformer {
    /// The decoder's tensors as [`cpu_inference`] borrows them (`None` without layers).
    pub(super) fn cpu_decoder(&self) -> Result<Option<cpu_inference::Decoder<'_>>> {
        let Some(first) = self.blocks.first() else {
            return Ok(None);
        };
        let (cos, sin) = self.rope.host();
        Ok(Some(cpu_inference::Decoder {
            dims: cpu_inference::Dims {
                hidden: self.embed.embeddings().dim(1)?,
                heads: first.attn.heads,
                kv_heads: first.attn.kv_heads,
                head_dim: first.attn.head_dim,
                intermediate: first.mlp.gate.weight().dim(0)?,
                eps: self.eps as f32,
            },
            embed: self.embed.embeddings(),
            layers: self
                .blocks
                .iter()
                .map(|bl| cpu_inference::LayerTensors {
                    ln1: &bl.ln1,
                    q: &bl.attn.q,
                    k: &bl.attn.k,
                    v: &bl.attn.v,
                    o: &bl.attn.o,
                    ln2: &bl.ln2,
                    gate: &bl.mlp.gate,
                    up: &bl.mlp.up,
                    down: &bl.mlp.down,
                })
                .collect(),
            norm: &self.norm,
            cos,
            sin,
        }))
    }

    /// [`Transformer::forward`] of padded ids by [`cpu_inference`], filling `cache` when given
    /// (continuing the positions it holds), at the positions `read` only when given; `None`
    /// when the weights are not held for it.
    pub(super) fn forward_cpu(
        &self,
        ids: &Tensor,
        mask: &KeyMask,
        cache: Option<&mut KvCache>,
        read: Option<&[Vec<usize>]>,
    ) -> Result<Option<Tensor>> {
        let (b, t) = ids.dims2()?;
        // The cached keys and values the new tokens continue, as host rows.
        let prefix = match &cache {
            Some(c) if !c.is_empty() => {
                let layers = c
                    .layers
                    .iter()
                    .map(|l| -> Result<_> {
                        let (k, v) = l
                            .as_ref()
                            .ok_or_else(|| anyhow::anyhow!("a cache with a layer missing"))?;
                        anyhow::ensure!(k.dim(0)? == b, "a cache of {} rows for a batch of {b}", k.dim(0)?);
                        Ok((
                            k.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?,
                            v.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?,
                        ))
                    })
                    .collect::<Result<_>>()?;
                Some(cpu_inference::Prefix { len: c.len(), layers })
            }
            _ => None,
        };
        let offset = prefix.as_ref().map_or(0, |p| p.len);
        let ids: Vec<u32> = ids.to_dtype(DType::U32)?.flatten_all()?.to_vec1()?;
        let hidden = self.embed.embeddings().dim(1)?;
        let Some(decoder) = self.cpu_decoder()? else {
            return Ok(None);
        };
        let Some((x, kv)) = cpu_inference::forward(&decoder, &ids, b, mask, cache.is_some(), read, prefix.as_ref())
        else {
            return Ok(None);
        };
        if let Some(cache) = cache {
            let (g, d) = (decoder.dims.kv_heads, decoder.dims.head_dim);
            let dev = Device::Cpu;
            cache.layers = kv
                .into_iter()
                .map(|(k, v)| -> Result<_> {
                    Ok(Some((
                        Tensor::from_vec(k, (b, g, offset + t, d), &dev)?,
                        Tensor::from_vec(v, (b, g, offset + t, d), &dev)?,
                    )))
                })
                .collect::<Result<_>>()?;
        }
        let x = match read {
            Some(rows) => Tensor::from_vec(x, (rows.iter().map(Vec::len).sum::<usize>(), hidden), &Device::Cpu)?,
            None => Tensor::from_vec(x, (b, t, hidden), &Device::Cpu)?,
        };
        Ok(Some(x))
    }
}
