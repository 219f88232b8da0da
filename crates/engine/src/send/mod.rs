//! The sending side of a session: handshake, manifest, path probe, channel threads, confirmation.
//!
//! Threads: the caller's thread runs the session loop (the driver of the data phase's machine,
//! `hurtle_proto::session::data::SenderData`, which keeps the blocks' values and routes
//! control messages); channel threads, one per channel but no more than there are cores (TCP
//! connections get one each), each serve one or more channels: a channel's [`ChannelSender`],
//! pacer, socket and block buffer belong to one thread. The control connection has a reader and
//! a writer thread. Channel threads talk to the session loop through channels, one message per
//! block or per NACK, never per datagram.
//!
//! [`send`] (here) runs a session. The rest, one thing per file:
//!
//! - `options`: how to send ([`SendOptions`], [`Transport`], [`default_channels`]).
//! - `memory`: what earlier transfers learnt of their paths, in a file ([`PathMemories`]).
//! - `session`: one session from the dial to the summary (`send_once`): set-up while the
//!   receiver decides, the data path (`open_data_path`, `dial_data`), the early data, threads,
//!   summary.
//! - `prober`: probing the path beside the data (`Prober`, `probe_step`).
//! - `session_loop`: the caller's thread while data flows: control messages, block values,
//!   rate changes, the live bottleneck.
//! - `channel_threads`: the channel threads (`serve_channels`, `ChannelWorker`) and their pacing.
//! - `shared`: the state and the messages the session loop and the channel threads share.
//! - [`value_cache`]: the block values of files left unfinished, kept between sessions
//!   ([`ValueCache`]) so that a resumed transfer does not read again what the receiver holds.
//! - `summary`: what a finished send did ([`SendSummary`], [`RateSummary`],
//!   [`BottleneckSummary`]).
//!
//! Imports point one way: `session` uses everything else; `session_loop` uses `prober`,
//! `channel_threads`' commands and `summary`; `prober` and `channel_threads` use `shared`.
//!
//! [`ChannelSender`]: hurtle_proto::ChannelSender

mod channel_threads;
mod memory;
mod options;
mod prober;
mod session;
mod session_loop;
mod shared;
mod summary;
pub mod value_cache;

pub use memory::PathMemories;
pub use options::{default_channels, SendOptions, Transport};
pub use summary::{BottleneckSummary, OutageSummary, RateSummary, ResumedSummary, SendSummary};
pub use value_cache::ValueCache;

use crate::error::SessionError;
use crate::progress::Progress;
use session::send_once;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// hurtle's directory of caches, where the sender keeps what outlives a session ([`PathMemories`],
/// [`ValueCache`]): `$XDG_CACHE_HOME/hurtle`, or `$HOME/.cache/hurtle` (`None` without either;
/// an empty variable counts as unset).
fn cache_dir() -> Option<PathBuf> {
    let var = |k| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("XDG_CACHE_HOME")
        .or_else(|| var("HOME").map(|h| h.join(".cache")))
        .map(|d| d.join("hurtle"))
}

/// Sends `paths` (files and directories) to the receiver at `to`. With
/// [`Transport::Auto`], data starts over UDP and moves to parallel TCP in the same session if
/// UDP does not get through.
pub fn send(
    paths: &[PathBuf],
    to: SocketAddr,
    opts: &SendOptions,
    progress: Arc<Progress>,
) -> Result<SendSummary, SessionError> {
    // A dialer through which only TCP gets (a relay that forwards no datagrams) makes it TCP.
    let tcp_only = opts.dialer.as_ref().is_some_and(|d| d.tcp_only());
    let transport = if opts.transport == Transport::Tcp || tcp_only {
        Transport::Tcp
    } else {
        Transport::Udp
    };
    send_once(paths, to, opts, transport, progress)
}
