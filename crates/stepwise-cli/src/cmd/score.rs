use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::time::Instant;
use stepwise_core::seams::{apply_outcome, score_in_order, OnError, ScoreFailure};
use stepwise_core::{Format, Solution, SolutionWriter};

/// Score every step of every solution with a PRM, or with a generative verifier.
#[derive(clap::Args)]
#[command(
    after_help = "Layouts (detected from config.json and the tokenizer when --layout is auto):
  qwen-prm    Qwen2.5-Math-PRM: chat template, steps joined by <extra_0>, softmax class 1 there
  step-tag    Math-Shepherd / RLHFlow: `problem step ки\\n ...`, P(+) over {+,-} at each ки
  token-cls   TRL PRMTrainer output: softmax class 1 on the last token of each step + \"\\n\"
  log-ratio   a folder with reward.json (`stepwise train-prm --head log-ratio`, the lab's
              verifiers):
              sigmoid(β·Σ log π/π_ref) over each step's tokens, against the reference it names

Examples:
  # run again after a kill: it resumes
  stepwise score --model fixtures/hf-tiny/qwen2-prm \\
      --input data/processbench/gsm8k.json --output scored.jsonl
  stepwise score --model orm/ --name orm --input scored.jsonl --output scored2.jsonl
  # stepwise serve --prm
  stepwise score --model http://gpu1:8000 --input steps.jsonl --output scored.jsonl
  # a fleet: two batches a server
  stepwise score --model servers.txt --batch-size 64 --input steps.jsonl --output scored.jsonl
  # vLLM /pooling
  stepwise score --model http://gpu1:8000 --protocol pooling --layout qwen-prm \\
      --server-tokenizer PRM_DIR --input steps.jsonl --output scored.jsonl
  stepwise score --verifier generative --model http://vllm:8000 --chat --samples 8 --name thinkprm \\
      --input steps.jsonl --output scored.jsonl                              # ThinkPRM-style chains

--verifier generative: the model (any policy: a checkpoint or a server) is asked to verify the solution one step at \
a time, each step ending in \\boxed{correct} or \\boxed{incorrect}, and to stop at the first incorrect one; --samples \
chains are drawn per solution and a step's score is the mean over the chains of its verdict: with a local \
checkpoint, the probability P(correct) / (P(correct) + P(incorrect)) the verifier gives the verdict word after \
\\boxed{ (--verdict likelihood); from a server, or with --verdict votes, 1 or 0 as the chain wrote it (the share of \
chains that call it correct). In a chain every step after its first incorrect one counts as incorrect; a step no \
chain reaches scores 0.5. The scores land under --name like a PRM's, so bon, search and eval take them.

--verifier judge: the model is a judge fine-tuned to write, right after a solution laid out as the policy's steps \
(split by --separator), the index of the first wrong step (-1 for none; --judge-format quote: the step copied out), \
as the lab's judge is (`stepwise lab` leaves it in RUN/judge). A step's score is the probability of the verdicts \
that put the first error after it: with --verdict likelihood, the probability the judge gives each verdict's \
answer, read in one forward pass (nothing sampled; from a server, each answer is sent after the solution with \
`echo` and `logprobs` and its tokens' log-probabilities summed: vLLM and `stepwise serve` give them, and \
--server-tokenizer is needed to end each answer with the end of text); with --verdict votes, the share of \
--samples sampled answers. For the lab's judge: `stepwise score --verifier judge --model RUN/judge --separator ' | ' \
--input RUN/scored_eval.jsonl --output s.jsonl --name judge_likelihood` gives the lab's own scores."
)]
pub struct Args {
    /// Checkpoint folder (config.json, model.safetensors, tokenizer.json), a Hugging Face model
    /// id (ORG/NAME[@REVISION]) found in the local cache (HF_HUB_CACHE, HF_HOME) or downloaded
    /// into it, a PEFT LoRA adapter (folder or id: merged onto its base once, kept in
    /// STEPWISE_CACHE), server URL(s), or a file listing servers (a fleet: docs/scale.md).
    #[arg(long, value_parser = super::backend::source)]
    pub model: super::backend::Source,
    /// Solutions in any format stepwise reads.
    #[arg(long)]
    pub input: PathBuf,
    /// Output: stepwise JSONL (or .parquet, .json; `-` for stdout) with the step scores in
    /// `scores.NAME`. Solutions are appended as they are scored, in input order (to the .jsonl
    /// output itself, or to OUTPUT.partial.jsonl beside a .parquet or .json one, written when the
    /// run ends): run the same command again after an interruption (even `kill -9`) and it scores
    /// only the rest; one started with other settings (model, name, input) is refused.
    #[arg(long)]
    pub output: PathBuf,
    /// The verifier's name in the output's `scores` (e.g. `prm`, `orm`): several verifiers can
    /// score one file in turn, and `stepwise bon` reads them by name.
    #[arg(long, default_value = "prm")]
    pub name: String,
    /// PRM layout: auto, qwen-prm, step-tag, token-cls or log-ratio.
    #[arg(long, default_value = "auto")]
    pub layout: String,
    /// Solutions handed to the scorer at once (a local PRM packs them into forward passes of at
    /// most --max-batch-tokens tokens; a server gets them as one request, two requests in flight
    /// to each server of a fleet).
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// Input format (detected when omitted).
    #[arg(long)]
    pub from: Option<Format>,
    /// A solution the verifier cannot score (longer than the model reads, say): `raise` stops
    /// with an error naming it, the solutions before it written to --output; `skip` leaves it
    /// unscored, the reason in its `meta.score_errors.NAME`, and goes on.
    #[arg(long, value_enum, default_value = "raise")]
    pub on_error: OnErrorArg,
    /// Where a local verifier runs, how one given by URL is reached, what it computes in.
    #[command(flatten)]
    pub models: super::backend::ModelArgs,
    /// prm: --model is a PRM or ORM (any layout). generative: --model writes a verification
    /// chain per solution with a verdict per step. judge: --model answers right after a
    /// solution with its first wrong step (see below).
    #[arg(long, value_enum, default_value = "prm")]
    pub verifier: VerifierKind,
    /// --verifier generative: chains sampled per solution; judge: answers sampled per solution
    /// (with --verdict votes).
    #[arg(long, default_value_t = 4)]
    pub samples: usize,
    /// --verifier judge: what the judge writes after a solution, `index` (the first wrong step's
    /// index, -1 for none) or `quote` (the first wrong step copied out).
    #[arg(long, default_value = "index", value_parser = ["index", "quote"])]
    pub judge_format: String,
    /// --verifier judge: text between the steps as the judge reads them (the lab's: " | ").
    #[arg(long, default_value = "\n")]
    pub separator: String,
    /// --verifier generative or judge: seed of the sampled chains or answers.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// --verifier generative: ask through the tokenizer's chat template (instruct models).
    #[arg(long)]
    pub chat: bool,
    /// --verifier generative: sampling temperature of the chains.
    #[arg(long, default_value_t = 0.7)]
    pub temperature: f32,
    /// --verifier generative: most tokens per chain.
    #[arg(long, default_value_t = 1024)]
    pub max_tokens: usize,
    /// --verifier generative or judge: how a verdict counts (likelihood: its probability, where
    /// the model gives log-probabilities; votes: 1 or 0 as sampled). A judge weighed by
    /// likelihood samples nothing; from a server it needs --server-tokenizer.
    #[arg(long, value_enum, default_value = "likelihood")]
    pub verdict: Verdict,
    /// --verifier generative: tools the chains may call. `python`: a chain may check a step by
    /// writing a ```python block; generation stops after it, the code runs in the sandbox of
    /// `--task code` (after the chain's earlier blocks), its output is put in the chain as
    /// GenPRM's executor puts it (`[Code Output]`), and the chain goes on (at most 8 blocks).
    /// Needs a local checkpoint or a completions server, and python3 (or STEPWISE_PYTHON).
    #[arg(long, value_enum, default_value = "none")]
    pub tools: Tools,
    /// --tools python: run the chains' code on these sandbox servers instead of here
    /// (`stepwise serve --sandbox`, or SandboxFusion; comma-separated, least busy first, failed
    /// requests retried on the others).
    #[arg(long, value_delimiter = ',', value_name = "URL")]
    pub sandbox_url: Vec<String>,
}

/// `--on-error`: what scoring does with a solution it cannot score.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnErrorArg {
    /// Stop, naming the solution; those before it are written.
    Raise,
    /// Leave it unscored (the reason in its meta) and go on.
    Skip,
}

impl From<OnErrorArg> for OnError {
    fn from(a: OnErrorArg) -> Self {
        match a {
            OnErrorArg::Raise => OnError::Raise,
            OnErrorArg::Skip => OnError::Skip,
        }
    }
}

/// Tools a generative verifier's chains may call.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tools {
    /// None: each chain is written in one go.
    None,
    /// Python code blocks, run in the sandbox (GenPRM's code verification).
    Python,
}

/// How a generative verifier's verdict on a step counts.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The verdict word's probability, P(correct) / (P(correct) + P(incorrect)), where the model
    /// gives log-probabilities (a local checkpoint); else as `votes`.
    Likelihood,
    /// 1 for `\boxed{correct}`, 0 for `\boxed{incorrect}`, as the chain was sampled.
    Votes,
}

/// What kind of verifier `--model` is.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerifierKind {
    /// A PRM or ORM of any layout (a score head, or a log-ratio verifier).
    Prm,
    /// A model that writes a verification chain with a verdict per step (ThinkPRM, GenPRM).
    Generative,
    /// A judge fine-tuned to answer right after a solution with its first wrong step (the
    /// lab's generative verifier: `--judge-format index` or `quote`).
    Judge,
}

pub fn run(a: Args) -> Result<()> {
    stepwise_core::io::refuse_same_file(&a.input, &a.output)?;
    if a.verifier == VerifierKind::Judge && a.verdict == Verdict::Likelihood {
        super::backend::check_weighable(&a.model, &a.models.remote, "--verifier judge --verdict likelihood")?;
    }
    // The output is claimed (or refused) before any model is loaded.
    let sols: Vec<Solution> = stepwise_core::io::read_solution_set(&a.input, a.from)?;
    let mut out = Output::open(&a, &sols)?;
    let (scorer_backend, policy_backend, prm_scorer, policy, generative, judge, sandbox);
    let servers;
    let scorer: &dyn stepwise_core::StepScorer = match a.verifier {
        VerifierKind::Prm => {
            scorer_backend = a.models.open_scorer(&a.model, &a.layout)?;
            servers = scorer_backend.client();
            prm_scorer = scorer_backend.scorer();
            &*prm_scorer
        }
        VerifierKind::Generative | VerifierKind::Judge => {
            policy_backend = a.models.open_policy(&a.model)?;
            servers = policy_backend.client();
            policy = policy_backend.policy(&verifier_settings(&a));
            let likelihood = a.verdict == Verdict::Likelihood;
            if a.verifier == VerifierKind::Judge {
                judge = stepwise_label::Judge {
                    policy: &*policy,
                    samples: a.samples,
                    seed: a.seed,
                    format: stepwise_label::methods::judge_format(&a.judge_format)?.0,
                    likelihood,
                };
                &judge
            } else {
                sandbox = sandbox_of(&a)?;
                generative = stepwise_label::GenerativeVerifier {
                    policy: &*policy,
                    samples: a.samples,
                    seed: a.seed,
                    likelihood,
                    tools: sandbox.as_deref(),
                };
                &generative
            }
        }
    };
    let resumed = out.resumed();
    let todo = &sols[resumed..];
    let bar = crate::progress::bar(Some(sols.len() as u64), "scoring");
    bar.set_position(resumed as u64);
    let start = Instant::now();
    let scored = score_in_order(scorer, todo, a.batch_size, a.on_error.into(), |i, outcome| {
        let mut s = todo[i].clone();
        apply_outcome(&mut s, &a.name, outcome);
        out.push(s)?;
        bar.set_position((resumed + i + 1) as u64);
        Ok(())
    });
    bar.finish_and_clear();
    let run = match scored {
        Ok(run) => run,
        Err(e) => {
            let Some(failure) = e.downcast_ref::<ScoreFailure>() else {
                return Err(e);
            };
            let before = resumed + failure.index;
            let written = match out.journal(&a.output) {
                // Kept where a run with the same settings goes on from.
                Some(journal) => format!(
                    "the {before} solutions before it are in {} (--on-error skip scores the rest, going on from there)",
                    journal.display()
                ),
                None => {
                    out.finish(&a.output, &sols)?;
                    format!(
                        "the {before} solutions before it are in {} (--on-error skip scores the rest)",
                        a.output.display()
                    )
                }
            };
            return Err(e.context(written));
        }
    };
    out.finish(&a.output, &sols)?;
    report(&a, &run, start.elapsed().as_secs_f64(), resumed, todo, servers);
    Ok(())
}

/// How a generative verifier or a judge is asked: a judge (`--verifier judge`) sees the
/// solution as the policy's steps, split by `--separator`; a chain verifier the question alone
/// (through the chat template with `--chat`).
fn verifier_settings(a: &Args) -> stepwise_remote::backend::PolicySettings {
    stepwise_remote::backend::PolicySettings {
        temperature: a.temperature,
        max_tokens: Some(a.max_tokens),
        prompt: if a.chat {
            stepwise_model::Prompt::Chat
        } else {
            stepwise_model::Prompt::Text
        },
        separator: a.separator.clone(),
        ..Default::default()
    }
}

/// Where a chain verifier's code runs (`--tools python`): the sandbox servers, or here.
fn sandbox_of(a: &Args) -> Result<Option<Box<dyn stepwise_core::seams::CodeRunner>>> {
    Ok(match a.tools {
        Tools::None => None,
        Tools::Python if !a.sandbox_url.is_empty() => {
            Some(Box::new(stepwise_remote::RemoteSandbox::new(&a.sandbox_url, 10.0)?))
        }
        Tools::Python => Some(Box::new(stepwise_code::Sandbox::new()?)),
    })
}

/// The closing lines: what was scored, how fast, by which servers, and what was skipped.
fn report(
    a: &Args,
    run: &stepwise_core::seams::ScoreRun,
    secs: f64,
    resumed: usize,
    todo: &[Solution],
    servers: Option<&stepwise_remote::Client>,
) {
    let kept = if resumed > 0 {
        format!(" ({resumed} scored before were kept)")
    } else {
        String::new()
    };
    eprintln!(
        "scored {} solutions ({} tokens) in {secs:.1}s: {:.0} tokens/s, {:.1} solutions/s{kept}{}",
        run.scored,
        run.tokens,
        run.tokens as f64 / secs,
        run.scored as f64 / secs,
        stepwise_remote::backend::servers_summary(&[("verifier", servers)])
    );
    if let Some(&first) = run.skipped.first() {
        eprintln!(
            "skipped {} solutions it could not score (the reason in each one's meta.score_errors.{}), the first `{}` (record {})",
            run.skipped.len(),
            a.name,
            todo[first].id,
            resumed + first + 1
        );
    }
}

/// Where scored solutions go: a journal ([`stepwise_core::journal::journal_of`]: a `.jsonl`
/// output itself, or beside a Parquet or JSON output that is written from it at the end),
/// appended to as solutions are scored (in input order), so a run cut off (even by `kill -9`, or
/// a fleet down past its retries) and started again scores only the rest; stdout is written in
/// one go at the end.
enum Output {
    Journal {
        journal: stepwise_core::journal::Journal,
        resumed: usize,
        /// Held while the run writes.
        _claim: stepwise_core::journal::Claim,
        /// Whether the output is written whole from the journal at the end (Parquet, JSON).
        whole: bool,
    },
    Whole(Vec<Solution>),
}

impl Output {
    fn open(a: &Args, sols: &[Solution]) -> Result<Self> {
        let Some(path) = stepwise_core::journal::journal_of(&a.output) else {
            return Ok(Output::Whole(Vec::new()));
        };
        stepwise_core::io::check_output_name(&a.output)?;
        let generative = (a.verifier != VerifierKind::Prm).then(|| {
            serde_json::json!({"samples": a.samples, "chat": a.chat, "temperature": a.temperature,
                "max_tokens": a.max_tokens, "verdict": format!("{:?}", a.verdict), "tools": format!("{:?}", a.tools),
                "judge_format": (a.verifier == VerifierKind::Judge).then_some(&a.judge_format),
                "separator": a.separator, "seed": a.seed})
        });
        let claim = stepwise_core::journal::claim(
            &path,
            &serde_json::json!({
                "input": stepwise_core::journal::fingerprint(sols)?, "model": a.model.identity()?,
                "name": a.name, "layout": a.layout, "dtype": a.models.dtype.dtype, "generative": generative,
            }),
        )?;
        let (journal, kept) = stepwise_core::journal::open_in_order(&path, sols)?;
        Ok(Output::Journal {
            journal,
            resumed: kept.len(),
            _claim: claim,
            whole: stepwise_core::journal::is_written_whole(&a.output),
        })
    }

    /// Solutions already in the output, scored by an earlier run.
    fn resumed(&self) -> usize {
        match self {
            Output::Journal { resumed, .. } => *resumed,
            Output::Whole(_) => 0,
        }
    }

    /// Where the solutions scored so far are kept, where they are kept as they come.
    fn journal(&self, output: &Path) -> Option<PathBuf> {
        match self {
            Output::Journal { .. } => stepwise_core::journal::journal_of(output),
            Output::Whole(_) => None,
        }
    }

    fn push(&mut self, s: Solution) -> Result<()> {
        match self {
            Output::Journal { journal, .. } => journal.append(s.id.clone(), &s),
            Output::Whole(all) => {
                all.push(s);
                Ok(())
            }
        }
    }

    /// Write what was scored, where it is not written yet: stdout, or an output written whole
    /// from its journal (in the order of `sols`, the input) once every solution is scored.
    fn finish(&mut self, path: &Path, sols: &[Solution]) -> Result<()> {
        match self {
            Output::Journal { whole: true, .. } => {
                let journal = stepwise_core::journal::journal_of(path).context("a journal")?;
                let (_, kept) = stepwise_core::journal::open_in_order(&journal, sols)?;
                stepwise_core::journal::finish_partial(path, &kept)
            }
            Output::Journal { .. } => Ok(()),
            Output::Whole(all) => write_solutions(path, all),
        }
    }
}

fn write_solutions(path: &Path, sols: &[Solution]) -> Result<()> {
    let mut writer = SolutionWriter::create(path, Format::Stepwise)?;
    for s in sols {
        writer.write(s)?;
    }
    Ok(writer.finish()?)
}
