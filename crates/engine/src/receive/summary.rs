//! What a finished receive did ([`ReceiveSummary`]): bytes, files, time, what was dropped or
//! fetched again, what this receiver can absorb, and each file's outcome.

use super::capacity::Capacity;
use crate::report::BytesByPath;
use serde::Serialize;

/// What a finished receive did.
#[derive(Debug, Clone, Serialize)]
pub struct ReceiveSummary {
    /// The sender's control address.
    pub peer: String,
    /// File bytes received (including those resumed).
    pub bytes: u64,
    /// Of those, bytes already here from an interrupted transfer (checked, not received again).
    pub resumed_bytes: u64,
    /// Of those, bytes in holes of sparse files (checked, not received; left as holes here).
    pub sparse_bytes: u64,
    /// Files written.
    pub files: usize,
    /// Directories created.
    pub dirs: usize,
    /// Symbolic links created, replaced or found already there.
    pub links: usize,
    /// Symbolic links not created because they point outside the destination (each named in
    /// a warning): see [`crate::fs::link_escapes`].
    pub unsafe_links: usize,
    /// Seconds from the hello to the end.
    pub seconds: f64,
    /// Bits per second of file data received in this session (`bytes - resumed_bytes -
    /// sparse_bytes`).
    pub goodput_bps: f64,
    /// Channels used.
    pub channels: u16,
    /// Payload bytes that arrived more than once.
    pub duplicate_bytes: u64,
    /// NACK messages sent.
    pub nacks: u64,
    /// Datagrams dropped as foreign, malformed or out of bounds.
    pub rejected: u64,
    /// Data frames dropped because they failed to open: forged, changed on the way, replayed.
    pub unauthentic: u64,
    /// Whether data frames were encrypted (control frames always are).
    pub encrypted: bool,
    /// Blocks that failed verification and were fetched again.
    pub rejected_blocks: u64,
    /// Blocks written to the file while still incomplete because the block buffers ran out
    /// (their missing datagrams are then written one by one as they arrive).
    pub spilled_blocks: u64,
    /// Data datagrams lost on the way and rebuilt from the tail's parity
    /// ([`hurtle_proto::fec`]) instead of being asked for again.
    pub recovered: u64,
    /// Kernel socket drops, when the kernel reports them.
    pub socket_drops: u64,
    /// Warnings (small socket buffers ...).
    pub warnings: Vec<String>,
    /// What this receiver measured it can absorb, and offered as the rate ceiling.
    pub capacity: Capacity,
    /// The bytes of the sender's that arrived each way (datagrams with their headers, counted
    /// by where each came from; see [`BytesByPath`]): what was lost on the way is in the
    /// sender's count and not here.
    pub bytes_by_path: BytesByPath,
    /// Seconds from the start to the first channel's move from the relay to a direct path
    /// punched through both NATs, as this side saw it (`None`: not relayed, or no direct path
    /// found).
    pub direct_after_seconds: Option<f64>,
    /// Per-file results.
    pub file_hashes: Vec<crate::report::FileReport>,
    /// Connections dropped before their greeting (not hurtle peers, or silent) since the
    /// receiver's previous transfer ended, or since it began listening: see [`crate::receive::accept`].
    pub strays: u64,
}
