//! The annotation methods by name, built over a policy, a task and (for the judge and
//! consensus) a judge: what `stepwise annotate --method` and the Python package's
//! `stepwise.annotate(method=...)` both run.

use crate::judge::{IndexAnswer, JudgeFormat, ProcessBenchCritique, QuoteAnswer};
use crate::{BinarySearch, Consensus, Judge, McOptions, MonteCarlo, OmegaOptions, OmegaPrm};
use anyhow::{bail, Result};
use stepwise_core::seams::{Annotator, Policy, Task};

/// An annotation method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Monte Carlo rollouts from every step prefix (Math-Shepherd): soft and hard labels.
    Mc,
    /// The first error by bisection (OmegaPRM's binary search): hard labels.
    BinarySearch,
    /// OmegaPRM's rollout tree per problem, searched by MCTS.
    OmegaPrm,
    /// A model asked for the first wrong step (ProcessBench's critique, or a fine-tuned judge).
    Judge,
    /// Monte Carlo labels kept where the judge agrees on the first error (Qwen2.5-Math-PRM).
    Consensus,
}

impl Method {
    /// Every method's name, as the command line and Python take them.
    pub const NAMES: [&'static str; 5] = ["mc", "binary-search", "omegaprm", "judge", "consensus"];

    /// The method called `name` (`binary_search` is taken for `binary-search`).
    pub fn by_name(name: &str) -> Result<Self> {
        Ok(match name {
            "mc" => Method::Mc,
            "binary-search" | "binary_search" => Method::BinarySearch,
            "omegaprm" => Method::OmegaPrm,
            "judge" => Method::Judge,
            "consensus" => Method::Consensus,
            other => bail!("unknown annotation method `{other}`: use {}", Self::NAMES.join(", ")),
        })
    }

    /// Its name, as [`Method::NAMES`] spells it.
    pub fn name(self) -> &'static str {
        match self {
            Method::Mc => "mc",
            Method::BinarySearch => "binary-search",
            Method::OmegaPrm => "omegaprm",
            Method::Judge => "judge",
            Method::Consensus => "consensus",
        }
    }

    /// Whether it asks a judge.
    pub fn needs_judge(self) -> bool {
        matches!(self, Method::Judge | Method::Consensus)
    }
}

/// How a judge is asked and read, by name: `critique` (ProcessBench's prompt, `\boxed{k}`),
/// `index` (a fine-tuned judge's bare index) or `quote` (the first wrong step copied out). The
/// separator a judge's prompt joins steps with comes with it: `"\n"` for the critique, the
/// policy's own for the others.
pub fn judge_format(name: &str) -> Result<(&'static dyn JudgeFormat, bool)> {
    Ok(match name {
        "critique" => (&ProcessBenchCritique, false),
        "index" => (&IndexAnswer, true),
        "quote" => (&QuoteAnswer, true),
        other => bail!("unknown judge format `{other}`: use critique, index or quote"),
    })
}

/// The settings every method reads its part of.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Rollouts per step prefix (Monte Carlo, binary search, OmegaPRM).
    pub rollouts: usize,
    /// Base seed.
    pub seed: u64,
    /// OmegaPRM: searches over each problem's tree of new rollouts after its given solutions'.
    pub search_limit: usize,
    /// The judge: answers sampled per solution (the most frequent verdict wins).
    pub judge_samples: usize,
    /// The judge: take its likeliest verdict instead of sampling ([`Judge::likelihood`]).
    pub judge_likelihood: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            rollouts: 8,
            seed: 0,
            search_limit: 0,
            judge_samples: 4,
            judge_likelihood: false,
        }
    }
}

/// The annotators a method is made of, built once; [`Annotators::get`] hands out the method's.
pub struct Annotators<'a> {
    method: Method,
    mc: MonteCarlo<'a>,
    binary_search: BinarySearch<'a>,
    omegaprm: OmegaPrm<'a>,
    judge: Option<Judge<'a>>,
}

impl<'a> Annotators<'a> {
    /// `method` over `policy` and `task`; `judge` (a model, and how it is asked) for the methods
    /// that ask one.
    pub fn new(
        method: Method,
        policy: &'a dyn Policy,
        task: &'a dyn Task,
        settings: &Settings,
        judge: Option<(&'a dyn Policy, &'a dyn JudgeFormat)>,
    ) -> Result<Self> {
        if method.needs_judge() && judge.is_none() {
            bail!("annotation method {method:?} asks a judge: give one (a model to ask)");
        }
        let options = McOptions {
            rollouts: settings.rollouts,
            seed: settings.seed,
        };
        Ok(Annotators {
            method,
            mc: MonteCarlo {
                policy,
                task,
                options: options.clone(),
            },
            binary_search: BinarySearch { policy, task, options },
            omegaprm: OmegaPrm {
                policy,
                task,
                options: OmegaOptions {
                    rollouts: settings.rollouts,
                    search_limit: settings.search_limit,
                    seed: settings.seed,
                    ..Default::default()
                },
            },
            judge: judge.map(|(policy, format)| Judge {
                policy,
                samples: settings.judge_samples,
                seed: settings.seed,
                format,
                likelihood: settings.judge_likelihood,
            }),
        })
    }

    /// The method's annotator.
    pub fn get(&self) -> Box<dyn Annotator + '_> {
        match (self.method, &self.judge) {
            (Method::BinarySearch, _) => Box::new(&self.binary_search),
            (Method::OmegaPrm, _) => Box::new(&self.omegaprm),
            (Method::Judge, Some(j)) => Box::new(j),
            (Method::Consensus, Some(j)) => Box::new(Consensus {
                first: &self.mc,
                second: j,
            }),
            _ => Box::new(&self.mc),
        }
    }
}
