//! Helpers shared by the CLI's integration tests.

/// Verifier `name`'s step scores (`scores.NAME`) of a stepwise JSONL file's solutions, in order.
pub fn step_scores(jsonl: &str, name: &str) -> Vec<f64> {
    jsonl
        .lines()
        .flat_map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            v["scores"][name]
                .as_array()
                .unwrap_or_else(|| panic!("no `scores.{name}` in {line}"))
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}
