//! Parity with PyTorch + transformers on the four fixture checkpoints (`expected.json`): token ids
//! exactly, step rewards within 1e-4, greedy continuations exactly; batched = unbatched scoring;
//! shared-prefix generation encodes the prefix once.

use candle_core::Device;
use serde_json::Value;
use std::path::PathBuf;
use stepwise_model::{generate, Decoding, Input, Model, PrmScorer, SamplingParams, Tokenizer};

mod common;
use common::fixtures;

fn expected() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected.json")).unwrap()).unwrap()
}

fn load(name: &str) -> (Model, Tokenizer) {
    let dir = fixtures().join(name);
    (
        // The f32 path (a bf16 fixture widened at load): within 1e-4 of transformers.
        Model::load_as(&dir, &Device::Cpu, stepwise_model::WeightDtype::F32).unwrap(),
        Tokenizer::from_dir(&dir).unwrap(),
    )
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn strs(v: &Value) -> Vec<&str> {
    v.as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect()
}

#[test]
fn prm_fixtures_reproduce_transformers() {
    let exp = expected();
    for case in ["qwen2-prm", "llama-shepherd", "qwen2-tokcls"] {
        let (model, tok) = load(case);
        let layout = stepwise_model::layout::detect(&model, &tok).unwrap();
        let scorer = PrmScorer::new(&model, &tok, layout);
        let items = exp["cases"][case]["items"].as_array().unwrap();
        let mut encoded = Vec::new();
        let mut want = Vec::new();
        for it in items {
            let steps = strs(&it["steps"]);
            let e = scorer.encode(it["problem"].as_str().unwrap(), &steps).unwrap();
            assert_eq!(e.ids, ids_of(&it["input_ids"]), "{case}: token ids");
            let pos: Vec<usize> = it["step_positions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as usize)
                .collect();
            assert_eq!(e.positions, pos, "{case}: step positions");
            let r = scorer.score(it["problem"].as_str().unwrap(), &steps).unwrap();
            let w: Vec<f32> = it["step_rewards"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            for (a, b) in r.iter().zip(&w) {
                assert!((a - b).abs() < 1e-4, "{case}: reward {a} vs transformers {b}");
            }
            encoded.push(e);
            want.push(r);
        }
        // Mixed-length batch = one at a time.
        let batched = scorer.score_batch(&encoded).unwrap();
        for (b, u) in batched.iter().zip(&want) {
            for (x, y) in b.iter().zip(u) {
                assert!((x - y).abs() < 1e-5, "{case}: batched {x} vs unbatched {y}");
            }
        }
    }
}

/// Greedy decoding of at most `max` new tokens.
fn greedy(max: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_new_tokens: max,
        ..Default::default()
    }
}

/// The fixture policy decoding greedily (at most `max` new tokens), its prompt the question as
/// text.
fn greedy_policy<'a>(model: &'a Model, tok: &'a Tokenizer, max: usize) -> stepwise_model::EnginePolicy<'a> {
    stepwise_model::EnginePolicy {
        model,
        tokenizer: tok,
        params: greedy(max),
        prompt: stepwise_model::Prompt::Text,
        separator: String::new(),
        adapter: None,
    }
}

#[test]
fn policy_greedy_matches_and_prefix_is_encoded_once() {
    let exp = expected();
    let (model, tok) = load("qwen2-policy");
    let p = greedy(16);
    for it in exp["cases"]["qwen2-policy"]["items"].as_array().unwrap() {
        let prompt = ids_of(&it["prompt_ids"]);
        assert_eq!(tok.encode(it["prompt"].as_str().unwrap(), true).unwrap(), prompt);
        let want = ids_of(&it["greedy_new_ids"]);
        let before = model.encoded_tokens();
        let outs = generate(&model, Some(&tok), &prompt, 4, &p).unwrap();
        let encoded = model.encoded_tokens() - before;
        // The prompt once, then one position per row per new token (the last token is not fed).
        assert_eq!(
            encoded,
            prompt.len() + 4 * (want.len() - 1),
            "prefix encoded more than once"
        );
        for o in &outs {
            assert_eq!(o, &want, "greedy continuation");
        }
    }
}

/// `continuation_logprobs` (what a generative verifier reads a verdict's likelihood with) agrees
/// with transformers' greedy choices: at every step the greedy token is likelier than any other
/// single swap, and log-probabilities chain (`log p(ab) = log p(a) + log p(b | a)`).
#[test]
fn continuation_logprobs_rank_transformers_greedy_tokens_first() {
    use stepwise_core::seams::Policy;
    let exp = expected();
    let (model, tok) = load("qwen2-policy");
    let item = &exp["cases"]["qwen2-policy"]["items"][0];
    let policy = greedy_policy(&model, &tok, 1);
    let question = item["prompt"].as_str().unwrap();
    let want = ids_of(&item["greedy_new_ids"]);
    let text = |ids: &[u32]| tok.decode(ids).unwrap();
    let roundtrips = |ids: &[u32]| tok.encode(&text(ids), false).unwrap() == ids;
    let lp = |written: &str, options: &[&str]| {
        policy
            .continuation_logprobs(question, written, options)
            .unwrap()
            .unwrap()
    };
    let k = (2..=want.len())
        .rev()
        .find(|&k| roundtrips(&want[..k]) && roundtrips(&want[..k - 1]) && roundtrips(&want[k - 1..k]))
        .unwrap();
    assert!(k >= 3, "the greedy text re-encodes to its tokens");
    let greedy_text = text(&want[..k]);
    // The last greedy token swapped for each other token whose text re-encodes to it.
    let swaps: Vec<String> = (0..tok.vocab_size() as u32)
        .filter(|&t| t != want[k - 1])
        .map(|t| [&want[..k - 1], &[t][..]].concat())
        .filter(|ids| roundtrips(ids))
        .map(|ids| text(&ids))
        .take(40)
        .collect();
    assert!(swaps.len() >= 10);
    let mut options = vec![greedy_text.as_str()];
    options.extend(swaps.iter().map(String::as_str));
    let all = lp("", &options);
    for (swap, l) in swaps.iter().zip(&all[1..]) {
        assert!(
            all[0] > *l,
            "greedy {:?} ({}) is less likely than {swap:?} ({l})",
            greedy_text,
            all[0]
        );
    }
    let head = text(&want[..k - 1]);
    let tail = text(&want[k - 1..k]);
    let chained = lp("", &[head.as_str()])[0] + lp(&head, &[tail.as_str()])[0];
    assert!((chained - all[0]).abs() < 1e-3, "{chained} against {}", all[0]);
}

/// `logprobs_after` (what a judge's verdicts are weighed with) reads the options where
/// `continue_from` would write: after the question alone it agrees with
/// `continuation_logprobs`, transformers' greedy text is likelier than each single-token swap of
/// it, and with `end` each option is followed by the end token (its log-probability added), or
/// refused where the policy has none.
#[test]
fn logprobs_after_reads_options_where_the_policy_writes_and_ends_them_with_its_end_token() {
    use stepwise_core::seams::{NextOptions, Policy};
    let exp = expected();
    let (model, tok) = load("qwen2-policy");
    let item = &exp["cases"]["qwen2-policy"]["items"][0];
    let question = item["prompt"].as_str().unwrap();
    let want = ids_of(&item["greedy_new_ids"]);
    let text = |ids: &[u32]| tok.decode(ids).unwrap();
    let greedy_text = text(&want[..3]);
    let swap = text(&[&want[..2], &[want[2] + 1][..]].concat());
    let options = [greedy_text.as_str(), swap.as_str()];
    let mut policy = greedy_policy(&model, &tok, 1);
    let ask = |options| NextOptions {
        question,
        prefix: &[],
        options,
    };
    // Asked twice in one batch, with the options in two orders: each ask gets its own values.
    let reversed = [options[1], options[0]];
    let after = policy
        .logprobs_after(&[ask(&options), ask(&reversed)], false)
        .unwrap()
        .unwrap();
    let written = policy.continuation_logprobs(question, "", &options).unwrap().unwrap();
    assert_eq!(after[0], written);
    assert_eq!(after[1], [written[1], written[0]]);
    assert!(after[0][0] > after[0][1], "greedy {after:?}");
    let err = policy.logprobs_after(&[ask(&options)], true).unwrap_err();
    assert!(err.to_string().contains("no end token"), "{err}");
    let end = tok
        .token_id("<|endoftext|>")
        .or_else(|| tok.token_id("</s>"))
        .unwrap_or(0);
    policy.params.stop_token_ids = vec![end];
    let ended = policy
        .logprobs_after(&[ask(&options)], true)
        .unwrap()
        .unwrap()
        .remove(0);
    let prompt = tok.encode(question, true).unwrap();
    for (k, o) in options.iter().enumerate() {
        let mut seq = prompt.clone();
        seq.extend(tok.encode(o, false).unwrap());
        seq.push(end);
        let lp = stepwise_model::log_ratio::sequence_logprobs(&model, &[&seq], 1, 4096).unwrap();
        let last = *lp[0].last().unwrap() as f64;
        assert!(last < 0.0);
        let unended = after[0][k];
        assert!(
            (ended[k] - (unended + last)).abs() < 1e-4,
            "{k}: {} vs {unended} + {last}",
            ended[k]
        );
    }
}

/// `continue_written` (what a verifier with tools writes its chain with) continues text the
/// model wrote as transformers' greedy decoding does, and stops at the first stop string, kept
/// at the end: the greedy continuation cut at a stop string taken from its middle, then the rest
/// after the text written so far.
#[test]
fn continue_written_follows_transformers_greedy_text_and_stops_at_a_stop_string() {
    use stepwise_core::seams::Policy;
    let exp = expected();
    let (model, tok) = load("qwen2-policy");
    let item = &exp["cases"]["qwen2-policy"]["items"][0];
    let policy = greedy_policy(&model, &tok, 16);
    let question = item["prompt"].as_str().unwrap();
    let want = tok.decode(&ids_of(&item["greedy_new_ids"])).unwrap();
    let whole = policy.continue_written(question, "", &[], 0).unwrap().unwrap();
    assert_eq!(whole.text, want, "no stop: transformers' greedy text");
    assert!(whole.finished);
    // A stop string from the middle of the text: the text up to its first occurrence.
    let chars: Vec<char> = want.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let cut = &want[..want.find(&stop).unwrap() + stop.len()];
    let part = policy
        .continue_written(question, "", &[stop.as_str()], 0)
        .unwrap()
        .unwrap();
    assert_eq!(part.text, cut);
    assert!(!part.finished, "stopped at a stop string");
    // Continued from where it stopped: the rest of the greedy text (16 more tokens reach past
    // its end). The cut falls on a token boundary here: the text written re-encodes to the
    // greedy tokens it came from.
    let cut_ids = tok.encode(cut, false).unwrap();
    assert_eq!(cut_ids, ids_of(&item["greedy_new_ids"])[..cut_ids.len()]);
    let rest = policy.continue_written(question, cut, &[], 0).unwrap().unwrap();
    assert!(
        format!("{cut}{}", rest.text).starts_with(&want),
        "{cut:?} + {:?} against {want:?}",
        rest.text
    );
}

/// Request `id` of each `(id, k)` asked for `1 + k` greedy continuations of item `k`'s prompt,
/// `5 + 3k` tokens each: every one is transformers' greedy continuation.
fn check_greedy(items: &[Value], done: &std::collections::HashMap<usize, Vec<Vec<u32>>>, ids: &[(usize, usize)]) {
    for &(id, k) in ids {
        let want = ids_of(&items[k]["greedy_new_ids"]);
        let outs = &done[&id];
        assert_eq!(outs.len(), 1 + k);
        for o in outs {
            assert_eq!(o[..], want[..5 + 3 * k], "item {k}");
        }
    }
}

/// Continuous batching: prompts of different lengths join one decoding batch at different steps
/// (left-padded caches, per-row rotary positions) and each still gets transformers' greedy
/// continuation; a request with `n` rows encodes its prompt once.
#[test]
fn requests_joining_a_running_batch_decode_as_alone() {
    let exp = expected();
    let (model, tok) = load("qwen2-policy");
    let items = exp["cases"]["qwen2-policy"]["items"].as_array().unwrap();
    let mut batch = Decoding::new(&model, Some(&tok));
    let mut done = std::collections::HashMap::new();
    let mut ids = Vec::new();
    // Join in reverse so a shorter prompt meets a longer running one and the other way round.
    for (k, it) in items.iter().enumerate().rev() {
        ids.push((
            batch.add(&ids_of(&it["prompt_ids"]), 1 + k, greedy(5 + 3 * k)).unwrap(),
            k,
        ));
        for _ in 0..3 {
            done.extend(batch.step().unwrap());
        }
    }
    while !batch.is_idle() {
        done.extend(batch.step().unwrap());
    }
    assert_eq!(batch.live_rows(), 0);
    check_greedy(items, &done, &ids);
}

/// Chunked prefill: prompts fed through a running batch's decoding steps (`Decoding::join`),
/// whole or in chunks of a few tokens a step continuing their own caches, each fanning out into
/// its `n` continuations after its last prompt token, get transformers' greedy continuations;
/// every step's rows are counted as continuations or prompt tokens, no step feeds more prompt
/// tokens than the chunk, and an empty token budget works.
#[test]
fn prompts_fed_through_decoding_steps_decode_as_alone() {
    let exp = expected();
    let (model, tok) = load("qwen2-policy");
    let items = exp["cases"]["qwen2-policy"]["items"].as_array().unwrap();
    for chunk in [usize::MAX, 3, 1] {
        let mut batch = Decoding::new(&model, Some(&tok)).prefill_chunk(chunk);
        let mut done = std::collections::HashMap::new();
        let mut ids = Vec::new();
        let (mut prompt_rows, mut steps) = (0, 0);
        let mut step = |batch: &mut Decoding, done: &mut std::collections::HashMap<_, _>| {
            done.extend(batch.step().unwrap());
            let fed = batch.last_step().prompts;
            assert!(fed <= chunk, "{fed} prompt tokens in a step, chunk {chunk}");
            prompt_rows += fed;
            steps += 1;
        };
        for (k, it) in items.iter().enumerate() {
            let prompt = ids_of(&it["prompt_ids"]);
            // The first request finds the batch empty and is encoded at once; the others join it.
            ids.push((batch.join(&prompt, 1 + k, greedy(5 + 3 * k)).unwrap(), k));
            step(&mut batch, &mut done);
        }
        let empty_budget = batch.join(&ids_of(&items[0]["prompt_ids"]), 2, greedy(0)).unwrap();
        while !batch.is_idle() {
            step(&mut batch, &mut done);
        }
        assert_eq!(batch.live_rows(), 0);
        assert_eq!(done[&empty_budget], vec![Vec::<u32>::new(); 2]);
        check_greedy(items, &done, &ids);
        // Every prompt token of the joining requests went through a step, once.
        let fed: usize = items[1..].iter().map(|it| ids_of(&it["prompt_ids"]).len()).sum();
        assert_eq!(prompt_rows, fed, "prompt rows over {steps} steps, chunk {chunk}");
    }

    // A one-token prompt joining a running batch: its first step fans out at once.
    let mut batch = Decoding::new(&model, Some(&tok));
    let long = ids_of(&items[0]["prompt_ids"]);
    let a = batch.add(&long, 1, greedy(6)).unwrap();
    let b = batch.join(&long[..1], 3, greedy(4)).unwrap();
    let alone = generate(&model, Some(&tok), &long[..1], 1, &greedy(4)).unwrap();
    let mut done = std::collections::HashMap::new();
    while !batch.is_idle() {
        done.extend(batch.step().unwrap());
    }
    assert_eq!(done[&a][0][..], ids_of(&items[0]["greedy_new_ids"])[..6]);
    assert_eq!(done[&b], vec![alone[0].clone(); 3]);
}

/// A request that cannot be decoded (a reward model has no LM head; a token outside the
/// vocabulary) is an error that leaves nothing behind: the batch stays idle, or goes on decoding
/// the others as before.
#[test]
fn a_failed_request_leaves_the_batch_as_it_was() {
    let (prm, _) = load("qwen2-prm");
    let mut batch = Decoding::new(&prm, None);
    let err = batch.add(&[5, 6, 7], 2, greedy(4)).unwrap_err().to_string();
    assert!(err.contains("LM head"), "{err}");
    assert!(batch.is_idle());
    assert_eq!(batch.live_rows(), 0);
    let exp = expected();
    let (model, tok) = load("qwen2-policy");
    let items = exp["cases"]["qwen2-policy"]["items"].as_array().unwrap();
    let mut batch = Decoding::new(&model, Some(&tok));
    assert!(batch.add(&[u32::MAX], 1, greedy(4)).is_err());
    assert!(batch.is_idle());
    let mut done = std::collections::HashMap::new();
    let first = batch.add(&ids_of(&items[0]["prompt_ids"]), 1, greedy(8)).unwrap();
    assert!(batch.add(&[u32::MAX], 1, greedy(4)).is_err());
    // Joining a running batch: refused at once, not when a step would feed it to the others.
    let err = batch.join(&[5, u32::MAX], 1, greedy(4)).unwrap_err().to_string();
    assert!(err.contains("outside the model's vocabulary"), "{err}");
    while !batch.is_idle() {
        done.extend(batch.step().unwrap());
    }
    assert_eq!(done.keys().copied().collect::<Vec<_>>(), vec![first]);
}

/// A cancelled request (its client went away) leaves the batch, decoding or still being fed, and
/// is never reported; the others get transformers' greedy continuations as before.
#[test]
fn cancelled_requests_leave_the_batch_and_the_others_decode_as_alone() {
    let exp = expected();
    let (model, tok) = load("qwen2-policy");
    let items = exp["cases"]["qwen2-policy"]["items"].as_array().unwrap();
    let mut batch = Decoding::new(&model, Some(&tok)).prefill_chunk(2);
    let mut done = std::collections::HashMap::new();
    // The first request, into an empty batch, is encoded at once and decodes; the last joins
    // behind the others and is still being fed (two tokens a step) when cancelled.
    let decoding = batch.join(&ids_of(&items[0]["prompt_ids"]), 3, greedy(40)).unwrap();
    let mut ids = Vec::new();
    for (k, it) in items.iter().enumerate() {
        ids.push((
            batch
                .join(&ids_of(&it["prompt_ids"]), 1 + k, greedy(5 + 3 * k))
                .unwrap(),
            k,
        ));
    }
    let feeding = batch.join(&ids_of(&items[1]["prompt_ids"]), 2, greedy(40)).unwrap();
    done.extend(batch.step().unwrap());
    done.extend(batch.step().unwrap());
    let rows = batch.live_rows();
    batch.cancel(decoding).unwrap();
    batch.cancel(feeding).unwrap();
    batch.cancel(decoding).unwrap();
    assert_eq!(batch.live_rows(), rows - 5);
    while !batch.is_idle() {
        done.extend(batch.step().unwrap());
    }
    assert!(!done.contains_key(&decoding) && !done.contains_key(&feeding));
    check_greedy(items, &done, &ids);
}

/// Caches of different lengths joined into one batch (the shorter left-padded) continue each
/// sequence as it would continue alone: same hidden states within float rounding, for several
/// steps and after a row leaves.
#[test]
fn joined_caches_continue_each_sequence_as_alone() {
    use candle_core::Tensor;
    use stepwise_model::transformer::KvCache;
    let exp = expected();
    let (model, _) = load("qwen2-policy");
    let items = exp["cases"]["qwen2-policy"]["items"].as_array().unwrap();
    let prompts: Vec<Vec<u32>> = items.iter().map(|it| ids_of(&it["prompt_ids"])).collect();
    let (long, short) = (&prompts[0], &prompts[1]);
    assert!(long.len() > short.len());
    let encode = |p: &[u32]| {
        let mut c = KvCache::default();
        let ids = Tensor::new(p, &Device::Cpu).unwrap().unsqueeze(0).unwrap();
        model.hidden(Input::padded(&ids, None).cache(&mut c)).unwrap();
        c
    };
    let (mut alone_a, mut alone_b) = (encode(short), encode(long));
    // The short sequence first, so its rows carry the padding.
    let mut joined = alone_a.concat_batch(&alone_b).unwrap();
    assert_eq!(joined.pads().unwrap(), &[long.len() - short.len(), 0]);
    let step = |c: &mut KvCache, toks: &[u32]| {
        let ids = Tensor::new(toks, &Device::Cpu).unwrap().unsqueeze(1).unwrap();
        model
            .hidden(Input::padded(&ids, None).cache(c))
            .unwrap()
            .squeeze(1)
            .unwrap()
    };
    for (i, t) in [5u32, 9, 2].into_iter().enumerate() {
        let both = step(&mut joined, &[t, t + 1]);
        let (a, b) = (step(&mut alone_a, &[t]), step(&mut alone_b, &[t + 1]));
        let diff = common::max_diff;
        assert!(
            diff(&both.get(0).unwrap(), &a.get(0).unwrap()) < 1e-5,
            "padded row, step {i}"
        );
        assert!(
            diff(&both.get(1).unwrap(), &b.get(0).unwrap()) < 1e-5,
            "unpadded row, step {i}"
        );
    }
    // The long row leaves: the padding every remaining row has is dropped.
    let mut rest = joined.select(&Tensor::new(&[0u32], &Device::Cpu).unwrap()).unwrap();
    assert!(rest.pads().is_none());
    assert_eq!(rest.len(), alone_a.len());
    let (x, y) = (step(&mut rest, &[7]), step(&mut alone_a, &[7]));
    assert!(common::max_diff(&x, &y) < 1e-5);
}

/// Several batches in one pass (an `Input` of several parts, chunked prefill's forward): a decoding
/// batch of two left-padded rows, a prompt from an empty cache and a prompt's second chunk
/// continuing its own cache each get the hidden states, and leave the caches, that they get
/// alone, within float rounding.
#[test]
fn batches_in_one_pass_match_each_alone() {
    use candle_core::Tensor;
    use stepwise_model::transformer::KvCache;
    let exp = expected();
    let (model, _) = load("qwen2-policy");
    let items = exp["cases"]["qwen2-policy"]["items"].as_array().unwrap();
    let prompts: Vec<Vec<u32>> = items.iter().map(|it| ids_of(&it["prompt_ids"])).collect();
    let ids = |toks: &[u32]| Tensor::new(toks, &Device::Cpu).unwrap().unsqueeze(0).unwrap();
    let encode = |p: &[u32]| {
        let mut c = KvCache::default();
        model.hidden(Input::padded(&ids(p), None).cache(&mut c)).unwrap();
        c
    };
    // The decoding batch: two sequences of different lengths, one token each.
    let decoding = encode(&prompts[1]).concat_batch(&encode(&prompts[0])).unwrap();
    let step = Tensor::new(&[[5u32], [9]], &Device::Cpu).unwrap();
    // A prompt's first chunk, and another prompt's second chunk after its first.
    let (fresh, (first, second)) = (&prompts[2][..], prompts[0].split_at(6));
    let chunked = encode(first);

    let (mut dec_alone, mut fresh_alone, mut chunk_alone) = (decoding.clone(), KvCache::default(), chunked.clone());
    let alone = [
        model.hidden(Input::padded(&step, None).cache(&mut dec_alone)).unwrap(),
        model
            .hidden(Input::padded(&ids(fresh), None).cache(&mut fresh_alone))
            .unwrap(),
        model
            .hidden(Input::padded(&ids(second), None).cache(&mut chunk_alone))
            .unwrap(),
    ];
    let (mut dec, mut fresh_cache, mut chunk_cache) = (decoding.clone(), KvCache::default(), chunked.clone());
    let (fresh_ids, second_ids) = (ids(fresh), ids(second));
    let together = model
        .hidden_parts(
            Input::padded(&step, None)
                .cache(&mut dec)
                .and(Input::padded(&fresh_ids, None).cache(&mut fresh_cache))
                .and(Input::padded(&second_ids, None).cache(&mut chunk_cache)),
        )
        .unwrap();
    for (k, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a.dims(), b.dims(), "batch {k}");
        assert!(common::max_diff(a, b) < 1e-4, "batch {k}: {}", common::max_diff(a, b));
    }
    for (k, (a, b)) in [
        (&dec_alone, &dec),
        (&fresh_alone, &fresh_cache),
        (&chunk_alone, &chunk_cache),
    ]
    .into_iter()
    .enumerate()
    {
        assert_eq!((a.len(), a.pads()), (b.len(), b.pads()), "cache {k}");
        for (la, lb) in a.layers.iter().zip(&b.layers) {
            let ((ka, va), (kb, vb)) = (la.as_ref().unwrap(), lb.as_ref().unwrap());
            assert!(
                common::max_diff(ka, kb) < 1e-4 && common::max_diff(va, vb) < 1e-4,
                "cache {k}"
            );
        }
    }
}

/// A decoding batch that keeps a cache a sequence (`RowsCache`, as `Decoding` does on the CPU)
/// gets bit for bit the hidden states its sequences get in one left-padded cache (paddings of
/// 0, 6 and 3 positions, odd and even), step after step, past each sequence's first room, after
/// a sequence leaves, and after another joins into the buffers it left.
#[test]
fn caches_a_sequence_decode_bit_for_bit_as_one_padded_cache() {
    use candle_core::Tensor;
    use stepwise_model::transformer::KvCache;
    use stepwise_model::BatchCache;
    use stepwise_model::RowsCache;
    let exp = expected();
    let (model, _) = load("qwen2-policy");
    let items = exp["cases"]["qwen2-policy"]["items"].as_array().unwrap();
    let prompts: Vec<Vec<u32>> = items.iter().map(|it| ids_of(&it["prompt_ids"])).collect();
    let encode = |p: &[u32]| {
        let mut c = KvCache::default();
        let ids = Tensor::new(p, &Device::Cpu).unwrap().unsqueeze(0).unwrap();
        model.hidden(Input::padded(&ids, None).cache(&mut c)).unwrap();
        c
    };
    let caches = [&prompts[0][..], &prompts[1][..], &prompts[0][..13]].map(encode);
    let mut padded = caches[0]
        .concat_batch(&caches[1])
        .unwrap()
        .concat_batch(&caches[2])
        .unwrap();
    assert_eq!(padded.pads(), Some(&[0, 6, 3][..]));
    let mut own = RowsCache::default();
    for c in &caches {
        own.push_copies(c, 1).unwrap();
    }
    let mut rows = 3;
    for step in 0..80u32 {
        if step == 50 {
            padded = padded.select(&Tensor::new(&[1u32, 2], &Device::Cpu).unwrap()).unwrap();
            own.keep(&[1, 2]);
            rows = 2;
        }
        if step == 60 {
            // A sequence joins: into the buffer the one that left wrote (stale past its prompt).
            padded = padded.concat_batch(&caches[1]).unwrap();
            own.push_copies(&caches[1], 1).unwrap();
            rows = 3;
        }
        let toks: Vec<u32> = (0..rows).map(|r| (step * 7 + r * 3) % 50 + 3).collect();
        let ids = Tensor::new(toks.as_slice(), &Device::Cpu)
            .unwrap()
            .unsqueeze(1)
            .unwrap();
        let hidden = |cache: BatchCache| -> Vec<f32> {
            let h = model.hidden(Input::padded(&ids, None).cache(cache)).unwrap();
            h.flatten_all().unwrap().to_vec1().unwrap()
        };
        let (a, b) = (
            hidden(BatchCache::Padded(&mut padded)),
            hidden(BatchCache::Rows(&mut own)),
        );
        assert_eq!(a, b, "step {step}");
        assert_eq!(
            (own.len(), own.pads()),
            (
                padded.len(),
                padded.pads().map_or(vec![0; rows as usize], <[usize]>::to_vec)
            )
        );
    }
}

/// A scalar value head (`Qwen2ForSequenceClassification`, one label): the sigmoid of the value at
/// each step's end matches transformers, and on a right-padded batch the last step's value is
/// transformers' own sequence-classification output (the outcome score).
#[test]
fn value_head_reproduces_transformers() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen2-value");
    let exp: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let model = Model::load(&dir, &Device::Cpu).unwrap();
    assert_eq!(model.config.head, stepwise_model::HeadKind::SequenceClassification);
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let scorer = PrmScorer::new(&model, &tok, stepwise_model::layout::detect(&model, &tok).unwrap());
    let mut encoded = Vec::new();
    for it in exp["items"].as_array().unwrap() {
        let steps = strs(&it["steps"]);
        let e = scorer.encode(it["problem"].as_str().unwrap(), &steps).unwrap();
        assert_eq!(e.ids, ids_of(&it["input_ids"]), "token ids");
        let got = scorer.score_batch(std::slice::from_ref(&e)).unwrap().remove(0);
        for (g, w) in got.iter().zip(it["step_values"].as_array().unwrap()) {
            assert!((*g as f64 - w.as_f64().unwrap()).abs() < 1e-4, "{got:?} vs {w}");
        }
        encoded.push(e);
    }
    let batched = scorer.score_batch(&encoded).unwrap();
    for (b, w) in batched.iter().zip(exp["pooled"].as_array().unwrap()) {
        let last = *b.last().unwrap() as f64;
        assert!((last - w.as_f64().unwrap()).abs() < 1e-4, "outcome {last} vs {w}");
    }
}
