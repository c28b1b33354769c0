//! `cargo +nightly fuzz run grader`: both grading modes on arbitrary answer pairs.
#![no_main]
use libfuzzer_sys::fuzz_target;
use stepwise_core::grader::{grade, GradeMode};

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    let (a, b) = s.split_once('\u{0}').unwrap_or((&s, "1"));
    for mode in [GradeMode::Prm800k, GradeMode::Lenient] {
        let _ = grade(a, b, mode);
    }
});
