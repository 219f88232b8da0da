//! Wire formats: the UDP datagram header and the TCP control messages.
//!
//! # Datagrams (UDP, one per data channel)
//!
//! Every datagram starts with a fixed 28-byte header, big-endian:
//!
//! | bytes | field | meaning |
//! |---|---|---|
//! | 0 | kind, flags | low 4 bits: kind, 1 = data, 2 = channel final, 3 = path probe, 4 = parity, 5 = feedback (receiver to sender); high 4 bits: flags, bit 0 = retransmit |
//! | 1 | channel | data channel index (0..=255: [`crate::layout::MAX_CHANNELS`] is 256) |
//! | 2..6 | session | random session id from the hello; anything else is dropped |
//! | 6..12 | packet number | 48 bits, per channel, strictly increasing from 1, never wrapping (probes from `PROBE_PACKETS`); with the channel, the AEAD nonce; divided by `EPOCH_PACKETS`, the key epoch |
//! | 12..16 | file | file id (manifest index) |
//! | 16..24 | offset | byte offset in the file (data; parity: of its group's first byte), stripe length (final), probe size (probe) |
//! | 24..28 | sent at | sender's clock in microseconds, wrapping; for one-way delay trends |
//!
//! The payload follows, encrypted, then a 16-byte tag ([`crate::secure`]; the header is the
//! associated data; the key is the packet number's epoch's; with `--no-encryption` on both
//! sides, the payload in the clear and no tag). The header carries no length: the payload is
//! what follows the header, up to the tag (a datagram is one frame; a TCP data connection puts
//! a length before each frame).
//! [`DATAGRAM_OVERHEAD`] counts the header and the tag.
//!
//! # Control messages (TCP)
//!
//! Each message is a frame: a 4-byte big-endian length, then the postcard encoding of a
//! [`Control`] value. Frames longer than [`MAX_FRAME`] are refused before they are read. The call
//! order of a session is described in the crate docs.

use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// Bytes of the datagram header.
pub const HEADER_LEN: usize = 28;
/// Header plus the 16-byte AEAD tag after the payload.
pub const DATAGRAM_OVERHEAD: usize = HEADER_LEN + 16;
/// Default payload per datagram: 28 + 16 + 1396 = 1440 bytes, which fits a 1500-byte MTU under
/// both IPv4 (20 + 8 bytes of headers) and IPv6 (40 + 8).
pub const DEFAULT_PAYLOAD: u16 = 1396;
/// The largest payload a 1500-byte path carries under IPv4: 20 + 8 + 28 + 16 + 1428 = 1500.
/// Probed beside the default, and used once acknowledged (+2.3% of file per datagram).
pub const IPV4_1500_PAYLOAD: u16 = 1428;
/// The largest payload a 1500-byte path carries under IPv6: 40 + 8 + 28 + 16 + 1408 = 1500.
pub const IPV6_1500_PAYLOAD: u16 = 1408;
/// Smallest payload hurtle will fall back to on a path that drops large datagrams.
pub const MIN_PAYLOAD: u16 = 512;
/// Largest payload hurtle will accept (a 9000-byte jumbo frame path: 28 + 16 + 8900 bytes of
/// datagram and 48 of IPv6 and UDP headers leave 8 to spare).
pub const MAX_PAYLOAD: u16 = 8900;
/// Largest packet number the header's 48 bits hold. The sender never wraps: see
/// [`crate::secure::PacketNumbers`].
pub const MAX_PACKET: u64 = (1 << 48) - 1;
/// Largest control frame (bytes after the length prefix).
pub const MAX_FRAME: usize = 4 << 20;
/// Magic bytes at the start of a hello.
pub const MAGIC: [u8; 4] = *b"HRTL";
/// Protocol version spoken by this build.
pub const VERSION: u16 = 16;

/// When the sender sent a datagram it stamped `sent_us`: the sender stamps microseconds since
/// `origin` (wrapping at 2^32, about 71 minutes), so this is `now` less the stamp's age. A stamp
/// older than `origin` (or from the future, which reads as 71 minutes old) gives `origin`.
pub fn sent_at(origin: Instant, now: Instant, sent_us: u32) -> Instant {
    let now_us = now.saturating_duration_since(origin).as_micros() as u32;
    let age = Duration::from_micros(u64::from(now_us.wrapping_sub(sent_us)));
    now.checked_sub(age).map_or(origin, |at| at.max(origin))
}

/// What a datagram is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// File bytes.
    Data = 1,
    /// "This channel has sent its whole stripe"; `offset` holds the stripe length.
    Final = 2,
    /// Path probe of a given size; `offset` holds the datagram size being probed.
    Probe = 3,
    /// Reed-Solomon parity of a group of the tail's data, which starts at `file` and `offset`;
    /// the payload is a [`crate::fec::ParityDesc`] and the shard (see [`crate::fec`]).
    Parity = 4,
    /// Receiver -> sender: a copy of a `Report` or `Nack` that also goes on the control
    /// connection, sealed with the feedback key; the payload is its postcard encoding (see
    /// [`crate::feedback`]).
    Feedback = 5,
}

/// Capability bit of the hello: data goes over N TCP connections instead of UDP channels.
pub const CAP_TCP_DATA: u64 = 1;
/// Capability bit of the hello: the sender wants files the receiver already has compared by
/// BLAKE3 ([`Decision::Have`]), never by size and modification time alone
/// ([`Decision::Unchanged`]).
pub const CAP_CHECKSUM: u64 = 2;
/// Capability bit of the hello: data starts over UDP, and the sender may move the channels to
/// TCP data connections in the same session if nothing gets through
/// ([`Control::UdpSilent`], [`Control::Fallback`]); the receiver offers a TCP data port
/// beside its UDP ones (`HelloAck::tcp_port`).
pub const CAP_RACE: u64 = 4;
/// Capability bit of the hello: a dry run (`-n`). The receiver decides on the manifest as
/// usual but creates nothing (no directory, no part file) and ends the session at the outcome;
/// the sender moves no data and reports what would have been sent, skipped and deleted.
pub const CAP_DRY_RUN: u64 = 8;
/// Capability bit of the hello: mirror (`--delete`). The sender's first sealed message is
/// [`Control::Mirror`]; a receiver that did not allow deletion refuses the session, and one
/// that did deletes, once every file is committed, what the sender did not offer inside the
/// directories it offered (never what the rules leave out).
pub const CAP_DELETE: u64 = 16;

/// Flag: this datagram repeats data sent before.
pub const FLAG_RETRANSMIT: u8 = 1;
/// The flag bits a header has room for (its first byte's high 4 bits).
pub const MAX_FLAGS: u8 = 0x0f;

/// The decoded datagram header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the datagram is.
    pub kind: Kind,
    /// Flag bits (`FLAG_*`; 4 bits on the wire, at most [`MAX_FLAGS`]).
    pub flags: u8,
    /// Data channel index (one byte on the wire: 0..=255).
    pub channel: u16,
    /// Session id.
    pub session: u32,
    /// Per-channel packet number (48 bits on the wire: at most [`MAX_PACKET`]).
    pub packet: u64,
    /// File id.
    pub file: u32,
    /// File offset, stripe length or probe size (see [`Kind`]).
    pub offset: u64,
    /// Payload length. Not on the wire: [`Header::decode`] sets it from the datagram's size,
    /// [`Header::encode`] ignores it.
    pub len: u16,
    /// Sender timestamp in microseconds (wrapping).
    pub sent_us: u32,
}

/// Why a datagram was rejected. Each is counted by the receiver, never trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DatagramError {
    /// Fewer bytes than a header.
    #[error("datagram shorter than its header")]
    Truncated,
    /// Unknown kind (the first byte's low 4 bits).
    #[error("unknown datagram kind {0}")]
    BadKind(u8),
    /// More payload than a frame can carry (its length is 16 bits everywhere it is counted:
    /// [`Header::len`], a TCP data connection's frame length); no datagram is that long.
    #[error("{0} payload bytes exceed a frame's 65535")]
    TooLong(usize),
}

impl Header {
    /// Writes the header into the first [`HEADER_LEN`] bytes of `out` (not [`Header::len`]:
    /// the payload's length is the frame's).
    ///
    /// # Panics
    /// If `out` is shorter than [`HEADER_LEN`], or a field does not fit its room on the wire:
    /// flags above [`MAX_FLAGS`], a channel above 255, a packet number above [`MAX_PACKET`].
    /// Each is a bug in the caller, never peer input; cut short, a channel or packet number
    /// would name another's AEAD nonce.
    pub fn encode(&self, out: &mut [u8]) {
        assert!(
            self.flags <= MAX_FLAGS,
            "flags {:#x} exceed 4 bits",
            self.flags
        );
        let Ok(channel) = u8::try_from(self.channel) else {
            panic!("channel {} does not fit the header's byte", self.channel);
        };
        assert!(
            self.packet <= MAX_PACKET,
            "packet number {} exceeds 48 bits",
            self.packet
        );
        let out = &mut out[..HEADER_LEN];
        out[0] = self.kind as u8 | self.flags << 4;
        out[1] = channel;
        out[2..6].copy_from_slice(&self.session.to_be_bytes());
        out[6..12].copy_from_slice(&self.packet.to_be_bytes()[2..]);
        out[12..16].copy_from_slice(&self.file.to_be_bytes());
        out[16..24].copy_from_slice(&self.offset.to_be_bytes());
        out[24..28].copy_from_slice(&self.sent_us.to_be_bytes());
    }

    /// Parses a whole frame (header and payload, no tag), returning the header and the
    /// payload: all that follows the header.
    pub fn decode(datagram: &[u8]) -> Result<(Header, &[u8]), DatagramError> {
        if datagram.len() < HEADER_LEN {
            return Err(DatagramError::Truncated);
        }
        let (h, payload) = datagram.split_at(HEADER_LEN);
        let len =
            u16::try_from(payload.len()).map_err(|_| DatagramError::TooLong(payload.len()))?;
        let be32 = |i: usize| u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let be64 = |i: usize| (u64::from(be32(i)) << 32) | u64::from(be32(i + 4));
        let kind = match h[0] & 0x0f {
            1 => Kind::Data,
            2 => Kind::Final,
            3 => Kind::Probe,
            4 => Kind::Parity,
            5 => Kind::Feedback,
            k => return Err(DatagramError::BadKind(k)),
        };
        let header = Header {
            kind,
            flags: h[0] >> 4,
            channel: u16::from(h[1]),
            session: be32(2),
            packet: packet_number(h),
            file: be32(12),
            offset: be64(16),
            len,
            sent_us: be32(24),
        };
        Ok((header, payload))
    }
}

/// The channel and packet number of the header at the start of `frame` (the AEAD nonce's
/// parts), read without decoding the rest.
///
/// # Panics
/// If `frame` is shorter than [`HEADER_LEN`].
pub fn nonce_fields(frame: &[u8]) -> (u16, u64) {
    (u16::from(frame[1]), packet_number(frame))
}

fn packet_number(h: &[u8]) -> u64 {
    let mut pn = [0u8; 8];
    pn[2..].copy_from_slice(&h[6..12]);
    u64::from_be_bytes(pn)
}

/// One entry of the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Relative path, `/`-separated. The receiver sanitizes it before use.
    pub path: String,
    /// File, directory or symbolic link.
    pub kind: EntryKind,
    /// Size in bytes (0 for a directory and a link).
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
    /// Blocks of a sparse file that lie wholly in holes (never written, read as zeros), as
    /// ascending half-open ranges of the file's block numbers. Their bytes are not sent: the
    /// receiver leaves holes there too, and both sides check those blocks' values like those
    /// of a resumed transfer. Empty for a file without holes and for a directory.
    pub holes: Vec<(u64, u64)>,
    /// A symbolic link's target, as the sender's `readlink` gave it (since protocol version
    /// 16); empty for a file and a directory. The receiver checks it as text and creates the
    /// link without following anything; it never resolves it.
    pub target: String,
}

/// What a manifest entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    /// A regular file; it gets a file id (its index among the manifest's files).
    File,
    /// A directory, created empty if nothing lands in it.
    Dir,
    /// A symbolic link (since protocol version 16): no data and no file id; its target is
    /// [`Entry::target`], its size 0.
    Symlink,
}

/// The receiver's answer for one manifest entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    /// Send the whole file.
    SendAll,
    /// The receiver will not take this entry; the text says why.
    Refuse(String),
    /// The receiver already has a file of this size, with this BLAKE3. The sender skips it if
    /// its own hash matches; otherwise it sends it if `replace_ok`, or stops.
    Have {
        /// BLAKE3 of the receiver's file.
        hash: [u8; 32],
        /// The receiver may replace its file (it runs with `--overwrite`).
        replace_ok: bool,
    },
    /// The receiver already has a file of this size and modification time (as hurtle leaves a
    /// file it received), and the sender did not ask for checksums: the sender skips it
    /// without reading it, as rsync does by default.
    Unchanged,
    /// Send the file, but the receiver already holds these blocks of it from an interrupted
    /// transfer (half-open ranges of the file's block numbers, counted from 0 within the file,
    /// ascending and disjoint). The sender hashes them and sends their values without their
    /// bytes; a block whose value differs from the receiver's copy is asked for again.
    Resume {
        /// Blocks held, as `(first, end)` ranges.
        blocks: Vec<(u64, u64)>,
    },
}

/// A message on the control connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Control {
    /// Sender -> receiver, right behind its `Agree` and in the clear (its fields say nothing
    /// the datagrams do not show; the key agreement's transcript covers it, so it cannot be
    /// changed on the way): what the receiver needs to answer with `HelloAck`, sealed in the
    /// flight of its own `Agree` (the data path opened ahead), or once the sender has proven
    /// its key (a data path opened for it then).
    Hello {
        /// Must be [`MAGIC`].
        magic: [u8; 4],
        /// Protocol version.
        version: u16,
        /// Capability bits (none defined yet).
        caps: u64,
        /// Channels the sender offers.
        channels: u16,
        /// Largest payload the sender wants to use.
        payload: u16,
        /// Block size for hashing and striping (power of two).
        block_size: u64,
        /// Random session id that every datagram will carry.
        session: u32,
    },
    /// Receiver -> sender: the agreed parameters.
    HelloAck {
        /// Protocol version.
        version: u16,
        /// Capability bits.
        caps: u64,
        /// UDP ports of the receiver's channels; their count is the agreed channel count.
        ports: Vec<u16>,
        /// Largest payload the receiver accepts.
        payload: u16,
        /// What the receiver can absorb, bits per second (0 = unknown).
        rate_ceiling: u64,
        /// Each channel socket's receive buffer as the kernel granted it, bytes (0 = unknown
        /// or not UDP).
        recv_buffer: u64,
        /// The receive buffer it asked for, bytes.
        recv_buffer_wanted: u64,
        /// Where the sender may dial TCP data connections if UDP does not get through
        /// ([`CAP_RACE`]); 0 when not offered.
        tcp_port: u16,
    },
    /// Sender -> receiver: part of the manifest; `last` closes it.
    Manifest {
        /// The entries, in order.
        entries: Vec<Entry>,
        /// True on the final part.
        last: bool,
    },
    /// Receiver -> sender: part of the decisions, one per manifest entry, in order; `last`
    /// closes them. In parts, as the manifest came: a receiver that has many of the files
    /// answers each with its hash.
    ManifestReply {
        /// The next entries' decisions.
        decisions: Vec<Decision>,
        /// True on the final part.
        last: bool,
    },
    /// Sender -> receiver, after `ManifestReply`: files (by file id) the receiver already has
    /// identical; they get no data and keep the receiver's copy.
    Skip {
        /// File ids skipped.
        files: Vec<u32>,
    },
    /// Receiver -> sender: a probe datagram of `size` bytes arrived on `channel`.
    ProbeAck {
        /// Channel.
        channel: u16,
        /// Datagram size.
        size: u16,
    },
    /// Retired in version 9, where each side's data phase starts as soon as it knows the
    /// outcome of the set-up (see [`crate::session`]); never sent, and refused if it comes.
    /// Kept so that the messages after it keep their encodings.
    Start {
        /// Payload bytes per datagram.
        payload: u16,
        /// How often the receiver should send a `Report`, in microseconds (about one RTT).
        report_interval_us: u64,
    },
    /// Sender -> receiver: BLAKE3 chaining values of blocks, as the sender read them, from
    /// the early data on (during the set-up too).
    BlockHashes {
        /// The session id of the data the blocks were read for: block numbers are of its
        /// layout (the values of superseded early data are dropped).
        session: u32,
        /// `(global block, chaining value)` pairs.
        blocks: Vec<(u64, [u8; 32])>,
    },
    /// Receiver -> sender: stripe ranges of a channel to send again.
    Nack {
        /// Channel.
        channel: u16,
        /// The channel's count of its NACKs, from 1: the same NACK goes over UDP and on the
        /// control connection, and the sender acts on the first copy only
        /// ([`crate::feedback::Dedup`]).
        seq: u64,
        /// Half-open stripe ranges `(start, end)`.
        ranges: Vec<(u64, u64)>,
        /// What the NACK knows of, on the sender's clock: the `sent_us` of the newest datagram
        /// (by packet number) the receiver had taken on the channel when it asked, plus the
        /// time since that datagram arrived ([`crate::admit::Admission::knew_us`]). A repair
        /// sent after that had not arrived when the receiver asked, however late the NACK
        /// itself comes ([`sent_at`], [`crate::channel_send::ChannelSender::on_nack`]). Since protocol
        /// version 14.
        knew_us: u32,
    },
    /// Receiver -> sender: the channel's whole stripe has arrived (acknowledges its final marker).
    ChannelDone {
        /// Channel.
        channel: u16,
    },
    /// Receiver -> sender: a file is verified, synced and in place.
    FileDone {
        /// File id.
        file: u32,
        /// BLAKE3 of the whole file as received.
        hash: [u8; 32],
    },
    /// Receiver -> sender: progress and what the receiver has seen (four times per round
    /// trip of the receiver's measure, every 10 to 500 ms: [`crate::rate::report_interval`]).
    Report {
        /// The session's count of its reports, from 1: the same report goes over UDP and on
        /// the control connection, and the sender takes the first copy of each, and none older
        /// than one it took ([`crate::feedback::Dedup`]).
        seq: u64,
        /// Bytes of payload accepted so far (new, not duplicates).
        received: u64,
        /// Datagrams dropped so far as malformed, foreign or out of bounds.
        rejected: u64,
        /// Kernel socket drops so far, if known (0 otherwise).
        socket_drops: u64,
        /// Length of the interval this report covers, microseconds: the time its bytes arrived
        /// over by the kernel's arrival times where the receiver has them (see
        /// [`crate::admit::arrival_interval`]), else the time since the last report.
        interval_us: u64,
        /// Bytes of datagrams received in the interval.
        bytes: u64,
        /// Datagrams received in the interval.
        datagrams: u64,
        /// Datagrams missing by packet number in the interval.
        lost: u64,
        /// Kernel socket drops in the interval.
        drops: u64,
        /// Mean queueing delay in the interval (one-way delay above the lowest seen), microseconds.
        queue_delay_us: u64,
        /// The fullest any channel's socket receive buffer got in the interval, in thousandths
        /// of its limit (0 when the kernel does not say): how close the receiver is to
        /// dropping because it cannot keep up.
        queue_fill: u16,
        /// How late the receiver's timer has been running (smoothed), microseconds: a receiver
        /// starved of CPU runs in lumps about this far apart.
        lateness_us: u64,
        /// The longest a complete block waited for the receiver's writer thread in the
        /// interval, microseconds (0 where the receiving threads write themselves, as on
        /// tmpfs): a disk slower than the network. Also in `queue_delay_us`.
        disk_wait_us: u64,
        /// The fullest the writer thread's queue got in the interval, in thousandths of its
        /// depth (0 without a writer thread). Also in `queue_fill`.
        disk_fill: u16,
        /// The bottleneck's rate as the spacing of the interval's back-to-back datagrams gave
        /// it, kbit/s of datagram bytes (the median of its trains'; 0: too few trains), new in
        /// version 13 ([`crate::rate::dispersion`]).
        train_kbps: u64,
    },
    /// Sender -> receiver, in a session that offered [`CAP_RACE`]: UDP does not get through,
    /// and every channel moves to a TCP data connection now (dialled to `HelloAck::tcp_port`,
    /// each opened by its greeting); what was sent over UDP and did not arrive is sent again.
    Fallback,
    /// Either side: nothing else to say, but still here (a sender in the data phase sends one
    /// every 200 ms; a side busy with slow work, once a second).
    KeepAlive,
    /// Sender -> receiver: everything is confirmed; the session ends.
    Done,
    /// Either side, before versions are agreed: the session fails; the text says why. Its
    /// encoding is the same in every version (it was `Abort` up to version 4), so a peer of
    /// another version can read why it was turned away.
    Reject {
        /// One-line cause.
        reason: String,
    },
    /// Either side: the session fails, for the given cause; the text says why.
    Abort {
        /// What kind of failure, so that the peer can report it (and exit) the same way.
        cause: AbortCause,
        /// One-line cause.
        reason: String,
    },
    /// The first frame of each side (version 6 on), the only one sent in the clear besides
    /// `Reject`: the key agreement ([`crate::secure`]). Every frame after it is sealed.
    Agree {
        /// Must be [`MAGIC`].
        magic: [u8; 4],
        /// Protocol version.
        version: u16,
        /// Which secret the sender uses ([`crate::secure::KeyId`]); zero for a code.
        key_id: [u8; 8],
        /// The SPAKE2 message.
        pake: Vec<u8>,
        /// Receiver only: proof that it derived the same keys (empty from the sender).
        confirm: Vec<u8>,
        /// This side asks for data datagrams in the clear (`--no-encryption`); they are sent so
        /// only when both sides ask.
        plain_data: bool,
    },
    /// Receiver -> sender, in a session that offered [`CAP_RACE`]: nothing at all (no probe,
    /// no data) arrived on these channels for a while after the receiver's data phase began; the
    /// sender answers with
    /// [`Control::Fallback`]. (After `Agree`: the encodings of `Reject` and `Agree` stay the
    /// same in every version.)
    UdpSilent {
        /// The silent channels.
        channels: Vec<u16>,
    },
    /// Sender -> receiver, the first sealed message of a session whose hello asked for
    /// [`CAP_DELETE`] (before the manifest): the sender's include and exclude rules, in order,
    /// each `"+ PATTERN"` or `"- PATTERN"`. What they leave out is kept on the receiver.
    Mirror {
        /// The rules.
        rules: Vec<String>,
        /// The receiver's destination itself holds what is sent (`cp SRC/ DEST`: the
        /// contents of a directory), so it is mirrored too; otherwise only the directories the
        /// manifest names are.
        root: bool,
    },
    /// Receiver -> sender, in a dry run ([`CAP_DRY_RUN`]) that asked for [`CAP_DELETE`], at
    /// the outcome: the paths (as the manifest names them) a mirror would delete; `last`
    /// closes them.
    Extraneous {
        /// Paths, what a directory holds before the directory.
        paths: Vec<String>,
        /// True on the final part.
        last: bool,
    },
    /// Either side, sealed, in a session agreed on an identity key (an authorized sender's
    /// public key, no shared secret): the side's public key and its Ed25519 signature over the
    /// agreement's transcript and its role ([`crate::secure::IdentityKey`]). The receiver's
    /// is its first sealed frame, in its `Agree`'s flight; the sender's is its first sealed
    /// frame, sent once it checked the receiver's.
    Identify {
        /// The side's Ed25519 public key.
        public: [u8; 32],
        /// The signature (64 bytes).
        proof: Vec<u8>,
    },
}

/// Why a side aborted a session, as its peer should report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AbortCause {
    /// Anything not named below (a protocol error, a bug, a local error of the aborting side).
    Failed,
    /// The receiver cannot take the transfer: a file exists, the destination is full or not
    /// writable, a path is unsafe.
    Refused,
    /// The network failed or stalled.
    Network,
    /// Data failed verification, or a source file changed while it was sent.
    Verification,
    /// The aborting side was interrupted by a signal (Ctrl-C); its part is kept for a resume.
    Interrupted,
}

/// Why a control frame could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The length prefix exceeds [`MAX_FRAME`].
    #[error("control frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLong(usize),
    /// The bytes are not a valid message.
    #[error("malformed control message: {0}")]
    Malformed(#[from] postcard::Error),
    /// A sealed frame failed authentication: changed on the way, or not from the peer.
    #[error("a control frame failed authentication (changed on the way, or not from the peer)")]
    Unauthentic,
}

impl Control {
    /// Encodes the message as a frame (length prefix included).
    pub fn to_frame(&self) -> Vec<u8> {
        let mut out = vec![0u8; 4];
        // Serializing into a Vec cannot fail for these types.
        let body = postcard::to_allocvec(self).unwrap_or_default();
        out.extend_from_slice(&body);
        let len = (out.len() - 4) as u32;
        out[..4].copy_from_slice(&len.to_be_bytes());
        out
    }

    /// Checks a frame's length prefix and returns the body length to read next.
    pub fn frame_len(prefix: [u8; 4]) -> Result<usize, FrameError> {
        let len = u32::from_be_bytes(prefix) as usize;
        if len > MAX_FRAME + crate::secure::TAG_LEN {
            return Err(FrameError::TooLong(len));
        }
        Ok(len)
    }

    /// Decodes a frame body (the bytes after the length prefix). Trailing bytes are an error.
    pub fn from_body(body: &[u8]) -> Result<Control, FrameError> {
        let (msg, rest) = postcard::take_from_bytes::<Control>(body)?;
        if !rest.is_empty() {
            return Err(FrameError::Malformed(
                postcard::Error::DeserializeBadEncoding,
            ));
        }
        Ok(msg)
    }

    /// A hello of this build's magic and version.
    pub fn hello(caps: u64, channels: u16, payload: u16, block_size: u64, session: u32) -> Control {
        Control::Hello {
            magic: MAGIC,
            version: VERSION,
            caps,
            channels,
            payload,
            block_size,
            session,
        }
    }

    /// Short name of the message kind, for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Control::Hello { .. } => "Hello",
            Control::HelloAck { .. } => "HelloAck",
            Control::Manifest { .. } => "Manifest",
            Control::ManifestReply { .. } => "ManifestReply",
            Control::ProbeAck { .. } => "ProbeAck",
            Control::Skip { .. } => "Skip",
            Control::Start { .. } => "Start",
            Control::BlockHashes { .. } => "BlockHashes",
            Control::Nack { .. } => "Nack",
            Control::ChannelDone { .. } => "ChannelDone",
            Control::FileDone { .. } => "FileDone",
            Control::Report { .. } => "Report",
            Control::KeepAlive => "KeepAlive",
            Control::Fallback => "Fallback",
            Control::Done => "Done",
            Control::Reject { .. } => "Reject",
            Control::Agree { .. } => "Agree",
            Control::Abort { .. } => "Abort",
            Control::UdpSilent { .. } => "UdpSilent",
            Control::Mirror { .. } => "Mirror",
            Control::Extraneous { .. } => "Extraneous",
            Control::Identify { .. } => "Identify",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header() -> impl Strategy<Value = Header> {
        (
            prop_oneof![Just(Kind::Data), Just(Kind::Final), Just(Kind::Probe)],
            any::<(u8, u8, u32, u64, u32, u64, u16, u32)>(),
        )
            .prop_map(
                |(kind, (flags, channel, session, packet, file, offset, len, sent_us))| Header {
                    kind,
                    flags: flags & MAX_FLAGS,
                    channel: u16::from(channel),
                    session,
                    packet: packet & MAX_PACKET,
                    file,
                    offset,
                    len: len % 2000,
                    sent_us,
                },
            )
    }

    #[test]
    fn a_stamp_reads_back_as_when_it_was_sent() {
        let origin = Instant::now();
        let at = |us: u64| origin + Duration::from_micros(us);
        let now = at(5_000_000);
        assert_eq!(sent_at(origin, now, 4_000_000), at(4_000_000));
        assert_eq!(sent_at(origin, now, 5_000_000), now);
        // Across the stamp's wrap (2^32 us after the origin).
        let wrap = 1u64 << 32;
        let later = at(wrap + 1_000);
        assert_eq!(sent_at(origin, later, u32::MAX - 999), at(wrap - 1_000));
        // A stamp from the future reads as 71 minutes old, which is before the origin here.
        assert_eq!(sent_at(origin, now, 6_000_000), origin);
    }

    #[test]
    fn header_test_vector() {
        let h = Header {
            kind: Kind::Data,
            flags: FLAG_RETRANSMIT,
            channel: 3,
            session: 0x0102_0304,
            packet: 0x0506_0708_090a,
            file: 10,
            offset: 0x1_0000_0000,
            len: 2,
            sent_us: 77,
        };
        let mut buf = [0u8; HEADER_LEN + 2];
        h.encode(&mut buf);
        buf[HEADER_LEN..].copy_from_slice(b"hi");
        assert_eq!(
            buf[..HEADER_LEN],
            [
                0x11, 3, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 0, 0, 10, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0,
                0, 77
            ]
        );
        assert_eq!(nonce_fields(&buf), (3, 0x0506_0708_090a));
        assert_eq!(Header::decode(&buf).unwrap(), (h, &b"hi"[..]));
        // The payload is what follows the header: its length is the frame's.
        let (short, payload) = Header::decode(&buf[..HEADER_LEN + 1]).unwrap();
        assert_eq!((short.len, payload), (1, &b"h"[..]));
        let (empty, payload) = Header::decode(&buf[..HEADER_LEN]).unwrap();
        assert_eq!((empty.len, payload), (0, &b""[..]));
        assert_eq!(
            Header::decode(&buf[..HEADER_LEN - 1]).unwrap_err(),
            DatagramError::Truncated
        );
        let mut long = vec![0u8; HEADER_LEN + 65_536];
        h.encode(&mut long);
        assert_eq!(
            Header::decode(&long).unwrap_err(),
            DatagramError::TooLong(65_536)
        );
        assert!(Header::decode(&long[..HEADER_LEN + 65_535]).is_ok());
    }

    #[test]
    fn unknown_kinds_are_refused_and_unknown_flags_pass_through() {
        let mut buf = [0u8; HEADER_LEN];
        Header {
            kind: Kind::Final,
            flags: 0,
            channel: 255,
            session: u32::MAX,
            packet: MAX_PACKET,
            file: 0,
            offset: 0,
            len: 0,
            sent_us: 0,
        }
        .encode(&mut buf);
        assert_eq!(
            buf[..12],
            [2, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255]
        );
        for kind in [0u8, 6, 15] {
            buf[0] = 0x10 | kind;
            assert_eq!(Header::decode(&buf), Err(DatagramError::BadKind(kind)));
        }
        // Flag bits this build does not know are kept as they came, and mean nothing to it.
        buf[0] = 0xe0 | 2;
        let (h, _) = Header::decode(&buf).unwrap();
        assert_eq!(
            (h.kind, h.flags, h.flags & FLAG_RETRANSMIT),
            (Kind::Final, 0xe, 0)
        );
    }

    fn encode_panics(h: Header) -> bool {
        std::panic::catch_unwind(|| h.encode(&mut [0u8; HEADER_LEN])).is_err()
    }

    #[test]
    fn fields_too_wide_for_the_wire_are_never_cut_short() {
        let h = Header {
            kind: Kind::Data,
            flags: MAX_FLAGS,
            channel: 255,
            session: 1,
            packet: MAX_PACKET,
            file: 0,
            offset: 0,
            len: 0,
            sent_us: 0,
        };
        assert!(!encode_panics(h));
        assert!(encode_panics(Header { flags: 0x10, ..h }));
        assert!(encode_panics(Header { channel: 256, ..h }));
        assert!(encode_panics(Header {
            packet: MAX_PACKET + 1,
            ..h
        }));
    }

    #[test]
    fn control_round_trip_and_limits() {
        let msgs = vec![
            Control::hello(0, 4, DEFAULT_PAYLOAD, 1 << 20, 42),
            Control::Manifest {
                entries: vec![
                    Entry {
                        path: "a/日本.txt".into(),
                        kind: EntryKind::File,
                        size: 5,
                        mode: 0o644,
                        mtime_ns: -1,
                        holes: vec![(1, 4)],
                        target: String::new(),
                    },
                    Entry {
                        path: "a/link".into(),
                        kind: EntryKind::Symlink,
                        size: 0,
                        mode: 0o777,
                        mtime_ns: 0,
                        holes: Vec::new(),
                        target: "../日本.txt".into(),
                    },
                ],
                last: true,
            },
            Control::Nack {
                channel: 1,
                seq: 3,
                ranges: vec![(0, 10), (20, 30)],
                knew_us: 7_000_000,
            },
            Control::ManifestReply {
                decisions: vec![
                    Decision::SendAll,
                    Decision::Resume {
                        blocks: vec![(0, 3), (7, 8)],
                    },
                    Decision::Refuse("exists".into()),
                ],
                last: true,
            },
            Control::Done,
            Control::Abort {
                cause: AbortCause::Interrupted,
                reason: "the sender was interrupted".into(),
            },
            Control::Agree {
                magic: MAGIC,
                version: VERSION,
                key_id: [1; 8],
                pake: vec![2; 33],
                confirm: vec![3; 32],
                plain_data: true,
            },
        ];
        for m in msgs {
            let frame = m.to_frame();
            let len = Control::frame_len(frame[..4].try_into().unwrap()).unwrap();
            assert_eq!(len, frame.len() - 4);
            assert_eq!(Control::from_body(&frame[4..]).unwrap(), m);
        }
        // A sealed frame carries a tag after the largest message.
        let sealed_max = (MAX_FRAME + crate::secure::TAG_LEN) as u32;
        assert!(Control::frame_len(sealed_max.to_be_bytes()).is_ok());
        assert!(Control::frame_len((sealed_max + 1).to_be_bytes()).is_err());
        let mut frame = Control::Done.to_frame();
        frame.push(0);
        assert!(Control::from_body(&frame[4..]).is_err(), "trailing bytes");
    }

    #[test]
    fn a_reject_reads_as_the_abort_of_version_4() {
        // Up to version 4, `Abort { reason }` was variant 15: a peer of that version can read
        // why it is turned away, and its own abort reads here as a reject.
        let frame = Control::Reject {
            reason: "no".into(),
        }
        .to_frame();
        assert_eq!(frame[4..], [15, 2, b'n', b'o']);
    }

    proptest! {
        #[test]
        fn header_round_trips(h in header(), extra in any::<u8>()) {
            let mut buf = vec![extra; HEADER_LEN + usize::from(h.len)];
            h.encode(&mut buf);
            let (back, payload) = Header::decode(&buf).unwrap();
            prop_assert_eq!(back, h);
            prop_assert_eq!(payload.len(), usize::from(h.len));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Header::decode(&bytes);
            let _ = Control::from_body(&bytes);
        }

        /// Whatever decodes encodes back to the same header bytes (as the datagram fuzz target
        /// checks): no bit of the 28 is lost or invented, unknown flag bits included.
        #[test]
        fn what_decodes_encodes_back_identically(
            bytes in proptest::collection::vec(any::<u8>(), HEADER_LEN..HEADER_LEN + 40),
        ) {
            if let Ok((h, payload)) = Header::decode(&bytes) {
                let mut again = [0u8; HEADER_LEN];
                h.encode(&mut again);
                prop_assert_eq!(&again[..], &bytes[..HEADER_LEN]);
                prop_assert_eq!(payload.len(), usize::from(h.len));
            }
        }

        #[test]
        fn nack_round_trips(channel in any::<u16>(), knew_us in any::<u32>(), ranges in proptest::collection::vec(any::<(u64, u64)>(), 0..50)) {
            let m = Control::Nack { channel, seq: 1, ranges, knew_us };
            let f = m.to_frame();
            prop_assert_eq!(Control::from_body(&f[4..]).unwrap(), m);
        }
    }
}
