//! OpenR's OmegaPRM output. Flat: `{question, final_answer, reasoning_steps: [{solution_prefix,
//! mc_value}]}`, where every prefix starts with the question and extends an earlier prefix by one
//! step; tree: `reasoning_steps: {text, mc_value, children: [...]}` rooted at the question.
//!
//! Flat records become one solution per prefix (its steps labelled with the MC values of the
//! prefixes that introduced them); tree records become one solution per leaf. Both keep the
//! record's position in `meta._omegaprm_group` so that writing regroups them.

use super::{binary_labels, problem_id_for};
use crate::error::FieldError;
use crate::json::{self, object};
use crate::record::{Provenance, Solution, Step, StepLabel};
use serde_json::{json, Map, Value};

const GROUP: &str = "_omegaprm_group";
const ROOT_MC: &str = "_omegaprm_root_mc";
const PATH: &str = "_omegaprm_path";
const SEPS: &str = "_omegaprm_separators";
const DEFAULT_SEP: &str = "\n\n";
const KNOWN: &[&str] = &["question", "final_answer", "reasoning_steps"];

/// An `mc_value` that may be null (unknown).
fn opt_mc(o: &Map<String, Value>, at: &str) -> Result<Option<f64>, FieldError> {
    match o.get("mc_value") {
        None | Some(Value::Null) => Ok(None),
        Some(_) => json::probability_field(o, "mc_value")
            .map(Some)
            .map_err(|e| e.within(at)),
    }
}

fn mc_label(mc: f64) -> StepLabel {
    StepLabel::soft(mc as f32, Provenance::OmegaPrm)
}

fn base(o: &Map<String, Value>, index: usize, question: &str) -> Result<Solution, FieldError> {
    let mut meta = json::rest(o, KNOWN);
    meta.insert(GROUP.into(), json!(index));
    Ok(Solution {
        problem_id: json::opt_str(o, "question_id")?.unwrap_or_else(|| problem_id_for(question)),
        question: question.to_string(),
        gold_answer: json::opt_str(o, "final_answer")?,
        meta,
        ..Default::default()
    })
}

/// One step of a flat prefix: (text, leading separator, MC value).
type FlatStep = (String, String, f64);

/// Split `remainder` into (leading whitespace, step text).
fn split_sep(remainder: &str) -> (&str, &str) {
    let text = remainder.trim_start();
    (&remainder[..remainder.len() - text.len()], text)
}

pub(super) fn read_flat(v: &Value, index: usize) -> Result<Vec<Solution>, FieldError> {
    let o = object(v, "")?;
    let question = json::str_field(o, "question")?;
    let base = base(o, index, question)?;
    let entries = json::array_field(o, "reasoning_steps")?;
    // For every entry: its prefix, its steps (text, separator, mc) in order.
    let mut done: Vec<(&str, Vec<FlatStep>)> = Vec::with_capacity(entries.len());
    let mut out = Vec::with_capacity(entries.len());
    for (j, e) in entries.iter().enumerate() {
        let at = format!("reasoning_steps[{j}]");
        let e = object(e, &at)?;
        let prefix = json::str_field(e, "solution_prefix").map_err(|x| x.within(&at))?;
        let mc = json::probability_field(e, "mc_value").map_err(|x| x.within(&at))?;
        if !prefix.starts_with(question) {
            return Err(FieldError::new(
                format!("{at}.solution_prefix"),
                "does not start with the question",
            ));
        }
        // The longest earlier prefix strictly shorter than this one that it extends.
        let parent = done
            .iter()
            .filter(|(p, _)| p.len() < prefix.len() && prefix.starts_with(p))
            .max_by_key(|(p, _)| p.len());
        let (parent_len, mut steps) = match parent {
            Some((p, s)) => (p.len(), s.clone()),
            None => (question.len(), Vec::new()),
        };
        if prefix.len() > parent_len {
            let (sep, text) = split_sep(&prefix[parent_len..]);
            steps.push((text.to_string(), sep.to_string(), mc));
        }
        let mut s = base.clone();
        s.id = format!("{index}-{j}");
        if steps.is_empty() {
            s.meta.insert(ROOT_MC.into(), json!(mc));
        } else if let Some(last) = steps.last_mut() {
            last.2 = mc;
        }
        set_steps(&mut s, &steps);
        done.push((prefix, steps));
        out.push(s);
    }
    Ok(out)
}

fn set_steps(s: &mut Solution, steps: &[FlatStep]) {
    s.steps = steps
        .iter()
        .map(|(t, _, mc)| Step::labelled(t.clone(), mc_label(*mc)))
        .collect();
    if steps.iter().any(|(_, sep, _)| sep != DEFAULT_SEP) {
        s.meta.insert(
            SEPS.into(),
            json!(steps.iter().map(|(_, sep, _)| sep).collect::<Vec<_>>()),
        );
    }
}

fn separators(s: &Solution) -> Vec<String> {
    let kept: Option<Vec<String>> = s.meta.get(SEPS).and_then(|v| serde_json::from_value(v.clone()).ok());
    match kept {
        Some(k) if k.len() == s.steps.len() => k,
        _ => vec![DEFAULT_SEP.to_string(); s.steps.len()],
    }
}

/// MC values of a solution's steps: soft labels as they are, hard ones as 1/0.
fn mc_values(s: &Solution) -> Vec<Value> {
    let goods = binary_labels(s);
    s.steps
        .iter()
        .zip(goods)
        .map(|(st, g)| match &st.label {
            Some(l) => json!(l.prob(1.0)),
            None => json!(if g { 1.0 } else { 0.0 }),
        })
        .collect()
}

fn header(group: &[Solution]) -> Map<String, Value> {
    let first = &group[0];
    let mut o = Map::new();
    o.insert("question".into(), json!(first.question));
    o.insert("final_answer".into(), json!(first.gold_answer));
    for (k, v) in &first.meta {
        if !k.starts_with('_') {
            o.insert(k.clone(), v.clone());
        }
    }
    o
}

pub(super) fn write_flat(group: &[Solution]) -> Value {
    let mut o = header(group);
    let mut entries = Vec::new();
    let mut emitted = std::collections::HashSet::new();
    for s in group {
        let seps = separators(s);
        let mcs = mc_values(s);
        let mut prefix = s.question.clone();
        let mut chain = vec![(prefix.clone(), s.meta.get(ROOT_MC).cloned())];
        for ((st, sep), mc) in s.steps.iter().zip(&seps).zip(mcs) {
            prefix.push_str(sep);
            prefix.push_str(&st.text);
            chain.push((prefix.clone(), Some(mc)));
        }
        // Ancestors not yet written, then the solution's own prefix (always).
        let own = chain.pop().unwrap();
        for (p, mc) in chain {
            if let Some(mc) = mc {
                if emitted.insert(p.clone()) {
                    entries.push(json!({"solution_prefix": p, "mc_value": mc}));
                }
            }
        }
        emitted.insert(own.0.clone());
        entries.push(json!({"solution_prefix": own.0, "mc_value": own.1.unwrap_or(Value::Null)}));
    }
    o.insert("reasoning_steps".into(), Value::Array(entries));
    Value::Object(o)
}

pub(super) fn read_tree(v: &Value, index: usize) -> Result<Vec<Solution>, FieldError> {
    let o = object(v, "")?;
    let question = json::str_field(o, "question")?;
    let mut base = base(o, index, question)?;
    let root = object(json::field(o, "reasoning_steps")?, "reasoning_steps")?;
    if let Some(mc) = opt_mc(root, "reasoning_steps")? {
        base.meta.insert(ROOT_MC.into(), json!(mc));
    }
    let mut out = Vec::new();
    let mut path = Vec::new();
    walk(
        root,
        "reasoning_steps",
        &base,
        &mut path,
        &mut Vec::new(),
        &mut out,
        index,
    )?;
    Ok(out)
}

fn walk(
    node: &Map<String, Value>,
    at: &str,
    base: &Solution,
    path: &mut Vec<Step>,
    positions: &mut Vec<usize>,
    out: &mut Vec<Solution>,
    index: usize,
) -> Result<(), FieldError> {
    let children = json::array_field(node, "children").map_err(|e| e.within(at))?;
    if children.is_empty() {
        let mut s = base.clone();
        s.id = format!("{index}-{}", out.len());
        s.steps = path.clone();
        s.meta.insert(PATH.into(), json!(positions));
        out.push(s);
    }
    for (i, c) in children.iter().enumerate() {
        let cat = format!("{at}.children[{i}]");
        let c = object(c, &cat)?;
        let text = json::str_field(c, "text").map_err(|e| e.within(&cat))?;
        let mc = opt_mc(c, &cat)?;
        path.push(Step {
            text: text.to_string(),
            label: mc.map(mc_label),
            ..Default::default()
        });
        positions.push(i);
        walk(c, &cat, base, path, positions, out, index)?;
        positions.pop();
        path.pop();
    }
    Ok(())
}

pub(super) fn write_tree(group: &[Solution]) -> Value {
    // Build a trie of steps: children keyed by (text, mc value), in first-seen order.
    struct Node {
        text: String,
        mc: Value,
        children: Vec<Node>,
    }
    fn to_json(n: &Node) -> Value {
        json!({"text": n.text, "mc_value": n.mc, "children": n.children.iter().map(to_json).collect::<Vec<_>>()})
    }
    let first = &group[0];
    let mut root = Node {
        text: first.question.clone(),
        mc: first.meta.get(ROOT_MC).cloned().unwrap_or(Value::Null),
        children: Vec::new(),
    };
    for s in group {
        // Child positions kept from a tree we read place nodes exactly (siblings may repeat);
        // otherwise identical steps under one parent are merged.
        let kept: Option<Vec<usize>> = s.meta.get(PATH).and_then(|p| serde_json::from_value(p.clone()).ok());
        let kept = kept.filter(|p| p.len() == s.steps.len());
        let mut node = &mut root;
        for (depth, (st, mc)) in s.steps.iter().zip(mc_values(s)).enumerate() {
            let pos = match &kept {
                Some(p) => (p[depth] < node.children.len()).then_some(p[depth]),
                None => node.children.iter().position(|c| c.text == st.text && c.mc == mc),
            };
            let k = pos.unwrap_or_else(|| {
                node.children.push(Node {
                    text: st.text.clone(),
                    mc,
                    children: Vec::new(),
                });
                node.children.len() - 1
            });
            node = &mut node.children[k];
        }
    }
    let mut o = header(group);
    o.insert("reasoning_steps".into(), to_json(&root));
    Value::Object(o)
}
