//! Rate control after PA-UDP: start at or below what the receiver can absorb, then follow the
//! path by the receiver's feedback.
//!
//! The receiver reports about once per RTT ([`Feedback`]): what arrived in the interval, how many
//! datagrams went missing (gaps in the per-channel packet numbers), kernel socket drops, how long
//! datagrams spent queued (one-way delay above the lowest seen, from the sender's timestamps) and
//! its write backlog. [`RateController`] turns that into a pacing rate:
//!
//! - **startup**: the rate doubles each round until the first sign of congestion;
//! - **congestion** is any of: loss clearly above the path's *loss floor* (the lowest loss rate of
//!   recent rounds, which is what random loss looks like), queueing delay above the mode's target,
//!   kernel socket drops at the receiver, or a receiver write backlog. On congestion the rate goes
//!   to just under what was actually delivered, then holds for one round so the queue drains;
//! - otherwise the rate probes upward: +6% per round in `auto`, +3% in `fair`.
//!
//! Random loss with no queueing and no socket drops raises the loss floor, not the alarm, so it
//! costs only the lost bytes; that is the point against TCP. `fair` uses a low delay target and
//! backs off harder, so a competing TCP flow, which fills the queue, keeps its share.
//! `fixed` paces at exactly the configured rate and ignores feedback.
//!
//! Every change is recorded with its reason ([`RateChange`]) for the progress line, the JSON
//! summary and the channel logs. The controller is pure: time comes in as arguments.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How the rate is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateMode {
    /// Pace at exactly the ceiling; ignore feedback.
    Fixed,
    /// As fast as the path and receiver take without self-inflicted loss.
    Auto,
    /// Like auto, but yield to competing traffic when queueing delay rises.
    Fair,
}

/// Configuration of a [`RateController`].
#[derive(Debug, Clone)]
pub struct RateConfig {
    /// Mode.
    pub mode: RateMode,
    /// Highest rate ever used, bits per second (the user's cap and the receiver's ceiling).
    pub ceiling_bps: u64,
    /// First rate, bits per second (clamped to the ceiling).
    pub start_bps: u64,
    /// Lowest rate, bits per second.
    pub min_bps: u64,
    /// Round-trip time measured at the handshake.
    pub rtt: Duration,
}

impl RateConfig {
    /// Queueing delay above which the mode sees congestion.
    pub fn delay_target(&self) -> Duration {
        match self.mode {
            RateMode::Fair => Duration::from_millis(5).max(self.rtt / 20),
            _ => Duration::from_millis(40).max(self.rtt / 2),
        }
    }
}

/// What the receiver saw during one report interval.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Feedback {
    /// Length of the interval.
    pub interval: Duration,
    /// Bytes of datagrams received (all, including repairs and duplicates).
    pub bytes: u64,
    /// Datagrams received.
    pub datagrams: u64,
    /// Datagrams missing by packet number.
    pub lost: u64,
    /// Datagrams the kernel dropped because the socket buffer was full.
    pub socket_drops: u64,
    /// Mean one-way delay above the lowest seen in the session.
    pub queue_delay: Duration,
    /// Bytes received but not yet written to storage.
    pub backlog_bytes: u64,
}

/// Why the rate changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// First rate.
    Start,
    /// Doubling during startup.
    Startup,
    /// Probing upward after a quiet round.
    Probe,
    /// Loss above the path's floor.
    Loss,
    /// Queueing delay above the target.
    Delay,
    /// The receiver's kernel dropped datagrams.
    SocketDrops,
    /// The receiver cannot write fast enough.
    Backlog,
}

impl Reason {
    /// Short lowercase name, for logs and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Start => "start",
            Reason::Startup => "startup",
            Reason::Probe => "probe",
            Reason::Loss => "loss",
            Reason::Delay => "delay",
            Reason::SocketDrops => "socket-drops",
            Reason::Backlog => "backlog",
        }
    }
}

/// A rate change, for the timeline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateChange {
    /// When.
    pub at: Instant,
    /// New rate, bits per second.
    pub rate_bps: u64,
    /// Why.
    pub reason: Reason,
}

/// Backlog above which the receiver counts as overwhelmed.
pub const BACKLOG_LIMIT: u64 = 64 << 20;
/// How many recent rounds the loss floor looks back over.
const FLOOR_ROUNDS: usize = 16;
/// Loss above the floor that counts as congestion.
const LOSS_MARGIN: f64 = 0.02;

/// The sender's rate controller. See the module docs.
#[derive(Debug, Clone)]
pub struct RateController {
    cfg: RateConfig,
    rate: f64,
    startup: bool,
    hold_until: Option<Instant>,
    recent_loss: VecDeque<f64>,
    timeline: Vec<RateChange>,
    changes: u64,
}

/// Most timeline entries kept (older ones are thinned out).
const TIMELINE_CAP: usize = 256;

impl RateController {
    /// A controller starting at `now`.
    pub fn new(cfg: RateConfig, now: Instant) -> Self {
        let ceiling = cfg.ceiling_bps.max(cfg.min_bps).max(1) as f64;
        let start = match cfg.mode {
            RateMode::Fixed => ceiling,
            _ => (cfg.start_bps as f64).clamp(cfg.min_bps.max(1) as f64, ceiling),
        };
        let mut c = RateController {
            cfg,
            rate: start,
            startup: true,
            hold_until: None,
            recent_loss: VecDeque::new(),
            timeline: Vec::new(),
            changes: 0,
        };
        c.record(now, Reason::Start);
        c
    }

    /// Current rate, bits per second.
    pub fn rate_bps(&self) -> u64 {
        self.rate as u64
    }

    /// The configuration.
    pub fn config(&self) -> &RateConfig {
        &self.cfg
    }

    /// True while still in startup.
    pub fn in_startup(&self) -> bool {
        self.startup
    }

    /// Rate changes so far (thinned to at most a few hundred entries).
    pub fn timeline(&self) -> &[RateChange] {
        &self.timeline
    }

    /// Number of rate changes made.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    fn record(&mut self, now: Instant, reason: Reason) {
        self.changes += 1;
        if self.timeline.len() >= TIMELINE_CAP {
            // Keep the first entry and every other later one: a coarser but complete picture.
            let mut i = 0;
            self.timeline.retain(|_| {
                i += 1;
                i == 1 || i % 2 == 0
            });
        }
        self.timeline.push(RateChange {
            at: now,
            rate_bps: self.rate as u64,
            reason,
        });
    }

    /// The loss rate of recent rounds that random loss alone explains.
    fn loss_floor(&self) -> f64 {
        self.recent_loss
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
    }

    /// Takes one report; returns the change made, if any.
    pub fn on_feedback(&mut self, now: Instant, fb: &Feedback) -> Option<RateChange> {
        if self.cfg.mode == RateMode::Fixed {
            return None;
        }
        let seen = fb.datagrams.saturating_add(fb.lost);
        if seen == 0 || fb.interval.is_zero() {
            return None;
        }
        let loss = fb.lost as f64 / seen as f64;
        self.recent_loss.push_back(loss);
        if self.recent_loss.len() > FLOOR_ROUNDS {
            self.recent_loss.pop_front();
        }
        let delivered = fb.bytes as f64 * 8.0 / fb.interval.as_secs_f64();
        let reason = if fb.socket_drops > 0 {
            Some(Reason::SocketDrops)
        } else if fb.backlog_bytes > BACKLOG_LIMIT {
            Some(Reason::Backlog)
        } else if fb.queue_delay > self.cfg.delay_target() {
            Some(Reason::Delay)
        } else if loss > self.loss_floor() + LOSS_MARGIN && self.recent_loss.len() > 1 || loss > 0.5
        {
            Some(Reason::Loss)
        } else {
            None
        };
        if self.hold_until.is_some_and(|t| now < t) {
            return None;
        }
        let ceiling = self.cfg.ceiling_bps.max(1) as f64;
        let floor = self.cfg.min_bps.max(1) as f64;
        let (new, why) = match reason {
            Some(r) => {
                self.startup = false;
                let base = if delivered.is_finite() && delivered > 0.0 {
                    self.rate.min(delivered)
                } else {
                    self.rate
                };
                let factor = if self.cfg.mode == RateMode::Fair {
                    0.8
                } else {
                    0.95
                };
                (base * factor, r)
            }
            None if self.startup => (self.rate * 2.0, Reason::Startup),
            None if self.cfg.mode == RateMode::Fair => (self.rate * 1.03, Reason::Probe),
            None => (self.rate * 1.06, Reason::Probe),
        };
        let new = if new.is_finite() {
            new.clamp(floor, ceiling.max(floor))
        } else {
            self.rate
        };
        // Wait one round trip plus one report before judging the new rate.
        self.hold_until = Some(now + self.cfg.rtt + fb.interval);
        if (new - self.rate).abs() < 1.0 {
            return None;
        }
        self.rate = new;
        self.record(now, why);
        self.timeline.last().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg(mode: RateMode) -> RateConfig {
        RateConfig {
            mode,
            ceiling_bps: 10_000_000_000,
            start_bps: 50_000_000,
            min_bps: 1_000_000,
            rtt: Duration::from_millis(50),
        }
    }

    fn fb(rate_bps: f64, loss: f64, delay_ms: u64) -> Feedback {
        let interval = Duration::from_millis(50);
        let bytes = (rate_bps / 8.0 * interval.as_secs_f64()) as u64;
        let datagrams = bytes / 1400;
        Feedback {
            interval,
            bytes,
            datagrams,
            lost: (datagrams as f64 * loss / (1.0 - loss)) as u64,
            socket_drops: 0,
            queue_delay: Duration::from_millis(delay_ms),
            backlog_bytes: 0,
        }
    }

    #[test]
    fn doubles_until_congestion_then_settles_below_delivered() {
        let t0 = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Auto), t0);
        let mut t = t0;
        for _ in 0..4 {
            t += Duration::from_millis(200);
            c.on_feedback(t, &fb(c.rate_bps() as f64, 0.0, 0));
        }
        assert_eq!(c.rate_bps(), 800_000_000);
        t += Duration::from_millis(200);
        // Sending 800M into a 300M bottleneck: most of it is lost.
        let ch = c.on_feedback(t, &fb(300e6, 0.6, 2)).unwrap();
        assert_eq!(ch.reason, Reason::Loss);
        assert!((ch.rate_bps as f64 - 285e6).abs() < 1e6);
        assert!(!c.in_startup());
    }

    #[test]
    fn random_loss_alone_does_not_slow_it_down() {
        let t0 = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Auto), t0);
        let mut t = t0;
        for _ in 0..12 {
            t += Duration::from_millis(200);
            c.on_feedback(t, &fb(c.rate_bps() as f64 * 0.99, 0.01, 1));
        }
        assert!(c.rate_bps() >= 5_000_000_000, "rate {}", c.rate_bps());
        assert!(c
            .timeline()
            .iter()
            .all(|ch| !matches!(ch.reason, Reason::Loss | Reason::Delay)));
    }

    #[test]
    fn fair_mode_yields_to_queueing_delay_and_fixed_ignores_everything() {
        let t0 = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Fair), t0);
        let before = c.rate_bps();
        let ch = c
            .on_feedback(t0 + Duration::from_secs(1), &fb(40e6, 0.0, 30))
            .unwrap();
        assert_eq!(ch.reason, Reason::Delay);
        assert!(c.rate_bps() < before);
        let mut f = RateController::new(cfg(RateMode::Fixed), t0);
        assert_eq!(
            f.on_feedback(t0 + Duration::from_secs(1), &fb(1e6, 0.9, 500)),
            None
        );
        assert_eq!(f.rate_bps(), 10_000_000_000);
    }

    #[test]
    fn holds_for_a_round_after_a_change() {
        let t0 = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Auto), t0);
        assert!(c
            .on_feedback(t0 + Duration::from_millis(60), &fb(50e6, 0.0, 0))
            .is_some());
        assert!(c
            .on_feedback(t0 + Duration::from_millis(70), &fb(50e6, 0.0, 0))
            .is_none());
    }

    proptest! {
        /// Any sequence of reports keeps the rate finite and within [min, ceiling].
        #[test]
        fn rate_stays_bounded(
            mode in prop_oneof![Just(RateMode::Auto), Just(RateMode::Fair), Just(RateMode::Fixed)],
            steps in proptest::collection::vec((0u64..400, any::<u64>(), any::<u32>(), any::<u32>(), any::<u16>(), 0u64..10_000, any::<u64>()), 1..200),
        ) {
            let t0 = Instant::now();
            let config = cfg(mode);
            let (lo, hi) = (config.min_bps, config.ceiling_bps);
            let mut c = RateController::new(config, t0);
            let mut t = t0;
            for (dt, bytes, datagrams, lost, drops, delay, backlog) in steps {
                t += Duration::from_millis(dt);
                let f = Feedback {
                    interval: Duration::from_millis(dt),
                    bytes,
                    datagrams: u64::from(datagrams),
                    lost: u64::from(lost),
                    socket_drops: u64::from(drops),
                    queue_delay: Duration::from_millis(delay),
                    backlog_bytes: backlog,
                };
                c.on_feedback(t, &f);
                let r = c.rate_bps();
                prop_assert!(r >= lo && r <= hi, "rate {r} outside [{lo}, {hi}]");
            }
        }
    }
}
