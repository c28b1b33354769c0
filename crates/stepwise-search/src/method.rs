//! What every search method shares: one configuration ([`SearchConfig`]), the partial solutions
//! it grows ([`Partial`]), the metered access to the policy and the scorer ([`Run`], which counts
//! generated and encoded tokens and wall time), and the [`SearchMethod`] trait each method file
//! implements. [`search`] runs one method on one problem and picks the answer.

use crate::aggregation::{aggregate, Aggregation};
use anyhow::{ensure, Result};
use serde::{Deserialize, Serialize};
use std::time::Instant;
use stepwise_core::seams::{NextSteps, Policy, PolicyBatch, ScoreInput, StepScorer, Until};

/// Settings of every method (each reads the ones it needs), as search-and-learn keeps one config.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SearchConfig {
    /// `N`: solutions' worth of samples per step — best-of-N's samples, the number of beams
    /// generated at each step of beam search, lookahead and DVTS.
    pub n: usize,
    /// `M`: beam search keeps `N / M` beams and expands each `M` ways; DVTS grows `N / M`
    /// independent subtrees, each expanded `M` ways per step.
    pub width: usize,
    /// Most steps in a solution; a partial solution that reaches it is finished.
    pub max_steps: usize,
    /// How step scores rank partial and finished solutions.
    pub aggregation: Aggregation,
    /// Lookahead: steps rolled out greedily to score a candidate step.
    pub lookahead: usize,
    /// Verify → resample: a step scored below `threshold` is rejected.
    pub threshold: f32,
    /// Verify → resample: most resamples of one step (then the best-scored attempt is kept).
    pub max_resamples: usize,
    /// Verify → resample: most resamples over a whole problem.
    pub resample_budget: usize,
    /// Seed of the policy's draws: the same seed gives the same search.
    pub seed: u64,
}

impl Default for SearchConfig {
    fn default() -> Self {
        SearchConfig {
            n: 8,
            width: 4,
            max_steps: 40,
            aggregation: Aggregation::Min,
            lookahead: 1,
            threshold: 0.5,
            max_resamples: 4,
            resample_budget: 16,
            seed: 0,
        }
    }
}

/// What a search spent on one problem.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Compute {
    /// Tokens the policy generated (rejected steps and lookahead rollouts included).
    pub generated_tokens: usize,
    /// Tokens the scorer encoded.
    pub encoded_tokens: usize,
    /// Calls to the policy.
    pub policy_calls: usize,
    /// Calls to the scorer.
    pub scorer_calls: usize,
    /// Steps rejected and resampled (verify → resample).
    pub rejected_steps: usize,
    /// Wall-clock seconds.
    pub seconds: f64,
}

/// A partial (or finished) solution in a search.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Partial {
    /// Its steps.
    pub steps: Vec<String>,
    /// The scorer's score of each step (empty until scored).
    pub scores: Vec<f32>,
    /// Whether it is complete (the policy ended it, or it reached the step limit).
    pub finished: bool,
}

impl Partial {
    /// Its aggregated score.
    pub fn value(&self, how: Aggregation) -> f32 {
        aggregate(&self.scores, how)
    }
}

/// Keep the `k` best of `beams` by `value` (ties: the earlier), dropping duplicates of the same
/// steps: a duplicated beam spends the budget twice on one path.
pub(crate) fn keep_best(beams: Vec<Partial>, value: &[f32], k: usize) -> Vec<Partial> {
    let mut order: Vec<usize> = (0..beams.len()).collect();
    order.sort_by(|&a, &b| value[b].total_cmp(&value[a]).then(a.cmp(&b)));
    let mut kept: Vec<Partial> = Vec::with_capacity(k);
    for i in order {
        if kept.len() == k {
            break;
        }
        if !kept.iter().any(|b| b.steps == beams[i].steps) {
            kept.push(beams[i].clone());
        }
    }
    kept
}

/// One problem's search in progress: the policy and scorer behind meters.
pub struct Run<'a> {
    /// The problem's id.
    pub problem_id: &'a str,
    /// Its question.
    pub question: &'a str,
    /// The settings.
    pub config: &'a SearchConfig,
    policy: &'a dyn Policy,
    /// The policy's batch, where it batches, opened at the second call (a method that calls the
    /// policy once, best-of-N, keeps no cache): a round's beams expanded in one call, each beam's
    /// text so far kept in its cache from the round before. `None` inside: it does not batch.
    batch: Option<Option<Box<dyn PolicyBatch + 'a>>>,
    scorer: &'a dyn StepScorer,
    draws: u64,
    /// What was spent so far.
    pub compute: Compute,
}

impl<'a> Run<'a> {
    /// A search of `question` with `policy` and `scorer`.
    pub fn new(
        problem_id: &'a str,
        question: &'a str,
        config: &'a SearchConfig,
        policy: &'a dyn Policy,
        scorer: &'a dyn StepScorer,
    ) -> Self {
        Run {
            problem_id,
            question,
            config,
            policy,
            batch: None,
            scorer,
            draws: 0,
            compute: Compute::default(),
        }
    }

    /// The seed of the next draw: a function of the search seed, the problem and the draw's rank.
    fn next_seed(&mut self) -> u64 {
        self.draws += 1;
        let mut h = self.config.seed ^ 0x9e37_79b9_7f4a_7c15;
        for b in self.problem_id.bytes().chain(self.draws.to_le_bytes()) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        h
    }

    /// Extend `parent` by one step, `n` ways (unscored), or to the end with [`Until::End`].
    pub fn expand(&mut self, parent: &Partial, n: usize, until: Until) -> Result<Vec<Partial>> {
        Ok(self.expand_all(&[(parent, n)], until)?.remove(0))
    }

    /// Each `(parent, n)` extended [`Run::expand`]'s way, with the draws it would give them one
    /// after the other: in one batch where the policy batches (a round's beams decoded together).
    pub fn expand_all(&mut self, parents: &[(&Partial, usize)], until: Until) -> Result<Vec<Vec<Partial>>> {
        let seeds: Vec<u64> = parents.iter().map(|_| self.next_seed()).collect();
        let prefixes: Vec<Vec<&str>> = (parents.iter())
            .map(|(p, _)| p.steps.iter().map(String::as_str).collect())
            .collect();
        let asks: Vec<NextSteps> = (parents.iter().zip(&prefixes).zip(&seeds))
            .map(|((&(_, n), prefix), &seed)| NextSteps {
                question: self.question,
                prefix,
                n,
                seed,
            })
            .collect();
        let answers = match self.open_batch() {
            Some(b) => b.continue_all(&asks, until),
            None => (asks.iter())
                .map(|a| self.policy.continue_from(a.question, a.prefix, a.n, until, a.seed))
                .collect(),
        };
        let mut out = Vec::with_capacity(parents.len());
        for (&(parent, n), outs) in parents.iter().zip(answers) {
            let outs = outs?;
            ensure!(
                outs.len() == n,
                "the policy returned {} continuations for {n}",
                outs.len()
            );
            self.compute.policy_calls += 1;
            let kids = (outs.into_iter())
                .map(|c| {
                    self.compute.generated_tokens += c.tokens;
                    self.child(parent, c.steps, c.finished)
                })
                .collect();
            out.push(kids);
        }
        Ok(out)
    }

    /// The policy's batch (`None` where it does not batch), opened at the search's second policy
    /// call: a method that calls the policy once (best-of-N) keeps no cache.
    fn open_batch(&mut self) -> Option<&mut (dyn PolicyBatch + 'a)> {
        if self.compute.policy_calls > 0 && self.batch.is_none() {
            self.batch = Some(self.policy.batch());
        }
        self.batch.as_mut().and_then(Option::as_mut).map(|b| &mut **b)
    }

    /// `parent` extended by one greedy step.
    pub fn greedy_step(&mut self, parent: &Partial) -> Result<Partial> {
        Ok(self.greedy_steps(&[parent])?.remove(0))
    }

    /// Each of `parents` extended by one greedy step: in one batch where the policy batches (a
    /// round's lookahead rollouts decoded together), else one call each.
    pub fn greedy_steps(&mut self, parents: &[&Partial]) -> Result<Vec<Partial>> {
        let prefixes: Vec<Vec<&str>> = (parents.iter())
            .map(|p| p.steps.iter().map(String::as_str).collect())
            .collect();
        let asks: Vec<(&str, &[&str])> = prefixes.iter().map(|p| (self.question, p.as_slice())).collect();
        let batched = self
            .open_batch()
            .and_then(|b| b.continue_greedy_all(&asks, Until::Step));
        let answers = batched.unwrap_or_else(|| {
            (asks.iter())
                .map(|(q, prefix)| self.policy.continue_greedy(q, prefix, Until::Step))
                .collect()
        });
        let mut out = Vec::with_capacity(parents.len());
        for (parent, c) in parents.iter().zip(answers) {
            let c = c?;
            self.compute.policy_calls += 1;
            self.compute.generated_tokens += c.tokens;
            out.push(self.child(parent, c.steps, c.finished));
        }
        Ok(out)
    }

    /// A child of `parent` with `new` steps: finished when the policy ended it, when it wrote no
    /// step (it cannot progress), or at the step limit.
    fn child(&self, parent: &Partial, new: Vec<String>, finished: bool) -> Partial {
        let empty = new.is_empty();
        let mut steps = parent.steps.clone();
        steps.extend(new);
        steps.truncate(self.config.max_steps.max(1));
        Partial {
            finished: finished || empty || steps.len() >= self.config.max_steps,
            steps,
            scores: Vec::new(),
        }
    }

    /// Score every step of each of `beams` (in one scorer call).
    pub fn score(&mut self, beams: &mut [Partial]) -> Result<()> {
        if beams.is_empty() {
            return Ok(());
        }
        let inputs: Vec<ScoreInput<'_>> = beams
            .iter()
            .map(|b| ScoreInput {
                problem_id: self.problem_id,
                question: self.question,
                steps: b.steps.iter().map(String::as_str).collect(),
                partial: !b.finished,
            })
            .collect();
        let scored = self.scorer.score(&inputs)?;
        ensure!(
            scored.scores.len() == beams.len(),
            "the scorer returned {} results for {} inputs",
            scored.scores.len(),
            beams.len()
        );
        self.compute.scorer_calls += 1;
        self.compute.encoded_tokens += scored.tokens;
        for (b, s) in beams.iter_mut().zip(scored.scores) {
            ensure!(
                s.len() == b.steps.len(),
                "the scorer returned {} scores for {} steps",
                s.len(),
                b.steps.len()
            );
            b.scores = s;
        }
        Ok(())
    }
}

/// A search strategy: grows solutions to one problem with a policy guided by a scorer and
/// returns the finished candidates (scored) it found.
pub trait SearchMethod: Sync {
    /// Its name (`bon`, `beam`, `dvts`, `lookahead`, `resample`).
    fn name(&self) -> &'static str;
    /// Search one problem.
    fn candidates(&self, run: &mut Run<'_>) -> Result<Vec<Partial>>;
}

/// The result of searching one problem.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Searched {
    /// The chosen solution: the finished candidate with the best aggregated score.
    pub chosen: Partial,
    /// How many finished candidates there were to choose from.
    pub candidates: usize,
    /// What the search spent.
    pub compute: Compute,
}

/// Search one problem with `method` and pick the candidate with the best aggregated score.
pub fn search(
    method: &dyn SearchMethod,
    config: &SearchConfig,
    problem_id: &str,
    question: &str,
    policy: &dyn Policy,
    scorer: &dyn StepScorer,
) -> Result<Searched> {
    ensure!(config.n > 0, "search: n must be at least 1");
    ensure!(config.width > 0, "search: the width must be at least 1");
    let clock = Instant::now();
    let mut run = Run::new(problem_id, question, config, policy, scorer);
    let found = method.candidates(&mut run)?;
    let value: Vec<f32> = found.iter().map(|p| p.value(config.aggregation)).collect();
    let candidates = found.len();
    let chosen = keep_best(found, &value, 1).pop().unwrap_or_default();
    run.compute.seconds = clock.elapsed().as_secs_f64();
    Ok(Searched {
        chosen,
        candidates,
        compute: run.compute,
    })
}
