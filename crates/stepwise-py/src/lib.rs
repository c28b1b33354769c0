//! `stepwise._stepwise`: the native module of the `stepwise` Python package (built by maturin
//! from `python/`). Each function is a thin front end over the same stage functions the command
//! line calls; `python/stepwise/__init__.py` re-exports them with the pure-Python helpers
//! (`to_hf`/`from_hf`, the RL integrations, the lab).
//!
//! At the boundary every function releases the GIL while Rust works, turns errors into
//! `stepwise.StepwiseError` carrying the Rust message (bad arguments into `ValueError`), and
//! catches panics, so none crosses into Python.

use pyo3::prelude::*;

/// The system allocator, large blocks starting on a cache line (where the CPU kernels' rows
/// load fastest: `stepwise_model::alloc`).
#[global_allocator]
static ALLOC: stepwise_model::alloc::CacheAligned<std::alloc::System> =
    stepwise_model::alloc::CacheAligned(std::alloc::System);

mod agent;
mod agent_rl;
mod bounded;
mod code;
mod convert;
mod dpo;
mod hub;
mod policy;
mod progress;
mod records;
mod rewards;
mod rl;
mod stages;
mod studio;
mod train;
mod verifier;

pyo3::create_exception!(
    _stepwise,
    StepwiseError,
    pyo3::exceptions::PyException,
    "An error from stepwise (a file, a record, a model or a server), with the message that names what is wrong."
);

/// Run the `stepwise` command line on `argv` (the program's name first) in this process, without
/// the GIL: its exit status. The `stepwise` command `pip install` puts on the PATH calls this.
#[pyfunction]
fn cli(py: Python<'_>, argv: Vec<String>) -> PyResult<i32> {
    convert::without_gil(py, move || Ok(stepwise_cli::main_with(argv)))
}

#[pymodule]
fn _stepwise(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("StepwiseError", m.py().get_type::<StepwiseError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("cuda_available", cfg!(feature = "cuda"))?;
    m.add("DEFAULT_MAX_BATCH_TOKENS", stepwise_model::DEFAULT_MAX_BATCH_TOKENS)?;
    m.add_function(wrap_pyfunction!(cli, m)?)?;
    m.add_function(wrap_pyfunction!(records::read, m)?)?;
    m.add_function(wrap_pyfunction!(records::read_problems, m)?)?;
    m.add_function(wrap_pyfunction!(records::write, m)?)?;
    m.add_function(wrap_pyfunction!(records::convert, m)?)?;
    m.add_function(wrap_pyfunction!(records::step_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(records::to_arrow_ipc, m)?)?;
    m.add_function(wrap_pyfunction!(records::from_arrow_ipc, m)?)?;
    m.add_function(wrap_pyfunction!(records::grade, m)?)?;
    m.add_function(wrap_pyfunction!(records::extract_answer, m)?)?;
    m.add_function(wrap_pyfunction!(records::split_steps, m)?)?;
    m.add_function(wrap_pyfunction!(rewards::step_rewards, m)?)?;
    m.add_function(wrap_pyfunction!(rewards::openrlhf_rewards, m)?)?;
    m.add_class::<verifier::Prm>()?;
    m.add_class::<policy::Policy>()?;
    m.add_class::<studio::Studio>()?;
    m.add_function(wrap_pyfunction!(stages::annotate, m)?)?;
    m.add_function(wrap_pyfunction!(agent::rooms, m)?)?;
    m.add_function(wrap_pyfunction!(agent::play, m)?)?;
    m.add_function(wrap_pyfunction!(agent::label_actions, m)?)?;
    m.add_function(wrap_pyfunction!(agent_rl::agent_rl, m)?)?;
    m.add_function(wrap_pyfunction!(stages::search, m)?)?;
    m.add_function(wrap_pyfunction!(stages::lab_run, m)?)?;
    m.add_function(wrap_pyfunction!(train::train_prm, m)?)?;
    m.add_function(wrap_pyfunction!(rl::rl, m)?)?;
    m.add_function(wrap_pyfunction!(dpo::dpo, m)?)?;
    m.add_function(wrap_pyfunction!(hub::merge_adapter, m)?)?;
    m.add_function(wrap_pyfunction!(hub::download, m)?)?;
    m.add_function(wrap_pyfunction!(code::run_tests, m)?)?;
    m.add_function(wrap_pyfunction!(code::pass_at_k, m)?)?;
    m.add_function(wrap_pyfunction!(verifier::generative_scores, m)?)?;
    m.add_function(wrap_pyfunction!(verifier::judge_scores, m)?)?;
    Ok(())
}
