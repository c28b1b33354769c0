use anyhow::{bail, Result};
use std::path::PathBuf;
use stepwise_core::seams::score_solutions;
use stepwise_core::{Format, Solution};
use stepwise_model::default_device;
use stepwise_model::scoring::LoadedVerifier;
use stepwise_search::calibrate;
use stepwise_search::calibrate::{scored_steps, THRESHOLD_FILE};

/// Calibrate a PRM's rejection threshold τ on labelled steps (for `stepwise search --method resample`).
#[derive(clap::Args)]
#[command(
    after_help = "A step scored below τ is called bad. τ is the largest threshold at which at least --precision of
the steps called bad are bad, read as verification reads a solution: each solution's steps up to and
including its first bad one. It is written to PRM/threshold.json with its precision and recall, where
`stepwise search --method resample` finds it. Solutions without `scores.NAME` are scored with the PRM
first. Calibrate on data the PRM was not trained on.

Example:
  stepwise calibrate --prm PRM --input data/processbench/gsm8k.json --precision 0.8"
)]
pub struct Args {
    /// PRM checkpoint folder or cached Hugging Face model id (threshold.json is written there).
    #[arg(long, value_parser = super::model_dir)]
    pub prm: PathBuf,
    /// Step-labelled solutions in any format stepwise reads.
    #[arg(long)]
    pub input: PathBuf,
    /// The scores' name in the input (`scores.NAME`), if already scored.
    #[arg(long, default_value = "prm")]
    pub name: String,
    /// Precision of "bad step" calls to reach.
    #[arg(long, default_value_t = 0.8)]
    pub precision: f64,
    /// PRM layout: auto, qwen-prm, step-tag, token-cls or log-ratio.
    #[arg(long, default_value = "auto")]
    pub layout: String,
    /// Input format (detected when omitted).
    #[arg(long)]
    pub from: Option<Format>,
    /// What loaded models compute in.
    #[command(flatten)]
    pub dtype: super::backend::DtypeArg,
}

pub fn run(a: Args) -> Result<()> {
    a.dtype.apply();
    if !(0.0..=1.0).contains(&a.precision) {
        bail!("--precision {}: a precision is between 0 and 1", a.precision);
    }
    let mut sols: Vec<Solution> = stepwise_core::io::read_solution_set(&a.input, a.from)?;
    if sols.iter().any(|s| s.scores_of(&a.name).is_none()) {
        let verifier = LoadedVerifier::load(&a.prm, &a.layout, &default_device())?;
        let bar = crate::progress::bar(Some(sols.len() as u64), "scoring");
        score_solutions(&verifier.scorer(), &a.name, &mut sols, 8, |d| {
            bar.set_position(d as u64)
        })?;
        bar.finish_and_clear();
    }
    let steps = scored_steps(&sols, &a.name).map_err(|e| anyhow::anyhow!("{}: {e:#}", a.input.display()))?;
    let bad = steps.iter().filter(|s| s.1).count();
    let Some(t) = calibrate(&steps, a.precision, &a.name) else {
        bail!(
            "no threshold calls steps bad with precision {} ({} of {} steps read are bad): lower --precision",
            a.precision,
            bad,
            steps.len()
        );
    };
    t.save(&a.prm)?;
    eprintln!(
        "τ = {:.4}: precision {:.3}, recall {:.3} of {} bad steps among {}; written to {}",
        t.tau,
        t.precision,
        t.recall,
        t.bad_steps,
        t.steps,
        a.prm.join(THRESHOLD_FILE).display()
    );
    Ok(())
}
