//! The relay server: one thread per connection, bounded in connections, codes, tickets,
//! pending splices and tracked clients, in all and per client address
//! ([`crate::limit::client_key`]); every read has a deadline.
//!
//! It pairs by nameplate only: a lookup of a registered nameplate is answered with a ticket,
//! whoever asks (within the lookup rate of its address), and no number of lookups cancels a
//! code: only a guess that reaches the receiver's key agreement is a try, and the receiver
//! counts those. A ticket opens at most [`CONTROL_SPLICES_PER_TICKET`] connection to the
//! receiver's control port through the relay, so one lookup is one guess at most; a ticket
//! that has not been used within [`TICKET_UNUSED`] is forgotten.
//!
//! A sender that starts first registers an *offer*: a nameplate with no receiver behind it,
//! never found by a lookup. A receiver given that code registers *answering* it, and the offer
//! is told the receiver's nameplate, which its sender looks up as any sender does. The offer
//! may withdraw a registration that answered it (`mismatch`: that receiver holds another code),
//! and nothing else.
//!
//! Per client address, each with its own refusal (kind `limited`, a message that names the
//! limit) and counter: connections open at once (idle ones included), codes registered at
//! once, lookups (a token bucket), UDP allocations ([`crate::udp`]), and bytes a second
//! forwarded, as datagrams (dropped over the rate) and through TCP splices (paced to it).

use crate::limit::{Holdings, Limiter, MAX_CLIENTS};
use crate::metrics::{inc, Metrics};
use crate::registry::{Expired, Full, Lookup, Registry};
use crate::splice::splice_paced;
use crate::udp::{Forwarder, Limits};
use crate::wire::{self, hex, FrameError, Msg, MAX_CANDIDATES, MAX_UDP_CHANNELS};
use std::collections::HashMap;
use std::io::{self, ErrorKind};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How a relay runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// How long a registered code can be looked up.
    pub code_ttl: Duration,
    /// Silence after which a client is disconnected (agents ping more often than this).
    pub idle_timeout: Duration,
    /// Lookups a client IP may make at once.
    pub lookup_burst: u32,
    /// Lookups per second a client IP may make on average.
    pub lookup_per_sec: f64,
    /// Most connections served at once (more are answered `busy` and closed).
    pub max_connections: usize,
    /// Most connections from one client address at once, idle ones included (more are
    /// answered `limited` and closed).
    pub connections_per_address: usize,
    /// Most codes registered at once.
    pub max_codes: usize,
    /// Most codes registered from one client address at once.
    pub codes_per_address: usize,
    /// Most UDP allocations held at once (a session holds one per channel).
    pub max_allocations: usize,
    /// Most UDP allocations made for one client address at once.
    pub allocations_per_address: usize,
    /// Bytes a second one client address may send through the relay, as datagrams and
    /// through splices, each (0: no limit).
    pub bytes_per_sec_per_address: u64,
    /// Where to serve the counters in the Prometheus text format (`None`: nowhere).
    pub metrics: Option<SocketAddr>,
    /// Write log lines (pairings, splice ends) on stderr.
    pub log: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            code_ttl: Duration::from_secs(600),
            idle_timeout: Duration::from_secs(30),
            lookup_burst: 10,
            lookup_per_sec: 1.0,
            max_connections: 4096,
            connections_per_address: 512,
            max_codes: 1024,
            codes_per_address: 256,
            max_allocations: 16_384,
            allocations_per_address: crate::udp::ALLOCATIONS_PER_IP,
            bytes_per_sec_per_address: crate::udp::BYTES_PER_SEC,
            metrics: None,
            log: true,
        }
    }
}

/// A receiver's registration connection, or a sender's offer, as the relay keeps it.
#[derive(Debug)]
struct Agent {
    addr: SocketAddr,
    /// The receiver's control port (where a guess at the code goes); 0 for an offer.
    port: u16,
    candidates: Vec<SocketAddr>,
    writer: Mutex<TcpStream>,
    /// What registered: a receiver, a sender's offer, or a receiver answering an offer.
    kind: Kind,
}

/// What a registration is.
#[derive(Debug)]
enum Kind {
    /// A receiver that printed its code (`register`).
    Receiver,
    /// A sender that printed its code (`offer`): answered, never looked up.
    Offer,
    /// A receiver that answered this offer (`answer`): looked up by the offer's sender.
    Answer(Arc<Agent>),
}

impl Agent {
    fn send(&self, msg: &Msg) -> io::Result<()> {
        wire::write_msg(&mut *lock(&self.writer), msg)
    }

    fn close(&self) {
        let _ = lock(&self.writer).shutdown(Shutdown::Both);
    }
}

struct Ticket {
    agent: Arc<Agent>,
    sender_ip: IpAddr,
    nameplate: u32,
    issued: Instant,
    /// Used for a splice or an allocation (then kept while the agent stays).
    used: bool,
    /// Splices made to the receiver's control port.
    control_splices: u8,
}

/// Connections to the receiver's control port that one ticket (one lookup) opens through the
/// relay: each carries one key agreement, one guess at the code.
pub const CONTROL_SPLICES_PER_TICKET: u8 = 1;
/// A ticket not used (for a splice or an allocation) this long after its lookup is forgotten
/// (a sender that went direct never uses it).
pub const TICKET_UNUSED: Duration = Duration::from_secs(60);
/// Most tickets held at once (each lookup makes one; the lookup rate bounds one address's).
pub const MAX_TICKETS: usize = 65_536;
/// Deadline for a connection's first message (a client that says nothing holds its place no
/// longer than this, or the idle timeout if that is shorter).
pub const FIRST_MESSAGE: Duration = Duration::from_secs(10);

/// A connection waiting for the agent to join, or the agent's refusal.
type Joined = Result<(TcpStream, Slot), String>;

struct Pending {
    agent: Arc<Agent>,
    tx: SyncSender<Joined>,
}

struct State {
    cfg: Config,
    codes: Mutex<Registry<Arc<Agent>>>,
    limiter: Mutex<Limiter>,
    tickets: Mutex<HashMap<String, Ticket>>,
    pending: Mutex<HashMap<u64, Pending>>,
    connections: AtomicUsize,
    /// Connections by client address.
    held: Mutex<Holdings>,
    /// Bytes through splices by sending client (`None`: no limit).
    splice_rate: Option<Mutex<Limiter>>,
    /// The UDP port's allocations, and its number.
    udp: Arc<Mutex<Forwarder>>,
    udp_port: u16,
    metrics: Metrics,
    /// Where log lines go (`None`: `Config::log` is off).
    log: Option<crate::logq::LogQueue>,
}

/// Holds one of the relay's connection slots, and one of its client address's; frees them
/// when dropped.
struct Slot(Arc<State>, IpAddr);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
        lock(&self.0.held).give_back(self.1);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How often [`bind_pair`] tries another port the kernel picks.
const BIND_TRIES: usize = 16;

/// The relay's TCP listener on `addr` and its UDP socket on the same port. Where `addr`'s port
/// is 0, the kernel picks one for TCP that another program may hold for UDP: then another.
fn bind_pair(addr: SocketAddr) -> io::Result<(TcpListener, hurtle_engine::net::udp::UdpChannel)> {
    let mut tries = 1;
    loop {
        let listener = TcpListener::bind(addr)?;
        match crate::udp::bind(listener.local_addr()?) {
            Ok(udp) => return Ok((listener, udp)),
            Err(e)
                if addr.port() == 0
                    && e.kind() == io::ErrorKind::AddrInUse
                    && tries < BIND_TRIES =>
            {
                tries += 1
            }
            Err(e) => return Err(e),
        }
    }
}

/// A bound relay; [`Server::run`] serves until the process ends.
pub struct Server {
    listener: TcpListener,
    metrics: Option<TcpListener>,
    udp: hurtle_engine::net::udp::UdpChannel,
    state: Arc<State>,
}

impl Server {
    /// Binds `addr`, for TCP and, on the same port, UDP.
    pub fn bind(addr: SocketAddr, cfg: Config) -> io::Result<Server> {
        let (listener, udp) = bind_pair(addr)?;
        let metrics = cfg.metrics.map(TcpListener::bind).transpose()?;
        let state = Arc::new(State {
            udp: Arc::new(Mutex::new(Forwarder::with_limits(Limits {
                allocations: cfg.max_allocations,
                per_address: cfg.allocations_per_address,
                bytes_per_sec: cfg.bytes_per_sec_per_address,
            }))),
            udp_port: udp.local_addr().port(),
            metrics: Metrics::default(),
            log: cfg
                .log
                .then(|| crate::logq::LogQueue::new(4096, std::io::stderr()))
                .transpose()?,
            codes: Mutex::new(Registry::with_per_address(
                cfg.max_codes,
                cfg.codes_per_address,
                cfg.code_ttl,
            )),
            limiter: Mutex::new(Limiter::new(cfg.lookup_burst, cfg.lookup_per_sec)),
            tickets: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            connections: AtomicUsize::new(0),
            held: Mutex::new(Holdings::new(cfg.connections_per_address)),
            splice_rate: (cfg.bytes_per_sec_per_address > 0).then(|| {
                let per_sec = cfg.bytes_per_sec_per_address as f64;
                Mutex::new(Limiter::with_capacity(
                    (per_sec / 4.0).max(65_536.0),
                    per_sec,
                    MAX_CLIENTS,
                ))
            }),
            cfg,
        });
        Ok(Server {
            listener,
            metrics,
            udp,
            state,
        })
    }

    /// The address bound.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The metrics endpoint's address, if it has one.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves forever (returns only if the listening socket fails).
    pub fn run(self) -> io::Result<()> {
        let (udp, forwarder) = (self.udp, self.state.udp.clone());
        std::thread::Builder::new()
            .name("relay-udp".into())
            .spawn(move || crate::udp::serve(udp, forwarder))?;
        if let Some(listener) = self.metrics {
            let st = self.state.clone();
            std::thread::Builder::new()
                .name("relay-metrics".into())
                .spawn(move || crate::metrics::serve(listener, || render(&st)))?;
        }
        let janitor = self.state.clone();
        std::thread::Builder::new()
            .name("relay-expiry".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(100));
                expire(&janitor);
            })?;
        loop {
            let (stream, peer) = match self.listener.accept() {
                Ok(c) => c,
                Err(e) if is_transient(&e) => {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let st = &self.state;
            if st.connections.fetch_add(1, Ordering::Relaxed) >= st.cfg.max_connections {
                st.connections.fetch_sub(1, Ordering::Relaxed);
                inc(&st.metrics.refused_busy);
                inc(&st.metrics.limit_connections);
                refuse_at_once(stream, "busy", "the relay is busy, try again later");
                continue;
            }
            if !lock(&st.held).take(peer.ip()) {
                st.connections.fetch_sub(1, Ordering::Relaxed);
                inc(&st.metrics.refused_limited);
                inc(&st.metrics.limit_connections_per_address);
                let message = format!(
                    "the relay limits connections from one address ({} at once), try again later",
                    st.cfg.connections_per_address
                );
                refuse_at_once(stream, "limited", &message);
                continue;
            }
            let slot = Slot(st.clone(), peer.ip());
            let _ = std::thread::Builder::new()
                .name("relay-conn".into())
                .stack_size(256 * 1024)
                .spawn(move || serve(stream, peer, slot));
        }
    }
}

/// Refuses a connection from the accepting thread: the error frame, then a close that does not
/// reset it away (what the client already sent is read first, without waiting).
fn refuse_at_once(mut s: TcpStream, kind: &str, message: &str) {
    let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
    let _ = wire::write_msg(&mut s, &Msg::error(kind, message));
    let _ = s.shutdown(Shutdown::Write);
    if s.set_nonblocking(true).is_ok() {
        let mut buf = [0u8; 4096];
        for _ in 0..4 {
            if !matches!(io::Read::read(&mut s, &mut buf), Ok(n) if n > 0) {
                break;
            }
        }
    }
}

/// The counters as the metrics endpoint shows them.
fn render(st: &State) -> String {
    let (allocations, udp) = {
        let f = lock(&st.udp);
        (f.len() as u64, f.counts())
    };
    let gauges = (
        st.connections.load(Ordering::Relaxed) as u64,
        lock(&st.codes).len() as u64,
        allocations,
    );
    st.metrics.render(gauges, udp)
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::ConnectionAborted
            | ErrorKind::ConnectionReset
            | ErrorKind::Interrupted
            | ErrorKind::WouldBlock
    ) || matches!(e.raw_os_error(), Some(23 | 24 | 105 | 12)) // ENFILE, EMFILE, ENOBUFS, ENOMEM
}

/// A log line, handed to the log's own thread (a log nobody reads never blocks a connection).
fn log(st: &State, line: std::fmt::Arguments<'_>) {
    if let Some(q) = &st.log {
        q.line(line.to_string());
    }
}

fn expire(st: &State) {
    let now = Instant::now();
    lock(&st.tickets)
        .retain(|_, t| t.used || now.saturating_duration_since(t.issued) < TICKET_UNUSED);
    let gone = lock(&st.codes).expire(now);
    for Expired {
        nameplate,
        agent,
        lookups,
    } in gone
    {
        let _ = agent.send(&Msg::Expired);
        if lookups == 0 {
            log(
                st,
                format_args!("code {nameplate} expired unused (receiver {})", agent.addr),
            );
            agent.close();
        } else {
            // Tickets are out: the agent stays for them until its receiver leaves.
            log(
                st,
                format_args!(
                    "code {nameplate} expired after {lookups} lookups (receiver {})",
                    agent.addr
                ),
            );
        }
    }
}

/// Reads one message; on a bad frame tells the client why (best effort) and gives up.
fn read(s: &mut TcpStream) -> Option<Msg> {
    match wire::read_msg(s) {
        Ok(m) => Some(m),
        Err(e @ (FrameError::BadLength(_) | FrameError::Malformed(_))) => {
            let _ = wire::write_msg(s, &Msg::error("bad_frame", e.to_string()));
            linger(s);
            None
        }
        Err(FrameError::Io(e)) => {
            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
                let _ = wire::write_msg(s, &Msg::error("timeout", "idle for too long"));
            }
            None
        }
    }
}

/// Closes our side and discards a bounded amount of what the client still sends, so the error
/// frame is not lost to a reset (closing with unread data makes the kernel send RST).
fn linger(s: &mut TcpStream) {
    let _ = s.shutdown(Shutdown::Write);
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = [0u8; 4096];
    let mut left = 256 * 1024usize;
    while left > 0 {
        match io::Read::read(s, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

fn reply(st: &State, s: &mut TcpStream, kind: &str, message: &str) {
    let m = &st.metrics;
    match kind {
        "rate_limited" => inc(&m.refused_rate_limited),
        "no_such_code" => inc(&m.refused_no_such_code),
        "busy" => inc(&m.refused_busy),
        "bad_request" | "bad_frame" => inc(&m.refused_bad_request),
        "no_such_ticket" => inc(&m.refused_no_such_ticket),
        "limited" => inc(&m.refused_limited),
        _ => {}
    }
    let _ = wire::write_msg(s, &Msg::error(kind, message));
}

fn serve(mut s: TcpStream, peer: SocketAddr, slot: Slot) {
    let st = slot.0.clone();
    let idle = st.cfg.idle_timeout;
    if s.set_read_timeout(Some(idle.min(FIRST_MESSAGE))).is_err()
        || s.set_write_timeout(Some(idle)).is_err()
    {
        return;
    }
    let _ = s.set_nodelay(true);
    let first = read(&mut s);
    if s.set_read_timeout(Some(idle)).is_err() {
        return;
    }
    match first {
        Some(Msg::Register { port, candidates }) => register(&st, s, peer, port, candidates, None),
        Some(Msg::Offer) => offer(&st, s, peer),
        Some(Msg::Answer {
            offer,
            port,
            candidates,
        }) => answer(&st, s, peer, offer, port, candidates),
        Some(Msg::Lookup { nameplate }) => lookup(&st, s, peer, nameplate),
        Some(Msg::Splice { ticket, port }) => relay_splice(&st, s, peer, &ticket, port),
        Some(Msg::Join { id }) => join(&st, s, peer, id, slot),
        Some(Msg::Allocate { ticket, channels }) => allocate(&st, s, peer, &ticket, channels),
        Some(_) => reply(&st, &mut s, "bad_request", "unexpected message"),
        None => {}
    }
}

/// A sender that starts first: registered as a receiver is, with no port and no candidates;
/// its connection is the offer, which hears `answered` when a receiver answers it.
fn offer(st: &Arc<State>, s: TcpStream, peer: SocketAddr) {
    register(st, s, peer, 0, Vec::new(), Some(Kind::Offer));
}

/// A receiver answering the offer of nameplate `offer`: looked up as a lookup is (and charged
/// to the lookup rate of its address), then registered; the offer hears its nameplate.
fn answer(
    st: &Arc<State>,
    mut s: TcpStream,
    peer: SocketAddr,
    offer: u32,
    port: u16,
    given: Vec<SocketAddr>,
) {
    if !lock(&st.limiter).allow(peer.ip(), Instant::now()) {
        inc(&st.metrics.limit_lookups_per_address);
        return reply(st, &mut s, "rate_limited", "too many lookups, slow down");
    }
    let found = lock(&st.codes).lookup(Instant::now(), offer);
    match found {
        Lookup::Found(a) if matches!(a.kind, Kind::Offer) => {
            register(st, s, peer, port, given, Some(Kind::Answer(a)))
        }
        _ => reply(
            st,
            &mut s,
            "no_such_code",
            "no sender is waiting with this code (expired, used or mistyped)",
        ),
    }
}

/// A registration (`kind` `None`: a receiver's): allocates a nameplate, answers it, and serves
/// the connection as the agent until it leaves.
fn register(
    st: &Arc<State>,
    mut s: TcpStream,
    peer: SocketAddr,
    port: u16,
    given: Vec<SocketAddr>,
    kind: Option<Kind>,
) {
    let is_offer = matches!(kind, Some(Kind::Offer));
    if (port == 0) != is_offer || given.len() > MAX_CANDIDATES {
        return reply(st, &mut s, "bad_request", "bad registration");
    }
    let mut candidates = Vec::new();
    let own = (!is_offer).then(|| SocketAddr::new(peer.ip().to_canonical(), port));
    for c in given.into_iter().chain(own) {
        let usable = !c.ip().is_unspecified() && !c.ip().is_multicast() && c.port() == port;
        if usable && !candidates.contains(&c) {
            candidates.push(c);
        }
    }
    let writer = match s.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let agent = Arc::new(Agent {
        addr: peer,
        port,
        candidates,
        writer: Mutex::new(writer),
        kind: kind.unwrap_or(Kind::Receiver),
    });
    // The code can be looked up as soon as it is allocated: hold the agent's writer until the
    // receiver has its answer, so that no `paired` can come before it.
    let (nameplate, registered) = {
        let mut w = lock(&agent.writer);
        let allocated = lock(&st.codes).allocate(Instant::now(), peer.ip(), agent.clone());
        let nameplate = match allocated {
            Ok(n) => n,
            Err(full) => {
                drop(w);
                let kind = match full {
                    Full::Relay => {
                        inc(&st.metrics.limit_codes);
                        "busy"
                    }
                    Full::Address(_) => {
                        inc(&st.metrics.limit_codes_per_address);
                        "limited"
                    }
                };
                return reply(st, &mut s, kind, &full.to_string());
            }
        };
        let sent = wire::write_msg(&mut *w, &Msg::Nameplate { nameplate }).is_ok()
            && wire::write_msg(
                &mut *w,
                &Msg::Registered {
                    ttl_secs: st.cfg.code_ttl.as_secs(),
                    idle_secs: st.cfg.idle_timeout.as_secs().max(1),
                },
            )
            .is_ok();
        (nameplate, sent)
    };
    if registered {
        inc(&st.metrics.registrations);
        if let Kind::Answer(offer) = &agent.kind {
            log(
                st,
                format_args!("code {nameplate} of receiver {peer} answers an offer"),
            );
            let _ = offer.send(&Msg::Answered { nameplate });
        }
        // The agent: pings, and refusals of dial requests (an offer: mismatches), until it
        // leaves or is dropped.
        while let Some(msg) = read(&mut s) {
            match msg {
                Msg::Ping => {}
                Msg::Mismatch { nameplate: other } if matches!(agent.kind, Kind::Offer) => {
                    mismatch(st, &agent, other)
                }
                Msg::Refuse { id, reason } => {
                    let p = lock(&st.pending).remove(&id);
                    match p {
                        Some(p) if Arc::ptr_eq(&p.agent, &agent) => {
                            let _ = p.tx.try_send(Err(format!(
                                "the receiver refused: {}",
                                reason.chars().take(200).collect::<String>()
                            )));
                        }
                        Some(p) => {
                            lock(&st.pending).insert(id, p);
                        }
                        None => {}
                    }
                }
                _ => {
                    reply(
                        st,
                        &mut s,
                        "bad_request",
                        "unexpected message from a receiver",
                    );
                    break;
                }
            }
        }
    }
    // Gone: its code (if still registered), its tickets and its pending splices go too.
    {
        let mut codes = lock(&st.codes);
        if codes
            .remove_if(nameplate, |a| Arc::ptr_eq(a, &agent))
            .is_some()
            && registered
        {
            drop(codes);
            let who = if is_offer { "sender" } else { "receiver" };
            log(
                st,
                format_args!("code {nameplate} withdrawn: its {who} {peer} left"),
            );
        }
    }
    lock(&st.tickets).retain(|_, t| !Arc::ptr_eq(&t.agent, &agent));
    lock(&st.pending).retain(|_, p| !Arc::ptr_eq(&p.agent, &agent));
    agent.close();
}

/// The offer `offer` says the receiver registered under `nameplate` holds another code: if
/// that receiver answered this offer, its code is withdrawn and it is told so.
fn mismatch(st: &State, offer: &Arc<Agent>, nameplate: u32) {
    let answered_this =
        |a: &Arc<Agent>| matches!(&a.kind, Kind::Answer(o) if Arc::ptr_eq(o, offer));
    let removed = lock(&st.codes).remove_if(nameplate, answered_this);
    if let Some(receiver) = removed {
        log(
            st,
            format_args!(
                "code {nameplate} cancelled: its receiver {} typed another code than the sender's",
                receiver.addr
            ),
        );
        let _ = receiver.send(&Msg::Cancelled {
            reason: "the sender holds another code than the one typed here".into(),
        });
    }
}

fn lookup(st: &Arc<State>, mut s: TcpStream, peer: SocketAddr, nameplate: u32) {
    if !lock(&st.limiter).allow(peer.ip(), Instant::now()) {
        inc(&st.metrics.limit_lookups_per_address);
        return reply(st, &mut s, "rate_limited", "too many lookups, slow down");
    }
    let found = lock(&st.codes).lookup(Instant::now(), nameplate);
    let agent = match found {
        // An offer is answered, never looked up: its sender is no receiver.
        Lookup::Found(a) if !matches!(a.kind, Kind::Offer) => a,
        _ => {
            return reply(
                st,
                &mut s,
                "no_such_code",
                "no such code (expired, used or mistyped)",
            )
        }
    };
    let ticket = hex(&rand::random::<[u8; 16]>());
    {
        let mut tickets = lock(&st.tickets);
        if tickets.len() >= MAX_TICKETS {
            drop(tickets);
            inc(&st.metrics.limit_tickets);
            return reply(st, &mut s, "busy", "the relay is busy, try again later");
        }
        tickets.insert(
            ticket.clone(),
            Ticket {
                agent: agent.clone(),
                sender_ip: peer.ip().to_canonical(),
                nameplate,
                issued: Instant::now(),
                used: false,
                control_splices: 0,
            },
        );
    }
    let _ = wire::write_msg(
        &mut s,
        &Msg::Found {
            ticket,
            candidates: agent.candidates.clone(),
        },
    );
    // The sender says how it reaches the receiver once it knows (after trying direct paths).
    let relayed = match read(&mut s) {
        Some(Msg::Path { relayed }) => Some(relayed),
        _ => None,
    };
    log(
        st,
        format_args!(
            "pairing nameplate={nameplate} receiver={} sender={peer} path={}",
            agent.addr,
            match relayed {
                Some(true) => "relayed",
                Some(false) => "direct",
                None => "unreported",
            }
        ),
    );
    inc(match relayed {
        Some(true) => &st.metrics.pairings_relayed,
        Some(false) => &st.metrics.pairings_direct,
        None => &st.metrics.pairings_unreported,
    });
    let _ = agent.send(&Msg::Paired {
        sender: peer,
        relayed,
    });
}

/// The receiver's agent and nameplate of `ticket`, if `peer` is the sender it was given to,
/// marking the ticket used (for a connection to `port`, `None` for an allocation); else the
/// client is told why not.
fn ticket_of(
    st: &State,
    s: &mut TcpStream,
    peer: SocketAddr,
    ticket: &str,
    port: Option<u16>,
) -> Option<(Arc<Agent>, u32)> {
    let found = match lock(&st.tickets).get_mut(ticket) {
        Some(t) if t.sender_ip == peer.ip().to_canonical() => {
            if port == Some(t.agent.port) && t.control_splices >= CONTROL_SPLICES_PER_TICKET {
                Err(true)
            } else {
                if port == Some(t.agent.port) {
                    t.control_splices += 1;
                }
                t.used = true;
                Ok((t.agent.clone(), t.nameplate))
            }
        }
        _ => Err(false),
    };
    match found {
        Ok(f) => Some(f),
        Err(true) => {
            inc(&st.metrics.limit_control_splices_per_ticket);
            reply(
                st,
                s,
                "limited",
                "a lookup opens one connection to the receiver's control port (one try of the code); look the code up again",
            );
            None
        }
        Err(false) => {
            reply(
                st,
                s,
                "no_such_ticket",
                "unknown ticket (the receiver may have left)",
            );
            None
        }
    }
}

/// UDP allocations for a paired session: the sender's tokens to it, the receiver's to its agent.
fn allocate(st: &Arc<State>, mut s: TcpStream, peer: SocketAddr, ticket: &str, channels: u16) {
    if channels == 0 || channels > MAX_UDP_CHANNELS {
        return reply(st, &mut s, "bad_request", "bad number of channels");
    }
    let Some((agent, _)) = ticket_of(st, &mut s, peer, ticket, None) else {
        return;
    };
    let now = Instant::now();
    let (pairs, refused_before): (Option<Vec<_>>, _) = {
        let mut f = lock(&st.udp);
        let before = f.counts().refused;
        (
            (0..channels).map(|_| f.allocate(now, peer.ip())).collect(),
            before,
        )
    };
    // What was allocated of a refused request is unused, and expires.
    let Some(pairs) = pairs else {
        let per_address = lock(&st.udp).counts().refused[1] > refused_before[1];
        return if per_address {
            let message = format!(
                "the relay limits UDP allocations for one address ({} at once)",
                st.cfg.allocations_per_address
            );
            reply(st, &mut s, "limited", &message)
        } else {
            reply(
                st,
                &mut s,
                "busy",
                "the relay holds too many UDP allocations",
            )
        };
    };
    let (mine, theirs): (Vec<String>, Vec<String>) =
        pairs.iter().map(|(a, b)| (hex(a), hex(b))).unzip();
    st.metrics
        .allocations
        .fetch_add(u64::from(channels), Ordering::Relaxed);
    let port = st.udp_port;
    if agent
        .send(&Msg::Udp {
            port,
            tokens: theirs,
        })
        .is_err()
    {
        return reply(st, &mut s, "refused", "the receiver left");
    }
    log(
        st,
        format_args!(
            "udp allocations={channels} receiver={} sender={peer}",
            agent.addr
        ),
    );
    let _ = wire::write_msg(&mut s, &Msg::Allocated { port, tokens: mine });
}

fn relay_splice(st: &Arc<State>, mut s: TcpStream, peer: SocketAddr, ticket: &str, port: u16) {
    let Some((agent, nameplate)) = ticket_of(st, &mut s, peer, ticket, Some(port)) else {
        return;
    };
    let id = rand::random::<u64>();
    let (tx, rx) = sync_channel::<Joined>(1);
    {
        let mut pending = lock(&st.pending);
        if pending.len() >= st.cfg.max_connections {
            drop(pending);
            return reply(st, &mut s, "busy", "the relay is busy, try again later");
        }
        pending.insert(
            id,
            Pending {
                agent: agent.clone(),
                tx,
            },
        );
    }
    if agent.send(&Msg::Dial { id, port }).is_err() {
        lock(&st.pending).remove(&id);
        return reply(st, &mut s, "refused", "the receiver is gone");
    }
    let joined = rx.recv_timeout(Duration::from_secs(10).min(st.cfg.idle_timeout));
    lock(&st.pending).remove(&id);
    let (mut other, _slot) = match joined {
        Ok(Ok(j)) => j,
        Ok(Err(reason)) => return reply(st, &mut s, "refused", &reason),
        Err(RecvTimeoutError::Timeout) => {
            return reply(st, &mut s, "timeout", "the receiver did not answer")
        }
        Err(RecvTimeoutError::Disconnected) => {
            return reply(st, &mut s, "refused", "the receiver is gone")
        }
    };
    if wire::write_msg(&mut s, &Msg::Spliced).is_err()
        || wire::write_msg(&mut other, &Msg::Spliced).is_err()
    {
        return;
    }
    // Each direction is paced to its sender's address's rate.
    let pace = |ip: IpAddr| {
        let st = st.clone();
        move |n: usize| {
            st.splice_rate
                .as_ref()
                .and_then(|r| lock(r).take(ip, n as f64, Instant::now()))
                .unwrap_or_default()
        }
    };
    let receiver_ip = other.peer_addr().map_or(agent.addr.ip(), |a| a.ip());
    let moved = splice_paced(
        s,
        other,
        st.cfg.idle_timeout,
        pace(peer.ip()),
        pace(receiver_ip),
    );
    inc(&st.metrics.splices);
    let m = &st.metrics;
    m.splice_bytes_forward
        .fetch_add(moved.forward, Ordering::Relaxed);
    m.splice_bytes_back.fetch_add(moved.back, Ordering::Relaxed);
    log(
        st,
        format_args!(
            "splice end nameplate={nameplate} port={port} sender={peer} sender->receiver={} bytes receiver->sender={} bytes",
            moved.forward, moved.back
        ),
    );
}

fn join(st: &Arc<State>, mut s: TcpStream, peer: SocketAddr, id: u64, slot: Slot) {
    let p = lock(&st.pending).remove(&id);
    match p {
        Some(p) if p.agent.addr.ip() == peer.ip() => match p.tx.try_send(Ok((s, slot))) {
            Ok(()) => {}
            Err(TrySendError::Full(j) | TrySendError::Disconnected(j)) => {
                if let Ok((mut s, _)) = j {
                    reply(st, &mut s, "timeout", "the sender is gone");
                }
            }
        },
        Some(p) => {
            lock(&st.pending).insert(id, p);
            reply(st, &mut s, "no_such_splice", "unknown splice");
        }
        None => reply(st, &mut s, "no_such_splice", "unknown splice"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{self, AgentEvent, RelayError};
    use crate::code::Code;
    use hurtle_engine::{OwnPorts, ReceiveOptions, Receiver};
    use std::io::{Read, Write};
    use std::sync::mpsc::{channel, Receiver as Events};

    const WAIT: Duration = Duration::from_secs(10);

    /// A relay on loopback, serving from a background thread for the rest of the test process.
    pub(super) fn relay(cfg: Config) -> SocketAddr {
        let server = Server::bind("127.0.0.1:0".parse().unwrap(), cfg).unwrap();
        let addr = server.local_addr().unwrap();
        std::thread::spawn(move || server.run());
        addr
    }

    #[test]
    fn a_relay_binds_one_port_for_tcp_and_udp_and_says_when_its_udp_is_taken() {
        let (tcp, udp) = bind_pair("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = tcp.local_addr().unwrap().port();
        assert_eq!(udp.local_addr().port(), port);
        drop(tcp);
        // The UDP port still held: asked for by number, it is not swapped for another.
        let e = bind_pair(SocketAddr::from(([127, 0, 0, 1], port))).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
    }

    pub(super) fn cfg() -> Config {
        Config {
            lookup_burst: 100,
            lookup_per_sec: 100.0,
            log: false,
            ..Config::default()
        }
    }

    /// A real receiver's control listener (so its agent will dial it), and its ports.
    pub(super) struct Local {
        _out: tempfile::TempDir,
        _receiver: Receiver,
        pub(super) control: SocketAddr,
        pub(super) ports: Arc<OwnPorts>,
    }

    pub(super) fn local_receiver() -> Local {
        let out = tempfile::tempdir().unwrap();
        let opts = ReceiveOptions {
            out_dir: out.path().to_path_buf(),
            ..ReceiveOptions::default()
        };
        let ports = opts.own_ports.clone();
        let receiver = Receiver::bind("127.0.0.1:0".parse().unwrap(), opts).unwrap();
        let control = receiver.local_addr().unwrap();
        Local {
            _out: out,
            _receiver: receiver,
            control,
            ports,
        }
    }

    /// Registers `control` at `relay` and starts its agent.
    pub(super) fn register(
        relay: SocketAddr,
        control: SocketAddr,
        ports: Arc<OwnPorts>,
    ) -> (Code, client::Agent, Events<AgentEvent>) {
        let reg = client::register(relay, control, 2).unwrap();
        let code = reg.code.clone();
        let (tx, rx) = channel();
        let agent = reg
            .start_agent(control.ip(), ports, move |e| {
                let _ = tx.send(e);
            })
            .unwrap();
        (code, agent, rx)
    }

    fn refused_kind(e: RelayError) -> (String, String) {
        match e {
            RelayError::Refused { kind, message } => (kind, message),
            e => panic!("expected the relay's refusal, got {e}"),
        }
    }

    pub(super) fn next_event(rx: &Events<AgentEvent>) -> AgentEvent {
        rx.recv_timeout(WAIT).expect("an agent event")
    }

    /// Bytes seen in one direction of one connection.
    type Tape = Arc<Mutex<Vec<u8>>>;

    /// The bytes of every connection through a proxy, each direction apart.
    #[derive(Default)]
    struct Captured {
        /// Per connection: (client to relay, relay to client).
        conns: Mutex<Vec<(Tape, Tape)>>,
    }

    fn copy_into(mut from: TcpStream, mut to: TcpStream, log: Tape) {
        let mut buf = [0u8; 4096];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    lock(&log).extend_from_slice(&buf[..n]);
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    }

    /// A proxy in front of `upstream` that records everything.
    fn capturing_proxy(upstream: SocketAddr) -> (SocketAddr, Arc<Captured>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let captured = Arc::new(Captured::default());
        let c = captured.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let relay = TcpStream::connect(upstream).unwrap();
                let (up, down) = (Arc::default(), Arc::default());
                lock(&c.conns).push((Arc::clone(&up), Arc::clone(&down)));
                let (c2, r2) = (client.try_clone().unwrap(), relay.try_clone().unwrap());
                std::thread::spawn(move || copy_into(client, relay, up));
                std::thread::spawn(move || copy_into(r2, c2, down));
            }
        });
        (addr, captured)
    }

    /// Every whole frame at the start of `bytes`, up to `spliced` (raw bytes may follow).
    fn frames(bytes: &[u8]) -> Vec<Msg> {
        let mut msgs = Vec::new();
        let mut at = 0;
        while let Some((m, used)) = wire::decode(&bytes[at..]).unwrap() {
            at += used;
            let end = m == Msg::Spliced;
            msgs.push(m);
            if end {
                break;
            }
        }
        msgs
    }

    /// Runs of at least `min` hex digits in `text`.
    fn hex_runs(text: &str, min: usize) -> Vec<String> {
        text.split(|c: char| !c.is_ascii_hexdigit())
            .filter(|r| r.len() >= min)
            .map(String::from)
            .collect()
    }

    #[test]
    fn the_relay_gets_the_nameplate_and_nothing_derived_from_the_words() {
        let upstream = relay(cfg());
        let (proxy, captured) = capturing_proxy(upstream);
        let local = local_receiver();
        // Registration, agent, lookup, a relayed connection: the whole conversation, through
        // the proxy (the agent joins through it too: it dials the relay it registered with).
        let (code, agent, events) = register(proxy, local.control, local.ports.clone());
        let found = client::lookup(proxy, code.nameplate).unwrap();
        let dialer = found.into_dialer(None);
        let spliced = dialer.dial(local.control, WAIT).unwrap();
        match next_event(&events) {
            AgentEvent::Paired { relayed, .. } => assert_eq!(relayed, Some(true)),
            e => panic!("expected paired, got {e:?}"),
        }
        drop(spliced);
        agent.stop();
        std::thread::sleep(Duration::from_millis(200));

        let conns: Vec<(Vec<u8>, Vec<u8>)> = lock(&captured.conns)
            .iter()
            .map(|(up, down)| (lock(up).clone(), lock(down).clone()))
            .collect();
        assert_eq!(conns.len(), 4, "register, lookup, splice, join");
        let tickets: Vec<String> = conns
            .iter()
            .flat_map(|(_, down)| frames(down))
            .filter_map(|m| match m {
                Msg::Found { ticket, .. } => Some(ticket),
                _ => None,
            })
            .collect();
        assert_eq!(tickets.len(), 1);
        // The relay's own numbers, which the clients echo: the ticket and the splice ids.
        let mut echoed: Vec<String> = conns
            .iter()
            .flat_map(|(_, down)| frames(down))
            .filter_map(|m| match m {
                Msg::Dial { id, .. } => Some(id.to_string()),
                _ => None,
            })
            .collect();
        echoed.push(tickets[0].clone());
        // What the clients said, message by message: nothing but these fields.
        let mut kinds = Vec::new();
        for (up, _) in &conns {
            for m in frames(up) {
                match &m {
                    Msg::Register { port, candidates } => {
                        assert_eq!(*port, local.control.port());
                        assert!(candidates.iter().all(|c| c.port() == *port), "{m:?}");
                    }
                    Msg::Lookup { nameplate } => assert_eq!(*nameplate, code.nameplate),
                    Msg::Path { relayed } => assert!(relayed),
                    Msg::Splice { ticket, port } => {
                        assert_eq!(ticket, &tickets[0]);
                        assert_eq!(*port, local.control.port());
                    }
                    Msg::Join { .. } | Msg::Ping => {}
                    m => panic!("a client sent {m:?}"),
                }
                kinds.push(std::mem::discriminant(&m));
            }
        }
        assert!(kinds.len() >= 5, "{kinds:?}");
        // And as bytes, both ways: no word, no code, no 32-byte value in hex.
        let vocabulary = serde_json::to_string(&[
            Msg::Register {
                port: 1,
                candidates: vec![],
            },
            Msg::Registered {
                ttl_secs: 1,
                idle_secs: 1,
            },
            Msg::Lookup { nameplate: 1 },
            Msg::Found {
                ticket: String::new(),
                candidates: vec![],
            },
            Msg::Paired {
                sender: upstream,
                relayed: None,
            },
        ])
        .unwrap();
        for (up, down) in &conns {
            for (dir, bytes) in [("to the relay", up), ("from the relay", down)] {
                let text = String::from_utf8_lossy(bytes).to_ascii_lowercase();
                assert!(!text.contains(&code.to_string()), "{dir}: {text}");
                for w in &code.words {
                    // (A word that is part of the protocol's own vocabulary cannot be told
                    // apart; there is none today, but the word list may grow.)
                    if !vocabulary.contains(w) {
                        assert!(!text.contains(w), "{w:?} {dir}: {text}");
                    }
                }
                assert!(hex_runs(&text, 64).is_empty(), "{dir}: {text}");
                if dir == "to the relay" {
                    for run in hex_runs(&text, 16) {
                        assert!(echoed.contains(&run), "{run} {dir}: {text}");
                    }
                }
            }
        }
    }

    #[test]
    fn an_offer_is_answered_never_looked_up_and_a_mismatch_cancels_only_its_answer() {
        let relay = relay(cfg());
        let offering = client::offer(relay, 2).unwrap();
        let offered = offering.code.clone();
        let (tx, offer_events) = channel();
        let offer = offering
            .start(move |e| {
                let _ = tx.send(e);
            })
            .unwrap();
        // A sender's lookup never finds an offer: its sender is no receiver.
        let (kind, _) = refused_kind(client::lookup(relay, offered.nameplate).unwrap_err());
        assert_eq!(kind, "no_such_code");
        // An answer never finds a receiver's registration.
        let control: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let (printed, _agent, _events) = register(relay, control, Arc::default());
        let e = client::register_answer(relay, control, &printed)
            .err()
            .unwrap();
        assert_eq!(refused_kind(e).0, "no_such_code");
        // A receiver answers the offer: the offer hears where to look it up.
        let answering: SocketAddr = "127.0.0.1:10".parse().unwrap();
        let reg = client::register_answer(relay, answering, &offered).unwrap();
        assert_eq!(reg.code, offered, "the answer's code is the offer's");
        let (tx, events) = channel();
        let _answer_agent = reg
            .start_agent(answering.ip(), Arc::default(), move |e| {
                let _ = tx.send(e);
            })
            .unwrap();
        let client::OfferEvent::Answered(n) = offer_events.recv_timeout(WAIT).unwrap() else {
            panic!("expected an answer")
        };
        assert_ne!(n, offered.nameplate);
        let found = client::lookup(relay, n).unwrap();
        assert_eq!(found.candidates[0], answering);
        drop(found);
        assert!(matches!(next_event(&events), AgentEvent::Paired { .. }));
        // A mismatch naming a registration that did not answer this offer changes nothing.
        offer.mismatch(printed.nameplate).unwrap();
        // One naming the answer cancels it, and tells its receiver.
        offer.mismatch(n).unwrap();
        assert!(matches!(next_event(&events), AgentEvent::Cancelled(_)));
        assert_eq!(
            refused_kind(client::lookup(relay, n).unwrap_err()).0,
            "no_such_code"
        );
        assert!(client::lookup(relay, printed.nameplate).is_ok());
        // The offer itself stays, for the next receiver.
        let again = client::register_answer(relay, answering, &offered).unwrap();
        assert!(matches!(
            offer_events.recv_timeout(WAIT).unwrap(),
            client::OfferEvent::Answered(m) if m != n
        ));
        drop(again);
        offer.stop();
    }

    #[test]
    fn lookup_waiting_asks_once_a_second_and_gives_up_after_its_wait() {
        let relay = relay(cfg());
        let t0 = Instant::now();
        let mut said = 0;
        let e = client::lookup_waiting(relay, 1234, Duration::from_millis(2500), || said += 1)
            .unwrap_err();
        assert_eq!(refused_kind(e).0, "no_such_code");
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_secs(2) && took < Duration::from_secs(5),
            "{took:?}"
        );
        assert_eq!(said, 1);
        // A code registered while the sender waits is found.
        let control: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let (code, _agent, _events) = register(relay, control, Arc::default());
        let found = client::lookup_waiting(relay, code.nameplate, Duration::ZERO, || {
            panic!("no wait for a registered code")
        })
        .unwrap();
        assert_eq!(found.candidates[0].port(), 9);
    }

    #[test]
    fn no_number_of_lookups_cancels_a_code() {
        let relay = relay(cfg());
        let control: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let (code, _agent, events) = register(relay, control, Arc::default());
        for i in 0..20 {
            let found =
                client::lookup(relay, code.nameplate).unwrap_or_else(|e| panic!("lookup {i}: {e}"));
            assert_eq!(found.candidates[0].port(), 9);
            drop(found);
            assert!(
                matches!(next_event(&events), AgentEvent::Paired { .. }),
                "each lookup tells the agent"
            );
        }
        assert!(
            events.recv_timeout(Duration::from_millis(300)).is_err(),
            "no cancel, nothing more for the agent"
        );
    }

    #[test]
    fn a_lookup_opens_one_connection_to_the_control_port_and_data_ports_are_not_counted() {
        let relay = relay(cfg());
        let local = local_receiver();
        let (code, _agent, events) = register(relay, local.control, local.ports.clone());
        // A stranger guesses the nameplate first, looks it up, goes away.
        drop(client::lookup(relay, code.nameplate).unwrap());
        assert!(matches!(
            next_event(&events),
            AgentEvent::Paired { relayed: None, .. }
        ));
        // The real sender still finds it, and its connection is spliced.
        let real = client::lookup(relay, code.nameplate)
            .unwrap()
            .into_dialer(None);
        assert!(matches!(
            next_event(&events),
            AgentEvent::Paired {
                relayed: Some(true),
                ..
            }
        ));
        let first = real.dial(local.control, WAIT).unwrap();
        // A second key agreement on the same lookup is refused by the relay.
        let again = real.dial(local.control, WAIT).unwrap_err().to_string();
        assert!(
            again.contains("one connection to the receiver's control port"),
            "{again}"
        );
        // A connection to another port (the receiver's TCP data port, say) is not a try: the
        // relay passes the request on (this receiver refuses it, listening on no such port).
        let other = SocketAddr::new(local.control.ip(), local.control.port() ^ 1);
        let refused = real.dial(other, WAIT).unwrap_err().to_string();
        assert!(refused.contains("refused"), "{refused}");
        // A new lookup is a new try.
        let second = client::lookup(relay, code.nameplate)
            .unwrap()
            .into_dialer(None)
            .dial(local.control, WAIT)
            .unwrap();
        drop((first, second));
    }

    #[test]
    fn expiry_closes_an_unused_codes_agent_and_keeps_a_looked_up_ones() {
        let relay = relay(Config {
            code_ttl: Duration::from_millis(400),
            ..cfg()
        });
        let control: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let (_unused, _a, unused_events) = register(relay, control, Arc::default());
        let (used, _b, used_events) = register(relay, control, Arc::default());
        drop(client::lookup(relay, used.nameplate).unwrap());
        assert!(matches!(
            next_event(&used_events),
            AgentEvent::Paired { .. }
        ));
        assert_eq!(next_event(&unused_events), AgentEvent::Expired);
        assert!(matches!(next_event(&unused_events), AgentEvent::Lost(_)));
        assert_eq!(next_event(&used_events), AgentEvent::Expired);
        assert!(
            used_events
                .recv_timeout(Duration::from_millis(300))
                .is_err(),
            "the looked-up code's agent stays"
        );
        let (kind, _) = refused_kind(client::lookup(relay, used.nameplate).unwrap_err());
        assert_eq!(kind, "no_such_code", "no more lookups after expiry");
    }

    #[test]
    fn lookups_stay_rate_limited_per_ip() {
        let relay = relay(Config {
            lookup_burst: 2,
            lookup_per_sec: 0.01,
            ..cfg()
        });
        let kinds: Vec<String> = (0..3)
            .map(|_| refused_kind(client::lookup(relay, 1234).unwrap_err()).0)
            .collect();
        assert_eq!(kinds, ["no_such_code", "no_such_code", "rate_limited"]);
    }
}

#[cfg(test)]
mod udp_tests {
    use super::tests::{cfg, local_receiver, next_event, register, relay};
    use super::{Config, Server};
    use crate::client::{self, AgentEvent};
    use crate::udp::{bind_request, observe_request, parse_seen};
    use std::net::{SocketAddr, UdpSocket};
    use std::time::Duration;

    fn socket() -> UdpSocket {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        s
    }

    /// Sends `req` to `to` until an answer with `nonce` comes (a datagram can be lost even
    /// on loopback when a buffer is full); the address it names.
    fn ask(s: &UdpSocket, to: SocketAddr, req: &[u8], nonce: [u8; 8]) -> SocketAddr {
        let mut buf = [0u8; 64];
        for _ in 0..10 {
            s.send_to(req, to).unwrap();
            if let Ok((n, from)) = s.recv_from(&mut buf) {
                assert_eq!(from, to);
                if let Some(seen) = parse_seen(&buf[..n], nonce) {
                    return seen;
                }
            }
        }
        panic!("no answer from the relay's UDP port");
    }

    #[test]
    fn the_relay_tells_a_socket_its_address_and_forwards_a_paired_sessions_datagrams() {
        let relay = relay(cfg());
        let local = local_receiver();
        let (code, agent, events) = register(relay, local.control, local.ports.clone());
        let found = client::lookup(relay, code.nameplate).unwrap();
        let (port, mine) = found.allocate_udp(2).unwrap();
        assert_eq!(port, relay.port(), "UDP on the TCP port's number");
        let theirs = loop {
            match next_event(&events) {
                AgentEvent::Udp { port: p, tokens } => {
                    assert_eq!(p, port);
                    break tokens;
                }
                AgentEvent::Paired { .. } => continue,
                e => panic!("expected the UDP tokens, got {e:?}"),
            }
        };
        assert_eq!((mine.len(), theirs.len()), (2, 2));
        let udp = SocketAddr::new(relay.ip(), port);
        // Address discovery: what the relay saw.
        let probe = socket();
        let seen = ask(&probe, udp, &observe_request([3; 8]), [3; 8]);
        assert_eq!(seen, probe.local_addr().unwrap());
        // Each channel's two sockets bind their ends; then each hears the other, unchanged.
        for ch in 0..2 {
            let (s, r) = (socket(), socket());
            assert_eq!(
                ask(&s, udp, &bind_request(&mine[ch], [1; 8]), [1; 8]),
                s.local_addr().unwrap()
            );
            assert_eq!(
                ask(&r, udp, &bind_request(&theirs[ch], [2; 8]), [2; 8]),
                r.local_addr().unwrap()
            );
            let mut buf = [0u8; 2000];
            let data: Vec<u8> = (0..1400u32).map(|i| (i * 7 + ch as u32) as u8).collect();
            s.send_to(&data, udp).unwrap();
            let (n, from) = r.recv_from(&mut buf).unwrap();
            assert_eq!((&buf[..n], from), (&data[..], udp));
            r.send_to(b"nack", udp).unwrap();
            let (n, _) = s.recv_from(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"nack");
            // A socket that bound nothing reaches no one.
            probe.send_to(b"hello?", udp).unwrap();
            assert!(r.recv_from(&mut buf).is_err() && s.recv_from(&mut buf).is_err());
        }
        drop(agent);
    }

    #[test]
    fn the_metrics_endpoint_counts_pairings_allocations_and_forwarded_bytes() {
        let server = Server::bind(
            "127.0.0.1:0".parse().unwrap(),
            Config {
                metrics: Some("127.0.0.1:0".parse().unwrap()),
                ..cfg()
            },
        )
        .unwrap();
        let (relay, metrics) = (server.local_addr().unwrap(), server.metrics_addr().unwrap());
        std::thread::spawn(move || server.run());
        let local = local_receiver();
        let (code, _agent, events) = register(relay, local.control, local.ports.clone());
        let found = client::lookup(relay, code.nameplate).unwrap();
        let (port, mine) = found.allocate_udp(1).unwrap();
        let theirs = loop {
            if let AgentEvent::Udp { tokens, .. } = next_event(&events) {
                break tokens;
            }
        };
        let udp = SocketAddr::new(relay.ip(), port);
        let (s, r) = (socket(), socket());
        ask(&s, udp, &bind_request(&mine[0], [1; 8]), [1; 8]);
        ask(&r, udp, &bind_request(&theirs[0], [2; 8]), [2; 8]);
        let mut buf = [0u8; 2000];
        s.send_to(&[0x21; 1000], udp).unwrap();
        r.recv_from(&mut buf).unwrap();
        // A stranger's datagram is dropped and counted.
        socket().send_to(&[0x21; 10], udp).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let mut c = std::net::TcpStream::connect(metrics).unwrap();
        std::io::Write::write_all(&mut c, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut c, &mut text).unwrap();
        assert!(text.starts_with("HTTP/1.0 200 OK"), "{text}");
        for line in [
            "hurtle_relay_registrations_total 1",
            "hurtle_relay_udp_allocations_total 1",
            "hurtle_relay_udp_allocations 1",
            "hurtle_relay_udp_forwarded_bytes_total 1000",
            "hurtle_relay_udp_dropped_total{reason=\"stranger\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }

    #[test]
    fn allocations_need_the_senders_ticket_and_a_sane_channel_count() {
        let relay = relay(cfg());
        let local = local_receiver();
        let (code, _agent, _events) = register(relay, local.control, local.ports.clone());
        let found = client::lookup(relay, code.nameplate).unwrap();
        assert!(found.allocate_udp(0).is_err());
        assert!(found
            .allocate_udp(crate::wire::MAX_UDP_CHANNELS + 1)
            .is_err());
        // A ticket nobody was given.
        let mut s = std::net::TcpStream::connect(relay).unwrap();
        crate::wire::write_msg(
            &mut s,
            &crate::wire::Msg::Allocate {
                ticket: "00".repeat(16),
                channels: 1,
            },
        )
        .unwrap();
        match crate::wire::read_msg(&mut s).unwrap() {
            crate::wire::Msg::Error { kind, .. } => assert_eq!(kind, "no_such_ticket"),
            m => panic!("{m:?}"),
        }
    }
}
