//! Token log-probabilities in `/v1/completions` replies: those of the generated tokens, and with
//! `echo` those of the prompt's own tokens before them (the first has none), as OpenAI's
//! completions API and vLLM give them. lm-evaluation-harness's loglikelihood tasks read a
//! prompt's log-probabilities this way (`echo: true, logprobs: 1, max_tokens: 0 or 1`), and so
//! does a judge weighed by likelihood through a served model
//! ([`crate::RemotePolicy`]'s `logprobs_after`). The numbers come from the log-probability
//! worker ([`super::weigher`]); this is their shape in a reply.

use super::weigher::Weighed;
use anyhow::Result;
use serde_json::{json, Value};
use stepwise_model::LoadedPolicy;

/// A token's text, its log-probability, and the most likely tokens at its position.
pub(super) type TokenLogprob = (String, f32, Vec<(String, f32)>);

/// Weighed tokens as texts.
pub(super) fn texts(p: &LoadedPolicy, weighed: Vec<Weighed>) -> Result<Vec<TokenLogprob>> {
    weighed
        .into_iter()
        .map(|w| {
            let top = w
                .top
                .into_iter()
                .map(|(t, lp)| Ok((p.tokenizer.decode(&[t])?, lp)))
                .collect::<Result<_>>()?;
            Ok((p.tokenizer.decode(&[w.token])?, w.logprob, top))
        })
        .collect()
}

/// The prompt's tokens in a reply: the first token's text (it has no log-probability) and the
/// rest with theirs.
pub(super) struct Echoed {
    pub(super) first: String,
    pub(super) rest: Vec<TokenLogprob>,
}

impl Echoed {
    /// The prompt `ids`, its tokens after the first weighed as `rest`.
    pub(super) fn of(p: &LoadedPolicy, ids: &[u32], rest: Vec<Weighed>) -> Result<Self> {
        let first = match ids.first() {
            Some(&t) => p.tokenizer.decode(&[t])?,
            None => String::new(),
        };
        Ok(Echoed {
            first,
            rest: texts(p, rest)?,
        })
    }

    /// The characters of its tokens' texts (where a generated token's text starts).
    pub(super) fn chars(&self) -> usize {
        self.first.chars().count() + chars(&self.rest)
    }
}

/// A completion choice's `logprobs` object: `tokens`, `token_logprobs`, `top_logprobs` and
/// `text_offset` (each token's start in the choice's text, counted from `offset`: a stream's
/// chunk continues its earlier chunks' text), the echoed prompt's tokens first (its first
/// token's log-probability and alternatives `null`) and then the generated ones.
pub(super) fn completion_logprobs(echoed: Option<&Echoed>, generated: &[TokenLogprob], offset: usize) -> Value {
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
    let mut offset = offset;
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

/// A chat choice's `logprobs` object: `content`, each token's text, log-probability, bytes and
/// likeliest alternatives.
pub(super) fn chat_logprobs(tokens: &[TokenLogprob]) -> Value {
    let entry = |t: &str, lp: f32| json!({"token": t, "logprob": lp, "bytes": t.as_bytes()});
    json!({"content": tokens.iter().map(|(t, lp, top)| {
        let mut e = entry(t, *lp);
        e["top_logprobs"] = top.iter().map(|(tt, l)| entry(tt, *l)).collect();
        e
    }).collect::<Vec<_>>()})
}

/// The characters of the tokens' texts (where the next token's text starts).
pub(super) fn chars(tokens: &[TokenLogprob]) -> usize {
    tokens.iter().map(|(t, _, _)| t.chars().count()).sum()
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
        let v = completion_logprobs(Some(&echoed), &generated, 0);
        assert_eq!(v["tokens"], json!(["The", " cat", " sat"]));
        assert_eq!(v["token_logprobs"], json!([null, -1.5, -0.5]));
        assert_eq!(v["top_logprobs"][0], Value::Null);
        assert_eq!(v["top_logprobs"][1][" dog"], json!(-2.0));
        assert_eq!(v["text_offset"], json!([0, 3, 7]));
        let plain = completion_logprobs(None, &generated, 0);
        assert_eq!(plain["token_logprobs"], json!([-0.5]));
        assert_eq!(plain["text_offset"], json!([0]));
        assert_eq!(completion_logprobs(None, &generated, 9)["text_offset"], json!([9]));
        let chat = chat_logprobs(&generated);
        assert_eq!(chat["content"][0]["token"], json!(" sat"));
        assert_eq!(chat["content"][0]["bytes"], json!([32, 115, 97, 116]));
        assert_eq!(chat["content"][0]["top_logprobs"][0]["logprob"], json!(-0.5));
    }
}
