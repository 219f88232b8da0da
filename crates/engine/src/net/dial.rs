//! How the sender opens its TCP connections (control, and parallel-TCP data): directly, or through
//! something else, such as a relay that splices the connection to the receiver.
//!
//! This module owns the [`Dialer`] trait, the direct dialer ([`Direct`]) and the connect it
//! uses (as do the relay client's connects and `hurtle cp`'s direct try), [`connect_hedged`]:
//! a connect that does not sit out the kernel's one-second SYN
//! retransmission timeout when its first SYN (or the SYN-ACK) is lost. It starts the first
//! attempt at once and, while none has completed, another after [`HEDGE_DELAY`] and a last one
//! after twice that ([`MAX_ATTEMPTS`] in all), each a new non-blocking socket to the same
//! address, all waited on with one `poll`. The first to connect wins and the others are closed:
//! one still in its handshake sends nothing more (the kernel answers a late SYN-ACK with a
//! reset), one that connected in the same instant is closed empty, which the receiver's front
//! door takes quietly ([`crate::receive::accept`]). The first attempt to fail ends the dial
//! with its error at once (refused: the port is closed, and a second try would be refused
//! too); the caller's timeout bounds the whole dial. An attempt after the first that cannot
//! even start (no socket) is skipped: hedging never fails a dial that one connect would not.
//!
//! A sender started before its receiver listens waits for it with [`connect_waiting`]
//! (refused or unreachable is tried again, with a backoff, for a bounded time; nothing else
//! is): the first dial of a [`Waiting`] dialer.

use socket2::{Domain, Protocol, Socket, Type};
use std::fmt::Debug;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

/// How long a connect attempt goes unanswered before the next one starts.
///
/// Linux retransmits a SYN (and a SYN-ACK) after its initial retransmission timeout of one
/// second, so a single lost packet of the handshake costs a whole second before anything
/// starts (on a 150 ms path with 1% loss, a 1 MiB transfer then takes 1.7-2.0 s instead of
/// 0.75 s). A fresh attempt after a quarter of that second gets the same chance at once, in the
/// manner of Happy Eyeballs (RFC 8305, which staggers its attempts by 250 ms for the same
/// reason). On a path whose round trip is longer than this, the later attempts' SYNs go out for
/// nothing: two small packets, answered by the kernel with resets once a winner is chosen.
pub const HEDGE_DELAY: Duration = Duration::from_millis(250);

/// The most connect attempts one dial makes: at 0, [`HEDGE_DELAY`] and twice that. With 1% loss
/// each way, the chance that all of them lose a packet of their handshake is about 1 in
/// 100,000, against 1 in 50 for one attempt.
pub const MAX_ATTEMPTS: usize = 3;

/// Opens the sender's TCP connections to the receiver. The engine asks for the control
/// connection to the receiver's address, then for each TCP data connection to the same IP and
/// a port the receiver named; a dialer may reach them any way it likes.
pub trait Dialer: Debug + Send + Sync {
    /// Opens a connection to `addr` (the receiver's IP and port as the engine knows them).
    fn dial(&self, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream>;

    /// True when only TCP can get through this way (datagrams are not forwarded): the session
    /// then uses the parallel-TCP transport.
    fn tcp_only(&self) -> bool {
        false
    }

    /// True when its connections go through a relay (its TCP splice), not to the receiver:
    /// what the summary counts TCP data under.
    fn relayed(&self) -> bool {
        false
    }

    /// Where the datagrams of a session of `channels` channels go when they cannot go straight
    /// to the receiver (a relay that forwards them): `None` when they go straight.
    fn udp_relay(&self, _channels: u16) -> Option<io::Result<UdpRelay>> {
        None
    }
}

/// The first byte of a relay's own datagrams (its answers to binds): no data datagram's (the
/// low nibble of a data datagram's first byte is its kind, 1 to 5; punching uses 0xF0).
pub const RELAY_TAG: u8 = 0xF1;

/// Datagrams through a forwarder: every channel sends to `addr`, after its socket has sent
/// `binds[channel]` there (which tells the forwarder which of the receiver's sockets is the
/// other end; answered by a datagram that starts with [`RELAY_TAG`]).
#[derive(Debug, Clone)]
pub struct UdpRelay {
    /// The forwarder's address.
    pub addr: SocketAddr,
    /// Per channel, the datagram that binds its socket.
    pub binds: Vec<Vec<u8>>,
    /// Reads the forwarder's answer to a bind: the address it saw, and the other end's once
    /// bound (where a direct path may be punched: [`crate::net::punch`]).
    pub parse: crate::net::punch::ParseAnswer,
}

impl UdpRelay {
    /// Sends each channel's bind from its socket and waits, within `within`, for each answer
    /// (sent again every 150 ms). Returns the channels whose bind was not answered.
    pub fn bind(&self, sockets: &[std::net::UdpSocket], within: Duration) -> Vec<u16> {
        let deadline = Instant::now() + within;
        // The channels' sockets are non-blocking (their clones share the flag): blocking, with
        // a timeout, for the wait, and back after it.
        for s in sockets {
            let _ = s.set_nonblocking(false);
        }
        let mut left: Vec<usize> = (0..sockets.len().min(self.binds.len())).collect();
        // Each bind carries the socket's own candidates (`crate::net::punch`).
        let binds: Vec<Vec<u8>> = left
            .iter()
            .map(|&ch| {
                let own = crate::net::punch::local_v6_candidates(&sockets[ch]);
                crate::net::punch::with_candidates(&self.binds[ch], &own)
            })
            .collect();
        let mut buf = [0u8; 64];
        while !left.is_empty() && Instant::now() < deadline {
            for &ch in &left {
                let _ = crate::net::punch::send_to(&sockets[ch], &binds[ch], self.addr);
            }
            let round = Instant::now() + Duration::from_millis(150);
            left.retain(|&ch| {
                let s = &sockets[ch];
                loop {
                    let wait = round.saturating_duration_since(Instant::now());
                    if wait.is_zero() || s.set_read_timeout(Some(wait)).is_err() {
                        return true;
                    }
                    match s.recv_from(&mut buf) {
                        // A dual-stack socket names an IPv4 source as IPv4-mapped IPv6.
                        Ok((n, from))
                            if SocketAddr::new(from.ip().to_canonical(), from.port())
                                == self.addr
                                && n > 0
                                && buf[0] == RELAY_TAG =>
                        {
                            return false
                        }
                        Ok(_) => continue,
                        Err(_) => return true,
                    }
                }
            });
        }
        for s in sockets {
            let _ = s.set_read_timeout(None);
            let _ = s.set_nonblocking(true);
        }
        left.into_iter().map(|ch| ch as u16).collect()
    }
}

/// A direct connection with a timeout, by [`connect_hedged`].
#[derive(Debug, Default, Clone, Copy)]
pub struct Direct;

impl Dialer for Direct {
    fn dial(&self, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        connect_hedged(addr, timeout)
    }
}

/// Connects to `addr` within `timeout`, starting a new attempt every [`HEDGE_DELAY`] while none
/// has completed, up to [`MAX_ATTEMPTS`] (see the module's documentation). Returns the first
/// connection made, in blocking mode; the first error an attempt meets (at once, without
/// waiting for the others); or `TimedOut` when `timeout` passes. A zero `timeout` is
/// `InvalidInput`, as for [`TcpStream::connect_timeout`].
pub fn connect_hedged(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    hedged(addr, timeout, |_| start(addr))
}

/// Starts a non-blocking connect to `addr`: a socket whose handshake is under way (or done).
fn start(addr: SocketAddr) -> io::Result<Socket> {
    let socket = Socket::new(
        Domain::for_address(addr),
        Type::STREAM.nonblocking(),
        Some(Protocol::TCP),
    )?;
    match socket.connect(&addr.into()) {
        Ok(()) => Ok(socket),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(socket),
        Err(e) => Err(e),
    }
}

/// How the connect on `socket`, which `poll` said is ready, ended: connected, or failed.
fn outcome(socket: &Socket) -> io::Result<()> {
    match socket.take_error()? {
        Some(e) => Err(e),
        // Ready without an error: connected, or (never seen) closed without saying why, which
        // is a failure too rather than an attempt to wait on again.
        None => socket.peer_addr().map(drop),
    }
}

/// The hedged connect to `addr`, with the attempts' start given: `start(n)` begins attempt `n`
/// (from 0) and returns its socket, non-blocking, its connect under way or done.
fn hedged(
    addr: SocketAddr,
    timeout: Duration,
    mut start: impl FnMut(usize) -> io::Result<Socket>,
) -> io::Result<TcpStream> {
    if timeout.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "cannot set a 0 duration timeout",
        ));
    }
    let t0 = Instant::now();
    // `None`: a timeout too long to add to now, so none.
    let deadline = t0.checked_add(timeout);
    // The attempts under way, by their start.
    let mut attempts: Vec<Socket> = Vec::with_capacity(MAX_ATTEMPTS);
    let mut started = 0;
    loop {
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "connection timed out",
            ));
        }
        while started < MAX_ATTEMPTS && now >= t0 + HEDGE_DELAY * started as u32 {
            if started > 0 {
                tracing::debug!(
                    "no connection to {addr} within {} ms: connect attempt {} of {MAX_ATTEMPTS}",
                    (now - t0).as_millis(),
                    started + 1
                );
            }
            match start(started) {
                Ok(socket) => attempts.push(socket),
                // With no attempt under way, this failure is the dial's.
                Err(e) if attempts.is_empty() => return Err(e),
                Err(e) => tracing::debug!("connect attempt {} to {addr}: {e}", started + 1),
            }
            started += 1;
        }
        let next_start = (started < MAX_ATTEMPTS).then(|| t0 + HEDGE_DELAY * started as u32);
        let wake = match (next_start, deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let ready = crate::sys::socket::wait_any(
            attempts.iter().map(|s| Some(s.as_fd())),
            libc::POLLOUT,
            wake.map(|w| w.saturating_duration_since(now)),
        )?;
        if ready == 0 {
            continue;
        }
        // The earliest attempt that connected wins, even beside one that failed; the others
        // are closed when `attempts` is dropped.
        let mut failed = None;
        for (i, socket) in attempts.iter().enumerate() {
            if ready & (1 << i) == 0 {
                continue;
            }
            match outcome(socket) {
                Ok(()) => {
                    let socket = attempts.swap_remove(i);
                    socket.set_nonblocking(false)?;
                    return Ok(socket.into());
                }
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
    }
}

/// Whether a connect failed because nothing listens there yet (refused, or the host or its
/// network unreachable): what a sender started before its receiver meets, and waits out with
/// [`connect_waiting`]. Anything else (a timeout, a reset) is not waited for.
pub fn not_listening_yet(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::ConnectionRefused
        || matches!(
            e.raw_os_error(),
            Some(libc::EHOSTUNREACH | libc::ENETUNREACH | libc::ECONNREFUSED)
        )
}

/// Most time between two connects of [`connect_waiting`] (the first waits 100 ms, each next
/// twice as long, up to this).
pub const WAIT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// [`connect_hedged`] (each attempt within `timeout`), trying again while nothing listens at
/// `addr` yet ([`not_listening_yet`]) for up to `wait`, with a backoff from 100 ms to
/// [`WAIT_BACKOFF_MAX`]; `on_wait` is called once, before the first wait. A zero `wait` is one
/// connect. The last error is returned once `wait` has passed; any other error at once.
pub fn connect_waiting(
    addr: SocketAddr,
    timeout: Duration,
    wait: Duration,
    on_wait: impl FnOnce(),
) -> io::Result<TcpStream> {
    let deadline = Instant::now() + wait;
    let mut on_wait = Some(on_wait);
    let mut pause = Duration::from_millis(100);
    loop {
        match connect_hedged(addr, timeout) {
            Err(e) if not_listening_yet(&e) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(e);
                }
                if let Some(f) = on_wait.take() {
                    f();
                }
                std::thread::sleep(pause.min(left));
                pause = (pause * 2).min(WAIT_BACKOFF_MAX);
            }
            other => return other,
        }
    }
}

/// A direct dialer for a sender that may start before its receiver listens: its first dial
/// waits for the receiver with [`connect_waiting`] (up to `wait`, calling `on_wait` with the
/// address once if it waits), every later one is [`connect_hedged`]. The wait happens when the
/// session dials, after it has read its sources, so a source that cannot be read fails first.
pub struct Waiting {
    wait: Duration,
    first: std::sync::atomic::AtomicBool,
    on_wait: Box<dyn Fn(SocketAddr) + Send + Sync>,
}

impl Waiting {
    /// A dialer whose first dial waits up to `wait`, telling `on_wait` when it starts to.
    pub fn new(wait: Duration, on_wait: impl Fn(SocketAddr) + Send + Sync + 'static) -> Waiting {
        Waiting {
            wait,
            first: std::sync::atomic::AtomicBool::new(true),
            on_wait: Box::new(on_wait),
        }
    }
}

impl Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting").field("wait", &self.wait).finish()
    }
}

impl Dialer for Waiting {
    fn dial(&self, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        if self.first.swap(false, std::sync::atomic::Ordering::Relaxed) {
            connect_waiting(addr, timeout, self.wait, || (self.on_wait)(addr))
        } else {
            connect_hedged(addr, timeout)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    /// A listener on loopback whose accept queue is full (a backlog of 0 holds one connection,
    /// which is made here and left unaccepted): the kernel drops a new SYN to it, as if the
    /// network had lost it, and retransmits it after its one-second timeout. Also returns the
    /// connection that fills the queue, to keep it there.
    fn full_listener() -> (Socket, TcpStream) {
        let l = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        l.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap();
        l.listen(0).unwrap();
        let addr = l.local_addr().unwrap().as_socket().unwrap();
        let filler = TcpStream::connect(addr).unwrap();
        // The handshake's last ACK is in the queue before any SYN of the test.
        std::thread::sleep(Duration::from_millis(20));
        (l, filler)
    }

    fn addr_of(l: &Socket) -> SocketAddr {
        l.local_addr().unwrap().as_socket().unwrap()
    }

    /// An address on loopback where nothing listens: a connect to it is refused.
    fn closed_port() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    }

    /// Well under the one second of the kernel's SYN retransmission, and above the hedge's
    /// delays: a dial that waited for the kernel would take a second or more.
    const BEFORE_THE_KERNEL: Duration = Duration::from_millis(900);

    #[test]
    fn a_lost_syn_costs_the_hedge_delay_not_the_kernels_second() {
        let (listener, filler) = full_listener();
        let addr = addr_of(&listener);
        // Once the first attempt's SYN is dropped, the queue is emptied: the next SYN gets
        // through, while the first one's retransmission is a second away.
        let (tx, rx) = mpsc::channel();
        let drain = std::thread::spawn(move || {
            rx.recv().unwrap();
            std::thread::sleep(Duration::from_millis(50));
            let taken = listener.accept().unwrap();
            (listener, taken, filler)
        });
        let t0 = Instant::now();
        let got = hedged(addr, Duration::from_secs(5), |n| {
            let s = start(addr);
            if n == 0 {
                tx.send(()).unwrap();
            }
            s
        });
        let took = t0.elapsed();
        let stream = got.unwrap();
        assert_eq!(stream.peer_addr().unwrap(), addr);
        assert!(
            took >= HEDGE_DELAY && took < BEFORE_THE_KERNEL,
            "connected after {took:?}"
        );
        drop(drain.join().unwrap());
    }

    #[test]
    fn an_attempt_that_never_completes_is_overtaken_by_the_next() {
        let (stuck, _filler) = full_listener();
        let live = TcpListener::bind("127.0.0.1:0").unwrap();
        let live_addr = live.local_addr().unwrap();
        let tried = AtomicUsize::new(0);
        let t0 = Instant::now();
        let got = hedged(live_addr, Duration::from_secs(5), |n| {
            tried.fetch_add(1, Ordering::Relaxed);
            start(if n == 0 { addr_of(&stuck) } else { live_addr })
        });
        let took = t0.elapsed();
        let stream = got.unwrap();
        assert_eq!(stream.peer_addr().unwrap(), live_addr);
        assert!(
            took >= HEDGE_DELAY && took < BEFORE_THE_KERNEL,
            "connected after {took:?}"
        );
        assert_eq!(tried.load(Ordering::Relaxed), 2);
        // Handed over in blocking mode, like `TcpStream::connect`.
        assert!(!socket2::SockRef::from(&stream).nonblocking().unwrap());
        let (server, from) = live.accept().unwrap();
        assert_eq!(from, stream.local_addr().unwrap());
        drop(server);
    }

    #[test]
    fn a_refused_connect_fails_at_once_without_a_second_attempt() {
        let addr = closed_port();
        let t0 = Instant::now();
        let err = Direct.dial(addr, Duration::from_secs(5)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
        assert!(t0.elapsed() < HEDGE_DELAY / 2, "{:?}", t0.elapsed());
        let tried = AtomicUsize::new(0);
        let err = hedged(addr, Duration::from_secs(5), |_| {
            tried.fetch_add(1, Ordering::Relaxed);
            start(addr)
        })
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
        assert_eq!(tried.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_later_attempt_refused_ends_the_dial_at_once() {
        // The first attempt's SYN is lost, and by the second the receiver is gone.
        let (stuck, _filler) = full_listener();
        let gone = closed_port();
        let t0 = Instant::now();
        let err = hedged(gone, Duration::from_secs(5), |n| {
            start(if n == 0 { addr_of(&stuck) } else { gone })
        })
        .unwrap_err();
        let took = t0.elapsed();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
        assert!(
            took >= HEDGE_DELAY && took < 2 * HEDGE_DELAY,
            "failed after {took:?}"
        );
    }

    #[test]
    fn the_timeout_bounds_the_dial_and_the_attempts_are_bounded() {
        let (stuck, _filler) = full_listener();
        let addr = addr_of(&stuck);
        for (timeout, attempts) in [
            (Duration::from_millis(700), MAX_ATTEMPTS),
            (Duration::from_millis(100), 1),
        ] {
            let tried = AtomicUsize::new(0);
            let t0 = Instant::now();
            let err = hedged(addr, timeout, |_| {
                tried.fetch_add(1, Ordering::Relaxed);
                start(addr)
            })
            .unwrap_err();
            let took = t0.elapsed();
            assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
            assert!(
                took >= timeout && took < timeout + Duration::from_millis(500),
                "gave up after {took:?} of {timeout:?}"
            );
            assert_eq!(tried.load(Ordering::Relaxed), attempts, "{timeout:?}");
        }
        let err = Direct.dial(addr, Duration::ZERO).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    }

    #[test]
    fn an_attempt_that_cannot_start_is_skipped_unless_it_is_the_only_one() {
        let (stuck, _filler) = full_listener();
        let live = TcpListener::bind("127.0.0.1:0").unwrap();
        let live_addr = live.local_addr().unwrap();
        let t0 = Instant::now();
        let stream = hedged(live_addr, Duration::from_secs(5), |n| match n {
            0 => start(addr_of(&stuck)),
            1 => Err(io::Error::other("out of sockets")),
            _ => start(live_addr),
        })
        .unwrap();
        let took = t0.elapsed();
        assert_eq!(stream.peer_addr().unwrap(), live_addr);
        assert!(
            took >= 2 * HEDGE_DELAY && took < BEFORE_THE_KERNEL,
            "connected after {took:?}"
        );
        let t0 = Instant::now();
        let err = hedged(live_addr, Duration::from_secs(5), |_| {
            Err(io::Error::other("out of sockets"))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "out of sockets");
        assert!(t0.elapsed() < HEDGE_DELAY, "{:?}", t0.elapsed());
    }

    #[test]
    fn a_listener_that_answers_is_connected_at_once() {
        let live = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = live.local_addr().unwrap();
        let t0 = Instant::now();
        let stream = Direct.dial(addr, Duration::from_secs(5)).unwrap();
        assert!(t0.elapsed() < HEDGE_DELAY, "{:?}", t0.elapsed());
        assert!(!socket2::SockRef::from(&stream).nonblocking().unwrap());
        let (mut server, _) = live.accept().unwrap();
        // One connection, not a spare one beside it.
        live.set_nonblocking(true).unwrap();
        assert_eq!(
            live.accept().map(drop).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        use std::io::{Read, Write};
        (&stream).write_all(b"hi").unwrap();
        let mut buf = [0u8; 2];
        server.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hi");
    }

    #[test]
    fn connect_waiting_waits_for_a_listener_that_comes_late() {
        let addr = closed_port();
        let later = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(400));
            let l = TcpListener::bind(addr).unwrap();
            l.accept().map(drop)
        });
        let waited = AtomicUsize::new(0);
        let t0 = Instant::now();
        let s = connect_waiting(
            addr,
            Duration::from_secs(5),
            Duration::from_secs(10),
            || {
                waited.fetch_add(1, Ordering::Relaxed);
            },
        )
        .unwrap();
        assert_eq!(s.peer_addr().unwrap(), addr);
        assert!(
            t0.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t0.elapsed()
        );
        assert_eq!(waited.load(Ordering::Relaxed), 1, "the wait is said once");
        later.join().unwrap().unwrap();
    }

    #[test]
    fn connect_waiting_without_a_wait_fails_at_once_and_gives_up_after_the_wait() {
        let addr = closed_port();
        let t0 = Instant::now();
        let e = connect_waiting(addr, Duration::from_secs(5), Duration::ZERO, || {
            panic!("no wait with a zero wait")
        })
        .unwrap_err();
        assert!(not_listening_yet(&e), "{e}");
        assert!(
            t0.elapsed() < Duration::from_millis(200),
            "{:?}",
            t0.elapsed()
        );
        let t0 = Instant::now();
        let e = connect_waiting(
            addr,
            Duration::from_secs(5),
            Duration::from_millis(500),
            || {},
        )
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(500) && took < Duration::from_secs(3),
            "{took:?}"
        );
    }

    #[test]
    fn waiting_waits_on_its_first_dial_only() {
        let addr = closed_port();
        let said = std::sync::Arc::new(AtomicUsize::new(0));
        let told = said.clone();
        let d = Waiting::new(Duration::from_millis(300), move |a| {
            assert_eq!(a, addr);
            told.fetch_add(1, Ordering::Relaxed);
        });
        let t0 = Instant::now();
        assert!(d.dial(addr, Duration::from_secs(5)).is_err());
        assert!(
            t0.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t0.elapsed()
        );
        assert_eq!(said.load(Ordering::Relaxed), 1);
        let t0 = Instant::now();
        assert!(d.dial(addr, Duration::from_secs(5)).is_err());
        assert!(
            t0.elapsed() < Duration::from_millis(200),
            "{:?}",
            t0.elapsed()
        );
        assert_eq!(
            said.load(Ordering::Relaxed),
            1,
            "a later dial does not wait"
        );
    }
}
