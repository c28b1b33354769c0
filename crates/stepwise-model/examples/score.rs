//! stepwise-model's main use: load a PRM checkpoint (any layout, detected) and score every step
//! of a solution. Defaults to the tiny Qwen2.5-Math-PRM-shaped fixture.
//!
//! cargo run -p stepwise-model --example score -- [PRM_FOLDER]

use stepwise_core::seams::{ScoreInput, StepScorer};

fn main() -> anyhow::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/hf-tiny/qwen2-prm").into());
    let prm = stepwise_model::scoring::LoadedVerifier::load(dir.as_ref(), "auto", &candle_core::Device::Cpu)?;
    println!("{dir}: layout {:?}", prm.layout);
    let input = ScoreInput {
        problem_id: "p1",
        question: "Ann has 3 bags of 4 apples. How many apples does she have?",
        steps: vec!["3 * 4 = 12", "The answer is 12."],
        partial: false,
    };
    // Through the `StepScorer` seam (what search, bon and the server call), in a batch.
    let scored = StepScorer::score(&prm.scorer(), &[input])?;
    println!("step scores: {:?} ({} tokens encoded)", scored.scores[0], scored.tokens);
    assert_eq!(scored.scores[0].len(), 2);
    // Or one solution directly.
    let one = prm.scorer().score("Ann has 3 bags of 4 apples.", &["3 * 4 = 12"])?;
    println!("one step: {one:?}");
    Ok(())
}
