//! The library's parts, one file each:
//!
//! - `send`: [`Sender`] and [`SenderBuilder`] (the options of `hurtle send`).
//! - `receive`: [`Receiver`] and [`ReceiverBuilder`] (the options of `hurtle receive`).
//! - `transfer`: [`Transfer`], the handle of a running transfer, its [`Event`]s and
//!   [`Canceller`].
//! - `error`: [`Error`] and [`ErrorKind`] (the command's exit codes).
//! - [`values`]: the checks of rates, sizes, counts, addresses and the output directory, with
//!   their messages.
//! - [`keys`]: codes and key files: checked, read and made.
//! - [`pairing`]: pairing by code through a relay, the steps the builders and the command
//!   share (a sender finding a code's receiver, a sender offering a code, a receiver
//!   registering or answering).
//! - [`identity`]: identity keys, authorized senders and pinned receivers (docs/identity.md).
//!
//! The `hurtle` command parses its flags with [`values`] and [`keys`], and takes its exit codes
//! from [`ErrorKind`], so that the command and a program accept and refuse the same things.
//!
//! The engine (`hurtle-engine`) stays behind these: its options, progress counters, threads
//! and network types are not part of the API; its summaries are ([`SendSummary`],
//! [`ReceiveSummary`]), as the `--json` output prints them.

mod error;
pub mod identity;
pub mod keys;
pub mod pairing;
mod receive;
mod send;
mod transfer;
pub mod values;

pub use error::{Error, ErrorKind};
pub use hurtle_engine::receive::Capacity;
pub use hurtle_engine::send::{BottleneckSummary, OutageSummary, RateSummary, ResumedSummary};
pub use hurtle_engine::{FileReport, ReceiveSummary, SendSummary};
pub use receive::{Receiver, ReceiverBuilder};
pub use send::{Sender, SenderBuilder, Transport};
pub use transfer::{
    Canceller, Event, Phase, Snapshot, Transfer, Waiting, DEFAULT_INTERVAL, MOVING_WITHIN,
};
