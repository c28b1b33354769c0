//! `cargo bench -p stepwise-core`: grader throughput (answers/s) in both modes, and reading
//! throughput (MB/s) of JSONL solutions, on the repository's public data.

use std::path::PathBuf;
use std::time::{Duration, Instant};
use stepwise_core::grader::{grade, GradeMode};
use stepwise_core::io::raw_records;
use stepwise_core::{write_solutions, Format, SolutionReader};

/// A file of the repository's public data (`data/`).
fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data").join(rel)
}

/// Run `f` repeatedly for about `budget`, return calls per second.
fn rate(budget: Duration, mut f: impl FnMut() -> usize) -> f64 {
    let start = Instant::now();
    let mut n = 0usize;
    while start.elapsed() < budget {
        n += f();
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let budget = Duration::from_secs(3);
    let mut pairs: Vec<(String, String)> = raw_records(&data("grader/prm800k_pairs.jsonl"))
        .unwrap()
        .map(|(_, r)| {
            let v = r.unwrap();
            (
                v["given"].as_str().unwrap().to_string(),
                v["ground_truth"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for r in raw_records(&data("math500/test.jsonl")).unwrap() {
        let a = r.1.unwrap()["answer"].as_str().unwrap().to_string();
        pairs.push((a.clone(), a));
    }
    for mode in [GradeMode::Prm800k, GradeMode::Lenient] {
        let r = rate(budget, || {
            for (g, t) in &pairs {
                std::hint::black_box(grade(g, t, mode));
            }
            pairs.len()
        });
        println!(
            "grader {mode:?}: {r:.0} answers/s ({} pairs: PRM800K pairs + MATH-500 gold answers)",
            pairs.len()
        );
    }

    // JSONL read throughput: ProcessBench MATH written as stepwise JSONL, read back.
    let dir = std::env::temp_dir().join("stepwise-bench");
    std::fs::create_dir_all(&dir).unwrap();
    let sols: Vec<_> = SolutionReader::open(data("processbench/math.json"), None)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let path = dir.join("pb-math.jsonl");
    write_solutions(&path, Format::Stepwise, &sols).unwrap();
    let bytes = std::fs::metadata(&path).unwrap().len() as f64;
    let raw = rate(budget, || raw_records(&path).unwrap().count());
    println!("JSONL raw records: {:.1} MB/s", raw / sols.len() as f64 * bytes / 1e6);
    let typed = rate(budget, || SolutionReader::open(&path, None).unwrap().count());
    println!(
        "JSONL -> Solution: {:.1} MB/s ({:.0} solutions/s)",
        typed / sols.len() as f64 * bytes / 1e6,
        typed
    );
}
