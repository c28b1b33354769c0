//! The lab's tokenizer: word level with one token per whole number (0 to [`MAX_NUMBER`]), built in
//! code and saved as a Hugging Face `tokenizer.json` and `tokenizer_config.json` next to every
//! checkpoint the lab trains ([`save`]).
//!
//! Whole-number tokens make each equation one lookup for the model (`36 - 13 =` → `23`), as
//! single digits were for multiplication. With one token per digit, a 64-wide two-layer policy got
//! 70–90% of additions and subtractions wrong even without carries: its mistakes were steps no
//! model of its size could check, so no verifier could do better than chance on them. Real
//! policies mostly fail on steps they could verify (see the README's lab section).

use crate::task::Domain;
use anyhow::{anyhow, Context, Result};
use rand::SeedableRng;
use std::collections::BTreeSet;
use stepwise_model::Tokenizer;

/// Separator between steps inside model inputs.
pub const SEP: &str = "|";
/// End of a solution.
pub const EOS: &str = "<eos>";
/// Padding.
pub const PAD: &str = "<pad>";
/// Any word outside the vocabulary.
pub const UNK: &str = "<unk>";
/// The largest number with its own token (larger ones are unknown to the lab's models; no
/// problem, reference or slip comes near it).
pub const MAX_NUMBER: usize = 299;

/// The `tokenizer.json` text of the lab tokenizer of `domain`: the same special tokens and
/// numbers, and the domain's words (the code domain's are its stories', its symbols and Python's
/// `return`).
pub fn tokenizer_json(domain: Domain) -> String {
    let mut words: BTreeSet<String> = BTreeSet::new();
    match domain {
        Domain::Arithmetic => {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
            for i in 0..3000 {
                let p = crate::problems::arithmetic(&mut rng, i);
                for w in p
                    .question
                    .split_whitespace()
                    .chain(p.steps.iter().flat_map(|s| s.split_whitespace()))
                {
                    if !w.chars().all(|c| c.is_ascii_digit()) {
                        words.insert(w.to_string());
                    }
                }
            }
        }
        Domain::Code => words.extend(crate::code::words()),
        Domain::Agent => words.extend(crate::agent::games::words()),
    }
    let mut vocab = vec![PAD.to_string(), UNK.into(), EOS.into(), SEP.into()];
    vocab.extend((0..=MAX_NUMBER).map(|d| d.to_string()));
    vocab.extend(
        ["+", "-", "*", "%", "=", ">", "<", "first", "second"]
            .iter()
            .map(|s| s.to_string()),
    );
    for w in words {
        if !vocab.contains(&w) {
            vocab.push(w);
        }
    }
    Tokenizer::word_level_json(&vocab, UNK)
}

/// The `tokenizer_config.json` of the lab tokenizer. There is no slow tokenizer class for it, so
/// it names `PreTrainedTokenizerFast`: `AutoTokenizer` then reads `tokenizer.json` as it is
/// (a class guessed from `config.json`'s `model_type` would add special tokens of its own and
/// shift the ids), with the lab's special tokens.
pub fn tokenizer_config_json() -> String {
    serde_json::to_string_pretty(&serde_json::json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": UNK,
        "bos_token": null,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": false,
    }))
    .expect("a JSON value serializes")
}

/// Write the lab tokenizer of `domain` into a checkpoint folder, so the folder loads in
/// stepwise and in transformers with the lab's ids and special tokens.
pub fn save(dir: &std::path::Path, domain: Domain) -> Result<()> {
    for (name, text) in [
        ("tokenizer.json", tokenizer_json(domain)),
        ("tokenizer_config.json", tokenizer_config_json()),
    ] {
        std::fs::write(dir.join(name), text).with_context(|| format!("writing {}", dir.join(name).display()))?;
    }
    Ok(())
}

/// The lab tokenizer of `domain`.
pub fn tokenizer(domain: Domain) -> Result<Tokenizer> {
    let inner: tokenizers::Tokenizer = tokenizer_json(domain)
        .parse()
        .map_err(|e| anyhow!("lab tokenizer: {e}"))?;
    Ok(Tokenizer::from_inner(inner, Some(EOS.into())))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn round_trip() {
        let t = tokenizer(Domain::Arithmetic).unwrap();
        let ids = t.encode("Ann has 12 boxes | 12 * 3 = 36", false).unwrap();
        assert!(!ids.contains(&1), "no unknown tokens");
        assert_eq!(ids.len(), 10, "one token per number");
        assert_eq!(t.decode(&ids).unwrap(), "Ann has 12 boxes | 12 * 3 = 36");
    }

    #[test]
    fn code_programs_are_one_token_a_word() {
        let t = tokenizer(Domain::Code).unwrap();
        let text = "Ann has a boxes of 6 apples . Ann gets c more apples . | x = a * 6 | y = x + c | z = y % 4 | w = z > x | return w";
        let ids = t.encode(text, false).unwrap();
        assert!(!ids.contains(&t.token_id(UNK).unwrap()), "no unknown tokens");
        assert_eq!(ids.len(), text.split_whitespace().count());
        assert_eq!(t.decode(&ids).unwrap(), text);
    }

    /// A saved folder reads back with the same ids and the lab's end-of-sequence token.
    #[test]
    fn a_saved_folder_reads_back_the_same() {
        let dir_tmp = tempfile::tempdir().unwrap();
        let dir = dir_tmp.path().join("stepwise-lab-vocab");
        std::fs::create_dir_all(&dir).unwrap();
        save(&dir, Domain::Arithmetic).unwrap();
        let (saved, built) = (
            Tokenizer::from_dir(&dir).unwrap(),
            tokenizer(Domain::Arithmetic).unwrap(),
        );
        let text = "Ann has 12 boxes | 12 * 3 = 36 | unknownword <eos>";
        assert_eq!(saved.encode(text, true).unwrap(), built.encode(text, true).unwrap());
        assert_eq!(saved.eos_id(), built.eos_id());
        assert!(saved.eos_id().is_some());
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap()).unwrap();
        assert_eq!(config["tokenizer_class"], "PreTrainedTokenizerFast");
        for key in ["eos_token", "pad_token", "unk_token"] {
            let token = config[key].as_str().unwrap();
            assert!(
                built.token_id(token).is_some(),
                "{key} `{token}` is not in the vocabulary"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
