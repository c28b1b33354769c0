//! Progress bars of a lab run: every bar joins one stack, so the bars of stages that run at once
//! (the three verifiers) do not draw over each other.

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use std::sync::LazyLock;

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
    pb
}

/// A line above the bars.
pub fn say(msg: &str) {
    BARS.suspend(|| eprintln!("{msg}"));
}
