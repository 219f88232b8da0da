//! Exit codes: the table users and scripts rely on, and the one place that maps each typed
//! failure to its code.

use hurtle_engine::net::control::ControlError;
use hurtle_engine::SessionError;
use hurtle_proto::wire::AbortCause;
use hurtle_relay::client::RelayError;

/// Success.
pub const OK: u8 = 0;
/// Any failure not named below (a protocol error, an expired or cancelled code, another
/// version of hurtle on the far side of `hurtle cp`).
pub const OTHER: u8 = 1;
/// Usage: a bad flag, value, address or configuration file, a malformed code (its shape, or a
/// word not in the list; checked before anything connects).
pub const USAGE: u8 = 2;
/// The receiver refused the transfer (a wrong code, a file exists, its destination is full or
/// not writable, an unsafe path); the sender's code.
pub const REFUSED: u8 = 3;
/// Network: a host that cannot be resolved or reached, a stalled transfer, UDP blocked, a peer
/// that disconnected or was interrupted.
pub const NETWORK: u8 = 4;
/// Verification: a block or file whose BLAKE3 does not match, a source file that changed while
/// it was sent.
pub const VERIFICATION: u8 = 5;
/// Local storage: disk full, a destination that is not a writable directory, an unsafe path, a
/// source that cannot be read.
pub const STORAGE: u8 = 6;
/// `hurtle cp`: ssh itself failed (authentication, host key, an unreachable host: ssh exits
/// 255); ssh's own message is shown.
pub const SSH: u8 = 7;
/// `hurtle cp`: no hurtle on the far side (its shell exits 127, or 126 when it is not
/// executable).
pub const REMOTE_MISSING: u8 = 8;
/// Interrupted by SIGINT (Ctrl-C): 128 + 2, as shells report it.
pub const SIGINT: u8 = 130;
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
  130  interrupted by SIGINT (Ctrl-C); 143 by SIGTERM: what was verified is kept, and the same
       command again resumes";

/// The name of an exit code's kind of failure, as the `--json` error object gives it
/// (`{"error": {"kind": ..., "message": ..., "exit_code": ...}}`).
pub fn kind(code: u8) -> &'static str {
    match code {
        OK => "ok",
        USAGE => "usage",
        REFUSED => "refused",
        NETWORK => "network",
        VERIFICATION => "verification",
        STORAGE => "storage",
        SSH => "ssh",
        REMOTE_MISSING => "remote_missing",
        SIGINT | SIGTERM => "interrupted",
        _ => "other",
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
        Failure::new(if e.is_network() { NETWORK } else { OTHER }, e)
    }
}

/// What a command returns.
pub type Outcome = Result<(), Failure>;

/// The exit code of a session's error, on either side.
pub fn session_code(e: &SessionError) -> u8 {
    match e {
        SessionError::Refused { .. }
        | SessionError::NotAuthenticated(_)
        | SessionError::CodeSpent(_) => REFUSED,
        SessionError::NoSecret => USAGE,
        SessionError::PeerAborted { cause, .. } => match cause {
            AbortCause::Refused => REFUSED,
            AbortCause::Network | AbortCause::Interrupted => NETWORK,
            AbortCause::Verification => VERIFICATION,
            _ => OTHER,
        },
        // Bytes that are not a message are the peer's fault, not the network's.
        SessionError::Control(ControlError::Frame(_)) => OTHER,
        SessionError::Connect { .. }
        | SessionError::Listen { .. }
        | SessionError::Control(_)
        | SessionError::PeerGone { .. }
        | SessionError::Busy(_)
        | SessionError::UdpBlocked { .. }
        | SessionError::Stalled(_)
        | SessionError::Udp(_) => NETWORK,
        SessionError::Verification { .. }
        | SessionError::VerificationInTheClear { .. }
        | SessionError::HashMismatch { .. }
        | SessionError::SourceChanged(_) => VERIFICATION,
        SessionError::Store(_) | SessionError::Path(_) | SessionError::Walk(_) => STORAGE,
        SessionError::Interrupted { .. } => SIGINT,
        _ => OTHER,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hurtle_engine::error::Side;

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
