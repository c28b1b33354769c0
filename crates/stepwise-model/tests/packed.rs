//! The packed batch is the scoring input: sequences end to end, no padding, passes made by a
//! token budget. Every solution must score as it does alone, whatever the budget and whatever it
//! is packed with.

mod common;

use common::fixtures;
use stepwise_model::scoring::LoadedVerifier;
use stepwise_model::{Input, Packed, Tokenizer};

/// Forty ProcessBench solutions of mixed lengths (the public data the project ships), cut to
/// their first steps and characters so that they fit the fixtures' 512 positions.
fn solutions() -> Vec<stepwise_core::Solution> {
    let data = fixtures().join("../../data/processbench/gsm8k.json");
    let mut sols = stepwise_core::io::read_solution_set(&data, None).unwrap();
    sols.truncate(40);
    let cut = |t: &str, n: usize| t.chars().take(n).collect::<String>();
    for (i, s) in sols.iter_mut().enumerate() {
        s.question = cut(&s.question, 40 + 7 * i);
        s.steps.truncate(1 + i % 4);
        for step in &mut s.steps {
            step.text = cut(&step.text, 60);
        }
    }
    sols
}

#[test]
fn every_solution_scores_as_alone_whatever_the_token_budget() {
    let sols = solutions();
    for name in ["qwen2-prm", "qwen2-tokcls", "llama-shepherd"] {
        let v = LoadedVerifier::load(&fixtures().join(name), "auto", &candle_core::Device::Cpu).unwrap();
        let scorer = v.scorer();
        let encoded: Vec<_> = sols
            .iter()
            .map(|s| scorer.encode(&s.question, &s.step_texts()).unwrap())
            .collect();
        let alone: Vec<Vec<f32>> = encoded
            .iter()
            .map(|e| scorer.score_batch(std::slice::from_ref(e)).unwrap().remove(0))
            .collect();
        let longest = encoded.iter().map(|e| e.ids.len()).max().unwrap();
        // One solution a pass, a few, and all at once.
        for budget in [1, longest, 3 * longest, usize::MAX] {
            let got = scorer
                .clone()
                .with_max_batch_tokens(budget)
                .score_batch(&encoded)
                .unwrap();
            assert_eq!(got.len(), alone.len());
            for (i, (g, a)) in got.iter().zip(&alone).enumerate() {
                assert_eq!(g.len(), a.len(), "{name}, budget {budget}, solution {i}");
                for (x, y) in g.iter().zip(a) {
                    assert!(
                        (x - y).abs() < 1e-6,
                        "{name}, budget {budget}, solution {i}: {x} vs {y}"
                    );
                }
            }
        }
    }
}

#[test]
fn packed_rows_equal_each_sequence_run_alone() {
    let dir = fixtures().join("qwen2-prm");
    let v = LoadedVerifier::load(&dir, "auto", &candle_core::Device::Cpu).unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let seqs: Vec<Vec<u32>> = solutions()
        .iter()
        .take(9)
        .map(|s| {
            tok.encode(&format!("{} {}", s.question, s.step_texts().join("\n")), true)
                .unwrap()
        })
        .collect();
    let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    let packed = Packed::new(&refs);
    // Every tenth position, and the last, of each sequence.
    let read: Vec<Vec<usize>> = seqs
        .iter()
        .map(|s| (0..s.len()).filter(|p| p % 10 == 0 || *p == s.len() - 1).collect())
        .collect();
    let all = v.model.hidden(Input::packed(&packed).read(&read)).unwrap();
    let mut first = 0;
    for (s, r) in seqs.iter().zip(&read) {
        let alone = v
            .model
            .hidden(Input::packed(&Packed::new(&[s.as_slice()])).read(std::slice::from_ref(r)))
            .unwrap();
        let mine = all.narrow(0, first, r.len()).unwrap();
        first += r.len();
        assert!(
            common::max_diff(&mine, &alone) < 1e-5,
            "{}",
            common::max_diff(&mine, &alone)
        );
        // And what the padded path gives the same sequence.
        let ids = candle_core::Tensor::new(s.as_slice(), &candle_core::Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let padded = v
            .model
            .hidden(Input::padded(&ids, None).read(std::slice::from_ref(r)))
            .unwrap();
        assert!(common::max_diff(&padded, &alone) < 1e-5);
    }
    // Reading past a sequence's end is an error naming it, not a panic.
    let err = v
        .model
        .hidden(Input::packed(&Packed::new(&[&[1, 2]])).read(&[vec![5]]))
        .unwrap_err();
    assert!(err.to_string().contains("past the end"), "{err}");
}

/// The one forward refuses what it cannot run with an error saying why, on every path (the
/// fused kernels', candle's, a training model's), never a panic.
#[test]
fn the_forward_refuses_inputs_it_cannot_run() {
    use candle_core::{Device, Tensor};
    use stepwise_model::transformer::KvCache;
    let mut v = LoadedVerifier::load(&fixtures().join("qwen2-prm"), "auto", &Device::Cpu).unwrap();
    let vocab = v.model.config.vocab_size as u32;
    let ids = Tensor::new(&[[1u32, 2, 3]], &Device::Cpu).unwrap();
    let outside = Tensor::new(&[[1u32, vocab]], &Device::Cpu).unwrap();
    let packed = Packed::new(&[&[1, 2], &[3]]);
    for training in [false, true] {
        v.model.set_training(training);
        let m = &v.model;
        let err = |r: anyhow::Result<Tensor>| r.unwrap_err().to_string();
        assert!(err(m.hidden(Input::padded(&outside, None))).contains("outside the model's vocabulary"));
        let bad_packed = Packed::new(&[&[vocab + 7]]);
        assert!(err(m.hidden(Input::packed(&bad_packed))).contains("outside the model's vocabulary"));
        assert!(err(m.hidden(Input::padded(&ids, None).read(&[vec![3]]))).contains("past the end"));
        assert!(err(m.hidden(Input::padded(&ids, None).read(&[vec![0], vec![1]]))).contains("2 lists of rows"));
        let mut cache = KvCache::default();
        assert!(err(m.hidden(Input::packed(&packed).cache(&mut cache))).contains("continues no cache"));
        let two = Input::padded(&ids, None).and(Input::padded(&ids, None));
        assert!(err(m.hidden(two)).contains("one part"));
        let reads = [vec![0]];
        let two = Input::padded(&ids, None).and(Input::padded(&ids, None)).read(&reads);
        assert!(err(m.hidden_parts(two).map(|mut v| v.remove(0))).contains("input of one part"));
        let long: Vec<u32> = vec![1; v.model.config.scoring_positions() + 1];
        assert!(err(m.hidden(Input::packed(&Packed::new(&[&long])))).contains("exceeds"));
    }
}

/// A policy may write the PRM's step token or tag inside a step: it is taken out, so the step
/// scores as it would without it, and the solution keeps one reward per step.
#[test]
fn step_tags_inside_the_text_do_not_add_rewards() {
    for (name, tag) in [("qwen2-prm", "<extra_0>"), ("llama-shepherd", "ки")] {
        let v = LoadedVerifier::load(&fixtures().join(name), "auto", &candle_core::Device::Cpu).unwrap();
        let scorer = v.scorer();
        let clean = scorer.score("What is 2+3?", &["2 + 3 = 5.", "So 5."]).unwrap();
        let tagged = scorer
            .score(
                &format!("What is {tag}2+3?"),
                &[&format!("2 + 3 {tag}= 5."), &format!("So 5.{tag}")],
            )
            .unwrap();
        assert_eq!(tagged.len(), 2, "{name}");
        assert_eq!(clean, tagged, "{name}");
    }
}
