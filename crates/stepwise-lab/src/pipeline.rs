//! The lab loop, stage by stage. Every stage writes its records into the run folder and is
//! skipped when its output is complete; the long stages (policy training, sampling, annotation,
//! verifier training) resume where an interrupted run stopped.

use crate::policy::{lm_example, LabPolicy};
use crate::report::{write_report, Report};
use crate::task::{self, oracle_labelled, LabProblem};
use crate::vocab::{self, SEP};
use anyhow::{Context, Result};
use candle_core::Device;
use candle_nn::VarMap;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use stepwise_core::journal::{sort_like, Journal};
use stepwise_core::{Solution, StepLabel};
use stepwise_label::{annotate_resumable, McOptions};
use stepwise_model::examples::{label_examples, LabelOptions};
use stepwise_model::log_ratio::{LogRatio, RewardSpec};
use stepwise_model::train::{evaluate, train, Objective, TrainConfig};
use stepwise_model::{HeadKind, Model, ModelConfig, PrmLayout, StepScorer, Tokenizer};

/// Sizes and budgets of a lab run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Preset {
    /// Name.
    pub name: String,
    /// Policy shape: hidden size, layers.
    pub policy_shape: (usize, usize),
    /// Policy training steps and batch size.
    pub policy_steps: usize,
    /// Problems the policy is trained on (reference solutions with slips).
    pub policy_problems: usize,
    /// Probability that a training solution carries one arithmetic slip.
    pub slip: f64,
    /// Problems whose samples are annotated to train the verifiers.
    pub label_problems: usize,
    /// Samples per annotation problem.
    pub label_samples: usize,
    /// Monte Carlo rollouts per step prefix.
    pub rollouts: usize,
    /// Which Math-Shepherd estimate of the rollouts PRM-MC learns.
    #[serde(default)]
    pub mc_labels: McLabels,
    /// Held-out evaluation problems.
    pub eval_problems: usize,
    /// Samples per evaluation problem (the largest N of best-of-N).
    pub eval_samples: usize,
    /// Start every verifier from the policy, as real PRMs and ORMs are fine-tuned from a language
    /// model (they need its arithmetic to judge a step); `false` trains classifier-head verifiers
    /// from scratch with `verifier_shape`.
    pub verifiers_from_policy: bool,
    /// Fresh decoder layers stacked on the policy's for the classifier head (the log-ratio head
    /// is the policy's own LM and takes none). One or two did not help (see the README).
    pub verifier_extra_layers: usize,
    /// Verifier shape when trained from scratch (the same for PRMs and the ORM).
    pub verifier_shape: (usize, usize),
    /// How every verifier turns the decoder's output into a step score.
    pub verifier_head: VerifierHead,
    /// `β` of the log-ratio and likelihood heads.
    pub verifier_beta: f32,
    /// The likelihood head's constant reference: the log-probability per token at which a
    /// step is neither good nor bad.
    pub verifier_reference_logprob: f32,
    /// Verifier training steps.
    pub verifier_steps: usize,
    /// Verifier peak learning rate.
    pub verifier_lr: f64,
    /// Sampling temperature.
    pub temperature: f32,
}

/// Math-Shepherd's two estimates of a step's label from its rollouts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum McLabels {
    /// Good when any rollout reached the gold answer (hard estimation).
    #[default]
    Hard,
    /// The fraction of rollouts that reached it (soft estimation), learned with BCE.
    Soft,
}

/// How a lab verifier scores a step (the same for PRMs and the ORM).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerifierHead {
    /// The policy's own LM, scored by its log-likelihood ratio against the policy over each
    /// step (implicit-PRM parameterisation, `stepwise_model::log_ratio`). The check a verifier
    /// needs — is the written result what the policy would compute? — is the LM's next-token
    /// distribution, so fine-tuning only has to learn to weigh it.
    LogRatio,
    /// The policy's own LM, scored by its log-likelihood of each step against a constant
    /// reference (`verifier_reference_logprob` per token). It starts as the policy's confidence
    /// in each step; fine-tuning raises good steps and lowers bad ones. A ratio against the
    /// policy instead can call a wrong step good when both models give it a tiny probability
    /// and the fine-tuned one's is less tiny (see the README).
    Likelihood,
    /// A fresh 2-class head on the decoder read at each step's separator (TRL's token
    /// classifier; a scalar value head for the ORM). With the lab's budget it learns priors
    /// over step kinds and numbers, not the arithmetic check (see the README).
    Classifier,
}

impl Preset {
    /// Every stage on a small budget (about a minute on 2 cores): checks the loop, numbers are noise.
    pub fn quick() -> Self {
        Preset {
            name: "quick".into(),
            policy_shape: (64, 2),
            policy_steps: 60,
            policy_problems: 600,
            slip: 0.25,
            label_problems: 12,
            label_samples: 4,
            rollouts: 2,
            mc_labels: McLabels::Hard,
            eval_problems: 10,
            eval_samples: 8,
            verifiers_from_policy: true,
            verifier_extra_layers: 0,
            verifier_shape: (32, 1),
            verifier_head: VerifierHead::Likelihood,
            verifier_beta: 1.0,
            verifier_reference_logprob: -0.5,
            verifier_steps: 20,
            verifier_lr: 1e-3,
            temperature: 1.0,
        }
    }

    /// The measured setting (about twelve minutes on 2 cores).
    pub fn standard() -> Self {
        Preset {
            name: "standard".into(),
            policy_shape: (64, 2),
            policy_steps: 1400,
            policy_problems: 8000,
            slip: 0.25,
            label_problems: 800,
            label_samples: 8,
            rollouts: 8,
            mc_labels: McLabels::Hard,
            eval_problems: 150,
            eval_samples: 32,
            verifiers_from_policy: true,
            verifier_extra_layers: 0,
            verifier_shape: (32, 1),
            verifier_head: VerifierHead::Likelihood,
            verifier_beta: 1.0,
            verifier_reference_logprob: -0.5,
            verifier_steps: 1200,
            verifier_lr: 3e-4,
            temperature: 1.0,
        }
    }

    /// Override fields by name, e.g. `policy_steps=2000` or `policy_shape=[128,4]` (values are
    /// JSON; a bare word is read as a string).
    pub fn with_overrides(self, sets: &[String]) -> Result<Self> {
        let mut v = serde_json::to_value(&self)?;
        for s in sets {
            let (key, val) = s
                .split_once('=')
                .with_context(|| format!("--set `{s}`: expected FIELD=VALUE"))?;
            let slot = v
                .get_mut(key)
                .with_context(|| format!("--set `{s}`: the preset has no field `{key}`"))?;
            *slot = serde_json::from_str(val).unwrap_or_else(|_| serde_json::Value::String(val.into()));
        }
        serde_json::from_value(v).context("--set: a value has the wrong type for its field")
    }

    /// How the verifiers are built and trained, in words (for the report).
    pub fn verifier_summary(&self) -> String {
        let head = match (self.verifier_head, self.verifiers_from_policy) {
            (VerifierHead::LogRatio, _) => format!(
                "the policy fine-tuned, each step scored by its log-likelihood ratio against the policy (β = {})",
                self.verifier_beta
            ),
            (VerifierHead::Likelihood, _) => format!(
                "the policy fine-tuned, each step scored by its own log-likelihood against a constant {} per token (β = {})",
                self.verifier_reference_logprob, self.verifier_beta
            ),
            (VerifierHead::Classifier, true) => {
                "the policy's decoder with a fresh classifier head (a value head for the ORM)".to_string()
            }
            (VerifierHead::Classifier, false) => format!(
                "a {}×{} decoder trained from scratch with a classifier head (a value head for the ORM)",
                self.verifier_shape.0, self.verifier_shape.1
            ),
        };
        format!(
            "{head}; {} steps of 32 solutions, peak learning rate {}",
            self.verifier_steps, self.verifier_lr
        )
    }

    /// By name.
    pub fn by_name(name: &str) -> Result<Self> {
        match name {
            "quick" => Ok(Self::quick()),
            "standard" => Ok(Self::standard()),
            o => anyhow::bail!("unknown preset `{o}`: use quick or standard"),
        }
    }
}

/// Options of [`run`].
#[derive(Debug, Clone)]
pub struct LabOptions {
    /// Sizes and budgets.
    pub preset: Preset,
    /// Seed of everything.
    pub seed: u64,
    /// Run folder.
    pub out: PathBuf,
}

/// Every progress bar of a run, so the bars of stages that run at once stack instead of
/// drawing over each other.
static BARS: LazyLock<MultiProgress> = LazyLock::new(MultiProgress::new);

fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = BARS.add(ProgressBar::new(len));
    pb.set_style(
        ProgressStyle::with_template("{msg:>22} [{bar:30}] {pos}/{len} {prefix} ({elapsed}, eta {eta})")
            .unwrap()
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

fn say(msg: &str) {
    BARS.suspend(|| eprintln!("{msg}"));
}

/// The problems of a run: policy-training, annotation and evaluation splits.
pub struct Splits {
    /// For training the policy.
    pub policy: Vec<LabProblem>,
    /// For annotation (verifier training).
    pub label: Vec<LabProblem>,
    /// Held out for evaluation.
    pub eval: Vec<LabProblem>,
}

/// The splits of a run. Training problems (policy, then annotation) come from the seed's first
/// random stream; held-out problems from a second stream, so the evaluation set does not move when
/// a training budget changes, and without any question a training problem already asked
/// (decontamination, as real benchmarks are screened). Held-out ids are `e00000`, `e00001`, ….
fn splits(p: &Preset, seed: u64) -> Splits {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut policy: Vec<LabProblem> = (0..p.policy_problems + p.label_problems)
        .map(|i| task::generate(&mut rng, i))
        .collect();
    let label = policy.split_off(p.policy_problems);
    let seen: HashSet<&str> = policy.iter().chain(&label).map(|q| q.question.as_str()).collect();
    let mut eval_rng = ChaCha8Rng::seed_from_u64(seed);
    eval_rng.set_stream(1);
    let eval = (0..)
        .map(|i| task::generate(&mut eval_rng, i))
        .filter(|q| !seen.contains(q.question.as_str()))
        .take(p.eval_problems)
        .enumerate()
        .map(|(i, q)| LabProblem {
            id: format!("e{i:05}"),
            ..q
        })
        .collect();
    Splits { policy, label, eval }
}

fn shape(vocab: usize, (hidden, layers): (usize, usize), head: HeadKind) -> ModelConfig {
    ModelConfig::tiny(vocab, hidden, layers, 4, 2, head)
}

fn done_marker(dir: &Path) -> PathBuf {
    dir.join("DONE")
}

/// Train (or resume, or reuse) a model in `dir`, from scratch or from the weights in `init`
/// (its decoder; a head it lacks starts fresh).
#[allow(clippy::too_many_arguments)]
fn train_stage(
    dir: &Path,
    what: &str,
    cfg: ModelConfig,
    init: Option<&Path>,
    train_set: &[stepwise_model::train::Example],
    valid: &[stepwise_model::train::Example],
    objective: Objective,
    tc: TrainConfig,
) -> Result<Model> {
    let dev = Device::Cpu;
    if done_marker(dir).exists() {
        say(&format!("{what}: cached in {}", dir.display()));
        return Model::load(dir, &dev);
    }
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("tokenizer.json"), vocab::tokenizer_json())?;
    let varmap = VarMap::new();
    let mut model = match init {
        Some(from) => Model::load_trainable(from, cfg, &varmap, &dev, tc.seed)?,
        None => Model::fresh(cfg, &varmap, &dev, tc.seed)?,
    };
    let pb = bar(tc.steps as u64, what);
    let tc = TrainConfig {
        out_dir: Some(dir.to_path_buf()),
        ..tc
    };
    let state = train(&mut model, &varmap, train_set, valid, objective, &tc, |s, l| {
        pb.set_position(s as u64);
        pb.set_prefix(format!("loss {l:.3}"));
    })?;
    pb.finish_and_clear();
    let m = if valid.is_empty() {
        None
    } else {
        Some(evaluate(&model, valid, objective, 64)?)
    };
    std::fs::write(
        dir.join("train_metrics.json"),
        serde_json::to_string_pretty(&(state.history, &m))?,
    )?;
    std::fs::write(done_marker(dir), "")?;
    say(&format!(
        "{what}: trained {} steps{}",
        tc.steps,
        m.map(|m| format!(", validation loss {:.3}", m.loss))
            .unwrap_or_default()
    ));
    Ok(model)
}

/// Per-problem sample record (one journal line).
#[derive(Serialize, Deserialize)]
struct Samples {
    problem_id: String,
    solutions: Vec<Solution>,
}

fn sample_stage(
    path: &Path,
    what: &str,
    problems: &[LabProblem],
    n: usize,
    policy: &LabPolicy,
    seed: u64,
) -> Result<Vec<Solution>> {
    let (mut j, mut kept) = Journal::open::<Samples>(path, |s| s.problem_id.clone())?;
    let todo: Vec<&LabProblem> = problems.iter().filter(|p| !j.contains(&p.id)).collect();
    if !todo.is_empty() {
        let pb = bar(problems.len() as u64, what);
        pb.set_position((problems.len() - todo.len()) as u64);
        for p in todo {
            let s = problem_seed(seed, &p.id);
            let outs = stepwise_label::Policy::complete(policy, &p.question, &[], n, s)?;
            let solutions = outs
                .into_iter()
                .enumerate()
                .map(|(k, steps)| task::solution(p, format!("{}-s{k}", p.id), steps, "lab-policy"))
                .collect();
            let rec = Samples {
                problem_id: p.id.clone(),
                solutions,
            };
            j.append(p.id.clone(), &rec)?;
            kept.push(rec);
            pb.inc(1);
        }
        pb.finish_and_clear();
    }
    sort_like(&mut kept, problems.iter().map(|p| p.id.as_str()), |s| {
        s.problem_id.as_str()
    });
    // Graded again by the current oracle: samples cached by an earlier version keep their text,
    // not their verdicts.
    let by_id: HashMap<&str, &LabProblem> = problems.iter().map(|p| (p.id.as_str(), p)).collect();
    let mut out = Vec::new();
    for rec in kept {
        let p = by_id
            .get(rec.problem_id.as_str())
            .with_context(|| format!("{}: problem {} is not in this run", path.display(), rec.problem_id))?;
        for s in rec.solutions {
            let steps = s.steps.into_iter().map(|st| st.text).collect();
            out.push(task::solution(p, s.id, steps, "lab-policy"));
        }
    }
    Ok(out)
}

fn problem_seed(seed: u64, id: &str) -> u64 {
    id.bytes().fold(seed ^ 0x9e3779b97f4a7c15, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

/// Monte Carlo annotation of `sols`, resumable; returns labelled solutions and rollouts spent.
pub fn annotate_stage(
    path: &Path,
    sols: &[Solution],
    policy: &LabPolicy,
    rollouts: usize,
    seed: u64,
) -> Result<(Vec<Solution>, usize)> {
    let pb = bar(sols.len() as u64, "annotating (MC)");
    let correct = |s: &Solution, full: &[String]| task::stated_answer(full).as_deref() == s.gold_answer.as_deref();
    let out = annotate_resumable(path, sols, policy, &correct, &McOptions { rollouts, seed }, |done| {
        pb.set_position(done as u64)
    })?;
    pb.finish_and_clear();
    Ok(out)
}

/// Hard Monte Carlo labels (Math-Shepherd hard estimation: good when any rollout succeeded).
fn hard_mc(s: &Solution) -> Solution {
    let mut s = s.clone();
    for st in &mut s.steps {
        if let Some(l) = &st.label {
            st.label = Some(StepLabel::from_bool(l.is_good(), l.source.clone()));
        }
    }
    s
}

/// The lab's verifiers: trained with the same code, budget and head, scored the same way.
struct Verifiers<'a> {
    preset: &'a Preset,
    out: &'a Path,
    policy: &'a Model,
    tok: &'a Tokenizer,
    seed: u64,
}

impl Verifiers<'_> {
    /// The `reward.json` of a log-ratio or likelihood verifier (`None` for the classifier head):
    /// the policy (one folder up) or a constant is its reference.
    fn spec(&self, outcome: bool) -> Option<RewardSpec> {
        let p = self.preset;
        let reference_logprob = match p.verifier_head {
            VerifierHead::Classifier => return None,
            VerifierHead::LogRatio => None,
            VerifierHead::Likelihood => Some(p.verifier_reference_logprob),
        };
        let log_ratio = LogRatio {
            beta: p.verifier_beta,
            // An ORM's score is the whole solution's: its last step's span starts at the first.
            cumulative: outcome,
            reference_logprob,
        };
        let reference = reference_logprob.is_none().then(|| PathBuf::from("../policy"));
        Some(RewardSpec::new(reference, SEP, log_ratio))
    }

    /// Train (or reuse) the verifier in `dir` on step labels, or on outcomes when `outcome`.
    fn train(&self, dir: &str, what: &str, sols: &[Solution], outcome: bool) -> Result<Model> {
        let p = self.preset;
        let spec = self.spec(outcome);
        let opts = LabelOptions {
            separator: SEP.into(),
            outcome,
            separator_after_problem: spec.is_some(),
            ..Default::default()
        };
        let mut examples = label_examples(self.tok, sols, &opts)?;
        let (cfg, init, objective) = match (&spec, p.verifiers_from_policy) {
            (Some(_), false) => {
                anyhow::bail!("the log-ratio and likelihood verifier heads need verifiers_from_policy = true")
            }
            (Some(spec), true) => {
                if p.verifier_extra_layers > 0 {
                    anyhow::bail!(
                        "verifier_extra_layers is for the classifier head: the log-ratio and likelihood heads are the policy's own LM"
                    )
                }
                if spec.reference.is_some() && !done_marker(&self.out.join(dir)).exists() {
                    stepwise_model::log_ratio::attach_reference(self.policy, &mut examples, 64)?;
                }
                let objective = Objective::LogRatio(spec.log_ratio);
                (self.policy.config.clone(), Some(self.out.join("policy")), objective)
            }
            (None, from_policy) => {
                let mut c = if from_policy {
                    let mut c = self.policy.config.clone().with_head(HeadKind::TokenClassification);
                    c.num_hidden_layers += p.verifier_extra_layers;
                    c
                } else {
                    shape(self.tok.vocab_size(), p.verifier_shape, HeadKind::TokenClassification)
                };
                // PRMs are 2-class token classifiers (TRL's layout); the ORM is the usual scalar
                // value head read at the last token.
                if outcome {
                    c = c.with_value_head();
                }
                let init = from_policy.then(|| self.out.join("policy"));
                (c, init, Objective::Classify)
            }
        };
        let tc = TrainConfig {
            lr: p.verifier_lr,
            warmup: p.verifier_steps / 20,
            steps: p.verifier_steps,
            batch_size: 32,
            eval_every: 0,
            seed: self.seed ^ 5,
            ..Default::default()
        };
        let model = train_stage(
            &self.out.join(dir),
            what,
            cfg,
            init.as_deref(),
            &examples,
            &[],
            objective,
            tc,
        )?;
        if let Some(spec) = spec {
            spec.save(&self.out.join(dir))?;
        }
        Ok(model)
    }

    /// Step scores on `sols` of a verifier trained on step labels, or on outcomes when `outcome`.
    fn score(&self, model: &Model, outcome: bool, sols: &[Solution], what: &str) -> Result<Vec<Vec<f32>>> {
        let (layout, reference) = match self.spec(outcome) {
            Some(spec) => (spec.layout(), spec.reference.is_some().then_some(self.policy)),
            None => (PrmLayout::TokenClassifier { separator: SEP.into() }, None),
        };
        let scorer = StepScorer {
            model,
            tokenizer: self.tok,
            layout,
            reference,
        };
        let pb = bar(sols.len() as u64, what);
        let mut out = Vec::with_capacity(sols.len());
        for chunk in sols.chunks(64) {
            let enc = chunk
                .iter()
                .map(|s| scorer.encode(&s.question, &s.step_texts()))
                .collect::<Result<Vec<_>>>()?;
            out.extend(scorer.score_batch(&enc)?);
            pb.inc(chunk.len() as u64);
        }
        pb.finish_and_clear();
        Ok(out)
    }
}

fn write_jsonl<T: Serialize>(path: &Path, items: &[T]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    stepwise_core::io::write_jsonl(&tmp, items)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Record the preset and seed in `out/preset.json`, or check that they are those the folder was
/// started with: its cached stages belong to that run, and reusing them under other settings
/// would mix two runs without a word.
fn claim_run_folder(out: &Path, p: &Preset, seed: u64) -> Result<()> {
    let path = out.join("preset.json");
    let ours = serde_json::to_value((p, seed))?;
    if path.exists() {
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let theirs: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
        if theirs != ours {
            let field = differing_field(&theirs, &ours);
            anyhow::bail!(
                "{} was started with other settings ({field} differs; see {}): its cached stages belong to that run. Use another --out, or delete the folder to start over",
                out.display(),
                path.display()
            );
        }
        return Ok(());
    }
    std::fs::write(&path, serde_json::to_string_pretty(&ours)?)?;
    Ok(())
}

/// The first preset field (or `seed`) in which two `[preset, seed]` records differ.
fn differing_field(a: &serde_json::Value, b: &serde_json::Value) -> String {
    if a.get(1) != b.get(1) {
        return "seed".into();
    }
    let (pa, pb) = (&a[0], &b[0]);
    pb.as_object()
        .and_then(|o| o.keys().find(|k| pa.get(k.as_str()) != pb.get(k.as_str())).cloned())
        .unwrap_or_else(|| "the preset".into())
}

/// Run the whole loop; returns the report (also written to the run folder).
pub fn run(o: &LabOptions) -> Result<Report> {
    let p = &o.preset;
    std::fs::create_dir_all(&o.out).with_context(|| format!("creating {}", o.out.display()))?;
    claim_run_folder(&o.out, p, o.seed)?;
    let tok = vocab::tokenizer()?;
    let v = tok.vocab_size();
    let sp = splits(p, o.seed);
    write_jsonl(
        &o.out.join("problems.jsonl"),
        &sp.eval
            .iter()
            .chain(&sp.label)
            .map(LabProblem::problem)
            .collect::<Vec<_>>(),
    )?;

    // 1. Policy: next-token LM on reference solutions, some with a slip.
    let mut rng = ChaCha8Rng::seed_from_u64(o.seed ^ 1);
    let lm: Vec<_> = sp
        .policy
        .iter()
        .map(|q| lm_example(&tok, &q.question, &task::noisy_reference(q, &mut rng, p.slip)))
        .collect::<Result<_>>()?;
    let (lm_valid, lm_train) = lm.split_at(lm.len() / 20);
    let tc = TrainConfig {
        lr: 3e-3,
        warmup: p.policy_steps / 20,
        steps: p.policy_steps,
        batch_size: 32,
        eval_every: p.policy_steps / 4,
        seed: o.seed,
        ..Default::default()
    };
    let policy_model = train_stage(
        &o.out.join("policy"),
        "training policy",
        shape(v, p.policy_shape, HeadKind::CausalLm),
        None,
        lm_train,
        lm_valid,
        Objective::Lm,
        tc,
    )?;
    let policy = LabPolicy {
        model: &policy_model,
        tok: &tok,
        temperature: p.temperature,
        max_new_tokens: 64,
    };

    // 2. Samples for annotation and for evaluation (shared-prefix KV cache).
    let label_sols = sample_stage(
        &o.out.join("samples_label.jsonl"),
        "sampling (label set)",
        &sp.label,
        p.label_samples,
        &policy,
        o.seed ^ 2,
    )?;
    let eval_sols = sample_stage(
        &o.out.join("samples_eval.jsonl"),
        "sampling (eval set)",
        &sp.eval,
        p.eval_samples,
        &policy,
        o.seed ^ 3,
    )?;

    // 3. Step labels: Monte Carlo rollouts, and the oracle for comparison.
    let (mc, rollouts_spent) = annotate_stage(
        &o.out.join("labels_mc.jsonl"),
        &label_sols,
        &policy,
        p.rollouts,
        o.seed ^ 4,
    )?;
    let oracle: Vec<Solution> = label_sols.iter().map(oracle_labelled).collect();
    write_jsonl(&o.out.join("labels_oracle.jsonl"), &oracle)?;

    // 4. Verifiers, same code and budget: PRM on MC labels, PRM on oracle labels, ORM.
    let mc_train: Vec<Solution> = match p.mc_labels {
        McLabels::Hard => mc.iter().map(hard_mc).collect(),
        McLabels::Soft => mc.clone(),
    };
    let verifiers = Verifiers {
        preset: p,
        out: &o.out,
        policy: &policy_model,
        tok: &tok,
        seed: o.seed,
    };
    // The three train at once: one training keeps about one core busy (its small ops run one
    // after another), and each is seeded on its own, so the weights are those of one at a time.
    let (prm_mc, prm_or, orm) = std::thread::scope(|scope| {
        let mc = scope.spawn(|| verifiers.train("prm_mc", "training PRM (MC labels)", &mc_train, false));
        let or = scope.spawn(|| verifiers.train("prm_oracle", "training PRM (oracle)", &oracle, false));
        let orm = verifiers.train("orm", "training ORM", &label_sols, true);
        let join = |h: std::thread::ScopedJoinHandle<'_, Result<Model>>| {
            h.join()
                .map_err(|_| anyhow::anyhow!("a verifier's training thread panicked"))?
        };
        anyhow::Ok((join(mc)?, join(or)?, orm?))
    })?;

    // 5. Score the evaluation samples with every verifier.
    let s_mc = verifiers.score(&prm_mc, false, &eval_sols, "scoring (PRM-MC)")?;
    let s_or = verifiers.score(&prm_or, false, &eval_sols, "scoring (PRM-oracle)")?;
    let s_orm = verifiers.score(&orm, true, &eval_sols, "scoring (ORM)")?;
    let scored: Vec<Solution> = eval_sols
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut s = oracle_labelled(s);
            for (st, x) in s.steps.iter_mut().zip(&s_mc[i]) {
                st.score = Some(*x);
            }
            s.meta.insert("prm_oracle_scores".into(), serde_json::json!(s_or[i]));
            s.meta.insert(
                "orm_score".into(),
                serde_json::json!(s_orm[i].last().copied().unwrap_or(0.0)),
            );
            s
        })
        .collect();
    write_jsonl(&o.out.join("scored_eval.jsonl"), &scored)?;
    let s_policy = eval_sols
        .iter()
        .map(|s| crate::policy::step_end_probabilities(&policy_model, &tok, &s.question, &s.step_texts()))
        .collect::<Result<Vec<_>>>()?;

    // 6. Evaluate and report.
    let report = crate::report::evaluate(
        p,
        o.seed,
        &sp.eval,
        &scored,
        &s_mc,
        &s_or,
        &s_orm,
        &s_policy,
        &mc,
        &oracle,
        rollouts_spent,
    )?;
    write_report(&o.out, &report)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepwise_core::{Provenance, Step};

    #[test]
    fn overrides_set_fields_by_name_and_name_what_is_wrong() {
        let sets = [
            "mc_labels=soft",
            "verifier_head=log_ratio",
            "verifier_lr=0.001",
            "policy_shape=[32,1]",
        ];
        let p = Preset::standard().with_overrides(&sets.map(String::from)).unwrap();
        assert_eq!(p.mc_labels, McLabels::Soft);
        assert_eq!(p.verifier_head, VerifierHead::LogRatio);
        assert_eq!((p.verifier_lr, p.policy_shape), (0.001, (32, 1)));
        let err = format!(
            "{:#}",
            Preset::quick().with_overrides(&["rollout=3".into()]).unwrap_err()
        );
        assert!(err.contains("rollout"), "{err}");
        assert!(Preset::quick().with_overrides(&["mc_labels=medium".into()]).is_err());
    }

    #[test]
    fn held_out_problems_ignore_training_budgets_and_never_repeat_a_training_question() {
        let small = Preset::quick();
        let big = Preset::quick()
            .with_overrides(&["label_problems=300".into(), "policy_problems=2000".into()])
            .unwrap();
        let (a, b) = (splits(&small, 7), splits(&big, 7));
        let questions = |s: &Splits| s.eval.iter().map(|q| q.question.clone()).collect::<Vec<_>>();
        assert_eq!(
            questions(&a),
            questions(&b),
            "the held-out set must not move with the budgets"
        );
        assert_eq!(b.eval.len(), big.eval_problems);
        let seen: HashSet<&str> = b.policy.iter().chain(&b.label).map(|q| q.question.as_str()).collect();
        assert!(b.eval.iter().all(|q| !seen.contains(q.question.as_str())));
        assert_eq!(b.eval[3].id, "e00003");
        let ids: HashSet<&str> = b.label.iter().chain(&b.eval).map(|q| q.id.as_str()).collect();
        assert_eq!(ids.len(), b.label.len() + b.eval.len(), "problem ids are unique");
    }

    #[test]
    fn a_run_folder_refuses_other_settings() {
        let dir = std::env::temp_dir().join(format!("stepwise-claim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = Preset::quick();
        claim_run_folder(&dir, &p, 1).unwrap();
        claim_run_folder(&dir, &p, 1).expect("the same settings resume");
        let err = format!("{:#}", claim_run_folder(&dir, &p, 2).unwrap_err());
        assert!(err.contains("seed differs") && err.contains("--out"), "{err}");
        let other = Preset::quick().with_overrides(&["rollouts=3".into()]).unwrap();
        let err = format!("{:#}", claim_run_folder(&dir, &other, 1).unwrap_err());
        assert!(err.contains("rollouts differs"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn hard_estimation_is_any_rollout_succeeded() {
        let soft = |hits| StepLabel::soft(hits as f32 / 8.0, Provenance::MonteCarlo { rollouts: 8, hits });
        let s = Solution {
            steps: vec![Step::labelled("a", soft(1)), Step::labelled("b", soft(0))],
            ..Default::default()
        };
        let hard: Vec<f32> = hard_mc(&s)
            .steps
            .iter()
            .map(|st| st.label.as_ref().unwrap().prob(0.5))
            .collect();
        assert_eq!(hard, [1.0, 0.0]);
    }
}
