//! Solutions as best-of-N candidates, grouped by problem: the one place a scored file or a lab
//! run becomes what the selectors rank.

use crate::Candidate;
use anyhow::{bail, Result};
use stepwise_core::Solution;

/// The solutions of `sols` grouped by `problem_id` (groups in order of first appearance), each as
/// a [`Candidate`]: its step scores from verifier `prm` (empty when `None`), its outcome score
/// from verifier `orm`'s last step (0 when `None`). Every solution needs `correct` and the scores
/// asked for; the error names the first record (1-based) that lacks them.
pub fn group_candidates(sols: &[Solution], prm: Option<&str>, orm: Option<&str>) -> Result<Vec<Vec<Candidate>>> {
    let mut groups: Vec<Vec<Candidate>> = Vec::new();
    let mut index = std::collections::HashMap::new();
    for (i, s) in sols.iter().enumerate() {
        let at = || format!("record {} (`{}`)", i + 1, s.id);
        let Some(correct) = s.correct else {
            bail!("{}: field `correct`: missing (grade the samples first)", at());
        };
        let scores = |name: &str| match s.scores_of(name) {
            Some(v) => Ok(v),
            None => bail!(
                "{}: field `scores.{name}`: missing or not one per step (run `stepwise score --name {name}`)",
                at()
            ),
        };
        let step_scores = match prm {
            Some(name) => scores(name)?,
            None => Vec::new(),
        };
        let outcome_score = match orm {
            Some(name) => scores(name)?.last().copied().unwrap_or(0.0),
            None => 0.0,
        };
        let g = *index.entry(s.problem_id.as_str()).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(Candidate {
            answer: s.final_answer.clone(),
            step_scores,
            outcome_score,
            correct,
        });
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{select, Aggregation, Selector};
    use stepwise_core::seams::{score_solutions, ScoreInput};
    use stepwise_core::testing::{FnScorer, PlainTask};
    use stepwise_core::{Step, Task};

    /// Best-of-N driven through the seams with no model: a scorer that reads the task's step
    /// checker scores every solution, and the PRM's pick is the correct one the vote misses.
    #[test]
    fn best_of_n_through_the_seams() {
        let task = PlainTask::default();
        let steps = [
            vec!["2 + 2 = 5 bad", "answer 5"],
            vec!["2 + 2 = 5 bad", "answer 5"],
            vec!["2 + 2 = 4", "answer 4"],
        ];
        let mut sols: Vec<Solution> = steps
            .iter()
            .enumerate()
            .map(|(k, st)| {
                let mut s = Solution {
                    id: format!("p-{k}"),
                    problem_id: "p".into(),
                    steps: st.iter().map(|t| Step::new(*t)).collect(),
                    gold_answer: Some("4".into()),
                    ..Default::default()
                };
                task.grade_solution(&mut s);
                s
            })
            .collect();
        let checker = FnScorer(|i: &ScoreInput<'_>| {
            let steps: Vec<String> = i.steps.iter().map(|s| s.to_string()).collect();
            let v = task.check_steps(i.problem_id, &steps).unwrap();
            v.into_iter().map(|ok| if ok { 0.9 } else { 0.1 }).collect()
        });
        let tokens = score_solutions(&checker, "prm", &mut sols, 2, |_| {}).unwrap();
        assert_eq!(tokens, 6);
        let groups = group_candidates(&sols, Some("prm"), Some("prm")).unwrap();
        assert_eq!(groups.len(), 1);
        let g: Vec<&Candidate> = groups[0].iter().collect();
        assert_eq!(
            select(&g, Selector::Majority),
            Some(0),
            "the vote follows the wrong majority"
        );
        assert_eq!(select(&g, Selector::Prm(Aggregation::Min)), Some(2));
        assert!(g[2].correct && !g[0].correct);
        let mut unscored = sols[0].clone();
        unscored.scores.clear();
        let err = group_candidates(&[unscored], Some("prm"), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("record 1") && err.contains("scores.prm"), "{err}");
    }
}
