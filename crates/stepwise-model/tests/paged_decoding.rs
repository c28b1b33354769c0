//! Generation on the packed engine (what the CUDA engine runs) checked on the CPU through its
//! reference backend: the paged KV cache gives every step the logits a cache-free pass over the
//! whole sequence gives, bit for bit (so greedy decoding picks their argmax), continuations of one
//! prompt share its blocks and decode alike, transformers' greedy continuations are reproduced,
//! and a KV budget smaller than the requests makes them wait, never fail.

mod common;

use common::fixtures;
use serde_json::Value;
use std::sync::Arc;
use stepwise_model::packed_engine::{PackedDecoder, PagedRows, Reference};
use stepwise_model::{Decoding, ModelConfig, Packed, SamplingParams};

fn policy() -> PackedDecoder<Reference> {
    let dir = fixtures().join("qwen2-policy");
    PackedDecoder::load(&dir, ModelConfig::from_dir(&dir).unwrap(), Arc::new(Reference)).unwrap()
}

fn greedy(max: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_new_tokens: max,
        ..Default::default()
    }
}

/// A batch over a paged cache of `blocks` blocks on `engine`.
fn paged(engine: &PackedDecoder<Reference>, blocks: usize) -> Decoding<'_> {
    Decoding::with_cache(Box::new(PagedRows::new(engine, blocks).unwrap()), None)
}

/// Runs the batch until every request is done; returns each request's continuations by id.
fn run(batch: &mut Decoding) -> Vec<(usize, Vec<Vec<u32>>)> {
    let mut done = Vec::new();
    while !batch.is_idle() {
        done.extend(batch.step().unwrap());
    }
    done.sort_by_key(|(id, _)| *id);
    done
}

/// The argmax of the logits a cache-free pass gives at the last position of `seq`.
fn argmax_without_cache(engine: &PackedDecoder<Reference>, seq: &[u32]) -> u32 {
    let (logits, _) = engine.head_at(&Packed::new(&[seq]), &[seq.len() - 1], None).unwrap();
    logits
        .iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
        .0 as u32
}

#[test]
fn cached_steps_pick_what_a_whole_pass_picks_and_reproduce_transformers() {
    let engine = policy();
    let exp: Value = serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected.json")).unwrap()).unwrap();
    for it in exp["cases"]["qwen2-policy"]["items"].as_array().unwrap() {
        let prompt: Vec<u32> = it["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let want: Vec<u32> = it["greedy_new_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        // Prompt chunks of 5 tokens: the prompt crosses chunks and the cache its first block.
        let mut batch = paged(&engine, 64).prefill_chunk(5);
        batch.join(&prompt, 3, greedy(want.len())).unwrap();
        let outs = run(&mut batch).remove(0).1;
        for out in &outs {
            assert_eq!(out, &outs[0], "continuations of one prompt decode alike");
        }
        let mut seq = prompt.clone();
        for &t in &outs[0] {
            assert_eq!(
                t,
                argmax_without_cache(&engine, &seq),
                "a cached step against a whole pass"
            );
            seq.push(t);
        }
        // bf16 activations: transformers' (f32) greedy tokens, where its margin is not tiny.
        let margin = it["greedy_margin_min"].as_f64().unwrap();
        if margin > 0.05 {
            assert_eq!(outs[0], want, "transformers' greedy continuation (margin {margin})");
        }
        assert_eq!(batch.cache_blocks().unwrap().0, 64, "every block is given back");
    }
}

#[test]
fn sampled_continuations_are_reproducible_and_share_the_prompts_blocks() {
    let engine = policy();
    // 70 tokens: one full block (shared by the continuations) and a partial one (copied).
    let prompt: Vec<u32> = (0..70).map(|i| (i * 7 % 500 + 10) as u32).collect();
    let params = SamplingParams {
        temperature: 1.0,
        max_new_tokens: 24,
        seed: 5,
        ..Default::default()
    };
    let sample = |chunk: usize| {
        let mut batch = paged(&engine, 32).prefill_chunk(chunk);
        batch.join(&prompt, 4, params.clone()).unwrap();
        run(&mut batch).remove(0).1
    };
    let a = sample(256);
    assert_eq!(a, sample(33), "the same samples whatever the prefill chunk");
    assert!(
        a.iter().any(|o| o != &a[0]),
        "temperature 1 draws different continuations"
    );
    // Once the prompt is fed, its full block is held once for all four continuations, and each
    // has its own copy of the partly filled one: 1 + 4 blocks, not 4 × 2.
    let mut batch = paged(&engine, 32);
    batch.join(&prompt, 4, params.clone()).unwrap();
    batch.step().unwrap();
    batch.step().unwrap();
    let (free, total) = batch.cache_blocks().unwrap();
    assert_eq!(total - free, 1 + 4, "one shared block and one of their own each");
    // And the continuations sample as the CPU engine's Decoding would for these logits: the
    // same draws as a batch of one continuation each.
    let one = |index: u64| {
        let mut batch = paged(&engine, 32);
        let p = SamplingParams {
            seed: params.seed,
            ..params.clone()
        };
        batch.join(&prompt, (index + 1) as usize, p).unwrap();
        run(&mut batch).remove(0).1.pop().unwrap()
    };
    assert_eq!(one(2), a[2], "continuation 2 draws from its own generator");
}

#[test]
fn a_small_kv_budget_makes_requests_wait_and_a_hopeless_one_is_refused() {
    let engine = policy();
    // Each request: a 20-token prompt, 2 continuations of up to 50 tokens: 1 + 2 × 2 = 5 blocks
    // at worst; the cache holds 6, so one request runs at a time.
    let mut batch = paged(&engine, 6);
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|k| (0..20).map(|i| (i * 3 + k * 11 + 5) as u32).collect())
        .collect();
    for p in &prompts {
        batch.join(p, 2, greedy(50)).unwrap();
    }
    let mut most = 0;
    let mut done = Vec::new();
    while !batch.is_idle() {
        done.extend(batch.step().unwrap());
        let (free, total) = batch.cache_blocks().unwrap();
        most = most.max(total - free);
    }
    assert_eq!(done.len(), 4);
    assert!(most <= 6);
    // Each alone gives the same.
    for (id, outs) in done {
        let mut alone = paged(&engine, 64);
        alone.join(&prompts[id], 2, greedy(50)).unwrap();
        assert_eq!(run(&mut alone).remove(0).1, outs);
    }
    let err = batch.join(&prompts[0], 8, greedy(400)).unwrap_err().to_string();
    assert!(err.contains("KV cache blocks"), "{err}");
    let err = batch.join(&prompts[0], 1, greedy(600)).unwrap_err().to_string();
    assert!(err.contains("max_position_embeddings"), "{err}");
}

#[test]
fn a_cancelled_request_gives_its_blocks_back_and_leaves_the_others_as_they_were() {
    let engine = policy();
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|k| (0..20).map(|i| (i * 7 + k * 13 + 3) as u32).collect())
        .collect();
    // A budget for two requests at a time: the third waits, and is cancelled while waiting;
    // the first is cancelled mid-decoding.
    let mut batch = paged(&engine, 10).prefill_chunk(8);
    let ids: Vec<usize> = prompts.iter().map(|p| batch.join(p, 2, greedy(40)).unwrap()).collect();
    let mut done = Vec::new();
    for _ in 0..6 {
        done.extend(batch.step().unwrap());
    }
    batch.cancel(ids[0]).unwrap();
    batch.cancel(ids[2]).unwrap();
    batch.cancel(ids[2]).unwrap();
    batch.cancel(99).unwrap();
    done.extend(run(&mut batch));
    assert_eq!(done.iter().map(|(id, _)| *id).collect::<Vec<_>>(), vec![ids[1]]);
    let (free, total) = batch.cache_blocks().unwrap();
    assert_eq!(free, total, "every block is back");
    let mut alone = paged(&engine, 64);
    alone.join(&prompts[1], 2, greedy(40)).unwrap();
    assert_eq!(run(&mut alone).remove(0).1, done[0].1);
    // The batch takes new requests afterwards, with the whole budget.
    batch.join(&prompts[0], 2, greedy(40)).unwrap();
    batch.join(&prompts[2], 2, greedy(40)).unwrap();
    assert_eq!(run(&mut batch).len(), 2);
}

/// `generate`'s one request gets a cache of the blocks it needs at worst, not the whole budget
/// (allocated and zeroed at every call): the same continuations, the pool that much smaller,
/// and a request past the budget still refused by it.
#[test]
fn a_batch_of_one_request_makes_only_the_cache_it_needs() {
    let engine: Arc<dyn stepwise_model::engine::PackedEngine> = Arc::new(policy());
    let model = stepwise_model::Model::on_packed(engine).unwrap();
    let prompt: Vec<u32> = (0..70).map(|i| (i * 5 + 2) as u32).collect();
    // 70 prompt tokens (2 blocks, the second partly filled), 3 continuations to position 150:
    // 2 + 3 × (3 − 1) = 8 blocks.
    assert_eq!(stepwise_model::packed_engine::worst_case_blocks(70, 3, 80), 8);
    let mut sized = Decoding::new(&model, None).only_for(70, 3, 80);
    sized.add(&prompt, 3, greedy(80)).unwrap();
    assert_eq!(sized.cache_blocks().map(|(_, total)| total), Some(8));
    let mut whole = Decoding::new(&model, None).kv_budget(Some(64 << 20));
    whole.add(&prompt, 3, greedy(80)).unwrap();
    assert!(whole.cache_blocks().unwrap().1 > 8);
    assert_eq!(run(&mut sized), run(&mut whole));
    assert_eq!(
        stepwise_model::generate(&model, None, &prompt, 3, &greedy(80)).unwrap(),
        run(&mut {
            let mut b = Decoding::new(&model, None).kv_budget(Some(64 << 20));
            b.add(&prompt, 3, greedy(80)).unwrap();
            b
        })
        .remove(0)
        .1
    );
    // Within the budget: a budget of 4 blocks' bytes refuses what needs 8.
    let per_block = 2 * 2 * stepwise_model::packed_engine::BLOCK * {
        let c = &model.config;
        c.num_key_value_heads * c.head_dim * c.num_hidden_layers
    };
    let mut small = Decoding::new(&model, None)
        .kv_budget(Some(4 * per_block))
        .only_for(70, 3, 80);
    let err = small.add(&prompt, 3, greedy(80)).unwrap_err().to_string();
    assert!(
        err.contains("need 8 KV cache blocks") && err.contains("holds 4"),
        "{err}"
    );
}

/// The fixture policy on the packed engine's reference backend, and its tokenizer.
fn packed_policy() -> (stepwise_model::Model, stepwise_model::Tokenizer) {
    let engine: Arc<dyn stepwise_model::engine::PackedEngine> = Arc::new(policy());
    let model = stepwise_model::Model::on_packed(engine).unwrap();
    let tok = stepwise_model::Tokenizer::from_dir(&fixtures().join("qwen2-policy")).unwrap();
    (model, tok)
}

/// `model` sampling at temperature 1, at most `max_new` tokens, lines as steps.
fn sampling<'a>(
    model: &'a stepwise_model::Model,
    tok: &'a stepwise_model::Tokenizer,
    max_new: usize,
    prompt: stepwise_model::Prompt,
) -> stepwise_model::EnginePolicy<'a> {
    stepwise_model::EnginePolicy {
        model,
        tokenizer: tok,
        params: SamplingParams {
            temperature: 1.0,
            max_new_tokens: max_new,
            ..Default::default()
        },
        prompt,
        separator: "\n".into(),
        adapter: None,
    }
}

/// An RL update's questions decoded in one batch (`EnginePolicy::continue_each`) give each
/// question the continuations `continue_from` samples for it alone: the same generators, and on
/// the reference backend (products row by row) the same bits.
#[test]
fn questions_decoded_together_sample_as_each_alone() {
    use stepwise_core::seams::{Policy, Until};
    let (model, tok) = packed_policy();
    let sampler = sampling(&model, &tok, 24, stepwise_model::Prompt::Text);
    let asks = [
        ("What is 2 + 3?", 3, 11),
        ("Name a prime number.", 2, 12),
        ("Count to four, one number a line, and then say done.", 4, 13),
    ];
    let together = sampler.continue_each(&asks).unwrap();
    assert_eq!(together.len(), 3);
    for (&(question, n, seed), got) in asks.iter().zip(&together) {
        let alone = sampler.continue_from(question, &[], n, Until::End, seed).unwrap();
        let ids =
            |cs: &[stepwise_core::seams::Continuation]| cs.iter().map(|c| c.token_ids.clone()).collect::<Vec<_>>();
        assert_eq!(ids(got), ids(&alone), "{question}");
        assert_eq!(
            got.iter().map(|c| &c.text).collect::<Vec<_>>(),
            alone.iter().map(|c| &c.text).collect::<Vec<_>>()
        );
        assert!(got.iter().all(|c| c.finished && c.tokens > 0));
    }
}

/// A batch that keeps its prefixes: a prompt that goes on from a continuation that stopped (its
/// prompt, what it wrote, then more) is fed only its tokens after what they share, and decodes
/// what a batch that feeds the whole prompt decodes, bit for bit on the reference backend. A
/// cache too small for what is kept forgets it, the least recently used first, and the requests
/// still run.
#[test]
fn a_prompt_that_goes_on_from_a_kept_continuation_feeds_only_what_is_new() {
    let engine = policy();
    let first: Vec<u32> = (1..40).collect();
    let mut batch = paged(&engine, 12).keep_prefixes();
    batch.join(&first, 1, greedy(30)).unwrap();
    let wrote = run(&mut batch).remove(0).1.remove(0);
    assert_eq!(wrote.len(), 30);
    // The next turn: the first prompt, what was written, and an answer of 7 tokens.
    let mut next = first.clone();
    next.extend(&wrote);
    next.extend(100..107);
    let mut fed = 0;
    batch.join(&next, 2, greedy(12)).unwrap();
    let mut kept_outs = Vec::new();
    while !batch.is_idle() {
        kept_outs.extend(batch.step().unwrap());
        fed += batch.last_step().prompts;
    }
    // Cached: the prompt and all it wrote but the last token, never fed.
    assert_eq!(fed, next.len() - (first.len() + wrote.len() - 1));
    let mut whole = paged(&engine, 12);
    whole.join(&next, 2, greedy(12)).unwrap();
    assert_eq!(kept_outs, run(&mut whole));
    // A prompt sharing nothing is fed whole; one needing the kept blocks' room makes them go.
    let other: Vec<u32> = (200..260).collect();
    batch.join(&other, 1, greedy(4)).unwrap();
    let mut fed = 0;
    while !batch.is_idle() {
        batch.step().unwrap();
        fed += batch.last_step().prompts;
    }
    assert_eq!(fed, other.len());
    // 9 blocks at worst, of 12, with 7 kept: admitted only once kept ones are forgotten.
    let big: Vec<u32> = (0..510).map(|t| t % 590 + 1).collect();
    batch.join(&big, 1, greedy(2)).unwrap();
    for _ in 0..8 {
        batch.step().unwrap();
    }
    assert!(batch.is_idle(), "the kept prefixes gave their room back");
}

/// A policy's batch on the packed engine (`Policy::batch`) continues each ask as
/// `continue_from` does alone, call after call, and a turn that goes on from the last one's text
/// is fed only what is new.
#[test]
fn a_policy_batch_continues_as_each_ask_alone_and_keeps_the_turns() {
    use stepwise_core::seams::{NextSteps, Policy, Until};
    let (model, tok) = packed_policy();
    let sampler = sampling(&model, &tok, 16, stepwise_model::Prompt::Pieces);
    let mut batch = sampler.batch().expect("a packed engine batches");
    let questions = ["Walk to the hall.", "Open the red box, then the blue one."];
    let mut turns: Vec<Vec<String>> = vec![Vec::new(); questions.len()];
    let mut fed_per_turn = Vec::new();
    for turn in 0..3u64 {
        let prefixes: Vec<Vec<&str>> = turns.iter().map(|t| t.iter().map(String::as_str).collect()).collect();
        let asks: Vec<NextSteps> = (questions.iter().zip(&prefixes).enumerate())
            .map(|(k, (q, p))| NextSteps {
                question: q,
                prefix: p,
                n: 1,
                seed: 10 * turn + k as u64,
            })
            .collect();
        let before = model.encoded_tokens();
        let got = batch.continue_all(&asks, Until::Step);
        fed_per_turn.push(model.encoded_tokens() - before);
        let mut actions = Vec::new();
        for (a, got) in asks.iter().zip(got) {
            let got = got.unwrap();
            let alone = sampler
                .continue_from(a.question, a.prefix, 1, Until::Step, a.seed)
                .unwrap();
            assert_eq!(got, alone, "{} after {} turns", a.question, turn);
            actions.push(got[0].steps.first().cloned().unwrap_or_else(|| "wait".into()));
        }
        for (t, action) in turns.iter_mut().zip(actions) {
            t.push(format!("{action}\nObservation: you see a door"));
        }
    }
    // An ask whose worst case outgrows the cache made for the first call (8 times its need:
    // 18 blocks; 12 continuations of a 430-token prompt need 31) gets a bigger one, and
    // continues as alone all the same.
    let mut long = String::from("Walk");
    while sampler.prompt_ids(&long, &[]).unwrap().len() < 430 {
        long.push_str(" to the hall and back");
    }
    let ask = NextSteps {
        question: &long,
        prefix: &[],
        n: 12,
        seed: 90,
    };
    let got = batch.continue_all(&[ask], Until::Step).remove(0).unwrap();
    assert_eq!(got, sampler.continue_from(&long, &[], 12, Until::Step, 90).unwrap());
    // Later turns re-read the history from the cache: what they feed stays small.
    let prompts: Vec<usize> = (turns.iter().zip(questions))
        .map(|(t, q)| {
            let prefix: Vec<&str> = t.iter().map(String::as_str).collect();
            sampler.prompt_ids(q, &prefix).unwrap().len()
        })
        .collect();
    assert!(
        fed_per_turn[2] < prompts.iter().sum::<usize>(),
        "turn 3 fed {fed_per_turn:?} tokens for prompts of {prompts:?}"
    );
}

/// The packed engine's CPU backend sampled from several threads at once (an annotator's threads,
/// a server's requests) gives each call what it gives alone. Its kernels run on the thread pool,
/// whose waiting workers take up other calls' steps: a step that waited for the engine's scratch
/// buffers while its own thread held them never ended.
#[test]
fn calls_from_many_threads_at_once_sample_as_each_alone() {
    use stepwise_core::seams::{Policy, Until};
    let dir = fixtures().join("qwen2-policy");
    let model = stepwise_model::Model::load_packed(&dir, stepwise_model::Placement::Cpu).unwrap();
    let tok = stepwise_model::Tokenizer::from_dir(&dir).unwrap();
    let sampler = sampling(&model, &tok, 48, stepwise_model::Prompt::Text);
    let question = "Count to four, one number a line, and then say done.";
    let ask = |seed: u64| sampler.continue_from(question, &[], 8, Until::End, seed).unwrap();
    let alone: Vec<_> = (0..6).map(&ask).collect();
    for _ in 0..5 {
        let together: Vec<_> = std::thread::scope(|s| {
            let calls: Vec<_> = (0..6).map(|seed| s.spawn(move || ask(seed))).collect();
            calls.into_iter().map(|c| c.join().unwrap()).collect()
        });
        for (got, want) in together.iter().zip(&alone) {
            let texts =
                |cs: &[stepwise_core::seams::Continuation]| cs.iter().map(|c| c.text.clone()).collect::<Vec<_>>();
            assert_eq!(texts(got), texts(want));
        }
    }
}

/// The tokens `model` is fed for `asks` in one batch call, each ask's continuations checked
/// against what it draws alone.
fn fed_together_as_alone(
    model: &stepwise_model::Model,
    sampler: &stepwise_model::EnginePolicy<'_>,
    asks: &[stepwise_core::seams::NextSteps<'_>],
) -> usize {
    use stepwise_core::seams::{Policy, Until};
    let before = model.encoded_tokens();
    let got = sampler.batch().unwrap().continue_all(asks, Until::End);
    let fed = model.encoded_tokens() - before;
    for (a, got) in asks.iter().zip(got) {
        let alone = sampler
            .continue_from(a.question, a.prefix, a.n, Until::End, a.seed)
            .unwrap();
        assert_eq!(got.unwrap(), alone, "seed {}", a.seed);
    }
    fed
}

/// A task whose prompt is 150 tokens or more: a history worth feeding once.
fn long_question(sampler: &stepwise_model::EnginePolicy<'_>) -> String {
    let mut question = String::from("Walk to the hall");
    while sampler.prompt_ids(&question, &[]).unwrap().len() < 150 {
        question.push_str(", open the red box, take the key and put it in the blue box");
    }
    question
}

/// Asks of one prompt in one call (an agent's rollouts from one state: each its own seed) feed
/// the prompt once, not once an ask, and draw what each draws alone.
#[test]
fn asks_of_one_prompt_feed_it_once_and_draw_as_each_alone() {
    use stepwise_core::seams::NextSteps;
    let (model, tok) = packed_policy();
    let sampler = sampling(&model, &tok, 12, stepwise_model::Prompt::Text);
    let question = long_question(&sampler);
    let question = question.as_str();
    let history = ["go north", "open red box", "take key"];
    let asks: Vec<NextSteps> = (0..4)
        .map(|seed| NextSteps {
            question,
            prefix: &history,
            n: 2,
            seed,
        })
        .chain([NextSteps {
            question: "Say done.",
            prefix: &[],
            n: 1,
            seed: 9,
        }])
        .collect();
    let prompt = sampler.prompt_ids(question, &history).unwrap().len();
    let other = sampler.prompt_ids("Say done.", &[]).unwrap().len();
    let fed = fed_together_as_alone(&model, &sampler, &asks);
    // The prompt once, each ask's last prompt token, the other prompt, and at most 12 tokens
    // a row; fed once an ask, the prompt alone would be 4 times its length.
    let most = prompt + 4 + other + 9 * 12;
    assert!(
        fed <= most && most < 4 * prompt,
        "fed {fed} tokens for 4 asks of a {prompt}-token prompt"
    );
}

/// Asks from an agent's successive states in one call (each state's history the next one's
/// start; two rollouts a state, each its own ask) feed the longest history about once, not
/// every state's whole, and draw what each draws alone.
#[test]
fn asks_sharing_a_start_feed_it_once_and_draw_as_each_alone() {
    use stepwise_core::seams::NextSteps;
    let (model, tok) = packed_policy();
    let sampler = sampling(&model, &tok, 12, stepwise_model::Prompt::Text);
    let question = long_question(&sampler);
    let question = question.as_str();
    let history: &[&str] = &[
        "go north and look around the hall",
        "open the red box with care",
        "take the key",
    ];
    let asks: Vec<NextSteps> = (1..=history.len())
        .flat_map(|state| {
            (0..2).map(move |r| NextSteps {
                question,
                prefix: &history[..state],
                n: 1,
                seed: (10 * state + r) as u64,
            })
        })
        .collect();
    let longest = sampler.prompt_ids(question, history).unwrap().len();
    let whole: usize = (1..=history.len())
        .map(|s| sampler.prompt_ids(question, &history[..s]).unwrap().len())
        .sum();
    let fed = fed_together_as_alone(&model, &sampler, &asks);
    // The longest history once, a token a primer and an ask where starts meet, and at most 12
    // tokens a row; fed once a state, the histories would be `whole`.
    let most = longest + 2 * history.len() + asks.len() + 6 * 12;
    assert!(
        fed <= most && most < whole,
        "fed {fed} tokens for states of {whole} history tokens in all, the longest {longest}"
    );
}

/// Greedy asks in one batch call (a lookahead round's rollouts) decode what each decodes alone.
#[test]
fn greedy_asks_together_decode_as_each_alone() {
    use stepwise_core::seams::{Policy, Until};
    let (model, tok) = packed_policy();
    let sampler = sampling(&model, &tok, 12, stepwise_model::Prompt::Text);
    let steps: &[&str] = &["go north", "open the red box", "take the key"];
    let asks: Vec<(&str, &[&str])> = (0..=steps.len())
        .map(|s| ("Walk to the hall and open the box", &steps[..s]))
        .chain([("Say done.", &[][..])])
        .collect();
    let mut batch = sampler.batch().unwrap();
    let got = batch
        .continue_greedy_all(&asks, Until::Step)
        .expect("the engine batches greedy asks");
    for ((q, prefix), got) in asks.iter().zip(got) {
        assert_eq!(
            got.unwrap(),
            sampler.continue_greedy(q, prefix, Until::Step).unwrap(),
            "{prefix:?}"
        );
    }
}

#[test]
fn each_sampled_tokens_log_probability_is_the_whole_pass_s() {
    let engine = policy();
    let asks = |seed: u64, logprobs: Option<usize>| SamplingParams {
        temperature: 1.0,
        max_new_tokens: 12,
        seed,
        logprobs,
        ..Default::default()
    };
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|p| (0..9 + 4 * p).map(|i| (i * 11 % 400 + 7 + p) as u32).collect())
        .collect();
    let mut batch = paged(&engine, 64).prefill_chunk(6);
    // A request joins a running batch, one asks for none, one stops on a token.
    let a = batch.join(&prompts[0], 2, asks(1, Some(3))).unwrap();
    batch.step().unwrap();
    let b = batch.join(&prompts[1], 1, asks(2, None)).unwrap();
    let c = batch.join(&prompts[2], 3, asks(3, Some(0))).unwrap();
    let mut got = std::collections::HashMap::new();
    while !batch.is_idle() {
        for (id, outs) in batch.step().unwrap() {
            got.insert(
                id,
                (outs, batch.logprobs(id).expect("kept until the next step").to_vec()),
            );
        }
    }
    let (_, none) = &got[&b];
    assert!(
        none.iter().all(Vec::is_empty),
        "a request that does not ask records nothing"
    );
    for (id, prompt, k) in [(a, &prompts[0], 3), (c, &prompts[2], 0)] {
        let (outs, lps) = &got[&id];
        for (out, lp) in outs.iter().zip(lps) {
            assert_eq!(lp.len(), out.len(), "one a token");
            let mut seq = prompt.clone();
            for (&t, w) in out.iter().zip(lp) {
                let (logits, _) = engine.head_at(&Packed::new(&[&seq]), &[seq.len() - 1], None).unwrap();
                assert_eq!(
                    w,
                    &stepwise_model::token_logprob(&logits, t, k),
                    "a step's against a whole pass's"
                );
                assert_eq!(w.top.len(), k);
                seq.push(t);
            }
        }
    }
    assert!(batch.logprobs(a).is_none(), "gone after the next step");
}
