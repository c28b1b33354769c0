//! The lab's reasoning domain: multi-step arithmetic word problems from templates, with an exact
//! step checker (the oracle). Steps are one equation each (`4 * 12 = 48`), comparisons
//! (`48 > 35`) or the final `The answer is X`. Some families have small answer spaces (yes or
//! no, which option, a remainder), so a wrong process can still land on the right answer.

use rand::seq::IndexedRandom;
use rand::Rng;
use serde::{Deserialize, Serialize};
use stepwise_core::{Problem, Provenance, Solution, Step, StepLabel};

/// The lab's reasoning domains: what a problem is, what a step is and how steps are checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Domain {
    /// Arithmetic word problems solved one equation a step (this module).
    #[default]
    Arithmetic,
    /// The same stories with symbols, solved by a straight-line Python function one statement a
    /// step, checked by executing it ([`crate::code`]).
    Code,
    /// An agent in the silent rooms world ([`stepwise_agent::rooms`]): a step is an action
    /// whose effect comes back from the environment; the lab runs its own loop for it
    /// ([`crate::agent`]).
    Agent,
}

impl Domain {
    /// Every domain.
    pub const ALL: [Domain; 3] = [Domain::Arithmetic, Domain::Code, Domain::Agent];

    /// As the preset and `metrics.json` spell it.
    pub fn name(self) -> &'static str {
        match self {
            Domain::Arithmetic => "arithmetic",
            Domain::Code => "code",
            Domain::Agent => "agent",
        }
    }

    /// Whether this is the default domain (left out of serialized problems).
    pub fn is_arithmetic(&self) -> bool {
        *self == Domain::Arithmetic
    }

    /// Problem `index` of a run of this domain, drawn from `rng`.
    pub fn generate(self, rng: &mut impl Rng, index: usize) -> LabProblem {
        match self {
            Domain::Arithmetic => crate::problems::arithmetic(rng, index),
            Domain::Code => crate::problems::code(rng, index),
            Domain::Agent => crate::agent::games::lab_problem(rng.random(), index),
        }
    }

    /// The final answer a solution of this domain gives: the `The answer is X` it states, or what
    /// its program returns.
    pub fn answer(self, steps: &[String]) -> Option<String> {
        match self {
            Domain::Arithmetic => stated_answer(steps),
            Domain::Code => crate::code::answer(steps),
            // A trajectory's outcome is the environment's, not something its text states.
            Domain::Agent => None,
        }
    }
}

impl std::str::FromStr for Domain {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Domain> {
        Domain::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| anyhow::anyhow!("unknown domain `{s}`: use arithmetic, code or agent"))
    }
}

/// One generated problem with its reference solution.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabProblem {
    /// Stable id.
    pub id: String,
    /// Template family.
    pub family: String,
    /// Question text.
    pub question: String,
    /// Gold answer.
    pub gold: String,
    /// Quantities stated in the question.
    pub quantities: Vec<i64>,
    /// The two answers of a comparison problem (`yes`/`no`, `first`/`second`): the first when
    /// the first computed total is the larger.
    pub names: Vec<String>,
    /// A correct step-by-step solution.
    pub steps: Vec<String>,
    /// The domain it belongs to.
    #[serde(default, skip_serializing_if = "Domain::is_arithmetic")]
    pub domain: Domain,
}

impl LabProblem {
    /// As a stepwise [`Problem`].
    pub fn problem(&self) -> Problem {
        let mut meta = stepwise_core::Meta::new();
        meta.insert("family".into(), self.family.clone().into());
        if !self.domain.is_arithmetic() {
            meta.insert("domain".into(), self.domain.name().into());
        }
        Problem {
            id: self.id.clone(),
            question: self.question.clone(),
            gold_answer: Some(self.gold.clone()),
            source: Some("stepwise-lab".into()),
            meta,
        }
    }
}

fn op_text(op: char, a: i64, b: i64) -> Option<i64> {
    match op {
        '+' => Some(a + b),
        '-' => Some(a - b),
        '*' => Some(a * b),
        '%' if b > 0 => Some(a.rem_euclid(b)),
        _ => None,
    }
}

/// What a step says.
/// What a calculator gives for an equation step's left side (`a op b` of `a op b = c`), the
/// lab judge's tool; `None` for any other step.
pub fn calculator(step: &str) -> Option<i64> {
    match parse_step(step)? {
        Parsed::Equation(a, op, b, _) => op_text(op, a, b),
        _ => None,
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Parsed {
    Equation(i64, char, i64, i64),
    Compare(i64, char, i64),
    Answer(String),
}

fn parse_step(s: &str) -> Option<Parsed> {
    let t: Vec<&str> = s.split_whitespace().collect();
    match t.as_slice() {
        [a, op, b, "=", c] if op.len() == 1 => Some(Parsed::Equation(
            a.parse().ok()?,
            op.chars().next()?,
            b.parse().ok()?,
            c.parse().ok()?,
        )),
        [a, rel @ (">" | "<"), b] => Some(Parsed::Compare(a.parse().ok()?, rel.chars().next()?, b.parse().ok()?)),
        ["The", "answer", "is", x] => Some(Parsed::Answer(x.to_string())),
        _ => None,
    }
}

/// The final answer a solution states, if any.
pub fn stated_answer(steps: &[String]) -> Option<String> {
    steps.iter().rev().find_map(|s| match parse_step(s) {
        Some(Parsed::Answer(x)) => Some(x),
        _ => None,
    })
}

/// What a correct solution of a problem may do next, read from its reference solution.
enum Plan {
    /// A running total: a product of the question's first two numbers, then each of `ops`
    /// exactly once, in any order unless `ordered` (chains add what was got and subtract what
    /// was given away; a remainder adds, then divides).
    Running {
        start: (i64, i64),
        ops: Vec<(char, i64)>,
        ordered: bool,
    },
    /// Two products, one per side, compared; the answer names the larger side.
    Compare { sides: [(i64, i64); 2] },
}

impl Plan {
    #[cfg(test)]
    fn sides(&self) -> [(i64, i64); 2] {
        match self {
            Plan::Compare { sides } => *sides,
            Plan::Running { .. } => unreachable!(),
        }
    }

    fn of(p: &LabProblem) -> Plan {
        let eqs: Vec<(i64, char, i64)> = p
            .steps
            .iter()
            .filter_map(|s| match parse_step(s) {
                Some(Parsed::Equation(a, op, b, _)) => Some((a, op, b)),
                _ => None,
            })
            .collect();
        if p.names.len() == 2 {
            return Plan::Compare {
                sides: [(eqs[0].0, eqs[0].2), (eqs[1].0, eqs[1].2)],
            };
        }
        Plan::Running {
            start: (eqs[0].0, eqs[0].2),
            ops: eqs[1..].iter().map(|&(_, op, b)| (op, b)).collect(),
            ordered: eqs[1..].iter().any(|&(_, op, _)| op == '%'),
        }
    }
}

/// Whether `x * y` multiplies exactly the pair `(a, b)`, in either order.
fn is_pair(x: i64, y: i64, (a, b): (i64, i64)) -> bool {
    (x, y) == (a, b) || (x, y) == (b, a)
}

/// The oracle: whether each step is correct, judged as a careful human grader would. A step is
/// wrong when its arithmetic or comparison is false, when it cannot be read, or when it is not
/// a step of any correct solution from where the solution stands: it uses a quantity that is
/// neither in the problem nor the result it should build on, applies an operation the problem
/// does not call for (adds what was given away, uses a number twice), or states an answer
/// that does not follow from the earlier steps or comes before the work is done. Results are
/// carried forward: after a wrong result, a step that builds on it correctly is correct (the
/// first error is what process supervision locates). Valid reorderings of a chain's additions and
/// subtractions are correct. A solution that never states an answer has its last step marked
/// wrong. With every step correct, the stated answer is the gold one. (A code problem's lines
/// are checked by execution instead: [`crate::code`].)
pub fn check_steps(p: &LabProblem, steps: &[String]) -> Vec<bool> {
    let mut verdicts = check_prefix(p, steps);
    if p.domain.answer(steps).is_none() {
        if let Some(last) = verdicts.last_mut() {
            *last = false;
        }
    }
    verdicts
}

/// [`check_steps`] for a solution still being written: not having stated an answer yet is no
/// error.
pub fn check_prefix(p: &LabProblem, steps: &[String]) -> Vec<bool> {
    if p.domain == Domain::Code {
        return crate::code::check_prefix(p, steps);
    }
    match Plan::of(p) {
        Plan::Running { start, ops, ordered } => check_running(steps, start, ops, ordered),
        Plan::Compare { sides } => check_compare(steps, sides, &p.names),
    }
}

fn check_running(steps: &[String], start: (i64, i64), mut ops: Vec<(char, i64)>, ordered: bool) -> Vec<bool> {
    let mut total: Option<i64> = None;
    steps
        .iter()
        .map(|s| match parse_step(s) {
            Some(Parsed::Equation(x, op, y, z)) => {
                let fits = match total {
                    None => op == '*' && is_pair(x, y, start),
                    Some(t) if x == t => {
                        let next = if ordered {
                            ops.first().filter(|&&o| o == (op, y)).map(|_| 0)
                        } else {
                            ops.iter().position(|&o| o == (op, y))
                        };
                        next.map(|i| ops.remove(i)).is_some()
                    }
                    Some(_) => false,
                };
                total = Some(z);
                fits && op_text(op, x, y) == Some(z)
            }
            Some(Parsed::Answer(a)) => ops.is_empty() && total.is_some_and(|t| t.to_string() == a),
            _ => false,
        })
        .collect()
}

fn check_compare(steps: &[String], sides: [(i64, i64); 2], names: &[String]) -> Vec<bool> {
    let mut products: [Option<i64>; 2] = [None, None];
    steps
        .iter()
        .map(|s| match parse_step(s) {
            Some(Parsed::Equation(x, '*', y, z)) => {
                let side = (0..2).find(|&i| products[i].is_none() && is_pair(x, y, sides[i]));
                match side {
                    Some(i) => {
                        products[i] = Some(z);
                        x * y == z
                    }
                    None => false,
                }
            }
            Some(Parsed::Compare(x, rel, y)) => match products {
                [Some(u), Some(v)] => ((x, y) == (u, v) || (x, y) == (v, u)) && if rel == '>' { x > y } else { x < y },
                _ => false,
            },
            Some(Parsed::Answer(a)) => match products {
                [Some(u), Some(v)] => a == names[usize::from(u <= v)],
                _ => false,
            },
            _ => false,
        })
        .collect()
}

/// A solution record for `steps` with oracle labels and the outcome graded against the gold.
pub fn solution(p: &LabProblem, id: String, steps: Vec<String>, generator: &str) -> Solution {
    let verdicts = check_steps(p, &steps);
    let answer = p.domain.answer(&steps);
    let correct = answer.as_deref() == Some(p.gold.as_str());
    let mut meta = stepwise_core::Meta::new();
    meta.insert("family".into(), p.family.clone().into());
    meta.insert("oracle".into(), serde_json::json!(verdicts));
    Solution {
        id,
        problem_id: p.id.clone(),
        question: p.question.clone(),
        steps: steps.into_iter().map(Step::new).collect(),
        final_answer: answer,
        gold_answer: Some(p.gold.clone()),
        correct: Some(correct),
        generator: Some(generator.to_string()),
        meta,
        ..Default::default()
    }
}

/// Oracle verdicts kept in a solution's meta, as step labels.
pub fn oracle_labelled(s: &Solution) -> Solution {
    let mut s = s.clone();
    let verdicts: Vec<bool> = s
        .meta
        .get("oracle")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default();
    for (st, ok) in s.steps.iter_mut().zip(verdicts) {
        st.label = Some(StepLabel::from_bool(ok, Provenance::Oracle));
    }
    s
}

/// A reference solution with, at probability `slip`, one arithmetic slip carried forward
/// consistently (the kind of mistake the policy should learn to make sometimes).
pub fn noisy_reference(p: &LabProblem, rng: &mut impl Rng, slip: f64) -> Vec<String> {
    if p.domain == Domain::Code {
        return crate::code::noisy_reference(p, rng, slip);
    }
    let n_eq = p
        .steps
        .iter()
        .filter(|s| matches!(parse_step(s), Some(Parsed::Equation(..))))
        .count();
    if n_eq == 0 || !rng.random_bool(slip) {
        return p.steps.clone();
    }
    let target = rng.random_range(0..n_eq);
    let mut subst: Vec<(i64, i64)> = Vec::new();
    let mut results = Vec::new();
    let mut out = Vec::new();
    let mut eq = 0;
    let fix = |x: i64, subst: &[(i64, i64)]| subst.iter().rev().find(|(o, _)| *o == x).map_or(x, |(_, n)| *n);
    for s in &p.steps {
        match parse_step(s) {
            Some(Parsed::Equation(a, op, b, c)) => {
                let (a2, b2) = (fix(a, &subst), fix(b, &subst));
                let mut c2 = op_text(op, a2, b2).unwrap_or(c);
                if eq == target {
                    let delta = *[-2, -1, 1, 2, 10].choose(rng).unwrap();
                    let slipped = (c2 + delta).max(0);
                    c2 = if slipped == c2 { c2 + 1 } else { slipped };
                }
                if c2 != c {
                    subst.push((c, c2));
                }
                results.push(c2);
                out.push(format!("{a2} {op} {b2} = {c2}"));
                eq += 1;
            }
            Some(Parsed::Compare(a, _, b)) => {
                let (a2, b2) = (fix(a, &subst), fix(b, &subst));
                out.push(if a2 > b2 {
                    format!("{a2} > {b2}")
                } else {
                    format!("{a2} < {b2}")
                });
            }
            Some(Parsed::Answer(_)) => {
                let ans = if p.names.len() == 2 {
                    if results[0] > results[1] {
                        p.names[0].clone()
                    } else {
                        p.names[1].clone()
                    }
                } else {
                    results.last().map_or(p.gold.clone(), |r| r.to_string())
                };
                out.push(format!("The answer is {ans}"));
            }
            None => out.push(s.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn references_are_correct_and_slips_are_caught() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let mut lucky = 0;
        for i in 0..500 {
            let p = crate::problems::arithmetic(&mut rng, i);
            assert!(check_steps(&p, &p.steps).iter().all(|&ok| ok), "{:?}", p);
            assert_eq!(stated_answer(&p.steps).as_deref(), Some(p.gold.as_str()));
            let noisy = noisy_reference(&p, &mut rng, 1.0);
            let v = check_steps(&p, &noisy);
            assert!(v.iter().any(|ok| !ok), "a slip must be caught: {noisy:?}");
            if stated_answer(&noisy).as_deref() == Some(p.gold.as_str()) {
                lucky += 1;
            }
        }
        assert!(
            lucky > 0,
            "small answer spaces must let some wrong processes land on the right answer"
        );
    }

    /// A chain's steps for a start product and running operations, results carried forward.
    fn running_steps((a, b): (i64, i64), ops: &[(char, i64)]) -> Vec<String> {
        let mut total = a * b;
        let mut steps = vec![format!("{a} * {b} = {total}")];
        for &(op, c) in ops {
            let next = op_text(op, total, c).unwrap();
            steps.push(format!("{total} {op} {c} = {next}"));
            total = next;
        }
        steps.push(format!("The answer is {total}"));
        steps
    }

    fn plan_parts(p: &LabProblem) -> ((i64, i64), Vec<(char, i64)>) {
        match Plan::of(p) {
            Plan::Running { start, ops, .. } => (start, ops),
            Plan::Compare { .. } => unreachable!(),
        }
    }

    #[test]
    fn process_errors_with_right_arithmetic_are_wrong_and_valid_reorderings_are_right() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let (mut flipped, mut reordered, mut compared) = (0, 0, 0);
        for i in 0..400 {
            let p = crate::problems::arithmetic(&mut rng, i);
            if p.names.len() == 2 {
                // Both products, the second side first: still correct.
                let mut steps = p.steps.clone();
                steps.swap(0, 1);
                assert!(check_steps(&p, &steps).iter().all(|&ok| ok), "{steps:?}");
                // Multiplying across the sides is not a step of any correct solution.
                let Some(Parsed::Equation(a, _, _, _)) = parse_step(&p.steps[0]) else {
                    unreachable!()
                };
                let Some(Parsed::Equation(_, _, d, _)) = parse_step(&p.steps[1]) else {
                    unreachable!()
                };
                let mut cross = p.steps.clone();
                cross[0] = format!("{a} * {d} = {}", a * d);
                if !is_pair(a, d, Plan::of(&p).sides()[0]) && !is_pair(a, d, Plan::of(&p).sides()[1]) {
                    assert!(!check_steps(&p, &cross)[0], "{cross:?}");
                }
                compared += 1;
                continue;
            }
            let (start, ops) = plan_parts(&p);
            assert_eq!(running_steps(start, &ops), p.steps);
            // Subtracting what was got (or adding what was given away), arithmetic right.
            if let Some(j) = ops.iter().position(|&(op, _)| op == '+' || op == '-') {
                let mut wrong = ops.clone();
                wrong[j].0 = if wrong[j].0 == '+' { '-' } else { '+' };
                let steps = running_steps(start, &wrong);
                let v = check_steps(&p, &steps);
                // The flipped step, or (when it matches another of the problem's operations,
                // a valid reordering) a later one, is an error; none before it.
                assert!(v[j + 1..].contains(&false), "{steps:?} {v:?}");
                assert!(v[..=j].iter().all(|&ok| ok), "{steps:?} {v:?}");
                flipped += 1;
            }
            // Using a number twice and skipping another.
            if ops.len() >= 2 && ops.iter().filter(|&&o| o == ops[0]).count() == 1 && ops[1].0 != '%' {
                let mut twice = ops.clone();
                twice[1] = twice[0];
                let v = check_steps(&p, &running_steps(start, &twice));
                assert!(!v[2], "{twice:?} {v:?}");
            }
            // The same additions and subtractions in another order reach the gold answer.
            if p.family != "remainder" && ops.len() >= 2 {
                let mut other = ops.clone();
                other.reverse();
                let steps = running_steps(start, &other);
                assert!(check_steps(&p, &steps).iter().all(|&ok| ok), "{steps:?}");
                assert_eq!(stated_answer(&steps).as_deref(), Some(p.gold.as_str()));
                reordered += 1;
            }
            // Answering before the work is done.
            let early = vec![p.steps[0].clone(), format!("The answer is {}", start.0 * start.1)];
            assert!(!check_steps(&p, &early)[1]);
        }
        assert!(
            flipped > 50 && reordered > 50 && compared > 50,
            "{flipped} {reordered} {compared}"
        );
    }

    #[test]
    fn a_solution_with_every_step_correct_states_the_gold_answer() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
        let mut all_correct = 0;
        for i in 0..300 {
            let p = crate::problems::arithmetic(&mut rng, i);
            for _ in 0..20 {
                // Drop, repeat or swap steps, slip a result: the kinds of damage samples show.
                let mut steps = noisy_reference(&p, &mut rng, 0.3);
                let j = rng.random_range(0..steps.len());
                let k = rng.random_range(0..steps.len());
                match rng.random_range(0..4) {
                    0 if steps.len() > 2 => {
                        steps.remove(j);
                    }
                    1 => steps.insert(j, steps[k].clone()),
                    2 => steps.swap(j, k),
                    _ => {}
                }
                if check_steps(&p, &steps).iter().all(|&ok| ok) {
                    all_correct += 1;
                    assert_eq!(stated_answer(&steps).as_deref(), Some(p.gold.as_str()), "{steps:?}");
                }
            }
        }
        assert!(all_correct > 1000, "{all_correct}");
    }

    #[test]
    fn unknown_quantities_are_wrong() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        let p = crate::problems::arithmetic(&mut rng, 0);
        let mut steps = p.steps.clone();
        steps[0] = "97 + 1 = 98".into();
        assert!(!check_steps(&p, &steps)[0]);
    }
}
