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

/// The Python program that runs a chain's block after its `earlier` ones: each earlier block on
/// its own, its output and errors discarded, then `code`, whose printed output is the answer.
/// Local and remote sandboxes run the same text.
pub fn chain_program(earlier: &[String], code: &str) -> String {
    let mut program = String::from("import contextlib as _c, io as _io\n");
    for block in earlier {
        // A JSON string is a Python string literal.
        let literal = serde_json::to_string(block).unwrap_or_else(|_| "''".into());
        program.push_str(&format!(
            "with _c.redirect_stdout(_io.StringIO()), _c.redirect_stderr(_io.StringIO()):\n    try:\n        exec({literal})\n    except BaseException:\n        pass\n"
        ));
    }
    program.push_str(code);
    program.push('\n');
    program
}

/// What a chain reads back from a block: its printed output, and when it failed, GenPRM's
/// executor's `Code execute Error: <why>` after it.
pub fn chain_reply(stdout: &str, error: Option<&str>) -> String {
    let out = stdout.trim_end();
    match error {
        None => out.to_string(),
        Some(why) if out.is_empty() => format!("Code execute Error: {why}"),
        Some(why) => format!("{out}\nCode execute Error: {why}"),
    }
}
