//! A text world of rooms, containers and items: the agent domain's environment, small enough
//! for a tiny model to learn and with an exact oracle.
//!
//! ```text
//! Put the gem in the case.
//! Observation: You are in the hall. You see a drawer (closed). Exits: north to the cellar.
//! open drawer        → You open the drawer. Inside: a key.                        (progress)
//! look               → You are in the hall. …                                     (useless)
//! take key           → You take the key.                                          (progress)
//! go north           → You are in the cellar. You see a chest (locked), a well. … (progress)
//! put key in well    → The key falls into the well and is gone.                   (ruin)
//! ```
//!
//! The goal needs a few prerequisite actions (a key in a drawer opens the chest that holds the
//! item); some actions are valid but useless (looking, taking what is not needed), some move
//! away from the goal but can be repaired (going back, closing what must be open), some are
//! invalid (nothing happens), and some ruin it (eating the item, dropping the key down the
//! well), which ends the episode. An episode that reaches the goal after an invalid or
//! regressing action is a lucky success: the outcome cannot tell it from a clean one.
//!
//! The oracle knows, for every state, the fewest actions still needed (a breadth-first search
//! over the items that matter), and so whether an action made progress.

mod expert;
mod generate;
pub mod rules;

pub use expert::Expert;
pub use generate::{generate, problem};

use anyhow::{bail, Context, Result};
use rules::{apply, describe, distance, parse};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use stepwise_core::seams::{ActionKind, Environment, Episode, Observation};
use stepwise_core::Problem;

/// The directions exits lead in, in the order actions name them.
pub const DIRECTIONS: [&str; 4] = ["north", "south", "east", "west"];

/// Where an item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Place {
    /// Lying in room `r`.
    Room(u8),
    /// Inside container `c`.
    In(u8),
    /// Carried by the agent.
    Held,
    /// Eaten or lost down the well.
    Gone,
}

/// A container: closed or open, perhaps locked by a key; a sink swallows what is put in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Container {
    /// Its name (unique in the world).
    pub name: String,
    /// The room it stands in.
    pub room: usize,
    /// The item that unlocks it; it starts locked when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<usize>,
    /// Whether it starts open.
    #[serde(default)]
    pub open: bool,
    /// A well: what goes in is gone.
    #[serde(default)]
    pub sink: bool,
}

/// An item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    /// Its name (unique in the world).
    pub name: String,
    /// Where it starts.
    pub at: Place,
    /// Whether eating it is possible (and makes it gone).
    #[serde(default)]
    pub edible: bool,
}

/// A whole world: its map, containers, items and goal (put `goal_item` in `goal_container`).
/// Problems carry it in `meta.world`, so a trajectory file can be replayed anywhere.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct World {
    /// Room names.
    pub rooms: Vec<String>,
    /// For each room, the room each direction of [`DIRECTIONS`] leads to.
    pub exits: Vec<[Option<usize>; 4]>,
    /// The containers.
    pub containers: Vec<Container>,
    /// The items.
    pub items: Vec<Item>,
    /// The room the agent starts in.
    pub start: usize,
    /// The item the goal is about.
    pub goal_item: usize,
    /// The container it must end up in.
    pub goal_container: usize,
}

/// The state of an episode.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The room the agent is in.
    pub room: u8,
    /// Where each item is.
    pub items: Vec<Place>,
    /// Open containers, one bit each.
    pub open: u16,
    /// Locked containers, one bit each.
    pub locked: u16,
}

impl State {
    fn is_open(&self, c: usize) -> bool {
        self.open & (1 << c) != 0
    }

    fn is_locked(&self, c: usize) -> bool {
        self.locked & (1 << c) != 0
    }

    fn set_open(&mut self, c: usize, open: bool) {
        if open {
            self.open |= 1 << c;
        } else {
            self.open &= !(1 << c);
        }
    }
}

impl World {
    /// The state an episode starts in.
    pub fn initial(&self) -> State {
        let bits = |f: &dyn Fn(&Container) -> bool| {
            self.containers
                .iter()
                .enumerate()
                .filter(|(_, c)| f(c))
                .fold(0u16, |m, (i, _)| m | 1 << i)
        };
        State {
            room: self.start as u8,
            items: self.items.iter().map(|i| i.at).collect(),
            open: bits(&|c| c.open || c.sink),
            locked: bits(&|c| c.key.is_some()),
        }
    }

    /// The task, as the agent is given it.
    pub fn task(&self) -> String {
        format!(
            "Put the {} in the {}.",
            self.items[self.goal_item].name, self.containers[self.goal_container].name
        )
    }

    /// Whether `s` reaches the goal.
    pub fn reached(&self, s: &State) -> bool {
        s.items[self.goal_item] == Place::In(self.goal_container as u8)
    }

    /// Where the goal's item lies in `s`, in words (`in the case`, `carried`, `in the hall`,
    /// `gone`): the outcome a majority vote over trajectories counts.
    pub fn goal_place(&self, s: &State) -> String {
        match s.items[self.goal_item] {
            Place::Room(r) => format!("in the {}", self.rooms[r as usize]),
            Place::In(c) => format!("in the {}", self.containers[c as usize].name),
            Place::Held => "carried".into(),
            Place::Gone => "gone".into(),
        }
    }

    /// The state after `actions` from the start (those that parse; invalid ones change
    /// nothing, as in an episode).
    pub fn replay<'a>(&self, actions: impl IntoIterator<Item = &'a str>) -> State {
        actions.into_iter().fold(self.initial(), |s, a| match parse(self, a) {
            Some(a) => apply(self, &s, a).state,
            None => s,
        })
    }

    /// The items that can matter for the goal: its item and every key.
    pub fn relevant_items(&self) -> Vec<usize> {
        let mut r: Vec<usize> = std::iter::once(self.goal_item)
            .chain(self.containers.iter().filter_map(|c| c.key))
            .collect();
        r.sort_unstable();
        r.dedup();
        r
    }

    /// `s` with the items that cannot matter set aside (all `Gone`), so states that differ
    /// only in them are one state to the search.
    pub fn project(&self, s: &State, relevant: &[usize]) -> State {
        let mut p = s.clone();
        for (i, place) in p.items.iter_mut().enumerate() {
            if !relevant.contains(&i) {
                *place = Place::Gone;
            }
        }
        p
    }

    /// Check that indices point inside the world and names are unique, naming what is wrong.
    pub fn validate(&self) -> Result<()> {
        let (nr, nc, ni) = (self.rooms.len(), self.containers.len(), self.items.len());
        if nr == 0 || nr > 200 || nc > 16 || ni > 32 || self.exits.len() != nr {
            bail!("a world needs 1-200 rooms with one exits entry each, at most 16 containers and 32 items");
        }
        let room_ok = |r: usize| r < nr;
        let place_ok = |p: Place| match p {
            Place::Room(r) => room_ok(r as usize),
            Place::In(c) => (c as usize) < nc,
            Place::Held | Place::Gone => true,
        };
        let ok = room_ok(self.start)
            && self.goal_item < ni
            && self.goal_container < nc
            && self.exits.iter().flatten().flatten().all(|&r| room_ok(r))
            && self
                .containers
                .iter()
                .all(|c| room_ok(c.room) && c.key.is_none_or(|k| k < ni))
            && self.items.iter().all(|i| place_ok(i.at));
        let mut names: Vec<&str> = self.items.iter().map(|i| i.name.as_str()).collect();
        names.extend(self.containers.iter().map(|c| c.name.as_str()));
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        if !ok || names.len() != n {
            bail!("a room, container or item index is out of range, or a name is used twice");
        }
        Ok(())
    }
}

/// The world of a problem, read from its `meta.world`.
pub fn world_of(problem: &Problem) -> Result<World> {
    let v = problem.meta.get("world").with_context(|| {
        format!(
            "problem `{}` has no `meta.world`: it is not a rooms problem (make them with `stepwise agent games`)",
            problem.id
        )
    })?;
    let w: World =
        serde_json::from_value(v.clone()).with_context(|| format!("problem `{}`: field `meta.world`", problem.id))?;
    w.validate()
        .with_context(|| format!("problem `{}`: field `meta.world`", problem.id))?;
    Ok(w)
}

/// The fewest actions to the goal found so far, by state, in one world.
pub(crate) type Distances = HashMap<State, Option<u8>>;

/// The rooms environment. Distances the oracle has computed are remembered per world and
/// shared by every episode of it.
#[derive(Default)]
pub struct Rooms {
    memo: Mutex<HashMap<String, Arc<Mutex<Distances>>>>,
    /// The most actions an episode may take (default 30).
    pub max_actions: Option<usize>,
    /// Whether the world keeps the goal to itself ([`Rooms::silent`]).
    pub silent: bool,
}

/// An episode in a rooms world.
#[derive(Clone)]
pub struct RoomsEpisode {
    world: Arc<World>,
    state: State,
    over: bool,
    silent: bool,
    memo: Arc<Mutex<Distances>>,
}

impl RoomsEpisode {
    /// The fewest actions still needed from the current state (`None`: the goal is lost).
    pub fn distance(&self) -> Option<u8> {
        distance(
            &self.world,
            &self.state,
            &mut self.memo.lock().unwrap_or_else(|e| e.into_inner()),
        )
    }

    /// The world this episode plays in.
    pub fn world(&self) -> &World {
        &self.world
    }

    /// The current state.
    pub fn state(&self) -> &State {
        &self.state
    }
}

impl Rooms {
    /// The rooms environment, an episode lasting at most `max_actions` actions.
    pub fn new(max_actions: usize) -> Rooms {
        Rooms {
            max_actions: Some(max_actions),
            ..Default::default()
        }
    }

    /// The rooms world that keeps the goal to itself, as WebShop scores a purchase: reaching
    /// the goal or losing it for good says nothing and ends nothing; the agent stops when it
    /// judges the task done (an empty action: end of sequence), and the outcome is whether the
    /// goal holds then ([`Episode::outcome`]). An agent that puts the item in and takes it out
    /// again has failed; one that stops early has too. Best-of-N over trajectories is then a
    /// real choice: no observation says which trajectory succeeded.
    pub fn silent(max_actions: usize) -> Rooms {
        Rooms {
            silent: true,
            ..Rooms::new(max_actions)
        }
    }
}

impl Environment for Rooms {
    fn reset(&self, problem: &Problem) -> Result<(Box<dyn Episode>, String)> {
        let world = world_of(problem)?;
        let memo = self
            .memo
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(problem.id.clone())
            .or_default()
            .clone();
        let ep = RoomsEpisode {
            state: world.initial(),
            world: Arc::new(world),
            over: false,
            silent: self.silent,
            memo,
        };
        let first = describe(&ep.world, &ep.state);
        Ok((Box::new(ep), first))
    }

    fn max_actions(&self) -> usize {
        self.max_actions.unwrap_or(30)
    }
}

impl Episode for RoomsEpisode {
    fn step(&mut self, action: &str) -> Result<Observation> {
        if self.over {
            return Ok(Observation {
                text: "The episode is over.".into(),
                done: true,
                success: false,
            });
        }
        let Some(a) = parse(&self.world, action) else {
            return Ok(Observation {
                text: "Nothing happens: that is not an action here.".into(),
                ..Default::default()
            });
        };
        let effect = apply(&self.world, &self.state, a);
        self.state = effect.state;
        let mut obs = Observation {
            text: effect.message,
            ..Default::default()
        };
        if self.silent {
            return Ok(obs);
        }
        if self.world.reached(&self.state) {
            obs.text.push_str(" You have done it.");
            (obs.done, obs.success) = (true, true);
        } else if effect.valid && self.distance().is_none() {
            obs.text.push_str(" The task can no longer be done.");
            obs.done = true;
        }
        self.over = obs.done;
        Ok(obs)
    }

    fn fork(&self) -> Result<Box<dyn Episode>> {
        Ok(Box::new(self.clone()))
    }

    fn outcome(&self) -> Option<bool> {
        Some(self.world.reached(&self.state))
    }

    fn judge(&self, action: &str) -> Option<ActionKind> {
        if self.over {
            return Some(ActionKind::Invalid);
        }
        let Some(a) = parse(&self.world, action) else {
            return Some(ActionKind::Invalid);
        };
        let effect = apply(&self.world, &self.state, a);
        if !effect.valid {
            return Some(ActionKind::Invalid);
        }
        let mut memo = self.memo.lock().unwrap_or_else(|e| e.into_inner());
        let before = distance(&self.world, &self.state, &mut memo);
        let after = distance(&self.world, &effect.state, &mut memo);
        Some(match (before, after) {
            // Past ruin (the silent world goes on): nothing more can be lost.
            (None, None) => ActionKind::Useless,
            (_, None) => ActionKind::Ruin,
            (Some(b), Some(a)) if a < b => ActionKind::Progress,
            (Some(b), Some(a)) if a == b => ActionKind::Useless,
            _ => ActionKind::Regress,
        })
    }
}
