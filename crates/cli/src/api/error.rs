//! The errors of the API ([`Error`]) and their kinds ([`ErrorKind`]): each kind is one of the
//! command line's exit codes, so that a program and a shell script judge a failure alike.
//!
//! This is the one place that says which exit code each of the engine's and the relay's
//! errors is: the command's `exit` module takes its codes and its mapping from here
//! ([`ErrorKind::exit_code`], `ErrorKind::from(&SessionError)`, `ErrorKind::from(&RelayError)`).

use hurtle_engine::error::Side;
use hurtle_engine::net::control::ControlError;
use hurtle_engine::SessionError;
use hurtle_proto::wire::AbortCause;
use hurtle_relay::client::RelayError;

/// What kind of failure an [`Error`] is: one per exit code of the `hurtle` command.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Anything not named below (a protocol error, an expired or cancelled code): exit 1.
    Other,
    /// A bad option or value, a malformed code, no code or key: exit 2. Nothing was started.
    Usage,
    /// The receiver refused the transfer (a wrong code, a file exists, no room): exit 3.
    Refused,
    /// A host that cannot be resolved or reached, a stall, UDP blocked, a peer gone: exit 4.
    Network,
    /// A block or file whose BLAKE3 does not match, a source that changed: exit 5.
    Verification,
    /// Local storage: the output directory not writable, disk full, an unsafe path, an
    /// unreadable source: exit 6.
    Storage,
    /// The receiver proved another identity key than the one the sender pinned for its
    /// address (a man in the middle, or a new key; docs/identity.md): exit 9. Nothing was
    /// sent.
    Identity,
    /// Cancelled ([`Transfer::cancel`](crate::Transfer::cancel)): what was verified is kept
    /// and the same transfer again resumes from it: exit 130, as for Ctrl-C.
    Interrupted,
}

impl ErrorKind {
    /// The exit code the `hurtle` command gives this kind of failure.
    pub const fn exit_code(self) -> u8 {
        match self {
            ErrorKind::Other => 1,
            ErrorKind::Usage => 2,
            ErrorKind::Refused => 3,
            ErrorKind::Network => 4,
            ErrorKind::Verification => 5,
            ErrorKind::Storage => 6,
            ErrorKind::Identity => 9,
            ErrorKind::Interrupted => 130,
        }
    }

    /// The kind's name, as the command's `--json` error object gives it (`usage`, `refused`,
    /// `network`, `verification`, `storage`, `identity`, `interrupted`, `other`).
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Other => "other",
            ErrorKind::Usage => "usage",
            ErrorKind::Refused => "refused",
            ErrorKind::Network => "network",
            ErrorKind::Verification => "verification",
            ErrorKind::Storage => "storage",
            ErrorKind::Identity => "identity",
            ErrorKind::Interrupted => "interrupted",
        }
    }
}

impl From<&SessionError> for ErrorKind {
    /// The kind of a session's error, on either side: the command's exit code for it.
    fn from(e: &SessionError) -> ErrorKind {
        session_kind(e)
    }
}

impl From<&RelayError> for ErrorKind {
    /// A relay that cannot be reached or answers no more is the network's failure; anything
    /// else the relay says (an unknown code, a protocol error) is [`ErrorKind::Other`].
    fn from(e: &RelayError) -> ErrorKind {
        if e.is_network() {
            ErrorKind::Network
        } else {
            ErrorKind::Other
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a transfer, or building a sender or receiver, failed. Each message is one line.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad option or value (the message names it and says what is accepted).
    #[error("{0}")]
    Usage(String),
    /// The output directory is not, and cannot be made, a writable directory.
    #[error("{0}")]
    Storage(String),
    /// A host name that does not resolve.
    #[error("{0}")]
    Resolve(String),
    /// The session failed (its kind follows the engine's error, as the command's exit code
    /// does).
    #[error(transparent)]
    Session(SessionError),
    /// Talking to the relay failed.
    #[error(transparent)]
    Relay(#[from] RelayError),
    /// The relay cancelled the code, or it expired before a sender came.
    #[error("{0}")]
    Code(String),
    /// The code was refused by the other side through the relay: a receiver's answer to a
    /// sender's code that the sender did not accept, or a sender's code answered with other
    /// codes until it was spent.
    #[error("{0}")]
    Refused(String),
    /// The transfer was cancelled: what was verified is kept, and the same transfer again
    /// resumes from it.
    #[error("{}", interrupted(*.receiver, *.held, *.total))]
    Interrupted {
        /// Whether this side is the receiver.
        receiver: bool,
        /// Bytes the receiver holds, verified (as this side knows it).
        held: u64,
        /// Bytes the transfer was to move (0 if it had not started moving).
        total: u64,
    },
    /// A thread could not be started, or ended without a result.
    #[error("{0}")]
    Thread(String),
}

fn interrupted(receiver: bool, held: u64, total: u64) -> String {
    if total == 0 {
        return "cancelled before any data moved; nothing to keep".into();
    }
    let whose = if receiver {
        "its hidden part files (.NAME.hurtle-part)"
    } else {
        "the receiver's hidden part files"
    };
    format!(
        "cancelled: {held} of {total} bytes verified are kept in {whose}, and the same transfer \
         again resumes from them"
    )
}

impl Error {
    /// The kind of failure: which of the command's exit codes it is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Usage(_) => ErrorKind::Usage,
            Error::Storage(_) => ErrorKind::Storage,
            Error::Resolve(_) => ErrorKind::Network,
            Error::Session(e) => session_kind(e),
            Error::Relay(e) => ErrorKind::from(e),
            Error::Code(_) | Error::Thread(_) => ErrorKind::Other,
            Error::Refused(_) => ErrorKind::Refused,
            Error::Interrupted { .. } => ErrorKind::Interrupted,
        }
    }

    /// The exit code the `hurtle` command gives this failure (`self.kind().exit_code()`).
    pub fn exit_code(&self) -> u8 {
        self.kind().exit_code()
    }

    pub(crate) fn usage(what: &str, detail: impl std::fmt::Display) -> Error {
        Error::Usage(format!("{what}: {detail}"))
    }
}

impl From<SessionError> for Error {
    fn from(e: SessionError) -> Self {
        match e {
            SessionError::Interrupted { side } => Error::Interrupted {
                receiver: side == Side::Receiver,
                held: 0,
                total: 0,
            },
            e => Error::Session(e),
        }
    }
}

/// The kind of a session's error, on either side: the command's exit code for it.
fn session_kind(e: &SessionError) -> ErrorKind {
    match e {
        SessionError::Refused { .. }
        | SessionError::NotAuthenticated(_)
        | SessionError::CodeSpent(_) => ErrorKind::Refused,
        SessionError::NoSecret => ErrorKind::Usage,
        SessionError::PeerAborted { cause, .. } => match cause {
            AbortCause::Refused => ErrorKind::Refused,
            AbortCause::Network | AbortCause::Interrupted => ErrorKind::Network,
            AbortCause::Verification => ErrorKind::Verification,
            _ => ErrorKind::Other,
        },
        // Bytes that are not a message are the peer's fault, not the network's.
        SessionError::Control(ControlError::Frame(_)) => ErrorKind::Other,
        SessionError::Connect { .. }
        | SessionError::Listen { .. }
        | SessionError::Control(_)
        | SessionError::PeerGone { .. }
        | SessionError::Busy(_)
        | SessionError::UdpBlocked { .. }
        | SessionError::Stalled(_)
        | SessionError::Udp(_) => ErrorKind::Network,
        SessionError::Verification { .. }
        | SessionError::VerificationInTheClear { .. }
        | SessionError::HashMismatch { .. }
        | SessionError::SourceChanged(_) => ErrorKind::Verification,
        SessionError::Store(_) | SessionError::Path(_) | SessionError::Walk(_) => {
            ErrorKind::Storage
        }
        SessionError::Interrupted { .. } => ErrorKind::Interrupted,
        SessionError::IdentityChanged(_) => ErrorKind::Identity,
        _ => ErrorKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_the_command_s_exit_codes() {
        let aborted = |cause| {
            Error::from(SessionError::PeerAborted {
                peer: Side::Receiver,
                cause,
                reason: "x".into(),
            })
        };
        assert_eq!(aborted(AbortCause::Refused).exit_code(), 3);
        assert_eq!(aborted(AbortCause::Interrupted).kind(), ErrorKind::Network);
        assert_eq!(aborted(AbortCause::Verification).exit_code(), 5);
        assert_eq!(Error::from(SessionError::NoSecret).exit_code(), 2);
        let cancelled = Error::from(SessionError::Interrupted { side: Side::Sender });
        assert_eq!(cancelled.exit_code(), 130);
        assert_eq!(cancelled.kind().as_str(), "interrupted");
        assert_eq!(Error::Usage("x".into()).kind().to_string(), "usage");
        let busy = SessionError::Busy("another transfer".into());
        assert_eq!(ErrorKind::from(&busy), ErrorKind::Network);
        assert_eq!(aborted(AbortCause::Failed).kind(), ErrorKind::Other);
        let changed =
            SessionError::from(hurtle_engine::fs::StoreError::SourceChanged { path: "a".into() });
        assert_eq!(ErrorKind::from(&changed), ErrorKind::Verification);
    }
}
