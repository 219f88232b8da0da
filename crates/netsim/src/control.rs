//! The modelled control connection: one direction of the session's TCP control stream, on the
//! virtual clock.
//!
//! # What this module owns
//!
//! - **The path** (`ControlPath`, crate-internal): reliable and in order, with a one-way delay.
//!   During a blackout it stalls and delivers what was sent once the blackout ends, or, with a
//!   retransmission timeout (`with_rto`), at TCP's first retransmission after it, its timer
//!   doubling from the blackout's start. Messages really are framed with
//!   [`Control::to_frame`] and parsed with [`Control::frame_len`] / [`Control::from_body`], so
//!   a frame the engine's reader would refuse is refused here too. The writer can close its
//!   direction; the reader sees the end after everything sent before it.
//! - **Its faults** ([`Fault`]): what goes wrong at one genuine message of a direction (a
//!   message inserted, replaced, lost or duplicated, garbage, an oversized length prefix, or
//!   silence from it on), applied by the path when that message is sent.
//!
//! # What it does not own
//!
//! Its users. The data phase ([`crate::pair`]) runs one path each way beside its data link;
//! whole sessions ([`crate::whole_session`]) run their set-up over the same two and say which faults
//! hit which direction ([`crate::whole_session::ControlFault`]). This module imports neither: the
//! delay, blackouts, timer and faults come in as plain values.

use hurtle_proto::wire::{Control, FrameError, MAX_FRAME};
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// Something that goes wrong on the control path toward one side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// This message arrives just before the genuine one.
    Insert(Control),
    /// This message arrives instead of the genuine one.
    Replace(Control),
    /// The genuine message is lost (TCP would not lose it: a bug of the peer's driver).
    Drop,
    /// The genuine message arrives twice.
    Duplicate,
    /// A frame of these bytes (with a correct length prefix) arrives just before the genuine
    /// message.
    Garbage(Vec<u8>),
    /// A length prefix beyond the frame limit arrives just before the genuine message.
    Oversized,
    /// Neither the genuine message nor anything after it arrives, not even the end of the
    /// connection: the peer or the path hung.
    Silence,
}

/// The control connection in one direction: reliable, in order, delayed; stalled by blackouts.
/// Whole sessions ([`crate::whole_session`]) can also make it misbehave
/// ([`crate::whole_session::ControlFault`]: a message
/// inserted, replaced, duplicated, garbage, silence from some message on) and close it.
#[derive(Debug)]
pub(crate) struct ControlPath {
    t0: Instant,
    delay: Duration,
    blackouts: Vec<(Duration, Duration)>,
    /// TCP's first retransmission timeout in a blackout, if modelled (see
    /// [`Scenario::control_rto`](crate::pair::Scenario::control_rto)).
    rto: Option<Duration>,
    queue: VecDeque<(Instant, Vec<u8>)>,
    last: Instant,
    /// Messages handed to [`ControlPath::send`] (the genuine ones), by kind.
    pub(crate) by_kind: BTreeMap<&'static str, u64>,
    /// Genuine messages handed to [`ControlPath::send`] so far.
    genuine: usize,
    /// What goes wrong, at which genuine message (0 = the first).
    faults: Vec<(usize, Fault)>,
    /// From a [`Fault::Silence`] on, nothing gets through, not even the close.
    silent: bool,
    /// The writer closed the connection: nothing more is sent; the reader sees the end at
    /// this time (after everything sent before).
    closed: bool,
    closed_at: Option<Instant>,
    close_seen: bool,
}

impl ControlPath {
    pub(crate) fn new(t0: Instant, delay: Duration, blackouts: Vec<(Duration, Duration)>) -> Self {
        ControlPath {
            t0,
            delay,
            blackouts,
            rto: None,
            queue: VecDeque::new(),
            last: t0,
            by_kind: BTreeMap::new(),
            genuine: 0,
            faults: Vec::new(),
            silent: false,
            closed: false,
            closed_at: None,
            close_seen: false,
        }
    }

    /// Models TCP's retransmission timer in blackouts, starting at `rto` (see
    /// [`Scenario::control_rto`](crate::pair::Scenario::control_rto)).
    pub(crate) fn with_rto(mut self, rto: Option<Duration>) -> Self {
        self.rto = rto;
        self
    }

    /// Adds faults: each applies when the genuine message with its number is sent.
    pub(crate) fn with_faults(mut self, faults: Vec<(usize, Fault)>) -> Self {
        self.faults = faults;
        self
    }

    pub(crate) fn send(&mut self, now: Instant, msg: &Control) {
        if self.closed {
            return;
        }
        let n = self.genuine;
        self.genuine += 1;
        *self.by_kind.entry(msg.name()).or_default() += 1;
        if self.faults.is_empty() {
            self.enqueue(now, msg.to_frame());
            return;
        }
        let mut frames = Vec::new();
        let mut frame = Some(msg.to_frame());
        let mut copies = 1;
        for (_, fault) in self.faults.iter().filter(|(at, _)| *at == n) {
            match fault {
                Fault::Insert(m) => frames.push(m.to_frame()),
                Fault::Garbage(body) => {
                    let mut f = (body.len() as u32).to_be_bytes().to_vec();
                    f.extend_from_slice(body);
                    frames.push(f);
                }
                Fault::Oversized => {
                    let len = (MAX_FRAME + 1024) as u32;
                    frames.push(len.to_be_bytes().to_vec());
                }
                Fault::Replace(m) => frame = Some(m.to_frame()),
                Fault::Drop => frame = None,
                Fault::Duplicate => copies += 1,
                Fault::Silence => self.silent = true,
            }
        }
        if let Some(f) = frame {
            for _ in 0..copies {
                frames.push(f.clone());
            }
        }
        for f in frames {
            self.enqueue(now, f);
        }
    }

    fn enqueue(&mut self, now: Instant, frame: Vec<u8>) {
        if self.silent {
            return;
        }
        let at = self.arrival(now);
        self.last = at;
        self.queue.push_back((at, frame));
    }

    /// When something sent at `now` arrives: after the delay, after any blackout it is sent in
    /// (TCP keeps retransmitting through it: with [`ControlPath::with_rto`], at its first
    /// retransmission after the blackout, the timer doubling from the blackout's start), and
    /// not before what was sent earlier.
    fn arrival(&self, now: Instant) -> Instant {
        let mut base = now;
        loop {
            let rel = base.saturating_duration_since(self.t0);
            match self.blackouts.iter().find(|(s, e)| *s <= rel && rel < *e) {
                Some(&(start, end)) => {
                    let mut resent = end;
                    if let Some(rto) = self.rto.filter(|r| !r.is_zero()) {
                        let (mut at, mut wait) = (start, rto);
                        while at < end {
                            at += wait;
                            wait *= 2;
                        }
                        resent = at;
                    }
                    base = self.t0 + resent;
                }
                None => break,
            }
        }
        (base + self.delay).max(self.last)
    }

    /// The writer closes the connection at `now`: the reader sees the end once everything sent
    /// before has arrived (never, if the path went silent).
    pub(crate) fn close(&mut self, now: Instant) {
        if !self.closed {
            self.closed = true;
            if !self.silent {
                self.closed_at = Some(self.arrival(now));
            }
        }
    }

    pub(crate) fn next_delivery(&self) -> Option<Instant> {
        match self.queue.front() {
            Some((at, _)) => Some(*at),
            None if !self.close_seen => self.closed_at,
            None => None,
        }
    }

    pub(crate) fn poll(&mut self, now: Instant) -> Option<Result<Control, FrameError>> {
        if self.queue.front()?.0 > now {
            return None;
        }
        let (_, frame) = self.queue.pop_front()?;
        // Every frame here has its 4-byte prefix (see `send`); the body is what follows.
        let (prefix, body) = frame.split_at(frame.len().min(4));
        let prefix: [u8; 4] = prefix.try_into().unwrap_or([0xff; 4]);
        Some(Control::frame_len(prefix).and_then(|_| Control::from_body(body)))
    }

    /// True once, when the reader reaches the end of a closed connection at `now`.
    pub(crate) fn poll_closed(&mut self, now: Instant) -> bool {
        let end =
            self.queue.is_empty() && !self.close_seen && self.closed_at.is_some_and(|t| t <= now);
        if end {
            self.close_seen = true;
        }
        end
    }

    /// Frames sent and not yet read.
    pub(crate) fn in_flight(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_path_is_in_order_and_waits_out_blackouts() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut p = ControlPath::new(t0, ms(10), vec![(ms(5), ms(50))]);
        p.send(t0, &Control::Done);
        p.send(t0 + ms(6), &Control::ChannelDone { channel: 1 });
        p.send(t0 + ms(60), &Control::ChannelDone { channel: 2 });
        assert_eq!(p.next_delivery(), Some(t0 + ms(10)));
        assert!(p.poll(t0 + ms(9)).is_none());
        assert_eq!(p.poll(t0 + ms(10)).unwrap().unwrap(), Control::Done);
        assert_eq!(p.next_delivery(), Some(t0 + ms(60)));
        assert_eq!(
            p.poll(t0 + ms(60)).unwrap().unwrap(),
            Control::ChannelDone { channel: 1 }
        );
        assert_eq!(p.next_delivery(), Some(t0 + ms(70)));
    }

    #[test]
    fn a_control_path_with_a_retransmission_timer_delivers_at_its_first_firing_after_a_blackout() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // Down from 100 to 1000 ms; the timer fires at 300, 700 and 1500 ms.
        let mut p = ControlPath::new(t0, ms(10), vec![(ms(100), ms(1000))]).with_rto(Some(ms(200)));
        p.send(t0 + ms(500), &Control::Done);
        assert_eq!(p.next_delivery(), Some(t0 + ms(1510)));
        // What is sent after the blackout waits behind it (TCP is in order).
        p.send(t0 + ms(1100), &Control::KeepAlive);
        assert_eq!(p.poll(t0 + ms(1510)).unwrap().unwrap(), Control::Done);
        assert_eq!(p.next_delivery(), Some(t0 + ms(1510)));
    }

    #[test]
    fn control_path_faults_apply_at_their_message_and_close_ends_the_stream() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let done = |channel| Control::ChannelDone { channel };
        let mut p = ControlPath::new(t0, ms(10), Vec::new()).with_faults(vec![
            (0, Fault::Insert(Control::KeepAlive)),
            (1, Fault::Duplicate),
            (2, Fault::Replace(Control::Done)),
            (3, Fault::Garbage(vec![0xff; 3])),
            (3, Fault::Drop),
            (4, Fault::Oversized),
            (5, Fault::Silence),
        ]);
        for (i, at) in [0, 1, 2, 3, 4, 5, 6].into_iter().enumerate() {
            p.send(t0 + ms(at), &done(i as u16));
        }
        p.close(t0 + ms(7));
        let mut got = Vec::new();
        while let Some(at) = p.next_delivery() {
            match p.poll(at) {
                Some(Ok(m)) => got.push(format!("{} {:?}", (at - t0).as_millis(), m)),
                Some(Err(FrameError::Malformed(_))) => got.push("malformed".into()),
                Some(Err(FrameError::TooLong(_))) => got.push("too long".into()),
                Some(Err(e)) => panic!("{e}"),
                None => panic!("nothing at its delivery time"),
            }
        }
        assert_eq!(
            got,
            [
                "10 KeepAlive",
                "10 ChannelDone { channel: 0 }",
                "11 ChannelDone { channel: 1 }",
                "11 ChannelDone { channel: 1 }",
                "12 Done",
                "malformed",
                "too long",
                "14 ChannelDone { channel: 4 }",
            ]
        );
        // Silent from message 5 on: not even the close gets through.
        assert!(!p.poll_closed(t0 + ms(100)));
        assert_eq!(p.by_kind.get("ChannelDone"), Some(&7));
        let mut q = ControlPath::new(t0, ms(10), Vec::new());
        q.send(t0, &Control::Done);
        q.close(t0 + ms(1));
        q.send(t0 + ms(2), &Control::Done);
        assert!(
            !q.poll_closed(t0 + ms(11)),
            "the message before the end is read first"
        );
        assert!(q.poll(t0 + ms(10)).is_some());
        assert_eq!(q.next_delivery(), Some(t0 + ms(11)));
        assert!(!q.poll_closed(t0 + ms(10)));
        assert!(q.poll_closed(t0 + ms(11)));
        assert!(!q.poll_closed(t0 + ms(12)), "seen once");
        assert_eq!(q.next_delivery(), None, "nothing after the end");
    }
}
