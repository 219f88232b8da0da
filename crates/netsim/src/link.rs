//! A deterministic simulated network link: one direction of an impaired path.
//!
//! # What this module owns
//!
//! The network model only. A [`Link`] takes packets (`Vec<u8>`) at caller-supplied times and hands
//! them back later, after applying, in this order:
//!
//! 1. **MTU**: a packet longer than [`LinkConfig::mtu`] is dropped ([`LinkStats::dropped_mtu`]).
//! 2. **Blackouts**: a packet *sent* inside a window `[start, end)` of
//!    [`LinkConfig::blackouts`] (measured from the link's creation time) is dropped
//!    ([`LinkStats::dropped_blackout`]). Packets already in flight when a window opens still arrive.
//! 3. **Bottleneck**: with [`LinkConfig::rate_bps`] set, packets are serialized one after another at
//!    that rate behind a drop-tail queue of [`LinkConfig::queue_bytes`]. The packet being serialized
//!    is not in the queue; a packet that would have to wait is dropped
//!    ([`LinkStats::dropped_queue`]) if the bytes already waiting plus its own length exceed
//!    `queue_bytes`. A packet's *departure* is the moment its last bit has been serialized (its
//!    send time if there is no rate limit). [`Link::set_rate`] changes the rate mid-run.
//! 4. **Random loss** on the wire after the bottleneck ([`LinkStats::dropped_loss`]), so a lost
//!    packet still used bottleneck capacity.
//! 5. **Duplication**: at most one extra copy, which shares the departure time but draws its own
//!    corruption, jitter and reordering ([`LinkStats::duplicated`]). It costs no bottleneck capacity.
//! 6. Per copy: **corruption** flips one uniformly chosen bit (empty packets are never corrupted),
//!    **jitter** adds a uniform extra delay in `[0, jitter)`, **reordering** adds
//!    [`LinkConfig::reorder_delay`].
//!
//! The delivery time of a copy is `departure + delay + jitter (+ reorder_delay)`. Copies come out
//! of [`Link::poll`] in delivery-time order, ties in the order they were enqueued. Because jitter
//! and reordering add different extra delays to different packets, packets may be reordered;
//! with [`LinkConfig::jitter_in_order`] jitter does not reorder (a copy not picked for
//! reordering leaves no earlier than the one before it that was not either, as linkem's and
//! netem's jitter with a rate do), and only reordering does.
//!
//! # What it does not own
//!
//! Sockets, threads, clocks and the protocol. Time is whatever [`Instant`] the caller passes in;
//! nothing here reads the real clock. Driving hurtle's sender and receiver state machines over a
//! pair of links (the scenario runner: event loop, timers, which side talks next) is not part of
//! this module.
//!
//! # Determinism
//!
//! All randomness comes from a seeded, counter-based SplitMix64 written inline below. Each effect
//! (loss, duplication, corruption, jitter, reordering) has its own stream, and a decision is a pure
//! function of `(seed, effect, packet index, copy)`, where the packet index counts calls to
//! [`Link::send`] (bursty loss, [`LinkConfig::loss_burst`], also depends on whether the packet
//! before was lost: the loss stream's earlier decisions). So the same seed, configuration and sequence of calls give the same output, and
//! changing one effect's setting does not change the others' decisions for any packet (e.g.
//! turning on corruption leaves the set of lost packets unchanged).
//!
//! Send times should be nondecreasing. A send with an earlier time than a previous send is treated
//! as happening at the latest send time seen so far.
//!
//! # Cost
//!
//! In-flight packets live in a [`BinaryHeap`] keyed by `(delivery time, sequence number)`: `send`
//! and `poll` are O(log n). Payloads are moved, never copied, except to make a duplicate.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::time::{Duration, Instant};

/// Parameters of one direction of a simulated path.
///
/// [`LinkConfig::default`] is a perfect link: no delay, no impairments, no rate limit, no MTU.
/// Probabilities are compared against a uniform draw in `[0, 1)`: `0` (or NaN) never fires, `1` (or
/// more) always fires.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkConfig {
    /// Fixed one-way propagation delay, added after the bottleneck.
    pub delay: Duration,
    /// Upper bound (exclusive) of a uniform extra delay drawn per packet copy.
    pub jitter: Duration,
    /// Jitter keeps order: a copy's delivery is no earlier than that of the copy put in flight
    /// before it (reordered copies aside: they are held back from there, and hold back none).
    pub jitter_in_order: bool,
    /// Probability that a packet is lost on the wire (independently per packet, or in bursts:
    /// [`LinkConfig::loss_burst`]).
    pub loss: f64,
    /// Mean length of a burst of lost packets: 1 (or less) loses packets independently; more
    /// loses them in bursts (a Gilbert model: a packet is lost while the link is in a burst,
    /// which starts before a packet with probability `loss / (burst (1 - loss))` and ends after
    /// each with `1 / burst`), at the same mean rate `loss`, as Wi-Fi does and as `linkem
    /// --loss-burst` does.
    pub loss_burst: f64,
    /// Probability that a packet that survived the bottleneck and loss gets one extra copy.
    pub duplicate: f64,
    /// Probability that a packet copy is held back by an extra [`LinkConfig::reorder_delay`].
    pub reorder: f64,
    /// Extra delay given to packets picked for reordering. With zero, reordering has no effect
    /// (though such packets are still counted in [`LinkStats::reordered`]).
    pub reorder_delay: Duration,
    /// Probability that a packet copy has one random bit of its payload flipped.
    pub corrupt: f64,
    /// Bottleneck rate in bits per second; `None` means unlimited. `Some(0)` drops every packet
    /// as a queue drop.
    pub rate_bps: Option<u64>,
    /// Capacity in bytes of the drop-tail queue in front of the bottleneck (bytes waiting to be
    /// serialized, not counting the packet being serialized). Only used with
    /// [`LinkConfig::rate_bps`]. Default: unbounded.
    pub queue_bytes: usize,
    /// Largest packet (payload bytes) that passes; larger ones are dropped. `None`: no limit.
    pub mtu: Option<usize>,
    /// Windows `[start, end)`, relative to the link's creation time, during which every packet
    /// sent is dropped.
    pub blackouts: Vec<(Duration, Duration)>,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            jitter_in_order: false,
            loss: 0.0,
            loss_burst: 1.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::ZERO,
            corrupt: 0.0,
            rate_bps: None,
            queue_bytes: usize::MAX,
            mtu: None,
            blackouts: Vec::new(),
        }
    }
}

impl LinkConfig {
    /// Sets the fixed one-way delay.
    #[must_use]
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Sets a jitter bound (uniform extra delay in `[0, jitter)`) that keeps order
    /// ([`LinkConfig::jitter_in_order`]).
    #[must_use]
    pub fn with_ordered_jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self.jitter_in_order = true;
        self
    }

    /// Sets the jitter bound (uniform extra delay in `[0, jitter)`).
    #[must_use]
    pub fn with_jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// Sets the random loss probability.
    #[must_use]
    pub fn with_loss(mut self, loss: f64) -> Self {
        self.loss = loss;
        self
    }

    /// Sets the mean length of a burst of lost packets ([`LinkConfig::loss_burst`]).
    #[must_use]
    pub fn with_loss_burst(mut self, burst: f64) -> Self {
        self.loss_burst = burst;
        self
    }

    /// Sets the duplication probability.
    #[must_use]
    pub fn with_duplicate(mut self, duplicate: f64) -> Self {
        self.duplicate = duplicate;
        self
    }

    /// Sets the reordering probability and the extra delay given to reordered packets.
    #[must_use]
    pub fn with_reorder(mut self, reorder: f64, reorder_delay: Duration) -> Self {
        self.reorder = reorder;
        self.reorder_delay = reorder_delay;
        self
    }

    /// Sets the single-bit corruption probability.
    #[must_use]
    pub fn with_corrupt(mut self, corrupt: f64) -> Self {
        self.corrupt = corrupt;
        self
    }

    /// Sets a bottleneck of `rate_bps` bits per second behind a drop-tail queue of `queue_bytes`.
    #[must_use]
    pub fn with_rate(mut self, rate_bps: u64, queue_bytes: usize) -> Self {
        self.rate_bps = Some(rate_bps);
        self.queue_bytes = queue_bytes;
        self
    }

    /// Sets the largest packet size that passes.
    #[must_use]
    pub fn with_mtu(mut self, mtu: usize) -> Self {
        self.mtu = Some(mtu);
        self
    }

    /// Adds a blackout window `[start, end)` relative to the link's creation time.
    #[must_use]
    pub fn with_blackout(mut self, start: Duration, end: Duration) -> Self {
        self.blackouts.push((start, end));
        self
    }
}

/// Counters kept by a [`Link`]. Once every in-flight packet has been polled,
/// `delivered + dropped() == sent + duplicated`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Calls to [`Link::send`].
    pub sent: u64,
    /// Packet copies returned by [`Link::poll`].
    pub delivered: u64,
    /// Packets lost at random on the wire.
    pub dropped_loss: u64,
    /// Packets dropped because the bottleneck queue was full.
    pub dropped_queue: u64,
    /// Packets dropped for exceeding the MTU.
    pub dropped_mtu: u64,
    /// Packets dropped because they were sent during a blackout.
    pub dropped_blackout: u64,
    /// Extra copies created by duplication.
    pub duplicated: u64,
    /// Packet copies that had a bit flipped.
    pub corrupted: u64,
    /// Packet copies that got the extra reordering delay.
    pub reordered: u64,
}

impl LinkStats {
    /// Total packets dropped, for any reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_loss + self.dropped_queue + self.dropped_mtu + self.dropped_blackout
    }
}

/// One direction of a simulated path. See the [module docs](self) for the model.
#[derive(Debug)]
pub struct Link {
    config: LinkConfig,
    rng: Rng,
    start: Instant,
    /// Latest send time seen; earlier send times are raised to it.
    last_send: Instant,
    /// When the bottleneck finishes serializing the last admitted packet.
    busy_until: Instant,
    /// Packets admitted to the bottleneck whose serialization had not started at the last send:
    /// `(serialization start, length)`, in start order.
    waiting: VecDeque<(Instant, usize)>,
    /// Sum of the lengths in `waiting`.
    waiting_bytes: usize,
    in_flight: BinaryHeap<InFlight>,
    /// Sequence number of the next copy put in flight; breaks delivery-time ties in send order.
    next_seq: u64,
    /// Delivery time of the latest copy put in flight that was not reordered
    /// ([`LinkConfig::jitter_in_order`]).
    last_in_order: Instant,
    /// Whether the last packet that passed the bottleneck was lost in a burst
    /// ([`LinkConfig::loss_burst`]).
    in_burst: bool,
    stats: LinkStats,
}

impl Link {
    /// Creates an empty link. `start` is time zero for [`LinkConfig::blackouts`]; `seed` fixes
    /// every random decision.
    pub fn new(config: LinkConfig, seed: u64, start: Instant) -> Self {
        Self {
            in_burst: false,
            config,
            rng: Rng::new(seed),
            start,
            last_send: start,
            busy_until: start,
            waiting: VecDeque::new(),
            waiting_bytes: 0,
            in_flight: BinaryHeap::new(),
            next_seq: 0,
            last_in_order: start,
            stats: LinkStats::default(),
        }
    }

    /// Offers `packet` to the link at time `now`: it is either dropped (and counted) or scheduled
    /// for delivery, possibly together with a duplicate.
    ///
    /// # Panics
    ///
    /// If a delivery time does not fit in an [`Instant`] (absurdly large delays).
    pub fn send(&mut self, now: Instant, packet: Vec<u8>) {
        let index = self.stats.sent;
        self.stats.sent += 1;
        let now = now.max(self.last_send);
        self.last_send = now;

        if self.config.mtu.is_some_and(|mtu| packet.len() > mtu) {
            self.stats.dropped_mtu += 1;
            return;
        }
        if self.in_blackout(now) {
            self.stats.dropped_blackout += 1;
            return;
        }
        let Some(departure) = self.serialize(now, packet.len()) else {
            self.stats.dropped_queue += 1;
            return;
        };
        if self.lost(index) {
            self.stats.dropped_loss += 1;
            return;
        }
        let duplicate = if self
            .rng
            .chance(Stream::Duplicate, index, 0, self.config.duplicate)
        {
            self.stats.duplicated += 1;
            Some(packet.clone())
        } else {
            None
        };
        self.dispatch(departure, index, 0, packet);
        if let Some(copy) = duplicate {
            self.dispatch(departure, index, 1, copy);
        }
    }

    /// The earliest time at which [`Link::poll`] will return a packet, or `None` if nothing is in
    /// flight.
    pub fn next_delivery(&self) -> Option<Instant> {
        self.in_flight.peek().map(|p| p.at)
    }

    /// Removes and returns the in-flight packet with the earliest delivery time, if that time is
    /// `<= now`. Call repeatedly to get every packet due by `now`.
    pub fn poll(&mut self, now: Instant) -> Option<Vec<u8>> {
        if self.in_flight.peek()?.at > now {
            return None;
        }
        let packet = self.in_flight.pop()?;
        self.stats.delivered += 1;
        Some(packet.payload)
    }

    /// Number of packet copies scheduled but not yet polled.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Counters so far.
    pub fn stats(&self) -> &LinkStats {
        &self.stats
    }

    /// The configuration: the one this link was created with, with the rate set by the last
    /// [`Link::set_rate`], if any.
    pub fn config(&self) -> &LinkConfig {
        &self.config
    }

    /// Changes the bottleneck rate from `now` on (a path whose capacity changes mid-run), with
    /// the same meaning as [`LinkConfig::rate_bps`]. Packets already admitted keep their
    /// departure times; later packets queue behind them (the queue limit still applies) and are
    /// serialized at the new rate. With `None` later packets no longer wait for a rate, but
    /// still leave after the packets admitted before the change.
    pub fn set_rate(&mut self, rate_bps: Option<u64>) {
        self.config.rate_bps = rate_bps;
    }

    /// Whether `now` falls in one of [`LinkConfig::blackouts`].
    pub(crate) fn in_blackout(&self, now: Instant) -> bool {
        let offset = now.saturating_duration_since(self.start);
        self.config
            .blackouts
            .iter()
            .any(|&(start, end)| start <= offset && offset < end)
    }

    /// Runs a packet of `len` bytes arriving at `now` through the bottleneck. Returns its
    /// departure time, or `None` if the queue drops it.
    /// Whether packet `index`, which passed the bottleneck, is lost on the wire: independently,
    /// or while in a burst ([`LinkConfig::loss_burst`]), one draw of the loss stream either way.
    fn lost(&mut self, index: u64) -> bool {
        let (loss, burst) = (self.config.loss, self.config.loss_burst);
        if !(burst > 1.0 && loss > 0.0 && loss < 1.0) {
            return self.rng.chance(Stream::Loss, index, 0, loss);
        }
        let stay_or_start = if self.in_burst {
            1.0 - 1.0 / burst
        } else {
            loss / (burst * (1.0 - loss))
        };
        self.in_burst = self.rng.chance(Stream::Loss, index, 0, stay_or_start);
        self.in_burst
    }

    fn serialize(&mut self, now: Instant, len: usize) -> Option<Instant> {
        let Some(rate) = self.config.rate_bps else {
            // `busy_until` is past `now` only if a rate was in force before [`Link::set_rate`].
            return Some(self.busy_until.max(now));
        };
        if rate == 0 {
            return None;
        }
        while let Some(&(start, bytes)) = self.waiting.front() {
            if start > now {
                break;
            }
            self.waiting.pop_front();
            self.waiting_bytes -= bytes;
        }
        let start = self.busy_until.max(now);
        if start > now {
            if self.waiting_bytes.saturating_add(len) > self.config.queue_bytes {
                return None;
            }
            self.waiting.push_back((start, len));
            self.waiting_bytes += len;
        }
        let nanos = (len as u128 * 8 * 1_000_000_000).div_ceil(u128::from(rate));
        self.busy_until = start + Duration::from_nanos(saturate_u64(nanos));
        Some(self.busy_until)
    }

    /// Applies the per-copy effects (corruption, jitter, reordering) to copy `copy` of packet
    /// `index` and puts it in flight.
    fn dispatch(&mut self, departure: Instant, index: u64, copy: u64, mut payload: Vec<u8>) {
        if !payload.is_empty()
            && self
                .rng
                .chance(Stream::Corrupt, index, copy, self.config.corrupt)
        {
            let bits = payload.len() as u64 * 8;
            let bit = self.rng.below(Stream::CorruptBit, index, copy, bits);
            payload[(bit / 8) as usize] ^= 1 << (bit % 8);
            self.stats.corrupted += 1;
        }
        let mut at = departure + self.config.delay;
        let jitter = saturate_u64(self.config.jitter.as_nanos());
        if jitter > 0 {
            at += Duration::from_nanos(self.rng.below(Stream::Jitter, index, copy, jitter));
        }
        if self.config.jitter_in_order {
            at = at.max(self.last_in_order);
        }
        if self
            .rng
            .chance(Stream::Reorder, index, copy, self.config.reorder)
        {
            self.stats.reordered += 1;
            at += self.config.reorder_delay;
        } else {
            self.last_in_order = at;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.in_flight.push(InFlight { at, seq, payload });
    }
}

/// Both directions of a simulated path between endpoints `a` and `b`.
#[derive(Debug)]
pub struct Duplex {
    /// Packets sent by `a`, received by `b`.
    pub a_to_b: Link,
    /// Packets sent by `b`, received by `a`.
    pub b_to_a: Link,
}

impl Duplex {
    /// Creates both directions. Their seeds are the first two outputs of SplitMix64 seeded with
    /// `seed`, so the directions' random decisions are independent.
    pub fn new(a_to_b: LinkConfig, b_to_a: LinkConfig, seed: u64, start: Instant) -> Self {
        Self {
            a_to_b: Link::new(a_to_b, mix64(seed.wrapping_add(GOLDEN_GAMMA)), start),
            b_to_a: Link::new(
                b_to_a,
                mix64(seed.wrapping_add(GOLDEN_GAMMA.wrapping_mul(2))),
                start,
            ),
        }
    }

    /// Creates both directions with the same configuration (but independent randomness).
    pub fn symmetric(config: LinkConfig, seed: u64, start: Instant) -> Self {
        Self::new(config.clone(), config, seed, start)
    }

    /// The earliest delivery time over both directions.
    pub fn next_delivery(&self) -> Option<Instant> {
        match (self.a_to_b.next_delivery(), self.b_to_a.next_delivery()) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        }
    }
}

/// A packet copy in flight. Ordered so that [`BinaryHeap`] (a max-heap) pops the smallest
/// `(at, seq)` first.
#[derive(Debug)]
struct InFlight {
    at: Instant,
    seq: u64,
    payload: Vec<u8>,
}

impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for InFlight {}

impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for InFlight {
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

fn saturate_u64(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// SplitMix64's increment.
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function (a strong 64-bit mixer).
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The independent random streams, one per kind of decision.
#[derive(Debug, Clone, Copy)]
enum Stream {
    Loss,
    Duplicate,
    Corrupt,
    CorruptBit,
    Jitter,
    Reorder,
}

const STREAMS: usize = 6;

/// Counter-based SplitMix64: the draw for `(stream, index, copy)` is element `2 * index + copy`
/// of a SplitMix64 sequence whose starting state is derived from the seed and the stream. No
/// state changes between draws, so each decision depends only on its own coordinates.
#[derive(Debug, Clone)]
struct Rng {
    keys: [u64; STREAMS],
}

impl Rng {
    fn new(seed: u64) -> Self {
        let mut keys = [0; STREAMS];
        for (stream, key) in keys.iter_mut().enumerate() {
            *key = mix64(seed ^ mix64(stream as u64 + 1));
        }
        Self { keys }
    }

    fn draw(&self, stream: Stream, index: u64, copy: u64) -> u64 {
        let counter = index.wrapping_mul(2).wrapping_add(copy).wrapping_add(1);
        mix64(self.keys[stream as usize].wrapping_add(counter.wrapping_mul(GOLDEN_GAMMA)))
    }

    /// True with probability `p` (clamped to `[0, 1]`; NaN counts as 0).
    fn chance(&self, stream: Stream, index: u64, copy: u64, p: f64) -> bool {
        // Skip the draw when it cannot matter; the result is the same either way.
        if p.is_nan() || p <= 0.0 {
            return false;
        }
        if p >= 1.0 {
            return true;
        }
        let unit = (self.draw(stream, index, copy) >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
        unit < p
    }

    /// Uniform in `[0, n)`, for `n > 0`.
    fn below(&self, stream: Stream, index: u64, copy: u64, n: u64) -> u64 {
        ((u128::from(self.draw(stream, index, copy)) * u128::from(n)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    /// Polls everything due by `until`, recording each copy's exact delivery time.
    fn drain(link: &mut Link, until: Instant) -> Vec<(Instant, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some(at) = link.next_delivery() {
            if at > until {
                break;
            }
            out.push((at, link.poll(at).expect("due packet")));
        }
        out
    }

    fn far(t0: Instant) -> Instant {
        t0 + Duration::from_secs(3600)
    }

    /// The number [`numbered`] put into packet `p`.
    fn number_of(p: &[u8]) -> u64 {
        u64::from_le_bytes(p[..8].try_into().unwrap())
    }

    fn numbered(i: u64, len: usize) -> Vec<u8> {
        let mut p = i.to_le_bytes().to_vec();
        p.resize(len.max(8), 0xAB);
        p
    }

    #[test]
    fn perfect_link_delivers_in_order_at_exactly_the_delay() {
        let t0 = Instant::now();
        let delay = Duration::from_millis(30);
        let mut link = Link::new(LinkConfig::default().with_delay(delay), 1, t0);
        for i in 0..100u64 {
            link.send(t0 + Duration::from_micros(100 * i), numbered(i, 100));
        }
        for i in 0..100u64 {
            let due = t0 + Duration::from_micros(100 * i) + delay;
            assert_eq!(link.next_delivery(), Some(due));
            assert_eq!(link.poll(due - Duration::from_nanos(1)), None);
            assert_eq!(link.poll(due), Some(numbered(i, 100)));
        }
        assert_eq!(link.next_delivery(), None);
        let s = link.stats();
        assert_eq!((s.sent, s.delivered, s.dropped()), (100, 100, 0));
    }

    #[test]
    fn default_link_has_zero_delay_and_keeps_send_order_on_ties() {
        let t0 = Instant::now();
        let mut link = Link::new(LinkConfig::default(), 0, t0);
        for i in 0..10 {
            link.send(t0, numbered(i, 8));
        }
        for i in 0..10 {
            assert_eq!(link.poll(t0), Some(numbered(i, 8)));
        }
        assert_eq!(link.poll(t0), None);
    }

    #[test]
    fn next_delivery_is_none_when_empty() {
        let t0 = Instant::now();
        let mut link = Link::new(LinkConfig::default().with_delay(MS), 7, t0);
        assert_eq!(link.next_delivery(), None);
        assert_eq!(link.poll(far(t0)), None);
        link.send(t0, vec![1, 2, 3]);
        assert_eq!(link.next_delivery(), Some(t0 + MS));
        assert_eq!(link.in_flight(), 1);
        assert_eq!(link.poll(far(t0)), Some(vec![1, 2, 3]));
        assert_eq!(link.next_delivery(), None);
        assert_eq!(link.in_flight(), 0);
    }

    #[test]
    fn bursty_loss_keeps_its_rate_and_loses_runs_of_its_mean_length() {
        let t0 = Instant::now();
        let n = 200_000u64;
        let mut link = Link::new(
            LinkConfig::default().with_loss(0.02).with_loss_burst(2.0),
            42,
            t0,
        );
        for i in 0..n {
            link.send(t0 + Duration::from_micros(i), numbered(i, 8));
        }
        let arrived: std::collections::HashSet<u64> = drain(&mut link, far(t0))
            .iter()
            .map(|(_, p)| number_of(p))
            .collect();
        // Runs of consecutive lost packets.
        let (mut runs, mut in_run) = (0u64, false);
        for i in 0..n {
            let lost = !arrived.contains(&i);
            runs += u64::from(lost && !in_run);
            in_run = lost;
        }
        let lost = link.stats().dropped_loss;
        let mean_run = lost as f64 / runs as f64;
        // 4,000 expected; runs of 2 on average (independent 2% loss: 1.02).
        assert!((3_600..=4_400).contains(&lost), "{lost}");
        assert!((1.8..=2.2).contains(&mean_run), "{mean_run}");
    }

    #[test]
    fn loss_of_twenty_percent_drops_about_a_fifth() {
        let t0 = Instant::now();
        let n = 100_000;
        let mut link = Link::new(LinkConfig::default().with_loss(0.2), 42, t0);
        for i in 0..n {
            link.send(t0 + Duration::from_micros(i), numbered(i, 8));
        }
        let delivered = drain(&mut link, far(t0)).len() as u64;
        let s = *link.stats();
        // Expected 20_000, standard deviation ~126.
        assert!((19_000..=21_000).contains(&s.dropped_loss), "{s:?}");
        assert_eq!(delivered, s.delivered);
        assert_eq!(s.delivered + s.dropped_loss, n);
        assert_eq!(s.dropped(), s.dropped_loss);
    }

    fn busy_config() -> LinkConfig {
        LinkConfig::default()
            .with_delay(Duration::from_millis(20))
            .with_jitter(Duration::from_millis(3))
            .with_loss(0.05)
            .with_duplicate(0.03)
            .with_reorder(0.02, Duration::from_millis(7))
            .with_corrupt(0.02)
            .with_rate(50_000_000, 30_000)
            .with_mtu(1400)
            .with_blackout(Duration::from_millis(100), Duration::from_millis(120))
    }

    fn run(config: LinkConfig, seed: u64) -> (Vec<(Instant, Vec<u8>)>, LinkStats, Instant) {
        let t0 = Instant::now();
        let mut link = Link::new(config, seed, t0);
        let mut out = Vec::new();
        for i in 0..5_000u64 {
            let now = t0 + Duration::from_micros(50 * i);
            out.extend(drain(&mut link, now));
            link.send(now, numbered(i, 200 + (i as usize * 37) % 1300));
        }
        out.extend(drain(&mut link, far(t0)));
        (out, *link.stats(), t0)
    }

    #[test]
    fn same_seed_gives_identical_sequence() {
        let (a, sa, ta) = run(busy_config(), 99);
        let (b, sb, tb) = run(busy_config(), 99);
        let rel = |v: &[(Instant, Vec<u8>)], t0: Instant| {
            v.iter()
                .map(|(at, p)| (*at - t0, p.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(rel(&a, ta), rel(&b, tb));
        assert_eq!(sa, sb);
        // Every effect actually fired in this run.
        assert!(sa.dropped_loss > 0 && sa.dropped_queue > 0 && sa.dropped_mtu > 0);
        assert!(sa.dropped_blackout > 0 && sa.duplicated > 0 && sa.corrupted > 0);
        assert!(sa.reordered > 0);
        assert_eq!(sa.delivered + sa.dropped(), sa.sent + sa.duplicated);

        let (c, _, tc) = run(busy_config(), 100);
        assert_ne!(rel(&a, ta), rel(&c, tc));
    }

    #[test]
    fn each_effect_has_its_own_random_stream() {
        let lost = |config: LinkConfig| {
            let t0 = Instant::now();
            let mut link = Link::new(config, 5, t0);
            for i in 0..2_000 {
                link.send(t0, numbered(i, 64));
            }
            let got: std::collections::HashSet<u64> = drain(&mut link, far(t0))
                .into_iter()
                .map(|(_, p)| number_of(&p))
                .collect();
            (0..2_000)
                .filter(|i| !got.contains(i))
                .collect::<Vec<u64>>()
        };
        let base = lost(LinkConfig::default().with_loss(0.1));
        let noisy = lost(
            LinkConfig::default()
                .with_loss(0.1)
                .with_duplicate(0.5)
                .with_jitter(MS)
                .with_reorder(0.5, MS),
        );
        assert!(!base.is_empty());
        assert_eq!(base, noisy);
    }

    #[test]
    fn rate_limit_spaces_departures_and_queue_drops_when_overfilled() {
        let t0 = Instant::now();
        let delay = Duration::from_millis(10);
        // 8 Mbit/s: a 1000-byte packet takes exactly 1 ms to serialize.
        let config = LinkConfig::default()
            .with_delay(delay)
            .with_rate(8_000_000, 5_000);
        let mut link = Link::new(config, 3, t0);
        for i in 0..20 {
            link.send(t0, numbered(i, 1000));
        }
        // One packet in service plus 5000 bytes of queue.
        let s = *link.stats();
        assert_eq!(s.dropped_queue, 14);
        let got = drain(&mut link, far(t0));
        let expected: Vec<_> = (0..6u64)
            .map(|i| (t0 + (i as u32 + 1) * MS + delay, numbered(i, 1000)))
            .collect();
        assert_eq!(got, expected);

        // Once drained, the queue accepts again; a sender pacing at exactly the rate never waits,
        // so even a zero-byte queue drops nothing.
        let config = LinkConfig::default().with_rate(8_000_000, 0);
        let mut link = Link::new(config, 3, t0);
        for i in 0..1_000u32 {
            link.send(t0 + i * MS, numbered(i.into(), 1000));
        }
        assert_eq!(link.stats().dropped_queue, 0);
        let got = drain(&mut link, far(t0));
        assert_eq!(got.len(), 1_000);
        for (i, (at, _)) in got.iter().enumerate() {
            assert_eq!(*at, t0 + (i as u32 + 1) * MS);
        }
        // But two at once with a zero-byte queue: the second would have to wait.
        link.send(t0 + 2_000 * MS, vec![0; 1000]);
        link.send(t0 + 2_000 * MS, vec![0; 1000]);
        assert_eq!(link.stats().dropped_queue, 1);
    }

    #[test]
    fn set_rate_applies_to_later_packets_only() {
        let t0 = Instant::now();
        // 8 Mbit/s: 1000 bytes take 1 ms.
        let config = LinkConfig::default().with_rate(8_000_000, 10_000);
        let mut link = Link::new(config, 0, t0);
        link.send(t0, numbered(0, 1000));
        link.send(t0, numbered(1, 1000));
        // Half the rate: the next packet waits for the two admitted ones, then takes 2 ms.
        link.set_rate(Some(4_000_000));
        assert_eq!(link.config().rate_bps, Some(4_000_000));
        link.send(t0, numbered(2, 1000));
        // Unlimited: no serialization time, but still behind everything admitted before.
        link.set_rate(None);
        link.send(t0, numbered(3, 1000));
        link.send(t0 + 10 * MS, numbered(4, 1000));
        // Back to a rate: only the 10 ms packet's own serialization.
        link.set_rate(Some(8_000_000));
        link.send(t0 + 20 * MS, numbered(5, 1000));
        let times: Vec<_> = drain(&mut link, far(t0))
            .into_iter()
            .map(|(at, _)| at - t0)
            .collect();
        assert_eq!(
            times,
            [1, 2, 4, 4, 10, 21].map(|n| n * MS).to_vec(),
            "{:?}",
            link.stats()
        );
        assert_eq!(link.stats().dropped(), 0);
        // Zero drops everything, as configured.
        link.set_rate(Some(0));
        link.send(t0 + 30 * MS, numbered(6, 1000));
        assert_eq!(link.stats().dropped_queue, 1);
    }

    #[test]
    fn queue_refills_as_the_bottleneck_drains() {
        let t0 = Instant::now();
        let config = LinkConfig::default().with_rate(8_000_000, 2_000);
        let mut link = Link::new(config, 0, t0);
        // Offer 2 packets per ms to a 1 packet/ms bottleneck for 100 ms: roughly half get dropped,
        // and the bottleneck stays busy, so departures are back to back.
        for i in 0..200u32 {
            let now = t0 + i * MS / 2;
            link.send(now, numbered(i.into(), 1000));
        }
        let s = *link.stats();
        assert!((95..=105).contains(&s.dropped_queue), "{s:?}");
        let got = drain(&mut link, far(t0));
        assert_eq!(got.len() as u64, 200 - s.dropped_queue);
        for w in got.windows(2) {
            assert_eq!(w[1].0 - w[0].0, MS);
        }
    }

    #[test]
    fn blackout_drops_everything_inside_and_nothing_outside() {
        let t0 = Instant::now();
        let config = LinkConfig::default()
            .with_delay(Duration::from_millis(5))
            .with_blackout(Duration::from_millis(100), Duration::from_millis(200));
        let mut link = Link::new(config, 11, t0);
        for i in 0..300u32 {
            link.send(t0 + i * MS, numbered(i.into(), 50));
        }
        assert_eq!(link.stats().dropped_blackout, 100);
        let got: Vec<u64> = drain(&mut link, far(t0))
            .into_iter()
            .map(|(_, p)| number_of(&p))
            .collect();
        let expected: Vec<u64> = (0..100).chain(200..300).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn mtu_drops_oversized_packets() {
        let t0 = Instant::now();
        let mut link = Link::new(LinkConfig::default().with_mtu(1200), 0, t0);
        link.send(t0, vec![1; 1200]);
        link.send(t0, vec![2; 1201]);
        link.send(t0, vec![3; 10]);
        assert_eq!(link.stats().dropped_mtu, 1);
        let got: Vec<_> = drain(&mut link, t0).into_iter().map(|(_, p)| p).collect();
        assert_eq!(got, vec![vec![1; 1200], vec![3; 10]]);
    }

    #[test]
    fn duplication_and_corruption_are_counted() {
        let t0 = Instant::now();
        let n = 50_000u64;
        let config = LinkConfig::default().with_duplicate(0.1).with_corrupt(0.1);
        let mut link = Link::new(config, 8, t0);
        for i in 0..n {
            link.send(t0, tagged(i, 8));
        }
        let got = drain(&mut link, t0);
        let s = *link.stats();
        assert!((4_500..=5_500).contains(&s.duplicated), "{s:?}");
        // Corruption is decided per copy.
        let copies = n + s.duplicated;
        assert!(
            (copies / 10 - 600..=copies / 10 + 600).contains(&s.corrupted),
            "{s:?}"
        );
        assert_eq!(got.len() as u64, copies);
        assert_eq!(s.delivered, copies);

        // What actually arrived: every copy is its original or one bit away from it.
        let mut flipped = 0;
        let mut seen = vec![0u32; n as usize];
        for (_, p) in &got {
            let i = origin_of(p);
            let d = hamming(p, &tagged(i, 8));
            assert!(d <= 1);
            flipped += u64::from(d);
            seen[i as usize] += 1;
        }
        assert_eq!(flipped, s.corrupted);
        assert!(seen.iter().all(|&c| c == 1 || c == 2));
        assert_eq!(
            seen.iter().filter(|&&c| c == 2).count() as u64,
            s.duplicated
        );

        // Duplicate with probability 1: every packet twice, back to back.
        let mut link = Link::new(LinkConfig::default().with_duplicate(1.0), 8, t0);
        link.send(t0, vec![1]);
        link.send(t0, vec![2]);
        let got: Vec<_> = drain(&mut link, t0).into_iter().map(|(_, p)| p).collect();
        assert_eq!(got, vec![vec![1], vec![1], vec![2], vec![2]]);

        // Empty packets are never corrupted.
        let mut link = Link::new(LinkConfig::default().with_corrupt(1.0), 8, t0);
        link.send(t0, Vec::new());
        assert_eq!(link.poll(t0), Some(Vec::new()));
        assert_eq!(link.stats().corrupted, 0);
    }

    /// The index of a [`tagged`] payload with at most one bit flipped (majority of three).
    fn origin_of(p: &[u8]) -> u64 {
        let word = |k: usize| u64::from_le_bytes(p[8 * k..8 * k + 8].try_into().unwrap());
        if word(0) == word(1) || word(0) == word(2) {
            word(0)
        } else {
            word(1)
        }
    }

    fn hamming(a: &[u8], b: &[u8]) -> u32 {
        a.iter().zip(b).map(|(x, y)| (x ^ y).count_ones()).sum()
    }

    #[test]
    fn jitter_reorders_within_bounds() {
        let t0 = Instant::now();
        let delay = Duration::from_millis(10);
        let jitter = Duration::from_millis(5);
        let config = LinkConfig::default().with_delay(delay).with_jitter(jitter);
        let mut link = Link::new(config, 17, t0);
        let n = 1_000u32;
        for i in 0..n {
            link.send(t0 + i * Duration::from_micros(100), numbered(i.into(), 16));
        }
        let got = drain(&mut link, far(t0));
        assert_eq!(got.len(), n as usize);
        let order: Vec<u64> = got.iter().map(|(_, p)| number_of(p)).collect();
        let inversions = order.windows(2).filter(|w| w[0] > w[1]).count();
        assert!(inversions > 100, "{inversions}");
        for (at, p) in &got {
            let i = number_of(p) as u32;
            let sent = t0 + i * Duration::from_micros(100);
            let extra = *at - sent - delay;
            assert!(extra < jitter, "{extra:?}");
        }
        // Delivery times come out nondecreasing.
        assert!(got.windows(2).all(|w| w[0].0 <= w[1].0));
    }

    #[test]
    fn ordered_jitter_keeps_order_and_lifts_the_mean_delay_with_the_rate() {
        let t0 = Instant::now();
        let delay = Duration::from_millis(10);
        let jitter = Duration::from_millis(8);
        // The mean extra delay of `n` packets sent `gap` apart.
        let mean_extra = |gap: Duration, n: u32| {
            let config = LinkConfig::default()
                .with_delay(delay)
                .with_ordered_jitter(jitter);
            let mut link = Link::new(config, 17, t0);
            for i in 0..n {
                link.send(t0 + i * gap, numbered(i.into(), 16));
            }
            let got = drain(&mut link, far(t0));
            assert_eq!(got.len(), n as usize);
            let order: Vec<u64> = got.iter().map(|(_, p)| number_of(p)).collect();
            assert!(order.windows(2).all(|w| w[0] < w[1]), "in order");
            let extra: Duration = got
                .iter()
                .map(|(at, p)| {
                    let i = number_of(p) as u32;
                    let extra = *at - (t0 + i * gap) - delay;
                    assert!(extra < jitter, "{extra:?}");
                    extra
                })
                .sum();
            extra / n
        };
        // Sparse packets get about half the bound on average; dense ones wait for the latest
        // before them, nearly the whole bound.
        let sparse = mean_extra(Duration::from_millis(20), 1000);
        let dense = mean_extra(Duration::from_micros(20), 10_000);
        assert!(sparse < Duration::from_millis(5), "{sparse:?}");
        assert!(dense > Duration::from_millis(7), "{dense:?}");
    }

    #[test]
    fn reorder_holds_packets_back() {
        let t0 = Instant::now();
        let config = LinkConfig::default()
            .with_delay(MS)
            .with_reorder(0.1, Duration::from_millis(3));
        let mut link = Link::new(config, 23, t0);
        for i in 0..10_000u32 {
            link.send(t0 + i * MS, numbered(i.into(), 16));
        }
        let got = drain(&mut link, far(t0));
        let s = *link.stats();
        assert!((900..=1_100).contains(&s.reordered), "{s:?}");
        let late = got
            .iter()
            .filter(|(at, p)| {
                let i = number_of(p) as u32;
                *at - (t0 + i * MS) == Duration::from_millis(4)
            })
            .count() as u64;
        assert_eq!(late, s.reordered);
        let order: Vec<u64> = got.iter().map(|(_, p)| number_of(p)).collect();
        assert!(order.windows(2).any(|w| w[0] > w[1]));
    }

    #[test]
    fn send_times_going_backwards_are_clamped() {
        let t0 = Instant::now();
        let mut link = Link::new(LinkConfig::default().with_delay(MS), 0, t0);
        link.send(t0 + 10 * MS, vec![1]);
        link.send(t0 + 5 * MS, vec![2]);
        assert_eq!(
            drain(&mut link, far(t0)),
            vec![(t0 + 11 * MS, vec![1]), (t0 + 11 * MS, vec![2])]
        );
    }

    #[test]
    fn duplex_directions_are_independent() {
        let t0 = Instant::now();
        let config = LinkConfig::default().with_loss(0.5).with_delay(MS);
        let mut d = Duplex::symmetric(config, 1234, t0);
        assert_eq!(d.next_delivery(), None);
        for i in 0..200 {
            d.a_to_b.send(t0, numbered(i, 8));
            d.b_to_a.send(t0 + MS, numbered(i, 8));
        }
        assert_eq!(d.next_delivery(), Some(t0 + MS));
        let ab = drain(&mut d.a_to_b, far(t0));
        assert_eq!(d.next_delivery(), Some(t0 + 2 * MS));
        let ba = drain(&mut d.b_to_a, far(t0));
        let ids = |v: Vec<(Instant, Vec<u8>)>| v.into_iter().map(|(_, p)| p).collect::<Vec<_>>();
        assert_ne!(ids(ab), ids(ba));
        assert_eq!(d.next_delivery(), None);
    }

    /// Payload for packet `i` with `pad` extra bytes: the index three times, so two different
    /// packets differ in at least 3 bits and a one-bit corruption still identifies its original.
    fn tagged(i: u64, pad: usize) -> Vec<u8> {
        let mut p = Vec::with_capacity(24 + pad);
        for _ in 0..3 {
            p.extend_from_slice(&i.to_le_bytes());
        }
        p.resize(24 + pad, 0x5A);
        p
    }

    fn arb_config() -> impl Strategy<Value = LinkConfig> {
        let prob = || 0.0..=1.0f64;
        (
            (0u64..50_000, 0u64..20_000, 0u64..50_000),
            (prob(), prob(), prob(), prob()),
            (
                proptest::option::of(1_000u64..100_000_000),
                0usize..20_000,
                proptest::option::of(0usize..1_700),
            ),
            proptest::collection::vec((0u64..2_000, 0u64..500), 0..3),
            0.0..8.0f64,
        )
            .prop_map(
                |(
                    (delay, jitter, reorder_delay),
                    (loss, duplicate, reorder, corrupt),
                    rate,
                    bl,
                    loss_burst,
                )| {
                    let us = Duration::from_micros;
                    LinkConfig {
                        delay: us(delay),
                        jitter: us(jitter),
                        jitter_in_order: false,
                        loss,
                        loss_burst,
                        duplicate,
                        reorder,
                        reorder_delay: us(reorder_delay),
                        corrupt,
                        rate_bps: rate.0,
                        queue_bytes: rate.1,
                        mtu: rate.2,
                        blackouts: bl
                            .into_iter()
                            .map(|(s, len)| {
                                (Duration::from_millis(s), Duration::from_millis(s + len))
                            })
                            .collect(),
                    }
                },
            )
    }

    /// Polls everything due at `now`, checking nothing due is left behind.
    fn poll_all(
        link: &mut Link,
        now: Instant,
        got: &mut Vec<(Instant, Vec<u8>)>,
    ) -> Result<(), TestCaseError> {
        while let Some(p) = link.poll(now) {
            got.push((now, p));
        }
        if let Some(next) = link.next_delivery() {
            prop_assert!(next > now);
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn delivered_packets_were_sent_and_counts_balance(
            config in arb_config(),
            seed in any::<u64>(),
            sends in proptest::collection::vec((0u64..5_000, 0usize..1_600, any::<bool>()), 0..300),
        ) {
            let t0 = Instant::now();
            let delay = config.delay;
            let mut link = Link::new(config, seed, t0);
            let mut sent = Vec::new();
            let mut got = Vec::new();
            let mut now = t0;
            for (i, &(gap_us, pad, poll)) in sends.iter().enumerate() {
                now += Duration::from_micros(gap_us);
                if poll {
                    poll_all(&mut link, now, &mut got)?;
                }
                let p = tagged(i as u64, pad);
                sent.push((now, p.clone()));
                link.send(now, p);
            }
            poll_all(&mut link, far(t0), &mut got)?;
            prop_assert_eq!(link.in_flight(), 0);

            let s = *link.stats();
            prop_assert_eq!(s.sent, sent.len() as u64);
            prop_assert_eq!(s.delivered, got.len() as u64);
            prop_assert_eq!(s.delivered + s.dropped(), s.sent + s.duplicated);
            prop_assert!(s.corrupted <= s.delivered);

            let mut times = vec![0u32; sent.len()];
            for (polled_at, p) in &got {
                let origin = sent
                    .iter()
                    .position(|(_, q)| q.len() == p.len() && hamming(p, q) <= 1);
                prop_assert!(origin.is_some(), "delivered packet matches no sent packet");
                let origin = origin.unwrap();
                times[origin] += 1;
                prop_assert!(*polled_at >= sent[origin].0 + delay);
            }
            prop_assert!(times.iter().all(|&t| t <= 2));
            let twice = times.iter().filter(|&&t| t == 2).count() as u64;
            prop_assert!(twice <= s.duplicated);
        }
    }
}
