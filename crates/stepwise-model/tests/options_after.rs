//! Options weighed after their contexts on the packed engine (`PackedDecoder::options_after`,
//! what `Policy::logprobs_after` and a judge weighed by likelihood run on): each context is fed
//! once and its options go on from its cache, and every option's log-probability is what a
//! cache-free pass over the context and the option gives, bit for bit on the reference backend,
//! however the queries are split into groups and passes; a start contexts share is fed once.

mod common;

use common::fixtures;
use std::sync::Arc;
use stepwise_model::packed_engine::{log_normalizer, PackedDecoder, Reference};
use stepwise_model::{ModelConfig, Packed};

fn policy() -> PackedDecoder<Reference> {
    let dir = fixtures().join("qwen2-policy");
    PackedDecoder::load(&dir, ModelConfig::from_dir(&dir).unwrap(), Arc::new(Reference)).unwrap()
}

/// `option`'s log-probability after `context` from one cache-free pass over both.
fn whole_pass(engine: &PackedDecoder<Reference>, context: &[u32], option: &[u32]) -> f64 {
    let seq = [context, option].concat();
    let rows: Vec<usize> = (context.len() - 1..seq.len() - 1).collect();
    let (logits, width) = engine.head_at(&Packed::new(&[&seq]), &rows, None).unwrap();
    (logits.chunks(width).zip(option))
        .map(|(row, &t)| row[t as usize] as f64 - log_normalizer(row))
        .sum()
}

fn ctx(n: u32, from: u32) -> Vec<u32> {
    (0..n).map(|i| (from + 7 * i) % 500 + 1).collect()
}

/// Contexts of 1, 63, 64 (a whole block: its fork copies nothing) and 90 tokens, with options
/// of one token and of several (one crossing into a new block); then one that goes on from the
/// 63-token context and one the same as the 90-token context.
fn queries() -> Vec<(Vec<u32>, Vec<Vec<u32>>)> {
    vec![
        (ctx(1, 3), vec![vec![5], vec![6, 7]]),
        (ctx(63, 11), vec![vec![9, 10, 11], vec![12], vec![9, 10, 13]]),
        (ctx(64, 29), vec![vec![14, 15], vec![16]]),
        (ctx(90, 41), vec![vec![17], vec![18, 19, 20, 21], vec![22]]),
        ([ctx(63, 11), vec![5, 6, 7]].concat(), vec![vec![8, 9], vec![10]]),
        (ctx(90, 41), vec![vec![23, 24], vec![17]]),
    ]
}

#[test]
fn each_option_is_weighed_as_a_whole_pass_weighs_it_and_each_context_is_fed_once() {
    let mut engine = policy();
    let owned = queries();
    let asked: Vec<(&[u32], &[Vec<u32>])> = owned.iter().map(|(c, o)| (c.as_slice(), o.as_slice())).collect();
    let want: Vec<Vec<f64>> = (owned.iter())
        .map(|(c, os)| os.iter().map(|o| whole_pass(&engine, c, o)).collect())
        .collect();
    let before = engine.encoded_tokens.load(std::sync::atomic::Ordering::Relaxed);
    let got = engine.options_after(&asked, 16384).unwrap();
    let fed = engine.encoded_tokens.load(std::sync::atomic::Ordering::Relaxed) - before;
    assert_eq!(got, want);
    // The contexts once (what two share, once: the 63-token context but its last token, and the
    // 90-token one's), and each option's tokens but its last.
    let contexts: usize = 1 + 64 + (62 + 1 + 4) + (89 + 1 + 1);
    let options: usize = owned.iter().flat_map(|(_, os)| os.iter().map(|o| o.len() - 1)).sum();
    assert_eq!(fed, contexts + options);
    // Groups of one context (a pass of 64 tokens at most) and passes of one row of logits: the
    // same values.
    engine.set_logits_budget(4 * engine.config.vocab_size);
    assert_eq!(engine.options_after(&asked, 64).unwrap(), want);
    assert!(want.iter().flatten().all(|&lp| lp < 0.0 && lp.is_finite()));
}

#[test]
fn bad_queries_are_refused_with_what_is_wrong() {
    let engine = policy();
    let err = |q: &[(&[u32], &[Vec<u32>])]| engine.options_after(q, 16384).unwrap_err().to_string();
    let e = err(&[(&[], &[vec![1]])]);
    assert!(e.contains("empty prompt"), "{e}");
    let e = err(&[(&[1, 2], &[vec![]])]);
    assert!(e.contains("no tokens"), "{e}");
    let e = err(&[(&[1, 2], &[vec![u32::MAX]])]);
    assert!(e.contains("past the model's vocabulary"), "{e}");
    let positions = engine.config.max_position_embeddings;
    let long: Vec<u32> = vec![1; positions];
    let e = err(&[(&long, &[vec![1]])]);
    assert!(e.contains("more than the model's context"), "{e}");
}
