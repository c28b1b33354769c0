//! Readers and writers for the step-supervision formats the field uses.
//!
//! Every format maps one record (a JSON value) to one or more [`Solution`]s and back. Fields the
//! [`Solution`] has no slot for are kept in `meta`, so converting a file to stepwise's own format
//! and back reproduces it. [`Format::drops`] says what converting *into* a format loses.

mod humaneval;
mod math_shepherd;
mod omegaprm;
mod prm800k;
mod prmbench;
mod processbench;
mod rlhflow;
mod trajectory;
mod trl;

pub use prm800k::written_steps as prm800k_written_steps;

use crate::error::FieldError;
use crate::record::Solution;
use serde_json::Value;
use std::fmt;
use std::str::FromStr;

/// A dataset format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// stepwise's own JSONL of [`Solution`] records.
    Stepwise,
    /// OpenAI PRM800K (phase 1 and 2): per-step completions rated -1/0/1 by humans.
    Prm800k,
    /// Math-Shepherd: `input` with ` ки` after each step and `label` with `+`/`-` in their place.
    MathShepherd,
    /// OpenR's training layout of Math-Shepherd data: `{question, process, labels: [1, 0]}`.
    OpenrPrm,
    /// TRL's stepwise supervision layout: `{prompt, completions, labels}`.
    Trl,
    /// ProcessBench: `{id, generator, problem, steps, final_answer_correct, label}`.
    ProcessBench,
    /// OpenR's OmegaPRM output, flat: `reasoning_steps: [{solution_prefix, mc_value}]`.
    OmegaPrm,
    /// OpenR's OmegaPRM output as a tree: `reasoning_steps: {text, mc_value, children}`.
    OmegaPrmTree,
    /// RLHFlow chat: user turns are steps, assistant turns are `+`/`-`.
    Rlhflow,
    /// PRMBench: `{idx, modified_question, modified_process, error_steps, classification}`.
    PrmBench,
    /// HumanEval: `{task_id, prompt, entry_point, canonical_solution, test}`; steps are lines.
    HumanEval,
    /// An agent's trajectory as OpenAI chat `messages`: the task, then assistant turns (with
    /// `tool_calls`) each answered by `tool` results or a `user` turn, the observation.
    Messages,
    /// An agent's trajectory as ShareGPT `conversations` (`from`/`value`), as AgentInstruct and
    /// AgentBank publish ALFWorld and WebShop: `gpt` actions, `human` observations.
    Conversations,
}

/// Every format, in the order `--help` lists them.
pub const ALL_FORMATS: [Format; 13] = [
    Format::Stepwise,
    Format::Prm800k,
    Format::MathShepherd,
    Format::OpenrPrm,
    Format::Trl,
    Format::ProcessBench,
    Format::OmegaPrm,
    Format::OmegaPrmTree,
    Format::Rlhflow,
    Format::PrmBench,
    Format::HumanEval,
    Format::Messages,
    Format::Conversations,
];

impl Format {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Format::Stepwise => "stepwise",
            Format::Prm800k => "prm800k",
            Format::MathShepherd => "math-shepherd",
            Format::OpenrPrm => "openr-prm",
            Format::Trl => "trl",
            Format::ProcessBench => "processbench",
            Format::OmegaPrm => "omegaprm",
            Format::OmegaPrmTree => "omegaprm-tree",
            Format::Rlhflow => "rlhflow",
            Format::PrmBench => "prmbench",
            Format::HumanEval => "humaneval",
            Format::Messages => "messages",
            Format::Conversations => "conversations",
        }
    }

    /// Guess the format from a file's first record.
    pub fn detect(v: &Value) -> Option<Format> {
        let o = v.as_object()?;
        let has = |k: &str| o.contains_key(k);
        let steps_are_objects = o
            .get("steps")
            .and_then(|s| s.as_array())
            .is_some_and(|a| a.iter().all(Value::is_object));
        Some(if has("modified_process") && has("error_steps") {
            Format::PrmBench
        } else if has("task_id") && has("canonical_solution") && has("entry_point") {
            Format::HumanEval
        } else if has("steps") && steps_are_objects && !has("problem") {
            Format::Stepwise
        } else if has("label") && o.get("label")?.get("steps").is_some() {
            Format::Prm800k
        } else if has("input") && has("label") {
            Format::MathShepherd
        } else if has("process") && has("labels") {
            Format::OpenrPrm
        } else if has("prompt") && has("completions") {
            Format::Trl
        } else if has("problem") && has("steps") {
            Format::ProcessBench
        } else if has("reasoning_steps") {
            if o.get("reasoning_steps")?.is_array() {
                Format::OmegaPrm
            } else {
                Format::OmegaPrmTree
            }
        } else if has("conversations") || has("messages") {
            if !trajectory::is_trajectory(o) {
                Format::Rlhflow
            } else if has("conversations") && o["conversations"].get(0).is_some_and(|t| t.get("from").is_some()) {
                Format::Conversations
            } else {
                Format::Messages
            }
        } else {
            return None;
        })
    }

    /// Whether the writer needs all solutions of one problem together (one record holds many).
    pub fn groups_by_problem(self) -> bool {
        matches!(self, Format::OmegaPrm | Format::OmegaPrmTree)
    }

    /// Read one record. `index` is the record's 0-based position in its file, used for ids.
    pub fn read(self, v: &Value, index: usize) -> Result<Vec<Solution>, FieldError> {
        match self {
            Format::Stepwise => read_stepwise(v).map(|s| vec![s]),
            Format::Prm800k => prm800k::read(v, index).map(|s| vec![s]),
            Format::MathShepherd => math_shepherd::read(v, index).map(|s| vec![s]),
            Format::OpenrPrm => math_shepherd::read_openr(v, index).map(|s| vec![s]),
            Format::Trl => trl::read(v, index).map(|s| vec![s]),
            Format::ProcessBench => processbench::read(v, index).map(|s| vec![s]),
            Format::OmegaPrm => omegaprm::read_flat(v, index),
            Format::OmegaPrmTree => omegaprm::read_tree(v, index),
            Format::Rlhflow => rlhflow::read(v, index).map(|s| vec![s]),
            Format::PrmBench => prmbench::read(v, index).map(|s| vec![s]),
            Format::HumanEval => humaneval::read(v, index).map(|s| vec![s]),
            Format::Messages => trajectory::read(trajectory::Layout::Messages, v, index).map(|s| vec![s]),
            Format::Conversations => trajectory::read(trajectory::Layout::Conversations, v, index).map(|s| vec![s]),
        }
    }

    /// Write solutions as records of this format. For formats that
    /// [group by problem](Format::groups_by_problem), `group` holds the solutions of one problem.
    pub fn write(self, group: &[Solution]) -> Result<Vec<Value>, FieldError> {
        match self {
            Format::OmegaPrm => Ok(vec![omegaprm::write_flat(group)]),
            Format::OmegaPrmTree => Ok(vec![omegaprm::write_tree(group)]),
            _ => group.iter().map(|s| self.write_one(s)).collect(),
        }
    }

    /// Write every solution of `sols` (in order; a format that groups a problem's solutions
    /// writes one record per run of solutions to the same problem).
    pub fn write_all(self, sols: &[Solution]) -> Result<Vec<Value>, FieldError> {
        let groups: Vec<&[Solution]> = if self.groups_by_problem() {
            sols.chunk_by(|a, b| a.problem_id == b.problem_id).collect()
        } else {
            sols.chunks(1).collect()
        };
        let mut out = Vec::with_capacity(sols.len());
        for g in groups {
            out.extend(
                self.write(g)
                    .map_err(|e| FieldError::new("", format!("solution `{}` as {}: {e}", g[0].id, self.name())))?,
            );
        }
        Ok(out)
    }

    fn write_one(self, s: &Solution) -> Result<Value, FieldError> {
        Ok(match self {
            Format::Stepwise => serde_json::to_value(s).map_err(|e| FieldError::new("", e.to_string()))?,
            Format::Prm800k => prm800k::write(s),
            Format::MathShepherd => math_shepherd::write(s),
            Format::OpenrPrm => math_shepherd::write_openr(s),
            Format::Trl => trl::write(s),
            Format::ProcessBench => processbench::write(s),
            Format::Rlhflow => rlhflow::write(s),
            Format::PrmBench => prmbench::write(s),
            Format::HumanEval => humaneval::write(s),
            Format::Messages => trajectory::write(trajectory::Layout::Messages, s)?,
            Format::Conversations => trajectory::write(trajectory::Layout::Conversations, s)?,
            Format::OmegaPrm | Format::OmegaPrmTree => {
                unreachable!("grouped formats are written by Format::write")
            }
        })
    }

    /// What converting a stepwise record into this format loses.
    pub fn drops(self) -> &'static str {
        match self {
            Format::Stepwise => "nothing",
            Format::Prm800k => "soft labels (written as rating 1 when p > 0, else -1) and step scores",
            Format::MathShepherd | Format::OpenrPrm | Format::Trl | Format::Rlhflow => {
                "neutral ratings (written as good), soft values (good when p > 0), label provenance and step scores; \
                 unlabelled steps are written good before the first bad step and bad after it"
            }
            Format::ProcessBench => {
                "every label after the first bad step, soft values (good when p > 0), provenance and step scores; \
                 an unknown outcome is written final_answer_correct = (no step is bad)"
            }
            Format::OmegaPrm | Format::OmegaPrmTree => {
                "hard ratings (written as mc_value 1 or 0; neutral as 1), provenance and step scores"
            }
            Format::HumanEval => "every label and score (HumanEval has none): code and tests only",
            Format::Messages | Format::Conversations => {
                "neutral ratings (written as good), soft values (good when p > 0), provenance and step scores; \
                 several tool results after one turn are joined into one; a solution with no observations \
                 between its steps is not a trajectory and is refused"
            }
            Format::PrmBench => {
                "neutral ratings and unlabelled steps (written as not erroneous), soft values (erroneous when p = 0), \
                 provenance and step scores"
            }
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ALL_FORMATS
            .iter()
            .copied()
            .find(|f| f.name() == s.to_ascii_lowercase().replace('_', "-"))
            .ok_or_else(|| {
                let names: Vec<_> = ALL_FORMATS.iter().map(|f| f.name()).collect();
                format!("unknown format `{s}`; known formats: {}", names.join(", "))
            })
    }
}

/// A stable short id for a question text (FNV-1a 64, hex), so solutions of one problem share it.
pub fn problem_id_for(question: &str) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in question.as_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("q{h:016x}")
}

/// Binary labels for writing into formats that only hold good/bad: a label's verdict where there
/// is one; unlabelled steps are good before the first bad step and bad after it.
pub(crate) fn binary_labels(s: &Solution) -> Vec<bool> {
    let mut seen_bad = false;
    s.steps
        .iter()
        .map(|st| {
            let good = match &st.label {
                Some(l) => l.is_good(),
                None => !seen_bad,
            };
            seen_bad |= !good;
            good
        })
        .collect()
}

/// Copy `meta` entries into a record object, skipping keys the record already has and keys
/// that belong to another format (prefixed `_`).
pub(crate) fn extend_with_meta(obj: &mut serde_json::Map<String, Value>, s: &Solution) {
    for (k, v) in &s.meta {
        if !k.starts_with('_') && !obj.contains_key(k) {
            obj.insert(k.clone(), v.clone());
        }
    }
}

/// Split a `question + " " + "Step 1: ..."` string into question and first step at `Step 1`;
/// without that marker the question cannot be told apart and comes back empty.
pub(crate) fn split_question(first: &str) -> (String, String) {
    if let Some(i) = first.find("Step 1") {
        return (first[..i].trim_end().to_string(), first[i..].to_string());
    }
    (String::new(), first.to_string())
}

/// Question and first step from the text before the first step boundary: at an explicit
/// `question` field (writers add one when the steps carry no `Step 1` marker), else at `Step 1`.
pub(crate) fn split_first(o: &serde_json::Map<String, Value>, first: &str) -> Result<(String, String), FieldError> {
    match crate::json::opt_str(o, "question")? {
        Some(q) => match first.strip_prefix(q.as_str()) {
            Some(rest) => Ok((q, rest.trim().to_string())),
            None => Err(FieldError::new(
                "question",
                "the first step's text does not start with it",
            )),
        },
        None => Ok(split_question(first)),
    }
}

/// Whether `question + " " + step 1` could not be split back without a `question` field.
pub(crate) fn needs_question_field(s: &Solution) -> bool {
    let first = s.steps.first().map_or("", |st| st.text.as_str());
    !s.question.is_empty() && split_question(&format!("{} {first}", s.question)).0 != s.question
}

/// A stepwise record. Top-level fields stepwise does not know are kept in `meta` (a field
/// already there wins), so reading and writing a file loses nothing.
/// The field of a stepwise record that keeps it from reading (`steps[2]` for a bad step): the
/// first whose neutral stand-in makes the rest read. Empty when no one field is to blame.
fn failing_field(v: &Value, known: &[&str]) -> String {
    let Some(o) = v.as_object() else {
        return String::new();
    };
    for (k, x) in o.iter().filter(|(k, _)| known.contains(&k.as_str())) {
        let mut rest = o.clone();
        match k.as_str() {
            "steps" => rest.insert(k.clone(), Value::Array(Vec::new())),
            "id" | "problem_id" | "question" => rest.insert(k.clone(), Value::String(String::new())),
            _ => rest.remove(k),
        };
        if serde_json::from_value::<Solution>(Value::Object(rest)).is_ok() {
            let bad_step = x.as_array().and_then(|steps| {
                steps
                    .iter()
                    .position(|st| serde_json::from_value::<crate::record::Step>(st.clone()).is_err())
            });
            return match (k.as_str(), bad_step) {
                ("steps", Some(i)) => format!("steps[{i}]"),
                _ => k.clone(),
            };
        }
    }
    String::new()
}

fn read_stepwise(v: &Value) -> Result<Solution, FieldError> {
    const KNOWN: [&str; 10] = [
        "id",
        "problem_id",
        "question",
        "steps",
        "final_answer",
        "gold_answer",
        "correct",
        "generator",
        "scores",
        "meta",
    ];
    let mut s: Solution =
        serde_json::from_value(v.clone()).map_err(|e| FieldError::new(failing_field(v, &KNOWN), e.to_string()))?;
    if let Some(fields) = v.as_object() {
        for (k, x) in fields.iter().filter(|(k, _)| !KNOWN.contains(&k.as_str())) {
            s.meta.entry(k.clone()).or_insert_with(|| x.clone());
        }
    }
    Ok(s)
}
