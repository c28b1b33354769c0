//! The labelling studio from Python (`stepwise.Studio`): start one on records, add records and
//! accounts, and read the labels back as records, while people label in the browser.

use crate::convert::{format_named, records_arg, records_of, solutions_of, to_py, value_error, without_gil};
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::Mutex;
use stepwise_studio::export::{export, Shape};
use stepwise_studio::server::Running;
use stepwise_studio::{NewRecord, Policy, Role, Settings, Store};

/// A labelling studio: a project in a SQLite database, served in the background for people to
/// label in the browser (see docs/studio.md).
///
/// >>> studio = stepwise.Studio("labels.sqlite", records, policy="convincing-wrong", overlap=2)
/// >>> studio.add_user("ada", "admin", "a long password")
/// >>> studio.url                      # open it in a browser
/// >>> labelled = studio.ratings()     # stepwise records, every labeller in meta["studio"]
#[pyclass(module = "stepwise._stepwise")]
pub struct Studio {
    db: PathBuf,
    project: String,
    running: Mutex<Option<Running>>,
    url: Option<String>,
}

fn open(db: &std::path::Path) -> anyhow::Result<Store> {
    Store::open(db)
}

impl Studio {
    fn project(&self, store: &Store) -> anyhow::Result<stepwise_studio::Project> {
        store
            .project(&self.project)?
            .ok_or_else(|| anyhow::anyhow!("no project `{}` in {}", self.project, self.db.display()))
    }
}

#[pymethods]
impl Studio {
    /// Opens (creating) the studio database `db` with project `project` (its settings fixed when
    /// created), adds `records` (any format stepwise reads, or a path), and, with `serve`,
    /// serves it on `host:port` (0: a free port) until `close()`.
    #[new]
    #[pyo3(signature = (db, records=None, *, project="default", policy="uniform", overlap=1, stop_at_first_bad=false,
                        blind=false, qc_every=10, code=false, seed=0, serve=true, host="127.0.0.1", port=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        db: PathBuf,
        records: Option<&Bound<'_, PyAny>>,
        project: &str,
        policy: &str,
        overlap: u32,
        stop_at_first_bad: bool,
        blind: bool,
        qc_every: u32,
        code: bool,
        seed: u64,
        serve: bool,
        host: &str,
        port: u16,
    ) -> PyResult<Self> {
        let policy: Policy = policy.parse().map_err(value_error)?;
        if overlap == 0 {
            return Err(value_error("overlap is at least 1"));
        }
        let settings = Settings {
            overlap,
            stop_at_first_bad,
            assist: !blind,
            policy,
            qc_every,
            code,
        };
        let studio = Studio {
            db,
            project: project.to_string(),
            running: Mutex::new(None),
            url: None,
        };
        without_gil(py, || {
            open(&studio.db)?.project_or_create(&studio.project, &settings, seed)?;
            Ok(())
        })?;
        if let Some(r) = records {
            studio.add_records(py, r, false)?;
        }
        if !serve {
            return Ok(studio);
        }
        let address = format!("{host}:{port}");
        let running = without_gil(py, || stepwise_studio::server::spawn(open(&studio.db)?, &address))?;
        let url = running.url();
        *studio.running.lock().unwrap_or_else(|e| e.into_inner()) = Some(running);
        Ok(Studio {
            url: Some(url),
            ..studio
        })
    }

    /// Where it is served (`http://127.0.0.1:PORT`), or None when not serving.
    #[getter]
    fn url(&self) -> Option<String> {
        self.url.clone()
    }

    /// Adds records (a list of dicts in any format stepwise reads, or a path to a file); all or
    /// none (a bad record is named and nothing is added). `gold=True`: quality-control records,
    /// whose step labels are the gold ratings. Returns how many were new.
    #[pyo3(signature = (records, gold=false))]
    fn add_records(&self, py: Python<'_>, records: &Bound<'_, PyAny>, gold: bool) -> PyResult<usize> {
        let sols = if let Ok(path) = records.extract::<PathBuf>() {
            without_gil(py, || Ok(stepwise_core::io::read_solution_set(&path, None)?))?
        } else {
            let values = records_arg(records)?;
            without_gil(py, || solutions_of(&values, None))?
        };
        without_gil(py, || {
            let mut store = open(&self.db)?;
            let project = self.project(&store)?;
            store.add_records(&project, NewRecord::each(sols, gold))
        })
    }

    /// Creates an account (or sets its role and password): role `labeller`, `reviewer` or `admin`.
    fn add_user(&self, py: Python<'_>, name: String, role: &str, password: String) -> PyResult<()> {
        let role: Role = role.parse().map_err(value_error)?;
        without_gil(py, || open(&self.db)?.set_user(&name, role, &password))
    }

    /// The labels as records of `format`: PRM800K one per labeller and record; any other format
    /// one per record (adjudicated, else majority; in `stepwise`, every labeller in
    /// `meta["studio"]`). `include_unlabelled`: the records nobody finished too, as added.
    #[pyo3(signature = (format="stepwise", include_unlabelled=false))]
    fn ratings<'py>(&self, py: Python<'py>, format: &str, include_unlabelled: bool) -> PyResult<Bound<'py, PyAny>> {
        let format = format_named(format)?;
        let values = without_gil(py, || {
            let store = open(&self.db)?;
            let project = self.project(&store)?;
            let shape = if format == stepwise_core::Format::Prm800k {
                Shape::PerLabelling
            } else {
                Shape::PerRecord
            };
            let sols = export(&store, &project, shape, include_unlabelled)?;
            if format == stepwise_core::Format::Stepwise {
                records_of(&sols)
            } else {
                crate::convert::in_format(&sols, format)
            }
        })?;
        to_py(py, &serde_json::Value::Array(values))
    }

    /// The dashboard's numbers: progress, agreement (Fleiss' κ, first errors), per labeller.
    fn dashboard<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let v = without_gil(py, || {
            let store = open(&self.db)?;
            let project = self.project(&store)?;
            Ok(serde_json::to_value(store.dashboard(&project)?)?)
        })?;
        to_py(py, &v)
    }

    /// The project's guidelines for labellers ("" when none): shown before each labeller's
    /// first record and after each change. Setting them replaces them ("" removes them).
    #[getter]
    fn guidelines(&self, py: Python<'_>) -> PyResult<String> {
        without_gil(py, || {
            let store = open(&self.db)?;
            let project = self.project(&store)?;
            Ok(store.guidelines(&project)?.map(|g| g.text).unwrap_or_default())
        })
    }

    #[setter]
    fn set_guidelines(&self, py: Python<'_>, text: String) -> PyResult<()> {
        let most = stepwise_studio::store::MAX_GUIDELINES_BYTES;
        if text.len() > most {
            return Err(value_error(format!(
                "guidelines of {} bytes: at most {most}",
                text.len()
            )));
        }
        without_gil(py, || {
            let mut store = open(&self.db)?;
            let project = self.project(&store)?;
            store.set_guidelines(&project, &text, "python")?;
            Ok(())
        })
    }

    /// The records nobody has been given yet (to score with a new PRM for `next_generation`).
    fn unassigned<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let values = without_gil(py, || {
            let store = open(&self.db)?;
            let project = self.project(&store)?;
            let sols: Vec<_> = store.unassigned(&project)?.into_iter().map(|(_, s)| s).collect();
            records_of(&sols)
        })?;
        to_py(py, &serde_json::Value::Array(values))
    }

    /// Starts the next generation: `records` (those of `unassigned()`, scored by a new PRM) are
    /// ranked again by the project's policy. Returns the generation.
    fn next_generation(&self, py: Python<'_>, records: &Bound<'_, PyAny>) -> PyResult<i64> {
        let values: Vec<serde_json::Value> = records_arg(records)?;
        without_gil(py, || {
            let scored = solutions_of(&values, Some(stepwise_core::Format::Stepwise))?;
            let mut store = open(&self.db)?;
            let project = self.project(&store)?;
            let rows: std::collections::HashMap<String, i64> = store
                .unassigned(&project)?
                .into_iter()
                .map(|(row, s)| (s.id, row))
                .collect();
            let mut pairs = Vec::with_capacity(scored.len());
            for s in scored {
                match rows.get(&s.id) {
                    Some(&row) => pairs.push((row, s)),
                    None => anyhow::bail!("record `{}` is not among the unassigned records", s.id),
                }
            }
            store.next_generation(&project, &pairs)
        })
    }

    /// Stops serving (ratings already saved stay in the database).
    fn close(&self) {
        self.running.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close();
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "Studio(db={:?}, project={:?}, url={:?})",
            self.db.display().to_string(),
            self.project,
            self.url
        )
    }
}
