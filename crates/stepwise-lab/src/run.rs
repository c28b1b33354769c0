//! A lab run: its options, its run folder (which remembers its settings) and the loop of its
//! domain ([`run_domain`]; the reasoning loop is [`crate::reasoning`]).

use crate::preset::Preset;
use crate::task::Domain;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use stepwise_model::Model;

pub use crate::reasoning::run;

/// Options of [`run`].
#[derive(Debug, Clone)]
pub struct LabOptions {
    /// Sizes and budgets.
    pub preset: Preset,
    /// Seed of everything.
    pub seed: u64,
    /// Run folder.
    pub out: PathBuf,
}

/// The run folder a run gets when none is named: `runs/PRESET-seedN`, or
/// `runs/PRESET-DOMAIN-seedN` outside the arithmetic domain.
pub fn default_run_folder(p: &Preset, seed: u64) -> PathBuf {
    PathBuf::from(match p.domain {
        Domain::Arithmetic => format!("runs/{}-seed{seed}", p.name),
        domain => format!("runs/{}-{}-seed{seed}", p.name, domain.name()),
    })
}

/// Record the preset and seed in `out/preset.json`, or check that they are those the folder was
/// started with: its cached stages belong to that run, and reusing them under other settings
/// would mix two runs without a word.
pub(crate) fn claim_run_folder(out: &Path, p: &Preset, seed: u64) -> Result<()> {
    let path = out.join("preset.json");
    let ours = serde_json::to_value((p, seed))?;
    if path.exists() {
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let mut theirs: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
        // A folder started by an earlier version lacks the settings of stages added since; they
        // govern only those stages, so the folder takes them on.
        let added = add_missing_fields(&mut theirs, &ours);
        if theirs != ours {
            let field = differing_field(&theirs, &ours);
            anyhow::bail!(
                "{} was started with other settings ({field} differs; see {}): its cached stages belong to that run. Use another --out, or delete the folder to start over",
                out.display(),
                path.display()
            );
        }
        if !added.is_empty() {
            crate::progress::say(&format!(
                "{}: settings of newer stages added ({})",
                path.display(),
                added.join(", ")
            ));
            std::fs::write(&path, serde_json::to_string_pretty(&ours)?)?;
        }
        return Ok(());
    }
    std::fs::write(&path, serde_json::to_string_pretty(&ours)?)?;
    Ok(())
}

/// Wait for the verifiers' base LM's training thread, if there is one.
pub(crate) fn join_base(training: Option<std::thread::JoinHandle<Result<Model>>>) -> Result<Option<Model>> {
    training
        .map(|h| {
            h.join()
                .map_err(|_| anyhow::anyhow!("the verifiers' base training thread panicked"))?
        })
        .transpose()
}

/// Settings added after run folders existed that change what earlier stages made (the
/// verifiers' starting model): a folder that lacks them made its stages with their serde
/// defaults, so it keeps those instead of taking on the current ones.
const CHANGE_EARLIER_STAGES: &[&str] = &[
    "domain",
    "verifier_base_steps",
    "verifier_base_shape",
    "completer",
    "verifier_last_tokens",
    "verifier_stop_at_first_bad",
];

/// Copy into the preset of `theirs` (`[preset, seed]`) the fields of `ours` it lacks (those in
/// [`CHANGE_EARLIER_STAGES`] with their serde defaults instead); returns their names.
fn add_missing_fields(theirs: &mut serde_json::Value, ours: &serde_json::Value) -> Vec<String> {
    let as_made = serde_json::from_value::<Preset>(theirs[0].clone())
        .ok()
        .and_then(|p| serde_json::to_value(p).ok());
    let (Some(t), Some(o)) = (theirs.get_mut(0).and_then(|v| v.as_object_mut()), ours[0].as_object()) else {
        return Vec::new();
    };
    let mut added = Vec::new();
    for (k, v) in o {
        if !t.contains_key(k) {
            let v = match &as_made {
                Some(made) if CHANGE_EARLIER_STAGES.contains(&k.as_str()) => made[k].clone(),
                _ => v.clone(),
            };
            t.insert(k.clone(), v);
            added.push(k.clone());
        }
    }
    added
}

/// The first preset field (or `seed`) in which two `[preset, seed]` records differ.
fn differing_field(a: &serde_json::Value, b: &serde_json::Value) -> String {
    if a.get(1) != b.get(1) {
        return "seed".into();
    }
    let (pa, pb) = (&a[0], &b[0]);
    pb.as_object()
        .and_then(|o| o.keys().find(|k| pa.get(k.as_str()) != pb.get(k.as_str())).cloned())
        .unwrap_or_else(|| "the preset".into())
}

/// Run the loop of the preset's domain, its report written to the run folder: the agent
/// domain's own ([`crate::agent::run`]) or the reasoning loop ([`run`]).
pub fn run_domain(o: &LabOptions) -> Result<()> {
    match o.preset.domain {
        Domain::Agent => crate::agent::run(o).map(drop),
        _ => run(o).map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_folder_refuses_other_settings() {
        let dir_tmp = tempfile::tempdir().unwrap();
        let dir = dir_tmp.path().join("stepwise-claim");
        std::fs::create_dir_all(&dir).unwrap();
        let p = Preset::quick();
        claim_run_folder(&dir, &p, 1).unwrap();
        claim_run_folder(&dir, &p, 1).expect("the same settings resume");
        let err = format!("{:#}", claim_run_folder(&dir, &p, 2).unwrap_err());
        assert!(err.contains("seed differs") && err.contains("--out"), "{err}");
        let other = Preset::quick().with_overrides(&["rollouts=3".into()]).unwrap();
        let err = format!("{:#}", claim_run_folder(&dir, &other, 1).unwrap_err());
        assert!(err.contains("rollouts differs"), "{err}");
        // A folder from before a stage existed takes on that stage's settings.
        let path = dir.join("preset.json");
        let mut old: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        old[0].as_object_mut().unwrap().remove("search_budgets");
        std::fs::write(&path, old.to_string()).unwrap();
        claim_run_folder(&dir, &p, 1).expect("an older folder resumes");
        assert!(std::fs::read_to_string(&path).unwrap().contains("search_budgets"));
        // But one whose verifiers started from the policy does not take on their own base.
        let mut old: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        old[0].as_object_mut().unwrap().remove("verifier_base_steps");
        std::fs::write(&path, old.to_string()).unwrap();
        let based = Preset::quick()
            .with_overrides(&["verifier_base_steps=50".into()])
            .unwrap();
        let err = format!("{:#}", claim_run_folder(&dir, &based, 1).unwrap_err());
        assert!(err.contains("verifier_base_steps differs"), "{err}");
        let from_policy = Preset::quick()
            .with_overrides(&["verifier_base_steps=0".into()])
            .unwrap();
        claim_run_folder(&dir, &from_policy, 1).expect("the folder's own setting resumes");
        // Nor does one whose rollouts were the policy's take on another completer.
        let mut old: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        old[0].as_object_mut().unwrap().remove("completer");
        std::fs::write(&path, old.to_string()).unwrap();
        let err = format!("{:#}", claim_run_folder(&dir, &from_policy, 1).unwrap_err());
        assert!(err.contains("completer differs"), "{err}");
        let policy_rollouts = from_policy.with_overrides(&["completer=policy".into()]).unwrap();
        claim_run_folder(&dir, &policy_rollouts, 1).expect("the folder's own completer resumes");
        // Nor does one whose PRMs trained on every step take on stopping at the first bad one.
        let mut old: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        old[0].as_object_mut().unwrap().remove("verifier_stop_at_first_bad");
        std::fs::write(&path, old.to_string()).unwrap();
        assert!(policy_rollouts.verifiers.stop_at_first_bad);
        let err = format!("{:#}", claim_run_folder(&dir, &policy_rollouts, 1).unwrap_err());
        assert!(err.contains("verifier_stop_at_first_bad differs"), "{err}");
        let every_step = policy_rollouts
            .with_overrides(&["verifier_stop_at_first_bad=false".into()])
            .unwrap();
        claim_run_folder(&dir, &every_step, 1).expect("the folder's own verifier labels resume");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
