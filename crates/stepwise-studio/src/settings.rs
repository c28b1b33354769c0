//! A project's settings: how its records are labelled and in which order they are served.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// What a person may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Rates the records assigned to them, nothing else.
    Labeller,
    /// Also sees every labeller's ratings, the dashboard, and adjudicates.
    Reviewer,
    /// Also exports and manages projects.
    Admin,
}

impl Role {
    /// Whether this role may review (see others' ratings, adjudicate, read the dashboard).
    pub fn reviews(self) -> bool {
        matches!(self, Role::Reviewer | Role::Admin)
    }
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "labeller" | "labeler" => Ok(Role::Labeller),
            "reviewer" => Ok(Role::Reviewer),
            "admin" => Ok(Role::Admin),
            _ => Err(format!("unknown role `{s}`: use labeller, reviewer or admin")),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Labeller => "labeller",
            Role::Reviewer => "reviewer",
            Role::Admin => "admin",
        })
    }
}

/// The order in which a project's records are served (active learning).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// A seeded shuffle: every record equally likely next.
    Uniform,
    /// PRM800K phase 2: solutions with a wrong final answer that the PRM scores highest first.
    ConvincingWrong,
    /// ActPRM: the records whose steps the scorers (an ensemble's spread, a PRM's or Monte
    /// Carlo's closeness to 1/2) are least sure of first.
    Uncertainty,
}

impl FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "uniform" => Ok(Policy::Uniform),
            "convincing-wrong" => Ok(Policy::ConvincingWrong),
            "uncertainty" => Ok(Policy::Uncertainty),
            _ => Err(format!(
                "unknown policy `{s}`: use uniform, convincing-wrong or uncertainty"
            )),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Policy::Uniform => "uniform",
            Policy::ConvincingWrong => "convincing-wrong",
            Policy::Uncertainty => "uncertainty",
        })
    }
}

/// How a step is shown to the person rating it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// Labellers per record (PRM800K's overlap); gold records go to every labeller.
    pub overlap: u32,
    /// PRM800K phase 2: a record is finished at its first −1 (`found_error`).
    pub stop_at_first_bad: bool,
    /// Show the PRM's (or the records' Monte Carlo / judge) score beside each step; off for
    /// blind labelling. Recorded with every rating.
    pub assist: bool,
    /// The queue's order.
    pub policy: Policy,
    /// One gold (quality-control) record in every `qc_every` served, while a labeller has gold
    /// records left; 0 serves none.
    pub qc_every: u32,
    /// Steps shown as code with line numbers instead of text with LaTeX.
    pub code: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            overlap: 1,
            stop_at_first_bad: false,
            assist: true,
            policy: Policy::Uniform,
            qc_every: 10,
            code: false,
        }
    }
}

/// PRM800K's reasons a labelling ends.
pub const FINISH_REASONS: [&str; 4] = ["found_error", "solution", "bad_problem", "give_up"];
