use anyhow::{Context, Result};
use std::path::PathBuf;
use std::time::Instant;
use stepwise_core::seams::{continue_each, Continuation, NextSteps, Until};
use stepwise_core::steps::SplitStrategy;
use stepwise_core::{Format, Policy, Problem, Solution, SolutionWriter, Step};
use stepwise_model::Prompt;
use stepwise_remote::Client;

/// Problems whose samples a local engine that batches ([`Policy::batch`]) decodes together: each
/// decoding step reads the weights once for all their rows (8 samples: 256 rows).
const SAMPLED_TOGETHER: usize = 32;

/// Sample solutions from a policy.
#[derive(clap::Args)]
#[command(
    after_help = "Input: JSONL records with `question` (or `problem`), optional `id` and a gold answer in \
`gold_answer` or `answer` (GSM8K's `#### N` is understood). Output: one stepwise Solution per sample, split into \
steps, with `final_answer` extracted and `correct` graded when a gold answer is known (lenient grader). The prompt is \
the question and a newline (or the question in the chat template with --chat), as `stepwise annotate` continues it; it \
is encoded once and its KV cache shared by the n samples. On a GPU, and on the CPU for a pretrained policy held in \
bf16 (hidden size 512 or more; the packed engine), 32 problems' samples are decoded together, a pass a token for \
all their rows; the draws are the ones each problem gets alone.

--model may be a server instead (vLLM, SGLang, llama.cpp, `stepwise serve`): its URL, several comma-separated \
serving the same model, or a file listing them (one a line; read again as it changes, so servers added join); the \
requests are spread over them, retried when a server fails, and moved off a server that dies or hangs. Each request \
carries the seed, so the samples do not depend on which server answered. Problems are asked --threads at a time \
(default: one for a checkpoint that does not batch, --max-in-flight for each server), and written in the input's order. The \
--output is a journal: a run cut off (even by kill -9) and started again samples only the problems it lacks, and \
the records equal an uninterrupted run's (a .parquet or .json output is kept as OUTPUT.partial.jsonl until the \
run ends, then written; stdout, the default, is streamed).

Examples:
  stepwise generate --model fixtures/hf-tiny/qwen2-policy --input problems.jsonl -n 8 \\
      --output samples.jsonl
  stepwise generate --model http://gpu1:8000,http://gpu2:8000 --input problems.jsonl -n 8 \\
      --output samples.jsonl
  stepwise generate --model servers.txt --threads 1024 --input problems.jsonl -n 8 \\
      --output samples.jsonl
  stepwise generate --model POLICY --task code --input HumanEval.jsonl -n 10 \\
      --output code-samples.jsonl

With --task code the input is HumanEval's or MBPP's JSONL: the prompt is the problem's (HumanEval: the function's \
signature and docstring, which the samples continue), completions stop where top-level code starts (the Codex \
paper's stop strings, unless --stop is given), the steps are the lines, and `correct` says whether the problem's \
tests passed in the sandbox. `stepwise grade --task code` reports pass@k."
)]
pub struct Args {
    /// Policy checkpoint folder, Hugging Face model id, PEFT LoRA adapter (merged onto its base
    /// once), or server URL(s).
    #[arg(long, value_parser = super::backend::source)]
    pub model: super::backend::Source,
    /// Problems (JSONL).
    #[arg(long)]
    pub input: PathBuf,
    /// Output solutions (stepwise JSONL).
    #[arg(long, default_value = "-")]
    pub output: PathBuf,
    /// Samples per problem.
    #[arg(short, default_value_t = 4)]
    pub n: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.7)]
    pub temperature: f32,
    /// Nucleus mass.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Top-k (0 = off; local policies only).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Most new tokens per sample (default: what the model's context leaves after the prompt,
    /// as vLLM's default; a server is asked with `max_tokens: null`).
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop strings (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Step splitting: blank-line, newline, step-marker or tag:TAG (--task code: always lines,
    /// with their indentation).
    #[arg(long, default_value = "newline")]
    pub split: SplitStrategy,
    /// Wrap the question in the tokenizer's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Which task grades the samples (math answers, or code run against tests).
    #[command(flatten)]
    pub task: super::task::TaskArgs,
    /// Where local models run, how served ones are reached, what they compute in.
    #[command(flatten)]
    pub models: super::backend::ModelArgs,
    /// Problems asked at once (default: one for a checkpoint, which samples the n of a problem
    /// in one batch; --max-in-flight for each server).
    #[arg(long)]
    pub threads: Option<usize>,
}

pub fn run(a: Args) -> Result<()> {
    stepwise_core::io::refuse_same_file(&a.input, &a.output)?;
    let task = a.task.open(Some(&a.input))?;
    let problems = a.task.problems(&*task, &a.input)?;
    let mut stop = a.stop.clone();
    if stop.is_empty() {
        stop = a.task.stops();
    }
    let backend = a.models.open_policy(&a.model)?;
    let prompt = if a.chat { Prompt::Chat } else { Prompt::Text };
    let policy: Box<dyn Policy + '_> = match &backend {
        super::backend::PolicyBackend::Local(loaded) => {
            let mut policy = loaded.policy(a.temperature, a.max_tokens.unwrap_or(usize::MAX), prompt, "\n");
            policy.params.top_p = a.top_p;
            policy.params.top_k = a.top_k;
            policy.params.stop_strings = stop.clone();
            Box::new(policy)
        }
        remote => {
            if a.top_k > 0 {
                anyhow::bail!("--top-k is for local policies (OpenAI's API has no top-k)");
            }
            remote.policy(&stepwise_remote::backend::PolicySettings {
                temperature: a.temperature,
                max_tokens: a.max_tokens,
                prompt,
                top_p: a.top_p,
                stop: stop.clone(),
                ..Default::default()
            })
        }
    };
    let (mut output, problems) = Output::open(&a, &stop, problems)?;
    let bar = crate::progress::bar(None, "generating");
    let start = Instant::now();
    let mut new_tokens = 0usize;
    let threads = a.threads.unwrap_or(backend.client().map_or(1, Client::concurrency));
    let mut write = |p: &Problem, outs: Result<Vec<Continuation>>| -> Result<()> {
        for (k, out) in outs?.into_iter().enumerate() {
            new_tokens += out.tokens;
            let mut s = Solution {
                id: format!("{}-{k}", p.id),
                problem_id: p.id.clone(),
                question: p.question.clone(),
                steps: a.task.split(&out.text, &a.split).into_iter().map(Step::new).collect(),
                gold_answer: p.gold_answer.clone(),
                generator: Some(a.model.to_string()),
                ..Default::default()
            };
            task.grade_solution(&mut s);
            output.write(&s)?;
            bar.inc(1);
        }
        Ok(())
    };
    // A local engine that batches decodes SAMPLED_TOGETHER problems' samples together; else
    // `threads` problems are asked at a time.
    let asks: Vec<NextSteps> = (problems.iter())
        .map(|p| NextSteps {
            question: &p.question,
            prefix: &[],
            n: a.n,
            seed: a.seed,
        })
        .collect();
    continue_each(&*policy, &asks, Until::End, (SAMPLED_TOGETHER, threads), |i, outs| {
        write(&problems[i], outs)
    })?;
    output.finish()?;
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "generated {new_tokens} tokens in {secs:.1}s ({:.0} tokens/s){}",
        new_tokens as f64 / secs,
        stepwise_remote::backend::servers_summary(&[("policy", backend.client())])
    );
    Ok(())
}

/// Where samples go: a journal ([`stepwise_core::journal::journal_of`]: a `.jsonl` output itself,
/// or beside a Parquet or JSON output that is written from it at the end), so a run cut off,
/// even by `kill -9`, resumes with the problems it lacks, and the records equal an
/// uninterrupted run's, as each request carries the seed; stdout is streamed.
enum Output {
    Journal {
        journal: stepwise_core::journal::Journal,
        /// Held while the run writes (no other process writes the output meanwhile).
        _claim: stepwise_core::journal::Claim,
        /// The output written whole from the journal at the end, and the ids in their order.
        whole: Option<(PathBuf, Vec<String>)>,
    },
    Writer(Box<SolutionWriter>),
}

impl Output {
    /// The output, and the problems still to sample.
    fn open(a: &Args, stop: &[String], problems: Vec<Problem>) -> Result<(Self, Vec<Problem>)> {
        let Some(path) = stepwise_core::journal::journal_of(&a.output) else {
            return Ok((
                Output::Writer(Box::new(SolutionWriter::create(&a.output, Format::Stepwise)?)),
                problems,
            ));
        };
        stepwise_core::io::check_output_name(&a.output)?;
        let claim = stepwise_core::journal::claim(
            &path,
            &serde_json::json!({
                "input": stepwise_core::journal::fingerprint(&problems)?, "model": a.model.identity()?,
                "n": a.n, "temperature": a.temperature, "top_p": a.top_p, "top_k": a.top_k,
                "max_tokens": a.max_tokens, "seed": a.seed, "stop": stop, "split": format!("{:?}", a.split),
                "chat": a.chat, "task": a.task.identity(Some(&a.input))?,
            }),
        )?;
        let (journal, _) = stepwise_core::journal::Journal::open::<Solution>(&path, |s| s.id.clone())?;
        let whole = stepwise_core::journal::is_written_whole(&a.output).then(|| {
            let ids = problems
                .iter()
                .flat_map(|p| (0..a.n).map(move |k| format!("{}-{k}", p.id)));
            (a.output.clone(), ids.collect())
        });
        let todo: Vec<Problem> = problems
            .into_iter()
            .filter(|p| (0..a.n).any(|k| !journal.contains(&format!("{}-{k}", p.id))))
            .collect();
        Ok((
            Output::Journal {
                journal,
                _claim: claim,
                whole,
            },
            todo,
        ))
    }

    fn write(&mut self, s: &Solution) -> Result<()> {
        match self {
            Output::Journal { journal, .. } if journal.contains(&s.id) => Ok(()),
            Output::Journal { journal, .. } => journal.append(s.id.clone(), s),
            Output::Writer(w) => Ok(w.write(s)?),
        }
    }

    /// Write the output where it is written whole (from its journal, in the input's order).
    fn finish(self) -> Result<()> {
        match self {
            Output::Journal {
                journal,
                _claim,
                whole: Some((output, ids)),
            } => {
                drop(journal);
                let path = stepwise_core::journal::journal_of(&output).context("a journal")?;
                let (_, mut records) = stepwise_core::journal::Journal::open::<Solution>(&path, |s| s.id.clone())?;
                stepwise_core::journal::sort_like(&mut records, ids.iter().map(String::as_str), |s| &s.id);
                stepwise_core::journal::finish_partial(&output, &records)
            }
            Output::Journal { .. } => Ok(()),
            Output::Writer(w) => Ok(w.finish()?),
        }
    }
}
