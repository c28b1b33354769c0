//! `stepwise studio`: the labelling studio (stepwise-studio) from the command line: start it
//! on records, manage accounts, import more records, re-rank with a new PRM, export labels.

use anyhow::{bail, Context, Result};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use stepwise_core::seams::score_solutions;
use stepwise_core::{Format, Solution, SolutionWriter};
use stepwise_studio::export::{export, Shape};
use stepwise_studio::{NewRecord, Policy, Project, Role, Settings, Store};

/// People label steps in the browser: PRM800K's workflow with a PRM's help and active learning.
#[derive(clap::Args)]
#[command(
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    after_help = "Start a studio on records, make accounts, label, export:
  # reads the password from stdin
  stepwise studio user add alice --role labeller --db labels.sqlite
  stepwise studio --db labels.sqlite --input samples.jsonl --prm PRM_DIR --port 8080
  # open http://127.0.0.1:8080, sign in, rate steps with 1 / 2 / 3 (−1 / 0 / +1), j/k, f to finish
  stepwise studio export --db labels.sqlite --to prm800k --output labels.jsonl
  stepwise train-prm --input labels.jsonl --base BASE --output prm2/
  stepwise studio next-generation --db labels.sqlite --prm prm2/       # re-rank what is left

The queue: --policy uniform (a seeded shuffle), convincing-wrong (PRM800K phase 2: wrong final answers
the PRM scores highest first; needs gold answers and PRM scores) or uncertainty (ActPRM: the records
whose steps the scorers are least sure of: an ensemble's spread, or one score's closeness to 1/2).
Scores come from --prm (scored on import, shown beside each step unless --blind) or from the records
(`scores`, Monte Carlo soft labels). --gold FILE adds quality-control records (their step labels are the
gold ratings), served to every labeller once in every --qc-every records.

A project's settings are fixed when it is created (the first start with --project NAME); later
starts add records to it. --guidelines FILE gives labellers written instructions (replaced at each
start given one; admins can also edit them on the dashboard). The HTTP API the page uses is in
docs/studio.md, so scripts can label too."
)]
pub struct Args {
    #[command(subcommand)]
    action: Option<Action>,
    #[command(flatten)]
    start: Start,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Accounts: `user add NAME --role ROLE` (password from stdin), `user list`.
    #[command(subcommand)]
    User(UserAction),
    /// Add records (any format stepwise reads) to a project; all of a file or, on a bad record,
    /// none of it.
    Import(Import),
    /// Write the labels in any format stepwise writes (PRM800K: one line per labeller and
    /// record; others: the adjudicated or majority rating per step, every labeller in `meta.studio`).
    Export(ExportArgs),
    /// Score the records nobody has had yet with a new PRM and rank them again (the next
    /// generation of PRM800K's active learning).
    NextGeneration(NextGeneration),
}

#[derive(clap::Subcommand)]
enum UserAction {
    /// Create an account, or set its role and password (the password is read from stdin).
    Add {
        /// The user name.
        name: String,
        /// labeller (rates what is assigned to them), reviewer (also the dashboard and
        /// adjudication) or admin (also export).
        #[arg(long, default_value = "labeller")]
        role: Role,
        /// The studio's database.
        #[arg(long)]
        db: PathBuf,
    },
    /// List the accounts.
    List {
        /// The studio's database.
        #[arg(long)]
        db: PathBuf,
    },
}

/// Where records come from and how they are ranked.
#[derive(clap::Args)]
struct Source {
    /// The studio's database (SQLite; created if missing).
    #[arg(long)]
    db: Option<PathBuf>,
    /// Records to label, in any format stepwise reads.
    #[arg(long)]
    input: Option<PathBuf>,
    /// Input format (detected when omitted).
    #[arg(long)]
    from: Option<Format>,
    /// Gold quality-control records (their step labels are the gold ratings).
    #[arg(long)]
    gold: Option<PathBuf>,
    /// The project.
    #[arg(long, default_value = "default")]
    project: String,
    /// A PRM (checkpoint folder, Hub id in the cache, or server URL) whose step scores are
    /// shown as suggestions and rank the queue.
    #[arg(long, value_parser = super::backend::source)]
    prm: Option<super::backend::Source>,
    /// The PRM's layout (auto, qwen-prm, step-tag, token-cls, log-ratio).
    #[arg(long, default_value = "auto")]
    layout: String,
    #[command(flatten)]
    device: super::backend::DeviceArgs,
    #[command(flatten)]
    remote: super::backend::RemoteArgs,
}

/// The settings a new project is created with.
#[derive(clap::Args)]
struct ProjectArgs {
    /// The queue's order: uniform, convincing-wrong or uncertainty.
    #[arg(long, default_value = "uniform")]
    policy: Policy,
    /// Labellers per record.
    #[arg(long, default_value_t = 1)]
    overlap: u32,
    /// PRM800K phase 2: a labelling ends at the first −1 (found_error).
    #[arg(long)]
    stop_at_first_bad: bool,
    /// Blind labelling: the PRM's scores are not shown.
    #[arg(long)]
    blind: bool,
    /// One gold record in every N served (0: none).
    #[arg(long, default_value_t = 10)]
    qc_every: u32,
    /// Show steps as code with line numbers (default: when the records are HumanEval's).
    #[arg(long)]
    code: bool,
    /// Seed of the uniform shuffle.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Labelling guidelines (a text file; `$…$` math is typeset) shown to every labeller on
    /// their first visit and after each change, and under `g` on the page. Unlike the settings
    /// they may change: each start or import given this replaces them (an empty file removes them).
    #[arg(long)]
    guidelines: Option<PathBuf>,
}

#[derive(clap::Args)]
struct Start {
    #[command(flatten)]
    source: Source,
    #[command(flatten)]
    project: ProjectArgs,
    /// Port to listen on.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Address to listen on (0.0.0.0 for every interface; put HTTPS in front and pass
    /// --secure-cookie).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Mark the session cookie Secure (served behind HTTPS).
    #[arg(long)]
    secure_cookie: bool,
}

#[derive(clap::Args)]
struct Import {
    #[command(flatten)]
    source: Source,
    #[command(flatten)]
    project: ProjectArgs,
}

#[derive(clap::Args)]
struct ExportArgs {
    /// The studio's database.
    #[arg(long)]
    db: PathBuf,
    /// The project.
    #[arg(long, default_value = "default")]
    project: String,
    /// Output format.
    #[arg(long, default_value = "stepwise")]
    to: Format,
    /// Output file (.jsonl, .json or .parquet; `-` for standard output).
    #[arg(long)]
    output: PathBuf,
    /// Also the records nobody finished, as imported.
    #[arg(long)]
    include_unlabelled: bool,
}

#[derive(clap::Args)]
struct NextGeneration {
    #[command(flatten)]
    source: Source,
}

pub fn run(a: Args) -> Result<()> {
    match a.action {
        None => start(a.start),
        Some(Action::User(UserAction::Add { name, role, db })) => {
            let password = read_password()?;
            Store::open(&db)?.set_user(&name, role, &password)?;
            eprintln!("{name}: {role}");
            Ok(())
        }
        Some(Action::User(UserAction::List { db })) => {
            for (name, role) in Store::open(&db)?.users()? {
                println!("{name}\t{role}");
            }
            Ok(())
        }
        Some(Action::Import(i)) => {
            let mut store = open(&i.source)?;
            let project = project(&mut store, &i.source, &i.project)?;
            set_guidelines(&mut store, &project, &i.project)?;
            import(&mut store, &project, &i.source)
        }
        Some(Action::Export(e)) => run_export(e),
        Some(Action::NextGeneration(n)) => next_generation(n),
    }
}

fn read_password() -> Result<String> {
    if let Ok(p) = std::env::var("STEPWISE_STUDIO_PASSWORD") {
        return Ok(p);
    }
    eprintln!("password (one line on stdin):");
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .context("reading the password from stdin")?;
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

fn open(s: &Source) -> Result<Store> {
    let Some(db) = &s.db else {
        bail!("--db is required: the studio's database (created if missing)");
    };
    Store::open(db)
}

fn project(store: &mut Store, s: &Source, p: &ProjectArgs) -> Result<Project> {
    let code = p.code || s.from == Some(Format::HumanEval);
    let settings = Settings {
        overlap: p.overlap.max(1),
        stop_at_first_bad: p.stop_at_first_bad,
        assist: !p.blind,
        policy: p.policy,
        qc_every: p.qc_every,
        code,
    };
    let project = store.project_or_create(&s.project, &settings, p.seed)?;
    if project.settings != settings {
        eprintln!(
            "project `{}` exists: its settings are kept ({})",
            project.name,
            serde_json::to_string(&project.settings)?
        );
    }
    Ok(project)
}

/// Reads `path` whole (a bad record fails it all, naming file, line and field), scored by
/// `--prm` when given.
fn read(path: &Path, s: &Source) -> Result<Vec<Solution>> {
    let mut sols = stepwise_core::io::read_solution_set(path, s.from)?;
    if let Some(prm) = &s.prm {
        let backend = s.device.open_scorer(prm, &s.layout, &s.remote)?;
        let scorer = backend.scorer();
        let bar = crate::progress::bar(Some(sols.len() as u64), "scoring");
        score_solutions(&*scorer, "prm", &mut sols, 64, |done| bar.set_position(done as u64))?;
        bar.finish_and_clear();
    }
    Ok(sols)
}

fn import(store: &mut Store, project: &Project, s: &Source) -> Result<()> {
    let mut records = Vec::new();
    for (path, gold) in [(&s.input, false), (&s.gold, true)] {
        let Some(path) = path else { continue };
        let sols = read(path, s)?;
        if gold {
            if let Some(sol) = sols.iter().find(|x| x.steps.iter().all(|st| st.label.is_none())) {
                bail!(
                    "{}: gold record `{}` has no step labels to check labellers against",
                    path.display(),
                    sol.id
                );
            }
        }
        records.extend(NewRecord::each(sols, gold));
    }
    let n = records.len();
    let added = store.add_records(project, records)?;
    let (all, gold) = store.count_records(project)?;
    eprintln!(
        "project `{}`: {added} of {n} records added ({} already there); {all} records, {gold} gold; queue: {}",
        project.name,
        n - added,
        project.settings.policy
    );
    Ok(())
}

/// The project's guidelines replaced by `--guidelines FILE`'s text, when given.
fn set_guidelines(store: &mut Store, project: &Project, p: &ProjectArgs) -> Result<()> {
    let Some(path) = &p.guidelines else { return Ok(()) };
    let text = std::fs::read_to_string(path).with_context(|| format!("reading the guidelines {}", path.display()))?;
    store
        .set_guidelines(project, &text, "command line")
        .with_context(|| format!("{}", path.display()))?;
    match text.trim().is_empty() {
        true => eprintln!(
            "project `{}`: guidelines removed ({} is empty)",
            project.name,
            path.display()
        ),
        false => eprintln!("project `{}`: guidelines set from {}", project.name, path.display()),
    }
    Ok(())
}

fn start(a: Start) -> Result<()> {
    let mut store = open(&a.source)?;
    if a.source.input.is_some() || a.source.gold.is_some() {
        let project = project(&mut store, &a.source, &a.project)?;
        set_guidelines(&mut store, &project, &a.project)?;
        import(&mut store, &project, &a.source)?;
    } else if a.project.guidelines.is_some() {
        let name = &a.source.project;
        let project = store
            .project(name)?
            .with_context(|| format!("no project `{name}` to give guidelines to: start it with --input FILE"))?;
        set_guidelines(&mut store, &project, &a.project)?;
    }
    if store.projects()?.is_empty() {
        bail!("the database has no project yet: start with --input FILE (records to label)");
    }
    if store.users()?.is_empty() {
        eprintln!("no accounts yet: stepwise studio user add NAME --role admin --db ...");
    }
    let router = stepwise_studio::server::app(store, a.secure_cookie);
    let address = format!("{}:{}", a.host, a.port);
    let limits = stepwise_remote::serve::Limits {
        max_body_bytes: stepwise_studio::server::MAX_BODY,
        ..Default::default()
    };
    stepwise_remote::serve::serve_router(router, &address, &limits, |addr| {
        eprintln!("stepwise studio: http://{addr}/ (Ctrl-C stops; every saved rating is on disk)");
    })
}

fn run_export(e: ExportArgs) -> Result<()> {
    let store = Store::open(&e.db)?;
    let project = store
        .project(&e.project)?
        .with_context(|| format!("{}: no project `{}`", e.db.display(), e.project))?;
    let shape = if e.to == Format::Prm800k {
        Shape::PerLabelling
    } else {
        Shape::PerRecord
    };
    let records = export(&store, &project, shape, e.include_unlabelled)?;
    let mut w = SolutionWriter::create(&e.output, e.to)?;
    for r in &records {
        w.write(r)?;
    }
    w.finish()?;
    eprintln!("{} records written to {} ({})", records.len(), e.output.display(), e.to);
    Ok(())
}

fn next_generation(n: NextGeneration) -> Result<()> {
    let mut store = open(&n.source)?;
    let project = store
        .project(&n.source.project)?
        .with_context(|| format!("no project `{}`", n.source.project))?;
    let Some(prm) = &n.source.prm else {
        bail!("--prm is required: the PRM that ranks the next generation");
    };
    let mut left = store.unassigned(&project)?;
    let backend = n.source.device.open_scorer(prm, &n.source.layout, &n.source.remote)?;
    let scorer = backend.scorer();
    let mut sols: Vec<Solution> = left.iter().map(|(_, s)| s.clone()).collect();
    let bar = crate::progress::bar(Some(sols.len() as u64), "scoring");
    score_solutions(&*scorer, "prm", &mut sols, 64, |done| bar.set_position(done as u64))?;
    bar.finish_and_clear();
    for ((_, old), new) in left.iter_mut().zip(sols) {
        *old = new;
    }
    let generation = store.next_generation(&project, &left)?;
    eprintln!(
        "project `{}`: generation {generation}: {} records not yet given ranked again ({})",
        project.name,
        left.len(),
        project.settings.policy
    );
    Ok(())
}
