//! Batched UDP data channels.
//!
//! One channel is one UDP socket, used by one thread at a time (a receiving thread may serve
//! several, waiting on all of them with [`wait_readable`]). This module moves bytes in and out of
//! that socket with as few system calls as the kernel allows; the rule of the project is that no
//! system call is made per datagram on the data path.
//!
//! # What it owns
//!
//! - Batched sending ([`UdpChannel::send_batch`]) and receiving ([`UdpChannel::recv_batch`]).
//! - Socket buffer sizing: `SO_RCVBUF`/`SO_SNDBUF`, what the kernel really granted, and a
//!   one-line hint naming the sysctl to raise when it granted less ([`UdpChannel::buffer_warning`]).
//! - The kernel's drop counter for the socket ([`UdpChannel::kernel_drops`]).
//!
//! # What it does not own
//!
//! Any protocol knowledge. Bytes go in, bytes come out; headers, sequence numbers, pacing,
//! loss recovery and verification live in `hurtle-proto`. Datagrams are not validated here.
//!
//! # How sending works
//!
//! The caller hands [`UdpChannel::send_batch`] one buffer holding several datagrams back to back,
//! each `segment_size` bytes long except possibly the last, or [`UdpChannel::send_framed`]
//! the same datagrams as headers in one buffer and payloads as consecutive slices of another
//! (a block of the file), so the sender never copies payload into a datagram buffer. Either way
//! the kernel gathers each datagram from its pieces (one iovec, or a header's and a payload's);
//! both go through one loop, `send_gathered`.
//!
//! - **GSO** (Linux 4.18+, [`UdpChannel::max_gso_segments`] > 1): the datagrams are cut into
//!   runs of at most `max_gso_segments()` segments and at most [`MAX_GSO_BYTES`] bytes, and each
//!   run is one `sendmsg` with a `UDP_SEGMENT` control message (written here: quinn-udp sends
//!   only contiguous buffers). The kernel, or the NIC, cuts it into datagrams. With 1424-byte
//!   datagrams that is 45 per system call. A lone datagram is sent without `UDP_SEGMENT`.
//! - **Fallback** (no GSO, or [`ChannelOptions::gso`] off): the datagrams go out with
//!   `sendmmsg(2)`, up to 64 per call. Its message headers and iovecs live in fixed arrays on
//!   the stack, so nothing is allocated per call. If a GSO send fails with `EIO`/`EINVAL` (a
//!   driver that cannot segment), GSO is turned off for the socket and the run is sent again on
//!   this path.
//! - Gathering the payload from its block instead of copying it into datagram buffers takes
//!   away the user-space copy, and the kernel's copy grows by less than that (it reads the
//!   block rather than a freshly written buffer).
//! - A full send buffer (`EAGAIN`) is waited out with `poll(2)`, and `ENOBUFS` (a full device
//!   queue) with short sleeps; both for at most [`SEND_STALL_LIMIT`] in a row before
//!   [`UdpError::SendStalled`].
//!
//! # How receiving works
//!
//! [`UdpChannel::recv_batch`] fills a [`RecvBatch`], allocated once, with one `recvmmsg(2)`
//! (through quinn-udp's `UdpSocketState::recv`): up to [`MAX_RECV_BUFFERS`] buffers per call.
//! quinn-udp turns on **GRO** (`UDP_GRO`) where the kernel has it, so one buffer can hold up to
//! 64 datagrams of the same size, `stride` bytes apart (the last may be shorter). On loopback
//! a GSO send arrives as one such buffer. [`RecvBatch::iter`] splits buffers back into
//! datagrams, so callers never see the difference. With GRO on, buffers must be at least
//! [`GRO_BUF_SIZE`] bytes, or a merged batch would be cut short.
//!
//! # Blocking and timeouts
//!
//! The socket stays non-blocking, as quinn-udp configures it. A plain blocking socket does not
//! work well here: `recvmmsg` without `MSG_WAITFORONE` (quinn-udp passes no flags) keeps
//! blocking until *all* buffers are filled, so a half-empty queue would stall every call for a
//! whole `SO_RCVTIMEO`. Instead `recv_batch` tries `recvmmsg` first and, only when the queue is
//! empty, waits in `poll(2)` for at most the read timeout. A busy channel makes one system call
//! per batch; an idle one makes one more.
//!
//! # Receive queue and drop counters
//!
//! quinn-udp reads no `SO_RXQ_OVFL` control message, so that option is not enabled. Instead
//! [`UdpChannel::receive_queue`] asks the kernel with one `getsockopt(SO_MEMINFO)` how many
//! bytes wait in the socket's receive buffer, its limit, and how many packets it dropped.
//! Where that option is missing, [`UdpChannel::kernel_drops`] falls back to the socket's
//! `drops` column in `/proc/net/udp` or `/proc/net/udp6` (a file read: for statistics, not
//! per batch). Drops count packets, and a GRO batch is one packet.
//!
//! # System calls
//!
//! `poll(2)`, `sendmsg(2)` with `UDP_SEGMENT`, `sendmmsg(2)` and `getsockopt(SO_MEMINFO)` are
//! made through the safe wrappers of the engine's `sys` folder; there is no `unsafe` here.

use std::{
    fmt,
    io::{self, IoSliceMut},
    net::{IpAddr, SocketAddr, UdpSocket},
    os::fd::{AsFd, AsRawFd, BorrowedFd},
    time::{Duration, Instant},
};

use crate::sys::{self, socket::MMSG_BATCH};
use quinn_udp::{RecvMeta, UdpSocketState};
use socket2::{Domain, Protocol, Socket, Type};

/// Largest UDP payload over IPv4 (65535 minus 20 bytes of IP header and 8 of UDP header), and so
/// the most one datagram, or one GSO send, may carry.
pub const MAX_DATAGRAM: usize = 65_507;

/// Most bytes one GSO send carries. The kernel cuts a GSO packet into datagrams in software,
/// before the device, when its length with IP, UDP and link headers reaches the device's
/// `gso_max_size` (64 KiB on loopback and most NICs): the NIC's segmentation offload is then
/// lost, and on loopback the receiver gets every datagram on its own instead of one GRO buffer.
/// Measured on loopback over IPv4: 65 492 payload bytes in one send stayed one packet, 65 494
/// arrived as separate datagrams. This limit leaves room for IPv6's 40-byte header and a
/// 14-byte Ethernet header: 45 datagrams of a 1500-byte path's size per send (46 were cut up).
pub const MAX_GSO_BYTES: usize = 65_536 - 14 - 40 - 8 - 1;

/// Most datagrams one [`UdpChannel::send_framed`] call gathers into one system call.
pub const MAX_FRAMED: usize = 64;

/// Smallest [`RecvBatch`] buffer that can hold any GRO batch the kernel may hand over (the kernel
/// caps a merged batch at 64 KiB).
pub const GRO_BUF_SIZE: usize = 65_536;

/// Most buffers one `recv_batch` call fills: quinn-udp's batch size for `recvmmsg`. A
/// [`RecvBatch`] with more buffers is trimmed to this.
pub const MAX_RECV_BUFFERS: usize = quinn_udp::BATCH_SIZE;

/// How long a send may keep failing with a full send buffer or `ENOBUFS` before
/// [`UdpChannel::send_batch`] gives up with [`UdpError::SendStalled`].
pub const SEND_STALL_LIMIT: Duration = Duration::from_secs(2);

/// Longest single sleep while the device queue is full (`ENOBUFS`).
const ENOBUFS_MAX_SLEEP: Duration = Duration::from_millis(1);

/// Why a UDP channel operation failed.
#[derive(Debug, thiserror::Error)]
pub enum UdpError {
    /// The socket could not be bound to the address.
    #[error("cannot bind UDP socket to {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the kernel said.
        source: io::Error,
    },
    /// Creating or configuring the socket failed.
    #[error("UDP socket setup failed ({what}): {source}")]
    Setup {
        /// The step that failed.
        what: &'static str,
        /// What the kernel said.
        source: io::Error,
    },
    /// `segment_size` was 0 or larger than [`MAX_DATAGRAM`].
    #[error("segment size {0} is outside 1..={MAX_DATAGRAM}")]
    InvalidSegmentSize(usize),
    /// The [`RecvBatch`] buffers are smaller than a GRO batch can be.
    #[error("receive buffers of {have} bytes cannot hold a GRO batch; use at least {need}")]
    RecvBufferTooSmall {
        /// The batch's buffer size.
        have: usize,
        /// The size needed.
        need: usize,
    },
    /// The kernel reported the peer unreachable (an ICMP port, host or network unreachable).
    /// Linux reports these reliably only on a [connected](UdpChannel::connect) socket.
    #[error("UDP peer unreachable: {0}")]
    PeerUnreachable(io::Error),
    /// Sends kept failing with a full send buffer or a full device queue for this long.
    #[error("UDP send stalled for {0:?}: send buffer or device queue stayed full")]
    SendStalled(Duration),
    /// Any other socket error.
    #[error("UDP socket error: {0}")]
    Io(#[from] io::Error),
}

impl UdpError {
    /// Sorts an error from a send or receive call into a variant.
    fn from_io(e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EHOSTDOWN) => {
                Self::PeerUnreachable(e)
            }
            _ => Self::Io(e),
        }
    }
}

/// How to set up a [`UdpChannel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelOptions {
    /// `SO_RCVBUF` to ask for, in bytes (default 4 MiB). Linux caps it at `net.core.rmem_max`.
    pub recv_buffer: usize,
    /// `SO_SNDBUF` to ask for, in bytes (default 4 MiB). Linux caps it at `net.core.wmem_max`.
    pub send_buffer: usize,
    /// Longest [`UdpChannel::recv_batch`] waits for a datagram before returning 0 (default
    /// 50 ms). `None` waits for ever.
    pub read_timeout: Option<Duration>,
    /// Use UDP GSO when the kernel supports it (default `true`). `false` forces the `sendmmsg`
    /// path, for comparison or for drivers that mishandle GSO.
    pub gso: bool,
}

impl Default for ChannelOptions {
    fn default() -> Self {
        Self {
            recv_buffer: 4 << 20,
            send_buffer: 4 << 20,
            read_timeout: Some(Duration::from_millis(50)),
            gso: true,
        }
    }
}

/// A socket's receive queue at one moment, in the kernel's accounting: `queued` counts each
/// packet's buffer overhead too, and the kernel drops arriving packets once `queued` reaches
/// `limit`, so `queued / limit` is how close the socket is to dropping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiveQueue {
    /// Bytes held by packets waiting to be read.
    pub queued: u64,
    /// The receive buffer's limit (what `SO_RCVBUF` granted, as the kernel stores it).
    pub limit: u64,
    /// Packets dropped since the socket was created.
    pub drops: u64,
}

impl ReceiveQueue {
    /// How full the queue is, in thousandths of its limit (capped at 1000).
    pub fn fill_permille(&self) -> u64 {
        (self.queued.saturating_mul(1000) / self.limit.max(1)).min(1000)
    }
}

/// One UDP data channel: a socket with batched send and receive. Meant to be owned and driven by
/// one thread.
#[derive(Debug)]
pub struct UdpChannel {
    socket: UdpSocket,
    state: UdpSocketState,
    local: SocketAddr,
    read_timeout: Option<Duration>,
    gso: bool,
    requested_recv: usize,
    requested_send: usize,
    granted_recv: usize,
    granted_send: usize,
}

impl UdpChannel {
    /// Binds a channel to `addr` (port 0 picks a free port; see [`local_addr`](Self::local_addr)),
    /// sets its buffer sizes and turns on the offloads the kernel has.
    pub fn bind(addr: SocketAddr, opts: &ChannelOptions) -> Result<Self, UdpError> {
        fn setup(what: &'static str) -> impl FnOnce(io::Error) -> UdpError {
            move |source| UdpError::Setup { what, source }
        }
        let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))
            .map_err(setup("create socket"))?;
        sock.set_recv_buffer_size(opts.recv_buffer)
            .map_err(setup("set SO_RCVBUF"))?;
        sock.set_send_buffer_size(opts.send_buffer)
            .map_err(setup("set SO_SNDBUF"))?;
        sock.bind(&addr.into())
            .map_err(|source| UdpError::Bind { addr, source })?;
        let granted_recv = kernel_granted(sock.recv_buffer_size().map_err(setup("get SO_RCVBUF"))?);
        let granted_send = kernel_granted(sock.send_buffer_size().map_err(setup("get SO_SNDBUF"))?);
        let socket = UdpSocket::from(sock);
        // Sets the socket non-blocking, which recv_batch relies on (see the module docs), and
        // turns on GRO, packet info and the rest.
        let state = UdpSocketState::new((&socket).into()).map_err(setup("enable offloads"))?;
        let local = socket.local_addr().map_err(setup("get local address"))?;
        Ok(Self {
            socket,
            state,
            local,
            read_timeout: opts.read_timeout,
            gso: opts.gso,
            requested_recv: opts.recv_buffer,
            requested_send: opts.send_buffer,
            granted_recv,
            granted_send,
        })
    }

    /// The address the socket is bound to, with the real port if port 0 was asked for.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Fixes the peer: the kernel then drops datagrams from any other source and reports ICMP
    /// errors from the peer as [`UdpError::PeerUnreachable`]. Optional; `send_batch` still takes
    /// a destination.
    pub fn connect(&mut self, peer: SocketAddr) -> Result<(), UdpError> {
        self.socket.connect(self.for_socket(peer))?;
        Ok(())
    }

    /// Another handle on the same socket (same port, same options), for datagrams sent beside
    /// the channel's own batches, such as path probes.
    pub fn try_clone_socket(&self) -> io::Result<std::net::UdpSocket> {
        self.socket.try_clone()
    }

    /// Changes how long [`recv_batch`](Self::recv_batch) waits; `None` waits for ever.
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) {
        self.read_timeout = timeout;
    }

    /// The receive buffer the kernel granted, in bytes of payload room. Linux reports twice the
    /// value set (the other half is for its bookkeeping); this is the reported value halved, so
    /// it compares directly with [`ChannelOptions::recv_buffer`].
    pub fn granted_recv_buffer(&self) -> usize {
        self.granted_recv
    }

    /// The send buffer the kernel granted, halved on Linux like
    /// [`granted_recv_buffer`](Self::granted_recv_buffer).
    pub fn granted_send_buffer(&self) -> usize {
        self.granted_send
    }

    /// Most datagrams one GSO send may carry; 1 when GSO is unavailable or turned off, in which
    /// case `send_batch` uses `sendmmsg`. Can drop to 1 later if a GSO send fails.
    pub fn max_gso_segments(&self) -> usize {
        if self.gso {
            self.state.max_gso_segments()
        } else {
            1
        }
    }

    /// Most datagrams the kernel may merge into one received buffer (64 with GRO, else 1).
    pub fn gro_segments(&self) -> usize {
        self.state.gro_segments()
    }

    /// A one-line hint when the kernel granted smaller buffers than asked for, naming the sysctl
    /// to raise and the value that would do; `None` when both were granted in full.
    pub fn buffer_warning(&self) -> Option<String> {
        let mut parts = Vec::new();
        for (which, asked, got, sysctl) in [
            (
                "receive",
                self.requested_recv,
                self.granted_recv,
                "net.core.rmem_max",
            ),
            (
                "send",
                self.requested_send,
                self.granted_send,
                "net.core.wmem_max",
            ),
        ] {
            if got < asked {
                parts.push(format!(
                    "UDP {which} buffer is {} instead of the {} asked for; raise it with `sysctl -w {sysctl}={asked}`",
                    human_bytes(got),
                    human_bytes(asked),
                ));
            }
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    /// The receive queue now: bytes waiting and the drops so far, from `SO_MEMINFO` (one
    /// `getsockopt`, cheap enough to call every millisecond or so). `None` where the kernel
    /// does not have it (not Linux, or older than 4.11).
    pub fn receive_queue(&self) -> Option<ReceiveQueue> {
        sys::socket::meminfo(self.socket.as_fd()).map(|(queued, limit, drops)| ReceiveQueue {
            queued,
            limit,
            drops,
        })
    }

    /// Packets the kernel dropped on this socket since it was created, mostly because the
    /// receive buffer was full: from [`receive_queue`](Self::receive_queue) where the kernel has
    /// it, else read from the `drops` column of `/proc/net/udp` (or `udp6`), on the line whose
    /// inode is this socket's (more exact than the local port, which `SO_REUSEPORT` sockets
    /// share). `None` when neither is possible. The fallback reads a file, so call this for
    /// statistics, not per batch.
    ///
    /// The kernel counts packets as they reach the socket, so a GRO batch counts once: over
    /// loopback, where a GSO send arrives whole, one drop can be up to 64 lost datagrams.
    pub fn kernel_drops(&self) -> Option<u64> {
        self.receive_queue()
            .map(|q| q.drops)
            .or_else(|| self.proc_drops())
    }

    /// The socket's drop counter from `/proc/net/udp` (or `udp6`).
    fn proc_drops(&self) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        let fd = self.socket.as_raw_fd();
        let inode = std::fs::metadata(format!("/proc/self/fd/{fd}")).ok()?.ino();
        let table = match self.local {
            SocketAddr::V4(_) => "/proc/net/udp",
            SocketAddr::V6(_) => "/proc/net/udp6",
        };
        // The kernel prints this table in pieces; a socket that another thread opens or closes
        // between two pieces can shift our line past a piece boundary so that one read misses
        // it. Our socket is open, so a miss is that race: read again.
        (0..4).find_map(|_| {
            let text = std::fs::read_to_string(table).ok()?;
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref pointer drops
            text.lines().skip(1).find_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                match fields.get(9)?.parse::<u64>() {
                    Ok(i) if i == inode => fields.get(12)?.parse().ok(),
                    _ => None,
                }
            })
        })
    }

    /// Sends the datagrams in `buf` to `dest`: `buf` holds them back to back, each
    /// `segment_size` bytes except possibly the last, which may be shorter. Uses one GSO
    /// `sendmsg` per [`max_gso_segments`](Self::max_gso_segments) datagrams, or `sendmmsg` for up
    /// to 64 at a time without GSO. An empty `buf` sends nothing.
    ///
    /// `segment_size` must fit the path MTU. With GSO, a segment the device cannot carry fails
    /// with `EINVAL`, which is taken for "GSO unsupported": GSO is turned off for this socket
    /// and the datagrams then fail with `EMSGSIZE` as they would without GSO.
    pub fn send_batch(
        &mut self,
        dest: SocketAddr,
        buf: &[u8],
        segment_size: usize,
    ) -> Result<(), UdpError> {
        if segment_size == 0 || segment_size > MAX_DATAGRAM {
            return Err(UdpError::InvalidSegmentSize(segment_size));
        }
        let count = buf.len().div_ceil(segment_size);
        self.send_gathered(dest, segment_size, count, 1, |d| {
            [
                &buf[d * segment_size..((d + 1) * segment_size).min(buf.len())],
                &[],
            ]
        })
    }

    /// Sends datagrams that are each one header of `headers` (`header_len` bytes each, back to
    /// back) followed by the next `payload` bytes of `data` (the last datagram's share may be
    /// shorter): the datagrams [`send_batch`](Self::send_batch) would send of the same bytes
    /// laid out datagram by datagram, without copying `data` into such a buffer. The kernel
    /// gathers each datagram from its two pieces: `sendmsg` with iovecs and `UDP_SEGMENT`
    /// (at most [`MAX_FRAMED`] datagrams and [`MAX_GSO_BYTES`] per call), or `sendmmsg`
    /// without GSO. `headers` must hold a header for every datagram `data` makes.
    pub fn send_framed(
        &mut self,
        dest: SocketAddr,
        headers: &[u8],
        header_len: usize,
        data: &[u8],
        payload: usize,
    ) -> Result<(), UdpError> {
        let segment_size = header_len + payload;
        if header_len == 0 || payload == 0 || segment_size > MAX_DATAGRAM {
            return Err(UdpError::InvalidSegmentSize(segment_size));
        }
        let count = data.len().div_ceil(payload);
        if headers.len() < count * header_len {
            return Err(UdpError::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                "fewer headers than datagrams",
            )));
        }
        self.send_gathered(dest, segment_size, count, 2, |d| {
            [
                &headers[d * header_len..(d + 1) * header_len],
                &data[d * payload..((d + 1) * payload).min(data.len())],
            ]
        })
    }

    /// Sends datagrams `0..count`, each gathered by the kernel from the first `per` (1 or 2)
    /// of the pieces `pieces(d)` gives, every datagram `segment_size` bytes long but the last:
    /// with GSO one `sendmsg` with `UDP_SEGMENT` per [`MAX_GSO_BYTES`] (a lone datagram goes
    /// without it, as a plain send), else `sendmmsg` for up to [`MMSG_BATCH`] datagrams. A GSO
    /// send that fails with `EIO`/`EINVAL` (a device that cannot segment) turns GSO off for the
    /// socket and is sent again without it.
    fn send_gathered<'a>(
        &mut self,
        dest: SocketAddr,
        segment_size: usize,
        count: usize,
        per: usize,
        pieces: impl Fn(usize) -> [&'a [u8]; 2],
    ) -> Result<(), UdpError> {
        let dest = socket2::SockAddr::from(self.for_socket(dest));
        let mut first = 0;
        while first < count {
            let gso = self.max_gso_segments();
            let n = if gso > 1 {
                gso.min(MAX_GSO_BYTES / segment_size).max(1)
            } else {
                MMSG_BATCH
            }
            .min(MAX_FRAMED)
            .min(count - first);
            let mut iovs = [sys::socket::iovec(&[]); 2 * MAX_FRAMED];
            for (i, slots) in iovs.chunks_exact_mut(per).take(n).enumerate() {
                for (slot, piece) in slots.iter_mut().zip(pieces(first + i)) {
                    *slot = sys::socket::iovec(piece);
                }
            }
            let iovs = &iovs[..per * n];
            let fd = self.socket.as_fd();
            if gso > 1 && n > 1 {
                match self
                    .retry_send(|| sys::socket::sendmsg_segmented(fd, &dest, iovs, segment_size))
                {
                    Ok(()) => first += n,
                    Err(UdpError::Io(e))
                        if matches!(e.raw_os_error(), Some(libc::EIO) | Some(libc::EINVAL)) =>
                    {
                        self.gso = false;
                    }
                    Err(e) => return Err(e),
                }
            } else {
                first += self.retry_send(|| sys::socket::sendmmsg(fd, &dest, iovs, per))?;
            }
        }
        Ok(())
    }

    /// Receives what one `recvmmsg` call gives into `out`, replacing what it held, and returns
    /// the number of datagrams (GRO buffers counted as the datagrams they hold). Waits up to the
    /// read timeout for the first datagram and returns `Ok(0)` if none came. Allocates nothing.
    ///
    /// Datagrams longer than `out`'s buffer size are cut short without notice, so size buffers
    /// for the largest datagram expected; with GRO on they must be at least [`GRO_BUF_SIZE`].
    pub fn recv_batch(&mut self, out: &mut RecvBatch) -> Result<usize, UdpError> {
        out.clear();
        if self.gro_segments() > 1 && out.buf_size < GRO_BUF_SIZE {
            return Err(UdpError::RecvBufferTooSmall {
                have: out.buf_size,
                need: GRO_BUF_SIZE,
            });
        }
        let mut deadline: Option<Option<Instant>> = None;
        loop {
            let result = {
                let mut chunks = out.data.chunks_mut(out.buf_size);
                let mut bufs: [IoSliceMut<'_>; MAX_RECV_BUFFERS] =
                    std::array::from_fn(|_| IoSliceMut::new(chunks.next().unwrap_or(&mut [])));
                let n = out.meta.len();
                self.state
                    .recv((&self.socket).into(), &mut bufs[..n], &mut out.meta)
            };
            match result {
                Ok(n) => return Ok(out.fill(n)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let now = Instant::now();
                    let deadline =
                        *deadline.get_or_insert_with(|| self.read_timeout.map(|t| now + t));
                    let remaining = match deadline {
                        None => None,
                        Some(d) if d <= now => return Ok(0),
                        Some(d) => Some(d - now),
                    };
                    sys::socket::wait(self.socket.as_fd(), libc::POLLIN, remaining)?;
                }
                Err(e) => return Err(UdpError::from_io(e)),
            }
        }
    }

    /// Runs a send operation, waiting out a full send buffer or device queue for at most
    /// [`SEND_STALL_LIMIT`].
    fn retry_send<T>(&self, mut op: impl FnMut() -> io::Result<T>) -> Result<T, UdpError> {
        let mut stalled_since: Option<Instant> = None;
        let mut nap = Duration::from_micros(20);
        loop {
            let e = match op() {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            let would_block = e.kind() == io::ErrorKind::WouldBlock;
            if !would_block && e.raw_os_error() != Some(libc::ENOBUFS) {
                return Err(UdpError::from_io(e));
            }
            let since = *stalled_since.get_or_insert_with(Instant::now);
            let waited = since.elapsed();
            if waited >= SEND_STALL_LIMIT {
                return Err(UdpError::SendStalled(waited));
            }
            if would_block {
                let left = SEND_STALL_LIMIT - waited;
                sys::socket::wait(self.socket.as_fd(), libc::POLLOUT, Some(left))?;
            } else {
                std::thread::sleep(nap);
                nap = (nap * 2).min(ENOBUFS_MAX_SLEEP);
            }
        }
    }

    /// Writes `addr` in the socket's address family where possible (IPv4 as IPv4-mapped IPv6 on
    /// an IPv6 socket and back), so that a dual-stack socket takes plain IPv4 addresses.
    fn for_socket(&self, addr: SocketAddr) -> SocketAddr {
        match (self.local, addr) {
            (SocketAddr::V6(_), SocketAddr::V4(v4)) => {
                SocketAddr::new(IpAddr::V6(v4.ip().to_ipv6_mapped()), v4.port())
            }
            (SocketAddr::V4(_), SocketAddr::V6(v6)) => match v6.ip().to_ipv4_mapped() {
                Some(ip) => SocketAddr::new(IpAddr::V4(ip), v6.port()),
                None => addr,
            },
            _ => addr,
        }
    }
}

/// Halves what Linux reports for `SO_RCVBUF`/`SO_SNDBUF`: it stores twice the value set.
fn kernel_granted(reported: usize) -> usize {
    if cfg!(any(target_os = "linux", target_os = "android")) {
        reported / 2
    } else {
        reported
    }
}

/// `4194304` as "4 MiB", `1000` as "1000 bytes".
fn human_bytes(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} bytes")
    }
}

/// An IPv4-mapped IPv6 address (what a dual-stack socket reports for IPv4 peers) as plain IPv4.
fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(ip) => SocketAddr::new(IpAddr::V4(ip), v6.port()),
            None => addr,
        },
        SocketAddr::V4(_) => addr,
    }
}

impl AsFd for UdpChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

pub use crate::sys::socket::MAX_WAIT_FDS;

/// Waits until one of `fds` (sockets of any kind; `None` for one not to watch; at most
/// [`MAX_WAIT_FDS`], any beyond are not watched) has something to read, or `timeout` passes; a
/// thread serving several channels sleeps here. Returns which are ready to read (or have an
/// error or hang-up for the read to report): bit `i` for the `i`th of `fds`; 0 after a timeout
/// or a signal. Allocates nothing.
pub fn wait_readable<'a>(
    fds: impl IntoIterator<Item = Option<BorrowedFd<'a>>>,
    timeout: Duration,
) -> Result<u64, UdpError> {
    sys::socket::wait_any(fds, libc::POLLIN, Some(timeout)).map_err(UdpError::from_io)
}

/// Receive buffers for [`UdpChannel::recv_batch`], allocated once and reused: `buffers` buffers
/// of `buf_size` bytes each, and the datagrams the last call received.
pub struct RecvBatch {
    data: Vec<u8>,
    meta: Vec<RecvMeta>,
    buf_size: usize,
    filled: usize,
    datagrams: usize,
}

impl RecvBatch {
    /// Allocates `buffers` buffers (clamped to 1..=[`MAX_RECV_BUFFERS`]) of `buf_size` bytes
    /// (at least 1). With GRO on (the usual case on Linux) `buf_size` must be at least
    /// [`GRO_BUF_SIZE`]; `RecvBatch::new(32, GRO_BUF_SIZE)` (2 MiB) is a good choice.
    pub fn new(buffers: usize, buf_size: usize) -> Self {
        let buffers = buffers.clamp(1, MAX_RECV_BUFFERS);
        let buf_size = buf_size.max(1);
        Self {
            data: vec![0; buffers * buf_size],
            meta: vec![RecvMeta::default(); buffers],
            buf_size,
            filled: 0,
            datagrams: 0,
        }
    }

    /// Number of buffers, the most `recvmmsg` results one call can take.
    pub fn buffers(&self) -> usize {
        self.meta.len()
    }

    /// Size of each buffer in bytes.
    pub fn buf_size(&self) -> usize {
        self.buf_size
    }

    /// Number of datagrams the last `recv_batch` received.
    pub fn len(&self) -> usize {
        self.datagrams
    }

    /// Whether the last `recv_batch` filled every buffer (so more may be waiting).
    pub fn is_full(&self) -> bool {
        self.filled == self.meta.len()
    }

    /// Whether the last `recv_batch` received nothing.
    pub fn is_empty(&self) -> bool {
        self.datagrams == 0
    }

    /// The datagrams of the last `recv_batch`, with GRO buffers split by their stride, each with
    /// its source address (IPv4-mapped IPv6 sources given as IPv4).
    pub fn iter(&self) -> RecvIter<'_> {
        RecvIter {
            batch: self,
            buffer: 0,
            offset: 0,
        }
    }

    /// Hands each datagram to `f` as [`iter`](Self::iter) does, but mutable (sealed datagrams
    /// are opened in place); stops at the first error.
    pub fn for_each_mut<E>(
        &mut self,
        mut f: impl FnMut(&SocketAddr, &mut [u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        for (b, m) in self.meta[..self.filled].iter().enumerate() {
            let base = b * self.buf_size;
            let buf = &mut self.data[base..base + m.len];
            if m.len == 0 {
                f(&m.addr, buf)?;
                continue;
            }
            for datagram in buf.chunks_mut(m.stride) {
                f(&m.addr, datagram)?;
            }
        }
        Ok(())
    }

    fn clear(&mut self) {
        self.filled = 0;
        self.datagrams = 0;
    }

    /// Records that the first `n` buffers were filled; returns the number of datagrams.
    fn fill(&mut self, n: usize) -> usize {
        self.filled = n;
        let mut datagrams = 0;
        for m in &mut self.meta[..n] {
            m.addr = canonical(m.addr);
            m.len = m.len.min(self.buf_size);
            if m.stride == 0 || m.stride > m.len {
                m.stride = m.len;
            }
            datagrams += if m.len == 0 {
                1
            } else {
                m.len.div_ceil(m.stride)
            };
        }
        self.datagrams = datagrams;
        datagrams
    }
}

impl fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvBatch")
            .field("buffers", &self.meta.len())
            .field("buf_size", &self.buf_size)
            .field("filled", &self.filled)
            .field("datagrams", &self.datagrams)
            .finish()
    }
}

impl<'a> IntoIterator for &'a RecvBatch {
    type Item = (&'a SocketAddr, &'a [u8]);
    type IntoIter = RecvIter<'a>;

    fn into_iter(self) -> RecvIter<'a> {
        self.iter()
    }
}

/// Iterator over the datagrams in a [`RecvBatch`]: `(source, datagram)` pairs.
#[derive(Debug)]
pub struct RecvIter<'a> {
    batch: &'a RecvBatch,
    buffer: usize,
    offset: usize,
}

impl<'a> Iterator for RecvIter<'a> {
    type Item = (&'a SocketAddr, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let batch = self.batch;
        if self.buffer >= batch.filled {
            return None;
        }
        let m = &batch.meta[self.buffer];
        let base = self.buffer * batch.buf_size;
        let start = self.offset;
        // `fill` made 0 < stride <= len, or stride == len == 0 (one empty datagram).
        let end = (start + m.stride).min(m.len);
        if end >= m.len {
            self.buffer += 1;
            self.offset = 0;
        } else {
            self.offset = end;
        }
        Some((&m.addr, &batch.data[base + start..base + end]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn opts() -> ChannelOptions {
        ChannelOptions {
            read_timeout: Some(Duration::from_millis(200)),
            ..ChannelOptions::default()
        }
    }

    /// Datagram `seq` of the test stream: the sequence number, then bytes that differ per
    /// datagram and per position.
    fn datagram(seq: u32, len: usize, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend((0..len).map(|i| (seq as usize * 131 + i * 7 + (i >> 8)) as u8));
        let n = len.min(4);
        out[start..start + n].copy_from_slice(&seq.to_le_bytes()[..n]);
    }

    fn expected(seq: u32, len: usize) -> Vec<u8> {
        let mut v = Vec::new();
        datagram(seq, len, &mut v);
        v
    }

    /// Binds a pair of channels on `ip`, or `None` (with a message) if `ip` cannot be bound.
    fn pair(ip: IpAddr, sender: &ChannelOptions) -> Option<(UdpChannel, UdpChannel)> {
        let a = match UdpChannel::bind(SocketAddr::new(ip, 0), sender) {
            Ok(a) => a,
            Err(UdpError::Bind { addr, source }) if ip.is_ipv6() => {
                println!("skipping: cannot bind {addr} ({source}); IPv6 disabled?");
                return None;
            }
            Err(e) => panic!("bind: {e}"),
        };
        let b = UdpChannel::bind(SocketAddr::new(ip, 0), &opts()).expect("bind receiver");
        Some((a, b))
    }

    #[test]
    fn wait_readable_says_which_sockets_have_data() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let (mut a, b) = pair(lo, &opts()).unwrap();
        let c = UdpChannel::bind(SocketAddr::new(lo, 0), &opts()).unwrap();
        let fds = || [Some(b.as_fd()), None, Some(c.as_fd())];
        let t = Instant::now();
        assert_eq!(wait_readable(fds(), Duration::from_millis(20)).unwrap(), 0);
        assert!(
            t.elapsed() >= Duration::from_millis(15),
            "{:?}",
            t.elapsed()
        );
        a.send_batch(c.local_addr(), &[7u8; 100], 100).unwrap();
        assert_eq!(wait_readable(fds(), Duration::from_secs(5)).unwrap(), 0b100);
        a.send_batch(b.local_addr(), &[7u8; 100], 100).unwrap();
        assert_eq!(wait_readable(fds(), Duration::from_secs(5)).unwrap(), 0b101);
    }

    /// Sends 1000 distinct 1400-byte datagrams in chunks of 100, receiving between chunks, and
    /// checks each arrived exactly once with the right content.
    fn thousand_datagrams(ip: IpAddr, gso: bool) {
        const COUNT: u32 = 1000;
        const CHUNK: u32 = 100;
        const SIZE: usize = 1400;
        let Some((mut a, mut b)) = pair(ip, &ChannelOptions { gso, ..opts() }) else {
            return;
        };
        if !gso {
            assert_eq!(a.max_gso_segments(), 1);
        }
        let dest = b.local_addr();
        let mut batch = RecvBatch::new(32, GRO_BUF_SIZE);
        let mut seen = vec![false; COUNT as usize];
        let mut received = 0u32;
        let mut calls = 0;
        let mut buf = Vec::with_capacity(CHUNK as usize * SIZE);
        for first in (0..COUNT).step_by(CHUNK as usize) {
            buf.clear();
            for seq in first..first + CHUNK {
                datagram(seq, SIZE, &mut buf);
            }
            a.send_batch(dest, &buf, SIZE).expect("send_batch");
            while received < first + CHUNK {
                let n = b.recv_batch(&mut batch).expect("recv_batch");
                if n == 0 {
                    break;
                }
                calls += 1;
                assert_eq!(batch.len(), n);
                assert_eq!(batch.iter().count(), n);
                for (src, d) in &batch {
                    assert_eq!(*src, a.local_addr());
                    assert_eq!(d.len(), SIZE);
                    let seq = u32::from_le_bytes(d[..4].try_into().unwrap());
                    assert!(seq < COUNT, "sequence {seq} out of range");
                    assert!(!seen[seq as usize], "datagram {seq} arrived twice");
                    assert!(d == expected(seq, SIZE), "datagram {seq} corrupted");
                    seen[seq as usize] = true;
                    received += 1;
                }
            }
        }
        println!(
            "{ip} gso={gso}: GSO segments {}, GRO segments {}, {received} datagrams in {calls} recv calls",
            a.max_gso_segments(),
            b.gro_segments()
        );
        let missing: Vec<usize> = (0..COUNT as usize).filter(|&i| !seen[i]).collect();
        assert!(
            missing.is_empty(),
            "{} datagrams missing (kernel drops: {:?}), first {:?}",
            missing.len(),
            b.kernel_drops(),
            &missing[..missing.len().min(10)]
        );
        assert_eq!(b.kernel_drops(), Some(0));
    }

    /// A GSO send as large as `send_batch` makes stays one packet on loopback: the receiver
    /// gets it as one GRO buffer, not datagram by datagram (which it did when sends reached
    /// the device's 64 KiB `gso_max_size` with their headers).
    fn gso_sends_arrive_whole(ip: IpAddr) {
        const SIZE: usize = 1424; // a 1500-byte path's datagram
        const COUNT: usize = 90;
        let Some((mut a, mut b)) = pair(ip, &opts()) else {
            return;
        };
        if a.max_gso_segments() <= 1 || b.gro_segments() <= 1 {
            println!(
                "skipping: no UDP GSO/GRO here ({} / {})",
                a.max_gso_segments(),
                b.gro_segments()
            );
            return;
        }
        let per_send = a.max_gso_segments().min(MAX_GSO_BYTES / SIZE);
        let mut buf = Vec::new();
        for seq in 0..COUNT as u32 {
            datagram(seq, SIZE, &mut buf);
        }
        a.send_batch(b.local_addr(), &buf, SIZE).unwrap();
        let mut batch = RecvBatch::new(32, GRO_BUF_SIZE);
        let (mut datagrams, mut buffers) = (0, 0);
        while datagrams < COUNT {
            let n = b.recv_batch(&mut batch).unwrap();
            assert!(n > 0, "only {datagrams} of {COUNT} datagrams arrived");
            datagrams += n;
            buffers += batch.filled;
        }
        assert_eq!(datagrams, COUNT);
        assert_eq!(
            buffers,
            COUNT.div_ceil(per_send),
            "{per_send} datagrams per send"
        );
    }

    /// `send_framed` sends what `send_batch` would of the same datagrams laid out whole: each
    /// a header and its slice of the data, the last one shorter, with GSO and without.
    fn framed_sends(ip: IpAddr, gso: bool) {
        const HEADER: usize = 12;
        const PAYLOAD: usize = 1384;
        const COUNT: usize = 150; // more than one GSO send and one sendmmsg batch
        let Some((mut a, mut b)) = pair(ip, &ChannelOptions { gso, ..opts() }) else {
            return;
        };
        let data: Vec<u8> = (0..(COUNT - 1) * PAYLOAD + 500)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let mut headers = Vec::new();
        for i in 0..COUNT as u32 {
            headers.extend_from_slice(&i.to_le_bytes());
            headers.extend_from_slice(&[0xA5; HEADER - 4]);
        }
        a.send_framed(b.local_addr(), &headers, HEADER, &data, PAYLOAD)
            .unwrap();
        let mut batch = RecvBatch::new(32, GRO_BUF_SIZE);
        let mut seen = [false; COUNT];
        let mut got = 0;
        while got < COUNT {
            let n = b.recv_batch(&mut batch).unwrap();
            assert!(n > 0, "only {got} of {COUNT} datagrams arrived (gso={gso})");
            for (_, d) in &batch {
                let i = u32::from_le_bytes(d[..4].try_into().unwrap()) as usize;
                assert!(!seen[i], "datagram {i} twice");
                seen[i] = true;
                assert_eq!(&d[4..HEADER], &[0xA5; HEADER - 4]);
                let want = &data[i * PAYLOAD..((i + 1) * PAYLOAD).min(data.len())];
                assert!(&d[HEADER..] == want, "datagram {i}'s payload differs");
            }
            got += n;
        }
        assert_eq!(got, COUNT);
    }

    #[test]
    fn framed_sends_ipv4_gso() {
        framed_sends(Ipv4Addr::LOCALHOST.into(), true);
    }

    #[test]
    fn framed_sends_ipv4_without_gso() {
        framed_sends(Ipv4Addr::LOCALHOST.into(), false);
    }

    #[test]
    fn framed_sends_ipv6_gso() {
        framed_sends(Ipv6Addr::LOCALHOST.into(), true);
    }

    #[test]
    fn framed_sends_refuse_missing_headers() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let (mut a, b) = pair(lo, &opts()).unwrap();
        let err = a.send_framed(b.local_addr(), &[0; 20], 10, &[1; 25], 10);
        assert!(err.is_err(), "3 datagrams, 2 headers");
        assert!(matches!(
            a.send_framed(b.local_addr(), &[0; 10], 10, &[1; 10], 0),
            Err(UdpError::InvalidSegmentSize(_))
        ));
    }

    #[test]
    fn gso_sends_arrive_whole_ipv4() {
        gso_sends_arrive_whole(Ipv4Addr::LOCALHOST.into());
    }

    #[test]
    fn gso_sends_arrive_whole_ipv6() {
        gso_sends_arrive_whole(Ipv6Addr::LOCALHOST.into());
    }

    #[test]
    fn thousand_datagrams_ipv4_gso() {
        thousand_datagrams(Ipv4Addr::LOCALHOST.into(), true);
    }

    #[test]
    fn thousand_datagrams_ipv4_sendmmsg() {
        thousand_datagrams(Ipv4Addr::LOCALHOST.into(), false);
    }

    #[test]
    fn thousand_datagrams_ipv6_gso() {
        thousand_datagrams(Ipv6Addr::LOCALHOST.into(), true);
    }

    #[test]
    fn thousand_datagrams_ipv6_sendmmsg() {
        thousand_datagrams(Ipv6Addr::LOCALHOST.into(), false);
    }

    #[test]
    fn short_last_segment() {
        for gso in [true, false] {
            let (mut a, mut b) = pair(
                Ipv4Addr::LOCALHOST.into(),
                &ChannelOptions { gso, ..opts() },
            )
            .unwrap();
            let mut buf = Vec::new();
            for seq in 0..3 {
                datagram(seq, 1000, &mut buf);
            }
            datagram(3, 17, &mut buf);
            a.send_batch(b.local_addr(), &buf, 1000).unwrap();
            let mut batch = RecvBatch::new(8, GRO_BUF_SIZE);
            let mut got = Vec::new();
            while got.len() < 4 {
                if b.recv_batch(&mut batch).unwrap() == 0 {
                    break;
                }
                got.extend(batch.iter().map(|(_, d)| d.to_vec()));
            }
            let want: Vec<Vec<u8>> = (0..4)
                .map(|seq| expected(seq, if seq == 3 { 17 } else { 1000 }))
                .collect();
            assert_eq!(got, want, "gso = {gso}");
        }
    }

    #[test]
    fn single_datagram_and_empty_buffer() {
        let (mut a, mut b) = pair(Ipv4Addr::LOCALHOST.into(), &opts()).unwrap();
        a.send_batch(b.local_addr(), &[], 1400).unwrap();
        a.send_batch(b.local_addr(), b"hello", 1400).unwrap();
        let mut batch = RecvBatch::new(4, GRO_BUF_SIZE);
        assert_eq!(b.recv_batch(&mut batch).unwrap(), 1);
        let all: Vec<_> = batch.iter().collect();
        assert_eq!(all, vec![(&a.local_addr(), &b"hello"[..])]);
    }

    #[test]
    fn recv_timeout_returns_zero() {
        let mut b = UdpChannel::bind(
            (Ipv4Addr::LOCALHOST, 0).into(),
            &ChannelOptions {
                read_timeout: Some(Duration::from_millis(50)),
                ..ChannelOptions::default()
            },
        )
        .unwrap();
        let mut batch = RecvBatch::new(4, GRO_BUF_SIZE);
        let t = Instant::now();
        assert_eq!(b.recv_batch(&mut batch).unwrap(), 0);
        let waited = t.elapsed();
        assert!(batch.is_empty());
        assert_eq!(batch.iter().count(), 0);
        assert!(
            waited >= Duration::from_millis(45) && waited < Duration::from_secs(2),
            "waited {waited:?}"
        );
    }

    fn sysctl(name: &str) -> usize {
        std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    #[test]
    fn buffer_sizes_and_warning() {
        let (rmem_max, wmem_max) = (sysctl("rmem_max"), sysctl("wmem_max"));
        let ch = UdpChannel::bind((Ipv4Addr::LOCALHOST, 0).into(), &opts()).unwrap();
        if rmem_max >= 4 << 20 && wmem_max >= 4 << 20 {
            assert_eq!(ch.granted_recv_buffer(), 4 << 20);
            assert_eq!(ch.granted_send_buffer(), 4 << 20);
            assert_eq!(ch.buffer_warning(), None);
        }
        let big = ChannelOptions {
            recv_buffer: 64 << 20,
            ..opts()
        };
        let ch = UdpChannel::bind((Ipv4Addr::LOCALHOST, 0).into(), &big).unwrap();
        if rmem_max >= 64 << 20 {
            println!("skipping warning check: net.core.rmem_max is {rmem_max}");
            return;
        }
        assert_eq!(ch.granted_recv_buffer(), rmem_max);
        let warning = ch.buffer_warning().expect("a warning");
        println!("{warning}");
        assert!(!warning.contains('\n'));
        assert!(warning.contains("net.core.rmem_max=67108864"), "{warning}");
        assert!(!warning.contains("wmem") || wmem_max < 4 << 20, "{warning}");
    }

    #[test]
    fn kernel_drops_counts_overflow() {
        let (mut a, _) = pair(Ipv4Addr::LOCALHOST.into(), &opts()).unwrap();
        let small = ChannelOptions {
            recv_buffer: 8 << 10,
            ..opts()
        };
        let b = UdpChannel::bind((Ipv4Addr::LOCALHOST, 0).into(), &small).unwrap();
        assert_eq!(b.kernel_drops(), Some(0));
        let mut buf = Vec::new();
        for seq in 0..200 {
            datagram(seq, 1400, &mut buf);
        }
        a.send_batch(b.local_addr(), &buf, 1400).unwrap();
        let drops = b.kernel_drops().expect("drop counter");
        assert!(drops > 0, "no drops with an 8 KiB buffer");
        assert_eq!(b.proc_drops(), Some(drops), "/proc agrees with SO_MEMINFO");
        let q = b.receive_queue().expect("SO_MEMINFO on Linux");
        assert_eq!(q.drops, drops);
        assert!(q.fill_permille() > 500, "full when it drops: {q:?}");
    }

    #[test]
    fn receive_queue_shows_waiting_bytes() {
        let (mut a, mut b) = pair(Ipv4Addr::LOCALHOST.into(), &opts()).unwrap();
        let empty = b.receive_queue().expect("SO_MEMINFO on Linux");
        assert_eq!((empty.queued, empty.drops), (0, 0));
        assert!(empty.limit >= b.granted_recv_buffer() as u64, "{empty:?}");
        let mut buf = Vec::new();
        for seq in 0..20 {
            datagram(seq, 1400, &mut buf);
        }
        a.send_batch(b.local_addr(), &buf, 1400).unwrap();
        let q = b.receive_queue().unwrap();
        assert!(q.queued >= 20 * 1400, "{q:?}");
        assert!((1..500).contains(&q.fill_permille()), "{q:?}");
        let mut batch = RecvBatch::new(MAX_RECV_BUFFERS, GRO_BUF_SIZE);
        let mut got = 0;
        while got < 20 {
            b.recv_batch(&mut batch).unwrap();
            got += batch.iter().count();
        }
        assert_eq!(b.receive_queue().unwrap().queued, 0);
    }

    #[test]
    fn peer_unreachable_on_connected_socket() {
        let dead = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let (mut a, _) = pair(Ipv4Addr::LOCALHOST.into(), &opts()).unwrap();
        a.connect(dead).unwrap();
        let mut batch = RecvBatch::new(1, GRO_BUF_SIZE);
        for _ in 0..50 {
            let r = a
                .send_batch(dead, b"anyone?", 1400)
                .and_then(|()| a.recv_batch(&mut batch));
            match r {
                Err(UdpError::PeerUnreachable(e)) => {
                    assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED));
                    return;
                }
                Err(e) => panic!("unexpected error: {e}"),
                Ok(_) => {}
            }
        }
        panic!("no PeerUnreachable after 50 sends to a closed port");
    }

    #[test]
    fn dual_stack_socket_speaks_ipv4() {
        let v6any = SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0));
        let mut a = match UdpChannel::bind(v6any, &opts()) {
            Ok(a) => a,
            Err(e) => {
                println!("skipping: {e}");
                return;
            }
        };
        let mut b = UdpChannel::bind((Ipv4Addr::LOCALHOST, 0).into(), &opts()).unwrap();
        // A plain IPv4 destination from an IPv6 socket.
        a.send_batch(b.local_addr(), b"ping", 100).unwrap();
        let mut batch = RecvBatch::new(4, GRO_BUF_SIZE);
        assert_eq!(b.recv_batch(&mut batch).unwrap(), 1);
        let (&src, d) = batch.iter().next().unwrap();
        assert_eq!(d, b"ping");
        assert_eq!(src.port(), a.local_addr().port());
        // The IPv6 socket sees the IPv4 peer as plain IPv4, not as ::ffff:127.0.0.1.
        b.send_batch(src, b"pong", 100).unwrap();
        assert_eq!(a.recv_batch(&mut batch).unwrap(), 1);
        let (&src, d) = batch.iter().next().unwrap();
        assert_eq!(d, b"pong");
        assert_eq!(src, b.local_addr());
    }

    #[test]
    fn rejects_bad_sizes() {
        let (mut a, mut b) = pair(Ipv4Addr::LOCALHOST.into(), &opts()).unwrap();
        let dest = b.local_addr();
        assert!(matches!(
            a.send_batch(dest, b"x", 0),
            Err(UdpError::InvalidSegmentSize(0))
        ));
        assert!(matches!(
            a.send_batch(dest, b"x", MAX_DATAGRAM + 1),
            Err(UdpError::InvalidSegmentSize(_))
        ));
        if b.gro_segments() > 1 {
            let mut small = RecvBatch::new(4, 2048);
            assert!(matches!(
                b.recv_batch(&mut small),
                Err(UdpError::RecvBufferTooSmall { have: 2048, .. })
            ));
        }
    }

    #[test]
    fn iter_splits_gro_buffers_by_stride() {
        let mut batch = RecvBatch::new(3, 100);
        for (i, byte) in batch.data.iter_mut().enumerate() {
            *byte = i as u8;
        }
        let mapped: SocketAddr = "[::ffff:10.0.0.1]:9".parse().unwrap();
        let v4: SocketAddr = "10.0.0.1:9".parse().unwrap();
        for (m, (len, stride)) in batch.meta.iter_mut().zip([(25, 10), (0, 0), (7, 7)]) {
            m.addr = mapped;
            m.len = len;
            m.stride = stride;
        }
        assert_eq!(batch.fill(3), 5);
        let got: Vec<(SocketAddr, Vec<u8>)> = batch.iter().map(|(a, d)| (*a, d.to_vec())).collect();
        let want = vec![
            (v4, (0..10).collect::<Vec<u8>>()),
            (v4, (10..20).collect()),
            (v4, (20..25).collect()),
            (v4, vec![]),
            (v4, (200..207).collect()),
        ];
        assert_eq!(got, want);
        let mut again = Vec::new();
        batch
            .for_each_mut(|a, d| {
                again.push((*a, d.to_vec()));
                Ok::<(), ()>(())
            })
            .unwrap();
        assert_eq!(again, want);
        batch.clear();
        assert_eq!(batch.iter().count(), 0);
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(64 << 20), "64 MiB");
        assert_eq!(human_bytes(212_992), "208 KiB");
        assert_eq!(human_bytes(1000), "1000 bytes");
    }
}
