//! The lab's tokenizer: word level with one token per whole number (0 to [`MAX_NUMBER`]), built in
//! code and saved as a Hugging Face `tokenizer.json` next to every checkpoint the lab trains.
//!
//! Whole-number tokens make each equation one lookup for the model (`36 - 13 =` → `23`), as
//! single digits were for multiplication. With one token per digit, a 64-wide two-layer policy got
//! 70–90% of additions and subtractions wrong even without carries: its mistakes were steps no
//! model of its size could check, so no verifier could do better than chance on them. Real
//! policies mostly fail on steps they could verify (see the README's lab section).

use crate::task::generate;
use anyhow::{anyhow, Result};
use rand::SeedableRng;
use std::collections::BTreeSet;
use stepwise_model::Tokenizer;

/// Separator between steps inside model inputs.
pub const SEP: &str = "|";
/// End of a solution.
pub const EOS: &str = "<eos>";
/// The largest number with its own token (larger ones are unknown to the lab's models; no
/// problem, reference or slip comes near it).
pub const MAX_NUMBER: usize = 299;

/// The `tokenizer.json` text of the lab tokenizer.
pub fn tokenizer_json() -> String {
    let mut words: BTreeSet<String> = BTreeSet::new();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    for i in 0..3000 {
        let p = generate(&mut rng, i);
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
    let mut vocab = vec!["<pad>".to_string(), "<unk>".into(), EOS.into(), SEP.into()];
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
    Tokenizer::word_level_json(&vocab, "<unk>")
}

/// The lab tokenizer.
pub fn tokenizer() -> Result<Tokenizer> {
    let inner: tokenizers::Tokenizer = tokenizer_json().parse().map_err(|e| anyhow!("lab tokenizer: {e}"))?;
    Ok(Tokenizer::from_inner(inner, Some(EOS.into())))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn round_trip() {
        let t = tokenizer().unwrap();
        let ids = t.encode("Ann has 12 boxes | 12 * 3 = 36", false).unwrap();
        assert!(!ids.contains(&1), "no unknown tokens");
        assert_eq!(ids.len(), 10, "one token per number");
        assert_eq!(t.decode(&ids).unwrap(), "Ann has 12 boxes | 12 * 3 = 36");
    }
}
