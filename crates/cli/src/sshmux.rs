//! The last resort of `hurtle cp`: the TCP connections of one session carried through one byte
//! pipe, the ssh channel (the far process's stdin and stdout), when no port of the other host
//! can be reached directly.
//!
//! This module owns the multiplexer: its frames, its flow control, and its two ends. The
//! dialing end is a [`MuxDialer`], the engine's [`Dialer`]: for each connection the engine
//! asks for, it opens a mux stream that asks the other end to connect to a port on that host's
//! loopback, and hands the engine one end of a loopback socket pair whose other end it pumps
//! into and out of the pipe. The accepting end ([`Accept`]) connects each stream to
//! `IP:PORT` (the receiver's loopback address, at a port the receiver listens on: nothing
//! else) and pumps. It knows nothing of the session inside: what crosses is the session's
//! ciphertext, and the pipe is ssh's.
//!
//! A frame is `[stream id: u32][kind: u8][length: u32][length bytes]`, big-endian, at most
//! [`MAX_DATA`] bytes of payload. Kinds: `OPEN` (payload: the port, u16), `OPENED`, `REFUSED`
//! (payload: why, UTF-8), `DATA`, `CLOSE` (the sender of the frame sends no more on this stream:
//! a half close, as TCP's FIN), `RESET` (the stream is dead both ways) and `CREDIT` (payload:
//! u32 bytes written out, which the other end may send again).
//!
//! Back-pressure: each stream's direction has a window of [`WINDOW`] bytes. A pump sends only
//! within the credit it holds, and the other end queues what arrives (never more than the
//! window) for a thread that writes it to its socket and then returns the credit. So the
//! thread reading the pipe never waits for a socket (one slow connection cannot stall the
//! others) and nothing is queued without bound; a write to the pipe simply blocks while ssh's
//! own flow control holds it. The thread reading the pipe never writes to it either (a rare
//! answer goes from a thread of its own), so the two ends cannot wait on each other.
//!
//! The mux ends when the pipe reaches EOF or breaks: every stream is reset (its socket shut
//! down both ways, so the engine sees the connection end), later dials fail, and `on_end` runs
//! (the far side ends its session there, as it does when its ssh channel closes).

use hurtle_engine::net::dial::Dialer;
use std::collections::{HashMap, VecDeque};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Largest payload of one frame.
pub const MAX_DATA: usize = 32 * 1024;
/// Bytes one direction of a stream may have in flight (sent, not yet written out by the other
/// end).
pub const WINDOW: u32 = 1 << 20;
/// How long the accepting end may take to connect to its port.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

const OPEN: u8 = 1;
const OPENED: u8 = 2;
const REFUSED: u8 = 3;
const DATA: u8 = 4;
const CLOSE: u8 = 5;
const RESET: u8 = 6;
const CREDIT: u8 = 7;

/// Where the accepting end connects the streams it is asked for.
pub struct Accept {
    /// The address to connect to (a loopback address).
    pub ip: IpAddr,
    /// Whether a port may be connected to (the receiver's own ports only).
    pub allow: Box<dyn Fn(u16) -> bool + Send + Sync>,
}

/// One end of a multiplexer over a byte pipe. Dropping it does not end the mux: the pipe's
/// EOF does.
#[derive(Clone)]
pub struct Mux {
    shared: Arc<Shared>,
}

struct Shared {
    /// The pipe's writing end (`None` once closed here).
    out: Mutex<Option<BufWriter<Box<dyn Write + Send>>>>,
    streams: Mutex<HashMap<u32, Arc<Stream>>>,
    /// Dials waiting for `OPENED` or `REFUSED`.
    pending: Mutex<HashMap<u32, mpsc::Sender<Result<(), String>>>>,
    next_id: AtomicU32,
    ended: AtomicBool,
    accept: Option<Accept>,
    /// The threads this mux started and that may still run (finished ones are let go as new
    /// ones start), for [`Mux::join_threads`].
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// One stream: a local socket, pumped both ways.
struct Stream {
    /// The local socket (a clone; each pump has its own).
    sock: TcpStream,
    /// Credit to send to the other end, and whether the stream is dead.
    credit: Mutex<(u32, bool)>,
    credit_cv: Condvar,
    /// What arrived for the socket, for its writer thread; bounded by the window.
    inbound: Mutex<Inbound>,
    inbound_cv: Condvar,
    /// Directions finished (2: the stream is forgotten).
    done: AtomicU8,
}

#[derive(Default)]
struct Inbound {
    queue: VecDeque<Vec<u8>>,
    bytes: usize,
    closed: bool,
    reset: bool,
}

impl Mux {
    /// Starts a mux over `input` and `output` (the two directions of the pipe). With `accept`
    /// this end connects the streams the other end opens; without, it refuses them. `on_end`
    /// runs once, on the thread that read the pipe, when the pipe has reached EOF or failed.
    pub fn start(
        input: impl Read + Send + 'static,
        output: impl Write + Send + 'static,
        accept: Option<Accept>,
        on_end: impl FnOnce() + Send + 'static,
    ) -> Mux {
        let shared = Arc::new(Shared {
            out: Mutex::new(Some(BufWriter::with_capacity(
                MAX_DATA + 64,
                Box::new(output) as Box<dyn Write + Send>,
            ))),
            streams: Mutex::default(),
            pending: Mutex::default(),
            next_id: AtomicU32::new(1),
            ended: AtomicBool::new(false),
            accept,
            threads: Mutex::default(),
        });
        let reader = shared.clone();
        let _ = shared.spawn("sshmux-read", move || {
            let _ = reader.read_loop(BufReader::with_capacity(256 * 1024, input));
            reader.end();
            on_end();
        });
        Mux { shared }
    }

    /// The engine's dialer through this mux.
    pub fn dialer(&self) -> Arc<MuxDialer> {
        Arc::new(MuxDialer { mux: self.clone() })
    }

    /// True once the pipe has ended.
    pub fn ended(&self) -> bool {
        self.shared.ended.load(Ordering::Relaxed)
    }

    /// Waits until every thread this mux started has exited (true), or `timeout` has passed
    /// (false). Threads end once the pipe has ended and the local sockets are done; a test
    /// that must leave nothing running behind it calls this after the mux's end.
    pub fn join_threads(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let finished: Vec<JoinHandle<()>> = {
                let mut threads = self.shared.lock_threads();
                if threads.is_empty() {
                    return true;
                }
                let (done, running) = threads.drain(..).partition(|h| h.is_finished());
                *threads = running;
                done
            };
            for h in finished {
                let _ = h.join();
            }
            if self.shared.lock_threads().is_empty() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits until every stream has finished both ways (what the session wrote is through the
    /// pipe), the pipe has ended, or `timeout` has passed. A process that ends right after its
    /// session calls it, so that its last frames are not lost with it.
    pub fn drain(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline && !self.ended() {
            if self.shared.lock_streams().is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Closes this end's writing half of the pipe (the far process then sees its stdin end),
    /// unless a frame is being written right now (a pipe that does not drain: the caller
    /// ends ssh instead).
    pub fn close(&self) {
        if let Ok(mut out) = self.shared.out.try_lock() {
            if let Some(mut w) = out.take() {
                let _ = w.flush();
            }
        }
    }

    /// Opens a stream to `port` on the other end's host and returns this end's socket of it.
    fn open(&self, port: u16, timeout: Duration) -> io::Result<TcpStream> {
        let s = &self.shared;
        if self.ended() {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the ssh channel has closed",
            ));
        }
        let (outer, inner) = socket_pair()?;
        let id = s.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        s.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tx);
        let stream = Stream::new(inner)?;
        s.lock_streams().insert(id, stream.clone());
        let answer = s
            .send(id, OPEN, &port.to_be_bytes())
            .map_err(|e| e.to_string())
            .and_then(|()| match rx.recv_timeout(timeout) {
                Ok(r) => r,
                Err(mpsc::RecvTimeoutError::Timeout) => Err(format!(
                    "no answer through the ssh channel within {} s",
                    timeout.as_secs_f64()
                )),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    Err("the ssh channel has closed".into())
                }
            });
        s.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        match answer {
            Ok(()) => {
                s.pump(id, stream)?;
                Ok(outer)
            }
            Err(why) => {
                s.lock_streams().remove(&id);
                let _ = s.send(id, RESET, &[]);
                Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!("port {port} through the ssh channel: {why}"),
                ))
            }
        }
    }
}

/// A connected pair of loopback TCP sockets: a listener on 127.0.0.1:0, a connect to it, and
/// the accepted end checked to be that connect.
fn socket_pair() -> io::Result<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let outer = TcpStream::connect(listener.local_addr()?)?;
    let me = outer.local_addr()?;
    loop {
        let (inner, peer) = listener.accept()?;
        if peer == me {
            let _ = inner.set_nodelay(true);
            let _ = outer.set_nodelay(true);
            return Ok((outer, inner));
        }
        // Someone else connected in between: not ours.
    }
}

impl Stream {
    fn new(sock: TcpStream) -> io::Result<Arc<Stream>> {
        Ok(Arc::new(Stream {
            sock,
            credit: Mutex::new((WINDOW, false)),
            credit_cv: Condvar::new(),
            inbound: Mutex::default(),
            inbound_cv: Condvar::new(),
            done: AtomicU8::new(0),
        }))
    }

    /// Kills the stream both ways: its socket shut down, its pumps woken.
    fn reset(&self) {
        let _ = self.sock.shutdown(Shutdown::Both);
        self.credit.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
        self.credit_cv.notify_all();
        let mut q = self.inbound.lock().unwrap_or_else(|e| e.into_inner());
        q.reset = true;
        q.queue.clear();
        self.inbound_cv.notify_all();
    }
}

impl Shared {
    fn lock_streams(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<Stream>>> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_threads(&self) -> std::sync::MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.threads.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a thread of this mux, kept for [`Mux::join_threads`] (the finished ones are let
    /// go here, so a long-lived mux keeps only the running ones).
    fn spawn(&self, name: &str, f: impl FnOnce() + Send + 'static) -> io::Result<()> {
        let handle = std::thread::Builder::new().name(name.into()).spawn(f)?;
        let mut threads = self.lock_threads();
        threads.retain(|h| !h.is_finished());
        threads.push(handle);
        Ok(())
    }

    /// Writes one frame to the pipe (blocking while the pipe is full).
    fn send(&self, id: u32, kind: u8, payload: &[u8]) -> io::Result<()> {
        if self.ended.load(Ordering::Relaxed) {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the ssh channel has closed",
            ));
        }
        let mut head = [0u8; 9];
        head[..4].copy_from_slice(&id.to_be_bytes());
        head[4] = kind;
        head[5..].copy_from_slice(&(payload.len() as u32).to_be_bytes());
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let Some(out) = out.as_mut() else {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the ssh channel was closed here",
            ));
        };
        out.write_all(&head)
            .and_then(|()| out.write_all(payload))
            .and_then(|()| out.flush())
    }

    /// Sends a frame from a thread of its own: for the pipe's reader, which must never block
    /// on the pipe's other direction.
    fn send_later(self: &Arc<Self>, id: u32, kind: u8, payload: Vec<u8>) {
        let me = self.clone();
        let _ = self.spawn("sshmux-answer", move || {
            let _ = me.send(id, kind, &payload);
        });
    }

    fn read_loop(self: &Arc<Self>, mut input: impl Read) -> io::Result<()> {
        let mut head = [0u8; 9];
        loop {
            input.read_exact(&mut head)?;
            let id = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
            let kind = head[4];
            let len = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) as usize;
            if len > MAX_DATA {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("a mux frame of {len} bytes"),
                ));
            }
            let mut payload = vec![0u8; len];
            input.read_exact(&mut payload)?;
            self.on_frame(id, kind, payload);
        }
    }

    fn on_frame(self: &Arc<Self>, id: u32, kind: u8, payload: Vec<u8>) {
        let stream = self.lock_streams().get(&id).cloned();
        match (kind, stream) {
            (OPEN, None) => self.on_open(id, &payload),
            (OPENED, Some(_)) | (REFUSED, Some(_)) => {
                let answer = if kind == OPENED {
                    Ok(())
                } else {
                    Err(String::from_utf8_lossy(&payload).into_owned())
                };
                let waiting = self
                    .pending
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
                // (None: the dial gave up already, and reset the stream.)
                if let Some(tx) = waiting {
                    let _ = tx.send(answer);
                }
            }
            (DATA, Some(s)) => {
                let mut q = s.inbound.lock().unwrap_or_else(|e| e.into_inner());
                if q.reset || q.closed {
                    return;
                }
                if q.bytes + payload.len() > WINDOW as usize {
                    // The other end ignored its credit: this stream cannot be trusted.
                    drop(q);
                    self.kill(id, &s);
                    return;
                }
                q.bytes += payload.len();
                q.queue.push_back(payload);
                s.inbound_cv.notify_all();
            }
            (CLOSE, Some(s)) => {
                s.inbound.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
                s.inbound_cv.notify_all();
            }
            (RESET, Some(s)) => {
                s.reset();
                self.lock_streams().remove(&id);
            }
            (CREDIT, Some(s)) => {
                let n = payload
                    .get(..4)
                    .and_then(|b| b.try_into().ok())
                    .map_or(0, u32::from_be_bytes);
                let mut c = s.credit.lock().unwrap_or_else(|e| e.into_inner());
                c.0 = c.0.saturating_add(n).min(WINDOW);
                s.credit_cv.notify_all();
            }
            // A stream this end does not know (any more): tell the other end to forget it.
            (OPENED | DATA | CLOSE, None) => self.send_later(id, RESET, Vec::new()),
            _ => {}
        }
    }

    /// Resets stream `id` here and at the other end.
    fn kill(self: &Arc<Self>, id: u32, s: &Stream) {
        s.reset();
        self.lock_streams().remove(&id);
        self.send_later(id, RESET, Vec::new());
    }

    /// The other end asks for a connection to a port of this host.
    fn on_open(self: &Arc<Self>, id: u32, payload: &[u8]) {
        let refuse = |why: String| self.send_later(id, REFUSED, why.into_bytes());
        let Some(accept) = &self.accept else {
            return refuse("this end accepts no connections".into());
        };
        let Some(port) = payload
            .get(..2)
            .and_then(|b| b.try_into().ok())
            .map(u16::from_be_bytes)
        else {
            return refuse("no port".into());
        };
        if !(accept.allow)(port) {
            return refuse(format!("port {port} is not one the receiver listens on"));
        }
        let addr = SocketAddr::new(accept.ip, port);
        let me = self.clone();
        let _ = self.spawn("sshmux-connect", move || {
            let connected = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).and_then(|sock| {
                let _ = sock.set_nodelay(true);
                Stream::new(sock)
            });
            match connected {
                Ok(stream) => {
                    me.lock_streams().insert(id, stream.clone());
                    if me.send(id, OPENED, &[]).is_ok() && me.pump(id, stream).is_err() {
                        if let Some(s) = me.lock_streams().remove(&id) {
                            s.reset();
                        }
                        let _ = me.send(id, RESET, &[]);
                    }
                }
                Err(e) => {
                    let _ = me.send(
                        id,
                        REFUSED,
                        format!("cannot connect to {addr}: {e}").as_bytes(),
                    );
                }
            }
        });
    }

    /// Starts the two pumps of an open stream.
    fn pump(self: &Arc<Self>, id: u32, stream: Arc<Stream>) -> io::Result<()> {
        let reading = stream.sock.try_clone()?;
        let (me, s) = (self.clone(), stream.clone());
        self.spawn("sshmux-out", move || me.pump_out(id, &s, reading))?;
        let (me, s) = (self.clone(), stream);
        self.spawn("sshmux-in", move || me.pump_in(id, &s))
    }

    /// One direction of a stream is done; both: the stream is forgotten.
    fn finished(&self, id: u32, s: &Arc<Stream>) {
        if s.done.fetch_add(1, Ordering::AcqRel) == 1 {
            let mut streams = self.lock_streams();
            if streams.get(&id).is_some_and(|t| Arc::ptr_eq(t, s)) {
                streams.remove(&id);
            }
        }
    }

    /// Socket to pipe, within the credit the other end gave.
    fn pump_out(self: &Arc<Self>, id: u32, s: &Arc<Stream>, mut sock: TcpStream) {
        let mut buf = vec![0u8; MAX_DATA];
        loop {
            let credit = {
                let mut c = s.credit.lock().unwrap_or_else(|e| e.into_inner());
                while c.0 == 0 && !c.1 {
                    c = s.credit_cv.wait(c).unwrap_or_else(|e| e.into_inner());
                }
                if c.1 {
                    break;
                }
                c.0
            };
            let want = buf.len().min(credit as usize);
            match sock.read(&mut buf[..want]) {
                Ok(0) => {
                    let _ = self.send(id, CLOSE, &[]);
                    break;
                }
                Ok(n) => {
                    s.credit.lock().unwrap_or_else(|e| e.into_inner()).0 -= n as u32;
                    if self.send(id, DATA, &buf[..n]).is_err() {
                        s.reset();
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    // The local end reset its connection: so does the stream.
                    if !s.credit.lock().unwrap_or_else(|e| e.into_inner()).1 {
                        s.reset();
                        let _ = self.send(id, RESET, &[]);
                    }
                    break;
                }
            }
        }
        self.finished(id, s);
    }

    /// Pipe to socket, returning the credit as the bytes are written.
    fn pump_in(self: &Arc<Self>, id: u32, s: &Arc<Stream>) {
        let mut sock = &s.sock;
        loop {
            let next = {
                let mut q = s.inbound.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if q.reset {
                        break None;
                    }
                    if let Some(chunk) = q.queue.pop_front() {
                        break Some(chunk);
                    }
                    if q.closed {
                        break None;
                    }
                    q = s.inbound_cv.wait(q).unwrap_or_else(|e| e.into_inner());
                }
            };
            let Some(chunk) = next else {
                let _ = sock.shutdown(Shutdown::Write);
                break;
            };
            if sock.write_all(&chunk).is_err() {
                s.reset();
                let _ = self.send(id, RESET, &[]);
                break;
            }
            s.inbound.lock().unwrap_or_else(|e| e.into_inner()).bytes -= chunk.len();
            let _ = self.send(id, CREDIT, &(chunk.len() as u32).to_be_bytes());
        }
        self.finished(id, s);
    }

    /// The pipe has ended: every stream dies, every dial waiting fails.
    fn end(&self) {
        self.ended.store(true, Ordering::Relaxed);
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let streams: Vec<Arc<Stream>> = self.lock_streams().drain().map(|(_, s)| s).collect();
        for s in streams {
            s.reset();
        }
    }
}

/// The engine's [`Dialer`] through a [`Mux`]: each connection is a mux stream to the asked
/// port on the other end's loopback (the IP the engine names is ignored). Datagrams cannot
/// cross the pipe, so the session uses parallel TCP.
pub struct MuxDialer {
    mux: Mux,
}

impl std::fmt::Debug for MuxDialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MuxDialer")
    }
}

impl Dialer for MuxDialer {
    fn dial(&self, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        self.mux.open(addr.port(), timeout)
    }

    fn tcp_only(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    /// Two mux ends joined by a socket pair: (dialing end, accepting end reaching `allow`).
    /// Also returns the near end of the pipe, to cut it.
    fn pair(allow: u16) -> (Mux, Mux, mpsc::Receiver<()>, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        let cut = a.try_clone().unwrap();
        let (ended_tx, ended) = mpsc::channel();
        let near = Mux::start(a.try_clone().unwrap(), a, None, || {});
        let far = Mux::start(
            b.try_clone().unwrap(),
            b,
            Some(Accept {
                ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
                allow: Box::new(move |p| p == allow),
            }),
            move || {
                let _ = ended_tx.send(());
            },
        );
        (near, far, ended, cut)
    }

    #[test]
    fn streams_carry_bytes_both_ways_and_half_close() {
        let server = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = server.local_addr().unwrap().port();
        // An echo server that reads everything, then writes it back reversed in order.
        let echo = std::thread::spawn(move || {
            let mut handles = Vec::new();
            for _ in 0..3 {
                let (mut s, _) = server.accept().unwrap();
                handles.push(std::thread::spawn(move || {
                    let mut all = Vec::new();
                    s.read_to_end(&mut all).unwrap();
                    all.reverse();
                    s.write_all(&all).unwrap();
                }));
            }
            handles.into_iter().for_each(|h| h.join().unwrap());
        });
        let (near, _far, _, _cut) = pair(port);
        let dialer = near.dialer();
        let clients: Vec<_> = (0..3u8)
            .map(|i| {
                let mut s = dialer
                    .dial(
                        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), port),
                        Duration::from_secs(5),
                    )
                    .unwrap();
                std::thread::spawn(move || {
                    // 5 MiB: several windows, so credit must flow back.
                    let data: Vec<u8> = (0..5 << 20)
                        .map(|k: u32| (k * 7 + u32::from(i)) as u8)
                        .collect();
                    let mut w = s.try_clone().unwrap();
                    let sent = data.clone();
                    let writer = std::thread::spawn(move || {
                        w.write_all(&sent).unwrap();
                        w.shutdown(Shutdown::Write).unwrap();
                    });
                    let mut back = Vec::new();
                    s.read_to_end(&mut back).unwrap();
                    writer.join().unwrap();
                    let mut want = data;
                    want.reverse();
                    assert!(back == want, "stream {i}: {} bytes back", back.len());
                })
            })
            .collect();
        clients.into_iter().for_each(|c| c.join().unwrap());
        echo.join().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !near.shared.lock_streams().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(near.shared.lock_streams().is_empty(), "streams forgotten");
    }

    #[test]
    fn other_ports_are_refused_and_the_pipe_s_end_ends_everything() {
        let server = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = server.local_addr().unwrap().port();
        let (near, far, far_ended, cut) = pair(port);
        let dialer = near.dialer();
        let to = |p| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p);
        let e = dialer
            .dial(to(port ^ 1), Duration::from_secs(5))
            .unwrap_err();
        assert!(e.to_string().contains("not one the receiver"), "{e}");
        let mut s = dialer.dial(to(port), Duration::from_secs(5)).unwrap();
        let (accepted, _) = server.accept().unwrap();
        // The pipe is cut: both ends see its EOF, the far end says so, and the stream's
        // socket here ends.
        cut.shutdown(Shutdown::Both).unwrap();
        far_ended
            .recv_timeout(Duration::from_secs(5))
            .expect("the far end ended");
        let mut buf = [0u8; 1];
        assert_eq!(s.read(&mut buf).unwrap_or(0), 0);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !near.ended() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(dialer.dial(to(port), Duration::from_secs(1)).is_err());
        // Every thread of both ends exits, the local sockets still open.
        let _open = (s, accepted);
        assert!(
            near.join_threads(Duration::from_secs(5)),
            "near end's threads"
        );
        assert!(
            far.join_threads(Duration::from_secs(5)),
            "far end's threads"
        );
        assert!(near.shared.lock_threads().is_empty());
    }
}
