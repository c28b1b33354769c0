//! Preference pairs read back for training (`stepwise dpo`): any layout `stepwise pairs` writes
//! ([`crate::pairs::Layout`]), or step-labelled records, mined on the way as `stepwise pairs`
//! mines them. The layout is told from the first record's fields:
//!
//! - `question` and `prefix` (a list of steps): stepwise's own;
//! - `initial_reason_steps`: Step-DPO's (`xinlai/Math-Step-DPO-10K`); the prefix is that text
//!   split at the separator;
//! - `prompt`, `chosen` and `rejected`: TRL's, the prompt taken as text as it stands;
//! - anything else stepwise reads as solutions: step-labelled records.

use crate::error::{Error, FieldError, RecordError, Result};
use crate::io::{raw_records, RawRecord};
use crate::json::{object, opt_bool, str_array, str_field};
use crate::pairs::{step_pairs, PairStats, StepPair};
use crate::SolutionReader;
use serde_json::{Map, Value};
use std::path::Path;

/// What the completions follow.
#[derive(Debug, Clone, PartialEq)]
pub enum PairPrompt {
    /// A question and the steps so far, to be laid out as the policy's prompt is.
    Steps {
        /// The question.
        question: String,
        /// The steps before the compared ones.
        prefix: Vec<String>,
    },
    /// A prompt already laid out as text (TRL's layout).
    Text(String),
}

/// One preference pair as a trainer takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct PreferencePair {
    /// The pair's id (`stepwise` layout), else `LINE` of the file it came from.
    pub id: String,
    /// What both completions follow.
    pub prompt: PairPrompt,
    /// The preferred completion.
    pub chosen: String,
    /// The dispreferred one.
    pub rejected: String,
    /// Whether the chosen completion ends the solution (the end token follows it, not the
    /// separator).
    pub chosen_ends: bool,
    /// Whether the rejected one does.
    pub rejected_ends: bool,
}

impl From<StepPair> for PreferencePair {
    fn from(p: StepPair) -> Self {
        PreferencePair {
            id: p.id,
            prompt: PairPrompt::Steps {
                question: p.question,
                prefix: p.prefix,
            },
            chosen: p.chosen,
            rejected: p.rejected,
            chosen_ends: p.chosen_ends,
            rejected_ends: p.rejected_ends,
        }
    }
}

/// Which of the layouts a record is in.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Stepwise,
    StepDpo,
    Trl,
    Labelled,
}

fn kind_of(obj: &Map<String, Value>) -> Kind {
    let has = |k: &str| obj.contains_key(k);
    if has("initial_reason_steps") {
        Kind::StepDpo
    } else if has("prefix") && has("question") && has("chosen") {
        Kind::Stepwise
    } else if has("prompt") && has("chosen") && has("rejected") {
        Kind::Trl
    } else {
        Kind::Labelled
    }
}

/// How the pairs of a file were found: read as pairs, or mined from labelled records (with what
/// mining saw).
#[derive(Debug, Clone, PartialEq)]
pub enum Origin {
    /// Records of a pair layout: `"stepwise"`, `"step-dpo"` or `"trl"`.
    Pairs(&'static str),
    /// Step-labelled records mined for pairs.
    Mined(PairStats),
}

/// The pairs in `path` (module docs); labelled records are mined with `chosen_min`
/// ([`step_pairs`]), and Step-DPO's `initial_reason_steps` is split at `separator`. A record
/// that is not a pair of the file's layout is an error naming its line and field.
pub fn read_preference_pairs(path: &Path, chosen_min: f32, separator: &str) -> Result<(Vec<PreferencePair>, Origin)> {
    let mut records = raw_records(path)?.peekable();
    let layout = match records.peek() {
        Some((_, Ok(v))) => pair_layout(v),
        _ => None,
    };
    match layout {
        None => {
            drop(records);
            let sols = SolutionReader::open(path, None)?.collect::<Result<Vec<_>, _>>()?;
            let (pairs, stats) = step_pairs(&sols, chosen_min);
            Ok((
                pairs.into_iter().map(PreferencePair::from).collect(),
                Origin::Mined(stats),
            ))
        }
        Some(name) => Ok((pairs_of_records(records, path, separator)?, Origin::Pairs(name))),
    }
}

/// The pair layout a record is in (`"stepwise"`, `"step-dpo"` or `"trl"`; module docs), or
/// `None`: a step-labelled record, or none stepwise reads.
pub fn pair_layout(record: &Value) -> Option<&'static str> {
    match record.as_object().map(kind_of)? {
        Kind::Stepwise => Some("stepwise"),
        Kind::StepDpo => Some("step-dpo"),
        Kind::Trl => Some("trl"),
        Kind::Labelled => None,
    }
}

/// `records` (1-based positions, as [`raw_records`] gives them) read as pairs of the first
/// record's layout; `file` names them in errors.
pub fn pairs_of_records(
    records: impl Iterator<Item = RawRecord>,
    file: &Path,
    separator: &str,
) -> Result<Vec<PreferencePair>> {
    let mut kind = None;
    let mut out = Vec::new();
    for (line, rec) in records {
        let at = |source: RecordError| Error::Record {
            file: file.to_path_buf(),
            line,
            source,
        };
        let value = rec.map_err(at)?;
        let k = *kind.get_or_insert_with(|| value.as_object().map_or(Kind::Labelled, kind_of));
        out.push(pair_of(&value, k, line, separator).map_err(|e| at(e.into()))?);
    }
    Ok(out)
}

/// One record of layout `kind` (read at `line`) as a pair.
fn pair_of(value: &Value, kind: Kind, line: usize, separator: &str) -> Result<PreferencePair, FieldError> {
    let obj = object(value, "")?;
    let text = |k: &str| str_field(obj, k).map(str::to_string);
    let (id, prompt) = match kind {
        Kind::Labelled => {
            return Err(FieldError::new(
                "chosen",
                "missing: not a preference pair (stepwise, step-dpo or trl layout)",
            ))
        }
        Kind::Stepwise => (
            text("id").unwrap_or_else(|_| line.to_string()),
            PairPrompt::Steps {
                question: text("question")?,
                prefix: str_array(obj, "prefix")?,
            },
        ),
        Kind::StepDpo => (
            line.to_string(),
            PairPrompt::Steps {
                question: text("prompt")?,
                prefix: split_steps(str_field(obj, "initial_reason_steps")?, separator),
            },
        ),
        Kind::Trl => (line.to_string(), PairPrompt::Text(text("prompt")?)),
    };
    let (chosen, rejected) = (text("chosen")?, text("rejected")?);
    if chosen == rejected {
        return Err(FieldError::new("rejected", "the same text as `chosen`: no preference"));
    }
    Ok(PreferencePair {
        id,
        prompt,
        chosen,
        rejected,
        chosen_ends: opt_bool(obj, "chosen_ends")?.unwrap_or(false),
        rejected_ends: opt_bool(obj, "rejected_ends")?.unwrap_or(false),
    })
}

/// `text`'s steps, each having been followed by `separator` (empty pieces dropped).
fn split_steps(text: &str, separator: &str) -> Vec<String> {
    if separator.is_empty() {
        return vec![text.to_string()].into_iter().filter(|s| !s.is_empty()).collect();
    }
    text.split(separator)
        .filter(|s| !s.trim().is_empty())
        .map(str::to_string)
        .collect()
}
