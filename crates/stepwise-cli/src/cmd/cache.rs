use anyhow::{Context, Result};
use std::time::{Duration, SystemTime};
use stepwise_model::merged_cache::{self, Merged, Prune};

/// What stepwise keeps in its cache: the models it merged from PEFT adapters.
#[derive(clap::Args)]
#[command(
    after_help = "An adapter folder or id given as a model is merged onto its base once and kept in the cache
($STEPWISE_CACHE, else $XDG_CACHE_HOME/stepwise, else ~/.cache/stepwise), under merged/NAME-HASH/:
as large as the base, so they add up. Each run that finds one marks it used.
$STEPWISE_CACHE_MAX_GB=N keeps the merged models under N GiB: after each merge the least recently
used others go. Models downloaded from the Hub live in the Hugging Face cache (`hf cache ls`).

Examples:
  stepwise cache list
  stepwise cache prune --unused-for 30d
  stepwise cache prune --max-gb 20
  stepwise cache remove prm-lora-3f2a9c0d1e2b4a5f"
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

/// What to do with the cache.
#[derive(clap::Subcommand)]
pub enum Command {
    /// The merged models, most recently used first: name, size, last use, adapter and base.
    List {
        /// One JSON object a line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove merged models by name (as `list` shows them), or all of them.
    Remove {
        /// Their names.
        #[arg(required_unless_present = "all")]
        names: Vec<String>,
        /// Every merged model.
        #[arg(long, conflicts_with = "names")]
        all: bool,
    },
    /// Remove the merged models not used for a while and/or the least recently used past a size,
    /// and merges left unfinished by runs that were killed.
    Prune {
        /// Not used for longer than this: a number with d (days), h or m (minutes); days when bare.
        #[arg(long, value_parser = parse_age)]
        unused_for: Option<Duration>,
        /// Then the least recently used, until the merged models take at most this many GiB.
        #[arg(long)]
        max_gb: Option<f64>,
    },
}

/// Run a cache command.
pub fn run(a: Args) -> Result<()> {
    let root = stepwise_model::peft::cache_root().context("no cache folder: set STEPWISE_CACHE")?;
    match a.command {
        Command::List { json } => list(&root, json),
        Command::Remove { names, all } => {
            let names = match all {
                true => merged_cache::list(&root)?.into_iter().map(|m| m.name).collect(),
                false => names,
            };
            say_removed(&merged_cache::remove_all(&root, &names)?);
            Ok(())
        }
        Command::Prune { unused_for, max_gb } => {
            let max_bytes = max_gb
                .map(|gb| merged_cache::gib(gb).with_context(|| format!("--max-gb {gb}")))
                .transpose()?;
            let how = Prune {
                unused_for,
                max_bytes,
                keep: None,
            };
            say_removed(&merged_cache::prune(&root, &how)?);
            Ok(())
        }
    }
}

fn list(root: &std::path::Path, json: bool) -> Result<()> {
    let all = merged_cache::list(root)?;
    if json {
        for m in &all {
            println!("{}", as_json(m));
        }
        return Ok(());
    }
    println!("{}", root.join("merged").display());
    if all.is_empty() {
        println!("  (no merged models)");
        return Ok(());
    }
    println!("  {:<44} {:>9}  {:<10}  adapter → base", "name", "size", "last used");
    for m in &all {
        let name = match m.unfinished {
            Some(true) => format!("{} (merging)", m.name),
            Some(false) => format!("{} (unfinished)", m.name),
            None => m.name.clone(),
        };
        let from = |x: &Option<String>| x.clone().unwrap_or_else(|| "?".into());
        println!(
            "  {name:<44} {:>9}  {:<10}  {} → {}",
            size(m.bytes),
            ago(m.last_used),
            from(&m.adapter),
            from(&m.base)
        );
    }
    let total: u64 = all.iter().map(|m| m.bytes).sum();
    println!("  {} in {} merged models", size(total), all.len());
    Ok(())
}

fn as_json(m: &Merged) -> serde_json::Value {
    let secs = m
        .last_used
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    serde_json::json!({
        "name": m.name, "path": m.path, "bytes": m.bytes, "last_used": secs,
        "adapter": m.adapter, "base": m.base, "unfinished": m.unfinished.is_some(),
    })
}

fn say_removed(removed: &[Merged]) {
    for m in removed {
        println!("removed {} ({})", m.path.display(), size(m.bytes));
    }
    let total: u64 = removed.iter().map(|m| m.bytes).sum();
    println!("{} freed, {} merged models removed", size(total), removed.len());
}

/// Bytes for people: `512 B`, `1.5 MiB`, `14.2 GiB`.
fn size(bytes: u64) -> String {
    let mut x = bytes as f64;
    for unit in ["B", "KiB", "MiB", "GiB"] {
        if x < 1024.0 || unit == "GiB" {
            return if unit == "B" {
                format!("{bytes} B")
            } else {
                format!("{x:.1} {unit}")
            };
        }
        x /= 1024.0;
    }
    unreachable!()
}

/// How long ago, in the largest whole unit: `5 min ago`, `3 h ago`, `12 d ago`.
fn ago(t: SystemTime) -> String {
    let s = SystemTime::now().duration_since(t).unwrap_or_default().as_secs();
    match s {
        0..60 => "just now".into(),
        60..3600 => format!("{} min ago", s / 60),
        3600..86400 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86400),
    }
}

/// `30d`, `12h`, `90m` or a bare number of days.
fn parse_age(arg: &str) -> Result<Duration, String> {
    let arg = arg.trim();
    let (number, unit) = match arg.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&arg[..i], c),
        _ => (arg, 'd'),
    };
    let seconds = match unit {
        'd' => 86400.0,
        'h' => 3600.0,
        'm' => 60.0,
        _ => return Err(format!("{arg}: a number with d, h or m")),
    };
    match number.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(Duration::from_secs_f64(x * seconds)),
        _ => Err(format!("{arg}: a number with d, h or m (30d, 12h, 90m)")),
    }
}
