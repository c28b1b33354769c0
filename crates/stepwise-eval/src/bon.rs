//! Best-of-N scaling curves: expected accuracy of a selector given N samples per problem, with
//! bootstrap 95% intervals over problems; pass@N is the ceiling.

use rand::seq::index::sample;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use stepwise_search::{select, Candidate, Selector};

/// One point of a curve.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Point {
    /// Samples per problem.
    pub n: usize,
    /// Accuracy.
    pub accuracy: f64,
    /// Bootstrap 2.5% quantile.
    pub lo: f64,
    /// Bootstrap 97.5% quantile.
    pub hi: f64,
}

/// A method's curve.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Curve {
    /// Method label.
    pub method: String,
    /// Points by increasing N.
    pub points: Vec<Point>,
}

/// Which rule picks, or `None` for pass@N (any correct).
pub type Method = Option<Selector>;

/// Per-problem expected correctness at N: `draws` random subsets of size N.
fn per_problem(cands: &[Candidate], n: usize, how: Method, draws: usize, rng: &mut ChaCha8Rng) -> f64 {
    if cands.is_empty() {
        return 0.0;
    }
    let n = n.min(cands.len());
    let draws = if n == cands.len() { 1 } else { draws };
    let mut hits = 0usize;
    for _ in 0..draws {
        let idx = sample(rng, cands.len(), n);
        let sub: Vec<&Candidate> = idx.iter().map(|i| &cands[i]).collect();
        let ok = match how {
            None => sub.iter().any(|c| c.correct),
            Some(sel) => select(&sub, sel).is_some_and(|k| sub[k].correct),
        };
        hits += usize::from(ok);
    }
    hits as f64 / draws as f64
}

/// Each problem's expected correctness when `how` picks from `n` of its candidates (`draws`
/// random subsets; one when `n` covers them all): the per-problem results behind a curve's point,
/// for paired comparisons.
pub fn per_problem_accuracy(problems: &[Vec<Candidate>], how: Method, n: usize, draws: usize, seed: u64) -> Vec<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    problems
        .iter()
        .map(|c| per_problem(c, n, how, draws, &mut rng))
        .collect()
}

/// The curve of `how` over `ns`, for candidates grouped by problem.
pub fn curve(label: &str, problems: &[Vec<Candidate>], how: Method, ns: &[usize], draws: usize, seed: u64) -> Curve {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let points = ns
        .iter()
        .map(|&n| {
            let per: Vec<f64> = problems
                .iter()
                .map(|c| per_problem(c, n, how, draws, &mut rng))
                .collect();
            let accuracy = per.iter().sum::<f64>() / per.len().max(1) as f64;
            let (lo, hi) = bootstrap(&per, 1000, &mut rng);
            Point { n, accuracy, lo, hi }
        })
        .collect();
    Curve {
        method: label.to_string(),
        points,
    }
}

/// 95% bootstrap interval of the mean.
pub fn bootstrap(xs: &[f64], reps: usize, rng: &mut impl Rng) -> (f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let mut means: Vec<f64> = (0..reps)
        .map(|_| (0..xs.len()).map(|_| xs[rng.random_range(0..xs.len())]).sum::<f64>() / xs.len() as f64)
        .collect();
    means.sort_by(f64::total_cmp);
    (means[reps * 25 / 1000], means[(reps * 975 / 1000).min(reps - 1)])
}
