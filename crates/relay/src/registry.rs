//! Registered codes, by nameplate: allocation (at most so many at once, and so many for one
//! client address), lookup, expiry. Pure bookkeeping with the clock passed in; the server holds
//! it behind a lock.
//!
//! The registry knows nameplates only. It cannot tell the real sender's lookup from a stranger's
//! (the peers' key agreement does that), so a lookup never uses a code up, and no number of
//! lookups, from however many addresses, cancels one: a try at a code is a guess that reaches
//! its receiver's key agreement, and the receiver counts those. What ends a code is its
//! receiver leaving, or its expiry (or, for a receiver that answered a sender's offer, that
//! sender saying it holds another code). The entries are opaque here: a sender's offer is held
//! as a receiver's registration is (the server tells them apart).

use crate::limit::Holdings;
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// What a lookup found.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<A> {
    /// The nameplate is registered: the agent of its receiver. The code stays registered.
    Found(A),
    /// No registered code has this nameplate (expired, withdrawn or mistyped).
    Unknown,
}

/// Why a code was not allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Full {
    /// The relay holds as many codes as it may.
    #[error("the relay holds too many codes, try again later")]
    Relay,
    /// The client address holds as many codes as one address may.
    #[error(
        "the relay limits registrations from one address ({0} codes at once), try again later"
    )]
    Address(usize),
}

/// A code removed by [`Registry::expire`].
#[derive(Debug, PartialEq, Eq)]
pub struct Expired<A> {
    /// Its nameplate.
    pub nameplate: u32,
    /// Its receiver's agent.
    pub agent: A,
    /// Lookups it answered (tickets may be out).
    pub lookups: u32,
}

#[derive(Debug)]
struct Entry<A> {
    expires: Instant,
    lookups: u32,
    owner: IpAddr,
    agent: A,
}

/// Codes by nameplate, at most `cap` of them and `per_address` for one client address.
#[derive(Debug)]
pub struct Registry<A> {
    codes: HashMap<u32, Entry<A>>,
    owners: Holdings,
    cap: usize,
    per_address: usize,
    ttl: Duration,
}

/// Nameplates are drawn from this range (four digits, easy to read aloud).
pub const NAMEPLATES: std::ops::Range<u32> = 1000..10_000;

impl<A: Clone> Registry<A> {
    /// An empty registry for at most `cap` codes that live `ttl` each, and no per-address
    /// bound beyond `cap`.
    pub fn new(cap: usize, ttl: Duration) -> Registry<A> {
        Registry::with_per_address(cap, cap, ttl)
    }

    /// An empty registry for at most `cap` codes that live `ttl` each, at most `per_address`
    /// of them registered from one client address ([`crate::limit::client_key`]).
    pub fn with_per_address(cap: usize, per_address: usize, ttl: Duration) -> Registry<A> {
        let cap = cap.min(NAMEPLATES.len());
        Registry {
            codes: HashMap::new(),
            owners: Holdings::new(per_address),
            cap,
            per_address: per_address.max(1),
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

    /// Registers a free nameplate for `agent`, a receiver at `owner`, valid for lookups until
    /// `now + ttl`.
    pub fn allocate(&mut self, now: Instant, owner: IpAddr, agent: A) -> Result<u32, Full> {
        if self.codes.len() >= self.cap {
            return Err(Full::Relay);
        }
        if !self.owners.take(owner) {
            return Err(Full::Address(self.per_address));
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
                owner,
                agent,
            },
        );
        Ok(n)
    }

    /// Looks a nameplate up at `now`: found until the code expires or its receiver leaves,
    /// however often it is looked up.
    pub fn lookup(&mut self, now: Instant, nameplate: u32) -> Lookup<A> {
        match self.codes.get_mut(&nameplate) {
            Some(e) if e.expires > now => {
                e.lookups = e.lookups.saturating_add(1);
                Lookup::Found(e.agent.clone())
            }
            _ => Lookup::Unknown,
        }
    }

    /// Removes the code of `nameplate` (its receiver left).
    pub fn remove(&mut self, nameplate: u32) -> Option<A> {
        let e = self.codes.remove(&nameplate)?;
        self.owners.give_back(e.owner);
        Some(e.agent)
    }

    /// Removes the code of `nameplate` if its agent passes `owned` (a nameplate may have
    /// expired, and been handed to another receiver meanwhile).
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
                let e = self.codes.remove(&n)?;
                self.owners.give_back(e.owner);
                Some(Expired {
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

    const HOME: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));

    fn reg() -> (Registry<&'static str>, Instant) {
        (Registry::new(100, Duration::from_secs(600)), Instant::now())
    }

    #[test]
    fn lookups_never_use_the_code_up_however_many() {
        let (mut r, t0) = reg();
        let n = r.allocate(t0, HOME, "agent").unwrap();
        assert!(NAMEPLATES.contains(&n));
        // Strangers sweeping the nameplate, many times, then the real sender.
        for _ in 0..1000 {
            assert_eq!(r.lookup(t0, n), Lookup::Found("agent"));
        }
        assert_eq!(r.len(), 1, "still registered");
        assert_eq!(r.lookup(t0, n), Lookup::Found("agent"));
        assert_eq!(r.lookup(t0, n + 1), Lookup::Unknown);
    }

    #[test]
    fn withdrawn_codes_are_unknown_and_remove_if_checks_the_owner() {
        let (mut r, t0) = reg();
        let n = r.allocate(t0, HOME, "a").unwrap();
        assert_eq!(r.remove_if(n, |a| *a == "b"), None);
        assert_eq!(r.lookup(t0, n), Lookup::Found("a"));
        assert_eq!(r.remove_if(n, |a| *a == "a"), Some("a"));
        assert_eq!(r.lookup(t0, n), Lookup::Unknown);
    }

    #[test]
    fn codes_expire_with_an_injected_clock() {
        let (mut r, t0) = reg();
        let a = r.allocate(t0, HOME, "a").unwrap();
        let b = r
            .allocate(t0 + Duration::from_secs(300), HOME, "b")
            .unwrap();
        let c = r.allocate(t0 + Duration::from_secs(1), HOME, "c").unwrap();
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
            assert!(seen.insert(r.allocate(t0, HOME, i).unwrap()));
        }
        assert_eq!(r.allocate(t0, HOME, 99), Err(Full::Relay));
        assert!(r.remove(*seen.iter().next().unwrap()).is_some());
        assert!(r.allocate(t0, HOME, 99).is_ok());
    }

    #[test]
    fn one_address_holds_its_share_and_others_still_register() {
        let t0 = Instant::now();
        let mut r = Registry::with_per_address(100, 3, Duration::from_secs(10));
        let greedy: IpAddr = "198.51.100.7".parse().unwrap();
        let mut held: Vec<u32> = (0..3).map(|i| r.allocate(t0, greedy, i).unwrap()).collect();
        assert_eq!(r.allocate(t0, greedy, 9), Err(Full::Address(3)));
        assert!(
            Full::Address(3)
                .to_string()
                .contains("limits registrations from one address"),
            "the refusal says why"
        );
        // Another address, and another /64 of IPv6, are not held back; the same /64 is.
        assert!(r.allocate(t0, "198.51.100.8".parse().unwrap(), 10).is_ok());
        for ip in ["2001:db8::1", "2001:db8::2", "2001:db8::3"] {
            assert!(r.allocate(t0, ip.parse().unwrap(), 11).is_ok());
        }
        assert_eq!(
            r.allocate(t0, "2001:db8::ffff".parse().unwrap(), 12),
            Err(Full::Address(3))
        );
        // A code withdrawn or expired gives its place back.
        r.remove(held.pop().unwrap());
        assert!(r.allocate(t0, greedy, 13).is_ok());
        assert_eq!(r.expire(t0 + Duration::from_secs(10)).len(), 7);
        assert!(r.is_empty());
        assert!((0..3).all(|i| r.allocate(t0, greedy, 20 + i).is_ok()));
    }
}
