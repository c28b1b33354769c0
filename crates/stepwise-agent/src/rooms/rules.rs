//! What an action does in a world of rooms: parsing, the state it leads to, what the agent is
//! told, and the fewest actions still needed to reach the goal (the oracle's measure).

use super::{Place, State, World, DIRECTIONS};
use std::collections::{HashMap, HashSet, VecDeque};

/// An action the world understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Go(usize),
    Take(usize),
    Drop(usize),
    Open(usize),
    Close(usize),
    Unlock(usize, usize),
    Put(usize, usize),
    Eat(usize),
    Look,
    Inventory,
}

/// What one action did.
pub struct Effect {
    /// The state after it (the same state when the action was invalid).
    pub state: State,
    /// What the agent is told.
    pub message: String,
    /// Whether the world could do it.
    pub valid: bool,
}

/// An action parsed from text: lower case, articles and a trailing full stop ignored; `None`
/// when it names nothing this world has.
pub fn parse(world: &World, text: &str) -> Option<Action> {
    let lower = text.trim().trim_end_matches('.').to_lowercase();
    let words: Vec<&str> = lower
        .split_whitespace()
        .filter(|w| !matches!(*w, "the" | "a" | "an"))
        .collect();
    let item = |w: &str| world.items.iter().position(|i| i.name == w);
    let container = |w: &str| world.containers.iter().position(|c| c.name == w);
    Some(match words.as_slice() {
        ["go", d] | [d] if DIRECTIONS.contains(d) => Action::Go(DIRECTIONS.iter().position(|x| x == d)?),
        ["take" | "get", i] | ["pick", "up", i] => Action::Take(item(i)?),
        ["drop", i] => Action::Drop(item(i)?),
        ["open", c] => Action::Open(container(c)?),
        ["close", c] => Action::Close(container(c)?),
        ["unlock", c, "with", i] => Action::Unlock(container(c)?, item(i)?),
        ["put", i, "in" | "into", c] => Action::Put(item(i)?, container(c)?),
        ["eat", i] => Action::Eat(item(i)?),
        ["look"] => Action::Look,
        ["inventory"] | ["i"] => Action::Inventory,
        _ => return None,
    })
}

/// The text of an action, as [`parse`] reads it back.
pub fn render(world: &World, a: Action) -> String {
    let item = |i: usize| &world.items[i].name;
    let cont = |c: usize| &world.containers[c].name;
    match a {
        Action::Go(d) => format!("go {}", DIRECTIONS[d]),
        Action::Take(i) => format!("take {}", item(i)),
        Action::Drop(i) => format!("drop {}", item(i)),
        Action::Open(c) => format!("open {}", cont(c)),
        Action::Close(c) => format!("close {}", cont(c)),
        Action::Unlock(c, i) => format!("unlock {} with {}", cont(c), item(i)),
        Action::Put(i, c) => format!("put {} in {}", item(i), cont(c)),
        Action::Eat(i) => format!("eat {}", item(i)),
        Action::Look => "look".into(),
        Action::Inventory => "inventory".into(),
    }
}

/// Whether item `i` can be reached from where the agent stands: lying in the room, or inside an
/// open container in it.
fn within_reach(world: &World, s: &State, i: usize) -> bool {
    match s.items[i] {
        Place::Room(r) => r == s.room,
        Place::In(c) => world.containers[c as usize].room == s.room as usize && s.is_open(c as usize),
        Place::Held | Place::Gone => false,
    }
}

/// What `a` does in state `s`.
pub fn apply(world: &World, s: &State, a: Action) -> Effect {
    let mut t = s.clone();
    let here = |c: usize| world.containers[c].room == s.room as usize;
    let item = |i: usize| world.items[i].name.as_str();
    let cont = |c: usize| world.containers[c].name.as_str();
    let no = |message: String| Effect {
        state: s.clone(),
        message,
        valid: false,
    };
    let message = match a {
        Action::Go(d) => match world.exits[s.room as usize][d] {
            Some(r) => {
                t.room = r as u8;
                describe(world, &t)
            }
            None => return no(format!("You cannot go {} from here.", DIRECTIONS[d])),
        },
        Action::Take(i) if within_reach(world, s, i) => {
            t.items[i] = Place::Held;
            format!("You take the {}.", item(i))
        }
        Action::Take(i) if s.items[i] == Place::Held => return no(format!("You already have the {}.", item(i))),
        Action::Take(i) => return no(format!("You see no {} here.", item(i))),
        Action::Drop(i) | Action::Put(i, _) if s.items[i] != Place::Held => {
            return no(format!("You do not have the {}.", item(i)))
        }
        Action::Drop(i) => {
            t.items[i] = Place::Room(s.room);
            format!("You drop the {}.", item(i))
        }
        Action::Open(c) | Action::Close(c) | Action::Unlock(c, _) | Action::Put(_, c) if !here(c) => {
            return no(format!("You see no {} here.", cont(c)))
        }
        Action::Open(c) if world.containers[c].sink => return no(format!("The {} cannot be opened.", cont(c))),
        Action::Open(c) if s.is_locked(c) => return no(format!("The {} is locked.", cont(c))),
        Action::Open(c) if s.is_open(c) => return no(format!("The {} is already open.", cont(c))),
        Action::Open(c) => {
            t.set_open(c, true);
            format!("You open the {}. {}", cont(c), contents(world, &t, c))
        }
        Action::Close(c) if !s.is_open(c) || world.containers[c].sink => {
            return no(format!("The {} is not open.", cont(c)))
        }
        Action::Close(c) => {
            t.set_open(c, false);
            format!("You close the {}.", cont(c))
        }
        Action::Unlock(c, _) if !s.is_locked(c) => return no(format!("The {} is not locked.", cont(c))),
        Action::Unlock(_, i) if s.items[i] != Place::Held => return no(format!("You do not have the {}.", item(i))),
        Action::Unlock(c, i) if world.containers[c].key != Some(i) => {
            return no(format!("The {} does not fit the {}.", item(i), cont(c)))
        }
        Action::Unlock(c, _) => {
            t.locked &= !(1 << c);
            format!("You unlock the {}.", cont(c))
        }
        Action::Put(i, c) if world.containers[c].sink => {
            t.items[i] = Place::Gone;
            format!("The {} falls into the {} and is gone.", item(i), cont(c))
        }
        Action::Put(_, c) if !s.is_open(c) => return no(format!("The {} is closed.", cont(c))),
        Action::Put(i, c) => {
            t.items[i] = Place::In(c as u8);
            format!("You put the {} in the {}.", item(i), cont(c))
        }
        Action::Eat(i) if !world.items[i].edible => return no(format!("You cannot eat the {}.", item(i))),
        Action::Eat(i) if s.items[i] == Place::Held || within_reach(world, s, i) => {
            t.items[i] = Place::Gone;
            format!("You eat the {}.", item(i))
        }
        Action::Eat(i) => return no(format!("You see no {} here.", item(i))),
        Action::Look => describe(world, s),
        Action::Inventory => inventory(world, s),
    };
    Effect {
        state: t,
        message,
        valid: true,
    }
}

fn list(names: &[String]) -> String {
    match names {
        [] => "nothing".into(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// What an open container holds.
fn contents(world: &World, s: &State, c: usize) -> String {
    let inside: Vec<String> = (0..world.items.len())
        .filter(|&i| s.items[i] == Place::In(c as u8))
        .map(|i| format!("a {}", world.items[i].name))
        .collect();
    format!("Inside: {}.", list(&inside))
}

fn inventory(world: &World, s: &State) -> String {
    let held: Vec<String> = (0..world.items.len())
        .filter(|&i| s.items[i] == Place::Held)
        .map(|i| format!("a {}", world.items[i].name))
        .collect();
    format!("You carry {}.", list(&held))
}

/// The room the agent stands in: what lies there, the containers and what the open ones hold,
/// and the exits.
pub fn describe(world: &World, s: &State) -> String {
    let r = s.room as usize;
    let mut seen: Vec<String> = Vec::new();
    for (c, k) in world.containers.iter().enumerate().filter(|(_, k)| k.room == r) {
        let state = if k.sink {
            String::new()
        } else if s.is_locked(c) {
            " (locked)".into()
        } else if s.is_open(c) {
            let inside: Vec<String> = (0..world.items.len())
                .filter(|&i| s.items[i] == Place::In(c as u8))
                .map(|i| world.items[i].name.clone())
                .collect();
            format!(" (open, holding {})", list(&inside))
        } else {
            " (closed)".into()
        };
        seen.push(format!("a {}{state}", k.name));
    }
    for i in (0..world.items.len()).filter(|&i| s.items[i] == Place::Room(s.room)) {
        seen.push(format!("a {}", world.items[i].name));
    }
    let exits: Vec<String> = (0..4)
        .filter_map(|d| world.exits[r][d].map(|to| format!("{} to the {}", DIRECTIONS[d], world.rooms[to])))
        .collect();
    format!(
        "You are in the {}. You see {}. Exits: {}.",
        world.rooms[r],
        list(&seen),
        list(&exits)
    )
}

/// Every action worth trying in `s` (a BFS over them finds the fewest actions to the goal):
/// moves, and what can be done with the items in `relevant` and the containers here.
pub fn candidates(world: &World, s: &State, relevant: &[usize]) -> Vec<Action> {
    let mut out: Vec<Action> = (0..4)
        .filter(|&d| world.exits[s.room as usize][d].is_some())
        .map(Action::Go)
        .collect();
    for c in (0..world.containers.len()).filter(|&c| world.containers[c].room == s.room as usize) {
        out.extend([Action::Open(c), Action::Close(c)]);
        for &i in relevant {
            out.extend([Action::Unlock(c, i), Action::Put(i, c)]);
        }
    }
    for &i in relevant {
        out.extend([Action::Take(i), Action::Drop(i)]);
    }
    out
}

/// Fewest actions from `s` to the goal (`None`: it cannot be reached), remembered in `memo`. The
/// items that cannot matter (neither the goal's item nor a key) are left out of the search:
/// nothing they do changes what the others can.
pub fn distance(world: &World, s: &State, memo: &mut HashMap<State, Option<u8>>) -> Option<u8> {
    let relevant = world.relevant_items();
    let start = world.project(s, &relevant);
    if let Some(d) = memo.get(&start) {
        return *d;
    }
    let mut seen: HashSet<State> = HashSet::from([start.clone()]);
    let mut queue = VecDeque::from([(start.clone(), 0u8)]);
    let mut found = None;
    while let Some((state, d)) = queue.pop_front() {
        if world.reached(&state) {
            found = Some(d);
            break;
        }
        for a in candidates(world, &state, &relevant) {
            let e = apply(world, &state, a);
            if e.valid && seen.insert(e.state.clone()) {
                queue.push_back((e.state, d + 1));
            }
        }
    }
    memo.insert(start, found);
    found
}
