//! Progress bars shared by the long-running subcommands.

use indicatif::{ProgressBar, ProgressStyle};

/// A bar over `len` items (a spinner when `len` is unknown); where stderr is not a terminal, a
/// plain line every few seconds instead ([`stepwise_lab::progress::in_logs`]).
pub fn bar(len: Option<u64>, what: &str) -> ProgressBar {
    let pb = match len {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new_spinner(),
    };
    let template = match len {
        Some(_) => "{msg:>12} [{bar:30}] {pos}/{len} ({per_sec}, eta {eta})",
        None => "{msg:>12} {spinner} {pos} ({per_sec})",
    };
    pb.set_style(ProgressStyle::with_template(template).unwrap().progress_chars("=> "));
    pb.set_message(what.to_string());
    stepwise_lab::progress::in_logs(&pb);
    pb
}
