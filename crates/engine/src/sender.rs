//! The sending side of a session: handshake, manifest, path probe, channel threads, confirmation.
//!
//! Threads: the caller's thread runs the session loop (it owns the [`BlockTable`] and routes
//! control messages); channel threads, one per channel but no more than there are cores (TCP
//! connections get one each), each serve one or more channels: a channel's [`ChannelSender`],
//! pacer, socket and block buffer belong to one thread. The control connection has a reader and
//! a writer thread. Channel threads talk to the session loop through channels, one message per
//! block or per NACK, never per datagram.

use crate::error::{next_control, SessionError, Side};
use crate::fs::SourceFile;
use crate::iobuf::IoBuf;
use crate::net::control::{ControlError, Incoming};
use crate::net::dial::{Dialer, Direct};
use crate::net::link::{self, LinkOut, OutPath};
use crate::net::udp::{ChannelOptions, UdpChannel};
use crate::netlog::NetLog;
use crate::progress::{Phase, Progress};
use crate::walk::{self, WalkOptions};
use crossbeam_channel::{select, unbounded, Receiver, Sender};
use hurtle_proto::hash::{block_value, to_hex};
use hurtle_proto::probe::{PayloadProbe, ProbeDecision};
use hurtle_proto::rate::bottleneck::{Bottleneck, Evidence, ReceiverSigns};
use hurtle_proto::secure::{self, DataKey, PacketSeal, Secret, TAG_LEN};
use hurtle_proto::wire::{self, Control, Decision, Entry, EntryKind, Header, Kind, HEADER_LEN};
use hurtle_proto::{
    rate, BlockTable, ChannelSender, Feedback, Layout, Pacer, RateConfig, RateController, RateMode,
    RunKind, SendConfig,
};
use serde::Serialize;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// UDP channels; if no datagram gets through, fall back to parallel TCP.
    Auto,
    /// UDP channels only.
    Udp,
    /// N parallel TCP connections (for networks that block UDP).
    Tcp,
}

impl Transport {
    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Auto => "auto",
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        }
    }
}

/// How to send. Build with [`SendOptions::default`] and the `with_*`-style fields.
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// Data channels (UDP) or connections (TCP) to offer (the receiver may lower it).
    pub channels: u16,
    /// UDP, parallel TCP, or UDP with fallback to TCP.
    pub transport: Transport,
    /// How the rate is chosen: `Auto` (default), `Fair` or `Fixed`.
    pub rate_mode: RateMode,
    /// Bits per second for all channels together: the cap that `Auto` and `Fair` never exceed,
    /// or the exact rate in `Fixed` mode. The receiver's measured ceiling lowers it further.
    pub rate_bps: u64,
    /// Lowest first rate of `Auto` and `Fair`, bits per second (on a short path it starts
    /// higher, at TCP's initial window per round trip: [`hurtle_proto::rate::initial_rate`]).
    pub start_rate_bps: u64,
    /// Largest datagram payload to try. The handshake probes it, then the 1500-byte-path size,
    /// then smaller ones, and keeps the largest that reaches the receiver on every channel; a
    /// size larger than the local interface allows fails at once (`EMSGSIZE`) and costs nothing.
    pub payload: u16,
    /// Block size for striping and hashing (power of two).
    pub block_size: u64,
    /// Follow symbolic links instead of skipping them.
    pub follow_symlinks: bool,
    /// Compare files the receiver already has by BLAKE3 (both sides read them), not by size
    /// and modification time.
    pub checksum: bool,
    /// Send the holes of sparse files as data, without asking the filesystem where they are
    /// (for a filesystem whose hole reporting is not trusted).
    pub no_sparse: bool,
    /// Directory for per-channel network logs.
    pub log_dir: Option<PathBuf>,
    /// Give up when nothing progresses for this long.
    pub stall_timeout: Duration,
    /// How long to wait for the TCP connection.
    pub connect_timeout: Duration,
    /// How TCP connections to the receiver are opened (`None`: directly). A dialer that is
    /// [`Dialer::tcp_only`] forces the parallel-TCP transport.
    pub dialer: Option<Arc<dyn Dialer>>,
    /// The code or key both sides hold; the session's keys are agreed from it. Required
    /// (`None` fails with [`SessionError::NoSecret`]): authentication is never off.
    pub secret: Option<Secret>,
    /// Ask for data datagrams in the clear (`--no-encryption`): granted only when the receiver
    /// asks too. Control frames are sealed either way.
    pub no_encryption: bool,
}

impl Default for SendOptions {
    fn default() -> Self {
        SendOptions {
            channels: default_channels(),
            transport: Transport::Auto,
            rate_mode: RateMode::Auto,
            rate_bps: 100_000_000_000,
            start_rate_bps: 100_000_000,
            payload: wire::MAX_PAYLOAD,
            block_size: 1 << 20,
            follow_symlinks: false,
            checksum: false,
            no_sparse: false,
            log_dir: None,
            stall_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            dialer: None,
            secret: None,
            no_encryption: false,
        }
    }
}

/// Channels used when the user does not say: one per core, between 2 and 8.
pub fn default_channels() -> u16 {
    std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8) as u16)
}

/// One file's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct FileReport {
    /// Relative path.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// BLAKE3, hex, as confirmed by the receiver; empty for a file skipped because the
    /// receiver's copy had the same size and modification time (not read; see `--checksum`).
    pub blake3: String,
    /// Not sent: the receiver already had it (the same BLAKE3, or without `--checksum` the same
    /// size and modification time).
    pub skipped: bool,
}

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
    /// Resent share of all data datagrams.
    pub resent_share: f64,
    /// NACK messages received.
    pub nacks: u64,
    /// Channels (UDP) or connections (TCP) used.
    pub channels: u16,
    /// `udp` or `tcp`.
    pub transport: &'static str,
    /// Payload bytes per datagram after probing.
    pub payload: u16,
    /// Milliseconds from the sender's start to its first data datagram: what setting up the
    /// session cost (`None` if no data was sent).
    pub first_data_ms: Option<f64>,
    /// Seconds spent finding UDP blocked before falling back to parallel TCP (`None` when there
    /// was no fallback); counted in `seconds`.
    pub fallback_seconds: Option<f64>,
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

/// What limited a send (see [`hurtle_proto::rate::bottleneck`]).
#[derive(Debug, Clone, Serialize)]
pub struct BottleneckSummary {
    /// `path`, `receiver-cpu`, `receiver-disk`, `receiver-ceiling`, `rate-cap`, `sender` or
    /// `fixed-rate`.
    pub kind: &'static str,
    /// One line for people, with the figures behind it.
    pub detail: String,
}

impl BottleneckSummary {
    /// Names what limited a send paced by `ctl` from `start` until now, in which the channels
    /// sent `bits` of datagrams; `cap_bps` is the user's `--rate` (0: none).
    fn new(
        ctl: &RateController,
        bits: f64,
        (cap_bps, receiver_ceiling_bps): (u64, u64),
        receiver: ReceiverSigns,
    ) -> BottleneckSummary {
        let b = Self::judge(ctl, bits, (cap_bps, receiver_ceiling_bps), receiver);
        BottleneckSummary {
            kind: b.name(),
            detail: b.to_string(),
        }
    }

    fn judge(
        ctl: &RateController,
        bits: f64,
        (cap_bps, receiver_ceiling_bps): (u64, u64),
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
            paced_for,
            cap_bps,
            receiver_ceiling_bps,
            sent_bps: bits / paced_for.as_secs_f64().max(1e-9),
            path_bps: ctl
                .model()
                .and_then(|m| m.bottleneck_bps())
                .map(|b| b as u64),
            random_loss: ctl.random_loss(),
            receiver,
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
    /// Changes by reason (startup, probe, loss, delay, socket-drops, backlog).
    pub reasons: std::collections::BTreeMap<&'static str, u64>,
    /// The changes, `(milliseconds since start, bits per second, reason)`, thinned to a few hundred.
    pub timeline: Vec<(u64, u64, &'static str)>,
    /// The receiver's reports, `(milliseconds since start, delivered bits per second, queueing
    /// delay in microseconds, datagrams lost, datagrams counted, rate after it)`, thinned to a
    /// few hundred (`bench/timeline.py` draws them).
    pub reports: Vec<(u64, u64, u64, u64, u64, u64)>,
    /// `auto`'s model of the path at the end: its bottleneck rate, bits per second.
    pub path_bps: Option<u64>,
    /// The share of datagrams random loss took, as the controller estimated it at the end.
    pub random_loss: Option<f64>,
}

impl RateSummary {
    fn new(ctl: &RateController, start: Instant, receiver_ceiling_bps: u64, cap_bps: u64) -> Self {
        let tl = ctl.timeline();
        let mut reasons = std::collections::BTreeMap::new();
        for c in tl.iter().skip(1) {
            *reasons.entry(c.reason.as_str()).or_insert(0) += 1;
        }
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
            min_bps: tl.iter().map(|c| c.rate_bps).min().unwrap_or(0),
            max_bps: tl.iter().map(|c| c.rate_bps).max().unwrap_or(0),
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
                    )
                })
                .collect(),
            path_bps: ctl
                .model()
                .and_then(|m| m.bottleneck_bps())
                .map(|b| b as u64),
            random_loss: ctl.random_loss(),
        }
    }
}

/// What the session loop tells a channel.
enum ChanCmd {
    Nack(Vec<(u64, u64)>),
    Done,
}

/// What the session loop tells a channel thread.
enum ThreadCmd {
    /// For one of its channels.
    Channel(u16, ChanCmd),
    /// The session is over.
    Stop,
}

enum ChanEvent {
    /// A block was read for the first time, with its value; `held`: one the receiver already
    /// has, read only to be hashed.
    Block {
        block: u64,
        value: [u8; 32],
        held: bool,
    },
    Failed(SessionError),
}

struct Shared {
    layout: Layout,
    sources: Vec<SourceFile>,
    session: u64,
    /// Payload bytes per data datagram now: probing may move it while data flows.
    payload: AtomicU16,
    /// The most `payload` can become: what buffers are sized for.
    max_payload: u16,
    start: Instant,
    progress: Arc<Progress>,
    /// Current pacing rate for all channels together, bits per second.
    rate_bps: AtomicU64,
    channels: u16,
    /// When the first data datagram left, microseconds after `start` (`u64::MAX`: not yet).
    first_data_us: AtomicU64,
    /// What the live bottleneck is judged against: the user's `--rate` (0: none) and the
    /// receiver's offered ceiling; `None` over parallel TCP, which paces itself.
    limits: Option<(u64, u64)>,
    /// What the receiver's reports said of its CPU and its disk.
    receiver_signs: std::sync::Mutex<ReceiverSigns>,
}

/// Longest train of datagrams one send may put on the wire, in time at the session's rate (all
/// channels together): a train passes the bottleneck in this long, and a channel's trains are
/// as large with 8 channels as with 1, so more channels do not mean more, smaller sends (at
/// the channel's own rate, 8 channels would make 8 times the system calls per byte).
/// BENCHMARKS.md, section 3, has what channel counts cost on loopback.
const SEND_TRAIN: Duration = Duration::from_micros(250);
/// Catch-up credit of each channel's pacer after a late wake-up. On a busy 2-core machine a
/// channel thread often wakes more than 0.5 ms late, and lateness beyond the credit is rate
/// lost: with 0.5 ms a channel fell measurably short of its pace, with 1.5 ms it kept it.
/// Credit is sent back to back, so it is also the most a channel can burst into the
/// bottleneck's queue (1.5 ms is 56 KB at 300 Mbit/s).
const PACER_CREDIT: Duration = Duration::from_micros(1500);

/// Sends `paths` (files and directories) to the receiver at `to`.
pub fn send(
    paths: &[PathBuf],
    to: SocketAddr,
    opts: &SendOptions,
    progress: Arc<Progress>,
) -> Result<SendSummary, SessionError> {
    let tcp_only = opts.dialer.as_ref().is_some_and(|d| d.tcp_only());
    let first = if opts.transport == Transport::Tcp || tcp_only {
        Transport::Tcp
    } else {
        Transport::Udp
    };
    let started = Instant::now();
    match send_once(paths, to, opts, first, progress.clone()) {
        Err(SessionError::UdpBlocked { channel, .. })
            if opts.transport == Transport::Auto && !tcp_only =>
        {
            let lost = started.elapsed();
            let mut s = send_once(paths, to, opts, Transport::Tcp, progress)?;
            let moved = s.goodput_bps * s.seconds;
            s.seconds += lost.as_secs_f64();
            s.goodput_bps = moved / s.seconds.max(1e-9);
            s.first_data_ms = s.first_data_ms.map(|ms| ms + lost.as_secs_f64() * 1e3);
            s.fallback_seconds = Some(lost.as_secs_f64());
            s.warnings.insert(0, format!("no UDP datagram reached the receiver (channel {channel}); fell back to parallel TCP after {:.1} s, counted in the time", lost.as_secs_f64()));
            Ok(s)
        }
        other => other,
    }
}

fn send_once(
    paths: &[PathBuf],
    to: SocketAddr,
    opts: &SendOptions,
    transport: Transport,
    progress: Arc<Progress>,
) -> Result<SendSummary, SessionError> {
    let start = Instant::now();
    let walked = walk::collect(
        paths,
        &WalkOptions {
            follow_symlinks: opts.follow_symlinks,
        },
    )?;
    let mut warnings = walked.warnings.clone();
    let files: Vec<&walk::SourceEntry> = walked
        .entries
        .iter()
        .filter(|e| e.kind == EntryKind::File)
        .collect();
    let dirs = walked.entries.len() - files.len();
    let total_bytes: u64 = files.iter().map(|f| f.size).sum();
    progress.total.store(total_bytes, Ordering::Relaxed);
    // A transfer has at most MAX_BLOCKS blocks: a bigger one goes in bigger blocks.
    let sizes: Vec<u64> = files.iter().map(|f| f.size).collect();
    let block_size = hurtle_proto::layout::fitting_block_size(&sizes, opts.block_size);
    if block_size != opts.block_size {
        warnings.push(format!(
            "chunk size raised to {} KiB: a transfer of {total_bytes} bytes in {} KiB chunks would have more than {} of them",
            block_size >> 10,
            opts.block_size >> 10,
            hurtle_proto::layout::MAX_BLOCKS
        ));
    }
    let opts = &SendOptions {
        block_size,
        ..opts.clone()
    };

    // The manifest. A sparse file's holes are announced, and their bytes are not sent (looked
    // for before connecting: the receiver would wait meanwhile). A file smaller than a block
    // is not looked at (a hole there would save one block at most, and many small files can
    // look sparse: inline data, compression).
    let entries: Vec<Entry> = walked
        .entries
        .iter()
        .map(|e| Entry {
            holes: if e.sparse && e.size >= opts.block_size && !opts.no_sparse {
                source_holes(&e.abs_path, e.size, opts.block_size)
            } else {
                Vec::new()
            },
            ..e.to_wire()
        })
        .collect();

    progress.set_address(to);
    progress.set_phase(Phase::Connecting);
    let secret = opts.secret.as_ref().ok_or(SessionError::NoSecret)?;
    let mut stream = dial(opts, to)?;
    progress.set_phase(Phase::SettingUp);
    let handshake_timeout = Duration::from_secs(10);
    let agree_at = Instant::now();
    let keys = crate::agree::offer(&mut stream, secret, opts.no_encryption, handshake_timeout)?;
    let agree_rtt = agree_at.elapsed();
    let data_key = keys.data.clone();
    let data_seal = keys.encrypt_data.then(|| keys.data.sealer());
    let (rx, tx, writer) =
        crate::net::control::open(&stream, opts.stall_timeout, keys.frames_out, keys.frames_in)
            .map_err(|e| SessionError::io("control connection", e))?;

    let session: u64 = rand::random::<u64>() | 1;
    let hello_at = Instant::now();
    let _ = tx.send(Control::Hello {
        magic: wire::MAGIC,
        version: wire::VERSION,
        caps: if transport == Transport::Tcp {
            wire::CAP_TCP_DATA
        } else {
            0
        } | if opts.checksum { wire::CAP_CHECKSUM } else { 0 },
        channels: opts.channels.max(1),
        payload: opts.payload,
        block_size: opts.block_size,
        session,
    });
    // The manifest follows at once, in parts that stay well under the frame limit: the
    // receiver answers the hello and the manifest in the same round trip.
    let parts: Vec<&[Entry]> = if entries.is_empty() {
        vec![&[][..]]
    } else {
        entries.chunks(2048).collect()
    };
    let n_parts = parts.len();
    for (i, part) in parts.into_iter().enumerate() {
        let _ = tx.send(Control::Manifest {
            entries: part.to_vec(),
            last: i + 1 == n_parts,
        });
    }
    // The sources are opened while the receiver decides (for many files, both take a while).
    let opening = {
        let paths: Vec<PathBuf> = files.iter().map(|f| f.abs_path.clone()).collect();
        std::thread::Builder::new()
            .name("open".into())
            .spawn(move || {
                paths
                    .iter()
                    .map(|p| SourceFile::open(p))
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(|e| SessionError::io("open thread", e))?
    };
    let (ports, max_payload, receiver_ceiling) = match next_control(&rx, handshake_timeout)? {
        Control::HelloAck {
            ports,
            payload,
            version,
            rate_ceiling,
            ..
        } if version == wire::VERSION && !ports.is_empty() => (ports, payload, rate_ceiling),
        Control::HelloAck { version, .. } => {
            return Err(SessionError::Protocol(format!(
                "receiver speaks version {version}, no usable channels"
            )))
        }
        other => return Err(SessionError::unexpected(Side::Receiver, other, "HelloAck")),
    };
    let mut rtt = hello_at.elapsed().min(agree_rtt);
    let channels = ports
        .len()
        .min(usize::from(hurtle_proto::layout::MAX_CHANNELS)) as u16;
    // Data sockets, of the receiver's address family. They are set up while the receiver
    // decides on the manifest: TCP connections are dialled, UDP probes are on their way.
    let bind_ip: IpAddr = if to.is_ipv4() {
        Ipv4Addr::UNSPECIFIED.into()
    } else {
        Ipv6Addr::UNSPECIFIED.into()
    };
    let dests: Vec<SocketAddr> = ports
        .iter()
        .take(usize::from(channels))
        .map(|&p| SocketAddr::new(to.ip(), p))
        .collect();
    let mut data = if transport == Transport::Tcp {
        DataSetup::Tcp(dial_data(opts, &dests, session, &data_key))
    } else {
        let mut udps = Vec::with_capacity(usize::from(channels));
        for _ in 0..channels {
            let u = UdpChannel::bind(SocketAddr::new(bind_ip, 0), &ChannelOptions::default())?;
            if let Some(w) = u.buffer_warning() {
                if !warnings.contains(&w) {
                    warnings.push(w);
                }
            }
            udps.push(u);
        }
        let socks = udps
            .iter()
            .map(UdpChannel::try_clone_socket)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| SessionError::io("UDP socket", e))?;
        let mut prober = Prober {
            probe: PayloadProbe::new(opts.payload.min(max_payload), channels, rtt, Instant::now()),
            socks,
            dests: dests.clone(),
            session,
            packet: secure::PROBE_PACKETS,
            seal: data_seal.clone(),
        };
        prober.send_due(Instant::now());
        DataSetup::Udp(udps, Box::new(prober))
    };

    let mut skipped: Vec<Option<[u8; 32]>> = vec![None; files.len()];
    // Of those, the ones skipped on size and modification time, unread: no hash to report.
    let mut unchecked = vec![false; files.len()];
    // Per file: the blocks the receiver holds from an interrupted transfer.
    let mut resumed: Vec<Vec<(u64, u64)>> = vec![Vec::new(); files.len()];
    // The receiver may take a while (hashing files it already has, preallocating big ones); it
    // sends keep-alives meanwhile, and each one restarts the wait.
    let reply = loop {
        match next_control(&rx, handshake_timeout)? {
            Control::KeepAlive => continue,
            Control::ProbeAck { channel, size } => {
                if let DataSetup::Udp(_, prober) = &mut data {
                    prober
                        .probe
                        .on_ack(channel, usize::from(size), Instant::now());
                }
            }
            other => break other,
        }
    };
    match reply {
        Control::ManifestReply { decisions } => {
            if decisions.len() != entries.len() {
                return Err(SessionError::Protocol(
                    "manifest reply has the wrong length".into(),
                ));
            }
            // Hashing our copies of files the receiver has can take a while (a big file from a
            // slow disk): the receiver waits for the answer, so keep the connection alive.
            let _alive = decisions
                .iter()
                .any(|d| matches!(d, Decision::Have { .. }))
                .then(|| crate::net::control::KeepAlive::start(tx.clone()));
            let mut file_id = 0usize;
            for (d, e) in decisions.iter().zip(&entries) {
                match d {
                    Decision::Refuse(reason) => {
                        return Err(SessionError::Refused {
                            path: e.path.clone(),
                            reason: reason.clone(),
                        })
                    }
                    Decision::Have { hash, replace_ok } if e.kind == EntryKind::File => {
                        let path = &files[file_id].abs_path;
                        let mine = crate::fs::hash_file(path)
                            .map_err(|e| SessionError::io(format!("read {}", path.display()), e))?;
                        if mine == *hash {
                            skipped[file_id] = Some(mine);
                        } else if !replace_ok {
                            let err = SessionError::Refused {
                                path: e.path.clone(),
                                reason: "a different file of the same size exists on the receiver (receive with --overwrite to replace it)".into(),
                            };
                            // The receiver waits for our answer to its offer: tell it why not.
                            let _ = tx.send(err.to_abort(Side::Sender));
                            // Every end of the writer's queue goes, so that it ends.
                            drop(_alive);
                            drop(tx);
                            let _ = writer.join();
                            return Err(err);
                        }
                    }
                    Decision::Unchanged if e.kind == EntryKind::File && !opts.checksum => {
                        // The hash is not known; nothing reads this placeholder but the
                        // summary, which reports no hash for it.
                        skipped[file_id] = Some([0; 32]);
                        unchecked[file_id] = true;
                    }
                    Decision::Unchanged => {
                        return Err(SessionError::Protocol(format!(
                            "the receiver skipped {} on size and time alone",
                            e.path
                        )))
                    }
                    Decision::Resume { blocks } if e.kind == EntryKind::File => {
                        resumed[file_id] = blocks.clone();
                    }
                    _ => {}
                }
                if e.kind == EntryKind::File {
                    file_id += 1;
                }
            }
        }
        other => {
            return Err(SessionError::unexpected(
                Side::Receiver,
                other,
                "ManifestReply",
            ))
        }
    }
    let _ = tx.send(Control::Skip {
        files: (0..files.len() as u32)
            .filter(|&f| skipped[f as usize].is_some())
            .collect(),
    });
    let sent_bytes: u64 = files
        .iter()
        .zip(&skipped)
        .filter(|(_, s)| s.is_none())
        .map(|(f, _)| f.size)
        .sum();

    // Skipped files take no room in the layout: the receiver builds the same one.
    let sizes: Vec<u64> = files
        .iter()
        .zip(&skipped)
        .map(|(f, s)| if s.is_some() { 0 } else { f.size })
        .collect();
    let layout = Layout::new(&sizes, opts.block_size, channels)?;
    progress.set_files(files.iter().map(|f| f.rel_path.clone()).collect());
    // The stripe ranges of each channel the receiver already holds: resumed blocks, and the
    // holes of sparse files, which the receiver leaves as holes.
    let holes: Vec<&[(u64, u64)]> = entries
        .iter()
        .filter(|e| e.kind == EntryKind::File)
        .zip(&skipped)
        .map(|(e, s)| if s.is_some() { &[][..] } else { &e.holes[..] })
        .collect();
    let held = layout.held_stripes(&resumed, &holes)?;
    let (held_bytes, resumed_bytes, sparse_bytes) =
        (held.bytes(), held.resumed_bytes, held.hole_bytes);
    let mut held = held.stripes;
    progress
        .total
        .store(sent_bytes - held_bytes, Ordering::Relaxed);
    progress.resumed.store(resumed_bytes, Ordering::Relaxed);
    let sources = opening
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;

    let (links, payload, prober) = match data {
        DataSetup::Tcp(dialing) => {
            let mut links = Vec::with_capacity(dialing.len());
            for d in dialing {
                let s = d
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
                links.push(LinkOut::new(OutPath::Tcp(s), data_seal.clone()));
            }
            (
                links,
                link::TCP_PAYLOAD.min(max_payload.max(link::TCP_PAYLOAD)),
                None,
            )
        }
        DataSetup::Udp(udps, mut prober) => {
            let now = Instant::now();
            // The deadline runs from here: probing can only find UDP blocked in the data
            // phase (`probe_step`), where the caller's fallback to TCP is handled too.
            prober.probe.receiver_ready(now);
            prober.send_due(now);
            if let Some(p) = prober.probe.rtt() {
                rtt = rtt.min(p);
            }
            let links = udps
                .into_iter()
                .zip(&dests)
                .map(|(sock, &dest)| LinkOut::new(OutPath::Udp { sock, dest }, data_seal.clone()))
                .collect();
            let payload = prober.probe.payload();
            (links, payload, Some(*prober))
        }
    };
    let report_every = rate::report_interval(rtt);
    let _ = tx.send(Control::Start {
        payload,
        report_interval_us: report_every.as_micros() as u64,
    });
    progress.set_phase(Phase::Moving);
    let ceiling = match (opts.rate_mode, receiver_ceiling) {
        (RateMode::Fixed, _) | (_, 0) => opts.rate_bps,
        (_, r) => opts.rate_bps.min(r),
    };
    // TCP has congestion control of its own: no pacing beyond the user's cap.
    let (rate_mode, ceiling) = if transport == Transport::Tcp {
        (
            RateMode::Fixed,
            if opts.rate_bps >= 100_000_000_000 {
                1_000_000_000_000
            } else {
                opts.rate_bps
            },
        )
    } else {
        (opts.rate_mode, ceiling)
    };
    let mut controller = RateController::new(
        RateConfig {
            mode: rate_mode,
            ceiling_bps: ceiling,
            // Capped by the user's --rate through the ceiling.
            start_bps: rate::initial_rate(opts.start_rate_bps, payload, rtt),
            min_bps: 1_000_000,
            rtt,
        },
        Instant::now(),
    );

    let shared = Arc::new(Shared {
        layout,
        sources,
        session,
        payload: AtomicU16::new(payload),
        max_payload: prober.as_ref().map_or(payload, |p| p.probe.max_payload()),
        start,
        progress: progress.clone(),
        rate_bps: AtomicU64::new(controller.rate_bps()),
        channels,
        first_data_us: AtomicU64::new(u64::MAX),
        limits: (transport != Transport::Tcp).then(|| (user_cap(opts), receiver_ceiling)),
        receiver_signs: Default::default(),
    });
    progress
        .rate_bps
        .store(controller.rate_bps(), Ordering::Relaxed);
    let (ev_tx, ev_rx) = unbounded::<ChanEvent>();
    let per_channel_rate = (controller.rate_bps() / u64::from(channels)).max(100_000);
    let send_cfg = SendConfig::for_rtt(rtt);
    let threads = send_threads(channels, links.first().is_some_and(LinkOut::is_tcp));
    let mut groups: Vec<Vec<ChannelWorker>> = (0..threads).map(|_| Vec::new()).collect();
    for (ch, link) in links.into_iter().enumerate() {
        let ch = ch as u16;
        let log = NetLog::open(opts.log_dir.as_deref(), "send", ch, start)
            .map_err(|e| SessionError::io("log directory", e))?;
        let mut sender = ChannelSender::new(&shared.layout, ch, send_cfg.clone());
        for stripe in held[usize::from(ch)].drain(..) {
            sender.hold(stripe);
        }
        groups[usize::from(ch) % threads].push(ChannelWorker {
            ch,
            link,
            sender,
            pacer: Pacer::new(per_channel_rate, PACER_CREDIT),
            shared: shared.clone(),
            events: ev_tx.clone(),
            log,
            packet: 0,
            rate_seen: controller.rate_bps(),
            loaded: None,
            valued: None,
            block_buf: IoBuf::new(shared.layout.block_size() as usize),
            sent: 0,
            resent: 0,
        });
    }
    let mut thread_cmds = Vec::new();
    let mut handles = Vec::new();
    for (i, group) in groups.into_iter().enumerate() {
        let (cmd_tx, cmd_rx) = unbounded();
        let handle = std::thread::Builder::new()
            .name(format!("send-{i}"))
            .spawn(move || serve_channels(group, cmd_rx))
            .map_err(|e| SessionError::io("channel thread", e))?;
        thread_cmds.push(ChannelCmds {
            tx: cmd_tx,
            thread: handle.thread().clone(),
        });
        handles.push(handle);
    }
    // Channel ch's commands go to the thread that serves it.
    let cmd_txs: Vec<ChannelCmds> = (0..usize::from(channels))
        .map(|ch| thread_cmds[ch % threads].clone())
        .collect();
    drop(ev_tx);

    let wires = Wires {
        rx: &rx,
        events: &ev_rx,
        tx: &tx,
        cmds: &cmd_txs,
    };
    let mut rate_log = NetLog::open_named(opts.log_dir.as_deref(), "send-rate.log", start)
        .map_err(|e| SessionError::io("log directory", e))?;
    rate_log.line(|| {
        let cfg = controller.config();
        format!(
            "start mode={:?} rate_mbps={:.1} ceiling_mbps={:.1} rtt_ms={:.2} delay_target_ms={:.1} report_every_ms={:.1}",
            cfg.mode,
            controller.rate_bps() as f64 / 1e6,
            cfg.ceiling_bps as f64 / 1e6,
            cfg.rtt.as_secs_f64() * 1e3,
            cfg.delay_target().as_secs_f64() * 1e3,
            report_every.as_secs_f64() * 1e3,
        )
    });
    let result = session_loop(
        &shared,
        &files,
        &wires,
        opts.stall_timeout,
        (&mut controller, &mut rate_log),
        &skipped,
        prober,
    );
    for c in &thread_cmds {
        let _ = c.send(ThreadCmd::Stop);
    }
    let mut sent = 0;
    let mut resent = 0;
    let mut nacks = 0;
    for h in handles {
        if let Ok((s, r, n)) = h.join() {
            sent += s;
            resent += r;
            nacks += n;
        }
    }
    match &result {
        Ok(_) => {
            let _ = tx.send(Control::Done);
        }
        // Probing found no datagram getting through: the caller retries over TCP.
        Err(SessionError::UdpBlocked { .. }) if opts.transport == Transport::Auto => {
            let _ = tx.send(Control::Fallback);
        }
        Err(e) if !e.peer_knows() => {
            let _ = tx.send(e.to_abort(Side::Sender));
        }
        Err(_) => {}
    }
    drop(tx);
    let _ = writer.join();
    // A FIN right behind the last message, so that the receiver reads it before anything of
    // ours could reset the connection.
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let (hashes, rejected, drops) = result?;
    let seconds = start.elapsed().as_secs_f64();
    Ok(SendSummary {
        bytes: sent_bytes,
        resumed_bytes,
        sparse_bytes,
        files: files.len(),
        skipped: skipped.iter().filter(|s| s.is_some()).count(),
        encrypted: data_seal.is_some(),
        dirs,
        seconds,
        goodput_bps: (sent_bytes - held_bytes) as f64 * 8.0 / seconds.max(1e-9),
        datagrams_sent: sent,
        datagrams_resent: resent,
        resent_share: if sent == 0 {
            0.0
        } else {
            resent as f64 / sent as f64
        },
        nacks,
        channels,
        transport: transport.as_str(),
        payload: shared.payload.load(Ordering::Relaxed),
        fallback_seconds: None,
        first_data_ms: match shared.first_data_us.load(Ordering::Relaxed) {
            u64::MAX => None,
            us => Some(us as f64 / 1e3),
        },
        rate: RateSummary::new(&controller, start, receiver_ceiling, opts.rate_bps),
        bottleneck: shared.limits.map(|limits| {
            BottleneckSummary::new(
                &controller,
                sent as f64
                    * (HEADER_LEN + usize::from(shared.payload.load(Ordering::Relaxed))) as f64
                    * 8.0,
                limits,
                shared.signs(),
            )
        }),
        receiver_rejected: rejected,
        receiver_socket_drops: drops,
        warnings,
        file_hashes: files
            .iter()
            .zip(hashes)
            .zip(&skipped)
            .zip(&unchecked)
            .map(|(((f, h), k), &u)| FileReport {
                path: f.rel_path.clone(),
                size: f.size,
                blake3: if u { String::new() } else { to_hex(&h) },
                skipped: k.is_some(),
            })
            .collect(),
    })
}

/// The holes of the sparse source file at `path`, in whole blocks (see
/// [`crate::fs::hole_blocks`]); none if it cannot be opened or asked, and then its bytes
/// are read and sent, holes or not. A hole filled after this look is still sent right: its
/// value, read when the transfer comes to it, differs from the receiver's, which asks for it.
fn source_holes(path: &std::path::Path, size: u64, block_size: u64) -> Vec<(u64, u64)> {
    std::fs::File::open(path)
        .and_then(|f| crate::fs::hole_blocks(&f, size, block_size))
        .unwrap_or_default()
}

/// Opens a TCP connection to the receiver with the session's dialer.
fn dial(opts: &SendOptions, addr: SocketAddr) -> Result<TcpStream, SessionError> {
    let dialer: &dyn Dialer = opts.dialer.as_deref().unwrap_or(&Direct);
    dialer
        .dial(addr, opts.connect_timeout)
        .map_err(|source| SessionError::Connect { addr, source })
}

/// The data paths being set up while the receiver decides on the manifest.
enum DataSetup {
    /// One connection per channel, being dialled.
    Tcp(Vec<std::thread::JoinHandle<Result<TcpStream, SessionError>>>),
    /// The channels' sockets, and the probing of the path that started on them.
    Udp(Vec<UdpChannel>, Box<Prober>),
}

/// Dials the TCP data connections, all at once (one after the other, 8 of them would cost 8
/// round trips), each greeted with the session and its channel.
fn dial_data(
    opts: &SendOptions,
    dests: &[SocketAddr],
    session: u64,
    key: &DataKey,
) -> Vec<std::thread::JoinHandle<Result<TcpStream, SessionError>>> {
    dests
        .iter()
        .enumerate()
        .map(|(ch, &dest)| {
            let opts = opts.clone();
            let greeting = link::greeting(key, session, ch as u16);
            std::thread::spawn(move || {
                let mut s = dial(&opts, dest)?;
                let _ = s.set_nodelay(true);
                s.write_all(&greeting)
                    .map_err(|e| SessionError::io("TCP data connection", e))?;
                Ok(s)
            })
        })
        .collect()
}

/// The driver of [`PayloadProbe`]: sends its probe datagrams from clones of the channels'
/// sockets (the channel threads own the sockets themselves), beside the data.
struct Prober {
    probe: PayloadProbe,
    socks: Vec<std::net::UdpSocket>,
    dests: Vec<SocketAddr>,
    session: u64,
    /// The last probe packet number, counted from [`secure::PROBE_PACKETS`] (a space of its
    /// own: a probe never shares a nonce with data).
    packet: u64,
    seal: Option<PacketSeal>,
}

impl Prober {
    /// Sends the probes that are due. A size the local interface refuses (`EMSGSIZE`: the
    /// sockets set don't-fragment) is dropped; any other failure is a probe lost on the way.
    fn send_due(&mut self, now: Instant) {
        let mut buf = vec![0u8; HEADER_LEN + usize::from(self.probe.max_payload()) + TAG_LEN];
        for (ch, payload) in self.probe.to_send(now) {
            let (Some(sock), Some(dest)) = (
                self.socks.get(usize::from(ch)),
                self.dests.get(usize::from(ch)),
            ) else {
                continue;
            };
            let size = HEADER_LEN + usize::from(payload);
            self.packet += 1;
            Header {
                kind: Kind::Probe,
                flags: 0,
                channel: ch,
                session: self.session,
                packet: self.packet,
                file: 0,
                offset: size as u64,
                len: payload,
                sent_us: 0,
            }
            .encode(&mut buf[..size]);
            let size = match &self.seal {
                Some(seal) => {
                    seal.seal(&mut buf[..size + TAG_LEN]);
                    size + TAG_LEN
                }
                None => size,
            };
            if let Err(e) = sock.send_to(&buf[..size], dest) {
                if e.raw_os_error() == Some(libc::EMSGSIZE) {
                    self.probe.on_too_big(payload);
                }
            }
        }
    }
}

/// One line of `send-rate.log`: a receiver report and the change it caused, if any.
fn rate_line(fb: &Feedback, rate_bps: u64, changed: Option<&str>) -> String {
    let secs = fb.interval.as_secs_f64();
    let delivered = if secs > 0.0 {
        fb.bytes as f64 * 8.0 / secs / 1e6
    } else {
        0.0
    };
    let rate = rate_bps as f64 / 1e6;
    let why = changed.unwrap_or("unchanged");
    format!(
        "report interval_ms={:.1} delivered_mbps={delivered:.1} datagrams={} lost={} socket_drops={} queue_ms={:.2} fill={:.0}% lag_ms={:.1} -> rate {rate:.1} Mbit/s ({why})",
        secs * 1e3,
        fb.datagrams,
        fb.lost,
        fb.socket_drops,
        fb.queue_delay.as_secs_f64() * 1e3,
        fb.queue_fill * 100.0,
        fb.receiver_lag.as_secs_f64() * 1e3,
    )
}

type LoopResult = Result<(Vec<[u8; 32]>, u64, u64), SessionError>;

/// The session loop's message paths: control in and out, channel events in, channel commands out.
struct Wires<'a> {
    rx: &'a Incoming,
    events: &'a Receiver<ChanEvent>,
    tx: &'a Sender<Control>,
    cmds: &'a [ChannelCmds],
}

fn session_loop(
    shared: &Shared,
    files: &[&walk::SourceEntry],
    wires: &Wires,
    stall: Duration,
    (controller, rate_log): (&mut RateController, &mut NetLog),
    skipped: &[Option<[u8; 32]>],
    mut prober: Option<Prober>,
) -> LoopResult {
    let Wires {
        rx,
        events,
        tx,
        cmds,
    } = *wires;
    let layout = &shared.layout;
    let mut table = BlockTable::new(layout);
    let mut confirmed: Vec<Option<[u8; 32]>> = skipped.to_vec();
    let mut left = confirmed.iter().filter(|c| c.is_none()).count();
    let (mut rejected, mut drops) = (0, 0);
    let mut last_received = 0;
    let mut last_progress = Instant::now();
    let mut judged_at = Instant::now();
    let tick = crossbeam_channel::tick(Duration::from_millis(200));
    while left > 0 {
        select! {
            recv(rx) -> msg => {
                let msg = msg.map_err(|_| ControlError::Closed)??;
                match msg {
                    Control::Nack { channel, ranges } => {
                        if let Some(c) = cmds.get(usize::from(channel)) {
                            let _ = c.send(ThreadCmd::Channel(channel, ChanCmd::Nack(ranges)));
                        }
                    }
                    Control::ChannelDone { channel } => {
                        if let Some(c) = cmds.get(usize::from(channel)) {
                            let _ = c.send(ThreadCmd::Channel(channel, ChanCmd::Done));
                        }
                    }
                    Control::FileDone { file, hash } => {
                        let f = file as usize;
                        let Some(want) = table.file_root(file).filter(|_| f < files.len()) else {
                            return Err(SessionError::Protocol(format!("receiver confirmed file {file} before it was sent")));
                        };
                        if want != hash {
                            return Err(SessionError::HashMismatch { path: files[f].rel_path.clone(), got: to_hex(&hash), want: to_hex(&want) });
                        }
                        if confirmed[f].replace(hash).is_none() {
                            left -= 1;
                            shared.progress.files_done.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    report @ Control::Report { received, rejected: r, socket_drops, .. } => {
                        rejected = r;
                        drops = socket_drops;
                        let Some(fb) = Feedback::of_report(&report) else { unreachable!("a report") };
                        shared
                            .receiver_signs
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .note(&fb, hurtle_proto::rate::model::queue_target(controller.config().rtt));
                        let change = controller.on_report(Instant::now(), &fb);
                        let why = change.as_ref().map(|c| c.reason.as_str());
                        rate_log.line(|| rate_line(&fb, controller.rate_bps(), why));
                        if change.is_some() {
                            let r = controller.rate_bps();
                            shared.rate_bps.store(r, Ordering::Relaxed);
                            shared.progress.rate_bps.store(r, Ordering::Relaxed);
                        }
                        shared.progress.confirmed.store(received, Ordering::Relaxed);
                        if judged_at.elapsed() >= LIMIT_EVERY {
                            judged_at = Instant::now();
                            judge_live(shared, controller);
                        }
                        if received > last_received {
                            last_received = received;
                            last_progress = Instant::now();
                        }
                    }
                    Control::ProbeAck { channel, size } => {
                        if let Some(p) = prober.as_mut() {
                            p.probe.on_ack(channel, usize::from(size), Instant::now());
                            probe_step(p, shared, last_received > 0, rate_log)?;
                        }
                    }
                    Control::KeepAlive => {}
                    other => return Err(SessionError::unexpected(Side::Receiver, other, "a data-phase message")),
                }
            }
            recv(events) -> ev => match ev {
                Ok(ChanEvent::Block { block, value, held }) => {
                    // Hashing what the receiver already holds is progress too: a resume of a
                    // big, nearly finished file sends nothing for a while.
                    if held {
                        last_progress = Instant::now();
                    }
                    if let Some((file, _)) = table.set(block, value) {
                        // Every block of this file has been read once: make sure it did not change
                        // meanwhile, before the last hash lets the receiver finish the file.
                        shared.sources[file as usize].check_unchanged()?;
                    }
                    let _ = tx.send(Control::BlockHashes { blocks: vec![(block, value)] });
                }
                Ok(ChanEvent::Failed(e)) => return Err(e),
                Err(_) => return Err(SessionError::Protocol("all channel threads ended early".into())),
            },
            recv(tick) -> _ => {
                if shared.progress.interrupted() {
                    return Err(SessionError::Interrupted { side: Side::Sender });
                }
                if let Some(p) = prober.as_mut() {
                    p.send_due(Instant::now());
                    probe_step(p, shared, last_received > 0, rate_log)?;
                    if p.probe.is_done() {
                        prober = None;
                    }
                }
                let _ = tx.send(Control::KeepAlive);
                if last_progress.elapsed() > stall {
                    return Err(SessionError::Stalled(stall.as_secs()));
                }
            }
        }
    }
    Ok((
        confirmed
            .into_iter()
            .map(|h| h.unwrap_or_default())
            .collect(),
        rejected,
        drops,
    ))
}

impl Shared {
    /// What the receiver's reports said of its CPU and its disk so far.
    fn signs(&self) -> ReceiverSigns {
        *self
            .receiver_signs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// The user's `--rate`, or 0 when it is the default (no ceiling at all).
fn user_cap(opts: &SendOptions) -> u64 {
    if opts.rate_bps >= SendOptions::default().rate_bps {
        0
    } else {
        opts.rate_bps
    }
}

/// How often the progress line's bottleneck is judged again.
const LIMIT_EVERY: Duration = Duration::from_secs(1);

/// Judges what limits the transfer so far, for the progress line.
fn judge_live(shared: &Shared, controller: &RateController) {
    let Some(limits) = shared.limits else {
        return;
    };
    let payload = usize::from(shared.payload.load(Ordering::Relaxed)).max(1);
    // First transmissions only: close enough to tell a sender that cannot keep up.
    let bits =
        shared.progress.sent.load(Ordering::Relaxed) as f64 * 8.0 * (HEADER_LEN + payload) as f64
            / payload as f64;
    let b = BottleneckSummary::judge(controller, bits, limits, shared.signs());
    shared.progress.set_limit(b.brief());
}

/// Applies what probing decided: another payload for the data from now on, or UDP blocked.
/// `delivered`: the receiver has reported data.
fn probe_step(
    p: &mut Prober,
    shared: &Shared,
    delivered: bool,
    log: &mut NetLog,
) -> Result<(), SessionError> {
    match p.probe.poll(Instant::now(), delivered) {
        Some(ProbeDecision::UsePayload(payload)) => {
            shared.payload.store(payload, Ordering::Relaxed);
            log.line(|| format!("payload {payload}: the largest size the path carried"));
            Ok(())
        }
        Some(ProbeDecision::Blocked { channel, after }) => Err(SessionError::UdpBlocked {
            channel,
            secs: after.as_secs(),
        }),
        None => Ok(()),
    }
}

/// Commands to the thread that serves a channel. The thread sleeps in `park_timeout` between
/// sends, and a command wakes it: crossbeam's blocking receive spins and yields before it
/// sleeps, which costs the sending thread CPU (thousands of `sched_yield` per GiB) for pacing
/// waits of tens of microseconds.
#[derive(Clone)]
struct ChannelCmds {
    tx: Sender<ThreadCmd>,
    thread: std::thread::Thread,
}

impl ChannelCmds {
    /// Queues `cmd` and wakes the thread; an error when the thread has ended.
    fn send(&self, cmd: ThreadCmd) -> Result<(), crossbeam_channel::SendError<ThreadCmd>> {
        let sent = self.tx.send(cmd);
        self.thread.unpark();
        sent
    }
}

/// Threads sending `channels` UDP channels: one per channel, at most one per core. TCP
/// connections get a thread each: a write blocks until the connection takes it, which would
/// hold up the others.
fn send_threads(channels: u16, tcp: bool) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let channels = usize::from(channels).max(1);
    if tcp {
        channels
    } else {
        channels.min(cores)
    }
}

/// Sends for several channels on one thread until told to stop: each channel sends what its
/// pacer allows in turn, then the thread sleeps until the first of them may send again, a
/// timer is due, or a command arrives. Returns (datagrams sent, datagrams resent, NACKs
/// handled), summed over the channels. A channel's error is reported and ends the thread.
fn serve_channels(mut workers: Vec<ChannelWorker>, cmds: Receiver<ThreadCmd>) -> (u64, u64, u64) {
    let mut bufs = SendBufs::for_channels(&workers);
    // Hands a command to its channel; false when the thread is to stop.
    let dispatch = |workers: &mut [ChannelWorker], cmd: ThreadCmd| -> bool {
        match cmd {
            ThreadCmd::Stop => false,
            ThreadCmd::Channel(ch, cmd) => {
                if let Some(w) = workers.iter_mut().find(|w| w.ch == ch) {
                    w.on_cmd(cmd);
                }
                true
            }
        }
    };
    'run: loop {
        loop {
            match cmds.try_recv() {
                Ok(c) => {
                    if !dispatch(&mut workers, c) {
                        break 'run;
                    }
                }
                Err(crossbeam_channel::TryRecvError::Disconnected) => break 'run,
                Err(crossbeam_channel::TryRecvError::Empty) => break,
            }
        }
        let mut wake: Option<Instant> = None;
        for w in &mut workers {
            match w.step(&mut bufs) {
                Ok(next) => wake = [wake, next].into_iter().flatten().min(),
                Err(e) => {
                    let _ = w.events.send(ChanEvent::Failed(e));
                    break 'run;
                }
            }
        }
        let wait = match wake {
            Some(t) => t.saturating_duration_since(Instant::now()),
            None => Duration::from_millis(200),
        };
        if wait.is_zero() {
            continue;
        }
        // Even short waits sleep: spinning through them with sched_yield costs CPU (on
        // loopback, a core both ends share) and gained nothing; a late wake-up is made up from
        // the pacer's credit. A command unparks the thread
        // (`ChannelCmds::send`); the loop's top takes it.
        std::thread::park_timeout(wait);
    }
    workers.iter().fold((0, 0, 0), |(s, r, n), w| {
        (s + w.sent, r + w.resent, n + w.sender.stats().nacks)
    })
}

/// Buffers a channel thread shares between its channels, sized once for the largest send any
/// of them makes: the headers of the datagrams being sent, and a repair's bytes.
struct SendBufs {
    headers: Vec<u8>,
    scratch: IoBuf,
}

impl SendBufs {
    fn for_channels(workers: &[ChannelWorker]) -> SendBufs {
        let (datagrams, payload) = workers
            .iter()
            .map(ChannelWorker::max_send)
            .fold((0, 0), |(d, p), (wd, wp)| (d.max(wd), p.max(wp)));
        SendBufs {
            headers: vec![0u8; datagrams * HEADER_LEN],
            scratch: IoBuf::new(payload),
        }
    }
}

struct ChannelWorker {
    ch: u16,
    link: LinkOut,
    sender: ChannelSender,
    pacer: Pacer,
    shared: Arc<Shared>,
    events: Sender<ChanEvent>,
    log: NetLog,
    packet: u64,
    /// The shared rate last applied to this channel's pacer.
    rate_seen: u64,
    /// The block new data is being sent from, and its bytes.
    loaded: Option<u64>,
    /// The block whose value was passed on last (a hole's value is, without loading it).
    valued: Option<u64>,
    block_buf: IoBuf,
    /// Datagrams sent and resent.
    sent: u64,
    resent: u64,
}

impl ChannelWorker {
    fn on_cmd(&mut self, cmd: ChanCmd) {
        match cmd {
            ChanCmd::Nack(ranges) => {
                let q = self.sender.on_nack(&ranges, Instant::now());
                self.log.line(|| {
                    format!(
                        "nack ranges={} queued={q} first={:?}",
                        ranges.len(),
                        ranges.first()
                    )
                });
            }
            ChanCmd::Done => {
                self.sender.on_channel_done();
                self.log.line(|| "channel confirmed".into());
            }
        }
    }

    /// How many datagrams one send may carry now: the link's limit, and over UDP no more than
    /// one GSO send's bytes.
    fn max_datagrams(&self, payload: u16) -> usize {
        self.datagrams_within(self.link.max_frames(), payload)
    }

    /// The most datagrams one send can ever make (the link's limit changes when GSO is turned
    /// off after a failure, but never exceeds [`LinkOut::frame_limit`]), and the most payload
    /// bytes in them: what the buffers are sized for.
    /// Probing may move the payload between [`wire::MIN_PAYLOAD`] and the session's largest:
    /// the buffers fit either.
    fn max_send(&self) -> (usize, usize) {
        let frames = self.link.frame_limit();
        [wire::MIN_PAYLOAD, self.shared.max_payload]
            .into_iter()
            .map(|p| {
                let n = self.datagrams_within(frames, p);
                (n, n * usize::from(p))
            })
            .fold((0, 0), |(d, b), (n, nb)| (d.max(n), b.max(nb)))
    }

    fn datagrams_within(&self, frames: usize, payload: u16) -> usize {
        let dgram = self.link.frame_overhead() + usize::from(payload);
        if self.link.is_tcp() {
            frames
        } else {
            frames.min((crate::net::udp::MAX_GSO_BYTES / dgram).max(1))
        }
    }

    /// Reads `block` into the block buffer unless it is there already, and the first time
    /// hashes it and passes its value on (for the receiver; `held`: the receiver has the block
    /// and will not be sent it, and if it lies in a hole it is hashed as zeros, not read).
    /// Returns the block's file offset.
    fn load_block(&mut self, block: u64, held: bool) -> Result<u64, SessionError> {
        let layout = &self.shared.layout;
        let (file, range) = layout
            .block_file_range(block)
            .ok_or_else(|| SessionError::Protocol("block outside the layout".into()))?;
        let loaded = self.loaded == Some(block);
        // Bytes to send from the buffer (a held block's are not sent), and a value to pass on.
        let need_bytes = !held && !loaded;
        let need_value = self.valued != Some(block);
        if need_bytes || need_value {
            let blen = (range.end - range.start) as usize;
            let source = &self.shared.sources[file as usize];
            // A hole the receiver holds as a hole is hashed, not read: reading one makes the
            // kernel fill page-cache pages with zeros (a GiB of holes cost a second of it).
            let data = if loaded {
                &self.block_buf.aligned()[..blen]
            } else if held && source.is_hole(range.start, range.end)? {
                crate::iobuf::zeros(blen)
            } else {
                let block_buf = &mut self.block_buf.aligned()[..blen];
                source.read_at(range.start, block_buf)?;
                self.loaded = Some(block);
                &*block_buf
            };
            if need_value {
                let blocks = layout.blocks_of(file);
                let value = block_value(
                    data,
                    block - blocks.start,
                    layout.block_size(),
                    blocks.end - blocks.start,
                );
                self.valued = Some(block);
                let _ = self.events.send(ChanEvent::Block { block, value, held });
            }
        }
        Ok(range.start)
    }

    /// Sends what the pacer allows (new data, repairs, the final marker) at the rate the
    /// controller last chose; returns when it should run again (`None`: only when a command
    /// comes).
    fn step(&mut self, bufs: &mut SendBufs) -> Result<Option<Instant>, SessionError> {
        // Its own handle, so that reading blocks (which borrows the worker) can go on beside it.
        let shared = self.shared.clone();
        let layout = &shared.layout;
        let payload16 = self.shared.payload.load(Ordering::Relaxed);
        let payload = usize::from(payload16);
        // The buffers fit any run the link allows (`max_send`).
        let max_run = (self.max_datagrams(payload16) * payload) as u64;
        let scratch = &mut bufs.scratch;
        let headers = &mut bufs.headers;
        // Data, as the pacer allows, at the rate the controller last chose.
        let rate = self.shared.rate_bps.load(Ordering::Relaxed);
        if rate != self.rate_seen {
            self.rate_seen = rate;
            self.pacer
                .set_rate((rate / u64::from(self.shared.channels)).max(100_000));
            self.log
                .line(|| format!("rate {rate} bit/s for all channels"));
        }
        // Each send is at most this much of the session's rate (and at least one datagram): a
        // shallow bottleneck queue then sees short trains, not 64-datagram GSO bursts.
        let bytes = (self.rate_seen as f64 / 8.0 * SEND_TRAIN.as_secs_f64()) as u64;
        let run_cap = (bytes / payload as u64 * payload as u64).clamp(payload as u64, max_run);
        let mut now = Instant::now();
        let mut bursts = 0;
        while self.pacer.can_send(now) && bursts < 16 {
            let Some(run) = self.sender.poll_run(layout, run_cap, now) else {
                break;
            };
            bursts += 1;
            let span = layout
                .resolve(self.ch, run.pos)
                .ok_or_else(|| SessionError::Protocol("run outside the layout".into()))?;
            let len = run.len as usize;
            let data: &[u8] = match run.kind {
                RunKind::Held => {
                    // The receiver has these bytes: it needs only their value to check them.
                    self.load_block(span.block, true)?;
                    self.log
                        .line(|| format!("held block {} hashed", span.block));
                    continue;
                }
                RunKind::New => {
                    let start = self.load_block(span.block, false)?;
                    let at = (span.offset - start) as usize;
                    &self.block_buf.aligned()[at..at + len]
                }
                RunKind::Repair => {
                    let buf = scratch.for_offset(span.offset, len);
                    shared.sources[span.file as usize].read_at(span.offset, buf)?;
                    buf
                }
            };
            let flags = if run.kind == RunKind::Repair {
                wire::FLAG_RETRANSMIT
            } else {
                0
            };
            let sent_us = self.shared.start.elapsed().as_micros() as u32;
            let mut total = 0;
            let mut n = 0u64;
            // Headers only: the link gathers each datagram from its header and its slice of
            // `data`, which is not copied.
            for (i, piece) in data.chunks(payload).enumerate() {
                self.packet += 1;
                let at = i * HEADER_LEN;
                Header {
                    kind: Kind::Data,
                    flags,
                    channel: self.ch,
                    session: self.shared.session,
                    packet: self.packet,
                    file: span.file,
                    offset: span.offset + (i * payload) as u64,
                    len: piece.len() as u16,
                    sent_us,
                }
                .encode(&mut headers[at..]);
                total += HEADER_LEN + piece.len();
                n += 1;
            }
            self.link
                .send_framed(&headers[..n as usize * HEADER_LEN], data, payload)?;
            if self.sent == 0 {
                shared
                    .first_data_us
                    .fetch_min(shared.start.elapsed().as_micros() as u64, Ordering::Relaxed);
            }
            self.sent += n;
            shared.progress.note_moving(self.ch, span.file);
            if run.kind == RunKind::Repair {
                self.resent += n;
            } else {
                self.shared
                    .progress
                    .sent
                    .fetch_add(run.len, Ordering::Relaxed);
            }
            self.log.line(|| {
                format!(
                    "send {:?} pos={} len={} datagrams={n} pkt={}",
                    run.kind, run.pos, run.len, self.packet
                )
            });
            self.pacer.on_sent(now, total as u64);
            now = Instant::now();
        }
        // The final marker.
        if self.sender.poll_final(now) {
            self.packet += 1;
            let mut fin = [0u8; HEADER_LEN];
            Header {
                kind: Kind::Final,
                flags: 0,
                channel: self.ch,
                session: self.shared.session,
                packet: self.packet,
                file: 0,
                offset: self.sender.stripe_len(),
                len: 0,
                // Stamped like data: the receiver takes a one-way delay sample from it.
                sent_us: self.shared.start.elapsed().as_micros() as u32,
            }
            .encode(&mut fin);
            self.link.send_headers(&fin)?;
            self.log
                .line(|| format!("final stripe_len={}", self.sender.stripe_len()));
        }
        // When the pacer or a timer allows more.
        let pace = if self.sender.has_work() {
            Some(self.pacer.ready_at().unwrap_or(now))
        } else {
            None
        };
        Ok([pace, self.sender.next_timeout()]
            .into_iter()
            .flatten()
            .min())
    }
}
