//! Errors that name the file, the line and the field at fault.

use std::fmt;
use std::path::PathBuf;

/// A problem with one field of one record.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// JSON path of the field, e.g. `label.steps[2].rating`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl FieldError {
    /// A new field error.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }

    /// Prefix the field path with a parent (`parent.field`).
    pub fn within(mut self, parent: &str) -> Self {
        self.field = if self.field.is_empty() {
            parent.to_string()
        } else if self.field.starts_with('[') {
            format!("{parent}{}", self.field)
        } else {
            format!("{parent}.{}", self.field)
        };
        self
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "field `{}`: {}", self.field, self.message)
        }
    }
}

/// An error while reading or writing a data file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A record could not be understood.
    #[error("{}:{line}: {source}", file.display())]
    Record {
        /// The file.
        file: PathBuf,
        /// 1-based line number (for JSON arrays: the record's index + 1).
        line: usize,
        /// What went wrong.
        source: RecordError,
    },
    /// An I/O failure.
    #[error("{}: {source}", file.display())]
    Io {
        /// The file.
        file: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Anything else, with the file it concerns.
    #[error("{}: {message}", file.display())]
    Other {
        /// The file.
        file: PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// Why one record failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RecordError {
    /// The line is not valid JSON.
    #[error("invalid JSON: {0}")]
    Json(String),
    /// A Parquet row group cannot be read (corrupt data, a failed page checksum).
    #[error("unreadable Parquet data (the row group from here on): {0}")]
    Parquet(String),
    /// A field is missing or has the wrong type or value.
    #[error("{0}")]
    Field(FieldError),
    /// The record is JSON, but of no format stepwise can tell from its fields.
    #[error("{0}")]
    Format(String),
    /// A line longer than any record ([`crate::io::MAX_LINE_BYTES`]): a binary file, a device,
    /// or JSON without line breaks. Reading the file stops there.
    #[error("a line longer than {0} MiB: not a JSON Lines record (a binary file, a device, or JSON without line breaks); reading stops here")]
    TooLong(usize),
}

impl From<FieldError> for RecordError {
    fn from(e: FieldError) -> Self {
        RecordError::Field(e)
    }
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
