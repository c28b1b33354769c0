use anyhow::{Context, Result};
use std::path::PathBuf;
use stepwise_core::{Format, Solution};
use stepwise_eval::bon::{curve, Curve};
use stepwise_search::{group_candidates, Aggregation, Selector};

/// Best-of-N curves from scored samples.
#[derive(clap::Args)]
#[command(
    after_help = "Input: solutions with step scores (from `stepwise score`: `scores.NAME`, or `steps[i].score` in \
files written elsewhere), `problem_id`, `final_answer` and `correct` (from `stepwise generate`), several per problem. \
For each N, the expected accuracy of picking one of N random samples by the PRM (every aggregation), by PRM-weighted \
vote, by the ORM (with --orm NAME: the same solutions scored by an outcome model under that name; its last step score is \
the outcome score), by majority vote, and pass@N, with bootstrap 95% intervals over problems.

Example:
  stepwise score --model prm/ --name prm --input samples.jsonl --output s1.jsonl
  stepwise score --model orm/ --name orm --input s1.jsonl --output scored.jsonl
  stepwise bon --input scored.jsonl --prm prm --orm orm --out bon/"
)]
pub struct Args {
    /// Solutions scored by a PRM.
    #[arg(long)]
    pub input: PathBuf,
    /// The PRM's name in the solutions' `scores`.
    #[arg(long, default_value = "prm")]
    pub prm: String,
    /// An ORM's name in the solutions' `scores` (adds the ORM's pick).
    #[arg(long)]
    pub orm: Option<String>,
    /// Sample counts (default: powers of two up to the samples per problem).
    #[arg(long, value_delimiter = ',')]
    pub ns: Vec<usize>,
    /// Random subsets drawn per problem and N.
    #[arg(long, default_value_t = 200)]
    pub draws: usize,
    /// Seed of the subsets and the bootstrap.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Folder for bon.json and the plot (bon.png, bon.svg).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Input format (detected when omitted).
    #[arg(long)]
    pub from: Option<Format>,
}

pub fn run(a: Args) -> Result<()> {
    let sols: Vec<Solution> = stepwise_core::io::read_solution_set(&a.input, a.from)?;
    let groups =
        group_candidates(&sols, Some(&a.prm), a.orm.as_deref()).with_context(|| a.input.display().to_string())?;
    let most = groups.iter().map(Vec::len).max().unwrap_or(0);
    let ns: Vec<usize> = if a.ns.is_empty() {
        (0..).map(|k| 1usize << k).take_while(|&n| n <= most).collect()
    } else {
        a.ns.clone()
    };
    let mut methods: Vec<(String, Option<Selector>)> = Aggregation::ALL
        .iter()
        .map(|&g| (format!("PRM ({})", g.name()), Some(Selector::Prm(g))))
        .collect();
    methods.push(("PRM-weighted vote".into(), Some(Selector::PrmVote(Aggregation::Min))));
    if a.orm.is_some() {
        methods.push(("ORM".into(), Some(Selector::Orm)));
    }
    methods.push(("majority vote".into(), Some(Selector::Majority)));
    methods.push(("pass@N".into(), None));
    let curves: Vec<Curve> = methods
        .iter()
        .map(|(label, how)| curve(label, &groups, *how, &ns, a.draws, a.seed))
        .collect();
    outln!("{} problems, up to {most} samples each", groups.len())?;
    outln!(
        "| method | {} |",
        ns.iter().map(|n| format!("N={n}")).collect::<Vec<_>>().join(" | ")
    )?;
    outln!("|---|{}", "---|".repeat(ns.len()))?;
    for c in &curves {
        let cells: Vec<String> = c
            .points
            .iter()
            .map(|p| format!("{:.3} [{:.2}, {:.2}]", p.accuracy, p.lo, p.hi))
            .collect();
        outln!("| {} | {} |", c.method, cells.join(" | "))?;
    }
    if let Some(out) = &a.out {
        std::fs::create_dir_all(out)?;
        std::fs::write(out.join("bon.json"), serde_json::to_string_pretty(&curves)?)?;
        stepwise_eval::plot::bon_plot(&out.join("bon"), "Best-of-N accuracy", &curves)?;
        eprintln!("wrote {}/bon.json, bon.png, bon.svg", out.display());
    }
    Ok(())
}
