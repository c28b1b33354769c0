//! The studio's store: one SQLite file (WAL, `synchronous = FULL`), so a rating the page shows
//! as saved is on disk and survives the server's `kill -9` (and a power cut).
//!
//! Tables: `projects` (settings as JSON), `records` (a stepwise [`Solution`] as JSON, whether it
//! is a gold quality-control record, its queue priority and the generation that set it),
//! `users` and `sessions`, `assignments` (a record given to a labeller: when, the generation,
//! whether the PRM's suggestions were shown, how it finished), `ratings` (one per assignment and
//! step: −1/0/+1, a comment, when, the suggestion shown), `adjudications` (a reviewer's word) and
//! `guidelines` (a project's instructions to its labellers).

mod guidelines;
mod labels;
mod review;
mod users;

pub use guidelines::{Guidelines, MAX_GUIDELINES_BYTES};
pub(crate) use labels::alternatives;
pub use labels::{Labelled, RatingInput, RecordView, Saved, StepView, HISTORY_LIMIT};
pub use review::{Dashboard, LabellerStats, Labelling, ReviewView};
pub use users::{LoginError, SessionUser, SESSION_SECONDS};

use crate::select;
use crate::settings::Settings;
use anyhow::{bail, Context, Result};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;
use stepwise_core::record::Solution;

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS projects (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    settings TEXT NOT NULL,
    generation INTEGER NOT NULL DEFAULT 0,
    seed INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY,
    project_id INTEGER NOT NULL REFERENCES projects(id),
    ext_id TEXT NOT NULL,
    solution TEXT NOT NULL,
    n_steps INTEGER NOT NULL,
    gold INTEGER NOT NULL DEFAULT 0,
    priority REAL NOT NULL DEFAULT 0,
    generation INTEGER NOT NULL DEFAULT 0,
    selected_by TEXT NOT NULL DEFAULT '',
    n_assigned INTEGER NOT NULL DEFAULT 0,
    open INTEGER NOT NULL DEFAULT 1,
    UNIQUE (project_id, ext_id)
);
CREATE INDEX IF NOT EXISTS records_queue ON records (project_id, priority DESC) WHERE gold = 0 AND open = 1;
CREATE INDEX IF NOT EXISTS records_gold ON records (project_id, gold);
CREATE TABLE IF NOT EXISTS users (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    role TEXT NOT NULL,
    password TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    token_sha256 TEXT PRIMARY KEY,
    user_id INTEGER NOT NULL REFERENCES users(id),
    expires REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS assignments (
    id INTEGER PRIMARY KEY,
    record_id INTEGER NOT NULL REFERENCES records(id),
    user_id INTEGER NOT NULL REFERENCES users(id),
    generation INTEGER NOT NULL,
    assist INTEGER NOT NULL,
    started REAL NOT NULL,
    finished REAL,
    finish_reason TEXT,
    UNIQUE (record_id, user_id)
);
CREATE INDEX IF NOT EXISTS assignments_user ON assignments (user_id, finished);
CREATE TABLE IF NOT EXISTS ratings (
    assignment_id INTEGER NOT NULL REFERENCES assignments(id),
    step INTEGER NOT NULL,
    rating INTEGER,
    comment TEXT NOT NULL DEFAULT '',
    at REAL NOT NULL,
    suggestion REAL,
    PRIMARY KEY (assignment_id, step)
);
CREATE TABLE IF NOT EXISTS adjudications (
    record_id INTEGER NOT NULL REFERENCES records(id),
    step INTEGER NOT NULL,
    rating INTEGER NOT NULL,
    reviewer_id INTEGER NOT NULL REFERENCES users(id),
    at REAL NOT NULL,
    PRIMARY KEY (record_id, step)
);
CREATE TABLE IF NOT EXISTS corrections (
    assignment_id INTEGER NOT NULL REFERENCES assignments(id),
    step INTEGER NOT NULL,
    text TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (assignment_id, step)
);
CREATE TABLE IF NOT EXISTS guidelines (
    project_id INTEGER PRIMARY KEY REFERENCES projects(id),
    text TEXT NOT NULL,
    updated REAL NOT NULL,
    set_by TEXT NOT NULL
);
"#;

/// A project as stored.
#[derive(Debug, Clone)]
pub struct Project {
    /// Row id.
    pub id: i64,
    /// Its name (unique).
    pub name: String,
    /// How it is labelled.
    pub settings: Settings,
    /// The current generation (0 until the first `next-generation`).
    pub generation: i64,
    /// The uniform policy's shuffle seed.
    pub seed: u64,
}

/// One record to add: the solution and whether it is a gold quality-control record (its own
/// step labels are the gold ratings).
pub struct NewRecord {
    /// The record.
    pub solution: Solution,
    /// Quality control: served to every labeller, their ratings compared with its labels.
    pub gold: bool,
}

impl NewRecord {
    /// `solutions` to add, gold or not.
    pub fn each(solutions: impl IntoIterator<Item = Solution>, gold: bool) -> Vec<NewRecord> {
        solutions
            .into_iter()
            .map(|solution| NewRecord { solution, gold })
            .collect()
    }
}

/// The studio's database.
pub struct Store {
    pub(crate) db: Connection,
    /// Held while a background thread checkpoints the write-ahead log (it stops when this goes).
    checkpointer: Option<std::sync::Arc<()>>,
}

/// How often the background checkpointer moves the write-ahead log into the database.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

impl Store {
    /// Opens (creating if needed) the store at `path`.
    pub fn open(path: &Path) -> Result<Store> {
        let db = Connection::open(path).with_context(|| format!("opening the studio database {}", path.display()))?;
        // A second process (an export while the server runs) waits for a write lock up to 5 s.
        db.busy_timeout(std::time::Duration::from_secs(5))?;
        let mode: String = db.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            bail!(
                "{}: SQLite refused write-ahead logging (journal_mode is {mode})",
                path.display()
            );
        }
        db.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")?;
        db.execute_batch(SCHEMA)
            .with_context(|| format!("creating the tables of {}", path.display()))?;
        Ok(Store { db, checkpointer: None })
    }

    /// Move write-ahead-log checkpoints off the committing connection: SQLite otherwise copies
    /// the log into the database (and syncs it) inside whichever commit crosses 1,000 pages,
    /// the slowest ratings a labeller waits for. A thread with its own connection checkpoints
    /// every 500 ms (PASSIVE: it never blocks a writer) until this store is dropped.
    pub fn checkpoint_in_background(&mut self) -> Result<()> {
        let path = self
            .db
            .path()
            .filter(|p| !p.is_empty())
            .context("an in-memory database has no log")?;
        let other = Connection::open(path)?;
        other.busy_timeout(std::time::Duration::from_secs(5))?;
        self.db.execute_batch("PRAGMA wal_autocheckpoint = 0")?;
        let alive = std::sync::Arc::new(());
        let watch = std::sync::Arc::downgrade(&alive);
        self.checkpointer = Some(alive);
        std::thread::Builder::new()
            .name("studio-checkpoint".into())
            .spawn(move || {
                while watch.upgrade().is_some() {
                    std::thread::sleep(CHECKPOINT_EVERY);
                    if let Err(e) = other.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                        eprintln!("stepwise studio: checkpointing the write-ahead log: {e}");
                    }
                }
            })?;
        Ok(())
    }

    /// Creates a project, or returns the existing one of that name (its settings unchanged:
    /// a project's settings are fixed once records are labelled under them).
    pub fn project_or_create(&mut self, name: &str, settings: &Settings, seed: u64) -> Result<Project> {
        if let Some(p) = self.project(name)? {
            return Ok(p);
        }
        self.db.execute(
            "INSERT INTO projects (name, settings, seed) VALUES (?1, ?2, ?3)",
            params![name, serde_json::to_string(settings)?, seed as i64],
        )?;
        self.project(name)?.context("the project just created")
    }

    /// The project called `name`.
    pub fn project(&self, name: &str) -> Result<Option<Project>> {
        self.db
            .query_row(
                "SELECT id, name, settings, generation, seed FROM projects WHERE name = ?1",
                [name],
                project_row,
            )
            .optional()?
            .transpose()
    }

    /// Every project, by name.
    pub fn projects(&self) -> Result<Vec<Project>> {
        let mut q = self
            .db
            .prepare("SELECT id, name, settings, generation, seed FROM projects ORDER BY name")?;
        let rows = q.query_map([], project_row)?;
        rows.map(|r| r?).collect()
    }

    /// The project of row id `id`.
    pub fn project_by_id(&self, id: i64) -> Result<Project> {
        self.db.query_row(
            "SELECT id, name, settings, generation, seed FROM projects WHERE id = ?1",
            [id],
            project_row,
        )?
    }

    /// Adds `records` to `project` in one transaction (all or none), ranked by the project's
    /// policy; a record whose id is already there is left as it is. Returns how many were new.
    pub fn add_records(&mut self, project: &Project, records: Vec<NewRecord>) -> Result<usize> {
        let tx = self.db.transaction()?;
        let mut added = 0;
        {
            let mut insert = tx.prepare(
                "INSERT OR IGNORE INTO records (project_id, ext_id, solution, n_steps, gold, priority, generation, selected_by)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?;
            for r in records {
                let (priority, why) = select::priority(project.settings.policy, project.seed, &r.solution);
                added += insert.execute(params![
                    project.id,
                    r.solution.id,
                    serde_json::to_string(&r.solution)?,
                    r.solution.steps.len() as i64,
                    r.gold,
                    priority,
                    project.generation,
                    why
                ])?;
            }
        }
        tx.commit()?;
        Ok(added)
    }

    /// The records of `project` that nobody has been given yet (those `next-generation` re-ranks).
    pub fn unassigned(&self, project: &Project) -> Result<Vec<(i64, Solution)>> {
        let mut q = self
            .db
            .prepare("SELECT id, solution FROM records WHERE project_id = ?1 AND gold = 0 AND n_assigned = 0")?;
        let rows = q.query_map([project.id], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))?;
        rows.map(|r| {
            let (id, text) = r?;
            Ok((id, serde_json::from_str(&text)?))
        })
        .collect()
    }

    /// Starts a new generation of `project`: the records nobody has been given are replaced
    /// by `rescored` (the same records with a new PRM's scores) and ranked again; what is
    /// labelled from now on records the new generation. Returns the generation.
    pub fn next_generation(&mut self, project: &Project, rescored: &[(i64, Solution)]) -> Result<i64> {
        let generation = project.generation + 1;
        let tx = self.db.transaction()?;
        {
            let mut update = tx.prepare(
                "UPDATE records SET solution = ?2, priority = ?3, generation = ?4, selected_by = ?5
                 WHERE id = ?1 AND n_assigned = 0",
            )?;
            for (id, s) in rescored {
                let (priority, why) = select::priority(project.settings.policy, project.seed, s);
                update.execute(params![id, serde_json::to_string(s)?, priority, generation, why])?;
            }
            tx.execute(
                "UPDATE projects SET generation = ?2 WHERE id = ?1",
                params![project.id, generation],
            )?;
        }
        tx.commit()?;
        Ok(generation)
    }

    /// Every record of `project` in the order added: row id → (its id, the solution).
    pub fn records_of(&self, project: &Project) -> Result<Vec<(i64, (String, Solution))>> {
        let mut q = self
            .db
            .prepare("SELECT id, ext_id, solution FROM records WHERE project_id = ?1 ORDER BY id")?;
        let rows = q.query_map([project.id], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?))
        })?;
        rows.map(|r| {
            let (id, ext, text) = r?;
            Ok((id, (ext, serde_json::from_str(&text)?)))
        })
        .collect()
    }

    /// How many records `project` holds: (all, gold).
    pub fn count_records(&self, project: &Project) -> Result<(i64, i64)> {
        Ok(self.db.query_row(
            "SELECT COUNT(*), COALESCE(SUM(gold), 0) FROM records WHERE project_id = ?1",
            [project.id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?)
    }
}

fn project_row(r: &rusqlite::Row) -> rusqlite::Result<Result<Project>> {
    let settings: String = r.get(2)?;
    let name: String = r.get(1)?;
    Ok(Ok(Project {
        id: r.get(0)?,
        settings: match serde_json::from_str(&settings) {
            Ok(s) => s,
            Err(e) => return Ok(Err(anyhow::anyhow!("project `{name}`: its stored settings: {e}"))),
        },
        name,
        generation: r.get(3)?,
        seed: r.get::<_, i64>(4)? as u64,
    }))
}
