use anyhow::{Context, Result};
use std::collections::HashMap;
use std::path::PathBuf;
use stepwise_core::{Format, Solution, SolutionReader};
use stepwise_eval::bon::{curve, Curve};
use stepwise_search::{Aggregation, Candidate, Selector};

/// Best-of-N curves from scored samples.
#[derive(clap::Args)]
#[command(
    after_help = "Input: solutions with `steps[i].score` (from `stepwise score`), `problem_id`, \
`final_answer` and `correct` (from `stepwise generate`), several per problem. For each N, the expected accuracy \
of picking one of N random samples by the PRM (every aggregation), by PRM-weighted vote, by the ORM (with --orm: \
the same solutions scored by an outcome model; its last step score is the outcome score), by majority vote, and \
pass@N, with bootstrap 95% intervals over problems.

Example:
  stepwise bon --input prm_scored.jsonl --orm orm_scored.jsonl --out bon/"
)]
pub struct Args {
    /// Solutions scored by a PRM.
    #[arg(long)]
    pub input: PathBuf,
    /// The same solutions scored by an ORM (matched by `id`).
    #[arg(long)]
    pub orm: Option<PathBuf>,
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

fn read(path: &PathBuf, from: Option<Format>) -> Result<Vec<Solution>> {
    SolutionReader::open(path, from)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(Into::into)
}

pub fn run(a: Args) -> Result<()> {
    let sols = read(&a.input, a.from)?;
    let orm: HashMap<String, f32> = match &a.orm {
        Some(p) => read(p, a.from)?
            .into_iter()
            .map(|s| (s.id.clone(), s.steps.last().and_then(|x| x.score).unwrap_or(0.0)))
            .collect(),
        None => HashMap::new(),
    };
    let mut groups: Vec<Vec<Candidate>> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for (i, s) in sols.iter().enumerate() {
        let correct = s.correct.with_context(|| {
            format!(
                "{}: record {}: field `correct`: missing (grade the samples first)",
                a.input.display(),
                i + 1
            )
        })?;
        let step_scores = super::step_scores(s, &a.input, i)?;
        let outcome_score = match &a.orm {
            Some(p) => *orm
                .get(&s.id)
                .with_context(|| format!("{}: no solution with id `{}`", p.display(), s.id))?,
            None => 0.0,
        };
        let g = *index.entry(s.problem_id.clone()).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(Candidate {
            answer: s.final_answer.clone(),
            step_scores,
            outcome_score,
            correct,
        });
    }
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
    println!("{} problems, up to {most} samples each", groups.len());
    println!(
        "| method | {} |",
        ns.iter().map(|n| format!("N={n}")).collect::<Vec<_>>().join(" | ")
    );
    println!("|---|{}", "---|".repeat(ns.len()));
    for c in &curves {
        let cells: Vec<String> = c
            .points
            .iter()
            .map(|p| format!("{:.3} [{:.2}, {:.2}]", p.accuracy, p.lo, p.hi))
            .collect();
        println!("| {} | {} |", c.method, cells.join(" | "));
    }
    if let Some(out) = &a.out {
        std::fs::create_dir_all(out)?;
        std::fs::write(out.join("bon.json"), serde_json::to_string_pretty(&curves)?)?;
        stepwise_eval::plot::bon_plot(&out.join("bon"), "Best-of-N accuracy", &curves)?;
        eprintln!("wrote {}/bon.json, bon.png, bon.svg", out.display());
    }
    Ok(())
}
