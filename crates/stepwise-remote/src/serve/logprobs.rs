//! Token log-probabilities in `/v1/completions` replies: those of the generated tokens, and with
//! `echo` those of the prompt's own tokens before them (the first has none), as OpenAI's
//! completions API and vLLM give them. lm-evaluation-harness's loglikelihood tasks read a
//! prompt's log-probabilities this way (`echo: true, logprobs: 1, max_tokens: 0 or 1`), and so
//! does a judge weighed by likelihood through a served model
//! ([`crate::RemotePolicy`]'s `logprobs_after`).
//!
//! Memory stays bounded whatever the client asks: the sequence is encoded once and the
//! vocabulary rows are computed a slice of positions at a time (about 64 MiB of them), never a
//! whole long prompt's at once.

use anyhow::Result;
use serde_json::{json, Value};
use stepwise_model::LoadedPolicy;

/// A token's text, its log-probability, and the most likely tokens at its position.
pub(super) type TokenLogprob = (String, f32, Vec<(String, f32)>);

/// Vocabulary floats computed in one pass at most (64 MiB of `f32`).
const FLOATS_A_PASS: usize = 1 << 24;

/// Each of `targets`' log-probability under the model (its raw distribution, as vLLM reports by
/// default) and the `k` likeliest tokens there: `targets[i]` is read at position `first + i` of
/// `ids` (the position before it). One pass over `ids`, the vocabulary rows computed a slice of
/// positions at a time, so a long prompt's rows never sit in memory at once.
pub(super) fn logprobs_at(
    p: &LoadedPolicy,
    ids: &[u32],
    first: usize,
    targets: &[u32],
    k: usize,
) -> Result<Vec<TokenLogprob>> {
    let per_pass = (FLOATS_A_PASS / p.model.config.vocab_size.max(1)).max(1);
    let rows: Vec<usize> = (first..first + targets.len()).collect();
    let mut out = Vec::with_capacity(targets.len());
    p.model.vocab_logprobs_each(ids, &rows, per_pass, |at, logp| {
        for (&t, row) in targets[at..].iter().zip(logp) {
            let lp = *row
                .get(t as usize)
                .ok_or_else(|| anyhow::anyhow!("token {t} is outside the model's vocabulary"))?;
            out.push((p.tokenizer.decode(&[t])?, lp, likeliest(p, &row, k)?));
        }
        Ok(())
    })?;
    Ok(out)
}

/// The `k` likeliest tokens of a row of log-probabilities, likeliest first.
fn likeliest(p: &LoadedPolicy, row: &[f32], k: usize) -> Result<Vec<(String, f32)>> {
    let k = k.min(row.len());
    if k == 0 {
        return Ok(Vec::new());
    }
    let mut best: Vec<(usize, f32)> = row.iter().copied().enumerate().collect();
    best.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
    best.truncate(k);
    best.sort_by(|a, b| b.1.total_cmp(&a.1));
    best.into_iter()
        .map(|(id, lp)| Ok((p.tokenizer.decode(&[id as u32])?, lp)))
        .collect()
}

/// The prompt's tokens after its first, each with its log-probability given those before it.
pub(super) fn prompt_logprobs(p: &LoadedPolicy, ids: &[u32], k: usize) -> Result<Vec<TokenLogprob>> {
    if ids.len() < 2 {
        return Ok(Vec::new());
    }
    logprobs_at(p, ids, 0, &ids[1..], k)
}

/// The prompt's tokens in a reply: the first token's text (it has no log-probability) and the
/// rest with theirs.
pub(super) struct Echoed {
    pub(super) first: String,
    pub(super) rest: Vec<TokenLogprob>,
}

impl Echoed {
    /// `ids`' tokens with their log-probabilities (`k` alternatives each).
    pub(super) fn of(p: &LoadedPolicy, ids: &[u32], k: usize) -> Result<Self> {
        let first = match ids.first() {
            Some(&t) => p.tokenizer.decode(&[t])?,
            None => String::new(),
        };
        Ok(Echoed {
            first,
            rest: prompt_logprobs(p, ids, k)?,
        })
    }
}

/// A completion choice's `logprobs` object: `tokens`, `token_logprobs`, `top_logprobs` and
/// `text_offset` (each token's start in the choice's text), the echoed prompt's tokens first
/// (its first token's log-probability and alternatives `null`) and then the generated ones.
pub(super) fn completion_logprobs(echoed: Option<&Echoed>, generated: &[TokenLogprob]) -> Value {
    let (mut tokens, mut lps, mut tops) = (Vec::new(), Vec::new(), Vec::new());
    if let Some(e) = echoed {
        tokens.push(e.first.as_str());
        lps.push(Value::Null);
        tops.push(Value::Null);
    }
    let rest = echoed.map_or(&[][..], |e| &e.rest[..]);
    for (t, lp, top) in rest.iter().chain(generated) {
        tokens.push(t.as_str());
        lps.push(json!(lp));
        tops.push(Value::Object(
            top.iter().map(|(tt, l)| (tt.clone(), json!(l))).collect(),
        ));
    }
    let mut offset = 0;
    let offsets: Vec<usize> = tokens
        .iter()
        .map(|t| {
            let at = offset;
            // In characters, as OpenAI and vLLM count them.
            offset += t.chars().count();
            at
        })
        .collect();
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_echoed_prompt_leads_with_a_null_first_token_and_offsets_run_on() {
        let echoed = Echoed {
            first: "The".into(),
            rest: vec![(" cat".into(), -1.5, vec![(" cat".into(), -1.5), (" dog".into(), -2.0)])],
        };
        let generated = vec![(" sat".to_string(), -0.5, vec![(" sat".to_string(), -0.5)])];
        let v = completion_logprobs(Some(&echoed), &generated);
        assert_eq!(v["tokens"], json!(["The", " cat", " sat"]));
        assert_eq!(v["token_logprobs"], json!([null, -1.5, -0.5]));
        assert_eq!(v["top_logprobs"][0], Value::Null);
        assert_eq!(v["top_logprobs"][1][" dog"], json!(-2.0));
        assert_eq!(v["text_offset"], json!([0, 3, 7]));
        let plain = completion_logprobs(None, &generated);
        assert_eq!(plain["token_logprobs"], json!([-0.5]));
        assert_eq!(plain["text_offset"], json!([0]));
    }
}
