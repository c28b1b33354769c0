//! A local checkpoint as a [`Policy`]: the prompt is the question and the steps so far (in one of
//! three layouts, [`Prompt`]); continuations are split back into steps at the separator. The
//! prompt is encoded once and its KV cache shared by the `n` continuations; [`Until::Step`]
//! stops each at the separator.

use crate::generate::{generate_with, Decoding, SamplingParams};
use crate::model::Model;
use crate::packed_engine::{log_normalizer, logprob_at};
use crate::prompt::Prompt;
use crate::tokenizer::Tokenizer;
use anyhow::{Context, Result};
use stepwise_core::seams::{split_steps_at, Continuation, NextOptions, NextSteps, Policy, PolicyBatch, Until};

/// A local model as a policy.
pub struct EnginePolicy<'a> {
    /// The policy model.
    pub model: &'a Model,
    /// Its tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// Sampling settings; `stop_token_ids` end a solution (the seed is set per call).
    pub params: SamplingParams,
    /// The prompt's layout.
    pub prompt: Prompt,
    /// Text between steps, e.g. `"\n"`, `"\n\n"` or the lab's `"|"`.
    pub separator: String,
    /// The served adapter it samples and weighs with ([`Model::load_adapter`],
    /// [`Model::lease_adapter`]: whoever sets it holds a lease on it meanwhile); `None`: the
    /// base model.
    pub adapter: Option<usize>,
}

impl EnginePolicy<'_> {
    /// The prompt's token ids for a question and the steps so far.
    pub fn prompt_ids(&self, question: &str, prefix: &[&str]) -> Result<Vec<u32>> {
        self.prompt.ids(self.tokenizer, &self.separator, question, prefix)
    }

    /// Its sampling settings with `seed` for a prompt of `prompt_len` tokens: at most what the
    /// context leaves after the prompt (a budget past it is cut to it); a prompt that fills the
    /// context is an error.
    fn params_after(&self, prompt_len: usize, seed: u64) -> Result<SamplingParams> {
        let context = self.model.config.max_position_embeddings;
        if prompt_len >= context {
            anyhow::bail!("the prompt has {prompt_len} tokens: the model's context ({context}) leaves none to continue it");
        }
        Ok(SamplingParams {
            seed,
            max_new_tokens: self.params.max_new_tokens.min(context - prompt_len),
            ..self.params.clone()
        })
    }

    /// For each query `(context, options)`, the log-probability of each option (then `end`,
    /// where given) after the tokens `context`. On a packed engine each context is fed once and
    /// its options go on from its cache ([`crate::engine::PackedEngine::options_after`]); on the
    /// CPU decoder the sequences are packed end to end in passes of at most
    /// [`crate::DEFAULT_MAX_BATCH_TOKENS`] tokens ([`Model::head_at`]: the head runs only at the
    /// positions that predict an option's tokens).
    fn options_after(&self, queries: &[(&[u32], &[&str])], end: Option<u32>) -> Result<Vec<Vec<f64>>> {
        let mut tokenized: Vec<Vec<Vec<u32>>> = Vec::with_capacity(queries.len());
        for &(_, options) in queries {
            let mut ids = Vec::with_capacity(options.len());
            for o in options.iter() {
                let mut option = self.tokenizer.encode(o, false)?;
                if option.is_empty() {
                    anyhow::bail!("option `{o}` has no tokens");
                }
                option.extend(end);
                ids.push(option);
            }
            tokenized.push(ids);
        }
        let with_ids: Vec<crate::packed_engine::Query> =
            queries.iter().zip(&tokenized).map(|(q, ids)| (q.0, ids.as_slice())).collect();
        crate::packed_engine::check_queries(&with_ids, self.model.config.max_position_embeddings)?;
        match self.model.packed() {
            // The engine's contexts fed once are the base model's: an adapter's go end to end.
            Some(engine) if self.adapter.is_none() => engine.options_after(&with_ids, crate::DEFAULT_MAX_BATCH_TOKENS),
            _ => self.options_packed_end_to_end(&with_ids),
        }
    }

    /// [`Self::options_after`] on the CPU decoder (or with an adapter): each context and option
    /// one sequence, packed.
    fn options_packed_end_to_end(&self, queries: &[crate::packed_engine::Query<'_>]) -> Result<Vec<Vec<f64>>> {
        let seqs: Vec<(usize, Vec<u32>)> = (queries.iter().enumerate())
            .flat_map(|(q, &(context, options))| options.iter().map(move |o| (q, [context, o].concat())))
            .collect();
        let max_tokens = crate::DEFAULT_MAX_BATCH_TOKENS;
        let mut sums = Vec::with_capacity(seqs.len());
        let mut at = 0;
        while at < seqs.len() {
            let mut to = at + 1;
            let mut tokens = seqs[at].1.len();
            while to < seqs.len() && tokens + seqs[to].1.len() <= max_tokens {
                tokens += seqs[to].1.len();
                to += 1;
            }
            let batch = &seqs[at..to];
            let refs: Vec<&[u32]> = batch.iter().map(|(_, s)| s.as_slice()).collect();
            let read: Vec<Vec<usize>> = batch
                .iter()
                .map(|(q, s)| (queries[*q].0.len() - 1..s.len() - 1).collect())
                .collect();
            let (logits, width) = self.model.head_at_with(&refs, &read, None, self.adapter.into_iter().map(Some).collect())?;
            let mut rows = logits.chunks(width.max(1));
            for (q, s) in batch {
                let mut sum = 0f64;
                for &token in &s[queries[*q].0.len()..] {
                    let row = rows.next().context("the model read fewer positions than asked")?;
                    sum += logprob_at(row, log_normalizer(row), token)?;
                }
                sums.push(sum);
            }
            at = to;
        }
        let mut out: Vec<Vec<f64>> = queries.iter().map(|(_, o)| Vec::with_capacity(o.len())).collect();
        for ((q, _), sum) in seqs.iter().zip(sums) {
            out[*q].push(sum);
        }
        Ok(out)
    }

    /// The text of generated tokens `out`, its end tokens left out.
    fn text_of(&self, out: &[u32]) -> Result<String> {
        let end = &self.params.stop_token_ids;
        let body: Vec<u32> = out.iter().copied().filter(|t| !end.contains(t)).collect();
        self.tokenizer.decode(&body)
    }
}

impl Policy for EnginePolicy<'_> {
    /// On the packed engine, a batch that keeps its prefixes ([`Decoding::keep_prefixes`]); the
    /// CPU decoder asks one by one, as the lab's recorded runs sampled.
    fn batch(&self) -> Option<Box<dyn PolicyBatch + '_>> {
        self.model.packed()?;
        Some(Box::new(EngineBatch {
            policy: self,
            batch: None,
            sep_id: self.tokenizer.token_id(&self.separator),
        }))
    }

    fn continuation_logprobs(&self, question: &str, written: &str, options: &[&str]) -> Result<Option<Vec<f64>>> {
        let mut context = self.prompt_ids(question, &[])?;
        context.extend(self.tokenizer.encode(written, false)?);
        Ok(self.options_after(&[(&context, options)], None)?.pop())
    }

    fn logprobs_after(&self, asks: &[NextOptions<'_>], end: bool) -> Result<Option<Vec<Vec<f64>>>> {
        let end = match end {
            true => Some(
                *self
                    .params
                    .stop_token_ids
                    .first()
                    .context("the policy has no end token to end an option with")?,
            ),
            false => None,
        };
        let contexts: Vec<Vec<u32>> = asks
            .iter()
            .map(|a| self.prompt_ids(a.question, a.prefix))
            .collect::<Result<_>>()?;
        let queries: Vec<(&[u32], &[&str])> = contexts.iter().map(Vec::as_slice).zip(asks.iter().map(|a| a.options)).collect();
        self.options_after(&queries, end).map(Some)
    }

    fn continue_written(&self, question: &str, written: &str, stop: &[&str], seed: u64) -> Result<Option<Continuation>> {
        // The text written is part of the prompt.
        let mut ids = self.prompt_ids(question, &[])?;
        ids.extend(self.tokenizer.encode(written, false)?);
        let mut params = self.params_after(ids.len(), seed)?;
        params.stop_strings.extend(stop.iter().map(|s| s.to_string()));
        let out = generate_with(self.model, Some(self.tokenizer), &ids, 1, &params, self.adapter)?
            .pop()
            .context("the engine returned no continuation")?;
        let text = self.text_of(&out)?;
        let at_stop = stop.iter().any(|s| text.ends_with(s));
        Ok(Some(Continuation {
            steps: Vec::new(),
            finished: !at_stop,
            tokens: out.len(),
            token_ids: out,
            text,
        }))
    }

    fn continue_greedy(&self, question: &str, prefix: &[&str], until: Until) -> Result<Continuation> {
        let greedy = EnginePolicy {
            params: SamplingParams {
                temperature: 0.0,
                ..self.params.clone()
            },
            prompt: self.prompt,
            separator: self.separator.clone(),
            ..*self
        };
        let mut one = greedy.continue_from(question, prefix, 1, until, 0)?;
        Ok(one.remove(0))
    }

    fn continue_from(
        &self,
        question: &str,
        prefix: &[&str],
        n: usize,
        until: Until,
        seed: u64,
    ) -> Result<Vec<Continuation>> {
        let sep_id = self.tokenizer.token_id(&self.separator);
        let (ids, params) = self.prepared(question, prefix, seed, until, sep_id)?;
        generate_with(self.model, Some(self.tokenizer), &ids, n, &params, self.adapter)?
            .into_iter()
            .map(|out| self.continuation(out, until, sep_id))
            .collect()
    }
}

impl<'a> EnginePolicy<'a> {
    /// The prompt's ids and the sampling settings of an ask: its seed, and with [`Until::Step`]
    /// the separator (its token `sep_id`, where it is one, else its text) as a stop.
    fn prepared(
        &self,
        question: &str,
        prefix: &[&str],
        seed: u64,
        until: Until,
        sep_id: Option<u32>,
    ) -> Result<(Vec<u32>, SamplingParams)> {
        let ids = self.prompt_ids(question, prefix)?;
        let mut params = self.params_after(ids.len(), seed)?;
        if until == Until::Step {
            match sep_id {
                Some(id) => params.stop_token_ids.push(id),
                None => params.stop_strings.push(self.separator.clone()),
            }
        }
        Ok((ids, params))
    }

    /// Each prepared ask `(prompt, n, settings)` joined to `batch` and decoded with the others
    /// to the end: its continuations, or the error it met (where the engine fails a step, every
    /// ask not yet done fails with it, and the flag says the batch is unusable).
    fn decode_all(
        &self,
        batch: &mut Decoding<'a>,
        asks: Vec<crate::primers::Prepared>,
        until: Until,
        sep_id: Option<u32>,
    ) -> (Vec<Result<Vec<Continuation>>>, bool) {
        let mut out: Vec<Option<Result<Vec<Continuation>>>> = (0..asks.len()).map(|_| None).collect();
        let mut failed = false;
        let mut asked = std::collections::HashMap::new();
        for (i, ask) in asks.into_iter().enumerate() {
            match ask.and_then(|(ids, n, params)| batch.join_with(&ids, n, params, self.adapter)) {
                Ok(id) => _ = asked.insert(id, i),
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        while !batch.is_idle() {
            match batch.step() {
                Ok(done) => {
                    for (id, outs) in done {
                        let i = asked.remove(&id).expect("a request of this call");
                        out[i] = Some(outs.into_iter().map(|o| self.continuation(o, until, sep_id)).collect());
                    }
                }
                Err(e) => {
                    for i in asked.into_values() {
                        out[i] = Some(Err(anyhow::anyhow!("the batch failed a step: {e:#}")));
                    }
                    failed = true;
                    break;
                }
            }
        }
        let out = (out.into_iter())
            .map(|o| o.unwrap_or_else(|| Err(anyhow::anyhow!("the batch lost an ask"))))
            .collect();
        (out, failed)
    }

    /// The continuation whose tokens are `out`, split into steps (one, to its separator, with
    /// [`Until::Step`]); `sep_id` is the separator's token, where it is one.
    fn continuation(&self, out: Vec<u32>, until: Until, sep_id: Option<u32>) -> Result<Continuation> {
        let at_separator = match sep_id {
            Some(id) => out.last() == Some(&id),
            None => false,
        };
        let text = self.text_of(&out)?;
        let mut steps = split_steps_at(&text, &self.separator);
        // Until::Step: a step followed by the separator can be continued; one that ended the
        // sequence (or the token budget) cannot.
        let finished = until == Until::End || !(at_separator || text.ends_with(self.separator.as_str()));
        if until == Until::Step {
            steps.truncate(1);
        }
        Ok(Continuation {
            steps,
            text,
            finished,
            tokens: out.len(),
            token_ids: out,
        })
    }

    /// For each `(question, n, seed)`, `n` solutions from scratch to the end, as
    /// [`Policy::continue_from`] samples them (each continuation's generator the same), all
    /// decoded in one batch: the prompts fed through its decoding steps and every live row
    /// decoded in one pass a step, so the weights are read once a step for all of them rather
    /// than once a question (an RL update's prompts). Rows multiplied together may round apart
    /// from rows multiplied alone, so a draw can differ where two tokens' probabilities tie to
    /// float precision. The cache holds only what the questions need at worst.
    pub fn continue_each(&self, asks: &[(&str, usize, u64)]) -> Result<Vec<Vec<Continuation>>> {
        let prepared: Vec<_> = (asks.iter())
            .map(|&(question, n, seed)| Ok((self.prepared(question, &[], seed, Until::End, None)?, n)))
            .collect::<Result<_>>()?;
        let mut batch = Decoding::new(self.model, Some(self.tokenizer));
        for ((ids, params), n) in &prepared {
            batch = batch.only_for(ids.len(), *n, params.max_new_tokens);
        }
        let prepared = (prepared.into_iter()).map(|((ids, params), n)| Ok((ids, n, params))).collect();
        let sep_id = self.tokenizer.token_id(&self.separator);
        self.decode_all(&mut batch, prepared, Until::End, sep_id).0.into_iter().collect()
    }
}

/// How many times its first call's worst case a policy's batch makes its cache hold (within the
/// engine's KV budget): room for what the calls after it keep ([`EngineBatch`]).
const BATCH_ROOM: usize = 8;

/// A policy's batch on the packed engine ([`Policy::batch`]): one [`Decoding`] that keeps its
/// prefixes ([`Decoding::keep_prefixes`]) from call to call. Its cache is made at the first call,
/// [`BATCH_ROOM`] times as big as that call's continuations need at worst (within the KV budget;
/// a pool is allocated whole and zeroed, so the budget is not taken for a few episodes), and
/// made anew, as big again for the call that needs it, when a call's worst case outgrows it
/// (what was kept is then read again).
struct EngineBatch<'p> {
    policy: &'p EnginePolicy<'p>,
    /// The batch, with the blocks its cache was asked for (`None`: made at the next call).
    batch: Option<(Decoding<'p>, usize)>,
    sep_id: Option<u32>,
}

impl<'p> EngineBatch<'p> {
    /// The batch for these prepared asks: the one made before, unless their worst case outgrew
    /// its cache (or it has none yet).
    fn batch_for(&mut self, asks: &[crate::primers::Prepared]) -> &mut Decoding<'p> {
        use crate::packed_engine::worst_case_blocks;
        let fine = asks.iter().flatten();
        let need: usize = fine.clone().map(|(ids, n, p)| worst_case_blocks(ids.len(), *n, p.max_new_tokens)).sum();
        let outgrown = match &self.batch {
            // Made as big as asked, or as the budget allows: anew only where it was not capped.
            Some((b, asked)) => match b.cache_blocks() {
                Some((_, total)) => total < need && total >= *asked,
                None => true,
            },
            None => true,
        };
        if outgrown {
            let policy = self.policy;
            let mut b = Decoding::new(policy.model, Some(policy.tokenizer)).keep_prefixes();
            let mut asked = 0;
            for (ids, n, p) in fine {
                b = b.only_for(ids.len(), n * BATCH_ROOM, p.max_new_tokens);
                asked += worst_case_blocks(ids.len(), n * BATCH_ROOM, p.max_new_tokens);
            }
            self.batch = Some((b, asked));
        }
        &mut self.batch.as_mut().expect("made above").0
    }
}

impl PolicyBatch for EngineBatch<'_> {
    fn continue_all(&mut self, asks: &[NextSteps<'_>], until: Until) -> Vec<Result<Vec<Continuation>>> {
        let (policy, sep_id) = (self.policy, self.sep_id);
        let prepared: Vec<_> = (asks.iter())
            .map(|a| {
                let (ids, params) = policy.prepared(a.question, a.prefix, a.seed, until, sep_id)?;
                Ok((ids, a.n, params))
            })
            .collect();
        self.decode(prepared, until)
    }

    /// Each ask decoded at temperature 0, as [`EnginePolicy::continue_greedy`] decodes it alone.
    fn continue_greedy_all(&mut self, asks: &[(&str, &[&str])], until: Until) -> Option<Vec<Result<Continuation>>> {
        let (policy, sep_id) = (self.policy, self.sep_id);
        let prepared: Vec<_> = (asks.iter())
            .map(|(question, prefix)| {
                let (ids, params) = policy.prepared(question, prefix, 0, until, sep_id)?;
                Ok((ids, 1, SamplingParams { temperature: 0.0, ..params }))
            })
            .collect();
        let out = self.decode(prepared, until).into_iter();
        Some(out.map(|r| r.and_then(|mut one| one.pop().context("the engine returned no continuation"))).collect())
    }
}

impl EngineBatch<'_> {
    /// The prepared asks decoded on the batch, the starts they share fed once first.
    fn decode(&mut self, prepared: Vec<crate::primers::Prepared>, until: Until) -> Vec<Result<Vec<Continuation>>> {
        let (policy, sep_id) = (self.policy, self.sep_id);
        // Starts the asks share, fed once, level by level (crate::primers): the base model's,
        // kept for it alone (an adapter's keys differ).
        let batch = self.batch_for(&prepared);
        let levels = match policy.adapter {
            None => crate::primers::primer_levels(&prepared, |p| batch.kept_start(p)),
            Some(_) => Vec::new(),
        };
        for primers in levels {
            let batch = self.batch_for(&prepared);
            if policy.decode_all(batch, primers, until, sep_id).1 {
                self.batch = None;
            }
        }
        let batch = self.batch_for(&prepared);
        let (out, failed) = policy.decode_all(batch, prepared, until, sep_id);
        if failed {
            // A step failed: the batch is left as it was then; the next call starts a new one.
            self.batch = None;
        }
        out
    }
}

/// Whether a policy of `config` sampled on the CPU at `precision` runs on the packed engine's CPU
/// backend (bf16 weights, bf16 products with f32 sums): a pretrained model
/// ([`crate::train::run::PRETRAINED_WIDTH`] wide or more) whose weights are bf16 at that
/// precision anyway (stored in bf16 and kept so, or rounded to bf16 with bf16 products), where it
/// decodes many rows in one pass a step and keeps prefixes, as the GPU's engine does. The small
/// shapes (the lab's), f32 weights (`--dtype f32`, or an f32 checkpoint as stored) and products
/// widened to f32 (`bf16-weights`) keep the CPU decoder and its numbers.
pub fn samples_packed_on_cpu(config: &crate::ModelConfig, precision: crate::Precision) -> bool {
    use crate::WeightDtype;
    let bf16 = match precision.weights {
        WeightDtype::Auto => config.dtype == candle_core::DType::BF16,
        WeightDtype::Bf16 => true,
        WeightDtype::F32 => false,
    };
    bf16 && precision.bf16_products && config.hidden_size >= crate::train::run::PRETRAINED_WIDTH
}

/// A policy folder loaded for sampling: the model, its tokenizer, and the token ids that end a
/// solution (the config's end-of-sequence ids and the tokenizer's).
pub struct LoadedPolicy {
    /// The model.
    pub model: Model,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Ids that end a solution.
    pub stop_token_ids: Vec<u32>,
}

impl LoadedPolicy {
    /// Load the checkpoint in `dir` on the CPU.
    pub fn load(dir: &std::path::Path, device: &candle_core::Device) -> Result<Self> {
        Self::with_model(dir, Model::load(dir, device)?)
    }

    /// Load the checkpoint in `dir` where `placement` says, on the engine that samples it best
    /// there: on a GPU the CUDA engine (its KV cache on the device); on the CPU the packed
    /// engine's CPU backend for a pretrained policy held in bf16 ([`samples_packed_on_cpu`]:
    /// rows decoded together, prefixes kept, [`Policy::batch`]), the CPU decoder otherwise.
    pub fn load_on(dir: &std::path::Path, placement: crate::Placement, precision: crate::Precision) -> Result<Self> {
        let model = match placement.resolve()? {
            crate::Placement::Cpu if samples_packed_on_cpu(&crate::ModelConfig::from_dir(dir)?, precision) => {
                Model::load_packed(dir, crate::Placement::Cpu)?
            }
            _ => Model::load_on(dir, placement, precision)?,
        };
        Self::with_model(dir, model)
    }

    fn with_model(dir: &std::path::Path, model: Model) -> Result<Self> {
        let tokenizer = Tokenizer::from_dir(dir)?;
        let mut stop_token_ids = model.config.eos_token_ids.clone();
        stop_token_ids.extend(tokenizer.eos_id());
        Ok(LoadedPolicy {
            model,
            tokenizer,
            stop_token_ids,
        })
    }

    /// It as a [`Policy`] sampling at `temperature`, at most `max_new_tokens` per continuation,
    /// with `prompt`'s layout and `separator` between steps.
    pub fn policy(&self, temperature: f32, max_new_tokens: usize, prompt: Prompt, separator: &str) -> EnginePolicy<'_> {
        EnginePolicy {
            model: &self.model,
            tokenizer: &self.tokenizer,
            params: SamplingParams {
                temperature,
                max_new_tokens,
                stop_token_ids: self.stop_token_ids.clone(),
                ..Default::default()
            },
            prompt,
            separator: separator.to_string(),
            adapter: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::samples_packed_on_cpu;
    use crate::{HeadKind, ModelConfig, Precision};
    use candle_core::DType;

    /// A pretrained policy held in bf16 samples on the packed engine; the small shapes, f32
    /// weights and widened products keep the decoder.
    #[test]
    fn the_cpu_samples_a_pretrained_bf16_policy_on_the_packed_engine() {
        let config = |hidden: usize, dtype: DType| ModelConfig {
            dtype,
            ..ModelConfig::tiny(64, hidden, 1, 4, 2, HeadKind::CausalLm)
        };
        let at = |p: &str| p.parse::<Precision>().unwrap();
        let qwen = config(896, DType::BF16);
        assert!(samples_packed_on_cpu(&qwen, at("auto")));
        assert!(samples_packed_on_cpu(&qwen, at("bf16")));
        assert!(!samples_packed_on_cpu(&qwen, at("f32")));
        assert!(!samples_packed_on_cpu(&qwen, at("bf16-weights")));
        let stored_f32 = config(896, DType::F32);
        assert!(!samples_packed_on_cpu(&stored_f32, at("auto")));
        assert!(samples_packed_on_cpu(&stored_f32, at("bf16")));
        let small = config(64, DType::BF16);
        assert!(!samples_packed_on_cpu(&small, at("bf16")));
    }
}
