//! Step-level search over actions on worlds of its own: beam search guided by PRM-MC, the
//! environment stepping every candidate ([`stepwise_agent::search`]), against best-of-N over as
//! many whole trajectories as the beam samples actions per depth (picked by PRM-MC-min) and
//! against one sampled trajectory, paired world by world.

use super::evaluate::{lucky_ids, lucky_share};
use super::Ctx;
use anyhow::Result;
use serde::Serialize;
use serde_json::json;
use stepwise_agent::rollout::{each_resumable, fnv};
use stepwise_agent::search::{beam_search, BeamOptions};
use stepwise_agent::{Games, Oracle, Rooms};
use stepwise_core::{Problem, Solution};
use stepwise_eval::paired::{paired_difference, PairedDifference};
use stepwise_model::Model;
use stepwise_search::{aggregate, Aggregation};

/// What search found.
#[derive(Debug, Clone, Serialize)]
pub struct SearchReport {
    /// Worlds searched.
    pub worlds: usize,
    /// Beams kept, and actions sampled from each.
    pub beam: (usize, usize),
    /// Success of: `beam` (PRM-MC-guided beam search), `best-of-N` (PRM-MC-min over N = width ×
    /// expand sampled trajectories), `sample` (one sampled trajectory, the mean over N).
    pub success: std::collections::BTreeMap<String, f64>,
    /// Lucky successes among each method's successes.
    pub lucky: std::collections::BTreeMap<String, f64>,
    /// Policy tokens per world.
    pub tokens: std::collections::BTreeMap<String, f64>,
    /// Environment steps per world.
    pub env_steps: std::collections::BTreeMap<String, f64>,
    /// Beam against best-of-N and against one sample.
    pub paired: Vec<PairedDifference>,
}

fn meta_u64(s: &Solution, key: &str) -> f64 {
    s.meta.get(key).and_then(serde_json::Value::as_u64).unwrap_or(0) as f64
}

impl Ctx<'_> {
    /// Beam search and its baselines on `worlds`, guided by `prm` (PRM-MC).
    pub fn search(&self, worlds: &[Problem], prm: &Model) -> Result<Option<SearchReport>> {
        let a = &self.preset.agent;
        if worlds.is_empty() {
            return Ok(None);
        }
        let (width, expand) = a.beam;
        let n = (width * expand).max(1);
        let env = Rooms::silent(a.max_actions);
        let v = self.verifiers();
        let scorer = v.scorer(prm, false);
        let o = BeamOptions {
            width,
            expand,
            seed: self.seed ^ 6,
        };
        let pb = crate::progress::bar(worlds.len() as u64, "beam search over actions");
        let beams = each_resumable(
            &self.out.join("search_beam.jsonl"),
            worlds,
            1,
            |p, id| {
                let o = BeamOptions {
                    seed: o.seed ^ fnv(id),
                    ..o
                };
                match beam_search(self.policy, &env, &scorer, p, id.to_string(), &o) {
                    Ok((mut s, cost)) => {
                        s.meta.insert("env_steps".into(), json!(cost.env_steps));
                        s
                    }
                    Err(e) => {
                        let mut s =
                            stepwise_agent::rollout::trajectory(p, id.to_string(), p.question.clone(), Vec::new());
                        s.meta.insert("error".into(), json!(format!("{e:#}")));
                        s
                    }
                }
            },
            |d| pb.set_position(d as u64),
        )?;
        pb.finish_and_clear();
        let mut sampled = self.play(
            "trajectories_search.jsonl",
            worlds,
            n,
            "playing the search worlds",
            self.seed ^ 7,
        )?;
        v.score(
            prm,
            false,
            &mut sampled,
            "prm_mc",
            "scoring the search worlds' trajectories",
        )?;
        let games = Games::new(&env, worlds.iter().cloned());
        let label = |ts: &[Solution], file: &str| self.label(file, ts, &Oracle(&games), "oracle labels (search)");
        let (beam_oracle, sampled_oracle) = (
            label(&beams, "search_beam_oracle.jsonl")?,
            label(&sampled, "search_sampled_oracle.jsonl")?,
        );
        Ok(Some(summarize(
            worlds,
            &beams,
            &beam_oracle,
            &sampled,
            &sampled_oracle,
            (width, expand),
            self.seed,
        )))
    }
}

fn won(s: &Solution) -> f64 {
    f64::from(u8::from(s.correct == Some(true)))
}

/// Per world: the beam's success, best-of-N's (PRM-MC-min), one sample's (the mean).
fn summarize(
    worlds: &[Problem],
    beams: &[Solution],
    beam_oracle: &[Solution],
    sampled: &[Solution],
    sampled_oracle: &[Solution],
    beam: (usize, usize),
    seed: u64,
) -> SearchReport {
    let mut per: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    let mut picks: Vec<&Solution> = Vec::new();
    for w in worlds {
        let mine: Vec<&Solution> = sampled.iter().filter(|s| s.problem_id == w.id).collect();
        let b = beams.iter().find(|s| s.problem_id == w.id);
        per.entry("beam").or_default().push(b.map_or(0.0, won));
        let score = |s: &Solution| aggregate(&s.scores_of("prm_mc").unwrap_or_default(), Aggregation::Min);
        let pick = mine.iter().copied().max_by(|x, y| score(x).total_cmp(&score(y)));
        per.entry("best-of-N").or_default().push(pick.map_or(0.0, won));
        picks.extend(pick);
        per.entry("sample")
            .or_default()
            .push(mine.iter().map(|s| won(s)).sum::<f64>() / mine.len().max(1) as f64);
    }
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len().max(1) as f64;
    let (beam_lucky, sampled_lucky) = (lucky_ids(beam_oracle), lucky_ids(sampled_oracle));
    let per_world =
        |ts: &[Solution], key: &str| ts.iter().map(|s| meta_u64(s, key)).sum::<f64>() / worlds.len().max(1) as f64;
    let measure = "search success";
    SearchReport {
        worlds: worlds.len(),
        beam,
        success: per.iter().map(|(k, v)| (k.to_string(), mean(v))).collect(),
        lucky: [
            ("beam".to_string(), lucky_share(beams, &beam_lucky)),
            (
                "best-of-N".to_string(),
                lucky_share(picks.iter().copied(), &sampled_lucky),
            ),
            ("sample".to_string(), lucky_share(sampled, &sampled_lucky)),
        ]
        .into(),
        tokens: [
            ("beam".to_string(), per_world(beams, "tokens")),
            ("best-of-N".to_string(), per_world(sampled, "tokens")),
        ]
        .into(),
        env_steps: [
            ("beam".to_string(), per_world(beams, "env_steps")),
            (
                "best-of-N".to_string(),
                sampled.iter().map(|s| s.steps.len() as f64).sum::<f64>() / worlds.len().max(1) as f64,
            ),
        ]
        .into(),
        paired: vec![
            paired_difference(measure, "beam", &per["beam"], "best-of-N", &per["best-of-N"], seed ^ 10),
            paired_difference(measure, "beam", &per["beam"], "sample", &per["sample"], seed ^ 11),
        ],
    }
}
