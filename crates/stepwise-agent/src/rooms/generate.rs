//! Rooms worlds drawn from a seed: three or four rooms, the goal's item somewhere behind a
//! prerequisite or two, a key, a well, and items that do not matter.

use super::{Container, Item, Place, World};
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use stepwise_core::Problem;

const ROOMS: [&str; 6] = ["kitchen", "hall", "garden", "cellar", "study", "attic"];
const GOAL_ITEMS: [(&str, bool); 4] = [("gem", false), ("ring", false), ("apple", true), ("bread", true)];
const TARGETS: [&str; 3] = ["case", "basket", "box"];
const DISTRACTORS: [(&str, bool); 3] = [("lamp", false), ("rope", false), ("pear", true)];

/// Directions' opposites, by index into [`DIRECTIONS`].
const OPPOSITE: [usize; 4] = [1, 0, 3, 2];

/// Rooms joined as a tree: each new room hangs off an earlier one by a free direction.
fn map(rng: &mut impl Rng, n: usize) -> (Vec<String>, Vec<[Option<usize>; 4]>) {
    let mut names: Vec<&str> = ROOMS.to_vec();
    names.shuffle(rng);
    let mut exits = vec![[None; 4]; n];
    for r in 1..n {
        loop {
            let from = rng.random_range(0..r);
            let free: Vec<usize> = (0..4).filter(|&d| exits[from][d].is_none()).collect();
            if let Some(&d) = free.choose(rng) {
                exits[from][d] = Some(r);
                exits[r][OPPOSITE[d]] = Some(from);
                break;
            }
        }
    }
    (names[..n].iter().map(|s| s.to_string()).collect(), exits)
}

/// World number `index` of the stream `seed`.
pub fn generate(seed: u64, index: usize) -> World {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let n = rng.random_range(3..=4);
    let (rooms, exits) = map(&mut rng, n);
    let room = |rng: &mut ChaCha8Rng| rng.random_range(0..n);
    let (goal_name, goal_edible) = *GOAL_ITEMS.choose(&mut rng).unwrap();
    // Containers: the target, the chest (locked by the key), the drawer, the well.
    let mut containers = vec![
        Container {
            name: TARGETS.choose(&mut rng).unwrap().to_string(),
            room: room(&mut rng),
            key: None,
            open: rng.random_bool(0.5),
            sink: false,
        },
        Container {
            name: "chest".into(),
            room: room(&mut rng),
            key: Some(1),
            open: false,
            sink: false,
        },
        Container {
            name: "drawer".into(),
            room: room(&mut rng),
            key: None,
            open: false,
            sink: false,
        },
        Container {
            name: "well".into(),
            room: room(&mut rng),
            key: None,
            open: true,
            sink: true,
        },
    ];
    // The goal's item: locked in the chest (the long way), in the drawer, or lying in a room.
    let hidden = rng.random_range(0..4);
    let goal_at = match hidden {
        0 | 1 => Place::In(1),
        2 => Place::In(2),
        _ => Place::Room(room(&mut rng) as u8),
    };
    let key_at = if hidden == 2 || rng.random_bool(0.5) {
        Place::Room(room(&mut rng) as u8)
    } else {
        Place::In(2)
    };
    let mut items = vec![
        Item {
            name: goal_name.into(),
            at: goal_at,
            edible: goal_edible,
        },
        Item {
            name: "key".into(),
            at: key_at,
            edible: false,
        },
    ];
    let mut extra: Vec<(&str, bool)> = DISTRACTORS.to_vec();
    extra.shuffle(&mut rng);
    for &(name, edible) in &extra[..rng.random_range(1..=2)] {
        let at = if rng.random_bool(0.3) {
            Place::In(0)
        } else {
            Place::Room(room(&mut rng) as u8)
        };
        items.push(Item {
            name: name.into(),
            at,
            edible,
        });
    }
    if !rng.random_bool(0.7) {
        // No well in this world.
        containers.pop();
    }
    World {
        rooms,
        exits,
        containers,
        items,
        start: room(&mut rng),
        goal_item: 0,
        goal_container: 0,
    }
}

/// The problem of world `index` of stream `seed`: the task as its question, the world in
/// `meta.world`.
pub fn problem(seed: u64, index: usize) -> Problem {
    let w = generate(seed, index);
    let mut meta = stepwise_core::Meta::new();
    meta.insert("world".into(), serde_json::to_value(&w).expect("a world serialises"));
    Problem {
        id: format!("rooms-{seed}-{index}"),
        question: w.task(),
        gold_answer: None,
        source: Some("stepwise-rooms".into()),
        meta,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rooms::DIRECTIONS;

    #[test]
    fn worlds_are_valid_connected_and_reproducible() {
        for i in 0..200 {
            let w = generate(3, i);
            w.validate().unwrap();
            assert_eq!(w, generate(3, i));
            // Every room is reachable from the start.
            let mut seen = vec![false; w.rooms.len()];
            let mut stack = vec![w.start];
            while let Some(r) = stack.pop() {
                if !std::mem::replace(&mut seen[r], true) {
                    stack.extend(w.exits[r].iter().flatten());
                }
            }
            assert!(seen.iter().all(|&s| s), "world {i}");
            for (r, ex) in w.exits.iter().enumerate() {
                for (d, to) in ex.iter().enumerate() {
                    if let Some(to) = to {
                        assert_eq!(w.exits[*to][OPPOSITE[d]], Some(r), "{} back", DIRECTIONS[d]);
                    }
                }
            }
        }
        assert_ne!(generate(3, 0), generate(4, 0));
    }
}
