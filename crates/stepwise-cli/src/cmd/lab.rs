use anyhow::Result;
use clap::builder::TypedValueParser as _;
use std::path::PathBuf;
use stepwise_lab::run::default_run_folder;
use stepwise_lab::{report::headline, run, task::Domain, LabOptions, Preset};

/// Run the built-in lab: the whole process-supervision loop on a verifiable synthetic task.
#[derive(clap::Args)]
#[command(
    after_help = "Stages (each cached in the run folder and resumed after an interruption):
  1. train a policy from scratch on arithmetic word problems (reference solutions, some with slips),
     or with `--domain code` on the same stories as straight-line Python programs (every line
     checked by executing it), and the verifiers' own base LM (on the references without slips)
  2. sample N solutions per problem (shared-prefix KV cache)
  3. label the steps five ways, rollouts completed by the verifiers' base: Monte Carlo
     (Math-Shepherd), binary search for the first error and OmegaPRM's tree (OmegaPRM), a judge
     fine-tuned on a small budget of oracle labels, and consensus (MC kept where the judge
     agrees); oracle labels from the exact checker
  4. train a PRM on each label source (MC, binary search, OmegaPRM, judge, consensus, oracle) and
     an ORM, same code and budget, each the verifiers' base fine-tuned and scoring a step by its
     log-likelihood against a constant reference (`--set verifier_head=log_ratio`: against the
     base; `--set verifier_head=classifier`: a fresh classifier head)
  5. evaluate on held-out problems: best-of-N curves, ProcessBench metric, label quality; the
     judge and a judge with a calculator (each equation step's value shown; `--set
     judge_calculator=false` skips it) verify too, against a PRM on the same oracle labels
  6. test-time search on problems of its own: best-of-N, beam search, DVTS, lookahead and
     verify → resample (τ calibrated on the evaluation samples), guided by PRM-MC, PRM-oracle
     and the oracle, at N in search_budgets; accuracy against tokens generated
     (`--set search_problems=0` skips it)
  7. RL from the policy against each reward source (outcome, ORM, PRM-MC, PRM-oracle, oracle, and
     PRIME's implicit PRM learned online from outcomes), same
     budget (rl_updates × rl_prompts × rl_group), measured on held-out problems before and after
     (`--set rl_updates=0` skips it)
  8. write metrics.json, report.md, report.html and plots (bon, calibration, search, rl: .png
     and .svg); comparisons on the same problems as paired differences with 95% intervals
     (metrics keys paired, search.paired, rl.paired)

Examples:
  # standard preset (600 held-out problems), about 10 minutes on 2 cores
  stepwise lab
  stepwise lab --preset quick --seed 2  # every stage, small, a few minutes
  stepwise lab --set eval_samples=64 --out runs/n64   # one preset field changed
  # the loop on programs checked by execution (runs/standard-code-seed1)
  stepwise lab --domain code
  # an agent in a text world: actions as steps (runs/standard-agent-seed1)
  stepwise lab --domain agent

With `--domain agent` the loop is the agent's (docs/agents.md): the noisy expert's
demonstrations teach a policy; it plays the label worlds; actions are labelled by the oracle,
Monte Carlo rollouts (agent_rollouts), binary search for the first dead action and TD(λ) from
a cross-fitted value (agent_lambda, agent_gamma); PRMs on MC and TD labels, a progress head and
an ORM on outcomes, trained from the policy; best-of-N over held-out trajectories against the
majority of outcomes and the ORM, with clean and lucky successes counted; beam search over
actions; RL with each reward source against outcome-only RL, agent_rl_seeds runs a source
(`--set agent_rl_seeds=1` for one, `--set agent_rl_updates=0` to skip it). Its sizes are the
preset's agent_* fields (`--set agent_eval_games=100`)."
)]
pub struct Args {
    /// quick (minutes, noisy) or standard (the measured setting).
    #[arg(long, default_value = "standard")]
    pub preset: String,
    /// The reasoning domain: arithmetic word problems (default), or `code`: the same stories
    /// with symbols, solved by straight-line Python functions one statement a step, every line
    /// checked by executing it; or `agent`: an agent in a text world of rooms, containers and
    /// items, its actions the steps.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(Domain::ALL.map(Domain::name))
        .map(|s| s.parse::<Domain>().expect("a listed domain")))]
    pub domain: Option<Domain>,
    /// Seed of everything (problems, models, sampling).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Run folder (default runs/PRESET-seedN); rerunning with the same settings reuses what is
    /// complete, and a folder started with other settings is refused.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Change one preset field, e.g. `--set policy_steps=3000 --set rollouts=8` (repeatable;
    /// the fields are in the run folder's preset.json).
    #[arg(long = "set", value_name = "FIELD=VALUE")]
    pub sets: Vec<String>,
    /// What loaded models compute in.
    #[command(flatten)]
    pub dtype: super::backend::DtypeArg,
}

pub fn run_lab(a: Args) -> Result<()> {
    a.dtype.apply();
    let mut preset = Preset::by_name(&a.preset)?.with_overrides(&a.sets)?;
    if let Some(domain) = a.domain {
        preset.domain = domain;
    }
    let out = a.out.unwrap_or_else(|| default_run_folder(&preset, a.seed));
    let start = std::time::Instant::now();
    let options = LabOptions {
        preset,
        seed: a.seed,
        out: out.clone(),
    };
    if options.preset.domain == Domain::Agent {
        let report = stepwise_lab::agent::run(&options)?;
        outln!("\n{}", stepwise_lab::agent::report::headline(&report))?;
        outln!(
            "report: {} ({:.0}s)",
            out.join("report.md").display(),
            start.elapsed().as_secs_f64()
        )?;
        return Ok(());
    }
    let report = run(&options)?;
    outln!("\n{}", headline(&report))?;
    outln!(
        "policy accuracy {:.3}; lucky-correct {:.1}% of correct answers; MC hard-label accuracy {:.3}; PRM-MC ProcessBench F1 {:.3}",
        report.policy_accuracy,
        100.0 * report.lucky_correct_rate,
        report.mc_label_quality.hard_accuracy,
        report.processbench.first().map_or(0.0, |p| p.1.f1)
    )?;
    let auroc = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.3}"));
    let (mut within, mut step) = (Vec::new(), Vec::new());
    // The verifiers here; the judges and the PRM on their labels are in the report's table.
    let judged = |name: &str| name.starts_with("judge") || name.ends_with("judge's labels");
    for (name, d) in report.discrimination.iter().filter(|(name, _)| !judged(name)) {
        within.push(format!("{name} {}", auroc(d.within_problem_auroc)));
        if d.step_auroc.is_some() {
            step.push(format!("{name} {}", auroc(d.step_auroc)));
        }
    }
    outln!("within-problem AUROC (0.5 = chance): {}", within.join(", "))?;
    outln!("step AUROC against the oracle: {}", step.join(", "))?;
    outln!(
        "report: {} ({:.0}s)",
        out.join("report.md").display(),
        start.elapsed().as_secs_f64()
    )?;
    Ok(())
}
