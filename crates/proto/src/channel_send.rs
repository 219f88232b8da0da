//! The sending side of one data channel, and the pacer.
//!
//! A [`ChannelSender`] owns its channel's stripe (see [`crate::layout`]): a cursor over new data,
//! a [`RangeSet`] of ranges the receiver asked for again, and the channel's final marker. The
//! driver asks it for the next *run* (contiguous stripe bytes inside one block), reads those
//! bytes, cuts them into datagrams and sends them; it feeds NACKs and the receiver's
//! `ChannelDone` back in. Call order per driver turn:
//!
//! 1. `on_nack` / `on_channel_done` for every control message addressed to this channel;
//! 2. while the [`Pacer`] allows: `poll_run`, then send the run;
//! 3. `poll_final(now)`: send a final marker when it says so;
//! 4. sleep until the earliest of the pacer's and `next_timeout()`'s deadlines.
//!
//! Repairs go first, but while new data is still flowing they may take at most
//! `repair_share` of the bytes sent (a token bucket capped at `credit_cap`), so a loss storm
//! cannot starve the new data; once the stripe is fully sent, repairs get the whole rate.
//!
//! **The tail.** Near the end of the stripe every repair is what the transfer waits for, and a
//! lost one is asked for again only after the receiver's `nack_retry` (a round trip and more):
//! at 1% loss the last round trips' hundred-odd repairs lose one most transfers. So a repair
//! sent in the tail goes twice: its second copy follows the batch of first copies, up to
//! `tail_copies` bytes per `repair_echo` (bounding the cost when the tail is a long outage's
//! worth of repairs). The tail is where the driver says it is ([`ChannelSender::set_tail`]:
//! the last round trip and a half of new data, [`crate::fec::in_tail`]), and at the latest
//! once the stripe is fully sent; while new data is left, second copies share the repairs'
//! budget.
//!
//! A resumed transfer starts with blocks the receiver already holds ([`ChannelSender::hold`]).
//! The cursor does not send them: when it reaches one it returns a [`RunKind::Held`] run of the
//! whole block, which the driver reads and hashes (so the receiver can check its copy against
//! the sender's value) but does not send or pace. A held block that fails that check comes
//! back as a NACK like any other loss, and is resent as a repair.

use crate::layout::Layout;
use crate::ranges::RangeSet;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Tunables of a channel sender.
#[derive(Debug, Clone)]
pub struct SendConfig {
    /// Largest share of sent bytes that repairs may take while new data remains (0..1).
    pub repair_share: f64,
    /// Largest repair credit that can accumulate, in bytes.
    pub credit_cap: u64,
    /// How long to wait for `ChannelDone` before sending the final marker again.
    pub final_interval: Duration,
    /// How long a repair is on its way: a NACK for bytes repaired less than this ago was sent
    /// before the repair could arrive (the receiver asked again while the repair waited in the
    /// sender's queue), and is not answered with another copy; nor is one for bytes repaired
    /// after what the NACK knew of (a NACK that came late, see [`ChannelSender::on_nack`]).
    /// About a round trip and the path's queueing; zero answers every NACK (and remembers no
    /// repairs).
    pub repair_echo: Duration,
    /// Most bytes of second copies of repairs sent once the stripe is fully sent, per
    /// `repair_echo` (or per 100 ms if that is zero); zero sends no second copies.
    pub tail_copies: u64,
}

impl Default for SendConfig {
    fn default() -> Self {
        SendConfig {
            repair_share: 0.5,
            credit_cap: 1 << 20,
            final_interval: Duration::from_millis(100),
            repair_echo: Duration::ZERO,
            tail_copies: 256 << 10,
        }
    }
}

impl SendConfig {
    /// Timers for a path of round-trip time `rtt`: the final marker is sent again after two
    /// round trips (30 ms at least), and a NACK that comes within a round trip and a quarter
    /// (and 10 ms) of a repair of its bytes was sent before that repair could arrive.
    pub fn for_rtt(rtt: Duration) -> SendConfig {
        SendConfig {
            final_interval: (rtt * 2).max(Duration::from_millis(30)),
            repair_echo: rtt + rtt / 4 + Duration::from_millis(10),
            ..SendConfig::default()
        }
    }
}

/// Why a run is being sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunKind {
    /// First transmission.
    New,
    /// Resent because the receiver asked.
    Repair,
    /// A whole block the receiver already holds: hash it, send nothing.
    Held,
}

/// Contiguous stripe bytes within one block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// Stripe position of the first byte.
    pub pos: u64,
    /// Length in bytes (never 0, never past the block's end).
    pub len: u64,
    /// New data or repair.
    pub kind: RunKind,
}

/// Counters of one channel sender.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendStats {
    /// Bytes sent for the first time.
    pub new_bytes: u64,
    /// Bytes resent.
    pub repair_bytes: u64,
    /// NACK messages handled.
    pub nacks: u64,
    /// Bytes those NACKs asked for (before de-duplication).
    pub nacked_bytes: u64,
    /// Final markers sent.
    pub finals: u64,
    /// Bytes the receiver already held (passed over as [`RunKind::Held`] runs).
    pub held_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Final {
    NotSent,
    Sent(Instant),
    Acked,
}

/// The sending state of one channel. See the module docs for the call order.
#[derive(Debug, Clone)]
pub struct ChannelSender {
    channel: u16,
    stripe_len: u64,
    next_new: u64,
    repair: RangeSet,
    /// Stripe ranges (whole blocks) the receiver already holds, not yet passed by `next_new`.
    held: RangeSet,
    credit: f64,
    fin: Final,
    cfg: SendConfig,
    stats: SendStats,
    /// Repairs sent within the last [`REPAIR_MEMORY`] (and `cfg.repair_echo`): (when, stripe
    /// range), oldest first.
    recent_repairs: VecDeque<(Instant, u64, u64)>,
    /// Tail repairs to send a second time, after the first copies.
    copies: RangeSet,
    /// Since when second copies are counted against `cfg.tail_copies`, and their bytes
    /// (`None` before the first).
    copy_window: Option<(Instant, u64)>,
    /// Every range ever held ([`ChannelSender::hold`]), kept after the cursor passes them.
    held_all: RangeSet,
    /// The driver says the channel is in its tail ([`ChannelSender::set_tail`]).
    tail: bool,
    /// The channel's link loses nothing ([`ChannelSender::set_lossless`]).
    lossless: bool,
}

/// Most repairs remembered (older ones are forgotten first: a NACK that asks for one is
/// answered, a repair too many rather than one too few).
const RECENT_REPAIRS: usize = 8192;

/// How long a repair is remembered, beyond [`SendConfig::repair_echo`], for NACKs that come
/// late: after an outage TCP brings the copies of NACKs whose datagrams were lost seconds late.
const REPAIR_MEMORY: Duration = Duration::from_secs(30);

impl ChannelSender {
    /// A sender for `channel` of `layout`.
    pub fn new(layout: &Layout, channel: u16, cfg: SendConfig) -> Self {
        ChannelSender {
            channel,
            stripe_len: layout.stripe_len(channel),
            next_new: 0,
            repair: RangeSet::new(),
            held: RangeSet::new(),
            credit: 0.0,
            fin: Final::NotSent,
            cfg,
            stats: SendStats::default(),
            recent_repairs: VecDeque::new(),
            copies: RangeSet::new(),
            copy_window: None,
            held_all: RangeSet::new(),
            tail: false,
            lossless: false,
        }
    }

    /// The path's round trip is now known to be `rtt` (lower than the one the sender was
    /// configured for: the key agreement's timing, which on a busy host has both sides' waits
    /// for a core in it). The timers [`SendConfig::for_rtt`] derives from a round trip
    /// (`final_interval`, `repair_echo`) are set for it; a `repair_echo` of zero (no repairs
    /// remembered) stays zero. A final marker already sent is sent again on the new interval.
    pub fn set_rtt(&mut self, rtt: Duration) {
        let timers = SendConfig::for_rtt(rtt);
        self.cfg.final_interval = timers.final_interval;
        if !self.cfg.repair_echo.is_zero() {
            self.cfg.repair_echo = timers.repair_echo;
        }
    }

    /// Whether the channel is in its tail, where repairs go twice (see the module docs);
    /// once the stripe is fully sent it is, whatever this says.
    pub fn set_tail(&mut self, tail: bool) {
        self.tail = tail;
    }

    /// The channel index.
    pub fn channel(&self) -> u16 {
        self.channel
    }
    /// Counters so far.
    pub fn stats(&self) -> SendStats {
        self.stats
    }
    /// Bytes of the stripe not yet sent once.
    pub fn new_remaining(&self) -> u64 {
        self.stripe_len - self.next_new
    }
    /// Bytes waiting to be resent.
    pub fn repair_pending(&self) -> u64 {
        self.repair.total()
    }
    /// True once the receiver confirmed the whole stripe and nothing is pending.
    pub fn is_done(&self) -> bool {
        self.fin == Final::Acked && self.repair.is_empty()
    }

    /// The receiver already holds stripe range `range` (a whole block, as the layout places
    /// it on this channel): the cursor passes it as a [`RunKind::Held`] run instead of sending
    /// it. Call before the first `poll_run`; parts the cursor has passed are ignored.
    pub fn hold(&mut self, range: std::ops::Range<u64>) {
        let start = range.start.max(self.next_new);
        let end = range.end.min(self.stripe_len);
        if start < end {
            self.held.insert(start..end);
            self.held_all.insert(start..end);
        }
    }

    /// The channel moved to a link that loses nothing (a TCP connection): a repair goes once,
    /// in the tail too (a second copy would only arrive twice).
    pub fn set_lossless(&mut self) {
        self.lossless = true;
        self.copies = RangeSet::new();
    }

    /// Nothing sent so far reached the receiver (the channel's datagrams went nowhere, and it
    /// moves to another link): everything sent is queued to be sent again, held ranges
    /// excepted, and the final marker is sent again once it is due. Returns the bytes queued.
    pub fn on_link_lost(&mut self) -> u64 {
        let before = self.repair.total();
        self.repair.insert(0..self.next_new);
        for r in self.held_all.iter() {
            self.repair.remove(r);
        }
        self.recent_repairs.clear();
        self.copies = RangeSet::new();
        self.fin = Final::NotSent;
        self.repair.total().saturating_sub(before)
    }

    /// The next run to send, at most `max_len` bytes, or `None` when there is nothing to send.
    /// A [`RunKind::Held`] run is a whole held block, whatever `max_len` says.
    pub fn poll_run(&mut self, layout: &Layout, max_len: u64, now: Instant) -> Option<Run> {
        let max_len = max_len.max(1);
        let new_left = self.next_new < self.stripe_len;
        let repair_allowed = !self.repair.is_empty() && (!new_left || self.credit >= 0.0);
        let in_tail = !self.lossless && (!new_left || self.tail);
        let copy_due = !self.copies.is_empty() && (!new_left || (self.tail && self.credit >= 0.0));
        if repair_allowed || copy_due {
            // First copies, then second ones.
            let copy = !repair_allowed;
            let first = if copy {
                self.copies.first()?
            } else {
                self.repair.first()?
            };
            let to_block_end = layout.resolve(self.channel, first.start)?.to_block_end;
            let len = (first.end - first.start).min(to_block_end).min(max_len);
            let range = first.start..first.start + len;
            if copy {
                self.copies.remove(range);
            } else {
                self.repair.remove(range.clone());
                self.copies.remove(range.clone());
                if in_tail && self.copy_allowed(len, now) {
                    self.copies.insert(range);
                }
            }
            if new_left {
                self.credit -= len as f64;
            }
            self.stats.repair_bytes += len;
            if !self.cfg.repair_echo.is_zero() {
                if self.recent_repairs.len() >= RECENT_REPAIRS {
                    self.recent_repairs.pop_front();
                }
                self.recent_repairs
                    .push_back((now, first.start, first.start + len));
            }
            return Some(Run {
                pos: first.start,
                len,
                kind: RunKind::Repair,
            });
        }
        if !new_left {
            return None;
        }
        let pos = self.next_new;
        let to_block_end = layout.resolve(self.channel, pos)?.to_block_end;
        if self.held.contains(pos) {
            let len = to_block_end.min(self.stripe_len - pos);
            self.held.remove(pos..pos + len);
            self.next_new += len;
            self.stats.held_bytes += len;
            return Some(Run {
                pos,
                len,
                kind: RunKind::Held,
            });
        }
        // New data stops short of the next held block.
        let before_held = self
            .held
            .first()
            .map_or(u64::MAX, |h| h.start.saturating_sub(pos));
        let len = to_block_end
            .min(max_len)
            .min(self.stripe_len - pos)
            .min(before_held);
        self.next_new += len;
        self.stats.new_bytes += len;
        let share = self.cfg.repair_share.clamp(0.0, 0.95);
        self.credit =
            (self.credit + len as f64 * share / (1.0 - share)).min(self.cfg.credit_cap as f64);
        Some(Run {
            pos,
            len,
            kind: RunKind::New,
        })
    }

    /// Whether a second copy of a tail repair of `len` bytes fits `cfg.tail_copies` now (and
    /// counts it if so).
    fn copy_allowed(&mut self, len: u64, now: Instant) -> bool {
        let window = if self.cfg.repair_echo.is_zero() {
            Duration::from_millis(100)
        } else {
            self.cfg.repair_echo
        };
        let (since, used) = match self.copy_window {
            Some((since, used)) if now.saturating_duration_since(since) < window => (since, used),
            _ => (now, 0),
        };
        let fits = used + len <= self.cfg.tail_copies;
        self.copy_window = Some((since, if fits { used + len } else { used }));
        fits
    }

    /// The receiver asks for these stripe ranges again, knowing of what was sent up to `knew`
    /// ([`crate::wire::sent_at`] of the NACK's `knew_us`: what was sent later had not arrived
    /// when it asked). Ranges beyond what was sent are ignored (that data is on its way);
    /// returns the bytes newly queued.
    ///
    /// Bytes repaired after `knew`, or less than [`SendConfig::repair_echo`] before `now`, are
    /// not queued again: that repair had not arrived when the receiver asked. The first rule
    /// is for a NACK that comes late (after an outage, TCP brings the copies of NACKs whose
    /// datagrams were lost seconds after they were sent, asking for what has been repaired
    /// since); the second for a timely one, whose `knew` is about a round trip old, so it
    /// decides.
    pub fn on_nack(&mut self, ranges: &[(u64, u64)], now: Instant, knew: Instant) -> u64 {
        self.stats.nacks += 1;
        let keep = REPAIR_MEMORY.max(self.cfg.repair_echo);
        while self
            .recent_repairs
            .front()
            .is_some_and(|&(at, _, _)| at + keep <= now)
        {
            self.recent_repairs.pop_front();
        }
        // Repairs sent after this had not arrived when the receiver asked.
        let since = now
            .checked_sub(self.cfg.repair_echo)
            .map_or(knew, |echo| echo.min(knew));
        let unknown = self
            .recent_repairs
            .partition_point(|&(at, _, _)| at <= since);
        let mut queued = 0;
        for &(s, e) in ranges {
            let e = e.min(self.next_new);
            if s < e {
                self.stats.nacked_bytes += e - s;
                let echoes = |&&(_, rs, re): &&(Instant, u64, u64)| rs < e && s < re;
                let in_flight = self.recent_repairs.range(unknown..);
                if !in_flight.clone().any(|r| echoes(&r)) {
                    queued += self.repair.insert(s..e);
                    continue;
                }
                let mut asked = RangeSet::new();
                asked.insert(s..e);
                for &(_, rs, re) in in_flight.filter(echoes) {
                    asked.remove(rs..re);
                }
                for r in asked.iter() {
                    queued += self.repair.insert(r);
                }
            }
        }
        if queued > 0 && self.fin == Final::Acked {
            // A block failed verification after the stripe was confirmed: confirm again later.
            self.fin = Final::NotSent;
        }
        queued
    }

    /// The receiver holds the whole stripe.
    pub fn on_channel_done(&mut self) {
        if self.repair.is_empty() {
            self.fin = Final::Acked;
            self.copies = RangeSet::new();
        }
    }

    /// True when a final marker should be sent now (everything sent once, no repair pending,
    /// not yet confirmed, and the last marker is older than the resend interval).
    pub fn poll_final(&mut self, now: Instant) -> bool {
        if self.next_new < self.stripe_len || !self.repair.is_empty() {
            return false;
        }
        let due = match self.fin {
            Final::NotSent => true,
            Final::Sent(at) => now.saturating_duration_since(at) >= self.cfg.final_interval,
            Final::Acked => false,
        };
        if due {
            self.fin = Final::Sent(now);
            self.stats.finals += 1;
        }
        due
    }

    /// When `poll_final` may next return true, if the channel is waiting on its marker.
    pub fn next_timeout(&self) -> Option<Instant> {
        match self.fin {
            Final::Sent(at) if self.repair.is_empty() => Some(at + self.cfg.final_interval),
            _ => None,
        }
    }

    /// True when `poll_run` would return a run.
    pub fn has_work(&self) -> bool {
        self.next_new < self.stripe_len || !self.repair.is_empty() || !self.copies.is_empty()
    }

    /// Stripe length, which the final marker announces.
    pub fn stripe_len(&self) -> u64 {
        self.stripe_len
    }
}

/// Paces sending to a rate: a virtual clock that advances by each send's serialization time.
///
/// A driver that wakes late may send up to `burst` of the time it missed at once, never more
/// (a flood into a shallow queue). Time missed beyond that, up to [`MAX_OWED`], is owed: the
/// following sends go at [`CATCH_UP_GAIN`] times the rate until it is repaid, so that a sender
/// preempted for a few milliseconds on a busy machine still sends at its rate on average
/// (before, what it missed was lost: on the 2-core test machine, 3-5% of the rate at
/// 500 Mbit/s). A sender with nothing to send says so ([`Pacer::idle`]): idle time is not
/// owed.
///
/// Repaying a debt puts up to that much time of data into the bottleneck's queue (the link
/// idled while the sender did not send); the rate controller sees it as any queue, and must
/// not allow for it as the sender's own lump, as it does for the receiver's lag: where the
/// sender is late most of the time (a busy VM), that lets a queue of tens of milliseconds
/// stand and overflows the bottleneck's buffer.
#[derive(Debug, Clone)]
pub struct Pacer {
    bytes_per_sec: f64,
    next: Option<Instant>,
    burst: Duration,
    /// Missed time still to repay.
    owed: Duration,
    /// Missed time beyond the burst, in all (repaid or not).
    late: Duration,
    /// Missed time beyond `max_owed`: never repaid, the rate lost it.
    lost: Duration,
    /// Most missed time repaid ([`MAX_OWED`] unless [`Pacer::set_max_owed`] said otherwise).
    max_owed: Duration,
}

/// Most missed time a [`Pacer`] repays; beyond it, missed time is lost ([`Pacer::lost`]).
/// (Not more: where the rate is the path's, the link time a stall idled is gone, and repaying
/// it only queues. A cap of 40 ms, 100 ms or half the round trip repays more of a busy VM's
/// missed time but gains no goodput beyond its noise, and the bottleneck's queue drops more.)
pub const MAX_OWED: Duration = Duration::from_millis(10);
/// The rate, as a multiple of the pacer's, while missed time is repaid.
pub const CATCH_UP_GAIN: f64 = 1.25;

impl Pacer {
    /// A pacer for `bits_per_sec` (clamped to at least 8 kbit/s) allowing `burst` of catch-up.
    pub fn new(bits_per_sec: u64, burst: Duration) -> Self {
        Pacer {
            bytes_per_sec: (bits_per_sec.max(8_000) as f64) / 8.0,
            next: None,
            burst,
            owed: Duration::ZERO,
            late: Duration::ZERO,
            lost: Duration::ZERO,
            max_owed: MAX_OWED,
        }
    }
    /// Sets the most missed time the pacer repays from now on (what is owed beyond it is
    /// forgiven, not counted as lost): the rate controller's [`crate::rate::RateController::catch_up`].
    pub fn set_max_owed(&mut self, max_owed: Duration) {
        self.max_owed = max_owed;
        self.owed = self.owed.min(max_owed);
    }
    /// Changes the rate from `now` on: what is left of the wait for the next send is
    /// rescaled to the new rate. (At a low rate a run's wait is long, 0.18 s for four
    /// datagrams at 250 kbit/s a channel: kept at the old rate, a probe's higher rate did not
    /// show in what was sent while it lasted, a drain's lower one lasted past its end, and
    /// what a channel sent fell below the controller's rate, which the controller then took
    /// for the path's.)
    pub fn set_rate(&mut self, bits_per_sec: u64, now: Instant) {
        let new = (bits_per_sec.max(8_000) as f64) / 8.0;
        if let Some(next) = self.next.filter(|&n| n > now) {
            self.next = Some(now + (next - now).mul_f64(self.bytes_per_sec / new));
        }
        self.bytes_per_sec = new;
    }
    /// The current rate in bits per second.
    pub fn rate(&self) -> u64 {
        (self.bytes_per_sec * 8.0) as u64
    }
    /// When the next send may happen (`None`: now).
    pub fn ready_at(&self) -> Option<Instant> {
        self.next
    }
    /// True if a send may happen at `now`.
    pub fn can_send(&self, now: Instant) -> bool {
        self.next.is_none_or(|n| n <= now)
    }
    /// Accounts for `bytes` sent at `now`.
    pub fn on_sent(&mut self, now: Instant, bytes: u64) {
        // The first send starts the clock at `now`: no burst credit before anything was sent.
        let base = match self.next {
            None => now,
            Some(n) => {
                let floor = now.checked_sub(self.burst).unwrap_or(now);
                if n < floor {
                    let missed = floor - n;
                    self.late += missed;
                    let owed = self.owed + missed;
                    self.lost += owed.saturating_sub(self.max_owed);
                    self.owed = owed.min(self.max_owed);
                    floor
                } else {
                    n
                }
            }
        };
        let time = Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec);
        let repay = time.mul_f64(1.0 - 1.0 / CATCH_UP_GAIN).min(self.owed);
        self.owed -= repay;
        self.next = Some(base + time - repay);
    }

    /// The sender has nothing to send at the moment: the clock starts again with its next
    /// send, and nothing is owed (only a sender that wanted to send and could not owes time).
    pub fn idle(&mut self) {
        self.next = None;
        self.owed = Duration::ZERO;
    }

    /// Time the sender missed beyond the burst so far (woke too late to keep the rate), in
    /// all; what was repaid is counted too.
    pub fn late(&self) -> Duration {
        self.late
    }

    /// Time the sender missed beyond what it may owe ([`MAX_OWED`], or less: see
    /// [`Pacer::set_max_owed`]), in all: it was never
    /// made up, so the average rate fell short of the pacer's by this much time.
    pub fn lost(&self) -> Duration {
        self.lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout::new(&[10_000], 4096, 1).unwrap()
    }

    #[test]
    fn a_new_rate_rescales_the_wait_for_the_next_send() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut p = Pacer::new(1_000_000, Duration::ZERO);
        // 5,600 bytes at 1 Mbit/s: the next send 44.8 ms later.
        p.on_sent(t0, 5600);
        assert!(!p.can_send(t0 + ms(44)));
        // Ten times the rate 4.8 ms in: the 40 ms left are 4.
        p.set_rate(10_000_000, t0 + Duration::from_micros(4800));
        assert!(!p.can_send(t0 + ms(8)));
        assert!(p.can_send(t0 + ms(9)));
        // Back to 1 Mbit/s at once: the wait stretches again, from then.
        p.set_rate(1_000_000, t0 + Duration::from_micros(4800));
        assert!(!p.can_send(t0 + ms(44)));
        assert!(p.can_send(t0 + ms(45)));
        // A rate set while nothing is pending changes no send time.
        let mut idle = Pacer::new(1_000_000, Duration::ZERO);
        idle.set_rate(2_000_000, t0);
        assert!(idle.can_send(t0));
    }

    #[test]
    fn sends_new_data_in_block_sized_runs_then_final() {
        let l = layout();
        let mut s = ChannelSender::new(&l, 0, SendConfig::default());
        let runs: Vec<Run> = std::iter::from_fn(|| s.poll_run(&l, 3000, Instant::now())).collect();
        let lens: Vec<u64> = runs.iter().map(|r| r.len).collect();
        assert_eq!(lens, vec![3000, 1096, 3000, 1096, 1808]);
        let t0 = Instant::now();
        assert!(s.poll_final(t0));
        assert!(!s.poll_final(t0 + Duration::from_millis(10)));
        assert!(s.poll_final(t0 + Duration::from_millis(100)));
        s.on_channel_done();
        assert!(s.is_done());
        assert_eq!(s.next_timeout(), None);
    }

    #[test]
    fn a_round_trip_lowered_to_the_paths_sets_the_timers_a_quiet_handshake_would_have() {
        // A busy host: the key agreement took 40 ms on a 0.1 ms path. The final marker went
        // again only after 80 ms, and a NACK 20 ms after a repair of its bytes was taken
        // for one sent before that repair could arrive.
        let l = layout();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let sent_all = |s: &mut ChannelSender| {
            while s.new_remaining() > 0 {
                s.poll_run(&l, 1000, t0).unwrap();
            }
        };
        let mut s = ChannelSender::new(&l, 0, SendConfig::for_rtt(ms(40)));
        sent_all(&mut s);
        s.set_rtt(Duration::from_micros(100));
        let quiet = SendConfig::for_rtt(Duration::from_micros(100));
        assert_eq!(s.cfg.final_interval, quiet.final_interval);
        assert_eq!(s.cfg.repair_echo, quiet.repair_echo);
        assert!(s.poll_final(t0));
        assert!(!s.poll_final(t0 + ms(29)));
        assert!(s.poll_final(t0 + ms(31)), "again after 30 ms, not 80");
        // A repair at t0, then the receiver asks again 20 ms later: answered.
        s.on_nack(&[(0, 500)], t0, t0);
        assert_eq!(
            s.poll_run(&l, 1000, t0).map(|r| r.kind),
            Some(RunKind::Repair)
        );
        while s.poll_run(&l, 1000, t0).is_some() {}
        assert_eq!(s.on_nack(&[(0, 500)], t0 + ms(20), t0 + ms(20)), 500);
        // A sender configured without repair memory keeps none.
        let mut s = ChannelSender::new(&l, 0, SendConfig::default());
        s.set_rtt(ms(1));
        assert_eq!(s.cfg.repair_echo, Duration::ZERO);
    }

    #[test]
    fn repairs_are_bounded_while_new_data_flows() {
        let l = Layout::new(&[1 << 20], 1 << 20, 1).unwrap();
        let cfg = SendConfig {
            repair_share: 0.25,
            ..SendConfig::default()
        };
        let mut s = ChannelSender::new(&l, 0, cfg);
        for _ in 0..100 {
            s.poll_run(&l, 1000, Instant::now());
        }
        s.on_nack(&[(0, 100_000)], Instant::now(), Instant::now());
        let (mut new, mut rep) = (0, 0);
        for _ in 0..200 {
            let r = s.poll_run(&l, 1000, Instant::now()).unwrap();
            match r.kind {
                RunKind::New => new += r.len,
                RunKind::Repair => rep += r.len,
                RunKind::Held => unreachable!("nothing is held"),
            }
        }
        let share = rep as f64 / (new + rep) as f64;
        assert!(share > 0.2 && share < 0.4, "repair share {share}");
    }

    #[test]
    fn on_a_lossless_link_a_repair_goes_once_even_in_the_tail() {
        let l = layout();
        let mut s = ChannelSender::new(&l, 0, SendConfig::default());
        let t0 = Instant::now();
        while s.new_remaining() > 0 {
            s.poll_run(&l, 1000, t0).unwrap();
        }
        // All sent (the tail, whatever the driver says) and lost: it moves to TCP.
        s.on_link_lost();
        s.set_lossless();
        let mut repaired = 0;
        while let Some(r) = s.poll_run(&l, 1000, t0) {
            if r.kind == RunKind::Repair {
                repaired += r.len;
            }
        }
        assert_eq!(repaired, s.stripe_len(), "each byte once");
        // Without it, the tail's second copies follow.
        let mut s = ChannelSender::new(&l, 0, SendConfig::default());
        while s.new_remaining() > 0 {
            s.poll_run(&l, 1000, t0).unwrap();
        }
        s.on_link_lost();
        let mut repaired = 0;
        while let Some(r) = s.poll_run(&l, 1000, t0) {
            if r.kind == RunKind::Repair {
                repaired += r.len;
            }
        }
        assert!(repaired > s.stripe_len(), "{repaired}");
    }

    #[test]
    fn in_the_tail_the_driver_names_a_repair_goes_twice_while_new_data_is_left() {
        let l = layout();
        let cfg = SendConfig {
            repair_echo: Duration::from_millis(100),
            ..SendConfig::default()
        };
        let mut s = ChannelSender::new(&l, 0, cfg);
        let t0 = Instant::now();
        // Credit for repairs, then a loss.
        for _ in 0..3 {
            s.poll_run(&l, 1000, t0).unwrap();
        }
        s.set_tail(true);
        s.on_nack(&[(0, 500)], t0, t0);
        let mut repairs = Vec::new();
        while s.new_remaining() > 0 {
            let r = s.poll_run(&l, 1000, t0).unwrap();
            if r.kind == RunKind::Repair {
                repairs.push((r.pos, r.len));
            }
        }
        // Both copies went before the last new byte.
        assert_eq!(repairs, vec![(0, 500), (0, 500)]);
        // Outside the tail the same loss goes once.
        let mut s = ChannelSender::new(&l, 0, SendConfig::default());
        for _ in 0..3 {
            s.poll_run(&l, 1000, t0).unwrap();
        }
        s.on_nack(&[(0, 500)], t0, t0);
        let mut n = 0;
        while s.new_remaining() > 0 {
            n += usize::from(s.poll_run(&l, 1000, t0).unwrap().kind == RunKind::Repair);
        }
        assert_eq!(n, 1);
    }

    #[test]
    fn a_repair_in_the_tail_goes_twice_within_a_budget_and_one_before_it_once() {
        // One channel, blocks of 4096 over 10,000 bytes.
        let l = layout();
        let cfg = SendConfig {
            tail_copies: 3000,
            repair_echo: Duration::from_millis(100),
            ..SendConfig::default()
        };
        let mut s = ChannelSender::new(&l, 0, cfg);
        let t0 = Instant::now();
        let runs = |s: &mut ChannelSender, at| -> Vec<(u64, u64, RunKind)> {
            std::iter::from_fn(|| s.poll_run(&l, 1000, at))
                .map(|r| (r.pos, r.len, r.kind))
                .collect()
        };
        // While new data flows, a repair goes once.
        assert_eq!(s.poll_run(&l, 1000, t0).unwrap().len, 1000);
        s.on_nack(&[(0, 500)], t0, t0);
        let before_tail = runs(&mut s, t0);
        assert_eq!(
            before_tail
                .iter()
                .filter(|r| r.2 == RunKind::Repair)
                .collect::<Vec<_>>(),
            vec![&(0, 500, RunKind::Repair)]
        );
        // In the tail: each repair again after the first copies, 3000 bytes' worth per
        // window; what does not fit goes once.
        s.on_nack(&[(1000, 3000), (5000, 7000)], t0, t0);
        let tail = runs(&mut s, t0);
        assert_eq!(
            tail,
            vec![
                (1000, 1000, RunKind::Repair),
                (2000, 1000, RunKind::Repair),
                (5000, 1000, RunKind::Repair),
                (6000, 1000, RunKind::Repair),
                (1000, 1000, RunKind::Repair),
                (2000, 1000, RunKind::Repair),
                (5000, 1000, RunKind::Repair),
            ]
        );
        assert!(!s.has_work());
        // The next window has its own budget; a confirmed stripe drops what is left.
        let t1 = t0 + Duration::from_millis(150);
        s.on_nack(&[(8192, 9192)], t1, t1);
        assert_eq!(s.poll_run(&l, 1000, t1).unwrap().pos, 8192);
        assert!(s.has_work(), "its second copy");
        assert!(s.poll_final(t1));
        s.on_channel_done();
        assert!(s.is_done() && !s.has_work());
        assert_eq!(s.poll_run(&l, 1000, t1), None);
        // Without a budget, none.
        let mut none = ChannelSender::new(
            &l,
            0,
            SendConfig {
                tail_copies: 0,
                ..SendConfig::default()
            },
        );
        while none.poll_run(&l, 5000, t0).is_some() {}
        none.on_nack(&[(0, 100)], t0, t0);
        assert_eq!(runs(&mut none, t0), vec![(0, 100, RunKind::Repair)]);
    }

    #[test]
    fn nacks_for_unsent_data_are_ignored_and_reopen_a_confirmed_channel() {
        let l = layout();
        let mut s = ChannelSender::new(&l, 0, SendConfig::default());
        assert_eq!(s.on_nack(&[(0, 100)], Instant::now(), Instant::now()), 0);
        while s.poll_run(&l, 5000, Instant::now()).is_some() {}
        s.poll_final(Instant::now());
        s.on_channel_done();
        assert!(s.is_done());
        assert_eq!(
            s.on_nack(
                &[(4096, 8192), (9000, 20_000)],
                Instant::now(),
                Instant::now()
            ),
            4096 + 1000
        );
        assert!(!s.is_done());
        let r = s.poll_run(&l, 5000, Instant::now()).unwrap();
        assert_eq!((r.pos, r.len, r.kind), (4096, 4096, RunKind::Repair));
    }

    #[test]
    fn a_lost_link_queues_everything_sent_again_but_held_blocks() {
        // One channel, blocks of 4096 over 10,000 bytes; the middle block is held.
        let l = layout();
        let mut s = ChannelSender::new(&l, 0, SendConfig::default());
        s.hold(4096..8192);
        let t0 = Instant::now();
        // The first block and the held one are passed; the last one not yet.
        let first = s.poll_run(&l, 4096, t0).unwrap();
        assert_eq!((first.pos, first.len, first.kind), (0, 4096, RunKind::New));
        let held = s.poll_run(&l, 4096, t0).unwrap();
        assert_eq!(held.kind, RunKind::Held);
        assert_eq!(s.on_link_lost(), 4096);
        let again: Vec<(u64, u64, RunKind)> = std::iter::from_fn(|| s.poll_run(&l, 8192, t0))
            .map(|r| (r.pos, r.len, r.kind))
            .collect();
        // The lost block again (new data and repairs share the link), then the rest; the
        // held block is never sent.
        assert!(again.contains(&(0, 4096, RunKind::Repair)), "{again:?}");
        assert!(again.contains(&(8192, 1808, RunKind::New)), "{again:?}");
        assert_eq!(again.len(), 2, "{again:?}");
        // The final marker goes out again; a second loss before more was sent queues the same.
        assert!(s.poll_final(t0));
        assert_eq!(s.on_link_lost(), 4096 + 1808);
        assert!(!s.is_done());
    }

    #[test]
    fn held_blocks_are_passed_over_and_resent_only_when_asked() {
        // Two channels, blocks of 4096: channel 0 carries blocks 0, 2, 4 (stripe 0..12288).
        let l = Layout::new(&[5 * 4096], 4096, 2).unwrap();
        let mut s = ChannelSender::new(&l, 0, SendConfig::default());
        s.hold(4096..8192);
        let runs: Vec<(u64, u64, RunKind)> =
            std::iter::from_fn(|| s.poll_run(&l, 3000, Instant::now()))
                .map(|r| (r.pos, r.len, r.kind))
                .collect();
        assert_eq!(
            runs,
            vec![
                (0, 3000, RunKind::New),
                (3000, 1096, RunKind::New),
                (4096, 4096, RunKind::Held),
                (8192, 3000, RunKind::New),
                (11_192, 1096, RunKind::New),
            ]
        );
        assert_eq!(s.stats().held_bytes, 4096);
        assert_eq!(s.stats().new_bytes, 8192);
        // The receiver's copy of the held block turned out wrong: it is asked for and resent.
        assert!(s.poll_final(Instant::now()));
        assert_eq!(
            s.on_nack(&[(4096, 8192)], Instant::now(), Instant::now()),
            4096
        );
        let r = s.poll_run(&l, 5000, Instant::now()).unwrap();
        assert_eq!((r.pos, r.len, r.kind), (4096, 4096, RunKind::Repair));
        // In the tail: its second copy, then nothing.
        let r = s.poll_run(&l, 5000, Instant::now()).unwrap();
        assert_eq!((r.pos, r.len, r.kind), (4096, 4096, RunKind::Repair));
        assert_eq!(s.poll_run(&l, 5000, Instant::now()), None);
    }

    #[test]
    fn a_held_stripe_sends_no_data_but_still_ends_with_a_final_marker() {
        let l = layout();
        let mut s = ChannelSender::new(&l, 0, SendConfig::default());
        s.hold(0..4096);
        s.hold(4096..8192);
        s.hold(8192..10_000);
        let kinds: Vec<RunKind> = std::iter::from_fn(|| s.poll_run(&l, 1000, Instant::now()))
            .map(|r| r.kind)
            .collect();
        assert_eq!(kinds, vec![RunKind::Held; 3]);
        assert_eq!(s.stats().new_bytes, 0);
        assert!(s.poll_final(Instant::now()));
        // Holding what the cursor passed changes nothing.
        s.hold(0..4096);
        assert_eq!(s.poll_run(&l, 1000, Instant::now()), None);
    }

    /// A one-channel sender of 1 MiB, with a 50 ms repair echo, that sent it all at `t0`.
    fn all_sent(l: &Layout, t0: Instant) -> ChannelSender {
        let cfg = SendConfig {
            repair_echo: Duration::from_millis(50),
            ..SendConfig::default()
        };
        let mut s = ChannelSender::new(l, 0, cfg);
        while s.poll_run(l, 1 << 20, t0).is_some() {}
        s
    }

    #[test]
    fn a_nack_sent_before_a_repair_could_arrive_gets_no_second_copy() {
        let l = Layout::new(&[1 << 20], 1 << 20, 1).unwrap();
        let t0 = Instant::now();
        let mut s = all_sent(&l, t0);
        assert_eq!(s.on_nack(&[(1000, 3000)], t0, t0), 2000);
        let r = s.poll_run(&l, 1 << 20, t0).unwrap();
        assert_eq!((r.pos, r.len, r.kind), (1000, 2000, RunKind::Repair));
        // The receiver asks again, and more, before the repair could reach it: only the new
        // part is queued.
        let soon = t0 + Duration::from_millis(20);
        assert_eq!(s.on_nack(&[(1000, 4000)], soon, soon), 1000);
        let r = s.poll_run(&l, 1 << 20, soon).unwrap();
        assert_eq!((r.pos, r.len), (3000, 1000));
        // Asked again a round trip after the repair went out: it was lost, send it again.
        let later = t0 + Duration::from_millis(60);
        assert_eq!(s.on_nack(&[(1000, 3000)], later, later), 2000);
    }

    #[test]
    fn a_late_nack_gets_no_copy_of_a_repair_sent_after_what_it_knew() {
        let l = Layout::new(&[1 << 20], 1 << 20, 1).unwrap();
        let t0 = Instant::now();
        let mut s = all_sent(&l, t0);
        let at = |ms| t0 + Duration::from_millis(ms);
        // Asked at once (a timely NACK: it knew of everything sent up to 100 ms before).
        assert_eq!(s.on_nack(&[(1000, 3000)], at(100), t0), 2000);
        let r = s.poll_run(&l, 1 << 20, at(100)).unwrap();
        assert_eq!((r.pos, r.len), (1000, 2000));
        // Two seconds later a NACK sent before that repair could arrive (its datagram was lost,
        // TCP brought its copy): only what was never repaired is queued.
        assert_eq!(
            s.on_nack(&[(1000, 3000), (5000, 6000)], at(2100), at(90)),
            1000
        );
        let r = s.poll_run(&l, 1 << 20, at(2100)).unwrap();
        assert_eq!((r.pos, r.len), (5000, 1000));
        // One that knew of the repairs and still asks: they were lost, send again.
        assert_eq!(s.on_nack(&[(1000, 3000)], at(2200), at(2000)), 2000);
        // A NACK as old but later than the repairs are remembered is answered in full.
        let mut s = all_sent(&l, t0);
        s.on_nack(&[(1000, 3000)], at(100), t0);
        s.poll_run(&l, 1 << 20, at(100)).unwrap();
        let late = at(100) + REPAIR_MEMORY;
        assert_eq!(s.on_nack(&[(1000, 3000)], late, at(90)), 2000);
    }

    #[test]
    fn pacer_spaces_sends_at_the_rate() {
        let t0 = Instant::now();
        let mut p = Pacer::new(8_000_000, Duration::ZERO);
        assert!(p.can_send(t0));
        p.on_sent(t0, 1000);
        assert_eq!(p.ready_at(), Some(t0 + Duration::from_millis(1)));
        assert!(!p.can_send(t0 + Duration::from_micros(999)));
        assert!(p.can_send(t0 + Duration::from_millis(1)));
    }

    /// A sender that woke 5 ms late sends its burst at once, then repays the rest faster than
    /// the rate; one that was idle owes nothing.
    #[test]
    fn a_late_sender_catches_up_and_an_idle_one_does_not() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        // Bytes sent in the 40 ms from `woke` by a sender that sends whenever `p` lets it.
        let sent_after = |p: &mut Pacer, woke: Instant| {
            let (mut now, mut sent) = (woke, 0u64);
            while now < woke + ms(40) {
                if p.can_send(now) {
                    p.on_sent(now, 1000);
                    sent += 1000;
                } else {
                    now = p.ready_at().unwrap();
                }
            }
            sent
        };
        // 8 Mbit/s: 1000 bytes take 1 ms.
        let mut p = Pacer::new(8_000_000, ms(1));
        p.on_sent(t0, 1000);
        // Due at 1 ms, woke at 6 ms: 1 ms of it is burst, 4 ms owed. Over the 40 ms after
        // waking: the rate's 40 sends, the burst's one and the 4 owed.
        let woke = t0 + ms(6);
        assert_eq!(sent_after(&mut p, woke), 45_000);
        assert_eq!(p.late(), ms(4));
        assert_eq!(p.lost(), Duration::ZERO);
        // Without a debt, the same run sends at the rate.
        let mut q = Pacer::new(8_000_000, ms(1));
        q.on_sent(t0, 1000);
        q.idle();
        assert_eq!(sent_after(&mut q, woke), 40_000);
        assert_eq!(q.late(), Duration::ZERO);
        // Missed time beyond MAX_OWED is lost.
        let mut r = Pacer::new(8_000_000, ms(1));
        r.on_sent(t0, 1000);
        r.on_sent(t0 + ms(100), 1000);
        assert_eq!(r.late(), ms(98));
        assert_eq!(r.lost(), ms(98) - MAX_OWED);
        assert_eq!(r.owed, MAX_OWED - Duration::from_micros(200));
        // Allowed no catch-up (a shallow bottleneck): the same wake-up repays nothing, and a
        // debt already owed is forgiven.
        let mut s = Pacer::new(8_000_000, ms(1));
        s.set_max_owed(Duration::ZERO);
        s.on_sent(t0, 1000);
        assert_eq!(sent_after(&mut s, woke), 41_000);
        assert_eq!(s.late(), ms(4));
        assert_eq!(s.lost(), ms(4));
        r.set_max_owed(Duration::ZERO);
        assert_eq!(r.owed, Duration::ZERO);
    }
}
