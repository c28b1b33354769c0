//! LoRA adapters served unmerged on the packed engine ([`crate::Adapters`], `stepwise serve
//! --lora-modules`): each sequence of a pass may run with an adapter of its own; after each of a
//! layer's products (q|k|v, o, gate|up, down) the rows of each adapter get `(x·Aᵀ)·(s·B)ᵀ` added
//! to the columns of every projection it adapts, `x` being the product's own bf16 input. The
//! backend adds them ([`super::Backend::lora_add`]): the CPU backends on the host
//! ([`host_lora_add`], rows in parallel in the engine's vector kernels); the CUDA engine has no
//! such kernel, and a model on it refuses adapters when they are served.

use super::{Backend, Out, PackedDecoder};
use crate::adapters::{push_runs, Adapters, Form, Proj};
use anyhow::{ensure, Result};
use rayon::prelude::*;
use std::sync::Arc;

/// One adapter's update of some rows of a product, for [`super::Backend::lora_add`]:
/// `y[row, offset..offset + n] += Σ_j (x[row]·a[j])·bt[j]` for the `r` rows `j` of `a` `[r, k]`
/// and of `bt` `[r, n]` (the scaled `B`, transposed), f32 on the host; or in bf16, `a16` and
/// `b16`, as the backend reads them ([`super::Backend::adapter_form`]: the other pair empty).
#[derive(Clone, Copy, Debug)]
pub struct LoraPart<'a> {
    /// The rows (ascending, each once).
    pub rows: &'a [u32],
    /// `A`, `[r, k]`.
    pub a: &'a [f32],
    /// `(s·B)ᵀ`, `[r, n]`.
    pub bt: &'a [f32],
    /// `A` in bf16, `[r, k]`.
    pub a16: &'a [u16],
    /// `s·B` in bf16, `[n, r]`.
    pub b16: &'a [u16],
    /// The rank.
    pub r: usize,
    /// The first column of the projection in the product's output.
    pub offset: usize,
    /// Its columns.
    pub n: usize,
}

/// The adapters a pass's rows run with: the served adapters and each one's rows.
pub(crate) struct RowAdapters {
    adapters: Arc<Adapters>,
    groups: Vec<(usize, Vec<u32>)>,
}

impl RowAdapters {
    /// Sequences of `lens` rows packed end to end, sequence `i` with `each[i]` (one entry: all
    /// of them; `None`: the base model); `None` where no row has an adapter.
    pub(crate) fn of(adapters: &Arc<Adapters>, lens: &[usize], each: &[Option<usize>]) -> Result<Option<Self>> {
        ensure!(
            each.len() <= 1 || each.len() == lens.len(),
            "{} adapters for {} sequences",
            each.len(),
            lens.len()
        );
        let mut runs = Vec::new();
        let mut start = 0;
        for (i, &len) in lens.iter().enumerate() {
            let one = if each.len() == lens.len() { &each[i..=i] } else { each };
            push_runs(&mut runs, start, 1, len, one);
            start += len;
        }
        let groups = adapters.rows_by_adapter(&runs)?;
        Ok((!groups.is_empty()).then(|| RowAdapters {
            adapters: adapters.clone(),
            groups,
        }))
    }
}

/// One of a layer's products.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Product {
    Qkv,
    O,
    GateUp,
    Down,
}

impl<B: Backend> PackedDecoder<B> {
    /// Each adapter's update of `product` of layer `li` added to its rows of `y` (the product of
    /// the bf16 rows `x`), where `lora` names any.
    pub(super) fn add_adapters(
        &self,
        lora: Option<&RowAdapters>,
        li: usize,
        product: Product,
        x: &B::Bf16,
        y: Out<'_, B>,
    ) -> Result<()> {
        let Some(lora) = lora else {
            return Ok(());
        };
        let cfg = &self.config;
        let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
        let (q, kv) = (cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim);
        let (k, width, projs): (usize, usize, &[(Proj, usize, usize)]) = match product {
            Product::Qkv => (h, q + 2 * kv, &[(Proj::Q, 0, q), (Proj::K, q, kv), (Proj::V, q + kv, kv)]),
            Product::O => (q, h, &[(Proj::O, 0, h)]),
            Product::GateUp => (h, 2 * inter, &[(Proj::Gate, 0, inter), (Proj::Up, inter, inter)]),
            Product::Down => (inter, h, &[(Proj::Down, 0, h)]),
        };
        let mut parts = Vec::new();
        for (adapter, rows) in &lora.groups {
            for &(proj, offset, n) in projs {
                if let Some(p) = lora.adapters.host(li, proj, *adapter) {
                    parts.push(LoraPart {
                        rows,
                        a: p.a,
                        bt: p.bt,
                        a16: p.a16,
                        b16: p.b16,
                        r: p.r,
                        offset,
                        n,
                    });
                }
            }
        }
        if parts.is_empty() {
            return Ok(());
        }
        self.backend().lora_add(x, y, k, width, &parts)
    }
}

/// A product's output on the host.
pub(crate) enum HostOut<'a> {
    F32(&'a mut [f32]),
    /// Rounded to bf16 (to nearest even) after the update is added.
    Bf16(&'a mut [u16]),
}

impl<'a, B: Backend<F32 = Vec<f32>, Bf16 = Vec<u16>> + ?Sized> From<Out<'a, B>> for HostOut<'a> {
    fn from(y: Out<'a, B>) -> Self {
        match y {
            Out::F32(v) => HostOut::F32(v),
            Out::Bf16(v) => HostOut::Bf16(v),
        }
    }
}

/// [`super::Backend::lora_add`] on host buffers: `x` rows of `k` bf16 values, `y` rows of
/// `width`. Each part in two products over all its rows at once, so that `A` and `B` are read
/// once a pass, not once a row (an all-linear rank-16 adapter of a 0.5B model is 35 MB of f32):
/// `T = X·Aᵀ`, `A`'s rows shared out over the threads, then `U = T·(s·B)ᵀ`, blocks of columns
/// shared out; then `U` is added to the rows of `y` (rounded back to bf16 for a bf16 `y`).
pub(crate) fn host_lora_add(x: &[u16], mut y: HostOut<'_>, k: usize, width: usize, parts: &[LoraPart<'_>]) -> Result<()> {
    let threads = rayon::current_num_threads().max(1);
    for p in parts {
        if !fits(p, x, &y, k, width, crate::adapters::Form::HostF32)? {
            continue;
        }
        let m = p.rows.len();
        let xs: Vec<f32> = p
            .rows
            .iter()
            .flat_map(|&row| &x[row as usize * k..(row as usize + 1) * k])
            .map(|&v| f32::from_bits((v as u32) << 16))
            .collect();
        // `t[j·m + i]`: row `i` dotted with `A`'s row `j`.
        let mut t = vec![0f32; p.r * m];
        let per = p.r.div_ceil(threads);
        t.par_chunks_mut(per * m).enumerate().for_each(|(c, out)| {
            crate::kernels::simd::dispatch(Dots {
                a: &p.a[c * per * k..],
                xs: &xs,
                k,
                out,
            })
        });
        let cols = p.n.div_ceil(threads).next_multiple_of(16);
        let blocks: Vec<(usize, Vec<f32>)> = (0..p.n)
            .step_by(cols)
            .collect::<Vec<_>>()
            .into_par_iter()
            .map(|c0| {
                let len = cols.min(p.n - c0);
                let mut u = vec![0f32; m * len];
                crate::kernels::simd::dispatch(Combine {
                    t: &t,
                    part: p,
                    c0,
                    out: &mut u,
                });
                (c0, u)
            })
            .collect();
        for (c0, u) in blocks {
            add_rows(&mut y, p, width, c0, &u);
        }
    }
    Ok(())
}

/// Whether part `p` has rows, checked against the buffers (`x` rows of `k`, `y` of `width`) and
/// its matrices in `form` (the one its backend reads) against the product.
pub(crate) fn fits(p: &LoraPart<'_>, x: &[u16], y: &HostOut<'_>, k: usize, width: usize, form: Form) -> Result<bool> {
    let (a, b) = match form {
        Form::HostBf16 => (p.a16.len(), p.b16.len()),
        _ => (p.a.len(), p.bt.len()),
    };
    ensure!(
        a == p.r * k && b == p.r * p.n && p.offset + p.n <= width,
        "an adapter's matrices ({form:?}) do not fit the product"
    );
    let Some(&last) = p.rows.last() else {
        return Ok(false);
    };
    let len = match y {
        HostOut::F32(v) => v.len(),
        HostOut::Bf16(v) => v.len(),
    };
    ensure!((last as usize + 1) * width <= len && (last as usize + 1) * k <= x.len(), "row {last} is past the buffers");
    Ok(true)
}

/// `u` (a row of `u.len() / rows` values a row of `p`) added to `y` at `p`'s columns from `c0`
/// (rounded back to bf16 for a bf16 `y`).
pub(crate) fn add_rows(y: &mut HostOut<'_>, p: &LoraPart<'_>, width: usize, c0: usize, u: &[f32]) {
    let len = u.len() / p.rows.len();
    for (&row, u) in p.rows.iter().zip(u.chunks_exact(len)) {
        let at = row as usize * width + p.offset + c0;
        match y {
            HostOut::F32(v) => v[at..at + len].iter_mut().zip(u).for_each(|(y, u)| *y += u),
            HostOut::Bf16(v) => v[at..at + len].iter_mut().zip(u).for_each(|(y, u)| {
                *y = half::bf16::from_f32(f32::from_bits((*y as u32) << 16) + u).to_bits();
            }),
        }
    }
}

/// `out[jj·m + i] = a[jj]·xs[i]` for the rows `jj` of `a` that `out` covers (`m` = the rows of
/// `xs`): each of `a`'s rows read once, for every row of `xs`.
struct Dots<'a> {
    a: &'a [f32],
    xs: &'a [f32],
    k: usize,
    out: &'a mut [f32],
}

impl crate::kernels::simd::Kernel for Dots<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        let (k, m) = (self.k, self.xs.len() / self.k);
        for (jj, col) in self.out.chunks_exact_mut(m).enumerate() {
            let a = &self.a[jj * k..(jj + 1) * k];
            for (o, x) in col.iter_mut().zip(self.xs.chunks_exact(k)) {
                *o = crate::kernels::simd::dot::<FMA>(a, x);
            }
        }
    }
}

/// `out[i, ..] = Σ_j t[j·m + i]·bt[j, c0..c0 + len]` for the `m` rows, `len = out.len() / m`:
/// the block of `(s·B)ᵀ`'s columns read once, for every row.
struct Combine<'a> {
    t: &'a [f32],
    part: &'a LoraPart<'a>,
    c0: usize,
    out: &'a mut [f32],
}

impl crate::kernels::simd::Kernel for Combine<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        let p = self.part;
        let m = p.rows.len();
        let len = self.out.len() / m;
        for j in 0..p.r {
            let b = &p.bt[j * p.n + self.c0..j * p.n + self.c0 + len];
            for (i, u) in self.out.chunks_exact_mut(len).enumerate() {
                crate::kernels::simd::axpy::<FMA>(self.t[j * m + i], b, u);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Backend;
    use super::*;

    /// The host update against a plain triple loop, into f32 and into bf16 outputs.
    #[test]
    fn the_host_update_adds_each_rows_low_rank_product() {
        let (k, width, r) = (37, 50, 3);
        let (offset, n) = (11, 29);
        let val = |i: usize, s: usize| ((i * 2654435761 + s) % 997) as f32 / 997.0 - 0.5;
        let x: Vec<u16> = (0..5 * k).map(|i| half::bf16::from_f32(val(i, 1)).to_bits()).collect();
        let a: Vec<f32> = (0..r * k).map(|i| val(i, 2)).collect();
        let bt: Vec<f32> = (0..r * n).map(|i| val(i, 3)).collect();
        let rows = [1u32, 2, 4];
        let bf16 = |v: &[f32]| -> Vec<u16> { v.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect() };
        let b: Vec<f32> = (0..n * r).map(|i| bt[(i % r) * n + i / r]).collect();
        let (a16, b16) = (bf16(&a), bf16(&b));
        let part = LoraPart {
            rows: &rows,
            a: &a,
            bt: &bt,
            a16: &a16,
            b16: &b16,
            r,
            offset,
            n,
        };
        let base: Vec<f32> = (0..5 * width).map(|i| val(i, 4)).collect();
        let mut y = base.clone();
        host_lora_add(&x, HostOut::F32(&mut y), k, width, &[part]).unwrap();
        let xf = |row: usize, c: usize| f32::from_bits((x[row * k + c] as u32) << 16) as f64;
        for row in 0..5 {
            for c in 0..width {
                let mut want = base[row * width + c] as f64;
                if rows.contains(&(row as u32)) && (offset..offset + n).contains(&c) {
                    for j in 0..r {
                        let t: f64 = (0..k).map(|i| a[j * k + i] as f64 * xf(row, i)).sum();
                        want += t * bt[j * n + c - offset] as f64;
                    }
                }
                assert!((y[row * width + c] as f64 - want).abs() < 1e-4, "row {row} column {c}");
            }
        }
        let mut y16: Vec<u16> = base.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect();
        host_lora_add(&x, HostOut::Bf16(&mut y16), k, width, &[part]).unwrap();
        for (i, (&got, &want)) in y16.iter().zip(&y).enumerate() {
            let got = half::bf16::from_bits(got).to_f32();
            assert!((got - want).abs() <= want.abs() / 64.0 + 1e-3, "value {i}: {got} against {want}");
        }
        // The CPU backend's bf16 products: within their rounding of the f32 specification.
        let mut z = base.clone();
        super::super::Cpu.lora_add(&x, Out::F32(&mut z), k, width, &[part]).unwrap();
        for (i, (&got, &want)) in z.iter().zip(&y).enumerate() {
            assert!((got - want).abs() <= 0.02 * (want - base[i]).abs() + 2e-3, "value {i}: {got} against {want}");
        }
        let short = LoraPart { n: width, ..part };
        assert!(host_lora_add(&x, HostOut::F32(&mut y), k, width, &[short]).is_err());
    }
}
