//! The data phase and the finish, after the set-up: one state machine per side
//! ([`SenderData`], [`ReceiverData`]) that takes the control messages of the data phase, what
//! the side's channel threads found (a block's value, a channel heard or silent) and the time
//! in, and hands control messages to send, commands for the channels and work for the driver
//! (commit a file, set a rate, move the channels to another path) out.
//!
//! What they own, the rules of the data phase that both peers must keep alike:
//!
//! - **Block values and the file check.** The sender passes each block's value on as it reads
//!   it (under its data phase's session id) and keeps them in a [`BlockTable`]; a file's
//!   `FileDone` is taken only when its hash is the root of the values the sender read (an
//!   earlier one, or another hash, ends the session). The receiver's [`Verifier`] meets the
//!   sender's values with its own; a verified block goes to its file's journal, a verified file
//!   to the committer, a block that fails goes back to its channel, a block that fails too often
//!   ends the session. Values tagged with superseded early data's session id are dropped, any
//!   other session id is an error.
//! - **Repair routing.** A `Nack` or `ChannelDone` goes to its channel (unknown channels are
//!   dropped); the first copy of each report and NACK counts, whichever path brought it
//!   ([`Dedup`]).
//! - **Rate.** The sender's [`RateController`] takes every report, and in `auto` asks about
//!   silence once per report interval.
//! - **The path.** A session that may move its channels ([`DataPath`]) moves them from UDP to
//!   TCP once, when the receiver says UDP is silent or the sender's probes find it blocked;
//!   the receiver's [`SilenceWatch`] names the silent channels, and it moves at `Fallback`.
//!   Nothing is sent again that was delivered: each channel goes on where it was.
//! - **Liveness and the end.** The sender sends a keep-alive every [`KEEP_ALIVE`] and gives up
//!   when the receiver has confirmed nothing new for the stall time; the session is done when
//!   every file is confirmed. The receiver ends at `Done` once every file is in place, and
//!   takes a closed connection as that `Done` when every file already is (the sender ends as
//!   soon as every file is confirmed, and its `Done` can be lost to a reset); a sender silent
//!   for the idle time (no keep-alive either) ends it.
//!
//! What they leave to the driver: sockets, threads and files; the per-channel machines
//! ([`crate::ChannelSender`], [`crate::ChannelReceiver`]), which stay on their channels'
//! threads; reading and hashing blocks; checking a source file unchanged; committing files;
//! probing payload sizes; and building the receiver's reports from its counters.
//!
//! Both machines have the surface of the set-up's: `handle` a message, `poll_transmit` for
//! messages to send, `poll_event` for what the driver must do, `poll_timeout` and
//! `handle_timeout` for timers.
//!
//! [`BlockTable`]: crate::BlockTable
//! [`Verifier`]: crate::Verifier
//! [`Dedup`]: crate::feedback::Dedup
//! [`RateController`]: crate::RateController
//! [`SilenceWatch`]: crate::probe::SilenceWatch

mod receiver;
mod sender;

pub use receiver::{ReceiverData, ReceiverDataEvent};
pub use sender::{
    channel_list, ChannelCmd, SenderData, SenderDataEvent, SenderFinish, KEEP_ALIVE,
    VALUES_PER_MESSAGE,
};

use crate::wire::Control;
use std::time::Duration;

/// The path a session's channels carry data on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataPath {
    /// UDP datagrams, paced, from the sender's channel sockets to the receiver's.
    Udp,
    /// UDP, with TCP data connections dialled beside it: the channels move there, once, if
    /// nothing gets through on UDP (`--transport auto`).
    UdpOrTcp,
    /// One TCP connection per channel (`--transport tcp`, or UDP after the move).
    Tcp,
}

impl DataPath {
    /// Whether the channels may still move to TCP.
    pub fn may_move(self) -> bool {
        self == DataPath::UdpOrTcp
    }

    /// Whether the channels send datagrams (paced, probed, NACK-repaired on the sender's
    /// rate), as opposed to TCP connections that pace themselves.
    pub fn is_udp(self) -> bool {
        self != DataPath::Tcp
    }
}

/// What breaks the rules of the data phase, or ends it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DataError {
    /// The receiver confirmed a file before the sender read all of it, or one it never sent.
    #[error("the receiver confirmed file {file} before all of it was sent")]
    EarlyConfirmation {
        /// The file.
        file: u32,
    },
    /// The receiver's hash of a file is not the one the sender read.
    #[error("file {file} arrived with a hash other than the one read")]
    HashMismatch {
        /// The file.
        file: u32,
        /// The receiver's hash.
        got: [u8; 32],
        /// The root of the values the sender read.
        want: [u8; 32],
    },
    /// The receiver confirmed nothing new for this long.
    #[error("no progress for {} s", .after.as_secs())]
    Stalled {
        /// The stall time.
        after: Duration,
    },
    /// The sender's probes found UDP blocked, in a session that cannot move to TCP.
    #[error("no probe was answered on channel {channel} within {secs} s")]
    UdpBlocked {
        /// The channel the probing gave up on.
        channel: u16,
        /// How long it tried.
        secs: u64,
    },
    /// A block failed verification too often.
    #[error("block {block} failed verification too often")]
    GaveUp {
        /// The block.
        block: u64,
        /// Its file, if the layout has it.
        file: Option<u32>,
    },
    /// A block failed verification too often, its data coming in the clear
    /// (`--no-encryption`): changed on the way, as likely as a changed source.
    #[error("block {block} failed verification too often, its data in the clear")]
    GaveUpInTheClear {
        /// The block.
        block: u64,
        /// Its file, if the layout has it.
        file: Option<u32>,
    },
    /// Block values tagged with a session id that is neither the data phase's nor the
    /// superseded early data's.
    #[error("block values of session {session:#x}, not the data phase's")]
    WrongSession {
        /// The id they carried.
        session: u32,
    },
    /// The sender said `Done` while a file was not in place.
    #[error("the sender finished while file {file} was incomplete")]
    FinishedIncomplete {
        /// The first such file.
        file: u32,
    },
    /// The sender said nothing, not even a keep-alive, for this long.
    #[error("the sender was silent for {} s", .after.as_secs())]
    PeerSilent {
        /// How long the receiver waited.
        after: Duration,
    },
    /// The sender closed the control connection before it said `Done`, with files not in place.
    #[error("the sender closed the connection before the end")]
    PeerGone,
    /// A message that does not belong in the data phase (an `Abort` or `Reject` among them:
    /// the driver reads the peer's words from it).
    #[error("expected a data-phase message, got {}", .0.name())]
    Unexpected(Box<Control>),
}

#[cfg(test)]
mod tests;
