//! The receiver's front door: accepting control connections and greeting them, so that a
//! stranger cannot stop or stall a waiting receiver.
//!
//! This module owns everything between `accept` and the session: a thread that accepts on the
//! receiver's listener ([`FrontDoor`]), and the *greeting* of each connection ([`greet`]), the
//! step before the session that tells a hurtle sender from a stranger. Each greeting runs in a
//! thread of its own under a grace deadline ([`GREETING_GRACE`], like OpenSSH's
//! `LoginGraceTime`; [`SILENT_GRACE`] for a connection that has not sent a byte), and at most
//! [`MAX_UNGREETED`] run at once (like `MaxStartups`), at most [`MAX_PER_SOURCE`] of them from
//! one source (an IPv4 address, an IPv6 /64). A connection beyond either bound is told the
//! receiver is busy (a `Reject` starting with [`BUSY`], which a sender reports as
//! [`SessionError::Busy`]) and closed at once, by the accepting thread, without waiting.
//!
//! Why a bound per source rather than OpenSSH's random early drop: with random early drop, one
//! address that renews its connections as fast as they close keeps most of the slots and turns
//! most real senders away by chance; with a bound, it holds a quarter of the door and every
//! other source finds room. Many honest senders behind one NAT share one source's slots, but a
//! greeting lasts one round trip, so eight serve them unless nine arrive within one round trip,
//! and the ninth is told to try again. Failing to `accept` (out of descriptors, say) never ends
//! the receiver: it is logged once per streak and tried again after a pause; the soft limit on
//! descriptors is raised to the hard one when the door opens.
//!
//! A connection whose greeting fails is a *stray*
//! ([`Stray`]): garbage, an HTTP request, a length prefix no hello has, a frame that does not
//! decode, a first message other than a hello, a hello without hurtle's magic, silence past
//! the deadline, or a close. It is closed, counted ([`FrontDoor::take_strays`]) and logged
//! (`tracing`, target `hurtle_engine::receive::accept`, with the peer's address and the
//! reason), and nobody else notices it. A flood of strays is not a flood of lines: the first
//! few of a window get a line each, the rest one summary line per window ([`StrayLog`], in
//! `stray_log.rs`; a thread of the door says the summary when the window ends); a wrong code
//! always gets its line.
//!
//! A connection that closes (or resets) before sending a byte is taken quietly: closed like a
//! stray, but not counted, and logged at `debug` only, which the CLI does not print. That is
//! what a sender's losing connect attempt looks like ([`crate::net::dial`]: when its first
//! connect is slow the sender starts another, and closes whichever loses); it can arrive
//! before the winner or while the winner's session runs, and disturbs neither (nothing is
//! handed to a session, nothing counted in its summary). A port scanner's connect looks the
//! same, and is as harmless.
//!
//! A greeted connection ([`Arrival`]: the stream and the hello already read from it) is handed
//! to the session in the order the greetings completed, so a silent connection never delays a
//! real sender. A hello of another protocol version is a hurtle peer, not a stranger: it is
//! greeted, and the session answers it with `Reject`, as before.
//!
//! Sessions themselves still run one at a time (`Receiver::accept_one`): under `--serve`, a
//! sender greeted while another's transfer runs waits in the queue for it to end. Greetings go
//! on meanwhile, so strays are dropped during a transfer too.
//!
//! The greeting is the key agreement ([`crate::handshake`]): the first frame must be the sender's
//! `Agree`, and the second its hello (in the clear, bound into the keys); the receiver answers
//! with a key from its [`Keyring`] (a try of the code charged to the code's budget first) and,
//! sealed in the same flight, the hello's `HelloAck`, with the ports of the data path the
//! receiver opened ahead of any connection, lent to this greeting ([`super::data_path`]); the
//! sender's first sealed frame (the manifest's first part) must then open, and the session
//! keeps what was lent. A greeting that fails gives it back: a peer that has not proven the key
//! gets no socket, listener or file of its own. A greeting that finds that set taken (by an
//! overlapping greeting, or a session) answers the hello only once the sender's first sealed
//! frame opened, with a data path opened then. Whatever fails before
//! the peer is authenticated is a stray and ignored: a stranger, a peer of another protocol
//! version (answered with a `Reject` saying so), a sender with a key this receiver does not
//! know, or one with the wrong code. At most [`CODE_TRIES`] wrong codes are ever answered
//! (however many come at once, or are held open after the answer); the [`CODE_TRIES`]th
//! failure spends the code, and the receiver ends ([`SessionError::CodeSpent`]). Whatever
//! fails after the agreement is the session's error. [`greet`] is the one place that decides.

mod stray_log;

pub use stray_log::{LogLine, StrayKind, StrayLog, STRAY_LOG_BURST, STRAY_LOG_WINDOW};

use super::data_path::{DataDoor, Lent, Opened};
use crate::error::SessionError;
use crate::handshake::{self, Keyring, BUSY, CODE_TRIES};
use hurtle_proto::secure::FrameSeal;
use hurtle_proto::session::check_hello;
use hurtle_proto::wire::{self, Control};
use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a new connection has to send its hello before it is dropped as a stray (a real
/// sender sends it as soon as it has connected).
pub const GREETING_GRACE: Duration = Duration::from_secs(5);

/// How long a new connection may stay without sending a byte before it is dropped: a sender
/// sends its offer in the same flight as its connect's last packet.
pub const SILENT_GRACE: Duration = Duration::from_secs(3);

/// How many connections may be in their greeting at once; one more is told the receiver is
/// busy and closed at once.
pub const MAX_UNGREETED: usize = 32;

/// How many of the [`MAX_UNGREETED`] greetings one source may hold at once (an IPv4 address,
/// or an IPv6 /64: what one host or one NAT has); one more from it is told the receiver is busy
/// and closed at once, so that no single source can hold the door.
pub const MAX_PER_SOURCE: usize = MAX_UNGREETED / 4;

/// The longest first frame read: a hello is some 30 bytes, and a stranger's length prefix must
/// not make the receiver hold megabytes for each of [`MAX_UNGREETED`] connections.
pub const MAX_HELLO_FRAME: usize = 64 << 10;

/// How many of a stray's first bytes are kept to show in the log.
const GLIMPSE: usize = 40;

/// What a successful greeting established: the key agreement's [`Accepted`](handshake::Accepted)
/// (the session's keys, the sender's hello, and the name of the key it used).
pub use crate::handshake::Accepted as Greeted;

/// What the greeting checks senders against.
#[derive(Debug, Clone)]
pub struct Gatekeeper {
    /// The code and keys a sender may use.
    pub keys: Keyring,
    /// This receiver asks for data in the clear (`--no-encryption`).
    pub plain_data: bool,
    /// The data path opened ahead, lent to a greeting to answer its hello in the agreement's
    /// flight (or opened for a proven sender when that set is taken).
    pub data: DataDoor,
}

/// A greeted connection, ready for a session.
#[derive(Debug)]
pub struct Arrival {
    /// The control connection; what follows the sender's first sealed frame is still unread
    /// in it.
    pub stream: TcpStream,
    /// The peer's address.
    pub peer: SocketAddr,
    /// What the greeting established.
    pub greeted: Greeted,
    /// The data path opened for its hello, and the set-up that answered it.
    pub opened: Opened,
}

/// Why a connection was dropped before its greeting completed: it is not a hurtle peer, or not
/// one that spoke in time.
#[derive(Debug)]
pub enum Stray {
    /// Closed before a whole hello arrived; `got` bytes of it did.
    Closed {
        /// Bytes received.
        got: usize,
    },
    /// No whole hello within the grace time.
    Silent {
        /// The grace time it had.
        after: Duration,
        /// Bytes received.
        got: usize,
    },
    /// A length prefix no hello has (over [`MAX_HELLO_FRAME`]): text such as an HTTP request,
    /// most often.
    TooLong {
        /// The length the prefix claimed.
        len: usize,
        /// The first bytes received.
        first: Vec<u8>,
    },
    /// A frame of length zero.
    EmptyFrame,
    /// A frame whose body is no message.
    Malformed {
        /// The decoder's complaint.
        error: String,
        /// The first bytes received.
        first: Vec<u8>,
    },
    /// A message other than the key agreement came first.
    NotHello {
        /// The message's name.
        name: &'static str,
    },
    /// A hello (behind the agreement's offer) this receiver cannot take: another message, a
    /// bad block size (it was answered with a `Reject` saying so).
    BadHello {
        /// Why.
        reason: String,
    },
    /// A hurtle peer of another protocol version (answered with a `Reject` saying so).
    OtherVersion {
        /// Its version.
        version: u16,
    },
    /// The key agreement failed: an unknown key, a wrong code, a changed message.
    Agreement {
        /// What failed.
        reason: String,
        /// It used the receiver's code: one of its [`CODE_TRIES`].
        code_try: bool,
        /// It was the [`CODE_TRIES`]th failure with the code, which spent it.
        spent: bool,
    },
    /// A hello without hurtle's magic (it was answered with a `Reject` saying so).
    NotHurtle {
        /// The magic it had.
        magic: [u8; 4],
    },
    /// Told the receiver is busy and closed at once: [`MAX_UNGREETED`] connections were
    /// already being greeted, or [`MAX_PER_SOURCE`] from its address (`from_source`).
    Busy {
        /// The limit that was reached.
        limit: usize,
        /// The limit was its address's.
        from_source: bool,
    },
    /// The socket failed.
    Io(io::Error),
}

impl Stray {
    /// Whether the stray sent bytes that are not hurtle's (as opposed to saying nothing, or
    /// too little): those are logged as warnings, the others as information.
    pub fn is_foreign(&self) -> bool {
        matches!(
            self,
            Stray::TooLong { .. }
                | Stray::EmptyFrame
                | Stray::Malformed { .. }
                | Stray::NotHello { .. }
                | Stray::BadHello { .. }
                | Stray::NotHurtle { .. }
                | Stray::Agreement { .. }
        )
    }

    /// What kind of stray it is to the log: a failed try of the code, foreign, quiet, or one
    /// that left without a word (a close before any byte: not counted, a `debug` line).
    pub fn kind(&self) -> StrayKind {
        match self {
            Stray::Agreement { code_try: true, .. } => StrayKind::CodeTry,
            Stray::Closed { got: 0 } => StrayKind::Left,
            s if s.is_foreign() => StrayKind::Foreign,
            _ => StrayKind::Quiet,
        }
    }
}

impl fmt::Display for Stray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stray::Closed { got: 0 } => write!(f, "closed without sending anything"),
            Stray::Closed { got } => write!(f, "closed after {got} bytes, before a whole hello"),
            Stray::Silent { after, got: 0 } => {
                write!(f, "sent nothing within {} s", after.as_secs_f64())
            }
            Stray::Silent { after, got } => write!(
                f,
                "sent {got} bytes but no whole hello within {} s",
                after.as_secs_f64()
            ),
            Stray::TooLong { first, .. } => {
                write!(f, "sent {} (not a hurtle peer)", glimpse(first))
            }
            Stray::EmptyFrame => write!(f, "sent an empty frame (not a hurtle peer)"),
            Stray::Malformed { error, first } => {
                write!(f, "sent {} (not a hurtle peer: {error})", glimpse(first))
            }
            Stray::NotHello { name } => {
                write!(
                    f,
                    "sent {name} before any key agreement (not a hurtle sender)"
                )
            }
            Stray::BadHello { reason } => write!(
                f,
                "sent a hello this receiver cannot take: {reason}; told so"
            ),
            Stray::OtherVersion { version } => write!(
                f,
                "a hurtle peer of protocol version {version} (this receiver speaks {}); told so",
                wire::VERSION
            ),
            Stray::Agreement { reason, .. } => write!(f, "failed the key agreement: {reason}"),
            Stray::NotHurtle { magic } => write!(
                f,
                "sent a hello with magic {} (not a hurtle peer)",
                glimpse(magic)
            ),
            Stray::Busy {
                limit,
                from_source: false,
            } => write!(
                f,
                "told busy and closed at once: {limit} connections were already being greeted"
            ),
            Stray::Busy {
                limit,
                from_source: true,
            } => write!(
                f,
                "told busy and closed at once: {limit} connections from its address were already being greeted"
            ),
            Stray::Io(e) => write!(f, "socket error: {e}"),
        }
    }
}

/// The first line of `bytes`, quoted, with bytes that are not printable ASCII escaped.
fn glimpse(bytes: &[u8]) -> String {
    let line = bytes
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .filter(|&end| end > 0)
        .map_or(bytes, |end| &bytes[..end]);
    let mut s = String::from("'");
    for &b in line.iter().take(GLIMPSE) {
        match b {
            b' '..=b'~' if b != b'\'' && b != b'\\' => s.push(char::from(b)),
            _ => s.push_str(&format!("\\x{b:02x}")),
        }
    }
    if line.len() > GLIMPSE {
        s.push_str("...");
    }
    s.push('\'');
    s
}

/// Greets a new control connection: reads its first message, within `deadline`, runs the key
/// agreement with `gate`'s keys, and decides whether the peer is an authenticated hurtle sender
/// ([`Greeted`]) or a stray ([`Stray`]).
///
/// Reads exactly the first frame and nothing more, so what follows it (the manifest, which a
/// sender sends without waiting) is left for the session. A hello with another magic is
/// answered with a `Reject` (best effort) before it counts as a stray. Leaves the stream
/// without a read or write timeout.
///
/// This is the step an authenticated key agreement replaces: everything that fails in here is
/// a stranger's doing and is ignored; what fails after it is the session's error.
pub fn greet(
    stream: &mut TcpStream,
    deadline: Instant,
    gate: &Gatekeeper,
) -> Result<(Greeted, Opened), Stray> {
    greet_within(stream, (deadline, deadline), gate)
}

/// [`greet`], with a deadline of its own for the first byte: `(first_byte_by, deadline)`. A
/// sender sends its offer as soon as it has connected, so a connection that has said nothing
/// by `first_byte_by` is dropped then, not at `deadline`.
pub fn greet_within(
    stream: &mut TcpStream,
    (first_byte_by, deadline): (Instant, Instant),
    gate: &Gatekeeper,
) -> Result<(Greeted, Opened), Stray> {
    let started = Instant::now();
    let r = Reading {
        stream,
        deadline,
        first_byte_by: first_byte_by.min(deadline),
        started,
        got: 0,
        first: Vec::new(),
    };
    let result = greet_inner(r, deadline, gate);
    let _ = stream.set_read_timeout(None);
    let _ = stream.set_write_timeout(None);
    result
}

fn greet_inner(
    mut r: Reading<'_>,
    deadline: Instant,
    gate: &Gatekeeper,
) -> Result<(Greeted, Opened), Stray> {
    let msg = r.frame()?;
    let told = |stream: &mut TcpStream, reason: String| {
        let left = deadline.saturating_duration_since(Instant::now());
        let _ = stream.set_write_timeout(Some(left.max(Duration::from_millis(10))));
        let _ = stream.write_all(&Control::Reject { reason }.to_frame());
    };
    match &msg {
        Control::Hello { magic, version, .. } | Control::Agree { magic, version, .. }
            if *magic != wire::MAGIC =>
        {
            told(r.stream, format!(
                "not a hurtle {} sender (magic {magic:?}, version {version}): use the same hurtle version on both sides",
                wire::VERSION
            ));
            Err(Stray::NotHurtle { magic: *magic })
        }
        Control::Hello { version, .. } | Control::Agree { version, .. }
            if *version != wire::VERSION =>
        {
            told(r.stream, format!(
                "this receiver speaks hurtle protocol version {}, the sender {version}: use the same hurtle version on both sides",
                wire::VERSION
            ));
            Err(Stray::OtherVersion { version: *version })
        }
        Control::Agree { .. } => {
            // The hello comes in the clear right behind the offer. Its answer goes sealed right
            // behind the agreement's if the data path opened ahead can serve it (lent to this
            // greeting, given back if it fails); else a data path is opened for it, and the
            // hello answered, once the sender proved its key.
            let hello = r.frame()?;
            let params = check_hello(hello.clone(), &gate.data.limits).map_err(|e| {
                told(
                    r.stream,
                    format!("the receiver cannot take this hello: {e}"),
                );
                Stray::BadHello {
                    reason: e.to_string(),
                }
            })?;
            let local_ip = r.stream.local_addr().map_err(Stray::Io)?.ip();
            let ahead = |seal: &mut FrameSeal| {
                let mut lent = gate.data.lend(local_ip, params)?;
                let ack = lent.answer()?;
                let sealed = seal.seal(&ack);
                Some((lent, sealed))
            };
            let answered = |seal: &mut FrameSeal| {
                let mut opened = gate
                    .data
                    .open(local_ip, params)
                    .map_err(|e| format!("the receiver could not open its data path: {e}"))?;
                let ack = opened
                    .setup
                    .poll_transmit()
                    .ok_or("the set-up gave no answer to the hello")?;
                let sealed = seal.seal(&ack);
                Ok((Lent::own(opened), sealed))
            };
            handshake::answer(
                r.stream,
                &gate.keys,
                gate.plain_data,
                (&msg, &hello),
                deadline,
                (ahead, answered),
            )
            .map(|(greeted, lent)| (greeted, lent.keep()))
            .map_err(|refusal| Stray::Agreement {
                reason: refusal.reason,
                code_try: refusal.code_try,
                spent: refusal.spent,
            })
        }
        other => Err(Stray::NotHello { name: other.name() }),
    }
}

/// Reads within a deadline, keeping the first bytes for the log.
struct Reading<'a> {
    stream: &'a mut TcpStream,
    deadline: Instant,
    /// The deadline while nothing has arrived.
    first_byte_by: Instant,
    started: Instant,
    got: usize,
    first: Vec<u8>,
}

impl Reading<'_> {
    /// Reads one frame (at most [`MAX_HELLO_FRAME`]) and decodes it.
    fn frame(&mut self) -> Result<Control, Stray> {
        let mut prefix = [0u8; 4];
        self.fill(&mut prefix)?;
        let len = u32::from_be_bytes(prefix) as usize;
        if len == 0 {
            return Err(Stray::EmptyFrame);
        }
        if len > MAX_HELLO_FRAME {
            self.glimpse_more();
            return Err(Stray::TooLong {
                len,
                first: std::mem::take(&mut self.first),
            });
        }
        let mut body = vec![0u8; len];
        self.fill(&mut body)?;
        Control::from_body(&body).map_err(|e| Stray::Malformed {
            error: e.to_string(),
            first: self.first.clone(),
        })
    }

    /// Fills `buf` entirely, or says why not.
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), Stray> {
        let mut at = 0;
        while at < buf.len() {
            let until = if self.got == 0 {
                self.first_byte_by
            } else {
                self.deadline
            };
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.silent());
            }
            self.stream
                .set_read_timeout(Some(left))
                .map_err(Stray::Io)?;
            match self.stream.read(&mut buf[at..]) {
                Ok(0) => return Err(Stray::Closed { got: self.got }),
                Ok(n) => {
                    self.keep(&buf[at..at + n]);
                    at += n;
                }
                Err(e) => match e.kind() {
                    io::ErrorKind::Interrupted => {}
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                        return Err(self.silent())
                    }
                    io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::UnexpectedEof => return Err(Stray::Closed { got: self.got }),
                    _ => return Err(Stray::Io(e)),
                },
            }
        }
        Ok(())
    }

    fn keep(&mut self, bytes: &[u8]) {
        self.got += bytes.len();
        let room = (2 * GLIMPSE).saturating_sub(self.first.len());
        self.first
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// Reads what more is already there, without waiting, only to show it in the log (a
    /// request line rather than its first four bytes).
    fn glimpse_more(&mut self) {
        let mut more = [0u8; 2 * GLIMPSE];
        if self.stream.set_nonblocking(true).is_err() {
            return;
        }
        if let Ok(n) = self.stream.read(&mut more) {
            self.keep(&more[..n]);
        }
        let _ = self.stream.set_nonblocking(false);
    }

    fn silent(&self) -> Stray {
        let until = if self.got == 0 {
            self.first_byte_by
        } else {
            self.deadline
        };
        Stray::Silent {
            after: until.saturating_duration_since(self.started),
            got: self.got,
        }
    }
}

/// How the front door admits connections.
#[derive(Debug, Clone, Copy)]
pub struct DoorLimits {
    /// How long a connection has to greet ([`GREETING_GRACE`]).
    pub grace: Duration,
    /// How long a connection may stay silent before it is dropped ([`SILENT_GRACE`]).
    pub silent_grace: Duration,
    /// How many connections may be greeted at once ([`MAX_UNGREETED`]).
    pub max_ungreeted: usize,
    /// How many of them one source may hold ([`MAX_PER_SOURCE`]).
    pub max_per_source: usize,
    /// How many strays of a window of the log get a line each ([`STRAY_LOG_BURST`]).
    pub log_burst: u32,
    /// The log's window: the rest of its strays are one line at its end
    /// ([`STRAY_LOG_WINDOW`]).
    pub log_window: Duration,
}

impl Default for DoorLimits {
    fn default() -> Self {
        DoorLimits {
            grace: GREETING_GRACE,
            silent_grace: SILENT_GRACE,
            max_ungreeted: MAX_UNGREETED,
            max_per_source: MAX_PER_SOURCE,
            log_burst: STRAY_LOG_BURST,
            log_window: STRAY_LOG_WINDOW,
        }
    }
}

/// The receiver's front door: a thread that accepts connections on a listener, greets each in a
/// thread of its own and queues the greeted ones for [`FrontDoor::next`].
///
/// Dropping it stops the accepting thread (greetings under way end by their deadline).
pub struct FrontDoor {
    arrivals: crossbeam_channel::Receiver<Result<Arrival, SessionError>>,
    strays: Arc<AtomicU64>,
    log: Arc<Logbook>,
    /// Says a window's summary when the window ends ([`summarise`]); without it (it could not
    /// start), summaries wait for the next stray, a session or the door's close.
    summariser: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    /// Where to connect to wake the accepting thread from `accept` when stopping.
    wake: Option<SocketAddr>,
    thread: Option<JoinHandle<()>>,
}

impl FrontDoor {
    /// Starts accepting on `listener`.
    pub fn open(
        listener: TcpListener,
        limits: DoorLimits,
        gate: Gatekeeper,
    ) -> io::Result<FrontDoor> {
        let wake = listener.local_addr().ok().map(|a| {
            let ip = match a.ip() {
                std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
                    std::net::Ipv4Addr::LOCALHOST.into()
                }
                std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
                    std::net::Ipv6Addr::LOCALHOST.into()
                }
                ip => ip,
            };
            SocketAddr::new(ip, a.port())
        });
        let (tx, arrivals) = crossbeam_channel::unbounded();
        let strays = Arc::new(AtomicU64::new(0));
        let log = Arc::new(Logbook::new(StrayLog::new(
            limits.log_burst,
            limits.log_window,
        )));
        let summariser = {
            let log = log.clone();
            std::thread::Builder::new()
                .name("stray-log".into())
                .spawn(move || summarise(&log))
                .ok()
        };
        raise_descriptor_limit();
        let stop = Arc::new(AtomicBool::new(false));
        let door = Door {
            listener,
            limits,
            arrivals: tx,
            strays: strays.clone(),
            log: log.clone(),
            stop: stop.clone(),
            ungreeted: Arc::new(Pending::default()),
            gate: Arc::new(gate),
        };
        let thread = std::thread::Builder::new()
            .name("accept".into())
            .spawn(move || door.run());
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                log.close();
                if let Some(t) = summariser {
                    let _ = t.join();
                }
                return Err(e);
            }
        };
        Ok(FrontDoor {
            arrivals,
            strays,
            log,
            summariser,
            stop,
            wake,
            thread: Some(thread),
        })
    }

    /// Waits for the next greeted connection. An error is one `accept` failed with (not a
    /// stray's: those are dropped and counted; the door keeps accepting after it), or the code
    /// spent by too many wrong tries ([`SessionError::CodeSpent`]).
    ///
    /// Strays counted for the log and not yet said are said before a greeted connection is
    /// handed over, so that they come before the session's lines.
    pub fn next(&self) -> Result<Arrival, SessionError> {
        self.next_unless(&|| false)
    }

    /// [`FrontDoor::next`], or [`SessionError::Interrupted`] as soon as `stop` says so (it is
    /// asked every 50 ms): a receiver waiting for its sender is cancelled from another thread.
    pub fn next_unless(&self, stop: &dyn Fn() -> bool) -> Result<Arrival, SessionError> {
        let next = loop {
            if stop() {
                return Err(SessionError::Interrupted {
                    side: crate::error::Side::Receiver,
                });
            }
            match self.arrivals.recv_timeout(Duration::from_millis(50)) {
                Ok(next) => break next,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    break Err(SessionError::io(
                        "accept",
                        io::Error::other("the accepting thread ended"),
                    ))
                }
            }
        };
        if next.is_ok() {
            self.log.flush();
        }
        next
    }

    /// Strays dropped since the last call (or since the door opened); connections that closed
    /// without sending a byte are not counted.
    pub fn take_strays(&self) -> u64 {
        self.strays.swap(0, Ordering::Relaxed)
    }

    /// Strays dropped and not yet taken.
    pub fn strays(&self) -> u64 {
        self.strays.load(Ordering::Relaxed)
    }
}

impl Drop for FrontDoor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the thread from `accept`; it sees `stop` and ends. If the connection cannot be
        // made, the thread is left to end at its next connection rather than waited for.
        let woken = self
            .wake
            .is_some_and(|addr| TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok());
        if let Some(t) = self.thread.take().filter(|_| woken) {
            let _ = t.join();
        }
        // What the log counted is said; greetings still under way get a line each.
        self.log.close();
        if let Some(t) = self.summariser.take() {
            let _ = t.join();
        }
    }
}

/// The door's [`StrayLog`], shared by the greetings (which record strays in it), the thread
/// that says a window's summary when it ends ([`summarise`]), and the [`FrontDoor`] (which
/// has it say what is counted when a session starts and when the door closes). Lines are
/// logged under its lock, so they come out in the order the log decided them.
struct Logbook {
    log: Mutex<StrayLog>,
    /// Wakes [`summarise`]: the log's next window end changed, or the door closed.
    woken: Condvar,
    /// The door closed: [`summarise`] ends.
    closed: AtomicBool,
    /// Every line logged, for the tests.
    #[cfg(test)]
    said: Mutex<Vec<LogLine>>,
}

impl Logbook {
    fn new(log: StrayLog) -> Logbook {
        Logbook {
            log: Mutex::new(log),
            woken: Condvar::new(),
            closed: AtomicBool::new(false),
            #[cfg(test)]
            said: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, StrayLog> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Logs `line` (under the lock).
    fn say(&self, line: LogLine) {
        match &line {
            LogLine::Warn(text) => tracing::warn!("{text}"),
            LogLine::Info(text) => tracing::info!("{text}"),
            LogLine::Debug(text) => tracing::debug!("{text}"),
        }
        #[cfg(test)]
        self.said
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(line);
    }

    /// A stray dropped now: its line, a summary, or neither.
    fn record(&self, peer: SocketAddr, why: &Stray) {
        let mut log = self.lock();
        let due = log.due();
        for line in log.record(Instant::now(), why.kind(), peer, why) {
            self.say(line);
        }
        let wake = log.due() != due;
        drop(log);
        if wake {
            self.woken.notify_one();
        }
    }

    /// Says what is counted and not yet said.
    fn flush(&self) {
        let mut log = self.lock();
        if let Some(line) = log.flush(Instant::now()) {
            self.say(line);
        }
    }

    /// Says what is counted, logs every later stray on its own line, and ends [`summarise`].
    fn close(&self) {
        let mut log = self.lock();
        if let Some(line) = log.close(Instant::now()) {
            self.say(line);
        }
        self.closed.store(true, Ordering::Relaxed);
        drop(log);
        self.woken.notify_all();
    }
}

/// The thread that says each window's summary when the window ends, until the door closes.
fn summarise(book: &Logbook) {
    let mut log = book.lock();
    // `closed` is set under the lock, so it is seen here before a wait, or wakes the wait.
    while !book.closed.load(Ordering::Relaxed) {
        let now = Instant::now();
        if let Some(line) = log.tick(now) {
            book.say(line);
        }
        log = match log.due() {
            Some(due) => {
                let wait = due.saturating_duration_since(now);
                match book.woken.wait_timeout(log, wait) {
                    Ok((log, _)) => log,
                    Err(e) => e.into_inner().0,
                }
            }
            None => book.woken.wait(log).unwrap_or_else(|e| e.into_inner()),
        };
    }
}

/// The accepting thread's side of the [`FrontDoor`].
struct Door {
    listener: TcpListener,
    limits: DoorLimits,
    arrivals: crossbeam_channel::Sender<Result<Arrival, SessionError>>,
    strays: Arc<AtomicU64>,
    log: Arc<Logbook>,
    stop: Arc<AtomicBool>,
    ungreeted: Arc<Pending>,
    gate: Arc<Gatekeeper>,
}

/// The connections in their greeting: how many, and how many from each source.
#[derive(Debug, Default)]
struct Pending {
    by_source: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

impl Pending {
    /// Takes a slot for a connection from `peer`, or says which limit is reached.
    fn take(self: &Arc<Self>, peer: IpAddr, limits: &DoorLimits) -> Result<Greeting, Stray> {
        let source = source_of(peer);
        let mut g = self.by_source.lock().unwrap_or_else(|e| e.into_inner());
        let (total, by_source) = &mut *g;
        if *total >= limits.max_ungreeted {
            return Err(Stray::Busy {
                limit: limits.max_ungreeted,
                from_source: false,
            });
        }
        let mine = by_source.entry(source).or_insert(0);
        if *mine >= limits.max_per_source {
            return Err(Stray::Busy {
                limit: limits.max_per_source,
                from_source: true,
            });
        }
        *mine += 1;
        *total += 1;
        Ok(Greeting {
            pending: self.clone(),
            source,
        })
    }

    fn put_back(&self, source: IpAddr) {
        let mut g = self.by_source.lock().unwrap_or_else(|e| e.into_inner());
        let (total, by_source) = &mut *g;
        *total = total.saturating_sub(1);
        if let Some(n) = by_source.get_mut(&source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                by_source.remove(&source);
            }
        }
    }
}

/// What counts as one source: an IPv4 address (an IPv4-mapped IPv6 one too), or an IPv6 /64
/// (the least a site is given: one host can use every address in it).
fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(prefix.into())
            }
        },
    }
}

/// One connection in its greeting, counted in [`Door::ungreeted`] until dropped.
struct Greeting {
    pending: Arc<Pending>,
    source: IpAddr,
}

impl Drop for Greeting {
    fn drop(&mut self) {
        self.pending.put_back(self.source);
    }
}

/// Raises this process's soft limit on open descriptors to its hard limit (once), before
/// the first connection: each connection in its greeting holds one, and a session's data path
/// a few more. Failing to raise it is not an error (the accepting thread survives running out:
/// see [`Door::run`]).
fn raise_descriptor_limit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let now = crate::sys::fs::raise_open_file_limit();
        tracing::debug!("open descriptors: soft limit {now:?}");
    });
}

/// How long the accepting thread pauses after `accept` failed for want of a resource
/// (descriptors, memory), rather than spinning on the same error.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

impl Door {
    fn run(self) {
        // Failures in a row, said once per streak (and how long it lasted when it ends).
        let mut failing: Option<(Instant, u64)> = None;
        loop {
            let accepted = self.listener.accept();
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            match accepted {
                Ok((stream, peer)) => {
                    if let Some((since, n)) = failing.take() {
                        tracing::info!(
                            "accepting connections again after {n} failures over {:.1} s",
                            since.elapsed().as_secs_f64()
                        );
                    }
                    self.admit(stream, peer)
                }
                Err(e) => match e.kind() {
                    // The peer gave up between its connect and our accept: nothing to do.
                    io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::Interrupted => {}
                    _ => {
                        // Out of descriptors, say: never the receiver's end. Said once, and
                        // tried again after a pause (the connection waits in the backlog).
                        match &mut failing {
                            Some((_, n)) => *n += 1,
                            None => {
                                tracing::warn!(
                                    "cannot accept connections: {e}; trying again every {} ms",
                                    ACCEPT_PAUSE.as_millis()
                                );
                                failing = Some((Instant::now(), 1));
                            }
                        }
                        std::thread::sleep(ACCEPT_PAUSE);
                    }
                },
            }
        }
    }

    fn admit(&self, stream: TcpStream, peer: SocketAddr) {
        let slot = match self.ungreeted.take(peer.ip(), &self.limits) {
            Ok(slot) => slot,
            Err(busy) => {
                // Counted before it is closed, so whoever sees it closed sees it counted.
                self.dropped(peer, &busy);
                turn_away(stream, &busy);
                return;
            }
        };
        let now = Instant::now();
        let deadline = now + self.limits.grace;
        let first_byte_by = now + self.limits.silent_grace;
        let arrivals = self.arrivals.clone();
        let strays = self.strays.clone();
        let log = self.log.clone();
        let gate = self.gate.clone();
        let spawned = std::thread::Builder::new()
            .name("greet".into())
            .spawn(move || {
                let _slot = slot;
                let mut stream = stream;
                match greet_within(&mut stream, (first_byte_by, deadline), &gate) {
                    Ok((greeted, opened)) => {
                        let _ = arrivals.send(Ok(Arrival {
                            stream,
                            peer,
                            greeted,
                            opened,
                        }));
                    }
                    // Counted (and logged, or counted for the log's summary) before it is
                    // closed, so whoever sees it closed sees it counted.
                    Err(why) => {
                        count_stray(&strays, &log, peer, &why);
                        if let Stray::Agreement { spent: true, .. } = why {
                            // The keyring removed the code; a receiver with nothing else to
                            // accept ends.
                            let _ = arrivals.send(Err(SessionError::CodeSpent(CODE_TRIES)));
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            // The closure, and with it the stream and the slot, are gone already.
            self.dropped(peer, &Stray::Io(e));
        }
    }

    fn dropped(&self, peer: SocketAddr, why: &Stray) {
        count_stray(&self.strays, &self.log, peer, why);
    }
}

/// Tells a connection the door has no room for that the receiver is busy (a `Reject` a sender
/// reads as its agreement's answer), and closes it, without ever waiting: the accepting thread
/// does it. What the peer had sent is read first, where it is already there, so that the close
/// is a FIN behind the `Reject`, not a reset that could overtake it.
fn turn_away(mut stream: TcpStream, why: &Stray) {
    if stream.set_nonblocking(true).is_err() {
        return;
    }
    let reason = match why {
        Stray::Busy {
            from_source: true, ..
        } => format!("{BUSY}the receiver is greeting as many connections from your address as it takes; try again in a few seconds"),
        _ => format!("{BUSY}the receiver is greeting as many connections as it takes; try again in a few seconds"),
    };
    let _ = stream.write_all(&Control::Reject { reason }.to_frame());
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut sink = [0u8; 4096];
    for _ in 0..16 {
        match stream.read(&mut sink) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
}

/// Counts and logs a dropped stray (a line of its own, or counted for a summary: [`StrayLog`]);
/// one that left without a word is not counted, and its line is at `debug`
/// ([`StrayKind::Left`]).
fn count_stray(strays: &AtomicU64, log: &Logbook, peer: SocketAddr, why: &Stray) {
    if why.kind() != StrayKind::Left {
        strays.fetch_add(1, Ordering::Relaxed);
    }
    log.record(peer, why);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(magic: [u8; 4], version: u16) -> Control {
        Control::Hello {
            magic,
            version,
            caps: 0,
            channels: 1,
            payload: hurtle_proto::wire::DEFAULT_PAYLOAD,
            block_size: 1 << 20,
            session: 7,
        }
    }

    /// A connected pair on loopback: (the peer's end, the greeted end).
    fn pair(listener: &TcpListener) -> (TcpStream, TcpStream) {
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (client, server)
    }

    /// Greets what `send` writes (then closes, unless `hold`), with `grace`.
    fn greet_after(
        send: &[u8],
        hold: bool,
        grace: Duration,
    ) -> (Result<(Greeted, Opened), Stray>, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (mut client, mut server) = pair(&listener);
        client.write_all(send).unwrap();
        if !hold {
            client.shutdown(std::net::Shutdown::Write).unwrap();
        }
        (greet(&mut server, Instant::now() + grace, &gate()), client)
    }

    const CODE: &str = "1-purple-sausage";

    fn gate() -> Gatekeeper {
        Gatekeeper {
            keys: Keyring::code(CODE),
            plain_data: false,
            data: DataDoor::for_tests(),
        }
    }

    /// A real sender on `client`: the agreement with `code` (and its hello), then `then` as its
    /// first sealed frame and a keep-alive.
    fn sender(
        mut client: TcpStream,
        code: &'static str,
        then: Control,
    ) -> std::thread::JoinHandle<Result<(), SessionError>> {
        std::thread::spawn(move || {
            let secret = hurtle_proto::secure::Secret::code(code);
            let hello = hello(wire::MAGIC, wire::VERSION);
            let mut keys =
                handshake::offer(&mut client, &secret, false, &hello, Duration::from_secs(5))?;
            client.write_all(&keys.frames_out.seal(&then)).unwrap();
            client
                .write_all(&keys.frames_out.seal(&Control::KeepAlive))
                .unwrap();
            // Held open until the test is done with it.
            std::thread::sleep(Duration::from_millis(500));
            Ok(())
        })
    }

    const GRACE: Duration = Duration::from_secs(5);

    #[test]
    fn a_sender_with_the_code_is_greeted_and_what_follows_its_first_frame_is_left_unread() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (client, mut server) = pair(&listener);
        let s = sender(client, CODE, Control::Done);
        let (mut greeted, opened) = greet(&mut server, Instant::now() + GRACE, &gate()).unwrap();
        assert_eq!(greeted.first, Control::Done);
        assert_eq!(greeted.key_name, "code");
        // The data path was opened for the hello, and answered.
        assert_eq!(opened.setup.hello().channels, 1);
        assert!(
            matches!(opened.data_in, super::super::data_path::DataIn::Udp(ref u, None) if u.len() == 1)
        );
        let next =
            crate::net::control::read_sealed(&mut server, &mut greeted.keys.frames_in, GRACE)
                .unwrap();
        assert_eq!(
            next,
            Control::KeepAlive,
            "the frame after the first sealed one is the session's"
        );
        s.join().unwrap().unwrap();
    }

    /// A gate whose receiver opened its data path ahead, on 127.0.0.1 (8 UDP sockets and a
    /// TCP listener).
    fn gate_ahead() -> Gatekeeper {
        let g = gate();
        g.data.open_ahead("127.0.0.1".parse().unwrap()).unwrap();
        assert_eq!(g.data.ahead_ports().0.len(), 8);
        g
    }

    /// A hello offering `n` channels.
    fn hello_of(n: u16) -> Control {
        let mut h = hello(wire::MAGIC, wire::VERSION);
        if let Control::Hello { channels, .. } = &mut h {
            *channels = n;
        }
        h
    }

    /// Reads the next frame on `c`, or none within `wait`.
    fn nothing_within(c: &mut TcpStream, wait: Duration) -> bool {
        c.set_read_timeout(Some(wait)).unwrap();
        let mut byte = [0u8; 1];
        let quiet = matches!(c.read(&mut byte), Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut));
        c.set_read_timeout(None).unwrap();
        quiet
    }

    #[test]
    fn with_a_data_path_opened_ahead_the_hello_is_answered_in_the_agreements_flight() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (mut client, mut server) = pair(&listener);
        let gate = gate_ahead();
        let (before, listening) = gate.data.ahead_ports();
        let g = gate.clone();
        let door = std::thread::spawn(move || {
            let got = greet(&mut server, Instant::now() + GRACE, &g);
            (got.map(|(g, o)| (g.first, o)), server)
        });
        let secret = hurtle_proto::secure::Secret::code(CODE);
        let mut keys = handshake::offer(&mut client, &secret, false, &hello_of(3), GRACE).unwrap();
        // One round trip after the connect: keys and ports. The sender has sent nothing since
        // its offer, and the sealed HelloAck is there already.
        let ack =
            crate::net::control::read_sealed(&mut client, &mut keys.frames_in, GRACE).unwrap();
        let Control::HelloAck { ports, .. } = ack else {
            panic!("{ack:?}")
        };
        assert_eq!(ports.len(), 3);
        assert!(
            ports.iter().all(|p| before.contains(p)),
            "{ports:?} are not among the ports opened ahead {before:?}"
        );
        client
            .write_all(&keys.frames_out.seal(&Control::KeepAlive))
            .unwrap();
        let (got, _server) = door.join().unwrap();
        let (first, opened) = got.unwrap();
        assert_eq!(first, Control::KeepAlive);
        assert!(
            matches!(opened.data_in, super::super::data_path::DataIn::Udp(ref u, None) if u.len() == 3)
        );
        // The proven sender keeps its three; the rest stay for the next one.
        let (left, still) = gate.data.ahead_ports();
        assert_eq!(left.len(), 5);
        assert!(left.iter().all(|p| !ports.contains(p)));
        assert_eq!(
            still, listening,
            "a hello without the race takes no listener"
        );
    }

    #[test]
    fn a_wrong_code_gives_the_data_path_opened_ahead_back_and_opens_nothing() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (client, mut server) = pair(&listener);
        let gate = gate_ahead();
        let before = gate.data.ahead_ports();
        let s = sender(client, "1-purple-sausages", Control::Done);
        let why = greet(&mut server, Instant::now() + GRACE, &gate).unwrap_err();
        assert!(
            matches!(why, Stray::Agreement { code_try: true, .. }),
            "{why:?}"
        );
        assert!(s.join().unwrap().is_err());
        assert_eq!(gate.data.ahead_ports(), before);
    }

    #[test]
    fn what_reached_a_socket_opened_ahead_before_it_was_lent_is_dropped_unread() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (client, mut server) = pair(&listener);
        let gate = gate_ahead();
        let (ports, _) = gate.data.ahead_ports();
        let stranger = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for p in &ports {
            for _ in 0..3 {
                stranger.send_to(b"not yours", ("127.0.0.1", *p)).unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(50));
        let s = sender(client, CODE, Control::Done);
        let (_, opened) = greet(&mut server, Instant::now() + GRACE, &gate).unwrap();
        let super::super::data_path::DataIn::Udp(udps, _) = &opened.data_in else {
            panic!("a UDP data path")
        };
        for u in udps {
            let sock = u.try_clone_socket().unwrap();
            sock.set_nonblocking(true).unwrap();
            let mut buf = [0u8; 64];
            let got = sock.recv(&mut buf);
            assert!(
                matches!(&got, Err(e) if e.kind() == io::ErrorKind::WouldBlock),
                "{got:?} waited on port {}",
                u.local_addr().port()
            );
        }
        s.join().unwrap().unwrap();
    }

    #[test]
    fn a_greeting_that_overlaps_one_holding_the_set_opened_ahead_is_answered_once_proven() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let gate = gate_ahead();
        let before = gate.data.ahead_ports();
        // The first greeting takes all eight and holds them: it never proves the code.
        let (mut holder, mut server) = pair(&listener);
        let g = gate.clone();
        let held = std::thread::spawn(move || greet(&mut server, Instant::now() + GRACE, &g));
        let secret = hurtle_proto::secure::Secret::code(CODE);
        let mut held_keys =
            handshake::offer(&mut holder, &secret, false, &hello_of(8), GRACE).unwrap();
        let ack =
            crate::net::control::read_sealed(&mut holder, &mut held_keys.frames_in, GRACE).unwrap();
        assert!(matches!(ack, Control::HelloAck { .. }), "{ack:?}");
        assert!(gate.data.ahead_ports().0.is_empty());
        // The second finds none: nothing is opened for it until it proves the code.
        let (mut client, mut server) = pair(&listener);
        let g = gate.clone();
        let door = std::thread::spawn(move || {
            let got = greet(&mut server, Instant::now() + GRACE, &g);
            (got.map(|(g, o)| (g.first, o)), server)
        });
        let mut keys = handshake::offer(&mut client, &secret, false, &hello_of(2), GRACE).unwrap();
        assert!(
            nothing_within(&mut client, Duration::from_millis(300)),
            "the receiver said more before the sender proved the code"
        );
        client
            .write_all(&keys.frames_out.seal(&Control::KeepAlive))
            .unwrap();
        let ack =
            crate::net::control::read_sealed(&mut client, &mut keys.frames_in, GRACE).unwrap();
        let Control::HelloAck { ports, .. } = ack else {
            panic!("{ack:?}")
        };
        assert_eq!(ports.len(), 2);
        assert!(ports.iter().all(|p| !before.0.contains(p)));
        let (got, _server) = door.join().unwrap();
        assert_eq!(got.unwrap().0, Control::KeepAlive);
        // The holder leaves without proving the code: the eight go back.
        drop(holder);
        assert!(held.join().unwrap().is_err());
        assert_eq!(gate.data.ahead_ports(), before);
    }

    #[test]
    fn without_a_data_path_opened_ahead_the_hello_is_answered_once_the_sender_proved_the_code() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (mut client, mut server) = pair(&listener);
        let door = std::thread::spawn(move || {
            let got = greet(&mut server, Instant::now() + GRACE, &gate());
            (got.map(|(g, _)| g.first), server)
        });
        let secret = hurtle_proto::secure::Secret::code(CODE);
        let mut hello = hello(wire::MAGIC, wire::VERSION);
        if let Control::Hello { channels, .. } = &mut hello {
            *channels = 3;
        }
        let mut keys =
            handshake::offer(&mut client, &secret, false, &hello, Duration::from_secs(5)).unwrap();
        // Nothing more comes before the sender proves it holds the code: no data path is open
        // for it yet.
        client
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut byte = [0u8; 1];
        assert!(
            matches!(client.read(&mut byte), Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)),
            "the receiver said more before the sender proved the code"
        );
        client
            .write_all(&keys.frames_out.seal(&Control::KeepAlive))
            .unwrap();
        let ack =
            crate::net::control::read_sealed(&mut client, &mut keys.frames_in, GRACE).unwrap();
        let Control::HelloAck { ports, .. } = ack else {
            panic!("{ack:?}")
        };
        assert_eq!(ports.len(), 3);
        assert!(ports.iter().all(|&p| p != 0));
        let (first, _server) = door.join().unwrap();
        assert_eq!(first.unwrap(), Control::KeepAlive);
    }

    #[test]
    fn a_hello_the_receiver_cannot_take_is_told_and_dropped() {
        let offer = hurtle_proto::secure::Offer::new(
            &hurtle_proto::secure::Secret::code(CODE),
            false,
            &hello(wire::MAGIC, wire::VERSION),
        )
        .1;
        let mut bad = hello(wire::MAGIC, wire::VERSION);
        if let Control::Hello { block_size, .. } = &mut bad {
            *block_size = 1000;
        }
        let mut flight = offer.to_frame();
        flight.extend_from_slice(&bad.to_frame());
        let (got, mut c) = greet_after(&flight, true, GRACE);
        assert!(matches!(got, Err(Stray::BadHello { .. })), "{got:?}");
        let told = crate::net::control::read_frame(&mut c, GRACE).unwrap();
        assert!(
            matches!(&told, Control::Reject { reason } if reason.contains("block size")),
            "{told:?}"
        );
    }

    #[test]
    fn a_wrong_code_is_a_stray_that_costs_a_try() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (client, mut server) = pair(&listener);
        let s = sender(client, "1-purple-sausages", Control::Done);
        let why = greet(&mut server, Instant::now() + GRACE, &gate()).unwrap_err();
        assert!(
            matches!(why, Stray::Agreement { code_try: true, .. }),
            "{why:?}"
        );
        assert!(matches!(
            s.join().unwrap(),
            Err(SessionError::NotAuthenticated(_))
        ));
    }

    #[test]
    fn a_peer_of_another_version_is_told_and_dropped() {
        for first in [
            hello(wire::MAGIC, wire::VERSION - 1),
            Control::Agree {
                magic: wire::MAGIC,
                version: wire::VERSION + 1,
                key_id: [0; 8],
                pake: vec![1; 33],
                confirm: vec![],
                plain_data: false,
            },
        ] {
            let (got, mut c) = greet_after(&first.to_frame(), true, GRACE);
            assert!(matches!(got, Err(Stray::OtherVersion { .. })), "{got:?}");
            let told = crate::net::control::read_frame(&mut c, GRACE).unwrap();
            assert!(
                matches!(&told, Control::Reject { reason } if reason.contains("version")),
                "{told:?}"
            );
        }
    }

    #[test]
    fn garbage_is_a_stray() {
        // Its "length prefix" is small, its body no message.
        let (got, _c) = greet_after(
            &[0, 0, 0, 8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
            true,
            GRACE,
        );
        let why = got.unwrap_err();
        assert!(matches!(why, Stray::Malformed { .. }), "{why:?}");
        let said = why.to_string();
        assert!(said.contains("'\\x00\\x00\\x00\\x08\\xff"), "{said}");
        assert!(said.contains("not a hurtle peer"), "{said}");
    }

    #[test]
    fn an_http_request_is_a_stray_shown_by_its_request_line() {
        let (got, _c) = greet_after(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", true, GRACE);
        let why = got.unwrap_err();
        assert!(
            matches!(
                why,
                Stray::TooLong {
                    len: 1_195_725_856,
                    ..
                }
            ),
            "{why:?}"
        );
        assert_eq!(why.to_string(), "sent 'GET / HTTP/1.1' (not a hurtle peer)");
        assert!(why.is_foreign());
    }

    #[test]
    fn a_huge_length_prefix_is_a_stray_read_no_further() {
        let (got, _c) = greet_after(&[0xff; 4], true, GRACE);
        let why = got.unwrap_err();
        assert!(
            matches!(
                why,
                Stray::TooLong {
                    len: 0xffff_ffff,
                    ..
                }
            ),
            "{why:?}"
        );
        assert_eq!(
            why.to_string(),
            "sent '\\xff\\xff\\xff\\xff' (not a hurtle peer)"
        );
        // Longer than a hello, though within the session's frame limit: a stray too.
        let prefix = ((MAX_HELLO_FRAME + 1) as u32).to_be_bytes();
        let (got, _c) = greet_after(&prefix, true, GRACE);
        assert!(matches!(got, Err(Stray::TooLong { .. })), "{got:?}");
    }

    #[test]
    fn a_zero_length_frame_is_a_stray() {
        let (got, _c) = greet_after(&[0; 4], true, GRACE);
        assert!(matches!(got, Err(Stray::EmptyFrame)), "{got:?}");
    }

    #[test]
    fn another_first_message_is_a_stray() {
        let (got, _c) = greet_after(&Control::Done.to_frame(), true, GRACE);
        let why = got.unwrap_err();
        assert!(matches!(why, Stray::NotHello { name: "Done" }), "{why:?}");
    }

    #[test]
    fn a_hello_without_the_magic_is_a_stray_told_why() {
        let (got, mut client) =
            greet_after(&hello(*b"NOPE", wire::VERSION).to_frame(), true, GRACE);
        let why = got.unwrap_err();
        assert!(
            matches!(why, Stray::NotHurtle { magic } if &magic == b"NOPE"),
            "{why:?}"
        );
        client.set_read_timeout(Some(GRACE)).unwrap();
        match crate::net::control::read_frame(&mut client, GRACE) {
            Ok(Control::Reject { reason }) => assert!(reason.contains("not a hurtle"), "{reason}"),
            other => panic!("expected a Reject, got {other:?}"),
        }
    }

    #[test]
    fn silence_until_the_deadline_is_a_stray() {
        let grace = Duration::from_millis(200);
        let t0 = Instant::now();
        let (got, _c) = greet_after(&[], true, grace);
        let waited = t0.elapsed();
        assert!(matches!(got, Err(Stray::Silent { got: 0, .. })), "{got:?}");
        assert!(waited >= grace && waited < grace * 10, "{waited:?}");
        // Half a hello, then nothing: silent too, and the deadline is not renewed by the bytes.
        let frame = hello(wire::MAGIC, wire::VERSION).to_frame();
        let (got, _c) = greet_after(&frame[..frame.len() - 1], true, grace);
        assert!(
            matches!(got, Err(Stray::Silent { got, .. }) if got == frame.len() - 1),
            "{got:?}"
        );
    }

    #[test]
    fn an_immediate_close_is_a_stray() {
        let (got, _c) = greet_after(&[], false, GRACE);
        let why = got.unwrap_err();
        assert!(matches!(why, Stray::Closed { got: 0 }), "{why:?}");
        assert!(!why.is_foreign());
        // Not a word: a sender's losing connect attempt, most likely; taken quietly.
        assert_eq!(why.kind(), StrayKind::Left);
        let (got, _c) = greet_after(&[0, 0, 0, 100, 7, 7], false, GRACE);
        let why = got.unwrap_err();
        assert!(matches!(why, Stray::Closed { got: 6 }), "{why:?}");
        assert_eq!(why.kind(), StrayKind::Quiet);
    }

    #[test]
    fn the_door_drops_strays_and_hands_over_the_sender_after_them() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let door = FrontDoor::open(
            listener,
            DoorLimits {
                grace: Duration::from_secs(2),
                max_ungreeted: 32,
                // All from one address here.
                max_per_source: 32,
                ..DoorLimits::default()
            },
            gate(),
        )
        .unwrap();
        let strays: Vec<&[u8]> = vec![
            b"\x00\x00\x00\x08\xff\xff\xff\xff\xff\xff\xff\xff",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            &[0xff; 4],
            &[0; 4],
        ];
        let mut held = Vec::new();
        for bytes in &strays {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(bytes).unwrap();
            held.push(c);
        }
        // Silent ones, and one closed at once (a sender's losing connect attempt, say: dropped
        // too, but not counted).
        for _ in 0..3 {
            held.push(TcpStream::connect(addr).unwrap());
        }
        drop(TcpStream::connect(addr).unwrap());
        // The real sender comes while the silent ones still hold their connections.
        let real = TcpStream::connect(addr).unwrap();
        let real_addr = real.local_addr().unwrap();
        let _real = sender(real, CODE, Control::KeepAlive);
        let t0 = Instant::now();
        let arrival = door.next().unwrap();
        assert!(
            t0.elapsed() < Duration::from_millis(1500),
            "the sender waited for the silent ones: {:?}",
            t0.elapsed()
        );
        assert_eq!(arrival.greeted.first, Control::KeepAlive);
        assert_eq!(arrival.peer, real_addr);
        // Every stray is counted once the silent ones' grace is over.
        let deadline = Instant::now() + Duration::from_secs(5);
        while door.strays() < 7 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(door.take_strays(), 7);
        assert_eq!(door.take_strays(), 0, "taken");
    }

    /// Waits for the door to close `c` (it has dropped it as a stray, so counted and logged it).
    fn closed_by_door(mut c: TcpStream) {
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 256];
        loop {
            match c.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
                    ) =>
                {
                    return
                }
                Err(e) => panic!("the door did not close a stray: {e}"),
            }
        }
    }

    /// Strays the door's log accounts for: one per line of its own, a summary's number.
    fn accounted(said: &[LogLine]) -> u64 {
        said.iter()
            .map(|l| match l.text().strip_prefix("... and ") {
                Some(rest) => rest.split(' ').next().unwrap().parse::<u64>().unwrap(),
                None => {
                    assert!(l.text().starts_with("stray connection from "), "{l:?}");
                    1
                }
            })
            .sum()
    }

    #[test]
    fn a_flood_of_strays_is_a_few_lines_and_summaries_that_add_up() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let window = Duration::from_millis(400);
        let door = FrontDoor::open(
            listener,
            DoorLimits {
                grace: Duration::from_secs(2),
                max_ungreeted: 32,
                log_burst: 3,
                log_window: window,
                ..DoorLimits::default()
            },
            gate(),
        )
        .unwrap();
        let book = door.log.clone();
        let said = || book.said.lock().unwrap().clone();
        let strays = |n: usize| {
            let conns: Vec<TcpStream> = (0..n)
                .map(|_| {
                    let mut c = TcpStream::connect(addr).unwrap();
                    c.write_all(&[0xff; 4]).unwrap();
                    c
                })
                .collect();
            conns.into_iter().for_each(closed_by_door);
        };
        for _ in 0..3 {
            strays(20);
        }
        // A wrong code in the flood: a line of its own all the same.
        let wrong = sender(
            TcpStream::connect(addr).unwrap(),
            "1-purple-sausages",
            Control::Done,
        );
        assert!(wrong.join().unwrap().is_err());
        // Nothing else happens: the summariser says the rest at the window's end.
        let deadline = Instant::now() + Duration::from_secs(5);
        while accounted(&said()) < 61 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let lines = said();
        assert_eq!(accounted(&lines), 61, "{lines:#?}");
        let own = |l: &&LogLine| l.text().starts_with("stray connection from ");
        let tries: Vec<&LogLine> = lines
            .iter()
            .filter(|l| l.text().contains("failed the key agreement"))
            .collect();
        assert_eq!(tries.len(), 1, "{lines:#?}");
        assert!(own(&tries[0]) && matches!(tries[0], LogLine::Warn(_)));
        // 3 lines, the try's, and a summary per window while the strays came (a fraction of a
        // second on loopback; a stall of a window would cost 3 lines more).
        assert!(lines.iter().filter(own).count() <= 3 + 1 + 3, "{lines:#?}");
        assert!(
            lines.len() <= 15,
            "60 strays took {} lines: {lines:#?}",
            lines.len()
        );
        // More strays, then a sender: what is counted is said before it is handed over.
        strays(5);
        let _real = sender(TcpStream::connect(addr).unwrap(), CODE, Control::KeepAlive);
        door.next().unwrap();
        assert_eq!(accounted(&said()), 66, "{:#?}", said());
        // More, then the door closes: they are said.
        strays(5);
        assert_eq!(door.take_strays(), 71);
        drop(door);
        assert_eq!(accounted(&said()), 71, "{:#?}", said());
    }

    #[test]
    fn a_connection_closed_without_a_word_is_taken_quietly_before_and_during_a_session() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let door = FrontDoor::open(listener, DoorLimits::default(), gate()).unwrap();
        let said = || door.log.said.lock().unwrap().clone();
        // A sender's losing connect attempt: connected, and closed before it said anything
        // (with a FIN, or a reset).
        let empty = || {
            let c = TcpStream::connect(addr).unwrap();
            c.shutdown(std::net::Shutdown::Write).unwrap();
            closed_by_door(c);
        };
        let reset = |lines: usize| {
            let c = TcpStream::connect(addr).unwrap();
            socket2::SockRef::from(&c)
                .set_linger(Some(Duration::ZERO))
                .unwrap();
            drop(c);
            let deadline = Instant::now() + Duration::from_secs(5);
            while said().len() < lines && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        empty();
        reset(2);
        // The waiting receiver did not end: the sender behind them is handed over.
        let _real = sender(TcpStream::connect(addr).unwrap(), CODE, Control::KeepAlive);
        let arrival = door.next().unwrap();
        assert_eq!(arrival.greeted.first, Control::KeepAlive);
        // During the session (a losing attempt accepted after the winner): nothing is handed
        // to the session, nothing counted for its summary.
        empty();
        reset(4);
        assert!(
            door.arrivals.is_empty(),
            "something was queued for a session"
        );
        assert_eq!(door.take_strays(), 0, "counted as turned away");
        let lines = said();
        assert_eq!(lines.len(), 4, "{lines:#?}");
        for l in &lines {
            assert!(matches!(l, LogLine::Debug(_)), "said above debug: {l:?}");
            assert!(
                l.text().contains("closed without sending anything"),
                "{l:?}"
            );
        }
    }

    #[test]
    fn beyond_the_bound_a_connection_is_closed_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let door = FrontDoor::open(
            listener,
            DoorLimits {
                grace: Duration::from_secs(5),
                max_ungreeted: 2,
                ..DoorLimits::default()
            },
            gate(),
        )
        .unwrap();
        let _silent: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
        // Both are being greeted before the third comes.
        std::thread::sleep(Duration::from_millis(100));
        let mut third = TcpStream::connect(addr).unwrap();
        third
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let t0 = Instant::now();
        // Told the receiver is busy, and closed.
        let told = crate::net::control::read_frame(&mut third, Duration::from_secs(2)).unwrap();
        assert!(
            matches!(&told, Control::Reject { reason } if reason.starts_with(BUSY)),
            "{told:?}"
        );
        let mut buf = [0u8; 1];
        let n = third.read(&mut buf).unwrap_or(0);
        assert_eq!(n, 0, "closed");
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        assert_eq!(door.strays(), 1);
        drop(door);
    }

    #[test]
    fn one_source_holds_no_more_than_its_share_and_a_sender_is_told_busy() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let door = FrontDoor::open(
            listener,
            DoorLimits {
                grace: Duration::from_secs(5),
                max_ungreeted: 8,
                max_per_source: 2,
                ..DoorLimits::default()
            },
            gate(),
        )
        .unwrap();
        let _silent: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(100));
        // A sender from the same address: told the receiver is busy, in its own words.
        let refused = sender(TcpStream::connect(addr).unwrap(), CODE, Control::KeepAlive);
        let why = refused.join().unwrap().unwrap_err();
        assert!(
            matches!(&why, SessionError::Busy(r) if r.contains("your address")),
            "{why}"
        );
        assert!(why.to_string().starts_with("the receiver is busy"), "{why}");
        // From another address (127.0.0.2 is loopback too): in at once.
        let other =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        other
            .bind(&SocketAddr::from(([127, 0, 0, 2], 0)).into())
            .unwrap();
        other.connect(&addr.into()).unwrap();
        let _real = sender(other.into(), CODE, Control::KeepAlive);
        let arrival = door.next().unwrap();
        assert_eq!(arrival.peer.ip(), std::net::IpAddr::from([127, 0, 0, 2]));
    }

    #[test]
    fn a_source_is_an_ipv4_address_or_an_ipv6_slash_64() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(source_of(ip("192.0.2.7")), ip("192.0.2.7"));
        assert_eq!(source_of(ip("::ffff:192.0.2.7")), ip("192.0.2.7"));
        assert_eq!(
            source_of(ip("2001:db8:1:2:aaaa:bbbb:cccc:dddd")),
            ip("2001:db8:1:2::")
        );
        assert_ne!(
            source_of(ip("2001:db8:1:2::1")),
            source_of(ip("2001:db8:1:3::1"))
        );
    }

    #[test]
    fn a_connection_that_says_nothing_is_dropped_at_the_silent_grace() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let silent_grace = Duration::from_millis(200);
        let door = FrontDoor::open(
            listener.try_clone().unwrap(),
            DoorLimits {
                grace: Duration::from_secs(5),
                silent_grace,
                ..DoorLimits::default()
            },
            gate(),
        )
        .unwrap();
        let addr = listener.local_addr().unwrap();
        let t0 = Instant::now();
        closed_by_door(TcpStream::connect(addr).unwrap());
        let took = t0.elapsed();
        assert!(
            took >= silent_grace && took < Duration::from_secs(2),
            "{took:?}"
        );
        // One that said something has the whole grace.
        let mut spoke = TcpStream::connect(addr).unwrap();
        spoke.write_all(&[0, 0]).unwrap();
        std::thread::sleep(Duration::from_millis(600));
        spoke.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        assert!(
            matches!(spoke.read(&mut b), Err(e) if e.kind() == io::ErrorKind::WouldBlock),
            "closed before its grace"
        );
        assert_eq!(door.strays(), 1);
    }
}
