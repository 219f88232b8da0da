//! Whole sessions: the set-up, then the data phase, on one virtual clock.
//!
//! # What this module owns
//!
//! The driver of both sides' set-up, in simulation. A [`SessionScenario`] describes what the
//! sender offers ([`SimEntry`]: files with sizes, modification times and sparse holes, and
//! directories), what the receiver's file system already has ([`Disk`]: files at the same
//! paths, identical or not, things that are not files, part files of interrupted transfers),
//! how each side works (the receiver's channel limit and rate ceiling, how fast each side
//! hashes) and what goes wrong on the control path ([`ControlFault`]). A [`Session`] runs it:
//!
//! 1. **Set-up.** Time zero is the sender's first flight: the key agreement's `Agree` (not
//!    modelled) with the hello ([`SenderSetup::hello`]) in the clear behind it. That flight
//!    leaves one round trip after the sender's TCP connect, which is not modelled either: add
//!    one round trip to any time here for the time from the connect. The receiver checks the
//!    hello ([`check_hello`]; `Reject` for another version), opens its data path at once and
//!    answers with one port per channel (7401, 7402, ...) and
//!    [`SessionScenario::rate_ceiling_bps`] in its `HelloAck` ([`ReceiverSetup::accept`]),
//!    which comes back with the agreement's answer. Only then does the engine's sender have
//!    its keys, so only then does it send its manifest: here too, the manifest parts leave at
//!    the `HelloAck` (one round trip after time zero). The receiver decides each manifest
//!    entry from its file system's facts with [`hurtle_proto::session::first_look`],
//!    finishing with [`Look::with_hash`] (BLAKE3 of its copy) or [`Look::with_part`] (its part
//!    file's blocks). The sender hashes its own files when asked
//!    ([`SenderEvent::HashWanted`]) and sends `Skip` if it was. Hashing takes virtual time at
//!    [`SessionScenario::sender_hash_bps`] / [`SessionScenario::receiver_hash_bps`] (none by
//!    default), and the receiver's look at its file system [`SessionScenario::receiver_look`];
//!    a side busy with either sends a `KeepAlive` every second, as the engine's do.
//!    Every message goes over the same modelled control connection ([`crate::control`]) as
//!    the data phase's (reliable, in order, one-way delay [`Scenario::control_delay`] or the
//!    data link's; framed with [`Control::to_frame`] and parsed with [`Control::from_body`]),
//!    on the virtual clock.
//! 2. **Early data.** From the `HelloAck` on, the sender does not wait for the decisions: it
//!    starts the data phase of [`Pair`] from its provisional outcome
//!    ([`SenderSetup::provisional`]: every file whole, holes held, the hello's session id),
//!    at most [`EARLY_RTTS`] round trips' worth of new bytes at its initial rate (the round
//!    trip it measured from its hello to the `HelloAck`; see [`EarlyData::budget`]), and it
//!    sends the block values of what it reads at once, tagged with the hello's session id.
//!    The receiver's set-up machine takes those that come before its outcome
//!    ([`ReceiverSetup::handle`]: this driver feeds it every message, even while it decides;
//!    the engine's reads none then, which changes nothing but when they are taken). When its
//!    outcome comes ([`SenderEvent::Ready`]) and is the provisional one ([`Agreed::early`]),
//!    the sender's data phase goes on with no budget; otherwise (a file skipped, resumed or
//!    offered for hashing) the sender drops its early data and starts the data phase again
//!    from its outcome, under the next session id (its pacers, rate controller and packet
//!    numbers go on), reading every block again and sending its value under that id. What
//!    the early data was is in [`SessionOutcome::early`].
//! 3. **Data.** No `Start`: each side starts its data phase from its own outcome. The
//!    receiver's is ready at its decisions when none is `Have`, at the sender's `Skip`
//!    otherwise; its data state (layout, session id, its part files' blocks held, skipped
//!    files) is built from its own `Agreed`, and it reads no datagram before: they wait in
//!    the link meanwhile, as in a socket buffer. Its verifier starts with the early data's
//!    block values that came during its set-up if its outcome keeps the early data
//!    ([`ReceiverSetup::early_values`], as the engine's driver does); otherwise the machine
//!    dropped them. From then on its admission drops every datagram of another session id
//!    (early data its outcome did not keep), it drops the block values of that early data
//!    and fails on those of any other session id but its own, and with
//!    [`Scenario::rate`] it reports every [`hurtle_proto::rate::report_interval`] of the
//!    scenario's round trip ([`RateConfig::rtt`](hurtle_proto::RateConfig::rtt)), stretched
//!    at low rates ([`hurtle_proto::rate::ReportCadence`]; further on a short path,
//!    [`crate::pair::Scenario::report_pace`]), as the engine's receiver does of the one it
//!    measured. Once both sides have their `Agreed`
//!    they must be equal ([`SideError::Disagreed`] for the receiver otherwise); the data
//!    phase is the one [`Pair`] runs.
//! 4. **End.** When every file is confirmed and every channel done, the sender sends `Done`;
//!    the receiver ends when it reads it. A side that fails sends `Abort` (`Reject` for an
//!    incompatible peer; nothing when the peer already ended it) and closes the connection; a
//!    side that reads the end of a closed connection fails with [`SideError::PeerGone`].
//!
//! Every run, whatever its end, is checked: a file the receiver put in place holds exactly the
//! sender's bytes, and every other file of the receiver is as it was (no wrong byte ever lands).
//! A session that ends [`End::Done`] on both sides must also have the receiver's data phase
//! exact, and each skipped file identical to the sender's (a file skipped on size and time alone
//! is left as it was). Anything else fails the run with a [`Failure`].
//!
//! The virtual time of each phase is in [`PhaseTimes`]: from time zero, the hello's flight,
//! the first data datagram leaves exactly one round trip later (at the `HelloAck`), whatever
//! the manifest and the decisions, and the receiver starts its data phase one and a half round
//! trips after time zero when it offers nothing for hashing.
//!
//! # What it does not own
//!
//! The TCP connect and the key agreement and sealing (`Agree`, AES-GCM), probing of payload
//! sizes (`ProbeAck`s are never sent; data uses [`Scenario::payload`]), parallel TCP and the
//! fallback to it, the control connection's model and the [`Fault`]s it applies (see
//! [`crate::control`]), and the data phase's own rules (see [`crate::pair`]).

use crate::control::ControlPath;
// `Fault` lives in `control`; this keeps its `whole_session::Fault` path too.
pub use crate::control::Fault;
use crate::link::LinkStats;
use crate::pair::{
    check_knobs, file_bytes, session_id, DataFailure, DataPlan, EarlySent, Failure, Outcome, Pair,
    Scenario,
};
use hurtle_proto::layout::{Layout, MAX_CHANNELS, MIN_BLOCK_SIZE};
use hurtle_proto::rate::ReportPace;
use hurtle_proto::session::data::DataError;
use hurtle_proto::session::{
    check_hello, first_look, Accepted, Agreed, Found, HelloParams, Intake, Look, ReceiverEvent,
    ReceiverLimits, ReceiverSetup, SenderEvent, SenderParams, SenderSetup, Setup, SetupError,
    Skipped, SETUP_TIMEOUT,
};
use hurtle_proto::wire::{AbortCause, Control, Decision, Entry, EntryKind, FrameError};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

/// How often a side busy with slow work (hashing) tells its peer it is still there.
pub const BUSY_KEEPALIVE: Duration = Duration::from_secs(1);

/// The modification time [`SessionScenario::new`] gives its files, ns since the Unix epoch.
pub const MTIME_NS: i64 = 1_700_000_000_000_000_000;

/// The first data port the receiver names (one per channel from there).
pub const FIRST_PORT: u16 = 7401;

/// Round trips' worth of new data, at the sender's initial rate, that it may send as early
/// data before it knows its outcome (see [`EarlyData::budget`]). The outcome comes one round
/// trip after the early data starts unless a side hashes to decide, so two round trips' worth
/// never binds a session without hashing, and bounds the waste of one with it.
pub const EARLY_RTTS: u64 = 2;

/// One side of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The side that sends files.
    Sender,
    /// The side that receives them.
    Receiver,
}

/// A file the sender offers. Its bytes come from the seed ([`crate::pair::file_bytes`] of its
/// file id), with zeros in its holes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimFile {
    /// Relative path.
    pub path: String,
    /// Length in bytes.
    pub size: u64,
    /// Modification time, ns since the Unix epoch.
    pub mtime_ns: i64,
    /// Blocks that lie wholly in holes (the file's own block numbers at the scenario's block
    /// size, ascending half-open ranges): zeros on the sender, offered as holes in the manifest.
    pub holes: Vec<(u64, u64)>,
}

/// One entry of the sender's manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimEntry {
    /// A regular file.
    File(SimFile),
    /// A directory.
    Dir(String),
}

impl SimEntry {
    /// A file of `size` bytes at `path`, modified at [`MTIME_NS`], without holes.
    pub fn file(path: &str, size: u64) -> SimEntry {
        SimEntry::File(SimFile {
            path: path.into(),
            size,
            mtime_ns: MTIME_NS,
            holes: Vec::new(),
        })
    }

    /// A directory at `path`.
    pub fn dir(path: &str) -> SimEntry {
        SimEntry::Dir(path.into())
    }
}

/// What the receiver's file system has at a path before the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnDisk {
    /// A regular file with exactly the bytes of the sender's file at that path.
    Copy {
        /// Its modification time, ns since the Unix epoch.
        mtime_ns: i64,
    },
    /// A regular file of `len` bytes that are not the sender's (seeded).
    Altered {
        /// Its length.
        len: u64,
        /// Its modification time, ns since the Unix epoch.
        mtime_ns: i64,
    },
    /// Something that is not a regular file: a directory, a symlink.
    NotAFile,
}

/// A part file an interrupted transfer left for a path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartFile {
    /// Blocks its journal vouches for (the file's own block numbers, half-open ranges): they
    /// hold the sender's bytes.
    pub blocks: Vec<(u64, u64)>,
    /// Of those, blocks whose bytes are wrong all the same (a torn write, a source changed
    /// since): one byte differs.
    pub corrupt: Vec<u64>,
}

/// The receiver's file system before the session, as data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Disk {
    /// What is at each path.
    pub files: BTreeMap<String, OnDisk>,
    /// Part files, by the path they are for.
    pub parts: BTreeMap<String, PartFile>,
    /// The receiver may replace what is there (`--overwrite`).
    pub overwrite: bool,
}

/// A [`Fault`] at one message of one direction of the control path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlFault {
    /// The side the path leads to.
    pub toward: Side,
    /// The genuine message (0 = the first sent that way) it happens at. On the way to the
    /// receiver they are `Hello`, the `Manifest` parts, then `BlockHashes` (the early
    /// data's first, from the `HelloAck` on: one per step of the sender's that read blocks),
    /// `Skip` among them (only if the receiver offered files for hashing: after the early
    /// data's), `Done` last; on the way to the
    /// sender `HelloAck`, the `ManifestReply` parts, then data-phase ones (`KeepAlive`s of a
    /// busy side count too).
    pub nth: usize,
    /// What goes wrong.
    pub fault: Fault,
}

/// Everything a whole session depends on. See the module docs.
#[derive(Debug, Clone)]
pub struct SessionScenario {
    /// The data phase's knobs (path, pacing, faults of the data path, caps) and the sender's
    /// hello: [`Scenario::channels`] is the count it offers, [`Scenario::block_size`] and
    /// [`Scenario::payload`] what it proposes. Its `files` and `held` are not used: the files
    /// are [`SessionScenario::entries`] and held blocks come from [`Disk::parts`].
    pub data: Scenario,
    /// The sender's manifest, in order.
    pub entries: Vec<SimEntry>,
    /// The receiver's file system.
    pub disk: Disk,
    /// The sender compares existing files by hash only (`--checksum`).
    pub checksum: bool,
    /// Most channels the receiver takes.
    pub max_channels: u16,
    /// What the receiver says it can absorb, bit/s (0 = unknown).
    pub rate_ceiling_bps: u64,
    /// How fast the sender hashes its files when asked, bit/s (`None`: no time at all).
    pub sender_hash_bps: Option<u64>,
    /// How fast the receiver hashes its existing files to decide, bit/s (`None`: no time).
    pub receiver_hash_bps: Option<u64>,
    /// How long the receiver takes to look at its file system for the whole manifest before
    /// it decides (the `stat`s, the part files' journals), on top of any hashing. Default:
    /// none.
    pub receiver_look: Duration,
    /// What goes wrong on the control path.
    pub faults: Vec<ControlFault>,
}

impl SessionScenario {
    /// `data`'s files (named `f0`, `f1`, ..., modified at [`MTIME_NS`]) offered to an empty
    /// directory on a receiver that takes every channel offered.
    pub fn new(data: Scenario) -> SessionScenario {
        let entries = data
            .files
            .iter()
            .enumerate()
            .map(|(i, &size)| SimEntry::file(&format!("f{i}"), size))
            .collect();
        SessionScenario {
            entries,
            disk: Disk::default(),
            checksum: false,
            max_channels: MAX_CHANNELS,
            rate_ceiling_bps: 0,
            sender_hash_bps: None,
            receiver_hash_bps: None,
            receiver_look: Duration::ZERO,
            faults: Vec::new(),
            data,
        }
    }

    /// Runs the session to its end. See [`Session::drive`].
    pub fn run(&self) -> Result<SessionOutcome, Failure> {
        Session::new(self.clone())?.drive()
    }
}

impl Default for SessionScenario {
    fn default() -> Self {
        SessionScenario::new(Scenario::default())
    }
}

/// Why one side ended a session.
#[derive(Debug)]
pub enum SideError {
    /// Its set-up machine failed.
    Setup(SetupError),
    /// A control frame did not parse.
    Frame(FrameError),
    /// The peer ended the session (`Abort`, or `Reject`: cause [`AbortCause::Failed`]).
    PeerAborted {
        /// Why, as the peer said.
        cause: AbortCause,
        /// The peer's words.
        reason: String,
    },
    /// The peer closed the control connection.
    PeerGone,
    /// A message the data phase does not take.
    Unexpected {
        /// What came.
        got: Box<Control>,
    },
    /// A data-phase message that breaks its rules (a NACK for an unknown channel, a file
    /// confirmed with a wrong hash, `Done` before every file is verified), or a block that
    /// keeps failing verification.
    Data(String),
    /// The receiver's `Agreed` is not the sender's (which its data would have to follow).
    Disagreed(String),
}

impl From<SetupError> for SideError {
    /// As the engine reports them: the peer's `Abort` or `Reject` in its own words.
    fn from(e: SetupError) -> Self {
        match e {
            SetupError::PeerAborted { cause, reason } => SideError::PeerAborted { cause, reason },
            other => SideError::Setup(other),
        }
    }
}

impl SideError {
    /// What this side tells its peer when it ends with this error (`None`: the peer knows).
    fn farewell(&self) -> Option<Control> {
        let cause = match self {
            SideError::PeerAborted { .. } | SideError::PeerGone => return None,
            SideError::Setup(SetupError::Incompatible { .. }) => {
                return Some(Control::Reject {
                    reason: self.to_string(),
                })
            }
            SideError::Setup(SetupError::Refused { .. }) => AbortCause::Refused,
            SideError::Setup(SetupError::Timeout(_)) => AbortCause::Network,
            _ => AbortCause::Failed,
        };
        Some(Control::Abort {
            cause,
            reason: self.to_string(),
        })
    }
}

impl fmt::Display for SideError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SideError::Setup(e) => write!(f, "set-up failed: {e}"),
            SideError::Frame(e) => write!(f, "{e}"),
            SideError::PeerAborted { cause, reason } => {
                write!(f, "the peer ended the session ({cause:?}): {reason}")
            }
            SideError::PeerGone => write!(f, "the peer closed the control connection"),
            SideError::Unexpected { got } => {
                write!(f, "unexpected {} during the data phase", got.name())
            }
            SideError::Data(reason) => write!(f, "data phase failed: {reason}"),
            SideError::Disagreed(what) => write!(f, "the two sides agreed differently: {what}"),
        }
    }
}

impl std::error::Error for SideError {}

/// How one side ended.
#[derive(Debug)]
pub enum End {
    /// Everything confirmed (sender: `Done` sent; receiver: `Done` read).
    Done,
    /// It failed.
    Failed(SideError),
}

/// When and how one side ended.
#[derive(Debug)]
pub struct SideEnd {
    /// Virtual time from time zero.
    pub at: Duration,
    /// How.
    pub end: End,
}

impl SideEnd {
    /// The error it ended with, if any.
    pub fn error(&self) -> Option<&SideError> {
        match &self.end {
            End::Done => None,
            End::Failed(e) => Some(e),
        }
    }
}

/// Virtual times of the phases of a session, from time zero (the sender's `Agree` and hello,
/// one round trip after its connect). `None`: not reached.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PhaseTimes {
    /// The hello reached the receiver (it answered with `HelloAck` at once).
    pub hello_at_receiver: Option<Duration>,
    /// The whole manifest had reached the receiver.
    pub manifest_at_receiver: Option<Duration>,
    /// The receiver sent `ManifestReply`.
    pub reply_sent: Option<Duration>,
    /// `HelloAck` reached the sender (its manifest and its early data left).
    pub hello_ack: Option<Duration>,
    /// `ManifestReply` reached the sender.
    pub manifest_reply: Option<Duration>,
    /// The sender had its outcome (its `Agreed` taken, `Skip` sent if asked for, the early
    /// data kept or dropped).
    pub sender_ready: Option<Duration>,
    /// The receiver had its outcome (at its decisions, or at `Skip`) and started its data
    /// phase: it reads datagrams from then on.
    pub receiver_ready: Option<Duration>,
    /// The first data datagram left the sender (early data included).
    pub first_data: Option<Duration>,
}

/// The sender's early data: what it sent under its provisional outcome before it knew the
/// real one (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EarlyData {
    /// When it started (the `HelloAck`), from time zero.
    pub from: Duration,
    /// New bytes it could send before its outcome: [`EARLY_RTTS`] times the round trip from
    /// its hello to the `HelloAck`, at its initial rate (the fixed
    /// [`Scenario::rate_bps`], or the rate controller's first rate), in bytes.
    pub budget: u64,
    /// Whether its outcome kept it ([`Agreed::early`]); `None` if the sender never had its
    /// outcome.
    pub kept: Option<bool>,
    /// What it sent until its outcome (or its end, without one). When not kept, all of it is
    /// wasted: the receiver drops whatever of it it reads (another session id), and the data
    /// phase's counts ([`SessionOutcome::data`]) do not include it.
    pub sent: EarlySent,
}

/// What became of one of the sender's files on the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileState {
    /// Nothing at its path, before or after.
    Absent,
    /// What was at its path is still there, untouched (a skipped file, or a session that
    /// failed before the file was complete).
    Kept,
    /// The session put the received file in place.
    Written,
}

/// One of the sender's files at the end, on the receiver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEnd {
    /// Its path.
    pub path: String,
    /// What became of it.
    pub state: FileState,
    /// The receiver's file at its path is the sender's, byte for byte.
    pub equals_source: bool,
}

/// What a session did, successful or not.
#[derive(Debug)]
pub struct SessionOutcome {
    /// How the sender ended.
    pub sender: SideEnd,
    /// How the receiver ended.
    pub receiver: SideEnd,
    /// When each phase happened.
    pub times: PhaseTimes,
    /// The receiver's answer to the hello, as the sender got it.
    pub accepted: Option<Accepted>,
    /// The hello as the receiver checked it.
    pub hello: Option<HelloParams>,
    /// The receiver's decisions, one per manifest entry.
    pub decisions: Vec<Decision>,
    /// The sender's outcome of the set-up.
    pub sender_agreed: Option<Agreed>,
    /// The receiver's outcome of the set-up.
    pub receiver_agreed: Option<Agreed>,
    /// File ids the sender hashed (asked by the receiver), in order.
    pub sender_hashed: Vec<u32>,
    /// Paths of existing files the receiver hashed to decide, in order.
    pub receiver_hashed: Vec<String>,
    /// `KeepAlive`s each side sent while busy: (sender, receiver).
    pub keepalives: (u64, u64),
    /// Messages sent toward the receiver, by kind (genuine ones: faults not counted).
    pub to_receiver: BTreeMap<&'static str, u64>,
    /// Messages sent toward the sender, by kind.
    pub to_sender: BTreeMap<&'static str, u64>,
    /// Each of the sender's files on the receiver, in file-id order.
    pub files: Vec<FileEnd>,
    /// The data phase's numbers, if the sender had its outcome (its times count from time
    /// zero; with early data kept, they include it).
    pub data: Option<Outcome>,
    /// The sender's early data, if it started.
    pub early: Option<EarlyData>,
    /// Block values of the early data (the hello's session id) that the receiver's set-up
    /// machine took before its outcome: kept for its data phase if the outcome keeps the
    /// early data ([`Outcome::early_values`]), dropped otherwise.
    pub values_in_setup: u64,
    /// Counters of the data link.
    pub link: LinkStats,
    /// Event-loop steps.
    pub steps: u64,
}

impl SessionOutcome {
    /// Both sides ended [`End::Done`].
    pub fn is_done(&self) -> bool {
        matches!(
            (&self.sender.end, &self.receiver.end),
            (End::Done, End::Done)
        )
    }

    /// The error `side` ended with, if any.
    pub fn error(&self, side: Side) -> Option<&SideError> {
        match side {
            Side::Sender => self.sender.error(),
            Side::Receiver => self.receiver.error(),
        }
    }

    /// Payload bytes of data datagrams the sender sent for file `file` (0 without data phase).
    pub fn payload_bytes(&self, file: usize) -> u64 {
        self.data
            .as_ref()
            .and_then(|d| d.file_payload_bytes.get(file).copied())
            .unwrap_or(0)
    }
}

impl fmt::Display for SessionOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let end = |e: &SideEnd| match &e.end {
            End::Done => format!("done at {:?}", e.at),
            End::Failed(err) => format!("failed at {:?}: {err}", e.at),
        };
        write!(
            f,
            "sender {}; receiver {}; {:?}",
            end(&self.sender),
            end(&self.receiver),
            self.times
        )?;
        if let Some(d) = &self.data {
            write!(f, "\n  data: {d}")?;
        }
        Ok(())
    }
}

/// Where a side is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Its set-up machine takes every message (the sender's early data may run meanwhile).
    Setup,
    /// The data phase of its outcome.
    Data,
    /// Ended.
    Ended,
}

/// What the receiver's file system has at a path, with the bytes.
#[derive(Debug, Clone)]
enum Item {
    File { bytes: Vec<u8>, mtime_ns: i64 },
    Other,
}

#[derive(Debug)]
struct SenderDriver {
    setup: SenderSetup,
    phase: Phase,
    /// `HelloAck` came: the engine's sender has its keys, the manifest goes.
    keys: bool,
    /// The provisional outcome its early data follows, while it does.
    provisional: Option<Agreed>,
    early: Option<EarlyData>,
    /// Hashes asked for: (done at, file id), in order.
    hashing: VecDeque<(Instant, u32)>,
    busy_until: Instant,
    next_keepalive: Option<Instant>,
    hashed: Vec<u32>,
    keepalives: u64,
    accepted: Option<Accepted>,
    agreed: Option<Agreed>,
    end: Option<SideEnd>,
}

#[derive(Debug)]
struct ReceiverDriver {
    /// From the hello on.
    setup: Option<ReceiverSetup>,
    limits: ReceiverLimits,
    /// The wait for the hello (the engine's key agreement keeps it).
    hello_deadline: Option<Instant>,
    phase: Phase,
    /// Decisions made, and when the hashing behind them is done.
    reply: Option<(Instant, Vec<Decision>)>,
    next_keepalive: Option<Instant>,
    hashed: Vec<String>,
    keepalives: u64,
    decisions: Vec<Decision>,
    agreed: Option<Agreed>,
    /// Block values of the hello's session its set-up machine took.
    values_in_setup: u64,
    /// Its data phase started (from its own outcome).
    data_started: bool,
    /// The agreements were compared (once both exist).
    compared: bool,
    end: Option<SideEnd>,
}

/// A whole session: both sides' set-up machines and drivers, then a [`Pair`]'s data phase, on
/// one virtual clock. See the module docs.
#[derive(Debug)]
pub struct Session {
    sc: SessionScenario,
    pair: Pair,
    /// The sender's manifest.
    entries: Vec<Entry>,
    /// The sender's bytes, by file id, and each file's path.
    src: Vec<Vec<u8>>,
    paths: Vec<String>,
    /// The receiver's file system before the session.
    disk: BTreeMap<String, Item>,
    /// Its part files' bytes (the file's length, held blocks in place, zeros elsewhere).
    parts: BTreeMap<String, Vec<u8>>,
    snd: SenderDriver,
    rcv: ReceiverDriver,
    times: PhaseTimes,
    hello: Option<HelloParams>,
}

/// How long hashing `bytes` takes at `bps` (no time without a rate).
fn hash_time(bytes: u64, bps: Option<u64>) -> Duration {
    match bps {
        Some(bps) if bps > 0 => {
            let nanos = (u128::from(bytes) * 8 * 1_000_000_000).div_ceil(u128::from(bps));
            Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
        }
        _ => Duration::ZERO,
    }
}

/// The sender's bytes of a file: seeded, with zeros in its holes.
fn source_bytes(seed: u64, id: usize, f: &SimFile, block_size: u64) -> Vec<u8> {
    let mut bytes = file_bytes(seed, id, f.size);
    for &(start, end) in &f.holes {
        let a = start.saturating_mul(block_size).min(f.size) as usize;
        let b = end.saturating_mul(block_size).min(f.size) as usize;
        if a < b {
            bytes[a..b].fill(0);
        }
    }
    bytes
}

impl Session {
    /// Both sides at time zero: the sender's hello is on its way (its manifest waits for the
    /// `HelloAck`).
    pub fn new(sc: SessionScenario) -> Result<Session, Failure> {
        let fail = |reason: String| Failure {
            at: Duration::ZERO,
            reason,
            state: String::new(),
        };
        check_knobs(&sc.data).map_err(fail)?;
        if !sc.data.held.is_empty() {
            return Err(fail(
                "a session's held blocks come from Disk::parts, not Scenario::held".into(),
            ));
        }
        let bs = sc.data.block_size;
        let mut entries = Vec::new();
        let mut src = Vec::new();
        let mut paths = Vec::new();
        for e in &sc.entries {
            match e {
                SimEntry::File(f) => {
                    src.push(source_bytes(sc.data.seed, src.len(), f, bs));
                    paths.push(f.path.clone());
                    entries.push(Entry {
                        path: f.path.clone(),
                        kind: EntryKind::File,
                        size: f.size,
                        mode: 0o644,
                        mtime_ns: f.mtime_ns,
                        holes: f.holes.clone(),
                        target: String::new(),
                    });
                }
                SimEntry::Dir(path) => entries.push(Entry {
                    path: path.clone(),
                    kind: EntryKind::Dir,
                    size: 0,
                    mode: 0o755,
                    mtime_ns: MTIME_NS,
                    holes: Vec::new(),
                    target: String::new(),
                }),
            }
        }
        let ids: HashMap<&str, usize> = paths
            .iter()
            .enumerate()
            .map(|(id, p)| (p.as_str(), id))
            .collect();
        let id_of = |path: &str| ids.get(path).copied();
        let mut disk = BTreeMap::new();
        for (path, on) in &sc.disk.files {
            let item = match *on {
                OnDisk::Copy { mtime_ns } => {
                    let id = id_of(path)
                        .ok_or_else(|| fail(format!("a copy of {path}, which is not offered")))?;
                    Item::File {
                        bytes: src[id].clone(),
                        mtime_ns,
                    }
                }
                OnDisk::Altered { len, mtime_ns } => {
                    let id = id_of(path).unwrap_or(paths.len());
                    let mut bytes = file_bytes(!sc.data.seed, id, len);
                    if src.get(id) == Some(&bytes) && !bytes.is_empty() {
                        bytes[0] ^= 1;
                    }
                    Item::File { bytes, mtime_ns }
                }
                OnDisk::NotAFile => Item::Other,
            };
            disk.insert(path.clone(), item);
        }
        let mut parts = BTreeMap::new();
        for (path, part) in &sc.disk.parts {
            let id = id_of(path)
                .ok_or_else(|| fail(format!("a part file of {path}, which is not offered")))?;
            let s = &src[id];
            let mut bytes = vec![0u8; s.len()];
            let blocks = (s.len() as u64).div_ceil(bs.max(1));
            for &(start, end) in &part.blocks {
                for b in start..end.min(blocks) {
                    let a = b.saturating_mul(bs).min(s.len() as u64) as usize;
                    let z = (b + 1).saturating_mul(bs).min(s.len() as u64) as usize;
                    bytes[a..z].copy_from_slice(&s[a..z]);
                }
            }
            for &b in &part.corrupt {
                if let Some(byte) = bytes.get_mut(b.saturating_mul(bs) as usize) {
                    *byte ^= 0x20;
                }
            }
            parts.insert(path.clone(), bytes);
        }
        let t0 = Instant::now();
        let delay = sc.data.control_delay.unwrap_or(sc.data.link.delay);
        let blackouts = sc.data.link.blackouts.clone();
        let faults_toward = |side: Side| {
            sc.faults
                .iter()
                .filter(|f| f.toward == side)
                .map(|f| (f.nth, f.fault.clone()))
                .collect()
        };
        let control = (
            ControlPath::new(t0, delay, blackouts.clone())
                .with_faults(faults_toward(Side::Receiver)),
            ControlPath::new(t0, delay, blackouts).with_faults(faults_toward(Side::Sender)),
        );
        // Nothing runs until each side starts: an empty layout stands in until then.
        let idle = DataPlan {
            layout: Layout::new(&[], MIN_BLOCK_SIZE, 1).map_err(|e| fail(e.to_string()))?,
            session: 0,
            snd_files: Vec::new(),
            rcv_files: Vec::new(),
            held: vec![Vec::new()],
        };
        let mut pair = Pair::build(sc.data.clone(), idle, t0, control, false).map_err(fail)?;
        let params = SenderParams {
            channels: sc.data.channels,
            payload: sc.data.payload,
            block_size: bs,
            session: session_id(sc.data.seed),
            tcp: false,
            // The move of channels to TCP is the engine's (it needs TCP data connections,
            // which are not modelled here).
            race: false,
            checksum: sc.checksum,
        };
        let setup = SenderSetup::new(params, entries.clone(), t0);
        // Time zero: the hello, in the clear behind the key agreement's `Agree`.
        pair.to_receiver.send(t0, &setup.hello());
        let snd = SenderDriver {
            setup,
            phase: Phase::Setup,
            keys: false,
            provisional: None,
            early: None,
            hashing: VecDeque::new(),
            busy_until: t0,
            next_keepalive: None,
            hashed: Vec::new(),
            keepalives: 0,
            accepted: None,
            agreed: None,
            end: None,
        };
        let rcv = ReceiverDriver {
            setup: None,
            limits: ReceiverLimits {
                max_channels: sc.max_channels,
            },
            hello_deadline: Some(t0 + SETUP_TIMEOUT),
            phase: Phase::Setup,
            reply: None,
            next_keepalive: None,
            hashed: Vec::new(),
            keepalives: 0,
            decisions: Vec::new(),
            agreed: None,
            values_in_setup: 0,
            data_started: false,
            compared: false,
            end: None,
        };
        Ok(Session {
            sc,
            pair,
            entries,
            src,
            paths,
            disk,
            parts,
            snd,
            rcv,
            times: PhaseTimes::default(),
            hello: None,
        })
    }

    /// The sender's manifest.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Virtual time elapsed.
    pub fn elapsed(&self) -> Duration {
        self.pair.now - self.pair.t0
    }

    /// The data phase's runner (its layout, the receiver's, is an empty stand-in until the
    /// receiver starts its data phase).
    pub fn pair(&self) -> &Pair {
        &self.pair
    }

    /// Runs steps until both sides ended, then checks what the receiver has (see the module
    /// docs).
    pub fn drive(mut self) -> Result<SessionOutcome, Failure> {
        while !self.step()? {}
        self.finish()
    }

    /// Handles everything due at the current virtual time, then advances the clock. Returns
    /// true once both sides ended.
    pub fn step(&mut self) -> Result<bool, Failure> {
        if self.pair.finished.is_some() {
            return Ok(true);
        }
        self.pair.steps += 1;
        let now = self.pair.now;
        self.pair.apply_rate_changes(now);
        self.receiver_turn(now)?;
        self.sender_turn(now)?;
        if self.snd.end.is_some() && self.rcv.end.is_some() {
            self.pair.finished = Some(now);
            return Ok(true);
        }
        let extra = self.next_deadline();
        self.pair.advance(now, extra)?;
        Ok(false)
    }

    /// The drivers' own deadlines: the wait for the hello, the set-up machines' timeouts,
    /// hashing, keep-alives.
    fn next_deadline(&self) -> Option<Instant> {
        let mut all = Vec::new();
        if matches!(self.snd.phase, Phase::Setup) {
            all.push(self.snd.setup.poll_timeout());
            all.push(self.snd.hashing.front().map(|&(at, _)| at));
            all.push(self.snd.next_keepalive);
        }
        if matches!(self.rcv.phase, Phase::Setup) {
            all.push(self.rcv.hello_deadline);
            all.push(self.rcv.setup.as_ref().and_then(|s| s.poll_timeout()));
            all.push(self.rcv.reply.as_ref().map(|(at, _)| *at));
            all.push(self.rcv.next_keepalive);
        }
        all.into_iter().flatten().min()
    }

    fn rel(&self, now: Instant) -> Duration {
        now - self.pair.t0
    }

    // ----- receiver -----

    fn receiver_turn(&mut self, now: Instant) -> Result<(), Failure> {
        if self.rcv.end.is_some() {
            // Closed: whatever still arrives is not read.
            while self.pair.to_receiver.poll(now).is_some() {}
            self.pair.to_receiver.poll_closed(now);
            return Ok(());
        }
        let reading = self.rcv.phase == Phase::Data;
        if reading {
            self.pair
                .receiver_datagrams(now)
                .map_err(|r| self.pair.failure(r))?;
        }
        while self.rcv.end.is_none() {
            let Some(item) = self.pair.to_receiver.poll(now) else {
                break;
            };
            let result = match item {
                Err(e) => Err(SideError::Frame(e)),
                Ok(msg) => self.receiver_message(now, msg),
            };
            self.flush_receiver(now);
            if let Err(e) = result {
                self.end_receiver(now, End::Failed(e));
            }
        }
        if self.rcv.end.is_none() && self.pair.to_receiver.poll_closed(now) {
            self.end_receiver(now, End::Failed(SideError::PeerGone));
        }
        if self.rcv.end.is_none() && self.rcv.phase == Phase::Setup {
            let result = self.receiver_work(now);
            self.flush_receiver(now);
            if let Err(e) = result {
                self.end_receiver(now, End::Failed(e));
            }
        }
        if self.rcv.end.is_none() && self.rcv.phase == Phase::Setup {
            let timed_out = match &mut self.rcv.setup {
                Some(setup) => setup.handle_timeout(now).err(),
                None => self
                    .rcv
                    .hello_deadline
                    .filter(|&d| now >= d)
                    .map(|_| SetupError::Timeout(SETUP_TIMEOUT)),
            };
            if let Some(e) = timed_out {
                self.end_receiver(now, End::Failed(e.into()));
            }
        }
        if self.rcv.end.is_none() && self.rcv.phase == Phase::Data {
            if !reading {
                // Datagrams that waited for the receiver to be ready are read now.
                self.pair
                    .receiver_datagrams(now)
                    .map_err(|r| self.pair.failure(r))?;
            }
            if let Err(e) = self.pair.receiver_timers(now) {
                self.end_receiver(now, End::Failed(data_failure(e)));
            } else if let Err(e) = self.pair.receiver_outputs(now) {
                self.end_receiver(now, End::Failed(SideError::Data(e)));
            }
        }
        Ok(())
    }

    fn flush_receiver(&mut self, now: Instant) {
        let Some(setup) = &mut self.rcv.setup else {
            return;
        };
        while let Some(m) = setup.poll_transmit() {
            self.pair.to_sender.send(now, &m);
        }
    }

    fn receiver_message(&mut self, now: Instant, msg: Control) -> Result<(), SideError> {
        match self.rcv.phase {
            Phase::Setup => match &mut self.rcv.setup {
                Some(setup) => {
                    // The early data's block values, at any time: the machine keeps or drops
                    // them.
                    let values = match &msg {
                        Control::BlockHashes { session, blocks }
                            if *session == setup.hello().session =>
                        {
                            blocks.len() as u64
                        }
                        _ => 0,
                    };
                    setup.handle(msg, now)?;
                    self.rcv.values_in_setup += values;
                    self.receiver_events(now)
                }
                None => self.receiver_hello(now, msg),
            },
            Phase::Data => match self.pair.on_receiver_control(now, msg) {
                Ok(false) => Ok(()),
                // The sender is done and every file is in place.
                Ok(true) => {
                    self.end_receiver(now, End::Done);
                    Ok(())
                }
                Err(e) => Err(data_failure(e)),
            },
            Phase::Ended => Ok(()),
        }
    }

    /// The first message, read with the key agreement: the hello. A good one starts the
    /// set-up, and the data path opens at once (`HelloAck`).
    fn receiver_hello(&mut self, now: Instant, msg: Control) -> Result<(), SideError> {
        let h = check_hello(msg, &self.rcv.limits)?;
        self.rcv.hello_deadline = None;
        self.times.hello_at_receiver = Some(self.rel(now));
        self.hello = Some(h);
        let mut setup = ReceiverSetup::new(h, now);
        let ports = (0..h.channels).map(|c| FIRST_PORT + c).collect();
        let intake = Intake {
            ceiling_bps: self.sc.rate_ceiling_bps,
            ..Intake::default()
        };
        let result = setup.accept(ports, None, intake, now);
        self.rcv.setup = Some(setup);
        result?;
        self.receiver_events(now)
    }

    fn receiver_events(&mut self, now: Instant) -> Result<(), SideError> {
        loop {
            let Some(ev) = self.rcv.setup.as_mut().and_then(|s| s.poll_event()) else {
                return Ok(());
            };
            match ev {
                ReceiverEvent::Manifest => {
                    self.times.manifest_at_receiver = Some(self.rel(now));
                    let (decisions, hashed_bytes) = self.decide();
                    let at = now
                        + self.sc.receiver_look
                        + hash_time(hashed_bytes, self.sc.receiver_hash_bps);
                    if at > now {
                        self.rcv.next_keepalive = Some(now + BUSY_KEEPALIVE);
                    }
                    self.rcv.reply = Some((at, decisions));
                    self.receiver_work(now)?;
                }
                ReceiverEvent::Ready => self.receiver_ready(now)?,
            }
        }
    }

    /// The receiver has its outcome at `now`: its data phase starts from it.
    fn receiver_ready(&mut self, now: Instant) -> Result<(), SideError> {
        self.times.receiver_ready = Some(self.rel(now));
        let agreed = self
            .rcv
            .setup
            .as_mut()
            .and_then(|s| s.agreed())
            .ok_or_else(|| SideError::Data("ready without an outcome".into()))?;
        let plan = self.plan(&agreed);
        self.rcv.agreed = Some(agreed);
        self.compare_agreed()?;
        // The engine's receiver takes the round trip it measured; this one the scenario's
        // (only used with rate control).
        let pace = self
            .sc
            .data
            .report_pace()
            .unwrap_or(ReportPace::new(Duration::ZERO, false));
        // Early data its outcome did not keep (the hello's session id) is told apart.
        let early = self.hello.map_or(0, |h| h.session);
        // The early data's block values that came meanwhile, if its outcome keeps it.
        let values = self
            .rcv
            .setup
            .as_mut()
            .map(ReceiverSetup::early_values)
            .unwrap_or_default();
        self.pair
            .receiver_starts(plan, now, (pace, early), values)
            .map_err(SideError::Data)?;
        self.rcv.data_started = true;
        self.rcv.phase = Phase::Data;
        Ok(())
    }

    /// The receiver's decision for every entry, from its file system; and the bytes of
    /// existing files it hashed to make them.
    fn decide(&mut self) -> (Vec<Decision>, u64) {
        let checksum = self.hello.is_some_and(|h| h.checksum);
        let overwrite = self.sc.disk.overwrite;
        let mut hashed = 0;
        let entries = self.rcv.setup.as_ref().map_or(&[][..], |s| s.entries());
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            let found = match self.disk.get(&e.path) {
                None => Found::Nothing,
                Some(Item::File { bytes, mtime_ns }) => Found::File {
                    len: bytes.len() as u64,
                    mtime_ns: *mtime_ns,
                },
                Some(Item::Other) => Found::Other,
            };
            out.push(match first_look(e, found, checksum, overwrite) {
                Look::Decided(d) => d,
                Look::HashExisting { replace_ok } => {
                    let bytes = match self.disk.get(&e.path) {
                        Some(Item::File { bytes, .. }) => &bytes[..],
                        _ => &[][..],
                    };
                    hashed += bytes.len() as u64;
                    self.rcv.hashed.push(e.path.clone());
                    Look::with_hash(replace_ok, *blake3::hash(bytes).as_bytes())
                }
                Look::LookForPart => {
                    Look::with_part(self.sc.disk.parts.get(&e.path).map(|p| p.blocks.clone()))
                }
            });
        }
        (out, hashed)
    }

    /// The receiver's own work due at `now`: its reply once hashing is done, keep-alives
    /// until then.
    fn receiver_work(&mut self, now: Instant) -> Result<(), SideError> {
        if self.rcv.reply.as_ref().is_some_and(|(at, _)| *at <= now) {
            let Some((_, decisions)) = self.rcv.reply.take() else {
                return Ok(());
            };
            self.rcv.next_keepalive = None;
            self.rcv.decisions = decisions.clone();
            self.times.reply_sent = Some(self.rel(now));
            self.rcv
                .setup
                .as_mut()
                .ok_or_else(|| SideError::Data("decisions before the hello".into()))?
                .reply(decisions, now)?;
            // Its outcome, at once when nothing is offered for hashing (after slow work too,
            // with no message of the sender's to come and wake it).
            self.receiver_events(now)?;
        }
        if let Some(at) = self.rcv.next_keepalive.filter(|&at| at <= now) {
            self.pair.to_sender.send(now, &Control::KeepAlive);
            self.rcv.keepalives += 1;
            self.rcv.next_keepalive = Some(at + BUSY_KEEPALIVE);
        }
        Ok(())
    }

    fn end_receiver(&mut self, now: Instant, end: End) {
        self.flush_receiver(now);
        if let End::Failed(e) = &end {
            if let Some(m) = e.farewell() {
                self.pair.to_sender.send(now, &m);
            }
        }
        self.pair.to_sender.close(now);
        self.pair.rcv_reading = false;
        self.rcv.phase = Phase::Ended;
        self.rcv.end = Some(SideEnd {
            at: self.rel(now),
            end,
        });
    }

    /// Once both sides have their `Agreed`: the receiver's must be the sender's (a check of
    /// the simulator's: neither side sees the other's).
    fn compare_agreed(&mut self) -> Result<(), SideError> {
        let (Some(s), Some(r)) = (&self.snd.agreed, &self.rcv.agreed) else {
            return Ok(());
        };
        if self.rcv.compared {
            return Ok(());
        }
        self.rcv.compared = true;
        let differs = [
            ("channels", s.channels != r.channels),
            ("block size", s.block_size != r.block_size),
            ("session", s.session != r.session),
            ("skips", s.skips != r.skips),
            ("resumed blocks", s.resumed != r.resumed),
            ("layout", s.layout != r.layout),
            ("held stripes", s.held != r.held),
            ("bytes sent", s.sent_bytes != r.sent_bytes),
            ("early data kept", s.early != r.early),
        ];
        match differs.iter().find(|(_, d)| *d) {
            Some((what, _)) => Err(SideError::Disagreed(format!(
                "{what} (sender {} channels, receiver {})",
                s.channels, r.channels
            ))),
            None => Ok(()),
        }
    }

    // ----- sender -----

    fn sender_turn(&mut self, now: Instant) -> Result<(), Failure> {
        if self.snd.end.is_some() {
            while self.pair.to_sender.poll(now).is_some() {}
            self.pair.to_sender.poll_closed(now);
            return Ok(());
        }
        while self.snd.end.is_none() {
            let Some(item) = self.pair.to_sender.poll(now) else {
                break;
            };
            let result = match item {
                Err(e) => Err(SideError::Frame(e)),
                Ok(msg) => self.sender_message(now, msg),
            };
            if let Err(e) = result {
                self.end_sender(now, End::Failed(e));
            }
        }
        if self.snd.end.is_none() && self.pair.to_sender.poll_closed(now) {
            self.end_sender(now, End::Failed(SideError::PeerGone));
        }
        if self.snd.end.is_none() && self.snd.phase == Phase::Setup {
            if let Err(e) = self.sender_work(now) {
                self.end_sender(now, End::Failed(e));
            }
        }
        if self.snd.end.is_none() && self.snd.phase == Phase::Setup {
            if let Some(deadline) = self.snd.setup.poll_timeout() {
                if now >= deadline {
                    if let Err(e) = self.snd.setup.handle_timeout(now) {
                        self.end_sender(now, End::Failed(e.into()));
                    }
                }
            }
        }
        if self.snd.end.is_none() {
            self.flush_sender(now);
        }
        if self.snd.end.is_none() && self.snd.phase == Phase::Data {
            if let Err(e) = self.pair.sender_timers(now) {
                self.end_sender(now, End::Failed(data_failure(e)));
            }
        }
        let early = self.snd.provisional.is_some();
        if self.snd.end.is_none() && (self.snd.phase == Phase::Data || early) {
            self.pair
                .sender_data(now)
                .map_err(|r| self.pair.failure(r))?;
            if self.times.first_data.is_none() {
                self.times.first_data = self.pair.first_data();
            }
        }
        if self.snd.end.is_none() && self.snd.phase == Phase::Data {
            let snd = &self.pair.snd;
            if snd.channels.iter().all(|c| c.is_done()) && snd.data.is_done() {
                self.pair.to_receiver.send(now, &Control::Done);
                self.end_sender(now, End::Done);
            }
        }
        Ok(())
    }

    /// Sends what the set-up machine queued, once the sender has its keys (the `HelloAck`).
    fn flush_sender(&mut self, now: Instant) {
        if !self.snd.keys {
            return;
        }
        while let Some(m) = self.snd.setup.poll_transmit() {
            self.pair.to_receiver.send(now, &m);
        }
    }

    fn sender_message(&mut self, now: Instant, msg: Control) -> Result<(), SideError> {
        match self.snd.phase {
            Phase::Setup => {
                if matches!(msg, Control::ManifestReply { .. }) {
                    self.times.manifest_reply.get_or_insert(self.rel(now));
                }
                self.snd.setup.handle(msg, now)?;
                self.sender_events(now)
            }
            Phase::Data => self.pair.on_sender_control(now, msg).map_err(data_failure),
            Phase::Ended => Ok(()),
        }
    }

    fn sender_events(&mut self, now: Instant) -> Result<(), SideError> {
        while let Some(ev) = self.snd.setup.poll_event() {
            match ev {
                SenderEvent::Accepted(a) => self.sender_accepted(now, a)?,
                // This driver does not probe.
                SenderEvent::ProbeAck { .. } => {}
                SenderEvent::HashWanted { file } => {
                    let size = self.src.get(file as usize).map_or(0, |s| s.len() as u64);
                    let at =
                        self.snd.busy_until.max(now) + hash_time(size, self.sc.sender_hash_bps);
                    self.snd.busy_until = at;
                    if at > now && self.snd.next_keepalive.is_none() {
                        self.snd.next_keepalive = Some(now + BUSY_KEEPALIVE);
                    }
                    self.snd.hashing.push_back((at, file));
                }
                SenderEvent::Ready => self.sender_ready(now)?,
            }
        }
        Ok(())
    }

    /// The sender's own work due at `now`: hashes done, keep-alives while hashing.
    fn sender_work(&mut self, now: Instant) -> Result<(), SideError> {
        while let Some(&(at, file)) = self.snd.hashing.front() {
            if at > now {
                break;
            }
            self.snd.hashing.pop_front();
            self.snd.hashed.push(file);
            let hash =
                *blake3::hash(self.src.get(file as usize).map_or(&[][..], |s| &s[..])).as_bytes();
            self.snd.setup.hashed(file, hash)?;
            self.sender_events(now)?;
        }
        if self.snd.hashing.is_empty() {
            self.snd.next_keepalive = None;
        }
        if let Some(at) = self.snd.next_keepalive.filter(|&at| at <= now) {
            self.pair.to_receiver.send(now, &Control::KeepAlive);
            self.snd.keepalives += 1;
            self.snd.next_keepalive = Some(at + BUSY_KEEPALIVE);
        }
        Ok(())
    }

    /// The receiver's `HelloAck` (with the agreement's answer: the keys) at `now`: the
    /// manifest goes, and the early data starts under the provisional outcome.
    fn sender_accepted(&mut self, now: Instant, accepted: Accepted) -> Result<(), SideError> {
        self.times.hello_ack = Some(self.rel(now));
        self.snd.keys = true;
        self.pair.sc.payload = self.sc.data.payload.min(accepted.max_payload).max(1);
        self.snd.accepted = Some(accepted);
        let provisional =
            self.snd.setup.provisional().ok_or_else(|| {
                SideError::Data("accepted without a provisional outcome".into())
            })??;
        // The round trip it measured: its hello to the `HelloAck`.
        let rtt = self.rel(now);
        let rate_bps = match self.sc.data.controller(now) {
            Some(c) => c.rate_bps(),
            None => self.sc.data.rate_bps,
        };
        let budget = u128::from(rate_bps) * rtt.as_nanos() * u128::from(EARLY_RTTS) / 8_000_000_000;
        let budget = u64::try_from(budget).unwrap_or(u64::MAX);
        let plan = self.plan(&provisional);
        self.pair
            .sender_begins(plan, now, Some(budget))
            .map_err(SideError::Data)?;
        self.snd.provisional = Some(provisional);
        self.snd.early = Some(EarlyData {
            from: self.rel(now),
            budget,
            kept: None,
            sent: EarlySent::default(),
        });
        Ok(())
    }

    /// The sender's set-up is done at `now`: `Skip` goes out if the receiver asked for hashes,
    /// and its outcome becomes the data phase: the early data's if it is the provisional one,
    /// a new one otherwise.
    fn sender_ready(&mut self, now: Instant) -> Result<(), SideError> {
        let agreed = self
            .snd
            .setup
            .agreed()
            .ok_or_else(|| SideError::Data("ready without an outcome".into()))?;
        self.times.sender_ready = Some(self.rel(now));
        // `Skip` before any block value.
        self.flush_sender(now);
        let provisional = self.snd.provisional.take();
        let sent = self.pair.early_sent();
        match provisional {
            Some(p) if agreed.early => {
                if p != agreed {
                    return Err(SideError::Data(
                        "an early outcome that is not the provisional one".into(),
                    ));
                }
                self.pair.early_kept(now);
            }
            Some(_) => {
                let plan = self.plan(&agreed);
                self.pair
                    .sender_restarts(plan, now)
                    .map_err(SideError::Data)?;
            }
            None => {
                let plan = self.plan(&agreed);
                self.pair
                    .sender_begins(plan, now, None)
                    .map_err(SideError::Data)?;
            }
        }
        if let Some(e) = &mut self.snd.early {
            e.kept = Some(agreed.early);
            e.sent = sent;
        }
        self.snd.phase = Phase::Data;
        self.snd.agreed = Some(agreed);
        // The receiver usually has its outcome first: compared now.
        if let Err(e) = self.compare_agreed() {
            if self.rcv.end.is_none() {
                self.end_receiver(now, End::Failed(e));
            }
        }
        Ok(())
    }

    /// The data phase of an outcome: the sender's bytes of the files it sends, the receiver's
    /// starting copy of each (its part file, or zeros), and the stripes both hold.
    fn plan(&self, agreed: &Agreed) -> DataPlan {
        let mut snd_files = Vec::with_capacity(agreed.skips.len());
        let mut rcv_files = Vec::with_capacity(agreed.skips.len());
        for (id, skip) in agreed.skips.iter().enumerate() {
            if skip.is_skipped() {
                snd_files.push(Vec::new());
                rcv_files.push(Vec::new());
                continue;
            }
            let src = self.src.get(id).cloned().unwrap_or_default();
            let resumed = agreed.resumed.get(id).is_some_and(|r| !r.is_empty());
            let part = self
                .paths
                .get(id)
                .and_then(|p| self.parts.get(p))
                .filter(|_| resumed)
                .cloned();
            rcv_files.push(part.unwrap_or_else(|| vec![0; src.len()]));
            snd_files.push(src);
        }
        DataPlan {
            layout: agreed.layout.clone(),
            session: agreed.session,
            snd_files,
            rcv_files,
            held: agreed.held.stripes.clone(),
        }
    }

    fn end_sender(&mut self, now: Instant, end: End) {
        self.flush_sender(now);
        if let End::Failed(e) = &end {
            if let Some(m) = e.farewell() {
                self.pair.to_receiver.send(now, &m);
            }
        }
        self.pair.to_receiver.close(now);
        self.pair.snd_sending = false;
        self.snd.phase = Phase::Ended;
        self.snd.end = Some(SideEnd {
            at: self.rel(now),
            end,
        });
    }

    // ----- end -----

    /// What the receiver has at the end, checked; and the outcome.
    fn finish(mut self) -> Result<SessionOutcome, Failure> {
        let started = self.rcv.data_started;
        // What the receiver skipped (it writes nothing of those), and what the sender did.
        let rcv_skips = self.rcv.agreed.as_ref().map(|a| a.skips.clone());
        let skips = self.snd.agreed.as_ref().map(|a| a.skips.clone());
        let mut files_end = Vec::with_capacity(self.src.len());
        for (id, path) in self.paths.iter().enumerate() {
            let before = match self.disk.get(path) {
                Some(Item::File { bytes, .. }) => Some(&bytes[..]),
                _ => None,
            };
            let skipped = rcv_skips
                .as_ref()
                .and_then(|s| s.get(id))
                .is_some_and(|s| s.is_skipped());
            // A file the receiver verified is in place; anything else is as it was.
            let written = started
                && !skipped
                && self
                    .pair
                    .rcv
                    .data
                    .committed()
                    .get(id)
                    .is_some_and(Option::is_some);
            let (state, now_there) = if written {
                (FileState::Written, Some(&self.pair.rcv.files[id][..]))
            } else if self.disk.contains_key(path) {
                (FileState::Kept, before)
            } else {
                (FileState::Absent, None)
            };
            let equals_source = now_there == Some(&self.src[id][..]);
            if state == FileState::Written && !equals_source {
                return Err(self.pair.failure(format!(
                    "the receiver put {path} in place with bytes that are not the sender's"
                )));
            }
            files_end.push(FileEnd {
                path: path.clone(),
                state,
                equals_source,
            });
        }
        let (Some(sender), Some(receiver)) = (self.snd.end.take(), self.rcv.end.take()) else {
            return Err(self.pair.failure("a side did not end".into()));
        };
        let done = matches!((&sender.end, &receiver.end), (End::Done, End::Done));
        if done {
            self.pair.check_exact()?;
            let skips = skips.unwrap_or_default();
            for ((f, skip), id) in files_end.iter().zip(&skips).zip(0..) {
                let ok = match skip {
                    Skipped::No => f.state == FileState::Written && f.equals_source,
                    Skipped::Same(hash) => {
                        f.state == FileState::Kept
                            && f.equals_source
                            && *hash == *blake3::hash(&self.src[id]).as_bytes()
                    }
                    Skipped::Unchecked => f.state == FileState::Kept,
                };
                if !ok {
                    return Err(self.pair.failure(format!(
                        "{} ({skip:?}) ends {:?}, equal to the source: {}",
                        f.path, f.state, f.equals_source
                    )));
                }
            }
        }
        let data = self.snd.agreed.is_some().then(|| self.pair.outcome());
        let mut early = self.snd.early.take();
        if let Some(e) = early.as_mut().filter(|e| e.kept.is_none()) {
            // No outcome: all it sent was early.
            e.sent = self.pair.early_sent();
        }
        Ok(SessionOutcome {
            sender,
            receiver,
            times: self.times,
            accepted: self.snd.accepted,
            hello: self.hello,
            decisions: self.rcv.decisions,
            sender_agreed: self.snd.agreed,
            receiver_agreed: self.rcv.agreed,
            sender_hashed: self.snd.hashed,
            receiver_hashed: self.rcv.hashed,
            keepalives: (self.snd.keepalives, self.rcv.keepalives),
            to_receiver: self.pair.to_receiver.by_kind.clone(),
            to_sender: self.pair.to_sender.by_kind.clone(),
            files: files_end,
            data,
            early,
            values_in_setup: self.rcv.values_in_setup,
            link: *self.pair.link.stats(),
            steps: self.pair.steps,
        })
    }
}

/// A data-phase message a side does not take: the peer's farewell in its own words, or
/// unexpected.
/// A data phase's failure, as a side's error: the peer's words where it sent them.
fn data_failure(e: DataFailure) -> SideError {
    match e {
        DataFailure::Rule(DataError::Unexpected(msg)) => peer_words(*msg),
        other => SideError::Data(other.to_string()),
    }
}

fn peer_words(msg: Control) -> SideError {
    match msg {
        Control::Abort { cause, reason } => SideError::PeerAborted { cause, reason },
        Control::Reject { reason } => SideError::PeerAborted {
            cause: AbortCause::Failed,
            reason,
        },
        other => SideError::Unexpected {
            got: Box::new(other),
        },
    }
}
