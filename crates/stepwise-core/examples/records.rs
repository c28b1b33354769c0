//! stepwise-core's main use: step-labelled records in any format, and grading final answers.
//! Builds a solution with hard step labels, writes it in TRL's stepwise-supervision layout,
//! reads it back (the format is detected), and grades its final answer.
//!
//! cargo run -p stepwise-core --example records

use stepwise_core::grader::{grade, GradeMode};
use stepwise_core::{read_solutions, write_solutions, Format, Provenance, Rating, Solution, Step, StepLabel};

fn main() -> anyhow::Result<()> {
    let step = |text: &str, rating| {
        let mut s = Step::new(text);
        s.label = Some(StepLabel::hard(rating, Provenance::Human));
        s
    };
    let solution = Solution {
        id: "s1".into(),
        problem_id: "p1".into(),
        question: "Ann has 3 bags of 4 apples. How many apples does she have?".into(),
        steps: vec![
            step("3 * 4 = 12", Rating::Good),
            step("So she has \\boxed{12} apples.", Rating::Good),
        ],
        gold_answer: Some("12".into()),
        ..Default::default()
    };

    let path = std::env::temp_dir().join(format!("stepwise-example-{}.jsonl", std::process::id()));
    write_solutions(&path, Format::Trl, std::slice::from_ref(&solution))?;
    let back = read_solutions(&path, None)?; // TRL detected from the first record
    std::fs::remove_file(&path)?;
    assert_eq!(back[0].steps.len(), 2);
    assert_eq!(back[0].first_error(), None, "both steps are good");

    let answer = stepwise_core::answer::extract_answer(&back[0].steps[1].text).unwrap_or_default();
    let correct = grade(&answer, "12.0", GradeMode::Lenient);
    println!(
        "read back {} steps; final answer {answer}: correct = {correct}",
        back[0].steps.len()
    );
    assert!(correct);
    Ok(())
}
