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
//! after the one before: it queued behind it at the bottleneck. A train of at least
//! [`MIN_PAIRS`] such pairs arriving over at least [`MIN_SPAN`] gives one estimate, its bytes
//! after the first over its arrival span. A report carries the median of its interval's
//! estimates ([`median_kbps`]), given at least [`MIN_TRAINS`].
//!
//! What makes an estimate wrong:
//! - another flow's or another channel's datagrams between a train's at the bottleneck stretch
//!   it: too low;
//! - a receiver, NIC or emulator that delivers in lumps (interrupt coalescing, an emulator
//!   thread that ran late) squeezes it: too high. Datagrams with one arrival time (one GRO
//!   buffer) have no gap, and a train of only those no span: no estimate;
//! - a sender that puts datagrams out slower than the bottleneck takes them: such pairs do not
//!   join (their sent gap is not under half the arrival gap).
//!
//! The median copes with a minority of either; the model uses the estimate only to slow
//! startup's growth near it, not to stop it, so a wrong estimate costs a little time or a
//! little queue, never the transfer's rate.

use std::time::{Duration, Instant};

/// Pairs of back-to-back datagrams a train needs to give an estimate.
pub const MIN_PAIRS: u32 = 3;
/// The shortest arrival span a train is timed over (a few microseconds are the kernel's
/// noise).
pub const MIN_SPAN: Duration = Duration::from_micros(10);
/// Estimates a report interval needs for its median to be reported.
pub const MIN_TRAINS: usize = 5;
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
    pairs: u32,
    bytes: u64,
    span: Duration,
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
        let queued_behind = before.and_then(|b| {
            if packet != b.packet.wrapping_add(1) {
                return None;
            }
            let gap = at.checked_duration_since(b.at)?;
            // Sent after the one before (the clock wraps: a "gap" past half its range is a
            // datagram sent earlier).
            let sent_gap = sent_us.wrapping_sub(b.sent_us);
            let queued = sent_gap < 1 << 31 && u128::from(sent_gap) * 2 < gap.as_micros();
            queued.then_some(gap)
        });
        match queued_behind {
            Some(gap) => {
                let t = &mut self.trains[index];
                t.pairs += 1;
                t.bytes = t.bytes.saturating_add(size);
                t.span += gap;
            }
            None => self.finish(index),
        }
    }

    /// Ends channel `index`'s train: an estimate if it was long enough.
    fn finish(&mut self, index: usize) {
        let t = std::mem::take(&mut self.trains[index]);
        if t.pairs < MIN_PAIRS || t.span < MIN_SPAN || self.rates.len() >= MAX_TRAINS {
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
        // Three datagrams a burst are two pairs: fewer than MIN_PAIRS.
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
                    // Channel 0's fifth burst arrived in a lump (an emulator that ran late).
                    let gap = if ch == 0 && b == 4 { per / 10 } else { per };
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
            out.iter().any(|&r| f64::from(r) > expect * 5.0),
            "the lump: {out:?}"
        );
        let median = median_kbps(&mut out).unwrap() as f64;
        assert!(
            (median / expect - 1.0).abs() < 0.01,
            "{median} against {expect}"
        );
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
