//! Rate control after PA-UDP: start at or below what the receiver can absorb, then follow the
//! path by the receiver's feedback.
//!
//! The receiver reports about once per RTT ([`Feedback`]): what arrived in the interval, how many
//! datagrams went missing (gaps in the per-channel packet numbers), kernel socket drops, how long
//! datagrams spent queued (one-way delay above the lowest seen, from the sender's timestamps) and
//! how full its socket receive buffers got (its backlog: datagrams it has not read yet).
//! [`RateController`] turns that into a pacing rate:
//!
//! - **rounds**: a new rate is judged by the first report whose data was all sent at it (one
//!   RTT, with the queueing delay, plus about one report interval after the change); reports in
//!   between only feed the loss floor, unless the receiver already sees congestion after an
//!   increase, which is acted on at once;
//! - **startup**: from the first rate (the engine's floor, or [`initial_rate`] on a short
//!   path), the rate doubles each round (but to no more than twice what was delivered) until
//!   the first sign of congestion;
//! - **congestion** is any of: loss clearly above the path's *loss floor* (what the quieter
//!   recent rounds lost, which is what random loss looks like, allowing for the counts' noise),
//!   queueing delay above the mode's target, kernel socket drops at the receiver, a receiver
//!   socket buffer more than half full (the receiver falls behind: caught before the kernel
//!   drops, which a delay target cannot promise when the buffer holds less than the target's
//!   worth of data), or a *saturated* round: less passed the path (delivered plus lost) than the
//!   rate while the queueing delay grew accordingly, i.e. the surplus is filling a queue, caught
//!   before the queue overflows. On congestion the rate goes to just under what was delivered,
//!   lower still if a standing queue has to drain (its delay, over two rounds), then holds until
//!   it has (unless the receiver keeps dropping from a full socket buffer at less than the
//!   new rate: then the cut was not deep enough); the delivered rate is remembered as the
//!   path's capacity, raised by any later report that delivered more than was sent (a queue
//!   draining, as fast as the bottleneck serves it);
//! - otherwise, in `auto`, the rate climbs back towards that capacity by halving the distance
//!   each round, and beyond it probes by +6% per round, the step doubling (up to 8x) while the
//!   path clearly takes each increase, so a path that got faster is found in a few rounds; a
//!   probe the path did not clearly take is followed by a round of waiting. A round in which
//!   the sender used less than half its rate says nothing about the path.
//! - `fair` follows LEDBAT's rule instead, in rates: past startup, queueing delay over its low
//!   target (5 ms, or RTT/20) cuts the rate by 25% per target's worth of excess (at most half),
//!   whoever built the queue, and judges again after one round; under the target the rate
//!   climbs by up to 10% per round in proportion to the room left (3% near the delivered rate
//!   of the last congestion), the step doubling over rounds in which the queue stays empty. It
//!   never jumps back to a remembered capacity, which a competing flow may now be using, and
//!   gives up 20% (not 5%) on loss.
//!
//! A receiver starved of CPU runs in lumps and its queueing delay swings by about its timer's
//! lateness, which it reports: delay targets and queue growth are judged with twice that
//! added, so the swings are not taken for a queue.
//!
//! Random loss with no queueing and no socket drops raises the loss floor, not the alarm, so it
//! costs only the lost bytes; that is the point against TCP. A competing loss-based TCP flow
//! keeps a standing queue, so `fair` yields to it (all the way down, against one that keeps the
//! queue over the target); `auto` reacts only to a queue over its 40 ms target or growing
//! under its own surplus. In both modes the sender's own surplus is caught by saturation before
//! it builds a long queue.
//! `fixed` paces at exactly the configured rate and ignores feedback.
//!
//! Every change is recorded with its reason ([`RateChange`]) for the progress line, the JSON
//! summary and the channel logs. The controller is pure: time comes in as arguments.

use crate::wire::Control;
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

/// Datagrams a transfer may send per round trip at its first rate: TCP's initial window
/// (RFC 6928), as a rate.
pub const INITIAL_WINDOW: u64 = 10;

/// The first rate for a path: [`INITIAL_WINDOW`] datagrams of `payload` bytes per `rtt`, or
/// `floor_bps` if that is higher. On a long path the floor decides (10 datagrams of 1384
/// bytes per 100 ms is 1.1 Mbit/s); on a short one (loopback, a rack) startup begins where TCP
/// would, not dozens of doubling rounds below it, since a round is a report interval (10 ms at
/// least), many round trips there.
pub fn initial_rate(floor_bps: u64, payload: u16, rtt: Duration) -> u64 {
    let window_bits = (INITIAL_WINDOW * u64::from(payload) * 8) as f64;
    let rtt = rtt.as_secs_f64().max(1e-6);
    floor_bps.max((window_bits / rtt).min(u64::MAX as f64 / 2.0) as u64)
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
    /// The fullest a receiver socket buffer got, as a share of its limit (0 to 1).
    pub queue_fill: f64,
    /// How late the receiver's own timer runs (smoothed): a receiver starved of CPU runs in
    /// lumps this far apart, and the queueing delay it measures moves by about that much from
    /// one report to the next without any queue building.
    pub receiver_lag: Duration,
}

impl Feedback {
    /// The controller's view of a receiver's `Report`; `None` for other messages.
    pub fn of_report(msg: &Control) -> Option<Feedback> {
        match *msg {
            Control::Report {
                interval_us,
                bytes,
                datagrams,
                lost,
                drops,
                queue_delay_us,
                queue_fill,
                lateness_us,
                ..
            } => Some(Feedback {
                interval: Duration::from_micros(interval_us),
                bytes,
                datagrams,
                lost,
                socket_drops: drops,
                queue_delay: Duration::from_micros(queue_delay_us),
                queue_fill: f64::from(queue_fill.min(1000)) / 1000.0,
                receiver_lag: Duration::from_micros(lateness_us),
            }),
            _ => None,
        }
    }
}

/// Tracks one-way delay (receiver clock minus the sender's timestamp, both in wrapping
/// microseconds, from unsynchronised clocks) relative to the lowest seen: the part above the
/// lowest is queueing. What a receiver reports as [`Feedback::queue_delay`].
#[derive(Debug, Default, Clone)]
pub struct OneWayDelay {
    base: Option<u32>,
    min: i64,
}

impl OneWayDelay {
    /// Queueing delay in microseconds of a datagram sent at `sent_us` (sender clock) and
    /// received at `now_us` (receiver clock).
    pub fn sample(&mut self, now_us: u32, sent_us: u32) -> u64 {
        let d = now_us.wrapping_sub(sent_us);
        let base = *self.base.get_or_insert(d);
        let rel = i64::from(d.wrapping_sub(base) as i32);
        self.min = self.min.min(rel);
        (rel - self.min) as u64
    }
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
    /// Queueing delay above the target, or a queue building (less passed than was sent).
    Delay,
    /// The receiver's kernel dropped datagrams.
    SocketDrops,
    /// The receiver is falling behind: its socket buffers are filling.
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

/// Receiver socket buffer fill above which the receiver counts as falling behind: past it a
/// stall of the reader, or a little more surplus, and the kernel drops.
pub const QUEUE_FILL_LIMIT: f64 = 0.5;
/// How many recent rounds the loss floor looks back over.
const FLOOR_ROUNDS: usize = 16;
/// Loss above what the floor explains that counts as congestion, as a share of the round's
/// datagrams (on top of the floor's own noise, see [`RateController::on_feedback`]).
const LOSS_MARGIN: f64 = 0.005;
/// Outside startup one report cuts the rate to no less than this share of it.
const MAX_CUT: f64 = 0.5;
/// Most doublings of the probing step above the last known capacity (8 x the base step).
const MAX_PROBE_DOUBLINGS: u32 = 3;
/// Outside startup, a judged round that delivered less than this share of the rate (or less,
/// after a large increase) means the surplus is queueing somewhere.
const SATURATED: f64 = 0.97;
/// The same in startup, where the rate doubles.
const STARTUP_SATURATED: f64 = 0.75;
/// Longest report interval, queueing delay or RTT taken at face value.
const MAX_REPORTED: Duration = Duration::from_secs(3600);
/// `auto`: probing step above the last known capacity, as a share of the rate.
const AUTO_STEP: f64 = 0.06;
/// `fair`: share of the rate given up per report for each delay target's worth of queueing
/// delay over the target (at most twice that: a cut to half at three times the target).
const FAIR_CUT: f64 = 0.25;
/// `fair`: increase per round before any doubling, with an empty queue; less the closer the
/// queueing delay is to the target. Doubled step at most [`FAIR_GAIN_MAX`] (below the last
/// congestion's delivered rate) or 1 (no such rate known: as fast as startup).
const FAIR_GAIN: f64 = 0.1;
/// `fair`: largest doubled step below the last congestion's delivered rate.
const FAIR_GAIN_MAX: f64 = 0.5;
/// `fair`: the base step within 3% of or above the delivered rate of the last congestion...
const FAIR_PROBE_GAIN: f64 = 0.03;
/// ... and the largest it doubles to there.
const FAIR_PROBE_GAIN_MAX: f64 = 0.12;
/// `fair`: most doublings of the step over rounds with an empty queue.
const FAIR_MAX_DOUBLINGS: u32 = 6;
/// Share of the rate a round must pass (delivered or lost, not queued) to count as the path
/// keeping up with it.
const KEPT_UP: f64 = 0.99;

/// The sender's rate controller. See the module docs.
#[derive(Debug, Clone)]
pub struct RateController {
    cfg: RateConfig,
    rate: f64,
    startup: bool,
    hold_until: Option<Instant>,
    /// (lost, seen) datagrams of recent rounds.
    recent_loss: VecDeque<(u64, u64)>,
    /// Delivery rate the last time congestion was seen: where the path's capacity was.
    capacity: Option<f64>,
    /// `auto`: quiet probing rounds in a row at or above `capacity`; `fair`: rounds in a row
    /// with an empty queue. Either way, how many times the probing step has doubled.
    quiet_above: u32,
    /// New rate over old rate of the last change; `None` before the first.
    last_change: Option<f64>,
    /// A probe above capacity was put off once because the path did not clearly take the last
    /// increase.
    waited: bool,
    /// Queueing delay of the previous report.
    prev_delay: Duration,
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
            capacity: None,
            quiet_above: 0,
            last_change: None,
            waited: false,
            prev_delay: Duration::ZERO,
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

    /// The loss rate of recent rounds that random loss alone explains, erring high: the
    /// datagrams of the quieter half of the recent rounds (so that congested rounds do not
    /// count), pooled, with the count of lost ones raised to the top of its likely range
    /// (`lost + 2 + 2 sqrt(lost + 1)`), so that a floor seen over few datagrams is not taken
    /// for zero. `None` before the first round.
    fn loss_floor(&self) -> Option<f64> {
        let mut rounds: Vec<(u64, u64)> = self.recent_loss.iter().copied().collect();
        rounds.sort_by(|a, b| (a.0 as f64 / a.1 as f64).total_cmp(&(b.0 as f64 / b.1 as f64)));
        let quiet = &rounds[..rounds.len().div_ceil(2)];
        let lost = quiet.iter().map(|r| r.0 as f64).sum::<f64>();
        let seen = quiet.iter().map(|r| r.1 as f64).sum::<f64>();
        (seen > 0.0).then(|| ((lost + 2.0 + 2.0 * (lost + 1.0).sqrt()) / seen).min(1.0))
    }

    /// Takes one report; returns the change made, if any.
    ///
    /// A round's loss is congestion if it is over half the datagrams, or if the lost count
    /// exceeds what the floor of the *earlier* rounds explains (`floor x seen`) by more than
    /// that count's noise (three standard deviations of a Poisson count, plus two datagrams)
    /// plus 0.5% of the round: so small rounds need more than a loss or two, and a
    /// clean path that has been watched for a while notices an overshoot of about 1%.
    ///
    /// A judged round is *saturated* if less passed the path (delivered, plus the lost share
    /// added back) than 97% of the rate (75% in startup, less after
    /// a large increase), and the mean queueing delay grew by at least half of what that
    /// surplus would queue in an interval; it counts as [`Reason::Delay`].
    ///
    /// On congestion the rate goes to the delivered rate (or the current rate, if lower) times
    /// the mode's factor; for [`Reason::Delay`] or [`Reason::Backlog`], or a queue longer than
    /// the delay target, lower still: low enough to drain the queue (the report's delay, plus,
    /// for a queue on the path, what the surplus added since) within two holds, never below
    /// half. The hold that follows lasts until that
    /// queue has drained (at most two more rounds), and a queue seen shrinking after a cut is
    /// left to drain, unless a report shows the receiver's socket buffer over its limit and
    /// dropping while it delivered less than 95% of the new rate: a full buffer is read as
    /// fast as the receiver can, so that cut was not deep enough, and the rate is cut again.
    /// Outside startup one report never cuts more than half, so an
    /// interval in which the sender had little to send (the end of a transfer) cannot collapse
    /// the rate. The delivered rate is remembered as the path's capacity.
    ///
    /// Without congestion: in startup the rate doubles, but to no more than twice what was
    /// delivered; after startup it closes half the distance to the remembered capacity per
    /// round (at least a quarter of the mode's step) until within 3% of it, and from there
    /// probes by the mode's step, doubling for every round in a row in which the path passed
    /// 99% of the rate. A round that did not is followed by a round without increase
    /// (and another while the queueing delay grows), then the base step again. A round that
    /// delivered less than half the rate says nothing about the path (the sender had little to
    /// send): the rate stays.
    pub fn on_feedback(&mut self, now: Instant, fb: &Feedback) -> Option<RateChange> {
        if self.cfg.mode == RateMode::Fixed {
            return None;
        }
        let seen = fb.datagrams.saturating_add(fb.lost);
        if seen == 0 || fb.interval.is_zero() {
            return None;
        }
        // The peer's numbers: keep the durations in a range where the arithmetic cannot overflow.
        let fb = &Feedback {
            interval: fb.interval.min(MAX_REPORTED),
            queue_delay: fb.queue_delay.min(MAX_REPORTED),
            receiver_lag: fb.receiver_lag.min(MAX_REPORTED),
            ..*fb
        };
        // Queueing delay that moves within twice the receiver's lag is its lumps, not a queue.
        let noise = fb.receiver_lag * 2;
        let loss = fb.lost as f64 / seen as f64;
        let loss_congestion = loss > 0.5
            || self.loss_floor().is_some_and(|floor| {
                let expected = floor * seen as f64;
                let noise = 3.0 * expected.sqrt() + 2.0;
                fb.lost as f64 > expected + noise + LOSS_MARGIN * seen as f64
            });
        self.recent_loss.push_back((fb.lost.min(seen), seen));
        if self.recent_loss.len() > FLOOR_ROUNDS {
            self.recent_loss.pop_front();
        }
        let delivered = fb.bytes as f64 * 8.0 / fb.interval.as_secs_f64();
        let measured = delivered.is_finite() && delivered > 0.0;
        // What left the queues: the delivered rate with the lost datagrams added back (they
        // were dropped, not queued), so random loss alone does not look like a queue.
        let passed = delivered / (1.0 - loss).max(0.5);
        let last_cut = self.last_change.is_some_and(|r| r < 1.0);
        let prev_delay = std::mem::replace(&mut self.prev_delay, fb.queue_delay);
        // A receiver whose socket buffer is full and dropping takes exactly what it can, so a
        // rate above what it delivered overflows it however old the report's data is: a cut
        // that left the rate there was not deep enough, and waiting for the queue to drain
        // would only wait through more drops.
        let overflowing = fb.socket_drops > 0
            && fb.queue_fill > QUEUE_FILL_LIMIT
            && measured
            && delivered < self.rate * 0.95;
        // After a cut, a report that delivered more than is being sent saw a queue drain, and
        // a queue drains as fast as its bottleneck serves it: that is the path's capacity, and
        // the climb back aims there. (The report that caused the cut can show much less, when
        // the receiver fell behind for a moment rather than for good.)
        if last_cut && self.cfg.mode == RateMode::Auto && measured && delivered > self.rate {
            self.capacity = Some(self.capacity.map_or(delivered, |c| c.max(delivered)));
        }
        // A queue that is draining after a cut is no reason to cut again, nor to speed up.
        if last_cut
            && !overflowing
            && fb.queue_delay > self.cfg.delay_target()
            && fb.queue_delay < prev_delay
        {
            return None;
        }
        // What the receiver saw.
        let seen_congestion = if fb.socket_drops > 0 {
            Some(Reason::SocketDrops)
        } else if fb.queue_fill > QUEUE_FILL_LIMIT {
            Some(Reason::Backlog)
        } else if fb.queue_delay > self.cfg.delay_target() + noise {
            Some(Reason::Delay)
        } else if loss_congestion {
            Some(Reason::Loss)
        } else {
            None
        };
        if self.hold_until.is_some_and(|t| now < t) {
            // After a cut the queue is still draining: wait, whatever the report says, unless
            // the receiver overflows at the new rate. After an increase, congestion the
            // receiver already sees is acted on at once (it cannot be older than the increase:
            // the report that allowed the increase was quiet).
            if (last_cut && !overflowing) || seen_congestion.is_none() {
                return None;
            }
        }
        // A judged round (its data was all sent after the last change, give or take a quarter
        // interval) that delivered clearly less than the rate while the queueing delay grew
        // accordingly: the surplus is filling a queue. Not before the first change (the first
        // report also covers the first one-way delay, when nothing can arrive), and outside
        // startup not below half the rate (the sender had little to send).
        let saturated = self.last_change.is_some_and(|ratio| {
            let share = if self.startup {
                STARTUP_SATURATED
            } else {
                // Some of the interval at the old rate weighs more after a larger increase.
                SATURATED.min(1.0 - (ratio - 1.0) / 8.0)
            };
            // Sending 1/share times what the path takes for an interval queues at least
            // (1 - share) of an interval; ask for half of that in the mean delay.
            let growth = fb.interval.mul_f64((1.0 - share) / 2.0);
            measured
                && (self.startup || delivered >= self.rate / 2.0)
                && passed < self.rate * share
                && fb.queue_delay >= prev_delay + growth + noise
        });
        let reason = seen_congestion.or(saturated.then_some(Reason::Delay));
        let ceiling = self.cfg.ceiling_bps.max(1) as f64;
        let floor = self.cfg.min_bps.max(1) as f64;
        // Judge the new rate by the first report whose data was sent after the change: one
        // round trip (with what is queued now) plus one report interval later. Reports come
        // once per interval, so a quarter interval of slack lets that one through despite
        // timing noise.
        let rtt = self.cfg.rtt.min(MAX_REPORTED);
        let mut hold = rtt + fb.queue_delay + fb.interval.mul_f64(0.75);
        let fair = self.cfg.mode == RateMode::Fair;
        let (new, why) = match reason {
            Some(r) => {
                let base = if measured {
                    self.capacity = Some(delivered);
                    self.rate.min(delivered)
                } else {
                    self.rate
                };
                // `fair` gives up more on loss: with a competing flow, a queue that overflows
                // is shared.
                let factor: f64 = if fair && r == Reason::Loss { 0.8 } else { 0.95 };
                // A filling socket buffer is a queue too, at the receiver: drain it the same way.
                let queue_cut = matches!(r, Reason::Delay | Reason::Backlog);
                // The queue now: what the report saw, plus, for a queue on the path, what the
                // surplus over the delivered rate has added since its data was sent. Not for a
                // receiver's socket buffer: it cannot hold more than it did by much (half full
                // already), and what does not fit is dropped, which the next report shows.
                let surplus = if measured && r == Reason::Delay {
                    (self.rate / delivered - 1.0).clamp(0.0, 1.0)
                } else {
                    0.0
                };
                let queue = fb.queue_delay + (rtt + fb.interval).mul_f64(surplus);
                // `fair`, past startup, over its delay target: the queue may well be someone
                // else's, so back off in proportion to how far over the target it is (LEDBAT's
                // rule), not to drain it, and judge again after one round.
                let yield_to_queue = fair
                    && !self.startup
                    && r == Reason::Delay
                    && fb.queue_delay > self.cfg.delay_target();
                // When the queue itself is the problem (or longer than the mode accepts), go low
                // enough to drain it within two holds. A short queue that drops (a shallow
                // bottleneck, a socket buffer) only needs the rate below capacity: it drains at
                // the mode's margin.
                let factor = if yield_to_queue {
                    let over =
                        fb.queue_delay.as_secs_f64() / self.cfg.delay_target().as_secs_f64() - 1.0;
                    1.0 - FAIR_CUT * over.min(2.0)
                } else if queue_cut || queue > self.cfg.delay_target() {
                    let drain = 1.0 - queue.as_secs_f64() / (2.0 * hold.as_secs_f64()).max(1e-6);
                    factor.min(drain).max(0.5)
                } else {
                    factor
                };
                let mut new = base * factor;
                if !self.startup {
                    new = new.max(self.rate * MAX_CUT);
                }
                // And wait for the queue to drain at that rate before judging again (at most
                // two more rounds).
                if !yield_to_queue {
                    hold += queue
                        .mul_f64(1.0 / (1.0 - factor))
                        .min((rtt + fb.interval) * 2);
                }
                self.startup = false;
                self.quiet_above = 0;
                (new, r)
            }
            None if self.startup => {
                let limit = if measured {
                    2.0 * delivered
                } else {
                    2.0 * self.rate
                };
                (self.rate.max(limit.min(2.0 * self.rate)), Reason::Startup)
            }
            // The sender had little to send: nothing learnt about the path.
            None if measured && delivered < self.rate / 2.0 => (self.rate, Reason::Probe),
            // `fair`: climb in proportion to the room under the delay target, by a smaller step
            // near and above the delivered rate of the last congestion, and never jump back to
            // it: a competing flow may be using it now. A queue that stays empty round after
            // round means the path has room (the competitor left): the step doubles each such
            // round, so the rate is back in a few rounds, not minutes.
            None if fair => {
                let target = self.cfg.delay_target();
                let under = 1.0 - fb.queue_delay.as_secs_f64() / target.as_secs_f64();
                if self.capacity.is_some_and(|c| self.rate > c * 1.25) {
                    // Well past it without congestion: it no longer says anything.
                    self.capacity = None;
                }
                self.quiet_above = if fb.queue_delay < target / 4 {
                    (self.quiet_above + 1).min(FAIR_MAX_DOUBLINGS)
                } else {
                    0
                };
                let doubled =
                    |base: f64| base * f64::from(1u32 << self.quiet_above.saturating_sub(1));
                let new = match self.capacity {
                    Some(c) if self.rate >= c * 0.97 => {
                        self.rate
                            * (1.0 + doubled(FAIR_PROBE_GAIN).min(FAIR_PROBE_GAIN_MAX) * under)
                    }
                    Some(c) => {
                        (self.rate * (1.0 + doubled(FAIR_GAIN).min(FAIR_GAIN_MAX) * under)).min(c)
                    }
                    None => self.rate * (1.0 + doubled(FAIR_GAIN).min(1.0) * under),
                };
                (new, Reason::Probe)
            }
            None => match self.capacity {
                Some(c) if self.rate < c * 0.97 => (
                    self.rate + ((c - self.rate) / 2.0).max(self.rate * AUTO_STEP / 4.0),
                    Reason::Probe,
                ),
                _ => {
                    // Did the path clearly take the last increase?
                    let took = !measured || passed >= self.rate * KEPT_UP;
                    if took {
                        // The step grows while the path takes each increase.
                        self.waited = false;
                        let gain = AUTO_STEP * f64::from(1u32 << self.quiet_above);
                        self.quiet_above = (self.quiet_above + 1).min(MAX_PROBE_DOUBLINGS);
                        (self.rate * (1.0 + gain), Reason::Probe)
                    } else if !self.waited
                        || fb.queue_delay
                            > prev_delay + fb.interval.mul_f64((1.0 - KEPT_UP) / 2.0) + noise
                    {
                        // Not clearly, or the queue grows: wait a round and see.
                        self.waited = true;
                        self.quiet_above = 0;
                        (self.rate, Reason::Probe)
                    } else {
                        // Quiet twice, and no queue building: the base step.
                        self.waited = false;
                        self.quiet_above = 1;
                        (self.rate * (1.0 + AUTO_STEP), Reason::Probe)
                    }
                }
            },
        };
        let new = if new.is_finite() {
            new.clamp(floor, ceiling.max(floor))
        } else {
            self.rate
        };
        self.hold_until = now.checked_add(hold);
        if (new - self.rate).abs() < 1.0 {
            return None;
        }
        self.last_change = Some(new / self.rate);
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
            queue_fill: 0.0,
            receiver_lag: Duration::ZERO,
        }
    }

    /// [`fb`] over a 10 ms interval.
    fn fb10(rate_bps: f64, delay_ms: u64) -> Feedback {
        Feedback {
            interval: Duration::from_millis(10),
            bytes: (rate_bps / 8.0 * 0.01) as u64,
            datagrams: (rate_bps / 8.0 * 0.01 / 8900.0) as u64,
            queue_delay: Duration::from_millis(delay_ms),
            ..Feedback::default()
        }
    }

    #[test]
    fn one_way_delay_is_relative_across_clock_offsets_and_wraps() {
        for offset in [0u64, 17, u64::from(u32::MAX) - 500] {
            let mut owd = OneWayDelay::default();
            let recv = |sent: u64, delay: u64| ((sent + delay + offset) as u32, sent as u32);
            let mut samples = Vec::new();
            for (sent, delay) in [
                (0, 20_000),
                (1_000, 25_000),
                (2_000, 19_000),
                (3_000, 21_000),
            ] {
                let (now_us, sent_us) = recv(sent, delay);
                samples.push(owd.sample(now_us, sent_us));
            }
            // Above the lowest seen so far.
            assert_eq!(samples, vec![0, 5_000, 0, 2_000], "offset {offset}");
        }
    }

    #[test]
    fn initial_rate_is_the_floor_on_long_paths_and_a_window_per_rtt_on_short_ones() {
        // 10 x 1384 bytes per 100 ms: 1.1 Mbit/s, under the floor.
        assert_eq!(
            initial_rate(100_000_000, 1384, Duration::from_millis(100)),
            100_000_000
        );
        // Loopback: 10 x 8900 bytes per 250 us.
        assert_eq!(
            initial_rate(100_000_000, 8900, Duration::from_micros(250)),
            2_848_000_000
        );
        // A zero RTT (a coarse clock) is bounded, not a division by zero.
        assert!(initial_rate(0, 8900, Duration::ZERO) <= 712_000_000_000);
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
    fn fair_yields_to_a_queue_it_did_not_cause_and_comes_back_when_it_empties() {
        let t0 = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Fair), t0);
        let mut t = t0;
        // Startup to about 400M, then a clean path for a while.
        while c.rate_bps() < 400_000_000 {
            t += Duration::from_millis(200);
            c.on_feedback(t, &fb(c.rate_bps() as f64, 0.0, 0));
        }
        for _ in 0..5 {
            t += Duration::from_millis(200);
            c.on_feedback(t, &fb(c.rate_bps() as f64, 0.0, 1));
        }
        let alone = c.rate_bps();
        // A competing flow keeps a 15 ms queue (three times the target) whatever we do.
        for _ in 0..10 {
            t += Duration::from_millis(200);
            let r = c.rate_bps() as f64;
            c.on_feedback(t, &fb(r * 0.9, 0.0, 15));
        }
        let yielded = c.rate_bps();
        assert!(yielded < alone / 10, "{alone} -> {yielded}");
        assert!(c
            .timeline()
            .iter()
            .rev()
            .take(5)
            .all(|ch| ch.reason == Reason::Delay));
        // It leaves: the queue is empty and everything sent arrives.
        let mut rounds = 0;
        while c.rate_bps() < alone / 2 {
            t += Duration::from_millis(200);
            c.on_feedback(t, &fb(c.rate_bps() as f64, 0.0, 0));
            rounds += 1;
            assert!(rounds < 30, "{:?}", c.timeline());
        }
        assert!(rounds <= 15, "{rounds} rounds back to half");
    }

    /// An `auto` controller on a 1 s round trip (a 500 ms delay target, more than a socket
    /// buffer holds) after one quiet report; returns it, its start and the report's time.
    fn long_path_after_one_round() -> (RateController, Instant, Instant) {
        let t0 = Instant::now();
        let mut c = RateController::new(
            RateConfig {
                rtt: Duration::from_secs(1),
                ..cfg(RateMode::Auto)
            },
            t0,
        );
        let t = t0 + Duration::from_secs(2);
        c.on_feedback(t, &fb(c.rate_bps() as f64, 0.0, 0));
        (c, t0, t)
    }

    #[test]
    fn a_filling_receiver_buffer_cuts_before_the_kernel_drops() {
        let (mut c, t0, mut t) = long_path_after_one_round();
        let before = c.rate_bps();
        // 200 ms queued at the receiver, under the target, but its buffer is 60% full.
        let full = Feedback {
            queue_fill: 0.6,
            ..fb(before as f64 * 0.7, 0.0, 200)
        };
        t += Duration::from_secs(2);
        let ch = c.on_feedback(t, &full).unwrap();
        assert_eq!(ch.reason, Reason::Backlog);
        assert!(
            c.rate_bps() < (before as f64 * 0.7 * 0.95) as u64,
            "below what was delivered, to drain: {before} -> {}",
            c.rate_bps()
        );
        assert!(!c.in_startup());
        // Half full is still fine.
        let mut d = RateController::new(cfg(RateMode::Auto), t0);
        let half = Feedback {
            queue_fill: 0.5,
            ..fb(d.rate_bps() as f64, 0.0, 0)
        };
        assert_eq!(
            d.on_feedback(t0 + Duration::from_secs(1), &half)
                .map(|c| c.reason),
            Some(Reason::Startup)
        );
    }

    #[test]
    fn a_cut_that_leaves_the_receiver_overflowing_is_followed_by_another() {
        let (mut c, _, mut t) = long_path_after_one_round();
        let full = |delivered: f64, drops: u64| Feedback {
            queue_fill: 1.0,
            socket_drops: drops,
            ..fb(delivered, 0.0, 200)
        };
        t += Duration::from_secs(2);
        let first = c
            .on_feedback(t, &full(c.rate_bps() as f64 * 0.8, 0))
            .unwrap();
        assert_eq!(first.reason, Reason::Backlog);
        // Within the hold: still full, and dropping, at less than the new rate.
        t += Duration::from_millis(500);
        let takes = first.rate_bps as f64 * 0.7;
        let second = c.on_feedback(t, &full(takes, 40)).unwrap();
        assert_eq!(second.reason, Reason::SocketDrops);
        assert!((second.rate_bps as f64) < takes);
        // Within the next hold: dropping, but delivering what is sent: the queue drains.
        t += Duration::from_millis(500);
        assert_eq!(c.on_feedback(t, &full(second.rate_bps as f64, 10)), None);
    }

    #[test]
    fn a_lumpy_receiver_s_delay_swings_are_not_a_queue() {
        // Reports from a receiver that runs in 30 ms lumps: the delay swings between 5 and 60
        // ms and the delivered rate by +-20% around what is sent, with no queue building.
        let run = |lag: Duration| {
            let t0 = Instant::now();
            let mut c = RateController::new(cfg(RateMode::Auto), t0);
            let mut t = t0;
            for _ in 0..3 {
                t += Duration::from_millis(200);
                c.on_feedback(t, &fb(c.rate_bps() as f64, 0.0, 1));
            }
            for i in 0..20 {
                t += Duration::from_millis(200);
                let (share, delay) = if i % 2 == 0 { (0.8, 60) } else { (1.2, 5) };
                let f = Feedback {
                    receiver_lag: lag,
                    ..fb(c.rate_bps() as f64 * share, 0.0, delay)
                };
                c.on_feedback(t, &f);
            }
            c.timeline().iter().any(|ch| ch.reason == Reason::Delay)
        };
        assert!(
            run(Duration::ZERO),
            "without the lag, these look like a queue"
        );
        assert!(!run(Duration::from_millis(30)), "with it, they do not");
    }

    #[test]
    fn auto_ignores_a_queue_under_its_target() {
        let t0 = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Auto), t0);
        let mut t = t0;
        for _ in 0..4 {
            t += Duration::from_millis(200);
            c.on_feedback(t, &fb(c.rate_bps() as f64, 0.0, 15));
        }
        assert!(c.timeline().iter().all(|ch| ch.reason != Reason::Delay));
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

    /// A controller out of startup with a known capacity of `capacity_bps` (a loss round there),
    /// at `t`; returns it and the time of its last report.
    fn settled_at(capacity_bps: f64) -> (RateController, Instant) {
        let t0 = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Auto), t0);
        let mut t = t0;
        while (c.rate_bps() as f64) < capacity_bps {
            t += Duration::from_millis(200);
            c.on_feedback(t, &fb(c.rate_bps() as f64, 0.0, 1));
        }
        t += Duration::from_millis(200);
        let ch = c.on_feedback(t, &fb(capacity_bps, 0.3, 1)).unwrap();
        assert_eq!(ch.reason, Reason::Loss);
        (c, t)
    }

    #[test]
    fn a_filling_queue_is_caught_before_it_overflows() {
        let (mut c, mut t) = settled_at(300e6);
        // Back up to the capacity, then one probe past it.
        while c.rate_bps() < 300_000_000 {
            t += Duration::from_millis(200);
            c.on_feedback(t, &fb(c.rate_bps() as f64, 0.0, 1));
        }
        let probe = c.rate_bps();
        assert!(probe < 330_000_000, "probe {probe}");
        // The path passes 300 of it without loss, and the queueing delay grows.
        t += Duration::from_millis(200);
        let ch = c.on_feedback(t, &fb(300e6, 0.0, 4)).unwrap();
        assert_eq!(ch.reason, Reason::Delay);
        assert!(
            ch.rate_bps < 300_000_000 && ch.rate_bps > 270_000_000,
            "{ch:?}"
        );
    }

    #[test]
    fn a_queue_draining_after_a_cut_shows_the_capacity_to_climb_back_to() {
        // Out of startup at 1 Gbit/s; one report then shows a receiver that fell behind for a
        // moment: 600 Mbit/s delivered and a queue.
        let (mut c, mut t) = settled_at(1e9);
        while c.rate_bps() < 1_000_000_000 {
            t += Duration::from_millis(200);
            c.on_feedback(t, &fb(c.rate_bps() as f64, 0.0, 1));
        }
        t += Duration::from_millis(200);
        let cut = c.on_feedback(t, &fb(600e6, 0.0, 120)).unwrap();
        assert_eq!(cut.reason, Reason::Delay);
        assert!(cut.rate_bps < 600_000_000, "{cut:?}");
        // While it holds, the queue drains at 950 Mbit/s, more than is sent.
        t += Duration::from_millis(100);
        assert_eq!(c.on_feedback(t, &fb(950e6, 0.0, 30)), None);
        // Quiet rounds then climb back near 950 in a few rounds, not by probing steps.
        for _ in 0..5 {
            t += Duration::from_millis(200);
            c.on_feedback(t, &fb(c.rate_bps() as f64, 0.0, 1));
        }
        assert!(c.rate_bps() > 850_000_000, "{:?}", c.timeline());
    }

    #[test]
    fn a_socket_buffer_half_full_is_not_extrapolated_like_a_path_queue() {
        // Startup on a 0.2 ms path with 10 ms reports has reached 10 Gbit/s when the receiver
        // falls behind for a moment: 5 Gbit/s delivered, its buffer 70% full (3 ms queued).
        let mut c = RateController::new(
            RateConfig {
                rtt: Duration::from_micros(200),
                ceiling_bps: 20_000_000_000,
                ..cfg(RateMode::Auto)
            },
            Instant::now(),
        );
        let mut t = Instant::now();
        while c.rate_bps() < 10_000_000_000 {
            t += Duration::from_millis(10);
            c.on_feedback(t, &fb10(c.rate_bps() as f64, 0));
        }
        t += Duration::from_millis(10);
        let full = Feedback {
            queue_fill: 0.7,
            ..fb10(5e9, 3)
        };
        let cut = c.on_feedback(t, &full).unwrap();
        assert_eq!(cut.reason, Reason::Backlog);
        // Below what was delivered, by what the 3 ms need to drain, not by half again for
        // what the surplus would add to a queue that cannot hold it.
        assert!(
            cut.rate_bps > 4_000_000_000 && cut.rate_bps < 5_000_000_000,
            "{cut:?}"
        );
    }

    #[test]
    fn a_path_that_got_faster_is_found_in_a_few_rounds() {
        let (mut c, mut t) = settled_at(150e6);
        let mut rounds = 0;
        while c.rate_bps() < 300_000_000 {
            t += Duration::from_millis(200);
            c.on_feedback(t, &fb(c.rate_bps() as f64, 0.0, 1));
            rounds += 1;
        }
        assert!(rounds <= 7, "{rounds} rounds: {:?}", c.timeline());
        assert!(c.rate_bps() < 500_000_000, "{}", c.rate_bps());
    }

    #[test]
    fn a_nearly_idle_round_cuts_at_most_half() {
        let (mut c, mut t) = settled_at(300e6);
        let before = c.rate_bps();
        t += Duration::from_millis(200);
        // The end of a transfer: a few datagrams, a third of them lost.
        let tail = Feedback {
            interval: Duration::from_millis(50),
            bytes: 20 * 1400,
            datagrams: 20,
            lost: 10,
            ..Feedback::default()
        };
        let ch = c.on_feedback(t, &tail).unwrap();
        assert_eq!(ch.reason, Reason::Loss);
        assert!(ch.rate_bps >= before / 2, "{} -> {}", before, ch.rate_bps);
    }

    #[test]
    fn random_loss_in_small_rounds_is_not_congestion() {
        let t0 = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Auto), t0);
        let mut t = t0;
        // About 1% of 200 datagrams per round, as a binomial count would scatter.
        for lost in [0, 3, 1, 4, 2, 0, 5, 2, 1, 3, 2, 4, 1, 0, 2, 3] {
            t += Duration::from_millis(200);
            let f = Feedback {
                interval: Duration::from_millis(50),
                bytes: 200 * 1400,
                datagrams: 200 - lost,
                lost,
                queue_delay: Duration::from_millis(1),
                ..Feedback::default()
            };
            c.on_feedback(t, &f);
        }
        assert!(
            c.timeline().iter().all(|ch| ch.reason != Reason::Loss),
            "{:?}",
            c.timeline()
        );
    }

    #[test]
    fn absurd_reports_do_not_panic() {
        let t0 = Instant::now();
        for mode in [RateMode::Auto, RateMode::Fair] {
            let mut c = RateController::new(cfg(mode), t0);
            let mut t = t0;
            for f in [
                Feedback {
                    interval: Duration::from_micros(u64::MAX),
                    bytes: u64::MAX,
                    datagrams: u64::MAX,
                    lost: u64::MAX,
                    socket_drops: 0,
                    queue_delay: Duration::from_micros(u64::MAX),
                    queue_fill: 0.0,
                    receiver_lag: Duration::ZERO,
                },
                Feedback {
                    interval: Duration::from_nanos(1),
                    bytes: u64::MAX,
                    datagrams: 1,
                    lost: 0,
                    queue_delay: Duration::MAX,
                    ..Feedback::default()
                },
                fb(100e6, 0.0, 1),
            ] {
                t += Duration::from_millis(200);
                c.on_feedback(t, &f);
                assert!((1_000_000..=10_000_000_000).contains(&c.rate_bps()));
            }
        }
    }

    proptest! {
        /// Any sequence of reports keeps the rate finite and within [min, ceiling].
        #[test]
        fn rate_stays_bounded(
            mode in prop_oneof![Just(RateMode::Auto), Just(RateMode::Fair), Just(RateMode::Fixed)],
            steps in proptest::collection::vec((0u64..400, any::<u64>(), any::<u32>(), any::<u32>(), any::<u16>(), 0u64..10_000, 0u16..=1000), 1..200),
        ) {
            let t0 = Instant::now();
            let config = cfg(mode);
            let (lo, hi) = (config.min_bps, config.ceiling_bps);
            let mut c = RateController::new(config, t0);
            let mut t = t0;
            for (dt, bytes, datagrams, lost, drops, delay, fill) in steps {
                t += Duration::from_millis(dt);
                let f = Feedback {
                    interval: Duration::from_millis(dt),
                    bytes,
                    datagrams: u64::from(datagrams),
                    lost: u64::from(lost),
                    socket_drops: u64::from(drops),
                    queue_delay: Duration::from_millis(delay),
                    queue_fill: f64::from(fill) / 1000.0,
                    receiver_lag: Duration::from_millis(dt / 8),
                };
                c.on_feedback(t, &f);
                let r = c.rate_bps();
                prop_assert!(r >= lo && r <= hi, "rate {r} outside [{lo}, {hi}]");
            }
        }
    }
}
