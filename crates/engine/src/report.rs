//! What both sides report the same way: one file's outcome in a finished transfer
//! ([`FileReport`]), the bytes each path carried ([`BytesByPath`]), and channels named in a
//! message (`channel_list`).

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

/// The bytes each path carried: datagrams with their headers (repairs and parity included), or
/// TCP frames. A sender counts what its channels sent, per batch, for the route each channel
/// had when it sent it ([`crate::progress::Route`]); a receiver counts what arrived and was
/// taken as the sender's, by where each datagram came from (the relay's UDP port, or another
/// address: direct) or, over TCP, whether the session's connections came through the relay.
/// The two differ by what was lost on the way (a sender's count has it, a receiver's not).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BytesByPath {
    /// Straight between the peers: no relay, or a path punched through the NATs.
    pub direct: u64,
    /// As datagrams through the relay's UDP port.
    pub relay_udp: u64,
    /// Over parallel TCP through the relay's splice.
    pub relay_tcp: u64,
}

impl BytesByPath {
    /// From [`crate::progress::Progress::route_bytes`].
    pub fn from_routes([direct, relay_udp, relay_tcp]: [u64; 3]) -> BytesByPath {
        BytesByPath {
            direct,
            relay_udp,
            relay_tcp,
        }
    }
}
