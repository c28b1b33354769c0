//! The CUDA engine's kernels compile with NVRTC for every target and head size it uses. Needs the
//! `cuda` feature and NVRTC (no GPU, no driver): `bench/check_cuda_build.sh` runs it with NVRTC
//! from NVIDIA's Python wheel.
#![cfg(feature = "cuda")]

#[test]
fn kernels_compile_with_nvrtc_for_every_target() {
    for arch in ["compute_80", "compute_89", "compute_90"] {
        for head_dim in [16, 32, 64, 96, 128] {
            let ptx = stepwise_model::cuda::compile_only(arch, head_dim)
                .unwrap_or_else(|e| panic!("{arch}, head size {head_dim}: {e:#}"));
            // Every kernel a GPU loads when opened (inference and training), and the flash one.
            for &kernel in stepwise_model::cuda::GENERAL.iter().chain(&["flash_attention"]) {
                assert!(
                    ptx.contains(&format!(".entry {kernel}")),
                    "{arch}: no `{kernel}` in the PTX"
                );
            }
            // The flash kernel's products run on the tensor cores.
            assert!(
                ptx.contains("mma.sync.aligned.m16n8k16"),
                "{arch}, head size {head_dim}: no mma"
            );
        }
    }
}
