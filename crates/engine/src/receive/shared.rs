//! What the session loop, the channel threads, the writer, the hole hasher and the committer
//! share: the session's state ([`Shared`]: layout, part files, the control writer's queue,
//! the counters behind the reports, [`Counters`]) and the messages between them ([`ChanCmd`],
//! [`ChanEvent`]), one per block, never per datagram.

use crate::error::SessionError;
use crate::fs::PartFile;
use crate::net::channel_link::LinkIn;
use crate::net::control::ControlTx;
use crate::net::feedback::FeedbackOut;
use crate::progress::Progress;
use hurtle_proto::admit::{ArrivalMark, Tally};
use hurtle_proto::rate::dispersion::TrainPool;
use hurtle_proto::wire::Control;
use hurtle_proto::Layout;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub(super) struct Shared {
    pub(super) layout: Layout,
    /// The files being received, by file id (`None`: skipped, the receiver has it).
    pub(super) files: Vec<Option<Arc<PartFile>>>,
    pub(super) peer_ip: IpAddr,
    /// The relay whose datagrams are the sender's too (a receiver paired by code).
    pub(super) relay_ip: Option<IpAddr>,
    /// The session's allocations at that relay, once it gives them: each channel thread then
    /// binds its socket and tries for a direct path ([`crate::net::punch::SocketPunch`]).
    pub(super) relay_offer: std::sync::OnceLock<super::RelayOffer>,
    /// The session's hole-punching key.
    pub(super) punch_key: [u8; 32],
    /// The relay the receiver was paired by (`receive --relay`), if any: whether the sender
    /// came through it ([`super::RelayedUdp::through_relay`]).
    pub(super) relay: Option<Arc<super::RelayedUdp>>,
    /// When the first channel moved to a direct path punched past the relay, microseconds
    /// from `origin` (`u64::MAX`: none did).
    pub(super) direct_at_us: AtomicU64,
    pub(super) to_wire: ControlTx,
    /// Copies of the reports and NACKs as datagrams (see [`crate::net::feedback`]).
    pub(super) feedback: FeedbackOut,
    pub(super) counters: Counters,
    pub(super) progress: Arc<Progress>,
    pub(super) stop: AtomicBool,
    /// The session loop runs: the data phase began, after the set-up's last message (the
    /// `ManifestReply`) went. Until then no data-phase message (`ChannelDone`, `FileDone`) is
    /// sent, so none overtakes it.
    pub(super) started: AtomicBool,
    /// Kernel drop counter of each channel's socket, refreshed by its thread.
    pub(super) channel_drops: Vec<AtomicU64>,
    /// Whether anything of the sender's (a probe, data) arrived on each channel: a channel
    /// still silent a while after the data phase began tells a sender that may move to TCP to
    /// do so.
    pub(super) heard: Vec<AtomicBool>,
    /// How many times each channel's thread has been round its loop (read its socket, or
    /// found it empty) while nothing had arrived on it: silence counts only from a channel
    /// whose socket was read.
    pub(super) passes: Vec<AtomicU64>,
    /// The fullest any channel's socket receive buffer got since the last report, thousandths
    /// of its limit (sampled by the channel threads, taken by the report loop).
    pub(super) queue_fill: AtomicU64,
    /// The longest a block waited in the writer's queue since the last report, microseconds.
    pub(super) write_wait_us: AtomicU64,
    /// The fullest the writer's queue got since the last report, thousandths of its depth.
    pub(super) write_fill: AtomicU64,
    /// Since the last report, some datagram was timed when a channel thread read it, not by
    /// the kernel on arrival (a TCP data connection; a kernel that gave no time): the report's
    /// bytes are then timed by the report loop, not by their arrivals.
    pub(super) timed_on_read: AtomicBool,
    /// Each channel's bytes admitted and when the last of them arrived by the kernel's time
    /// (microseconds from `origin`), updated once per receive batch: the report loop times the
    /// interval's bytes by when they came ([`hurtle_proto::admit::arrival_interval`]). Under a
    /// lock so that the two are read as one.
    pub(super) arrivals: Vec<Mutex<ArrivalMark>>,
    /// The origin of `arrivals`' times.
    pub(super) origin: Instant,
    /// The bottleneck estimates of the trains that ended since the last report (and of
    /// earlier ones too few to report), kbit/s ([`hurtle_proto::rate::dispersion`]), added by
    /// the channel threads once per batch.
    pub(super) train_rates: Mutex<TrainPool>,
    /// When the session loop sends its next report: channel threads that let datagrams gather
    /// read just before it.
    pub(super) report_clock: ReportClock,
}

/// When the session loop means to send its next report and how often it reports, published
/// after each of its timer rounds for the channel threads, whose gathering pauses end just
/// before a report (see `channel_threads::gather_pause`).
#[derive(Debug, Default)]
pub(super) struct ReportClock {
    /// The next report's time, microseconds from [`Shared::origin`] (0: none published yet).
    due_us: AtomicU64,
    /// The interval between reports, microseconds.
    every_us: AtomicU64,
    /// The path's own report interval ([`hurtle_proto::rate::report_interval`]), microseconds:
    /// `every_us` beyond it was stretched (by the datagram count or the loop's lateness).
    base_us: AtomicU64,
}

/// What a [`ReportClock`] published, microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ReportTimes {
    /// The next report's time, from [`Shared::origin`].
    pub(super) due_us: u64,
    /// The interval between reports.
    pub(super) every_us: u64,
    /// The path's own report interval, before any stretching.
    pub(super) base_us: u64,
}

impl ReportClock {
    /// The next report is due `due_us` microseconds from the origin, and reports come every
    /// `every_us`, on a path whose own report interval is `base_us`.
    pub(super) fn publish(&self, due_us: u64, every_us: u64, base_us: u64) {
        self.every_us.store(every_us, Ordering::Relaxed);
        self.base_us.store(base_us, Ordering::Relaxed);
        self.due_us.store(due_us.max(1), Ordering::Relaxed);
    }

    /// The next report's time and the intervals between reports, once published.
    pub(super) fn get(&self) -> Option<ReportTimes> {
        let due_us = self.due_us.load(Ordering::Relaxed);
        let every_us = self.every_us.load(Ordering::Relaxed);
        let base_us = self.base_us.load(Ordering::Relaxed);
        (due_us > 0 && every_us > 0).then_some(ReportTimes {
            due_us,
            every_us,
            base_us,
        })
    }
}

impl Shared {
    /// The way the bytes of a TCP data connection come: through the relay's splice when the
    /// sender came through the relay, else direct.
    pub(super) fn tcp_route(&self) -> crate::progress::Route {
        match &self.relay {
            Some(r) if r.through_relay() => crate::progress::Route::RelayTcp,
            _ => crate::progress::Route::Direct,
        }
    }

    /// Each channel's [`ArrivalMark`] now.
    pub(super) fn arrival_marks(&self) -> Vec<ArrivalMark> {
        self.arrivals
            .iter()
            .map(|m| *m.lock().unwrap_or_else(|e| e.into_inner()))
            .collect()
    }

    /// Adds `bytes` admitted on channel `ch`, the last of which arrived at `at`.
    pub(super) fn note_arrivals(&self, ch: u16, bytes: u64, at: Instant) {
        if let Some(m) = self.arrivals.get(usize::from(ch)) {
            let mut m = m.lock().unwrap_or_else(|e| e.into_inner());
            m.bytes = m.bytes.saturating_add(bytes);
            let at_us = at.saturating_duration_since(self.origin).as_micros() as u64;
            m.at_us = m.at_us.max(at_us.max(1));
        }
    }

    /// The median of the train estimates gathered, kbit/s (0: too few, kept for the next
    /// report: [`TrainPool`]), for a report.
    pub(super) fn take_train_kbps(&self) -> u64 {
        let mut pool = self.train_rates.lock().unwrap_or_else(|e| e.into_inner());
        pool.take_kbps()
    }

    /// Sends a NACK both ways: on the control connection, and as a datagram. (Reports go as
    /// datagrams, and on TCP only where [`hurtle_proto::feedback::TcpCopies`] says.)
    pub(super) fn send_nack(&self, msg: Control) {
        self.feedback.send(&msg);
        let _ = self.to_wire.send(msg);
    }

    /// Kernel socket drops so far, summed over the channels.
    pub(super) fn socket_drops(&self) -> u64 {
        self.channel_drops
            .iter()
            .map(|d| d.load(Ordering::Relaxed))
            .sum()
    }
}

#[derive(Default)]
pub(super) struct Counters {
    /// Data frames that failed to open.
    pub(super) unauthentic: AtomicU64,
    pub(super) rejected: AtomicU64,
    pub(super) duplicate: AtomicU64,
    pub(super) nacks: AtomicU64,
    pub(super) rejected_blocks: AtomicU64,
    pub(super) spilled_blocks: AtomicU64,
    /// Data datagrams rebuilt from the tail's parity ([`hurtle_proto::fec`]).
    pub(super) recovered: AtomicU64,
    /// The channels' admission [`Tally`]s, summed (`rejected` above is its `rejected`): each
    /// channel thread adds what its channels counted once per receive batch.
    pub(super) datagrams: AtomicU64,
    pub(super) bytes: AtomicU64,
    pub(super) pn_span: AtomicU64,
    pub(super) delay_sum_us: AtomicU64,
    pub(super) delay_count: AtomicU64,
}

impl Counters {
    /// Adds what a channel's admission counted since it was last added.
    pub(super) fn add(&self, t: &Tally) {
        self.datagrams.fetch_add(t.datagrams, Ordering::Relaxed);
        self.bytes.fetch_add(t.bytes, Ordering::Relaxed);
        self.pn_span.fetch_add(t.pn_span, Ordering::Relaxed);
        self.delay_sum_us
            .fetch_add(t.delay_sum_us, Ordering::Relaxed);
        self.delay_count.fetch_add(t.delay_count, Ordering::Relaxed);
        self.rejected.fetch_add(t.rejected, Ordering::Relaxed);
    }

    /// The admission totals of all channels so far.
    pub(super) fn totals(&self) -> Tally {
        Tally {
            datagrams: self.datagrams.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            pn_span: self.pn_span.load(Ordering::Relaxed),
            delay_sum_us: self.delay_sum_us.load(Ordering::Relaxed),
            delay_count: self.delay_count.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
        }
    }
}

pub(super) enum ChanCmd {
    /// The block failed verification: fetch it again.
    Reject(u64),
    /// The channel goes on over this link (the sender moved it from UDP to TCP).
    Relink(Box<LinkIn>),
}

pub(super) enum ChanEvent {
    Block { block: u64, value: [u8; 32] },
    Failed(SessionError),
}
