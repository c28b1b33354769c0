//! The register-tile products against a plain triple loop on ragged shapes: f32, bf16-held
//! weights, bf16 products, and split by columns across tasks (bit for bit the same).

use super::*;

fn reference(
    dst: &mut [f32],
    ds: usize,
    a: &[f32],
    as_: usize,
    w: &[f32],
    (m, n, k): (usize, usize, usize),
    acc: bool,
) {
    for i in 0..m {
        for j in 0..n {
            let s: f64 = (0..k).map(|p| a[i * as_ + p] as f64 * w[j * k + p] as f64).sum();
            let d = &mut dst[i * ds + j];
            *d = if acc { *d + s as f32 } else { s as f32 };
        }
    }
}

#[test]
fn tiles_equal_plain_sums_for_ragged_shapes() {
    if !available() {
        eprintln!("no AVX-512 here: sgemm untested");
        return;
    }
    let value = |i: usize| ((i * 7919 % 1009) as f32 / 1009.0) - 0.5;
    // m past and below a panel, n past and below a tile, k past a block; strides wider than
    // the rows; both overwrite and accumulate.
    for &(m, n, k) in &[
        (1, 1, 1),
        (31, 13, 5),
        (33, 12, 64),
        (48, 30, 35),
        (40, 7, 16),
        (70, 25, 1030),
        (5, 40, 2100),
        (40, 2 * CHUNK + 5, 600),
        (64, 24, 0),
        (37, 14, 67),
        (49, 26, 130),
        (3, 5, 1),
        // Whole AMX tiles of depth (and a chunk of 1024 then one of 32), with 16-row blocks of
        // the weight and columns left over, panels of one and two halves.
        (70, 37, 1056),
        (17, 48, 64),
        (100, 96, 96),
        (16, 16, 32),
        (33, 50, 2048),
    ] {
        for accumulate in [false, true] {
            let (as_, ds) = (k + 3, n + 5);
            let a: Vec<f32> = (0..m * as_).map(value).collect();
            let w: Vec<f32> = (0..n * k).map(|i| value(i + 17)).collect();
            let start: Vec<f32> = (0..m * ds).map(|i| value(i + 5)).collect();
            let (mut got, mut want) = (start.clone(), start.clone());
            matmul_t(&mut got, ds, &a, as_, WeightSlice::F32(&w), (m, n, k), accumulate);
            reference(&mut want, ds, &a, as_, &w, (m, n, k), accumulate);
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                    "{m}x{n}x{k} acc={accumulate} at {i}: {g} vs {e}"
                );
            }
            // Held in bf16: exactly the tiles' result on the same values widened.
            let held: Vec<half::bf16> = w.iter().map(|&v| half::bf16::from_f32(v)).collect();
            let widened: Vec<f32> = held.iter().map(|v| v.to_f32()).collect();
            let (mut narrow, mut wide) = (start.clone(), start.clone());
            let held_w = WeightSlice::Bf16(&held);
            // (`matmul_t` itself answers `k = 0`.)
            if k == 0 {
                matmul_t(&mut narrow, ds, &a, as_, held_w, (m, n, k), accumulate);
            } else {
                let dst = Dst {
                    at: narrow.as_mut_ptr(),
                    stride: ds,
                };
                // SAFETY: AVX-512F is here (checked above); the sizes are `matmul_t`'s.
                unsafe { matmul_t_widened(dst, &a, as_, held_w, (m, n, k), accumulate) };
            }
            matmul_t(
                &mut wide,
                ds,
                &a,
                as_,
                WeightSlice::F32(&widened),
                (m, n, k),
                accumulate,
            );
            assert_eq!(narrow, wide, "{m}x{n}x{k} acc={accumulate}: bf16-held");
            // In bf16 products: the exact sums of the activations rounded to bf16 times the
            // weight, to f32's rounding of the sums.
            if bf16_products_available() {
                let rounded: Vec<f32> = a.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect();
                let (mut got, mut want) = (start.clone(), start.clone());
                let held_w = WeightSlice::bf16(&held, true);
                matmul_t(&mut got, ds, &a, as_, held_w, (m, n, k), accumulate);
                reference(&mut want, ds, &rounded, as_, &widened, (m, n, k), accumulate);
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                        "{m}x{n}x{k} acc={accumulate} at {i} in bf16: {g} vs {e}"
                    );
                }
            }
            // Split by columns among tasks, each writing its block in place (or into a new
            // output): the same values as one pass, bit for bit, in every weight type.
            for weight in [WeightSlice::F32(&w), held_w] {
                let mut whole = start.clone();
                matmul_t(&mut whole, ds, &a, as_, weight, (m, n, k), accumulate);
                for tasks in [1, 2, 3] {
                    let mut split = start.clone();
                    matmul_t_by_columns(&mut split, ds, &a, as_, weight, (m, n, k), accumulate, tasks);
                    assert_eq!(split, whole, "{m}x{n}x{k} acc={accumulate}, {tasks} tasks");
                    if !accumulate {
                        let new = matmul_t_by_columns_new(&a, as_, weight, (m, n, k), tasks);
                        let rows: Vec<f32> = whole.chunks(ds).take(m).flat_map(|r| r[..n].to_vec()).collect();
                        assert_eq!(new, rows, "{m}x{n}x{k}, {tasks} tasks, new");
                    }
                }
            }
        }
    }
}
