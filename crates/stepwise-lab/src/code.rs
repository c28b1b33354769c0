//! The lab's second domain: code. The same stories as the arithmetic domain, with symbols for
//! some quantities, solved by a straight-line Python function body, one statement a step:
//!
//! ```text
//! Ann has a boxes of 6 apples . Ann gets c more apples . Ann gives away 3 apples . How many apples does Ann have now ?
//! x = a * 6 | y = x + c | z = y - 3 | return z
//! ```
//!
//! Every program is the body of `def f(a, b, c, d, e, g, h):` and runs on the same five calls
//! ([`PROBES`]); its answer is what it returns on them (`"23 45 19 57 34"`), so programs that
//! behave alike give the same answer (a majority vote is one by behaviour, as code-generation
//! work votes by execution). Programs run by [`run`], an exact interpreter of this subset with
//! Python's semantics (floor `%`, comparisons giving `True`/`False`, a syntax error anywhere
//! failing the whole function), checked against `python3` itself in the tests: a standard lab
//! seed grades over 400,000 programs, and a sandboxed `python3` per program would take hours.
//! A story names its symbols in an order of its own, and half the running totals mention what
//! someone else gets or gives away: a quantity the program must leave out.
//!
//! The oracle executes too: a line is correct when the value it stores is one a correct program
//! holds at some point, on every call — the reference's intermediate values, in any order the
//! story allows (a running total's additions and subtractions commute; a remainder comes last).
//! A wrong value, one that uses a quantity twice or skips ahead, or a name never assigned is an
//! error, and so is every line that builds on an error (its state can no longer reach the right
//! result by the reference's remaining steps). `return` is correct when it returns the right
//! values. A comparison's `True`/`False` can come out right from wrong products, so lucky-correct
//! programs exist here as in arithmetic.

use crate::task::LabProblem;
use rand::seq::IndexedRandom;
use rand::Rng;
use std::collections::HashMap;

/// The function's parameters (no `f`: the function's own name); a story uses them in an order
/// of its own.
pub const PARAMS: [&str; 7] = ["a", "b", "c", "d", "e", "g", "h"];
/// Names of the intermediate results, in the order a reference program assigns them.
pub(crate) const RESULTS: [&str; 7] = ["x", "y", "z", "w", "v", "u", "t"];
/// Calls every program is run on: one value per parameter (the columns differ from each other
/// and from every constant, so a wrong symbol always changes a value).
pub const PROBES: [[i64; 7]; 5] = [
    [3, 4, 5, 6, 2, 7, 8],
    [7, 2, 9, 3, 5, 4, 6],
    [2, 8, 3, 7, 9, 5, 4],
    [9, 6, 2, 4, 7, 3, 5],
    [5, 3, 8, 2, 4, 9, 7],
];
/// Python's keywords: not names (a line assigning one is a syntax error).
const KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue", "def", "del",
    "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in", "is", "lambda", "nonlocal",
    "not", "or", "pass", "raise", "return", "try", "while", "with", "yield",
];

/// A value on every probe call: integers, or `True`/`False` (as 1/0) when `boolean`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Value {
    /// One per call of [`PROBES`].
    pub calls: [i64; PROBES.len()],
    /// Whether the values are Python booleans.
    pub boolean: bool,
}

impl Value {
    fn constant(k: i64) -> Value {
        Value {
            calls: [k; PROBES.len()],
            boolean: false,
        }
    }

    fn param(i: usize) -> Value {
        Value {
            calls: PROBES.map(|call| call[i]),
            boolean: false,
        }
    }

    /// As Python prints the values, one call after another.
    pub fn show(&self) -> String {
        let one = |v: i64| match (self.boolean, v) {
            (true, 0) => "False".to_string(),
            (true, _) => "True".to_string(),
            (false, v) => v.to_string(),
        };
        self.calls.iter().map(|&v| one(v)).collect::<Vec<_>>().join(" ")
    }
}

/// An operand: a name or a non-negative integer literal.
#[derive(Debug, Clone, PartialEq)]
enum Operand {
    Name(String),
    Literal(i64),
}

/// A statement of the subset.
#[derive(Debug, Clone, PartialEq)]
enum Statement {
    /// `name = operand` or `name = operand op operand`.
    Assign {
        name: String,
        left: Operand,
        op: Option<char>,
        right: Option<Operand>,
    },
    /// `return operand`.
    Return(Operand),
}

fn is_name(w: &str) -> bool {
    let mut chars = w.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !KEYWORDS.contains(&w)
}

fn operand(w: &str) -> Option<Operand> {
    if is_name(w) {
        Some(Operand::Name(w.to_string()))
    } else if !w.is_empty() && w.chars().all(|c| c.is_ascii_digit()) && (w == "0" || !w.starts_with('0')) {
        w.parse().ok().map(Operand::Literal)
    } else {
        None
    }
}

/// A line as Python reads it (words separated by spaces, as the lab's tokenizer writes them);
/// `None` for anything outside the subset, a syntax error to Python too.
fn parse(line: &str) -> Option<Statement> {
    let w: Vec<&str> = line.split_whitespace().collect();
    match w.as_slice() {
        ["return", x] => Some(Statement::Return(operand(x)?)),
        [name, "=", x] if is_name(name) => Some(Statement::Assign {
            name: name.to_string(),
            left: operand(x)?,
            op: None,
            right: None,
        }),
        [name, "=", x, op @ ("+" | "-" | "*" | "%" | ">" | "<"), y] if is_name(name) => Some(Statement::Assign {
            name: name.to_string(),
            left: operand(x)?,
            op: op.chars().next(),
            right: Some(operand(y)?),
        }),
        _ => None,
    }
}

fn render(s: &Statement) -> String {
    let o = |x: &Operand| match x {
        Operand::Name(n) => n.clone(),
        Operand::Literal(k) => k.to_string(),
    };
    match s {
        Statement::Return(x) => format!("return {}", o(x)),
        Statement::Assign {
            name,
            left,
            op: Some(op),
            right: Some(right),
        } => format!("{name} = {} {op} {}", o(left), o(right)),
        Statement::Assign { name, left, .. } => format!("{name} = {}", o(left)),
    }
}

/// Python's `%`: the result takes the divisor's sign; `None` for a zero divisor
/// (`ZeroDivisionError`).
fn python_mod(a: i64, b: i64) -> Option<i64> {
    let r = a.checked_rem(b)?;
    Some(if r != 0 && (r < 0) != (b < 0) { r + b } else { r })
}

/// The local variables of one run of a program on every probe call.
struct Frame {
    locals: HashMap<String, Value>,
}

impl Frame {
    fn new() -> Frame {
        Frame {
            locals: PARAMS
                .iter()
                .enumerate()
                .map(|(i, p)| (p.to_string(), Value::param(i)))
                .collect(),
        }
    }

    fn get(&self, x: &Operand) -> Option<Value> {
        match x {
            Operand::Name(n) => self.locals.get(n).copied(),
            Operand::Literal(k) => Some(Value::constant(*k)),
        }
    }

    /// The value of a statement's right side; `None` where Python raises (a name never
    /// assigned, a zero divisor, an integer past 64 bits — the lab's values never come near).
    fn eval(&self, left: &Operand, op: Option<char>, right: Option<&Operand>) -> Option<Value> {
        let x = self.get(left)?;
        let (Some(op), Some(right)) = (op, right) else {
            return Some(x);
        };
        let y = self.get(right)?;
        let mut out = Value {
            calls: [0; PROBES.len()],
            boolean: matches!(op, '>' | '<'),
        };
        for (o, (&a, &b)) in out.calls.iter_mut().zip(x.calls.iter().zip(&y.calls)) {
            *o = match op {
                '+' => a.checked_add(b)?,
                '-' => a.checked_sub(b)?,
                '*' => a.checked_mul(b)?,
                '%' => python_mod(a, b)?,
                '>' => i64::from(a > b),
                _ => i64::from(a < b),
            };
        }
        Some(out)
    }
}

/// What a line did when run.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// It stored this value (a name) on every call.
    Stored(Value),
    /// It returned this value.
    Returned(Value),
    /// It raised (`NameError`, `ZeroDivisionError`) or could not be read.
    Failed,
    /// It comes after a `return`: never runs.
    Unreached,
}

/// Run a program's lines: each line's effect, in order (the execution trace: what each line
/// stored or returned on the five calls). A line outside the subset is [`Effect::Failed`] and so
/// is any line reading a name it left unassigned; the lines after it still run, as a reader
/// judges them (Python itself would not run the function at all: see [`answer`]).
pub fn run(steps: &[String]) -> Vec<Effect> {
    let mut frame = Frame::new();
    let mut returned = false;
    steps
        .iter()
        .map(|line| {
            if returned {
                return Effect::Unreached;
            }
            match parse(line) {
                Some(Statement::Assign { name, left, op, right }) => match frame.eval(&left, op, right.as_ref()) {
                    Some(v) => {
                        frame.locals.insert(name, v);
                        Effect::Stored(v)
                    }
                    None => {
                        frame.locals.remove(&name);
                        Effect::Failed
                    }
                },
                Some(Statement::Return(x)) => {
                    returned = true;
                    frame.get(&x).map_or(Effect::Failed, Effect::Returned)
                }
                None => Effect::Failed,
            }
        })
        .collect()
}

/// What the program returns on the five calls, as Python prints it; `None` when Python would
/// give no value: a line it cannot compile (anywhere in the body), an exception before the
/// `return`, or no `return` at all.
pub fn answer(steps: &[String]) -> Option<String> {
    if steps.iter().any(|s| parse(s).is_none()) {
        return None;
    }
    for effect in run(steps) {
        match effect {
            Effect::Returned(v) => return Some(v.show()),
            Effect::Failed => return None,
            Effect::Stored(_) | Effect::Unreached => {}
        }
    }
    None
}

/// What correct programs of a problem hold: every value a line of one may store, and the
/// value returned.
struct Plan {
    reachable: Vec<Value>,
    result: Value,
}

impl Plan {
    /// From the reference program: a running total (`chain`, `long`) reaches its start with any
    /// subset of its additions and subtractions applied (they commute); other families reach
    /// exactly the reference's values (a remainder's order is fixed; a comparison's two products
    /// and its verdict).
    fn of(p: &LabProblem) -> Plan {
        let effects = run(&p.steps);
        let stored: Vec<Value> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::Stored(v) => Some(*v),
                _ => None,
            })
            .collect();
        let result = effects
            .iter()
            .find_map(|e| match e {
                Effect::Returned(v) => Some(*v),
                _ => None,
            })
            .expect("a reference program returns");
        let reachable = if matches!(p.family.as_str(), "chain" | "long") {
            // Each later line adds or subtracts one operand: its value minus the line before's.
            let steps: Vec<[i64; PROBES.len()]> = stored
                .windows(2)
                .map(|w| std::array::from_fn(|i| w[1].calls[i] - w[0].calls[i]))
                .collect();
            (0..1usize << steps.len())
                .map(|subset| {
                    let mut v = stored[0];
                    for (k, delta) in steps.iter().enumerate() {
                        if subset & (1 << k) != 0 {
                            for (x, d) in v.calls.iter_mut().zip(delta) {
                                *x += d;
                            }
                        }
                    }
                    v
                })
                .collect()
        } else {
            stored
        };
        Plan { reachable, result }
    }
}

/// The oracle's verdict on each line of a program still being written (see the module's
/// documentation): a line after `return` is wrong.
pub fn check_prefix(p: &LabProblem, steps: &[String]) -> Vec<bool> {
    let plan = Plan::of(p);
    run(steps)
        .into_iter()
        .map(|e| match e {
            Effect::Stored(v) => plan.reachable.contains(&v),
            Effect::Returned(v) => v == plan.result,
            Effect::Failed | Effect::Unreached => false,
        })
        .collect()
}

/// The reference program with, at probability `slip`, one slip a programmer makes: a wrong
/// operator (`+` for `-`, `>` for `<`), a wrong name (another of the story's symbols or an
/// earlier result), or a number off by one. Later lines keep reading the names they read, so the
/// error flows on as it would.
pub fn noisy_reference(p: &LabProblem, rng: &mut impl Rng, slip: f64) -> Vec<String> {
    if !rng.random_bool(slip) {
        return p.steps.clone();
    }
    let mut steps = p.steps.clone();
    let assignments: Vec<usize> = (0..steps.len())
        .filter(|&i| matches!(parse(&steps[i]), Some(Statement::Assign { .. })))
        .collect();
    let symbols: Vec<&str> = PARAMS
        .iter()
        .copied()
        .filter(|s| p.question.split_whitespace().any(|w| w == *s))
        .collect();
    let before = run(&p.steps);
    for _ in 0..20 {
        let i = *assignments.choose(rng).expect("a reference program assigns");
        let Some(Statement::Assign {
            name,
            mut left,
            mut op,
            mut right,
        }) = parse(&steps[i])
        else {
            unreachable!("an assignment")
        };
        let earlier: Vec<String> = assignments
            .iter()
            .take_while(|&&j| j < i)
            .filter_map(|&j| match parse(&steps[j]) {
                Some(Statement::Assign { name, .. }) => Some(name),
                _ => None,
            })
            .collect();
        let pick_right = rng.random_bool(0.5);
        let slot = match right.as_mut() {
            Some(r) if pick_right => r,
            _ => &mut left,
        };
        match rng.random_range(0..3) {
            0 => {
                op = op.map(|o| match o {
                    '+' => '-',
                    '-' => '+',
                    '*' => '+',
                    '>' => '<',
                    '<' => '>',
                    o => o,
                })
            }
            1 => {
                let current = match &*slot {
                    Operand::Name(n) => n.clone(),
                    Operand::Literal(_) => continue,
                };
                let others: Vec<String> = symbols
                    .iter()
                    .map(|s| s.to_string())
                    .chain(earlier.iter().cloned())
                    .filter(|n| *n != current)
                    .collect();
                let Some(other) = others.choose(rng) else {
                    continue;
                };
                *slot = Operand::Name(other.clone());
            }
            _ => match slot {
                Operand::Literal(k) => *k = if rng.random_bool(0.5) { *k + 1 } else { (*k - 1).max(1) },
                Operand::Name(_) => continue,
            },
        }
        let changed = render(&Statement::Assign { name, left, op, right });
        let mut trial = steps.clone();
        trial[i] = changed;
        if run(&trial)[i] != before[i] {
            steps = trial;
            return steps;
        }
    }
    steps
}

/// Every word a code problem or program of the lab may use (the vocabulary's words).
pub fn words() -> Vec<String> {
    let mut w: Vec<String> = crate::problems::NAMES
        .iter()
        .chain(crate::problems::THINGS)
        .chain(crate::problems::CONTAINERS)
        .chain(&PARAMS)
        .chain(&RESULTS)
        .map(|s| s.to_string())
        .collect();
    for story in [
        "has of . gets more . gives away . How many does have now ?",
        "Does have more than ? and finds more . The are shared equally by friends . How many are left over ?",
        "return = + - * % > <",
    ] {
        w.extend(story.split_whitespace().map(str::to_string));
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn problems(seed: u64, n: usize) -> Vec<LabProblem> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|i| crate::problems::code(&mut rng, i)).collect()
    }

    fn lines(s: &str) -> Vec<String> {
        s.split(" | ").map(str::to_string).collect()
    }

    #[test]
    fn the_interpreter_follows_python() {
        // a = 3, 7, 2, 9, 5 and b = 4, 2, 8, 6, 3 on the five calls.
        let p = lines("x = a * b | y = x - 20 | z = y % 7 | w = z > 2 | return w");
        assert_eq!(
            run(&p)[..3],
            [
                Effect::Stored(Value {
                    calls: [12, 14, 16, 54, 15],
                    boolean: false
                }),
                Effect::Stored(Value {
                    calls: [-8, -6, -4, 34, -5],
                    boolean: false
                }),
                // Python's floor modulo: -8 % 7 == 6.
                Effect::Stored(Value {
                    calls: [6, 1, 3, 6, 2],
                    boolean: false
                }),
            ]
        );
        assert_eq!(answer(&p).as_deref(), Some("True False True True False"));
        // No return, a name never assigned, a syntax error anywhere: no value.
        assert_eq!(answer(&lines("x = a * b")), None);
        assert_eq!(answer(&lines("x = q * b | return x")), None);
        assert_eq!(answer(&lines("x = a * b | return x | is = 3")), None);
        assert_eq!(answer(&lines("x = a % 0 | return a")), None);
        // A line after return never runs.
        assert_eq!(answer(&lines("return a | x = q * b")).as_deref(), Some("3 7 2 9 5"));
    }

    #[test]
    fn references_are_correct_and_slips_are_caught() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let (mut lucky, mut slipped) = (0, 0);
        for p in problems(1, 600) {
            assert!(check_prefix(&p, &p.steps).iter().all(|&ok| ok), "{p:?}");
            assert_eq!(answer(&p.steps).as_ref(), Some(&p.gold));
            let noisy = noisy_reference(&p, &mut rng, 1.0);
            if noisy == p.steps {
                continue;
            }
            slipped += 1;
            let verdicts = check_prefix(&p, &noisy);
            assert!(verdicts.contains(&false), "a slip must be caught: {noisy:?}");
            if answer(&noisy).as_ref() == Some(&p.gold) {
                lucky += 1;
                // A comparison's verdicts, or a remainder the slip does not change
                // (`x - 9` for `x + 9`, shared by 3).
                assert!(matches!(p.family.as_str(), "compare" | "remainder"), "{noisy:?}");
            }
        }
        assert!(slipped > 550, "{slipped}");
        assert!(
            lucky > 5,
            "comparisons let wrong products give the right verdicts: {lucky}"
        );
    }

    #[test]
    fn reorderings_are_right_and_reusing_or_skipping_is_wrong() {
        let p = LabProblem {
            family: "long".into(),
            steps: lines("x = a * 6 | y = x + c | z = y - 3 | w = z + d | return w"),
            ..problems(2, 1).remove(0)
        };
        // The additions and subtractions in another order reach the same result.
        let other = lines("x = 6 * a | y = x + d | z = y - 3 | w = z + c | return w");
        assert_eq!(check_prefix(&p, &other), vec![true; 5]);
        // A quantity used twice; an error carried on; an early return.
        let twice = lines("x = a * 6 | y = x + c | z = y + c | w = z + d | return w");
        assert_eq!(check_prefix(&p, &twice), [true, true, false, false, false]);
        let early = lines("x = a * 6 | y = x + c | return y");
        assert_eq!(check_prefix(&p, &early), [true, true, false]);
        // A name never assigned, and a line after return.
        let unknown = lines("x = a * 6 | y = q + c | return y | z = x");
        assert_eq!(check_prefix(&p, &unknown), [true, false, false, false]);
    }

    #[test]
    fn the_questions_vary_and_use_only_the_vocabulary() {
        let ps = problems(3, 3000);
        let distinct: std::collections::HashSet<&str> = ps.iter().map(|p| p.question.as_str()).collect();
        assert!(distinct.len() > 2500, "{}", distinct.len());
        let words = words();
        for p in &ps {
            for w in p
                .question
                .split_whitespace()
                .chain(p.steps.iter().flat_map(|s| s.split_whitespace()))
            {
                assert!(
                    words.iter().any(|x| x == w) || w.parse::<u32>().is_ok(),
                    "`{w}` in {p:?}"
                );
            }
        }
        for family in ["chain", "long", "compare", "remainder"] {
            assert!(ps.iter().any(|p| p.family == family), "{family}");
        }
    }
}
