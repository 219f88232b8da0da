//! Batched UDP data channels.
//!
//! One channel is one UDP socket, used by one thread at a time (a receiving thread may serve
//! several, waiting on all of them with [`wait_readable`]). This folder moves bytes in and out of
//! that socket with as few system calls as the kernel allows; the rule of the project is that no
//! system call is made per datagram on the data path.
//!
//! # What it owns
//!
//! - The channel socket ([`UdpChannel`], in this file): binding, the offloads the kernel has,
//!   socket buffer sizing (`SO_RCVBUF`/`SO_SNDBUF`, what the kernel really granted, and a
//!   one-line hint naming the sysctl to raise when it granted less:
//!   [`UdpChannel::buffer_warning`]), and the errors ([`UdpError`]).
//! - `batch_send`: batched sending ([`UdpChannel::send_batch`], [`UdpChannel::send_framed`]) with GSO
//!   or `sendmmsg`.
//! - `batch_recv`: batched receiving ([`UdpChannel::recv_batch`] into a [`RecvBatch`]) with
//!   `recvmmsg` and GRO, and waiting on several sockets at once ([`wait_readable`]).
//! - `queue`: the socket's receive queue and the kernel's drop counter
//!   ([`UdpChannel::receive_queue`], [`UdpChannel::kernel_drops`]).
//!
//! # What it does not own
//!
//! Any protocol knowledge. Bytes go in, bytes come out; headers, sequence numbers, pacing,
//! loss recovery and verification live in `hurtle-proto`. Datagrams are not validated here.
//!
//! # System calls
//!
//! `poll(2)`, `sendmsg(2)` with `UDP_SEGMENT`, `sendmmsg(2)` and `getsockopt(SO_MEMINFO)` are
//! made through the safe wrappers of the engine's `sys` folder; there is no `unsafe` here.

mod batch_recv;
mod batch_send;
mod queue;
#[cfg(test)]
mod testing;

pub use batch_recv::{
    wait_readable, RecvBatch, RecvIter, GRO_BUF_SIZE, MAX_RECV_BUFFERS, MAX_WAIT_FDS,
};
pub use batch_send::{MAX_FRAMED, MAX_GSO_BYTES, SEND_STALL_LIMIT};
pub use queue::ReceiveQueue;

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket},
    os::fd::{AsFd, BorrowedFd},
    time::Duration,
};

use quinn_udp::UdpSocketState;
use socket2::{Domain, Protocol, Socket, Type};

/// Largest UDP payload over IPv4 (65535 minus 20 bytes of IP header and 8 of UDP header), and so
/// the most one datagram, or one GSO send, may carry.
pub const MAX_DATAGRAM: usize = 65_507;

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
    /// The peer the socket is connected to ([`connect`](Self::connect)), as the socket
    /// writes it: sends to it go without an address.
    peer: Option<SocketAddr>,
}

impl UdpChannel {
    /// A session's `count` channel sockets on free ports of `ip`, with the default options;
    /// each distinct buffer warning ([`buffer_warning`](Self::buffer_warning)) is added to
    /// `warnings` once.
    pub fn bind_channels(
        ip: IpAddr,
        count: u16,
        warnings: &mut Vec<String>,
    ) -> Result<Vec<UdpChannel>, UdpError> {
        let mut udps = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            let u = UdpChannel::bind(SocketAddr::new(ip, 0), &ChannelOptions::default())?;
            if let Some(w) = u.buffer_warning() {
                if !warnings.contains(&w) {
                    warnings.push(w);
                }
            }
            udps.push(u);
        }
        Ok(udps)
    }

    /// [`bind_channels`](Self::bind_channels) on every IPv6 address and every IPv4 one
    /// (dual-stack sockets: what a relayed session's channels use, so that a path to the
    /// peer's IPv6 addresses may be punched beside IPv4, `crate::net::punch`); on every IPv4
    /// address only where the host has no IPv6.
    pub fn bind_channels_dual_stack(
        count: u16,
        warnings: &mut Vec<String>,
    ) -> Result<Vec<UdpChannel>, UdpError> {
        UdpChannel::bind_channels(Ipv6Addr::UNSPECIFIED.into(), count, warnings)
            .or_else(|_| UdpChannel::bind_channels(Ipv4Addr::UNSPECIFIED.into(), count, warnings))
    }

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
        if let SocketAddr::V6(a) = addr {
            // Every IPv6 address takes IPv4 too, whatever the system's default.
            if a.ip().is_unspecified() {
                sock.set_only_v6(false)
                    .map_err(setup("clear IPV6_V6ONLY"))?;
            }
        }
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
            peer: None,
        })
    }

    /// The address the socket is bound to, with the real port if port 0 was asked for.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Fixes the peer: the kernel then drops datagrams from any other source (on every handle
    /// of the socket: [`try_clone_socket`](Self::try_clone_socket)'s too) and reports ICMP
    /// errors from the peer as [`UdpError::PeerUnreachable`]. Optional; `send_batch` still takes
    /// a destination, and sends to the peer then go without one: the kernel routes them with
    /// the route it keeps for the connection instead of looking one up per send.
    pub fn connect(&mut self, peer: SocketAddr) -> Result<(), UdpError> {
        let peer = self.for_socket(peer);
        self.socket.connect(peer)?;
        self.peer = Some(peer);
        Ok(())
    }

    /// The address a send to `dest` carries: none to the connected peer.
    fn send_address(&self, dest: SocketAddr) -> Option<socket2::SockAddr> {
        let dest = self.for_socket(dest);
        (self.peer != Some(dest)).then(|| dest.into())
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

    /// The receive buffer asked for ([`ChannelOptions::recv_buffer`]).
    pub fn requested_recv_buffer(&self) -> usize {
        self.requested_recv
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

impl AsFd for UdpChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{opts, pair};
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

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
    fn a_connected_socket_sends_to_its_peer_without_an_address_and_to_others_with_one() {
        let lo = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0);
        let any6 = SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), 0);
        // A dual-stack sender, connected to an IPv4 peer given as such.
        let mut a = UdpChannel::bind(any6, &opts()).unwrap();
        let mut b = UdpChannel::bind(lo, &opts()).unwrap();
        let mut c = UdpChannel::bind(lo, &opts()).unwrap();
        let (b_addr, c_addr) = (b.local_addr(), c.local_addr());
        assert!(
            a.send_address(b_addr).is_some(),
            "unconnected: every send has one"
        );
        a.connect(b_addr).unwrap();
        assert!(
            a.send_address(b_addr).is_none(),
            "the peer's sends carry an address"
        );
        assert!(a.send_address(c_addr).is_some());
        a.send_batch(b_addr, &[7u8; 3000], 1000).unwrap();
        a.send_batch(c_addr, b"elsewhere", 1000).unwrap();
        let mut batch = RecvBatch::new(8, GRO_BUF_SIZE);
        let mut got = 0;
        for _ in 0..50 {
            if got >= 3 {
                break;
            }
            got += b.recv_batch(&mut batch).unwrap_or(0);
        }
        assert_eq!(got, 3, "the peer got all three datagrams");
        let mut got_c = 0;
        for _ in 0..50 {
            got_c += c.recv_batch(&mut batch).unwrap_or(0);
            if got_c > 0 {
                break;
            }
        }
        assert_eq!(got_c, 1, "another address is still reached");
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
    fn human_sizes() {
        assert_eq!(human_bytes(64 << 20), "64 MiB");
        assert_eq!(human_bytes(212_992), "208 KiB");
        assert_eq!(human_bytes(1000), "1000 bytes");
    }
}
