//! The relay's clients, as the `hurtle` CLI uses them: a receiver registers and keeps an
//! [`Agent`] that forwards relayed connections to its own listeners; a sender looks a code up
//! (waiting for it with [`lookup_waiting`]), tries the receiver's addresses directly, and
//! otherwise dials through the relay ([`RelayDialer`]). A sender that starts first [`offer`]s:
//! it prints the code, its receiver answers the offer by registering ([`register_answer`]), and
//! the sender looks that registration up: who listens and who dials stays the same.
//!
//! Nothing here sends the relay anything derived from a code's words: registration sends the
//! receiver's port and addresses, a lookup sends the nameplate. The words stay with the peers,
//! for their key agreement.

use crate::code::Code;
use crate::splice::splice;
use crate::wire::{self, FrameError, Msg};
use hurtle_engine::net::dial::{connect_hedged, Dialer, UdpRelay};
use hurtle_engine::OwnPorts;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a relay may take to answer a request.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(15);

/// Why talking to the relay failed. Each message is one line.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The relay could not be reached.
    #[error("cannot reach the relay at {addr}: {source}")]
    Connect {
        /// The relay.
        addr: SocketAddr,
        /// The socket error.
        source: io::Error,
    },
    /// The connection to the relay failed.
    #[error("relay connection: {0}")]
    Io(#[from] io::Error),
    /// The relay sent something unreadable.
    #[error("relay: {0}")]
    Frame(FrameError),
    /// The relay answered with an error (no such code, too many lookups, busy ...).
    #[error("{message}")]
    Refused {
        /// Machine-readable kind (see [`Msg::Error`]).
        kind: String,
        /// The relay's message.
        message: String,
    },
    /// The relay broke the protocol.
    #[error("relay protocol error: {0}")]
    Protocol(String),
}

impl RelayError {
    /// True when the relay itself, not the code, was the problem (unreachable, broken).
    pub fn is_network(&self) -> bool {
        !matches!(self, RelayError::Refused { .. })
    }
}

fn connect(relay: SocketAddr, timeout: Duration) -> Result<TcpStream, RelayError> {
    let s = connect_hedged(relay, timeout).map_err(|source| RelayError::Connect {
        addr: relay,
        source,
    })?;
    let _ = s.set_nodelay(true);
    s.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    s.set_write_timeout(Some(ANSWER_TIMEOUT))?;
    Ok(s)
}

/// A TCP connection to `relay` from the local address `local` (port chosen by the system): for
/// a host with several addresses that must speak from one of them, and for tests that play
/// clients at several addresses (the relay's limits are per address).
pub fn connect_from(local: IpAddr, relay: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let domain = socket2::Domain::for_address(relay);
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    s.bind(&SocketAddr::new(local, 0).into())?;
    s.connect_timeout(&relay.into(), timeout)?;
    Ok(s.into())
}

fn answer(s: &mut TcpStream) -> Result<Msg, RelayError> {
    match wire::read_msg(s) {
        Ok(Msg::Error { kind, message }) => Err(RelayError::Refused {
            kind,
            message: message.chars().take(300).collect(),
        }),
        Ok(m) => Ok(m),
        Err(FrameError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => Err(
            RelayError::Protocol("the relay closed the connection".into()),
        ),
        Err(FrameError::Io(e)) => Err(RelayError::Io(e)),
        Err(e) => Err(RelayError::Frame(e)),
    }
}

fn unexpected(m: &Msg) -> RelayError {
    RelayError::Protocol(format!("unexpected answer {m:?}"))
}

/// A receiver's registered code, and the connection that keeps it.
pub struct Registration {
    /// The code to give the sender (the relay knows its nameplate only).
    pub code: Code,
    /// Seconds during which the code can be looked up.
    pub ttl_secs: u64,
    relay: SocketAddr,
    idle: Duration,
    stream: TcpStream,
}

/// Registers a receiver whose control listener is bound to `listen`; the code gets `words`
/// words, drawn here after the relay named the nameplate, and never sent.
pub fn register(
    relay: SocketAddr,
    listen: SocketAddr,
    words: usize,
) -> Result<Registration, RelayError> {
    registration(relay, listen, None, |nameplate| {
        Code::generate(nameplate, words)
    })
}

/// Registers a receiver whose control listener is bound to `listen`, answering the offer of a
/// sender that printed `code` ([`offer`]): the relay tells that sender where to look this
/// receiver up. Fails with `no_such_code` when no sender offers the code's nameplate. The
/// registration's code is `code` (the relay's nameplate for this receiver is never shown: only
/// the offer's sender looks it up).
pub fn register_answer(
    relay: SocketAddr,
    listen: SocketAddr,
    code: &Code,
) -> Result<Registration, RelayError> {
    registration(relay, listen, Some(code.nameplate), |_| code.clone())
}

/// `register`, or `answer {offer}` when `offer` is given; `code_of` makes the registration's
/// code from the nameplate the relay allocated.
fn registration(
    relay: SocketAddr,
    listen: SocketAddr,
    offer: Option<u32>,
    code_of: impl FnOnce(u32) -> Code,
) -> Result<Registration, RelayError> {
    let mut s = connect(relay, Duration::from_secs(5))?;
    let mut candidates = Vec::new();
    if let Ok(local) = s.local_addr() {
        candidates.push(SocketAddr::new(local.ip().to_canonical(), listen.port()));
    }
    if !listen.ip().is_unspecified() && !candidates.contains(&listen) {
        candidates.push(listen);
    }
    let port = listen.port();
    let msg = match offer {
        None => Msg::Register { port, candidates },
        Some(offer) => Msg::Answer {
            offer,
            port,
            candidates,
        },
    };
    wire::write_msg(&mut s, &msg)?;
    let nameplate = match answer(&mut s)? {
        Msg::Nameplate { nameplate } => nameplate,
        m => return Err(unexpected(&m)),
    };
    match answer(&mut s)? {
        Msg::Registered {
            ttl_secs,
            idle_secs,
        } => Ok(Registration {
            code: code_of(nameplate),
            ttl_secs,
            relay,
            idle: Duration::from_secs(idle_secs.max(1)),
            stream: s,
        }),
        m => Err(unexpected(&m)),
    }
}

/// What a receiver's agent hears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentEvent {
    /// Someone looked the code's nameplate up: the real sender, or a stranger who guessed the
    /// nameplate (only the key agreement tells them apart). `relayed` says how it reaches this
    /// receiver (`None`: unknown).
    Paired {
        /// The sender as the relay saw it.
        sender: SocketAddr,
        /// Through the relay or not.
        relayed: Option<bool>,
    },
    /// The relay asked for a port this receiver does not listen on (or it could not be reached);
    /// nothing was connected.
    Refused {
        /// The port asked for.
        port: u16,
        /// Why.
        reason: String,
    },
    /// The relay cancelled the code (a relay that cancels codes looked up too often; `hurtle
    /// relay` does not): no further sender can find it. The
    /// agent keeps serving the senders that found it before.
    Cancelled(String),
    /// The code expired: no further sender can find it. The agent keeps serving the senders
    /// that found it before (the relay closes it if there were none: then `Lost` follows).
    Expired,
    /// The sender asked for UDP through the relay: the receiver's ends of the allocations, one
    /// per channel, and the relay's UDP port.
    Udp {
        /// The relay's UDP port.
        port: u16,
        /// The receiver's token of each channel's allocation.
        tokens: Vec<crate::udp::Token>,
    },
    /// The connection to the relay ended (not reported after [`Agent::stop`]).
    Lost(String),
}

/// The receiver's side of its registration: answers the relay's dial requests by connecting
/// to the receiver's own listeners, and reports what happens.
pub struct Agent {
    stop: Arc<AtomicBool>,
    writer: Arc<Mutex<TcpStream>>,
}

impl Registration {
    /// Starts the agent. Relayed connections are made to `target` (the receiver's bound IP, or
    /// loopback when it is unspecified) at a port in `ports` only; `events` hears what happens.
    pub fn start_agent(
        self,
        target: IpAddr,
        ports: Arc<OwnPorts>,
        events: impl Fn(AgentEvent) + Send + Sync + 'static,
    ) -> io::Result<Agent> {
        let target = match target {
            IpAddr::V4(a) if a.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(a) if a.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let writer = Arc::new(Mutex::new(self.stream.try_clone()?));
        let events = Arc::new(events);
        let (w, st, idle) = (writer.clone(), stop.clone(), self.idle);
        std::thread::Builder::new()
            .name("agent-ping".into())
            .spawn(move || {
                let every = (idle / 3).max(Duration::from_millis(100));
                let mut next = Instant::now() + every;
                while !st.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50).min(every));
                    if Instant::now() >= next {
                        next += every;
                        if wire::write_msg(
                            &mut *w.lock().unwrap_or_else(|e| e.into_inner()),
                            &Msg::Ping,
                        )
                        .is_err()
                        {
                            return;
                        }
                    }
                }
            })?;
        let (w, st) = (writer.clone(), stop.clone());
        let (relay, mut s) = (self.relay, self.stream);
        s.set_read_timeout(None)?;
        std::thread::Builder::new()
            .name("agent".into())
            .spawn(move || {
                let end = loop {
                    let msg = match wire::read_msg(&mut s) {
                        Ok(m) => m,
                        Err(e) => break AgentEvent::Lost(e.to_string()),
                    };
                    match msg {
                        Msg::Paired { sender, relayed } => {
                            events(AgentEvent::Paired { sender, relayed })
                        }
                        Msg::Dial { id, port } => {
                            if !ports.contains(port) {
                                let reason =
                                    format!("port {port} is not one this receiver listens on");
                                let _ = wire::write_msg(
                                    &mut *w.lock().unwrap_or_else(|e| e.into_inner()),
                                    &Msg::Refuse {
                                        id,
                                        reason: reason.clone(),
                                    },
                                );
                                events(AgentEvent::Refused { port, reason });
                                continue;
                            }
                            let (w, events) = (w.clone(), events.clone());
                            let _ = std::thread::Builder::new().name("agent-dial".into()).spawn(
                                move || {
                                    if let Err(reason) =
                                        forward(relay, SocketAddr::new(target, port), id)
                                    {
                                        let _ = wire::write_msg(
                                            &mut *w.lock().unwrap_or_else(|e| e.into_inner()),
                                            &Msg::Refuse {
                                                id,
                                                reason: reason.clone(),
                                            },
                                        );
                                        events(AgentEvent::Refused { port, reason });
                                    }
                                },
                            );
                        }
                        Msg::Cancelled { reason } => events(AgentEvent::Cancelled(reason)),
                        Msg::Udp { port, tokens } => {
                            let tokens: Option<Vec<_>> =
                                tokens.iter().map(|t| crate::udp::parse_token(t)).collect();
                            match tokens {
                                Some(tokens) => events(AgentEvent::Udp { port, tokens }),
                                None => break AgentEvent::Lost("a malformed UDP token".into()),
                            }
                        }
                        Msg::Expired => events(AgentEvent::Expired),
                        Msg::Error { message, .. } => break AgentEvent::Lost(message),
                        m => break AgentEvent::Lost(format!("unexpected message {m:?}")),
                    }
                };
                if !st.swap(true, Ordering::Relaxed) {
                    events(end);
                }
            })?;
        Ok(Agent { stop, writer })
    }
}

impl Agent {
    /// Leaves the relay (the code, if still registered, is withdrawn; relayed connections in
    /// progress continue).
    pub fn stop(&self) {
        leave(&self.stop, &self.writer);
    }
}

/// Ends an agent's connection to the relay once (the relay withdraws what it held for it).
fn leave(stop: &AtomicBool, writer: &Mutex<TcpStream>) {
    if !stop.swap(true, Ordering::Relaxed) {
        let _ = writer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .shutdown(Shutdown::Both);
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Connects the local listener `local` and a `join` connection to the relay, then copies bytes
/// between them until both ends are done.
fn forward(relay: SocketAddr, local: SocketAddr, id: u64) -> Result<(), String> {
    let near = TcpStream::connect_timeout(&local, Duration::from_secs(2))
        .map_err(|e| format!("cannot connect to {local}: {e}"))?;
    let _ = near.set_nodelay(true);
    let mut far = connect(relay, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    wire::write_msg(&mut far, &Msg::Join { id }).map_err(|e| e.to_string())?;
    match answer(&mut far) {
        Ok(Msg::Spliced) => {}
        Ok(m) => return Err(unexpected(&m).to_string()),
        // The relay gave up on this splice: nothing to refuse any more.
        Err(_) => return Ok(()),
    }
    let _ = far.set_write_timeout(None);
    splice(far, near, Duration::from_secs(120));
    Ok(())
}

/// A successful lookup.
#[derive(Debug)]
pub struct Found {
    /// Where the receiver's control listener might be reachable directly.
    pub candidates: Vec<SocketAddr>,
    /// The relay.
    pub relay: SocketAddr,
    ticket: String,
    stream: TcpStream,
}

/// Looks a code up at the relay by its nameplate (all the relay ever gets of a code). A
/// lookup does not use the code up, and says nothing about its words: the peers' key agreement
/// finds a wrong code. The relay answers every lookup (within its address's lookup rate), and
/// lets each open one connection to the receiver's control port.
pub fn lookup(relay: SocketAddr, nameplate: u32) -> Result<Found, RelayError> {
    let mut s = connect(relay, Duration::from_secs(5))?;
    wire::write_msg(&mut s, &Msg::Lookup { nameplate })?;
    match answer(&mut s)? {
        Msg::Found { ticket, candidates } if !candidates.is_empty() => Ok(Found {
            candidates,
            relay,
            ticket,
            stream: s,
        }),
        m => Err(unexpected(&m)),
    }
}

/// How often [`lookup_waiting`] asks again for a code not registered yet: the relay's default
/// lookup rate for one address (bursts of 10, then one a second).
pub const LOOKUP_POLL: Duration = Duration::from_secs(1);

/// [`lookup`], waiting up to `wait` for a code that is not registered yet (its receiver has
/// not started): asks again every [`LOOKUP_POLL`] while the relay answers `no_such_code` (or
/// `rate_limited`), calling `on_wait` once before the first wait. Any other failure, and the
/// last answer once `wait` has passed, is returned as it is.
pub fn lookup_waiting(
    relay: SocketAddr,
    nameplate: u32,
    wait: Duration,
    on_wait: impl FnOnce(),
) -> Result<Found, RelayError> {
    let deadline = Instant::now() + wait;
    let mut on_wait = Some(on_wait);
    loop {
        let asked = Instant::now();
        match lookup(relay, nameplate) {
            Err(RelayError::Refused { kind, .. })
                if (kind == "no_such_code" || kind == "rate_limited")
                    && asked + LOOKUP_POLL < deadline =>
            {
                if let Some(f) = on_wait.take() {
                    f();
                }
                std::thread::sleep((asked + LOOKUP_POLL).saturating_duration_since(Instant::now()));
            }
            other => return other,
        }
    }
}

/// A sender's offer: the code it prints, and the connection that keeps it (see [`offer`]).
pub struct Offering {
    /// The code to give the receiver (the relay knows its nameplate only).
    pub code: Code,
    /// Seconds during which a receiver can answer the offer.
    pub ttl_secs: u64,
    idle: Duration,
    stream: TcpStream,
}

/// Asks the relay for a code a sender prints, for a sender that starts before its receiver:
/// the code gets `words` words, drawn here after the relay named the nameplate, and never
/// sent. A receiver given the code answers with [`register_answer`]; the sender hears the
/// receiver's nameplate ([`OfferEvent::Answered`]) and looks it up as for any code.
pub fn offer(relay: SocketAddr, words: usize) -> Result<Offering, RelayError> {
    let mut s = connect(relay, Duration::from_secs(5))?;
    wire::write_msg(&mut s, &Msg::Offer)?;
    let nameplate = match answer(&mut s)? {
        Msg::Nameplate { nameplate } => nameplate,
        m => return Err(unexpected(&m)),
    };
    match answer(&mut s)? {
        Msg::Registered {
            ttl_secs,
            idle_secs,
        } => Ok(Offering {
            code: Code::generate(nameplate, words),
            ttl_secs,
            idle: Duration::from_secs(idle_secs.max(1)),
            stream: s,
        }),
        m => Err(unexpected(&m)),
    }
}

/// What an offer hears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OfferEvent {
    /// A receiver answered the offer and registered under this nameplate: look it up. It is
    /// the real receiver, or a stranger who guessed the nameplate (only the key agreement tells
    /// them apart).
    Answered(u32),
    /// The code expired: no further receiver can answer it.
    Expired,
    /// The connection to the relay ended (not reported after [`OfferAgent::stop`]).
    Lost(String),
}

/// The sender's side of its offer: keeps it alive (pings) and reports what the relay says.
pub struct OfferAgent {
    stop: Arc<AtomicBool>,
    writer: Arc<Mutex<TcpStream>>,
}

impl Offering {
    /// Starts the offer's threads; `events` hears what happens.
    pub fn start(self, events: impl Fn(OfferEvent) + Send + 'static) -> io::Result<OfferAgent> {
        let stop = Arc::new(AtomicBool::new(false));
        let writer = Arc::new(Mutex::new(self.stream.try_clone()?));
        let (w, st, every) = (
            writer.clone(),
            stop.clone(),
            (self.idle / 3).max(Duration::from_millis(100)),
        );
        std::thread::Builder::new()
            .name("offer-ping".into())
            .spawn(move || {
                let mut next = Instant::now() + every;
                while !st.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50).min(every));
                    if Instant::now() >= next {
                        next += every;
                        let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
                        if wire::write_msg(&mut *w, &Msg::Ping).is_err() {
                            return;
                        }
                    }
                }
            })?;
        let st = stop.clone();
        let mut s = self.stream;
        s.set_read_timeout(None)?;
        std::thread::Builder::new()
            .name("offer".into())
            .spawn(move || {
                let end = loop {
                    match wire::read_msg(&mut s) {
                        Ok(Msg::Answered { nameplate }) => events(OfferEvent::Answered(nameplate)),
                        Ok(Msg::Expired) => events(OfferEvent::Expired),
                        Ok(Msg::Error { message, .. }) => break OfferEvent::Lost(message),
                        Ok(m) => break OfferEvent::Lost(format!("unexpected message {m:?}")),
                        Err(e) => break OfferEvent::Lost(e.to_string()),
                    }
                };
                if !st.swap(true, Ordering::Relaxed) {
                    events(end);
                }
            })?;
        Ok(OfferAgent { stop, writer })
    }
}

impl OfferAgent {
    /// Tells the relay that the receiver registered under `nameplate` (one that answered this
    /// offer) holds another code: its registration is withdrawn and it is told why.
    pub fn mismatch(&self, nameplate: u32) -> io::Result<()> {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        wire::write_msg(&mut *w, &Msg::Mismatch { nameplate })
    }

    /// Withdraws the offer.
    pub fn stop(&self) {
        leave(&self.stop, &self.writer);
    }
}

impl Drop for OfferAgent {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Found {
    /// Asks the relay for UDP allocations for a session of `channels` channels: the sender's
    /// end of each, in channel order, and the relay's UDP port (the receiver's ends go to its
    /// agent).
    pub fn allocate_udp(&self, channels: u16) -> Result<(u16, Vec<crate::udp::Token>), RelayError> {
        allocate_udp(self.relay, &self.ticket, channels)
    }

    /// The receiver's control port.
    pub fn port(&self) -> u16 {
        self.candidates[0].port()
    }

    /// Tries the candidates one after the other, within `total`; the first that connects is
    /// kept (closing it would look like a failed session to the receiver). Loopback candidates
    /// are tried only when the relay itself is on loopback.
    pub fn try_direct(&self, total: Duration) -> Option<(SocketAddr, TcpStream)> {
        let deadline = Instant::now() + total;
        let usable: Vec<SocketAddr> = self
            .candidates
            .iter()
            .copied()
            .filter(|c| !c.ip().is_loopback() || self.relay.ip().is_loopback())
            .collect();
        for (i, c) in usable.iter().enumerate() {
            let left = deadline.checked_duration_since(Instant::now())?;
            let share = left / (usable.len() - i) as u32;
            if let Ok(s) =
                TcpStream::connect_timeout(c, share.max(Duration::from_millis(200)).min(left))
            {
                return Some((*c, s));
            }
        }
        None
    }

    /// Tells the relay how the sender reaches the receiver (the receiver is told too), and
    /// returns a dialer for the engine: `Some(stream)` from [`Found::try_direct`] for a direct
    /// path, `None` for a relayed one.
    pub fn into_dialer(mut self, direct: Option<(SocketAddr, TcpStream)>) -> Arc<dyn Dialer> {
        let _ = wire::write_msg(
            &mut self.stream,
            &Msg::Path {
                relayed: direct.is_none(),
            },
        );
        let _ = self.stream.shutdown(Shutdown::Write);
        match direct {
            Some((addr, stream)) => Arc::new(Prepared {
                addr,
                first: Mutex::new(Some(stream)),
            }),
            None => Arc::new(RelayDialer {
                relay: self.relay,
                ticket: self.ticket,
            }),
        }
    }
}

/// Asks `relay` for UDP allocations for the session of `ticket`, `channels` of them: the
/// sender's end of each, in channel order, and the relay's UDP port.
fn allocate_udp(
    relay: SocketAddr,
    ticket: &str,
    channels: u16,
) -> Result<(u16, Vec<crate::udp::Token>), RelayError> {
    let mut s = connect(relay, Duration::from_secs(5))?;
    wire::write_msg(
        &mut s,
        &Msg::Allocate {
            ticket: ticket.to_string(),
            channels,
        },
    )?;
    match answer(&mut s)? {
        Msg::Allocated { port, tokens } if tokens.len() == usize::from(channels) => {
            let parsed: Option<Vec<_>> =
                tokens.iter().map(|t| crate::udp::parse_token(t)).collect();
            parsed
                .map(|t| (port, t))
                .ok_or_else(|| unexpected(&Msg::Allocated { port, tokens }))
        }
        m => Err(unexpected(&m)),
    }
}

/// The relay's answer to a bind: the address it saw the socket come from, and the other end's
/// once that end is bound.
pub fn parse_relay_answer(datagram: &[u8]) -> Option<(SocketAddr, Option<SocketAddr>)> {
    crate::udp::parse_answer(datagram).map(|(_, own, peer)| (own, peer))
}

/// The datagram a socket sends the relay to bind its end of an allocation (its nonce is
/// random; the answer names the address the relay saw).
pub fn udp_bind_request(token: &crate::udp::Token) -> [u8; crate::udp::BIND_LEN] {
    crate::udp::bind_request(token, rand::random())
}

/// A direct path whose first connection is already open.
#[derive(Debug)]
pub struct Prepared {
    addr: SocketAddr,
    first: Mutex<Option<TcpStream>>,
}

impl Dialer for Prepared {
    fn dial(&self, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        if addr == self.addr {
            if let Some(s) = self.first.lock().unwrap_or_else(|e| e.into_inner()).take() {
                return Ok(s);
            }
        }
        connect_hedged(addr, timeout)
    }
}

/// Opens each connection through the relay: `splice {ticket, port}`, then raw bytes. Only the
/// port of the address the engine asks for matters; it is the receiver's local port.
#[derive(Debug)]
pub struct RelayDialer {
    relay: SocketAddr,
    ticket: String,
}

impl Dialer for RelayDialer {
    fn dial(&self, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        let relayed = || -> Result<TcpStream, RelayError> {
            let mut s = connect(self.relay, timeout)?;
            wire::write_msg(
                &mut s,
                &Msg::Splice {
                    ticket: self.ticket.clone(),
                    port: addr.port(),
                },
            )?;
            match answer(&mut s)? {
                Msg::Spliced => {
                    s.set_read_timeout(None)?;
                    s.set_write_timeout(None)?;
                    Ok(s)
                }
                m => Err(unexpected(&m)),
            }
        };
        relayed().map_err(|e| match e {
            RelayError::Connect { source, .. } => source,
            RelayError::Io(e) => e,
            other => io::Error::other(format!("via the relay at {}: {other}", self.relay)),
        })
    }

    fn relayed(&self) -> bool {
        true
    }

    /// The relay forwards datagrams too: each channel gets an allocation there (a relay that
    /// cannot leaves the session to the TCP splice, which the engine falls back to).
    fn udp_relay(&self, channels: u16) -> Option<io::Result<UdpRelay>> {
        let relayed = || -> Result<UdpRelay, RelayError> {
            let (port, tokens) = allocate_udp(self.relay, &self.ticket, channels)?;
            Ok(UdpRelay {
                addr: SocketAddr::new(self.relay.ip(), port),
                binds: tokens
                    .iter()
                    .map(|t| udp_bind_request(t).to_vec())
                    .collect(),
                parse: parse_relay_answer,
            })
        };
        Some(
            relayed()
                .map_err(|e| io::Error::other(format!("via the relay at {}: {e}", self.relay))),
        )
    }
}
