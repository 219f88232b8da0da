//! An impairing man in the middle between a sender and a receiver.
//!
//! Every session is encrypted and authenticated by a code both ends hold (see
//! `hurtle_proto::secure`), so a proxy that only forwards bytes can neither read nor rewrite
//! anything. This one is a *trusted* man in the middle: it holds the suite's code
//! ([`super::TEST_CODE`]) and terminates the key agreement on each leg. It answers the sender's
//! `Agree` as a receiver would and offers to the real receiver as a sender would, so it holds
//! the keys of two sessions: leg A (sender and proxy) and leg B (proxy and receiver). It opens
//! each control frame from one leg and seals it again for the other, rewriting the receiver's
//! `HelloAck` so that the sender's data goes to the proxy's own UDP sockets (one per channel).
//! Each of those opens the sender's datagrams with leg A's data key, seals them with leg B's
//! (the header, packet number included, is kept: each leg has its own key, so nonces stay
//! unique per key) and forwards them to the receiver's real port after seeded random drop,
//! reordering (holding datagrams back a few milliseconds) and duplication. Both legs agree
//! whether data is sealed (the proxy answers the sender with the receiver's wish); with
//! `--no-encryption` on both ends datagrams pass as they are. Its sealers skip the data key's
//! record of numbers sealed (`DataKey::sealer_unchecked`): it seals the sender's numbers and
//! its own injected ones, out of order, and keeps them unique itself.
//!
//! Holding leg B's key, it can inject datagrams that pass the receiver's AEAD and must then be
//! judged by what comes after it, as if a peer sent them: a wrong session id, impossible file
//! ids, offsets or lengths, a far packet number (admission), and forged file bytes (block
//! verification). Injected datagrams use packet numbers no real one of these tests reaches
//! ([`INJECTED_PNS`], [`JUMP_PN`], 0 for the forgery), all within the receiver's replay window
//! of the real ones, so no nonce of leg B is used twice and the real datagrams still open.
//!
//! It can also play a network attacker between itself and the receiver who does *not* hold
//! leg B's key: copies of sealed datagrams with one bit flipped, replays of sealed datagrams,
//! and datagrams sealed with another session's key or made of garbage after a real header.
//! The receiver must drop all of them before admission ("unauthentic").
//!
//! With [`ProxyConfig::capture`] it records every byte it sees ([`Capture`]), so a test can
//! look for what must never be on the wire.

use super::{Rng, TEST_CODE};
use hurtle_engine::net::channel_link::TCP_PREFIX;
use hurtle_proto::secure::{
    self, DataKey, FrameOpen, FrameSeal, Offer, PacketOpen, PacketSeal, Secret, SessionKeys,
    TAG_LEN,
};
use hurtle_proto::wire::{Control, EntryKind, Header, Kind, HEADER_LEN};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest a proxy runs, whatever happens.
const LIFETIME: Duration = Duration::from_secs(120);

/// First packet number of the hostile datagrams the proxy seals with leg B's key (counted up,
/// over all channels). Real packet numbers of the suite's transfers stay far below (a few
/// thousand per channel), and the highest injected one stays within the receiver's replay
/// window (65,536) of packet number 1, so real datagrams that come later still open.
pub const INJECTED_PNS: u64 = 40_000;
/// The packet number of the `pn_jump` datagrams: far ahead of any real one, still within the
/// replay window of packet number 1 (a sealed datagram further ahead would move the window past
/// every real packet number, which only the key's holder can do, and only to its own session).
pub const JUMP_PN: u64 = 60_000;

/// What the proxy does to the traffic.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Seed of the impairment decisions.
    pub seed: u64,
    /// Share of data datagrams dropped.
    pub drop: f64,
    /// Share of data datagrams delivered twice (the copy is the same sealed datagram: the
    /// receiver's replay window drops it).
    pub dup: f64,
    /// Share of data datagrams held back 1 to 8 ms (so later ones overtake them).
    pub reorder: f64,
    /// Once data flows, keep injecting datagrams (sealed with leg B's key) the receiver must
    /// reject: wrong session id, file id out of range, offset past the end, length field not
    /// matching, wrong channel, unknown kind, truncated.
    pub hostile: bool,
    /// Before any data, inject a datagram (sealed with leg B's key) of garbage bytes exactly
    /// where the first datagram of file 0 goes: the receiver takes it, and only block
    /// verification can catch it.
    pub forge: bool,
    /// When data starts, inject on every channel one invalid datagram (file id out of range,
    /// sealed with leg B's key) whose packet number is far ahead and whose timestamp is
    /// skewed: being rejected, it must not count as a sign of loss or queueing in the
    /// receiver's feedback.
    pub pn_jump: bool,
    /// Attacker without leg B's key: share of data datagrams of which a copy with one bit
    /// flipped (in the header, the ciphertext and the tag in turn) is sent ahead of the
    /// original.
    pub flip: f64,
    /// Attacker without leg B's key: share of data datagrams sent again, unchanged, 2 to 6 ms
    /// after the original.
    pub replay: f64,
    /// Attacker without leg B's key: share of data datagrams preceded by an alien one with
    /// the same header: its payload sealed with another session's key, or garbage bytes and
    /// tag, in turn.
    pub alien: f64,
    /// Record every byte seen on both legs ([`Proxy::capture`]).
    pub capture: bool,
    /// Channels whose datagrams (probes too) are all dropped: a path that carries UDP to some
    /// of the receiver's ports and not to others.
    pub silent_channels: Vec<u16>,
    /// The first this many data datagrams that carry file 0's first bytes (the first sent and
    /// its repairs) have those bytes (the first [`CHANGED_BYTES`] of the file) replaced by
    /// the same garbage on the way, sealed again with leg B's key when leg B seals data: what
    /// an on-path attacker can do to data in the clear (`--no-encryption`), or a peer to
    /// sealed data. The same bytes change whatever the datagram's size, so the block comes
    /// out the same each time.
    pub change_first: u64,
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
            flip: 0.0,
            replay: 0.0,
            alien: 0.0,
            capture: false,
            silent_channels: Vec::new(),
            change_first: 0,
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
    /// Datagrams from the sender that did not open with leg A's key (should stay 0).
    pub unopened: AtomicU64,
    /// Copies with a flipped bit sent.
    pub flipped: AtomicU64,
    /// Replayed datagrams sent.
    pub replayed: AtomicU64,
    /// Alien datagrams (another key, or garbage) sent.
    pub alien: AtomicU64,
    /// Frames forwarded on TCP data connections (after a move from UDP).
    pub tcp_frames: AtomicU64,
    /// Datagrams whose payload was changed on the way ([`ProxyConfig::change_first`]).
    pub changed: AtomicU64,
}

impl Stats {
    /// Reads one counter.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// Every byte the proxy saw, when [`ProxyConfig::capture`] is on.
#[derive(Debug, Default)]
pub struct Capture {
    /// Control frames as they came from either end and as the proxy sent them on, one per
    /// entry, the key agreement's included.
    pub control: Vec<Vec<u8>>,
    /// The control messages the proxy opened, encoded in the clear: what the wire would carry
    /// without encryption.
    pub control_plain: Vec<Vec<u8>>,
    /// Datagrams as they came from the sender (leg A).
    pub from_sender: Vec<Vec<u8>>,
    /// Datagrams as the proxy sent them to the receiver (leg B), injected ones included.
    pub to_receiver: Vec<Vec<u8>>,
    /// The sender's datagrams as the proxy opened them (header and payload in the clear).
    pub opened: Vec<Vec<u8>>,
}

/// What the proxy learned about the session from the key agreement and the control frames.
#[derive(Debug, Default)]
struct Session {
    id: u32,
    payload: u16,
    file_sizes: Vec<u64>,
    real_ports: Vec<u16>,
    /// Leg A's data key, which opens the sender's datagrams (`None`: they are plain).
    open_a: Option<DataKey>,
    /// Leg B's data key, which seals what goes to the receiver (`None`: it goes plain).
    seal_b: Option<DataKey>,
    /// Both legs' data keys, which tag the TCP data connections' greetings in any case.
    data_a: Option<DataKey>,
    data_b: Option<DataKey>,
    /// With `forge`: the forged datagrams went to the receiver (the sender's are held until
    /// then, so that the forged ones are read first).
    forged: bool,
}

struct Ctx {
    cfg: ProxyConfig,
    receiver: SocketAddr,
    stats: Arc<Stats>,
    capture: Arc<Mutex<Capture>>,
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

    /// Records what `f` adds, when capturing.
    fn record(&self, f: impl FnOnce(&mut Capture)) {
        if self.cfg.capture {
            f(&mut self.capture.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }

    /// Sends datagram `d` to the receiver at `dest` from `sock`, recording it.
    fn to_receiver(&self, sock: &UdpSocket, d: &[u8], dest: SocketAddr) -> bool {
        self.record(|c| c.to_receiver.push(d.to_vec()));
        sock.send_to(d, dest).is_ok()
    }

    /// Leg B's sealer, when leg B seals data.
    fn seal_b(&self) -> Option<PacketSeal> {
        self.session
            .lock()
            .unwrap()
            .seal_b
            .as_ref()
            .map(DataKey::sealer_unchecked)
    }
}

/// A running proxy; dropping it stops and joins all its threads.
pub struct Proxy {
    addr: SocketAddr,
    stats: Arc<Stats>,
    capture: Arc<Mutex<Capture>>,
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
            capture: Arc::new(Mutex::new(Capture::default())),
            stop: Arc::new(AtomicBool::new(false)),
            deadline: Instant::now() + LIFETIME,
            session: Mutex::new(Session::default()),
            threads: Arc::new(Mutex::new(Vec::new())),
        });
        let proxy = Proxy {
            addr,
            stats: ctx.stats.clone(),
            capture: ctx.capture.clone(),
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

    /// Takes what the proxy recorded so far (with [`ProxyConfig::capture`]).
    pub fn capture(&self) -> Capture {
        std::mem::take(&mut self.capture.lock().unwrap_or_else(|e| e.into_inner()))
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

/// Accepts one sender, connects to the receiver, runs the key agreement on both legs and
/// starts a frame pump each way.
fn accept(ctx: Arc<Ctx>, listener: TcpListener) {
    listener.set_nonblocking(true).unwrap();
    let mut sender = loop {
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
    let Ok(mut receiver) = TcpStream::connect_timeout(&ctx.receiver, Duration::from_secs(5)) else {
        return;
    };
    for s in [&sender, &receiver] {
        s.set_nonblocking(false).unwrap();
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    }
    // Dropping both streams (returning) closes both connections.
    let Some((a, b)) = agree(&ctx, &mut sender, &mut receiver) else {
        return;
    };
    for s in [&sender, &receiver] {
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    }
    {
        let mut s = ctx.session.lock().unwrap();
        s.open_a = a.encrypt_data.then(|| a.data.clone());
        s.seal_b = b.encrypt_data.then(|| b.data.clone());
        s.data_a = Some(a.data.clone());
        s.data_b = Some(b.data.clone());
    }
    let (s2, r2) = (sender.try_clone().unwrap(), receiver.try_clone().unwrap());
    let (a_in, a_out, b_in, b_out) = (a.frames_in, a.frames_out, b.frames_in, b.frames_out);
    ctx.spawn(move |ctx| pump(&ctx, sender, r2, true, a_in, b_out));
    ctx.spawn(move |ctx| pump(&ctx, receiver, s2, false, b_in, a_out));
}

/// Reads one plain frame (the key agreement's): its bytes and its message.
fn read_plain(ctx: &Ctx, s: &mut TcpStream) -> Option<Control> {
    let mut prefix = [0u8; 4];
    s.read_exact(&mut prefix).ok()?;
    let len = Control::frame_len(prefix).ok()?;
    let mut frame = vec![0u8; 4 + len];
    frame[..4].copy_from_slice(&prefix);
    s.read_exact(&mut frame[4..]).ok()?;
    ctx.record(|c| c.control.push(frame.clone()));
    Control::from_body(&frame[4..]).ok()
}

fn write_plain(ctx: &Ctx, s: &mut TcpStream, msg: &Control) -> Option<()> {
    let frame = msg.to_frame();
    ctx.record(|c| c.control.push(frame.clone()));
    s.write_all(&frame).ok()
}

/// Terminates the key agreement on both legs with the suite's code: offers to the receiver as
/// a sender would (passing on the sender's wish for plain data), then answers the sender as a
/// receiver would (passing on the receiver's wish), so that both legs agree whether data is
/// sealed. Returns leg A's keys (the proxy's, as a receiver) and leg B's (as a sender).
fn agree(
    ctx: &Ctx,
    sender: &mut TcpStream,
    receiver: &mut TcpStream,
) -> Option<(SessionKeys, SessionKeys)> {
    let secret = Secret::code(TEST_CODE);
    let first = read_plain(ctx, sender)?;
    let Control::Agree {
        plain_data: sender_plain,
        ..
    } = first
    else {
        return None;
    };
    // The hello comes in the clear behind the offer; it goes on as it came.
    let hello = read_plain(ctx, sender)?;
    if let Control::Hello {
        session, payload, ..
    } = &hello
    {
        let mut s = ctx.session.lock().unwrap();
        s.id = *session;
        s.payload = *payload;
    }
    let (offer, ours) = Offer::new(&secret, sender_plain, &hello);
    write_plain(ctx, receiver, &ours)?;
    write_plain(ctx, receiver, &hello)?;
    let reply = read_plain(ctx, receiver)?;
    let receiver_plain = match &reply {
        Control::Agree { plain_data, .. } => *plain_data,
        // A refusal goes back to the sender as it came.
        _ => return write_plain(ctx, sender, &reply).and(None),
    };
    let b = offer.finish(reply).ok()?;
    let (a, answer) = secure::answer(&secret, &first, &hello, receiver_plain).ok()?;
    write_plain(ctx, sender, &answer)?;
    assert_eq!(
        a.encrypt_data, b.encrypt_data,
        "both legs agree whether data is sealed"
    );
    Some((a, b))
}

/// Forwards frames from `src` to `dst`: opens each with `open` (the leg it came on), looks at
/// it (possibly rewriting it) and seals it with `seal` (the other leg). On EOF, an error or a
/// frame that does not open it closes `dst` for writing, so the close reaches the other side.
fn pump(
    ctx: &Arc<Ctx>,
    mut src: TcpStream,
    mut dst: TcpStream,
    to_receiver: bool,
    mut open: FrameOpen,
    mut seal: FrameSeal,
) {
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
            ctx.record(|c| c.control.push(frame.clone()));
            let prefix = [frame[0], frame[1], frame[2], frame[3]];
            let Ok(msg) = open.open(prefix, frame[4..].to_vec()) else {
                break 'outer;
            };
            ctx.record(|c| c.control_plain.push(msg.to_frame().split_off(4)));
            let msg = if to_receiver {
                on_to_receiver(ctx, msg)
            } else {
                on_to_sender(ctx, msg)
            };
            let out = seal.seal(&msg);
            ctx.record(|c| c.control.push(out.clone()));
            ctx.stats.frames.fetch_add(1, Ordering::Relaxed);
            if dst.write_all(&out).is_err() {
                break 'outer;
            }
        }
    }
    let _ = dst.shutdown(std::net::Shutdown::Write);
}

fn on_to_receiver(ctx: &Arc<Ctx>, msg: Control) -> Control {
    let mut s = ctx.session.lock().unwrap();
    if let Control::Manifest { entries, last } = &msg {
        s.file_sizes.extend(
            entries
                .iter()
                .filter(|e| e.kind == EntryKind::File)
                .map(|e| e.size),
        );
        // The whole manifest: the receiver decides, then reads its sockets. (The sender sends
        // it as soon as it has the keys, beside the receiver's `HelloAck` coming the other way:
        // the attacks wait for the receiver's ports.)
        if *last {
            drop(s);
            ctx.spawn(|ctx| {
                while ctx.running() && ctx.session.lock().unwrap().real_ports.is_empty() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let mut s = ctx.session.lock().unwrap();
                if ctx.cfg.forge {
                    forge(&ctx, &s);
                    s.forged = true;
                }
                if ctx.cfg.pn_jump {
                    pn_jump(&ctx, &s);
                }
                drop(s);
                if ctx.cfg.hostile {
                    ctx.spawn(inject);
                }
            });
        }
    }
    msg
}

fn on_to_sender(ctx: &Arc<Ctx>, msg: Control) -> Control {
    let Control::HelloAck {
        version,
        caps,
        ports,
        payload,
        rate_ceiling,
        recv_buffer,
        recv_buffer_wanted,
        tcp_port,
    } = msg
    else {
        return msg;
    };
    // The TCP data connections the channels may move to go through the proxy too.
    let tcp_port = if tcp_port == 0 {
        0
    } else {
        let l = TcpListener::bind((ctx.receiver.ip(), 0)).unwrap();
        let port = l.local_addr().unwrap().port();
        let dest = SocketAddr::new(ctx.receiver.ip(), tcp_port);
        ctx.spawn(move |ctx| forward_tcp(&ctx, l, dest));
        port
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
        let keys = Legs {
            open: s.open_a.as_ref().map(|k| k.opener(ch as u16)),
            seal: s.seal_b.as_ref().map(DataKey::sealer_unchecked),
        };
        let silent = ctx.cfg.silent_channels.contains(&(ch as u16));
        ctx.spawn(move |ctx| forward(&ctx, sock, dest, Rng::new(seed), keys, silent));
    }
    Control::HelloAck {
        version,
        caps,
        ports: mine,
        payload,
        rate_ceiling,
        recv_buffer,
        recv_buffer_wanted,
        tcp_port,
    }
}

/// Takes the sender's TCP data connections (a move from UDP) and forwards each to the
/// receiver's TCP data port at `dest`.
fn forward_tcp(ctx: &Arc<Ctx>, listener: TcpListener, dest: SocketAddr) {
    listener.set_nonblocking(true).unwrap();
    while ctx.running() {
        match listener.accept() {
            Ok((s, _)) => ctx.spawn(move |ctx| tcp_channel(&ctx, s, dest)),
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// One TCP data connection: its greeting tagged again with leg B's key, each frame opened
/// with leg A's key and sealed with leg B's. Impairments are UDP's only.
fn tcp_channel(ctx: &Ctx, mut from: TcpStream, dest: SocketAddr) {
    let (keys, open_a, seal_b) = {
        let s = ctx.session.lock().unwrap();
        (
            s.data_a.clone().zip(s.data_b.clone()),
            s.open_a.clone(),
            s.seal_b.clone(),
        )
    };
    let Some((key_a, key_b)) = keys else {
        return;
    };
    let _ = from.set_nonblocking(false);
    from.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut g = [0u8; 16 + TAG_LEN];
    if from.read_exact(&mut g).is_err() || !key_a.check_greeting(&g[..16], &g[16..]) {
        return;
    }
    // The greeting: 4 zero bytes, the session id, the channel (2 bytes), zeros.
    let channel = u16::from_be_bytes([g[8], g[9]]);
    let Ok(mut to) = TcpStream::connect(dest) else {
        return;
    };
    let tag = key_b.greeting_tag(&g[..16]);
    g[16..].copy_from_slice(&tag);
    if to.write_all(&g).is_err() {
        return;
    }
    let tag_len = if open_a.is_some() { TAG_LEN } else { 0 };
    let mut legs = Legs {
        open: open_a.as_ref().map(|k| k.opener(channel)),
        seal: seal_b.as_ref().map(DataKey::sealer_unchecked),
    };
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    while ctx.running() {
        match from.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
        // Each frame behind its payload's length (2 bytes), which stays the same.
        while buf.len() >= TCP_PREFIX + HEADER_LEN {
            let len = TCP_PREFIX + HEADER_LEN + usize::from(u16::from_be_bytes([buf[0], buf[1]]));
            if buf.len() < len + tag_len {
                break;
            }
            let mut frame: Vec<u8> = buf.drain(..len + tag_len).collect();
            let Some((_, out)) = legs.reseal(&mut frame[TCP_PREFIX..]) else {
                return;
            };
            if to.write_all(&frame[..TCP_PREFIX]).is_err() || to.write_all(&out).is_err() {
                return;
            }
            ctx.stats.tcp_frames.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One channel's keys: leg A's opener, leg B's sealer (`None`: that leg's data is plain).
struct Legs {
    open: Option<PacketOpen>,
    seal: Option<PacketSeal>,
}

impl Legs {
    /// The sender's datagram `d` opened (header and payload in the clear), and as it goes on
    /// to the receiver; `None` if it does not open.
    fn reseal(&mut self, d: &mut [u8]) -> Option<(Vec<u8>, Vec<u8>)> {
        self.reseal_changed(d, |_| {})
    }

    /// [`reseal`](Self::reseal), the opened datagram changed by `change` before it is sealed
    /// again (the first of the pair is then the changed datagram).
    fn reseal_changed(
        &mut self,
        d: &mut [u8],
        change: impl FnOnce(&mut Vec<u8>),
    ) -> Option<(Vec<u8>, Vec<u8>)> {
        let mut plain = match &mut self.open {
            Some(open) => open.open(d).ok()?.to_vec(),
            None => d.to_vec(),
        };
        change(&mut plain);
        let out = match &mut self.seal {
            Some(seal) => {
                let mut out = plain.clone();
                out.extend_from_slice(&[0u8; TAG_LEN]);
                seal.seal(&mut out).ok()?;
                out
            }
            None => plain.clone(),
        };
        Some((plain, out))
    }
}

/// The attacker between the proxy and the receiver, who does not hold leg B's key.
struct Attacker {
    rng: Rng,
    /// Another session's data key (from an agreement with another code).
    alien_key: DataKey,
    flips: u64,
    aliens: u64,
}

impl Attacker {
    fn new(seed: u64) -> Attacker {
        let other = Secret::code("9999-not-the-suite-code");
        let hello = Control::KeepAlive;
        let (_, offer) = Offer::new(&other, false, &hello);
        let (keys, _) =
            secure::answer(&other, &offer, &hello, false).expect("an agreement with itself");
        Attacker {
            rng: Rng::new(seed ^ 0xa77a_c4e2),
            alien_key: keys.data,
            flips: 0,
            aliens: 0,
        }
    }

    /// `sealed` with one bit flipped: in the header, the ciphertext and the tag in turn.
    fn flipped(&mut self, sealed: &[u8]) -> Vec<u8> {
        let mut f = sealed.to_vec();
        let tag_at = f.len() - TAG_LEN;
        let region = match self.flips % 3 {
            0 => 0..HEADER_LEN,
            1 if tag_at > HEADER_LEN => HEADER_LEN..tag_at,
            _ => tag_at..f.len(),
        };
        self.flips += 1;
        let byte = region.start + self.rng.below(region.len() as u64) as usize;
        f[byte] ^= 1 << self.rng.below(8);
        f
    }

    /// A datagram with the header of `plain` (the real one, packet number included) that is
    /// not the peer's: its payload sealed with another session's key, or garbage bytes and
    /// tag, in turn.
    fn alien(&mut self, plain: &[u8]) -> Vec<u8> {
        let mut a = plain.to_vec();
        a.extend_from_slice(&[0u8; TAG_LEN]);
        if self.aliens.is_multiple_of(2) {
            self.alien_key.sealer_unchecked().seal(&mut a).ok();
        } else {
            self.rng.fill(&mut a[HEADER_LEN..]);
        }
        self.aliens += 1;
        a
    }
}

/// One channel: sender's datagrams in, opened, sealed for leg B, impaired (and attacked),
/// out to the receiver's real port.
fn forward(
    ctx: &Ctx,
    sock: UdpSocket,
    dest: SocketAddr,
    mut rng: Rng,
    mut legs: Legs,
    silent: bool,
) {
    sock.set_read_timeout(Some(Duration::from_millis(2)))
        .unwrap();
    let cfg = &ctx.cfg;
    let st = &ctx.stats;
    // The attacks need sealed datagrams to attack.
    let attacks = legs.seal.is_some();
    let mut attacker = Attacker::new(cfg.seed);
    let mut held: Vec<(Instant, Vec<u8>)> = Vec::new();
    let mut replays: Vec<(Instant, Vec<u8>)> = Vec::new();
    let mut buf = vec![0u8; 65536];
    let send = |d: &[u8]| {
        if ctx.to_receiver(&sock, d, dest) {
            st.forwarded.fetch_add(1, Ordering::Relaxed);
        }
    };
    let send_extra = |d: &[u8], counter: &AtomicU64| {
        if ctx.to_receiver(&sock, d, dest) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    };
    while ctx.running() {
        // The sender's early data waits in this socket until the forged datagrams went ahead
        // of it to the receiver (they are forged once the manifest is known).
        if cfg.forge && !ctx.session.lock().unwrap().forged {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        if let Ok((n, _)) = sock.recv_from(&mut buf) {
            if silent {
                st.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            ctx.record(|c| c.from_sender.push(buf[..n].to_vec()));
            let change = |plain: &mut Vec<u8>| change_first(ctx, plain);
            let Some((plain, d)) = legs.reseal_changed(&mut buf[..n], change) else {
                st.unopened.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            ctx.record(|c| c.opened.push(plain.clone()));
            // Probes pass untouched: the path's payload size is not what is being tested.
            if d.first() == Some(&(Kind::Probe as u8)) {
                send(&d);
                continue;
            }
            if attacks && attacker.rng.chance(cfg.flip) {
                send_extra(&attacker.flipped(&d), &st.flipped);
            }
            if attacks && attacker.rng.chance(cfg.alien) {
                send_extra(&attacker.alien(&plain), &st.alien);
            }
            if rng.chance(cfg.drop) {
                st.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if attacks && attacker.rng.chance(cfg.replay) {
                let after = Duration::from_micros(2000 + attacker.rng.below(4000));
                replays.push((Instant::now() + after, d.clone()));
            }
            if rng.chance(cfg.reorder) {
                let hold = Duration::from_micros(1000 + rng.below(7000));
                held.push((Instant::now() + hold, d));
                st.reordered.fetch_add(1, Ordering::Relaxed);
            } else {
                send(&d);
                if rng.chance(cfg.dup) {
                    send(&d);
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
        replays.retain(|(at, d)| {
            if *at <= now {
                send_extra(d, &st.replayed);
                false
            } else {
                true
            }
        });
    }
}

/// How many of file 0's first bytes [`ProxyConfig::change_first`] replaces: fewer than any
/// data datagram carries, so that the block they are in comes out the same each time. The
/// sender's datagrams do not keep one size: the first go out before the path's payload size
/// is probed, and the tail's are cut to leave room for parity (1,396, 8,900 and 8,892 bytes in
/// one run on loopback). Garbage over the whole payload would give the block another wrong
/// value each time the size changes, which is what corruption looks like, not a changed
/// source.
pub const CHANGED_BYTES: usize = 64;

/// With [`ProxyConfig::change_first`]: replaces the first [`CHANGED_BYTES`] of file 0 (at the
/// start of the opened datagram `plain`'s payload) by garbage, the same each time, if it is
/// one of the first so many datagrams to carry them.
fn change_first(ctx: &Ctx, plain: &mut [u8]) {
    let Ok((h, _)) = Header::decode(plain) else {
        return;
    };
    if h.kind != Kind::Data || h.file != 0 || h.offset != 0 || h.len == 0 {
        return;
    }
    let changed = &ctx.stats.changed;
    let mut n = Stats::get(changed);
    loop {
        if n >= ctx.cfg.change_first {
            return;
        }
        match changed.compare_exchange(n, n + 1, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => break,
            Err(now) => n = now,
        }
    }
    let end = plain.len().min(HEADER_LEN + CHANGED_BYTES);
    plain[HEADER_LEN..end].fill(0x5a);
}

/// Builds one data datagram with `payload_len` bytes of `fill` after the header, sealed with
/// leg B's key when leg B seals data (it then passes the receiver's AEAD, as a peer's would).
fn datagram(seal: Option<&PacketSeal>, h: Header, payload_len: usize, fill: u8) -> Vec<u8> {
    let mut d = vec![fill; HEADER_LEN + payload_len];
    h.encode(&mut d);
    sealed(seal, d)
}

/// `d` (header and payload) sealed with `seal`, or as it is without.
fn sealed(seal: Option<&PacketSeal>, mut d: Vec<u8>) -> Vec<u8> {
    if let Some(seal) = seal {
        d.extend_from_slice(&[0u8; TAG_LEN]);
        // Unchecked: it never refuses a number.
        let _ = seal.clone().seal(&mut d);
    }
    d
}

fn data_header(
    session: u32,
    channel: u16,
    packet: u64,
    file: u32,
    offset: u64,
    len: u16,
) -> Header {
    Header {
        kind: Kind::Data,
        flags: 0,
        channel,
        session,
        packet,
        file,
        offset,
        len,
        sent_us: 0,
    }
}

/// Sends garbage bytes where the first datagram of file 0 belongs, on every channel (only the
/// channel that carries that range accepts it; the others count it as rejected). Packet
/// number 0, which a sender never uses: its nonce is the forgery's own, and it spans no packet
/// numbers in the receiver's loss count.
fn forge(ctx: &Ctx, s: &Session) {
    let Some(&size0) = s.file_sizes.first() else {
        return;
    };
    let len = u64::from(s.payload).min(size0) as u16;
    if len == 0 {
        return;
    }
    let seal = s.seal_b.as_ref().map(DataKey::sealer_unchecked);
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    for (ch, &port) in s.real_ports.iter().enumerate() {
        let h = data_header(s.id, ch as u16, 0, 0, 0, len);
        let d = datagram(seal.as_ref(), h, len.into(), 0xa5);
        ctx.to_receiver(&sock, &d, SocketAddr::new(ctx.receiver.ip(), port));
        ctx.stats.forged.fetch_add(1, Ordering::Relaxed);
    }
}

/// Sends one rejected datagram per channel with a packet number far beyond any real one.
fn pn_jump(ctx: &Ctx, s: &Session) {
    let seal = s.seal_b.as_ref().map(DataKey::sealer_unchecked);
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let files = s.file_sizes.len() as u32;
    for (ch, &port) in s.real_ports.iter().enumerate() {
        let mut h = data_header(s.id, ch as u16, JUMP_PN, files + 7, 0, 64);
        h.sent_us = 0x8000_0000;
        let d = datagram(seal.as_ref(), h, 64, 7);
        ctx.to_receiver(&sock, &d, SocketAddr::new(ctx.receiver.ip(), port));
        ctx.stats.injected.fetch_add(1, Ordering::Relaxed);
    }
}

/// Keeps injecting datagrams the receiver must reject, every 5 ms, while data flows.
fn inject(ctx: Arc<Ctx>) {
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let (id, sizes, ports) = {
        let s = ctx.session.lock().unwrap();
        (s.id, s.file_sizes.clone(), s.real_ports.clone())
    };
    let seal = ctx.seal_b();
    let seal = seal.as_ref();
    let size0 = sizes.first().copied().unwrap_or(0);
    let files = sizes.len() as u32;
    let mut pn = INJECTED_PNS;
    let mut next = || {
        pn += 1;
        pn
    };
    for _ in 0..400 {
        if !ctx.running() {
            return;
        }
        for (ch, &port) in ports.iter().enumerate() {
            let ch = ch as u16;
            let mut bad = vec![
                // Foreign session.
                datagram(
                    seal,
                    data_header(id ^ 0xdead_beef, ch, next(), 0, 0, 64),
                    64,
                    1,
                ),
                // File id past the manifest.
                datagram(seal, data_header(id, ch, next(), files + 7, 0, 64), 64, 2),
                // Offset past the end of file 0.
                datagram(
                    seal,
                    data_header(id, ch, next(), 0, size0 + 4096, 64),
                    64,
                    3,
                ),
                // A range that starts inside file 0 but runs past its end.
                datagram(
                    seal,
                    data_header(id, ch, next(), 0, size0.saturating_sub(1), 100),
                    100,
                    4,
                ),
                // Another channel's number (dropped as misdirected before it is opened).
                datagram(
                    seal,
                    data_header(id, ch.wrapping_add(1), next(), 0, 0, 64),
                    64,
                    6,
                ),
            ];
            // Unknown kind.
            let mut kind = vec![0u8; HEADER_LEN];
            data_header(id, ch, next(), 0, 0, 0).encode(&mut kind);
            kind[0] = 9;
            bad.push(sealed(seal, kind));
            // Shorter than a header (too short to be sealed).
            bad.push(vec![1u8; 10]);
            for d in &bad {
                ctx.to_receiver(&sock, d, SocketAddr::new(ctx.receiver.ip(), port));
                ctx.stats.injected.fetch_add(1, Ordering::Relaxed);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
