//! `tokenizer.json` (Hugging Face `tokenizers`) and the chat template of `tokenizer_config.json`
//! rendered with minijinja the way transformers' `apply_chat_template` does.

use anyhow::{anyhow, Context, Result};
use serde_json::Value;
use std::path::Path;

/// Steps of work (minijinja's fuel) a chat template may spend, plus
/// [`TEMPLATE_FUEL_PER_MESSAGE`] a message.
pub const TEMPLATE_FUEL_BASE: u64 = 1_000_000;
/// Steps of work a chat template may spend per message.
pub const TEMPLATE_FUEL_PER_MESSAGE: u64 = 100_000;

/// A tokenizer with its chat template and special tokens.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    chat_template: Option<String>,
    /// End-of-sequence token text (`eos_token` of `tokenizer_config.json`).
    pub eos_token: Option<String>,
    /// Padding token text.
    pub pad_token: Option<String>,
    /// Beginning-of-sequence token text (what a chat template's `bos_token` renders as).
    pub bos_token: Option<String>,
    /// The longest token's text, in bytes (computed once).
    longest: std::sync::OnceLock<usize>,
}

fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// One chat message.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message.
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

impl Tokenizer {
    /// Load `tokenizer.json` (and `tokenizer_config.json` when present) from a folder.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let text = stepwise_core::io::read_regular_file(&path)?;
        let inner = <tokenizers::Tokenizer as std::str::FromStr>::from_str(&text)
            .map_err(|e| anyhow!("{}: {e}", path.display()))?;
        if inner.get_vocab_size(true) == 0 {
            anyhow::bail!(
                "{}: field `model.vocab`: the vocabulary is empty, so no text can be encoded",
                path.display()
            );
        }
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: Value = if cfg_path.exists() {
            serde_json::from_str(&stepwise_core::io::read_regular_file(&cfg_path)?)
                .with_context(|| format!("{}: invalid JSON", cfg_path.display()))?
        } else {
            Value::Null
        };
        Ok(Tokenizer {
            inner,
            chat_template: cfg.get("chat_template").and_then(Value::as_str).map(str::to_string),
            eos_token: token_text(cfg.get("eos_token")),
            pad_token: token_text(cfg.get("pad_token")),
            bos_token: token_text(cfg.get("bos_token")),
            longest: Default::default(),
        })
    }

    /// The `tokenizer.json` of a word-level tokenizer: whitespace splits the text, word `i` of
    /// `words` is token `i`, anything else is `unk` (which must be one of the words).
    pub fn word_level_json(words: &[String], unk: &str) -> String {
        let vocab: serde_json::Map<String, Value> = words
            .iter()
            .enumerate()
            .map(|(i, w)| (w.clone(), Value::from(i)))
            .collect();
        serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
            "pre_tokenizer": {"type": "WhitespaceSplit"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": unk}
        })
        .to_string()
    }

    /// A word-level tokenizer ([`Tokenizer::word_level_json`]) with `eos` as its end token.
    pub fn word_level(words: &[String], unk: &str, eos: Option<&str>) -> Result<Self> {
        let inner: tokenizers::Tokenizer = Self::word_level_json(words, unk)
            .parse()
            .map_err(|e| anyhow!("word-level tokenizer: {e}"))?;
        Ok(Self::from_inner(inner, eos.map(str::to_string)))
    }

    /// Wrap an in-memory `tokenizers::Tokenizer` (e.g. one stepwise built for the lab).
    pub fn from_inner(inner: tokenizers::Tokenizer, eos_token: Option<String>) -> Self {
        Tokenizer {
            inner,
            chat_template: None,
            eos_token,
            pad_token: None,
            bos_token: None,
            longest: Default::default(),
        }
    }

    /// The same tokenizer with `template` as its chat template (a Jinja text, as
    /// `tokenizer_config.json`'s `chat_template`).
    pub fn with_chat_template(mut self, template: impl Into<String>) -> Self {
        self.chat_template = Some(template.into());
        self
    }

    /// The chat template (`tokenizer_config.json`'s `chat_template`), if it has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The wrapped tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Token ids of `text`; `special` adds the post-processor's special tokens (transformers'
    /// default for `tokenizer(text)`).
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>> {
        Ok(self
            .inner
            .encode(text, special)
            .map_err(|e| anyhow!("tokenizing: {e}"))?
            .get_ids()
            .to_vec())
    }

    /// Text of token ids.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(|e| anyhow!("decoding: {e}"))
    }

    /// The id of a token given by its text.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The most bytes of text one token can stand for (its vocabulary's longest entry): a text
    /// of more than `n` times that many bytes is more than `n` tokens, known without tokenizing.
    pub fn longest_token_bytes(&self) -> usize {
        *self.longest.get_or_init(|| {
            self.inner
                .get_vocab(true)
                .keys()
                .map(String::len)
                .max()
                .unwrap_or(1)
                .max(1)
        })
    }

    /// Vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// End-of-sequence token id.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_token.as_deref().and_then(|t| self.token_id(t))
    }

    /// Render messages with the chat template (its work bounded: see [`TEMPLATE_FUEL_BASE`]).
    pub fn apply_chat_template(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let tpl = self
            .chat_template
            .as_deref()
            .context("tokenizer_config.json has no chat_template")?;
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(false);
        // A template's work is bounded: one that loops without end (or nests `range(100000)`)
        // fails instead of holding the caller. Real templates spend a few hundred steps a message.
        let fuel = TEMPLATE_FUEL_BASE + TEMPLATE_FUEL_PER_MESSAGE * messages.len() as u64;
        env.set_fuel(Some(fuel));
        env.add_template("chat", tpl).context("parsing the chat template")?;
        env.get_template("chat")?
            .render(minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                eos_token => self.eos_token.clone().unwrap_or_default(),
                bos_token => self.bos_token.clone().unwrap_or_default(),
            })
            .map_err(|e| match e.kind() {
                minijinja::ErrorKind::OutOfFuel => {
                    anyhow!(
                        "the chat template did more than {fuel} steps of work for {} messages: it loops too much",
                        messages.len()
                    )
                }
                _ => anyhow::Error::new(e).context("rendering the chat template"),
            })
    }
}

/// Copy the tokenizer files of checkpoint folder `from` (`tokenizer.json`,
/// `tokenizer_config.json`: those it has) into `to`, so that weights written there load alone.
pub fn copy_files(from: &Path, to: &Path) -> Result<()> {
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        if from.join(f).exists() {
            std::fs::copy(from.join(f), to.join(f)).with_context(|| format!("copying {f} into {}", to.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_template_that_loops_too_much_fails_instead_of_hanging() {
        let mut tok = Tokenizer::word_level(&["a".into(), "<unk>".into()], "<unk>", None).unwrap();
        let messages = [Message::new("user", "hi")];
        tok.chat_template = Some("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}".into());
        assert_eq!(tok.apply_chat_template(&messages, false).unwrap(), "<user>hi");
        tok.chat_template =
            Some("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}".into());
        let err = tok.apply_chat_template(&messages, false).unwrap_err().to_string();
        assert!(err.contains("loops too much"), "{err}");
    }

    #[test]
    fn a_tokenizer_with_an_empty_vocabulary_is_refused_by_name() {
        let dir_tmp = tempfile::tempdir().unwrap();
        let dir = dir_tmp.path().join("stepwise-empty-vocab");
        std::fs::create_dir_all(&dir).unwrap();
        let empty = r#"{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "vocab": {}, "merges": []}}"#;
        std::fs::write(dir.join("tokenizer.json"), empty).unwrap();
        let err = format!(
            "{:#}",
            Tokenizer::from_dir(&dir).err().expect("an empty vocabulary is refused")
        );
        assert!(
            err.contains("tokenizer.json") && err.contains("model.vocab") && err.contains("empty"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
