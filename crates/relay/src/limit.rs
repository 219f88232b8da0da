//! Per-client rate limiting of lookups: a token bucket per IP address, with a bounded table.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Instant;

/// Most client addresses tracked at once; when full, buckets that have refilled are forgotten,
/// and if none has, new clients are refused until some do.
pub const MAX_CLIENTS: usize = 65_536;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Token buckets by client IP: `burst` lookups at once, refilled at `per_sec`.
#[derive(Debug)]
pub struct Limiter {
    burst: f64,
    per_sec: f64,
    max_clients: usize,
    buckets: HashMap<IpAddr, Bucket>,
}

impl Limiter {
    /// A limiter allowing `burst` lookups at once and `per_sec` on average.
    pub fn new(burst: u32, per_sec: f64) -> Limiter {
        Limiter::with_capacity(burst, per_sec, MAX_CLIENTS)
    }

    /// Like [`Limiter::new`], tracking at most `max_clients` addresses.
    pub fn with_capacity(burst: u32, per_sec: f64, max_clients: usize) -> Limiter {
        Limiter {
            burst: f64::from(burst.max(1)),
            per_sec: if per_sec.is_finite() {
                per_sec.max(0.0)
            } else {
                0.0
            },
            max_clients: max_clients.max(1),
            buckets: HashMap::new(),
        }
    }

    fn refill(&self, b: &mut Bucket, now: Instant) {
        let secs = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + secs * self.per_sec).min(self.burst);
        b.at = now;
    }

    /// Takes one token for `ip` at `now`; false when over the limit.
    pub fn allow(&mut self, ip: IpAddr, now: Instant) -> bool {
        let ip = ip.to_canonical();
        if !self.buckets.contains_key(&ip) && self.buckets.len() >= self.max_clients {
            let (burst, per_sec) = (self.burst, self.per_sec);
            self.buckets.retain(|_, b| {
                let secs = now.saturating_duration_since(b.at).as_secs_f64();
                b.tokens + secs * per_sec < burst
            });
            if self.buckets.len() >= self.max_clients {
                return false;
            }
        }
        let mut b = self.buckets.get(&ip).copied().unwrap_or(Bucket {
            tokens: self.burst,
            at: now,
        });
        self.refill(&mut b, now);
        let ok = b.tokens >= 1.0;
        if ok {
            b.tokens -= 1.0;
        }
        self.buckets.insert(ip, b);
        ok
    }

    /// Addresses tracked.
    pub fn clients(&self) -> usize {
        self.buckets.len()
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
        let mut l = Limiter::with_capacity(2, 1.0, 100);
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
}
