//! `stepwise rl`: parsing and wiring; the run is [`stepwise_rl::run_rl`], which Python's
//! `stepwise.rl` calls too.

use anyhow::{Context, Result};
use std::path::PathBuf;
use stepwise_core::Problem;
use stepwise_rl::trainer::Heldout;
use stepwise_rl::{run_rl, Credit, PrimeConfig, RlConfig, RlJob, RlReward};

/// Optimise a policy by RL against a reward.
#[derive(clap::Args)]
#[command(
    after_help = "Each update samples --group-size solutions for each of --prompts problems with the current policy \\
(prompt KV cache shared), rewards them, normalises the rewards over each group (GRPO) and takes PPO-clip steps \\
(--clip) with a KL penalty (--kl, k3 estimator) to the starting policy. Rewards:
  outcome     1 when the graded final answer equals the problem's gold answer, else 0
  orm:DIR     an outcome model's score of the whole solution (any verifier folder `stepwise score`
              reads)
  prm:DIR     a PRM's score of every step: each step's tokens get that step's advantage (--credit:
              return-to-go = DeepSeekMath's sum of the normalised rewards of the step and every
              later one; min-so-far = the weakest step so far; own = the step's own reward;
              progress = its reward minus the step's before)
  prime       PRIME: the outcome, plus dense token rewards β·log π_φ/π_ref from an implicit PRM that
              starts as the policy and learns online from the samples' outcomes (no step labels;
              --prime-beta, --prime-lr, --prime-filter). Advantages: RLOO on both streams, returns,
              whitened. The implicit PRM is kept in OUT/implicit_prm, a verifier `stepwise score
              --prm` reads
Steps are what the policy writes between --separator texts. Problems: JSONL with `question` (or `problem`) and a \\
gold answer in `gold_answer` or `answer`. Writes the policy to --out in Hugging Face layout every \\
--checkpoint-every updates and at the end (with the optimiser and log), rl_log.jsonl (one line per update) and \\
rl.png/rl.svg (reward, sample accuracy, held-out accuracy with --eval-problems, KL against update); the same command \
on the same --out resumes after an interruption.

--device cuda (a build with --features cuda) trains on the GPU: the packed engine samples from the trainer's own \
bf16 weights (paged KV cache), the reference and a PRM or ORM reward run there too, and the update is the packed \
trainer's (f32 masters, AdamW, the PPO loss's derivative by each token's log-probability taken on the host). \
Log-probabilities and gradients run in packed passes of at most --max-batch-tokens tokens (a larger minibatch in \
several: its loss over all of them, then each pass's backward), so GPU memory follows the budget. \
With --reward prime the implicit PRM trains on the GPU too (a second packed trainer). On the CPU the same packed \
trainer updates a pretrained policy (hidden size 512 or more; --trainer packed|autograd chooses), sampling from its \
own weights on the packed engine's CPU backend; a small policy trains with candle's f32 autograd. On a 2-vCPU \
Xeon with AMX a 0.5B policy takes 10.2 s a steady update of 8 samples of 32 tokens (2.2 s of it sampling) in 15.2 GiB, \
3.1x TRL 1.16's GRPOTrainer on the same update at its best (31.0 s: bf16 weights, torch_compile); autograd was killed \
out of memory at 23.2 GiB (bench/rl_cpu.sh).

Example:
  stepwise rl --policy fixtures/hf-tiny/qwen2-policy --reward outcome \\
      --problems problems.jsonl --updates 20 --out rl-run/"
)]
pub struct Args {
    /// Policy checkpoint folder or Hugging Face model id to start from (also the KL reference),
    /// or a PEFT LoRA adapter's (merged onto its base once).
    #[arg(long, value_parser = super::model_dir)]
    pub policy: PathBuf,
    /// `outcome`, `orm:DIR`, `prm:DIR` or `prime`.
    #[arg(long, default_value = "outcome")]
    pub reward: String,
    /// Problems (JSONL).
    #[arg(long)]
    pub problems: PathBuf,
    /// Output folder (checkpoints, log, plot; resumed when present).
    #[arg(long)]
    pub out: PathBuf,
    /// Policy updates.
    #[arg(long, default_value_t = 100)]
    pub updates: usize,
    /// Prompts per update.
    #[arg(long, default_value_t = 8)]
    pub prompts: usize,
    /// Solutions per prompt (the group).
    #[arg(long, default_value_t = 8)]
    pub group_size: usize,
    /// Micro-batches per optimiser step (gradient accumulation).
    #[arg(long, default_value_t = 1)]
    pub grad_accum: usize,
    /// Per-step credit of process rewards: return-to-go, min-so-far, own or progress.
    #[arg(long, default_value = "return-to-go")]
    pub credit: String,
    /// Most new tokens per solution.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Text between steps (in the prompt and the completions).
    #[arg(long, default_value = "\n")]
    pub separator: String,
    /// Wrap the question in the tokenizer's chat template.
    #[arg(long)]
    pub chat: bool,
    /// PRIME's implicit PRM, with `--reward prime`.
    #[command(flatten)]
    pub prime: PrimeArgs,
    /// Layout of a PRM or ORM reward's verifier (as `stepwise score --layout`).
    #[arg(long, default_value = "auto")]
    pub layout: String,
    /// Held-out problems measured during training.
    #[command(flatten)]
    pub eval: HeldoutArgs,
    /// How each update learns.
    #[command(flatten)]
    pub optim: Optimisation,
    /// What loaded models compute in.
    #[command(flatten)]
    pub dtype: super::backend::DtypeArg,
    /// Where the policy trains and samples, and the reward model and reference run.
    #[command(flatten)]
    pub device: super::backend::DeviceArgs,
    /// Which trainer updates it.
    #[command(flatten)]
    pub trainer: super::backend::TrainerArg,
}

pub fn run(a: Args) -> Result<()> {
    a.dtype.apply();
    let credit: Credit = a.credit.parse().context("--credit")?;
    let reward = RlReward::parse(&a.reward).context("--reward")?;
    let problems = stepwise_core::io::read_problems(&a.problems)?;
    stepwise_rl::job::check_gold(&problems).with_context(|| a.problems.display().to_string())?;
    let heldout = a.eval.read(|p| Ok(stepwise_core::io::read_problems(p)?))?;
    let cfg = rl_config(&a, credit, a.prime.config(&a.reward, a.optim.lr));
    let bar = crate::progress::bar(Some(a.updates as u64), "RL");
    let log = run_rl(
        RlJob {
            policy: &a.policy,
            problems: &problems,
            reward,
            layout: a.layout.clone(),
            chat: a.chat,
            separator: a.separator.clone(),
            out: &a.out,
            heldout: a.eval.heldout(&heldout),
            placement: a.device.device,
            trainer: a.trainer.get()?,
            max_batch_tokens: a.device.max_batch_tokens,
        },
        &cfg,
        |l| {
            bar.set_position(l.update as u64);
            let prm = l
                .implicit_prm
                .map(|p| format!(" implicit PRM acc {:.2}", p.accuracy))
                .unwrap_or_default();
            bar.set_message(format!(
                "reward {:.3} acc {:.2}{}{prm}",
                l.reward,
                l.accuracy,
                kl_text(l)
            ));
        },
    )?;
    bar.finish_and_clear();
    report(&a.out, &a.reward, "accuracy", &log);
    Ok(())
}

/// PRIME's implicit PRM: what `rl` and `agent rl` share.
#[derive(clap::Args)]
pub struct PrimeArgs {
    /// PRIME: β of the implicit PRM's token rewards.
    #[arg(long, default_value_t = 0.05)]
    pub prime_beta: f32,
    /// PRIME: the implicit PRM's learning rate (default: --lr).
    #[arg(long)]
    pub prime_lr: Option<f64>,
    /// PRIME: learn only from groups whose share of successes lies in LOW,HIGH.
    #[arg(long, default_value = "0.2,0.8", value_parser = accuracy_bounds)]
    pub prime_filter: (f32, f32),
}

impl PrimeArgs {
    /// PRIME's settings where `reward` is `prime` (the policy's learning rate `lr` unless
    /// `--prime-lr` says).
    pub fn config(&self, reward: &str, lr: f64) -> Option<PrimeConfig> {
        (reward == "prime").then(|| PrimeConfig {
            beta: self.prime_beta,
            lr: self.prime_lr.unwrap_or(lr),
            accuracy_bounds: self.prime_filter,
            ..Default::default()
        })
    }
}

/// The run's settings from the command line.
fn rl_config(a: &Args, credit: Credit, prime: Option<PrimeConfig>) -> RlConfig {
    RlConfig {
        grad_accum: a.grad_accum,
        prime,
        ..a.optim.config(a.updates, a.prompts, a.group_size, credit, a.max_tokens)
    }
}

/// Held-out problems (or worlds) whose success is measured during training: what `rl` and
/// `agent rl` share.
#[derive(clap::Args)]
pub struct HeldoutArgs {
    /// Held-out problems (JSONL: problems with gold answers, or `agent games` worlds) whose
    /// single-sample success is logged and plotted during training.
    #[arg(long)]
    pub eval_problems: Option<PathBuf>,
    /// Measure them every this many updates (and after the last).
    #[arg(long, default_value_t = 10)]
    pub eval_every: usize,
    /// Samples per held-out problem.
    #[arg(long, default_value_t = 4)]
    pub eval_samples: usize,
}

impl HeldoutArgs {
    /// The held-out problems, read by `read` (none without `--eval-problems`).
    pub fn read(&self, read: impl Fn(&std::path::Path) -> Result<Vec<Problem>>) -> Result<Vec<Problem>> {
        self.eval_problems.as_deref().map_or(Ok(Vec::new()), read)
    }

    /// The measure over `problems` (as read by [`HeldoutArgs::read`]), with `--eval-problems`.
    pub fn heldout<'a>(&self, problems: &'a [Problem]) -> Option<Heldout<'a>> {
        self.eval_problems.is_some().then_some(Heldout {
            problems,
            every: self.eval_every,
            samples: self.eval_samples,
        })
    }
}

/// How each update learns and samples: the settings `rl` and `agent rl` share.
#[derive(clap::Args)]
pub struct Optimisation {
    /// PPO epochs over each update's samples.
    #[arg(long, default_value_t = 1)]
    pub epochs: usize,
    /// Samples (solutions, trajectories) per micro-batch: one forward and backward pass.
    #[arg(long, default_value_t = 32)]
    pub minibatch_size: usize,
    /// Peak learning rate (linear warm-up over the first tenth of the updates, then cosine).
    #[arg(long, default_value_t = 1e-5)]
    pub lr: f64,
    /// KL penalty weight β (k3, to the starting policy). 0: no penalty, and without PRIME the
    /// starting policy is neither loaded nor run over the samples, and rl_log.jsonl has no `kl`
    /// (TRL's GRPO at beta=0, as DAPO and Dr. GRPO train).
    #[arg(long, default_value_t = 0.04)]
    pub kl: f32,
    /// PPO clip range ε.
    #[arg(long, default_value_t = 0.2)]
    pub clip: f32,
    /// Sampling temperature.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    /// Checkpoint every this many updates.
    #[arg(long, default_value_t = 10)]
    pub checkpoint_every: usize,
    /// Seed of prompt choice, sampling and minibatch order.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub lora: super::LoraArgs,
}

impl Optimisation {
    /// The settings of `updates` updates of `group` samples for each of `prompts` prompts.
    pub fn config(&self, updates: usize, prompts: usize, group: usize, credit: Credit, max_tokens: usize) -> RlConfig {
        RlConfig {
            updates,
            prompts_per_update: prompts,
            group_size: group,
            epochs: self.epochs,
            minibatch_size: self.minibatch_size,
            lr: self.lr,
            warmup: updates / 10,
            kl_coef: self.kl,
            clip: self.clip,
            credit,
            temperature: self.temperature,
            max_new_tokens: max_tokens,
            seed: self.seed,
            checkpoint_every: self.checkpoint_every,
            lora: self.lora.config(self.seed),
            ..Default::default()
        }
    }
}

/// ` kl 0.0123` for an update that measured its KL to the reference, else nothing (a run
/// without a reference: `--kl 0`).
pub(crate) fn kl_text(l: &stepwise_rl::UpdateLog) -> String {
    l.kl.map(|k| format!(" kl {k:.4}")).unwrap_or_default()
}

/// The training curves plotted into `out/rl.*` (`reward` names the series) and the last
/// update's figures on stderr; `accuracy` names what the log's accuracy is the share of.
pub(crate) fn report(out: &std::path::Path, reward: &str, accuracy: &str, log: &[stepwise_rl::UpdateLog]) {
    let series = |f: &dyn Fn(&stepwise_rl::UpdateLog) -> Option<f64>| -> Vec<(String, Vec<(f64, f64)>)> {
        vec![(
            reward.to_string(),
            log.iter().filter_map(|l| Some((l.update as f64, f(l)?))).collect(),
        )]
    };
    let plotted = stepwise_eval::plot::panels_plot(
        &out.join("rl"),
        "RL",
        "update",
        &[
            ("reward".into(), series(&|l| Some(l.reward))),
            (format!("sample {accuracy}"), series(&|l| Some(l.accuracy))),
            (
                format!("held-out {accuracy}"),
                vec![(
                    reward.to_string(),
                    log.iter()
                        .filter_map(|l| Some((l.update as f64, l.heldout_accuracy?)))
                        .collect(),
                )],
            ),
            ("KL to start".into(), series(&|l| l.kl)),
        ],
    );
    if let Err(e) = plotted {
        eprintln!("plot skipped: {e}");
    }
    let last = log.last().cloned().unwrap_or_default();
    eprintln!(
        "{} updates: reward {:.3}, sample {accuracy} {:.3},{}; {} tokens sampled, {} learned; policy in {}",
        log.len(),
        last.reward,
        last.accuracy,
        kl_text(&last),
        last.sampled_tokens,
        last.updated_tokens,
        out.display()
    );
    if !log.is_empty() {
        let mean = |f: fn(&stepwise_rl::UpdateLog) -> f64| log.iter().map(f).sum::<f64>() / log.len() as f64;
        eprintln!(
            "an update took {:.1} s on average: sampling {:.1}, log-probabilities {:.1}, learning {:.1}",
            mean(|l| l.seconds),
            mean(|l| l.sampling_seconds),
            mean(|l| l.logprob_seconds),
            mean(|l| l.learn_seconds)
        );
    }
}

/// `LOW,HIGH`: bounds on a group's share of correct samples, 0 ≤ LOW ≤ HIGH ≤ 1.
fn accuracy_bounds(s: &str) -> Result<(f32, f32), String> {
    let parse = |x: &str| x.trim().parse::<f32>().map_err(|e| format!("`{x}`: {e}"));
    let (low, high) = s.split_once(',').ok_or("expected LOW,HIGH, e.g. 0.2,0.8")?;
    let (low, high) = (parse(low)?, parse(high)?);
    if !(0.0..=1.0).contains(&low) || !(low..=1.0).contains(&high) {
        return Err(format!("{low},{high}: need 0 <= LOW <= HIGH <= 1"));
    }
    Ok((low, high))
}
