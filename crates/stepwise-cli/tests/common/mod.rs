//! Helpers shared by the CLI's integration tests.

/// Every step score of a stepwise JSONL file's solutions, in order.
pub fn step_scores(jsonl: &str) -> Vec<f64> {
    jsonl
        .lines()
        .flat_map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            v["steps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["score"].as_f64().unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}
