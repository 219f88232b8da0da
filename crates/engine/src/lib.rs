//! hurtle's drivers: everything that touches the OS on behalf of the sans-IO core in `hurtle-proto`.
//!
//! One folder or file per part of the design:
//!
//! - [`send`](mod@send) and [`receive`]: a session from each side, joining the parts below:
//!   options, the session from set-up to summary, the session loop, the channel threads.
//!   [`receive::accept`] is the receiver's front door, which accepts connections and greets
//!   each, dropping strangers' (strays) without troubling the session.
//! - `setup`: drives either side's set-up machine (`hurtle_proto::session`) over the control
//!   connection; `phase`: the data phase's machines' errors in the session's terms.
//! - [`report`]: one file's outcome, as both sides report it.
//! - [`handshake`]: the key agreement that opens every control connection, and what a receiver
//!   accepts ([`handshake::Keyring`]).
//! - [`identity`]: key files (read only when private), authorized senders' public keys, and
//!   the receivers a sender has pinned ([`identity::KnownReceivers`]).
//! - [`net`]: the network, below any session: the TCP control connection ([`net::control`]), a
//!   channel's link, UDP datagrams or a TCP connection of frames ([`net::channel_link`]), batched UDP
//!   data channels ([`net::udp`]), and how the sender opens TCP connections ([`net::dial`]).
//! - [`fs`]: the file system: path checks, the output tree opened so that no symlink can
//!   redirect it, part files and their journals, sparse holes, hashing, the sender's source
//!   files, and open descriptors a bounded number at a time.
//! - [`iobuf`]: read buffers placed so the kernel's copy out of the page cache runs at full speed.
//! - [`mirror`]: what a receiver deletes for `--delete`, inside the directories offered only.
//! - [`walk`]: turning the user's source arguments into a manifest of files and directories.
//! - [`cpu`]: CPU clocks and the cgroup CPU quota (what the receiver can absorb).
//! - [`error`]: [`SessionError`], every way a session can end, each message one line.
//! - [`netlog`]: per-channel network logs; [`progress`]: live counters for a user interface.
//! - `sys`: the system calls std and the crates above lack, behind safe wrappers: the only
//!   `unsafe` in the engine (the crate denies `unsafe_code`, and allows it there alone).
//!
//! Imports point down: [`send`](mod@send) and [`receive`] use the parts below them and not
//! each other; [`net`], [`fs`] and `sys` never use a session's folder, and `sys` uses nothing
//! else in the engine.

#![deny(unsafe_code)]

pub mod cpu;
pub mod error;
pub mod filter;
pub mod fs;
pub mod handshake;
pub mod identity;
pub mod iobuf;
pub mod mirror;
pub mod net;
pub mod netlog;
mod phase;
pub mod progress;
pub mod receive;
pub mod report;
pub mod send;
mod setup;
#[allow(unsafe_code)]
mod sys;
pub mod walk;

pub use error::SessionError;
pub use handshake::Keyring;
pub use progress::Progress;
pub use receive::{OwnPorts, ReceiveOptions, ReceiveSummary, Receiver, RelayedUdp, WriteQueue};
pub use report::FileReport;
pub use send::{send, PathMemories, SendOptions, SendSummary};
