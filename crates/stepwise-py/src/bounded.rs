//! Calls into Python objects that may hang, bounded in time: a watchdog thread raises
//! `TimeoutError` in the calling thread when the call outlives its limit
//! (`PyThreadState_SetAsyncExc`, the way a debugger interrupts a thread). The exception lands at
//! the next bytecode the call runs, so a loop in Python code stops; a call blocked inside C code
//! (a `time.sleep`, a socket read) stops only when it next returns to Python.

use pyo3::call::PyCallArgs;
use pyo3::prelude::*;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Whether the call is over, and whether the watchdog fired.
#[derive(Default)]
struct Watch {
    state: Mutex<(bool, bool)>,
    over: Condvar,
}

/// `object.method(*args)` with at most `limit` (none: unbounded). A call that outlived it is an
/// error saying so, whatever it returned.
pub fn call_method_bounded<'py>(
    py: Python<'py>,
    object: &Py<PyAny>,
    method: &str,
    args: impl PyCallArgs<'py>,
    limit: Option<Duration>,
) -> Result<Py<PyAny>, BoundedError> {
    let Some(limit) = limit else {
        return object.call_method1(py, method, args).map_err(BoundedError::Raised);
    };
    // This thread as Python names it, for the watchdog.
    let ident: std::os::raw::c_ulong = py
        .import("threading")
        .and_then(|t| t.call_method0("get_ident"))
        .and_then(|i| i.extract())
        .map_err(BoundedError::Raised)?;
    // CPython's API takes the same bits as a signed long.
    let ident = ident as std::os::raw::c_long;
    let watch = Arc::new(Watch::default());
    let dog = {
        let watch = watch.clone();
        std::thread::spawn(move || {
            let state = watch.state.lock().unwrap_or_else(|e| e.into_inner());
            let (state, _) = watch
                .over
                .wait_timeout_while(state, limit, |s| !s.0)
                .unwrap_or_else(|e| e.into_inner());
            if state.0 {
                return;
            }
            drop(state);
            // The GIL first, then the state: the caller flips `over` holding the GIL, so the
            // two never cross.
            Python::attach(|_| {
                let mut state = watch.state.lock().unwrap_or_else(|e| e.into_inner());
                if !state.0 {
                    state.1 = true;
                    // SAFETY: the GIL is held; the exception type is a static object.
                    unsafe { pyo3::ffi::PyThreadState_SetAsyncExc(ident, pyo3::ffi::PyExc_TimeoutError) };
                }
            });
        })
    };
    let out = object.call_method1(py, method, args);
    let fired = {
        let mut state = watch.state.lock().unwrap_or_else(|e| e.into_inner());
        state.0 = true;
        if state.1 {
            // The call may have returned before the exception landed: clear it, so it cannot
            // surface in whatever this thread runs next.
            // SAFETY: the GIL is held; a null exception clears a pending one.
            unsafe { pyo3::ffi::PyThreadState_SetAsyncExc(ident, std::ptr::null_mut()) };
        }
        state.1
    };
    watch.over.notify_all();
    // The watchdog may be waiting for the GIL: let it go while it finishes.
    py.detach(|| dog.join()).ok();
    match out {
        _ if fired => Err(BoundedError::TimedOut(limit)),
        Ok(v) => Ok(v),
        Err(e) => Err(BoundedError::Raised(e)),
    }
}

/// Why a bounded call gave no value.
pub enum BoundedError {
    /// It raised.
    Raised(PyErr),
    /// It outlived its limit.
    TimedOut(Duration),
}
