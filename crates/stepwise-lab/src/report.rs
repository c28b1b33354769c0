//! The lab's evaluation and report: best-of-N curves, first-error localisation (ProcessBench's
//! metric), Monte Carlo label quality, calibration; `metrics.json`, `report.md`, `report.html`
//! and plots in the run folder, and a headline table for the terminal.

use crate::pipeline::Preset;
use crate::task::LabProblem;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;
use stepwise_core::Solution;
use stepwise_eval::bon::{curve, Curve, Method};
use stepwise_eval::labels::{calibration, label_quality, LabelQuality};
use stepwise_eval::processbench::{predict_first_error, score, ProcessBenchScore};
use stepwise_eval::ranking::{discrimination, Discrimination};
use stepwise_search::{aggregate, Aggregation, Candidate, Selector};

/// Everything the lab measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// Preset name.
    pub preset: String,
    /// Seed.
    pub seed: u64,
    /// Held-out problems and samples per problem.
    pub eval_problems: usize,
    /// Samples per evaluation problem.
    pub eval_samples: usize,
    /// How the verifiers were built and trained.
    #[serde(default)]
    pub verifiers: String,
    /// Single-sample accuracy of the policy on held-out problems.
    pub policy_accuracy: f64,
    /// Of the samples with a correct final answer, the fraction whose process the oracle rejects.
    pub lucky_correct_rate: f64,
    /// Best-of-N curves.
    pub bon: Vec<Curve>,
    /// Best-of-N at the largest N on each problem family: where each method wins and loses.
    #[serde(default)]
    pub by_family: Vec<FamilyRow>,
    /// First-error localisation on held-out samples, by verifier.
    pub processbench: Vec<(String, ProcessBenchScore)>,
    /// Ranking quality on held-out samples, by verifier (PRMs ranked by their min step score).
    #[serde(default)]
    pub discrimination: Vec<(String, Discrimination)>,
    /// Monte Carlo labels against the oracle: hard (any rollout succeeded) and soft.
    pub mc_label_quality: LabelQuality,
    /// Rollouts spent per labelled step.
    pub rollouts_per_step: f64,
    /// Calibration bins of step scores against oracle labels, by verifier.
    pub calibration: Vec<stepwise_eval::labels::CalibrationSeries>,
    /// Plot files written (or why not).
    pub plots: Vec<String>,
}

/// Best-of-N accuracy on one problem family, by method.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FamilyRow {
    /// Template family.
    pub family: String,
    /// Held-out problems of the family.
    pub problems: usize,
    /// Samples per problem the methods select from.
    pub n: usize,
    /// `(method, accuracy)` in the order of the best-of-N curves.
    pub accuracy: Vec<(String, f64)>,
}

/// Each method's best-of-`n` accuracy on the problems of each family (`families[i]` is problem
/// `i`'s), families in order of first appearance.
fn by_family(
    families: &[String],
    methods: &[(String, &[Vec<Candidate>], Method)],
    n: usize,
    draws: usize,
    seed: u64,
) -> Vec<FamilyRow> {
    let mut members: Vec<(&String, Vec<usize>)> = Vec::new();
    for (i, f) in families.iter().enumerate() {
        match members.iter_mut().find(|(name, _)| *name == f) {
            Some((_, idx)) => idx.push(i),
            None => members.push((f, vec![i])),
        }
    }
    members
        .into_iter()
        .map(|(family, idx)| {
            let accuracy = methods
                .iter()
                .map(|(name, g, how)| {
                    let subset: Vec<Vec<Candidate>> = idx.iter().map(|&i| g[i].clone()).collect();
                    let c = curve(name, &subset, *how, &[n], draws, seed);
                    (name.clone(), c.points[0].accuracy)
                })
                .collect();
            FamilyRow {
                family: family.clone(),
                problems: idx.len(),
                n,
                accuracy,
            }
        })
        .collect()
}

/// Compute the report from the scored evaluation samples.
#[allow(clippy::too_many_arguments)]
pub fn evaluate(
    p: &Preset,
    seed: u64,
    eval: &[LabProblem],
    scored: &[Solution],
    s_mc: &[Vec<f32>],
    s_or: &[Vec<f32>],
    s_orm: &[Vec<f32>],
    s_policy: &[Vec<f32>],
    mc: &[Solution],
    oracle: &[Solution],
    rollouts: usize,
) -> Result<Report> {
    // Candidates grouped by problem.
    let mut groups: Vec<Vec<Candidate>> = Vec::new();
    let mut groups_or: Vec<Vec<Candidate>> = Vec::new();
    let mut groups_pol: Vec<Vec<Candidate>> = Vec::new();
    let mut families: Vec<String> = Vec::new();
    let mut last = None;
    for (i, s) in scored.iter().enumerate() {
        if last != Some(&s.problem_id) {
            families.push(
                s.meta
                    .get("family")
                    .and_then(|f| f.as_str())
                    .unwrap_or("unknown")
                    .to_string(),
            );
            groups.push(Vec::new());
            groups_or.push(Vec::new());
            groups_pol.push(Vec::new());
            last = Some(&s.problem_id);
        }
        let c = Candidate {
            answer: s.final_answer.clone(),
            step_scores: s_mc[i].clone(),
            outcome_score: s_orm[i].last().copied().unwrap_or(0.0),
            correct: s.correct == Some(true),
        };
        groups_or.last_mut().unwrap().push(Candidate {
            step_scores: s_or[i].clone(),
            ..c.clone()
        });
        groups_pol.last_mut().unwrap().push(Candidate {
            step_scores: s_policy[i].clone(),
            ..c.clone()
        });
        groups.last_mut().unwrap().push(c);
    }
    let mut ns = vec![1];
    while ns.last().unwrap() * 2 <= p.eval_samples {
        ns.push(ns.last().unwrap() * 2);
    }
    // Every best-of-N method: its name, the candidates it ranks (scored by which verifier) and
    // how it selects.
    let mut methods: Vec<(String, &[Vec<Candidate>], Method)> = Aggregation::ALL
        .iter()
        .map(|a| (format!("PRM-MC ({})", a.name()), &groups[..], Some(Selector::Prm(*a))))
        .collect();
    methods.extend([
        (
            "PRM-MC weighted vote".to_string(),
            &groups[..],
            Some(Selector::PrmVote(Aggregation::Min)),
        ),
        (
            "PRM-oracle (min)".to_string(),
            &groups_or[..],
            Some(Selector::Prm(Aggregation::Min)),
        ),
        (
            "PRM-oracle weighted vote".to_string(),
            &groups_or[..],
            Some(Selector::PrmVote(Aggregation::Min)),
        ),
        ("ORM".to_string(), &groups[..], Some(Selector::Orm)),
        // A baseline, not a verifier: the policy's confidence in each written result, min over steps.
        (
            "policy confidence (min)".to_string(),
            &groups_pol[..],
            Some(Selector::Prm(Aggregation::Min)),
        ),
        ("majority vote".to_string(), &groups[..], Some(Selector::Majority)),
        ("pass@N".to_string(), &groups[..], None),
    ]);
    let draws = 32;
    let bon: Vec<Curve> = methods
        .iter()
        .map(|(name, g, how)| curve(name, g, *how, &ns, draws, seed))
        .collect();
    let by_family = by_family(&families, &methods, p.eval_samples, draws, seed);

    let truth: Vec<Option<usize>> = scored.iter().map(|s| s.first_error()).collect();
    let pb = |scores: &[Vec<f32>]| {
        score(
            &scores
                .iter()
                .zip(&truth)
                .map(|(s, t)| (predict_first_error(s, 0.5), *t))
                .collect::<Vec<_>>(),
        )
    };
    let processbench = vec![("PRM-MC".to_string(), pb(s_mc)), ("PRM-oracle".to_string(), pb(s_or))];

    let mut pairs = Vec::new();
    for (m, o) in mc.iter().zip(oracle) {
        for (a, b) in m.steps.iter().zip(&o.steps) {
            if let (Some(x), Some(y)) = (&a.label, &b.label) {
                pairs.push((x.prob(1.0), y.is_good()));
            }
        }
    }
    let mc_label_quality = label_quality(&pairs, 0.0);
    let labelled_steps = mc.iter().map(|s| s.steps.len()).sum::<usize>().max(1);

    let step_pairs = |scores: &[Vec<f32>]| -> Vec<(f32, bool)> {
        scored
            .iter()
            .zip(scores)
            .flat_map(|(s, sc)| {
                s.steps
                    .iter()
                    .zip(sc)
                    .filter_map(|(st, &x)| st.label.as_ref().map(|l| (x, l.is_good())))
            })
            .collect()
    };
    let calib = vec![
        ("PRM-MC".to_string(), calibration(&step_pairs(s_mc), 10)),
        ("PRM-oracle".to_string(), calibration(&step_pairs(s_or), 10)),
    ];

    let labels: Vec<Vec<Option<bool>>> = scored
        .iter()
        .map(|s| {
            s.steps
                .iter()
                .map(|st| st.label.as_ref().map(|l| l.is_good()))
                .collect()
        })
        .collect();
    let ranked = |groups: &[Vec<Candidate>], by: &dyn Fn(&Candidate) -> f32| -> Vec<Vec<(f32, bool)>> {
        groups
            .iter()
            .map(|g| g.iter().map(|c| (by(c), c.correct)).collect())
            .collect()
    };
    let by_min = |c: &Candidate| aggregate(&c.step_scores, Aggregation::Min);
    let discrimination = vec![
        (
            "PRM-MC".to_string(),
            discrimination(Some((s_mc, &labels)), &ranked(&groups, &by_min)),
        ),
        (
            "PRM-oracle".to_string(),
            discrimination(Some((s_or, &labels)), &ranked(&groups_or, &by_min)),
        ),
        (
            "ORM".to_string(),
            discrimination(None, &ranked(&groups, &|c| c.outcome_score)),
        ),
        (
            "policy confidence (diagnostic)".to_string(),
            discrimination(Some((s_policy, &labels)), &ranked(&groups_pol, &by_min)),
        ),
    ];

    let correct: Vec<&Solution> = scored.iter().filter(|s| s.correct == Some(true)).collect();
    let lucky = correct.iter().filter(|s| s.first_error().is_some()).count();
    Ok(Report {
        preset: p.name.clone(),
        seed,
        verifiers: p.verifier_summary(),
        eval_problems: eval.len(),
        eval_samples: p.eval_samples,
        policy_accuracy: correct.len() as f64 / scored.len().max(1) as f64,
        lucky_correct_rate: lucky as f64 / correct.len().max(1) as f64,
        bon,
        by_family,
        processbench,
        discrimination,
        mc_label_quality,
        rollouts_per_step: rollouts as f64 / labelled_steps as f64,
        calibration: calib,
        plots: Vec::new(),
    })
}

fn at(c: &Curve, n: usize) -> String {
    c.points
        .iter()
        .find(|p| p.n == n)
        .map_or("-".into(), |p| format!("{:.3}", p.accuracy))
}

/// The headline table (markdown; also what the terminal prints).
pub fn headline(r: &Report) -> String {
    let ns: Vec<usize> = r
        .bon
        .first()
        .map(|c| c.points.iter().map(|p| p.n).collect())
        .unwrap_or_default();
    let shown: Vec<usize> = ns
        .iter()
        .copied()
        .filter(|n| n.is_power_of_two() && (n.trailing_zeros() % 2 == 0 || *n == *ns.last().unwrap()))
        .collect();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| method | {} |",
        shown.iter().map(|n| format!("N={n}")).collect::<Vec<_>>().join(" | ")
    );
    let _ = writeln!(s, "|---|{}", "---|".repeat(shown.len()));
    for c in &r.bon {
        let _ = writeln!(
            s,
            "| {} | {} |",
            c.method,
            shown.iter().map(|&n| at(c, n)).collect::<Vec<_>>().join(" | ")
        );
    }
    s
}

fn body(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# stepwise lab report\n");
    let _ = writeln!(
        s,
        "Preset `{}`, seed {}: {} held-out problems, {} samples each.\n",
        r.preset, r.seed, r.eval_problems, r.eval_samples
    );
    let _ = writeln!(s, "- Verifiers (PRM-MC, PRM-oracle, ORM): {}", r.verifiers);
    let _ = writeln!(s, "- Policy single-sample accuracy: **{:.3}**", r.policy_accuracy);
    let _ = writeln!(
        s,
        "- Correct final answers reached through a wrong step (invisible to outcome supervision): **{:.1}%**",
        100.0 * r.lucky_correct_rate
    );
    let _ = writeln!(
        s,
        "- Monte Carlo rollouts per labelled step: {:.2}\n",
        r.rollouts_per_step
    );
    let _ = writeln!(s, "## Best-of-N accuracy\n");
    let _ = writeln!(s, "Expected accuracy of the answer each method selects from N samples (32 random draws of N per problem); pass@N is the ceiling (any sample correct).\n");
    s.push_str(&headline(r));
    let _ = writeln!(s, "\n![best-of-N](bon.png)\n");
    let _ = writeln!(s, "95% bootstrap intervals over problems:\n");
    let _ = writeln!(s, "| method | N | accuracy | 95% CI |\n|---|---|---|---|");
    for c in &r.bon {
        for pt in &c.points {
            let _ = writeln!(
                s,
                "| {} | {} | {:.3} | [{:.3}, {:.3}] |",
                c.method, pt.n, pt.accuracy, pt.lo, pt.hi
            );
        }
    }
    if let Some(first) = r.by_family.first() {
        let _ = writeln!(s, "\n## Best-of-{} by problem family\n", first.n);
        let _ = writeln!(
            s,
            "Where each method wins and loses: accuracy of the answer selected from all {} samples of each held-out problem.\n",
            first.n
        );
        let _ = writeln!(
            s,
            "| method | {} |\n|---|{}",
            r.by_family
                .iter()
                .map(|f| format!("{} ({})", f.family, f.problems))
                .collect::<Vec<_>>()
                .join(" | "),
            "---|".repeat(r.by_family.len())
        );
        for (i, (method, _)) in first.accuracy.iter().enumerate() {
            let cells: Vec<String> = r.by_family.iter().map(|f| format!("{:.3}", f.accuracy[i].1)).collect();
            let _ = writeln!(s, "| {method} | {} |", cells.join(" | "));
        }
    }
    let _ = writeln!(s, "\n## First-error localisation (ProcessBench metric)\n");
    let _ = writeln!(
        s,
        "On held-out samples with oracle labels; a PRM's predicted first error is its first step scoring below 0.5.\n"
    );
    let _ = writeln!(
        s,
        "| verifier | accuracy on erroneous | accuracy on correct | F1 | erroneous / correct |\n|---|---|---|---|---|"
    );
    for (name, m) in &r.processbench {
        let _ = writeln!(
            s,
            "| {name} | {:.3} | {:.3} | {:.3} | {} / {} |",
            m.error_accuracy, m.correct_accuracy, m.f1, m.counts.0, m.counts.1
        );
    }
    let _ = writeln!(s, "\n## Ranking quality\n");
    let _ = writeln!(
        s,
        "Step AUROC: step scores against oracle step labels. Within-problem AUROC: the chance that a correct sample outscores a wrong sample of the same problem (PRMs by their min step score) — what best-of-N depends on; 0.5 is chance. *Policy confidence* is not a verifier: it scores each step by the probability the policy itself gave the step's last token (the written result). Its step AUROC shows how much of the verifiers' job the policy's own weights already know.\n"
    );
    let _ = writeln!(
        s,
        "| verifier | step AUROC | within-problem AUROC | problems |\n|---|---|---|---|"
    );
    let opt = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.3}"));
    for (name, d) in &r.discrimination {
        let _ = writeln!(
            s,
            "| {name} | {} | {} | {} |",
            opt(d.step_auroc),
            opt(d.within_problem_auroc),
            d.problems
        );
    }
    let q = &r.mc_label_quality;
    let _ = writeln!(s, "\n## Monte Carlo labels against the oracle\n");
    let _ = writeln!(
        s,
        "| steps | hard accuracy | bad-step recall | bad-step precision | soft Brier |\n|---|---|---|---|---|"
    );
    let _ = writeln!(
        s,
        "| {} | {:.3} | {:.3} | {:.3} | {:.3} |",
        q.steps, q.hard_accuracy, q.bad_recall, q.bad_precision, q.soft_brier
    );
    let _ = writeln!(s, "\n## Calibration\n\n![calibration](calibration.png)\n");
    if !r.plots.is_empty() {
        let _ = writeln!(s, "Plots: {}", r.plots.join(", "));
    }
    s
}

/// Write `metrics.json`, `report.md`, `report.html` and the plots into `dir`.
pub fn write_report(dir: &Path, r: &Report) -> Result<()> {
    let mut r = r.clone();
    let mut plots = Vec::new();
    match stepwise_eval::plot::bon_plot(
        &dir.join("bon"),
        &format!("Best-of-N on held-out lab problems ({} preset)", r.preset),
        &r.bon,
    ) {
        Ok(()) => plots.extend(["bon.png".to_string(), "bon.svg".to_string()]),
        Err(e) => plots.push(format!("bon: {e}")),
    }
    match stepwise_eval::plot::calibration_plot(&dir.join("calibration"), &r.calibration) {
        Ok(()) => plots.extend(["calibration.png".to_string(), "calibration.svg".to_string()]),
        Err(e) => plots.push(format!("calibration: {e}")),
    }
    r.plots = plots;
    std::fs::write(dir.join("metrics.json"), serde_json::to_string_pretty(&r)?)?;
    let md = body(&r);
    std::fs::write(dir.join("report.md"), &md)?;
    std::fs::write(dir.join("report.html"), markdown_to_html(&md))?;
    Ok(())
}

/// Enough Markdown for the report: headings, bullets, tables, images, bold, paragraphs.
fn markdown_to_html(md: &str) -> String {
    let esc = |s: &str| s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    let inline = |s: &str| {
        let mut out = String::new();
        for (i, part) in esc(s).split("**").enumerate() {
            out.push_str(if i % 2 == 1 { "<b>" } else { "" });
            out.push_str(part);
            out.push_str(if i % 2 == 1 { "</b>" } else { "" });
        }
        out.replace('`', "")
    };
    let mut h = String::from("<!doctype html><html><head><meta charset=\"utf-8\"><title>stepwise lab report</title><style>body{font-family:sans-serif;max-width:960px;margin:2em auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child{text-align:left}img{max-width:100%}</style></head><body>\n");
    let mut in_table = false;
    for line in md.lines() {
        if line.starts_with('|') {
            if line.contains("---") {
                continue;
            }
            if !in_table {
                h.push_str("<table>\n");
                in_table = true;
            }
            let cells: Vec<&str> = line.trim_matches('|').split('|').collect();
            h.push_str("<tr>");
            for c in cells {
                let _ = write!(h, "<td>{}</td>", inline(c.trim()));
            }
            h.push_str("</tr>\n");
            continue;
        }
        if in_table {
            h.push_str("</table>\n");
            in_table = false;
        }
        if let Some(t) = line.strip_prefix("## ") {
            let _ = writeln!(h, "<h2>{}</h2>", inline(t));
        } else if let Some(t) = line.strip_prefix("# ") {
            let _ = writeln!(h, "<h1>{}</h1>", inline(t));
        } else if let Some(t) = line.strip_prefix("- ") {
            let _ = writeln!(h, "<li>{}</li>", inline(t));
        } else if let Some(t) = line.strip_prefix("![") {
            let (alt, rest) = t.split_once("](").unwrap_or((t, ""));
            let _ = writeln!(
                h,
                "<p><img alt=\"{}\" src=\"{}\"></p>",
                esc(alt),
                esc(rest.trim_end_matches(')'))
            );
        } else if !line.trim().is_empty() {
            let _ = writeln!(h, "<p>{}</p>", inline(line));
        }
    }
    if in_table {
        h.push_str("</table>\n");
    }
    h.push_str("</body></html>\n");
    h
}
