//! Prometheus metrics of `stepwise serve`: requests by route and status, prompt and generated
//! tokens, decoding steps and the continuations they carried (their ratio is the mean batch of
//! continuous batching), passes of the log-probability worker and the sequences they packed, and a latency histogram (`GET /metrics`, text exposition format).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// Upper bounds (seconds) of the latency histogram's buckets.
const BUCKETS: [f64; 12] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

#[derive(Default)]
struct Counts {
    requests: BTreeMap<(String, u16), u64>,
    prompt_tokens: u64,
    generation_tokens: u64,
    decode_steps: u64,
    decode_rows: u64,
    decode_prompt_rows: u64,
    cancelled: u64,
    weigh_passes: u64,
    weigh_sequences: u64,
    latency_buckets: [u64; BUCKETS.len()],
    latency_count: u64,
    latency_sum: f64,
}

/// The server's counters.
#[derive(Default)]
pub struct Metrics {
    counts: Mutex<Counts>,
}

impl Metrics {
    /// Count a finished request.
    pub fn request(&self, endpoint: &str, status: u16, seconds: f64) {
        let mut c = self.counts.lock().unwrap();
        *c.requests.entry((endpoint.to_string(), status)).or_default() += 1;
        for (b, le) in c.latency_buckets.iter_mut().zip(BUCKETS) {
            if seconds <= le {
                *b += 1;
            }
        }
        c.latency_count += 1;
        c.latency_sum += seconds;
    }

    /// Count tokens read and written.
    pub fn tokens(&self, prompt: usize, generated: usize) {
        let mut c = self.counts.lock().unwrap();
        c.prompt_tokens += prompt as u64;
        c.generation_tokens += generated as u64;
    }

    /// Count one decoding step of the generation worker over `rows` continuations and
    /// `prompt_rows` rows feeding a joining prompt.
    pub fn decode_step(&self, rows: usize, prompt_rows: usize) {
        let mut c = self.counts.lock().unwrap();
        c.decode_steps += 1;
        c.decode_rows += rows as u64;
        c.decode_prompt_rows += prompt_rows as u64;
    }

    /// Count one pass of the log-probability worker over `sequences` packed together.
    pub fn weigh_pass(&self, sequences: usize) {
        let mut c = self.counts.lock().unwrap();
        c.weigh_passes += 1;
        c.weigh_sequences += sequences as u64;
    }

    /// Count a generation request dropped because its client went away.
    pub fn cancelled(&self) {
        self.counts.lock().unwrap().cancelled += 1;
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let c = self.counts.lock().unwrap();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP stepwise_requests_total Requests answered, by route and HTTP status."
        );
        let _ = writeln!(out, "# TYPE stepwise_requests_total counter");
        for ((endpoint, status), n) in &c.requests {
            let _ = writeln!(
                out,
                "stepwise_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}"
            );
        }
        for (name, help, v) in [
            ("stepwise_prompt_tokens_total", "Prompt tokens read.", c.prompt_tokens),
            (
                "stepwise_generation_tokens_total",
                "Tokens generated.",
                c.generation_tokens,
            ),
            (
                "stepwise_decode_steps_total",
                "Decoding steps (forward passes) of the generation worker.",
                c.decode_steps,
            ),
            (
                "stepwise_decode_rows_total",
                "Continuations decoded, summed over decoding steps (divided by the steps: the mean batch).",
                c.decode_rows,
            ),
            (
                "stepwise_decode_prompt_rows_total",
                "Prompt tokens fed through decoding steps (chunked prefill), summed over steps.",
                c.decode_prompt_rows,
            ),
            (
                "stepwise_logprob_passes_total",
                "Forward passes of the log-probability worker (echoed prompts, generated tokens' log-probabilities).",
                c.weigh_passes,
            ),
            (
                "stepwise_logprob_sequences_total",
                "Sequences weighed by the log-probability worker (divided by its passes: the mean packing).",
                c.weigh_sequences,
            ),
            (
                "stepwise_requests_cancelled_total",
                "Generation requests stopped because their client went away.",
                c.cancelled,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        }
        let _ = writeln!(out, "# HELP stepwise_request_seconds Time to answer a request.");
        let _ = writeln!(out, "# TYPE stepwise_request_seconds histogram");
        for (b, le) in c.latency_buckets.iter().zip(BUCKETS) {
            let _ = writeln!(out, "stepwise_request_seconds_bucket{{le=\"{le}\"}} {b}");
        }
        let _ = writeln!(
            out,
            "stepwise_request_seconds_bucket{{le=\"+Inf\"}} {}",
            c.latency_count
        );
        let _ = writeln!(out, "stepwise_request_seconds_sum {}", c.latency_sum);
        let _ = writeln!(out, "stepwise_request_seconds_count {}", c.latency_count);
        out
    }
}
