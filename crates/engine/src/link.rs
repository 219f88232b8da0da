//! A data channel's link: UDP datagrams, or one TCP connection carrying the same frames.
//!
//! Channel workers send and receive *frames*: a 40-byte [`Header`](hurtle_proto::wire::Header)
//! and its payload. Over UDP a frame is a datagram (batched with GSO/GRO by [`crate::udp`]).
//! Over TCP (the parallel-TCP transport, for networks that block UDP) frames follow each other
//! on the stream; each is self-delimiting because the header carries the payload length.
//! Everything above this module (striping, verification, NACKs, final markers) is the same for
//! both.
//!
//! A TCP data connection opens with a 16-byte greeting: the session id (8 bytes, big-endian),
//! the channel index (2 bytes) and 6 zero bytes, so the receiver can tell which channel it is.

use crate::error::SessionError;
use crate::udp::{ReceiveQueue, RecvBatch, UdpChannel, UdpError, MAX_FRAMED};
use hurtle_proto::wire::HEADER_LEN;
use std::io::{ErrorKind, IoSlice, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

/// Payload per frame on TCP data connections (the header's length field is 16 bits).
pub const TCP_PAYLOAD: u16 = 65_472;
/// Bytes of the greeting that opens a TCP data connection.
pub const GREETING_LEN: usize = 16;

/// Encodes the greeting of a TCP data connection.
pub fn greeting(session: u64, channel: u16) -> [u8; GREETING_LEN] {
    let mut g = [0u8; GREETING_LEN];
    g[..8].copy_from_slice(&session.to_be_bytes());
    g[8..10].copy_from_slice(&channel.to_be_bytes());
    g
}

/// Reads a greeting; returns `(session, channel)`, or `None` for anything malformed.
pub fn read_greeting(stream: &mut TcpStream, timeout: Duration) -> Option<(u64, u16)> {
    stream.set_read_timeout(Some(timeout)).ok()?;
    let mut g = [0u8; GREETING_LEN];
    stream.read_exact(&mut g).ok()?;
    if g[10..].iter().any(|&b| b != 0) {
        return None;
    }
    let session = u64::from_be_bytes(g[..8].try_into().ok()?);
    Some((session, u16::from_be_bytes([g[8], g[9]])))
}

/// The sending end of a channel.
pub enum LinkOut {
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
    /// Most frames worth building for one send call: what one GSO send carries, or without GSO
    /// what one `sendmmsg` does, never more than [`MAX_FRAMED`].
    pub fn max_frames(&self) -> usize {
        match self {
            LinkOut::Udp { sock, .. } => match sock.max_gso_segments() {
                0 | 1 => MAX_FRAMED,
                n => n.min(MAX_FRAMED),
            },
            LinkOut::Tcp(_) => TCP_FRAMES,
        }
    }

    /// The most [`max_frames`](Self::max_frames) can ever say for this link.
    pub fn frame_limit(&self) -> usize {
        match self {
            LinkOut::Udp { .. } => MAX_FRAMED,
            LinkOut::Tcp(_) => TCP_FRAMES,
        }
    }

    /// Sends frames that are each one header of `headers` ([`HEADER_LEN`] bytes each, back to
    /// back) and the next `payload` bytes of `data` (the last may be shorter), without copying
    /// `data`: UDP gathers each datagram from the two pieces
    /// ([`UdpChannel::send_framed`]); TCP writes them with vectored writes.
    pub fn send_framed(
        &mut self,
        headers: &[u8],
        data: &[u8],
        payload: usize,
    ) -> Result<(), SessionError> {
        match self {
            LinkOut::Udp { sock, dest } => {
                lost_locally(sock.send_framed(*dest, headers, HEADER_LEN, data, payload))
            }
            LinkOut::Tcp(s) => write_frames(s, headers, data, payload)
                .map_err(|e| SessionError::io("TCP data connection", e)),
        }
    }

    /// Sends frames laid back to back in `buf`, each `frame_size` bytes but the last.
    pub fn send(&mut self, buf: &[u8], frame_size: usize) -> Result<(), SessionError> {
        match self {
            LinkOut::Udp { sock, dest } => lost_locally(sock.send_batch(*dest, buf, frame_size)),
            LinkOut::Tcp(s) => s
                .write_all(buf)
                .map_err(|e| SessionError::io("TCP data connection", e)),
        }
    }
}

/// Frames per send on a TCP data connection, and per vectored write.
const TCP_FRAMES: usize = 16;

/// A send a local firewall refused (`EPERM`: a netfilter rule dropped it on the way out) is a
/// datagram lost, as on the path: repairs and probing deal with it, as they do with loss, and a
/// path where nothing gets through is found blocked by probing, not failed on the first send.
fn lost_locally(sent: Result<(), UdpError>) -> Result<(), SessionError> {
    match sent {
        Err(UdpError::Io(e)) if e.raw_os_error() == Some(libc::EPERM) => Ok(()),
        other => Ok(other?),
    }
}

/// Writes frames (see [`LinkOut::send_framed`]) to `stream`, [`TCP_FRAMES`] at a time per
/// vectored write.
fn write_frames(
    stream: &mut TcpStream,
    headers: &[u8],
    data: &[u8],
    payload: usize,
) -> std::io::Result<()> {
    let mut pieces = data.chunks(payload).enumerate().peekable();
    while pieces.peek().is_some() {
        let mut slices = [IoSlice::new(&[]); 2 * TCP_FRAMES];
        let mut n = 0;
        for (i, body) in pieces.by_ref().take(TCP_FRAMES) {
            let header = headers
                .get(i * HEADER_LEN..(i + 1) * HEADER_LEN)
                .ok_or_else(|| std::io::Error::new(ErrorKind::InvalidInput, "missing header"))?;
            slices[n] = IoSlice::new(header);
            slices[n + 1] = IoSlice::new(body);
            n += 2;
        }
        let mut rest = &mut slices[..n];
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
/// for any of their [`fd`](LinkIn::fd)s (see [`crate::udp::wait_readable`]), then reads each.
pub enum LinkIn {
    /// Datagrams, received in batches.
    Udp(UdpChannel),
    /// Frames from a TCP connection.
    Tcp(TcpFrames),
}

impl LinkIn {
    /// A UDP link; its reads return at once when nothing is queued.
    pub fn udp(mut sock: UdpChannel) -> Self {
        sock.set_read_timeout(Some(Duration::ZERO));
        LinkIn::Udp(sock)
    }

    /// Hands each frame that is waiting to `f` with its source, using `batch` for UDP;
    /// returns how many came (0 when none was waiting).
    pub fn recv(
        &mut self,
        batch: &mut RecvBatch,
        mut f: impl FnMut(&SocketAddr, &[u8]) -> Result<(), SessionError>,
    ) -> Result<usize, SessionError> {
        match self {
            LinkIn::Udp(sock) => {
                let n = sock.recv_batch(batch)?;
                if n > 0 {
                    for (src, d) in batch.iter() {
                        f(src, d)?;
                    }
                }
                Ok(n)
            }
            LinkIn::Tcp(t) => t.recv(f),
        }
    }

    /// What to wait on for the next frame; `None` once a TCP connection has closed.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        match self {
            LinkIn::Udp(sock) => Some(sock.as_fd()),
            LinkIn::Tcp(t) if t.closed => None,
            LinkIn::Tcp(t) => Some(t.stream.as_fd()),
        }
    }

    /// The receive queue of a UDP link, where the kernel reports it (see
    /// [`UdpChannel::receive_queue`]); `None` over TCP, whose queue is flow-controlled.
    pub fn receive_queue(&self) -> Option<ReceiveQueue> {
        match self {
            LinkIn::Udp(sock) => sock.receive_queue(),
            LinkIn::Tcp(_) => None,
        }
    }

    /// The receive buffer a UDP link's socket was granted (see
    /// [`UdpChannel::granted_recv_buffer`]); `None` over TCP, which never drops.
    pub fn recv_buffer(&self) -> Option<usize> {
        match self {
            LinkIn::Udp(sock) => Some(sock.granted_recv_buffer()),
            LinkIn::Tcp(_) => None,
        }
    }

    /// Kernel socket drops of a UDP link, when the kernel reports them.
    pub fn kernel_drops(&self) -> Option<u64> {
        match self {
            LinkIn::Udp(sock) => sock.kernel_drops(),
            LinkIn::Tcp(_) => Some(0),
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

    fn recv(
        &mut self,
        mut f: impl FnMut(&SocketAddr, &[u8]) -> Result<(), SessionError>,
    ) -> Result<usize, SessionError> {
        if self.closed {
            return Ok(0);
        }
        if self.start > 0 && self.buf.len() - self.end < HEADER_LEN + usize::from(TCP_PAYLOAD) {
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
            Err(e) => return Err(SessionError::io("TCP data connection", e)),
        }
        let mut frames = 0;
        while self.end - self.start >= HEADER_LEN {
            let h = &self.buf[self.start..self.end];
            let len = usize::from(u16::from_be_bytes([h[32], h[33]]));
            if h.len() < HEADER_LEN + len {
                break;
            }
            let frame = &h[..HEADER_LEN + len];
            f(&self.peer, frame)?;
            self.start += HEADER_LEN + len;
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
    use crate::udp::ChannelOptions;
    use std::net::{IpAddr, Ipv4Addr};

    fn udp_link(gso: bool) -> LinkOut {
        let lo = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
        let opts = ChannelOptions {
            gso,
            ..ChannelOptions::default()
        };
        let sock = UdpChannel::bind(lo, &opts).unwrap();
        let dest = sock.local_addr();
        LinkOut::Udp { sock, dest }
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
}
