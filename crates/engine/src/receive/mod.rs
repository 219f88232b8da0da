//! The receiving side of a session: listen, agree, check the manifest, receive, verify, commit.
//!
//! Threads: the session loop (the caller's thread) drives the data phase's machine
//! (`hurtle_proto::session::data::ReceiverData`, which holds the [`Verifier`] and the files'
//! fates): it feeds the sender's block values in and hands verified files to a committer
//! thread, which commits them (fsync + rename, in batches of a few milliseconds' worth); the
//! machine sends `FileDone` for each once it is in place. Channel threads, one per channel but no more than there are cores, each serve one
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
//!
//! [`Receiver`] (here) binds the control port and serves one transfer at a time. The rest, one
//! thing per file:
//!
//! - [`accept`]: the front door: accepting connections and greeting them.
//! - [`data_path`]: the data path, opened ahead of the sender (or, when that set is taken,
//!   once the sender proved its key) and lent to the greeting that answers its hello.
//! - `session`: one session from the hello to the summary (`Receiver::run`): the manifest's
//!   answers, the part files, the layout, the threads.
//! - `held`: what is not sent: resumed part files and sparse files' holes, hashed here.
//! - `links`: the data links' keys and the TCP data connections.
//! - `names`: which names a sender may offer, and the one written under another name.
//! - `session_loop`: the caller's thread while data flows: verification and reports.
//! - `commit`: the committer thread, and the journals of verified blocks.
//! - `channel_threads`: the channel threads: reading, checking and gathering datagrams.
//! - `gathering`: a block gathered in memory and hashed as it fills.
//! - `writer`: writing complete blocks, and the writer thread.
//! - `capacity`: what this receiver can absorb ([`Capacity`]).
//! - `shared`: the state and the messages the threads share.
//! - `parallel`: work split over a few threads in runs.
//! - `summary`: what a finished receive did ([`ReceiveSummary`]).
//!
//! Imports point one way: `session` uses the files below it; `session_loop` uses `commit`;
//! `channel_threads` uses `gathering` and `writer`; all of them use `shared`.
//!
//! [`Verifier`]: hurtle_proto::Verifier
//! [`ChannelReceiver`]: hurtle_proto::ChannelReceiver
//! [`Admission`]: hurtle_proto::Admission
//! [`ReportBuilder`]: hurtle_proto::ReportBuilder

pub mod accept;
mod capacity;
mod channel_threads;
mod commit;
pub mod data_path;
mod gathering;
mod held;
mod links;
mod names;
mod parallel;
mod session;
mod session_loop;
mod shared;
mod summary;
mod writer;

pub use capacity::{measure_capacity, Capacity};
pub use names::Names;
pub use summary::ReceiveSummary;

use crate::error::{SessionError, Side};
use crate::handshake::Keyring;
use crate::progress::{Phase, Progress};
use accept::{Arrival, DoorLimits, FrontDoor, Gatekeeper, Greeted};
use links::DataKeys;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::PathBuf;
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
    /// Datagrams may come through this relay (`receive --relay`): its channels bind there.
    pub relayed_udp: Option<Arc<RelayedUdp>>,
    /// Whether complete blocks go to a writer thread (see [`WriteQueue`]).
    pub write_queue: WriteQueue,
    /// The code and keys a sender may use (authentication is never off: an empty keyring
    /// fails with [`SessionError::NoSecret`]).
    pub keys: Keyring,
    /// Ask for data datagrams in the clear (`--no-encryption`): granted only when the sender
    /// asks too.
    pub no_encryption: bool,
    /// How new connections are greeted: the grace time for their hello and how many may be
    /// greeted at once (see [`crate::receive::accept`]).
    pub door: DoorLimits,
    /// Which names a sender may offer, and the one written under another name (see
    /// [`Names`]; the default takes any name as it is).
    pub names: Names,
    /// A sender may ask for a mirror (`--delete`, `receive --allow-delete`): what it did not
    /// offer inside the directories it offered is deleted once every file is committed
    /// ([`crate::mirror`]). Without it such a session is refused before anything is written.
    pub allow_delete: bool,
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

/// Datagrams that may come through a relay (a receiver paired by code): the relay's IP, whose
/// datagrams the channels take as the sender's, and, once the relay gives them for a session
/// (its agent hears them), where each channel socket binds its end of the session's
/// allocation there and the datagram that does it ([`RelayedUdp::offer`]). An authenticated
/// session's channels send their binds as soon as they are offered. Whether the sender came
/// through the relay at all ([`RelayedUdp::paired_through_relay`], or an offer) decides how the
/// bytes of TCP data connections are counted (`bytes_by_path`: through the relay's splice).
#[derive(Debug)]
pub struct RelayedUdp {
    relay_ip: IpAddr,
    offer: std::sync::Mutex<Option<RelayOffer>>,
    ready: std::sync::Condvar,
    through_relay: std::sync::atomic::AtomicBool,
}

/// A session's allocations at the relay: its address, each channel socket's bind, and how its
/// answers read (they name the sender's socket once it is bound, for hole punching).
pub type RelayOffer = (SocketAddr, Vec<Vec<u8>>, crate::net::punch::ParseAnswer);

impl RelayedUdp {
    /// Datagrams may come from `relay_ip`.
    pub fn new(relay_ip: IpAddr) -> RelayedUdp {
        RelayedUdp {
            relay_ip: relay_ip.to_canonical(),
            offer: std::sync::Mutex::new(None),
            ready: std::sync::Condvar::new(),
            through_relay: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The sender's connections come through the relay's splice (the relay said so when it
    /// paired the two; an offer of datagram allocations says so too).
    pub fn paired_through_relay(&self) {
        self.through_relay
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the sender came through the relay (see [`RelayedUdp::paired_through_relay`]).
    pub fn through_relay(&self) -> bool {
        self.through_relay
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The relay gave a session's allocations: each channel's socket sends `binds[channel]`
    /// to `addr`, and reads the answers with `parse`.
    pub fn offer(
        &self,
        addr: SocketAddr,
        binds: Vec<Vec<u8>>,
        parse: crate::net::punch::ParseAnswer,
    ) {
        *self.offer.lock().unwrap_or_else(|e| e.into_inner()) = Some((addr, binds, parse));
        self.paired_through_relay();
        self.ready.notify_all();
    }

    /// The relay's IP.
    pub fn relay_ip(&self) -> IpAddr {
        self.relay_ip
    }

    /// Waits up to `timeout` for an offer, and takes it.
    fn take(&self, timeout: Duration) -> Option<RelayOffer> {
        let guard = self.offer.lock().unwrap_or_else(|e| e.into_inner());
        let (mut guard, _) = self
            .ready
            .wait_timeout_while(guard, timeout, |o| o.is_none())
            .unwrap_or_else(|e| e.into_inner());
        guard.take()
    }

    /// Hands the relay's offer, when it comes (at most `wait` from now), to `publish`, on a
    /// thread of its own: the session's channel threads then bind their sockets and try for
    /// direct paths ([`crate::net::punch::SocketPunch`]).
    pub(crate) fn when_offered(
        self: &Arc<Self>,
        wait: Duration,
        publish: impl FnOnce(RelayOffer) + Send + 'static,
    ) {
        let me = self.clone();
        let _ = std::thread::Builder::new()
            .name("relay-offer".into())
            .spawn(move || {
                if let Some(offer) = me.take(wait) {
                    publish(offer);
                }
            });
    }
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
            relayed_udp: None,
            write_queue: WriteQueue::Auto,
            keys: Keyring::default(),
            no_encryption: false,
            door: DoorLimits::default(),
            names: Names::default(),
            allow_delete: false,
        }
    }
}

/// A bound receiver; [`Receiver::accept_one`] serves one transfer.
pub struct Receiver {
    /// Accepts and greets connections on `listener`; dropped first, which stops it.
    door: FrontDoor,
    listener: TcpListener,
    opts: ReceiveOptions,
    /// The data paths: the set opened ahead for the next sender, refilled before each wait.
    data: data_path::DataDoor,
    /// The control listener's address, which the set opened ahead serves.
    receiver_ip: IpAddr,
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
        let capacity = Arc::new(std::sync::OnceLock::new());
        let data = data_path::DataDoor {
            own_ports: opts.own_ports.clone(),
            any_ip: opts.relayed_udp.is_some(),
            capacity: capacity.clone(),
            limits: hurtle_proto::session::ReceiverLimits {
                max_channels: opts.max_channels,
            },
            ahead: Arc::default(),
        };
        // The first sender's data path, opened before anyone connects.
        let receiver_ip = listener
            .local_addr()
            .map_err(|e| SessionError::io("listening socket", e))?
            .ip();
        if let Err(e) = data.open_ahead(receiver_ip) {
            tracing::warn!("could not open the first sender's data path ahead: {e}");
        }
        let door = listener
            .try_clone()
            .and_then(|l| {
                let keys = Gatekeeper {
                    keys: opts.keys.clone(),
                    plain_data: opts.no_encryption,
                    data: data.clone(),
                };
                FrontDoor::open(l, opts.door, keys)
            })
            .map_err(|e| SessionError::io("accepting thread", e))?;
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
            data,
            receiver_ip,
        })
    }

    /// What this receiver can absorb: measured once, by the thread [`Receiver::bind`] started
    /// (waiting for it if it is still at work).
    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, SessionError> {
        self.listener
            .local_addr()
            .map_err(|e| SessionError::io("listening socket", e))
    }

    /// Waits for one sender and receives its transfer.
    ///
    /// Connections that are not a hurtle sender's, or fail the key agreement, are dropped
    /// meanwhile and do not end the wait ([`crate::receive::accept`]); the summary counts them
    /// (not those closed before a byte, such as a sender's losing connect attempt). The
    /// [`CODE_TRIES`](crate::handshake::CODE_TRIES)th failed agreement with the code spends it
    /// ([`SessionError::CodeSpent`]). `progress.interrupt()` from another thread ends the wait
    /// for a sender within 50 ms ([`SessionError::Interrupted`]).
    pub fn accept_one(&self, progress: Arc<Progress>) -> Result<ReceiveSummary, SessionError> {
        if self.opts.keys.is_empty() {
            return Err(SessionError::NoSecret);
        }
        if let Ok(addr) = self.listener.local_addr() {
            progress.set_address(addr);
        }
        // What the last session took of the set opened ahead is opened again, for the next
        // sender (a receiver that cannot is still served, a round trip later).
        if let Err(e) = self.data.open_ahead(self.receiver_ip) {
            tracing::warn!("could not open the next sender's data path ahead: {e}");
        }
        // A cancel (`progress.interrupt()`) ends the wait for a sender, too.
        let arrival = self.door.next_unless(&|| progress.interrupted())?;
        progress.set_phase(Phase::SettingUp);
        let mut summary = self.serve(arrival, progress)?;
        summary.strays = self.door.take_strays();
        Ok(summary)
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
            opened,
        } = arrival;
        let start = Instant::now();
        let Greeted {
            first,
            keys,
            key_name,
            rtt,
        } = greeted;
        // Who came: the name the receiver's key file gives the key (or "code").
        tracing::info!("sender {peer} authenticated with {key_name}");
        let data = DataKeys {
            key: keys.data,
            encrypt: keys.encrypt_data,
            feedback: keys.feedback,
            punch: keys.punch,
        };
        let (rx, tx, writer) = crate::net::control::open(
            &stream,
            self.opts.idle_timeout,
            keys.frames_out,
            keys.frames_in,
        )
        .map_err(|e| SessionError::io("control connection", e))?;
        let result = self.run(
            (opened, first),
            rtt,
            (&rx, &tx, std::os::fd::AsFd::as_fd(&stream)),
            peer,
            start,
            progress,
            &data,
        );
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
}
