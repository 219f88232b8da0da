//! The errors a session can end with. Each message is one line that names the cause.

use crate::control::{ControlError, Incoming};
use hurtle_proto::wire::Control;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

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
    /// The peer broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The peer aborted the session.
    #[error("the peer aborted: {0}")]
    PeerAborted(String),
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
    /// The sender found UDP blocked and ended the session to reconnect with parallel TCP.
    #[error("the sender found UDP blocked and is reconnecting over TCP")]
    FellBack,
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
    /// Storage failed (disk full, permissions, unsafe path ...).
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// A path in the manifest is unsafe.
    #[error(transparent)]
    Path(#[from] crate::store::PathError),
    /// The sources could not be listed.
    #[error(transparent)]
    Walk(#[from] crate::walk::WalkError),
    /// A UDP socket failed.
    #[error(transparent)]
    Udp(#[from] crate::udp::UdpError),
    /// The layout could not be built.
    #[error(transparent)]
    Layout(#[from] hurtle_proto::layout::LayoutError),
    /// Another local I/O error.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}

impl SessionError {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        SessionError::Io {
            context: context.into(),
            source,
        }
    }

    /// The peer sent `msg` where `wanted` belongs: its abort, or a protocol error naming both.
    pub(crate) fn unexpected(msg: Control, wanted: &str) -> Self {
        match msg {
            Control::Abort { reason } => SessionError::PeerAborted(reason),
            other => SessionError::Protocol(format!("expected {wanted}, got {}", other.name())),
        }
    }
}

/// The next control message, or why there is none within `timeout`.
pub(crate) fn next_control(rx: &Incoming, timeout: Duration) -> Result<Control, SessionError> {
    match rx.recv_timeout(timeout) {
        Ok(Ok(msg)) => Ok(msg),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(ControlError::Timeout(timeout).into()),
    }
}
