//! Progress of long calls (`annotate`, `search`, `train_prm`) as Python users expect it: a `tqdm`
//! bar when tqdm is installed, a callable of theirs, or lines on the `stepwise` logger
//! (`logging.getLogger("stepwise")`, INFO) otherwise; `progress=False` is silent. The counts come
//! from Rust threads that do not hold the GIL; each report takes it briefly.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Where progress goes.
enum Sink {
    Silent,
    Bar(Py<PyAny>),
    Callback(Py<PyAny>),
    Log,
}

/// A call's progress: `done` of `total` units.
pub struct Progress {
    sink: Sink,
    what: String,
    total: std::sync::atomic::AtomicUsize,
    /// The count last reported, and when a log line was last written.
    last: Mutex<(usize, Instant)>,
}

/// How often the logger hears of progress without tqdm.
const LOG_EVERY: Duration = Duration::from_secs(10);

impl Progress {
    /// Progress of `total` `what` (`"records"`, `"problems"`, `"steps"`) as `arg` asks: `True`
    /// or None (tqdm when installed, else the logger), `False`, or a callable `f(done, total)`.
    pub fn start(py: Python<'_>, arg: Option<&Bound<'_, PyAny>>, what: &str, total: usize) -> PyResult<Progress> {
        let on = match arg {
            None => true,
            Some(a) if a.is_instance_of::<PyBool>() => a.extract::<bool>()?,
            Some(_) => false,
        };
        let sink = if on {
            tqdm(py, what, total).map_or(Sink::Log, Sink::Bar)
        } else if let Some(arg) = arg.filter(|a| !a.is_instance_of::<PyBool>()) {
            if !arg.is_callable() {
                return Err(pyo3::exceptions::PyTypeError::new_err(
                    "progress must be True, False or a callable f(done, total)",
                ));
            }
            Sink::Callback(arg.clone().unbind())
        } else {
            Sink::Silent
        };
        Ok(Progress {
            sink,
            what: what.to_string(),
            total: total.into(),
            last: Mutex::new((0, Instant::now())),
        })
    }

    /// `done` units are finished (a count that only grows); from any thread, without the GIL.
    pub fn done(&self, done: usize) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if done < last.0 || (done == last.0 && done != 0) {
            return;
        }
        let step = done - last.0;
        last.0 = done;
        let total = self.total.load(std::sync::atomic::Ordering::Relaxed);
        match &self.sink {
            Sink::Silent => {}
            Sink::Bar(bar) => Python::attach(|py| {
                let _ = bar.call_method1(py, "update", (step,));
            }),
            Sink::Callback(f) => Python::attach(|py| {
                if let Err(e) = f.call1(py, (done, total)) {
                    e.write_unraisable(py, None);
                }
            }),
            Sink::Log => {
                if done == total || last.1.elapsed() >= LOG_EVERY {
                    last.1 = Instant::now();
                    log(&format!("{}: {done}/{total} done", self.what));
                }
            }
        }
    }

    /// The total is `total` after all (known once the work has started: a run that leaves some
    /// of its input out).
    pub fn set_total(&self, total: usize) {
        if self.total.swap(total, std::sync::atomic::Ordering::Relaxed) == total {
            return;
        }
        if let Sink::Bar(bar) = &self.sink {
            Python::attach(|py| {
                let _ = bar.setattr(py, "total", total);
                let _ = bar.call_method0(py, "refresh");
            });
        }
    }

    /// A line of news (a training run's evaluation) on the `stepwise` logger, or above the bar.
    pub fn say(&self, line: &str) {
        match &self.sink {
            Sink::Silent => {}
            Sink::Bar(bar) => Python::attach(|py| {
                let _ = bar.bind(py).get_type().call_method1("write", (line,));
            }),
            Sink::Callback(_) | Sink::Log => log(line),
        }
    }

    /// Close the bar (it stays on screen with its final count).
    pub fn finish(&self) {
        if let Sink::Bar(bar) = &self.sink {
            Python::attach(|py| {
                let _ = bar.call_method0(py, "close");
            });
        }
    }
}

/// A tqdm bar (`tqdm.auto`: a notebook widget in Jupyter), when tqdm is installed.
fn tqdm(py: Python<'_>, what: &str, total: usize) -> Option<Py<PyAny>> {
    let make = || -> PyResult<Py<PyAny>> {
        let kwargs = PyDict::new(py);
        kwargs.set_item("total", total)?;
        kwargs.set_item("desc", format!("stepwise {what}"))?;
        let unit = match what.strip_suffix("ies") {
            Some(stem) => format!("{stem}y"),
            None => what.trim_end_matches('s').to_string(),
        };
        kwargs.set_item("unit", unit)?;
        Ok(py
            .import("tqdm.auto")?
            .getattr("tqdm")?
            .call((), Some(&kwargs))?
            .unbind())
    };
    make().ok()
}

/// `line` on the `stepwise` logger at INFO.
pub fn log(line: &str) {
    Python::attach(|py| {
        let logger = py
            .import("logging")
            .and_then(|l| l.call_method1("getLogger", ("stepwise",)));
        if let Ok(logger) = logger {
            let _ = logger.call_method1("info", (line,));
        }
    });
}
