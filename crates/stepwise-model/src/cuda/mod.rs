//! The CUDA engine (feature `cuda`): step scoring on an NVIDIA GPU over packed batches.
//!
//! - **Starts anywhere.** It is built on cudarc with dynamic loading: building needs no CUDA
//!   toolkit and no GPU, and the binary starts on any machine; the driver, NVRTC and cuBLAS are
//!   found when a GPU is first asked for ([`libraries`]).
//! - **Kernels compiled at run time.** The engine's own kernels (`kernels.cu`) are compiled by
//!   NVRTC for the GPU in use when it is opened; matrix products are cuBLAS's, bf16 on the tensor
//!   cores with f32 accumulation.
//! - **One packed forward** ([`GpuModel`], the [`crate::packed_engine`] on this backend): every
//!   product runs over all the tokens of a batch at once (sequences end to end, no padding),
//!   attention runs within each sequence in a fused, flash-style kernel that never writes the
//!   scores out, and weights stay bf16 on the device.
//!
//! Compute capability 8.0 or newer (Ampere, Ada, Hopper, Blackwell): the kernels use bf16
//! tensor-core instructions.

mod backend;
mod libraries;
mod train;

/// A checkpoint's decoder and head on a GPU: the packed engine on [`Gpu`].
pub type GpuModel = crate::packed_engine::PackedDecoder<Gpu>;

use anyhow::{bail, Context, Result};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, LaunchConfig};
use cudarc::driver::{DeviceRepr, PushKernelArg, ValidAsZeroBits};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The kernels' source, compiled by NVRTC when a GPU is opened.
const KERNELS: &str = concat!(include_str!("kernels.cu"), include_str!("train_kernels.cu"));

/// The general kernels of the engine's CUDA source (everything but the flash kernel, built per
/// head size), loaded when a GPU is opened.
pub const GENERAL: &[&str] = &[
    "embed_rows",
    "rms_norm",
    "bias_rope",
    "swiglu",
    "bias_relu_bf16",
    "add_bias",
    "attention_simple",
    "gather_rows_bf16",
    "cache_write",
    "paged_attention",
    "copy_f32",
    "round_bf16",
    "zero_f32",
    "column_sums",
    "rms_norm_backward",
    "swiglu_backward",
    "relu_backward",
    "rope_backward",
    "attention_backward_dq",
    "attention_backward_dkv",
    "embed_backward",
    "sum_squares",
    "adamw",
    "token_logprobs",
    "token_logprobs_backward",
];

/// An opened GPU: its context, the stream every call runs on, cuBLAS, and the compiled kernels.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    kernels: HashMap<&'static str, CudaFunction>,
    /// The flash attention kernel, compiled per head size on first use.
    flash: Mutex<HashMap<usize, CudaFunction>>,
    /// The NVRTC target (`compute_XY`).
    arch: &'static str,
    /// The device's name and ordinal, for reports.
    name: String,
    _modules: Vec<Arc<CudaModule>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

/// One kernel argument.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg {
    /// A device pointer (0: null).
    Ptr(u64),
    /// An `int`.
    I32(i32),
    /// A `long long`.
    I64(i64),
    /// A `float`.
    F32(f32),
}

/// The NVRTC target for a device of compute capability `(major, minor)`: PTX the driver compiles
/// for the device at load time.
fn arch_for(major: i32, minor: i32) -> Result<&'static str> {
    Ok(match (major, minor) {
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        (8, _) => "compute_80",
        (9, _) => "compute_90",
        (m, _) if m >= 10 => "compute_90",
        _ => bail!("compute capability {major}.{minor}: stepwise's CUDA engine needs 8.0 or newer (bf16 tensor cores)"),
    })
}

/// Compiles `names` from [`KERNELS`] with `defines` for the context's device.
fn compile(ctx: &Arc<CudaContext>, arch: &'static str, defines: &[String]) -> Result<Arc<CudaModule>> {
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        options: defines
            .iter()
            .map(|d| format!("-D{d}"))
            .chain(["--std=c++17".to_string()])
            .collect(),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(KERNELS, opts)
        .map_err(|e| anyhow::anyhow!("compiling the CUDA kernels with NVRTC: {e}"))?;
    ctx.load_module(ptx).context("loading the compiled CUDA kernels")
}

/// Compiles the kernels with NVRTC for compute capability `arch` (e.g. `compute_90`) without a
/// GPU, and returns their PTX: what `bench/check_cuda_build.sh` checks on a machine with NVRTC
/// but no driver.
pub fn compile_only(arch: &'static str, head_dim: usize) -> Result<String> {
    libraries_for_compiling()?;
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        options: vec![format!("-DHEAD_DIM={head_dim}"), "--std=c++17".to_string()],
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(KERNELS, opts)
        .map_err(|e| anyhow::anyhow!("compiling the CUDA kernels with NVRTC: {e}"))?;
    Ok(ptx.to_src())
}

/// NVRTC alone reachable (no driver needed), for [`compile_only`].
fn libraries_for_compiling() -> Result<()> {
    libraries::ensure_nvrtc()
}

/// The GPUs opened so far, by ordinal: every model on one GPU shares its context and stream.
fn opened() -> &'static Mutex<HashMap<usize, Arc<Gpu>>> {
    static OPENED: OnceLock<Mutex<HashMap<usize, Arc<Gpu>>>> = OnceLock::new();
    OPENED.get_or_init(Default::default)
}

/// GPU `ordinal`, opened on first use: its libraries found, its kernels compiled.
pub fn open(ordinal: usize) -> Result<Arc<Gpu>> {
    let mut all = opened().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(gpu) = all.get(&ordinal) {
        return Ok(gpu.clone());
    }
    libraries::ensure()?;
    let count = CudaContext::device_count().context("asking the NVIDIA driver for its GPUs")?;
    if ordinal as i32 >= count {
        bail!("cuda:{ordinal}: the driver reports {count} GPU(s)");
    }
    let ctx = CudaContext::new(ordinal).with_context(|| format!("opening cuda:{ordinal}"))?;
    // One stream for everything: cudarc's per-buffer event tracking is not needed.
    // SAFETY: every buffer of the engine is used on this one stream only.
    unsafe { ctx.disable_event_tracking() };
    let (major, minor) = ctx.compute_capability()?;
    let arch = arch_for(major, minor)?;
    let stream = ctx.default_stream();
    let blas = CudaBlas::new(stream.clone()).context("starting cuBLAS")?;
    let module = compile(&ctx, arch, &[])?;
    let kernels = GENERAL
        .iter()
        .map(|&n| -> Result<_> { Ok((n, module.load_function(n)?)) })
        .collect::<Result<_>>()?;
    let name = format!(
        "{} (cuda:{ordinal}, compute capability {major}.{minor}, {:.0} GiB)",
        ctx.name().unwrap_or_else(|_| "NVIDIA GPU".into()),
        ctx.total_mem().unwrap_or(0) as f64 / (1u64 << 30) as f64
    );
    let gpu = Arc::new(Gpu {
        ctx,
        stream,
        blas,
        kernels,
        flash: Mutex::new(HashMap::new()),
        arch,
        name,
        _modules: vec![module],
    });
    all.insert(ordinal, gpu.clone());
    Ok(gpu)
}

/// How many GPUs the driver reports (0 where there is no driver).
pub fn device_count() -> usize {
    if libraries::ensure().is_err() {
        return 0;
    }
    CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
}

impl Gpu {
    /// The device's name, ordinal, capability and memory.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes of device memory free and in all.
    pub fn memory(&self) -> Result<(usize, usize)> {
        Ok(self.ctx.mem_get_info()?)
    }

    /// Waits for everything queued on the stream.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }

    /// A zeroed device buffer of `n` values.
    pub(crate) fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>> {
        self.stream
            .alloc_zeros::<T>(n.max(1))
            .with_context(|| format!("allocating {n} values on {}", self.name))
    }

    /// A device copy of `host`.
    pub(crate) fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        if host.is_empty() {
            // A zero-length allocation is refused by the driver.
            return Ok(unsafe { self.stream.alloc::<T>(1) }?);
        }
        self.stream
            .clone_htod(host)
            .with_context(|| format!("copying {} values to {}", host.len(), self.name))
    }

    /// `buf`'s first `n` values, copied to the host (waits for the stream).
    pub(crate) fn download<T: DeviceRepr + Default + Clone>(&self, buf: &CudaSlice<T>, n: usize) -> Result<Vec<T>> {
        let mut out = vec![T::default(); n];
        if n > 0 {
            self.stream.memcpy_dtoh(&buf.slice(..n), &mut out)?;
        }
        self.stream.synchronize()?;
        Ok(out)
    }

    /// The device address of `buf`'s value `at` (for kernels and cuBLAS).
    pub(crate) fn ptr<T>(&self, buf: &CudaSlice<T>, at: usize) -> u64 {
        let (p, _sync) = buf.device_ptr(&self.stream);
        p + (at * std::mem::size_of::<T>()) as u64
    }

    /// The device address of `buf`'s first value.
    pub(crate) fn addr<T>(&self, buf: &CudaSlice<T>) -> u64 {
        self.ptr(buf, 0)
    }

    /// Launches kernel `name` (one of [`GENERAL`]).
    pub(crate) fn launch(&self, name: &str, grid: u32, block: u32, args: &[Arg]) -> Result<()> {
        let f = self.kernels.get(name).with_context(|| format!("no kernel `{name}`"))?;
        self.launch_fn(f, (grid, 1, 1), block, args)
            .with_context(|| format!("launching `{name}`"))
    }

    /// Launches `f` on a grid of `grid` blocks of `block` threads.
    fn launch_fn(&self, f: &CudaFunction, grid: (u32, u32, u32), block: u32, args: &[Arg]) -> Result<()> {
        if grid.0 == 0 || grid.1 == 0 {
            return Ok(());
        }
        let mut b = self.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::Ptr(p) => b.arg(p),
                Arg::I32(i) => b.arg(i),
                Arg::I64(i) => b.arg(i),
                Arg::F32(x) => b.arg(x),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: every kernel's arguments are built by the engine to the kernel's signature,
        // with buffers sized for the grid (model.rs).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// The flash attention kernel for heads of `head_dim` (compiled on first use), or `None`
    /// where it is not built for that size (a multiple of 16, at most 128).
    pub(crate) fn flash(&self, head_dim: usize) -> Result<Option<CudaFunction>> {
        if !head_dim.is_multiple_of(16)
            || head_dim > 128
            || std::env::var_os("STEPWISE_CUDA_SIMPLE_ATTENTION").is_some()
        {
            return Ok(None);
        }
        let mut built = self.flash.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = built.get(&head_dim) {
            return Ok(Some(f.clone()));
        }
        let module = compile(&self.ctx, self.arch, &[format!("HEAD_DIM={head_dim}")])?;
        let f = module.load_function("flash_attention")?;
        built.insert(head_dim, f.clone());
        Ok(Some(f))
    }

    /// Launches the flash kernel `f` on `tiles` × `heads` blocks.
    pub(crate) fn launch_flash(&self, f: &CudaFunction, tiles: u32, heads: u32, args: &[Arg]) -> Result<()> {
        self.launch_fn(f, (tiles, heads, 1), 128, args)
            .context("launching `flash_attention`")
    }

    /// `y[rows, n] = x[rows, k] · w[n, k]ᵀ` (or `+=` with `accumulate`): `x` and `w` bf16
    /// row-major, `y` f32 (`out_f32`) or bf16. cuBLAS, f32 accumulation on the tensor cores.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm(
        &self,
        x: u64,
        w: u64,
        y: u64,
        rows: usize,
        n: usize,
        k: usize,
        out_f32: bool,
        accumulate: bool,
    ) -> Result<()> {
        // Row-major y = x·wᵀ is column-major yᵀ = w·xᵀ: w is k×n column-major, taken transposed.
        let what = || format!("cuBLAS product [{rows}, {k}] × [{n}, {k}]ᵀ");
        self.blas_gemm(
            (true, w, k),
            (false, x, k),
            (y, n),
            (n, rows, k),
            out_f32,
            accumulate,
            what,
        )
    }

    /// Column-major `c[m, n] (+)= op(a) · op(b)` with bf16 operands (`a`, `b`: whether taken
    /// transposed, the address, the leading dimension; `c`: the address and leading dimension),
    /// f32 accumulation, `c` f32 (`out_f32`) or bf16. `what` names the product in errors.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn blas_gemm(
        &self,
        a: (bool, u64, usize),
        b: (bool, u64, usize),
        c: (u64, usize),
        (m, n, k): (usize, usize, usize),
        out_f32: bool,
        accumulate: bool,
        what: impl Fn() -> String,
    ) -> Result<()> {
        use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
        if m == 0 || n == 0 {
            return Ok(());
        }
        // cuBLAS runs in the calling thread's current context (a server's worker thread may not
        // have it yet).
        self.ctx.bind_to_thread()?;
        let (alpha, beta) = (1f32, if accumulate { 1f32 } else { 0f32 });
        let out_type = if out_f32 {
            cudaDataType::CUDA_R_32F
        } else {
            cudaDataType::CUDA_R_16BF
        };
        let op = |t: bool| {
            if t {
                cublasOperation_t::CUBLAS_OP_T
            } else {
                cublasOperation_t::CUBLAS_OP_N
            }
        };
        // SAFETY: the pointers address buffers of the sizes the shapes and leading dimensions
        // imply, sized by the caller (the packed engine), on this handle's stream.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.blas.handle(),
                op(a.0),
                op(b.0),
                m as i32,
                n as i32,
                k as i32,
                &alpha as *const f32 as *const _,
                a.1 as *const _,
                cudaDataType::CUDA_R_16BF,
                a.2 as i32,
                b.1 as *const _,
                cudaDataType::CUDA_R_16BF,
                b.2 as i32,
                &beta as *const f32 as *const _,
                c.0 as *mut _,
                out_type,
                c.1 as i32,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .with_context(what)?;
        Ok(())
    }
}
