//! Where a chat-templated text's turns begin and end, read off the checkpoint's own chat template
//! (rendered with minijinja, as prompts are) instead of a list of model families: the text that
//! opens a user turn, the text that follows a user message, and the text that closes an assistant
//! turn. OpenRLHF sends prompt + response as it templated them; the question is the last user
//! turn and the response ends before the closing marks.

use crate::tokenizer::{Message, Tokenizer};
use anyhow::{bail, Context, Result};

/// The marks of one chat template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTurns {
    /// Opens a user turn (`<|im_start|>user\n`, `<start_of_turn>user\n`).
    pub user_open: String,
    /// Follows a user message when the assistant answers next (`<|im_end|>\n<|im_start|>assistant\n`).
    pub after_user: String,
    /// Closes an assistant turn (`<|im_end|>`, `<end_of_turn>`, `<|eot_id|>`), whitespace trimmed.
    pub turn_end: String,
    /// The tokenizer's end-of-sequence text, which may follow a response too.
    pub eos: Option<String>,
}

/// Texts no template writes, standing for the messages.
const QUESTION: &str = "\u{E000}stepwise-question\u{E000}";
const ANSWER: &str = "\u{E000}stepwise-answer\u{E000}";
const NEXT: &str = "\u{E000}stepwise-next\u{E000}";

impl ChatTurns {
    /// The marks of `tok`'s chat template, found by rendering placeholder conversations.
    pub fn of(tok: &Tokenizer) -> Result<ChatTurns> {
        let render = |messages: &[(&str, &str)], generation: bool| {
            let messages: Vec<Message> = messages.iter().map(|(r, c)| Message::new(r, c)).collect();
            tok.apply_chat_template(&messages, generation)
        };
        let asked = render(&[("user", QUESTION)], true)?;
        let after_user = asked
            .split_once(QUESTION)
            .context("the chat template drops the user's message")?
            .1
            .to_string();
        let answered = render(&[("user", QUESTION), ("assistant", ANSWER)], false)?;
        let closing = answered
            .split_once(ANSWER)
            .context("the chat template drops the assistant's message")?
            .1
            .to_string();
        let follow_up = render(&[("user", QUESTION), ("assistant", ANSWER), ("user", NEXT)], true)?;
        let between = between(&follow_up, ANSWER, NEXT).context("the chat template drops a second user message")?;
        let user_open = between.strip_prefix(closing.as_str()).unwrap_or(between).to_string();
        let turn_end = closing.trim().to_string();
        if user_open.trim().is_empty() || turn_end.is_empty() {
            bail!("the chat template marks no user turn or no end of an assistant turn");
        }
        Ok(ChatTurns {
            user_open,
            after_user,
            turn_end,
            eos: tok.eos_token.clone().filter(|e| !e.is_empty()),
        })
    }

    /// The last user message in a templated `prompt`, if the prompt has one.
    pub fn question<'a>(&self, prompt: &'a str) -> Option<&'a str> {
        let at = prompt.rfind(&self.user_open)? + self.user_open.len();
        let body = &prompt[at..];
        let end = body
            .find(&self.after_user)
            .or_else(|| {
                body.find(self.after_user.trim())
                    .filter(|_| !self.after_user.trim().is_empty())
            })
            .or_else(|| body.find(&self.turn_end))
            .unwrap_or(body.len());
        Some(&body[..end])
    }

    /// `response` without the turn's closing marks (and end-of-sequence texts) at its end.
    pub fn strip_end<'a>(&self, response: &'a str) -> &'a str {
        let mut text = response;
        let marks = std::iter::once(self.turn_end.as_str()).chain(self.eos.as_deref());
        let marks: Vec<&str> = marks.collect();
        while let Some(rest) = marks.iter().find_map(|m| text.trim_end().strip_suffix(m)) {
            text = rest;
        }
        text
    }
}

/// The text between the first `a` and the next `b` in `text`.
fn between<'a>(text: &'a str, a: &str, b: &str) -> Option<&'a str> {
    let start = text.find(a)? + a.len();
    let len = text[start..].find(b)?;
    Some(&text[start..start + len])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_template(template: &str, eos: &str) -> Tokenizer {
        let inner = tokenizers::Tokenizer::new(tokenizers::models::bpe::BPE::default());
        Tokenizer::from_inner(inner, Some(eos.into())).with_chat_template(template)
    }

    const QWEN: &str = "{% for m in messages %}{% if loop.first and m.role != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    const LLAMA3: &str = "{{ '<|begin_of_text|>' }}{% for m in messages %}{{ '<|start_header_id|>' + m.role + '<|end_header_id|>\n\n' + m.content | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
    const GEMMA: &str = "{{ bos_token }}{% for m in messages %}{% set role = 'model' if m.role == 'assistant' else m.role %}<start_of_turn>{{ role }}\n{{ m.content | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}";

    #[test]
    fn the_question_and_response_of_three_families_are_read_off_their_templates() {
        for (name, template, eos) in [
            ("qwen", QWEN, "<|endoftext|>"),
            ("llama3", LLAMA3, "<|end_of_text|>"),
            ("gemma", GEMMA, "<eos>"),
        ] {
            let tok = with_template(template, eos);
            let turns = ChatTurns::of(&tok).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            let prompt = tok
                .apply_chat_template(
                    &[
                        Message::new("user", "What is 1+1?"),
                        Message::new("assistant", "2"),
                        Message::new("user", "What is 2+3?"),
                    ],
                    true,
                )
                .unwrap();
            assert_eq!(turns.question(&prompt), Some("What is 2+3?"), "{name}: {turns:?}");
            let answer = "2 + 3 = 5.\n\nThe answer is 5.";
            let closed = tok
                .apply_chat_template(
                    &[Message::new("user", "What is 2+3?"), Message::new("assistant", answer)],
                    false,
                )
                .unwrap();
            let response = &closed[closed.find(answer).unwrap()..];
            assert_eq!(
                turns.strip_end(&format!("{response}{eos}")),
                answer,
                "{name}: {turns:?}"
            );
            assert_eq!(turns.question("no template here"), None);
        }
    }

    #[test]
    fn a_template_without_turns_is_an_error() {
        let tok = with_template("{% for m in messages %}{{ m.content }}{% endfor %}", "</s>");
        assert!(ChatTurns::of(&tok).is_err());
    }
}
