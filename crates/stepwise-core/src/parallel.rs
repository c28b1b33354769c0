//! Work done on several threads and handed on in the input's order: how a command keeps many
//! requests to servers in flight while writing its output as a single thread would.

use anyhow::Result;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// `work` on every item, `threads` at a time, each result given to `sink` in the items' order
/// as soon as those before it are. An error from `sink` stops the rest (items already started
/// finish and are dropped) and is returned.
pub fn in_order<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    work: impl Fn(&T) -> R + Sync,
    mut sink: impl FnMut(&T, R) -> Result<()>,
) -> Result<()> {
    let threads = threads.clamp(1, items.len().max(1));
    if threads == 1 {
        return items.iter().try_for_each(|it| sink(it, work(it)));
    }
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let (tx, rx) = std::sync::mpsc::channel::<(usize, R)>();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let (tx, next, stop, work) = (tx.clone(), &next, &stop, &work);
            scope.spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= items.len() || tx.send((i, work(&items[i]))).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        let mut order = Reorder::default();
        for (i, r) in rx {
            if let Err(e) = order.put(i, r, |i, r| sink(&items[i], r)) {
                stop.store(true, Ordering::SeqCst);
                return Err(e);
            }
        }
        Ok(())
    })
}

/// Results that come in any order handed on in their items' order: each waits until every
/// result before it has been handed on.
pub struct Reorder<R> {
    waiting: BTreeMap<usize, R>,
    next: usize,
}

impl<R> Default for Reorder<R> {
    fn default() -> Self {
        Reorder {
            waiting: BTreeMap::new(),
            next: 0,
        }
    }
}

impl<R> Reorder<R> {
    /// Result `i` has come: hand `sink` every result now due, in order (`sink(index, result)`);
    /// its first error is returned, the results after it kept waiting.
    pub fn put(&mut self, i: usize, r: R, mut sink: impl FnMut(usize, R) -> Result<()>) -> Result<()> {
        self.waiting.insert(i, r);
        while let Some(r) = self.waiting.remove(&self.next) {
            self.next += 1;
            sink(self.next - 1, r)?;
        }
        Ok(())
    }

    /// Results waiting for one before them.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_in_order_and_an_error_stops_the_rest() {
        let items: Vec<u64> = (0..200).collect();
        let mut seen = Vec::new();
        in_order(
            &items,
            16,
            |&i| {
                std::thread::sleep(std::time::Duration::from_micros((200 - i) * 20));
                i * 2
            },
            |&i, r| {
                assert_eq!(r, i * 2);
                seen.push(i);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(seen, items);
        let worked = AtomicUsize::new(0);
        let e = in_order(
            &items,
            4,
            |&i| {
                worked.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(2));
                i
            },
            |&i, _| if i == 10 { anyhow::bail!("full disk") } else { Ok(()) },
        );
        assert_eq!(e.unwrap_err().to_string(), "full disk");
        assert!(worked.load(Ordering::SeqCst) < 200);
    }

    #[test]
    fn reordered_results_wait_for_those_before_them() {
        let mut order = Reorder::default();
        let mut seen = Vec::new();
        for i in [2, 0, 3, 1, 5] {
            order
                .put(i, i * 10, |j, r| {
                    seen.push((j, r));
                    Ok(())
                })
                .unwrap();
        }
        assert_eq!(seen, [(0, 0), (1, 10), (2, 20), (3, 30)]);
        assert_eq!(order.waiting(), 1, "5 waits for 4");
        let e = order.put(4, 40, |j, _| if j == 4 { anyhow::bail!("full disk") } else { Ok(()) });
        assert_eq!(e.unwrap_err().to_string(), "full disk");
        assert_eq!(order.waiting(), 1, "what follows an error stays");
    }
}
