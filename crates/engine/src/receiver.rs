//! The receiving side of a session: listen, agree, check the manifest, receive, verify, commit.
//!
//! Threads: the session loop (the caller's thread) owns the [`Verifier`] and the files' fates:
//! it feeds the sender's block values in and hands verified files to a committer thread, which
//! commits them (fsync + rename, in batches of a few milliseconds' worth) and sends `FileDone`
//! for each. Channel threads, one per channel but no more than there are cores, each serve one
//! or more channels; a channel's [`ChannelReceiver`] and socket belong to one thread, which
//! checks every datagram, gathers each block in a buffer (hashing it front to back as its bytes
//! arrive in order, while they are still in the CPU's cache), and writes it with one positional
//! write when complete (starting its writeback to the disk, so the final fsync has little left
//! to do) and hands its value to the session loop. On a disk the writing is left to a writer
//! thread (`Writer`), so that a write that blocks never stops a channel thread from
//! reading its socket; the writer hands the value on once the block is written. A block still
//! incomplete when buffers run short is *spilled*: what it
//! holds is written to the file, and the rest is written as it arrives; the block is then
//! hashed by reading it back.
//!
//! Every datagram is checked before it is trusted: its source address here, everything else
//! (session id, channel, kind, length, and that its bytes lie inside one block of a file of the
//! manifest) by the channel's [`Admission`] in `hurtle-proto`, which also counts what
//! the reports say; failures are counted and dropped. The reports themselves are built by a
//! [`ReportBuilder`] in the session loop.

use crate::accept::{Arrival, DoorLimits, FrontDoor, Gatekeeper, Greeted};
use crate::agree::Keyring;
use crate::error::{next_control, SessionError, Side};
use crate::fs::{self, PartFile, StoreError};
use crate::net::control::ControlError;
use crate::net::link::{read_greeting, LinkIn, TcpFrames};
use crate::net::udp::{ChannelOptions, RecvBatch, UdpChannel, GRO_BUF_SIZE};
use crate::netlog::NetLog;
use crate::progress::{Phase, Progress};
use crossbeam_channel::{select, unbounded, Receiver as ChanRx, Sender};
use hurtle_proto::admit::{Admit, Placed, RejectReason, ReportFacts, Tally};
use hurtle_proto::hash::{block_value, to_hex, BlockHasher, BlockValue};
use hurtle_proto::layout::{check_block_ranges, count_blocks, union_ranges, MAX_BLOCKS};
use hurtle_proto::secure::{DataKey, PacketOpen};
use hurtle_proto::wire::{self, Control, Decision, Entry, EntryKind};
use hurtle_proto::{
    Admission, ChannelReceiver, Layout, RecvConfig, ReportBuilder, Verdict, Verifier,
};
use serde::Serialize;
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How to receive.
#[derive(Debug, Clone)]
pub struct ReceiveOptions {
    /// Directory the files land in (created if missing).
    pub out_dir: PathBuf,
    /// Replace files that already exist.
    pub overwrite: bool,
    /// Most channels to accept.
    pub max_channels: u16,
    /// Directory for per-channel network logs.
    pub log_dir: Option<PathBuf>,
    /// Memory for block buffers, across all channels.
    pub buffer_memory: usize,
    /// Give up when the sender is silent this long.
    pub idle_timeout: Duration,
    /// Filled with the ports this receiver listens on (control, and the current session's TCP
    /// data listener), so a relay agent can refuse to forward connections anywhere else.
    pub own_ports: Arc<OwnPorts>,
    /// Whether complete blocks go to a writer thread (see [`WriteQueue`]).
    pub write_queue: WriteQueue,
    /// The code and keys a sender may use (authentication is never off: an empty keyring
    /// fails with [`SessionError::NoSecret`]).
    pub keys: Keyring,
    /// Ask for data datagrams in the clear (`--no-encryption`): granted only when the sender
    /// asks too.
    pub no_encryption: bool,
    /// How new connections are greeted: the grace time for their hello and how many may be
    /// greeted at once (see [`crate::accept`]).
    pub door: DoorLimits,
}

/// Who writes complete blocks to their files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WriteQueue {
    /// A writer thread behind a bounded queue on a disk, the channel threads on tmpfs and
    /// ramfs (where a write never waits for a device).
    #[default]
    Auto,
    /// Always the writer thread (to test or compare its path on any filesystem).
    Always,
    /// Always the channel threads.
    Never,
}

/// The local TCP ports a receiver is listening on right now.
#[derive(Debug, Default)]
pub struct OwnPorts(std::sync::Mutex<Vec<u16>>);

impl OwnPorts {
    /// True if the receiver listens on `port`.
    pub fn contains(&self, port: u16) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&port)
    }

    fn add(&self, port: u16) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(port);
    }

    fn remove(&self, port: u16) {
        let mut v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = v.iter().position(|&p| p == port) {
            v.swap_remove(i);
        }
    }
}

/// Removes a port from [`OwnPorts`] when the listener it stands for is dropped.
struct OwnPort<'a>(&'a OwnPorts, u16);

impl Drop for OwnPort<'_> {
    fn drop(&mut self) {
        self.0.remove(self.1);
    }
}

impl Default for ReceiveOptions {
    fn default() -> Self {
        ReceiveOptions {
            out_dir: PathBuf::from("."),
            overwrite: false,
            max_channels: 32,
            log_dir: None,
            buffer_memory: 256 << 20,
            idle_timeout: Duration::from_secs(30),
            own_ports: Arc::default(),
            write_queue: WriteQueue::Auto,
            keys: Keyring::default(),
            no_encryption: false,
            door: DoorLimits::default(),
        }
    }
}

/// What a finished receive did.
#[derive(Debug, Clone, Serialize)]
pub struct ReceiveSummary {
    /// The sender's control address.
    pub peer: String,
    /// File bytes received (including those resumed).
    pub bytes: u64,
    /// Of those, bytes already here from an interrupted transfer (checked, not received again).
    pub resumed_bytes: u64,
    /// Of those, bytes in holes of sparse files (checked, not received; left as holes here).
    pub sparse_bytes: u64,
    /// Files written.
    pub files: usize,
    /// Directories created.
    pub dirs: usize,
    /// Seconds from the hello to the end.
    pub seconds: f64,
    /// Bits per second of file data received in this session (`bytes - resumed_bytes -
    /// sparse_bytes`).
    pub goodput_bps: f64,
    /// Channels used.
    pub channels: u16,
    /// Payload bytes that arrived more than once.
    pub duplicate_bytes: u64,
    /// NACK messages sent.
    pub nacks: u64,
    /// Datagrams dropped as foreign, malformed or out of bounds.
    pub rejected: u64,
    /// Data frames dropped because they failed to open: forged, changed on the way, replayed.
    pub unauthentic: u64,
    /// Whether data frames were encrypted (control frames always are).
    pub encrypted: bool,
    /// Blocks that failed verification and were fetched again.
    pub rejected_blocks: u64,
    /// Blocks written to the file while still incomplete because the block buffers ran out
    /// (their missing datagrams are then written one by one as they arrive).
    pub spilled_blocks: u64,
    /// Kernel socket drops, when the kernel reports them.
    pub socket_drops: u64,
    /// Warnings (small socket buffers ...).
    pub warnings: Vec<String>,
    /// What this receiver measured it can absorb, and offered as the rate ceiling.
    pub capacity: Capacity,
    /// Per-file results.
    pub file_hashes: Vec<crate::report::FileReport>,
    /// Connections dropped before their greeting (not hurtle peers, or silent) since the
    /// receiver's previous transfer ended, or since it began listening: see [`crate::accept`].
    pub strays: u64,
}

/// What the receiver can absorb, measured once (PA-UDP's rate ceiling).
///
/// Only hashing is measured, in CPU time. The destination's write rate is not: a one-off sample
/// is only as good as the moment it was taken (a disk sampled while another big file is written
/// back looks several times slower than it is, and that ceiling would hold the whole transfer;
/// a small sample of tmpfs read twice as fast in one run as in the next), and the transfer
/// measures it all along instead: a disk's writer queue, or a receiving thread that
/// writes slowly and so reads its socket slowly, shows as backlog in every report.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Capacity {
    /// BLAKE3 rate of one core, bits per second of CPU time.
    pub hash_bps: u64,
    /// Threads that can hash at once (channels, at most the cores).
    pub threads: u64,
    /// The CPU quota of this process's cgroup, in cores, if it has one.
    pub cpu_quota: Option<f64>,
    /// The ceiling offered to senders: 90% of hashing, on the threads or within the CPU quota
    /// if that is less.
    pub ceiling_bps: u64,
}

impl Capacity {
    /// No measurement: no ceiling.
    const UNKNOWN: Capacity = Capacity {
        hash_bps: 0,
        threads: 0,
        cpu_quota: None,
        ceiling_bps: 0,
    };

    /// The capacity of a session with `channels` channels, from what [`measure_capacity`] saw.
    fn for_channels(self, channels: u16) -> Capacity {
        if self.hash_bps == 0 {
            return Capacity::UNKNOWN;
        }
        let threads = receive_threads(channels) as u64;
        let cpus = self
            .cpu_quota
            .map_or(threads as f64, |q| q.min(threads as f64));
        Capacity {
            threads,
            ceiling_bps: (self.hash_bps as f64 * cpus * 0.9) as u64,
            ..self
        }
    }
}

/// Threads receiving `channels` channels: one per channel, at most one per core (but enough
/// that none waits on more sockets than one `poll` watches).
fn receive_threads(channels: u16) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    usize::from(channels)
        .clamp(1, cores)
        .max(usize::from(channels).div_ceil(crate::net::udp::MAX_WAIT_FDS))
}

/// Measures this machine's BLAKE3 rate per core (in CPU time, so a CPU quota does not distort
/// it) and the CPU quota. A session's threads and ceiling follow from these and its channel
/// count.
pub fn measure_capacity() -> Capacity {
    const MIB: usize = 1 << 20;
    let buf = vec![0x5au8; MIB];
    let (c0, t1) = (crate::cpu::thread_time(), Instant::now());
    let cpu = || crate::cpu::thread_time().saturating_sub(c0);
    let mut rounds = 0u64;
    // 20 ms of CPU time; the wall-clock bound only matters if the CPU clock does not work.
    while rounds < 4 || (cpu() < Duration::from_millis(20) && t1.elapsed() < Duration::from_secs(1))
    {
        std::hint::black_box(blake3::hash(&buf));
        rounds += 1;
    }
    let hash_secs = match cpu() {
        Duration::ZERO => t1.elapsed(),
        c => c,
    }
    .as_secs_f64()
    .max(1e-6);
    Capacity {
        hash_bps: (rounds as f64 * MIB as f64 * 8.0 / hash_secs) as u64,
        threads: 0,
        cpu_quota: crate::cpu::quota_cores(),
        ceiling_bps: 0,
    }
}

/// A bound receiver; [`Receiver::accept_one`] serves one transfer.
pub struct Receiver {
    /// Accepts and greets connections on `listener`; dropped first, which stops it.
    door: FrontDoor,
    listener: TcpListener,
    opts: ReceiveOptions,
    /// Measured once, by a thread started at bind time (see [`Receiver::bind`]).
    capacity: Arc<std::sync::OnceLock<Capacity>>,
}

#[derive(Default)]
struct Counters {
    /// Data frames that failed to open.
    unauthentic: AtomicU64,
    rejected: AtomicU64,
    duplicate: AtomicU64,
    nacks: AtomicU64,
    rejected_blocks: AtomicU64,
    spilled_blocks: AtomicU64,
    /// The channels' admission [`Tally`]s, summed (`rejected` above is its `rejected`): each
    /// channel thread adds what its channels counted once per receive batch.
    datagrams: AtomicU64,
    bytes: AtomicU64,
    pn_span: AtomicU64,
    delay_sum_us: AtomicU64,
    delay_count: AtomicU64,
}

impl Counters {
    /// Adds what a channel's admission counted since it was last added.
    fn add(&self, t: &Tally) {
        self.datagrams.fetch_add(t.datagrams, Ordering::Relaxed);
        self.bytes.fetch_add(t.bytes, Ordering::Relaxed);
        self.pn_span.fetch_add(t.pn_span, Ordering::Relaxed);
        self.delay_sum_us
            .fetch_add(t.delay_sum_us, Ordering::Relaxed);
        self.delay_count.fetch_add(t.delay_count, Ordering::Relaxed);
        self.rejected.fetch_add(t.rejected, Ordering::Relaxed);
    }

    /// The admission totals of all channels so far.
    fn totals(&self) -> Tally {
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

impl Shared {
    /// Kernel socket drops so far, summed over the channels.
    fn socket_drops(&self) -> u64 {
        self.channel_drops
            .iter()
            .map(|d| d.load(Ordering::Relaxed))
            .sum()
    }
}

enum ChanCmd {
    Reject(u64),
}

enum ChanEvent {
    Block { block: u64, value: [u8; 32] },
    Failed(SessionError),
}

struct Shared {
    layout: Layout,
    /// The files being received, by file id (`None`: skipped, the receiver has it).
    files: Vec<Option<Arc<PartFile>>>,
    peer_ip: IpAddr,
    to_wire: Sender<Control>,
    counters: Counters,
    progress: Arc<Progress>,
    stop: AtomicBool,
    /// The sender's `Start` arrived. Until then the sender is still probing and expects no
    /// data-phase message (`ChannelDone`, `FileDone`), so none is sent.
    started: AtomicBool,
    /// Kernel drop counter of each channel's socket, refreshed by its thread.
    channel_drops: Vec<AtomicU64>,
    /// The fullest any channel's socket receive buffer got since the last report, thousandths
    /// of its limit (sampled by the channel threads, taken by the report loop).
    queue_fill: AtomicU64,
    /// The longest a block waited in the writer's queue since the last report, microseconds.
    write_wait_us: AtomicU64,
    /// The fullest the writer's queue got since the last report, thousandths of its depth.
    write_fill: AtomicU64,
}

impl Receiver {
    /// Creates the output directory if it is missing (so that a receiver that cannot write
    /// there says so at once, not when a sender arrives), binds the control port, and starts
    /// measuring what this receiver can absorb, so that the measurement is done, or nearly,
    /// when the first sender says hello: in the hello's round trip it would inflate the
    /// sender's RTT estimate, and with it how slowly the sender's rate ramps up.
    pub fn bind(addr: SocketAddr, opts: ReceiveOptions) -> Result<Receiver, SessionError> {
        std::fs::create_dir_all(&opts.out_dir)
            .map_err(|e| SessionError::io(format!("create {}", opts.out_dir.display()), e))?;
        let listener =
            TcpListener::bind(addr).map_err(|source| SessionError::Listen { addr, source })?;
        if let Ok(a) = listener.local_addr() {
            opts.own_ports.add(a.port());
        }
        let door = listener
            .try_clone()
            .and_then(|l| {
                let keys = Gatekeeper {
                    keys: opts.keys.clone(),
                    plain_data: opts.no_encryption,
                };
                FrontDoor::open(l, opts.door, keys)
            })
            .map_err(|e| SessionError::io("accepting thread", e))?;
        let capacity = Arc::new(std::sync::OnceLock::new());
        let slot = capacity.clone();
        // If the thread cannot start, the first hello measures instead.
        let _ = std::thread::Builder::new()
            .name("capacity".into())
            .spawn(move || {
                slot.get_or_init(measure_capacity);
            });
        Ok(Receiver {
            door,
            listener,
            opts,
            capacity,
        })
    }

    /// What this receiver can absorb: measured once, by the thread [`Receiver::bind`] started
    /// (waiting for it if it is still at work).
    fn capacity(&self) -> Capacity {
        *self.capacity.get_or_init(measure_capacity)
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, SessionError> {
        self.listener
            .local_addr()
            .map_err(|e| SessionError::io("listening socket", e))
    }

    /// Waits for one sender and receives its transfer. A sender that finds UDP blocked ends
    /// its first session and connects again with parallel TCP: that is still one transfer.
    ///
    /// Connections that are not a hurtle sender's, or fail the key agreement, are dropped
    /// meanwhile and do not end the wait ([`crate::accept`]); the summary counts them. The
    /// [`CODE_TRIES`](crate::agree::CODE_TRIES)th failed agreement with the code spends it
    /// ([`SessionError::CodeSpent`]).
    pub fn accept_one(&self, progress: Arc<Progress>) -> Result<ReceiveSummary, SessionError> {
        if self.opts.keys.is_empty() {
            return Err(SessionError::NoSecret);
        }
        let mut fallbacks = 0;
        if let Ok(addr) = self.listener.local_addr() {
            progress.set_address(addr);
        }
        loop {
            let arrival = self.door.next()?;
            progress.set_phase(Phase::SettingUp);
            match self.serve(arrival, progress.clone()) {
                Err(SessionError::FellBack) if fallbacks < 2 => fallbacks += 1,
                Ok(mut summary) => {
                    summary.strays = self.door.take_strays();
                    return Ok(summary);
                }
                other => return other,
            }
        }
    }

    /// Connections dropped before their greeting and not yet counted in a summary.
    pub fn strays(&self) -> u64 {
        self.door.strays()
    }

    fn serve(
        &self,
        arrival: Arrival,
        progress: Arc<Progress>,
    ) -> Result<ReceiveSummary, SessionError> {
        let Arrival {
            stream,
            peer,
            greeted,
        } = arrival;
        let start = Instant::now();
        let local_ip = stream
            .local_addr()
            .map_err(|e| SessionError::io("control socket", e))?
            .ip();
        let Greeted {
            hello,
            keys,
            key_name,
        } = greeted;
        // Who came: the name the receiver's key file gives the key (or "code").
        tracing::info!("sender {peer} authenticated with {key_name}");
        let data = DataKeys {
            key: keys.data,
            encrypt: keys.encrypt_data,
        };
        let (rx, tx, writer) = crate::net::control::open(
            &stream,
            self.opts.idle_timeout,
            keys.frames_out,
            keys.frames_in,
        )
        .map_err(|e| SessionError::io("control connection", e))?;
        let result = self.run(hello, &rx, &tx, peer, local_ip, start, progress, &data);
        if let Err(e) = &result {
            if !e.peer_knows() {
                let _ = tx.send(e.to_abort(Side::Receiver));
            }
        }
        drop(tx);
        let _ = writer.join();
        let _ = stream.shutdown(std::net::Shutdown::Both);
        result
    }

    /// The session on a greeted connection whose first message was `first`.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        first: Control,
        rx: &ChanRx<Result<Control, ControlError>>,
        tx: &Sender<Control>,
        peer: SocketAddr,
        local_ip: IpAddr,
        start: Instant,
        progress: Arc<Progress>,
        data: &DataKeys,
    ) -> Result<ReceiveSummary, SessionError> {
        let handshake = Duration::from_secs(10);
        let (offered, payload, block_size, session, caps) = match first {
            Control::Hello {
                magic,
                version,
                channels,
                payload,
                block_size,
                session,
                caps,
            } => {
                if magic != wire::MAGIC || version != wire::VERSION {
                    return Err(SessionError::Incompatible(format!(
                        "not a hurtle {} sender (magic {magic:?}, version {version}): use the same hurtle version on both sides",
                        wire::VERSION
                    )));
                }
                (channels, payload, block_size, session, caps)
            }
            other => return Err(SessionError::unexpected(Side::Sender, other, "Hello")),
        };
        let channels = offered.clamp(1, self.opts.max_channels.max(1));
        let mut warnings = Vec::new();
        let tcp = caps & wire::CAP_TCP_DATA != 0;
        let checksum = caps & wire::CAP_CHECKSUM != 0;
        let mut udps = Vec::new();
        for _ in 0..if tcp { 0 } else { channels } {
            let u = UdpChannel::bind(SocketAddr::new(local_ip, 0), &ChannelOptions::default())?;
            if let Some(w) = u.buffer_warning() {
                if !warnings.contains(&w) {
                    warnings.push(w);
                }
            }
            udps.push(u);
        }
        let tcp_listener = if tcp {
            let l = TcpListener::bind(SocketAddr::new(local_ip, 0))
                .map_err(|e| SessionError::io("TCP data listener", e))?;
            Some(l)
        } else {
            None
        };
        let mut _own_port = None;
        let ports = match &tcp_listener {
            Some(l) => {
                let port = l
                    .local_addr()
                    .map_err(|e| SessionError::io("TCP data listener", e))?
                    .port();
                self.opts.own_ports.add(port);
                _own_port = Some(OwnPort(&self.opts.own_ports, port));
                vec![port; usize::from(channels)]
            }
            None => udps.iter().map(|u| u.local_addr().port()).collect(),
        };
        let root = &self.opts.out_dir;
        std::fs::create_dir_all(root)
            .map_err(|e| SessionError::io(format!("create {}", root.display()), e))?;
        let disk_queued = match self.opts.write_queue {
            WriteQueue::Auto => !fs::memory_backed_dir(root),
            WriteQueue::Always => true,
            WriteQueue::Never => false,
        };
        let capacity = self.capacity().for_channels(channels);
        let ack_sent = Instant::now();
        let _ = tx.send(Control::HelloAck {
            version: wire::VERSION,
            caps: 0,
            ports,
            payload: payload.min(wire::MAX_PAYLOAD),
            rate_ceiling: capacity.ceiling_bps,
        });

        // Manifest: check every path before anything is created.
        let mut entries: Vec<Entry> = Vec::new();
        let mut rtt = None;
        loop {
            match next_control(rx, handshake)? {
                Control::Manifest {
                    entries: part,
                    last,
                } => {
                    // The sender answers the HelloAck with its manifest at once: a round trip.
                    rtt.get_or_insert_with(|| ack_sent.elapsed());
                    entries.extend(part);
                    if entries.len() > 10_000_000 {
                        return Err(SessionError::Protocol(
                            "manifest has more than 10 million entries".into(),
                        ));
                    }
                    if last {
                        break;
                    }
                }
                other => return Err(SessionError::unexpected(Side::Sender, other, "Manifest")),
            }
        }
        check_blocks(&entries, block_size)?;
        // Hashing files the receiver already has and preallocating new ones can take a while:
        // keep the sender's wait for the manifest reply alive meanwhile.
        let _alive = crate::net::control::KeepAlive::start(tx.clone());
        // Each directory of the output tree is checked (or created) once for all its files.
        let out = fs::OutRoot::new(&self.opts.out_dir);
        let (decisions, resumes) = self.decide(&out, &entries, block_size, checksum)?;
        if let Some((e, Decision::Refuse(reason))) = entries
            .iter()
            .zip(&decisions)
            .find(|(_, d)| matches!(d, Decision::Refuse(_)))
        {
            let _ = tx.send(Control::ManifestReply {
                decisions: decisions.clone(),
            });
            return Err(SessionError::Refused {
                path: e.path.clone(),
                reason: reason.clone(),
            });
        }
        let files: Vec<&Entry> = entries
            .iter()
            .filter(|e| e.kind == EntryKind::File)
            .collect();
        let dirs: Vec<&Entry> = entries
            .iter()
            .filter(|e| e.kind == EntryKind::Dir)
            .collect();
        for d in &dirs {
            out.make_dir(&d.path, 0o700)?;
        }
        // A transfer that cannot fit is refused before anything is sent. Part files are created
        // (and preallocated) before the reply. The sender's probes may arrive meanwhile: they
        // wait in the sockets' buffers, and the sender's probe deadline runs only from the end
        // of this set-up (see `hurtle_proto::probe`).
        let file_decisions: Vec<&Decision> = entries
            .iter()
            .zip(&decisions)
            .filter(|(e, _)| e.kind == EntryKind::File)
            .map(|(_, d)| d)
            .collect();
        let (mut parts, held_values) =
            self.prepare_parts(&out, &files, &file_decisions, resumes, block_size)?;
        drop(_alive);
        let _ = tx.send(Control::ManifestReply {
            decisions: decisions.clone(),
        });
        let mut skipped = vec![false; files.len()];
        // The sender may take a while (hashing its copies of files the receiver has); it sends
        // keep-alives meanwhile.
        let skip = loop {
            match next_control(rx, handshake)? {
                Control::KeepAlive => continue,
                other => break other,
            }
        };
        match skip {
            Control::Skip { files: skip } => {
                for f in skip {
                    match skipped.get_mut(f as usize) {
                        Some(s) => *s = true,
                        None => {
                            return Err(SessionError::Protocol(format!(
                                "skip names file {f}, which is not in the manifest"
                            )))
                        }
                    }
                }
            }
            other => return Err(SessionError::unexpected(Side::Sender, other, "Skip")),
        }
        // A skipped file only counts if the receiver offered it (Have), never by the sender's say.
        let offered: Vec<bool> = entries
            .iter()
            .zip(&decisions)
            .filter(|(e, _)| e.kind == EntryKind::File)
            .map(|(_, d)| matches!(d, Decision::Have { .. } | Decision::Unchanged))
            .collect();
        if let Some(f) = (0..files.len()).find(|&f| skipped[f] && !offered[f]) {
            return Err(SessionError::Protocol(format!(
                "the sender skipped {}, which the receiver does not have",
                files[f].path
            )));
        }
        let kept: Vec<Option<[u8; 32]>> = entries
            .iter()
            .zip(&decisions)
            .filter(|(e, _)| e.kind == EntryKind::File)
            .zip(&skipped)
            .map(|((_, d), &s)| match d {
                Decision::Have { hash, .. } if s => Some(*hash),
                // Not read: the summary reports no hash for it.
                Decision::Unchanged if s => Some([0; 32]),
                _ => None,
            })
            .collect();
        let unchecked: Vec<bool> = entries
            .iter()
            .zip(&decisions)
            .filter(|(e, _)| e.kind == EntryKind::File)
            .map(|(_, d)| matches!(d, Decision::Unchanged))
            .collect();
        // Skipped files take no room in the layout: no block of theirs is ever sent.
        let sizes: Vec<u64> = files
            .iter()
            .zip(&skipped)
            .map(|(f, &s)| if s { 0 } else { f.size })
            .collect();
        let layout = Layout::new(&sizes, block_size, channels)?;
        progress.set_files(files.iter().map(|f| f.path.clone()).collect());
        let total: u64 = sizes.iter().sum();
        // A file the receiver offered as already there but the sender did not skip (its copy
        // differs, and --overwrite allows replacing it) gets its part file now.
        for (f, part) in parts.iter_mut().enumerate() {
            if part.is_none() && !skipped[f] {
                let p = self.new_part(&out, files[f], block_size)?;
                p.preallocate(&files[f].holes, block_size)?;
                *part = Some(p);
            }
        }
        // What is not sent: blocks resumed from part files, and the holes of sparse files.
        let resumed: Vec<Vec<(u64, u64)>> = file_decisions
            .iter()
            .map(|d| match d {
                Decision::Resume { blocks } => blocks.clone(),
                _ => Vec::new(),
            })
            .collect();
        let holes: Vec<&[(u64, u64)]> = files
            .iter()
            .zip(&skipped)
            .map(|(e, &s)| if s { &[][..] } else { &e.holes[..] })
            .collect();
        let held = layout.held_stripes(&resumed, &holes)?;
        let (held_bytes, resumed_bytes, sparse_bytes) =
            (held.bytes(), held.resumed_bytes, held.hole_bytes);
        let mut held_stripes = held.stripes;
        // The holes' own values come from the hole hasher below. A new part file reads as
        // zeros there by construction; a resumed one may hold other bytes, which are made
        // holes again, or read back where the filesystem cannot.
        let mut held_values = held_values;
        let mut hole_blocks = Vec::new();
        for (f, h) in holes.iter().enumerate() {
            let Some(part) = parts[f].as_ref().filter(|_| !h.is_empty()) else {
                continue;
            };
            let zeros = part.is_new() || part.punch_holes(h, block_size)?;
            held_values[f].retain(|&(b, _)| !in_ranges(h, b));
            hole_blocks.push(Holes {
                file: f as u32,
                blocks: h.iter().flat_map(|&(a, b)| a..b).collect(),
                zeros,
            });
        }
        // Held blocks, by global number with their values.
        let held: Vec<(u64, BlockValue)> = held_values
            .into_iter()
            .enumerate()
            .flat_map(|(f, values)| {
                let first = layout.blocks_of(f as u32).start;
                values.into_iter().map(move |(index, v)| (first + index, v))
            })
            .collect();
        progress.total.store(total - held_bytes, Ordering::Relaxed);
        progress.resumed.store(resumed_bytes, Ordering::Relaxed);
        let links: Vec<LinkIn> = match &tcp_listener {
            Some(l) => accept_data_connections(l, session, channels, peer.ip(), data)?,
            None => udps
                .into_iter()
                .enumerate()
                .map(|(ch, u)| LinkIn::udp(u, data.opener(ch as u16)))
                .collect(),
        };

        let shared = Arc::new(Shared {
            layout,
            files: parts.into_iter().map(|p| p.map(Arc::new)).collect(),
            peer_ip: peer.ip(),
            to_wire: tx.clone(),
            counters: Counters::default(),
            progress: progress.clone(),
            stop: AtomicBool::new(false),
            started: AtomicBool::new(false),
            channel_drops: (0..channels).map(|_| AtomicU64::new(0)).collect(),
            queue_fill: AtomicU64::new(0),
            write_wait_us: AtomicU64::new(0),
            write_fill: AtomicU64::new(0),
        });
        let (ev_tx, ev_rx) = unbounded();
        let buffers_per_channel =
            (self.opts.buffer_memory / usize::from(channels) / block_size as usize).max(4);
        // On a disk a write can block for a long time (the device busy, dirty pages throttled),
        // and a channel thread blocked in one lets its socket overflow: blocks go to a writer
        // thread instead. On tmpfs a write is a memory copy that never waits, and handing it
        // over costs more than it saves.
        let (writer, writer_handle) = disk_queued
            .then(|| {
                let depth = (self.opts.buffer_memory / 4 / block_size as usize).clamp(4, 256);
                Writer::start(shared.clone(), ev_tx.clone(), depth)
            })
            .transpose()
            .map_err(|e| SessionError::io("writer thread", e))?
            .unzip();
        let recv_cfg = RecvConfig::for_rtt(rtt.unwrap_or(Duration::from_millis(100)));
        let mut cmd_txs = Vec::new();
        // Channels share threads, no more than there are cores: a thread per channel would
        // wake up for less data each, and on a busy machine the wake-ups cost more than the
        // extra channels bring.
        let threads = receive_threads(channels);
        let mut groups: Vec<Vec<(ChannelWorker, LinkIn)>> =
            (0..threads).map(|_| Vec::new()).collect();
        for (ch, link) in links.into_iter().enumerate() {
            let ch = ch as u16;
            let (cmd_tx, cmd_rx) = unbounded();
            let log = NetLog::open(self.opts.log_dir.as_deref(), "recv", ch, start)
                .map_err(|e| SessionError::io("log directory", e))?;
            let mut rec = ChannelReceiver::new(ch, shared.layout.stripe_len(ch), recv_cfg.clone());
            for stripe in held_stripes[usize::from(ch)].drain(..) {
                rec.hold(stripe);
            }
            let worker = ChannelWorker {
                ch,
                rec,
                shared: shared.clone(),
                cmds: cmd_rx,
                events: ev_tx.clone(),
                buffers: HashMap::new(),
                order: VecDeque::new(),
                pool: Vec::new(),
                writer: writer.clone(),
                max_buffers: buffers_per_channel,
                spilled: HashMap::new(),
                refetched: HashSet::new(),
                log,
                probes_acked: Vec::new(),
                admission: Admission::new(session, ch..ch + 1, start),
                added: Tally::default(),
                queue_sampled: Instant::now(),
                moved_file: None,
            };
            groups[usize::from(ch) % threads].push((worker, link));
            cmd_txs.push(cmd_tx);
        }
        let mut handles = Vec::new();
        for (i, group) in groups.into_iter().enumerate() {
            let shared = shared.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("recv-{i}"))
                    .spawn(move || serve_channels(group, &shared))
                    .map_err(|e| SessionError::io("channel thread", e))?,
            );
        }
        let holes_handle = (!hole_blocks.is_empty())
            .then(|| hash_holes(shared.clone(), ev_tx.clone(), hole_blocks))
            .transpose()
            .map_err(|e| SessionError::io("hole hashing thread", e))?;
        drop(ev_tx);
        // The writer ends once every channel's end of its queue is gone.
        drop(writer);

        let result = std::thread::scope(|scope| {
            let commits = Commits::start(scope, &shared, &files, &kept)?;
            let wires = Wires {
                rx,
                events: &ev_rx,
                cmds: &cmd_txs,
                commits,
            };
            // Returning drops `commits`: the committer ends once it has committed what it
            // was given, and the scope waits for it.
            session_loop(&shared, &files, &dirs, root, wires, &kept, &held)
        });
        shared.stop.store(true, Ordering::Relaxed);
        let mut socket_drops = 0;
        let mut nacks = 0;
        for h in handles {
            if let Ok((drops, n)) = h.join() {
                socket_drops += drops;
                nacks += n;
            }
        }
        for h in writer_handle.into_iter().chain(holes_handle) {
            let _ = h.join();
        }
        let hashes = result?;
        let seconds = start.elapsed().as_secs_f64();
        let c = &shared.counters;
        Ok(ReceiveSummary {
            peer: peer.to_string(),
            bytes: total,
            resumed_bytes,
            sparse_bytes,
            files: files.len(),
            dirs: dirs.len(),
            seconds,
            goodput_bps: (total - held_bytes) as f64 * 8.0 / seconds.max(1e-9),
            channels,
            duplicate_bytes: c.duplicate.load(Ordering::Relaxed),
            nacks,
            rejected: c.rejected.load(Ordering::Relaxed),
            unauthentic: c.unauthentic.load(Ordering::Relaxed),
            encrypted: data.encrypt,
            rejected_blocks: c.rejected_blocks.load(Ordering::Relaxed),
            spilled_blocks: c.spilled_blocks.load(Ordering::Relaxed),
            socket_drops,
            warnings,
            capacity,
            file_hashes: files
                .iter()
                .zip(hashes)
                .zip(&kept)
                .zip(&unchecked)
                .map(|(((f, h), k), &u)| crate::report::FileReport {
                    path: f.path.clone(),
                    size: f.size,
                    blake3: if u && k.is_some() {
                        String::new()
                    } else {
                        to_hex(&h)
                    },
                    skipped: k.is_some(),
                })
                .collect(),
            strays: 0,
        })
    }

    /// The answer to each manifest entry: send, refuse, already here (unchanged, or to be
    /// compared by hash), or resume from a part file; for each file entry, the part file to
    /// resume and what it holds.
    fn decide(
        &self,
        out: &fs::OutRoot,
        entries: &[Entry],
        block_size: u64,
        checksum: bool,
    ) -> Result<(Vec<Decision>, Vec<Option<Resumed>>), SessionError> {
        let mut decisions = Vec::with_capacity(entries.len());
        // Per file entry: a part file left by an interrupted transfer, and the values of the
        // blocks its journal lists, hashed again now.
        let mut resumes: Vec<Option<Resumed>> = Vec::new();
        for e in entries {
            let target = out.resolve(&e.path)?;
            let existing = if out.known_missing(&target) {
                None
            } else {
                std::fs::symlink_metadata(&target).ok()
            };
            let mut resumed = None;
            decisions.push(match (e.kind, existing) {
                // As hurtle leaves a file it received: rsync's quick check.
                (EntryKind::File, Some(m))
                    if !checksum
                        && m.is_file()
                        && m.len() == e.size
                        && fs::mtime_ns(&m) == e.mtime_ns =>
                {
                    Decision::Unchanged
                }
                (EntryKind::File, Some(m)) if m.is_file() && m.len() == e.size => Decision::Have {
                    hash: fs::hash_open(&out.open_existing(&e.path)?).map_err(|err| {
                        SessionError::io(format!("read {}", target.display()), err)
                    })?,
                    replace_ok: self.opts.overwrite,
                },
                (EntryKind::File, Some(_)) if !self.opts.overwrite => Decision::Refuse(
                    "it exists on the receiver (receive with --overwrite to replace it)".into(),
                ),
                (EntryKind::File, _) if e.size > 0 => {
                    match Resumed::open(out, e, block_size, self.opts.overwrite)? {
                        Some(r) => {
                            let d = Decision::Resume {
                                blocks: r.block_ranges(),
                            };
                            resumed = Some(r);
                            d
                        }
                        None => Decision::SendAll,
                    }
                }
                _ => Decision::SendAll,
            });
            if e.kind == EntryKind::File {
                resumes.push(resumed);
            }
        }
        Ok((decisions, resumes))
    }

    /// The part files of the files to be sent (`None` for the others), created or resumed and
    /// preallocated, and the held blocks' values of the resumed ones. Refuses with
    /// [`fs::StoreError::NoSpace`] a transfer that cannot fit, removing the part files it
    /// created (a resumed one is kept for a later try).
    fn prepare_parts(
        &self,
        out: &fs::OutRoot,
        files: &[&Entry],
        file_decisions: &[&Decision],
        mut resumes: Vec<Option<Resumed>>,
        block_size: u64,
    ) -> Result<PreparedParts, SessionError> {
        let root = out.path();
        let mut held_values: Vec<Vec<(u64, BlockValue)>> = vec![Vec::new(); files.len()];
        let mut parts = Vec::with_capacity(files.len());
        let mut needed = 0;
        let fresh: Vec<&Entry> = files
            .iter()
            .zip(file_decisions)
            .filter(|(_, d)| matches!(d, Decision::SendAll))
            .map(|(e, _)| *e)
            .collect();
        let mut fresh = self.new_parts(out, &fresh, block_size)?.into_iter();
        for (f, (e, d)) in files.iter().zip(file_decisions).enumerate() {
            // Space is needed only for the blocks neither held nor in holes.
            let not_needed = |held: &[(u64, u64)]| {
                fs::bytes_in_blocks(&union_ranges(held, &e.holes), block_size, e.size)
            };
            parts.push(match (d, resumes[f].take()) {
                (Decision::SendAll, _) => {
                    needed += e.size - not_needed(&[]);
                    fresh.next()
                }
                (Decision::Resume { .. }, Some(r)) => {
                    needed += e.size - not_needed(&r.block_ranges());
                    held_values[f] = r.values;
                    Some(r.part)
                }
                _ => None,
            });
        }
        if fs::free_space(root).is_some_and(|free| free < needed) {
            for (p, d) in parts.into_iter().zip(file_decisions) {
                // Best effort: the error below is what matters; a new file holds nothing. A
                // resumed one is kept for a later try.
                if let (Some(p), Decision::SendAll) = (p, d) {
                    let _ = p.discard();
                }
            }
            return Err(fs::StoreError::NoSpace {
                path: root.to_path_buf(),
                needed,
            }
            .into());
        }
        for (p, e) in parts.iter().zip(files) {
            if let Some(p) = p {
                p.preallocate(&e.holes, block_size)?;
            }
        }
        Ok((parts, held_values))
    }

    /// New part files for `entries`, in order, created on up to four threads when there are many:
    /// for a transfer of many small files, creating them is most of what the receiver does
    /// before data moves.
    fn new_parts(
        &self,
        out: &fs::OutRoot,
        entries: &[&Entry],
        block_size: u64,
    ) -> Result<Vec<PartFile>, SessionError> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = cores.min(4).min(entries.len() / PARTS_PER_THREAD).max(1);
        let create = |chunk: &[&Entry]| -> Result<Vec<PartFile>, SessionError> {
            chunk
                .iter()
                .map(|e| self.new_part(out, e, block_size))
                .collect()
        };
        // Consecutive entries mostly share a directory: each thread takes a run of them.
        in_runs(entries, threads, create)
    }

    /// A new part file for `e`. Files of more than one block keep a journal of their verified
    /// blocks, so that an interrupted transfer can resume; a one-block file is sent again.
    fn new_part(
        &self,
        out: &fs::OutRoot,
        e: &Entry,
        block_size: u64,
    ) -> Result<PartFile, SessionError> {
        let mut p = PartFile::create_in(out, &e.path, e.size, self.opts.overwrite)?;
        if e.size > block_size {
            p.keep_journal(block_size)?;
        }
        Ok(p)
    }
}

/// Accepts the sender's `channels` TCP data connections, each opened by its greeting. Connections
/// from another host, with another session id or a channel out of range are closed.
fn accept_data_connections(
    listener: &TcpListener,
    session: u64,
    channels: u16,
    peer_ip: IpAddr,
    data: &DataKeys,
) -> Result<Vec<LinkIn>, SessionError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    listener
        .set_nonblocking(true)
        .map_err(|e| SessionError::io("TCP data listener", e))?;
    let mut slots: Vec<Option<TcpStream>> = (0..channels).map(|_| None).collect();
    while slots.iter().any(Option::is_none) {
        if Instant::now() > deadline {
            return Err(SessionError::Protocol(
                "the sender did not open its TCP data connections within 10 s".into(),
            ));
        }
        match listener.accept() {
            Ok((mut s, from)) => {
                if from.ip().to_canonical() != peer_ip.to_canonical() {
                    continue;
                }
                let _ = s.set_nonblocking(false);
                match read_greeting(&mut s, &data.key, Duration::from_secs(5)) {
                    Some((sess, ch))
                        if sess == session
                            && usize::from(ch) < slots.len()
                            && slots[usize::from(ch)].is_none() =>
                    {
                        let _ = s.set_nodelay(true);
                        slots[usize::from(ch)] = Some(s);
                    }
                    _ => {}
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(e) => return Err(SessionError::io("accept TCP data connection", e)),
        }
    }
    slots
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(ch, s)| {
            TcpFrames::new(s)
                .map(|frames| LinkIn::tcp(frames, data.opener(ch as u16)))
                .map_err(|e| SessionError::io("TCP data connection", e))
        })
        .collect()
}

/// The session's data key, and whether data frames are sealed with it.
struct DataKeys {
    key: DataKey,
    encrypt: bool,
}

impl DataKeys {
    /// The opener of `channel`'s frames (`None`: they come in the clear).
    fn opener(&self, channel: u16) -> Option<PacketOpen> {
        self.encrypt.then(|| self.key.opener(channel))
    }
}

/// Fewest new part files worth a thread of their own.
const PARTS_PER_THREAD: usize = 256;

/// The part files of a transfer's files (`None`: not sent), and the values of the blocks each
/// resumed one holds.
type PreparedParts = (Vec<Option<PartFile>>, Vec<Vec<(u64, BlockValue)>>);

/// A part file left by an interrupted transfer, with the blocks its journal lists and their
/// values as hashed again from the part file now.
struct Resumed {
    part: PartFile,
    /// `(block number within the file, value)`, ascending.
    values: Vec<(u64, BlockValue)>,
}

impl Resumed {
    /// The part file of `e` and what it holds, if there is one to resume from (see
    /// [`PartFile::resume`]) and its journal lists any block.
    fn open(
        out: &fs::OutRoot,
        e: &Entry,
        block_size: u64,
        overwrite: bool,
    ) -> Result<Option<Resumed>, SessionError> {
        let Some((part, blocks)) =
            PartFile::resume_in(out, &e.path, e.size, block_size, overwrite)?
        else {
            return Ok(None);
        };
        if blocks.is_empty() {
            return Ok(None);
        }
        let values = hash_blocks(&part, e.size, block_size, &blocks, false)?;
        Ok(Some(Resumed { part, values }))
    }

    /// The held blocks as ascending half-open ranges, as a resume offer carries them.
    fn block_ranges(&self) -> Vec<(u64, u64)> {
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for &(b, _) in &self.values {
            match ranges.last_mut() {
                Some(last) if last.1 == b => last.1 = b + 1,
                _ => ranges.push((b, b + 1)),
            }
        }
        ranges
    }
}

/// The values of blocks `blocks` (numbers within the file, ascending) of `part`, a file of
/// `size` bytes, as read from it now, or with `zeros` (they read as zeros by construction)
/// hashed as zeros without reading: hashed on every core, since a nearly finished big file,
/// or a big sparse one, holds a lot.
fn hash_blocks(
    part: &PartFile,
    size: u64,
    block_size: u64,
    blocks: &[u64],
    zeros: bool,
) -> Result<Vec<(u64, BlockValue)>, StoreError> {
    let count = size.div_ceil(block_size);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(blocks.len())
        .max(1);
    let hash_some = |mine: &[u64]| -> Result<Vec<(u64, BlockValue)>, StoreError> {
        // Reading a hole would make the kernel fill page-cache pages with zeros.
        let mut buf = (!zeros).then(|| crate::iobuf::IoBuf::new(block_size as usize));
        mine.iter()
            .map(|&index| {
                let start = index * block_size;
                let len = (size - start).min(block_size) as usize;
                let data = match &mut buf {
                    None => crate::iobuf::zeros(len),
                    Some(buf) => {
                        let data = &mut buf.aligned()[..len];
                        part.read_at(start, data)?;
                        &*data
                    }
                };
                Ok((index, block_value(data, index, block_size, count)))
            })
            .collect()
    };
    in_runs(blocks, threads, hash_some)
}

/// Refuses, before anything is created, a manifest of more blocks than a transfer may have
/// (huge sparse files take no disk space, so the space check does not bound them), and holes
/// that are not ascending, disjoint block ranges inside their file, or in a directory.
fn check_blocks(entries: &[Entry], block_size: u64) -> Result<(), SessionError> {
    let sizes = entries.iter().map(|e| match e.kind {
        EntryKind::File => e.size,
        EntryKind::Dir => 0,
    });
    let blocks = count_blocks(sizes, block_size);
    if blocks > MAX_BLOCKS {
        return Err(hurtle_proto::layout::LayoutError::TooManyBlocks { blocks, block_size }.into());
    }
    for e in entries.iter().filter(|e| !e.holes.is_empty()) {
        let count = match e.kind {
            EntryKind::File => e.size.div_ceil(block_size),
            EntryKind::Dir => 0,
        };
        if let Err((start, end)) = check_block_ranges(&e.holes, count) {
            return Err(SessionError::Protocol(format!(
                "the manifest gives {} holes in blocks {start}..{end}, outside it or out of order",
                e.path
            )));
        }
    }
    Ok(())
}

/// True when block `b` lies in one of `ranges` (ascending, disjoint half-open ranges).
fn in_ranges(ranges: &[(u64, u64)], b: u64) -> bool {
    let i = ranges.partition_point(|&(_, end)| end <= b);
    ranges.get(i).is_some_and(|&(start, _)| start <= b)
}

/// Blocks of holes hashed at a time, between looks at whether the session stopped.
const HOLE_BATCH: usize = 64;

/// The blocks of a sparse file's holes, for [`hash_holes`].
struct Holes {
    /// File id.
    file: u32,
    /// Block numbers within the file.
    blocks: Vec<u64>,
    /// The part file reads as zeros there by construction (new, or the holes punched again);
    /// otherwise they are read back.
    zeros: bool,
}

/// Starts a thread that hashes the blocks of sparse files' holes in their part files, where
/// nothing is written, and hands each value to the session loop as a channel thread hands
/// those of received blocks; the sender's values for them come as for any other block. A
/// block read back that holds something else than zeros has a value that differs from the
/// sender's, and is fetched. On a thread of its own because a big sparse file holds a lot:
/// the channels run meanwhile, and the data blocks need not wait.
fn hash_holes(
    shared: Arc<Shared>,
    events: Sender<ChanEvent>,
    holes: Vec<Holes>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("holes".into())
        .spawn(move || {
            let layout = &shared.layout;
            for Holes {
                file,
                blocks,
                zeros,
            } in holes
            {
                let Some(part) = &shared.files[file as usize] else {
                    continue;
                };
                let first = layout.blocks_of(file).start;
                for batch in blocks.chunks(HOLE_BATCH) {
                    if shared.stop.load(Ordering::Relaxed) {
                        return;
                    }
                    match hash_blocks(part, part.size(), layout.block_size(), batch, zeros) {
                        Ok(values) => {
                            for (index, value) in values {
                                let block = first + index;
                                let _ = events.send(ChanEvent::Block { block, value });
                            }
                        }
                        Err(e) => {
                            let _ = events.send(ChanEvent::Failed(e.into()));
                            return;
                        }
                    }
                }
            }
        })
}

/// What the receiver's session loop listens to and commands.
struct Wires<'a> {
    /// Control messages from the sender.
    rx: &'a ChanRx<Result<Control, ControlError>>,
    /// Completed blocks and failures from the channel threads.
    events: &'a ChanRx<ChanEvent>,
    /// Commands to each channel, by channel.
    cmds: &'a [Sender<ChanCmd>],
    /// The committer thread, which puts verified files in place.
    commits: Commits,
}

/// The receiver's data phase: verifies blocks as their two values meet (hands each file whose
/// last block is verified to the committer thread, journals the others), sends reports, and
/// ends on `Done` once the committer has put every file in place. `held` are the blocks
/// resumed from part files, with the values hashed from them.
fn session_loop(
    shared: &Shared,
    files: &[&Entry],
    dirs: &[&Entry],
    root: &Path,
    wires: Wires<'_>,
    kept: &[Option<[u8; 32]>],
    held: &[(u64, BlockValue)],
) -> Result<Vec<[u8; 32]>, SessionError> {
    let Wires {
        rx,
        events,
        cmds,
        mut commits,
    } = wires;
    let mut journal = JournalQueue::new(shared);
    let layout = &shared.layout;
    let mut verifier = Verifier::new(layout);
    // A verdict about `block`.
    let handle = |block: u64,
                  v: Verdict,
                  journal: &mut JournalQueue,
                  commits: &mut Commits|
     -> Result<(), SessionError> {
        match v {
            Verdict::Pending => Ok(()),
            Verdict::Verified => {
                // Written and checked: a resume can start from it.
                if let Some((file, index)) = layout.file_of_block(block) {
                    journal.push(file, index);
                }
                Ok(())
            }
            Verdict::FileComplete { file, hash } => {
                commits.give(file, hash);
                Ok(())
            }
            Verdict::Mismatch { block } => {
                shared
                    .counters
                    .rejected_blocks
                    .fetch_add(1, Ordering::Relaxed);
                if let Some((ch, _)) = layout.block_stripe_range(block) {
                    let _ = cmds[usize::from(ch)].send(ChanCmd::Reject(block));
                }
                Ok(())
            }
            Verdict::GiveUp { block } => {
                let path = layout
                    .file_of_block(block)
                    .map(|(f, _)| files[f as usize].path.clone())
                    .unwrap_or_default();
                Err(SessionError::Verification {
                    path,
                    block,
                    times: hurtle_proto::verify::MAX_BLOCK_FAILURES,
                })
            }
        }
    };
    // The held blocks' own values wait for the sender's.
    for &(block, value) in held {
        handle(
            block,
            verifier.on_received(block, value),
            &mut journal,
            &mut commits,
        )?;
    }
    let tick = crossbeam_channel::tick(TICK);
    let mut report_every = Duration::from_millis(50);
    let mut reports = ReportBuilder::new(
        Instant::now(),
        shared.counters.totals(),
        shared.socket_drops(),
    );
    let mut lateness = Lateness::new(reports.interval_start());
    loop {
        select! {
            recv(rx) -> msg => {
                let msg = match msg.map_err(|_| ControlError::Closed)? {
                    Ok(msg) => msg,
                    // The sender ends as soon as every file is confirmed, and its `Done` can
                    // be lost to a reset of the connection (a report of ours reaching its
                    // closed socket): with every file in place, this is the end it said.
                    Err(ControlError::Closed) if commits.hashes.iter().all(Option::is_some) => Control::Done,
                    Err(ControlError::Closed) => return Err(SessionError::PeerGone { peer: Side::Sender }),
                    Err(other) => return Err(other.into()),
                };
                match msg {
                    Control::BlockHashes { blocks } => {
                        for (block, value) in blocks {
                            handle(block, verifier.on_expected(block, value), &mut journal, &mut commits)?;
                        }
                    }
                    Control::Start { report_interval_us, .. } => {
                        if !shared.started.swap(true, Ordering::Relaxed) {
                            shared.progress.set_phase(Phase::Moving);
                            for (f, e) in files.iter().enumerate() {
                                if kept[f].is_none() && e.size == 0 {
                                    commits.give(f as u32, *blake3::hash(b"").as_bytes());
                                }
                            }
                        }
                        report_every = Duration::from_micros(report_interval_us).clamp(Duration::from_millis(5), Duration::from_secs(1));
                    }
                    Control::KeepAlive => {}
                    // Probing runs beside the data: the sender may find UDP blocked after it
                    // started, as long as nothing got through.
                    Control::Fallback if shared.progress.sent.load(Ordering::Relaxed) == 0 => {
                        return Err(SessionError::FellBack)
                    }
                    Control::Done => {
                        commits.finish()?;
                        if let Some(f) = commits.hashes.iter().position(|h| h.is_none()) {
                            return Err(SessionError::Protocol(format!("the sender finished but {} is incomplete", files[f].path)));
                        }
                        for d in dirs.iter().rev() {
                            fs::set_dir_mode(root, &d.path, d.mode)?;
                            fs::set_dir_times(root, &d.path, d.mtime_ns)?;
                        }
                        return Ok(commits.hashes.iter().map(|h| h.unwrap_or_default()).collect());
                    }
                    other => return Err(SessionError::unexpected(Side::Sender, other, "a data-phase message")),
                }
            }
            recv(events) -> ev => match ev {
                Ok(ChanEvent::Block { block, value }) => {
                    handle(block, verifier.on_received(block, value), &mut journal, &mut commits)?;
                }
                Ok(ChanEvent::Failed(e)) => return Err(e),
                Err(_) => return Err(SessionError::Protocol("all channel threads ended early".into())),
            },
            recv(commits.committed) -> batch => {
                match batch {
                    Ok(batch) => commits.note(batch)?,
                    // It reports an error before it stops; it stops early only by panicking.
                    Err(_) => return Err(SessionError::io(
                        "commit files",
                        std::io::Error::other("the commit thread stopped"),
                    )),
                }
            }
            recv(tick) -> _ => {
                if shared.progress.interrupted() {
                    return Err(SessionError::Interrupted { side: Side::Receiver });
                }
                let now = Instant::now();
                journal.tick(now);
                let interval = now.saturating_duration_since(reports.interval_start());
                let late = lateness.tick(now);
                if interval >= report_every.max(late * 4).min(MAX_REPORT_INTERVAL) {
                    let facts = ReportFacts {
                        totals: shared.counters.totals(),
                        received: shared.progress.sent.load(Ordering::Relaxed),
                        socket_drops: shared.socket_drops(),
                        queue_fill_permille: shared.queue_fill.swap(0, Ordering::Relaxed),
                        // A block waiting for the writer is queued at the receiver: the longest
                        // wait counts like a queue on the path, so a stalled disk slows the
                        // sender as much as the wait says, not by a fixed step.
                        held_us: shared.write_wait_us.swap(0, Ordering::Relaxed),
                        lateness: late,
                        disk_fill_permille: shared.write_fill.swap(0, Ordering::Relaxed),
                    };
                    let _ = shared.to_wire.send(reports.build(now, &facts));
                }
            }
        }
    }
}

/// Files verified and committed so far.
type Committed = Vec<(u32, [u8; 32])>;

/// The session loop's side of the committer thread.
struct Commits {
    to_commit: Sender<(u32, [u8; 32])>,
    committed: crossbeam_channel::Receiver<Result<Committed, SessionError>>,
    /// Files given to the committer and not reported back yet.
    outstanding: usize,
    /// Each file's hash once it is in place (or the receiver's own copy is kept).
    hashes: Vec<Option<[u8; 32]>>,
}

impl Commits {
    /// Starts the committer thread in `scope`. `kept`: per file, the hash of the receiver's own
    /// copy when it is kept (nothing to commit).
    fn start<'scope, 'env>(
        scope: &'scope std::thread::Scope<'scope, 'env>,
        shared: &'env Shared,
        files: &'env [&'env Entry],
        kept: &[Option<[u8; 32]>],
    ) -> Result<Commits, SessionError> {
        let (to_commit, queue) = unbounded();
        let (report, committed) = unbounded();
        std::thread::Builder::new()
            .name("commit".into())
            .spawn_scoped(scope, move || commit_loop(shared, files, queue, report))
            .map_err(|e| SessionError::io("commit thread", e))?;
        Ok(Commits {
            to_commit,
            committed,
            outstanding: 0,
            // Nothing to commit for a kept copy; empty files are given when `Start` arrives.
            hashes: kept.to_vec(),
        })
    }

    /// Gives a verified file to the committer.
    fn give(&mut self, file: u32, hash: [u8; 32]) {
        self.outstanding += 1;
        // The committer outlives the session loop, so the queue cannot be closed here.
        let _ = self.to_commit.send((file, hash));
    }

    /// Records a batch the committer reports in place; its error ends the session.
    fn note(&mut self, batch: Result<Committed, SessionError>) -> Result<(), SessionError> {
        let batch = batch?;
        self.outstanding = self.outstanding.saturating_sub(batch.len());
        for (file, hash) in batch {
            self.hashes[file as usize] = Some(hash);
        }
        Ok(())
    }

    /// Waits until the committer has put in place every file it was given.
    fn finish(&mut self) -> Result<(), SessionError> {
        while self.outstanding > 0 {
            match self.committed.recv() {
                Ok(batch) => self.note(batch)?,
                Err(_) => break,
            }
        }
        Ok(())
    }
}

/// Verified blocks waiting to be noted in their files' journals: written in batches, one open
/// and write per file for every [`JournalQueue::BATCH`] blocks or [`JournalQueue::EVERY`],
/// and when the session ends, however it ends (a journal line per block cost three system
/// calls per MiB on the session's thread).
struct JournalQueue<'a> {
    shared: &'a Shared,
    /// `(file, block within the file)`, in verification order.
    pending: Vec<(u32, u64)>,
    flushed: Instant,
}

impl<'a> JournalQueue<'a> {
    const BATCH: usize = 64;
    const EVERY: Duration = Duration::from_millis(100);

    fn new(shared: &'a Shared) -> Self {
        JournalQueue {
            shared,
            pending: Vec::new(),
            flushed: Instant::now(),
        }
    }

    fn push(&mut self, file: u32, index: u64) {
        self.pending.push((file, index));
        if self.pending.len() >= Self::BATCH {
            self.flush();
        }
    }

    fn tick(&mut self, now: Instant) {
        if !self.pending.is_empty() && now.saturating_duration_since(self.flushed) >= Self::EVERY {
            self.flush();
        }
    }

    fn flush(&mut self) {
        self.pending.sort_unstable();
        for run in self.pending.chunk_by(|a, b| a.0 == b.0) {
            if let Some(Some(part)) = self.shared.files.get(run[0].0 as usize) {
                let indices: Vec<u64> = run.iter().map(|&(_, i)| i).collect();
                part.record_blocks(&indices);
            }
        }
        self.pending.clear();
        self.flushed = Instant::now();
    }
}

impl Drop for JournalQueue<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

/// How often a channel thread samples its socket's receive queue.
const QUEUE_SAMPLE_EVERY: Duration = Duration::from_millis(1);

/// The report loop's tick.
const TICK: Duration = Duration::from_millis(5);

/// Longest report interval, however starved the receiver.
const MAX_REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// Most verified files committed together.
const COMMIT_BATCH: usize = 256;

/// How long the committer gathers verified files before it commits them (unless it has
/// [`COMMIT_BATCH`] sooner): one directory sync serves them all.
const COMMIT_GATHER: Duration = Duration::from_millis(5);

/// The committer thread: takes verified files from `queue`, gathers them for up to
/// [`COMMIT_GATHER`] or [`COMMIT_BATCH`] files, commits them together (`commit_files`) and
/// reports each batch on `out`, until the queue is closed and empty or a commit fails (then the
/// error is the last report). On a thread of its own so that syncing many files does not hold
/// up the session loop's reports and verification.
fn commit_loop(
    shared: &Shared,
    files: &[&Entry],
    queue: crossbeam_channel::Receiver<(u32, [u8; 32])>,
    out: Sender<Result<Committed, SessionError>>,
) {
    let mut pending = Vec::new();
    while let Ok(first) = queue.recv() {
        pending.push(first);
        let until = Instant::now() + COMMIT_GATHER;
        while pending.len() < COMMIT_BATCH {
            match queue.recv_deadline(until) {
                Ok(next) => pending.push(next),
                Err(_) => break,
            }
        }
        let mut done = Vec::with_capacity(pending.len());
        let result = commit_files(shared, files, &mut pending, &mut done);
        let _ = out.send(Ok(done));
        if let Err(e) = result {
            let _ = out.send(Err(e));
            return;
        }
    }
}

/// Commits the verified files in `pending` (emptied) together: each is sealed (attributes
/// set, synced), then each renamed into place, then each directory synced once, and only then
/// is each reported to the sender (`FileDone`) and added to `done`. One at a time, each file
/// would cost a sync of itself and another of its directory; batched, a directory is synced
/// once for many files (BENCHMARKS.md, section 7, has today's figure for many small files). A
/// failure stops the session; the files of the batch renamed before it are still synced and
/// reported.
fn commit_files(
    shared: &Shared,
    files: &[&Entry],
    pending: &mut Vec<(u32, [u8; 32])>,
    done: &mut Vec<(u32, [u8; 32])>,
) -> Result<(), SessionError> {
    if pending.is_empty() {
        return Ok(());
    }
    let part = |f: u32| shared.files[f as usize].as_ref();
    let mut failed = None;
    let mut sealed = 0;
    for &(f, _) in pending.iter() {
        let e = files[f as usize];
        if let Some(Err(err)) = part(f).map(|p| p.seal(e.mode, e.mtime_ns)) {
            failed = Some(err);
            break;
        }
        sealed += 1;
    }
    let mut renamed = 0;
    let mut dirs: Vec<&Path> = Vec::new();
    for &(f, _) in &pending[..sealed] {
        if let Some(p) = part(f) {
            if let Err(err) = p.rename_into_place() {
                failed = Some(err);
                break;
            }
            if !dirs.contains(&p.dir()) {
                dirs.push(p.dir());
            }
        }
        renamed += 1;
    }
    for dir in dirs {
        fs::sync_dir(dir)?;
    }
    for (file, hash) in pending.drain(..).take(renamed) {
        done.push((file, hash));
        shared.progress.files_done.fetch_add(1, Ordering::Relaxed);
        let _ = shared.to_wire.send(Control::FileDone { file, hash });
    }
    match failed {
        Some(err) => Err(err.into()),
        None => Ok(()),
    }
}

/// How late the report loop's ticks come, smoothed. A receiver starved of CPU (a cgroup quota,
/// an overloaded machine) runs in lumps, tens or hundreds of milliseconds apart; a report
/// covering fewer than a few lumps measures the scheduler, not the path (the delivered rate of
/// one interval swings from zero to several times the real one), so reports then cover at
/// least four times the recent lateness, whatever interval the sender asked for.
struct Lateness {
    last: Instant,
    smoothed: Duration,
}

impl Lateness {
    fn new(now: Instant) -> Lateness {
        Lateness {
            last: now,
            smoothed: Duration::ZERO,
        }
    }

    /// Takes a tick at `now`; returns the smoothed lateness: the latest tick's, or the earlier
    /// figure decayed by 2% per tick (gone in a second or so of punctual ticks).
    fn tick(&mut self, now: Instant) -> Duration {
        let late = now
            .saturating_duration_since(std::mem::replace(&mut self.last, now))
            .saturating_sub(TICK);
        self.smoothed = late.max(self.smoothed.mul_f64(0.98));
        self.smoothed
    }
}

struct ChannelWorker {
    ch: u16,
    rec: ChannelReceiver,
    shared: Arc<Shared>,
    cmds: ChanRx<ChanCmd>,
    events: Sender<ChanEvent>,
    /// Incomplete blocks being gathered in memory.
    buffers: HashMap<u64, Gathering>,
    /// Their arrival order, oldest first (for spilling).
    order: VecDeque<u64>,
    pool: Vec<Vec<u8>>,
    /// Where complete blocks go to be written, if not written on this thread.
    writer: Option<Writer>,
    max_buffers: usize,
    /// Blocks whose bytes go straight to the file; value: the block's file start.
    spilled: HashMap<u64, u64>,
    /// Blocks fetched again after a failed check: their first copy was written.
    refetched: HashSet<u64>,
    log: NetLog,
    probes_acked: Vec<u16>,
    /// The channel's checks of each datagram, and their counts.
    admission: Admission,
    /// The admission totals already added to the shared counters (once per batch).
    added: Tally,
    /// When the socket's receive queue (or, without `SO_MEMINFO`, its drop counter) was last read.
    queue_sampled: Instant,
    /// The file of the last new bytes in the current batch, for the progress display.
    moved_file: Option<u32>,
}

/// `work` over `items` split into `threads` runs of consecutive items, one thread each (none
/// spawned for one), with the results joined in order. The first error is returned; a worker's
/// panic is passed on.
fn in_runs<T: Sync, R: Send, E: Send>(
    items: &[T],
    threads: usize,
    work: impl Fn(&[T]) -> Result<Vec<R>, E> + Sync,
) -> Result<Vec<R>, E> {
    if threads <= 1 || items.len() <= 1 {
        return work(items);
    }
    let work = &work;
    std::thread::scope(|scope| {
        let workers: Vec<_> = items
            .chunks(items.len().div_ceil(threads))
            .map(|run| scope.spawn(move || work(run)))
            .collect();
        let mut all = Vec::with_capacity(items.len());
        for w in workers {
            match w.join() {
                Ok(done) => all.extend(done?),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        Ok(all)
    })
}

/// Writes a complete block with one positional write and starts its writeback to the disk, so
/// that the file's final fsync has little left to do. A block of zeros is not written where
/// the file reads as zeros by construction: a part file created by this transfer (its length
/// set, its space at most preallocated), at a block never written before (`first`: not a
/// block fetched again after a failed check). The file then holds the same bytes without the
/// write, and on tmpfs without the memory. Nothing here asks the filesystem where its holes
/// are: a block is left unwritten only where nothing was ever written.
fn write_block(
    part: &PartFile,
    file_start: u64,
    buf: &[u8],
    first: bool,
) -> Result<(), StoreError> {
    if first && part.is_new() && all_zeros(buf) {
        return Ok(());
    }
    part.write_at(file_start, buf)?;
    part.start_writeback(file_start, buf.len() as u64);
    Ok(())
}

/// True when every byte of `buf` is zero; stops at the first 64 bytes that are not, so data
/// costs next to nothing to look at.
fn all_zeros(buf: &[u8]) -> bool {
    let mut chunks = buf.chunks_exact(64);
    let whole = chunks.all(|c| c.iter().fold(0u8, |acc, &b| acc | b) == 0);
    whole && chunks.remainder().iter().all(|&b| b == 0)
}

/// A complete block on its way to the writer thread.
struct Written {
    /// When it was handed to the writer.
    queued: Instant,
    file: u32,
    block: u64,
    file_start: u64,
    value: BlockValue,
    buf: Vec<u8>,
    /// Never written before (see [`write_block`]).
    first: bool,
}

/// A channel's end of the writer thread: one thread per session writes complete blocks to
/// their files in the order they come (so a block asked for again after a failed check is
/// written after its first copy), starts their writeback, and only then hands each block's
/// value to the session loop. Its queue is bounded; how full it is counts as receiver backlog
/// in the reports, so the sender slows down before the queue fills and a channel thread has to
/// wait.
#[derive(Clone)]
struct Writer {
    tx: Sender<Written>,
    /// Buffers the writer is done with.
    spare: ChanRx<Vec<u8>>,
}

impl Writer {
    /// Starts the writer thread, with a queue of `depth` blocks; returns the channels' end
    /// of it (to clone for each) and the thread, which ends once every end is dropped.
    fn start(
        shared: Arc<Shared>,
        events: Sender<ChanEvent>,
        depth: usize,
    ) -> std::io::Result<(Writer, std::thread::JoinHandle<()>)> {
        let (tx, rx) = crossbeam_channel::bounded::<Written>(depth);
        let (spare_tx, spare_rx) = unbounded();
        let handle = std::thread::Builder::new()
            .name("writer".into())
            .spawn(move || {
                for w in rx {
                    let waited = w.queued.elapsed().as_micros() as u64;
                    shared.write_wait_us.fetch_max(waited, Ordering::Relaxed);
                    let written = match &shared.files[w.file as usize] {
                        Some(part) => write_block(part, w.file_start, &w.buf, w.first),
                        None => Ok(()),
                    };
                    if let Err(e) = written {
                        let _ = events.send(ChanEvent::Failed(e.into()));
                        shared.stop.store(true, Ordering::Relaxed);
                        return;
                    }
                    let _ = events.send(ChanEvent::Block {
                        block: w.block,
                        value: w.value,
                    });
                    let _ = spare_tx.send(w.buf);
                }
            })?;
        Ok((
            Writer {
                tx,
                spare: spare_rx,
            },
            handle,
        ))
    }

    /// Queues `w` for the writer thread, waiting if its queue is full.
    fn hand_over(&self, shared: &Shared, w: Written) -> Result<(), SessionError> {
        let depth = self.tx.capacity().unwrap_or(1).max(1) as u64;
        let queued = self.tx.len() as u64 + 1;
        let fill = queued.min(depth) * 1000 / depth;
        // The writer's queue counts as the receiver's backlog, and apart as its disk's.
        shared.queue_fill.fetch_max(fill, Ordering::Relaxed);
        shared.write_fill.fetch_max(fill, Ordering::Relaxed);
        self.tx
            .send(w)
            .map_err(|_| SessionError::Protocol("the writer thread stopped".into()))
    }
}

/// A block being gathered in memory, hashed front to back while its bytes are still in the
/// CPU's cache: whenever the bytes held from its start reach past the next [`HASH_STEP`]
/// boundary, those steps are hashed. Hashed bytes are never written again (a datagram that
/// overlaps them only fills what lies beyond), so the value is that of the bytes written.
struct Gathering {
    buf: Vec<u8>,
    hasher: BlockHasher,
    /// End of the bytes held without a gap from the block's start (as far as in-order
    /// arrivals show; a gap filled later is hashed when the block completes).
    prefix: usize,
}

/// Bytes hashed at a time while a block is gathered: a multiple of BLAKE3's widest SIMD
/// batch, and small enough to still be in the cache after the copies that brought it.
const HASH_STEP: usize = 64 << 10;

impl Gathering {
    /// Copies `payload` to `at`, except what overlaps bytes already hashed, and hashes what
    /// is now complete from the start in whole steps.
    fn fill(&mut self, at: usize, payload: &[u8]) {
        let hashed = self.hasher.len() as usize;
        let end = at + payload.len();
        if end <= hashed {
            return;
        }
        let from = at.max(hashed);
        self.buf[from..end].copy_from_slice(&payload[from - at..]);
        if at <= self.prefix {
            self.prefix = self.prefix.max(end);
        }
        let upto = self.prefix / HASH_STEP * HASH_STEP;
        if upto > hashed {
            self.hasher.update(&self.buf[hashed..upto]);
        }
    }

    /// The block's value, once every byte is in.
    fn finish(&mut self) -> BlockValue {
        let hashed = self.hasher.len() as usize;
        self.hasher.update(&self.buf[hashed..]);
        self.hasher.finish()
    }
}

/// The longest a channel thread lets datagrams gather after a round of reads that found a few
/// (fewer than a batch holds) while the session is slow ([`SlowFlow`]). On a paced path
/// datagrams arrive one at a time, some tens of microseconds apart, and a thread that woke for
/// each one paid a wake-up, a `poll` and a `recvmmsg` per datagram; a pause of a fraction of a
/// millisecond about halved the receiver's CPU time per GiB, and 1 ms gained a little more. A
/// pause holds back feedback by no more than it lasts (1 ms against round trips of tens of
/// milliseconds), and what gathers meanwhile is kept small against the socket buffer
/// ([`gather_time`]).
const GATHER_MAX: Duration = Duration::from_millis(1);

/// The session rate, bits per second, below which datagrams may be let gather. Above it a
/// thread that has caught up is the bottleneck and must not sleep (on loopback it did, and
/// was slower).
const GATHER_BELOW_BPS: f64 = 2e9;

/// How long to let datagrams gather when the session receives `bps` bits per second into
/// sockets whose smallest receive buffer is `room` bytes: [`GATHER_MAX`], or less if that
/// would fill more than an eighth of the buffer. The kernel counts each datagram's overhead
/// against the buffer too (up to about twice the payload), and the sender sees a buffer past
/// half full as backlog, so an eighth leaves both far off. The session's rate bounds each
/// channel's.
fn gather_time(bps: f64, room: usize) -> Duration {
    let bytes_per_sec = (bps / 8.0).max(1.0);
    Duration::from_secs_f64(room as f64 / 8.0 / bytes_per_sec).min(GATHER_MAX)
}

/// Whether the session receives slowly enough to let datagrams gather: its received bytes over
/// the last 10 ms or more, below [`GATHER_BELOW_BPS`].
struct SlowFlow {
    since: Instant,
    bytes: u64,
    /// The last measured rate, bits per second, if below [`GATHER_BELOW_BPS`].
    slow: Option<f64>,
}

impl SlowFlow {
    fn new(now: Instant, bytes: u64) -> SlowFlow {
        SlowFlow {
            since: now,
            bytes,
            slow: None,
        }
    }

    /// With the session's byte count `bytes` at `now`: updates the estimate, at most every
    /// 10 ms, and returns the rate if it is slow.
    fn update(&mut self, now: Instant, bytes: u64) -> Option<f64> {
        let elapsed = now.saturating_duration_since(self.since);
        if elapsed >= Duration::from_millis(10) {
            let bps = bytes.saturating_sub(self.bytes) as f64 * 8.0 / elapsed.as_secs_f64();
            self.slow = (bps < GATHER_BELOW_BPS).then_some(bps);
            self.since = now;
            self.bytes = bytes;
        }
        self.slow
    }
}

/// Marks the links that `ready` (a `poll` that does not wait; bit `i` for link `i`) finds
/// readable, if any link is not marked already; `ready` is not called otherwise.
fn add_ready(readable: &mut [bool], ready: impl FnOnce() -> Option<u64>) {
    if readable.iter().all(|&r| r) {
        return;
    }
    if let Some(ready) = ready() {
        for (i, read) in readable.iter_mut().enumerate() {
            *read |= ready & (1 << i) != 0;
        }
    }
}

/// How long a channel thread sleeps when none of its channels has anything to read (it
/// wakes at once when one has): the longest its timers (NACKs, reports) can be late.
const IDLE_WAIT: Duration = Duration::from_millis(5);

/// Serves channels on one thread until the session stops: reads whatever each channel's link
/// has waiting, in turn, and sleeps until one of them has more. Returns the channels' kernel
/// drops and NACKs sent, summed. The first error stops the session.
fn serve_channels(mut members: Vec<(ChannelWorker, LinkIn)>, shared: &Shared) -> (u64, u64) {
    // One receive batch for all: each channel's datagrams are handled before the next
    // channel's are read, and one batch's buffers stay in the CPU's cache where several would
    // not.
    let mut batch = RecvBatch::new(32, GRO_BUF_SIZE);
    // Which links to read: those the last wait found readable, and those whose last read
    // filled the whole batch (more is probably waiting). The others only run their timers, so
    // no read comes back empty on a busy thread.
    let mut readable = vec![true; members.len()];
    let received = || shared.counters.bytes.load(Ordering::Relaxed);
    let mut slow = SlowFlow::new(Instant::now(), received());
    // The smallest receive buffer of the thread's UDP links, which gathering must not fill.
    let room = members
        .iter()
        .filter_map(|(_, link)| link.recv_buffer())
        .min()
        .unwrap_or(usize::MAX);
    'run: while !shared.stop.load(Ordering::Relaxed) {
        let mut got = 0;
        for ((worker, link), read) in members.iter_mut().zip(&mut readable) {
            match worker.step(link, (*read).then_some(&mut batch)) {
                Ok(n) => {
                    got += n;
                    *read = n > 0 && batch.is_full();
                }
                Err(e) => {
                    shared.stop.store(true, Ordering::Relaxed);
                    let _ = worker.events.send(ChanEvent::Failed(e));
                    break 'run;
                }
            }
        }
        if readable.iter().any(|&r| r) {
            // Some links had a batch or more waiting and are read again at once. The others
            // are asked whether they have anything too (one `poll` that does not wait), so a
            // quieter link is not left unread while busier ones are drained: it was, for tens
            // of milliseconds at a time with 8 channels on loopback, long enough to fill its
            // socket buffer.
            add_ready(&mut readable, || {
                let fds = members.iter().map(|(_, link)| link.fd());
                crate::net::udp::wait_readable(fds, Duration::ZERO).ok()
            });
            continue;
        }
        let trickle = got > 0 && got < batch.buffers();
        if let Some(bps) = trickle
            .then(|| slow.update(Instant::now(), received()))
            .flatten()
        {
            // Datagrams are trickling in: let more gather, then read every link.
            std::thread::sleep(gather_time(bps, room));
            readable.fill(true);
            continue;
        }
        // Links without anything to wait on (a closed TCP connection) are skipped; with none
        // left this sleeps out the wait.
        let fds = members.iter().map(|(_, link)| link.fd());
        match crate::net::udp::wait_readable(fds, IDLE_WAIT) {
            Ok(ready) => {
                for (i, read) in readable.iter_mut().enumerate() {
                    *read = ready & (1 << i) != 0;
                }
            }
            Err(e) => {
                shared.stop.store(true, Ordering::Relaxed);
                if let Some((worker, _)) = members.first() {
                    let _ = worker.events.send(ChanEvent::Failed(e.into()));
                }
                break;
            }
        }
    }
    members
        .iter()
        .map(|(worker, link)| worker.finish(link))
        .fold((0, 0), |(d, n), (dw, nw)| (d + dw, n + nw))
}

impl ChannelWorker {
    /// The channel's kernel drops and NACKs sent, when the session ends; adds its duplicate
    /// bytes to the session's counters.
    fn finish(&self, link: &LinkIn) -> (u64, u64) {
        self.shared
            .counters
            .duplicate
            .fetch_add(self.rec.stats().duplicate_bytes, Ordering::Relaxed);
        self.shared
            .counters
            .unauthentic
            .fetch_add(link.dropped(), Ordering::Relaxed);
        (link.kernel_drops().unwrap_or(0), self.rec.stats().nacks)
    }

    /// With a batch, reads what the link has waiting (without waiting for more); then runs
    /// the channel's timers: NACKs, completion. Returns how many datagrams came.
    fn step(
        &mut self,
        link: &mut LinkIn,
        batch: Option<&mut RecvBatch>,
    ) -> Result<usize, SessionError> {
        let mut new_bytes = 0;
        let mut batch_time = None;
        let n = match batch {
            Some(batch) => link.recv(batch, |src, datagram| {
                let now = *batch_time.get_or_insert_with(Instant::now);
                new_bytes += self.on_datagram(now, src, datagram)?;
                Ok(())
            })?,
            None => 0,
        };
        let now = Instant::now();
        self.sample_queue(now, link);
        if n > 0 {
            // Repairs wait behind the queue the batch's datagrams met.
            let queued = self.admission.take_peak_queue_delay();
            self.rec.note_queue_delay(now, queued);
            let totals = self.admission.tally();
            self.shared.counters.add(&totals.since(&self.added));
            self.added = totals;
            self.shared
                .progress
                .sent
                .fetch_add(new_bytes, Ordering::Relaxed);
            if let Some(file) = self.moved_file.take() {
                self.shared.progress.note_moving(self.ch, file);
            }
            self.log.line(|| {
                format!(
                    "recv datagrams={n} new_bytes={new_bytes} held={}",
                    self.rec.received_bytes()
                )
            });
        }
        while let Ok(ChanCmd::Reject(block)) = self.cmds.try_recv() {
            if let Some((_, range)) = self.shared.layout.block_stripe_range(block) {
                self.log
                    .line(|| format!("block {block} failed verification; fetching again"));
                self.spilled.remove(&block);
                self.refetched.insert(block);
                self.rec.reject(range);
            }
        }
        if let Some(ranges) = self.rec.poll_nack(now) {
            self.shared.counters.nacks.fetch_add(1, Ordering::Relaxed);
            self.log.line(|| {
                format!(
                    "loss nack ranges={} bytes={} first={:?}",
                    ranges.len(),
                    ranges.iter().map(|r| r.1 - r.0).sum::<u64>(),
                    ranges.first()
                )
            });
            let _ = self.shared.to_wire.send(Control::Nack {
                channel: self.ch,
                ranges,
            });
        }
        if self.shared.started.load(Ordering::Relaxed) && self.rec.poll_done() {
            self.log.line(|| "channel complete".into());
            let _ = self
                .shared
                .to_wire
                .send(Control::ChannelDone { channel: self.ch });
        }
        Ok(n)
    }

    /// Samples the socket's receive queue (every millisecond at most: one `getsockopt`) for
    /// the fill the next report carries, and its drop counter. Where the kernel cannot say how
    /// full the queue is, reads only the drop counter, every 100 ms (a file read).
    fn sample_queue(&mut self, now: Instant, link: &LinkIn) {
        let since = now.saturating_duration_since(self.queue_sampled);
        if since < QUEUE_SAMPLE_EVERY {
            return;
        }
        let drops = match link.receive_queue() {
            Some(q) => {
                self.shared
                    .queue_fill
                    .fetch_max(q.fill_permille(), Ordering::Relaxed);
                Some(q.drops)
            }
            None if since >= Duration::from_millis(100) => link.kernel_drops(),
            None => return,
        };
        self.queue_sampled = now;
        if let Some(d) = drops {
            self.shared.channel_drops[usize::from(self.ch)].store(d, Ordering::Relaxed);
        }
    }

    /// Checks and stores one datagram; returns the new payload bytes it brought.
    fn on_datagram(
        &mut self,
        now: Instant,
        src: &SocketAddr,
        datagram: &[u8],
    ) -> Result<u64, SessionError> {
        if src.ip().to_canonical() != self.shared.peer_ip.to_canonical() {
            self.admission.reject(RejectReason::Source);
            return Ok(0);
        }
        let (verdict, payload) = self
            .admission
            .admit_datagram(now, &self.shared.layout, datagram);
        match verdict {
            Admit::Reject(_) => Ok(0),
            Admit::Probe { size, .. } => {
                if !self.probes_acked.contains(&size) {
                    self.probes_acked.push(size);
                    let _ = self.shared.to_wire.send(Control::ProbeAck {
                        channel: self.ch,
                        size,
                    });
                }
                Ok(0)
            }
            Admit::Final { stripe_len, .. } => {
                self.rec.on_final(now, stripe_len);
                self.rec.resend_done();
                self.log.line(|| format!("final stripe_len={stripe_len}"));
                Ok(0)
            }
            Admit::Data(Placed {
                file: file_id,
                offset,
                len,
                retransmit,
                place,
            }) => {
                let out =
                    self.rec
                        .on_data(now, place.pos, len, retransmit, place.block_stripe.clone());
                if out.new_bytes == 0 {
                    return Ok(0);
                }
                self.moved_file = Some(file_id);
                let block_len = (place.block_stripe.end - place.block_stripe.start) as usize;
                let at = (offset - place.block_file_start) as usize;
                let Some(file) = &self.shared.files[file_id as usize] else {
                    // A file this receiver is not receiving (it takes no room in the layout,
                    // so nothing of it is ever placed).
                    self.admission.reject(RejectReason::Layout);
                    return Ok(0);
                };
                if self.spilled.contains_key(&place.block) {
                    file.write_at(offset, payload)?;
                } else {
                    if !self.buffers.contains_key(&place.block) {
                        if self.buffers.len() >= self.max_buffers {
                            self.spill_oldest()?;
                        }
                        let mut buf = self.take_buffer();
                        buf.resize(block_len, 0);
                        let layout = &self.shared.layout;
                        let blocks = layout.blocks_of(file_id);
                        let hasher = BlockHasher::new(
                            place.block - blocks.start,
                            layout.block_size(),
                            blocks.end - blocks.start,
                        );
                        let gathering = Gathering {
                            buf,
                            hasher,
                            prefix: 0,
                        };
                        self.buffers.insert(place.block, gathering);
                        self.order.push_back(place.block);
                    }
                    if let Some(g) = self.buffers.get_mut(&place.block) {
                        g.fill(at, payload);
                    }
                }
                if out.completes_block {
                    self.complete_block(place.block, file_id, place.block_file_start, block_len)?;
                }
                Ok(out.new_bytes)
            }
        }
    }

    fn complete_block(
        &mut self,
        block: u64,
        file: u32,
        file_start: u64,
        len: usize,
    ) -> Result<(), SessionError> {
        let layout = &self.shared.layout;
        let blocks = layout.blocks_of(file);
        let (index, count) = (block - blocks.start, blocks.end - blocks.start);
        let Some(part) = self.shared.files[file as usize].clone() else {
            return Ok(());
        };
        let value = if let Some(mut g) = self.buffers.remove(&block) {
            self.order.retain(|&b| b != block);
            let v = g.finish();
            let first = !self.refetched.contains(&block);
            if let Some(w) = &self.writer {
                // Its value goes to the session loop once written, from the writer thread.
                self.log
                    .line(|| format!("block {block} complete, queued for writing"));
                return w.hand_over(
                    &self.shared,
                    Written {
                        queued: Instant::now(),
                        file,
                        block,
                        file_start,
                        value: v,
                        buf: g.buf,
                        first,
                    },
                );
            }
            write_block(&part, file_start, &g.buf, first)?;
            self.pool.push(g.buf);
            v
        } else {
            // Spilled: read back what is on disk.
            self.spilled.remove(&block);
            let mut buf = self.take_buffer();
            buf.resize(len, 0);
            part.read_at(file_start, &mut buf)?;
            let v = block_value(&buf, index, self.shared.layout.block_size(), count);
            self.pool.push(buf);
            v
        };
        self.log.line(|| format!("block {block} complete"));
        let _ = self.events.send(ChanEvent::Block { block, value });
        Ok(())
    }

    /// A block buffer: from this channel's pool, else one the writer thread is done with, else
    /// a new one.
    fn take_buffer(&mut self) -> Vec<u8> {
        self.pool
            .pop()
            .or_else(|| self.writer.as_ref().and_then(|w| w.spare.try_recv().ok()))
            .unwrap_or_default()
    }

    /// Writes what the oldest buffered block holds to its file and frees its buffer.
    fn spill_oldest(&mut self) -> Result<(), SessionError> {
        let Some(block) = self.order.pop_front() else {
            return Ok(());
        };
        let Some(Gathering { buf, .. }) = self.buffers.remove(&block) else {
            return Ok(());
        };
        let layout = &self.shared.layout;
        let (Some((_, stripe)), Some((file, range))) = (
            layout.block_stripe_range(block),
            layout.block_file_range(block),
        ) else {
            return Ok(());
        };
        let Some(part) = &self.shared.files[file as usize] else {
            return Ok(());
        };
        for held in self.rec.held(stripe.clone()) {
            let a = (held.start - stripe.start) as usize;
            let b = (held.end - stripe.start) as usize;
            part.write_at(range.start + a as u64, &buf[a..b])?;
        }
        self.log
            .line(|| format!("block {block} spilled to disk while incomplete"));
        self.shared
            .counters
            .spilled_blocks
            .fetch_add(1, Ordering::Relaxed);
        self.spilled.insert(block, range.start);
        self.pool.push(buf);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hurtle_proto::hash::block_value;

    fn gathering(len: usize, index: u64, block_size: u64, blocks: u64) -> Gathering {
        Gathering {
            buf: vec![0; len],
            hasher: BlockHasher::new(index, block_size, blocks),
            prefix: 0,
        }
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i * 7 + usize::from(seed)) as u8)
            .collect()
    }

    #[test]
    fn zeros_are_told_from_data() {
        assert!(all_zeros(&[]));
        assert!(all_zeros(&[0; 1000]));
        for at in [0, 63, 64, 999] {
            let mut b = vec![0u8; 1000];
            b[at] = 1;
            assert!(!all_zeros(&b), "{at}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_block_of_zeros_is_written_only_where_something_was_written() {
        use std::os::unix::fs::MetadataExt;
        let mb = 1usize << 20;
        let dir = tempfile::tempdir_in("/dev/shm").expect("a tmpfs on /dev/shm");
        let mut part = PartFile::create(dir.path(), "f", 3 * mb as u64, false).unwrap();
        let allocated = |p: &PartFile| std::fs::metadata(p.part_path()).unwrap().blocks() * 512;
        // A first write into a new part file: not written, nothing allocated.
        write_block(&part, 0, &vec![0; mb], true).unwrap();
        assert_eq!(allocated(&part), 0);
        // A block fetched again over its first copy: written.
        write_block(&part, mb as u64, &vec![7; mb], true).unwrap();
        write_block(&part, mb as u64, &vec![0; mb], false).unwrap();
        let mut back = vec![1u8; 3 * mb];
        part.read_at(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        assert_eq!(allocated(&part), mb as u64, "only the block written twice");
        // A resumed part file may hold anything: written.
        part.keep_journal(mb as u64).unwrap();
        part.write_at(2 * mb as u64, &vec![9; mb]).unwrap();
        drop(part);
        let (resumed, _) = PartFile::resume(dir.path(), "f", 3 * mb as u64, mb as u64, false)
            .unwrap()
            .expect("a part file and its journal");
        write_block(&resumed, 2 * mb as u64, &vec![0; mb], true).unwrap();
        resumed.read_at(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
    }

    #[test]
    fn a_block_gathered_in_order_is_hashed_as_it_fills() {
        let block = pattern(300_000, 1);
        let mut g = gathering(block.len(), 3, 1 << 19, 5);
        for (i, piece) in block.chunks(8900).enumerate() {
            g.fill(i * 8900, piece);
            // Hashing keeps up with the prefix, in whole steps.
            let hashed = g.hasher.len() as usize;
            assert_eq!(
                hashed,
                ((i + 1) * 8900).min(block.len()) / HASH_STEP * HASH_STEP
            );
        }
        assert_eq!(g.finish(), block_value(&block, 3, 1 << 19, 5));
    }

    #[test]
    fn a_block_gathered_out_of_order_gets_the_same_value() {
        let block = pattern(200_000, 2);
        let mut g = gathering(block.len(), 0, 1 << 18, 1);
        let pieces: Vec<(usize, &[u8])> = block
            .chunks(1000)
            .enumerate()
            .map(|(i, p)| (i * 1000, p))
            .collect();
        // Every other piece first, then the gaps, then one piece again.
        for &(at, p) in pieces.iter().step_by(2) {
            g.fill(at, p);
        }
        assert_eq!(
            g.hasher.len(),
            0,
            "nothing is held without a gap from the start"
        );
        for &(at, p) in pieces.iter().skip(1).step_by(2) {
            g.fill(at, p);
        }
        g.fill(pieces[3].0, pieces[3].1);
        assert_eq!(g.buf, block);
        assert_eq!(g.finish(), *blake3::hash(&block).as_bytes());
    }

    #[test]
    fn hashed_bytes_are_never_overwritten() {
        let block = pattern(4 * HASH_STEP, 3);
        let mut g = gathering(block.len(), 1, 1 << 20, 2);
        g.fill(0, &block[..HASH_STEP + 10]);
        assert_eq!(g.hasher.len() as usize, HASH_STEP);
        // A datagram that overlaps the hashed step with other bytes: only its part beyond the
        // step is taken, so what is written is what was hashed.
        let hostile = vec![0xee; 100];
        g.fill(HASH_STEP - 50, &hostile);
        assert_eq!(&g.buf[..HASH_STEP], &block[..HASH_STEP]);
        assert_eq!(&g.buf[HASH_STEP..HASH_STEP + 50], &hostile[50..]);
        g.fill(0, &hostile);
        assert_eq!(&g.buf[..100], &block[..100]);
        g.fill(HASH_STEP, &block[HASH_STEP..]);
        assert_eq!(g.buf, block);
        assert_eq!(g.finish(), block_value(&g.buf, 1, 1 << 20, 2));
    }

    #[test]
    fn slow_flow_is_judged_over_ten_milliseconds() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut flow = SlowFlow::new(t0, 1000);
        // Not slow until measured, and not measured within 10 ms.
        assert_eq!(flow.update(t0 + ms(5), 1000), None);
        // 125 KB in 10 ms is 100 Mbit/s: slow.
        let bps = flow.update(t0 + ms(10), 126_000).expect("slow");
        assert!((bps - 100e6).abs() < 1e3, "{bps}");
        assert_eq!(flow.update(t0 + ms(15), 50_000_000), Some(bps));
        // 50 MB in 10 ms is 40 Gbit/s: fast.
        assert_eq!(flow.update(t0 + ms(20), 50_000_000 + 126_000), None);
        // Exactly at the threshold is not slow; just under it is.
        let at = (GATHER_BELOW_BPS / 8.0 / 100.0) as u64; // bytes in 10 ms
        let b = 50_000_000 + 126_000;
        assert_eq!(flow.update(t0 + ms(30), b + at), None);
        assert!(flow.update(t0 + ms(40), b + at + at - 1).is_some());
    }

    #[test]
    fn links_left_out_of_a_busy_round_are_read_when_ready() {
        // Link 0 had a full batch; links 1 and 2 were not marked. The poll finds 2 readable.
        let mut readable = [true, false, false];
        add_ready(&mut readable, || Some(0b100));
        assert_eq!(readable, [true, false, true]);
        // A poll that fails changes nothing.
        let mut readable = [true, false];
        add_ready(&mut readable, || None);
        assert_eq!(readable, [true, false]);
        // All marked: no poll at all.
        let mut readable = [true, true];
        add_ready(&mut readable, || {
            panic!("polled although every link is read anyway")
        });
        assert_eq!(readable, [true, true]);
    }

    #[test]
    fn gathering_fills_at_most_an_eighth_of_the_socket_buffer() {
        // 4 MiB buffers: the full pause at any rate that gathers.
        assert_eq!(gather_time(400e6, 4 << 20), GATHER_MAX);
        assert_eq!(gather_time(1.9e9, 4 << 20), GATHER_MAX);
        // Linux's usual 208 KiB: an eighth is 26.6 KB, 1.06 ms at 200 Mbit/s, 0.53 ms at 400.
        assert_eq!(gather_time(200e6, 212_992), GATHER_MAX);
        let t = gather_time(400e6, 212_992);
        assert!(
            t > Duration::from_micros(520) && t < Duration::from_micros(540),
            "{t:?}"
        );
        // What gathers at that rate in that time is an eighth of the buffer.
        let gathered = 400e6 / 8.0 * t.as_secs_f64();
        assert!((gathered - 212_992.0 / 8.0).abs() < 10.0, "{gathered}");
        // No UDP link (TCP only): the full pause.
        assert_eq!(gather_time(1e9, usize::MAX), GATHER_MAX);
    }

    #[test]
    fn lateness_follows_late_ticks_and_decays() {
        let t0 = Instant::now();
        let mut l = Lateness::new(t0);
        assert_eq!(l.tick(t0 + TICK), Duration::ZERO, "a punctual tick");
        // A 200 ms stall: the next tick comes 195 ms late.
        let mut t = t0 + TICK + Duration::from_millis(200);
        assert_eq!(l.tick(t), Duration::from_millis(195));
        // Punctual ticks afterwards: the figure decays, and is small after a few hundred.
        let mut last = Duration::from_millis(195);
        for _ in 0..300 {
            t += TICK;
            let now = l.tick(t);
            assert!(now < last);
            last = now;
        }
        assert!(last < Duration::from_millis(1), "{last:?}");
    }

    #[test]
    fn work_in_runs_keeps_the_order_and_returns_an_error() {
        let items: Vec<u32> = (0..103).collect();
        for threads in [1, 2, 4, 200] {
            let doubled = in_runs(&items, threads, |run| {
                Ok::<_, ()>(run.iter().map(|x| x * 2).collect())
            });
            assert_eq!(
                doubled.unwrap(),
                items.iter().map(|x| x * 2).collect::<Vec<_>>()
            );
            let failed = in_runs(&items, threads, |run| {
                if run.contains(&77) {
                    Err(77)
                } else {
                    Ok(run.to_vec())
                }
            });
            assert_eq!(failed, Err(77), "{threads} threads");
        }
    }

    #[test]
    fn capacity_scales_hashing_by_the_cpu_quota() {
        let measured = Capacity {
            hash_bps: 8_000_000_000,
            threads: 0,
            cpu_quota: None,
            ceiling_bps: 0,
        };
        let free = measured.for_channels(1);
        assert_eq!(free.threads, 1);
        assert_eq!(free.ceiling_bps, 7_200_000_000, "90% of one core's hashing");
        let quota = Capacity {
            cpu_quota: Some(0.25),
            ..measured
        }
        .for_channels(1);
        assert_eq!(
            quota.ceiling_bps, 1_800_000_000,
            "90% of a quarter core's hashing"
        );
        let unknown = Capacity {
            hash_bps: 0,
            ..measured
        }
        .for_channels(4);
        assert_eq!(unknown.ceiling_bps, 0, "nothing measured: no ceiling");
    }
}
