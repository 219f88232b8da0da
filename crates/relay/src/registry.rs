//! Registered codes, by nameplate: allocation, lookup (at most [`MAX_LOOKUPS`] per nameplate),
//! expiry. Pure bookkeeping with the clock passed in; the server holds it behind a lock.
//!
//! The registry knows nameplates only. It cannot tell the real sender's lookup from a stranger's
//! (the peers' key agreement does that), so a lookup never uses a code up: a stranger who
//! guesses a nameplate first does not take it from the real sender. What ends a code is its
//! receiver leaving, its expiry, or one lookup too many.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Lookups a nameplate answers; the next one cancels it.
pub const MAX_LOOKUPS: u8 = 3;

/// What a lookup found.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<A> {
    /// The nameplate is registered: the agent of its receiver. The code stays registered.
    Found(A),
    /// No registered code has this nameplate (expired, withdrawn, cancelled or mistyped).
    Unknown,
    /// The nameplate was looked up more than [`MAX_LOOKUPS`] times: the code is removed
    /// (cancelled), and this is the agent to tell.
    Exhausted(A),
}

/// A code removed by [`Registry::expire`].
#[derive(Debug, PartialEq, Eq)]
pub struct Expired<A> {
    /// Its nameplate.
    pub nameplate: u32,
    /// Its receiver's agent.
    pub agent: A,
    /// Lookups it answered (tickets may be out).
    pub lookups: u8,
}

#[derive(Debug)]
struct Entry<A> {
    expires: Instant,
    lookups: u8,
    agent: A,
}

/// Codes by nameplate, at most `cap` of them.
#[derive(Debug)]
pub struct Registry<A> {
    codes: HashMap<u32, Entry<A>>,
    cap: usize,
    ttl: Duration,
}

/// Nameplates are drawn from this range (four digits, easy to read aloud).
pub const NAMEPLATES: std::ops::Range<u32> = 1000..10_000;

impl<A: Clone> Registry<A> {
    /// An empty registry for at most `cap` codes that live `ttl` each.
    pub fn new(cap: usize, ttl: Duration) -> Registry<A> {
        Registry {
            codes: HashMap::new(),
            cap: cap.min(NAMEPLATES.len()),
            ttl,
        }
    }

    /// Codes held.
    pub fn len(&self) -> usize {
        self.codes.len()
    }

    /// True when no code is held.
    pub fn is_empty(&self) -> bool {
        self.codes.is_empty()
    }

    /// Registers a free nameplate for `agent`, valid for lookups until `now + ttl`; `None` when
    /// full.
    pub fn allocate(&mut self, now: Instant, agent: A) -> Option<u32> {
        if self.codes.len() >= self.cap {
            return None;
        }
        let span = NAMEPLATES.end - NAMEPLATES.start;
        let mut n = NAMEPLATES.start + rand::random::<u32>() % span;
        while self.codes.contains_key(&n) {
            n = NAMEPLATES.start + (n - NAMEPLATES.start + 1) % span;
        }
        self.codes.insert(
            n,
            Entry {
                expires: now + self.ttl,
                lookups: 0,
                agent,
            },
        );
        Some(n)
    }

    /// Looks a nameplate up at `now`. The first [`MAX_LOOKUPS`] lookups find it; the next one
    /// removes it.
    pub fn lookup(&mut self, now: Instant, nameplate: u32) -> Lookup<A> {
        let Some(e) = self.codes.get_mut(&nameplate) else {
            return Lookup::Unknown;
        };
        if e.expires <= now {
            return Lookup::Unknown;
        }
        if e.lookups >= MAX_LOOKUPS {
            return self
                .codes
                .remove(&nameplate)
                .map_or(Lookup::Unknown, |e| Lookup::Exhausted(e.agent));
        }
        e.lookups += 1;
        Lookup::Found(e.agent.clone())
    }

    /// Removes the code of `nameplate` (its receiver left).
    pub fn remove(&mut self, nameplate: u32) -> Option<A> {
        self.codes.remove(&nameplate).map(|e| e.agent)
    }

    /// Removes the code of `nameplate` if its agent passes `owned` (a nameplate may have been
    /// cancelled or expired, and handed to another receiver meanwhile).
    pub fn remove_if(&mut self, nameplate: u32, owned: impl Fn(&A) -> bool) -> Option<A> {
        match self.codes.get(&nameplate) {
            Some(e) if owned(&e.agent) => self.remove(nameplate),
            _ => None,
        }
    }

    /// Removes and returns the codes expired at `now`.
    pub fn expire(&mut self, now: Instant) -> Vec<Expired<A>> {
        let gone: Vec<u32> = self
            .codes
            .iter()
            .filter(|(_, e)| e.expires <= now)
            .map(|(&n, _)| n)
            .collect();
        gone.into_iter()
            .filter_map(|n| {
                self.codes.remove(&n).map(|e| Expired {
                    nameplate: n,
                    agent: e.agent,
                    lookups: e.lookups,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg() -> (Registry<&'static str>, Instant) {
        (Registry::new(100, Duration::from_secs(600)), Instant::now())
    }

    #[test]
    fn a_lookup_does_not_use_the_code_up() {
        let (mut r, t0) = reg();
        let n = r.allocate(t0, "agent").unwrap();
        assert!(NAMEPLATES.contains(&n));
        // A stranger who guessed the nameplate first, then the real sender.
        assert_eq!(r.lookup(t0, n), Lookup::Found("agent"));
        assert_eq!(r.lookup(t0, n), Lookup::Found("agent"));
        assert_eq!(r.len(), 1, "still registered");
        assert_eq!(r.lookup(t0, n + 1), Lookup::Unknown);
    }

    #[test]
    fn three_lookups_then_the_fourth_cancels() {
        let (mut r, t0) = reg();
        let n = r.allocate(t0, "agent").unwrap();
        for _ in 0..MAX_LOOKUPS {
            assert_eq!(r.lookup(t0, n), Lookup::Found("agent"));
        }
        assert_eq!(r.lookup(t0, n), Lookup::Exhausted("agent"));
        assert!(r.is_empty(), "cancelled");
        assert_eq!(r.lookup(t0, n), Lookup::Unknown);
        assert_eq!(r.remove(n), None);
    }

    #[test]
    fn withdrawn_codes_are_unknown_and_remove_if_checks_the_owner() {
        let (mut r, t0) = reg();
        let n = r.allocate(t0, "a").unwrap();
        assert_eq!(r.remove_if(n, |a| *a == "b"), None);
        assert_eq!(r.lookup(t0, n), Lookup::Found("a"));
        assert_eq!(r.remove_if(n, |a| *a == "a"), Some("a"));
        assert_eq!(r.lookup(t0, n), Lookup::Unknown);
    }

    #[test]
    fn codes_expire_with_an_injected_clock() {
        let (mut r, t0) = reg();
        let a = r.allocate(t0, "a").unwrap();
        let b = r.allocate(t0 + Duration::from_secs(300), "b").unwrap();
        let c = r.allocate(t0 + Duration::from_secs(1), "c").unwrap();
        assert_eq!(r.lookup(t0 + Duration::from_secs(2), c), Lookup::Found("c"));
        let t1 = t0 + Duration::from_secs(600);
        assert_eq!(r.lookup(t1, a), Lookup::Unknown, "expired at its deadline");
        let mut gone = r.expire(t1 + Duration::from_secs(1));
        gone.sort_by_key(|e| e.agent);
        assert_eq!(
            gone,
            vec![
                Expired {
                    nameplate: a,
                    agent: "a",
                    lookups: 0
                },
                Expired {
                    nameplate: c,
                    agent: "c",
                    lookups: 1
                },
            ]
        );
        assert_eq!(r.len(), 1);
        assert_eq!(r.lookup(t1, b), Lookup::Found("b"));
    }

    #[test]
    fn capacity_is_bounded_and_nameplates_distinct() {
        let t0 = Instant::now();
        let mut r = Registry::new(50, Duration::from_secs(1));
        let mut seen = std::collections::HashSet::new();
        for i in 0..50 {
            assert!(seen.insert(r.allocate(t0, i).unwrap()));
        }
        assert_eq!(r.allocate(t0, 99), None);
        assert!(r.remove(*seen.iter().next().unwrap()).is_some());
        assert!(r.allocate(t0, 99).is_some());
    }
}
