//! The errors a session can end with. Each message is one line that names the cause.

use crate::net::channel_link::LinkError;
use crate::net::control::ControlError;
use hurtle_proto::wire::{AbortCause, Control};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Why a send or a receive failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The receiver could not be reached.
    #[error("cannot reach the receiver at {addr}: {source}")]
    Connect {
        /// Address tried.
        addr: SocketAddr,
        /// The socket error.
        source: std::io::Error,
    },
    /// The listening address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// Address tried.
        addr: SocketAddr,
        /// The socket error.
        source: std::io::Error,
    },
    /// The control connection failed.
    #[error(transparent)]
    Control(#[from] ControlError),
    /// The peer speaks another version of the protocol, or not hurtle at all.
    #[error("{0}")]
    Incompatible(String),
    /// The peer broke the protocol.
    #[error("protocol error: expected {wanted}, got {got}")]
    Unexpected {
        /// What the session waited for.
        wanted: &'static str,
        /// The message that came instead.
        got: &'static str,
    },
    /// The key agreement's answer made no sense (not a wrong secret, not a refusal).
    #[error("protocol error: {0}")]
    Agreement(hurtle_proto::secure::AgreeError),
    /// Parallel TCP: the sender did not open every data connection in time.
    #[error("the sender did not open its TCP data connections within {0} s")]
    DataConnectionsLate(u64),
    /// The sender said it was done with a file still incomplete here.
    #[error("protocol error: the sender finished but {0} is incomplete")]
    FinishedIncomplete(String),
    /// The receiver confirmed a file before it could have had it.
    #[error("protocol error: the receiver confirmed file {0} before it was sent")]
    EarlyConfirmation(u32),
    /// A channel sent all the datagrams its packet numbers allow under one key (2^47, far more
    /// than any transfer needs): a packet number is never used twice, so the session ends.
    #[error(transparent)]
    PacketsExhausted(#[from] hurtle_proto::secure::PacketsExhausted),
    /// A thread of this side's session ended before it should have: a bug, said as one.
    #[error("internal error: {0}")]
    Internal(&'static str),
    /// The data key refused to seal a frame whose nonce was used before (a bug, said as one),
    /// or more data frames failed authentication than AES-GCM's integrity limit allows.
    #[error(transparent)]
    DataKey(LinkError),
    /// Neither a code nor a key was given (authentication is never off).
    #[error("no code or key: give the receiver's code with --code (or HURTLE_CODE), or a key file with --key")]
    NoSecret,
    /// The key agreement failed: the peer holds another code or key, or someone in between
    /// changed the messages. Nothing was sent or written.
    #[error("{0}")]
    NotAuthenticated(String),
    /// The receiver turned the connection away for want of room (too many connections from
    /// this address being greeted, or tries of its code under way); trying again later may
    /// work. Nothing was sent.
    #[error("the receiver is busy: {0}")]
    Busy(String),
    /// The receiver proved another identity key than the one the sender pinned for its
    /// address (a man in the middle, or a new key): nothing was sent. The text names both
    /// fingerprints and the known-receivers line to remove.
    #[error("{0}")]
    IdentityChanged(String),
    /// A receiver's code was tried too often with the wrong words; it is spent.
    #[error("the code was tried {0} times with the wrong words and is no longer valid; nothing was written (run the receiver again for a new code)")]
    CodeSpent(u32),
    /// The peer aborted the session and said why.
    #[error("{}", peer_aborted(*.peer, *.cause, .reason))]
    PeerAborted {
        /// Which side the peer is.
        peer: Side,
        /// What kind of failure it reported.
        cause: AbortCause,
        /// Its one-line reason.
        reason: String,
    },
    /// The peer closed the control connection before the session ended (it was killed, or its
    /// host or the network went away).
    #[error("the {peer} disconnected before the transfer finished")]
    PeerGone {
        /// Which side the peer is.
        peer: Side,
    },
    /// This side was interrupted (SIGINT or SIGTERM) and ended the session; the peer is told.
    #[error("the {side} was interrupted")]
    Interrupted {
        /// This side.
        side: Side,
    },
    /// The receiver refused an entry of the manifest.
    #[error("the receiver refused {path}: {reason}")]
    Refused {
        /// The entry.
        path: String,
        /// Its reason.
        reason: String,
    },
    /// No datagram of any tried size reached the receiver.
    #[error("no UDP datagrams reached the receiver within {secs} s on channel {channel} (is UDP blocked between the hosts?)")]
    UdpBlocked {
        /// The channel that got nothing through.
        channel: u16,
        /// How long was tried.
        secs: u64,
    },
    /// A source file changed while it was being sent.
    #[error("source file changed while being sent: {0}")]
    SourceChanged(PathBuf),
    /// A block kept failing verification.
    #[error("block {block} of {path} failed verification repeatedly, {times} attempts at most (did the source change?)")]
    Verification {
        /// File path.
        path: String,
        /// Global block number.
        block: u64,
        /// Attempts.
        times: u8,
    },
    /// A block kept failing verification, its data coming in the clear (`--no-encryption`):
    /// anyone on the path could have changed it.
    #[error("block {block} of {path} failed verification {times} times; with --no-encryption data datagrams are not authenticated, so they may have been changed on the way (or the source changed); without it they would have been dropped")]
    VerificationInTheClear {
        /// File path.
        path: String,
        /// Global block number.
        block: u64,
        /// Attempts.
        times: u8,
    },
    /// The receiver reported a file hash that differs from the sender's.
    #[error("{path}: receiver's BLAKE3 {got} differs from the sender's {want}")]
    HashMismatch {
        /// File path.
        path: String,
        /// Receiver's hash.
        got: String,
        /// Sender's hash.
        want: String,
    },
    /// No progress for too long.
    #[error("transfer stalled: no progress for {0} s")]
    Stalled(u64),
    /// Storage failed (disk full, permissions, unsafe path ...). A source file that changed is
    /// [`SessionError::SourceChanged`] instead.
    #[error(transparent)]
    Store(crate::fs::StoreError),
    /// A path in the manifest is unsafe.
    #[error(transparent)]
    Path(#[from] crate::fs::PathError),
    /// The sources could not be listed.
    #[error(transparent)]
    Walk(#[from] crate::walk::WalkError),
    /// A UDP socket failed.
    #[error(transparent)]
    Udp(#[from] crate::net::udp::UdpError),
    /// The layout could not be built.
    #[error(transparent)]
    Layout(#[from] hurtle_proto::layout::LayoutError),
    /// The peer broke a rule of the session's set-up (a manifest reply of the wrong length, a
    /// skip of a file not offered, holes outside a file ...).
    #[error("protocol error: {0}")]
    Setup(hurtle_proto::session::SetupError),
    /// Another local I/O error.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}

/// One side of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The side that sends files.
    Sender,
    /// The side that receives them.
    Receiver,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Sender => "sender",
            Side::Receiver => "receiver",
        })
    }
}

fn peer_aborted(peer: Side, cause: AbortCause, reason: &str) -> String {
    match cause {
        // The interrupted side's own words ("the sender was interrupted") say it already.
        AbortCause::Interrupted => format!("the {peer} was interrupted"),
        // A sender refuses only on the receiver's behalf, and says so.
        AbortCause::Refused if peer == Side::Sender => reason.to_string(),
        AbortCause::Refused => format!("the {peer} cannot take the transfer: {reason}"),
        _ => format!("the {peer} failed: {reason}"),
    }
}

impl From<crate::fs::StoreError> for SessionError {
    fn from(e: crate::fs::StoreError) -> Self {
        match e {
            crate::fs::StoreError::SourceChanged { path } => SessionError::SourceChanged(path),
            other => SessionError::Store(other),
        }
    }
}

impl From<LinkError> for SessionError {
    fn from(e: LinkError) -> Self {
        match e {
            LinkError::Udp(e) => SessionError::Udp(e),
            LinkError::Tcp(e) => SessionError::io("TCP data connection", e),
            e @ (LinkError::Seal(_) | LinkError::Integrity(_)) => SessionError::DataKey(e),
        }
    }
}

impl SessionError {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        SessionError::Io {
            context: context.into(),
            source,
        }
    }

    /// The peer (`peer`) sent `msg` where `wanted` belongs: its abort, or a protocol error
    /// naming both.
    pub(crate) fn unexpected(peer: Side, msg: Control, wanted: &'static str) -> Self {
        match msg {
            Control::Abort { cause, reason } => SessionError::PeerAborted {
                peer,
                cause,
                reason,
            },
            Control::Reject { reason } => SessionError::PeerAborted {
                peer,
                cause: AbortCause::Failed,
                reason,
            },
            other => SessionError::Unexpected {
                wanted,
                got: other.name(),
            },
        }
    }

    /// Whether the peer already knows the session is over (it aborted or went away), so that
    /// telling it is pointless.
    pub(crate) fn peer_knows(&self) -> bool {
        matches!(
            self,
            SessionError::PeerAborted { .. }
                | SessionError::PeerGone { .. }
                | SessionError::Control(_)
        )
    }

    /// The message that tells the peer this side (`side`) ends the session with this error.
    pub(crate) fn to_abort(&self, side: Side) -> Control {
        if let SessionError::Incompatible(reason) = self {
            // Said in the one message every version reads.
            return Control::Reject {
                reason: reason.clone(),
            };
        }
        Control::Abort {
            cause: self.abort_cause(side),
            reason: self.to_string(),
        }
    }

    /// How the peer should report this error of `side`.
    pub fn abort_cause(&self, side: Side) -> AbortCause {
        match self {
            SessionError::Interrupted { .. } => AbortCause::Interrupted,
            SessionError::Refused { .. } => AbortCause::Refused,
            SessionError::Store(_) | SessionError::Path(_) if side == Side::Receiver => {
                AbortCause::Refused
            }
            SessionError::Connect { .. }
            | SessionError::Control(_)
            | SessionError::UdpBlocked { .. }
            | SessionError::Stalled(_)
            | SessionError::PeerGone { .. }
            | SessionError::Udp(_) => AbortCause::Network,
            SessionError::Verification { .. }
            | SessionError::VerificationInTheClear { .. }
            | SessionError::HashMismatch { .. }
            | SessionError::SourceChanged(_) => AbortCause::Verification,
            _ => AbortCause::Failed,
        }
    }
}
