//! stepwise-rl's main use from an RL engine: a PRM's step scores as per-token rewards (verl's
//! `token_level_rewards`, OpenRLHF's per-token rewards). Each step's reward sits at the token
//! that ends the step; with PURE's min-form credit, a bad step caps the return of every token
//! before it.
//!
//! cargo run -p stepwise-rl --example dense_rewards

use stepwise_rl::dense::{token_rewards, TokenCredit};

fn main() -> anyhow::Result<()> {
    // A 12-token response of three steps ending at tokens 3, 7 and 11; the PRM likes steps 1 and
    // 3 and doubts step 2; the answer is right (outcome 1).
    let (scores, ends) = ([0.9, 0.2, 0.8], [3, 7, 11]);
    for credit in [TokenCredit::ReturnToGo, TokenCredit::Min] {
        let rewards = token_rewards(12, &scores, &ends, credit, Some(1.0))?;
        let returns: Vec<f32> = (0..12).map(|t| rewards[t..].iter().sum()).collect();
        println!("{credit:?}: rewards {rewards:?}\n  return from each token {returns:?}");
    }
    let min = token_rewards(12, &scores, &ends, TokenCredit::Min, None)?;
    let from_start: f32 = min.iter().sum();
    assert!(
        (from_start - 0.2).abs() < 1e-6,
        "min-form: the return from the start is the worst step"
    );
    Ok(())
}
