//! A data channel's link: UDP datagrams, or one TCP connection carrying the same frames.
//!
//! Channel workers send and receive *frames*: a 28-byte [`Header`](hurtle_proto::wire::Header)
//! and its payload. Over UDP a frame is a datagram (batched with GSO/GRO by [`crate::net::udp`]),
//! whose size says how long its payload is. Over TCP (the parallel-TCP transport, for networks
//! that block UDP) frames follow each other on the stream, each behind its payload's length
//! ([`TCP_PREFIX`] bytes, big-endian: the header has no length field). Everything above this
//! module (striping, verification, NACKs, final markers) is the same for both.
//!
//! Frames are sealed (see [`hurtle_proto::secure`]): each carries a 16-byte tag after its
//! payload, made with the session's data key, and the receiving end opens it in place and
//! drops, and counts, anything that fails, before the channel sees it. With `--no-encryption`
//! on both sides frames go as they are. A frame the sealer refuses (its nonce used before) and
//! failures to open past the AEAD's integrity limit fail the link, and the session.
//!
//! A TCP data connection opens with a 32-byte greeting: 4 zero bytes, the session id (4 bytes,
//! big-endian), the channel index (2 bytes), 6 zero bytes, and a tag over those 16 bytes made
//! with the data key, so the receiver can tell which channel it is and that it comes from the
//! peer.
//!
//! A link fails with its own [`LinkError`] (its UDP socket, or its TCP data connection); the
//! session's error wraps it, as it does the other errors of [`crate::net`].

use crate::net::dial::RELAY_TAG;
use crate::net::udp::{ReceiveQueue, RecvBatch, UdpChannel, UdpError, MAX_FRAMED};
use hurtle_proto::punch::TAG_BYTE as PUNCH_TAG;
use hurtle_proto::secure::{DataKey, OpenError, PacketOpen, PacketSeal, SealError, TAG_LEN};
use hurtle_proto::wire::HEADER_LEN;
use std::io::{ErrorKind, IoSlice, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

/// Payload per frame on TCP data connections (a frame's length prefix is 16 bits).
pub const TCP_PAYLOAD: u16 = 65_472;
/// Bytes before each frame on a TCP data connection: its payload's length, big-endian (the
/// tag, when sealed, follows the payload and is not counted).
pub const TCP_PREFIX: usize = 2;
/// Bytes of the greeting that opens a TCP data connection: 16 bytes and their tag.
pub const GREETING_LEN: usize = 16 + TAG_LEN;

/// Encodes the greeting of a TCP data connection.
pub fn greeting(key: &DataKey, session: u32, channel: u16) -> [u8; GREETING_LEN] {
    let mut g = [0u8; GREETING_LEN];
    g[4..8].copy_from_slice(&session.to_be_bytes());
    g[8..10].copy_from_slice(&channel.to_be_bytes());
    let tag = key.greeting_tag(&g[..16]);
    g[16..].copy_from_slice(&tag);
    g
}

/// Reads a greeting; returns `(session, channel)`, or `None` for anything malformed or not
/// made with `key`.
pub fn read_greeting(
    stream: &mut TcpStream,
    key: &DataKey,
    timeout: Duration,
) -> Option<(u32, u16)> {
    stream.set_read_timeout(Some(timeout)).ok()?;
    let mut g = [0u8; GREETING_LEN];
    stream.read_exact(&mut g).ok()?;
    let zeros = g[..4].iter().chain(&g[10..16]).all(|&b| b == 0);
    if !zeros || !key.check_greeting(&g[..16], &g[16..]) {
        return None;
    }
    let session = u32::from_be_bytes(g[4..8].try_into().ok()?);
    Some((session, u16::from_be_bytes([g[8], g[9]])))
}

/// Why a channel's link failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The channel's UDP socket failed.
    #[error(transparent)]
    Udp(#[from] UdpError),
    /// The TCP data connection failed.
    #[error("TCP data connection: {0}")]
    Tcp(#[source] std::io::Error),
    /// A frame was not sealed: its nonce would have been used twice.
    #[error("data channel: {0}")]
    Seal(#[from] SealError),
    /// Too many frames failed authentication under the session's data key.
    #[error("data channel: {0}")]
    Integrity(OpenError),
}

/// A link's sealing: the sealer and the buffer sealed frames are built in (a frame's payload
/// is copied once, into its place beside its header and tag, and encrypted there).
pub struct Sealer {
    seal: PacketSeal,
    buf: Vec<u8>,
}

impl Sealer {
    /// Seals with `seal`.
    pub fn new(seal: PacketSeal) -> Sealer {
        Sealer {
            seal,
            buf: Vec::new(),
        }
    }

    /// Builds the sealed frames of `headers` and `data` (as [`LinkOut::send_framed`] takes
    /// them) in the buffer, each behind its length prefix when `tcp`; returns the buffer and
    /// the size of each frame but the last, or the sealer's refusal.
    fn frames(
        &mut self,
        headers: &[u8],
        data: &[u8],
        payload: usize,
        tcp: bool,
    ) -> Result<(&[u8], usize), SealError> {
        self.buf.clear();
        let step = payload.max(1);
        let frames = if data.is_empty() {
            headers.len() / HEADER_LEN
        } else {
            (headers.len() / HEADER_LEN).min(data.len().div_ceil(step))
        };
        for (i, header) in headers.chunks_exact(HEADER_LEN).take(frames).enumerate() {
            let piece = &data[(i * step).min(data.len())..((i + 1) * step).min(data.len())];
            if tcp {
                self.buf.extend_from_slice(&tcp_prefix(piece.len()));
            }
            let at = self.buf.len();
            self.buf.extend_from_slice(header);
            self.buf.extend_from_slice(piece);
            self.buf.extend_from_slice(&[0u8; TAG_LEN]);
            self.seal.seal(&mut self.buf[at..])?;
        }
        let prefix = if tcp { TCP_PREFIX } else { 0 };
        Ok((&self.buf, prefix + HEADER_LEN + payload + TAG_LEN))
    }
}

/// The sending end of a channel: where frames go, and how they are sealed (`None`: in the
/// clear, when both sides asked for it).
pub struct LinkOut {
    /// Where frames go.
    pub path: OutPath,
    seal: Option<Sealer>,
}

/// Where a channel's frames go.
pub enum OutPath {
    /// Datagrams to `dest`.
    Udp {
        /// The channel's socket.
        sock: UdpChannel,
        /// The receiver's port for this channel.
        dest: SocketAddr,
    },
    /// Frames on a TCP connection.
    Tcp(TcpStream),
}

impl LinkOut {
    /// A link over `path`, sealing with `seal`.
    pub fn new(path: OutPath, seal: Option<PacketSeal>) -> LinkOut {
        LinkOut {
            path,
            seal: seal.map(Sealer::new),
        }
    }

    /// Whether this is a TCP data connection.
    pub fn is_tcp(&self) -> bool {
        matches!(self.path, OutPath::Tcp(_))
    }

    /// Bytes a frame adds to its payload: the header, and the tag when sealed.
    pub fn frame_overhead(&self) -> usize {
        HEADER_LEN + if self.seal.is_some() { TAG_LEN } else { 0 }
    }

    /// Most frames worth building for one send call: what one GSO send carries, or without GSO
    /// what one `sendmmsg` does, never more than [`MAX_FRAMED`].
    pub fn max_frames(&self) -> usize {
        match &self.path {
            OutPath::Udp { sock, .. } => match sock.max_gso_segments() {
                0 | 1 => MAX_FRAMED,
                n => n.min(MAX_FRAMED),
            },
            OutPath::Tcp(_) => TCP_FRAMES,
        }
    }

    /// The most [`max_frames`](Self::max_frames) can ever say for this link.
    pub fn frame_limit(&self) -> usize {
        match self.path {
            OutPath::Udp { .. } => MAX_FRAMED,
            OutPath::Tcp(_) => TCP_FRAMES,
        }
    }

    /// Sends frames that are each one header of `headers` ([`HEADER_LEN`] bytes each, back to
    /// back) and the next `payload` bytes of `data` (the last may be shorter), without copying
    /// `data`: UDP gathers each datagram from the two pieces
    /// ([`UdpChannel::send_framed`]); TCP writes them with vectored writes. Sealed, each frame
    /// is built and encrypted in the sealer's buffer first.
    pub fn send_framed(
        &mut self,
        headers: &[u8],
        data: &[u8],
        payload: usize,
    ) -> Result<(), LinkError> {
        let tcp = self.is_tcp();
        if let Some(sealer) = &mut self.seal {
            let (buf, frame_size) = sealer.frames(headers, data, payload, tcp)?;
            return send_sealed(&mut self.path, buf, frame_size);
        }
        match &mut self.path {
            OutPath::Udp { sock, dest } => {
                lost_locally(sock.send_framed(*dest, headers, HEADER_LEN, data, payload))
            }
            OutPath::Tcp(s) => write_frames(s, headers, data, payload).map_err(LinkError::Tcp),
        }
    }

    /// Sends header-only frames laid back to back in `headers` (final markers).
    pub fn send_headers(&mut self, headers: &[u8]) -> Result<(), LinkError> {
        let tcp = self.is_tcp();
        if let Some(sealer) = &mut self.seal {
            let (buf, frame_size) = sealer.frames(headers, &[], 0, tcp)?;
            return send_sealed(&mut self.path, buf, frame_size);
        }
        match &mut self.path {
            OutPath::Tcp(s) => write_frames(s, headers, &[], 0).map_err(LinkError::Tcp),
            OutPath::Udp { .. } => send_sealed(&mut self.path, headers, HEADER_LEN),
        }
    }
}

/// Sends frames already built (and sealed, and behind their length prefixes on TCP) back to
/// back in `buf`, each `frame_size` bytes but the last.
fn send_sealed(path: &mut OutPath, buf: &[u8], frame_size: usize) -> Result<(), LinkError> {
    match path {
        OutPath::Udp { sock, dest } => lost_locally(sock.send_batch(*dest, buf, frame_size)),
        OutPath::Tcp(s) => s.write_all(buf).map_err(LinkError::Tcp),
    }
}

/// Frames per send on a TCP data connection, and per vectored write.
const TCP_FRAMES: usize = 16;

/// A send a local firewall refused (`EPERM`: a netfilter rule dropped it on the way out) is a
/// datagram lost, as on the path: repairs and probing deal with it, as they do with loss, and a
/// path where nothing gets through is found blocked by probing, not failed on the first send.
/// So is an unreachable peer or network (`UdpError::PeerUnreachable`): a
/// [connected](UdpChannel::connect) socket reports the ICMP error an earlier datagram drew on
/// its next send (an unconnected one never does), and a route missing now may come back; the
/// control connection and probing, not one datagram's fate, say whether the peer is gone.
fn lost_locally(sent: Result<(), UdpError>) -> Result<(), LinkError> {
    match sent {
        Err(UdpError::Io(e)) if e.raw_os_error() == Some(libc::EPERM) => Ok(()),
        Err(UdpError::PeerUnreachable(_)) => Ok(()),
        other => Ok(other?),
    }
}

/// The length prefix of a frame of `payload` bytes on a TCP data connection. A payload never
/// exceeds [`TCP_PAYLOAD`] (the frames' payload is a `u16`).
fn tcp_prefix(payload: usize) -> [u8; TCP_PREFIX] {
    debug_assert!(payload <= usize::from(u16::MAX));
    (payload as u16).to_be_bytes()
}

/// Writes frames (see [`LinkOut::send_framed`]; header-only frames, one per header, when
/// `data` is empty) to `stream`, each behind its length prefix, [`TCP_FRAMES`] at a time per
/// vectored write.
fn write_frames(
    stream: &mut TcpStream,
    headers: &[u8],
    data: &[u8],
    payload: usize,
) -> std::io::Result<()> {
    let step = payload.max(1);
    let frames = if data.is_empty() {
        headers.len() / HEADER_LEN
    } else {
        data.len().div_ceil(step)
    };
    for first in (0..frames).step_by(TCP_FRAMES) {
        let n = (frames - first).min(TCP_FRAMES);
        let mut prefixes = [[0u8; TCP_PREFIX]; TCP_FRAMES];
        let mut bodies: [&[u8]; TCP_FRAMES] = [&[]; TCP_FRAMES];
        for k in 0..n {
            let i = first + k;
            bodies[k] = &data[(i * step).min(data.len())..((i + 1) * step).min(data.len())];
            prefixes[k] = tcp_prefix(bodies[k].len());
        }
        let mut slices = [IoSlice::new(&[]); 3 * TCP_FRAMES];
        for k in 0..n {
            let i = first + k;
            let header = headers
                .get(i * HEADER_LEN..(i + 1) * HEADER_LEN)
                .ok_or_else(|| std::io::Error::new(ErrorKind::InvalidInput, "missing header"))?;
            slices[3 * k] = IoSlice::new(&prefixes[k]);
            slices[3 * k + 1] = IoSlice::new(header);
            slices[3 * k + 2] = IoSlice::new(bodies[k]);
        }
        let mut rest = &mut slices[..3 * n];
        while !rest.is_empty() {
            match stream.write_vectored(rest) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(written) => IoSlice::advance_slices(&mut rest, written),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// The receiving end of a channel. It never waits: a thread serving several channels waits
/// for any of their [`fd`](LinkIn::fd)s (see [`crate::net::udp::wait_readable`]), then reads each.
pub struct LinkIn {
    /// Where frames come from.
    pub path: InPath,
    open: Option<PacketOpen>,
}

/// Where a channel's frames come from.
pub enum InPath {
    /// Datagrams, received in batches.
    Udp(UdpChannel),
    /// Frames from a TCP connection.
    Tcp(TcpFrames),
}

impl LinkIn {
    /// A UDP link; its reads return at once when nothing is queued.
    pub fn udp(mut sock: UdpChannel, open: Option<PacketOpen>) -> Self {
        sock.set_read_timeout(Some(Duration::ZERO));
        LinkIn {
            path: InPath::Udp(sock),
            open,
        }
    }

    /// A TCP data connection's frames.
    pub fn tcp(frames: TcpFrames, open: Option<PacketOpen>) -> Self {
        LinkIn {
            path: InPath::Tcp(frames),
            open,
        }
    }

    /// Hands each frame that is waiting to `f` with its source and, for UDP, when the kernel
    /// says it arrived (see [`RecvBatch::for_each_mut`]), using `batch` for UDP;
    /// returns how many came (0 when none was waiting), those that failed to open included.
    /// A sealed frame is opened first; one that fails is dropped and counted
    /// ([`dropped`](Self::dropped)), and `f` never sees it. `f`'s error ends the reading and
    /// is returned; the link's own failure is returned as that error too.
    pub fn recv<E: From<LinkError>>(
        &mut self,
        batch: &mut RecvBatch,
        mut f: impl FnMut(&SocketAddr, Option<Instant>, &[u8]) -> Result<(), E>,
    ) -> Result<usize, E> {
        let tag = if self.open.is_some() { TAG_LEN } else { 0 };
        let open = &mut self.open;
        let mut deliver = |src: &SocketAddr, at: Option<Instant>, frame: &mut [u8]| match open {
            // A relay's answer or a punching datagram: never sealed, never data.
            Some(_) if matches!(frame.first(), Some(&RELAY_TAG) | Some(&PUNCH_TAG)) => {
                f(src, at, frame)
            }
            Some(o) => match o.open(frame) {
                Ok(plain) => f(src, at, plain),
                Err(e @ OpenError::IntegrityLimit { .. }) => Err(LinkError::Integrity(e).into()),
                Err(_) => Ok(()),
            },
            None => f(src, at, frame),
        };
        match &mut self.path {
            InPath::Udp(sock) => {
                let n = sock.recv_batch(batch).map_err(LinkError::from)?;
                if n > 0 {
                    batch.for_each_mut(&mut deliver)?;
                }
                Ok(n)
            }
            // A byte stream's frames have no arrival of their own.
            InPath::Tcp(t) => t.recv(tag, |src, frame| deliver(src, None, frame)),
        }
    }

    /// Frames dropped because they failed to open (forged, changed, replayed, misdirected).
    pub fn dropped(&self) -> u64 {
        self.open.as_ref().map_or(0, |o| o.dropped)
    }

    /// What to wait on for the next frame; `None` once a TCP connection has closed.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.path {
            InPath::Udp(sock) => Some(sock.as_fd()),
            InPath::Tcp(t) if t.closed => None,
            InPath::Tcp(t) => Some(t.stream.as_fd()),
        }
    }

    /// The receive queue of a UDP link, where the kernel reports it (see
    /// [`UdpChannel::receive_queue`]); `None` over TCP, whose queue is flow-controlled.
    pub fn receive_queue(&self) -> Option<ReceiveQueue> {
        match &self.path {
            InPath::Udp(sock) => sock.receive_queue(),
            InPath::Tcp(_) => None,
        }
    }

    /// The receive buffer a UDP link's socket was granted (see
    /// [`UdpChannel::granted_recv_buffer`]); `None` over TCP, which never drops.
    pub fn recv_buffer(&self) -> Option<usize> {
        match &self.path {
            InPath::Udp(sock) => Some(sock.granted_recv_buffer()),
            InPath::Tcp(_) => None,
        }
    }

    /// Kernel socket drops of a UDP link, when the kernel reports them.
    pub fn kernel_drops(&self) -> Option<u64> {
        match &self.path {
            InPath::Udp(sock) => sock.kernel_drops(),
            InPath::Tcp(_) => Some(0),
        }
    }
}

/// Splits a TCP byte stream into frames.
pub struct TcpFrames {
    stream: TcpStream,
    peer: SocketAddr,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    closed: bool,
}

impl TcpFrames {
    /// Reads frames from `stream` (after its greeting), without waiting.
    pub fn new(stream: TcpStream) -> std::io::Result<Self> {
        stream.set_nonblocking(true)?;
        let peer = stream.peer_addr()?;
        Ok(TcpFrames {
            stream,
            peer,
            buf: vec![0u8; 4 << 20],
            start: 0,
            end: 0,
            closed: false,
        })
    }

    /// Reads what is waiting and hands each whole frame (header, payload and `tag` bytes of
    /// tag; its length prefix read and left out) to `f`.
    fn recv<E: From<LinkError>>(
        &mut self,
        tag: usize,
        mut f: impl FnMut(&SocketAddr, &mut [u8]) -> Result<(), E>,
    ) -> Result<usize, E> {
        if self.closed {
            return Ok(0);
        }
        // Room for the longest frame a prefix can announce.
        if self.start > 0
            && self.buf.len() - self.end < TCP_PREFIX + HEADER_LEN + usize::from(u16::MAX) + TAG_LEN
        {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        match self.stream.read(&mut self.buf[self.end..]) {
            Ok(0) => self.closed = true,
            Ok(n) => self.end += n,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(LinkError::Tcp(e).into()),
        }
        let mut frames = 0;
        while self.end - self.start >= TCP_PREFIX + HEADER_LEN {
            let h = &mut self.buf[self.start..self.end];
            let len = TCP_PREFIX + HEADER_LEN + usize::from(u16::from_be_bytes([h[0], h[1]])) + tag;
            if h.len() < len {
                break;
            }
            f(&self.peer, &mut h[TCP_PREFIX..len])?;
            self.start += len;
            frames += 1;
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        Ok(frames)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::udp::ChannelOptions;
    use std::net::{IpAddr, Ipv4Addr};

    #[test]
    fn an_unreachable_peer_on_a_connected_socket_is_a_datagram_lost() {
        let dead = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let lo = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
        let mut sock = UdpChannel::bind(lo, &ChannelOptions::default()).unwrap();
        sock.connect(dead).unwrap();
        let mut link = LinkOut::new(OutPath::Udp { sock, dest: dead }, None);
        // Each send after the first draws the port unreachable the one before it did.
        for _ in 0..20 {
            link.send_headers(&[0u8; HEADER_LEN]).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    fn udp_link(gso: bool) -> LinkOut {
        let lo = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
        let opts = ChannelOptions {
            gso,
            ..ChannelOptions::default()
        };
        let sock = UdpChannel::bind(lo, &opts).unwrap();
        let dest = sock.local_addr();
        LinkOut::new(OutPath::Udp { sock, dest }, None)
    }

    fn data_key() -> DataKey {
        use hurtle_proto::secure::{answer, Offer, Secret};
        let secret = Secret::code("1-link-test");
        let hello = hurtle_proto::wire::Control::KeepAlive;
        let (offer, first) = Offer::new(&secret, false, &hello);
        let (_, reply) = answer(&secret, &first, &hello, false).unwrap();
        offer.finish(reply).unwrap().data
    }

    /// The header of channel 1's frame `pn`, of `len` bytes of payload (a final marker: 0).
    fn header(pn: u64, len: u16) -> [u8; HEADER_LEN] {
        use hurtle_proto::wire::{Header, Kind};
        let mut h = [0u8; HEADER_LEN];
        Header {
            kind: if len == 0 { Kind::Final } else { Kind::Data },
            flags: 0,
            channel: 1,
            session: 5,
            packet: pn,
            file: 0,
            offset: 0,
            len,
            sent_us: 0,
        }
        .encode(&mut h);
        h
    }

    /// Sealed frames open back into their header and their piece of the data, the last one
    /// shorter; header-only frames (final markers) too.
    #[test]
    fn sealed_frames_open_into_their_header_and_piece() {
        let key = data_key();
        let data: Vec<u8> = (0..250u8).collect();
        let headers: Vec<u8> = [header(1, 100), header(2, 100), header(3, 50)].concat();
        let mut sealer = Sealer::new(key.sealer());
        let (buf, size) = sealer.frames(&headers, &data, 100, false).unwrap();
        assert_eq!(size, HEADER_LEN + 100 + TAG_LEN);
        let mut open = key.opener(1);
        let mut buf = buf.to_vec();
        let mut pieces = Vec::new();
        for frame in buf.chunks_mut(size) {
            let plain = open.open(frame).expect("opens");
            pieces.extend_from_slice(&plain[HEADER_LEN..]);
        }
        assert_eq!(pieces, data);
        let (fin, size) = sealer.frames(&header(4, 0), &[], 0, false).unwrap();
        assert_eq!(
            (fin.len(), size),
            (HEADER_LEN + TAG_LEN, HEADER_LEN + TAG_LEN)
        );
        assert_eq!(
            open.open(&mut fin.to_vec()).expect("opens").len(),
            HEADER_LEN
        );
    }

    /// On a TCP data connection each frame goes behind its length prefix (the header has no
    /// length): frames of a full and a shorter payload, more than one vectored write's worth,
    /// and a final marker come out of the stream whole, sealed or not.
    #[test]
    fn tcp_frames_come_out_whole_behind_their_length_prefixes() {
        use hurtle_proto::wire::{Header, Kind};
        use std::net::TcpListener;
        let key = data_key();
        // 2 * TCP_FRAMES + 5 frames: the last of them 50 bytes.
        let frames = 2 * TCP_FRAMES + 5;
        let data: Vec<u8> = (0..(frames - 1) * 100 + 50).map(|i| i as u8).collect();
        let headers: Vec<u8> = (0..frames)
            .flat_map(|i| header(i as u64 + 1, if i + 1 < frames { 100 } else { 50 }))
            .collect();
        for sealed in [false, true] {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let out = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (incoming, _) = listener.accept().unwrap();
            let mut link = LinkOut::new(OutPath::Tcp(out), sealed.then(|| key.sealer()));
            link.send_framed(&headers, &data, 100).unwrap();
            link.send_headers(&header(frames as u64 + 1, 0)).unwrap();
            drop(link);
            let mut rx = TcpFrames::new(incoming).unwrap();
            let mut open = sealed.then(|| key.opener(1));
            let tag = if sealed { TAG_LEN } else { 0 };
            let mut got: Vec<(Header, Vec<u8>)> = Vec::new();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !rx.closed {
                assert!(std::time::Instant::now() < deadline, "the stream ends");
                rx.recv(tag, |_, frame| {
                    let plain = match &mut open {
                        Some(o) => o.open(frame).expect("opens"),
                        None => frame,
                    };
                    let (h, payload) = Header::decode(plain).expect("decodes");
                    got.push((h, payload.to_vec()));
                    Ok::<(), LinkError>(())
                })
                .unwrap();
            }
            assert_eq!(got.len(), frames + 1, "sealed: {sealed}");
            let packets: Vec<u64> = got.iter().map(|(h, _)| h.packet).collect();
            assert_eq!(packets, (1..=frames as u64 + 1).collect::<Vec<_>>());
            let (fin, rest) = got.split_last().unwrap();
            assert_eq!((fin.0.kind, fin.0.len, fin.1.len()), (Kind::Final, 0, 0));
            assert!(rest.iter().all(|(h, p)| usize::from(h.len) == p.len()));
            assert_eq!(
                rest.iter().flat_map(|(_, p)| p.clone()).collect::<Vec<_>>(),
                data
            );
        }
    }

    #[test]
    fn frames_per_send_stay_within_the_limit_and_batch_without_gso() {
        let with = udp_link(true);
        assert!((1..=with.frame_limit()).contains(&with.max_frames()));
        // Without GSO a send is still one sendmmsg of many datagrams, not one per call.
        let without = udp_link(false);
        assert_eq!(without.max_frames(), MAX_FRAMED);
        assert_eq!(without.frame_limit(), MAX_FRAMED);
    }

    /// Over a TCP data connection, a frame injected into the stream (a forged tag) is dropped
    /// and counted, the real frames around it come through; past the key's integrity limit
    /// the link fails with an error that says so. And a frame whose number the key sealed
    /// before (by another sealer, as a restarted or renumbered channel would hold) is refused,
    /// not sent.
    #[test]
    fn past_the_integrity_limit_the_link_fails_and_a_number_is_never_sealed_twice() {
        use std::net::TcpListener;
        let key = data_key().with_integrity_limit(2);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let out = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let mut inject = out.try_clone().unwrap();
        let (incoming, _) = listener.accept().unwrap();
        let mut link = LinkOut::new(OutPath::Tcp(out), Some(key.sealer()));
        let forged = |pn: u64| -> Vec<u8> {
            let mut f = tcp_prefix(5).to_vec();
            f.extend_from_slice(&header(pn, 5));
            f.extend_from_slice(b"evil!");
            f.extend_from_slice(&[0u8; TAG_LEN]);
            f
        };
        let data = [7u8; 100];
        link.send_framed(&header(1, 100), &data, 100).unwrap();
        inject.write_all(&forged(2)).unwrap();
        link.send_framed(&header(3, 100), &data, 100).unwrap();
        // Another sealer of the same key, as a channel restarted or renumbered would hold.
        let mut again = LinkOut::new(
            OutPath::Tcp(inject.try_clone().unwrap()),
            Some(key.sealer()),
        );
        let err = again.send_framed(&header(3, 100), &data, 100).unwrap_err();
        assert!(
            matches!(err, LinkError::Seal(SealError::Reused { .. })),
            "{err}"
        );
        let mut rx = LinkIn::tcp(TcpFrames::new(incoming).unwrap(), Some(key.opener(1)));
        let mut got: Vec<u64> = Vec::new();
        let mut batch = RecvBatch::new(1, 2048);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut read = |rx: &mut LinkIn, got: &mut Vec<u64>| {
            rx.recv(&mut batch, |_, _, frame| {
                let (h, payload) = hurtle_proto::wire::Header::decode(frame).expect("decodes");
                assert_eq!(payload, &data[..]);
                got.push(h.packet);
                Ok::<(), LinkError>(())
            })
        };
        while got.len() < 2 || rx.dropped() < 1 {
            assert!(Instant::now() < deadline, "the frames come");
            read(&mut rx, &mut got).expect("no failure yet");
        }
        assert_eq!((got.clone(), rx.dropped()), (vec![1, 3], 1));
        // Two more forgeries: the third failure passes the limit of 2.
        inject.write_all(&forged(4)).unwrap();
        inject.write_all(&forged(5)).unwrap();
        let err = loop {
            assert!(Instant::now() < deadline, "the limit is reached");
            if let Err(e) = read(&mut rx, &mut got) {
                break e;
            }
        };
        assert!(matches!(err, LinkError::Integrity(_)), "{err}");
        assert!(err.to_string().contains("integrity limit"), "{err}");
        assert_eq!(got, vec![1, 3]);
    }
}
