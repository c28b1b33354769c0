//! `--task`: which domain grades solutions (and labels steps by outcome). Math compares final
//! answers; code runs the problem's tests in a sandboxed python3 (`stepwise-code`).
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use stepwise_code::{CodeTask, Sandbox, CODE_STOPS};
use stepwise_core::seams::{MathTask, Task};
use stepwise_core::steps::{split_steps, SplitStrategy};
use stepwise_core::Problem;

/// The domains a command can grade in.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Domain {
    /// Final answers compared by the math grader.
    Math,
    /// Programs run against their problem's tests (HumanEval, MBPP) in a sandbox.
    Code,
}

/// Which task grades solutions.
#[derive(clap::Args, Debug)]
pub struct TaskArgs {
    /// math: final answers graded against the gold answer. code: a solution's steps are lines of
    /// a program, run against its problem's tests in a sandboxed python3 (its gold answer is the
    /// problem's id); needs the problems (HumanEval or MBPP JSONL).
    #[arg(long = "task", value_enum, default_value = "math")]
    pub domain: Domain,
    /// The code problems with their tests (HumanEval's or MBPP's JSONL) for --task code.
    /// Commands whose input is problems read them from --input when this is not given.
    #[arg(long, value_name = "FILE")]
    pub problems: Option<PathBuf>,
    /// Wall-clock limit of one program run with --task code, in seconds (above 0, at most a
    /// day).
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    pub code_timeout: f64,
    /// Run programs without the kernel's isolation (namespaces, Landlock, seccomp), with only
    /// resource limits: for machines that lack those, on code you trust. A model's program can
    /// then read your files and reach the network. Also STEPWISE_INSECURE_SANDBOX=1.
    #[arg(long)]
    pub insecure_sandbox: bool,
}

impl TaskArgs {
    /// The code problems' file: --problems, else `input` when the command's input is problems.
    fn problems_file<'a>(&'a self, input: Option<&'a Path>) -> Result<&'a Path> {
        match (&self.problems, input) {
            (Some(p), _) => Ok(p),
            (None, Some(i)) => Ok(i),
            (None, None) => bail!("--task code needs --problems FILE (HumanEval's or MBPP's JSONL, with the tests)"),
        }
    }

    /// The task. `input` is the command's input when that is problems (generate, search).
    pub fn open(&self, input: Option<&Path>) -> Result<Box<dyn Task>> {
        match self.domain {
            Domain::Math => Ok(Box::new(MathTask::default())),
            Domain::Code => Ok(Box::new(self.code_task(input)?)),
        }
    }

    /// The code task of --problems (or `input`), whatever --task says.
    pub fn code_task(&self, input: Option<&Path>) -> Result<CodeTask> {
        let timeout = stepwise_code::sandbox::timeout_from_secs(self.code_timeout).context("--code-timeout")?;
        let file = self.problems_file(input)?;
        let problems = stepwise_code::problems::read_problems(file).with_context(|| {
            format!(
                "reading the code problems from {} (HumanEval's or MBPP's JSONL; give --problems FILE when the input is solutions)",
                file.display()
            )
        })?;
        let mut sandbox = if self.insecure_sandbox {
            Sandbox::new_with(stepwise_code::Isolation::Insecure)
        } else {
            Sandbox::new()
        }
        .context("--task code runs programs in python3")?;
        sandbox.timeout = timeout;
        Ok(CodeTask::new(problems, sandbox))
    }

    /// The problems a command whose input is problems works on: read from `input` for math; the
    /// task's own (prompt, id as the gold answer) for code.
    pub fn problems(&self, task: &dyn Task, input: &Path) -> Result<Vec<Problem>> {
        match self.domain {
            Domain::Math => Ok(stepwise_core::io::read_problems(input)?),
            Domain::Code => Ok(task.problems().to_vec()),
        }
    }

    /// The steps of a generated solution: split by `strategy` for math; a program's lines, with
    /// their indentation, for code.
    pub fn split(&self, text: &str, strategy: &SplitStrategy) -> Vec<String> {
        match self.domain {
            Domain::Math => split_steps(text, strategy),
            Domain::Code => stepwise_code::problems::steps_of(text),
        }
    }

    /// Stop strings for whole completions: the Codex paper's for code, none for math.
    pub fn stops(&self) -> Vec<String> {
        match self.domain {
            Domain::Math => Vec::new(),
            Domain::Code => CODE_STOPS.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// What a resumed run must share with the run it resumes: the domain and the code problems'
    /// content.
    pub fn identity(&self, input: Option<&Path>) -> Result<serde_json::Value> {
        Ok(match self.domain {
            Domain::Math => serde_json::json!("math"),
            Domain::Code => stepwise_code::task::resume_identity(self.problems_file(input)?, self.code_timeout)?,
        })
    }
}
