//! How a question and the steps so far become a prompt's token ids ([`Prompt`]): what a local
//! policy encodes and what a remote one sends, so that a server sees exactly the same input.

use crate::layout::encode_steps;
use crate::tokenizer::{Message, Tokenizer};
use anyhow::Result;

/// How the question and the steps so far become the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prompt {
    /// Question, separator, then each step and separator, every piece encoded on its own without
    /// special tokens: the layout the lab's policies and log-ratio verifiers are trained on
    /// ([`encode_steps`]).
    Pieces,
    /// The text `question + separator + step + separator + …`, encoded as one string.
    Text,
    /// The question in the tokenizer's chat template, then each step and separator.
    Chat,
}

impl Prompt {
    /// The prompt's token ids for a question and the steps so far, with `separator` between
    /// steps: what a local policy encodes, and what a remote one sends as token ids so that the
    /// server sees exactly the same input.
    pub fn ids(self, tok: &Tokenizer, separator: &str, question: &str, prefix: &[&str]) -> Result<Vec<u32>> {
        if self == Prompt::Pieces {
            return Ok(encode_steps(tok, question, prefix, separator, true)?.ids);
        }
        let mut text = match self {
            Prompt::Chat => tok.apply_chat_template(&[Message::new("user", question)], true)?,
            _ => format!("{question}{separator}"),
        };
        for s in prefix {
            text.push_str(s);
            text.push_str(separator);
        }
        tok.encode(&text, true)
    }
}
