//! The key/value cache of a batch of sequences, left-padded to the longest, that the CPU decoder
//! ([`crate::transformer::Transformer`]) continues: copy rows for Monte Carlo rollouts, pick the
//! rows still decoding, join another batch, trim the padding every row shares.

use anyhow::Result;
use candle_core::{DType, Tensor};

/// Per-layer key/value cache of a batch of sequences.
///
/// Sequences of different lengths share one cache by left padding: row `r`'s first `pads[r]`
/// positions are padding that attention never reads, and its token at cache position `i` has
/// rotary position `i - pads[r]`, so a row computes what it would alone (within float rounding).
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    /// `(k, v)` per layer, each `[batch, kv_heads, seq, head_dim]`.
    pub layers: Vec<Option<(Tensor, Tensor)>>,
    /// Left padding per batch row (empty: none).
    pads: Vec<usize>,
}

impl KvCache {
    /// Number of cached positions.
    pub fn len(&self) -> usize {
        self.layers
            .first()
            .and_then(|l| l.as_ref())
            .map_or(0, |(k, _)| k.dim(2).unwrap_or(0))
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Left padding of each batch row, when any row has some.
    pub fn pads(&self) -> Option<&[usize]> {
        self.pads.iter().any(|&p| p > 0).then_some(self.pads.as_slice())
    }

    /// Apply `f` to every layer's keys and values.
    fn map(&self, f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Vec<Option<(Tensor, Tensor)>>> {
        self.layers
            .iter()
            .map(|l| l.as_ref().map(|(k, v)| -> Result<_> { Ok((f(k)?, f(v)?)) }).transpose())
            .collect()
    }

    /// The same cache repeated `n` times along the batch (continuations of one prefix).
    pub fn repeat_batch(&self, n: usize) -> Result<KvCache> {
        Ok(KvCache {
            layers: self.map(|t| Ok(t.repeat((n, 1, 1, 1))?))?,
            pads: (0..n).flat_map(|_| self.pads.iter().copied()).collect(),
        })
    }

    /// Batch row `row`'s first `len` positions (after its padding), copied out as a one-row
    /// cache: the cache of a prefix of that sequence (with causal attention, its keys and values
    /// do not depend on what follows).
    pub fn row_prefix(&self, row: usize, len: usize) -> Result<KvCache> {
        let pad = self.pads.get(row).copied().unwrap_or(0);
        Ok(KvCache {
            layers: self.map(|t| Ok(t.narrow(0, row, 1)?.narrow(2, pad, len)?.contiguous()?))?,
            pads: Vec::new(),
        })
    }

    /// Bytes held by the cached keys and values.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|(k, v)| (k.elem_count() + v.elem_count()) * k.dtype().size_in_bytes())
            .sum()
    }

    /// Keep only the batch rows in `rows` (padding every row still has is dropped).
    pub fn select(&self, rows: &Tensor) -> Result<KvCache> {
        let picked = KvCache {
            layers: self.map(|t| Ok(t.index_select(rows, 0)?))?,
            pads: match self.pads() {
                Some(pads) => {
                    let rows: Vec<u32> = rows.to_dtype(DType::U32)?.flatten_all()?.to_vec1()?;
                    rows.iter().map(|&r| pads[r as usize]).collect()
                }
                None => Vec::new(),
            },
        };
        picked.trimmed()
    }

    /// Without the padding positions that every row has.
    fn trimmed(self) -> Result<KvCache> {
        let common = self.pads.iter().copied().min().unwrap_or(0);
        if common == 0 {
            return Ok(self);
        }
        let len = self.len() - common;
        Ok(KvCache {
            layers: self.map(|t| Ok(t.narrow(2, common, len)?.contiguous()?))?,
            pads: self.pads.iter().map(|p| p - common).collect(),
        })
    }

    /// This batch with one row more that holds nothing yet (every position of it padding): a
    /// sequence about to start, whose first token the next forward pass appends.
    pub fn with_empty_row(&self) -> Result<KvCache> {
        let (rows, len) = match self.layers.iter().flatten().next() {
            Some((k, _)) => (k.dim(0)?, k.dim(2)?),
            None => anyhow::bail!("adding a row to an empty cache"),
        };
        let layers = self.map(|t| {
            let (_, h, _, d) = t.dims4()?;
            Ok(Tensor::cat(
                &[t, &Tensor::zeros((1, h, len, d), t.dtype(), t.device())?],
                0,
            )?)
        })?;
        let mut pads = if self.pads.is_empty() {
            vec![0; rows]
        } else {
            self.pads.clone()
        };
        pads.push(len);
        Ok(KvCache { layers, pads })
    }

    /// This batch's rows followed by `other`'s, the shorter cache left-padded to the longer.
    pub fn concat_batch(&self, other: &KvCache) -> Result<KvCache> {
        if self.layers.iter().all(Option::is_none) {
            return Ok(other.clone());
        }
        anyhow::ensure!(
            self.layers.len() == other.layers.len(),
            "caches of {} and {} layers",
            self.layers.len(),
            other.layers.len()
        );
        let len = self.len().max(other.len());
        let rows =
            |c: &KvCache| -> Result<usize> { Ok(c.layers.iter().flatten().next().map_or(Ok(0), |(k, _)| k.dim(0))?) };
        let padded_pads = |c: &KvCache, rows: usize| -> Vec<usize> {
            let extra = len - c.len();
            (0..rows).map(|r| c.pads.get(r).copied().unwrap_or(0) + extra).collect()
        };
        let mut pads = padded_pads(self, rows(self)?);
        pads.extend(padded_pads(other, rows(other)?));
        let left_pad = |t: &Tensor| -> Result<Tensor> {
            let extra = len - t.dim(2)?;
            if extra == 0 {
                return Ok(t.clone());
            }
            let (b, h, _, d) = t.dims4()?;
            Ok(Tensor::cat(
                &[&Tensor::zeros((b, h, extra, d), t.dtype(), t.device())?, t],
                2,
            )?)
        };
        let layers = self
            .layers
            .iter()
            .zip(&other.layers)
            .map(|(a, b)| -> Result<_> {
                match (a, b) {
                    (Some((ka, va)), Some((kb, vb))) => Ok(Some((
                        Tensor::cat(&[&left_pad(ka)?, &left_pad(kb)?], 0)?,
                        Tensor::cat(&[&left_pad(va)?, &left_pad(vb)?], 0)?,
                    ))),
                    _ => anyhow::bail!("joining caches with a layer missing"),
                }
            })
            .collect::<Result<_>>()?;
        Ok(KvCache { layers, pads })
    }
}
