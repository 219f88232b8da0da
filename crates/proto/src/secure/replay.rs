//! [`ReplayWindow`]: which packet numbers of one channel were already accepted.

/// Packet numbers tracked below the highest one accepted. Older ones are dropped as replays:
/// a real datagram is never this late (repairs are new datagrams with new numbers).
pub const WINDOW: u64 = 1 << 16;
/// Words of the bitmap: one more than the window needs, so that the word being filled at the
/// top never shares its slot with the oldest word still inside the window.
const WORDS: usize = (WINDOW / 64) as usize + 1;

/// A sliding bitmap of accepted packet numbers (as IPsec's and WireGuard's): a number above the
/// highest is new; one within [`WINDOW`](crate::secure::REPLAY_WINDOW) below it is new unless its bit is set; anything older
/// is refused. [`check`](Self::check) before opening a datagram, [`accept`](Self::accept) only
/// after it opened, so forged datagrams never move the window.
#[derive(Debug, Clone)]
pub struct ReplayWindow {
    /// One past the highest accepted number (0: none yet).
    top: u64,
    bits: Box<[u64]>,
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow {
            top: 0,
            bits: vec![0u64; WORDS].into_boxed_slice(),
        }
    }
}

impl ReplayWindow {
    /// An empty window.
    pub fn new() -> ReplayWindow {
        ReplayWindow::default()
    }

    /// Whether `pn` may be new: above the highest accepted, or within the window and unseen.
    pub fn check(&self, pn: u64) -> bool {
        if pn >= self.top {
            return true;
        }
        if self.top - pn > WINDOW {
            return false;
        }
        let (w, b) = slot(pn);
        self.bits[w] & (1 << b) == 0
    }

    /// Records `pn` as accepted; returns false (and changes nothing) if
    /// [`check`](Self::check) would refuse it.
    pub fn accept(&mut self, pn: u64) -> bool {
        if !self.check(pn) {
            return false;
        }
        if pn >= self.top {
            // Clear the words the window slides over (all of them after a long jump).
            let from = self.top.div_ceil(64);
            let to = (pn / 64) + 1;
            if self.top == 0 || to - from >= WORDS as u64 {
                self.bits.fill(0);
            } else {
                for word in from..to {
                    self.bits[(word % WORDS as u64) as usize] = 0;
                }
            }
            self.top = pn + 1;
        }
        let (w, b) = slot(pn);
        self.bits[w] |= 1 << b;
        true
    }
}

fn slot(pn: u64) -> (usize, u32) {
    (((pn / 64) % WORDS as u64) as usize, (pn % 64) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn repeats_and_ancient_numbers_are_refused() {
        let mut w = ReplayWindow::new();
        assert!(w.accept(0));
        assert!(!w.accept(0));
        assert!(w.accept(5));
        assert!(w.accept(3), "late but within the window");
        assert!(!w.accept(3));
        assert!(w.accept(WINDOW + 10));
        assert!(!w.check(5), "more than a window below the top");
        assert!(w.check(WINDOW + 9));
    }

    #[test]
    fn a_long_jump_forgets_everything_below() {
        let mut w = ReplayWindow::new();
        for pn in 0..1000 {
            assert!(w.accept(pn));
        }
        assert!(w.accept(u64::MAX / 2));
        assert!(!w.check(999));
        assert!(w.check(u64::MAX / 2 - 1));
    }

    proptest! {
        /// Against a model that remembers every number: the window accepts a number exactly
        /// when it is unseen and not more than a window below the highest accepted.
        #[test]
        fn agrees_with_a_model(steps in proptest::collection::vec((0u64..3, 0u64..200_000), 1..600)) {
            let mut w = ReplayWindow::new();
            let mut seen = BTreeSet::new();
            let mut top: Option<u64> = None;
            let mut base = 0u64;
            for (kind, x) in steps {
                // Mostly near the top, sometimes far ahead, sometimes far behind.
                let pn = match kind {
                    0 => base + x % 512,
                    1 => base.saturating_sub(x % (2 * WINDOW)),
                    _ => { base += x; base }
                };
                let fresh = !seen.contains(&pn)
                    && top.is_none_or(|t| pn > t || t - pn < WINDOW);
                prop_assert_eq!(w.accept(pn), fresh, "pn {} top {:?}", pn, top);
                if fresh {
                    seen.insert(pn);
                    top = Some(top.map_or(pn, |t| t.max(pn)));
                }
            }
        }
    }
}
