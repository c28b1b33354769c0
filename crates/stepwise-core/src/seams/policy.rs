//! [`Policy`]: anything that writes solutions step by step.

use anyhow::{Context, Result};

/// How far a [`Policy`] continues a partial solution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// One more step: generation stops at the step separator (step-level search, beams).
    Step,
    /// To the end of the solution (sampling, Monte Carlo rollouts).
    End,
}

/// What [`Policy::logprobs_after`] weighs: `options`, each as what the model writes next after
/// `question` and the steps `prefix`.
#[derive(Debug, Clone, Copy)]
pub struct NextOptions<'a> {
    /// The question, laid out as the policy's prompt.
    pub question: &'a str,
    /// The steps after it.
    pub prefix: &'a [&'a str],
    /// The texts weighed.
    pub options: &'a [&'a str],
}

/// One ask of a [`PolicyBatch`]: `n` continuations of `question` after the steps `prefix`, drawn
/// with `seed`, as [`Policy::continue_from`] draws them.
#[derive(Debug, Clone, Copy)]
pub struct NextSteps<'a> {
    /// The question, laid out as the policy's prompt.
    pub question: &'a str,
    /// The steps after it.
    pub prefix: &'a [&'a str],
    /// Continuations wanted.
    pub n: usize,
    /// The draw's seed.
    pub seed: u64,
}

/// A batch of continuations a policy decodes together, call after call, on one KV cache
/// ([`Policy::batch`]): every ask of a call is decoded in the same steps (the weights read once
/// a step for all of them), and what an earlier call wrote stays cached, so an ask that goes on
/// from an earlier one's text (an agent's next turn, after the environment's answer) feeds only
/// what is new. Dropped, it frees its cache.
pub trait PolicyBatch {
    /// For each ask, its continuations as [`Policy::continue_from`] gives them (each row's
    /// draw the same; rows decoded together may round apart where two tokens tie to float
    /// precision), or the error that ask alone met.
    fn continue_all(&mut self, asks: &[NextSteps<'_>], until: Until) -> Vec<Result<Vec<Continuation>>>;

    /// For each `(question, prefix)`, the continuation [`Policy::continue_greedy`] gives it
    /// (lookahead search's rollouts of a round, decoded together); `None` where this batch only
    /// samples (the default: the caller then asks the policy one at a time).
    fn continue_greedy_all(&mut self, asks: &[(&str, &[&str])], until: Until) -> Option<Vec<Result<Continuation>>> {
        let _ = (asks, until);
        None
    }
}

/// One continuation of a partial solution.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Continuation {
    /// The new steps: at most one for [`Until::Step`], the rest of the solution for [`Until::End`].
    pub steps: Vec<String>,
    /// The generated text as it came out (without end tokens), before step splitting.
    pub text: String,
    /// Whether the solution ended here (end of sequence or token budget). With [`Until::Step`],
    /// `false` means the step was followed by the separator and more steps can follow.
    pub finished: bool,
    /// Tokens generated for this continuation.
    pub tokens: usize,
    /// The generated token ids, end token included, where the policy exposes them (a local
    /// engine does; RL trains on exactly these tokens). Empty otherwise.
    pub token_ids: Vec<u32>,
}

/// Anything that can continue a partial solution: the local engine, a remote server, a scripted
/// test double. `Sync`, so several solutions are worked on at once.
pub trait Policy: Sync {
    /// `n` continuations of `question` after the `prefix` steps, by one step or to the end.
    /// `seed` makes the draw reproducible: the same arguments give the same continuations.
    fn continue_from(
        &self,
        question: &str,
        prefix: &[&str],
        n: usize,
        until: Until,
        seed: u64,
    ) -> Result<Vec<Continuation>>;

    /// One continuation of the most likely tokens (temperature 0), where the policy can decode
    /// greedily; by default one sample (seed 0). Lookahead search rolls out with it.
    fn continue_greedy(&self, question: &str, prefix: &[&str], until: Until) -> Result<Continuation> {
        let mut one = self.continue_from(question, prefix, 1, until, 0)?;
        one.pop().context("the policy returned no continuation")
    }

    /// The log-probability of each of `options` being the text that comes next, after
    /// `question` laid out as a prompt (as [`Policy::continue_from`] lays it out, no steps) and
    /// then `written` as the model's own text; `None` where the policy cannot tell (the
    /// default). A local engine can: generative verifiers read a verdict's likelihood with it
    /// (`P(correct)` against `P(incorrect)` after `\boxed{`) instead of counting sampled votes.
    fn continuation_logprobs(&self, question: &str, written: &str, options: &[&str]) -> Result<Option<Vec<f64>>> {
        let _ = (question, written, options);
        Ok(None)
    }

    /// For each ask, the log-probability of each of its options being what the model writes
    /// next after its question and steps, laid out as [`Policy::continue_from`] lays them out
    /// (so a judge fine-tuned to answer right after a solution is read where it answers): the
    /// sum over an option's tokens, with `end` the policy's end of text after it as well (so
    /// options where one starts another, `1` and `10`, are told apart). `None` where the policy
    /// cannot tell (the default; a Python policy). A judge's verdicts are weighed with it instead
    /// of sampled (GenRM's `P(yes)`); a local engine weighs many asks in one batch, a served
    /// model each option's echoed log-probabilities.
    fn logprobs_after(&self, asks: &[NextOptions<'_>], end: bool) -> Result<Option<Vec<Vec<f64>>>> {
        let _ = (asks, end);
        Ok(None)
    }

    /// One continuation of `written`, the model's own text after `question` laid out as a
    /// prompt (as [`Policy::continuation_logprobs`] lays it out), to the end of the sequence,
    /// the token budget, or the first of `stop` it writes (kept at the end of its text, and then
    /// `finished` is false); `None` where the policy cannot continue its own text (the default).
    /// A verifier with tools writes its chain with it: it stops after a code block, runs the
    /// code, and continues after the code's output (GenPRM's code verification).
    fn continue_written(
        &self,
        question: &str,
        written: &str,
        stop: &[&str],
        seed: u64,
    ) -> Result<Option<Continuation>> {
        let _ = (question, written, stop, seed);
        Ok(None)
    }

    /// A batch that decodes many asks together and keeps its cache between calls, where the
    /// policy can (a local model on the packed engine); `None` (the default) where each ask is
    /// its own call (the caller then asks them one by one, several at once).
    fn batch(&self) -> Option<Box<dyn PolicyBatch + '_>> {
        None
    }

    /// `n` completions to the end, each as the list of its remaining steps.
    fn complete(&self, question: &str, prefix: &[&str], n: usize, seed: u64) -> Result<Vec<Vec<String>>> {
        Ok(self
            .continue_from(question, prefix, n, Until::End, seed)?
            .into_iter()
            .map(|c| c.steps)
            .collect())
    }
}

/// Every ask's continuations, handed to `sink` in the asks' order: on the policy's batch
/// ([`Policy::batch`]) `together` asks a call, else `threads` [`Policy::continue_from`] calls at
/// once (a server's requests in flight). An ask's error goes to `sink` with it; an error `sink`
/// returns stops the rest and is returned.
pub fn continue_each(
    policy: &dyn Policy,
    asks: &[NextSteps<'_>],
    until: Until,
    (together, threads): (usize, usize),
    mut sink: impl FnMut(usize, Result<Vec<Continuation>>) -> Result<()>,
) -> Result<()> {
    match policy.batch() {
        Some(mut batch) => {
            let mut at = 0;
            for chunk in asks.chunks(together.max(1)) {
                for out in batch.continue_all(chunk, until) {
                    sink(at, out)?;
                    at += 1;
                }
            }
            Ok(())
        }
        None => {
            let indexed: Vec<(usize, &NextSteps<'_>)> = asks.iter().enumerate().collect();
            crate::parallel::in_order(
                &indexed,
                threads,
                |(_, a)| policy.continue_from(a.question, a.prefix, a.n, until, a.seed),
                |(i, _), out| sink(*i, out),
            )
        }
    }
}

/// Split generated text into steps at `separator`, dropping blank ones and trailing whitespace.
/// After a separator that ends a line (`"\n"`, `"\n\n"`) a step keeps its leading spaces and
/// tabs, which are indentation (a line of code needs it) and make the steps joined by the
/// separator give back the text; after an inline separator (the lab's `"|"`) they are spacing,
/// and dropped.
pub fn split_steps_at(text: &str, separator: &str) -> Vec<String> {
    let lines = separator.ends_with('\n');
    text.split(separator)
        .map(|s| {
            if lines {
                s.trim_end().trim_start_matches(['\n', '\r'])
            } else {
                s.trim()
            }
        })
        .filter(|s| !s.trim().is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::split_steps_at;

    #[test]
    fn lines_keep_their_indentation_and_inline_steps_are_trimmed() {
        let code = "    for x in xs:\n        total += x\n\n    return total\n";
        assert_eq!(
            split_steps_at(code, "\n"),
            ["    for x in xs:", "        total += x", "    return total"]
        );
        assert_eq!(split_steps_at("a\n\n b \n\n\nc", "\n\n"), ["a", " b", "c"]);
        assert_eq!(
            split_steps_at("5 * 3 = 15| 15 - 2 = 13 |", "|"),
            ["5 * 3 = 15", "15 - 2 = 13"]
        );
    }
}
