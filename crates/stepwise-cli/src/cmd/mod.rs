//! One module per subcommand.
pub mod annotate;
pub mod bon;
pub mod convert;
pub mod eval;
pub mod generate;
pub mod grade;
pub mod lab;
pub mod score;
pub mod stats;
pub mod train_prm;

/// The step scores of record `i` (0-based) of `path`, naming the first missing one.
pub fn step_scores(s: &stepwise_core::Solution, path: &std::path::Path, i: usize) -> anyhow::Result<Vec<f32>> {
    use anyhow::Context;
    s.steps
        .iter()
        .enumerate()
        .map(|(k, st)| {
            st.score.with_context(|| {
                format!(
                    "{}: record {}: field `steps[{k}].score`: missing (run `stepwise score`)",
                    path.display(),
                    i + 1
                )
            })
        })
        .collect()
}
