//! How a solution's step scores become one score: the weakest step, their product, the last
//! step or their mean. Best-of-N selects by it and every step-level search ranks partial
//! solutions by it.

use anyhow::Result;
use serde::{Deserialize, Serialize};

/// How step scores become one solution score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Aggregation {
    /// The weakest step (Lightman et al.).
    Min,
    /// Product of step probabilities.
    Product,
    /// The last step's score.
    Last,
    /// Mean of step scores.
    Mean,
}

impl Aggregation {
    /// All aggregations.
    pub const ALL: [Aggregation; 4] = [
        Aggregation::Min,
        Aggregation::Product,
        Aggregation::Last,
        Aggregation::Mean,
    ];
    /// The aggregation called `name` (`min`, `product`, `last` or `mean`).
    pub fn by_name(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| anyhow::anyhow!("unknown aggregation `{name}`: use min, product, last or mean"))
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Aggregation::Min => "min",
            Aggregation::Product => "product",
            Aggregation::Last => "last",
            Aggregation::Mean => "mean",
        }
    }
}

/// Aggregate step scores (an empty solution scores 0).
pub fn aggregate(scores: &[f32], agg: Aggregation) -> f32 {
    if scores.is_empty() {
        return 0.0;
    }
    match agg {
        Aggregation::Min => scores.iter().copied().fold(f32::INFINITY, f32::min),
        Aggregation::Product => scores.iter().product(),
        Aggregation::Last => *scores.last().unwrap(),
        Aggregation::Mean => scores.iter().sum::<f32>() / scores.len() as f32,
    }
}
