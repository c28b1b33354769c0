//! What a [`crate::Decoding`] that keeps its prefixes ([`crate::Decoding::keep_prefixes`])
//! remembers of the rows that left: each one's tokens and the handle its keys and values are
//! kept under in the cache ([`crate::decode_cache::DecodeCache::retain_row`]). A prompt that
//! starts with a kept sequence's tokens starts from its cache and feeds only the rest (prefix
//! caching, as vLLM's and SGLang's): an agent's next turn re-reads only the environment's answer
//! and what follows, not the whole episode. The least recently used are forgotten when a
//! request needs their room.

/// One kept sequence.
struct Kept {
    handle: usize,
    /// The tokens its cache holds, in order.
    tokens: Vec<u32>,
    /// The room it holds at most (in the cache's units).
    room: usize,
}

/// The kept sequences, least recently used first.
#[derive(Default)]
pub(crate) struct KeptPrefixes {
    seqs: Vec<Kept>,
    /// The room they hold at most, together.
    held: usize,
}

impl KeptPrefixes {
    /// Remember the sequence kept under `handle`, whose cache holds `tokens` in `room`.
    pub(crate) fn keep(&mut self, handle: usize, tokens: Vec<u32>, room: usize) {
        self.held += room;
        self.seqs.push(Kept { handle, tokens, room });
    }

    /// The room held at most.
    pub(crate) fn held(&self) -> usize {
        self.held
    }

    /// The kept sequence that shares the longest start with `prompt`, and how many tokens they
    /// share (at most all but the prompt's last, whose logits the prompt's first draw needs);
    /// `None` where none shares a token. It becomes the most recently used.
    pub(crate) fn longest_shared(&mut self, prompt: &[u32]) -> Option<(usize, usize)> {
        let most = prompt.len().saturating_sub(1);
        let (at, len) = (self.seqs.iter().enumerate())
            .map(|(i, k)| {
                let shared = k.tokens.iter().zip(&prompt[..most]).take_while(|(a, b)| a == b).count();
                (i, shared)
            })
            .max_by_key(|&(i, shared)| (shared, i))?;
        if len == 0 {
            return None;
        }
        let k = self.seqs.remove(at);
        let handle = k.handle;
        self.seqs.push(k);
        Some((handle, len))
    }

    /// The most tokens of `prompt` a kept sequence holds, from its start.
    pub(crate) fn most_shared(&self, prompt: &[u32]) -> usize {
        (self.seqs.iter())
            .map(|k| k.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count())
            .max()
            .unwrap_or(0)
    }

    /// Forget the least recently used: its handle, for the cache to give its room back.
    pub(crate) fn forget_oldest(&mut self) -> Option<usize> {
        if self.seqs.is_empty() {
            return None;
        }
        let k = self.seqs.remove(0);
        self.held -= k.room;
        Some(k.handle)
    }
}

#[cfg(test)]
mod tests {
    use super::KeptPrefixes;

    #[test]
    fn the_longest_shared_start_is_found_and_the_oldest_forgotten() {
        let mut kept = KeptPrefixes::default();
        kept.keep(7, vec![1, 2, 3, 4], 1);
        kept.keep(8, vec![1, 2, 9], 2);
        assert_eq!(kept.held(), 3);
        // The prompt's last token is always fed: [1, 2, 3, 4] shares at most 3 with itself.
        assert_eq!(kept.longest_shared(&[1, 2, 3, 4]), Some((7, 3)));
        assert_eq!(kept.longest_shared(&[1, 2, 9, 9, 9]), Some((8, 3)));
        assert_eq!(kept.longest_shared(&[5, 1, 2]), None);
        assert_eq!((kept.most_shared(&[1, 2, 3, 4, 5]), kept.most_shared(&[5])), (4, 0));
        // 8 was used last: 7 goes first.
        assert_eq!(kept.forget_oldest(), Some(7));
        assert_eq!(kept.held(), 2);
        assert_eq!(kept.forget_oldest(), Some(8));
        assert_eq!(kept.forget_oldest(), None);
        assert_eq!(kept.held(), 0);
    }
}
