//! Answer grading in two modes.
//!
//! - [`GradeMode::Prm800k`] reproduces the verdicts of OpenAI's PRM800K grader exactly,
//!   including where it is deliberately strict (unreduced fractions, `2^{10}` ≠ 1024).
//! - [`GradeMode::Lenient`] is mathematically right where that grader is strict.
//!
//! No sympy: expressions are parsed to an AST ([`expr`]) and compared by exact rational
//! arithmetic where possible, by evaluation at random points otherwise. Every call finishes in
//! bounded time: inputs over [`MAX_ANSWER_CHARS`] are compared as strings only.

pub mod expr;
pub mod latex;
mod lenient;
pub mod mathd;
mod prm800k;

use std::str::FromStr;

/// Answers longer than this are compared after normalisation only, never parsed.
pub const MAX_ANSWER_CHARS: usize = 1000;

/// Which grader to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GradeMode {
    /// Exactly OpenAI's PRM800K grader.
    #[default]
    Prm800k,
    /// Mathematically right where PRM800K's grader is strict.
    Lenient,
}

impl FromStr for GradeMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "prm800k" => Ok(GradeMode::Prm800k),
            "lenient" => Ok(GradeMode::Lenient),
            _ => Err(format!("unknown grade mode `{s}`: use prm800k or lenient")),
        }
    }
}

/// Whether `given` answers `ground_truth`.
pub fn grade(given: &str, ground_truth: &str, mode: GradeMode) -> bool {
    if given.len() > MAX_ANSWER_CHARS || ground_truth.len() > MAX_ANSWER_CHARS {
        return mathd::normalize_answer(given) == mathd::normalize_answer(ground_truth);
    }
    match mode {
        GradeMode::Prm800k => prm800k::grade(given, ground_truth),
        GradeMode::Lenient => lenient::grade(given, ground_truth),
    }
}

pub use prm800k::normalize as prm800k_normalize;
