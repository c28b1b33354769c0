use anyhow::{bail, Result};
use std::path::PathBuf;
use stepwise_core::seams::OnError;
use stepwise_core::{Format, Solution};
use stepwise_label::methods::{judge_format, Settings};
use stepwise_label::{annotate_resumable_with, Annotators, Method, ANNOTATE_ERROR};
use stepwise_model::Prompt;
use stepwise_remote::backend::PolicySettings;

/// Label steps automatically by Monte Carlo rollouts (Math-Shepherd) or by binary search for the
/// first error (OmegaPRM).
#[derive(clap::Args)]
#[command(
    after_help = "For each step i of each solution, the policy completes the solution K times from the \
prefix ending at step i; the soft label is the fraction of completions whose final answer grades equal to the \
solution's `gold_answer` (lenient grader), the hard label is \"any did\". Labelling stops at the first step no \
rollout rescues: later steps are bad without spending rollouts. Each labelled solution is appended to --output as \
soon as it is done; run the same command again after an interruption and it continues where it stopped, with the \
same records an uninterrupted run writes. Train on the result with `stepwise train-prm` (soft labels: BCE).

--method binary-search (OmegaPRM) finds the first error of a wrong solution by bisection: roll out K times from \
the middle of the steps still in doubt; if any rollout reaches the gold answer the first error lies after it, else \
at or before it. It takes ceil(log2 T) rollout batches for T steps where mc takes up to T, and gives hard labels \
(good before the first error, bad from it on); a solution with the right answer is all good and costs nothing.

--method omegaprm runs that bisection over one rollout tree per problem (OmegaPRM with its MCTS): a problem's \
solutions and every rollout share one tree of step prefixes, so a prefix probed for one solution (or lying on a \
rollout that reached the gold answer) is not rolled out again for another. The given wrong solutions are searched \
in the order MCTS prefers (Q + U: alpha 0.5, beta 0.9, L 500, c_puct 0.125, the paper's constants), then \
--search-limit more searches over the tree's own wrong rollouts. Every completed rollout is written to --output as \
a new labelled solution (`meta.omegaprm_rollout`); `stepwise convert --to omegaprm-tree` writes the trees. Steps \
whose prefix has rollouts of its own carry their Monte Carlo value.

--method judge asks --judge (a checkpoint folder, cached model id or server URL; an instruct model, with --judge-chat) \
ProcessBench's critique question --judge-samples times and takes the most frequent index of the earliest wrong \
paragraph (\\boxed{k}, -1 for none); answers without a readable verdict do not vote, and a solution with no verdict \
stays unlabelled. --judge-format index asks a judge fine-tuned to write that index right after a solution (the \
lab's generative verifier: `stepwise lab` leaves it in RUN/judge) with the question and steps laid out as for \
the policy, and reads a bare index; --judge-format quote reads the first wrong step copied out instead. With --judge-verdict likelihood (index or quote) nothing is sampled: the judge's verdict is the one whose answer it gives the highest probability right after the solution (from a server, read from the answer's tokens' log-probabilities with `echo`, as vLLM and `stepwise serve` give them; --server-tokenizer needed). --method consensus labels by mc and by the judge and keeps a solution's (mc) labels only when both \
put the first error on the same step (the Qwen2.5-Math-PRM recipe); the retained fraction is reported.

--task code labels the lines of programs by execution: a rollout is the rest of the function, and it is right when \
the problem's tests pass in the sandbox (python3 with time, memory, file, process and network limits). The input \
may be HumanEval's or MBPP's JSONL itself (the reference solutions, one line a step) or solutions whose `gold_answer` \
is their problem's id, with --problems naming the problems' file.

Example:
  stepwise generate --model POLICY --input problems.jsonl -n 4 --output samples.jsonl
  stepwise annotate --policy POLICY --input samples.jsonl --rollouts 8 --output labeled.jsonl
  stepwise annotate --policy POLICY --method binary-search --input samples.jsonl --rollouts 8 \\
      --output bs.jsonl
  stepwise annotate --policy POLICY --method consensus --judge http://vllm:8000 --judge-chat \\
      --input samples.jsonl --output consensus.jsonl
  stepwise annotate --policy POLICY --task code --input code-samples.jsonl \\
      --problems HumanEval.jsonl --output code.jsonl"
)]
pub struct Args {
    /// Policy that completes the prefixes: checkpoint folder, cached Hugging Face model id, or
    /// server URL(s) (comma-separated: the rollouts are spread over them).
    #[arg(long, value_parser = super::backend::source)]
    pub policy: super::backend::Source,
    /// Solutions to label (any format; each needs a gold answer).
    #[arg(long)]
    pub input: PathBuf,
    /// Labelled solutions (stepwise JSONL, appended and resumed).
    #[arg(long)]
    pub output: PathBuf,
    /// How steps are labelled: `mc` (rollouts from every step prefix: soft and hard labels),
    /// `binary-search` (the first error by bisection: hard labels), `omegaprm` (OmegaPRM's
    /// rollout tree per problem, searched by MCTS), `judge` (a model asked for the first wrong
    /// step) or `consensus` (mc labels kept where the judge agrees on the first error).
    #[arg(long, default_value = "mc", value_parser = method_arg())]
    pub method: Method,
    /// --method omegaprm: searches over each problem's tree of new rollouts after its given
    /// solutions' (0: label only the given solutions; the probes' rollouts are still kept).
    #[arg(long, default_value_t = 0)]
    pub search_limit: usize,
    /// The judge of --method judge and consensus: checkpoint folder, cached model id or server
    /// URL(s).
    #[arg(long, value_parser = super::backend::source)]
    pub judge: Option<super::backend::Source>,
    /// Answers sampled from the judge per solution (the most frequent verdict wins).
    #[arg(long, default_value_t = 4)]
    pub judge_samples: usize,
    /// How the judge's verdict is reached: `votes` (the most frequent of --judge-samples sampled
    /// answers) or `likelihood` (the verdict whose answer the judge gives the highest
    /// probability, read in one forward pass, nothing sampled; --judge-format index or quote;
    /// from a server, --server-tokenizer).
    #[arg(long, default_value = "votes", value_parser = ["votes", "likelihood"])]
    pub judge_verdict: String,
    /// Ask the judge through its chat template (instruct models).
    #[arg(long)]
    pub judge_chat: bool,
    /// How the judge is asked: `critique` (ProcessBench's critique prompt, answer in
    /// \boxed{k}), `index` (the question and steps as the policy's prompt and pieces, split
    /// by --separator; the answer a bare index, -1 for none) or `quote` (asked as `index`; the
    /// answer the first wrong step copied out, -1 for none).
    #[arg(long, default_value = "critique", value_parser = ["critique", "index", "quote"])]
    pub judge_format: String,
    /// Rollouts per step prefix.
    #[arg(long, default_value_t = 8)]
    pub rollouts: usize,
    /// How the rollouts are sampled.
    #[command(flatten)]
    pub sampling: super::SamplingArgs,
    /// Wrap the question in the tokenizer's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Seed (each solution and step derives its own).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Input format (detected when omitted).
    #[arg(long)]
    pub from: Option<Format>,
    /// Which task grades the rollouts (math answers, or code run against tests).
    #[command(flatten)]
    pub task: super::task::TaskArgs,
    /// Solutions labelled at once (default: one per core; raise it for a policy on servers,
    /// whose requests then run in parallel).
    #[arg(long)]
    pub threads: Option<usize>,
    /// A solution whose labelling fails (no gold answer, longer than the policy reads): `raise`
    /// stops naming it, the solutions labelled before it kept in --output; `skip` writes it
    /// unlabelled, the reason in its `meta.annotate_error`, and goes on. A server that still
    /// fails after its retries stops the run either way.
    #[arg(long, value_enum, default_value = "raise")]
    pub on_error: super::score::OnErrorArg,
    /// Where local models run, how served ones are reached, what they compute in.
    #[command(flatten)]
    pub models: super::backend::ModelArgs,
}

pub fn run(a: Args) -> Result<()> {
    super::resumable_output(&a.input, &a.output)?;
    if a.judge_verdict == "likelihood" {
        if a.judge_format == "critique" {
            bail!("--judge-verdict likelihood weighs fixed answers: use --judge-format index or quote (a critique is free text)");
        }
        if let Some(judge) = &a.judge {
            super::backend::check_weighable(judge, &a.models.remote, "--judge-verdict likelihood")?;
        }
    }
    let sols: Vec<Solution> = stepwise_core::io::read_solution_set(&a.input, a.from)?;
    let on_error: OnError = a.on_error.into();
    let missing = sols.iter().enumerate().find(|(_, s)| s.gold_answer.is_none());
    if let (Some((i, s)), OnError::Raise) = (missing, on_error) {
        bail!(
            "{}: record {} (`{}`): field `gold_answer`: missing",
            a.input.display(),
            i + 1,
            s.id
        );
    }
    // One process per output, and only the settings it was started with.
    let _claim = stepwise_core::journal::claim(
        &a.output,
        &serde_json::json!({
            "input": stepwise_core::journal::fingerprint(&sols)?,
            "policy": a.policy.identity()?, "method": a.method.name(),
            "judge": a.judge.as_ref().map(|j| j.identity()).transpose()?, "judge_samples": a.judge_samples,
            "judge_verdict": a.judge_verdict, "judge_chat": a.judge_chat, "judge_format": a.judge_format, "rollouts": a.rollouts, "search_limit": a.search_limit, "temperature": a.sampling.temperature,
            "max_tokens": a.sampling.max_tokens, "separator": a.sampling.separator, "chat": a.chat, "seed": a.seed,
            "task": a.task.identity(Some(&a.input))?,
        }),
    )?;
    let backend = a.models.open_policy(&a.policy)?;
    let prompt = if a.chat { Prompt::Chat } else { Prompt::Text };
    let policy = backend.policy(&PolicySettings {
        stop: a.task.stops(),
        ..a.sampling.settings(prompt)
    });
    let task = a.task.open(Some(&a.input))?;
    let method = a.method;
    let judge_backend = match (&a.judge, method.needs_judge()) {
        (Some(j), _) => Some(a.models.open_policy(j)?),
        (None, true) => bail!("--method {} needs --judge (a model to ask)", method.name()),
        (None, false) => None,
    };
    let (format, own_separator) = judge_format(&a.judge_format)?;
    let separator = if own_separator {
        a.sampling.separator.as_str()
    } else {
        "\n"
    };
    let judge_policy = judge_backend.as_ref().map(|b| {
        let prompt = if a.judge_chat { Prompt::Chat } else { Prompt::Text };
        b.policy(&PolicySettings {
            separator: separator.into(),
            ..a.sampling.settings(prompt)
        })
    });
    let settings = Settings {
        rollouts: a.rollouts,
        seed: a.seed,
        search_limit: a.search_limit,
        judge_samples: a.judge_samples,
        judge_likelihood: a.judge_verdict == "likelihood",
    };
    let annotators = Annotators::new(
        method,
        &*policy,
        &*task,
        &settings,
        judge_policy.as_ref().map(|p| (&**p, format)),
    )?;
    let annotator = annotators.get();
    let bar = crate::progress::bar(Some(sols.len() as u64), "annotating");
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let (labelled, spent) = annotate_resumable_with(&a.output, &sols, &*annotator, threads, on_error, |done| {
        bar.set_position(done as u64)
    })?;
    bar.finish_and_clear();
    let retried = stepwise_remote::backend::servers_summary(&[("policy", backend.client())]);
    summarise(&a, &labelled, spent, &retried)?;
    Ok(())
}

/// What the run did, on stderr: solutions labelled and skipped, the trees' new solutions,
/// consensus kept, rollouts and tokens spent.
fn summarise(a: &Args, labelled: &[Solution], spent: stepwise_core::seams::Spent, retried: &str) -> Result<()> {
    let skipped = labelled.iter().filter(|s| s.meta.contains_key(ANNOTATE_ERROR)).count();
    if skipped > 0 {
        eprintln!(
            "{skipped} solutions could not be labelled and were written unlabelled (the reason in meta.annotate_error)"
        );
    }
    let steps: usize = labelled.iter().map(|s| s.steps.len()).sum();
    if a.method == Method::OmegaPrm {
        let all = std::fs::read_to_string(&a.output)?.lines().count();
        eprintln!(
            "omegaprm: {} new solutions from the trees' rollouts written beside the {} given",
            all.saturating_sub(labelled.len()),
            labelled.len()
        );
    }
    if a.method == Method::Consensus {
        let kept = labelled
            .iter()
            .filter(|s| s.meta.get("consensus") == Some(&true.into()))
            .count();
        eprintln!(
            "consensus: the annotators agree on {kept} of {} solutions ({:.1}% retained)",
            labelled.len(),
            100.0 * kept as f64 / labelled.len().max(1) as f64
        );
    }
    eprintln!(
        "labelled {} solutions ({steps} steps) with {} rollouts ({} tokens){retried}; {}",
        labelled.len(),
        spent.rollouts,
        spent.tokens,
        a.output.display()
    );
    Ok(())
}

/// `--method`: one of [`Method::NAMES`], parsed into the method (its names listed in `--help`).
fn method_arg() -> impl clap::builder::TypedValueParser<Value = Method> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(Method::NAMES)
        .try_map(|name: String| Method::by_name(&name).map_err(|e| e.to_string()))
}
