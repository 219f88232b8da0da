//! The receiving side of one data channel: what arrived, what is missing, when to ask again.
//!
//! A [`ChannelReceiver`] keeps the received stripe ranges of its channel. New data arrives in
//! stripe order, so everything below the *frontier* (the furthest new byte seen) that is still
//! missing was lost or reordered. A gap is only reported once the frontier passed it more than
//! `reorder_wait` ago, so ordinary reordering costs nothing. Reported ranges are remembered and
//! reported again after `nack_retry` if they are still missing (the repair itself may be lost),
//! plus one and a half times the queueing delay the channel's datagrams recently met
//! ([`ChannelReceiver::note_queue_delay`]): a repair joins the back of the same queue, so behind
//! a full socket buffer it takes that much longer, and asking again sooner only duplicates it.
//! `nack_retry` starts from the key agreement's round trip and falls to the path's once the
//! first repair of a first ask shows it ([`ChannelReceiver::timing_repairs`]).
//! The channel's final marker moves the frontier to the end of the stripe, which catches tail
//! loss; the sender repeats the marker until the receiver answers `ChannelDone`. A NACK holds
//! no more ranges than fit one feedback datagram ([`crate::feedback::NACK_RANGES_BUDGET`]); the
//! rest follow in the next poll.
//!
//! Call order per driver turn: `on_data` / `on_final` for each datagram; `reject` when a block
//! failed verification; then `poll_nack(now)` and `poll_done()`; sleep until `next_timeout`.
//!
//! A resumed transfer marks the blocks the receiver already holds with [`ChannelReceiver::hold`]
//! before anything arrives: they count as received, so they are never asked for, unless
//! verification later `reject`s one. A rejected block is asked for at once, whatever the
//! frontier: it is missing for certain, and a held block may be rejected before any data or
//! final marker has moved the frontier past it.

use crate::ranges::RangeSet;
use crate::rate::rtt::PathRtt;
use std::collections::VecDeque;
use std::ops::Range;
use std::time::{Duration, Instant};

/// Tunables of a channel receiver.
#[derive(Debug, Clone)]
pub struct RecvConfig {
    /// How long a gap below the frontier may be a mere reordering before it is reported.
    pub reorder_wait: Duration,
    /// How long to wait for a repair before asking for it again.
    pub nack_retry: Duration,
    /// Most ranges in one NACK message; the rest follow in the next. (Fewer where they would
    /// not fit one feedback datagram: [`crate::feedback::NACK_RANGES_BUDGET`].)
    pub max_nack_ranges: usize,
}

impl RecvConfig {
    /// Timers for a path of round-trip time `rtt`: a repair is asked for again after a round
    /// trip and a quarter plus 30 ms (the sender may still be sending it).
    pub fn for_rtt(rtt: Duration) -> Self {
        RecvConfig {
            nack_retry: (rtt + rtt / 4 + Duration::from_millis(30)).min(Duration::from_secs(5)),
            ..RecvConfig::default()
        }
    }
}

impl Default for RecvConfig {
    fn default() -> Self {
        RecvConfig {
            reorder_wait: Duration::from_millis(5),
            nack_retry: Duration::from_millis(150),
            max_nack_ranges: 1024,
        }
    }
}

/// What a data datagram did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataOutcome {
    /// Bytes never seen before (0 means a duplicate).
    pub new_bytes: u64,
    /// This datagram completed its block.
    pub completes_block: bool,
}

/// Counters of one channel receiver.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecvStats {
    /// New payload bytes.
    pub new_bytes: u64,
    /// Duplicate payload bytes.
    pub duplicate_bytes: u64,
    /// NACK messages produced.
    pub nacks: u64,
    /// Bytes those NACKs asked for.
    pub nacked_bytes: u64,
    /// Blocks rejected by verification.
    pub rejected_blocks: u64,
    /// Bytes held from an earlier transfer ([`ChannelReceiver::hold`]).
    pub held_bytes: u64,
}

/// The receiving state of one channel. See the module docs.
#[derive(Debug, Clone)]
pub struct ChannelReceiver {
    channel: u16,
    stripe_len: u64,
    received: RangeSet,
    /// Blocks that failed verification and have not arrived again: missing for certain, so
    /// they are asked for whatever the loss horizon says (a held block is rejected before any
    /// data or final marker may have moved the horizon past it).
    rejected: RangeSet,
    frontier: u64,
    /// Frontier samples, oldest first: (sample opened, frontier last raised, frontier). A new
    /// sample opens at most every `reorder_wait / 4`, so the list stays short.
    history: VecDeque<(Instant, Instant, u64)>,
    final_at: Option<Instant>,
    /// Ranges asked for, grouped by when: (generation opened, last asked in it, ranges). A
    /// generation is forgotten, so its ranges asked for again, once `nack_retry` has passed
    /// since its *last* ask: never before a range's own wait is over. (Timed from its opening,
    /// a range asked late in a generation was asked again up to a quarter of `nack_retry`
    /// early, sooner than the sender's `repair_echo` after its repair, which took it for an
    /// echo of the first ask and did not answer: a lost repair then cost another wait and a
    /// round trip, 0.24 s of a 5.6 s transfer over 150 ms.)
    asked: VecDeque<(Instant, Instant, RangeSet)>,
    /// Every byte missing below this was asked for (in a generation kept, or `due`) as of the
    /// last poll: a poll looks for new gaps only above it, not through every gap of the stripe
    /// (after an outage, thousands of them, every 2.5 ms: half the receiver's CPU).
    scanned: u64,
    /// Ranges of forgotten generations still missing: to be asked for again.
    due: RangeSet,
    /// Recent queueing delay, decayed: (when noted, delay).
    queue_delay: Option<(Instant, Duration)>,
    /// The channel's datagrams began to come another way (a relayed session moved to a direct
    /// path): when, and the frontier then ([`ChannelReceiver::on_path_change`]).
    moved: Option<(Instant, u64)>,
    done_sent: bool,
    cfg: RecvConfig,
    stats: RecvStats,
    /// The round trip `cfg`'s `nack_retry` was set for, lowered by the timing of repairs
    /// ([`ChannelReceiver::timing_repairs`]); `None`: not timed.
    path: Option<PathRtt>,
    /// The newest NACKs' first asks (bytes never asked for before, not rejected blocks): when
    /// each was sent, and its ranges. The first repair of any of them times a round trip.
    first_asks: VecDeque<(Instant, RangeSet)>,
}

/// How many NACKs' first asks wait for their repair's timing, at most.
const TIMED_ASKS: usize = 8;

impl ChannelReceiver {
    /// A receiver for `channel`, whose stripe is `stripe_len` bytes.
    pub fn new(channel: u16, stripe_len: u64, cfg: RecvConfig) -> Self {
        ChannelReceiver {
            channel,
            stripe_len,
            received: RangeSet::new(),
            rejected: RangeSet::new(),
            frontier: 0,
            history: VecDeque::new(),
            final_at: None,
            asked: VecDeque::new(),
            scanned: 0,
            due: RangeSet::new(),
            queue_delay: None,
            moved: None,
            done_sent: false,
            cfg,
            stats: RecvStats::default(),
            path: None,
            first_asks: VecDeque::new(),
        }
    }

    /// Lowers `nack_retry` toward the path's round trip as repairs show it: `rtt` is the round
    /// trip the configuration was made for (the key agreement's timing, which on a busy host
    /// has both sides' waits for a core in it) with the kernel's floor, if known. The first
    /// repair of bytes asked for the first time arrives a round trip after the ask at the
    /// earliest (the sender sends nothing marked a repair before it is asked); the lowest such
    /// timing, never below the floor, sets `nack_retry` as [`RecvConfig::for_rtt`] would
    /// ([`PathRtt::sample`]). Without a floor (through a relay, whose TCP round trip is not the
    /// path's, or where the kernel does not say) nothing is timed and the configuration stands.
    pub fn timing_repairs(mut self, rtt: PathRtt) -> Self {
        self.path = Some(rtt);
        self
    }

    /// The round trip the timers are set for now: the configured one, or lower once repairs
    /// showed the path's ([`ChannelReceiver::timing_repairs`]); `None` if not timed.
    pub fn path_rtt(&self) -> Option<Duration> {
        self.path.map(|p| p.get())
    }

    /// Whether repairs are timed now: a floor is known and the estimate is above it.
    fn timing(&self) -> bool {
        self.path
            .is_some_and(|p| p.floor().is_some_and(|f| f < p.get()))
    }

    /// A repair of stripe range `range` arrived at `now`: the first of a NACK's first asks
    /// times a round trip.
    fn time_repair(&mut self, now: Instant, range: Range<u64>) {
        let Some(i) = self
            .first_asks
            .iter()
            .position(|(_, set)| set.overlapping(range.clone()).next().is_some())
        else {
            return;
        };
        let Some((asked, _)) = self.first_asks.remove(i) else {
            return;
        };
        let lower = self
            .path
            .as_mut()
            .and_then(|p| p.sample(now.saturating_duration_since(asked)));
        if let Some(lower) = lower {
            self.cfg.nack_retry = self
                .cfg
                .nack_retry
                .min(RecvConfig::for_rtt(lower).nack_retry);
        }
        if !self.timing() {
            self.first_asks.clear();
        }
    }

    /// The channel index.
    pub fn channel(&self) -> u16 {
        self.channel
    }

    /// The receiver already holds stripe range `range` (from an earlier, interrupted transfer):
    /// it counts as received. Call before data arrives.
    pub fn hold(&mut self, range: Range<u64>) {
        let end = range.end.min(self.stripe_len);
        self.stats.held_bytes += self.received.insert(range.start.min(end)..end);
    }

    /// Counters so far.
    pub fn stats(&self) -> RecvStats {
        self.stats
    }
    /// Bytes of the stripe held.
    pub fn received_bytes(&self) -> u64 {
        self.received.total()
    }
    /// The parts of `within` that have arrived.
    pub fn held(&self, within: Range<u64>) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        let mut cursor = within.start;
        for gap in self.received.gaps(within.clone()) {
            if gap.start > cursor {
                out.push(cursor..gap.start);
            }
            cursor = gap.end;
        }
        if cursor < within.end {
            out.push(cursor..within.end);
        }
        out
    }

    /// True when all of stripe range `range` has arrived.
    pub fn has(&self, range: Range<u64>) -> bool {
        self.received.covers(range)
    }

    /// True when the whole stripe is held.
    pub fn is_complete(&self) -> bool {
        self.received.covers(0..self.stripe_len)
    }

    /// Records `len` bytes at stripe position `pos` (already checked against the layout), which
    /// lie in the block occupying stripe range `block`.
    pub fn on_data(
        &mut self,
        now: Instant,
        pos: u64,
        len: u64,
        retransmit: bool,
        block: Range<u64>,
    ) -> DataOutcome {
        let end = pos.saturating_add(len).min(self.stripe_len);
        let new_bytes = self.received.insert(pos..end);
        if !self.rejected.is_empty() {
            self.rejected.remove(pos..end);
        }
        if !self.due.is_empty() {
            self.due.remove(pos..end);
        }
        self.stats.new_bytes += new_bytes;
        self.stats.duplicate_bytes += (end - pos.min(end)) - new_bytes;
        if retransmit && !self.first_asks.is_empty() {
            self.time_repair(now, pos..end);
        }
        if !retransmit && end > self.frontier {
            self.frontier = end;
            let sample_every = self.cfg.reorder_wait / 4;
            match self.history.back_mut() {
                Some((opened, raised, f))
                    if now.saturating_duration_since(*opened) < sample_every =>
                {
                    *raised = now;
                    *f = end;
                }
                _ => self.history.push_back((now, now, end)),
            }
        }
        DataOutcome {
            new_bytes,
            completes_block: new_bytes > 0 && self.received.covers(block),
        }
    }

    /// The sender says it has sent the whole stripe of `stripe_len` bytes. Returns false (and
    /// changes nothing) if that length is not this channel's.
    pub fn on_final(&mut self, now: Instant, stripe_len: u64) -> bool {
        if stripe_len != self.stripe_len {
            return false;
        }
        if self.final_at.is_none() {
            self.final_at = Some(now);
        }
        // A repeated marker after completion means our ChannelDone may not have arrived yet;
        // the session answers markers of complete channels again.
        true
    }

    /// A block failed verification: forget its bytes so they are asked for again at once.
    pub fn reject(&mut self, block: Range<u64>) {
        self.stats.rejected_blocks += 1;
        self.received.remove(block.clone());
        self.rejected.insert(block.clone());
        for (_, _, set) in self.asked.iter_mut() {
            set.remove(block.clone());
        }
        self.done_sent = false;
    }

    /// The queueing delay (one-way delay above the lowest seen) of datagrams arriving at `now`.
    /// The receiver waits that much longer (times 1.5) before asking for a repair again. Larger
    /// figures count at once; smaller ones replace the earlier figure only as it decays (it
    /// halves every second), since the first datagrams after a stall show the most delay.
    pub fn note_queue_delay(&mut self, now: Instant, delay: Duration) {
        let decayed = self.decayed_queue_delay(now);
        self.queue_delay = Some((now, decayed.max(delay.min(Duration::from_secs(60)))));
    }

    fn decayed_queue_delay(&self, now: Instant) -> Duration {
        self.queue_delay.map_or(Duration::ZERO, |(at, d)| {
            let age = now.saturating_duration_since(at).as_secs_f64();
            d.mul_f64(0.5f64.powf(age))
        })
    }

    /// How long a repair may take before it is asked for again.
    fn retry_after(&self, now: Instant) -> Duration {
        self.cfg.nack_retry + self.decayed_queue_delay(now).mul_f64(1.5)
    }

    /// The channel's datagrams began to come another way at `now` (the sender moved them from
    /// a relay to a direct path, or back): for half a repair wait, bytes above the frontier of
    /// this moment are not taken for lost. What the old path still carries arrives later than
    /// what the new one brings, and without this allowance it was asked for (and arrived
    /// twice): about the difference of the two paths' delays, at the full rate.
    pub fn on_path_change(&mut self, now: Instant) {
        self.moved = Some((now, self.frontier));
    }

    /// The position below which missing bytes count as lost at `now`.
    fn loss_horizon(&mut self, now: Instant) -> u64 {
        let horizon = self.plain_loss_horizon(now);
        match self.moved {
            Some((at, frontier)) if now < at + self.cfg.nack_retry / 2 => horizon.min(frontier),
            Some(_) => {
                self.moved = None;
                horizon
            }
            None => horizon,
        }
    }

    /// The loss horizon without a path change's allowance.
    fn plain_loss_horizon(&mut self, now: Instant) -> u64 {
        if self
            .final_at
            .is_some_and(|t| now.saturating_duration_since(t) >= self.cfg.reorder_wait)
        {
            return self.stripe_len;
        }
        let Some(cutoff) = now.checked_sub(self.cfg.reorder_wait) else {
            return 0;
        };
        // Drop samples made obsolete by a newer sample that is also older than the cutoff.
        while self.history.len() >= 2 && self.history[1].1 <= cutoff {
            self.history.pop_front();
        }
        match self.history.front() {
            Some(&(_, raised, f)) if raised <= cutoff => f,
            _ => 0,
        }
    }

    /// Stripe ranges to ask for now, if any.
    ///
    /// What is wanted: the gaps below the loss horizon and the rejected blocks, less what was
    /// asked for within its wait. Found without walking every gap each time: the gaps above
    /// what earlier polls covered, the ranges of the generations whose wait ended and are still
    /// missing (`due`), and the rejected blocks.
    pub fn poll_nack(&mut self, now: Instant) -> Option<Vec<(u64, u64)>> {
        let retry = self.retry_after(now);
        while self
            .asked
            .front()
            .is_some_and(|(_, last, _)| now.saturating_duration_since(*last) >= retry)
        {
            if let Some((_, _, set)) = self.asked.pop_front() {
                for r in set.iter() {
                    for gap in self.received.gaps(r) {
                        self.due.insert(gap);
                    }
                }
            }
        }
        let horizon = self.loss_horizon(now);
        let mut wanted: RangeSet = self
            .received
            .gaps(self.scanned.min(horizon)..horizon)
            .into_iter()
            .collect();
        wanted.union_with(&self.due);
        wanted.union_with(&self.rejected);
        // (Only rejected blocks can be asked for already: anything else here is new or due.)
        if !self.rejected.is_empty() {
            let asked: Vec<Range<u64>> = wanted
                .iter()
                .flat_map(|w| {
                    self.asked
                        .iter()
                        .flat_map(move |g| g.2.overlapping(w.clone()))
                })
                .collect();
            for r in asked {
                wanted.remove(r);
            }
        }
        if wanted.is_empty() {
            self.scanned = self.scanned.max(horizon);
            return None;
        }
        let ranges = first_that_fit(&wanted, self.cfg.max_nack_ranges);
        if self.timing() {
            // Bytes asked for the first time: neither due again nor a rejected block.
            let mut first: RangeSet = ranges.iter().map(|&(s, e)| s..e).collect();
            first.subtract(&self.due);
            first.subtract(&self.rejected);
            if !first.is_empty() {
                if self.first_asks.len() >= TIMED_ASKS {
                    self.first_asks.pop_front();
                }
                self.first_asks.push_back((now, first));
            }
        }
        // Generations open at most every eighth of `nack_retry`: a range is asked for again at
        // most that much later than its own wait.
        let generation_span = self.cfg.nack_retry / 8;
        if self
            .asked
            .back()
            .is_none_or(|(opened, _, _)| now.saturating_duration_since(*opened) >= generation_span)
        {
            self.asked.push_back((now, now, RangeSet::new()));
        }
        if let Some((_, last, set)) = self.asked.back_mut() {
            *last = now;
            for &(s, e) in &ranges {
                set.insert(s..e);
                self.due.remove(s..e);
                self.stats.nacked_bytes += e - s;
            }
        }
        // What was not asked for (past the budget) is wanted at the next poll: the gaps above
        // the last range asked for, and what is left due.
        let all = ranges.len() == wanted.range_count();
        let covered = match ranges.last() {
            _ if all => horizon,
            Some(&(_, end)) => end.min(horizon),
            None => self.scanned,
        };
        self.scanned = self.scanned.max(covered);
        self.stats.nacks += 1;
        Some(ranges)
    }

    /// True once when the stripe becomes complete (send `ChannelDone`); again after a rejected
    /// block was repaired.
    pub fn poll_done(&mut self) -> bool {
        if !self.done_sent && self.is_complete() {
            self.done_sent = true;
            return true;
        }
        false
    }

    /// The final marker arrived for a channel that is already complete: answer it again.
    pub fn resend_done(&mut self) {
        if self.is_complete() {
            self.done_sent = false;
        }
    }

    /// Whether the channel is waiting on a loss: a gap below the frontier not asked for yet, a
    /// range asked for whose repair has not come (within its retry wait, or due again), or a
    /// rejected block. (A range asked for counts until its retry wait is over, whether or not
    /// its repair came meanwhile: a poll forgets it only then.) A driver that sleeps between
    /// polls keeps its sleeps short while this holds, so that neither the first ask nor a
    /// repeated one waits out a long sleep.
    pub fn awaiting_repair(&self) -> bool {
        !self.asked.is_empty()
            || !self.due.is_empty()
            || !self.rejected.is_empty()
            || !self.received.covers(self.scanned..self.frontier)
    }

    /// When `poll_nack` could next have something to say.
    pub fn next_timeout(&self, now: Instant) -> Option<Instant> {
        if self.is_complete() {
            return None;
        }
        let soonest_retry = self
            .asked
            .front()
            .map(|(_, last, _)| *last + self.retry_after(now));
        let reorder = now + self.cfg.reorder_wait / 2;
        Some(soonest_retry.map_or(reorder, |r| r.min(reorder)))
    }
}

/// The lowest ranges of `wanted`, at most `most`, and no more than fit one feedback datagram: a
/// NACK on the control connection alone comes late while TCP recovers (see
/// [`crate::feedback`]). The rest follow in the next.
fn first_that_fit(wanted: &RangeSet, most: usize) -> Vec<(u64, u64)> {
    let mut budget = crate::feedback::NACK_RANGES_BUDGET;
    wanted
        .iter()
        .take(most)
        .map(|r| (r.start, r.end))
        .take_while(
            |&(s, e)| match budget.checked_sub(crate::feedback::nack_range_len(s, e)) {
                Some(left) => {
                    budget = left;
                    true
                }
                None => false,
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn after_a_path_change_what_the_old_path_still_carries_is_not_asked_for_at_once() {
        let cfg = RecvConfig::for_rtt(ms(80)); // nack_retry 130 ms: an allowance of 65 ms
        let allowance = cfg.nack_retry / 2;
        let t0 = Instant::now();
        let mut r = ChannelReceiver::new(0, 100_000, cfg);
        // 0..10_000 came through the relay; the channel moves; 20_000.. comes direct, while
        // 10_000..20_000 is still on its way through the relay.
        r.on_data(t0, 0, 10_000, false, 0..100_000);
        r.on_path_change(t0);
        r.on_data(t0 + ms(1), 20_000, 5_000, false, 0..100_000);
        assert_eq!(r.poll_nack(t0 + ms(20)), None, "within the allowance");
        // Part of it arrives; what is still missing when the allowance is over is asked for.
        r.on_data(t0 + ms(30), 10_000, 6_000, false, 0..100_000);
        assert_eq!(r.poll_nack(t0 + allowance - ms(1)), None);
        assert_eq!(
            r.poll_nack(t0 + allowance + ms(6)),
            Some(vec![(16_000, 20_000)])
        );
        // Without the change the same gap is asked for after the reordering wait alone.
        let mut r = ChannelReceiver::new(0, 100_000, RecvConfig::for_rtt(ms(80)));
        r.on_data(t0, 0, 10_000, false, 0..100_000);
        r.on_data(t0 + ms(1), 20_000, 5_000, false, 0..100_000);
        assert_eq!(r.poll_nack(t0 + ms(20)), Some(vec![(10_000, 20_000)]));
    }

    #[test]
    fn a_nack_holds_what_fits_a_feedback_datagram_and_the_rest_follow() {
        // 1,000 lost datagrams at stripe positions past 4 GB (varints of five bytes): every
        // other one of 2,000 arrived.
        let t0 = Instant::now();
        let (base, size) = (5u64 << 30, 1428u64);
        let len = base + 2000 * size;
        let mut r = ChannelReceiver::new(0, len, RecvConfig::default());
        for i in (0..2000).step_by(2) {
            let pos = base + i * size;
            r.on_data(t0, pos, size, false, pos..pos + size);
        }
        let pos = base + 2000 * size - size;
        r.on_data(t0, pos, size, false, pos..pos + size);
        let mut asked = Vec::new();
        while let Some(ranges) = r.poll_nack(t0 + ms(6)) {
            let nack = crate::wire::Control::Nack {
                channel: 0,
                seq: u64::MAX,
                ranges: ranges.clone(),
                knew_us: u32::MAX,
            };
            assert!(
                crate::feedback::encode(&nack, 1, 1).is_some(),
                "{} ranges do not fit a datagram",
                ranges.len()
            );
            asked.extend(ranges);
            assert!(asked.len() <= 1000, "asked twice");
        }
        // All of them (999, and the stripe's first 5 GiB, which nothing here sent), in a few
        // NACKs.
        assert_eq!(asked.len(), 1000);
        assert!(r.stats().nacks >= 8, "{} NACKs", r.stats().nacks);
    }

    /// A channel receiver configured for a key agreement of `handshake` with the kernel's
    /// `floor`, timing repairs, with a gap at 1000..2000 asked for at the returned instant.
    fn asked_a_gap(handshake: Duration, floor: Option<Duration>) -> (ChannelReceiver, Instant) {
        let t0 = Instant::now();
        let mut r = ChannelReceiver::new(0, 10_000, RecvConfig::for_rtt(handshake))
            .timing_repairs(PathRtt::new(handshake, floor));
        r.on_data(t0, 0, 1000, false, 0..10_000);
        r.on_data(t0, 2000, 1000, false, 0..10_000);
        let asked = t0 + ms(6);
        assert_eq!(r.poll_nack(asked), Some(vec![(1000, 2000)]));
        (r, asked)
    }

    #[test]
    fn a_key_agreement_inflated_by_cpu_gives_way_to_the_round_trip_a_repair_shows() {
        // Loopback on a busy host: the key agreement took 40 ms (a repair asked again after
        // 80 ms), the kernel's floor is 30 us; the repair comes 0.5 ms after the ask.
        let (mut r, asked) = asked_a_gap(ms(40), Some(Duration::from_micros(30)));
        assert_eq!(r.cfg.nack_retry, ms(80));
        r.on_data(
            asked + Duration::from_micros(500),
            1000,
            500,
            true,
            0..10_000,
        );
        assert_eq!(r.path_rtt(), Some(Duration::from_micros(500)));
        assert_eq!(
            r.cfg.nack_retry,
            RecvConfig::for_rtt(Duration::from_micros(500)).nack_retry
        );
        // Asked again after that, not after 80 ms.
        let again = asked + r.cfg.nack_retry + ms(1);
        assert_eq!(r.poll_nack(again), Some(vec![(1500, 2000)]));
    }

    #[test]
    fn without_a_floor_as_through_a_relay_the_key_agreements_timing_stands() {
        let (mut r, asked) = asked_a_gap(ms(40), None);
        r.on_data(
            asked + Duration::from_micros(500),
            1000,
            1000,
            true,
            0..10_000,
        );
        assert_eq!(r.path_rtt(), Some(ms(40)));
        assert_eq!(r.cfg.nack_retry, ms(80));
    }

    #[test]
    fn a_repair_timed_below_the_kernels_floor_is_taken_as_the_floor() {
        // A sender that sends a "repair" before it could have heard the ask.
        let (mut r, asked) = asked_a_gap(ms(40), Some(ms(10)));
        r.on_data(asked, 1000, 1000, true, 0..10_000);
        assert_eq!(r.path_rtt(), Some(ms(10)));
        assert_eq!(r.cfg.nack_retry, RecvConfig::for_rtt(ms(10)).nack_retry);
    }

    #[test]
    fn only_a_repair_of_a_first_ask_is_timed_and_from_that_ask() {
        let floor = Some(Duration::from_micros(30));
        // The original, late (reordered past the wait), times nothing.
        let (mut r, asked) = asked_a_gap(ms(40), floor);
        r.on_data(asked + ms(1), 1000, 1000, false, 0..10_000);
        assert_eq!(r.path_rtt(), Some(ms(40)));
        // A repair lost and asked for again: repairs come 0.3 and 0.5 ms after the second
        // ask, 80 ms after the first. Either may answer the first ask (a tail repair goes
        // twice), so neither times the second: no lower round trip.
        let (mut r, asked) = asked_a_gap(ms(40), floor);
        let again = asked + ms(81);
        assert_eq!(r.poll_nack(again), Some(vec![(1000, 2000)]));
        r.on_data(
            again + Duration::from_micros(300),
            1000,
            1000,
            true,
            0..10_000,
        );
        r.on_data(
            again + Duration::from_micros(500),
            1000,
            1000,
            true,
            0..10_000,
        );
        assert_eq!(r.path_rtt(), Some(ms(40)));
        assert_eq!(r.cfg.nack_retry, ms(80));
    }

    #[test]
    fn reports_a_gap_after_reorder_wait_and_again_after_retry() {
        let t0 = Instant::now();
        let mut r = ChannelReceiver::new(0, 10_000, RecvConfig::default());
        r.on_data(t0, 0, 1000, false, 0..10_000);
        r.on_data(t0, 2000, 1000, false, 0..10_000);
        assert_eq!(r.poll_nack(t0 + ms(1)), None, "could still be reordering");
        assert_eq!(r.poll_nack(t0 + ms(6)), Some(vec![(1000, 2000)]));
        assert_eq!(r.held(500..2500), vec![500..1000, 2000..2500]);
        assert_eq!(r.poll_nack(t0 + ms(50)), None, "already asked");
        assert_eq!(
            r.poll_nack(t0 + ms(160)),
            Some(vec![(1000, 2000)]),
            "repair lost, ask again"
        );
        let out = r.on_data(t0 + ms(170), 1000, 1000, true, 0..3000);
        assert!(out.completes_block);
        assert_eq!(r.poll_nack(t0 + ms(400)), None);
    }

    #[test]
    fn awaits_a_repair_from_the_gap_until_the_retry_wait_after_it_came() {
        let t0 = Instant::now();
        let mut r = ChannelReceiver::new(0, 10_000, RecvConfig::default());
        assert!(!r.awaiting_repair(), "nothing yet");
        r.on_data(t0, 0, 1000, false, 0..10_000);
        r.on_data(t0, 1000, 1000, false, 0..10_000);
        assert_eq!(r.poll_nack(t0 + ms(6)), None);
        assert!(!r.awaiting_repair(), "in order, nothing missing");
        // A gap below the frontier, not asked for yet (it may be reordering).
        r.on_data(t0 + ms(7), 3000, 1000, false, 0..10_000);
        assert!(r.awaiting_repair(), "gap seen");
        assert_eq!(r.poll_nack(t0 + ms(8)), None, "could still be reordering");
        assert!(r.awaiting_repair(), "gap seen, not yet asked for");
        assert_eq!(r.poll_nack(t0 + ms(13)), Some(vec![(2000, 3000)]));
        assert!(r.awaiting_repair(), "asked for");
        r.on_data(t0 + ms(20), 2000, 1000, true, 0..10_000);
        assert!(r.awaiting_repair(), "repaired, its retry wait not over");
        assert_eq!(r.poll_nack(t0 + ms(200)), None);
        assert!(!r.awaiting_repair(), "repaired and forgotten");
        // A rejected block is awaited until it comes again.
        r.reject(0..1000);
        assert!(r.awaiting_repair(), "rejected");
    }

    #[test]
    fn a_range_is_not_asked_for_again_before_its_own_wait_is_over() {
        let t0 = Instant::now();
        let mut r = ChannelReceiver::new(0, 10_000, RecvConfig::default());
        r.on_data(t0, 0, 1000, false, 0..10_000);
        r.on_data(t0, 2000, 1000, false, 0..10_000);
        assert_eq!(r.poll_nack(t0 + ms(6)), Some(vec![(1000, 2000)]));
        // A second gap, asked for 10 ms later, in the same generation (150 / 8 ms).
        r.on_data(t0 + ms(10), 4000, 1000, false, 0..10_000);
        assert_eq!(r.poll_nack(t0 + ms(16)), Some(vec![(3000, 4000)]));
        // 150 ms after the first ask the second's wait is not over: neither is asked yet
        // (the first waits 10 ms longer than its own 150).
        assert_eq!(r.poll_nack(t0 + ms(160)), None);
        assert_eq!(
            r.poll_nack(t0 + ms(166)),
            Some(vec![(1000, 2000), (3000, 4000)])
        );
    }

    #[test]
    fn waits_for_a_repair_queued_behind_the_socket_buffer() {
        let t0 = Instant::now();
        let mut r = ChannelReceiver::new(0, 10_000, RecvConfig::default());
        r.on_data(t0, 0, 1000, false, 0..10_000);
        r.on_data(t0, 2000, 1000, false, 0..10_000);
        r.note_queue_delay(t0, ms(200));
        assert_eq!(r.poll_nack(t0 + ms(6)), Some(vec![(1000, 2000)]));
        // A later, shorter delay does not shorten the wait at once.
        r.note_queue_delay(t0 + ms(10), ms(1));
        assert_eq!(
            r.poll_nack(t0 + ms(160)),
            None,
            "the repair is still queued"
        );
        assert!(r.next_timeout(t0 + ms(160)).unwrap() > t0 + ms(160));
        // 150 ms + 1.5 x (200 ms, halved per second since it was seen).
        assert_eq!(r.poll_nack(t0 + ms(380)), None);
        assert_eq!(r.poll_nack(t0 + ms(430)), Some(vec![(1000, 2000)]));
        // Once the queue has been short for a while, the wait is back to `nack_retry`.
        r.note_queue_delay(t0 + ms(10_000), ms(0));
        assert_eq!(r.poll_nack(t0 + ms(10_000)), Some(vec![(1000, 2000)]));
        assert_eq!(r.poll_nack(t0 + ms(10_140)), None);
        assert_eq!(r.poll_nack(t0 + ms(10_151)), Some(vec![(1000, 2000)]));
    }

    #[test]
    fn final_marker_exposes_tail_loss() {
        let t0 = Instant::now();
        let mut r = ChannelReceiver::new(0, 10_000, RecvConfig::default());
        r.on_data(t0, 0, 4000, false, 0..10_000);
        assert!(!r.on_final(t0, 9_999), "wrong stripe length is refused");
        assert!(r.on_final(t0, 10_000));
        assert_eq!(r.poll_nack(t0 + ms(10)), Some(vec![(4000, 10_000)]));
        r.on_data(t0, 4000, 6000, true, 0..10_000);
        assert!(r.poll_done());
        assert!(!r.poll_done());
        assert_eq!(r.held(3000..5000), vec![3000..5000]);
        r.reject(0..5000);
        assert_eq!(r.poll_nack(t0 + ms(20)), Some(vec![(0, 5000)]));
    }

    #[test]
    fn held_ranges_are_not_asked_for_until_rejected() {
        let t0 = Instant::now();
        let mut r = ChannelReceiver::new(0, 12_000, RecvConfig::default());
        r.hold(4000..8000);
        r.hold(11_000..20_000);
        assert_eq!(r.stats().held_bytes, 5000);
        assert_eq!(r.received_bytes(), 5000);
        r.on_data(t0, 0, 4000, false, 0..4000);
        r.on_data(t0, 8000, 3000, false, 8000..12_000);
        assert_eq!(r.poll_nack(t0 + ms(10)), None, "nothing is missing");
        assert!(r.is_complete());
        assert!(r.poll_done());
        // The held copy of 4000..8000 failed verification: it is asked for like a loss.
        r.reject(4000..8000);
        assert_eq!(r.poll_nack(t0 + ms(20)), Some(vec![(4000, 8000)]));
        let out = r.on_data(t0 + ms(30), 4000, 4000, true, 4000..8000);
        assert!(out.completes_block);
        assert!(r.poll_done());
    }

    #[test]
    fn a_rejected_held_block_is_asked_for_without_data_or_a_final_marker() {
        // Everything held, nothing sent, the final marker lost: only the rejection says that
        // 4000..8000 is missing, and that is enough.
        let t0 = Instant::now();
        let mut r = ChannelReceiver::new(0, 8000, RecvConfig::default());
        r.hold(0..8000);
        assert!(r.poll_done());
        r.reject(4000..8000);
        assert_eq!(r.poll_nack(t0), Some(vec![(4000, 8000)]));
        assert_eq!(r.poll_nack(t0 + ms(10)), None, "already asked");
        assert_eq!(
            r.poll_nack(t0 + ms(200)),
            Some(vec![(4000, 8000)]),
            "the repair was lost: asked again"
        );
        assert!(
            r.on_data(t0 + ms(210), 4000, 4000, true, 4000..8000)
                .completes_block
        );
        assert_eq!(r.poll_nack(t0 + ms(500)), None);
        assert!(r.poll_done());
    }

    #[test]
    fn duplicates_are_counted_not_completing() {
        let t0 = Instant::now();
        let mut r = ChannelReceiver::new(0, 100, RecvConfig::default());
        assert!(r.on_data(t0, 0, 100, false, 0..100).completes_block);
        let again = r.on_data(t0, 0, 100, true, 0..100);
        assert_eq!(
            again,
            DataOutcome {
                new_bytes: 0,
                completes_block: false
            }
        );
        assert_eq!(r.stats().duplicate_bytes, 100);
    }

    /// What a NACK held when every poll walked every gap of the stripe: the gaps below the
    /// loss horizon and the rejected blocks, less every generation still waiting, cut to the
    /// budget. Computed on a copy of `r` as the poll at `now` finds it.
    fn naive_poll(r: &ChannelReceiver, now: Instant) -> Option<Vec<(u64, u64)>> {
        let mut r = r.clone();
        let retry = r.retry_after(now);
        while r
            .asked
            .front()
            .is_some_and(|(_, last, _)| now.saturating_duration_since(*last) >= retry)
        {
            r.asked.pop_front();
        }
        let horizon = r.loss_horizon(now);
        let mut wanted: RangeSet = r.received.gaps(0..horizon).into_iter().collect();
        wanted.union_with(&r.rejected);
        for (_, _, set) in &r.asked {
            wanted.subtract(set);
        }
        if wanted.is_empty() {
            return None;
        }
        Some(first_that_fit(&wanted, r.cfg.max_nack_ranges))
    }

    #[derive(Debug, Clone)]
    enum Step {
        /// Datagram `i` (of 100 bytes) arrives, new or a repair.
        Data(u64, bool),
        /// Block `i` (of 1,000 bytes) failed verification.
        Reject(u64),
        Final,
        /// Time passes (ms), and the receiver polls.
        Poll(u64),
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            6 => (0..100u64, any::<bool>()).prop_map(|(i, re)| Step::Data(i, re)),
            1 => (0..10u64).prop_map(Step::Reject),
            1 => Just(Step::Final),
            4 => (0..120u64).prop_map(Step::Poll),
        ]
    }

    proptest::proptest! {
        /// Polls that look only above what earlier ones covered ask for exactly what polls
        /// that walked the whole stripe asked for, whatever arrives, is rejected or is lost.
        #[test]
        fn a_poll_asks_for_what_walking_every_gap_would(
            steps in proptest::collection::vec(step(), 1..120),
            max_ranges in 1usize..6,
        ) {
            let t0 = Instant::now();
            let cfg = RecvConfig {
                max_nack_ranges: max_ranges,
                ..RecvConfig::default()
            };
            let mut r = ChannelReceiver::new(0, 10_000, cfg);
            let mut now = t0;
            for s in steps {
                match s {
                    Step::Data(i, re) => {
                        let block = (i / 10) * 1000;
                        r.on_data(now, i * 100, 100, re, block..block + 1000);
                    }
                    Step::Reject(b) => r.reject(b * 1000..b * 1000 + 1000),
                    Step::Final => {
                        r.on_final(now, 10_000);
                    }
                    Step::Poll(ms) => {
                        now += Duration::from_millis(ms);
                        let want = naive_poll(&r, now);
                        proptest::prop_assert_eq!(r.poll_nack(now), want);
                    }
                }
            }
        }
    }
}
