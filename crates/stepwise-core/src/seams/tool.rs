//! Tools a verifier calls inside its chain: code it writes is run and what it prints is shown
//! to it before it goes on (GenPRM's code verification).

/// Runs the code blocks a verification chain writes. The blocks of one chain share one
/// namespace, as GenPRM's executor keeps one: a block may use what an earlier one defined.
pub trait CodeRunner: Sync {
    /// What running `code` prints, after the chain's `earlier` blocks have run with their
    /// output discarded. An error, a timeout or a refused operation is reported as text (the
    /// chain reads it and goes on), never as a failure of the scoring.
    fn execute(&self, earlier: &[String], code: &str) -> String;
}
