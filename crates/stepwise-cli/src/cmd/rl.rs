use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use stepwise_core::seams::{MathTask, OutcomeReward, Reward, RewardKind, ScorerReward};
use stepwise_model::layout::RewardSpec;
use stepwise_model::log_ratio::LogRatio;
use stepwise_model::scoring::LoadedVerifier;
use stepwise_model::train::VarMap;
use stepwise_model::{default_device, default_precision, Model, ModelConfig, Placement, Prompt, Tokenizer};
use stepwise_rl::prime::OnlinePrm;
use stepwise_rl::trainer::{Heldout, RlRun};
use stepwise_rl::{train_rl, CandleLearner, Credit, ImplicitPrm, Learner, PrimeConfig, RlConfig};

/// Optimise a policy by RL against a reward.
#[derive(clap::Args)]
#[command(
    after_help = "Each update samples --group-size solutions for each of --prompts problems with the current policy \\
(prompt KV cache shared), rewards them, normalises the rewards over each group (GRPO) and takes PPO-clip steps \\
(--clip) with a KL penalty (--kl, k3 estimator) to the starting policy. Rewards:
  outcome     1 when the graded final answer equals the problem's gold answer, else 0
  orm:DIR     an outcome model's score of the whole solution (any verifier folder `stepwise score` reads)
  prm:DIR     a PRM's score of every step: each step's tokens get that step's advantage (--credit:
              return-to-go = DeepSeekMath's sum of the normalised rewards of the step and every later
              one; min-so-far = the weakest step so far)
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
With --reward prime the implicit PRM trains on the GPU too (a second packed trainer).

Example:
  stepwise rl --policy fixtures/hf-tiny/qwen2-policy --reward outcome \\
      --problems problems.jsonl --updates 20 --out rl-run/"
)]
pub struct Args {
    /// Policy checkpoint folder or cached Hugging Face model id to start from (also the KL
    /// reference).
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
    /// PPO epochs over each update's samples.
    #[arg(long, default_value_t = 1)]
    pub epochs: usize,
    /// Sequences per micro-batch (one forward and backward pass).
    #[arg(long, default_value_t = 32)]
    pub minibatch_size: usize,
    /// Micro-batches per optimiser step (gradient accumulation).
    #[arg(long, default_value_t = 1)]
    pub grad_accum: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = 1e-5)]
    pub lr: f64,
    /// KL penalty weight β.
    #[arg(long, default_value_t = 0.04)]
    pub kl: f32,
    /// PPO clip range ε.
    #[arg(long, default_value_t = 0.2)]
    pub clip: f32,
    /// Per-step credit of process rewards: return-to-go or min-so-far.
    #[arg(long, default_value = "return-to-go")]
    pub credit: String,
    /// Sampling temperature.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    /// Most new tokens per solution.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Text between steps (in the prompt and the completions).
    #[arg(long, default_value = "\n")]
    pub separator: String,
    /// Wrap the question in the tokenizer's chat template.
    #[arg(long)]
    pub chat: bool,
    /// PRIME: β of the implicit PRM's token rewards.
    #[arg(long, default_value_t = 0.05)]
    pub prime_beta: f32,
    /// PRIME: the implicit PRM's learning rate (default: --lr).
    #[arg(long)]
    pub prime_lr: Option<f64>,
    /// PRIME: learn only from groups whose share of correct samples lies in LOW,HIGH.
    #[arg(long, default_value = "0.2,0.8", value_parser = accuracy_bounds)]
    pub prime_filter: (f32, f32),
    /// Layout of a PRM or ORM reward's verifier (as `stepwise score --layout`).
    #[arg(long, default_value = "auto")]
    pub layout: String,
    /// Held-out problems (JSONL, with gold answers) whose single-sample accuracy is logged and
    /// plotted during training.
    #[arg(long)]
    pub eval_problems: Option<PathBuf>,
    /// Measure the held-out problems every this many updates (and after the last).
    #[arg(long, default_value_t = 10)]
    pub eval_every: usize,
    /// Samples per held-out problem.
    #[arg(long, default_value_t = 4)]
    pub eval_samples: usize,
    /// Checkpoint every this many updates.
    #[arg(long, default_value_t = 10)]
    pub checkpoint_every: usize,
    /// Seed of prompt choice, sampling and minibatch order.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// What loaded models compute in.
    #[command(flatten)]
    pub dtype: super::backend::DtypeArg,
    /// Where the policy trains and samples, and the reward model and reference run.
    #[command(flatten)]
    pub device: super::backend::DeviceArgs,
}

pub fn run(a: Args) -> Result<()> {
    a.dtype.apply();
    let dev = default_device();
    let credit: Credit = a.credit.parse().context("--credit")?;
    let problems = read_problems(&a)?;
    let task = MathTask::default();
    let heldout_problems = match &a.eval_problems {
        Some(path) => stepwise_core::io::read_problems(path)?,
        None => Vec::new(),
    };
    let placement = a.device.device.resolve()?;
    let verifier = reward_verifier(&a, placement)?;
    let scorer = verifier.as_ref().map(LoadedVerifier::scorer);
    let outcome = OutcomeReward { task: &task };
    let scored = scorer.as_ref().map(|s| ScorerReward {
        name: a.reward.split(':').next().unwrap_or_default().to_string(),
        scorer: s,
        kind: if a.reward.starts_with("prm:") {
            RewardKind::Process
        } else {
            RewardKind::Outcome
        },
    });
    let reward: &dyn Reward = match &scored {
        Some(r) => r,
        None => &outcome,
    };
    let tok = Tokenizer::from_dir(&a.policy)?;
    let reference = Model::load_on(&a.policy, placement, default_precision())?;
    let varmap = VarMap::new();
    let mut policy;
    let mut on_cpu;
    let mut on_gpu;
    let learner: &mut dyn Learner = match placement {
        Placement::Cuda(ordinal) => {
            on_gpu = stepwise_rl::learner::on_gpu(&a.policy, ordinal, a.device.max_batch_tokens)?;
            &mut *on_gpu
        }
        _ => {
            policy = Model::load_trainable(&a.policy, ModelConfig::from_dir(&a.policy)?, &varmap, &dev, a.seed)?;
            on_cpu = CandleLearner::new(&mut policy, &varmap)?;
            &mut on_cpu
        }
    };
    let mut stop = reference.config.eos_token_ids.clone();
    stop.extend(tok.eos_id());
    create_out(&a)?;
    let prime = prime_config(&a);
    let prm_varmap = VarMap::new();
    let mut prm = match &prime {
        Some(p) => implicit_prm(&a, p, placement, &prm_varmap)?,
        None => PrimeModel::None,
    };
    let cfg = rl_config(&a, credit, prime);
    let bar = crate::progress::bar(Some(a.updates as u64), "RL");
    let log = train_rl(
        RlRun {
            learner,
            reference: &reference,
            tokenizer: &tok,
            prompt: if a.chat { Prompt::Chat } else { Prompt::Text },
            separator: a.separator.clone(),
            stop_token_ids: stop,
            problems: &problems,
            task: &task,
            reward,
            watch: Vec::new(),
            out_dir: Some(a.out.clone()),
            heldout: a.eval_problems.is_some().then_some(Heldout {
                problems: &heldout_problems,
                every: a.eval_every,
                samples: a.eval_samples,
            }),
            implicit_prm: prm.as_implicit(&prm_varmap),
        },
        &cfg,
        |l| {
            bar.set_position(l.update as u64);
            let prm = l
                .implicit_prm
                .map(|p| format!(" implicit PRM acc {:.2}", p.accuracy))
                .unwrap_or_default();
            bar.set_message(format!(
                "reward {:.3} acc {:.2} kl {:.4}{prm}",
                l.reward, l.accuracy, l.kl
            ));
        },
    )?;
    bar.finish_and_clear();
    stepwise_core::io::write_jsonl(a.out.join("rl_log.jsonl"), &log)?;
    report(&a.out, &a.reward, "accuracy", &log);
    Ok(())
}

/// The verifier of a `prm:DIR` or `orm:DIR` reward, loaded where the policy runs (`None` for
/// `outcome` and `prime`).
fn reward_verifier(a: &Args, placement: Placement) -> Result<Option<LoadedVerifier>> {
    Ok(match a.reward.split_once(':') {
        Some(("orm" | "prm", dir)) => Some(LoadedVerifier::load_on(
            &stepwise_model::hub::resolve(dir).with_context(|| format!("--reward {}", a.reward))?,
            &a.layout,
            placement,
            default_precision(),
        )?),
        None if a.reward == "outcome" || a.reward == "prime" => None,
        _ => bail!("--reward `{}`: use outcome, orm:DIR, prm:DIR or prime", a.reward),
    })
}

/// PRIME's implicit PRM: it starts as the policy, and its folder is a log-ratio verifier against
/// the starting policy, readable by `stepwise score` once the run has saved its weights.
fn implicit_prm(a: &Args, p: &PrimeConfig, placement: Placement, prm_varmap: &VarMap) -> Result<PrimeModel> {
    let dir = OnlinePrm::dir(&a.out);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    stepwise_model::tokenizer::copy_files(&a.policy, &dir)?;
    let reference = std::fs::canonicalize(&a.policy)?;
    let log_ratio = LogRatio {
        beta: p.beta,
        cumulative: false,
        reference_logprob: None,
        last_tokens: None,
    };
    RewardSpec::log_ratio(Some(reference), &a.separator, log_ratio).save(&dir)?;
    Ok(match placement {
        Placement::Cuda(ordinal) => PrimeModel::Gpu(stepwise_rl::learner::on_gpu(
            &a.policy,
            ordinal,
            a.device.max_batch_tokens,
        )?),
        _ => {
            let config = ModelConfig::from_dir(&a.policy)?;
            PrimeModel::Cpu(Box::new(Model::load_trainable(
                &a.policy,
                config,
                prm_varmap,
                &default_device(),
                a.seed,
            )?))
        }
    })
}

/// The training problems, each with its gold answer.
fn read_problems(a: &Args) -> Result<Vec<stepwise_core::Problem>> {
    let problems = stepwise_core::io::read_problems(&a.problems)?;
    if let Some(p) = problems.iter().find(|p| p.gold_answer.is_none()) {
        bail!(
            "{}: problem `{}`: field `gold_answer`: missing",
            a.problems.display(),
            p.id
        );
    }
    Ok(problems)
}

/// PRIME's settings, with `--reward prime`.
fn prime_config(a: &Args) -> Option<PrimeConfig> {
    (a.reward == "prime").then(|| PrimeConfig {
        beta: a.prime_beta,
        lr: a.prime_lr.unwrap_or(a.lr),
        accuracy_bounds: a.prime_filter,
        ..Default::default()
    })
}

/// The output folder, with the policy's tokenizer (the checkpoints written there load alone).
fn create_out(a: &Args) -> Result<()> {
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    stepwise_model::tokenizer::copy_files(&a.policy, &a.out)
}

/// The run's settings from the command line.
fn rl_config(a: &Args, credit: Credit, prime: Option<PrimeConfig>) -> RlConfig {
    RlConfig {
        updates: a.updates,
        prompts_per_update: a.prompts,
        group_size: a.group_size,
        epochs: a.epochs,
        minibatch_size: a.minibatch_size,
        grad_accum: a.grad_accum,
        lr: a.lr,
        warmup: a.updates / 10,
        kl_coef: a.kl,
        clip: a.clip,
        credit,
        temperature: a.temperature,
        max_new_tokens: a.max_tokens,
        seed: a.seed,
        checkpoint_every: a.checkpoint_every,
        prime,
        ..Default::default()
    }
}

/// The training curves plotted into `out/rl.*` (`reward` names the series) and the last
/// update's figures on stderr; `accuracy` names what the log's accuracy is the share of.
pub(crate) fn report(out: &std::path::Path, reward: &str, accuracy: &str, log: &[stepwise_rl::UpdateLog]) {
    let series = |f: &dyn Fn(&stepwise_rl::UpdateLog) -> f64| -> Vec<(String, Vec<(f64, f64)>)> {
        vec![(
            reward.to_string(),
            log.iter().map(|l| (l.update as f64, f(l))).collect(),
        )]
    };
    let plotted = stepwise_eval::plot::panels_plot(
        &out.join("rl"),
        "RL",
        "update",
        &[
            ("reward".into(), series(&|l| l.reward)),
            (format!("sample {accuracy}"), series(&|l| l.accuracy)),
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
        "{} updates: reward {:.3}, sample {accuracy} {:.3}, KL {:.4}; {} tokens sampled, {} learned; policy in {}",
        log.len(),
        last.reward,
        last.accuracy,
        last.kl,
        last.sampled_tokens,
        last.updated_tokens,
        out.display()
    );
}

/// PRIME's implicit PRM as loaded: a candle model on the CPU, or a learner on a GPU.
enum PrimeModel {
    None,
    Cpu(Box<Model>),
    Gpu(Box<dyn Learner>),
}

impl PrimeModel {
    /// It, as the trainer takes it (`varmap`: the CPU model's weights).
    fn as_implicit<'a>(&'a mut self, varmap: &'a VarMap) -> Option<ImplicitPrm<'a>> {
        match self {
            PrimeModel::Cpu(model) => Some(ImplicitPrm::Candle { model, varmap }),
            PrimeModel::Gpu(learner) => Some(ImplicitPrm::Learner(&mut **learner)),
            PrimeModel::None => None,
        }
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
