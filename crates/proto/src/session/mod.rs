//! The set-up of a session, after the key agreement and before data: one state machine per
//! side ([`SenderSetup`], [`ReceiverSetup`]) that takes control messages, the local side's
//! facts and time in, and hands messages to send, decisions for the driver and a deadline out.
//!
//! The messages, in order (steps 1 and 2 of the session in the crate docs), with the round
//! trips from the sender's connect:
//!
//! ```text
//! sender                                 receiver
//! 1 RTT: connected
//!   Agree, Hello (in the clear) ------->   checks version and hello, clamps channels,
//!                                          charges a try of the code, lends the data path
//!                                          it opened ahead
//!                          <------------   Agree, HelloAck (sealed: ports, payload, rate
//!                                          ceiling, and a TCP data port if the hello asked)
//! 2 RTT: keys and ports; early data under provisional()
//!   Manifest parts (sealed) ----------->   the key proven: keeps the data path;
//!                                          decides each entry from its file system's facts
//!                          <------------   ManifestReply (send, refuse, have, unchanged, resume)
//!                                          every file "send": Agreed, data phase (the early
//!                                          data in its socket buffers counts)
//! 3 RTT: no "have": Agreed
//!   "have": hashes the files the receiver has
//!   Skip (identical files) ------------>   checks each skip was offered; Agreed
//! ```
//!
//! When the receiver's data path opened ahead is taken (greetings that overlap, a session
//! holding it), it answers with `Agree` alone and sends `HelloAck` once the first `Manifest`
//! part proved the key: ports, early data and every step after come a round trip later.
//!
//! **Early data.** The sender does not wait for the decisions: from the `HelloAck` on it sends
//! the data of the provisional outcome ([`Agreed::provisional`]: every file whole, sparse holes
//! held) under the hello's session id, at most a budget the driver sets. If every file's
//! decision is `SendAll` ([`keeps_early`]), that provisional outcome is the outcome
//! ([`Agreed::early`]): the data sent so far counts, and the data phase goes on. Otherwise
//! (files skipped, resumed, or offered for hashing) the outcome has another layout: its data
//! phase carries the next session id ([`data_session`]), so that the receiver drops whatever of
//! the early data it still finds in its sockets, and the sender starts its channels again (with
//! packet numbers that go on from the early ones: a packet number is the AEAD nonce). No
//! `Start` message: each side starts its data phase when it knows the outcome (the receiver at
//! its decisions, or at `Skip` if it offered files for hashing).
//!
//! With `--transport auto` the hello asks for a TCP data port beside the UDP ones
//! ([`CAP_RACE`](crate::wire::CAP_RACE)). Data starts over UDP at once; if nothing arrives on a
//! channel (the receiver says so with `UdpSilent`, or the sender's probes go unanswered), the
//! sender dials the TCP port, sends `Fallback`, and every channel goes on over its TCP
//! connection in the same session: the set-up is not done again.
//!
//! What the machines own: the order of messages and what each may say (anything else is a
//! [`SetupError`], never a panic), the limits (entries, channels, blocks), the decisions a
//! receiver makes from what it found at each path ([`decide`]), and the outcome both sides must
//! agree on ([`Agreed`]). What they leave to the driver: sockets, threads, the file system
//! (stat, hash, part files), keep-alives while it works, and the data phase.
//!
//! Both machines have the same surface, after quinn-proto's `Connection`: [`handle`] a message
//! that arrived, [`poll_transmit`] for messages to send, [`poll_event`] for what the driver
//! must act on, [`poll_timeout`] and [`handle_timeout`] for the wait's deadline (each message,
//! keep-alives included, restarts it).
//!
//! [`handle`]: SenderSetup::handle
//! [`poll_transmit`]: SenderSetup::poll_transmit
//! [`poll_event`]: SenderSetup::poll_event
//! [`poll_timeout`]: SenderSetup::poll_timeout
//! [`handle_timeout`]: SenderSetup::handle_timeout

pub mod data;
pub mod decide;
mod receiver;
mod sender;

pub use decide::{first_look, Found, Look};
pub use receiver::check_hello;
pub use receiver::{
    HelloParams, Intake, ReceiverEvent, ReceiverLimits, ReceiverSetup, MAX_EARLY_VALUES,
};
pub use sender::{Accepted, SenderEvent, SenderParams, SenderSetup};

use crate::layout::{Held, Layout, LayoutError};
use crate::wire::{AbortCause, Control, Decision, Entry, EntryKind, VERSION};
use std::time::{Duration, Instant};

/// How long either side waits for the peer's next message during set-up.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(10);
/// The most entries a receiver takes in one manifest.
pub const MAX_ENTRIES: usize = 10_000_000;
/// The longest link target a manifest may carry, in bytes (Linux's `PATH_MAX` less its NUL).
pub const MAX_LINK_TARGET: usize = 4095;
/// Most entries per `Manifest` part, and decisions per `ManifestReply` part.
pub const MANIFEST_PART: usize = 2048;
/// Estimated bytes a part aims to stay under: a quarter of the frame limit, whatever its
/// entries carry (long paths, many holes, many resumed ranges).
const PART_BYTES: usize = crate::wire::MAX_FRAME / 4;

/// `items` cut into parts of at most [`MANIFEST_PART`] items and about [`PART_BYTES`] by
/// `size` (an upper bound of an item's encoding); always at least one part, maybe empty.
fn parts<T>(items: &[T], size: impl Fn(&T) -> usize) -> Vec<&[T]> {
    let mut parts = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, item) in items.iter().enumerate() {
        let n = size(item);
        if i > start && (i - start == MANIFEST_PART || bytes + n > PART_BYTES) {
            parts.push(&items[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += n;
    }
    parts.push(&items[start..]);
    parts
}

/// An upper bound of an entry's encoding (varints of at most 10 bytes).
fn entry_bytes(e: &Entry) -> usize {
    48 + e.path.len() + 20 * e.holes.len()
}

/// An upper bound of a decision's encoding.
fn decision_bytes(d: &crate::wire::Decision) -> usize {
    use crate::wire::Decision;
    match d {
        Decision::SendAll | Decision::Unchanged => 1,
        Decision::Refuse(reason) => 11 + reason.len(),
        Decision::Have { .. } => 34,
        Decision::Resume { blocks } => 11 + 20 * blocks.len(),
    }
}

/// Why a set-up failed. Each is found where it happens; none panics.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The sender's hello names another protocol, or another version of this one.
    #[error("not a hurtle {VERSION} sender (magic {magic:?}, version {version}): use the same hurtle version on both sides")]
    Incompatible {
        /// The magic the hello carried.
        magic: [u8; 4],
        /// The version it carried.
        version: u16,
    },
    /// The receiver's answer names another version or no channel.
    #[error("receiver speaks version {version}, no usable channels")]
    NoChannels {
        /// The version it named.
        version: u16,
    },
    /// The peer ended the set-up: its `Abort`, or a `Reject` (another version), in its words.
    #[error("the peer ended the set-up: {reason}")]
    PeerAborted {
        /// Why, in the peer's terms (`Failed` for a `Reject`).
        cause: AbortCause,
        /// The peer's words.
        reason: String,
    },
    /// A message the set-up does not expect now.
    #[error("expected {wanted}, got {}", .got.name())]
    Unexpected {
        /// What came.
        got: Box<Control>,
        /// What the set-up waited for.
        wanted: &'static str,
    },
    /// The manifest grew past [`MAX_ENTRIES`].
    #[error("manifest has more than 10 million entries")]
    TooManyEntries,
    /// A manifest entry's holes are outside its file or out of order.
    #[error(
        "the manifest gives {path} holes in blocks {start}..{end}, outside it or out of order"
    )]
    BadHoles {
        /// The entry.
        path: String,
        /// The first bad range.
        start: u64,
        /// Its end.
        end: u64,
    },
    /// A manifest entry's link target is not one a link can have (empty, with a NUL, longer
    /// than [`MAX_LINK_TARGET`]), or an entry that is not a link has one, or a link has a
    /// size or holes.
    #[error("the manifest gives {path} a bad link: {why}")]
    BadLink {
        /// The entry.
        path: String,
        /// What is wrong.
        why: &'static str,
    },
    /// The manifest, the decisions or the channels make no layout (too many blocks, resumed
    /// blocks outside a file, a bad block size or channel count).
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// The receiver answered with another number of decisions than there are entries.
    #[error("manifest reply has the wrong length")]
    ReplyLength,
    /// The receiver refused an entry.
    #[error("the receiver refused {path}: {reason}")]
    Refused {
        /// The entry.
        path: String,
        /// The receiver's words.
        reason: String,
    },
    /// The receiver skipped an entry on size and time where that is not allowed (a directory,
    /// or the sender asked for checksums).
    #[error("the receiver skipped {path} on size and time alone")]
    UncheckedSkip {
        /// The entry.
        path: String,
    },
    /// The receiver's answer names more ports than the sender offered channels.
    #[error("the receiver answered with {ports} ports for {offered} channels offered")]
    TooManyPorts {
        /// Ports named.
        ports: usize,
        /// Channels offered.
        offered: u16,
    },
    /// The sender's `Skip` names a file the manifest does not have.
    #[error("skip names file {0}, which is not in the manifest")]
    SkipUnknown(u32),
    /// The sender's `Skip` names a file the receiver did not offer as already there.
    #[error("the sender skipped {path}, which the receiver does not have")]
    SkipNotOffered {
        /// The entry.
        path: String,
    },
    /// The driver's answer does not fit the set-up (a hash for a file not asked about, ports
    /// of another count than the channels, decisions before the manifest): a bug in the
    /// driver, reported instead of acted on.
    #[error("set-up driven out of order: {0}")]
    Driver(&'static str),
    /// No message from the peer within the deadline.
    #[error("no message from the peer within {0:?}")]
    Timeout(Duration),
}

impl SetupError {
    /// `got` where the set-up waited for `wanted`: the peer's own end if that is what it is.
    fn unexpected(got: Control, wanted: &'static str) -> Self {
        match got {
            Control::Abort { cause, reason } => SetupError::PeerAborted { cause, reason },
            Control::Reject { reason } => SetupError::PeerAborted {
                cause: AbortCause::Failed,
                reason,
            },
            got => SetupError::Unexpected {
                got: Box::new(got),
                wanted,
            },
        }
    }
}

/// The surface both set-up machines share, so that one driver loop serves either side.
pub trait Setup {
    /// What the driver must act on.
    type Event;
    /// A message from the peer arrived at `now`.
    fn handle(&mut self, msg: Control, now: Instant) -> Result<(), SetupError>;
    /// The next message to send.
    fn poll_transmit(&mut self) -> Option<Control>;
    /// The next thing the driver must act on.
    fn poll_event(&mut self) -> Option<Self::Event>;
    /// When the wait for the peer ends in failure unless a message comes first (`None` while
    /// the driver itself is at work, and once done).
    fn poll_timeout(&self) -> Option<Instant>;
    /// Marks the set-up failed (it takes nothing more) and hands `e` back.
    fn failed(&mut self, e: SetupError) -> SetupError;
    /// The deadline passed at `now` without a message: the set-up fails with
    /// [`SetupError::Timeout`].
    fn handle_timeout(&mut self, now: Instant) -> Result<(), SetupError> {
        match self.poll_timeout() {
            Some(d) if now >= d => Err(self.failed(SetupError::Timeout(SETUP_TIMEOUT))),
            _ => Ok(()),
        }
    }
}

macro_rules! impl_setup {
    ($machine:ty, $event:ty) => {
        impl Setup for $machine {
            type Event = $event;
            fn handle(&mut self, msg: Control, now: Instant) -> Result<(), SetupError> {
                <$machine>::handle(self, msg, now)
            }
            fn poll_transmit(&mut self) -> Option<Control> {
                <$machine>::poll_transmit(self)
            }
            fn poll_event(&mut self) -> Option<$event> {
                <$machine>::poll_event(self)
            }
            fn poll_timeout(&self) -> Option<Instant> {
                <$machine>::poll_timeout(self)
            }
            fn failed(&mut self, e: SetupError) -> SetupError {
                <$machine>::failed(self, e)
            }
        }
    };
}

impl_setup!(SenderSetup, SenderEvent);
impl_setup!(ReceiverSetup, ReceiverEvent);

/// How a file takes part in the transfer once both sides agreed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skipped {
    /// It is sent (all of it, or what the receiver does not hold).
    No,
    /// The receiver has it, identical: this is its BLAKE3, checked by both sides.
    Same([u8; 32]),
    /// The receiver has a file of its size and modification time and the sender skipped it
    /// unread, as rsync does: no hash is known.
    Unchecked,
}

impl Skipped {
    /// True for a file that is not sent.
    pub fn is_skipped(self) -> bool {
        self != Skipped::No
    }

    /// The hash to report for a skipped file (zeros for an unchecked one), `None` for a sent one.
    pub fn kept_hash(self) -> Option<[u8; 32]> {
        match self {
            Skipped::No => None,
            Skipped::Same(h) => Some(h),
            Skipped::Unchecked => Some([0; 32]),
        }
    }
}

/// Whether the early data counts: every file's decision is `SendAll` (directories aside), so
/// the outcome is the provisional one ([`Agreed::provisional`]).
pub fn keeps_early(entries: &[Entry], decisions: &[Decision]) -> bool {
    entries
        .iter()
        .zip(decisions)
        .all(|(e, d)| e.kind != EntryKind::File || *d == Decision::SendAll)
}

/// The session id of the data phase: the hello's when the early data counts (`early`, see
/// [`keeps_early`]), the next odd one otherwise, so that datagrams of the provisional layout
/// are told from the outcome's.
pub fn data_session(hello_session: u32, early: bool) -> u32 {
    if early {
        hello_session
    } else {
        hello_session.wrapping_add(2)
    }
}

/// What both sides agree on when the set-up is done. Each side builds it from the manifest,
/// the decisions and the skips, and they build the same one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agreed {
    /// Data channels.
    pub channels: u16,
    /// Block size.
    pub block_size: u64,
    /// Session id every datagram carries.
    pub session: u32,
    /// Per file (the manifest's files, in order): skipped or not.
    pub skips: Vec<Skipped>,
    /// Per file: blocks the receiver holds from an interrupted transfer (the file's own block
    /// numbers, half-open ranges).
    pub resumed: Vec<Vec<(u64, u64)>>,
    /// Which channel carries which bytes; skipped files take no room.
    pub layout: Layout,
    /// What is not sent: resumed blocks and sparse holes, by channel.
    pub held: Held,
    /// Bytes of the files that are sent (held bytes included).
    pub sent_bytes: u64,
    /// The provisional outcome, under the hello's session id: the early data counts.
    pub early: bool,
}

impl Agreed {
    /// The outcome if every file is sent whole (sparse holes held): what the sender's early
    /// data follows before the receiver's decisions, under the hello's session id.
    pub fn provisional(
        entries: &[Entry],
        block_size: u64,
        channels: u16,
        session: u32,
    ) -> Result<Agreed, SetupError> {
        let n = files(entries).count();
        Agreed::new(
            entries,
            vec![Skipped::No; n],
            vec![Vec::new(); n],
            block_size,
            channels,
            session,
        )
        .map(|a| Agreed { early: true, ..a })
    }

    fn new(
        entries: &[Entry],
        skips: Vec<Skipped>,
        resumed: Vec<Vec<(u64, u64)>>,
        block_size: u64,
        channels: u16,
        session: u32,
    ) -> Result<Agreed, SetupError> {
        let files: Vec<&Entry> = files(entries).collect();
        let sizes: Vec<u64> = files
            .iter()
            .zip(&skips)
            .map(|(f, s)| if s.is_skipped() { 0 } else { f.size })
            .collect();
        let layout = Layout::new(&sizes, block_size, channels)?;
        // A skipped file's holes are nobody's business: it is not sent.
        let holes: Vec<&[(u64, u64)]> = files
            .iter()
            .zip(&skips)
            .map(|(f, s)| {
                if s.is_skipped() {
                    &[][..]
                } else {
                    &f.holes[..]
                }
            })
            .collect();
        let held = layout.held_stripes(&resumed, &holes)?;
        Ok(Agreed {
            channels,
            block_size,
            session,
            skips,
            resumed,
            layout,
            held,
            sent_bytes: sizes.iter().sum(),
            early: false,
        })
    }

    /// Bytes that move: those sent minus those held.
    pub fn moving_bytes(&self) -> u64 {
        self.sent_bytes - self.held.bytes()
    }
}

/// The file entries of a manifest, in order: their index is the file id.
pub fn files(entries: &[Entry]) -> impl Iterator<Item = &Entry> {
    entries.iter().filter(|e| e.kind == EntryKind::File)
}

#[cfg(test)]
mod tests;
