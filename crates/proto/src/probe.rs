//! Path probing beside the data: which datagram payload the path carries, and whether UDP gets
//! through at all, found without a round trip spent only on probing.
//!
//! The sender probes every candidate size at once on every channel as soon as it knows the
//! receiver's ports, and repeats the probes not yet acknowledged every [`RESEND`]. Data does not
//! wait for them: it starts at the largest size already acknowledged everywhere, or else at
//! [`wire::DEFAULT_PAYLOAD`] (which fits a 1500-byte path under IPv4 and IPv6, the common
//! case), and [`PayloadProbe::poll`] says when to move to another size. The candidates are the
//! size asked for (jumbo frames by default), the largest a 1500-byte path carries under IPv4
//! ([`wire::IPV4_1500_PAYLOAD`]; under IPv6 the kernel refuses it at once) and under IPv6, the
//! default, 1200 and [`wire::MIN_PAYLOAD`]:
//!
//! | situation | decision |
//! |---|---|
//! | the largest size not refused locally is acknowledged on every channel | use it; done |
//! | a smaller size is acknowledged everywhere, a larger one is not after `grace` | use the largest acknowledged; done |
//! | the size in use is not acknowledged but a smaller one is (a path under 1500 bytes) | use the smaller one (the receiver asks again for what was lost) |
//! | the deadline passes with some channel acknowledging nothing and no data delivered | UDP is blocked |
//! | the deadline passes, and data was delivered | keep the size in use; done |
//!
//! `grace` is a hello round trip (50 ms at least): a larger size sent beside a smaller one
//! arrives about as soon. The deadline is 1.5 s, or three hello round trips on a longer path.
//! A size the local interface cannot carry is refused at once by the kernel (the sockets set
//! don't-fragment) and is dropped from the candidates ([`PayloadProbe::on_too_big`]).

use crate::wire::{self, HEADER_LEN};
use std::time::{Duration, Instant};

/// How often probes not yet acknowledged are sent again.
pub const RESEND: Duration = Duration::from_millis(100);
/// How long probing may take before UDP counts as blocked, at least (three hello round trips
/// on a longer path).
pub const DEADLINE: Duration = Duration::from_millis(1500);

/// How long after the start of its data phase the receiver waits, at least, before it calls a
/// channel on which nothing at all arrived (no probe, no data) silent ([`SilenceWatch`]; on a
/// longer path three round trips, see [`SilenceWatch::new`]). The
/// sender's probes went out at its `HelloAck` and go again every 100 ms after, each of every
/// size, and data goes on the same path from the `HelloAck` on: on a path that carries UDP at all, even
/// with a tenth of datagrams lost, a dozen probes and the data do not all vanish in this time.
pub const SILENT_AFTER: Duration = Duration::from_millis(300);

/// The receiver's watch for UDP that does not get through, in a session that may move its
/// channels to TCP ([`crate::wire::CAP_RACE`]): from the start of its data phase on, once [`SILENT_AFTER`] (or a
/// round trip, if longer) has passed, the channels on which nothing arrived are named once, for
/// a `UdpSilent`. The receiver judges from what it has (or has not) seen, at once; the sender
/// would judge from acknowledgements that cross the control connection, which a lost segment
/// there can hold back by a retransmission timeout.
///
/// A channel counts as silent only once the thread that reads it has been round its loop twice
/// after the wait (`passes`): a receiver starved of CPU, whose threads have not read their
/// sockets for a while, has not heard what is waiting there, and that is not silence.
#[derive(Debug, Clone)]
pub struct SilenceWatch {
    after: Duration,
    started: Option<Instant>,
    /// Each channel's passes when the wait was over.
    passes_then: Option<Vec<u64>>,
    done: bool,
}

impl SilenceWatch {
    /// A watch for a session whose round trip is about `rtt`: it waits [`SILENT_AFTER`] or three
    /// round trips, whichever is longer (a direct path's first datagram is due about one round
    /// trip into the receiver's data phase; the rest is margin for lost first tries). Channels
    /// through a relay wait longer ([`SilenceWatch::through_relay`]).
    pub fn new(rtt: Duration) -> SilenceWatch {
        SilenceWatch {
            after: SILENT_AFTER.max(rtt * 3),
            started: None,
            passes_then: None,
            done: false,
        }
    }

    /// The same watch for channels that go through a relay: two round trips longer. There the
    /// receiver's data phase starts before its channel sockets are bound at the relay, and the
    /// sender's datagrams are forwarded only once both ends are: on a 150 ms path the first
    /// datagram arrived 460-480 ms into the receiver's data phase, at the end of three round
    /// trips, where a direct path delivers within a few milliseconds of it.
    pub fn through_relay(mut self, rtt: Duration) -> SilenceWatch {
        self.after += rtt * 2;
        self
    }

    /// The data phase started at `now` (a second call changes nothing).
    pub fn start(&mut self, now: Instant) {
        self.started.get_or_insert(now);
    }

    /// When the wait is over, while the watch has not named its channels yet (after it, the
    /// verdict needs each channel's thread to have been round twice: poll at the driver's tick).
    pub fn next_check(&self) -> Option<Instant> {
        self.started
            .filter(|_| !self.done)
            .map(|started| started + self.after)
    }

    /// The silent channels of `channels`, once, when they are due. `seen(ch)` says whether
    /// anything arrived on channel `ch`, and how many passes its thread has made over its
    /// socket. Once every channel was heard by then, it names none.
    pub fn poll(
        &mut self,
        now: Instant,
        channels: u16,
        seen: impl Fn(u16) -> (bool, u64),
    ) -> Option<Vec<u16>> {
        let started = self.started.filter(|_| !self.done)?;
        if now < started + self.after {
            return None;
        }
        let Some(then) = &self.passes_then else {
            self.passes_then = Some((0..channels).map(|ch| seen(ch).1).collect());
            return None;
        };
        let mut silent = Vec::new();
        for ch in 0..channels {
            let (heard, passes) = seen(ch);
            if heard {
                continue;
            }
            if passes < then.get(usize::from(ch)).copied().unwrap_or(0) + 2 {
                // Its socket has not been read since: no verdict yet.
                return None;
            }
            silent.push(ch);
        }
        self.done = true;
        (!silent.is_empty()).then_some(silent)
    }
}

/// What the driver should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeDecision {
    /// Send data datagrams of this payload from now on.
    UsePayload(u16),
    /// No datagram of any size reached this channel by the deadline, and no data arrived.
    Blocked {
        /// The first channel that got nothing through.
        channel: u16,
        /// How long probing ran.
        after: Duration,
    },
}

/// The probing of one session (sans-IO: the driver sends, reads the acks, and keeps time).
#[derive(Debug, Clone)]
pub struct PayloadProbe {
    /// Payload sizes, largest first.
    candidates: Vec<u16>,
    /// `acked[size][channel]`.
    acked: Vec<Vec<bool>>,
    /// Sizes the local interface refused.
    too_big: Vec<bool>,
    start: Instant,
    deadline: Instant,
    /// How long probing may take: [`DEADLINE`], or three hello round trips.
    allowed: Duration,
    grace: Duration,
    /// When some size was first acknowledged everywhere.
    settled_at: Option<Instant>,
    /// When probes were last sent, and whether that was the first round.
    last_sent: Option<Instant>,
    first_sent: Option<Instant>,
    rtt: Option<Duration>,
    /// The payload data uses now.
    in_use: u16,
    done: bool,
}

impl PayloadProbe {
    /// Probing of up to `wanted` bytes of payload on `channels` channels, started at `now`
    /// after a hello that took `hello_rtt`.
    pub fn new(wanted: u16, channels: u16, hello_rtt: Duration, now: Instant) -> PayloadProbe {
        let mut candidates = vec![wanted.clamp(wire::MIN_PAYLOAD, wire::MAX_PAYLOAD)];
        for c in [
            wire::IPV4_1500_PAYLOAD,
            wire::IPV6_1500_PAYLOAD,
            wire::DEFAULT_PAYLOAD,
            1200,
            wire::MIN_PAYLOAD,
        ] {
            if c < candidates[candidates.len() - 1] {
                candidates.push(c);
            }
        }
        let n = candidates.len();
        let in_use = candidates
            .iter()
            .copied()
            .find(|&c| c <= wire::DEFAULT_PAYLOAD)
            .unwrap_or(wire::MIN_PAYLOAD);
        PayloadProbe {
            acked: vec![vec![false; usize::from(channels.max(1))]; n],
            too_big: vec![false; n],
            candidates,
            start: now,
            deadline: now + DEADLINE.max(hello_rtt * 3),
            allowed: DEADLINE.max(hello_rtt * 3),
            grace: hello_rtt.max(Duration::from_millis(50)),
            settled_at: None,
            last_sent: None,
            first_sent: None,
            rtt: None,
            in_use,
            done: false,
        }
    }

    /// The receiver reads its sockets from now on (it answers probes once its channel threads
    /// run, after the manifest and the skip list): the deadline runs from here, so that a slow
    /// set-up (files hashed, space preallocated) is not taken for a blocked path.
    pub fn receiver_ready(&mut self, now: Instant) {
        self.deadline = self.deadline.max(now + self.allowed);
    }

    /// The largest payload any probe tries: what buffers must hold.
    pub fn max_payload(&self) -> u16 {
        self.candidates[0]
    }

    /// The payload data should use now.
    pub fn payload(&self) -> u16 {
        self.in_use
    }

    /// Whether probing is over (the payload no longer changes).
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The shortest round trip of a first-round probe (a later round's ack may answer an
    /// earlier probe, so it says nothing about the time).
    pub fn rtt(&self) -> Option<Duration> {
        self.rtt
    }

    /// The probes to send now, as `(channel, payload)`: every size not yet acknowledged on a
    /// channel, when a round is due (at once, then every [`RESEND`]); none once done.
    pub fn to_send(&mut self, now: Instant) -> Vec<(u16, u16)> {
        if self.done || self.last_sent.is_some_and(|t| now < t + RESEND) {
            return Vec::new();
        }
        self.last_sent = Some(now);
        self.first_sent.get_or_insert(now);
        let mut out = Vec::new();
        for (i, &payload) in self.candidates.iter().enumerate() {
            if self.too_big[i] {
                continue;
            }
            for (ch, &acked) in self.acked[i].iter().enumerate() {
                if !acked {
                    out.push((ch as u16, payload));
                }
            }
        }
        out
    }

    /// The local interface refused a probe of `payload` bytes (`EMSGSIZE`).
    pub fn on_too_big(&mut self, payload: u16) {
        if let Some(i) = self.candidates.iter().position(|&c| c == payload) {
            self.too_big[i] = true;
            if self.in_use == payload {
                // Data cannot go out at this size either.
                if let Some(j) = (i + 1..self.candidates.len()).find(|&j| !self.too_big[j]) {
                    self.in_use = self.candidates[j];
                }
            }
        }
    }

    /// The receiver acknowledged a probe datagram of `datagram_len` bytes (header included) on
    /// `channel`, at `now`. Acks of unknown sizes or channels are ignored.
    pub fn on_ack(&mut self, channel: u16, datagram_len: usize, now: Instant) {
        let Some(i) = self
            .candidates
            .iter()
            .position(|&c| HEADER_LEN + usize::from(c) == datagram_len)
        else {
            return;
        };
        if let Some(a) = self.acked[i].get_mut(usize::from(channel)) {
            *a = true;
        } else {
            return;
        }
        // Only the first round's acks time a round trip.
        if let (Some(first), Some(last)) = (self.first_sent, self.last_sent) {
            if first == last {
                let sample = now.saturating_duration_since(first);
                self.rtt = Some(self.rtt.map_or(sample, |r| r.min(sample)));
            }
        }
    }

    /// The next time [`PayloadProbe::poll`] or [`PayloadProbe::to_send`] has something to do.
    pub fn next_timeout(&self) -> Option<Instant> {
        if self.done {
            return None;
        }
        let resend = self.last_sent.map(|t| t + RESEND);
        let settle = self.settled_at.map(|t| t + self.grace);
        [resend, settle, Some(self.deadline)]
            .into_iter()
            .flatten()
            .min()
    }

    /// What to do now; `delivered`: the receiver has reported data bytes (so the size in use
    /// gets through).
    pub fn poll(&mut self, now: Instant, delivered: bool) -> Option<ProbeDecision> {
        if self.done {
            return None;
        }
        if delivered {
            if let Some(i) = self.candidates.iter().position(|&c| c == self.in_use) {
                self.acked[i].iter_mut().for_each(|a| *a = true);
            }
        }
        let best = (0..self.candidates.len()).find(|&i| self.acked[i].iter().all(|&a| a));
        let Some(best) = best else {
            if now >= self.deadline {
                self.done = true;
                let channel = (0..self.acked[0].len())
                    .find(|&ch| !self.acked.iter().any(|a| a[ch]))
                    .unwrap_or(0);
                return Some(ProbeDecision::Blocked {
                    channel: channel as u16,
                    after: now.saturating_duration_since(self.start),
                });
            }
            return None;
        };
        let since = *self.settled_at.get_or_insert(now);
        // Larger sizes (the one in use among them, perhaps) may still come through: wait for
        // them a grace, or until the deadline.
        let larger_pending = (0..best).any(|j| !self.too_big[j]);
        if larger_pending && now < since + self.grace && now < self.deadline {
            return None;
        }
        self.done = true;
        let chosen = self.candidates[best];
        if chosen == self.in_use {
            return None;
        }
        self.in_use = chosen;
        Some(ProbeDecision::UsePayload(chosen))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn silent_channels_are_named_once_after_the_wait_and_heard_ones_never() {
        let t0 = Instant::now();
        let mut w = SilenceWatch::new(MS * 20);
        // Each channel's thread passes once per call here.
        let passes = std::cell::Cell::new(0u64);
        let poll = |w: &mut SilenceWatch, at: Duration, heard: fn(u16) -> bool| {
            passes.set(passes.get() + 1);
            let p = passes.get();
            w.poll(t0 + at, 3, |ch| (heard(ch), p))
        };
        // Nothing is judged before the data phase.
        assert_eq!(poll(&mut w, SILENT_AFTER * 10, |_| false), None);
        w.start(t0);
        w.start(t0 + SILENT_AFTER);
        assert_eq!(poll(&mut w, SILENT_AFTER - MS, |_| false), None);
        // The wait is over: the threads must read their sockets twice more first.
        assert_eq!(poll(&mut w, SILENT_AFTER, |_| false), None);
        assert_eq!(poll(&mut w, SILENT_AFTER + MS, |_| false), None);
        assert_eq!(
            poll(&mut w, SILENT_AFTER + MS * 2, |ch| ch == 1),
            Some(vec![0, 2])
        );
        assert_eq!(
            poll(&mut w, SILENT_AFTER * 2, |_| false),
            None,
            "named once"
        );
        // Every channel heard by then: none named, then or later.
        let mut w = SilenceWatch::new(MS);
        w.start(t0);
        for at in [SILENT_AFTER, SILENT_AFTER + MS, SILENT_AFTER + MS * 2] {
            assert_eq!(poll(&mut w, at, |_| true), None);
        }
        assert_eq!(poll(&mut w, SILENT_AFTER * 2, |_| false), None);
    }

    #[test]
    fn a_receiver_whose_threads_have_not_run_calls_nothing_silent() {
        let t0 = Instant::now();
        // A long path waits three round trips.
        let mut w = SilenceWatch::new(MS * 200);
        w.start(t0);
        assert_eq!(w.poll(t0 + SILENT_AFTER, 2, |_| (false, 5)), None);
        assert_eq!(w.poll(t0 + MS * 600, 2, |_| (false, 5)), None);
        // Starved: the channel threads have made no pass since the wait ended.
        for i in 1..100 {
            assert_eq!(w.poll(t0 + MS * (600 + i), 2, |_| (false, 5)), None);
        }
        // One thread ran twice (channel 0), the other once (channel 1): still nothing.
        assert_eq!(
            w.poll(t0 + MS * 800, 2, |ch| (false, if ch == 0 { 7 } else { 6 })),
            None
        );
        // Both read their sockets: what they did not hear is silent.
        assert_eq!(w.poll(t0 + MS * 801, 2, |_| (false, 7)), Some(vec![0, 1]));
        // Through a relay, two round trips more.
        let mut w = SilenceWatch::new(MS * 200).through_relay(MS * 200);
        w.start(t0);
        assert_eq!(w.next_check(), Some(t0 + MS * 1000));
    }

    fn len(payload: u16) -> usize {
        HEADER_LEN + usize::from(payload)
    }

    /// Acks every probe in `sent` whose payload passes `fits`, at `at`.
    fn ack_all(p: &mut PayloadProbe, sent: &[(u16, u16)], fits: impl Fn(u16) -> bool, at: Instant) {
        for &(ch, payload) in sent {
            if fits(payload) {
                p.on_ack(ch, len(payload), at);
            }
        }
    }

    #[test]
    fn data_starts_at_the_1500_byte_size_and_moves_up_when_jumbo_passes() {
        let t0 = Instant::now();
        let mut p = PayloadProbe::new(wire::MAX_PAYLOAD, 2, 20 * MS, t0);
        assert_eq!(p.payload(), wire::DEFAULT_PAYLOAD);
        assert_eq!(p.max_payload(), wire::MAX_PAYLOAD);
        let sent = p.to_send(t0);
        assert_eq!(sent.len(), 2 * 6, "every size on every channel");
        assert!(p.to_send(t0 + 10 * MS).is_empty(), "not before RESEND");
        ack_all(&mut p, &sent, |_| true, t0 + 20 * MS);
        assert_eq!(
            p.poll(t0 + 20 * MS, false),
            Some(ProbeDecision::UsePayload(wire::MAX_PAYLOAD))
        );
        assert!(p.is_done());
        assert_eq!(p.rtt(), Some(20 * MS));
        assert_eq!(p.poll(t0 + 30 * MS, true), None);
    }

    #[test]
    fn a_1500_byte_path_moves_data_up_to_the_largest_size_it_carries() {
        let t0 = Instant::now();
        // IPv4: the jumbo is refused by the interface, 1428 passes.
        let mut p = PayloadProbe::new(wire::MAX_PAYLOAD, 2, 100 * MS, t0);
        p.on_too_big(wire::MAX_PAYLOAD);
        let sent = p.to_send(t0);
        ack_all(&mut p, &sent, |_| true, t0 + 100 * MS);
        assert_eq!(
            p.poll(t0 + 100 * MS, true),
            Some(ProbeDecision::UsePayload(wire::IPV4_1500_PAYLOAD))
        );
        assert!(p.is_done());
        // IPv6: the interface refuses 1428 too.
        let mut p = PayloadProbe::new(wire::MAX_PAYLOAD, 2, 100 * MS, t0);
        p.on_too_big(wire::MAX_PAYLOAD);
        p.on_too_big(wire::IPV4_1500_PAYLOAD);
        let sent = p.to_send(t0);
        assert!(sent.iter().all(|&(_, s)| s <= wire::IPV6_1500_PAYLOAD));
        ack_all(&mut p, &sent, |_| true, t0 + 100 * MS);
        assert_eq!(
            p.poll(t0 + 100 * MS, true),
            Some(ProbeDecision::UsePayload(wire::IPV6_1500_PAYLOAD))
        );
    }

    #[test]
    fn a_path_a_little_under_1500_bytes_settles_on_the_default_after_the_grace() {
        let t0 = Instant::now();
        let mut p = PayloadProbe::new(wire::MAX_PAYLOAD, 2, 100 * MS, t0);
        let sent = p.to_send(t0);
        ack_all(&mut p, &sent, |s| s <= wire::DEFAULT_PAYLOAD, t0 + 100 * MS);
        // The default is in use and through: nothing changes, probing waits for the larger.
        assert_eq!(p.poll(t0 + 100 * MS, true), None);
        assert!(!p.is_done());
        assert_eq!(p.poll(t0 + 199 * MS, true), None);
        assert_eq!(
            p.poll(t0 + 200 * MS, true),
            None,
            "settled on the size in use"
        );
        assert!(p.is_done());
        assert_eq!(p.payload(), wire::DEFAULT_PAYLOAD);
    }

    #[test]
    fn a_narrow_tunnel_moves_data_down_to_what_passes() {
        let t0 = Instant::now();
        let mut p = PayloadProbe::new(wire::MAX_PAYLOAD, 1, 100 * MS, t0);
        let sent = p.to_send(t0);
        ack_all(&mut p, &sent, |s| s <= 1200, t0 + 100 * MS);
        // 1200 is through, the default (in use) is not yet known: wait out the grace.
        assert_eq!(p.poll(t0 + 150 * MS, false), None);
        assert_eq!(
            p.poll(t0 + 250 * MS, false),
            Some(ProbeDecision::UsePayload(1200))
        );
        assert_eq!(p.payload(), 1200);
    }

    #[test]
    fn sizes_the_interface_refuses_are_dropped_at_once() {
        let t0 = Instant::now();
        let mut p = PayloadProbe::new(wire::MAX_PAYLOAD, 1, 10 * MS, t0);
        p.on_too_big(wire::MAX_PAYLOAD);
        let sent = p.to_send(t0);
        assert!(sent.iter().all(|&(_, s)| s != wire::MAX_PAYLOAD));
        ack_all(&mut p, &sent, |_| true, t0 + 10 * MS);
        // Nothing larger is pending: done at once, on the largest acknowledged.
        assert_eq!(
            p.poll(t0 + 10 * MS, false),
            Some(ProbeDecision::UsePayload(wire::IPV4_1500_PAYLOAD))
        );
        assert!(p.is_done());
        // Refusing the size in use moves data down at once.
        let mut p = PayloadProbe::new(wire::MAX_PAYLOAD, 1, 10 * MS, t0);
        p.on_too_big(wire::DEFAULT_PAYLOAD);
        assert_eq!(p.payload(), 1200);
    }

    #[test]
    fn nothing_through_by_the_deadline_is_blocked_unless_data_arrived() {
        let t0 = Instant::now();
        let mut p = PayloadProbe::new(wire::MAX_PAYLOAD, 3, 10 * MS, t0);
        let mut rounds = 0;
        let mut t = t0;
        let decision = loop {
            if let Some(d) = p.poll(t, false) {
                break d;
            }
            if !p.to_send(t).is_empty() {
                rounds += 1;
            }
            t = p.next_timeout().unwrap();
            assert!(t <= t0 + DEADLINE);
        };
        assert_eq!(
            decision,
            ProbeDecision::Blocked {
                channel: 0,
                after: DEADLINE
            }
        );
        assert_eq!(rounds, 15, "a round every 100 ms");
        assert_eq!(t, t0 + DEADLINE);
        assert_eq!(p.poll(t, false), None, "decided once");
        // Data that arrived says the size in use passes even if every probe was lost.
        let mut r = PayloadProbe::new(wire::MAX_PAYLOAD, 3, 10 * MS, t0);
        r.to_send(t0);
        assert_eq!(r.poll(t0 + DEADLINE, true), None);
        assert!(r.is_done());
        assert_eq!(r.payload(), wire::DEFAULT_PAYLOAD);
    }

    #[test]
    fn a_long_path_gets_three_round_trips_and_a_round_trip_of_grace() {
        let t0 = Instant::now();
        let rtt = 600 * MS;
        let mut p = PayloadProbe::new(wire::MAX_PAYLOAD, 1, rtt, t0);
        p.to_send(t0);
        assert_eq!(
            p.poll(t0 + 1700 * MS, false),
            None,
            "before three round trips"
        );
        match p.poll(t0 + 1800 * MS, false) {
            Some(ProbeDecision::Blocked { channel: 0, after }) => assert_eq!(after, 1800 * MS),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_deadline_runs_from_when_the_receiver_reads() {
        let t0 = Instant::now();
        let mut p = PayloadProbe::new(wire::MAX_PAYLOAD, 1, 10 * MS, t0);
        p.to_send(t0);
        // The receiver took 3 s to decide on the manifest.
        let ready = t0 + Duration::from_secs(3);
        p.receiver_ready(ready);
        assert_eq!(p.poll(ready, false), None, "not blocked yet");
        assert!(!p.to_send(ready).is_empty(), "a round is due at once");
        assert!(matches!(
            p.poll(ready + DEADLINE, false),
            Some(ProbeDecision::Blocked { .. })
        ));
    }

    #[test]
    fn acks_of_unknown_sizes_and_channels_are_ignored() {
        let t0 = Instant::now();
        let mut p = PayloadProbe::new(wire::MAX_PAYLOAD, 1, 10 * MS, t0);
        p.to_send(t0);
        p.on_ack(7, len(wire::DEFAULT_PAYLOAD), t0);
        p.on_ack(0, 3, t0);
        assert_eq!(p.poll(t0 + 10 * MS, false), None);
        assert!(!p.is_done());
    }
}
