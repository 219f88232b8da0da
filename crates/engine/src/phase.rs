//! The drivers' side of the data phase's machines (`hurtle_proto::session::data`): what
//! breaks its rules, in the session's terms ([`session_error`]).

use crate::error::{SessionError, Side};
use crate::net::control::ControlError;
use hurtle_proto::hash::to_hex;
use hurtle_proto::session::data::DataError;

/// `e`, seen by this side of a session whose peer is `peer`; `path_of` names a file by its
/// index in the layout.
pub(crate) fn session_error(
    e: DataError,
    peer: Side,
    path_of: impl Fn(u32) -> String,
) -> SessionError {
    match e {
        DataError::EarlyConfirmation { file } => SessionError::EarlyConfirmation(file),
        DataError::HashMismatch { file, got, want } => SessionError::HashMismatch {
            path: path_of(file),
            got: to_hex(&got),
            want: to_hex(&want),
        },
        DataError::Stalled { after } => SessionError::Stalled(after.as_secs()),
        DataError::UdpBlocked { channel, secs } => SessionError::UdpBlocked { channel, secs },
        DataError::GaveUp { block, file } => SessionError::Verification {
            path: file.map(&path_of).unwrap_or_default(),
            block,
            times: hurtle_proto::verify::MAX_BLOCK_FAILURES,
        },
        DataError::GaveUpInTheClear { block, file } => SessionError::VerificationInTheClear {
            path: file.map(&path_of).unwrap_or_default(),
            block,
            times: hurtle_proto::verify::MAX_BLOCK_FAILURES,
        },
        DataError::FinishedIncomplete { file } => SessionError::FinishedIncomplete(path_of(file)),
        DataError::PeerGone => SessionError::PeerGone { peer },
        DataError::PeerSilent { after } => ControlError::Timeout(after).into(),
        DataError::WrongSession { .. } => SessionError::Unexpected {
            wanted: WANTED,
            got: "BlockHashes",
        },
        DataError::Unexpected(msg) => SessionError::unexpected(peer, *msg, WANTED),
    }
}

/// What the data phase waits for, in an error's words.
const WANTED: &str = "a data-phase message";
