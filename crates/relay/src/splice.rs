//! Copying bytes both ways between two TCP connections until both directions end, or neither
//! has moved a byte for the idle time; each direction optionally paced (the relay keeps each
//! client address to its byte rate: [`splice_paced`]).
//!
//! On Linux the bytes do not pass through the relay's memory: each direction moves them with
//! `splice(2)` from one socket into a pipe and from the pipe into the other socket (the
//! kernel hands its buffers on); elsewhere, or where no pipe can be had, through a buffer
//! (`read` and `write`).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes moved by a splice: `a` to `b`, and `b` to `a`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moved {
    /// From the first connection to the second.
    pub forward: u64,
    /// From the second connection to the first.
    pub back: u64,
}

/// Copies `a` ⇄ `b` (one extra thread) and returns when both directions are done. A direction
/// ends at end of stream (the other side's write half is shut down), on an error (both
/// connections are shut down), or when nothing moved either way for `idle`.
pub fn splice(a: TcpStream, b: TcpStream, idle: Duration) -> Moved {
    splice_paced(a, b, idle, |_| Duration::ZERO, |_| Duration::ZERO)
}

/// Like [`splice`], each direction paced: after reading `n` bytes from `a` (from `b`), the copy
/// waits what `pace_forward(n)` (`pace_back(n)`) says before writing them on. A wait is cut
/// to the idle time (a pace that asks for more is not honoured beyond it).
pub fn splice_paced(
    a: TcpStream,
    b: TcpStream,
    idle: Duration,
    pace_forward: impl Fn(usize) -> Duration,
    pace_back: impl Fn(usize) -> Duration + Send + 'static,
) -> Moved {
    let origin = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let (a2, b2) = match (a.try_clone(), b.try_clone()) {
        (Ok(a2), Ok(b2)) => (a2, b2),
        _ => {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
            return Moved::default();
        }
    };
    let l2 = last.clone();
    let back = std::thread::Builder::new()
        .name("splice".into())
        .stack_size(128 * 1024)
        .spawn(move || copy(b2, a2, idle, origin, &l2, &pace_back));
    let forward = copy(a, b, idle, origin, &last, &pace_forward);
    let back = match back {
        Ok(h) => h.join().unwrap_or(0),
        Err(_) => 0,
    };
    Moved { forward, back }
}

fn copy(
    mut from: TcpStream,
    mut to: TcpStream,
    idle: Duration,
    origin: Instant,
    last: &AtomicU64,
    pace: &dyn Fn(usize) -> Duration,
) -> u64 {
    let tick = idle.clamp(Duration::from_millis(50), Duration::from_secs(1));
    let _ = from.set_read_timeout(Some(tick));
    let _ = to.set_write_timeout(Some(idle.max(Duration::from_secs(1))));
    #[cfg(target_os = "linux")]
    if let Ok(pipe) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC) {
        return zero_copy(from, to, pipe, (idle, origin, last), pace);
    }
    let mut buf = vec![0u8; 64 * 1024];
    let mut moved = 0u64;
    loop {
        match from.read(&mut buf) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return moved;
            }
            Ok(n) => {
                let wait = pace(n).min(idle);
                if !wait.is_zero() {
                    std::thread::sleep(wait);
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
                moved += n as u64;
                last.store(origin.elapsed().as_millis() as u64, Ordering::Relaxed);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                if idle_past(idle, origin, last) {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    end_both(&from, &to);
    moved
}

/// Whether the splice has been quiet, both ways, for longer than `idle` (`last` is when
/// either way last moved a byte, in milliseconds since `origin`).
fn idle_past(idle: Duration, origin: Instant, last: &AtomicU64) -> bool {
    let quiet = origin.elapsed().as_millis() as u64 - last.load(Ordering::Relaxed);
    quiet > idle.as_millis() as u64
}

/// Ends both connections of one way, so the other way's blocked calls return too.
fn end_both(from: &TcpStream, to: &TcpStream) {
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// Bytes one `splice` into the pipe may take: what the pipe holds once enlarged.
#[cfg(target_os = "linux")]
const PIPE_BYTES: usize = 256 * 1024;

/// [`copy`] with `splice(2)` through `pipe` (its read and write ends): the same ends, waits and
/// pacing, and the bytes never copied into the relay's memory.
#[cfg(target_os = "linux")]
fn zero_copy(
    from: TcpStream,
    to: TcpStream,
    (pipe_out, pipe_in): (std::os::fd::OwnedFd, std::os::fd::OwnedFd),
    (idle, origin, last): (Duration, Instant, &AtomicU64),
    pace: &dyn Fn(usize) -> Duration,
) -> u64 {
    use rustix::io::Errno;
    use rustix::pipe::{fcntl_setpipe_size, splice, SpliceFlags};
    // A larger pipe takes more per call; the default (64 KiB) where the system allows no more.
    let room = fcntl_setpipe_size(&pipe_in, PIPE_BYTES).unwrap_or(64 * 1024);
    let mut moved = 0u64;
    loop {
        match splice(&from, None, &pipe_in, None, room, SpliceFlags::MOVE) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return moved;
            }
            Ok(n) => {
                let wait = pace(n).min(idle);
                if !wait.is_zero() {
                    std::thread::sleep(wait);
                }
                // Everything taken goes on before the next read (the write timeout bounds it).
                let mut left = n;
                while left > 0 {
                    match splice(&pipe_out, None, &to, None, left, SpliceFlags::MOVE) {
                        Ok(0) => break,
                        Ok(m) => left -= m,
                        Err(Errno::INTR) => {}
                        Err(_) => break,
                    }
                }
                if left > 0 {
                    break;
                }
                moved += n as u64;
                last.store(origin.elapsed().as_millis() as u64, Ordering::Relaxed);
            }
            // The read timeout ran out (`EAGAIN`), or a signal: idle for how long?
            Err(Errno::AGAIN | Errno::INTR) => {
                if idle_past(idle, origin, last) {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    end_both(&from, &to);
    moved
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (c, l.accept().unwrap().0)
    }

    #[test]
    fn copies_both_ways_and_half_closes() {
        let (mut x, x_relay) = pair();
        let (y_relay, mut y) = pair();
        let h = std::thread::spawn(move || splice(x_relay, y_relay, Duration::from_secs(5)));
        x.write_all(b"hello").unwrap();
        x.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        y.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"hello");
        y.write_all(b"back!!").unwrap();
        y.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        x.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"back!!");
        assert_eq!(
            h.join().unwrap(),
            Moved {
                forward: 5,
                back: 6
            }
        );
    }

    #[test]
    fn megabytes_cross_both_ways_at_once_unchanged() {
        let (mut x, x_relay) = pair();
        let (y_relay, mut y) = pair();
        let h = std::thread::spawn(move || splice(x_relay, y_relay, Duration::from_secs(5)));
        let data = |seed: u8| -> Vec<u8> {
            (0..8 << 20)
                .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ seed)
                .collect()
        };
        let (there, back) = (data(1), data(2));
        let (mut x2, mut y2) = (x.try_clone().unwrap(), y.try_clone().unwrap());
        let (t1, b1) = (there.clone(), back.clone());
        let wx = std::thread::spawn(move || {
            x2.write_all(&t1).unwrap();
            x2.shutdown(Shutdown::Write).unwrap();
        });
        let wy = std::thread::spawn(move || {
            y2.write_all(&b1).unwrap();
            y2.shutdown(Shutdown::Write).unwrap();
        });
        let (mut at_y, mut at_x) = (Vec::new(), Vec::new());
        y.read_to_end(&mut at_y).unwrap();
        x.read_to_end(&mut at_x).unwrap();
        wx.join().unwrap();
        wy.join().unwrap();
        assert!(at_y == there, "forward bytes changed");
        assert!(at_x == back, "backward bytes changed");
        assert_eq!(
            h.join().unwrap(),
            Moved {
                forward: 8 << 20,
                back: 8 << 20
            }
        );
    }

    #[test]
    fn a_paced_direction_keeps_to_its_pace() {
        let (mut x, x_relay) = pair();
        let (y_relay, mut y) = pair();
        // 100 ms a 10 KiB read, forward; none back.
        let h = std::thread::spawn(move || {
            splice_paced(
                x_relay,
                y_relay,
                Duration::from_secs(5),
                |n| Duration::from_millis(100 * n as u64 / 10_240),
                |_| Duration::ZERO,
            )
        });
        let t = Instant::now();
        let w = std::thread::spawn(move || {
            x.write_all(&[7u8; 50 * 1024]).unwrap();
            x.shutdown(Shutdown::Write).unwrap();
            x
        });
        let mut got = Vec::new();
        y.read_to_end(&mut got).unwrap();
        let took = t.elapsed();
        assert_eq!(got.len(), 50 * 1024);
        assert!(took >= Duration::from_millis(480), "{took:?}");
        drop((w.join().unwrap(), y));
        assert_eq!(h.join().unwrap().forward, 50 * 1024);
    }

    #[test]
    fn idle_splices_end() {
        let (_x, x_relay) = pair();
        let (y_relay, _y) = pair();
        let t = Instant::now();
        let m = splice(x_relay, y_relay, Duration::from_millis(200));
        assert_eq!(m, Moved::default());
        assert!(t.elapsed() < Duration::from_secs(3));
    }
}
