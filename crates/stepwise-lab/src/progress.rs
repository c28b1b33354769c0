//! Progress bars of a lab run: every bar joins one stack, so the bars of stages that run at once
//! (the three verifiers) do not draw over each other. Where stderr is not a terminal (a log
//! file, CI), where indicatif draws nothing, each bar is printed as a plain line every few
//! seconds instead ([`in_logs`]).

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::LazyLock;
use std::time::Duration;

/// How often a bar is printed to a log: `STEPWISE_PROGRESS_EVERY` seconds, else 5.
fn log_every() -> Duration {
    std::env::var("STEPWISE_PROGRESS_EVERY")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(Duration::from_secs(5), Duration::from_secs_f64)
}

/// When stderr is not a terminal, print `pb`'s state (`what: pos/len (rate/s, eta)`) as a line
/// every few seconds until it finishes or is dropped; on a terminal, nothing (the bar draws).
pub fn in_logs(pb: &ProgressBar) {
    if std::io::stderr().is_terminal() {
        return;
    }
    let every = log_every();
    let weak = pb.downgrade();
    std::thread::spawn(move || loop {
        std::thread::sleep(every);
        let Some(pb) = weak.upgrade() else { return };
        if pb.is_finished() {
            return;
        }
        let line = log_line(&pb.message(), pb.position(), pb.length(), pb.elapsed());
        eprintln!("{line}");
    });
}

/// A bar's line in a log: its position, its mean pace since it started (items a second, or
/// seconds an item when slower) and the time left at that pace. indicatif's own rate decays
/// while an item is under way, so that a DPO step of 20 s read as "eta 1449 s" with 25 s left.
fn log_line(what: &str, pos: u64, len: Option<u64>, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let pace = match (pos, secs) {
        (0, _) => None,
        (_, s) if s >= pos as f64 => Some(format!("{:.1} s each", s / pos as f64)),
        (_, s) => Some(format!("{:.2}/s", pos as f64 / s.max(1e-9))),
    };
    let what = what.trim_start();
    match (len, pace) {
        (Some(len), Some(pace)) => {
            let left = len.saturating_sub(pos) as f64 * secs / pos as f64;
            format!("{what}: {pos}/{len} ({pace}, eta {left:.0} s)")
        }
        (Some(len), None) => format!("{what}: {pos}/{len} ({secs:.0} s)"),
        (None, Some(pace)) => format!("{what}: {pos} ({pace})"),
        (None, None) => format!("{what}: {pos} ({secs:.0} s)"),
    }
}

static BARS: LazyLock<MultiProgress> = LazyLock::new(MultiProgress::new);

/// A bar of `len` steps labelled `what`.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = BARS.add(ProgressBar::new(len));
    pb.set_style(
        ProgressStyle::with_template("{msg:>22} [{bar:30}] {pos}/{len} {prefix} ({elapsed}, eta {eta})")
            .unwrap()
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    in_logs(&pb);
    pb
}

/// A line above the bars.
pub fn say(msg: &str) {
    BARS.suspend(|| eprintln!("{msg}"));
}

/// Wall-clock seconds of one stage of a run (`metrics.json`'s `stage_seconds`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StageSeconds {
    /// The stage, as the report names it.
    pub stage: String,
    /// Seconds this invocation spent in it (a stage read back from the run folder takes ~0).
    pub seconds: f64,
}

/// Times a run's stages one after another: each [`Stopwatch::lap`] closes the stage that began
/// at the previous one, says how long it took, and keeps it for the report.
#[derive(Debug)]
pub struct Stopwatch {
    last: std::time::Instant,
    laps: Vec<StageSeconds>,
}

impl Stopwatch {
    /// Starts timing the first stage.
    pub fn start() -> Self {
        Stopwatch {
            last: std::time::Instant::now(),
            laps: Vec::new(),
        }
    }

    /// Closes the current stage as `stage` and starts the next; a stage timed again adds to
    /// its first entry (where it falls depends on the preset: one wait, two places).
    pub fn lap(&mut self, stage: &str) {
        let now = std::time::Instant::now();
        let seconds = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        if seconds >= 0.05 {
            say(&format!("{stage}: {seconds:.1} s"));
        }
        match self.laps.iter_mut().find(|l| l.stage == stage) {
            Some(l) => l.seconds += seconds,
            None => self.laps.push(StageSeconds {
                stage: stage.to_string(),
                seconds,
            }),
        }
    }

    /// The stages timed so far.
    pub fn laps(&self) -> Vec<StageSeconds> {
        self.laps.clone()
    }
}

/// The report's "Where the time went" section: each stage's seconds and share of the run.
pub fn time_section(s: &mut String, laps: &[StageSeconds]) {
    use std::fmt::Write as _;
    if laps.is_empty() {
        return;
    }
    let total: f64 = laps.iter().map(|l| l.seconds).sum();
    let _ = writeln!(
        s,
        "\n## Where the time went\n\nWall-clock seconds of this invocation, stage by stage ({total:.0} s in all, \
         the report's plots not counted). A stage read back from the run folder takes about nothing, so these are \
         the costs of a run only when it started from an empty folder. The verifiers' own base LM trains on a \
         thread beside the policy and the samples; its time shows only where a stage waits for it.\n\n\
         | stage | seconds | share |\n|---|---|---|"
    );
    for l in laps {
        let _ = writeln!(
            s,
            "| {} | {:.1} | {:.1}% |",
            l.stage,
            l.seconds,
            100.0 * l.seconds / total.max(f64::MIN_POSITIVE)
        );
    }
    s.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_line_paces_by_the_mean_since_the_start() {
        let at = Duration::from_secs_f64;
        assert_eq!(log_line("DPO", 0, Some(2), at(4.6)), "DPO: 0/2 (5 s)");
        // One step of 20 s done: 20 s left, however long the second step has run so far.
        assert_eq!(
            log_line("DPO", 1, Some(2), at(20.0)),
            "DPO: 1/2 (20.0 s each, eta 20 s)"
        );
        assert_eq!(
            log_line("  sampling", 300, Some(400), at(60.0)),
            "sampling: 300/400 (5.00/s, eta 20 s)"
        );
        assert_eq!(log_line("scored", 10, None, at(4.0)), "scored: 10 (2.50/s)");
        assert_eq!(log_line("scored", 0, None, at(4.0)), "scored: 0 (4 s)");
    }

    #[test]
    fn the_stopwatch_keeps_each_stage_in_order_and_the_section_sums_them() {
        let mut clock = Stopwatch::start();
        std::thread::sleep(Duration::from_millis(20));
        clock.lap("first");
        clock.lap("second");
        clock.lap("first");
        let laps = clock.laps();
        assert_eq!(
            laps.iter().map(|l| l.stage.as_str()).collect::<Vec<_>>(),
            ["first", "second"]
        );
        assert!(laps[0].seconds >= 0.02 && laps[1].seconds < laps[0].seconds, "{laps:?}");
        let mut s = String::new();
        time_section(&mut s, &laps);
        assert!(s.contains("| first |") && s.contains("## Where the time went"), "{s}");
        let mut none = String::new();
        time_section(&mut none, &[]);
        assert!(none.is_empty());
    }
}
