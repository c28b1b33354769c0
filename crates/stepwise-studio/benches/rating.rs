//! How long the server takes to save a rating with 100,000 records in the store and 20
//! labellers working at once (issue #49's target: ≤ 20 ms). Each labeller is a thread with its
//! own HTTP client: next record, read it, rate every step, finish, again. Reported: the
//! latency of a rating as the client sees it (HTTP round trip and the fsync of the commit
//! included), its percentiles, and ratings per second. PAUSE_MS is each labeller's pause before
//! a rating (a person reads the step first; 0: every labeller rates as fast as the server
//! answers, a stress test of the store's one writer).
//!
//!     cargo bench -p stepwise-studio --bench rating [-- RECORDS LABELLERS SECONDS PAUSE_MS]

use std::time::{Duration, Instant};
use stepwise_core::record::{Solution, Step};
use stepwise_studio::client::Client;
use stepwise_studio::{NewRecord, Policy, Role, Settings, Store};

fn main() -> anyhow::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (records, labellers, seconds) = (
        *args.first().unwrap_or(&100_000),
        *args.get(1).unwrap_or(&20),
        *args.get(2).unwrap_or(&20),
    );
    let pause = Duration::from_millis(*args.get(3).unwrap_or(&0) as u64);
    let dir = std::env::temp_dir().join(format!("stepwise-studio-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let db = dir.join("labels.sqlite");
    let t = Instant::now();
    let mut store = Store::open(&db)?;
    let settings = Settings {
        overlap: 3,
        qc_every: 0,
        policy: Policy::Uniform,
        ..Default::default()
    };
    let project = store.project_or_create("bench", &settings, 1)?;
    let new: Vec<NewRecord> = (0..records)
        .map(|i| NewRecord {
            solution: Solution {
                id: format!("r{i}"),
                question: format!("Problem {i}: what is {} + {}?", i % 97, i % 89),
                steps: (0..6)
                    .map(|k| Step::new(format!("Step {k}: {} + {k} = {}", i % 97, i % 97 + k)))
                    .collect(),
                scores: [("prm".to_string(), vec![0.9, 0.8, 0.7, 0.6, 0.5, 0.4])].into(),
                ..Default::default()
            },
            gold: false,
        })
        .collect();
    store.add_records(&project, new)?;
    for k in 0..labellers {
        store.set_user(&format!("l{k}"), Role::Labeller, "bench-password")?;
    }
    eprintln!(
        "{records} records and {labellers} labellers in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let running = stepwise_studio::server::spawn(store, "127.0.0.1:0")?;
    let url = running.url();
    let stop = Instant::now() + Duration::from_secs(seconds as u64);
    let latencies: Vec<Duration> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..labellers)
            .map(|k| {
                let url = &url;
                scope.spawn(move || -> anyhow::Result<Vec<Duration>> {
                    let c = Client::login(url, &format!("l{k}"), "bench-password")?;
                    let mut mine = Vec::new();
                    while Instant::now() < stop {
                        let Some(id) = c.next("bench")? else { break };
                        let view = c.record(id)?;
                        for step in 0..view.steps.len() {
                            std::thread::sleep(pause);
                            let t = Instant::now();
                            c.rate(id, step, Some(if step == 5 { -1 } else { 1 }), None)?;
                            mine.push(t.elapsed());
                        }
                        c.finish(id, "found_error")?;
                    }
                    Ok(mine)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a labeller thread"))
            .collect::<anyhow::Result<Vec<_>>>()
            .map(|v| v.concat())
    })?;
    let mut ms: Vec<f64> = latencies.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() as f64 * q) as usize).min(ms.len() - 1)];
    println!(
        "{{\"records\": {records}, \"labellers\": {labellers}, \"pause_ms\": {}, \"ratings\": {}, \"ratings_per_s\": {:.0}, \"p50_ms\": {:.2}, \"p90_ms\": {:.2}, \"p99_ms\": {:.2}, \"max_ms\": {:.2}}}",
        pause.as_millis(),
        ms.len(),
        ms.len() as f64 / seconds as f64,
        at(0.5),
        at(0.9),
        at(0.99),
        ms.last().copied().unwrap_or(0.0)
    );
    drop(running);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
