//! What both sides report the same way: one file's outcome in a finished transfer
//! ([`FileReport`]), and channels named in a message (`channel_list`).

use serde::Serialize;

/// One file's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct FileReport {
    /// Relative path.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// BLAKE3, hex, as confirmed by the receiver; empty for a file skipped because the
    /// receiver's copy had the same size and modification time (not read; see `--checksum`).
    pub blake3: String,
    /// How `blake3` was made: `"blake3"`, the BLAKE3 of the file's bytes (what `b3sum`
    /// prints), or `"blake3-sparse"` for a file whose holes were announced: the same tree,
    /// with each hole block that holds only zeros standing as a marker instead of being hashed
    /// (see `hurtle_proto::hash::HashKind`).
    pub hash: &'static str,
    /// Not sent: the receiver already had it (the same BLAKE3, or without `--checksum` the same
    /// size and modification time).
    pub skipped: bool,
}
