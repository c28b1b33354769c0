//! OpenRLHF's remote reward model protocol (`--reward.remote_url http://host:port/get_reward`):
//! `{"query": [prompt + response, ...], "prompts": [...], "labels": [...]}` in,
//! `{"rewards": [...], "scores": [...], "extra_logs": {...}}` out, one reward a response: its
//! steps' PRM scores aggregated, plus the graded outcome when a label is given. The Python
//! package's `stepwise.integrations.openrlhf.reward_func` computes the same rewards in-process.

use super::{ApiError, Shared};
use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use stepwise_core::grader::{grade, GradeMode};
use stepwise_core::seams::split_steps_at;
use stepwise_model::chat_turns::ChatTurns;
use stepwise_search::{aggregate, Aggregation};

/// How a response's reward is made.
#[derive(Debug, Clone)]
pub struct RewardRule {
    /// Text between the response's steps.
    pub separator: String,
    /// How the step scores become one number.
    pub aggregation: Aggregation,
    /// Weight of the graded outcome (1 when the answer equals the label) added to it.
    pub outcome_weight: f32,
    /// The grader.
    pub mode: GradeMode,
    /// The turns of the chat template the queries were written with (the served policy's, else
    /// the PRM's); None: Qwen's and Llama 3's marks are recognised.
    pub turns: Option<ChatTurns>,
}

impl Default for RewardRule {
    fn default() -> Self {
        RewardRule {
            separator: "\n\n".into(),
            aggregation: Aggregation::Min,
            outcome_weight: 1.0,
            mode: GradeMode::Lenient,
            turns: None,
        }
    }
}

/// End-of-turn marks a response may end with when no chat template is known (removed before
/// grading and splitting).
const END_MARKS: [&str; 5] = ["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>", "<|end_of_text|>"];

/// The response in `query` (OpenRLHF sends prompt + response), end-of-turn marks removed: those
/// of `turns`, else the usual ones.
pub fn response_of<'a>(query: &'a str, prompt: &str, turns: Option<&ChatTurns>) -> &'a str {
    let mut text = match query.strip_prefix(prompt) {
        Some(rest) if !prompt.is_empty() => rest,
        _ => query,
    };
    if let Some(turns) = turns {
        return turns.strip_end(text);
    }
    while let Some(rest) = END_MARKS.iter().find_map(|m| text.trim_end().strip_suffix(m)) {
        text = rest;
    }
    text
}

/// The user's question inside a chat-templated prompt: its last user turn by `turns`, else by
/// Qwen's and Llama 3's marks, else the prompt itself.
pub fn question_of<'a>(prompt: &'a str, turns: Option<&ChatTurns>) -> &'a str {
    if let Some(question) = turns.and_then(|t| t.question(prompt)) {
        return question;
    }
    for (start, end) in [
        ("<|im_start|>user\n", "<|im_end|>"),
        ("<|start_header_id|>user<|end_header_id|>\n\n", "<|eot_id|>"),
    ] {
        if let Some(at) = prompt.rfind(start) {
            let body = &prompt[at + start.len()..];
            return body.find(end).map_or(body, |e| &body[..e]);
        }
    }
    prompt
}

/// One response's reward from its step scores and, when given, its label: `(reward, process,
/// outcome)`.
pub fn reward_of(rule: &RewardRule, response: &str, step_scores: &[f32], label: Option<&str>) -> (f32, f32, f32) {
    let process = aggregate(step_scores, rule.aggregation);
    let outcome = match (label, stepwise_core::answer::extract_answer(response)) {
        (Some(gold), Some(answer)) if grade(&answer, gold, rule.mode) => 1.0,
        _ => 0.0,
    };
    (process + rule.outcome_weight * outcome, process, outcome)
}

/// A response's question and steps (`prompt` empty when OpenRLHF sends none).
pub fn parts(rule: &RewardRule, query: &str, prompt: &str) -> (String, Vec<String>, String) {
    let turns = rule.turns.as_ref();
    let response = response_of(query, prompt, turns);
    (
        question_of(prompt, turns).to_string(),
        split_steps_at(response, &rule.separator),
        response.to_string(),
    )
}

/// `POST /get_reward`.
pub(crate) async fn get_reward(State(s): State<Shared>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let v = super::request::parse_body(&body)?;
    if s.prm.is_none() {
        return Err(ApiError::invalid("this server has no PRM (start it with --prm)", None));
    }
    let texts = |key: &'static str, required: bool| -> Result<Option<Vec<Option<String>>>, ApiError> {
        match v.get(key) {
            None | Some(Value::Null) if !required => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a.iter().map(|x| x.as_str().map(str::to_string)).collect())),
            _ => Err(ApiError::invalid(format!("`{key}` must be a list of texts"), Some(key))),
        }
    };
    let queries = texts("query", true)?.unwrap_or_default();
    let n = queries.len();
    super::steps::check_count(&s, n, "query")?;
    let prompts = texts("prompts", false)?.unwrap_or_else(|| vec![None; n]);
    let labels = texts("labels", false)?.unwrap_or_else(|| vec![None; n]);
    if prompts.len() != n || labels.len() != n {
        return Err(ApiError::invalid(
            format!("{n} queries but {} prompts and {} labels", prompts.len(), labels.len()),
            Some("prompts"),
        ));
    }
    let rule = s.reward_rule.clone();
    let mut inputs = Vec::with_capacity(n);
    let mut responses = Vec::with_capacity(n);
    for (k, (q, p)) in queries.iter().zip(&prompts).enumerate() {
        let q = q
            .as_deref()
            .ok_or_else(|| ApiError::invalid(format!("query[{k}] is not a text"), Some("query")))?;
        let (question, steps, response) = parts(&rule, q, p.as_deref().unwrap_or(""));
        inputs.push((question, steps, false));
        responses.push(response);
    }
    let scored = super::steps::score_queued(&s, inputs).await?;
    let mut rewards = Vec::with_capacity(n);
    let (mut process, mut outcomes) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for ((response, scores), label) in responses.iter().zip(&scored.scores).zip(&labels) {
        let (r, p, o) = reward_of(&rule, response, scores, label.as_deref());
        rewards.push(r);
        process.push(p);
        outcomes.push(o);
    }
    s.metrics.tokens(scored.tokens, 0);
    Ok(Json(json!({
        "rewards": rewards,
        "scores": rewards,
        "step_scores": scored.scores,
        "extra_logs": {"prm": process, "acc": outcomes,
                        "num_steps": scored.scores.iter().map(|s| s.len() as f32).collect::<Vec<_>>()},
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_question_and_response_of_a_templated_query() {
        let prompt = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n";
        let query = format!("{prompt}2 + 3 = 5.\n\nThe answer is \\boxed{{5}}.<|im_end|><|endoftext|>");
        let rule = RewardRule::default();
        let (question, steps, response) = parts(&rule, &query, prompt);
        assert_eq!(question, "What is 2+3?");
        assert_eq!(steps, vec!["2 + 3 = 5.", "The answer is \\boxed{5}."]);
        let (r, p, o) = reward_of(&rule, &response, &[0.9, 0.6], Some("5"));
        assert_eq!((p, o), (0.6, 1.0));
        assert!((r - 1.6).abs() < 1e-6);
        assert_eq!(reward_of(&rule, &response, &[0.9, 0.6], Some("6")).2, 0.0);
        // No prompt given: the query is the response; a bare prompt is its own question.
        assert_eq!(response_of("just text</s>", "", None), "just text");
        assert_eq!(question_of("plain question", None), "plain question");
    }

    /// With the marks read off the checkpoint's template (here Gemma's, which the fixed list
    /// does not know), its turns are read the same way.
    #[test]
    fn a_template_s_own_turns_are_used_when_known() {
        let turns = ChatTurns {
            user_open: "<start_of_turn>user\n".into(),
            after_user: "<end_of_turn>\n<start_of_turn>model\n".into(),
            turn_end: "<end_of_turn>".into(),
            eos: Some("<eos>".into()),
        };
        let prompt = "<bos><start_of_turn>user\nWhat is 2+3?<end_of_turn>\n<start_of_turn>model\n";
        let query = format!("{prompt}2 + 3 = 5.\n\nThe answer is 5.<end_of_turn>\n<eos>");
        let rule = RewardRule {
            turns: Some(turns),
            ..RewardRule::default()
        };
        let (question, steps, _) = parts(&rule, &query, prompt);
        assert_eq!(question, "What is 2+3?");
        assert_eq!(steps, vec!["2 + 3 = 5.", "The answer is 5."]);
        // Without them, Gemma's marks stay in the question and the response.
        let (question, steps, _) = parts(&RewardRule::default(), &query, prompt);
        assert_ne!(question, "What is 2+3?");
        assert!(steps[1].contains("<end_of_turn>"));
    }
}
