//! A single-turn RL run as `stepwise rl` and Python's `stepwise.rl` start it: a policy
//! checkpoint folder, problems with gold answers, a reward named as both front ends name it
//! (`outcome`, `orm:DIR`, `prm:DIR`, `prime`), an output folder and a device. It loads what
//! [`train_rl`] works on where the device and the trainer say (candle's autograd on the CPU, the
//! packed engine's trainer on a GPU or the CPU), runs it (resuming from the folder's
//! checkpoint), and leaves the policy, the optimiser, PRIME's implicit PRM and `rl_log.jsonl` in
//! the folder.

use crate::learner::{packed_learner, CandleLearner, Learner};
use crate::prime::{ImplicitPrm, OnlinePrm};
use crate::trainer::{train_rl, Heldout, RlConfig, RlRun, UpdateLog};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use stepwise_core::seams::{MathTask, OutcomeReward, Reward, RewardKind, ScorerReward};
use stepwise_core::Problem;
use stepwise_model::layout::RewardSpec;
use stepwise_model::log_ratio::LogRatio;
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
    let reference = Model::load_on(job.policy, placement, default_precision())?;
    let config = ModelConfig::from_dir(job.policy)?;
    let packed = job.trainer.packed_at(placement, Some(config.hidden_size))?;
    let varmap = VarMap::new();
    let mut policy;
    let mut on_cpu;
    let mut on_packed;
    let learner: &mut dyn Learner = if packed {
        on_packed = packed_learner(job.policy, placement, job.max_batch_tokens)?;
        &mut *on_packed
    } else {
        policy = Model::load_trainable(job.policy, config, &varmap, &default_device(), cfg.seed)?;
        on_cpu = CandleLearner::new(&mut policy)?;
        &mut on_cpu
    };
    let mut stop = reference.config.eos_token_ids.clone();
    stop.extend(tok.eos_id());
    std::fs::create_dir_all(job.out).with_context(|| format!("creating {}", job.out.display()))?;
    stepwise_model::tokenizer::copy_files(job.policy, job.out)?;
    let mut prm = match &cfg.prime {
        Some(p) => implicit_prm(
            job.policy,
            job.out,
            &job.separator,
            p.beta,
            (packed.then_some(placement), job.max_batch_tokens),
            cfg.seed,
        )?,
        None => PrimeModel::None,
    };
    let log = train_rl(
        RlRun {
            learner,
            reference: &reference,
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
            implicit_prm: prm.as_implicit(),
        },
        cfg,
        on_update,
    )?;
    stepwise_core::io::write_jsonl(job.out.join("rl_log.jsonl"), &log)?;
    Ok(log)
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
) -> Result<PrimeModel> {
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
    Ok(match placement {
        Some(placement) => PrimeModel::Packed(packed_learner(policy, placement, max_batch_tokens)?),
        None => {
            let config = ModelConfig::from_dir(policy)?;
            PrimeModel::Cpu(Box::new(Model::load_trainable(
                policy,
                config,
                &VarMap::new(),
                &default_device(),
                seed,
            )?))
        }
    })
}

/// PRIME's implicit PRM as loaded: a candle model on the CPU, or the packed engine's learner.
pub(crate) enum PrimeModel {
    None,
    Cpu(Box<Model>),
    Packed(Box<dyn Learner>),
}

impl PrimeModel {
    /// It, as the trainer takes it.
    pub(crate) fn as_implicit(&mut self) -> Option<ImplicitPrm<'_>> {
        match self {
            PrimeModel::Cpu(model) => Some(ImplicitPrm::Candle(model)),
            PrimeModel::Packed(learner) => Some(ImplicitPrm::Learner(&mut **learner)),
            PrimeModel::None => None,
        }
    }
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
}
