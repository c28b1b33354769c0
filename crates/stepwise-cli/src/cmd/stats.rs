use anyhow::Result;
use std::path::PathBuf;
use stepwise_core::{stats::stats, Format, SolutionReader};

/// Summarise a step-labelled dataset.
#[derive(clap::Args)]
#[command(after_help = "Example:\n  stepwise stats data/processbench/math.json --json")]
pub struct Args {
    /// Input file in any format stepwise reads.
    pub input: PathBuf,
    /// Input format (detected when omitted).
    #[arg(long)]
    pub from: Option<Format>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Skip records that cannot be read.
    #[arg(long)]
    pub skip_invalid: bool,
}

pub fn run(a: Args) -> Result<()> {
    let mut reader = SolutionReader::open(&a.input, a.from)?.skip_invalid(a.skip_invalid);
    let format = reader.format()?;
    let sols: Vec<_> = reader.by_ref().collect::<Result<_, _>>()?;
    let s = stats(&sols);
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&s)?)?;
    } else {
        outln!("format              {}", format.map_or("-".into(), |f| f.to_string()))?;
        out!("{s}")?;
    }
    if reader.skipped() > 0 {
        eprintln!("skipped {} invalid records", reader.skipped());
    }
    Ok(())
}
