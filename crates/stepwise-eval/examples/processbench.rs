//! stepwise-eval's main use: ProcessBench's metric from a verifier's step scores. Each
//! solution's predicted first error is its first step scored below a threshold; the F1 is the
//! harmonic mean of the exact first-error accuracy on wrong solutions and the "no error"
//! accuracy on right ones.
//!
//! cargo run -p stepwise-eval --example processbench

use stepwise_eval::processbench::{predict_first_error, score};

fn main() {
    // (a verifier's step scores, the labelled first error) for four solutions.
    let solutions: [(&[f32], Option<usize>); 4] = [
        (&[0.9, 0.8, 0.2, 0.1], Some(2)), // found
        (&[0.9, 0.3, 0.9], Some(2)),      // flagged too early
        (&[0.95, 0.9, 0.85], None),       // right, none flagged
        (&[0.9, 0.4], None),              // right, flagged anyway
    ];
    let pairs: Vec<(Option<usize>, Option<usize>)> = solutions
        .iter()
        .map(|(scores, truth)| (predict_first_error(scores, 0.5), *truth))
        .collect();
    let s = score(&pairs);
    println!(
        "error accuracy {:.2}, correct accuracy {:.2}, F1 {:.2} over {:?} (with / without an error)",
        s.error_accuracy, s.correct_accuracy, s.f1, s.counts
    );
    assert_eq!((s.error_accuracy, s.correct_accuracy), (0.5, 0.5));
}
