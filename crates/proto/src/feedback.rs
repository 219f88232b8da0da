//! The receiver's feedback over UDP, beside the control connection.
//!
//! The receiver's `Report`s (several per round trip) and `Nack`s go on the control connection,
//! which is TCP: reliable, but in order. On a path that loses 1% of packets each way, a lost
//! segment holds back everything behind it until TCP resends it, about a round trip later; with
//! a NACK per loss that is several stalls a second, and the sender's rate controller spent
//! 40% of a 150 ms intercontinental transfer waiting for reports held behind a lost one
//! (figures in BENCHMARKS.md's git history). So every `Report` and `Nack` also goes as a datagram
//! ([`Kind::Feedback`]) from one of the receiver's channel sockets to the sender's socket of
//! that channel. Each copy stands alone: a lost datagram costs only itself. Every NACK goes on
//! TCP too (which also carries the feedback where UDP from the receiver does not get back at
//! all). A report goes on TCP too where its datagram could not leave, while the path loses (a
//! report that counted a loss, and for two seconds after it), and otherwise every second report
//! interval ([`TcpCopies`] decides): on a path that loses nothing, a lost
//! report datagram costs only that interval's report (the next comes an interval later), were
//! all of them lost the sender still has a report every two intervals, within the silence its
//! controller allows, and each TCP copy left out spares both sides a wake-up of their control
//! threads and session loops.
//!
//! The sender acts on the first copy of each message and drops the other ([`Dedup`]): a
//! `Report` carries the session's count of reports, and one no newer than the newest taken is
//! dropped (its twin came first, or a newer report did: a late report only misleads); a `Nack`
//! carries its channel's count, and each count is acted on once (a NACK twice would send the
//! repairs twice).
//!
//! A feedback datagram is a 28-byte header ([`crate::wire`]; kind 5, channel 0, the session id,
//! a packet number of its own space, file, offset and timestamp 0), the message's postcard encoding, and
//! a 16-byte tag made with the session's feedback key ([`crate::secure::SessionKeys`]; sealed
//! also with `--no-encryption`: a forged report could slow a transfer, a forged NACK waste it).
//! Only `Report` and `Nack` are accepted in one; a message longer than [`MAX_BODY`] goes on the
//! control connection only. A receiver's NACK holds no more ranges than fit one
//! ([`NACK_RANGES_BUDGET`], [`nack_range_len`]; the rest follow in the next NACK): a NACK on
//! TCP alone comes late whenever TCP is recovering (after an outage, behind a lost segment),
//! and the sender, which takes a NACK for ranges it repaired more than a round trip ago for a
//! lost repair, sends again what its repairs had delivered meanwhile (after a 3 s outage
//! on a long path the asks for the outage's data, in NACKs of hundreds of ranges on TCP
//! alone, had tens of megabytes repaired twice). A NACK's copy on TCP can still come seconds
//! late after an outage when its datagram was lost: so it says what it knew of (`knew_us`),
//! and the sender does not repeat a repair sent after that.

use crate::secure::TAG_LEN;
use crate::wire::{Control, Header, Kind, HEADER_LEN};
use std::time::{Duration, Instant};

/// Longest message body a feedback datagram carries: with its header and tag it fits a
/// 1280-byte IPv6 minimum MTU (a NACK of many ranges is longer and goes on TCP only).
pub const MAX_BODY: usize = 1280 - 48 - HEADER_LEN - TAG_LEN;

/// Most bytes a NACK's ranges may take ([`nack_range_len`] each) for the NACK to fit a
/// feedback datagram whatever its channel and count: the rest of its body (the message's
/// variant, its channel, its count, the ranges' number and `knew_us`, varints) takes at most 33.
pub const NACK_RANGES_BUDGET: usize = MAX_BODY - (5 + 3 + 10 + 10 + 5);

/// The bytes the stripe range `(start, end)` takes in a NACK's body: two varints.
pub fn nack_range_len(start: u64, end: u64) -> usize {
    varint_len(start) + varint_len(end)
}

/// The length of `v` as a postcard varint: seven bits a byte.
fn varint_len(v: u64) -> usize {
    (64 - v.leading_zeros()).max(1).div_ceil(7) as usize
}

/// The channel field of every feedback datagram: feedback has a packet number space (and key)
/// of its own, whatever socket it leaves from.
pub const FEEDBACK_CHANNEL: u16 = 0;

/// Why a feedback datagram was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FeedbackError {
    /// No header, or not a feedback datagram of this session.
    #[error("not a feedback datagram of this session")]
    NotFeedback,
    /// The body does not decode to one message.
    #[error("malformed feedback")]
    Malformed,
    /// A message that has no business in a datagram.
    #[error("{0} is not feedback")]
    Kind(&'static str),
}

/// Whether `msg` may go as a feedback datagram.
pub fn is_feedback(msg: &Control) -> bool {
    matches!(msg, Control::Report { .. } | Control::Nack { .. })
}

/// The frame of a feedback datagram carrying `msg` (header, body, and [`TAG_LEN`] bytes of
/// room for the tag), to be sealed with the feedback key; `None` for a message that is not
/// feedback or is longer than [`MAX_BODY`].
pub fn encode(msg: &Control, session: u32, packet: u64) -> Option<Vec<u8>> {
    if !is_feedback(msg) {
        return None;
    }
    let body = postcard::to_allocvec(msg).ok()?;
    if body.len() > MAX_BODY {
        return None;
    }
    let mut frame = vec![0u8; HEADER_LEN + body.len() + TAG_LEN];
    Header {
        kind: Kind::Feedback,
        flags: 0,
        channel: FEEDBACK_CHANNEL,
        session,
        packet,
        file: 0,
        offset: 0,
        len: 0,
        sent_us: 0,
    }
    .encode(&mut frame);
    frame[HEADER_LEN..HEADER_LEN + body.len()].copy_from_slice(&body);
    Some(frame)
}

/// The message of an opened feedback datagram (header and body, no tag) of `session`.
pub fn decode(plain: &[u8], session: u32) -> Result<Control, FeedbackError> {
    let (h, body) = Header::decode(plain).map_err(|_| FeedbackError::NotFeedback)?;
    if h.kind != Kind::Feedback || h.session != session || h.channel != FEEDBACK_CHANNEL {
        return Err(FeedbackError::NotFeedback);
    }
    let msg = Control::from_body(body).map_err(|_| FeedbackError::Malformed)?;
    if !is_feedback(&msg) {
        return Err(FeedbackError::Kind(msg.name()));
    }
    Ok(msg)
}

/// NACK counts remembered per channel below the highest seen: a copy later than this many of
/// its channel's NACKs is dropped (the receiver asks again after its retry time if still
/// missing).
const NACK_WINDOW: u64 = 128;

/// The sender's filter of feedback copies (see the module docs): each `Report` and `Nack` is
/// let through once, whichever path brought it first.
#[derive(Debug, Clone, Default)]
pub struct Dedup {
    /// The newest report taken (0: none).
    report: u64,
    /// Per channel: one past the highest NACK count taken, and which of the [`NACK_WINDOW`]
    /// below it were taken (bit `i`: count `top - 1 - i`).
    nacks: Vec<(u64, u128)>,
    /// Copies dropped so far.
    pub dropped: u64,
}

impl Dedup {
    /// A filter that has let nothing through yet.
    pub fn new() -> Dedup {
        Dedup::default()
    }

    /// Whether to act on `msg`: true for anything but feedback, and for the first copy of a
    /// report newer than any taken or of a NACK not yet taken. Counts 0 (no count) always pass.
    pub fn admit(&mut self, msg: &Control) -> bool {
        let fresh = match *msg {
            Control::Report { seq, .. } => self.report(seq),
            Control::Nack { channel, seq, .. } => self.nack(channel, seq),
            _ => true,
        };
        if !fresh {
            self.dropped += 1;
        }
        fresh
    }

    fn report(&mut self, seq: u64) -> bool {
        if seq == 0 {
            return true;
        }
        let fresh = seq > self.report;
        self.report = self.report.max(seq);
        fresh
    }

    fn nack(&mut self, channel: u16, seq: u64) -> bool {
        if seq == 0 {
            return true;
        }
        let ch = usize::from(channel);
        if self.nacks.len() <= ch {
            self.nacks.resize(ch + 1, (0, 0));
        }
        let (top, bits) = &mut self.nacks[ch];
        if seq >= *top {
            let shift = seq + 1 - *top;
            *bits = if shift >= 128 { 0 } else { *bits << shift };
            // The one just below the new top is the previous top's slot moved: mark `seq`.
            *bits |= 1;
            *top = seq + 1;
            return true;
        }
        let back = *top - 1 - seq;
        if back >= NACK_WINDOW {
            return false;
        }
        let bit = 1u128 << back;
        let fresh = *bits & bit == 0;
        *bits |= bit;
        fresh
    }
}

/// Which reports go on the control connection too, beside their datagram (the engine's
/// receiver and netsim's both ask it). The TCP copy is what a lost datagram falls back on; on
/// a path that loses nothing it mostly duplicates what came already, and it costs both sides
/// a seal, a write, a read and a wake-up of their session loops, up to 100 times a second on
/// a short path. So a report goes on TCP too where its datagram did not leave (the sender not
/// heard yet, a full socket buffer), while the path loses (a report that counted a loss, and
/// for [`LOSS_HOLD`] after it: datagram copies may be lost too, and each report's losses count
/// once), and otherwise when two report intervals have passed since the last report on TCP:
/// were every datagram lost (a return path that drops UDP), the sender still gets a report at
/// least every two intervals, within the four after which its controller calls it silence
/// ([`crate::rate::SILENCE_REPORTS`]).
#[derive(Debug, Default)]
pub struct TcpCopies {
    /// When the last report went on TCP.
    last: Option<Instant>,
    /// Until when the path counts as losing.
    losing_until: Option<Instant>,
}

/// How long after a report that counted a loss every report goes on TCP too.
pub const LOSS_HOLD: Duration = Duration::from_secs(2);

impl TcpCopies {
    /// Whether `report`, built at `now` with reports due every `every`, goes on TCP too;
    /// `datagram` says whether its datagram copy left.
    pub fn wanted(
        &mut self,
        now: Instant,
        every: Duration,
        report: &Control,
        datagram: bool,
    ) -> bool {
        if matches!(report, Control::Report { lost, .. } if *lost > 0) {
            self.losing_until = Some(now + LOSS_HOLD);
        }
        let losing = self.losing_until.is_some_and(|until| now < until);
        let due = self
            .last
            .is_none_or(|last| now.saturating_duration_since(last) >= every * 2);
        let go = !datagram || losing || due;
        if go {
            self.last = Some(now);
        }
        go
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secure::testing_keys;
    use proptest::prelude::*;

    fn report(seq: u64) -> Control {
        Control::Report {
            train_kbps: 0,
            seq,
            received: 1,
            rejected: 0,
            socket_drops: 0,
            interval_us: 40_000,
            bytes: 1_000_000,
            datagrams: 700,
            lost: 7,
            drops: 0,
            queue_delay_us: 1200,
            queue_fill: 10,
            lateness_us: 100,
            disk_wait_us: 0,
            disk_fill: 0,
        }
    }

    fn nack(channel: u16, seq: u64) -> Control {
        Control::Nack {
            channel,
            seq,
            ranges: vec![(0, 1400), (14_000, 15_400)],
            knew_us: 123_456,
        }
    }

    #[test]
    fn a_sealed_report_opens_to_itself_and_only_with_the_feedback_key() {
        let (sender, receiver) = testing_keys();
        let mut frame = encode(&report(9), 77, 5).unwrap();
        receiver.feedback.sealer().seal(&mut frame).unwrap();
        // The data key of the same session does not open it.
        let mut wrong = frame.clone();
        assert!(sender
            .data
            .opener(FEEDBACK_CHANNEL)
            .open(&mut wrong)
            .is_err());
        let mut open = sender.feedback.opener(FEEDBACK_CHANNEL);
        let plain = open.open(&mut frame).unwrap();
        assert_eq!(decode(plain, 77).unwrap(), report(9));
        // Another session's id is not this session's feedback.
        let mut again = encode(&report(9), 77, 6).unwrap();
        receiver.feedback.sealer().seal(&mut again).unwrap();
        let plain = open.open(&mut again).unwrap();
        assert_eq!(decode(plain, 78), Err(FeedbackError::NotFeedback));
    }

    #[test]
    fn only_reports_and_nacks_go_and_none_too_long() {
        assert!(encode(&Control::KeepAlive, 1, 1).is_none());
        assert!(encode(&Control::ChannelDone { channel: 0 }, 1, 1).is_none());
        let long = Control::Nack {
            channel: 0,
            seq: 1,
            ranges: (0..200u64).map(|i| (i << 40, (i << 40) + 1400)).collect(),
            knew_us: 0,
        };
        assert!(encode(&long, 1, 1).is_none());
        assert!(encode(&nack(3, 1), 1, 1).unwrap().len() <= 1280 - 48);
        // A frame that claims feedback but carries another message is refused.
        let mut frame = encode(&nack(3, 1), 1, 1).unwrap();
        let body = postcard::to_allocvec(&Control::KeepAlive).unwrap();
        frame.truncate(HEADER_LEN);
        frame.extend_from_slice(&body);
        assert_eq!(decode(&frame, 1), Err(FeedbackError::Kind("KeepAlive")));
        assert_eq!(
            decode(&frame[..HEADER_LEN - 1], 1),
            Err(FeedbackError::NotFeedback)
        );
    }

    proptest! {
        /// Ranges within the budget make a NACK that fits a feedback datagram, whatever its
        /// channel, count and positions (varints of every length, up to the largest).
        #[test]
        fn a_nack_within_the_budget_fits_a_datagram(
            channel in any::<u16>(),
            seq in any::<u64>(),
            knew_us in any::<u32>(),
            ends in proptest::collection::vec(any::<u64>(), 1..400),
        ) {
            let mut budget = NACK_RANGES_BUDGET;
            let mut ranges = Vec::new();
            for e in ends {
                let r = (e / 2, e);
                let n = nack_range_len(r.0, r.1);
                if n > budget {
                    break;
                }
                budget -= n;
                ranges.push(r);
            }
            let body = postcard::to_allocvec(&Control::Nack { channel, seq, ranges: ranges.clone(), knew_us })
                .unwrap();
            prop_assert!(body.len() <= MAX_BODY, "{} > {MAX_BODY}", body.len());
            let nack = Control::Nack { channel, seq, ranges, knew_us };
            prop_assert!(encode(&nack, 1, 1).is_some());
        }
    }

    #[test]
    fn a_range_s_length_is_its_two_varints() {
        assert_eq!(nack_range_len(0, 127), 2);
        assert_eq!(nack_range_len(128, 16_383), 4);
        assert_eq!(nack_range_len(16_384, u64::MAX), 3 + 10);
        for v in [0u64, 1, 127, 128, 300, 1 << 35, u64::MAX] {
            let encoded = postcard::to_allocvec(&(v, v)).unwrap();
            assert_eq!(encoded.len(), nack_range_len(v, v), "{v}");
        }
    }

    #[test]
    fn each_report_passes_once_and_never_after_a_newer_one() {
        let mut d = Dedup::new();
        assert!(d.admit(&report(1)));
        assert!(
            !d.admit(&report(1)),
            "the TCP twin of a report taken over UDP"
        );
        assert!(d.admit(&report(3)));
        assert!(!d.admit(&report(2)), "older than one taken: stale");
        assert!(d.admit(&report(4)));
        assert!(d.admit(&Control::KeepAlive));
        assert_eq!(d.dropped, 2);
    }

    #[test]
    fn each_nack_passes_once_per_channel_in_any_order() {
        let mut d = Dedup::new();
        assert!(d.admit(&nack(0, 2)));
        assert!(
            d.admit(&nack(0, 1)),
            "its UDP copy was lost; the TCP copy is late"
        );
        assert!(!d.admit(&nack(0, 2)));
        assert!(!d.admit(&nack(0, 1)));
        assert!(d.admit(&nack(1, 1)), "channels count apart");
        assert!(d.admit(&nack(0, 200)));
        assert!(d.admit(&nack(0, 100)));
        assert!(!d.admit(&nack(0, 60)), "too old to tell: dropped");
        assert!(!d.admit(&nack(0, 200)));
        assert!(d.admit(&nack(300, 1)));
    }

    proptest! {
        /// Whatever the order and copies, each NACK count within the window passes exactly
        /// once.
        #[test]
        fn every_nack_count_passes_exactly_once(
            order in proptest::collection::vec((1u64..100, 0u8..2), 1..400),
        ) {
            let mut d = Dedup::new();
            let mut passed = std::collections::HashSet::new();
            for (seq, ch) in order {
                if d.admit(&nack(u16::from(ch), seq)) {
                    prop_assert!(passed.insert((ch, seq)), "{seq} on {ch} passed twice");
                }
            }
        }

        /// Arbitrary bytes never panic the decoder.
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes, 0);
        }
    }

    /// [`report`]`(seq)` with `lost` datagrams missing in its interval.
    fn report_lost(seq: u64, lost: u64) -> Control {
        let mut r = report(seq);
        if let Control::Report { lost: l, .. } = &mut r {
            *l = lost;
        }
        r
    }

    #[test]
    fn reports_go_on_tcp_while_the_path_loses_and_every_other_interval_otherwise() {
        let t0 = Instant::now();
        let every = Duration::from_millis(10);
        let mut copies = TcpCopies::default();
        // Each report goes on TCP where its datagram did not leave (sender not heard yet).
        for seq in 1..=3 {
            let now = t0 + every * seq as u32;
            assert!(
                copies.wanted(now, every, &report_lost(seq, 0), false),
                "{seq}"
            );
        }
        // A path that loses nothing: at least every second report goes on TCP (were all the
        // datagrams lost, the sender still hears every two intervals), and no more.
        let mut on_tcp = Vec::new();
        for seq in 4..=23 {
            let now = t0 + every * seq as u32;
            if copies.wanted(now, every, &report_lost(seq, 0), true) {
                on_tcp.push(seq);
            }
        }
        assert_eq!(on_tcp, (5..=23).step_by(2).collect::<Vec<_>>());
        // Reports that come late (the timer ran late) still go at least every two intervals.
        let late = t0 + every * 23 + every * 3;
        assert!(copies.wanted(late, every, &report_lost(24, 0), true));
        // A report that counted a loss goes on TCP, and so does every one for LOSS_HOLD after.
        let lossy = late + every;
        assert!(copies.wanted(lossy, every, &report_lost(25, 2), true));
        let mut t = lossy;
        let mut seq = 26;
        while t + every < lossy + LOSS_HOLD {
            t += every;
            assert!(copies.wanted(t, every, &report_lost(seq, 0), true), "{seq}");
            seq += 1;
        }
        // Then every other one again.
        t = lossy + LOSS_HOLD + every;
        assert!(copies.wanted(t, every, &report_lost(seq, 0), true));
        assert!(!copies.wanted(t + every, every, &report_lost(seq + 1, 0), true));
        assert!(copies.wanted(t + every * 2, every, &report_lost(seq + 2, 0), true));
    }
}
