//! The lab's report: `metrics.json`, `report.md`, `report.html` and the plots in the run folder,
//! and a headline table for the terminal.

use crate::stages::evaluate::Report;
use crate::stages::rl::RlReport;
use crate::stages::search::{SearchPoint, SearchReport};
use anyhow::Result;
use std::fmt::Write as _;
use std::path::Path;
use stepwise_eval::bon::Curve;
use stepwise_eval::plot::Intervals;

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
        "Preset `{}`, domain `{}`, seed {}: {} held-out problems, {} samples each.\n",
        r.preset, r.domain, r.seed, r.eval_problems, r.eval_samples
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
    bon_section(&mut s, r);
    family_section(&mut s, r);
    processbench_section(&mut s, r);
    ranking_section(&mut s, r);
    label_sources_section(&mut s, r);
    let _ = writeln!(s, "\n## Calibration\n\n![calibration](calibration.png)\n");
    if let Some(search) = &r.search {
        search_section(&mut s, search);
    }
    if let Some(rl) = &r.rl {
        rl_section(&mut s, rl);
    }
    if let Some(dpo) = &r.dpo {
        dpo.section(&mut s);
    }
    if let Some(studio) = &r.studio {
        studio_section(&mut s, studio, r.eval_samples);
    }
    paired_section(&mut s, r);
    crate::progress::time_section(&mut s, &r.stage_seconds);
    if !r.plots.is_empty() {
        let _ = writeln!(s, "Plots: {}", r.plots.join(", "));
    }
    s
}

/// Best-of-N accuracy: the headline table, the plot and every point with its interval.
fn bon_section(s: &mut String, r: &Report) {
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
}

/// Best-of-N at the largest N by problem family.
fn family_section(s: &mut String, r: &Report) {
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
}

/// First-error localisation, and the generative judge against the PRM at equal labels.
fn processbench_section(s: &mut String, r: &Report) {
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
    if let Some(g) = &r.generative {
        let _ = writeln!(
            s,
            "\n*Generative against discriminative at equal labels*: the judge (fine-tuned to write the index of the first wrong step) verifies by sampling {} verdicts a solution, {:.1} tokens a verified solution; the PRM beside it is trained on the same {} oracle-labelled solutions and writes none (one forward pass). Both appear in the best-of-N table, here and in the paired differences.",
            g.samples, g.tokens_per_solution, g.labelled_solutions
        );
        if let Some(c) = &g.calculator {
            let _ = writeln!(
                s,
                "\n*A judge with a tool*: the judge with a calculator is trained alike (same labels, seed and steps), but every equation step it reads shows the calculator's value of its left side after it (`36 - 13 = 24 = 23`), as a verifier that ran the step's arithmetic (GenPRM's code execution) sees it: {:.1} calculator calls and {:.1} tokens written a verified solution. A calculator finds arithmetic slips, not a wrong quantity or operation: the oracle's other errors stay the judge's to find.",
                c.calls_per_solution, c.tokens_per_solution
            );
        }
        if let Some(c) = &g.chain {
            let _ = writeln!(
                s,
                "\n*A judge that thinks*: the judge writing a chain is trained alike (same labels, seed and steps), but instead of one index it goes through the steps in turn, works each equation step again (`36 - 13 = 23` for `36 - 13 = 24`) and gives each step `yes` or `no`, up to the first `no` (ThinkPRM's verification chain, in the lab's vocabulary): {:.1} tokens written a verified solution.",
                c.tokens_per_solution
            );
        }
        if let Some(c) = &g.worked {
            let _ = writeln!(
                s,
                "\n*A judge that thinks where the step stands*: the judge working each step is trained alike (same labels, seed and steps; one example a step, up to the first wrong one), but it is asked after every step, with the solution up to that step, to work the step again and say `yes` or `no` (`6 + 1 = 7 no` for `6 + 1 = 8`): the step it checks is the last thing it read. A step's score is the share of its {} verdicts that say `yes`: {:.1} tokens written a verified solution.",
                g.samples, c.tokens_per_solution
            );
        }
        if let Some(c) = &g.direct {
            let _ = writeln!(
                s,
                "\n*Its control*: the same judge asked at each step, trained alike, that says `yes` or `no` without working the step: what the thinking adds, all else equal ({:.1} tokens written a verified solution).",
                c.tokens_per_solution
            );
        }
        likelihood_paragraph(s, g);
    }
}

/// The judges weighed by likelihood as well as by sampled verdicts, and what each way took.
fn likelihood_paragraph(s: &mut String, g: &crate::stages::evaluate::Generative) {
    if g.likelihood.is_empty() {
        return;
    }
    let timings: Vec<String> = g
        .likelihood
        .iter()
        .map(|w| {
            format!(
                "`{}` {:.0} s against {:.0} s sampled",
                w.verifier, w.seconds, w.votes_seconds
            )
        })
        .collect();
    let _ = writeln!(
        s,
        "\n*Verdicts weighed, not sampled*: each judge whose answer is a fixed text is also read for the probability it gives each verdict (GenRM's `P(yes)`), in a forward pass instead of {} sampled answers: a step's score is the probability of the verdicts that put the first error after it (the judges asked at each step: `P(yes) / (P(yes) + P(no))`, after the working they wrote where they work the step). Scores are graded, not multiples of 1/{}, so best-of-N has fewer ties to break at random; the `likelihood` rows and the paired differences against the same judge's sampled verdicts say whether that ranks better. Time to score the held-out samples on this machine: {}.",
        g.samples,
        g.samples,
        timings.join("; ")
    );
}

/// Ranking quality by verifier, and the Monte Carlo labels against the oracle.
fn ranking_section(s: &mut String, r: &Report) {
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
}

/// Every label source against the oracle, with the PRM each trains.
fn label_sources_section(s: &mut String, r: &Report) {
    if !r.labels.sources.is_empty() {
        let model = |name: &str| match name {
            "verifier_base" => "the verifiers' base",
            _ => "the policy",
        };
        let _ = writeln!(
            s,
            "\n## Label sources against the oracle\n\nThe same samples labelled by per-step Monte Carlo \
(Math-Shepherd), by binary search for the first error, with the same rollouts wherever both probe a \
prefix, by OmegaPRM (that bisection over one rollout tree per problem, its samples the root's first rollouts; its \
completed rollouts are kept as new labelled solutions, not compared here), and by the judge: {} fine-tuned to write the index of the first wrong step on the oracle's verdicts \
for a few solutions (*human labels*), sampled several times per solution and voted. The rollouts are {}'s (the *completer*). Consensus keeps the MC labels of \
the solutions where the judge puts the first error on the same step (the Qwen2.5-Math-PRM recipe). A PRM is \
trained on each source with the same code and budget; its ProcessBench F1 and best-of-N accuracy (min aggregation) \
are on the held-out samples. The judge's rollouts are its sampled answers.\n",
            model(&r.labels.judge_start),
            model(&r.labels.completer),
        );
        let n = r.eval_samples.to_string();
        let _ = writeln!(
            s,
            "| source | solutions kept | steps | label accuracy | bad-step recall | bad-step precision | first error right | rollouts | generated tokens | human labels | PRM ProcessBench F1 | PRM best-of-{n} |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        let opt = |x: Option<f64>| x.map_or("—".to_string(), |v| format!("{v:.3}"));
        for l in &r.labels.sources {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {} | {} | {} | {} |",
                l.source,
                opt(l.retained_fraction),
                l.steps,
                l.label_accuracy,
                l.bad_recall,
                l.bad_precision,
                l.first_error_agreement,
                l.rollouts,
                l.generated_tokens,
                l.human_labels,
                opt(l.processbench_f1),
                opt(l.bon.get(&n).copied()),
            );
        }
        for l in r.labels.sources.iter().filter(|l| l.new_solutions > 0) {
            let _ = writeln!(
                s,
                "\n{} also kept {} completed rollouts as new labelled solutions (label accuracy {} against the oracle).",
                l.source,
                l.new_solutions,
                opt(l.new_solutions_label_accuracy)
            );
        }
        pairs_table(s, &r.labels.sources);
    }
}

/// The step-level preference pairs each label source gives, checked by the oracle.
fn pairs_table(s: &mut String, sources: &[crate::stages::labels::LabelSource]) {
    if sources.iter().all(|l| l.pairs.is_none()) {
        return;
    }
    let _ = writeln!(
        s,
        "\nStep-level preference pairs (Step-DPO's data, `stepwise pairs`) in each source's labels: a right next step \
against a wrong one after the same sound prefix, found among the samples of a problem (and the tree's rollouts) that \
share it; the oracle checks both sides.\n\n| source | pairs | problems | both sides right | chosen right | rejected wrong |\n|---|---|---|---|---|---|"
    );
    for l in sources {
        if let Some(p) = &l.pairs {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.3} | {:.3} | {:.3} |",
                l.source, p.pairs, p.problems, p.precision, p.chosen_right, p.rejected_wrong
            );
        }
    }
}

/// Paired differences: best-of-N, search and RL comparisons on the same problems.
fn paired_section(s: &mut String, r: &Report) {
    let all: Vec<&stepwise_eval::paired::PairedDifference> = r
        .paired
        .iter()
        .chain(r.search.iter().flat_map(|x| &x.paired))
        .chain(r.rl.iter().flat_map(|x| &x.paired))
        .chain(r.dpo.iter().flat_map(|x| &x.paired))
        .chain(r.studio.iter().flat_map(|x| &x.paired))
        .collect();
    paired_table(s, &all);
}

/// The paired-differences section for `all` (nothing when empty).
pub(crate) fn paired_table(s: &mut String, all: &[&stepwise_eval::paired::PairedDifference]) {
    if all.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "## Paired differences
"
    );
    let _ = writeln!(
        s,
        "Two methods on the same problems, compared problem by problem: the mean of the per-problem differences (A − B) with a 95% bootstrap interval over problems (pairs kept). Where the interval excludes 0 the two are told apart at this size; where it does not, they are not, whatever the point estimates say.
"
    );
    let _ = writeln!(
        s,
        "| measure | A | B | A − B | 95% CI | problems | told apart |\n|---|---|---|---|---|---|---|"
    );
    for d in all {
        let verdict = match d.separates() {
            Some(true) => "A better",
            Some(false) => "B better",
            None => "no",
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:+.3} | [{:+.3}, {:+.3}] | {} | {verdict} |",
            d.measure, d.a, d.b, d.difference, d.ci95.0, d.ci95.1, d.problems
        );
    }
    let _ = writeln!(s);
}

/// The studio section: human labels (simulated labellers) by selection policy.
fn studio_section(s: &mut String, r: &crate::stages::studio::StudioReport, n: usize) {
    let _ = writeln!(
        s,
        "## Human labels in the studio, by selection policy
"
    );
    let _ = writeln!(
        s,
        "{} simulated labellers rated steps through the labelling studio's HTTP API, PRM800K phase 2's way \
         (each labelling stops at its first −1), each rating against the oracle with probability {}. \
         Generation 0 ({} steps) is a uniform sample shared by every policy; in each later generation a policy \
         ranks what is left with the PRM trained on its own labels so far and {} more steps are labelled \
         ({} generations in all). Each policy's PRM is trained on all its labels, with the code and budget of \
         the other verifiers. Labelling time is modelled: 20 s a solution, 4 s + 50 ms a character a step.\n",
        r.labellers, r.error_rate, r.steps_per_generation, r.steps_per_generation, r.generations
    );
    let _ = writeln!(
        s,
        "| policy | steps | solutions | labeller hours | ProcessBench F1 | best-of-{n} (min) |\n|---|---|---|---|---|---|"
    );
    for a in &r.arms {
        let hours: f64 = a.generations.iter().map(|g| g.labeller_minutes).sum::<f64>() / 60.0;
        let bon = a.bon.get(&n.to_string()).map_or("-".to_string(), |x| format!("{x:.3}"));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {hours:.1} | {:.3} | {bon} |",
            a.policy, a.labelled_steps, a.labelled_solutions, a.processbench_f1
        );
    }
    let _ = writeln!(
        s,
        "\nWhat each generation labelled: the share of wrong final answers, of labellings that found an error, \
         of rated steps the oracle calls bad, and of ratings the oracle agrees with.\n"
    );
    let _ = writeln!(
        s,
        "| policy | generation | solutions | steps | wrong answers | errors found | bad steps | label accuracy |\n|---|---|---|---|---|---|---|---|"
    );
    for a in &r.arms {
        for g in &a.generations {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.2} | {:.2} | {:.3} | {:.3} |",
                a.policy,
                g.generation,
                g.solutions,
                g.steps,
                g.wrong_answer_fraction,
                g.error_found_fraction,
                g.oracle_bad_fraction,
                g.label_accuracy
            );
        }
    }
    let _ = writeln!(s);
}

/// The search section: every method and verifier against the tokens it generated.
fn search_section(s: &mut String, r: &SearchReport) {
    let _ = writeln!(s, "## Test-time search\n");
    let _ = writeln!(
        s,
        "Each method picks one solution per problem on {} held-out problems, guided by PRM-MC, PRM-oracle or the oracle itself (the ceiling), with the same draws (a draw's seed depends on the problem and its rank). N is the number of samples per step (best-of-N: whole solutions), M the width (beam search keeps N/M beams and extends each M ways; DVTS grows N/M subtrees); candidates are ranked by their weakest step. Lookahead rolls each candidate one step further greedily. Verify → resample rejects a step scored below τ and resamples it (at most {} times per step), τ calibrated to a precision of {} for \"bad\" on the samples of {} other held-out problems. One sample writes {:.1} tokens; accuracy has a 95% bootstrap interval over problems.\n",
        r.problems,
        r.max_resamples,
        r.thresholds.first().map_or(0.0, |t| t.target_precision),
        r.calibration_problems,
        r.sample_tokens
    );
    let _ = writeln!(
        s,
        "| verifier | τ | precision | recall of bad steps |\n|---|---|---|---|"
    );
    for t in &r.thresholds {
        let _ = writeln!(
            s,
            "| {} | {:.3} | {:.3} | {:.3} |",
            t.verifier, t.tau, t.precision, t.recall
        );
    }
    let _ = writeln!(
        s,
        "\n| method | verifier | N | M | accuracy | 95% CI | tokens generated / problem | tokens encoded / problem | rejected steps / problem | seconds / problem |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for m in &r.methods {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.3} | [{:.3}, {:.3}] | {:.0} | {:.0} | {:.2} | {:.3} |",
            m.method,
            m.verifier,
            m.n,
            m.width,
            m.accuracy,
            m.ci95.0,
            m.ci95.1,
            m.generated_tokens,
            m.encoded_tokens,
            m.rejected_steps,
            m.seconds
        );
    }
    if let Some(i) = &r.incremental {
        let _ = writeln!(
            s,
            "\nIncremental scoring: beam search (N = {}) with PRM-oracle on {} problems encoded {} tokens; scoring every text whole encoded {} ({:.1}× more), in {:.2} s against {:.2} s; the same solution was chosen on {} of {} problems.",
            i.n, i.problems, i.encoded_tokens, i.whole_tokens, i.ratio, i.seconds.0, i.seconds.1, i.same_choice, i.problems
        );
    }
    let _ = writeln!(s, "\n![search](search.png)\n");
}

/// Accuracy against generated tokens per problem, one panel per verifier, one curve per method.
fn search_plot(stem: &Path, r: &SearchReport) -> Result<()> {
    let single = r.methods.iter().find(|m| m.method == "sample");
    let point = |m: &SearchPoint| stepwise_eval::bon::Point {
        n: m.generated_tokens.round().max(1.0) as usize,
        accuracy: m.accuracy,
        lo: m.ci95.0,
        hi: m.ci95.1,
    };
    let mut panels = Vec::new();
    for verifier in r.thresholds.iter().map(|t| t.verifier.as_str()) {
        let mut curves = Vec::new();
        for method in ["bon", "beam", "dvts", "lookahead", "resample"] {
            let mut points: Vec<_> = single
                .into_iter()
                .chain(
                    r.methods
                        .iter()
                        .filter(|m| m.verifier == verifier && m.method == method),
                )
                .map(point)
                .collect();
            points.sort_by_key(|p| p.n);
            if points.len() > 1 {
                curves.push(stepwise_eval::bon::Curve {
                    method: method.to_string(),
                    points,
                });
            }
        }
        panels.push((format!("guided by {verifier}"), curves));
    }
    stepwise_eval::plot::scaling_plot(stem, "tokens generated per problem", &panels, Intervals::Caps)
}

/// The RL section: each reward source's policy before and after, on held-out problems.
fn rl_section(s: &mut String, rl: &RlReport) {
    let (updates, prompts, group) = rl.budget;
    let _ = writeln!(s, "## RL against each reward source\n");
    let _ = writeln!(
        s,
        "The policy optimised from the same start with the same budget ({updates} updates × {prompts} prompts × {group} samples, GRPO advantages, DeepSeekMath per-step credit for process rewards, KL penalty to the start), then sampled {} times on each held-out problem. Accuracy is single-sample accuracy with a 95% bootstrap interval over problems; *lucky* is the share of correct answers the oracle says were reached through a wrong step; *reward* and *oracle* are the optimised reward's mean and the oracle's mean step verdict on the training samples, over the first and the last tenth of the updates.\n",
        rl.eval_samples
    );
    let _ = writeln!(
        s,
        "| reward | accuracy before | accuracy after | 95% CI | majority before → after | lucky before → after | reward first → last | oracle first → last | KL | sampled tokens |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for v in &rl.variants {
        let _ = writeln!(
            s,
            "| {} | {:.3} | {:.3} | [{:.3}, {:.3}] | {:.3} → {:.3} | {:.1}% → {:.1}% | {:.3} → {:.3} | {:.3} → {:.3} | {:.4} | {} |",
            v.reward,
            v.accuracy_before,
            v.accuracy_after,
            v.ci95.0,
            v.ci95.1,
            v.majority_before,
            v.majority_after,
            100.0 * v.lucky_correct_before,
            100.0 * v.lucky_correct_after,
            v.reward_first_last.0,
            v.reward_first_last.1,
            v.oracle_first_last.0,
            v.oracle_first_last.1,
            v.kl,
            v.sampled_tokens
        );
    }
    let prime = rl.prime.unwrap_or_default();
    for v in &rl.variants {
        if let (Some((first, last)), Some(kept)) = (v.implicit_prm_accuracy, v.kept_groups) {
            let _ = writeln!(
                s,
                "\n*{}*: the implicit PRM (started from the policy, learning online from the outcomes of the samples, β = {}) predicted the outcome of fresh samples {:.1}% → {:.1}% of the time (first → last tenth); its prompt filter kept {:.0}% of the groups ({:.0}–{:.0}% correct).",
                v.reward,
                prime.beta,
                100.0 * first,
                100.0 * last,
                100.0 * kept,
                100.0 * prime.accuracy_bounds.0,
                100.0 * prime.accuracy_bounds.1
            );
        }
    }
    let _ = writeln!(s, "\n![RL](rl.png)\n");
}

/// Training curves of the RL runs (moving averages over ten updates): accuracy of each update's
/// samples, the oracle's mean step verdict on them, and the KL to the starting policy.
fn rl_plot(stem: &Path, rl: &RlReport) -> Result<()> {
    let smooth = |ys: Vec<f64>| -> Vec<(f64, f64)> {
        (0..ys.len())
            .map(|i| {
                let w = &ys[i.saturating_sub(9)..=i];
                ((i + 1) as f64, w.iter().sum::<f64>() / w.len() as f64)
            })
            .collect()
    };
    let panel = |y: &str, f: &dyn Fn(&stepwise_rl::UpdateLog) -> f64| -> stepwise_eval::plot::Panel {
        let series = rl
            .variants
            .iter()
            .map(|v| (v.reward.clone(), smooth(v.log.iter().map(f).collect())))
            .collect();
        (y.to_string(), series)
    };
    stepwise_eval::plot::panels_plot(
        stem,
        "RL from the lab policy, by reward source",
        "update",
        &[
            panel("sample accuracy", &|l| l.accuracy),
            panel("oracle step verdict", &|l| {
                l.watched.get("oracle").copied().unwrap_or(0.0)
            }),
            panel("KL to start", &crate::stages::rl::kl),
        ],
    )
}

/// Best-of-N in panels, so that no panel holds more than about ten curves: the verifiers against
/// one another (each at its min aggregation), the generative judges against the PRM on their
/// labels (where the run has judges; those weighed by likelihood apart), and how PRM-MC's step
/// scores are combined (every aggregation and the weighted votes); majority vote and pass@N are
/// in each, as the floor and the ceiling.
fn bon_plot(stem: &Path, r: &Report) -> Result<()> {
    let aggregation = |m: &str| m.ends_with("weighted vote") || (m.starts_with("PRM-MC (") && m != "PRM-MC (min)");
    let reference = |m: &str| m == "majority vote" || m == "pass@N";
    let judged = |m: &str| m.starts_with("judge") || m == "PRM-oracle, judge's labels (min)";
    let pick = |keep: &dyn Fn(&str) -> bool| -> Vec<_> { r.bon.iter().filter(|c| keep(&c.method)).cloned().collect() };
    let mut panels = vec![(
        format!("Best-of-N by verifier, held-out lab problems ({} preset)", r.preset),
        pick(&|m| !aggregation(m) && !judged(m)),
    )];
    // The judges beside the PRM on their labels; those weighed by likelihood in a panel of
    // their own, where the run weighs them.
    let labels = r.generative.as_ref().map_or(0, |g| g.labelled_solutions);
    let budget = |m: &str| m == "PRM-oracle, judge's labels (min)";
    let weighed = |m: &str| m.ends_with(", likelihood (min)");
    let sampled = pick(&|m| (judged(m) && !weighed(m)) || reference(m));
    if sampled.iter().any(|c| judged(&c.method)) {
        panels.push((
            format!("Best-of-N: generative judges and a PRM on the same {labels} labelled solutions"),
            sampled,
        ));
    }
    let by_likelihood = pick(&|m| weighed(m) || budget(m) || reference(m));
    if by_likelihood.iter().any(|c| weighed(&c.method)) {
        panels.push((
            "Best-of-N: the judges' verdicts weighed by likelihood, not sampled".to_string(),
            by_likelihood,
        ));
    }
    panels.push((
        "Best-of-N: PRM-MC's step scores combined".to_string(),
        pick(&|m| aggregation(m) || m == "PRM-MC (min)" || reference(m)),
    ));
    stepwise_eval::plot::scaling_plot(stem, "N (samples per problem)", &panels, Intervals::Caps)
}

/// Write `metrics.json`, `report.md`, `report.html` and the plots into `dir`.
pub fn write_report(dir: &Path, r: &Report) -> Result<()> {
    let mut r = r.clone();
    let mut plots = Vec::new();
    match bon_plot(&dir.join("bon"), &r) {
        Ok(()) => plots.extend(["bon.png".to_string(), "bon.svg".to_string()]),
        Err(e) => plots.push(format!("bon: {e}")),
    }
    match stepwise_eval::plot::calibration_plot(&dir.join("calibration"), &r.calibration) {
        Ok(()) => plots.extend(["calibration.png".to_string(), "calibration.svg".to_string()]),
        Err(e) => plots.push(format!("calibration: {e}")),
    }
    if let Some(search) = &r.search {
        match search_plot(&dir.join("search"), search) {
            Ok(()) => plots.extend(["search.png".to_string(), "search.svg".to_string()]),
            Err(e) => plots.push(format!("search: {e}")),
        }
    }
    if let Some(rl) = &r.rl {
        match rl_plot(&dir.join("rl"), rl) {
            Ok(()) => plots.extend(["rl.png".to_string(), "rl.svg".to_string()]),
            Err(e) => plots.push(format!("rl: {e}")),
        }
    }
    r.plots = plots;
    std::fs::write(dir.join("metrics.json"), serde_json::to_string_pretty(&r)?)?;
    let md = body(&r);
    std::fs::write(dir.join("report.md"), &md)?;
    std::fs::write(dir.join("report.html"), crate::html::markdown_to_html(&md))?;
    Ok(())
}
