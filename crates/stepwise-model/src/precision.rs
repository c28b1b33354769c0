//! What a loaded model computes in ([`Precision`]): how its weight matrices are held and
//! whether bf16 ones multiply in bf16. A property of each model, given at load
//! ([`crate::Model::load_as`]); [`default_precision`] is what [`crate::Model::load`] gives.

use anyhow::{bail, Result};

/// How weight matrices are held in memory ([`Precision::weights`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WeightDtype {
    /// As the checkpoint stores them: bf16 and f16 stay two bytes a value (the default).
    #[default]
    Auto,
    /// Everything widened to f32 at load (twice the memory of a bf16 checkpoint; f32
    /// arithmetic throughout).
    F32,
    /// f32 matrices rounded to bf16 at load (half their memory; results move by bf16's
    /// rounding), bf16 and f16 kept as stored.
    Bf16,
}

impl std::str::FromStr for WeightDtype {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "auto" => WeightDtype::Auto,
            "f32" | "float32" => WeightDtype::F32,
            "bf16" | "bfloat16" => WeightDtype::Bf16,
            _ => bail!("unknown dtype `{s}`: expected auto, f32 or bf16"),
        })
    }
}

/// What a loaded model computes in: how its weight matrices are held, and whether bf16 ones
/// multiply in bf16. A property of the model ([`crate::Model::precision`]), given at load
/// ([`crate::Model::load_as`], [`crate::Model::load_on`]; [`crate::Model::load`] takes [`default_precision`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Precision {
    /// How weight matrices are held.
    pub weights: WeightDtype,
    /// Whether bf16 weights multiply in bf16 with f32 sums on CPUs with AVX512_BF16 (`true`:
    /// bf16 inference as PyTorch and vLLM compute it, up to twice as fast), or are widened to
    /// f32 for every product (`false`: the numbers of the checkpoint converted to f32, at bf16's
    /// memory). CPUs without the instruction always widen.
    pub bf16_products: bool,
}

impl Default for Precision {
    fn default() -> Self {
        Precision {
            weights: WeightDtype::Auto,
            bf16_products: true,
        }
    }
}

impl From<WeightDtype> for Precision {
    fn from(weights: WeightDtype) -> Self {
        Precision {
            weights,
            ..Precision::default()
        }
    }
}

/// The names [`Precision`] parses (the CLI's `--dtype`, Python's `dtype=`).
pub const PRECISIONS: [&str; 4] = ["auto", "f32", "bf16", "bf16-weights"];

impl std::str::FromStr for Precision {
    type Err = anyhow::Error;
    /// `auto`, `f32`, `bf16` ([`WeightDtype`]'s, bf16 products on) or `bf16-weights` (held in
    /// bf16, multiplied in f32).
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "bf16-weights" => Precision {
                weights: WeightDtype::Bf16,
                bf16_products: false,
            },
            _ => s
                .parse::<WeightDtype>()
                .map_err(|_| anyhow::anyhow!("unknown dtype `{s}`: expected one of {}", PRECISIONS.join(", ")))?
                .into(),
        })
    }
}

/// [`default_precision`]'s value.
static DEFAULT_PRECISION: std::sync::RwLock<Precision> = std::sync::RwLock::new(Precision {
    weights: WeightDtype::Auto,
    bf16_products: true,
});

/// The precision [`crate::Model::load`] gives the models loaded after this call in this process (the
/// CLI's `--dtype` for commands that load several models, as `torch.set_default_dtype`). A model
/// already loaded keeps its own ([`crate::Model::precision`]).
pub fn set_default_precision(p: Precision) {
    *DEFAULT_PRECISION.write().unwrap_or_else(|e| e.into_inner()) = p;
}

/// The precision [`crate::Model::load`] gives a model (see [`set_default_precision`]).
pub fn default_precision() -> Precision {
    *DEFAULT_PRECISION.read().unwrap_or_else(|e| e.into_inner())
}
