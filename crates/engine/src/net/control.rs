//! The TCP control connection: framed [`Control`] messages, one reader and one writer thread.
//!
//! Only the key agreement ([`crate::handshake`]) reads and writes plain frames ([`read_frame`],
//! [`write_frame`]); every frame after it is sealed: the writer thread seals with this side's
//! [`FrameSeal`], the reader thread opens with the peer's [`FrameOpen`], and a frame that fails
//! to open ends the connection ([`FrameError::Unauthentic`]).
//!
//! The session's main loop never blocks on the socket: a reader thread turns incoming frames into
//! a channel of messages (and rings a [`Bell`] after each, where the loop polls one beside its
//! sockets: [`open_ringing`]), and a writer thread drains a queue of outgoing messages ([`ControlTx`];
//! flushing whenever the queue runs dry), so channel threads can send NACKs without waiting. A
//! [`KeepAlive`] keeps the peer from timing out while this side does slow work before it can
//! answer.
//!
//! The writer's queue is a mutex and a condition variable rather than a channel: the writer
//! sleeps between the session's few dozen messages a second, and a channel's receive
//! (crossbeam's) spins and yields the CPU several times before it sleeps, each wake-up.

use crate::net::bell::Bell;
use crossbeam_channel::{unbounded, Receiver, Sender};
use hurtle_proto::secure::{FrameOpen, FrameSeal};
use hurtle_proto::wire::{Control, FrameError};
use std::collections::VecDeque;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// Why the control connection failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The peer closed the connection.
    #[error("the peer closed the control connection")]
    Closed,
    /// Nothing arrived within the time allowed.
    #[error("the peer sent nothing on the control connection for {0:?}")]
    Timeout(Duration),
    /// A frame could not be decoded.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// A socket error.
    #[error("control connection: {0}")]
    Io(io::Error),
}

impl From<io::Error> for ControlError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe => ControlError::Closed,
            _ => ControlError::Io(e),
        }
    }
}

/// Reads one frame. Read timeouts set on the stream surface as [`ControlError::Timeout`].
pub fn read_frame(r: &mut impl Read, timeout: Duration) -> Result<Control, ControlError> {
    let (_, body) = read_raw(r, timeout)?;
    Ok(Control::from_body(&body)?)
}

/// Reads one sealed frame and opens it with `open`.
pub fn read_sealed(
    r: &mut impl Read,
    open: &mut FrameOpen,
    timeout: Duration,
) -> Result<Control, ControlError> {
    let (prefix, body) = read_raw(r, timeout)?;
    Ok(open.open(prefix, body)?)
}

/// Reads one frame's length prefix (checked against the limit) and its bytes.
fn read_raw(r: &mut impl Read, timeout: Duration) -> Result<([u8; 4], Vec<u8>), ControlError> {
    let map_timeout = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ControlError::Timeout(timeout),
        _ => ControlError::from(e),
    };
    let mut prefix = [0u8; 4];
    r.read_exact(&mut prefix).map_err(map_timeout)?;
    let len = Control::frame_len(prefix)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(map_timeout)?;
    Ok((prefix, body))
}

/// Writes one frame (unflushed if `w` buffers).
pub fn write_frame(w: &mut impl Write, msg: &Control) -> Result<(), ControlError> {
    w.write_all(&msg.to_frame())?;
    Ok(())
}

/// Incoming control messages, in order; the last item is the error that ended the stream.
pub type Incoming = Receiver<Result<Control, ControlError>>;

/// The writer thread's queue was closed: the thread ended (a write failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the control connection's writer has ended")]
pub struct WriterGone;

/// The sending end of the control writer's queue ([`spawn_writer`]): clone it for each thread
/// that sends; sending never blocks. The writer flushes and ends once every clone is dropped.
pub struct ControlTx {
    queue: Arc<Queue>,
}

/// The queue between the [`ControlTx`]s and the writer thread.
struct Queue {
    state: Mutex<QueueState>,
    /// Signalled when a message comes to a waiting writer, or the last sender goes.
    ready: Condvar,
}

struct QueueState {
    msgs: VecDeque<Control>,
    /// Live [`ControlTx`] clones.
    senders: usize,
    /// The writer waits on `ready` (a send wakes it only then: a wake-up is a system call).
    waiting: bool,
    /// The writer ended: sends fail.
    closed: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ControlTx {
    /// Queues `msg` for the writer; fails only once the writer has ended.
    pub fn send(&self, msg: Control) -> Result<(), WriterGone> {
        let mut state = self.queue.lock();
        if state.closed {
            return Err(WriterGone);
        }
        state.msgs.push_back(msg);
        let wake = std::mem::take(&mut state.waiting);
        drop(state);
        if wake {
            self.queue.ready.notify_one();
        }
        Ok(())
    }
}

impl Clone for ControlTx {
    fn clone(&self) -> Self {
        self.queue.lock().senders += 1;
        ControlTx {
            queue: self.queue.clone(),
        }
    }
}

impl Drop for ControlTx {
    fn drop(&mut self) {
        let mut state = self.queue.lock();
        state.senders -= 1;
        let last = state.senders == 0;
        drop(state);
        if last {
            self.queue.ready.notify_one();
        }
    }
}

/// The writer's end of the queue: closes it when the writer ends, so that sends fail.
struct QueueRx {
    queue: Arc<Queue>,
}

impl QueueRx {
    /// Moves every queued message to `into`, waiting for one first if there is none; false
    /// once the queue is empty and every sender is gone.
    fn take_all(&self, into: &mut VecDeque<Control>) -> bool {
        let mut state = self.queue.lock();
        while state.msgs.is_empty() {
            if state.senders == 0 {
                return false;
            }
            state.waiting = true;
            state = self
                .queue
                .ready
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
        state.waiting = false;
        std::mem::swap(&mut state.msgs, into);
        true
    }

    /// Whether nothing is queued now.
    fn is_empty(&self) -> bool {
        self.queue.lock().msgs.is_empty()
    }
}

impl Drop for QueueRx {
    fn drop(&mut self) {
        let mut state = self.queue.lock();
        state.closed = true;
        state.msgs.clear();
    }
}

/// A writer's queue: the senders' end and the writer's.
fn queue() -> (ControlTx, QueueRx) {
    let queue = Arc::new(Queue {
        state: Mutex::new(QueueState {
            msgs: VecDeque::new(),
            senders: 1,
            waiting: false,
            closed: false,
        }),
        ready: Condvar::new(),
    });
    (
        ControlTx {
            queue: queue.clone(),
        },
        QueueRx { queue },
    )
}

/// Both ends of the control connection on `stream`: `TCP_NODELAY` set, the reader thread (the
/// peer may stay silent for `idle`) and the writer thread, whose handle the caller joins after
/// dropping the sender to flush what it sent last.
/// Frames are sealed with `seal` and opened with `open` (the session's keys, after the
/// agreement).
pub fn open(
    stream: &TcpStream,
    idle: Duration,
    seal: FrameSeal,
    open: FrameOpen,
) -> io::Result<(Incoming, ControlTx, JoinHandle<()>)> {
    open_ringing(stream, idle, (seal, open), None)
}

/// [`open`], whose reader also rings `bell` after each message it delivers (a thread that
/// waits on sockets beside the messages polls the bell: [`crate::net::bell`]).
pub fn open_ringing(
    stream: &TcpStream,
    idle: Duration,
    (seal, open): (FrameSeal, FrameOpen),
    bell: Option<Arc<Bell>>,
) -> io::Result<(Incoming, ControlTx, JoinHandle<()>)> {
    stream.set_nodelay(true)?;
    let (rx, _reader) = spawn_reader_ringing(stream.try_clone()?, idle, open, bell)?;
    let (tx, writer) = spawn_writer(stream.try_clone()?, seal)?;
    Ok((rx, tx, writer))
}

/// Spawns the reader thread. Each frame (or the error that ended the stream) is delivered in order;
/// after an error the thread exits. `idle` bounds how long the peer may stay silent.
pub fn spawn_reader(
    stream: TcpStream,
    idle: Duration,
    open: FrameOpen,
) -> io::Result<(Incoming, JoinHandle<()>)> {
    spawn_reader_ringing(stream, idle, open, None)
}

/// [`spawn_reader`], ringing `bell` after each item it delivers.
fn spawn_reader_ringing(
    stream: TcpStream,
    idle: Duration,
    mut open: FrameOpen,
    bell: Option<Arc<Bell>>,
) -> io::Result<(Incoming, JoinHandle<()>)> {
    stream.set_read_timeout(Some(idle))?;
    let (tx, rx) = unbounded();
    let handle = std::thread::Builder::new()
        .name("control-rx".into())
        .spawn(move || {
            let mut r = BufReader::with_capacity(256 * 1024, stream);
            loop {
                let msg = read_sealed(&mut r, &mut open, idle);
                let stop = msg.is_err();
                let gone = tx.send(msg).is_err();
                if let Some(b) = &bell {
                    b.ring();
                }
                if gone || stop {
                    return;
                }
            }
        })?;
    Ok((rx, handle))
}

/// Spawns the writer thread, which sends each message queued on the [`ControlTx`] in order.
/// Dropping every [`ControlTx`] flushes and ends it; a write error ends it too (the reader then
/// reports the broken connection, and sends fail).
pub fn spawn_writer(stream: TcpStream, seal: FrameSeal) -> io::Result<(ControlTx, JoinHandle<()>)> {
    let (tx, rx) = queue();
    let handle = std::thread::Builder::new()
        .name("control-tx".into())
        .spawn(move || write_queue(rx, &stream, seal))?;
    Ok((tx, handle))
}

/// The writer thread: seals and writes what `rx` brings to `stream`, flushing whenever the
/// queue runs dry, until every sender is gone (then shuts the stream's sending side) or a
/// write fails.
fn write_queue(rx: QueueRx, stream: &TcpStream, mut seal: FrameSeal) {
    let mut w = BufWriter::with_capacity(256 * 1024, stream);
    let mut batch = VecDeque::new();
    while rx.take_all(&mut batch) {
        for msg in batch.drain(..) {
            if w.write_all(&seal.seal(&msg)).is_err() {
                return;
            }
        }
        if rx.is_empty() && w.flush().is_err() {
            return;
        }
    }
    let _ = w.flush();
    let _ = stream.shutdown(std::net::Shutdown::Write);
}

/// Sends a [`Control::KeepAlive`] every second until dropped, so that the peer's wait for an
/// answer does not time out while this side does slow work.
pub struct KeepAlive {
    stop: Option<Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl KeepAlive {
    /// Starts sending keep-alives through `tx`.
    pub fn start(tx: ControlTx) -> KeepAlive {
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        let thread = std::thread::Builder::new()
            .name("keepalive".into())
            .spawn(move || {
                while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(Duration::from_secs(1))
                {
                    if tx.send(Control::KeepAlive).is_err() {
                        return;
                    }
                }
            })
            .ok();
        KeepAlive {
            stop: Some(stop),
            thread,
        }
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_garbage_is_an_error() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &Control::Done).unwrap();
        write_frame(
            &mut buf,
            &Control::Nack {
                channel: 2,
                seq: 1,
                ranges: vec![(1, 2)],
                knew_us: 3,
            },
        )
        .unwrap();
        let mut r = &buf[..];
        let t = Duration::from_secs(1);
        assert_eq!(read_frame(&mut r, t).unwrap(), Control::Done);
        assert!(matches!(
            read_frame(&mut r, t).unwrap(),
            Control::Nack { channel: 2, .. }
        ));
        assert!(matches!(read_frame(&mut r, t), Err(ControlError::Closed)));
        let garbage = [0u8, 0, 0, 3, 0xff, 0xff, 0xff];
        assert!(matches!(
            read_frame(&mut &garbage[..], t),
            Err(ControlError::Frame(_))
        ));
        let huge = [0xffu8, 0xff, 0xff, 0xff];
        assert!(matches!(
            read_frame(&mut &huge[..], t),
            Err(ControlError::Frame(FrameError::TooLong(_)))
        ));
        let truncated = [0u8, 0, 0, 10, 1];
        assert!(matches!(
            read_frame(&mut &truncated[..], t),
            Err(ControlError::Closed)
        ));
    }

    #[test]
    fn keep_alives_come_every_second_until_dropped() {
        let (tx, rx) = queue();
        let alive = KeepAlive::start(tx);
        let mut got = VecDeque::new();
        assert!(rx.take_all(&mut got));
        assert_eq!(got.pop_front(), Some(Control::KeepAlive));
        drop(alive);
        // Dropping it ends the thread and with it the last sender.
        let mut more = 0;
        while rx.take_all(&mut got) {
            assert!(got.drain(..).all(|m| m == Control::KeepAlive));
            more += 1;
            assert!(more < 10, "the keep-alive thread still runs");
        }
    }

    /// A sender's frame sealer and the receiver's opener of the same session, from a key
    /// agreement on loopback.
    fn frame_keys() -> (FrameSeal, FrameOpen) {
        use crate::handshake::{offer, testing, Keyring};
        let (mut s, r) = testing::pair();
        let receiver = std::thread::spawn(move || {
            let mut r = r;
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            testing::receive(&mut r, &Keyring::code("7-a-b"), deadline).unwrap()
        });
        let secret = hurtle_proto::secure::Secret::code("7-a-b");
        let t = Duration::from_secs(5);
        let mut keys = offer(&mut s, &secret, false, &testing::hello(), t).unwrap();
        s.write_all(&keys.frames_out.seal(&Control::KeepAlive))
            .unwrap();
        let got = receiver.join().unwrap();
        (keys.frames_out, got.keys.frames_in)
    }

    /// Both ends of a loopback TCP connection.
    fn tcp_pair() -> (TcpStream, TcpStream) {
        crate::handshake::testing::pair()
    }

    #[test]
    fn a_ringing_reader_rings_its_bell_after_each_message_it_delivers() {
        use crate::net::udp::wait_readable;
        let (mut seal, open) = frame_keys();
        let (ours, mut theirs) = tcp_pair();
        let bell = Arc::new(Bell::new().unwrap());
        let (rx, _reader) =
            spawn_reader_ringing(ours, Duration::from_secs(30), open, Some(bell.clone())).unwrap();
        let rung = |t: Duration| wait_readable([Some(bell.fd())], t).unwrap() & 1 != 0;
        assert!(!rung(Duration::ZERO), "rung before any message");
        theirs.write_all(&seal.seal(&Control::Done)).unwrap();
        assert!(
            rung(Duration::from_secs(10)),
            "a message did not ring the bell"
        );
        bell.answer();
        // The message was queued before the ring.
        assert_eq!(rx.try_recv().unwrap().unwrap(), Control::Done);
        // The connection's end is delivered, and rings, too.
        drop(theirs);
        assert!(
            rung(Duration::from_secs(10)),
            "the end did not ring the bell"
        );
        assert!(rx.try_recv().unwrap().is_err());
    }

    #[test]
    fn the_writer_sends_every_frame_in_order_from_every_sender_and_ends_on_drop() {
        let (seal, mut open) = frame_keys();
        let (ours, theirs) = tcp_pair();
        let (tx, writer) = spawn_writer(ours, seal).unwrap();
        let nack = |seq| Control::Nack {
            channel: 1,
            seq,
            ranges: vec![(seq, seq + 1)],
            knew_us: 0,
        };
        // Two threads send at once, each its own numbers in order; a third sender is dropped
        // unused.
        let threads: Vec<_> = (0..2u64)
            .map(|t| {
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for i in 0..500 {
                        tx.send(nack(t * 1000 + i)).unwrap();
                        if i % 100 == 0 {
                            // Let the writer run dry and wait now and then.
                            std::thread::sleep(Duration::from_millis(2));
                        }
                    }
                })
            })
            .collect();
        drop(tx.clone());
        for t in threads {
            t.join().unwrap();
        }
        tx.send(Control::Done).unwrap();
        drop(tx);
        // Every sender gone: the writer flushes, shuts its side and ends.
        writer.join().unwrap();
        let mut r = BufReader::new(theirs);
        let t = Duration::from_secs(5);
        let mut next = [0u64, 1000];
        for _ in 0..1000 {
            match read_sealed(&mut r, &mut open, t).unwrap() {
                Control::Nack { seq, .. } => {
                    let from = usize::from(seq >= 1000);
                    assert_eq!(seq, next[from], "out of order");
                    next[from] += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(read_sealed(&mut r, &mut open, t).unwrap(), Control::Done);
        assert!(matches!(
            read_sealed(&mut r, &mut open, t),
            Err(ControlError::Closed)
        ));
    }

    #[test]
    fn sending_fails_once_the_writer_has_ended() {
        let (seal, _) = frame_keys();
        let (ours, theirs) = tcp_pair();
        let (tx, writer) = spawn_writer(ours, seal).unwrap();
        // The peer is gone: a write fails, sooner or later (the first may still be buffered
        // by the kernel), and ends the writer.
        drop(theirs);
        let t = std::time::Instant::now();
        while tx.send(Control::KeepAlive).is_ok() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the writer never ended"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        writer.join().unwrap();
        assert_eq!(tx.send(Control::Done), Err(WriterGone));
    }
}
