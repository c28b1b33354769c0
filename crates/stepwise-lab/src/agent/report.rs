//! The agent lab's report: `metrics.json` (`"domain": "agent"`), `report.md`/`.html` and the
//! best-of-N plot.

use super::evaluate::{lucky_ids, lucky_share, BestOfN};
use super::heads::HeadsReport;
use super::labels::{LabelCost, Labels};
use super::rl::AgentRlReport;
use super::search::SearchReport;
use crate::preset::Preset;
use anyhow::Result;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;
use stepwise_core::Solution;
use stepwise_eval::bon::Curve;

/// What the policy does on the held-out worlds.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyStats {
    /// Trajectories.
    pub trajectories: usize,
    /// Share that reached the goal.
    pub success_rate: f64,
    /// Share of successes that are lucky (an invalid or regressing action on the way).
    pub lucky_rate: f64,
    /// Share that stopped of the policy's own accord.
    pub stop_rate: f64,
    /// Mean actions per trajectory.
    pub mean_actions: f64,
    /// Share of actions by the oracle's verdict (`progress`, `useless`, `regress`, `invalid`, `ruin`).
    pub actions: BTreeMap<String, f64>,
}

/// The agent lab's report.
#[derive(Debug, Clone, Serialize)]
pub struct AgentReport {
    /// Always `agent`.
    pub domain: String,
    /// The preset's name.
    pub preset: String,
    /// The seed.
    pub seed: u64,
    /// The policy on the held-out worlds.
    pub policy: PolicyStats,
    /// Label sources on the label split: agreement with the oracle and cost (`mc`, `td`, `return`).
    pub labels: BTreeMap<String, LabelCost>,
    /// Environment steps of the labelled trajectories themselves.
    pub label_trajectory_steps: u64,
    /// The promise and progress heads' readings of the held-out actions against the oracle.
    pub heads: HeadsReport,
    /// Best-of-N over held-out trajectories.
    pub bon: BestOfN,
    /// Beam search over actions against best-of-N and one sample (`None`: no search worlds).
    pub search: Option<SearchReport>,
    /// RL with per-action rewards against outcome-only RL (`None`: no RL updates).
    pub rl: Option<AgentRlReport>,
    /// Seconds the run took (stages cached by an earlier run cost nothing).
    pub seconds: f64,
    /// Wall-clock seconds of each stage of this run.
    #[serde(default)]
    pub stage_seconds: Vec<crate::progress::StageSeconds>,
    /// Plot files written beside the report.
    pub plots: Vec<String>,
}

/// The policy's statistics on held-out trajectories (`oracle`: the same, labelled by the oracle).
fn policy_stats(ts: &[Solution], oracle: &[Solution]) -> PolicyStats {
    let n = ts.len().max(1) as f64;
    let wins = ts.iter().filter(|t| t.correct == Some(true)).count();
    let mut actions: BTreeMap<String, f64> = BTreeMap::new();
    let mut total = 0usize;
    for k in oracle
        .iter()
        .filter_map(|o| o.meta.get("actions").and_then(|a| a.as_array()))
        .flatten()
    {
        *actions.entry(k.as_str().unwrap_or("?").to_string()).or_default() += 1.0;
        total += 1;
    }
    actions.values_mut().for_each(|v| *v /= total.max(1) as f64);
    PolicyStats {
        trajectories: ts.len(),
        success_rate: wins as f64 / n,
        lucky_rate: lucky_share(ts, &lucky_ids(oracle)),
        stop_rate: ts.iter().filter(|t| super::policy::stopped(t)).count() as f64 / n,
        mean_actions: ts.iter().map(|t| t.steps.len()).sum::<usize>() as f64 / n,
        actions,
    }
}

/// What the stages after sampling found.
pub struct Stages<'a> {
    /// The label sources.
    pub labels: &'a Labels,
    /// The promise and progress heads.
    pub heads: HeadsReport,
    /// Best-of-N.
    pub bon: BestOfN,
    /// Search.
    pub search: Option<SearchReport>,
    /// RL.
    pub rl: Option<AgentRlReport>,
}

/// The report of a run.
pub fn build(
    p: &Preset,
    seed: u64,
    eval: &[Solution],
    eval_oracle: &[Solution],
    st: Stages<'_>,
    seconds: f64,
) -> AgentReport {
    let Stages {
        labels,
        heads,
        bon,
        search,
        rl,
    } = st;
    AgentReport {
        domain: "agent".into(),
        preset: p.name.clone(),
        seed,
        policy: policy_stats(eval, eval_oracle),
        labels: labels.costs.iter().cloned().collect(),
        label_trajectory_steps: labels.trajectory_steps,
        heads,
        bon,
        search,
        rl,
        seconds,
        stage_seconds: Vec::new(),
        plots: Vec::new(),
    }
}

/// The one-line summary.
pub fn headline(r: &AgentReport) -> String {
    let at = |label: &str| {
        r.bon
            .curves
            .iter()
            .find(|c| c.method == label)
            .and_then(|c| c.points.last())
            .map_or(f64::NAN, |pt| pt.accuracy)
    };
    let n = r.bon.curves.first().and_then(|c| c.points.last()).map_or(0, |pt| pt.n);
    format!(
        "agent lab ({} preset, seed {}): policy success {:.3}; best-of-{n} PRM-MC-min {:.3}, PRM-TD-min {:.3}, ORM {:.3}, majority {:.3}, pass@{n} {:.3}",
        r.preset,
        r.seed,
        r.policy.success_rate,
        at("PRM-MC-min"),
        at("PRM-TD-min"),
        at("ORM"),
        at("majority"),
        at("pass@N"),
    )
}

fn body(r: &AgentReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Agent lab report ({} preset, seed {})\n\n{}\n",
        r.preset,
        r.seed,
        headline(r)
    );
    let pol = &r.policy;
    let _ = writeln!(
        s,
        "## The policy\n\nOn {} held-out trajectories it reaches the goal in {:.1}% ({:.1}% of those are lucky: an invalid or regressing action on the way), stops of its own accord in {:.1}%, and takes {:.1} actions on average. Its actions by the oracle's verdict: {}.\n",
        pol.trajectories,
        100.0 * pol.success_rate,
        100.0 * pol.lucky_rate,
        100.0 * pol.stop_rate,
        pol.mean_actions,
        pol.actions.iter().map(|(k, v)| format!("{k} {:.1}%", 100.0 * v)).collect::<Vec<_>>().join(", ")
    );
    let _ = writeln!(
        s,
        "## Labels for actions\n\nAgreement with the oracle: the AUC of each action's progress, the oracle's good actions against its bad ones (0.5 is chance). Environment steps are those spent labelling, beyond the {} steps of the trajectories themselves.\n\n| labels | AUC | actions compared | environment steps | policy tokens |\n|---|---|---|---|---|",
        r.label_trajectory_steps
    );
    for (name, c) in &r.labels {
        let _ = writeln!(
            s,
            "| {name} | {:.3} | {} | {} | {} |",
            c.agreement.auc, c.agreement.compared, c.env_steps, c.tokens
        );
    }
    heads_section(&mut s, &r.heads);
    let _ = writeln!(
        s,
        "## Best-of-N over trajectories\n\nSuccess, and in brackets clean success (no invalid or regressing action on the way: a lucky success counts as a failure), when each method picks one of N trajectories of a held-out world.\n\n| method | {} |\n|---|{}",
        r.bon
            .curves
            .first()
            .map(|c| c
                .points
                .iter()
                .map(|p| format!("N={}", p.n))
                .collect::<Vec<_>>()
                .join(" | "))
            .unwrap_or_default(),
        r.bon
            .curves
            .first()
            .map(|c| "---|".repeat(c.points.len()))
            .unwrap_or_default()
    );
    for (c, k) in r.bon.curves.iter().zip(&r.bon.clean_curves) {
        let cells: Vec<String> = c
            .points
            .iter()
            .zip(&k.points)
            .map(|(p, q)| format!("{:.3} ({:.3})", p.accuracy, q.accuracy))
            .collect();
        let _ = writeln!(s, "| {} | {} |", c.method, cells.join(" | "));
    }
    let _ = writeln!(
        s,
        "\n{}",
        if r.bon.orm_shortfall < 0.005 {
            "The ORM picks a success whenever there is one (it reaches pass@N at every N): the outcome is readable from the trajectory, and on success no selector can beat it; clean success is where a verifier of actions can.".to_string()
        } else {
            format!(
                "The ORM falls short of pass@N by up to {:.3} on success.",
                r.bon.orm_shortfall
            )
        }
    );
    let _ = writeln!(
        s,
        "\nLucky successes among what each selector picks from all of a world's trajectories (the pool: every success): {}.\n",
        r.bon.lucky.iter().map(|(k, v)| format!("{k} {:.1}%", 100.0 * v)).collect::<Vec<_>>().join(", ")
    );
    if let Some(x) = &r.search {
        search_section(&mut s, x);
    }
    if let Some(x) = &r.rl {
        rl_section(&mut s, x, &r.policy);
    }
    let paired: Vec<_> = r
        .bon
        .paired
        .iter()
        .chain(r.search.iter().flat_map(|x| &x.paired))
        .chain(r.rl.iter().flat_map(|x| &x.paired))
        .collect();
    crate::report::paired_table(&mut s, &paired);
    crate::progress::time_section(&mut s, &r.stage_seconds);
    if !r.plots.is_empty() {
        let _ = writeln!(s, "Plots: {}", r.plots.join(", "));
    }
    s
}

fn heads_section(s: &mut String, h: &HeadsReport) {
    let _ = writeln!(
        s,
        "\n## Promise and progress heads\n\nTwo verifiers from the same TD labels: PRM-TD learns each action's promise (the value of the state it led to), the progress head its advantage (`(A + 1) / 2`, read as `A = 2s − 1`). On the held-out actions, the AUC of each reading, the oracle's good actions against its bad ones.\n\n| reading | AUC | actions compared (good) |\n|---|---|---|"
    );
    for (name, a) in [
        ("progress head, 2s − 1", &h.progress_head),
        ("promise head's change, s − s_before / γ", &h.promise_change),
        ("promise head, s", &h.promise),
    ] {
        let _ = writeln!(s, "| {name} | {:.3} | {} ({}) |", a.auc, a.compared, a.good);
    }
    let _ = writeln!(s);
}

fn search_section(s: &mut String, x: &SearchReport) {
    let row = |m: &std::collections::BTreeMap<String, f64>, k: &str, digits: usize| {
        m.get(k).map_or("-".to_string(), |v| format!("{v:.digits$}"))
    };
    let _ = writeln!(
        s,
        "## Search over actions\n\nOn {} worlds of its own: beam search guided by PRM-MC ({} beams, {} actions sampled from each, the world stepping every candidate) against best-of-{} whole trajectories picked by PRM-MC-min, and one sampled trajectory.\n\n| method | success | lucky among successes | policy tokens per world | environment steps per world |\n|---|---|---|---|---|",
        x.worlds, x.beam.0, x.beam.1, x.beam.0 * x.beam.1
    );
    for k in ["beam", "best-of-N", "sample"] {
        let _ = writeln!(
            s,
            "| {k} | {} | {} | {} | {} |",
            row(&x.success, k, 3),
            row(&x.lucky, k, 3),
            row(&x.tokens, k, 0),
            row(&x.env_steps, k, 0)
        );
    }
    let _ = writeln!(s);
}

fn rl_section(s: &mut String, x: &AgentRlReport, before: &PolicyStats) {
    let (u, w, g) = x.budget;
    let _ = writeln!(
        s,
        "## RL with per-action rewards\n\nGRPO over the policy's own trajectories in the demonstration worlds, {u} updates of {w} worlds × {g} trajectories for every reward source (the world's observations are read, not learned), {} a source with their own RL seeds (the same seeds for every source), then {} trajectories of each held-out world after each run; the measures pool the runs, a world's success is its mean over them, and the runs' own successes show the spread the training's randomness makes. Before RL the policy reached the goal in {:.1}% ({:.1}% of successes lucky). Clean success: the goal with no invalid or regressing action on the way. Credit: how a process reward became each action's advantage (`--credit`; — for the goal alone and for PRIME, whose implicit PRM rewards tokens).\n\n| reward | credit | success (95% CI) | by run | clean success | lucky among successes | stopped | actions | sampled tokens | KL | success during RL, first → last tenth |\n|---|---|---|---|---|---|---|---|---|---|---|",
        match x.seeds {
            1 => "one run".to_string(),
            n => format!("{n} runs"),
        },
        x.eval_samples,
        100.0 * before.success_rate,
        100.0 * before.lucky_rate,
    );
    for v in &x.variants {
        let _ = writeln!(
            s,
            "| {} | {} | {:.3} [{:.3}, {:.3}] | {} | {:.3} | {:.3} | {:.3} | {:.1} | {} | {:.3} | {:.3} → {:.3} |",
            v.reward,
            v.credit.map_or("—", |c| c.name()),
            v.success,
            v.ci95.0,
            v.ci95.1,
            v.success_by_run
                .iter()
                .map(|x| format!("{x:.3}"))
                .collect::<Vec<_>>()
                .join(" / "),
            v.clean_success,
            v.lucky_rate,
            v.stop_rate,
            v.mean_actions,
            v.sampled_tokens,
            v.kl,
            v.success_first_last.0,
            v.success_first_last.1
        );
    }
    let _ = writeln!(s);
}

/// Write `metrics.json`, `report.md`, `report.html` and the best-of-N plot into `dir`.
pub fn write(dir: &Path, r: &AgentReport) -> Result<()> {
    let mut r = r.clone();
    let title = format!("Best-of-N over held-out trajectories ({} preset)", r.preset);
    // The headline methods only: the other aggregations lie on top of these.
    let shown = |curves: &[Curve], methods: &[&str]| -> Vec<Curve> {
        curves
            .iter()
            .filter(|c| methods.contains(&c.method.as_str()))
            .cloned()
            .collect()
    };
    let success = shown(
        &r.bon.curves,
        &["pass@N", "majority", "ORM", "PRM-MC-min", "PRM-TD-min"],
    );
    // Clean success, where a verifier of actions can pass the ORM; the first three methods and
    // PRM-MC-min keep their colours from the success plot.
    let clean = shown(
        &r.bon.clean_curves,
        &["pass@N", "majority", "ORM", "PRM-MC-min", "PRM-MC-mean"],
    );
    let clean_title = format!(
        "Best-of-N, clean success: no invalid or regressing action ({} preset)",
        r.preset
    );
    r.plots = [("bon", &title, &success), ("bon_clean", &clean_title, &clean)]
        .into_iter()
        .flat_map(
            |(stem, title, curves)| match stepwise_eval::plot::bon_plot(&dir.join(stem), title, curves) {
                Ok(()) => vec![format!("{stem}.png"), format!("{stem}.svg")],
                Err(e) => vec![format!("{stem}: {e}")],
            },
        )
        .collect();
    std::fs::write(dir.join("metrics.json"), serde_json::to_string_pretty(&r)?)?;
    let md = body(&r);
    std::fs::write(dir.join("report.md"), &md)?;
    std::fs::write(dir.join("report.html"), crate::html::markdown_to_html(&md))?;
    Ok(())
}
