//! The path's round trip as the controller uses it ([`PathRtt`]), not the round trip of the
//! two sides' CPUs.
//!
//! The sender first times the key agreement: from its offer to the receiver's answer. That is
//! the path's round trip plus both sides' key-agreement work and, on a busy host, their waits
//! for a core: 0.1 ms on an idle loopback, 20 to 55 ms on the same loopback with other work on
//! both cores. Every later timing of a message and its answer is likewise the path plus some
//! time the sides spent, so each is an upper bound of the path's round trip, and the lowest
//! of them is the closest: the controller takes the minimum (a filter that only falls; a
//! path that gets longer shows as a queue, as it does to every controller that takes its
//! round trip once).
//!
//! A sample can be garbled or lie: a receiver that knows what a probe will be can answer it
//! before it arrives. So a sample never takes the estimate below the **floor**, the lowest
//! round trip the sender's own kernel measured on the control connection (TCP's `min_rtt`,
//! from the connection's handshake on, with no application in the loop). The floor is a
//! lower bound of the path only: a relay, or a middlebox that answers TCP for the receiver
//! (a performance-enhancing proxy on a satellite link), ends the kernel's round trip short of
//! the receiver, so the floor alone is never taken for the path. Without a floor (a platform
//! whose kernel does not say), no sample is taken: the handshake's timing stands.

use std::time::Duration;

/// The least a sample must lower the estimate by to count as a change: a twentieth of it
/// (timings of the same path differ by that much without meaning anything).
pub const LOWER_BY: f64 = 0.05;

/// The controller's round trip: the key agreement's timing, lowered by later samples of the
/// path, never below the kernel's floor. Pure: samples come in as arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathRtt {
    /// The key agreement's timing: an upper bound.
    handshake: Duration,
    /// The kernel's lowest round trip on the control connection: a lower bound, if known.
    floor: Option<Duration>,
    /// The estimate now: the lowest of the handshake and the samples, at or above the floor.
    best: Duration,
}

impl PathRtt {
    /// The round trip measured by the key agreement (`handshake`), with the kernel's lowest
    /// round trip on the same connection (`floor`) if known. A floor above the handshake's
    /// timing (the kernel's first samples can include a delayed acknowledgement) bounds
    /// nothing: it is taken as the handshake's.
    pub fn new(handshake: Duration, floor: Option<Duration>) -> PathRtt {
        PathRtt {
            handshake,
            floor: floor.map(|f| f.min(handshake)),
            best: handshake,
        }
    }

    /// The estimate now.
    pub fn get(&self) -> Duration {
        self.best
    }

    /// The key agreement's timing.
    pub fn handshake(&self) -> Duration {
        self.handshake
    }

    /// The kernel's floor, if known.
    pub fn floor(&self) -> Option<Duration> {
        self.floor
    }

    /// The range the path's round trip lies in, as far as the sender can tell: from the floor
    /// (or the estimate, without one) to the estimate. A memory of the path
    /// ([`super::PathMemory::fits_range`]) is judged against it.
    pub fn range(&self) -> (Duration, Duration) {
        (self.floor.unwrap_or(self.best), self.best)
    }

    /// Takes `sample`, a round trip timed on the path since the handshake (a probe and its
    /// answer). Returns the new estimate if it fell by more than [`LOWER_BY`] of the old one;
    /// `None` if it did not (a sample above the estimate, or no floor to bound it by). A
    /// sample below the floor is taken as the floor.
    pub fn sample(&mut self, sample: Duration) -> Option<Duration> {
        let floor = self.floor?;
        let s = sample.max(floor);
        if s.as_secs_f64() < self.best.as_secs_f64() * (1.0 - LOWER_BY) {
            self.best = s;
            Some(s)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: f64) -> Duration {
        Duration::from_secs_f64(v / 1e3)
    }

    #[test]
    fn a_handshake_inflated_by_cpu_gives_way_to_the_path_once_a_sample_comes() {
        // Loopback with both cores busy: the key agreement took 27 ms, the kernel's round
        // trip is 30 us, a probe's answer 0.4 ms.
        let mut r = PathRtt::new(ms(27.0), Some(ms(0.03)));
        assert_eq!(r.get(), ms(27.0));
        assert_eq!(r.sample(ms(0.4)), Some(ms(0.4)));
        assert_eq!(r.get(), ms(0.4));
        // A later, slower answer does not raise it; a faster one lowers it further.
        assert_eq!(r.sample(ms(3.0)), None);
        assert_eq!(r.get(), ms(0.4));
        assert_eq!(r.sample(ms(0.2)), Some(ms(0.2)));
        assert_eq!(r.handshake(), ms(27.0));
        assert_eq!(r.range(), (ms(0.03), ms(0.2)));
    }

    #[test]
    fn a_hostile_or_garbled_sample_cannot_go_below_the_kernels_floor() {
        // A receiver answering a probe before it could have arrived, or a zero.
        let mut r = PathRtt::new(ms(180.0), Some(ms(150.0)));
        assert_eq!(r.sample(Duration::ZERO), Some(ms(150.0)));
        assert_eq!(r.get(), ms(150.0));
        assert_eq!(r.sample(ms(1.0)), None, "already at the floor");
        assert_eq!(r.get(), ms(150.0));
        // Nor can one that is barely below the estimate move it (timing noise).
        let mut r = PathRtt::new(ms(180.0), Some(ms(0.05)));
        assert_eq!(r.sample(ms(175.0)), None);
        assert_eq!(r.get(), ms(180.0));
    }

    #[test]
    fn without_a_floor_no_sample_is_taken() {
        let mut r = PathRtt::new(ms(40.0), None);
        assert_eq!(r.sample(ms(1.0)), None);
        assert_eq!(r.get(), ms(40.0));
        assert_eq!(r.range(), (ms(40.0), ms(40.0)));
    }

    #[test]
    fn the_floor_alone_never_replaces_the_handshake() {
        // A proxy that answers TCP near the sender: the kernel's round trip is 2 ms, the
        // path's (and every sample's) 600 ms. The estimate stays the path's.
        let mut r = PathRtt::new(ms(640.0), Some(ms(2.0)));
        assert_eq!(r.get(), ms(640.0));
        assert_eq!(r.sample(ms(612.0)), None, "within a twentieth");
        assert_eq!(r.sample(ms(601.0)), Some(ms(601.0)));
        assert_eq!(r.get(), ms(601.0));
    }

    #[test]
    fn a_floor_above_the_handshake_bounds_nothing() {
        let mut r = PathRtt::new(ms(5.0), Some(ms(40.0)));
        assert_eq!(r.floor(), Some(ms(5.0)));
        assert_eq!(r.sample(ms(1.0)), None);
        assert_eq!(r.get(), ms(5.0));
    }
}
