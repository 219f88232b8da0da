//! An impairing man in the middle between a sender and a receiver.
//!
//! The proxy accepts the sender's control connection, connects to the real receiver and
//! forwards frames both ways, rewriting the receiver's `HelloAck` so that the sender's data goes
//! to the proxy's own UDP sockets (one per channel). Each of those forwards datagrams to the
//! receiver's real port after seeded random drop, reordering (holding datagrams back a few
//! milliseconds) and duplication. It can also inject datagrams the receiver must not trust:
//! a wrong session id, impossible file ids, offsets or lengths, and forged file bytes.

use super::Rng;
use hurtle_proto::wire::{Control, EntryKind, Header, Kind, HEADER_LEN};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest a proxy runs, whatever happens.
const LIFETIME: Duration = Duration::from_secs(120);

/// What the proxy does to the traffic.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Seed of the impairment decisions.
    pub seed: u64,
    /// Share of data datagrams dropped.
    pub drop: f64,
    /// Share of data datagrams delivered twice.
    pub dup: f64,
    /// Share of data datagrams held back 1 to 8 ms (so later ones overtake them).
    pub reorder: f64,
    /// Once data flows, keep injecting datagrams the receiver must reject: wrong session id,
    /// file id out of range, offset past the end, length field not matching, wrong channel,
    /// unknown kind, truncated.
    pub hostile: bool,
    /// Before any data, inject a datagram of garbage bytes exactly where the first datagram of
    /// file 0 goes: the receiver takes it, and only block verification can catch it.
    pub forge: bool,
    /// When data starts, inject on every channel one invalid datagram (file id out of range)
    /// whose packet number is far ahead and whose timestamp is skewed: being rejected, it must
    /// not count as a sign of loss or queueing in the receiver's feedback.
    pub pn_jump: bool,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            seed: 1,
            drop: 0.0,
            dup: 0.0,
            reorder: 0.0,
            hostile: false,
            forge: false,
            pn_jump: false,
        }
    }
}

/// Counters of what the proxy did.
#[derive(Debug, Default)]
pub struct Stats {
    /// Datagrams forwarded (duplicates included).
    pub forwarded: AtomicU64,
    /// Datagrams dropped.
    pub dropped: AtomicU64,
    /// Datagrams sent twice.
    pub duplicated: AtomicU64,
    /// Datagrams held back.
    pub reordered: AtomicU64,
    /// Hostile datagrams injected.
    pub injected: AtomicU64,
    /// Forged datagrams injected.
    pub forged: AtomicU64,
    /// Control frames forwarded.
    pub frames: AtomicU64,
}

impl Stats {
    /// Reads one counter.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// What the proxy learned about the session from the control frames.
#[derive(Debug, Default)]
struct Session {
    id: u64,
    payload: u16,
    file_sizes: Vec<u64>,
    real_ports: Vec<u16>,
}

struct Ctx {
    cfg: ProxyConfig,
    receiver: SocketAddr,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
    deadline: Instant,
    session: Mutex<Session>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Ctx {
    fn running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed) && Instant::now() < self.deadline
    }

    fn spawn(self: &Arc<Self>, f: impl FnOnce(Arc<Ctx>) + Send + 'static) {
        let ctx = self.clone();
        let h = std::thread::spawn(move || f(ctx));
        self.threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(h);
    }
}

/// A running proxy; dropping it stops and joins all its threads.
pub struct Proxy {
    addr: SocketAddr,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    /// Starts a proxy in front of the receiver at `receiver`; it serves one sender.
    pub fn start(receiver: SocketAddr, cfg: ProxyConfig) -> Proxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let ctx = Arc::new(Ctx {
            cfg,
            receiver,
            stats: Arc::new(Stats::default()),
            stop: Arc::new(AtomicBool::new(false)),
            deadline: Instant::now() + LIFETIME,
            session: Mutex::new(Session::default()),
            threads: Arc::new(Mutex::new(Vec::new())),
        });
        let proxy = Proxy {
            addr,
            stats: ctx.stats.clone(),
            stop: ctx.stop.clone(),
            threads: ctx.threads.clone(),
        };
        ctx.spawn(move |ctx| accept(ctx, listener));
        proxy
    }

    /// Where the sender should connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What the proxy did so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Threads may start threads; each checks `stop` at least every 50 ms.
        for _ in 0..1000 {
            let Some(h) = self.threads.lock().unwrap_or_else(|e| e.into_inner()).pop() else {
                break;
            };
            let _ = h.join();
        }
    }
}

/// Accepts one sender, connects to the receiver and starts a frame pump each way.
fn accept(ctx: Arc<Ctx>, listener: TcpListener) {
    listener.set_nonblocking(true).unwrap();
    let sender = loop {
        if !ctx.running() {
            return;
        }
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(_) => return,
        }
    };
    let Ok(receiver) = TcpStream::connect_timeout(&ctx.receiver, Duration::from_secs(5)) else {
        return;
    };
    for s in [&sender, &receiver] {
        s.set_nonblocking(false).unwrap();
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    }
    let (s2, r2) = (sender.try_clone().unwrap(), receiver.try_clone().unwrap());
    ctx.spawn(move |ctx| pump(&ctx, sender, r2, true));
    ctx.spawn(move |ctx| pump(&ctx, receiver, s2, false));
}

/// Forwards frames from `src` to `dst`, looking at (and possibly rewriting) each. On EOF or an
/// error it closes `dst` for writing, so the close reaches the other side.
fn pump(ctx: &Arc<Ctx>, mut src: TcpStream, mut dst: TcpStream, to_receiver: bool) {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    'outer: while ctx.running() {
        match src.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
        while buf.len() >= 4 {
            let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if buf.len() < 4 + len {
                break;
            }
            let frame: Vec<u8> = buf.drain(..4 + len).collect();
            let out = match Control::from_body(&frame[4..]) {
                Ok(msg) if to_receiver => on_to_receiver(ctx, msg, frame),
                Ok(msg) => on_to_sender(ctx, msg, frame),
                Err(_) => frame,
            };
            ctx.stats.frames.fetch_add(1, Ordering::Relaxed);
            if dst.write_all(&out).is_err() {
                break 'outer;
            }
        }
    }
    let _ = dst.shutdown(std::net::Shutdown::Write);
}

fn on_to_receiver(ctx: &Arc<Ctx>, msg: Control, frame: Vec<u8>) -> Vec<u8> {
    let mut s = ctx.session.lock().unwrap();
    match msg {
        Control::Hello {
            session, payload, ..
        } => {
            s.id = session;
            s.payload = payload;
        }
        Control::Manifest { entries, .. } => s.file_sizes.extend(
            entries
                .iter()
                .filter(|e| e.kind == EntryKind::File)
                .map(|e| e.size),
        ),
        Control::Start { .. } => {
            if ctx.cfg.pn_jump {
                pn_jump(ctx, &s);
            }
            drop(s);
            if ctx.cfg.hostile {
                ctx.spawn(inject);
            }
        }
        _ => {}
    }
    frame
}

fn on_to_sender(ctx: &Arc<Ctx>, msg: Control, frame: Vec<u8>) -> Vec<u8> {
    // The sender sends data as soon as it has the receiver's answer to the manifest: forged
    // bytes injected before that answer is passed on are queued at the receiver ahead of any
    // real datagram (its channels read them once the skip list has come).
    if matches!(msg, Control::ManifestReply { .. }) && ctx.cfg.forge {
        forge(ctx, &ctx.session.lock().unwrap());
        return frame;
    }
    let Control::HelloAck {
        version,
        caps,
        ports,
        payload,
        rate_ceiling,
    } = msg
    else {
        return frame;
    };
    let mut s = ctx.session.lock().unwrap();
    s.payload = s.payload.min(payload);
    s.real_ports = ports.clone();
    let mut mine = Vec::new();
    for (ch, &port) in ports.iter().enumerate() {
        let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        mine.push(sock.local_addr().unwrap().port());
        let dest = SocketAddr::new(ctx.receiver.ip(), port);
        let seed = ctx.cfg.seed.wrapping_mul(1000).wrapping_add(ch as u64);
        ctx.spawn(move |ctx| forward(&ctx, sock, dest, Rng::new(seed)));
    }
    Control::HelloAck {
        version,
        caps,
        ports: mine,
        payload,
        rate_ceiling,
    }
    .to_frame()
}

/// One channel: sender's datagrams in, impaired datagrams out to the receiver's real port.
fn forward(ctx: &Ctx, sock: UdpSocket, dest: SocketAddr, mut rng: Rng) {
    sock.set_read_timeout(Some(Duration::from_millis(2)))
        .unwrap();
    let cfg = &ctx.cfg;
    let st = &ctx.stats;
    let mut held: Vec<(Instant, Vec<u8>)> = Vec::new();
    let mut buf = vec![0u8; 65536];
    let send = |d: &[u8]| {
        if sock.send_to(d, dest).is_ok() {
            st.forwarded.fetch_add(1, Ordering::Relaxed);
        }
    };
    while ctx.running() {
        if let Ok((n, _)) = sock.recv_from(&mut buf) {
            let d = &buf[..n];
            // Probes pass untouched: the path's payload size is not what is being tested.
            if d.first() == Some(&(Kind::Probe as u8)) {
                send(d);
            } else if rng.chance(cfg.drop) {
                st.dropped.fetch_add(1, Ordering::Relaxed);
            } else if rng.chance(cfg.reorder) {
                let hold = Duration::from_micros(1000 + rng.below(7000));
                held.push((Instant::now() + hold, d.to_vec()));
                st.reordered.fetch_add(1, Ordering::Relaxed);
            } else {
                send(d);
                if rng.chance(cfg.dup) {
                    send(d);
                    st.duplicated.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let now = Instant::now();
        held.retain(|(at, d)| {
            if *at <= now {
                send(d);
                false
            } else {
                true
            }
        });
    }
}

/// Builds one data datagram with `payload_len` bytes of `fill` after the header.
fn datagram(h: Header, payload_len: usize, fill: u8) -> Vec<u8> {
    let mut d = vec![fill; HEADER_LEN + payload_len];
    h.encode(&mut d);
    d
}

fn data_header(session: u64, channel: u16, file: u32, offset: u64, len: u16) -> Header {
    Header {
        kind: Kind::Data,
        flags: 0,
        channel,
        session,
        packet: 1,
        file,
        offset,
        len,
        sent_us: 0,
    }
}

/// Sends garbage bytes where the first datagram of file 0 belongs, on every channel (only the
/// channel that carries that range accepts it; the others count it as rejected).
fn forge(ctx: &Ctx, s: &Session) {
    let Some(&size0) = s.file_sizes.first() else {
        return;
    };
    let len = u64::from(s.payload).min(size0) as u16;
    if len == 0 {
        return;
    }
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    for (ch, &port) in s.real_ports.iter().enumerate() {
        let d = datagram(data_header(s.id, ch as u16, 0, 0, len), len.into(), 0xa5);
        let _ = sock.send_to(&d, SocketAddr::new(ctx.receiver.ip(), port));
        ctx.stats.forged.fetch_add(1, Ordering::Relaxed);
    }
}

/// Sends one rejected datagram per channel with a packet number far beyond any real one.
fn pn_jump(ctx: &Ctx, s: &Session) {
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let files = s.file_sizes.len() as u32;
    for (ch, &port) in s.real_ports.iter().enumerate() {
        let mut h = data_header(s.id, ch as u16, files + 7, 0, 64);
        h.packet = 1 << 40;
        h.sent_us = 0x8000_0000;
        let _ = sock.send_to(
            &datagram(h, 64, 7),
            SocketAddr::new(ctx.receiver.ip(), port),
        );
        ctx.stats.injected.fetch_add(1, Ordering::Relaxed);
    }
}

/// Keeps injecting datagrams the receiver must reject, every 5 ms, while data flows.
fn inject(ctx: Arc<Ctx>) {
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let (id, payload, sizes, ports) = {
        let s = ctx.session.lock().unwrap();
        (s.id, s.payload, s.file_sizes.clone(), s.real_ports.clone())
    };
    let size0 = sizes.first().copied().unwrap_or(0);
    let files = sizes.len() as u32;
    for _ in 0..400 {
        if !ctx.running() {
            return;
        }
        for (ch, &port) in ports.iter().enumerate() {
            let ch = ch as u16;
            let mut bad = vec![
                // Foreign session.
                datagram(data_header(id ^ 0xdead_beef, ch, 0, 0, 64), 64, 1),
                // File id past the manifest.
                datagram(data_header(id, ch, files + 7, 0, 64), 64, 2),
                // Offset past the end of file 0.
                datagram(data_header(id, ch, 0, size0 + 4096, 64), 64, 3),
                // A range that starts inside file 0 but runs past its end.
                datagram(data_header(id, ch, 0, size0.saturating_sub(1), 100), 100, 4),
                // Another channel's number.
                datagram(data_header(id, ch.wrapping_add(1), 0, 0, 64), 64, 6),
            ];
            // Length field claims a full payload, 100 bytes follow.
            let mut short = datagram(data_header(id, ch, 0, 0, payload), 0, 0);
            short.extend_from_slice(&[5u8; 100]);
            bad.push(short);
            // Unknown kind, and a datagram shorter than a header.
            let mut kind = datagram(data_header(id, ch, 0, 0, 0), 0, 0);
            kind[0] = 9;
            bad.push(kind);
            bad.push(vec![1u8; 10]);
            for d in &bad {
                let _ = sock.send_to(d, SocketAddr::new(ctx.receiver.ip(), port));
                ctx.stats.injected.fetch_add(1, Ordering::Relaxed);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
