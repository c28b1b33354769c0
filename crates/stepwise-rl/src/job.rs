//! A single-turn RL run as `stepwise rl` and Python's `stepwise.rl` start it: a policy
//! checkpoint folder, problems with gold answers, a reward named as both front ends name it
//! (`outcome`, `orm:DIR`, `prm:DIR`, `prime`), an output folder and a device. It loads what
//! [`train_rl`] works on where the device and the trainer say (candle's autograd on the CPU, the
//! packed engine's trainer on a GPU or the CPU), runs it (resuming from the folder's
//! checkpoint), and leaves the policy, the optimiser, PRIME's implicit PRM and `rl_log.jsonl` in
//! the folder.

use crate::learner::{packed_learner, CandleLearner, Learner};
use crate::prime::{ImplicitPrm, OnlinePrm};
use crate::trainer::{train_rl, Heldout, Reference, RlConfig, RlRun, UpdateLog};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use stepwise_core::seams::{MathTask, OutcomeReward, Reward, RewardKind, ScorerReward};
use stepwise_core::Problem;
use stepwise_model::layout::RewardSpec;
use stepwise_model::log_ratio::LogRatio;
use stepwise_model::packed_engine::LoraConfig;
use stepwise_model::scoring::LoadedVerifier;
use stepwise_model::train::run::Trainer;
use stepwise_model::train::VarMap;
use stepwise_model::{default_device, default_precision, Model, ModelConfig, Placement, Prompt, Tokenizer};

/// What a single-turn RL run optimises.
#[derive(Debug, Clone, PartialEq)]
pub enum RlReward {
    /// 1 when the graded final answer equals the gold answer, else 0.
    Outcome,
    /// An outcome model's score of the whole solution.
    Orm(PathBuf),
    /// A PRM's score of every step.
    Prm(PathBuf),
    /// PRIME: the outcome plus an implicit PRM's dense token rewards, the PRM learning online
    /// ([`RlConfig::prime`] holds its settings).
    Prime,
}

impl RlReward {
    /// `outcome`, `orm:DIR`, `prm:DIR` or `prime`.
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s.split_once(':') {
            Some(("orm", dir)) if !dir.is_empty() => RlReward::Orm(PathBuf::from(dir)),
            Some(("prm", dir)) if !dir.is_empty() => RlReward::Prm(PathBuf::from(dir)),
            None if s == "outcome" => RlReward::Outcome,
            None if s == "prime" => RlReward::Prime,
            _ => bail!("reward `{s}`: use outcome, orm:DIR, prm:DIR or prime"),
        })
    }

    /// The verifier folder of an ORM or PRM reward.
    fn verifier(&self) -> Option<&Path> {
        match self {
            RlReward::Orm(d) | RlReward::Prm(d) => Some(d),
            _ => None,
        }
    }
}

/// A single-turn RL run, as the front ends describe it.
pub struct RlJob<'a> {
    /// The starting policy's checkpoint folder (also the KL reference).
    pub policy: &'a Path,
    /// The problems, each with its gold answer ([`check_gold`]).
    pub problems: &'a [Problem],
    /// What is optimised.
    pub reward: RlReward,
    /// An ORM or PRM reward's layout (as `stepwise score --layout`).
    pub layout: String,
    /// Wrap the question in the tokenizer's chat template.
    pub chat: bool,
    /// Text between steps.
    pub separator: String,
    /// Checkpoints, the log; resumed from when it holds a checkpoint.
    pub out: &'a Path,
    /// Problems whose single-sample accuracy is measured during training.
    pub heldout: Option<Heldout<'a>>,
    /// Where the policy trains and samples, and the reference and reward models run.
    pub placement: Placement,
    /// Which trainer updates the policy (and PRIME's implicit PRM): on the CPU, `Auto` is the
    /// packed engine's for a pretrained policy, candle's autograd for a small one.
    pub trainer: Trainer,
    /// Most tokens in one pass of the packed trainer.
    pub max_batch_tokens: usize,
}

/// Every problem has a gold answer (else: the first without one, named).
pub fn check_gold(problems: &[Problem]) -> Result<()> {
    match problems.iter().find(|p| p.gold_answer.is_none()) {
        Some(p) => bail!("problem `{}`: field `gold_answer`: missing", p.id),
        None => Ok(()),
    }
}

/// Run `job` with `cfg`; `on_update` sees each update's log. Returns the log of every update
/// (a resumed run's earlier part included), also written to `OUT/rl_log.jsonl`.
pub fn run_rl(job: RlJob<'_>, cfg: &RlConfig, on_update: impl FnMut(&UpdateLog)) -> Result<Vec<UpdateLog>> {
    // Refused before a model is loaded or the folder made.
    cfg.check()?;
    check_gold(job.problems)?;
    if (job.reward == RlReward::Prime) != cfg.prime.is_some() {
        bail!("the prime reward and PRIME's settings (RlConfig::prime) go together");
    }
    let placement = job.placement.resolve()?;
    let task = MathTask::default();
    let verifier = match job.reward.verifier() {
        Some(dir) => {
            let resolved = stepwise_model::hub::resolve(&dir.to_string_lossy())
                .with_context(|| format!("reward verifier {}", dir.display()))?;
            Some(LoadedVerifier::load_on(
                &resolved,
                &job.layout,
                placement,
                default_precision(),
            )?)
        }
        None => None,
    };
    let scorer = verifier.as_ref().map(LoadedVerifier::scorer);
    let outcome = OutcomeReward { task: &task };
    let (name, kind) = match job.reward {
        RlReward::Prm(_) => ("prm", RewardKind::Process),
        _ => ("orm", RewardKind::Outcome),
    };
    let scored = scorer.as_ref().map(|s| ScorerReward {
        name: name.to_string(),
        scorer: s,
        kind,
    });
    let reward: &dyn Reward = match &scored {
        Some(r) => r,
        None => &outcome,
    };
    let tok = Tokenizer::from_dir(job.policy)?;
    let trainer = (job.trainer, cfg.lora.as_ref());
    let mut policy = TrainedPolicy::load(job.policy, placement, trainer, job.max_batch_tokens, cfg.seed)?;
    let reference = policy.reference_if(cfg.needs_reference(), job.policy, placement)?;
    let mut stop = ModelConfig::from_dir(job.policy)?.eos_token_ids;
    stop.extend(tok.eos_id());
    std::fs::create_dir_all(job.out).with_context(|| format!("creating {}", job.out.display()))?;
    stepwise_model::tokenizer::copy_files(job.policy, job.out)?;
    let mut prm = match &cfg.prime {
        Some(p) => Some(implicit_prm(
            job.policy,
            job.out,
            &job.separator,
            p.beta,
            (policy.packed().then_some(placement), job.max_batch_tokens),
            cfg.seed,
        )?),
        None => None,
    };
    let log = policy.with_learner(|learner| {
        let run = RlRun {
            learner,
            reference: Reference::pick(reference.as_ref(), cfg.needs_reference()),
            tokenizer: &tok,
            prompt: if job.chat { Prompt::Chat } else { Prompt::Text },
            separator: job.separator.clone(),
            stop_token_ids: stop,
            problems: job.problems,
            task: &task,
            reward,
            watch: Vec::new(),
            out_dir: Some(job.out.to_path_buf()),
            heldout: job.heldout,
            implicit_prm: prm.as_mut().map(TrainedPolicy::as_implicit),
        };
        train_rl(run, cfg, on_update)
    })?;
    stepwise_core::io::write_jsonl(job.out.join("rl_log.jsonl"), &log)?;
    Ok(log)
}

/// The policy as its trainer holds it: the packed engine's learner (a GPU, or the CPU for a
/// pretrained policy), or a candle model made trainable for candle's autograd on the CPU.
pub(crate) enum TrainedPolicy {
    Packed(Box<dyn Learner>),
    Candle(Box<Model>),
}

impl TrainedPolicy {
    /// The policy in the checkpoint folder `dir`, loaded for the trainer `trainer` chooses at
    /// `placement` ([`Trainer::packed_at`]); a packed pass holds at most `max_batch_tokens`.
    pub(crate) fn load(
        dir: &Path,
        placement: Placement,
        (trainer, lora): (Trainer, Option<&LoraConfig>),
        max_batch_tokens: usize,
        seed: u64,
    ) -> Result<Self> {
        let config = ModelConfig::from_dir(dir)?;
        let packed = trainer.packed_at(placement, Some(config.hidden_size))?;
        if lora.is_some() && !packed {
            bail!("LoRA trains on the packed trainer (--trainer packed), not candle's");
        }
        Self::load_as(dir, packed.then_some(placement), max_batch_tokens, seed, lora)
    }

    /// The policy in `dir` on the packed engine's trainer at `packed` when given (passes of at
    /// most `max_batch_tokens`; LoRA's adapters with `lora`), else as candle variables on the CPU.
    fn load_as(
        dir: &Path,
        packed: Option<Placement>,
        max_batch_tokens: usize,
        seed: u64,
        lora: Option<&LoraConfig>,
    ) -> Result<Self> {
        Ok(match packed {
            Some(placement) => TrainedPolicy::Packed(packed_learner(dir, placement, max_batch_tokens, lora.cloned())?),
            None => {
                let config = ModelConfig::from_dir(dir)?;
                let model = Model::load_trainable(dir, config, &VarMap::new(), &default_device(), seed)?;
                TrainedPolicy::Candle(Box::new(model))
            }
        })
    }

    /// The frozen starting policy in `dir` (the KL penalty's reference), computing as the policy
    /// does: on the packed engine at `placement` beside the packed trainer (its log-probabilities
    /// those of the untrained policy, bit for bit), else as `stepwise score` loads a model.
    pub(crate) fn reference(&self, dir: &Path, placement: Placement) -> Result<Model> {
        match self {
            TrainedPolicy::Packed(_) => Model::load_packed(dir, placement),
            TrainedPolicy::Candle(_) => Model::load_on(dir, placement, default_precision()),
        }
    }

    /// [`TrainedPolicy::reference`] where `needed` (a KL penalty or PRIME) and the learner has no
    /// frozen base to read it from (LoRA's: [`Learner::has_base`]), else none: a 0.5B policy's
    /// bf16 weights saved ([`Reference::pick`] then says where the run's reference is).
    pub(crate) fn reference_if(&self, needed: bool, dir: &Path, placement: Placement) -> Result<Option<Model>> {
        (needed && !self.has_base())
            .then(|| self.reference(dir, placement))
            .transpose()
    }

    /// Whether the learner reads its frozen base ([`Learner::has_base`]).
    pub(crate) fn has_base(&self) -> bool {
        match self {
            TrainedPolicy::Packed(learner) => learner.has_base(),
            TrainedPolicy::Candle(_) => false,
        }
    }

    /// Whether the packed engine's trainer holds it.
    pub(crate) fn packed(&self) -> bool {
        matches!(self, TrainedPolicy::Packed(_))
    }

    /// `work` run with the policy's learner.
    pub(crate) fn with_learner<R>(&mut self, work: impl FnOnce(&mut dyn Learner) -> Result<R>) -> Result<R> {
        match self {
            TrainedPolicy::Packed(learner) => work(&mut **learner),
            TrainedPolicy::Candle(model) => work(&mut CandleLearner::new(model)?),
        }
    }

    /// It as PRIME's trainer takes an implicit PRM.
    pub(crate) fn as_implicit(&mut self) -> ImplicitPrm<'_> {
        match self {
            TrainedPolicy::Packed(learner) => ImplicitPrm::Learner(&mut **learner),
            TrainedPolicy::Candle(model) => ImplicitPrm::Candle(model),
        }
    }
}

/// PRIME's implicit PRM: it starts as the policy, and its folder is a log-ratio verifier against
/// the starting policy (`policy`, whose text steps `separator` joins), readable by `stepwise
/// score` once the run in `out` has saved its weights. It trains on the packed engine's trainer
/// at `placement` when one is given, with the most tokens of a packed pass there, else with
/// candle's autograd on the CPU.
pub(crate) fn implicit_prm(
    policy: &Path,
    out: &Path,
    separator: &str,
    beta: f32,
    (placement, max_batch_tokens): (Option<Placement>, usize),
    seed: u64,
) -> Result<TrainedPolicy> {
    let dir = OnlinePrm::dir(out);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    stepwise_model::tokenizer::copy_files(policy, &dir)?;
    let reference = std::fs::canonicalize(policy)?;
    let log_ratio = LogRatio {
        beta,
        cumulative: false,
        reference_logprob: None,
        last_tokens: None,
    };
    RewardSpec::log_ratio(Some(reference), separator, log_ratio).save(&dir)?;
    TrainedPolicy::load_as(policy, placement, max_batch_tokens, seed, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewards_are_read_as_the_front_ends_name_them() {
        assert_eq!(RlReward::parse("outcome").unwrap(), RlReward::Outcome);
        assert_eq!(RlReward::parse("prime").unwrap(), RlReward::Prime);
        assert_eq!(RlReward::parse("orm:o").unwrap(), RlReward::Orm(PathBuf::from("o")));
        assert_eq!(RlReward::parse("prm:p").unwrap(), RlReward::Prm(PathBuf::from("p")));
        for bad in ["prm:", "goal", "oracle", ""] {
            let e = RlReward::parse(bad).unwrap_err().to_string();
            assert!(e.contains("outcome, orm:DIR, prm:DIR or prime"), "{bad}: {e}");
        }
        let p = |gold: Option<&str>| Problem {
            id: "p1".into(),
            gold_answer: gold.map(str::to_string),
            ..Default::default()
        };
        assert!(check_gold(&[p(Some("3"))]).is_ok());
        let e = check_gold(&[p(Some("3")), p(None)]).unwrap_err().to_string();
        assert!(e.contains("problem `p1`: field `gold_answer`: missing"), "{e}");
    }

    /// The trainer named holds the policy: the packed engine's for `packed`, candle's for
    /// `autograd`, and for `auto` candle's for a policy this small (hidden size under 512).
    #[test]
    fn the_trainer_named_holds_the_policy() {
        let dir = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/hf-tiny/qwen2-policy"
        ));
        let load = |trainer| TrainedPolicy::load(dir, Placement::Cpu, (trainer, None), 4096, 0).unwrap();
        let mut packed = load(Trainer::Packed);
        assert!(packed.packed());
        assert!(matches!(packed.as_implicit(), ImplicitPrm::Learner(_)));
        assert!(!load(Trainer::Autograd).packed());
        let mut auto = load(Trainer::Auto);
        assert!(!auto.packed());
        assert!(matches!(auto.as_implicit(), ImplicitPrm::Candle(_)));
        // Each hands a learner whose samples come from the policy being trained.
        for mut policy in [packed, auto] {
            let vocab = policy.with_learner(|l| Ok(l.sampler()?.config.vocab_size)).unwrap();
            assert_eq!(vocab, ModelConfig::from_dir(dir).unwrap().vocab_size);
        }
    }
}
