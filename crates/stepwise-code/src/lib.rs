//! stepwise-code: the code domain. A program's steps are the lines of its function body; a
//! program is checked by running it against its tests in a sandboxed `python3`
//! ([`sandbox::Sandbox`]: time, memory, file, process and network limits), which can also record
//! the function's locals after every line (its execution trace). [`problems`] reads HumanEval
//! and MBPP; [`task::CodeTask`] is the [`stepwise_core::seams::Task`] that grades a solution by
//! running its problem's tests, so annotators label code steps by execution as they label math
//! steps by answers.
//!
//! # Example
//!
//! `examples/grade_humaneval.rs` (run it with `cargo run -p stepwise-code --example grade_humaneval`; it is also a doc-test):
//!
#![doc = concat!("```\n", include_str!("../examples/grade_humaneval.rs"), "```")]
#![warn(missing_docs)]

pub mod grading;
pub mod problems;
pub mod sandbox;
pub mod task;

pub use problems::CodeProblem;
pub use sandbox::{Isolation, Job, Outcome, Sandbox, Script, ScriptOutcome, ScriptStatus, Status, Tests};
pub use task::{CodeTask, CODE_STOPS};
