//! Exit codes: the table users and scripts rely on. The codes of the kinds of failure a
//! transfer has, and which error is which kind, are the library's
//! ([`hurtle::ErrorKind`]): the command takes them from there, and adds its own (ssh, a far
//! side without hurtle, SIGTERM).

use hurtle::ErrorKind;
use hurtle_engine::SessionError;
use hurtle_relay::client::RelayError;

/// Success.
pub const OK: u8 = 0;
/// Any failure not named below (a protocol error, an expired or cancelled code, another
/// version of hurtle on the far side of `hurtle cp`).
pub const OTHER: u8 = ErrorKind::Other.exit_code();
/// Usage: a bad flag, value, address or configuration file, a malformed code (its shape, or a
/// word not in the list; checked before anything connects).
pub const USAGE: u8 = ErrorKind::Usage.exit_code();
/// The receiver refused the transfer (a wrong code, a file exists, its destination is full or
/// not writable, an unsafe path); the sender's code.
pub const REFUSED: u8 = ErrorKind::Refused.exit_code();
/// Network: a host that cannot be resolved or reached, a stalled transfer, UDP blocked, a peer
/// that disconnected or was interrupted.
pub const NETWORK: u8 = ErrorKind::Network.exit_code();
/// Verification: a block or file whose BLAKE3 does not match, a source file that changed while
/// it was sent.
pub const VERIFICATION: u8 = ErrorKind::Verification.exit_code();
/// Local storage: disk full, a destination that is not a writable directory, an unsafe path, a
/// source that cannot be read.
pub const STORAGE: u8 = ErrorKind::Storage.exit_code();
/// `hurtle cp`: ssh itself failed (authentication, host key, an unreachable host: ssh exits
/// 255); ssh's own message is shown.
pub const SSH: u8 = 7;
/// `hurtle cp`: no hurtle on the far side (its shell exits 127, or 126 when it is not
/// executable).
pub const REMOTE_MISSING: u8 = 8;
/// Interrupted by SIGINT (Ctrl-C): 128 + 2, as shells report it.
pub const SIGINT: u8 = ErrorKind::Interrupted.exit_code();
/// Interrupted by SIGTERM: 128 + 15.
pub const SIGTERM: u8 = 143;

/// The table shown at the end of `--help` and in docs/usage.md (a test keeps them equal).
pub const TABLE: &str = "\
Exit codes:
  0    success
  1    other failure (a protocol error, an expired or cancelled code, another hurtle version on
       the far side of cp)
  2    usage: a bad flag, value, address or configuration file; a malformed code (not a number
       and 2 or 3 words of the list: checked before anything connects, no try is spent)
  3    refused by the receiver: a wrong code (one of the receiver's 3 tries), a file exists,
       its destination is full or not writable
  4    network: unresolvable or unreachable host, stalled, UDP blocked, peer gone or interrupted
  5    verification: a hash mismatch, a source file changed while it was sent
  6    local storage: disk full, --out not a writable directory, unsafe path, unreadable source
  7    cp: ssh failed (authentication, host key, unreachable host; ssh's message is shown)
  8    cp: no hurtle on the far side (install it there, or name it with --remote-hurtle)
  9    identity: the receiver proved another identity key than the one pinned for its address
       (a man in the middle, or a new key: the message names the known-receivers line)
  130  interrupted by SIGINT (Ctrl-C); 143 by SIGTERM: what was verified is kept, and the same
       command again resumes";

/// The name of an exit code's kind of failure, as the `--json` error object gives it
/// (`{"error": {"kind": ..., "message": ..., "exit_code": ...}}`).
pub fn kind(code: u8) -> &'static str {
    const KINDS: [ErrorKind; 7] = [
        ErrorKind::Usage,
        ErrorKind::Refused,
        ErrorKind::Network,
        ErrorKind::Verification,
        ErrorKind::Storage,
        ErrorKind::Identity,
        ErrorKind::Interrupted,
    ];
    match code {
        OK => "ok",
        SSH => "ssh",
        REMOTE_MISSING => "remote_missing",
        SIGTERM => ErrorKind::Interrupted.as_str(),
        _ => KINDS
            .iter()
            .find(|k| k.exit_code() == code)
            .map_or(ErrorKind::Other.as_str(), |k| k.as_str()),
    }
}

/// The `--json` error object of a failure: `{"error": {"kind", "message", "exit_code"}}`, one
/// line.
pub fn json_error(code: u8, message: &str) -> String {
    serde_json::json!({
        "error": {"kind": kind(code), "message": message, "exit_code": code}
    })
    .to_string()
}

/// A failed command: its exit code and what to print.
#[derive(Debug)]
pub struct Failure {
    /// The process exit code.
    pub code: u8,
    /// The error, printed on one line.
    pub error: anyhow::Error,
}

impl Failure {
    /// A failure with this code.
    pub fn new(code: u8, error: impl Into<anyhow::Error>) -> Self {
        Failure {
            code,
            error: error.into(),
        }
    }

    /// A usage error (exit 2).
    pub fn usage(msg: impl std::fmt::Display) -> Self {
        Failure::new(USAGE, anyhow::anyhow!("{msg}"))
    }
}

impl From<SessionError> for Failure {
    fn from(e: SessionError) -> Self {
        Failure::new(session_code(&e), e)
    }
}

impl From<RelayError> for Failure {
    fn from(e: RelayError) -> Self {
        Failure::new(ErrorKind::from(&e).exit_code(), e)
    }
}

impl From<hurtle::Error> for Failure {
    /// A failure of the library: its kind's exit code, its message.
    fn from(e: hurtle::Error) -> Self {
        Failure::new(e.exit_code(), e)
    }
}

/// What a command returns.
pub type Outcome = Result<(), Failure>;

/// The exit code of a session's error, on either side (the library's
/// [`ErrorKind`] of it).
pub fn session_code(e: &SessionError) -> u8 {
    ErrorKind::from(e).exit_code()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hurtle_engine::error::Side;
    use hurtle_proto::wire::AbortCause;

    #[test]
    fn the_json_error_names_the_kind_of_its_exit_code() {
        let v: serde_json::Value =
            serde_json::from_str(&json_error(USAGE, "bad \"x\"\nhere")).unwrap();
        assert_eq!(v["error"]["kind"], "usage");
        assert_eq!(v["error"]["message"], "bad \"x\"\nhere");
        assert_eq!(v["error"]["exit_code"], 2);
        for (code, name) in [
            (OTHER, "other"),
            (REFUSED, "refused"),
            (NETWORK, "network"),
            (VERIFICATION, "verification"),
            (STORAGE, "storage"),
            (SSH, "ssh"),
            (REMOTE_MISSING, "remote_missing"),
            (ErrorKind::Identity.exit_code(), "identity"),
            (SIGINT, "interrupted"),
            (SIGTERM, "interrupted"),
        ] {
            assert_eq!(kind(code), name);
        }
    }

    #[test]
    fn a_peer_abort_exits_as_its_cause() {
        let aborted = |cause| SessionError::PeerAborted {
            peer: Side::Receiver,
            cause,
            reason: "x".into(),
        };
        assert_eq!(session_code(&aborted(AbortCause::Refused)), REFUSED);
        assert_eq!(session_code(&aborted(AbortCause::Interrupted)), NETWORK);
        assert_eq!(
            session_code(&aborted(AbortCause::Verification)),
            VERIFICATION
        );
        assert_eq!(session_code(&aborted(AbortCause::Failed)), OTHER);
        let changed =
            SessionError::from(hurtle_engine::fs::StoreError::SourceChanged { path: "a".into() });
        assert_eq!(session_code(&changed), VERIFICATION);
    }
}
