//! The bottleneck's rate from the spacing of back-to-back datagrams (packet-train dispersion),
//! measured by the receiver.
//!
//! A sender's channel thread puts a millisecond or so of data on the wire at each wake-up, in
//! sends of several datagrams each, so consecutive datagrams of a channel often leave much
//! closer together than the bottleneck can carry them. Past the bottleneck they are as far
//! apart as it took to carry each: a datagram's size over its arrival gap behind the one
//! before is the bottleneck's rate, whatever the transfer's average rate. So the receiver
//! learns the path's rate long before startup reaches it, and startup can slow its growth
//! there ([`super::model`]) instead of passing it twofold and learning so a round trip later,
//! with a queue of a round trip's surplus (more than intercontinental's 4 MiB queue holds).
//!
//! [`TrainMeter`] (one per [`crate::Admission`], fed every counted datagram with its arrival
//! time and the sender's `sent_us`) joins consecutive datagrams of a channel (consecutive
//! packet numbers) into a **train** while each left the sender less than half its arrival gap
//! after the one before: it queued behind it at the bottleneck.
//!
//! A train is timed **buffer to buffer**. Datagrams with one arrival time came in one buffer
//! (a GRO buffer: a NIC or an emulator that hands over what arrived since it last did, in one
//! lump, stamped once), and a buffer's bytes arrived over the gap since the buffer before it.
//! Without GRO every datagram is a buffer of its own. The first buffer's bytes arrived before
//! the train's first time, and the last buffer may hold only part of what arrived over its gap
//! (the train ended in it), so both are left out: a train of buffers `1..=k` gives the bytes of
//! buffers `2..k` over the time from buffer 1 to buffer `k - 1`. With at least [`MIN_PAIRS`]
//! such counted buffers over at least [`MIN_SPAN`] it gives one estimate. A report carries the
//! median of its interval's estimates ([`median_kbps`]), given at least [`MIN_TRAINS`].
//!
//! Behind GRO a train must span several buffers to be timed: the sender makes its trains long
//! while startup lasts ([`crate::rate::RateController::train_bytes`]: a sixteenth of the round
//! trip at the channel's rate, up to 64 KiB, which is ten 100 µs buffers at 500 Mbit/s and
//! five at 1 Gbit/s; on a short path, where that share is too short to time, they double with
//! each report that carried no estimate, to half the round trip at most).
//!
//! What makes an estimate wrong:
//! - another flow's or another channel's datagrams between a train's at the bottleneck stretch
//!   it: too low;
//! - a receiver, NIC or emulator that delivers in lumps but stamps each datagram apart
//!   (interrupt coalescing without GRO, an emulator thread that ran late) squeezes it: too
//!   high. (Lumps stamped once are timed right, above; a train inside one has no span: no
//!   estimate.);
//! - a sender that puts datagrams out slower than the bottleneck takes them: such pairs do not
//!   join (their sent gap is not under half the arrival gap).
//!
//! The median copes with a minority of either; the model uses the estimate only to slow
//! startup's growth near it, not to stop it, so a wrong estimate costs a little time or a
//! little queue, never the transfer's rate.

use std::time::{Duration, Instant};

/// Buffers a train needs to give an estimate, besides its first and its last (without GRO,
/// datagrams: a train of four, as before GRO buffers were timed, when it took three gaps
/// including the last). Behind GRO each counted buffer holds exactly what arrived over its gap,
/// so two give the rate to within the jitter of the buffers' stamps: with three, startup's
/// trains (58 KB a channel at first on wan-1g) at 1 Gbit/s, four or five 100 µs buffers, gave
/// no estimate until they were 64 KiB and the link nearly full.
pub const MIN_PAIRS: u32 = 2;
/// The shortest arrival span a train is timed over (a few microseconds are the kernel's
/// noise).
pub const MIN_SPAN: Duration = Duration::from_micros(10);
/// Estimates a report needs for its median to be reported.
pub const MIN_TRAINS: usize = 5;
/// Reports an interval's estimates are carried over to while there are fewer than
/// [`MIN_TRAINS`] ([`TrainPool`]).
pub const MAX_CARRIED: u32 = 3;
/// Most estimates kept per interval (the rest are dropped: a median of this many is plenty).
pub const MAX_TRAINS: usize = 4096;

/// The last datagram counted on a channel.
#[derive(Debug, Clone, Copy)]
struct Last {
    packet: u64,
    sent_us: u32,
    at: Instant,
}

/// The train a channel's datagrams are building.
#[derive(Debug, Clone, Copy, Default)]
struct Train {
    /// Buffers counted (each after the first, and shown whole by a later one).
    pairs: u32,
    /// Their bytes.
    bytes: u64,
    /// Their gaps: the time from the train's first buffer to the last one counted.
    span: Duration,
    /// The latest buffer, unless it is the train's first: counted once a later buffer of the
    /// train shows it was whole.
    open: Option<Open>,
    /// When the train's first datagram left the sender (its `sent_us`).
    first_sent: u32,
    /// When the last datagram of the buffers counted left the sender.
    counted_sent: u32,
}

/// A train's latest buffer (see [`Train::open`]).
#[derive(Debug, Clone, Copy)]
struct Open {
    bytes: u64,
    /// The gap that brought it.
    gap: Duration,
    /// When its last datagram so far left the sender.
    last_sent: u32,
}

/// How a datagram stands to the one its channel counted before it.
enum Joins {
    /// In the same buffer (one arrival time).
    SameBuffer,
    /// The first of a buffer that queued behind the one before at the bottleneck, this long
    /// after it.
    NextBuffer(Duration),
    /// Not part of the train (the first datagram, a gap in packet numbers, sent too late).
    No,
}

/// Per channel of an admission, the trains its datagrams form, and the estimates of the trains
/// that ended since the driver last took them (see the module docs).
#[derive(Debug, Clone)]
pub struct TrainMeter {
    last: Vec<Option<Last>>,
    trains: Vec<Train>,
    /// Finished trains' rates, kbit/s of datagram bytes (headers included).
    rates: Vec<u32>,
}

impl TrainMeter {
    /// A meter for `channels` channels (indexed from 0).
    pub fn new(channels: usize) -> TrainMeter {
        TrainMeter {
            last: vec![None; channels],
            trains: vec![Train::default(); channels],
            rates: Vec::new(),
        }
    }

    /// Counts datagram `packet` of channel `index`, `size` bytes, stamped `sent_us` by the
    /// sender, that arrived at `at`.
    pub fn on_datagram(&mut self, index: usize, packet: u64, sent_us: u32, at: Instant, size: u64) {
        let Some(slot) = self.last.get_mut(index) else {
            return;
        };
        let before = slot.replace(Last {
            packet,
            sent_us,
            at,
        });
        let joins = before.map_or(Joins::No, |b| {
            // Sent after the one before (the clock wraps: a "gap" past half its range is a
            // datagram sent earlier).
            let sent_gap = sent_us.wrapping_sub(b.sent_us);
            if packet != b.packet.wrapping_add(1) || sent_gap >= 1 << 31 {
                return Joins::No;
            }
            match at.checked_duration_since(b.at) {
                Some(gap) if gap.is_zero() => Joins::SameBuffer,
                Some(gap) if u128::from(sent_gap) * 2 < gap.as_micros() => Joins::NextBuffer(gap),
                _ => Joins::No,
            }
        });
        let t = &mut self.trains[index];
        match joins {
            Joins::SameBuffer => {
                // (In the train's first buffer: arrived before the train's first time.)
                if let Some(open) = &mut t.open {
                    open.bytes = open.bytes.saturating_add(size);
                    open.last_sent = sent_us;
                }
            }
            Joins::NextBuffer(gap) => {
                if let Some(open) = t.open.take() {
                    t.pairs += 1;
                    t.bytes = t.bytes.saturating_add(open.bytes);
                    t.span += open.gap;
                    t.counted_sent = open.last_sent;
                }
                t.open = Some(Open {
                    bytes: size,
                    gap,
                    last_sent: sent_us,
                });
            }
            Joins::No => {
                self.finish(index);
                self.trains[index].first_sent = sent_us;
            }
        }
    }

    /// Ends channel `index`'s train: an estimate if it was long enough (its open buffer is
    /// left out: the train may have ended inside it).
    fn finish(&mut self, index: usize) {
        let t = std::mem::take(&mut self.trains[index]);
        // Its datagrams left closer together than they arrived: they queued. (Pair by pair
        // that is judged only within a buffer's gap, which behind GRO is the buffers' spacing,
        // not the datagrams': a sender pacing single datagrams faster than the receiver takes
        // buffers would pass it.)
        let sent_span = t.counted_sent.wrapping_sub(t.first_sent);
        let queued = u128::from(sent_span) * 2 < t.span.as_micros();
        if t.pairs < MIN_PAIRS || t.span < MIN_SPAN || !queued || self.rates.len() >= MAX_TRAINS {
            return;
        }
        let kbps = t.bytes as f64 * 8.0 / t.span.as_secs_f64() / 1000.0;
        self.rates.push(kbps.min(f64::from(u32::MAX)) as u32);
    }

    /// Drops the estimates of the trains that ended.
    pub fn forget(&mut self) {
        self.rates.clear();
    }

    /// Moves the estimates of the trains that ended into `out` (up to [`MAX_TRAINS`] in all).
    pub fn drain_into(&mut self, out: &mut Vec<u32>) {
        let room = MAX_TRAINS.saturating_sub(out.len());
        out.extend(self.rates.drain(..).take(room));
    }
}

/// The train estimates gathered for the receiver's next report.
///
/// A report gives their median once there are [`MIN_TRAINS`]; fewer are carried over to the
/// next report, for [`MAX_CARRIED`] reports at most, and dropped after. On a short path a
/// report interval holds only a few of startup's trains, which must be long to be timed behind
/// GRO ([`crate::rate::RateController::train_bytes`]): on a 40 ms path at 100 Mbit/s, two
/// channels' 64 KiB trains are two or three per 10 ms report, and a report of its own would
/// never carry an estimate.
#[derive(Debug, Default)]
pub struct TrainPool {
    rates: Vec<u32>,
    /// Reports the estimates in `rates` were carried over to so far.
    carried: u32,
}

impl TrainPool {
    /// Where a channel adds the estimates of its trains that ended (see
    /// [`crate::admit::Admission::take_train_rates`]).
    pub fn rates_mut(&mut self) -> &mut Vec<u32> {
        &mut self.rates
    }

    /// For a report: the median of the estimates gathered (kbit/s), or 0 while there are too
    /// few (carried over, see [`TrainPool`]).
    pub fn take_kbps(&mut self) -> u64 {
        if let Some(kbps) = median_kbps(&mut self.rates) {
            self.rates.clear();
            self.carried = 0;
            return kbps;
        }
        self.carried += 1;
        if self.carried > MAX_CARRIED {
            self.rates.clear();
            self.carried = 0;
        }
        0
    }
}

/// The median of an interval's train estimates (kbit/s), if there are at least
/// [`MIN_TRAINS`]; reorders `rates`.
pub fn median_kbps(rates: &mut [u32]) -> Option<u64> {
    if rates.len() < MIN_TRAINS {
        return None;
    }
    let mid = rates.len() / 2;
    let (_, m, _) = rates.select_nth_unstable(mid);
    Some(u64::from(*m))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SIZE: u64 = 1428;

    /// A sender that puts `per_burst` datagrams on the wire at once every `every`, through a
    /// bottleneck of `bps` that was idle before each burst: returns the meter's estimates.
    fn bursts(bps: f64, per_burst: u64, every: Duration, count: u64) -> Vec<u32> {
        let t0 = Instant::now();
        let mut m = TrainMeter::new(1);
        let per = Duration::from_secs_f64(SIZE as f64 * 8.0 / bps);
        let mut packet = 1;
        for b in 0..count {
            let sent = every * b as u32;
            for i in 0..per_burst {
                let at = t0 + sent + per * (i as u32 + 1) + Duration::from_millis(75);
                m.on_datagram(0, packet, sent.as_micros() as u32, at, SIZE);
                packet += 1;
            }
        }
        // A datagram sent later ends the last train.
        m.on_datagram(0, packet, u32::MAX / 4, t0 + Duration::from_secs(100), SIZE);
        let mut out = Vec::new();
        m.drain_into(&mut out);
        out
    }

    #[test]
    fn bursts_through_a_bottleneck_measure_its_rate_not_the_senders() {
        // 6 datagrams per millisecond is 69 Mbit/s on average; the bottleneck is 500.
        let mut rates = bursts(500e6, 6, Duration::from_millis(1), 20);
        assert_eq!(rates.len(), 20);
        let median = median_kbps(&mut rates).unwrap() as f64 * 1000.0;
        assert!((median / 500e6 - 1.0).abs() < 0.01, "{median}");
    }

    #[test]
    fn short_trains_and_datagrams_with_one_arrival_time_give_nothing() {
        // Three datagrams a burst count one buffer between the first and the last: fewer
        // than MIN_PAIRS.
        assert!(bursts(500e6, 3, Duration::from_millis(1), 20).is_empty());
        // One GRO buffer: every datagram of a burst with the same arrival time.
        let t0 = Instant::now();
        let mut m = TrainMeter::new(1);
        for p in 1..=40u64 {
            let burst = (p - 1) / 8;
            let at = t0 + Duration::from_millis(burst);
            m.on_datagram(0, p, (burst * 1000) as u32, at, SIZE);
        }
        let mut out = Vec::new();
        m.drain_into(&mut out);
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(median_kbps(&mut out), None);
    }

    /// Like [`bursts`], to a receiver that is handed what arrived since its last wake-up as
    /// one buffer stamped at the wake-up (GRO behind a NIC or an emulator that coalesces), its
    /// wake-ups `lump` apart plus up to `late` more (a pseudo-random lateness): the estimates.
    fn lumped(
        bps: f64,
        per_burst: u64,
        every: Duration,
        count: u64,
        lump: Duration,
        late: Duration,
    ) -> Vec<u32> {
        let t0 = Instant::now();
        let per = SIZE as f64 * 8.0 / bps;
        // Arrival times (seconds after t0) of every datagram, in order.
        let mut arrivals = Vec::new();
        for b in 0..count {
            let sent = every.as_secs_f64() * b as f64;
            for i in 0..per_burst {
                arrivals.push((sent, sent + per * (i + 1) as f64));
            }
        }
        let mut m = TrainMeter::new(1);
        let mut wake = 0.0;
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = 0;
        let end = arrivals.last().map_or(0.0, |a| a.1) + 1e-3;
        while wake < end {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let lateness = late.as_secs_f64() * (x % 1000) as f64 / 1000.0;
            wake += lump.as_secs_f64() + lateness;
            while next < arrivals.len() && arrivals[next].1 <= wake {
                let sent_us = (arrivals[next].0 * 1e6) as u32;
                let at = t0 + Duration::from_secs_f64(wake);
                m.on_datagram(0, next as u64 + 1, sent_us, at, SIZE);
                next += 1;
            }
        }
        m.on_datagram(
            0,
            next as u64 + 1,
            u32::MAX / 4,
            t0 + Duration::from_secs(100),
            SIZE,
        );
        let mut out = Vec::new();
        m.drain_into(&mut out);
        out
    }

    #[test]
    fn trains_over_several_gro_buffers_are_timed_buffer_to_buffer() {
        let us = Duration::from_micros;
        // Startup's 64 KiB trains (45 datagrams) every 2 ms, wake-ups every 100-170 us (what
        // linkem's GSO writes with a slack of 100 us look like to the receiver).
        for bps in [100e6, 500e6, 1e9] {
            // (Each train well apart from the next at the bottleneck: three times its length.)
            let every = Duration::from_secs_f64(3.0 * 45.0 * SIZE as f64 * 8.0 / bps);
            let mut out = lumped(bps, 45, every, 40, us(100), us(70));
            // (At 1 Gbit/s a train spans 3-5 buffers: a few are too short.)
            assert!(out.len() >= 30 && out.len() <= 40, "{bps}: {out:?}");
            let median = median_kbps(&mut out).unwrap() as f64 * 1000.0;
            assert!((median / bps - 1.0).abs() < 0.1, "{bps}: {median}");
        }
        // Without leaving out the last buffer (which the train ended in) these were too low;
        // without the first (which arrived before the train's first time), too high. Short
        // trains that span fewer than four buffers give nothing.
        assert!(lumped(1e9, 20, Duration::from_millis(2), 40, us(100), us(0)).is_empty());
    }

    #[test]
    fn a_paced_sender_below_the_bottleneck_is_no_train() {
        // Datagrams that left as far apart as they arrived did not queue: no estimate.
        let t0 = Instant::now();
        let mut m = TrainMeter::new(1);
        for p in 1..=100u64 {
            let sent = Duration::from_micros(100 * p);
            m.on_datagram(0, p, sent.as_micros() as u32, t0 + sent, SIZE);
        }
        let mut out = Vec::new();
        m.drain_into(&mut out);
        assert!(out.is_empty(), "{out:?}");
        // Nor behind GRO: a datagram every 100 us, handed over in buffers every 250 us.
        assert!(lumped(
            500e6,
            1,
            Duration::from_micros(100),
            200,
            Duration::from_micros(250),
            Duration::ZERO
        )
        .is_empty());
    }

    #[test]
    fn a_loss_or_another_channel_breaks_a_train_and_the_median_ignores_outliers() {
        let t0 = Instant::now();
        let mut m = TrainMeter::new(2);
        let per = Duration::from_micros(23);
        let mut packet = [1u64, 1];
        for b in 0..10u32 {
            for ch in 0..2 {
                let sent = Duration::from_millis(u64::from(b)) + Duration::from_micros(500) * ch;
                for i in 0..6u32 {
                    // Channel 1's third burst lost its third datagram: trains of 1 and 2
                    // pairs, no estimate.
                    if ch == 1 && b == 2 && i == 2 {
                        packet[1] += 1;
                        continue;
                    }
                    // Channel 0's fifth burst arrived in a lump (an emulator that ran late, and
                    // stamped each datagram apart).
                    let gap = if ch == 0 && b == 4 { per / 4 } else { per };
                    let at = t0 + sent + gap * (i + 1);
                    m.on_datagram(
                        ch as usize,
                        packet[ch as usize],
                        sent.as_micros() as u32,
                        at,
                        SIZE,
                    );
                    packet[ch as usize] += 1;
                }
            }
        }
        let mut out = Vec::new();
        m.drain_into(&mut out);
        // Each channel's last train is still open, and channel 1's third gave none.
        assert_eq!(out.len(), 9 + 8);
        let expect = SIZE as f64 * 8.0 / per.as_secs_f64() / 1000.0;
        assert!(
            out.iter().any(|&r| f64::from(r) > expect * 3.0),
            "the lump: {out:?}"
        );
        let median = median_kbps(&mut out).unwrap() as f64;
        assert!(
            (median / expect - 1.0).abs() < 0.01,
            "{median} against {expect}"
        );
    }

    #[test]
    fn a_pool_carries_too_few_estimates_over_to_the_next_reports_and_drops_them_after() {
        let mut pool = TrainPool::default();
        // Two trains a report: the third report has five, and gives their median.
        pool.rates_mut().extend([900_000, 1_000_000]);
        assert_eq!(pool.take_kbps(), 0);
        pool.rates_mut().extend([1_010_000, 990_000]);
        assert_eq!(pool.take_kbps(), 0);
        pool.rates_mut().extend([1_020_000, 980_000]);
        assert_eq!(pool.take_kbps(), 1_000_000);
        // The next starts empty; one train a report is dropped after MAX_CARRIED carries.
        for _ in 0..=MAX_CARRIED {
            pool.rates_mut().push(500_000);
            assert_eq!(pool.take_kbps(), 0);
        }
        assert!(pool.rates_mut().is_empty());
        pool.rates_mut().extend([700_000; MIN_TRAINS]);
        assert_eq!(pool.take_kbps(), 700_000);
    }

    proptest! {
        /// Whatever arrives, the meter keeps no more than it may and every estimate is a rate
        /// some train's bytes and span give.
        #[test]
        fn any_arrivals_give_bounded_finite_estimates(
            dgs in proptest::collection::vec((0usize..3, 0u64..50, any::<u32>(), 0u64..5_000_000, 0u64..70_000), 0..400)
        ) {
            let t0 = Instant::now();
            let mut m = TrainMeter::new(2);
            for (ch, packet, sent_us, at_ns, size) in dgs {
                m.on_datagram(ch, packet, sent_us, t0 + Duration::from_nanos(at_ns), size);
            }
            let mut out = Vec::new();
            m.drain_into(&mut out);
            prop_assert!(out.len() <= MAX_TRAINS);
            let _ = median_kbps(&mut out);
        }
    }
}
