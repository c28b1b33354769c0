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

/// Verifier `name`'s step scores of record `i` (0-based) of `path`.
pub fn step_scores(
    s: &stepwise_core::Solution,
    name: &str,
    path: &std::path::Path,
    i: usize,
) -> anyhow::Result<Vec<f32>> {
    match s.scores_of(name) {
        Some(v) => Ok(v),
        None => anyhow::bail!(
            "{}: record {}: field `scores.{name}`: missing or not one per step (run `stepwise score --name {name}`)",
            path.display(),
            i + 1
        ),
    }
}
