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
        let (what, pos, rate) = (pb.message(), pb.position(), pb.per_sec());
        let line = match pb.length() {
            Some(len) if rate > 0.0 => {
                let eta = (len.saturating_sub(pos)) as f64 / rate;
                format!("{what}: {pos}/{len} ({rate:.2}/s, eta {eta:.0} s)")
            }
            Some(len) => format!("{what}: {pos}/{len}"),
            None => format!("{what}: {pos} ({rate:.2}/s)"),
        };
        eprintln!("{}", line.trim_start());
    });
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
