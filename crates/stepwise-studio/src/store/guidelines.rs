//! A project's labelling guidelines: the text every labeller reads before rating (PRM800K's
//! labellers worked from a written guide), shown on the page and replaced whenever an admin
//! edits them; unlike the settings, they may change while a project runs.

use super::{Project, Store};
use crate::time::now;
use anyhow::{ensure, Result};
use rusqlite::{params, OptionalExtension};
use serde::Serialize;

/// Most bytes guidelines may hold (they travel in one request under the API's 64 KiB body limit).
pub const MAX_GUIDELINES_BYTES: usize = 60_000;

/// A project's guidelines as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Guidelines {
    /// The text (plain text; `$…$` math is typeset on the page).
    pub text: String,
    /// When they were last set (Unix seconds).
    pub updated: f64,
    /// Who set them: an admin's user name, `command line` or `python`.
    pub set_by: String,
}

impl Store {
    /// `project`'s guidelines (`None` until some are set).
    pub fn guidelines(&self, project: &Project) -> Result<Option<Guidelines>> {
        Ok(self
            .db
            .query_row(
                "SELECT text, updated, set_by FROM guidelines WHERE project_id = ?1",
                [project.id],
                |r| {
                    Ok(Guidelines {
                        text: r.get(0)?,
                        updated: r.get(1)?,
                        set_by: r.get(2)?,
                    })
                },
            )
            .optional()?)
    }

    /// Replaces `project`'s guidelines with `text`, set by `set_by`; returns when. Empty (or
    /// blank) text removes them.
    pub fn set_guidelines(&mut self, project: &Project, text: &str, set_by: &str) -> Result<f64> {
        ensure!(
            text.len() <= MAX_GUIDELINES_BYTES,
            "guidelines of {} bytes: at most {MAX_GUIDELINES_BYTES}",
            text.len()
        );
        ensure!(!text.contains('\0'), "guidelines may not contain a NUL character");
        let at = now();
        if text.trim().is_empty() {
            self.db
                .execute("DELETE FROM guidelines WHERE project_id = ?1", [project.id])?;
            return Ok(at);
        }
        self.db.execute(
            "INSERT INTO guidelines (project_id, text, updated, set_by) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (project_id) DO UPDATE SET text = ?2, updated = ?3, set_by = ?4",
            params![project.id, text, at, set_by],
        )?;
        Ok(at)
    }
}
