//! Prompts of one call that share a start feed it once (automatic prefix caching, as vLLM's and
//! SGLang's, within the asks of one [`crate::policy`] batch call): an agent's rollouts from one
//! state (each its own ask, with its own seed) share the whole history; its states `i` and
//! `i + 1`, asked in the same call, share all of state `i`'s; a caller's every prefix of one
//! solution shares the question and the steps before. A batch keeps the prefixes of rows that
//! finished ([`crate::Decoding::keep_prefixes`]), but asks admitted together are fed before any
//! is kept: each would feed the start again. So each start two or more prompts share (a branch
//! point of their trie) gets a primer, a request for one token of it, decoded before the asks and
//! kept; primers go in levels, a start's after the longest primed start it begins with, so each
//! feeds only what its parent lacks, and every ask then starts from the longest primer it begins
//! with. The asks' draws are their own; only where their keys are computed changes.

use crate::SamplingParams;

/// A prepared ask: its prompt's tokens, how many continuations, their settings.
pub(crate) type Prepared = anyhow::Result<(Vec<u32>, usize, SamplingParams)>;

/// Shared starts shorter than this are fed with each ask: a level of primers is a decoding pass
/// (the weights read once more), which a few tokens do not repay.
pub(crate) const SHARED_START_MIN: usize = 8;

/// The primers of `asks`, level by level: every start of at least [`SHARED_START_MIN`] tokens
/// that two or more of their prompts share, as one-token requests (settings from an ask that has
/// it), each in the level after the longest primed start it begins with. A start `kept` says is
/// cached already but for its last token (it returns how many tokens of a prompt the batch holds
/// from earlier calls) is left out.
pub(crate) fn primer_levels(asks: &[Prepared], kept: impl Fn(&[u32]) -> usize) -> Vec<Vec<Prepared>> {
    let fine: Vec<&(Vec<u32>, usize, SamplingParams)> = asks.iter().flatten().collect();
    let prompts: Vec<&[u32]> = fine.iter().map(|f| f.0.as_slice()).collect();
    (shared_starts(&prompts, |start| kept(start) + 1 >= start.len()).into_iter())
        .map(|level| {
            (level.into_iter())
                .map(|(start, ask)| {
                    let one = SamplingParams {
                        max_new_tokens: 1,
                        ..fine[ask].2.clone()
                    };
                    Ok((start.to_vec(), 1, one))
                })
                .collect()
        })
        .collect()
}

/// The starts of at least [`SHARED_START_MIN`] tokens that two or more of `prompts` share (the
/// branch points of their trie), level by level, each with the index of a prompt that has it: a
/// start is in the level after the longest start it begins with, so fed level by level each
/// start feeds only what its parent lacks. A start `skip` says needs no feeding is left out (what
/// begins with it goes a level earlier).
pub(crate) fn shared_starts<'a>(prompts: &[&'a [u32]], skip: impl Fn(&[u32]) -> bool) -> Vec<Vec<(&'a [u32], usize)>> {
    let mut order: Vec<usize> = (0..prompts.len()).collect();
    order.sort_by(|&a, &b| prompts[a].cmp(prompts[b]));
    // The start each pair of neighbours in sorted order shares.
    let mut starts: Vec<(&[u32], usize)> = (order.windows(2))
        .filter_map(|w| {
            let (a, b) = (prompts[w[0]], prompts[w[1]]);
            let shared = a.iter().zip(b).take_while(|(x, y)| x == y).count();
            (shared >= SHARED_START_MIN).then_some((&a[..shared], w[0]))
        })
        .collect();
    // Sorted, a start comes before every start that begins with it, and those follow it together.
    starts.sort_by(|x, y| x.0.cmp(y.0));
    starts.dedup_by(|x, y| x.0 == y.0);
    let mut levels: Vec<Vec<(&[u32], usize)>> = Vec::new();
    // The starts the current one may begin with, each with its level.
    let mut open: Vec<(&[u32], usize)> = Vec::new();
    for (start, prompt) in starts {
        while open.last().is_some_and(|(s, _)| !start.starts_with(s)) {
            open.pop();
        }
        if skip(start) {
            continue;
        }
        let level = open.last().map_or(0, |&(_, l)| l + 1);
        open.push((start, level));
        if levels.len() == level {
            levels.push(Vec::new());
        }
        levels[level].push((start, prompt));
    }
    levels
}

#[cfg(test)]
mod tests {
    use super::{primer_levels, Prepared};
    use crate::SamplingParams;

    fn ask(tokens: &[u32]) -> Prepared {
        Ok((tokens.to_vec(), 2, SamplingParams::default()))
    }

    fn levels(asks: &[Prepared], kept: impl Fn(&[u32]) -> usize) -> Vec<Vec<Vec<u32>>> {
        (primer_levels(asks, kept).into_iter())
            .map(|l| l.into_iter().map(|p| p.unwrap().0).collect())
            .collect()
    }

    /// An agent's states 1..3 of one history (each a prefix of the next, two rollouts each, one
    /// prompt asked twice), another task's prompt, and a failed ask: the states are primed in a
    /// chain, shortest first; what nothing shares, or shares too briefly, is not.
    #[test]
    fn shared_starts_are_primed_in_levels_shortest_first() {
        let s1: Vec<u32> = (0..10).collect();
        let s2: Vec<u32> = (0..20).collect();
        let s3: Vec<u32> = (0..30).collect();
        let mut other: Vec<u32> = (0..5).collect();
        other.extend(100..120);
        let asks = [
            ask(&s3),
            ask(&s1),
            Err(anyhow::anyhow!("a bad ask")),
            ask(&s2),
            ask(&other),
            ask(&s2),
        ];
        let got = levels(&asks, |_| 0);
        assert_eq!(got, vec![vec![s1.clone()], vec![s2.clone()]]);
        for level in primer_levels(&asks, |_| 0) {
            let (_, n, params) = level.into_iter().next().unwrap().unwrap();
            assert_eq!((n, params.max_new_tokens), (1, 1));
        }
        // The states share their first 10 tokens with a new one at 12: its start 12 long is
        // primed between them.
        let mut s12: Vec<u32> = (0..12).collect();
        s12.push(77);
        let got = levels(&[ask(&s1), ask(&s2), ask(&s12), ask(&s3)], |_| 0);
        assert_eq!(got, vec![vec![s1.clone()], vec![(0..12).collect()], vec![s2.clone()]]);
    }

    /// A start the batch holds already (from an earlier call) is not primed again, and what
    /// begins with it is primed a level earlier.
    #[test]
    fn a_start_kept_already_is_not_primed_again() {
        let s1: Vec<u32> = (0..10).collect();
        let s2: Vec<u32> = (0..20).collect();
        let s3: Vec<u32> = (0..30).collect();
        let asks = [ask(&s1), ask(&s2), ask(&s3)];
        let kept = |p: &[u32]| p.len().min(10);
        assert_eq!(levels(&asks, kept), vec![vec![s2.clone()]]);
        let got = levels(&[ask(&(0..7).collect::<Vec<_>>()), ask(&(0..7).collect::<Vec<_>>())], |_| 0);
        assert!(got.is_empty(), "a 7-token start is fed with each ask");
    }
}
