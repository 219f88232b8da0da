//! How to send ([`SendOptions`]): channels, transport ([`Transport`]), rate, payload, block
//! size, what to read and how, and the secret; the defaults, and the user's rate cap as the
//! live bottleneck is judged against it.

use super::memory::PathMemories;
use super::value_cache::ValueCache;
use crate::net::dial::Dialer;
use hurtle_proto::secure::Secret;
use hurtle_proto::wire;
use hurtle_proto::RateMode;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// UDP channels, with TCP data connections dialled beside them; if nothing gets through,
    /// the channels move to those connections in the same session.
    Auto,
    /// UDP channels only.
    Udp,
    /// N parallel TCP connections (for networks that block UDP).
    Tcp,
}

impl Transport {
    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Auto => "auto",
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        }
    }
}

/// How to send. Build with [`SendOptions::default`] and the `with_*`-style fields.
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// Data channels (UDP) or connections (TCP) to offer (the receiver may lower it).
    pub channels: u16,
    /// UDP, parallel TCP, or UDP with fallback to TCP.
    pub transport: Transport,
    /// How the rate is chosen: `Auto` (default), `Fair` or `Fixed`.
    pub rate_mode: RateMode,
    /// Bits per second for all channels together: the cap that `Auto` and `Fair` never exceed,
    /// or the exact rate in `Fixed` mode. The receiver's measured ceiling lowers it further.
    pub rate_bps: u64,
    /// Lowest first rate of `Auto` and `Fair`, bits per second (on a short path it starts
    /// higher, at TCP's initial window per round trip: [`hurtle_proto::rate::initial_rate`]).
    pub start_rate_bps: u64,
    /// Largest datagram payload to try. The handshake probes it, then the 1500-byte-path size,
    /// then smaller ones, and keeps the largest that reaches the receiver on every channel; a
    /// size larger than the local interface allows fails at once (`EMSGSIZE`) and costs nothing.
    pub payload: u16,
    /// Block size for striping and hashing (power of two).
    pub block_size: u64,
    /// Send what symbolic links inside a directory point at (`--copy-links`) instead of the
    /// links themselves.
    pub follow_symlinks: bool,
    /// Paths among those sent that go as links when they are symbolic links (the entries
    /// `hurtle cp SRC/` expands `SRC/` to), as links inside a directory do; other paths given
    /// are followed. See [`crate::walk::WalkOptions::link_args`].
    pub link_args: Vec<PathBuf>,
    /// Which paths to send (`--exclude`, `--include`; by default all).
    pub filter: crate::filter::Filter,
    /// Compare files the receiver already has by BLAKE3 (both sides read them), not by size
    /// and modification time.
    pub checksum: bool,
    /// Send the holes of sparse files as data, without asking the filesystem where they are
    /// (for a filesystem whose hole reporting is not trusted).
    pub no_sparse: bool,
    /// Directory for per-channel network logs.
    pub log_dir: Option<PathBuf>,
    /// Give up when nothing progresses for this long.
    pub stall_timeout: Duration,
    /// How long to wait for the TCP connection.
    pub connect_timeout: Duration,
    /// How TCP connections to the receiver are opened (`None`: directly). A dialer that is
    /// [`Dialer::tcp_only`] forces the parallel-TCP transport.
    pub dialer: Option<Arc<dyn Dialer>>,
    /// The code or key both sides hold; the session's keys are agreed from it. Required
    /// (`None` fails with [`SessionError::NoSecret`](crate::SessionError::NoSecret)):
    /// authentication is never off.
    pub secret: Option<Secret>,
    /// Where a secret that is an identity key ([`Secret::identity`]) checks and pins the
    /// receiver's identity, under the receiver's address; `None` refuses such a session.
    pub known_receivers: Option<crate::identity::KnownReceivers>,
    /// Ask for data datagrams in the clear (`--no-encryption`): granted only when the receiver
    /// asks too. Control frames are sealed either way.
    pub no_encryption: bool,
    /// Where what transfers learnt of their paths is kept: `auto` starts from the last
    /// transfer's bottleneck to the same receiver, and leaves its own (see [`PathMemories`]).
    /// `None` (the default): every start is a cold one, and nothing is kept.
    pub path_memory: Option<PathMemories>,
    /// Where the block values of files a session leaves unfinished are kept, so that resuming
    /// them reads nothing the receiver holds ([`ValueCache`]; `None`: nowhere, and held blocks
    /// are read to be valued). By default [`ValueCache::from_env`].
    pub value_cache: Option<ValueCache>,
    /// Send parity for the tail of each UDP channel's data ([`hurtle_proto::fec`]): a loss in
    /// the last round trip of new data is rebuilt by the receiver instead of repaired a round
    /// trip later. On by default; `--no-fec` turns it off.
    pub fec: bool,
    /// A dry run (`-n`): the receiver decides on the manifest and creates nothing; no data
    /// moves, and the summary's files say which would be sent and which skipped.
    pub dry_run: bool,
    /// Mirror (`--delete`): the receiver, if it allows it, deletes what was not offered
    /// inside the directories offered, keeping what [`SendOptions::filter`] leaves out.
    pub delete: bool,
    /// With [`SendOptions::delete`]: the receiver's destination itself holds what is sent
    /// (`cp SRC/`, a directory's contents), and is mirrored too.
    pub mirror_root: bool,
}

impl Default for SendOptions {
    fn default() -> Self {
        SendOptions {
            channels: default_channels(),
            transport: Transport::Auto,
            rate_mode: RateMode::Auto,
            rate_bps: 100_000_000_000,
            start_rate_bps: 100_000_000,
            payload: wire::MAX_PAYLOAD,
            block_size: 1 << 20,
            follow_symlinks: false,
            link_args: Vec::new(),
            filter: crate::filter::Filter::default(),
            checksum: false,
            no_sparse: false,
            log_dir: None,
            stall_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            dialer: None,
            secret: None,
            known_receivers: None,
            no_encryption: false,
            path_memory: None,
            value_cache: ValueCache::from_env(),
            fec: true,
            dry_run: false,
            delete: false,
            mirror_root: false,
        }
    }
}

/// Channels used when the user does not say: one per core, between 2 and 8.
pub fn default_channels() -> u16 {
    std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8) as u16)
}

/// The user's `--rate`, or 0 when it is the default (no ceiling at all).
pub(super) fn user_cap(opts: &SendOptions) -> u64 {
    if opts.rate_bps >= SendOptions::default().rate_bps {
        0
    } else {
        opts.rate_bps
    }
}
