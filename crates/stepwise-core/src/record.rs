//! The records every stage reads and writes: [`Problem`], [`Solution`], [`Step`], [`StepLabel`].
//!
//! A [`Solution`] carries its question (and gold answer when known) so that a JSONL file of
//! solutions is self-contained: any stage can run on it alone.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Free-form metadata kept alongside a record (format-specific fields live here so that
/// conversions back to the original format are lossless).
pub type Meta = Map<String, Value>;

/// A problem to solve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Problem {
    /// Stable identifier.
    pub id: String,
    /// The question text.
    pub question: String,
    /// The reference final answer, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gold_answer: Option<String>,
    /// Where the problem comes from (dataset name, generator family, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Anything else.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub meta: Meta,
}

impl Problem {
    /// A problem from a JSON record: `question` (or `problem`), an optional `id` (else one
    /// derived from the question), a gold answer in `gold_answer` or `answer` (GSM8K's
    /// `#### N` is understood), and `source` and `meta` as written (an agent's world lives in
    /// `meta`). An error names the field.
    pub fn from_record(v: &serde_json::Value) -> Result<Problem, crate::FieldError> {
        use serde_json::Value;
        let question = v
            .get("question")
            .or_else(|| v.get("problem"))
            .and_then(Value::as_str)
            .ok_or_else(|| crate::FieldError::new("question", "missing (or `problem`: the problem's text)"))?
            .to_string();
        let gold_answer = ["gold_answer", "answer"]
            .iter()
            .find_map(|k| v.get(*k).and_then(Value::as_str))
            .map(|g| crate::answer::extract_gsm8k_gold(g).unwrap_or_else(|| g.to_string()));
        let id = v
            .get("id")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| crate::formats::problem_id_for(&question));
        let meta = match v.get("meta") {
            None | Some(Value::Null) => Meta::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(other) => {
                return Err(crate::FieldError::new(
                    "meta",
                    format!("expected an object, found {}", crate::json::kind(other)),
                ))
            }
        };
        Ok(Problem {
            id,
            question,
            gold_answer,
            source: v.get("source").and_then(Value::as_str).map(str::to_string),
            meta,
        })
    }
}

/// A step-by-step solution to a problem, with optional per-step labels and scores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Solution {
    /// Stable identifier of this solution.
    pub id: String,
    /// Identifier of the problem it answers.
    #[serde(default)]
    pub problem_id: String,
    /// The question text (copied from the problem so the record stands alone).
    #[serde(default)]
    pub question: String,
    /// The reasoning steps, in order.
    pub steps: Vec<Step>,
    /// The final answer the solution arrives at, when extracted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_answer: Option<String>,
    /// The reference answer of the problem, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gold_answer: Option<String>,
    /// Whether the final answer is correct (outcome label), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correct: Option<bool>,
    /// The model (or person) that wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator: Option<String>,
    /// Step scores by verifier name (`"prm"`, `"orm"`, `"oracle"`, …): one score per step. An
    /// outcome model's solution score is its last step's. The one place stepwise keeps scores;
    /// [`Solution::scores_of`] also reads `steps[].score` of files written elsewhere.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        serialize_with = "short::by_name"
    )]
    pub scores: BTreeMap<String, Vec<f32>>,
    /// Anything else, including format-specific fields kept for lossless round trips.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub meta: Meta,
}

/// One reasoning step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Step {
    /// The step's text.
    pub text: String,
    /// A supervision label, when the step has been annotated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<StepLabel>,
    /// A score given by a step scorer (PRM, oracle, …), in [0, 1] for probabilities.
    #[serde(default, skip_serializing_if = "Option::is_none", serialize_with = "short::option")]
    pub score: Option<f32>,
    /// In an agent's trajectory, what the environment answered after this step's action (the
    /// next state's observation): context the policy and scorers read, never scored itself.
    /// `None` in single-turn solutions (math, code) and after an episode's last action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation: Option<String>,
    /// In a trajectory read from a chat layout with tool calls, the calls this step made, as
    /// the source wrote them (OpenAI `tool_calls`), so writing it back loses nothing. The step's
    /// `text` then ends with the calls rendered as `name(arguments)`, one per line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Value>,
}

impl Step {
    /// An unlabelled step.
    pub fn new(text: impl Into<String>) -> Self {
        Step {
            text: text.into(),
            ..Default::default()
        }
    }

    /// A step with a label.
    pub fn labelled(text: impl Into<String>, label: StepLabel) -> Self {
        Step {
            text: text.into(),
            label: Some(label),
            ..Default::default()
        }
    }

    /// An agent's step: its action and the observation the environment answered with.
    pub fn turn(action: impl Into<String>, observation: Option<String>) -> Self {
        Step {
            text: action.into(),
            observation,
            ..Default::default()
        }
    }
}

/// A hard step rating, as PRM800K rates steps: -1 bad, 0 neutral, +1 good.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rating {
    /// The step is wrong (-1).
    Bad,
    /// The step is acceptable but does not move towards the answer (0).
    Neutral,
    /// The step is correct and useful (+1).
    Good,
}

impl Rating {
    /// PRM800K's integer encoding.
    pub fn as_i64(self) -> i64 {
        match self {
            Rating::Bad => -1,
            Rating::Neutral => 0,
            Rating::Good => 1,
        }
    }

    /// Inverse of [`Rating::as_i64`].
    pub fn from_i64(v: i64) -> Option<Rating> {
        match v {
            -1 => Some(Rating::Bad),
            0 => Some(Rating::Neutral),
            1 => Some(Rating::Good),
            _ => None,
        }
    }
}

/// Who or what produced a label.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Provenance {
    /// Not recorded by the source format.
    #[default]
    Unknown,
    /// A human annotator.
    Human,
    /// Monte Carlo rollouts from the step prefix: `hits` of `rollouts` reached the gold answer.
    MonteCarlo {
        /// Number of rollouts from this prefix.
        rollouts: u32,
        /// Number of those that reached a correct answer.
        hits: u32,
    },
    /// Binary search for the first error (Luo et al.'s step-by-step search without a tree).
    BinarySearch,
    /// OmegaPRM's search tree: a step the tree knows is right (a later prefix on its path
    /// reached the answer) or wrong (after its first error), without rollouts of its own; steps
    /// the tree did roll out from carry [`Provenance::MonteCarlo`]. Also the `mc_value` labels
    /// of OmegaPRM's released data.
    #[serde(rename = "omegaprm")]
    OmegaPrm,
    /// An LLM judge.
    Judge,
    /// Agreement of several annotators (e.g. Monte Carlo and judge).
    Consensus,
    /// An exact step checker.
    Oracle,
    /// A temporal-difference estimate from a learned value (Xi et al.'s AgentPRM): the label is
    /// the step's λ-return (its promise), bootstrapped from the value of later states instead
    /// of rolled out; the step's progress (its GAE advantage) is kept beside it.
    #[serde(rename = "td")]
    TemporalDifference {
        /// The discount γ.
        #[serde(serialize_with = "short::one")]
        gamma: f32,
        /// The λ of TD(λ)/GAE: 0 bootstraps from the next state alone, 1 is the Monte Carlo return.
        #[serde(serialize_with = "short::one")]
        lambda: f32,
        /// The step's progress: its GAE advantage, the promise gained over the state before it.
        #[serde(serialize_with = "short::one")]
        progress: f32,
    },
}

/// The value of a label: a hard rating or a soft probability that the step is correct.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LabelValue {
    /// A hard rating.
    Hard {
        /// The rating.
        rating: Rating,
    },
    /// A soft label: the estimated probability that the step is correct (e.g. an MC value).
    Soft {
        /// Probability in [0, 1].
        #[serde(serialize_with = "short::one")]
        p: f32,
    },
}

/// A supervision label on one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepLabel {
    /// Hard or soft value.
    #[serde(flatten)]
    pub value: LabelValue,
    /// Who produced it.
    #[serde(default, skip_serializing_if = "is_unknown")]
    pub source: Provenance,
}

fn is_unknown(p: &Provenance) -> bool {
    matches!(p, Provenance::Unknown)
}

impl StepLabel {
    /// A hard label.
    pub fn hard(rating: Rating, source: Provenance) -> Self {
        StepLabel {
            value: LabelValue::Hard { rating },
            source,
        }
    }

    /// A hard good/bad label from a boolean.
    pub fn from_bool(good: bool, source: Provenance) -> Self {
        Self::hard(if good { Rating::Good } else { Rating::Bad }, source)
    }

    /// A soft label.
    pub fn soft(p: f32, source: Provenance) -> Self {
        StepLabel {
            value: LabelValue::Soft { p },
            source,
        }
    }

    /// The hard rating if this is a hard label.
    pub fn rating(&self) -> Option<Rating> {
        match self.value {
            LabelValue::Hard { rating } => Some(rating),
            LabelValue::Soft { .. } => None,
        }
    }

    /// Probability that the step is good: 1/0 for good/bad, `neutral` for neutral, p for soft.
    pub fn prob(&self, neutral: f32) -> f32 {
        match self.value {
            LabelValue::Hard { rating: Rating::Good } => 1.0,
            LabelValue::Hard { rating: Rating::Bad } => 0.0,
            LabelValue::Hard {
                rating: Rating::Neutral,
            } => neutral,
            LabelValue::Soft { p } => p,
        }
    }

    /// Binary verdict: good unless bad; neutral counts as good (PRM800K's convention), soft
    /// labels are good when `p > 0` (Math-Shepherd hard estimation: any rollout succeeded).
    pub fn is_good(&self) -> bool {
        match self.value {
            LabelValue::Hard { rating } => rating != Rating::Bad,
            LabelValue::Soft { p } => p > 0.0,
        }
    }
}

/// Most steps one solution may have. Real chains have tens to hundreds (ProcessBench's longest
/// has under 100); a record past this is refused rather than held, so a file's memory stays in
/// proportion to a sane record, whatever a broken or hostile file holds.
pub const MAX_STEPS: usize = 100_000;

impl Solution {
    /// Values outside their domain, with the field's path: more than [`MAX_STEPS`] steps, a soft
    /// label that is not a probability in [0, 1], a step score that is not a finite number.
    pub fn check_values(&self) -> Result<(), crate::FieldError> {
        if self.steps.len() > MAX_STEPS {
            return Err(crate::FieldError::new(
                "steps",
                format!(
                    "{} steps; a solution may have at most {MAX_STEPS} (is this one step per character or per token?)",
                    self.steps.len()
                ),
            ));
        }
        for (i, step) in self.steps.iter().enumerate() {
            if let Some(LabelValue::Soft { p }) = step.label.as_ref().map(|l| l.value) {
                if !(0.0..=1.0).contains(&p) {
                    return Err(crate::FieldError::new(
                        format!("steps[{i}].label.p"),
                        format!("{p} is not a probability in [0, 1]"),
                    ));
                }
            }
            if let Some(x) = step.score.filter(|x| !x.is_finite()) {
                return Err(crate::FieldError::new(
                    format!("steps[{i}].score"),
                    format!("{x} is not a finite number"),
                ));
            }
        }
        for (name, scores) in &self.scores {
            if let Some((j, x)) = scores.iter().enumerate().find(|(_, x)| !x.is_finite()) {
                return Err(crate::FieldError::new(
                    format!("scores.{name}[{j}]"),
                    format!("{x} is not a finite number"),
                ));
            }
        }
        Ok(())
    }

    /// Index of the first step whose label is bad, if any.
    pub fn first_error(&self) -> Option<usize> {
        self.steps
            .iter()
            .position(|s| s.label.as_ref().is_some_and(|l| !l.is_good()))
    }

    /// Whether every step carries a label.
    pub fn fully_labelled(&self) -> bool {
        self.steps.iter().all(|s| s.label.is_some())
    }

    /// The step texts.
    pub fn step_texts(&self) -> Vec<&str> {
        self.steps.iter().map(|s| s.text.as_str()).collect()
    }

    /// Whether this is an agent's trajectory: some step carries the environment's observation.
    pub fn is_trajectory(&self) -> bool {
        self.steps.iter().any(|s| s.observation.is_some())
    }

    /// The steps as a policy or scorer reads them: each step's text, followed by what the
    /// environment answered (see [`render_turn`]) in a trajectory; the step texts otherwise.
    pub fn turn_strings(&self) -> Vec<String> {
        self.steps
            .iter()
            .map(|s| render_turn(&s.text, s.observation.as_deref()))
            .collect()
    }

    /// The step texts, owned.
    pub fn step_strings(&self) -> Vec<String> {
        self.steps.iter().map(|s| s.text.clone()).collect()
    }

    /// Record `verifier`'s step scores (one per step).
    pub fn set_scores(&mut self, verifier: &str, scores: Vec<f32>) {
        self.scores.insert(verifier.to_string(), scores);
    }

    /// `verifier`'s step scores, one per step: from [`Solution::scores`], else, for a file whose
    /// scores sit on its steps (`steps[].score`, as other tools and earlier versions write them),
    /// those when every step has one. `None` when there are none, or not one per step.
    pub fn scores_of(&self, verifier: &str) -> Option<Vec<f32>> {
        match self.scores.get(verifier) {
            Some(s) => (s.len() == self.steps.len()).then(|| s.clone()),
            None if self.scores.is_empty() && !self.steps.is_empty() => self.steps.iter().map(|s| s.score).collect(),
            None => None,
        }
    }
}

/// What marks the environment's answer inside a rendered turn, as ReAct-style agents write it
/// (AgentInstruct, AgentBank): `take key\nObservation: You take the key.`
pub const OBSERVATION_MARK: &str = "\nObservation: ";

/// One turn of a trajectory as text a policy continues and a scorer reads: the action, then the
/// observation after [`OBSERVATION_MARK`]; the action alone when there is none.
pub fn render_turn(action: &str, observation: Option<&str>) -> String {
    match observation {
        Some(o) => format!("{action}{OBSERVATION_MARK}{o}"),
        None => action.to_string(),
    }
}

/// Single-precision numbers written as the shortest decimal that reads back as them: `0.3` as
/// it was written, not its widening to `0.30000001192092896`, in text and in a
/// `serde_json::Value` alike (Python sees what the file says).
mod short {
    use serde::Serializer;
    use std::collections::BTreeMap;

    /// `x` as the double its shortest decimal names.
    pub fn widen(x: f32) -> f64 {
        if x.is_finite() {
            x.to_string().parse().unwrap_or(x as f64)
        } else {
            x as f64
        }
    }

    pub fn one<S: Serializer>(x: &f32, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(widen(*x))
    }

    pub fn option<S: Serializer>(x: &Option<f32>, s: S) -> Result<S::Ok, S::Error> {
        match x {
            Some(x) => s.serialize_some(&widen(*x)),
            None => s.serialize_none(),
        }
    }

    pub fn by_name<S: Serializer>(m: &BTreeMap<String, Vec<f32>>, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(
            m.iter()
                .map(|(k, v)| (k, v.iter().map(|x| widen(*x)).collect::<Vec<f64>>())),
        )
    }
}
