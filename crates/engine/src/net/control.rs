//! The TCP control connection: framed [`Control`] messages, one reader and one writer thread.
//!
//! Only the key agreement ([`crate::handshake`]) reads and writes plain frames ([`read_frame`],
//! [`write_frame`]); every frame after it is sealed: the writer thread seals with this side's
//! [`FrameSeal`], the reader thread opens with the peer's [`FrameOpen`], and a frame that fails
//! to open ends the connection ([`FrameError::Unauthentic`]).
//!
//! The session's main loop never blocks on the socket: a reader thread turns incoming frames into
//! a channel of messages, and a writer thread drains a channel of outgoing messages (flushing
//! whenever its queue runs dry), so channel threads can send NACKs without a lock. A
//! [`KeepAlive`] keeps the peer from timing out while this side does slow work before it can
//! answer.

use crossbeam_channel::{unbounded, Receiver, Sender};
use hurtle_proto::secure::{FrameOpen, FrameSeal};
use hurtle_proto::wire::{Control, FrameError};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::TcpStream;
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
) -> io::Result<(Incoming, Sender<Control>, JoinHandle<()>)> {
    stream.set_nodelay(true)?;
    let (rx, _reader) = spawn_reader(stream.try_clone()?, idle, open)?;
    let (tx, writer) = spawn_writer(stream.try_clone()?, seal)?;
    Ok((rx, tx, writer))
}

/// Spawns the reader thread. Each frame (or the error that ended the stream) is delivered in order;
/// after an error the thread exits. `idle` bounds how long the peer may stay silent.
pub fn spawn_reader(
    stream: TcpStream,
    idle: Duration,
    mut open: FrameOpen,
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
                if tx.send(msg).is_err() || stop {
                    return;
                }
            }
        })?;
    Ok((rx, handle))
}

/// Spawns the writer thread. Dropping every [`Sender`] flushes and ends it; a write error ends it
/// too (the reader then reports the broken connection).
pub fn spawn_writer(
    stream: TcpStream,
    mut seal: FrameSeal,
) -> io::Result<(Sender<Control>, JoinHandle<()>)> {
    let (tx, rx) = unbounded::<Control>();
    let handle = std::thread::Builder::new()
        .name("control-tx".into())
        .spawn(move || {
            let mut w = BufWriter::with_capacity(256 * 1024, &stream);
            while let Ok(msg) = rx.recv() {
                if w.write_all(&seal.seal(&msg)).is_err() {
                    return;
                }
                if rx.is_empty() && w.flush().is_err() {
                    return;
                }
            }
            let _ = w.flush();
            let _ = stream.shutdown(std::net::Shutdown::Write);
        })?;
    Ok((tx, handle))
}

/// Sends a [`Control::KeepAlive`] every second until dropped, so that the peer's wait for an
/// answer does not time out while this side does slow work.
pub struct KeepAlive {
    stop: Option<Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl KeepAlive {
    /// Starts sending keep-alives through `tx`.
    pub fn start(tx: Sender<Control>) -> KeepAlive {
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
        let (tx, rx) = unbounded();
        let alive = KeepAlive::start(tx);
        let first = rx.recv_timeout(Duration::from_secs(3)).unwrap();
        assert_eq!(first, Control::KeepAlive);
        drop(alive);
        // Dropping it ends the thread and with it the last sender.
        while let Ok(m) = rx.recv_timeout(Duration::from_secs(3)) {
            assert_eq!(m, Control::KeepAlive);
        }
        assert!(rx.recv().is_err(), "the keep-alive thread still runs");
    }
}
