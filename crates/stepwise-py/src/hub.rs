//! Models by Hugging Face id and PEFT adapters: what `stepwise merge` does, from Python.

use crate::convert::{path_of, without_gil};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use std::path::PathBuf;

/// A path argument's path, or a `TypeError` naming the argument.
fn path_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<PathBuf> {
    path_of(obj).ok_or_else(|| PyTypeError::new_err(format!("{name}: a str or os.PathLike path is needed")))
}

/// Merges the PEFT LoRA adapter `adapter` (a folder with `adapter_config.json` and
/// `adapter_model.safetensors`, or its Hugging Face model id) onto its base, or onto `base` (a
/// folder or model id: for an adapter whose `base_model_name_or_path` is a folder of another
/// machine), into the new folder `out`: PEFT's `merge_and_unload()` and `save_pretrained()`, for
/// tools that read no adapters. (`stepwise.PRM` and `stepwise.Policy` take the adapter itself.)
/// Returns `out`.
///
/// >>> stepwise.merge_adapter("runs/prm-lora", "models/prm-merged")
#[pyfunction]
#[pyo3(signature = (adapter, out, base=None))]
pub fn merge_adapter(
    py: Python<'_>,
    adapter: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    base: Option<&Bound<'_, PyAny>>,
) -> PyResult<String> {
    let adapter = path_arg(adapter, "adapter")?;
    let out = path_arg(out, "out")?;
    let base = base.map(|b| path_arg(b, "base")).transpose()?;
    without_gil(py, move || {
        let base = base
            .map(|b| stepwise_model::hub::resolve(&b.to_string_lossy()))
            .transpose()?;
        stepwise_model::hub::merge_adapter(&adapter.to_string_lossy(), base.as_deref(), &out)?;
        Ok(out.display().to_string())
    })
}

/// Downloads the Hugging Face model `id` (`ORG/NAME`, optionally `@REVISION`) into the local
/// Hugging Face cache, only what stepwise reads (safetensors weights, configs, tokenizer files,
/// chat templates), as `stepwise download`, and returns its snapshot folder; already cached, it
/// fetches nothing. For a PEFT adapter, its base too when that is a model id. Every model
/// argument downloads what it lacks anyway: this is for fetching ahead of an offline run.
///
/// >>> stepwise.download("Qwen/Qwen2.5-Math-PRM-7B")
#[pyfunction]
pub fn download(py: Python<'_>, id: String) -> PyResult<String> {
    without_gil(py, move || {
        Ok(stepwise_model::hub::download(&id)?[0].1.display().to_string())
    })
}
