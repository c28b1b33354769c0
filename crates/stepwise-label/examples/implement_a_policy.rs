//! Implementing the `Policy` seam, and labelling steps with it by Monte Carlo rollouts
//! (Math-Shepherd). The policy here is a rule: it finishes any prefix that has not gone wrong
//! with the right answer half of the time. A real one wraps a model (stepwise-model's engine,
//! a server through stepwise-remote, or vLLM from Python); the annotators only see the trait.
//!
//! cargo run -p stepwise-label --example implement_a_policy

use stepwise_core::seams::{Annotator, Continuation, MathTask, Policy, Until};
use stepwise_core::{Solution, Step};
use stepwise_label::{McOptions, MonteCarlo};

/// Continues a prefix: right (`\boxed{12}`) on even draws unless a step already says 13.
struct RulePolicy;

impl Policy for RulePolicy {
    fn continue_from(
        &self,
        _question: &str,
        prefix: &[&str],
        n: usize,
        until: Until,
        seed: u64,
    ) -> anyhow::Result<Vec<Continuation>> {
        let derailed = prefix.iter().any(|s| s.contains("13"));
        Ok((0..n as u64)
            .map(|j| {
                let right = !derailed && (seed + j).is_multiple_of(2);
                let mut steps = vec![format!("The answer is \\boxed{{{}}}.", if right { 12 } else { 13 })];
                if until == Until::Step {
                    steps.truncate(1);
                }
                Continuation {
                    text: steps.join("\n"),
                    tokens: 6,
                    steps,
                    finished: true,
                    token_ids: Vec::new(),
                }
            })
            .collect())
    }
}

fn main() -> anyhow::Result<()> {
    let solution = Solution {
        id: "s1".into(),
        problem_id: "p1".into(),
        question: "Ann has 3 bags of 4 apples. How many apples does she have?".into(),
        steps: ["3 * 4 = 12", "12 + 1 = 13", "The answer is \\boxed{13}."]
            .map(Step::new)
            .to_vec(),
        gold_answer: Some("12".into()),
        ..Default::default()
    };
    let annotator = MonteCarlo {
        policy: &RulePolicy,
        task: &MathTask::default(),
        options: McOptions { rollouts: 8, seed: 0 },
    };
    let (labelled, spent) = annotator.annotate(&solution)?;
    for step in &labelled.steps {
        let p = step.label.as_ref().map_or(f32::NAN, |l| l.prob(1.0));
        println!("{p:.2}  {}", step.text);
    }
    println!(
        "first error: step {:?}; {} rollouts",
        labelled.first_error(),
        spent.rollouts
    );
    assert_eq!(
        labelled.first_error(),
        Some(1),
        "the step that makes 13 is the first error"
    );
    Ok(())
}
