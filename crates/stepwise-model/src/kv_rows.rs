//! A decoding batch's KV cache kept per sequence, each with room to grow.
//!
//! [`KvCache`] holds a batch in one tensor a layer, left-padded to its longest sequence: every
//! step appends a position by copying the whole cache, a sequence leaving copies it again, and so
//! does one joining. With dozens of sequences in flight (a server's decoding batch) those copies
//! were a tenth of a step. Here each sequence owns its keys and values, with room for more
//! positions: a step writes one position a sequence, a sequence leaves by being dropped, one
//! joins by copying its prompt's cache once. Keys are kept transposed, as the attention kernel
//! reads them ([`crate::kernels::attention`] transposes a padded cache's keys every call). The
//! buffers of sequences that leave are kept for those that join: a server's steady stream of
//! requests reuses them instead of asking the system for fresh, zeroed pages (which, with
//! every sequence growing its own, were 7% of a step serving 64 requests of 256 tokens).
//!
//! Attention over these caches gives bit for bit what the padded cache gives
//! ([`crate::kernels::attention`]'s `attention_rows`), so a decoding batch computes the same
//! values whichever it keeps.

use crate::kernels::attention::{transpose_key_rows, RowKeys};
use crate::kv_cache::KvCache;
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};

/// The fewest positions a sequence's cache has room for.
const MIN_ROOM: usize = 64;

/// A batch of sequences' caches, one each, every layer.
#[derive(Clone, Debug, Default)]
pub struct RowsCache {
    /// Per layer, per sequence.
    layers: Vec<Vec<RowLayer>>,
    /// Positions cached per sequence.
    lens: Vec<usize>,
    /// Per layer, buffers of sequences that have left, for those that join.
    spare: Vec<Vec<RowLayer>>,
    /// The most sequences held at once (the spare buffers a layer never outnumber it).
    peak: usize,
}

/// One sequence's keys and values in one layer.
#[derive(Clone, Debug)]
pub(crate) struct RowLayer {
    /// `[kv_heads, head_dim, room]`: component `c` of head `h`'s key at position `j` is at
    /// `(h · head_dim + c) · room + j`; past the cached positions, anything.
    kt: Vec<f32>,
    /// `[kv_heads, room, head_dim]`: each head's values by position.
    v: Vec<f32>,
    /// Positions there is room for.
    room: usize,
}

impl RowLayer {
    /// Room for `room` positions of `kv_heads` heads of `d` values, nothing cached.
    fn with_room(kv_heads: usize, d: usize, room: usize) -> Self {
        RowLayer {
            kt: vec![0.0; kv_heads * d * room],
            v: vec![0.0; kv_heads * room * d],
            room,
        }
    }

    /// Writes position `at`'s keys and values (`[kv_heads, d]` each), first moving to twice the
    /// room when it is full (the `at` positions before it cached).
    fn write(&mut self, at: usize, k: &[f32], v: &[f32], d: usize) {
        let kv_heads = k.len() / d;
        if at >= self.room {
            let mut grown = RowLayer::with_room(kv_heads, d, (2 * self.room).max(at + 1));
            for (new, old) in grown
                .kt
                .chunks_exact_mut(grown.room)
                .zip(self.kt.chunks_exact(self.room))
            {
                new[..at].copy_from_slice(&old[..at]);
            }
            for (new, old) in grown
                .v
                .chunks_exact_mut(grown.room * d)
                .zip(self.v.chunks_exact(self.room * d))
            {
                new[..at * d].copy_from_slice(&old[..at * d]);
            }
            *self = grown;
        }
        for (h, (k, v)) in k.chunks_exact(d).zip(v.chunks_exact(d)).enumerate() {
            for (c, &x) in k.iter().enumerate() {
                self.kt[(h * d + c) * self.room + at] = x;
            }
            self.v[(h * self.room + at) * d..][..d].copy_from_slice(v);
        }
    }
}

impl RowsCache {
    /// Sequences in the batch.
    pub fn rows(&self) -> usize {
        self.lens.len()
    }

    /// Positions of the longest sequence.
    pub fn len(&self) -> usize {
        self.lens.iter().copied().max().unwrap_or(0)
    }

    /// Whether no sequence is cached.
    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    /// Layers cached (0 before any sequence joins).
    pub(crate) fn layers(&self) -> usize {
        self.layers.len()
    }

    /// How far each sequence is behind the longest: its left padding in a shared cache.
    pub fn pads(&self) -> Vec<usize> {
        let len = self.len();
        self.lens.iter().map(|&l| len - l).collect()
    }

    /// Adds `n` sequences continuing `prefix`, a cache of one sequence without padding (a
    /// prompt's), each with its own copy.
    pub fn push_copies(&mut self, prefix: &KvCache, n: usize) -> Result<()> {
        ensure!(prefix.pads().is_none(), "a padded cache cannot start sequences");
        if self.layers.is_empty() {
            self.layers = vec![Vec::new(); prefix.layers.len()];
            self.spare = vec![Vec::new(); prefix.layers.len()];
        }
        ensure!(
            self.layers.len() == prefix.layers.len(),
            "caches of {} and {} layers",
            self.layers.len(),
            prefix.layers.len()
        );
        let len = prefix.len();
        for ((rows, spare), layer) in self.layers.iter_mut().zip(&mut self.spare).zip(&prefix.layers) {
            let Some((k, v)) = layer else {
                anyhow::bail!("a prompt's cache with a layer missing");
            };
            let (one, kv_heads, s, d) = k.dims4()?;
            ensure!(one == 1 && s == len, "a prompt's cache holds one sequence");
            let host = |t: &Tensor| -> Result<Vec<f32>> { Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?) };
            let (k, v) = (host(k)?, host(v)?);
            for _ in 0..n {
                // A spare buffer of this shape with room for the prompt and a token, else a new one.
                let reusable = spare
                    .iter()
                    .rposition(|r| r.room > len && r.kt.len() == kv_heads * d * r.room);
                let mut row = match reusable {
                    Some(i) => spare.swap_remove(i),
                    None => RowLayer::with_room(kv_heads, d, (len + 1).next_power_of_two().max(MIN_ROOM)),
                };
                for h in 0..kv_heads {
                    let keys = &k[h * len * d..][..len * d];
                    transpose_key_rows(keys, d, &mut row.kt[h * d * row.room..], row.room);
                    row.v[h * row.room * d..][..len * d].copy_from_slice(&v[h * len * d..][..len * d]);
                }
                rows.push(row);
            }
        }
        self.lens.extend(std::iter::repeat_n(len, n));
        self.peak = self.peak.max(self.lens.len());
        Ok(())
    }

    /// Keeps only the sequences `keep` (indices, ascending); the others' buffers are kept for
    /// sequences that join (at most as many a layer as the most sequences held at once).
    pub fn keep(&mut self, keep: &[usize]) {
        for (all, spare) in self.layers.iter_mut().zip(&mut self.spare) {
            let mut old = std::mem::take(all).into_iter().map(Some).collect::<Vec<_>>();
            *all = keep.iter().map(|&k| old[k].take().expect("each kept once")).collect();
            spare.extend(old.into_iter().flatten());
            if spare.len() > self.peak {
                // The roomiest are the ones worth keeping.
                spare.sort_by_key(|r| std::cmp::Reverse(r.room));
                spare.truncate(self.peak);
            }
        }
        self.lens = keep.iter().map(|&k| self.lens[k]).collect();
    }

    /// Every layer's view, for a forward pass of one new position a sequence.
    pub(crate) fn layer_views(&mut self) -> Vec<RowsLayer<'_>> {
        let lens = &self.lens;
        self.layers.iter_mut().map(|rows| RowsLayer { rows, lens }).collect()
    }

    /// After a forward pass has written every layer's new position: counts it.
    pub(crate) fn advance(&mut self) {
        self.lens.iter_mut().for_each(|l| *l += 1);
    }
}

/// One layer of a [`RowsCache`] during a forward pass.
pub(crate) struct RowsLayer<'a> {
    rows: &'a mut Vec<RowLayer>,
    /// Positions cached per sequence before this pass.
    lens: &'a [usize],
}

impl RowsLayer<'_> {
    /// Writes each sequence's new position (`k`, `v`: `[b, kv_heads · d]`) and returns what the
    /// attention kernel reads, the new position included.
    pub(crate) fn append(&mut self, k: &[f32], v: &[f32], d: usize) -> Vec<RowKeys<'_>> {
        let width = k.len() / self.rows.len().max(1);
        for (r, row) in self.rows.iter_mut().enumerate() {
            row.write(self.lens[r], &k[r * width..][..width], &v[r * width..][..width], d);
        }
        self.rows
            .iter()
            .zip(self.lens)
            .map(|(row, &len)| RowKeys {
                kt: &row.kt,
                v: &row.v,
                stride: row.room,
                len: len + 1,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// A one-sequence cache of `len` positions, the same in every layer, whose values name their
    /// head, position and component.
    fn prompt_cache(layers: usize, kv_heads: usize, len: usize, d: usize) -> KvCache {
        let value = |h: usize, j: usize, c: usize| (h * 100 + j * 10 + c) as f32;
        let tensor = |sign: f32| {
            let data: Vec<f32> = (0..kv_heads * len * d)
                .map(|i| {
                    let (h, j, c) = (i / (len * d), i / d % len, i % d);
                    sign * value(h, j, c)
                })
                .collect();
            Tensor::from_vec(data, (1, kv_heads, len, d), &Device::Cpu).unwrap()
        };
        let mut cache = KvCache::default();
        cache.layers = (0..layers).map(|_| Some((tensor(1.0), tensor(-1.0)))).collect();
        cache
    }

    #[test]
    fn sequences_grow_leave_and_read_back_as_written() {
        let (kv_heads, d) = (2, 4);
        let mut cache = RowsCache::default();
        cache.push_copies(&prompt_cache(2, kv_heads, 3, d), 2).unwrap();
        cache.push_copies(&prompt_cache(2, kv_heads, 5, d), 1).unwrap();
        assert_eq!((cache.rows(), cache.len(), cache.pads()), (3, 5, vec![2, 2, 0]));
        // Past the first room: every sequence moves to more room, keeping what it held.
        let steps = MIN_ROOM + 3;
        for step in 0..steps {
            for mut layer in cache.layer_views() {
                let k: Vec<f32> = (0..3 * kv_heads * d).map(|i| (step * 100 + i) as f32 + 0.5).collect();
                let v: Vec<f32> = k.iter().map(|x| -x).collect();
                let keys = layer.append(&k, &v, d);
                for (r, keys) in keys.iter().enumerate() {
                    let at = keys.len - 1;
                    for h in 0..kv_heads {
                        for c in 0..d {
                            let want = k[(r * kv_heads + h) * d + c];
                            assert_eq!(keys.kt[(h * d + c) * keys.stride + at], want);
                            assert_eq!(keys.v[(h * keys.stride + at) * d + c], -want);
                            // The prompt's first position survives every move.
                            let first = (h * 100 + c) as f32;
                            assert_eq!(keys.kt[(h * d + c) * keys.stride], first);
                            assert_eq!(keys.v[h * keys.stride * d + c], -first);
                        }
                    }
                }
            }
            cache.advance();
        }
        assert_eq!(cache.pads(), vec![2, 2, 0]);
        cache.keep(&[1, 2]);
        assert_eq!((cache.rows(), cache.len(), cache.pads()), (2, 5 + steps, vec![2, 0]));
        cache.keep(&[0]);
        assert_eq!((cache.rows(), cache.len(), cache.pads()), (1, 3 + steps, vec![0]));
    }
}
