use anyhow::{Context, Result};
use std::path::PathBuf;
use stepwise_core::{Format, SolutionReader, SolutionWriter};

/// Convert step-labelled data between formats.
#[derive(clap::Args)]
#[command(after_help = FORMATS_HELP)]
pub struct Args {
    /// Input file: JSONL, a JSON array, or .parquet (`-` for stdin).
    pub input: PathBuf,
    /// Output file: .jsonl, .json (one array) or .parquet (`-` for stdout).
    pub output: PathBuf,
    /// Output format.
    #[arg(long, default_value = "stepwise")]
    pub to: Format,
    /// Input format (detected from the first record when omitted).
    #[arg(long)]
    pub from: Option<Format>,
    /// Skip records that cannot be read, and report how many, instead of stopping.
    #[arg(long)]
    pub skip_invalid: bool,
}

const FORMATS_HELP: &str = "Formats:
  stepwise       stepwise's own records (lossless)
  prm800k        OpenAI PRM800K phase 1/2 ({labeler, question, label: {steps: [{completions,
                 chosen_completion}]}})
  math-shepherd  Math-Shepherd ({input with ` ки` tags, label with +/-})
  openr-prm      OpenR's training layout ({question, process, labels: [1, 0]})
  trl            TRL stepwise supervision ({prompt, completions, labels})
  processbench   ProcessBench ({id, generator, problem, steps, final_answer_correct, label})
  omegaprm       OpenR OmegaPRM, flat ({question, final_answer, reasoning_steps: [{solution_prefix,
                 mc_value}]})
  omegaprm-tree  OpenR OmegaPRM, tree ({reasoning_steps: {text, mc_value, children}})
  rlhflow        RLHFlow chat ({conversations: user step / assistant +/-})
  prmbench       PRMBench ({idx, modified_question, modified_process, error_steps: [1-based],
                 classification})
  humaneval      HumanEval problems ({task_id, prompt, canonical_solution, test, entry_point}): the
                 solution's lines

Example:
  stepwise convert data/processbench/gsm8k.json pb.trl.parquet --to trl";

pub fn run(a: Args) -> Result<()> {
    stepwise_core::io::refuse_same_file(&a.input, &a.output)?;
    let mut reader = SolutionReader::open(&a.input, a.from)?.skip_invalid(a.skip_invalid);
    let from = reader.format()?;
    let mut writer = SolutionWriter::create(&a.output, a.to)?;
    let bar = crate::progress::bar(None, "converting");
    let mut n = 0u64;
    for s in reader.by_ref() {
        writer.write(&s?)?;
        n += 1;
        bar.inc(1);
    }
    writer
        .finish()
        .with_context(|| format!("writing {}", a.output.display()))?;
    bar.finish_and_clear();
    let from = from.map_or("empty".to_string(), |f| f.to_string());
    eprintln!("converted {n} solutions: {from} -> {}", a.to);
    if reader.skipped() > 0 {
        eprintln!("skipped {} invalid records", reader.skipped());
    }
    if a.to != Format::Stepwise && Some(a.to) != reader.format()? {
        eprintln!("note: {} drops {}", a.to, a.to.drops());
    }
    Ok(())
}
