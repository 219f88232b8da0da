//! Per-client limits, pure and driven by an injected clock: token buckets by client
//! ([`Limiter`]: lookups a minute, forwarded bytes a second) and counts of what a client holds
//! at once ([`Holdings`]: connections, registered codes).
//!
//! A client is an address as [`client_key`] names it: an IPv4 address, or an IPv6 address's
//! /64 (one host or one site gets a whole /64, so limiting a single IPv6 address would limit
//! nothing). An IPv4-mapped IPv6 address is its IPv4 address.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::time::{Duration, Instant};

/// Most client addresses tracked at once; when full, buckets that have refilled are forgotten,
/// and if none has, new clients are refused until some do.
pub const MAX_CLIENTS: usize = 65_536;

/// The client an address belongs to, for every per-address limit: the IPv4 address itself, or
/// the IPv6 address's /64 (its last 64 bits zero).
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(bits))
        }
        v4 => v4,
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Token buckets by client ([`client_key`]): `burst` tokens at once, refilled at `per_sec`.
#[derive(Debug)]
pub struct Limiter {
    burst: f64,
    per_sec: f64,
    max_clients: usize,
    buckets: HashMap<IpAddr, Bucket>,
}

impl Limiter {
    /// A limiter allowing `burst` tokens at once and `per_sec` on average.
    pub fn new(burst: u32, per_sec: f64) -> Limiter {
        Limiter::with_capacity(f64::from(burst), per_sec, MAX_CLIENTS)
    }

    /// Like [`Limiter::new`], with a burst of any size, tracking at most `max_clients`
    /// clients.
    pub fn with_capacity(burst: f64, per_sec: f64, max_clients: usize) -> Limiter {
        Limiter {
            burst: if burst.is_finite() {
                burst.max(1.0)
            } else {
                1.0
            },
            per_sec: if per_sec.is_finite() {
                per_sec.max(0.0)
            } else {
                0.0
            },
            max_clients: max_clients.max(1),
            buckets: HashMap::new(),
        }
    }

    /// Takes one token for `ip`'s client at `now`; false when over the limit.
    pub fn allow(&mut self, ip: IpAddr, now: Instant) -> bool {
        self.allow_n(ip, 1.0, now)
    }

    /// Takes `n` tokens for `ip`'s client at `now`; false (and none taken) when it has fewer.
    pub fn allow_n(&mut self, ip: IpAddr, n: f64, now: Instant) -> bool {
        let Some(b) = self.bucket(ip, now) else {
            return false;
        };
        let ok = b.tokens >= n;
        if ok {
            b.tokens -= n;
        }
        ok
    }

    /// Takes `n` tokens for `ip`'s client at `now`, going into debt if it has fewer: how long
    /// to wait before going on, so that the client keeps to the rate on average (a copy that
    /// cannot drop, like a TCP splice, is paced rather than refused). `None` when the table of
    /// clients is full.
    pub fn take(&mut self, ip: IpAddr, n: f64, now: Instant) -> Option<Duration> {
        let per_sec = self.per_sec;
        let b = self.bucket(ip, now)?;
        b.tokens -= n;
        Some(if b.tokens >= 0.0 || per_sec <= 0.0 {
            Duration::ZERO
        } else {
            Duration::try_from_secs_f64(-b.tokens / per_sec).unwrap_or(Duration::MAX)
        })
    }

    /// The bucket of `ip`'s client, refilled to `now` (a full one when it has none); `None`
    /// when the table is full of buckets still in use. One hash lookup when the client is
    /// known (the forwarder asks once per datagram).
    fn bucket(&mut self, ip: IpAddr, now: Instant) -> Option<&mut Bucket> {
        let key = client_key(ip);
        let (burst, per_sec) = (self.burst, self.per_sec);
        if self.buckets.len() >= self.max_clients && !self.buckets.contains_key(&key) {
            self.buckets.retain(|_, b| {
                let secs = now.saturating_duration_since(b.at).as_secs_f64();
                b.tokens + secs * per_sec < burst
            });
            if self.buckets.len() >= self.max_clients {
                return None;
            }
        }
        let b = self.buckets.entry(key).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let secs = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + secs * per_sec).min(burst);
        b.at = now;
        Some(b)
    }

    /// Addresses tracked.
    pub fn clients(&self) -> usize {
        self.buckets.len()
    }
}

/// What each client holds at once (connections, codes), each client at most `per_client`; the
/// table holds only clients that hold something, so it is bounded by what is held.
#[derive(Debug)]
pub struct Holdings {
    per_client: usize,
    held: HashMap<IpAddr, usize>,
}

impl Holdings {
    /// Each client may hold at most `per_client` (at least 1).
    pub fn new(per_client: usize) -> Holdings {
        Holdings {
            per_client: per_client.max(1),
            held: HashMap::new(),
        }
    }

    /// One more for `ip`'s client; false (and nothing taken) when it holds its share.
    pub fn take(&mut self, ip: IpAddr) -> bool {
        let n = self.held.entry(client_key(ip)).or_insert(0);
        if *n >= self.per_client {
            return false;
        }
        *n += 1;
        true
    }

    /// One fewer for `ip`'s client (given back when what it held ends).
    pub fn give_back(&mut self, ip: IpAddr) {
        let key = client_key(ip);
        if let Some(n) = self.held.get_mut(&key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.held.remove(&key);
            }
        }
    }

    /// What `ip`'s client holds now.
    pub fn held(&self, ip: IpAddr) -> usize {
        self.held.get(&client_key(ip)).copied().unwrap_or(0)
    }

    /// Clients holding something.
    pub fn clients(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn burst_then_steady_rate_per_ip() {
        let t0 = Instant::now();
        let mut l = Limiter::new(10, 1.0);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        for _ in 0..10 {
            assert!(l.allow(a, t0));
        }
        assert!(!l.allow(a, t0));
        assert!(l.allow(b, t0), "another client has its own bucket");
        assert!(!l.allow(a, t0 + Duration::from_millis(900)));
        assert!(l.allow(a, t0 + Duration::from_millis(1100)));
        assert!(!l.allow(a, t0 + Duration::from_millis(1200)));
        // Refills up to the burst, no further.
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..10 {
            assert!(l.allow(a, later));
        }
        assert!(!l.allow(a, later));
    }

    #[test]
    fn ipv4_mapped_ipv6_shares_the_bucket() {
        let t0 = Instant::now();
        let mut l = Limiter::new(1, 0.0);
        assert!(l.allow("10.0.0.1".parse().unwrap(), t0));
        assert!(!l.allow("::ffff:10.0.0.1".parse().unwrap(), t0));
    }

    #[test]
    fn table_is_bounded() {
        let t0 = Instant::now();
        let mut l = Limiter::with_capacity(2.0, 1.0, 100);
        for i in 0..100u32 {
            assert!(l.allow(IpAddr::from(i.to_be_bytes()), t0));
        }
        // Full and nobody has refilled: a new client is refused, a known one still served.
        assert!(!l.allow("192.168.0.1".parse().unwrap(), t0));
        assert!(l.allow(IpAddr::from(5u32.to_be_bytes()), t0));
        assert_eq!(l.clients(), 100);
        // Once buckets have refilled they are forgotten to make room.
        assert!(l.allow("192.168.0.1".parse().unwrap(), t0 + Duration::from_secs(5)));
        assert!(l.clients() <= 100);
    }

    #[test]
    fn ipv6_clients_are_their_64_and_ipv4_their_address() {
        let k = |s: &str| client_key(s.parse().unwrap());
        assert_eq!(k("2001:db8:1:2:aaaa::1"), k("2001:db8:1:2:ffff:1:2:3"));
        assert_ne!(k("2001:db8:1:2::1"), k("2001:db8:1:3::1"));
        assert_eq!(k("::ffff:10.0.0.1"), k("10.0.0.1"));
        assert_ne!(k("10.0.0.1"), k("10.0.0.2"));
        let t0 = Instant::now();
        let mut l = Limiter::new(1, 0.0);
        assert!(l.allow("2001:db8::1".parse().unwrap(), t0));
        assert!(
            !l.allow("2001:db8::2".parse().unwrap(), t0),
            "the same /64 shares a bucket"
        );
        assert!(l.allow("2001:db8:0:1::1".parse().unwrap(), t0));
    }

    #[test]
    fn bytes_are_allowed_up_to_the_burst_then_at_the_rate() {
        let t0 = Instant::now();
        // 1000 bytes a second, 500 at once.
        let mut l = Limiter::with_capacity(500.0, 1000.0, 10);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        assert!(l.allow_n(a, 400.0, t0));
        assert!(!l.allow_n(a, 200.0, t0), "100 left");
        assert!(l.allow_n(a, 100.0, t0));
        assert!(l.allow_n(a, 100.0, t0 + Duration::from_millis(100)));
        assert!(!l.allow_n(a, 10.0, t0 + Duration::from_millis(100)));
        // Over a long run the client gets the rate, whatever it asks.
        let mut got = 0.0;
        for ms in 0..10_000u64 {
            if l.allow_n(a, 100.0, t0 + Duration::from_millis(200 + ms)) {
                got += 100.0;
            }
        }
        assert!((9_500.0..=10_600.0).contains(&got), "{got} bytes in 10 s");
    }

    #[test]
    fn take_paces_a_copy_by_going_into_debt() {
        let t0 = Instant::now();
        let mut l = Limiter::with_capacity(1000.0, 1000.0, 10);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(l.take(a, 1000.0, t0), Some(Duration::ZERO));
        assert_eq!(l.take(a, 500.0, t0), Some(Duration::from_millis(500)));
        assert_eq!(
            l.take(a, 500.0, t0 + Duration::from_millis(500)),
            Some(Duration::from_millis(500)),
            "the debt is paid at the rate"
        );
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        assert_eq!(l.take(b, 10.0, t0), Some(Duration::ZERO), "its own bucket");
    }

    #[test]
    fn holdings_are_per_client_and_given_back() {
        let mut h = Holdings::new(2);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        assert!(h.take(a) && h.take(a));
        assert!(!h.take(a), "its share");
        assert!(h.take(b), "another client is not held back");
        h.give_back(a);
        assert_eq!(h.held(a), 1);
        assert!(h.take(a));
        for _ in 0..3 {
            h.give_back(a);
        }
        h.give_back(b);
        assert_eq!(
            (h.held(a), h.clients()),
            (0, 0),
            "nothing held, nothing tracked"
        );
        let v6 = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(h.take(v6("2001:db8::1")) && h.take(v6("2001:db8::2")));
        assert!(!h.take(v6("2001:db8::3")), "one /64 is one client");
    }
}
