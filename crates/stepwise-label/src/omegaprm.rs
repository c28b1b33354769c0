//! OmegaPRM (Luo et al. 2024): binary search for the first error over a tree of rollouts that
//! every search of a problem shares, with MCTS choosing what to search next.
//!
//! - **The tree.** A node is a step prefix of the problem's solutions; equal prefixes are one
//!   node. A problem's given solutions are the root's first rollouts. A node is *alive* once any
//!   complete solution through it reaches the gold answer, and *dead* once `k` rollouts from it
//!   all failed (and none through it succeeded). Every rollout is kept: its steps become a path
//!   in the tree, so a later search that probes a prefix on it already knows the answer when the
//!   rollout succeeded, or reuses the prefix's own rollouts.
//! - **A search** takes a wrong solution `r` that left an alive node `s` and bisects the steps of
//!   `r` after `s` for the first dead prefix, exactly as [`crate::BinarySearch`] does, probing
//!   prefixes with `k` rollouts only where the tree does not know yet. The wrong rollouts from
//!   an alive probed prefix join the pool of searches.
//! - **Selection** (the paper's MCTS): the next search is the pool's `(s, r)` maximising
//!   `Q(s, r) + U(s)`, with `Q = α^(1 − MC(s)) · β^(len(r)/L)` (solutions from likely-right
//!   prefixes that are short: the "supposed to be right" ones) and `U = c_puct · √(Σ N) /
//!   (1 + N(s))`, where `MC(s)` is the fraction of `s`'s rollouts that succeeded and `N` counts
//!   searches started from a node. The paper's constants are the defaults.
//! - **Budget.** Every given wrong solution is searched (in selection order); then up to
//!   `search_limit` more searches over the new rollouts, which become labelled solutions too.
//!
//! Labels: a step whose prefix has rollouts of its own gets the soft Monte Carlo value of those
//! (when it agrees with what the tree knows), else good when alive, bad from the first dead
//! prefix on, none where the tree does not know. Every rollout is counted in what a problem cost:
//! a search's rollouts to the given solution searched, the extra searches' to the problem's first
//! solution.

use crate::probes::{Ask, Rollouts, Rounds};
use anyhow::{Context, Result};
use stepwise_core::seams::{Annotator, Continuation, Policy, ProblemDone, Spent, Task};
use stepwise_core::{Provenance, Solution, Step, StepLabel};

/// OmegaPRM's settings (the paper's constants by default).
#[derive(Debug, Clone)]
pub struct OmegaOptions {
    /// Rollouts `k` per probed prefix.
    pub rollouts: usize,
    /// Searches over the tree's new rollouts after the given solutions' (0: only the given).
    pub search_limit: usize,
    /// `α` of `Q`: how strongly likely-right prefixes are preferred.
    pub alpha: f64,
    /// `β` of `Q`: how strongly short solutions are preferred.
    pub beta: f64,
    /// `L` of `Q`: the length scale in tokens.
    pub length_scale: f64,
    /// `c_puct` of `U`: exploration.
    pub c_puct: f64,
    /// Base seed; each prefix's rollouts derive their seed from it and the prefix's text.
    pub seed: u64,
}

impl Default for OmegaOptions {
    fn default() -> Self {
        OmegaOptions {
            rollouts: 8,
            search_limit: 0,
            alpha: 0.5,
            beta: 0.9,
            length_scale: 500.0,
            c_puct: 0.125,
            seed: 0,
        }
    }
}

/// The OmegaPRM annotator.
pub struct OmegaPrm<'a> {
    /// Completes the prefixes.
    pub policy: &'a dyn Policy,
    /// Grades a completed solution against its gold answer.
    pub task: &'a dyn Task,
    /// Settings.
    pub options: OmegaOptions,
}

/// One step prefix of the problem's solutions.
#[derive(Debug, Default)]
struct Node {
    step: String,
    parent: Option<usize>,
    children: Vec<usize>,
    /// Rollouts from this prefix, and how many reached the gold answer.
    rollouts: usize,
    hits: usize,
    /// Searches started from this prefix (`N`).
    visits: usize,
    /// Some complete solution through this prefix reaches the gold answer.
    alive: bool,
    /// Rollouts from it all failed and none through it succeeded.
    dead: bool,
    /// A complete solution ends here: whether it is right, and its length (tokens, or words for
    /// a given solution).
    ended: Option<(bool, usize)>,
}

/// A search to run: the wrong solution ending at `leaf`, rolled out from the alive `from`.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    from: usize,
    leaf: usize,
    /// The given solution it is, if any (its cost is booked to it).
    given: Option<usize>,
}

/// A problem's rollout tree (node 0 is the question).
struct Tree {
    nodes: Vec<Node>,
}

impl Tree {
    fn new() -> Self {
        Tree {
            nodes: vec![Node {
                // The question has an answer: the root is alive by assumption.
                alive: true,
                ..Default::default()
            }],
        }
    }

    /// The node for `steps` after `from`, made where missing.
    fn insert(&mut self, from: usize, steps: &[String]) -> usize {
        let mut at = from;
        for s in steps {
            let found = self.nodes[at]
                .children
                .iter()
                .copied()
                .find(|&c| self.nodes[c].step == *s);
            at = found.unwrap_or_else(|| {
                self.nodes.push(Node {
                    step: s.clone(),
                    parent: Some(at),
                    ..Default::default()
                });
                let id = self.nodes.len() - 1;
                self.nodes[at].children.push(id);
                id
            });
        }
        at
    }

    /// The nodes from the root (excluded) down to `node` (included).
    fn path(&self, node: usize) -> Vec<usize> {
        let mut p = Vec::new();
        let mut at = node;
        while let Some(parent) = self.nodes[at].parent {
            p.push(at);
            at = parent;
        }
        p.reverse();
        p
    }

    fn steps(&self, node: usize) -> Vec<String> {
        self.path(node).iter().map(|&n| self.nodes[n].step.clone()).collect()
    }

    /// A complete solution ends at `leaf`; a right one makes every prefix on its path alive.
    fn end(&mut self, leaf: usize, right: bool, length: usize) {
        self.nodes[leaf].ended = Some((right, length));
        if right {
            let mut at = Some(leaf);
            while let Some(n) = at {
                self.nodes[n].alive = true;
                self.nodes[n].dead = false;
                at = self.nodes[n].parent;
            }
        } else if !self.nodes[leaf].alive {
            // A wrong finished solution cannot be continued to the right answer.
            self.nodes[leaf].dead = true;
        }
    }

    /// `MC(s)`: the fraction of `s`'s rollouts that succeeded.
    fn mc(&self, s: usize) -> f64 {
        let n = &self.nodes[s];
        if n.rollouts == 0 {
            f64::from(u8::from(n.alive))
        } else {
            n.hits as f64 / n.rollouts as f64
        }
    }

    /// The label of the node `n`'s last step, given whether an earlier prefix on the path is
    /// dead.
    fn label(&self, n: usize, after_dead: bool) -> Option<StepLabel> {
        let node = &self.nodes[n];
        let bad = after_dead || node.dead;
        if node.rollouts > 0 && node.alive == (node.hits > 0) && (node.hits > 0 || bad) {
            let source = Provenance::MonteCarlo {
                rollouts: node.rollouts as u32,
                hits: node.hits as u32,
            };
            return Some(StepLabel::soft(node.hits as f32 / node.rollouts as f32, source));
        }
        if node.alive {
            Some(StepLabel::from_bool(true, Provenance::OmegaPrm))
        } else if bad {
            Some(StepLabel::from_bool(false, Provenance::OmegaPrm))
        } else {
            None
        }
    }

    /// The steps of the solution ending at `leaf`, labelled from what the tree knows.
    fn labelled_steps(&self, leaf: usize) -> Vec<Step> {
        let mut after_dead = false;
        self.path(leaf)
            .into_iter()
            .map(|n| {
                let label = self.label(n, after_dead);
                after_dead |= self.nodes[n].dead && !self.nodes[n].alive;
                Step {
                    text: self.nodes[n].step.clone(),
                    label,
                    ..Default::default()
                }
            })
            .collect()
    }
}

/// A bisection under way: the candidate, the nodes of its solution after its start, the bounds
/// (the prefix before `lo + 1` is alive, the one ending at `hi` dead), the probe asked, the cost.
struct Bisection {
    c: Candidate,
    path: Vec<usize>,
    lo: isize,
    hi: usize,
    asked: usize,
    spent: Spent,
}

/// One problem's search in progress: what [`OmegaPrm::annotate_tree`] runs, a probe a round
/// ([`Rounds`]), alone or many problems together.
struct Search<'s> {
    annotator: &'s OmegaPrm<'s>,
    sols: &'s [Solution],
    question: &'s str,
    gold: &'s str,
    problem: &'s str,
    tree: Tree,
    /// Each given solution's leaf.
    leaves: Vec<usize>,
    /// The given wrong solutions still to search.
    given: Vec<Candidate>,
    /// Searches still to run over the tree's new rollouts.
    pool: Vec<Candidate>,
    /// What each given solution's searches cost.
    spent: Vec<Spent>,
    /// The bisection under way.
    current: Option<Bisection>,
    /// Searches of the tree's own rollouts made (`None`: the given ones still go first).
    searched: Option<usize>,
}

impl Search<'_> {
    /// The prefix `node`'s `k` rollouts (kept in the tree; their cost added to `spent`): whether
    /// it is alive.
    fn take_rollouts(&mut self, node: usize, outs: Vec<Continuation>, spent: &mut Spent) -> bool {
        let prefix = self.tree.steps(node);
        spent.rollouts += outs.len();
        spent.tokens += outs.iter().map(|c| c.tokens).sum::<usize>();
        let mut wrong = Vec::new();
        let mut hits = 0;
        for c in &outs {
            let mut full = prefix.clone();
            full.extend(c.steps.iter().cloned());
            let right = self.annotator.task.is_correct(self.gold, &full);
            let leaf = self.tree.insert(node, &c.steps);
            self.tree.end(leaf, right, c.tokens);
            hits += usize::from(right);
            if !right && leaf != node {
                wrong.push(leaf);
            }
        }
        let n = &mut self.tree.nodes[node];
        n.rollouts += outs.len();
        n.hits += hits;
        if !n.alive {
            n.dead = true;
        }
        let alive = n.alive;
        if alive {
            // The wrong rollouts of a prefix that can still be right hold an error to find.
            self.pool.extend(wrong.into_iter().map(|leaf| Candidate {
                from: node,
                leaf,
                given: None,
            }));
        }
        alive
    }

    /// The nodes of the candidate's solution after its start `from`, down to its leaf.
    fn steps_searched(&self, c: Candidate) -> Vec<usize> {
        let mut path = self.tree.path(c.leaf);
        let start = path.iter().position(|&n| n == c.from).map_or(0, |i| i + 1);
        path.drain(..start);
        path
    }

    /// Whether the tree already knows where the candidate's solution first goes wrong: it
    /// reached the gold answer after all, or an alive prefix (or its start) is followed on it by
    /// a dead one.
    fn resolved(&self, c: Candidate) -> bool {
        if self.tree.nodes[c.leaf].alive {
            return true;
        }
        let mut before_alive = true;
        for n in self.steps_searched(c) {
            let node = &self.tree.nodes[n];
            if node.dead && !node.alive {
                return before_alive;
            }
            before_alive = node.alive;
        }
        false
    }

    /// The bisection of the steps of the candidate's solution after its alive start for the
    /// first dead prefix (none to make where it has no steps there or reached the gold answer).
    fn bisection(&mut self, c: Candidate) -> Bisection {
        self.tree.nodes[c.from].visits += 1;
        let path = self.steps_searched(c);
        let hi = match path.is_empty() || self.tree.nodes[c.leaf].alive {
            true => 0,
            false => path.len() - 1,
        };
        Bisection {
            c,
            path,
            lo: -1,
            hi,
            asked: 0,
            spent: Spent::default(),
        }
    }

    /// The next prefix to probe by rollouts: bisections run in MCTS's order (every given wrong
    /// solution, then the tree's own up to the search limit), a prefix the tree already knows
    /// settled without rollouts; `None` once the search is over.
    fn next_probe(&mut self) -> Option<usize> {
        loop {
            if let Some(b) = self.current.as_mut() {
                if b.hi as isize - b.lo > 1 {
                    let mid = ((b.lo + b.hi as isize) / 2) as usize;
                    let node = &self.tree.nodes[b.path[mid]];
                    match (node.alive, node.dead) {
                        (true, _) => b.lo = mid as isize,
                        (false, true) => b.hi = mid,
                        (false, false) => {
                            b.asked = mid;
                            return Some(b.path[mid]);
                        }
                    }
                    continue;
                }
                let b = self.current.take().expect("checked above");
                self.spent[b.c.given.unwrap_or(0)] += b.spent;
                if let Some(k) = self.searched.as_mut() {
                    *k += 1;
                }
                continue;
            }
            let c = match self.searched {
                None => match self.select(&self.given) {
                    Some(i) => self.given.swap_remove(i),
                    None => {
                        self.searched = Some(0);
                        continue;
                    }
                },
                Some(k) if k >= self.annotator.options.search_limit => return None,
                Some(_) => {
                    let i = self.select(&self.pool)?;
                    let c = self.pool.swap_remove(i);
                    // A candidate the tree has meanwhile resolved is dropped without counting.
                    if self.resolved(c) {
                        continue;
                    }
                    c
                }
            };
            self.current = Some(self.bisection(c));
        }
    }

    /// The index of the pool's candidate with the largest `Q + U` (the first among equals).
    fn select(&self, pool: &[Candidate]) -> Option<usize> {
        let o = &self.annotator.options;
        let total: usize = self.tree.nodes.iter().map(|n| n.visits).sum();
        let value = |c: &Candidate| {
            let length = self.tree.nodes[c.leaf].ended.map_or(0, |e| e.1) as f64;
            let q = o.alpha.powf(1.0 - self.tree.mc(c.from)) * o.beta.powf(length / o.length_scale);
            let u = o.c_puct * (total as f64).sqrt() / (1.0 + self.tree.nodes[c.from].visits as f64);
            q + u
        };
        let values: Vec<f64> = pool.iter().map(value).collect();
        // The first of the largest (`max_by` would return the last).
        (0..values.len()).reduce(|b, i| if values[i] > values[b] { i } else { b })
    }
}

impl OmegaPrm<'_> {
    /// Search the tree of one problem's solutions (all with the same question and gold
    /// answer); returns the given solutions labelled, each with what its searches cost, then the
    /// new complete rollouts as labelled solutions (`meta.omegaprm_rollout`).
    pub fn annotate_tree(&self, sols: &[Solution]) -> Result<Vec<(Solution, Spent)>> {
        if sols.is_empty() {
            return Ok(Vec::new());
        }
        let options = self.mc_options();
        Rollouts::new(self.policy, self.task, &options).one(self.search_of(sols)?)
    }

    /// What [`Rollouts`] takes of the options (each probe seeds its own rollouts).
    fn mc_options(&self) -> crate::McOptions {
        crate::McOptions {
            rollouts: self.options.rollouts,
            seed: self.options.seed,
        }
    }

    /// The search of the tree of `sols` (one problem's, at least one): the given solutions are
    /// the root's first rollouts, the wrong ones the first candidates.
    fn search_of<'s>(&'s self, sols: &'s [Solution]) -> Result<Search<'s>> {
        let first = sols.first().context("a problem of no solutions")?;
        let gold = first
            .gold_answer
            .as_deref()
            .with_context(|| format!("solution {}: field `gold_answer`: missing", first.id))?;
        let mut search = Search {
            annotator: self,
            sols,
            question: &first.question,
            gold,
            problem: &first.problem_id,
            tree: Tree::new(),
            leaves: Vec::with_capacity(sols.len()),
            given: Vec::new(),
            pool: Vec::new(),
            spent: vec![Spent::default(); sols.len()],
            current: None,
            searched: None,
        };
        for (i, s) in sols.iter().enumerate() {
            let steps = s.step_strings();
            let leaf = search.tree.insert(0, &steps);
            search.leaves.push(leaf);
            if steps.is_empty() {
                continue;
            }
            let right = self.task.is_correct(gold, &steps);
            let words = steps.iter().map(|t| t.split_whitespace().count()).sum();
            search.tree.end(leaf, right, words);
            search.tree.nodes[0].rollouts += 1;
            search.tree.nodes[0].hits += usize::from(right);
            if !right {
                search.given.push(Candidate {
                    from: 0,
                    leaf,
                    given: Some(i),
                });
            }
        }
        Ok(search)
    }
}

impl Rounds for Search<'_> {
    type Out = Vec<(Solution, Spent)>;

    fn question(&self) -> &str {
        self.question
    }

    fn next(&mut self, _: &Rollouts<'_>) -> Option<Ask> {
        let node = self.next_probe()?;
        let prefix = self.tree.steps(node);
        let key = format!("{}\u{1f}{}", self.problem, prefix.join("\u{1f}"));
        let o = &self.annotator.options;
        Some(Ask {
            at: node,
            prefix,
            n: o.rollouts,
            seed: crate::montecarlo::seed_for(o.seed, &key, 0),
        })
    }

    fn observe(&mut self, _: &Rollouts<'_>, node: usize, outs: Vec<Continuation>) {
        let mut spent = Spent::default();
        let alive = self.take_rollouts(node, outs, &mut spent);
        let b = self.current.as_mut().expect("a probe belongs to a bisection");
        b.spent += spent;
        match alive {
            true => b.lo = b.asked as isize,
            false => b.hi = b.asked,
        }
    }

    /// The given solutions labelled from what the tree knows, each with its searches' cost, then
    /// the tree's new complete rollouts as labelled solutions.
    fn finish(self) -> Vec<(Solution, Spent)> {
        let (tree, first) = (&self.tree, &self.sols[0]);
        let mut out: Vec<(Solution, Spent)> = (self.sols.iter().zip(&self.leaves).zip(&self.spent))
            .map(|((s, &leaf), &cost)| {
                let mut l = s.clone();
                if !s.steps.is_empty() {
                    for (st, new) in l.steps.iter_mut().zip(tree.labelled_steps(leaf)) {
                        st.label = new.label;
                    }
                }
                (l, cost)
            })
            .collect();
        let given_leaves: std::collections::HashSet<usize> = self.leaves.iter().copied().collect();
        let mut extra = 0;
        for (n, node) in tree.nodes.iter().enumerate() {
            let Some((right, _)) = node.ended else { continue };
            if given_leaves.contains(&n) {
                continue;
            }
            let mut s = Solution {
                id: format!("{}-omegaprm-{extra}", first.problem_id),
                problem_id: first.problem_id.clone(),
                question: first.question.clone(),
                steps: tree.labelled_steps(n),
                gold_answer: first.gold_answer.clone(),
                correct: Some(right),
                generator: first.generator.clone(),
                ..Default::default()
            };
            s.final_answer = self.annotator.task.answer(&s.step_strings());
            s.meta.insert("omegaprm_rollout".into(), true.into());
            out.push((s, Spent::default()));
            extra += 1;
        }
        out
    }
}

impl Annotator for OmegaPrm<'_> {
    fn name(&self) -> &str {
        "omegaprm"
    }

    fn annotate(&self, sol: &Solution) -> Result<(Solution, Spent)> {
        let mut out = self.annotate_tree(std::slice::from_ref(sol))?;
        Ok(out.swap_remove(0))
    }

    fn annotate_problem(&self, sols: &[Solution]) -> Result<Vec<(Solution, Spent)>> {
        self.annotate_tree(sols)
    }

    fn by_problem(&self) -> bool {
        true
    }

    /// Many problems' searches at once where the policy batches: every live problem's next
    /// probe in one call a round (`Rollouts::together`), each problem's searches in the order
    /// and with the seeds it has alone, so the same labels.
    fn annotate_problems_together(&self, problems: &[Vec<Solution>], done: &mut ProblemDone<'_>) -> Option<Result<()>> {
        let options = self.mc_options();
        Rollouts::new(self.policy, self.task, &options).together(problems, |sols| self.search_of(sols), done)
    }
}

#[cfg(test)]
mod tests;
