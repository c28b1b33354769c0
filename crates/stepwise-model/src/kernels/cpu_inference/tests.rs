//! The CPU inference path against the candle path.

use crate::config::{HeadKind, ModelConfig};
use crate::kv_cache::KvCache;
use crate::Model;
use candle_core::{Device, Tensor};
use candle_nn::VarMap;

/// A random model whose every weight (biases included) is non-trivial: the same weights every
/// run (a seeded generator), so that the tolerances below hold or fail alike each time (drawn
/// afresh, one draw in many took a 512-wide model's keys past them).
fn model(hidden: usize, heads: usize, kv_heads: usize) -> Model {
    use rand::SeedableRng;
    use rand_distr::Distribution;
    let cfg = ModelConfig::tiny(50, hidden, 2, heads, kv_heads, HeadKind::CausalLm);
    let varmap = VarMap::new();
    let m = Model::fresh(cfg, &varmap, &Device::Cpu, 3).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let vars = varmap.data().lock().unwrap();
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort();
    for name in names {
        let var = &vars[name];
        let base = if name.contains("norm") { 1.0 } else { 0.0 };
        let normal = rand_distr::Normal::new(base, 0.3f32).unwrap();
        let values: Vec<f32> = (0..var.elem_count()).map(|_| normal.sample(&mut rng)).collect();
        var.set(&Tensor::from_vec(values, var.shape(), &Device::Cpu).unwrap()).unwrap();
    }
    drop(vars);
    m
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar().unwrap()
}

/// Equal to 1e-4 relative to `b`'s largest value (at least 1): the keys of the 512-wide model
/// reach about 24, where two summation orders differ by about 2e-4.
fn close(a: &Tensor, b: &Tensor) -> bool {
    let scale: f32 = b.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
    max_diff(a, b) <= 1e-4 * scale.max(1.0)
}

/// The fast path (whole sequences per thread, or threads sharing one sequence) gives the
/// hidden states and the prefill cache of the candle path, with padding, grouped-query
/// heads, q/k/v biases, head sizes on and off the vector tiles, and widths below and above
/// [`sgemm::MIN_DEPTH`](crate::kernels::sgemm::MIN_DEPTH) (gemm's kernels, then the AVX-512 tiles).
#[test]
fn the_cpu_path_matches_the_candle_path() {
    for (hidden, heads, kv_heads) in [(64, 4, 2), (48, 4, 1), (512, 8, 2)] {
        let mut m = model(hidden, heads, kv_heads);
        // One sequence split by gemm (21 rows) or into blocks of rows (70); three, one per thread.
        for (b, t) in [(1, 21), (1, 70), (3, 37)] {
            let ids: Vec<u32> = (0..b * t).map(|i| ((i * 17) % 49) as u32 + 1).collect();
            let ids = Tensor::from_vec(ids, (b, t), &Device::Cpu).unwrap();
            // The last sequence is left-padded by five positions.
            let pad: Vec<f32> = (0..b * t)
                .map(|i| if i / t == b - 1 && i % t < 5 { 0.0 } else { 1.0 })
                .collect();
            let pad = Tensor::from_vec(pad, (b, t), &Device::Cpu).unwrap();
            let mut run = |training: bool| {
                m.set_training(training);
                let mut cache = KvCache::default();
                let h = m.hidden(crate::Input::padded(&ids, Some(&pad)).cache(&mut cache)).unwrap();
                (h, cache)
            };
            let (fast, fast_cache) = run(false);
            let (slow, slow_cache) = run(true);
            let case = format!("hidden {hidden}, heads {heads}/{kv_heads}, batch {b}");
            assert!(close(&fast, &slow), "{case}: {}", max_diff(&fast, &slow));
            for (f, s) in fast_cache.layers.iter().zip(&slow_cache.layers) {
                let ((fk, fv), (sk, sv)) = (f.as_ref().unwrap(), s.as_ref().unwrap());
                assert!(close(fk, sk) && close(fv, sv), "{case}: cache");
            }
            // Reading some rows (in any order, none for one sequence) gives those rows.
            let rows: Vec<Vec<usize>> = (0..b)
                .map(|i| match i {
                    1 => Vec::new(),
                    _ => vec![t - 1, 0, 7, 7, t / 2, 3, 9],
                })
                .collect();
            m.set_training(false);
            let read = m.hidden(crate::Input::padded(&ids, Some(&pad)).read(&rows)).unwrap();
            let picked: Vec<Tensor> = rows
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let idx = Tensor::new(r.iter().map(|&p| p as u32).collect::<Vec<_>>(), &Device::Cpu).unwrap();
                    slow.get(i).unwrap().index_select(&idx, 0).unwrap()
                })
                .collect();
            let want = Tensor::cat(&picked, 0).unwrap();
            assert!(close(&read, &want), "{case}: rows {}", max_diff(&read, &want));
        }
    }
}

/// A packed pass of short sequences (run joined: every product over all their rows) gives each
/// sequence's rows as the candle path computes that sequence alone, rows read in any order and
/// a sequence with none read included; a pass of long ones (a sequence a thread) the same.
#[test]
fn a_joined_packed_pass_matches_each_sequence_alone() {
    for (hidden, heads, kv_heads) in [(64, 4, 2), (512, 8, 2)] {
        let mut m = model(hidden, heads, kv_heads);
        for lengths in [vec![5usize, 19, 1, 33, 12], vec![90, 70]] {
            let seqs: Vec<Vec<u32>> = lengths
                .iter()
                .enumerate()
                .map(|(s, &t)| (0..t).map(|i| ((i * 13 + s * 7) % 49) as u32 + 1).collect())
                .collect();
            let read: Vec<Vec<usize>> = lengths
                .iter()
                .enumerate()
                .map(|(s, &t)| match s {
                    2 => Vec::new(),
                    _ => vec![t - 1, 0, t / 2, 0],
                })
                .collect();
            let (fast, want) = packed_and_alone(&mut m, &seqs, &read);
            let case = format!("hidden {hidden}, lengths {lengths:?}");
            assert!(close(&fast, &want), "{case}: {}", max_diff(&fast, &want));
        }
    }
}

/// A joined pass whose sequences share prefixes (a question's four answers, one of them twice,
/// one answer a prefix of another, a sequence sharing nothing) computes each shared prefix once
/// and gives every position of every sequence as the candle path computes that sequence alone.
#[test]
fn shared_prefixes_in_a_joined_pass_match_each_sequence_alone() {
    let mut m = model(512, 8, 2);
    let question: Vec<u32> = (0..20).map(|i| ((i * 11) % 47) as u32 + 1).collect();
    let with = |tail: &[u32]| question.iter().chain(tail).copied().collect::<Vec<u32>>();
    let seqs: Vec<Vec<u32>> = vec![
        with(&[5, 6]),
        with(&[5, 7, 9]),
        with(&[8]),
        with(&[5, 6]),
        with(&[5]),
        (0..9).map(|i| (i * 5 % 40) as u32 + 3).collect(),
    ];
    let read: Vec<Vec<usize>> = seqs.iter().map(|s| (0..s.len()).rev().collect()).collect();
    let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    let packed = crate::packed::Packed::new(&refs);
    let plan = super::shared::Plan::new(&packed);
    // The question and its answer 5 once; then 6, 6 again (a duplicate keeps its last row), 7 9,
    // 8 and the unrelated sequence.
    assert_eq!(plan.len(), 21 + 1 + 1 + 2 + 1 + 9, "the question computed once");
    let (fast, want) = packed_and_alone(&mut m, &seqs, &read);
    assert!(close(&fast, &want), "{}", max_diff(&fast, &want));
}

/// Long sequences run joined when they share at least a quarter of their positions (a long
/// prompt's answers: the prompt computed once) and a sequence a thread when they do not; both
/// give every position of every sequence as the candle path computes that sequence alone.
#[test]
fn long_sequences_sharing_a_prompt_run_joined_and_match_each_sequence_alone() {
    let mut m = model(512, 8, 2);
    let prompt: Vec<u32> = (0..150).map(|i| ((i * 11) % 47) as u32 + 1).collect();
    let answers: [&[u32]; 4] = [&[5], &[6, 2], &[7], &[5, 9]];
    let seqs: Vec<Vec<u32>> = answers.iter().map(|a| prompt.iter().chain(*a).copied().collect()).collect();
    let unrelated: Vec<Vec<u32>> = (0..2)
        .map(|s| (0..150).map(|i| ((i * 13 + s * 7) % 49) as u32 + 1).collect())
        .collect();
    for (case, seqs, joined) in [("a prompt", &seqs, true), ("nothing", &unrelated, false)] {
        let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
        let plan = super::joined::plan(&crate::packed::Packed::new(&refs), 512);
        assert_eq!(plan.is_some(), joined, "sharing {case}");
        let read: Vec<Vec<usize>> = seqs.iter().map(|s| vec![s.len() - 1, 0, 149, s.len() / 2]).collect();
        let (fast, want) = packed_and_alone(&mut m, seqs, &read);
        assert!(close(&fast, &want), "sharing {case}: {}", max_diff(&fast, &want));
    }
}

/// A joined pass too large for one group runs in groups (sequences that share standing
/// together) and gives every row read, in the batch's order, as each sequence alone does; a
/// sequence longer than a group may hold leaves the pass to a sequence a thread.
#[test]
fn a_joined_pass_in_groups_matches_each_sequence_alone() {
    let m = model(512, 8, 2);
    let prompt = |p: usize| -> Vec<u32> { (0..60).map(|i| ((i * 11 + p * 5) % 47) as u32 + 1).collect() };
    // Three prompts' answers, interleaved as a batch packs them.
    let seqs: Vec<Vec<u32>> = (0..9)
        .map(|k| prompt(k % 3).into_iter().chain([k as u32 + 2, 7]).collect())
        .collect();
    let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    let batch = crate::packed::Packed::new(&refs);
    let read: Vec<Vec<usize>> = seqs.iter().map(|s| vec![s.len() - 1, 3, s.len() - 2]).collect();
    let whole = super::joined::plan_within(&batch, 512, 8192).expect("joined");
    assert_eq!(whole.len(), 1);
    // 70 rows a group: a prompt's three answers (62 + 2 + 2 rows) each, in three groups.
    let groups = super::joined::plan_within(&batch, 512, 70).expect("joined in groups");
    assert_eq!(groups.len(), 3);
    assert!(super::joined::plan_within(&batch, 512, 61).is_none(), "a sequence longer than a group");
    let mut m = m;
    let (one, want) = packed_and_alone(&mut m, &seqs, &read);
    super::joined::MAX_ROWS_HERE.with(|c| c.set(70));
    let (three, _) = packed_and_alone(&mut m, &seqs, &read);
    super::joined::MAX_ROWS_HERE.with(|c| c.set(8192));
    assert!(close(&one, &want) && close(&three, &want), "{} {}", max_diff(&one, &want), max_diff(&three, &want));
}

/// The rows `read[i]` of each sequence `i` from one packed pass of the fast path, and from the
/// candle path running each sequence alone, stacked.
fn packed_and_alone(m: &mut Model, seqs: &[Vec<u32>], read: &[Vec<usize>]) -> (Tensor, Tensor) {
    let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    let packed = crate::packed::Packed::new(&refs);
    m.set_training(false);
    let fast = m.hidden(crate::Input::packed(&packed).read(read)).unwrap();
    m.set_training(true);
    let mut want = Vec::new();
    for (ids, r) in seqs.iter().zip(read) {
        let t = Tensor::new(ids.as_slice(), &Device::Cpu).unwrap().unsqueeze(0).unwrap();
        let h = m.hidden(crate::Input::padded(&t, None)).unwrap().squeeze(0).unwrap();
        let idx = Tensor::new(r.iter().map(|&p| p as u32).collect::<Vec<_>>(), &Device::Cpu).unwrap();
        want.push(h.index_select(&idx, 0).unwrap());
    }
    (fast, Tensor::cat(&want, 0).unwrap())
}
