//! `stepwise`: process supervision for reasoning models, one subcommand per stage of the loop.
//! The command line only parses arguments and wires the library crates together; it is a library
//! too ([`main_with`]) so the Python package ships it (`pip install` puts `stepwise` on the PATH,
//! running this code in the package's native module, as Rust-backed tools such as ruff ship
//! theirs).

/// `println!` that returns the write's error instead of panicking: a closed pipe (`| head`)
/// ends the command quietly, a full disk with a message.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// `print!` that returns the write's error instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*)
    }};
}

mod cmd;
mod progress;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "stepwise",
    version,
    about = "Process supervision for reasoning models: label steps, train process reward models, verify and search.",
    long_about = "stepwise runs the process-supervision loop: step-labelled data in every format the field \
uses, automatic step annotation, process and outcome reward models, step scoring, best-of-N and search, and \
evaluation. Every stage reads and writes JSONL (or Parquet), so each can run alone on files other tools made.",
    after_help = "Examples:\n  \
stepwise lab                                       # the whole loop on the built-in task\n  \
stepwise convert prm800k.jsonl out.jsonl --to trl  # any format to any other\n  \
stepwise stats processbench/gsm8k.json             # counts, label balance, first errors\n  \
stepwise grade --mode lenient answers.jsonl        # adds `correct` to {given, ground_truth}\n  \
stepwise score --model DIR --input steps.jsonl --output scored.jsonl\n  \
stepwise search --policy DIR --prm DIR --method beam -n 16 \\\n      --input problems.jsonl --output beam.jsonl\n\n\
Run `stepwise <command> --help` for the details of each."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Before the command, as earlier versions took it: the command's own `--dtype`.
    #[arg(long, hide = true, value_parser = cmd::backend::DTYPES)]
    dtype: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// The built-in lab: train a policy, sample, annotate, train PRMs and an ORM, evaluate, report.
    Lab(cmd::lab::Args),
    /// Convert step-labelled data between formats (detects the input format).
    Convert(cmd::convert::Args),
    /// Summarise a step-labelled dataset: counts, steps per solution, label balance, first errors.
    Stats(cmd::stats::Args),
    /// Step-level preference pairs (Step-DPO, TRL's DPO layout) from step-labelled records: a right next step against a wrong one.
    Pairs(cmd::pairs::Args),
    /// Grade final answers ({given, ground_truth} JSONL: each record with `correct`), or programs by their tests (--task code: pass@k).
    Grade(cmd::grade::Args),
    /// Score every step of every solution with a PRM, one forward pass per solution.
    Score(cmd::score::Args),
    /// Sample solutions from a policy (shared-prefix KV cache), split into steps and graded.
    Generate(cmd::generate::Args),
    /// Train a PRM on hard or soft step labels, or an ORM on outcomes (--outcome).
    TrainPrm(cmd::train_prm::Args),
    /// Label steps by Monte Carlo rollouts of a policy (Math-Shepherd hard and soft labels), resumable.
    Annotate(cmd::annotate::Args),
    /// Best-of-N curves from scored samples: PRM (every aggregation), weighted vote, ORM, majority.
    Bon(cmd::bon::Args),
    /// Search step by step guided by a PRM: beam search, DVTS, lookahead, verify → resample, best-of-N.
    Search(cmd::search::Args),
    /// Calibrate a PRM's rejection threshold τ on labelled steps (writes PRM/threshold.json).
    Calibrate(cmd::calibrate::Args),
    /// Optimise a policy by RL against outcome, ORM or PRM rewards (GRPO, per-step credit), resumable.
    Rl(cmd::rl::Args),
    /// Train a policy by DPO on preference pairs (Step-DPO with `stepwise pairs`' step pairs): no reward model, no sampling.
    Dpo(cmd::dpo::Args),
    /// Download models (and an adapter's base) from the Hugging Face Hub ahead of an offline run: only what stepwise reads.
    Download(cmd::download::Args),
    /// Merge a PEFT LoRA adapter onto its base into a model folder (PEFT's merge_and_unload + save_pretrained).
    Merge(cmd::merge::Args),
    /// The models stepwise merged from adapters into its cache: list them, remove or prune them.
    Cache(cmd::cache::Args),
    /// Serve a policy and/or PRM over an OpenAI-compatible HTTP API (completions, chat, step scores).
    Serve(cmd::serve::Args),
    /// Evaluate scored solutions (ProcessBench's first-error metric).
    #[command(subcommand)]
    Eval(cmd::eval::Command),
    /// Agents: rooms worlds to play, trajectories played by a policy, labels for their actions.
    Agent(cmd::agent::Args),
    /// The labelling studio: people rate steps in the browser, with a PRM's suggestions and active learning.
    Studio(Box<cmd::studio::Args>),
}

/// Run the command line on `args` (the program's name first, as `std::env::args_os` gives them):
/// its exit status. Help, errors and output go to the process's standard streams.
pub fn main_with<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        // Help, version or a usage error (status 2); printing it can fail too (a full disk).
        Err(e) => {
            return match e.print() {
                Err(io) if io.kind() != std::io::ErrorKind::BrokenPipe => {
                    eprintln!("error: {io}");
                    1
                }
                _ => e.exit_code(),
            }
        }
    };
    if let Some(d) = &cli.dtype {
        cmd::backend::apply_dtype(d);
    }
    let result = match cli.command {
        Command::Lab(a) => cmd::lab::run_lab(a),
        Command::Convert(a) => cmd::convert::run(a),
        Command::Stats(a) => cmd::stats::run(a),
        Command::Pairs(a) => cmd::pairs::run(a),
        Command::Grade(a) => cmd::grade::run(a),
        Command::Score(a) => cmd::score::run(a),
        Command::Generate(a) => cmd::generate::run(a),
        Command::TrainPrm(a) => cmd::train_prm::run(a),
        Command::Annotate(a) => cmd::annotate::run(a),
        Command::Bon(a) => cmd::bon::run(a),
        Command::Eval(c) => cmd::eval::run(c),
        Command::Rl(a) => cmd::rl::run(a),
        Command::Dpo(a) => cmd::dpo::run(a),
        Command::Search(a) => cmd::search::run(a),
        Command::Calibrate(a) => cmd::calibrate::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Merge(a) => cmd::merge::run(a),
        Command::Download(a) => cmd::download::run(a),
        Command::Cache(a) => cmd::cache::run(a),
        Command::Studio(a) => cmd::studio::run(*a),
        Command::Agent(a) => cmd::agent::run(a),
    };
    if let Err(e) = result {
        // A reader that stopped reading (`stepwise convert ... - | head`) is not an error.
        let pipe = Some(std::io::ErrorKind::BrokenPipe);
        let closed_pipe = e.chain().any(|c| {
            c.downcast_ref::<std::io::Error>().map(|io| io.kind()) == pipe
                || c.downcast_ref::<serde_json::Error>().and_then(|j| j.io_error_kind()) == pipe
        });
        if closed_pipe {
            return 0;
        }
        eprintln!("error: {}", message(&e));
        return 1;
    }
    0
}

/// An error and its causes, `: `-separated as anyhow's `{:#}`, leaving out a cause that the
/// message before it already ends with (errors that quote their source would say it twice).
fn message(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.ends_with(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every indented line of every command's closing help (its examples and tables) fits the 100
    /// columns clap renders help in, so none is wrapped: an example copied from `--help` runs as
    /// written. Prose (a line that starts at the margin) is reflowed by clap and may be longer.
    #[test]
    fn no_help_line_is_wrapped() {
        fn check(cmd: &clap::Command, path: &str, long: &mut Vec<String>) {
            let texts = [cmd.get_after_help(), cmd.get_after_long_help()];
            for text in texts.into_iter().flatten() {
                for line in text.to_string().lines() {
                    if line.starts_with(' ') && line.chars().count() > 100 {
                        long.push(format!("{path}: {line}"));
                    }
                }
            }
            for sub in cmd.get_subcommands() {
                check(sub, &format!("{path} {}", sub.get_name()), long);
            }
        }
        let mut long = Vec::new();
        check(&super::Cli::command(), "stepwise", &mut long);
        assert!(
            long.is_empty(),
            "{} lines past 100 columns:\n{}",
            long.len(),
            long.join("\n")
        );
    }
}
