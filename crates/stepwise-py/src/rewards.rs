//! Rewards for RL engines: dense per-token step rewards (verl) and OpenRLHF's remote reward.

use crate::convert::{value_error, without_gil};
use crate::verifier::Prm;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use stepwise_core::grader::GradeMode;
use stepwise_core::seams::ScoreInput;
use stepwise_remote::serve::openrlhf::{parts, reward_of, RewardRule};

/// Per-token rewards for an RL engine (verl's `token_level_rewards`): each step's reward at the
/// token ending the step (`step_ends[j]`, ascending indices into the response), zero elsewhere,
/// plus `outcome` at the last token when given. `credit="return_to_go"` places each step's score
/// (the return from a step sums its score and every later one's); `credit="min"` places
/// differences so that the return from each step is the lowest score from it on (PURE's
/// min-form credit). `response` is the response's token ids (or their number).
///
/// >>> stepwise.step_rewards([11, 12, 13, 14], [0.2, 0.9], [1, 3], credit="min")
/// [0.0, -0.7, 0.0, 0.9]
#[pyfunction]
#[pyo3(signature = (response, step_scores, step_ends, credit="return_to_go", outcome=None))]
pub fn step_rewards(
    response: &Bound<'_, PyAny>,
    step_scores: Vec<f32>,
    step_ends: Vec<usize>,
    credit: &str,
    outcome: Option<f32>,
) -> PyResult<Vec<f64>> {
    let tokens = match response.extract::<usize>() {
        Ok(n) => n,
        Err(_) => response.len()?,
    };
    let credit = stepwise_rl::dense::TokenCredit::by_name(credit).map_err(|e| value_error(e.to_string()))?;
    let rewards = stepwise_rl::dense::token_rewards(tokens, &step_scores, &step_ends, credit, outcome)
        .map_err(|e| value_error(e.to_string()))?;
    Ok(rewards.into_iter().map(crate::convert::as_written).collect())
}

/// OpenRLHF's rewards for `queries` (prompt + response, as OpenRLHF sends them), exactly as
/// `stepwise serve`'s `/get_reward` computes them: each response (the query after its prompt,
/// end-of-turn marks removed) split into steps at `separator`, scored by `prm` (None: no process
/// reward) and aggregated (`min`, `product`, `last`, `mean`), plus `outcome_weight` when its
/// answer grades equal to its label. Returns `rewards` and `extra_logs` (`prm`, `acc`,
/// `num_steps`), and every response's `step_scores`.
#[pyfunction]
#[pyo3(signature = (queries, prompts=None, labels=None, prm=None, separator="\n\n", aggregate="min", outcome_weight=1.0, mode="lenient"))]
#[allow(clippy::too_many_arguments)]
pub fn openrlhf_rewards<'py>(
    py: Python<'py>,
    queries: Vec<String>,
    prompts: Option<Vec<String>>,
    labels: Option<Vec<Option<String>>>,
    prm: Option<Py<Prm>>,
    separator: &str,
    aggregate: &str,
    outcome_weight: f32,
    mode: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let n = queries.len();
    let prompts = prompts.unwrap_or_else(|| vec![String::new(); n]);
    let labels = labels.unwrap_or_else(|| vec![None; n]);
    if prompts.len() != n || labels.len() != n {
        return Err(value_error(format!(
            "{n} queries but {} prompts and {} labels",
            prompts.len(),
            labels.len()
        )));
    }
    let rule = RewardRule {
        separator: separator.to_string(),
        aggregation: stepwise_search::Aggregation::by_name(aggregate).map_err(|e| value_error(e.to_string()))?,
        outcome_weight,
        mode: mode.parse::<GradeMode>().map_err(value_error)?,
        // The queries' turns by the PRM's chat template when it is known here.
        turns: prm.as_ref().and_then(|p| p.get().chat_turns()),
    };
    let (rewards, process, outcomes, step_scores) = without_gil(py, || {
        let split: Vec<(String, Vec<String>, String)> =
            queries.iter().zip(&prompts).map(|(q, p)| parts(&rule, q, p)).collect();
        let step_scores: Vec<Vec<f32>> = match &prm {
            Some(prm) => {
                let inputs: Vec<ScoreInput> = split
                    .iter()
                    .map(|(q, steps, _)| ScoreInput {
                        problem_id: "",
                        question: q,
                        steps: steps.iter().map(String::as_str).collect(),
                        partial: false,
                    })
                    .collect();
                prm.get().score_inputs(&inputs)?
            }
            None => vec![Vec::new(); n],
        };
        let mut out = (Vec::new(), Vec::new(), Vec::new());
        for ((_, _, response), (scores, label)) in split.iter().zip(step_scores.iter().zip(&labels)) {
            let (r, p, o) = reward_of(&rule, response, scores, label.as_deref());
            out.0.push(r);
            out.1.push(p);
            out.2.push(o);
        }
        Ok((out.0, out.1, out.2, step_scores))
    })?;
    let d = PyDict::new(py);
    let logs = PyDict::new(py);
    logs.set_item("prm", process)?;
    logs.set_item("acc", outcomes)?;
    logs.set_item(
        "num_steps",
        step_scores.iter().map(|s| s.len() as f32).collect::<Vec<_>>(),
    )?;
    d.set_item("rewards", &rewards)?;
    d.set_item("scores", &rewards)?;
    d.set_item("extra_logs", logs)?;
    d.set_item("step_scores", step_scores)?;
    Ok(d)
}
