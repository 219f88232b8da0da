//! What a finished send did ([`SendSummary`]): bytes, files, time, datagrams, which path
//! carried how many bytes ([`BytesByPath`]), the pacing rate's timeline ([`RateSummary`]) and
//! what limited the transfer ([`BottleneckSummary`]).

pub use crate::report::BytesByPath;
use crate::report::FileReport;
use hurtle_proto::rate::bottleneck::{Bottleneck, BufferCap, Evidence, ReceiverSigns};
use hurtle_proto::{RateController, RateMode};
use serde::Serialize;
use std::time::Instant;

/// What a finished send did.
#[derive(Debug, Clone, Serialize)]
pub struct SendSummary {
    /// File bytes delivered (including those resumed).
    pub bytes: u64,
    /// Of those, bytes the receiver already held from an interrupted transfer (checked, not
    /// sent again).
    pub resumed_bytes: u64,
    /// Of those, bytes in holes of sparse files (checked, not sent; holes on the receiver too).
    pub sparse_bytes: u64,
    /// Blocks the receiver held from an interrupted transfer whose values came from the
    /// sender's cache of block values, unread ([`ValueCache`](super::ValueCache)).
    pub resume_blocks_cached: u64,
    /// Blocks the receiver held from an interrupted transfer that the sender read and hashed
    /// to value them (no cache entry for their source as it is now).
    pub resume_blocks_read: u64,
    /// Files in the transfer (including skipped ones).
    pub files: usize,
    /// Files skipped because the receiver already had them (see [`FileReport::skipped`]).
    pub skipped: usize,
    /// Whether data frames were encrypted (control frames always are).
    pub encrypted: bool,
    /// Directories created.
    pub dirs: usize,
    /// Wall time from connect to confirmation, including a UDP attempt before a fallback to TCP.
    pub seconds: f64,
    /// Bits per second of file data moved in this session (`bytes - resumed_bytes -
    /// sparse_bytes`).
    pub goodput_bps: f64,
    /// Data datagrams sent, first transmissions and repairs.
    pub datagrams_sent: u64,
    /// Of those, repairs.
    pub datagrams_resent: u64,
    /// Parity datagrams sent for the tail of each channel's data ([`hurtle_proto::fec`]; not
    /// counted in `datagrams_sent`).
    pub parity_sent: u64,
    /// Resent share of all data datagrams.
    pub resent_share: f64,
    /// NACK messages received.
    pub nacks: u64,
    /// Reports and NACKs that came as datagrams as well as on the control connection
    /// ([`crate::net::feedback`]): 0 where nothing gets back from the receiver over UDP.
    pub feedback_datagrams: u64,
    /// Milliseconds the channel threads woke too late to keep their pace, beyond the burst a
    /// late thread may send at once, summed over the channels: a sender short of CPU. Up to
    /// 10 ms of each lateness is made up by sending faster ([`hurtle_proto::Pacer`]).
    pub sender_late_ms: f64,
    /// Of `sender_late_ms`, what was never made up (lateness beyond the 10 ms a pacer may
    /// owe): the sender's average rate fell short of its pacing by this much time.
    pub sender_lost_ms: f64,
    /// Channels (UDP) or connections (TCP) used.
    pub channels: u16,
    /// `udp` or `tcp`.
    pub transport: &'static str,
    /// Payload bytes per datagram after probing.
    pub payload: u16,
    /// Milliseconds from the sender's start to its first data datagram: what setting up the
    /// session cost (`None` if no data was sent).
    pub first_data_ms: Option<f64>,
    /// Milliseconds from the sender's start until every channel had sent all its new data
    /// once (`seconds` less this is the tail: the repairs and confirmations the end waited
    /// for); `None` if no data was sent.
    pub new_data_sent_ms: Option<f64>,
    /// The round-trip time measured at the key agreement, milliseconds (what the rate
    /// controller's rounds and a path memory's fit are judged by).
    pub rtt_ms: f64,
    /// Seconds from the start of data over UDP to the channels' move to parallel TCP, when
    /// UDP did not get through (`None` when they did not move); counted in `seconds`.
    pub fallback_seconds: Option<f64>,
    /// Seconds from the start to the first channel's move from the relay to a direct path
    /// punched through both NATs (`None`: not relayed, or no direct path found).
    pub direct_after_seconds: Option<f64>,
    /// Channels that moved to a punched direct path.
    pub direct_channels: usize,
    /// The bytes each path carried.
    pub bytes_by_path: BytesByPath,
    /// Pacing rate: mode, limits and how it changed.
    pub rate: RateSummary,
    /// What limited the transfer, as the sender sees it (`None` over parallel TCP, where the
    /// kernel's congestion control paces).
    pub bottleneck: Option<BottleneckSummary>,
    /// Datagrams the receiver rejected (foreign, malformed, out of bounds).
    pub receiver_rejected: u64,
    /// Kernel socket drops reported by the receiver.
    pub receiver_socket_drops: u64,
    /// Warnings (skipped symlinks, small socket buffers ...).
    pub warnings: Vec<String>,
    /// Per-file results.
    pub file_hashes: Vec<FileReport>,
}

/// What a send's bottleneck is judged against besides the rate timeline and the receiver's
/// reports.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// The user's `--rate`, bits per second (0: none).
    pub(super) cap_bps: u64,
    /// The ceiling the receiver offered, bits per second (0: none).
    pub(super) receiver_ceiling_bps: u64,
    /// The receiver's socket buffers, when the kernel granted less than it asked for.
    pub(super) receiver_buffer: Option<BufferCap>,
}

/// What limited a send (see [`hurtle_proto::rate::bottleneck`]).
#[derive(Debug, Clone, Serialize)]
pub struct BottleneckSummary {
    /// `path`, `receiver-cpu`, `receiver-buffers`, `receiver-disk`, `receiver-ceiling`,
    /// `rate-cap`, `sender` or `fixed-rate`.
    pub kind: &'static str,
    /// One line for people, with the figures behind it.
    pub detail: String,
}

impl BottleneckSummary {
    /// Names what limited a send paced by `ctl` from `start` until now, in which the channels
    /// sent `bits` of datagrams.
    pub(super) fn new(
        ctl: &RateController,
        bits: f64,
        limits: Limits,
        receiver: ReceiverSigns,
    ) -> BottleneckSummary {
        let b = Self::judge(ctl, bits, limits, receiver);
        BottleneckSummary {
            kind: b.name(),
            detail: b.to_string(),
        }
    }

    pub(super) fn judge(
        ctl: &RateController,
        bits: f64,
        limits: Limits,
        receiver: ReceiverSigns,
    ) -> Bottleneck {
        let tl = ctl.timeline();
        let first = tl.first().map_or_else(Instant::now, |c| c.at);
        let paced_for = first.elapsed();
        Bottleneck::classify(&Evidence {
            mode: ctl.config().mode,
            changes: tl
                .iter()
                .map(|c| (c.at.saturating_duration_since(first), c.rate_bps, c.reason))
                .collect(),
            reasons: ctl.reasons().to_vec(),
            paced_for,
            cap_bps: limits.cap_bps,
            receiver_ceiling_bps: limits.receiver_ceiling_bps,
            sent_bps: bits / paced_for.as_secs_f64().max(1e-9),
            path_bps: ctl
                .model()
                .and_then(|m| m.bottleneck_bps())
                .map(|b| b as u64),
            random_loss: ctl.loss_share(),
            receiver,
            receiver_buffer: limits.receiver_buffer,
        })
    }
}

/// The rate timeline of a send, for `--json` and the summary line.
#[derive(Debug, Clone, Serialize)]
pub struct RateSummary {
    /// `auto`, `fair` or `fixed`.
    pub mode: &'static str,
    /// The user's cap (or fixed rate), bits per second.
    pub cap_bps: u64,
    /// The receiver's measured ceiling, bits per second (0 = not offered).
    pub receiver_ceiling_bps: u64,
    /// First rate.
    pub start_bps: u64,
    /// Last rate.
    pub final_bps: u64,
    /// Lowest rate used.
    pub min_bps: u64,
    /// Highest rate used.
    pub max_bps: u64,
    /// Number of changes.
    pub changes: u64,
    /// Changes by reason (startup, probe, loss, delay, socket-drops, backlog), all of them.
    pub reasons: std::collections::BTreeMap<&'static str, u64>,
    /// The changes, `(milliseconds since start, bits per second, reason)`: at most a few
    /// hundred, the latest whole and the older spread evenly over the run.
    pub timeline: Vec<(u64, u64, &'static str)>,
    /// The receiver's reports, `(milliseconds since start, delivered bits per second, queueing
    /// delay in microseconds, datagrams lost, datagrams counted, rate after it, the
    /// bottleneck's rate by the receiver's trains in bits per second or 0)`, kept as the
    /// changes are (`bench/timeline.py` draws them).
    pub reports: Vec<(u64, u64, u64, u64, u64, u64, u64)>,
    /// `auto`'s model of the path at the end: its bottleneck rate, bits per second.
    pub path_bps: Option<u64>,
    /// The share of datagrams the path lost in the reports that showed no congestion, over the
    /// transfer: its random loss (`None` before a thousand datagrams were counted).
    pub random_loss: Option<f64>,
    /// The start from the last transfer to this receiver, if there was one (see
    /// [`PathMemories`](super::PathMemories)).
    pub resumed: Option<ResumedSummary>,
    /// Times the path delivered nothing while data was sent, and lost what was
    /// ([`hurtle_proto::rate::Outages`]).
    pub outages: OutageSummary,
}

/// The path's outages during a send.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct OutageSummary {
    /// How many.
    pub count: u32,
    /// Their lengths added up, seconds.
    pub seconds: f64,
}

/// A start from what the last transfer to the same receiver learnt of the path.
#[derive(Debug, Clone, Serialize)]
pub struct ResumedSummary {
    /// The bottleneck that transfer's model found, bits per second.
    pub remembered_bps: u64,
    /// Its round-trip time, milliseconds.
    pub remembered_rtt_ms: f64,
    /// How long ago it ended, seconds.
    pub age_s: u64,
}

impl RateSummary {
    pub(super) fn new(
        ctl: &RateController,
        start: Instant,
        receiver_ceiling_bps: u64,
        cap_bps: u64,
    ) -> Self {
        let tl = ctl.timeline();
        let reasons = ctl
            .reasons()
            .iter()
            .map(|&(r, n)| (r.as_str(), n))
            .collect();
        let (min_bps, max_bps) = ctl.rate_range();
        RateSummary {
            mode: match ctl.config().mode {
                RateMode::Auto => "auto",
                RateMode::Fair => "fair",
                RateMode::Fixed => "fixed",
            },
            cap_bps,
            receiver_ceiling_bps,
            start_bps: tl.first().map_or(0, |c| c.rate_bps),
            final_bps: ctl.rate_bps(),
            min_bps,
            max_bps,
            changes: ctl.changes().saturating_sub(1),
            reasons,
            timeline: tl
                .iter()
                .map(|c| {
                    (
                        c.at.saturating_duration_since(start).as_millis() as u64,
                        c.rate_bps,
                        c.reason.as_str(),
                    )
                })
                .collect(),
            reports: ctl
                .reports()
                .iter()
                .map(|r| {
                    (
                        r.at.saturating_duration_since(start).as_millis() as u64,
                        r.delivered_bps,
                        r.queue_delay.as_micros() as u64,
                        r.lost,
                        r.seen,
                        r.rate_bps,
                        r.train_bps,
                    )
                })
                .collect(),
            path_bps: ctl
                .model()
                .and_then(|m| m.bottleneck_bps())
                .map(|b| b as u64),
            random_loss: ctl.loss_share(),
            resumed: None,
            outages: {
                let o = ctl.outages();
                OutageSummary {
                    count: o.count,
                    seconds: o.total.as_secs_f64(),
                }
            },
        }
    }
}
