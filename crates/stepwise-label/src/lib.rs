//! stepwise-label: automatic step annotation. Every annotator implements
//! [`stepwise_core::Annotator`] over the [`stepwise_core::Policy`] and [`stepwise_core::Task`]
//! seams, so it runs the same on a local checkpoint, a remote server or a scripted test double;
//! [`annotate_resumable`] runs any of them over a file with a journal that survives `kill -9`.
//!
//! # Example
//!
//! `examples/implement_a_policy.rs` (run it with `cargo run -p stepwise-label --example implement_a_policy`; it is also a doc-test):
//!
#![doc = concat!("```\n", include_str!("../examples/implement_a_policy.rs"), "```")]
#![warn(missing_docs)]

pub mod binary_search;
pub mod consensus;
pub mod generative;
pub mod judge;
pub mod methods;
pub mod montecarlo;
pub mod omegaprm;
pub mod probes;
pub mod rectify;
pub mod resumable;

pub use binary_search::BinarySearch;
pub use consensus::Consensus;
pub use generative::GenerativeVerifier;
pub use judge::Judge;
pub use methods::{Annotators, Method};
pub use montecarlo::{McOptions, MonteCarlo};
pub use omegaprm::{OmegaOptions, OmegaPrm};
pub use rectify::{rectify, RectifyOptions, RectifyStats};
pub use resumable::{annotate_resumable, annotate_resumable_with, ANNOTATE_ERROR};

/// Label `sol`'s steps hard from where its first error is: good before `first`, bad from it on
/// (all good when `first` is `None`), each label's source `source`.
pub fn label_by_first_error(
    sol: &mut stepwise_core::Solution,
    first: Option<usize>,
    source: stepwise_core::Provenance,
) {
    for (i, step) in sol.steps.iter_mut().enumerate() {
        let good = first.is_none_or(|f| i < f);
        step.label = Some(stepwise_core::StepLabel::from_bool(good, source.clone()));
    }
}

/// A scripted policy and solutions shared by the annotators' tests.
#[cfg(test)]
pub(crate) mod test_support {
    use stepwise_core::{Solution, Step};

    /// Rollouts that finish correctly (every other one) only while the prefix has no "bad" step.
    pub fn toy(_q: &str, prefix: &[&str], j: usize) -> Vec<String> {
        let ok = !prefix.contains(&"bad");
        vec![if ok && j.is_multiple_of(2) {
            "answer 1"
        } else {
            "answer 2"
        }
        .into()]
    }

    /// A solution of `steps` whose gold answer is 1.
    pub fn solution(id: &str, steps: &[&str]) -> Solution {
        Solution {
            id: id.into(),
            steps: steps.iter().map(|t| Step::new(*t)).collect(),
            gold_answer: Some("1".into()),
            ..Default::default()
        }
    }
}
