//! Registered codes, by nameplate: allocation, lookup (single use, three wrong tries), expiry.
//! Pure bookkeeping with the clock passed in; the server holds it behind a lock.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Wrong verifiers a nameplate survives; the last of them cancels it.
pub const MAX_WRONG: u8 = 3;

/// What a lookup found.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<A> {
    /// The code matched; it is removed (single use). The agent of the receiver.
    Found(A),
    /// No registered code has this nameplate (expired, used, mistyped, or not yet claimed).
    Unknown,
    /// The verifier is wrong; `Some(agent)` when that was the last try and the code is cancelled.
    Wrong(Option<A>),
}

#[derive(Debug)]
struct Entry<A> {
    verifier: Option<String>,
    expires: Instant,
    wrong: u8,
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

    /// Codes held (claimed or not).
    pub fn len(&self) -> usize {
        self.codes.len()
    }

    /// True when no code is held.
    pub fn is_empty(&self) -> bool {
        self.codes.is_empty()
    }

    /// Reserves a free nameplate for `agent`; `None` when full.
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
                verifier: None,
                expires: now + self.ttl,
                wrong: 0,
                agent,
            },
        );
        Some(n)
    }

    /// Sets the verifier of a reserved nameplate; false if it is unknown or already claimed.
    pub fn claim(&mut self, nameplate: u32, verifier: String) -> bool {
        match self.codes.get_mut(&nameplate) {
            Some(e) if e.verifier.is_none() => {
                e.verifier = Some(verifier);
                true
            }
            _ => false,
        }
    }

    /// Looks a code up at `now`.
    pub fn lookup(&mut self, now: Instant, nameplate: u32, verifier: &str) -> Lookup<A> {
        let Some(e) = self.codes.get_mut(&nameplate) else {
            return Lookup::Unknown;
        };
        if e.expires <= now {
            return Lookup::Unknown;
        }
        match &e.verifier {
            None => Lookup::Unknown,
            Some(v) if constant_time_eq(v.as_bytes(), verifier.as_bytes()) => {
                let e = self.codes.remove(&nameplate).map(|e| e.agent);
                e.map_or(Lookup::Unknown, Lookup::Found)
            }
            Some(_) => {
                e.wrong += 1;
                if e.wrong >= MAX_WRONG {
                    Lookup::Wrong(self.codes.remove(&nameplate).map(|e| e.agent))
                } else {
                    Lookup::Wrong(None)
                }
            }
        }
    }

    /// Removes the code of `nameplate` (its receiver left).
    pub fn remove(&mut self, nameplate: u32) -> Option<A> {
        self.codes.remove(&nameplate).map(|e| e.agent)
    }

    /// Removes the code of `nameplate` if its agent passes `owned` (a nameplate may have been
    /// used, freed and handed to another receiver meanwhile).
    pub fn remove_if(&mut self, nameplate: u32, owned: impl Fn(&A) -> bool) -> Option<A> {
        match self.codes.get(&nameplate) {
            Some(e) if owned(&e.agent) => self.remove(nameplate),
            _ => None,
        }
    }

    /// Removes and returns the codes expired at `now`.
    pub fn expire(&mut self, now: Instant) -> Vec<(u32, A)> {
        let gone: Vec<u32> = self
            .codes
            .iter()
            .filter(|(_, e)| e.expires <= now)
            .map(|(&n, _)| n)
            .collect();
        gone.into_iter()
            .filter_map(|n| self.codes.remove(&n).map(|e| (n, e.agent)))
            .collect()
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg() -> (Registry<&'static str>, Instant) {
        (Registry::new(100, Duration::from_secs(600)), Instant::now())
    }

    #[test]
    fn single_use() {
        let (mut r, t0) = reg();
        let n = r.allocate(t0, "agent").unwrap();
        assert!(NAMEPLATES.contains(&n));
        assert_eq!(r.lookup(t0, n, "v"), Lookup::Unknown, "not claimed yet");
        assert!(r.claim(n, "v".into()));
        assert!(!r.claim(n, "w".into()), "claimed once only");
        assert_eq!(r.lookup(t0, n, "v"), Lookup::Found("agent"));
        assert_eq!(r.lookup(t0, n, "v"), Lookup::Unknown);
        assert!(r.is_empty());
    }

    #[test]
    fn three_wrong_tries_cancel() {
        let (mut r, t0) = reg();
        let n = r.allocate(t0, "agent").unwrap();
        r.claim(n, "right".into());
        assert_eq!(r.lookup(t0, n, "wrong"), Lookup::Wrong(None));
        assert_eq!(r.lookup(t0, n, "wrong"), Lookup::Wrong(None));
        assert_eq!(r.lookup(t0, n, "wrong"), Lookup::Wrong(Some("agent")));
        assert_eq!(r.lookup(t0, n, "right"), Lookup::Unknown);
    }

    #[test]
    fn right_code_after_a_wrong_try_still_works() {
        let (mut r, t0) = reg();
        let n = r.allocate(t0, "seven").unwrap();
        r.claim(n, "right".into());
        assert_eq!(r.lookup(t0, n, "wrong"), Lookup::Wrong(None));
        assert_eq!(r.lookup(t0, n, "right"), Lookup::Found("seven"));
    }

    #[test]
    fn codes_expire_with_an_injected_clock() {
        let (mut r, t0) = reg();
        let a = r.allocate(t0, "a").unwrap();
        r.claim(a, "va".into());
        let b = r.allocate(t0 + Duration::from_secs(300), "b").unwrap();
        r.claim(b, "vb".into());
        let t1 = t0 + Duration::from_secs(600);
        assert_eq!(
            r.lookup(t1, a, "va"),
            Lookup::Unknown,
            "expired at its deadline"
        );
        assert_eq!(r.expire(t1), vec![(a, "a")]);
        assert_eq!(r.len(), 1);
        assert_eq!(r.lookup(t1, b, "vb"), Lookup::Found("b"));
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
