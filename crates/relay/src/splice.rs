//! Copying bytes both ways between two TCP connections until both directions end, or neither
//! has moved a byte for the idle time.

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
        .spawn(move || copy(b2, a2, idle, origin, &l2));
    let forward = copy(a, b, idle, origin, &last);
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
) -> u64 {
    let tick = idle.clamp(Duration::from_millis(50), Duration::from_secs(1));
    let _ = from.set_read_timeout(Some(tick));
    let _ = to.set_write_timeout(Some(idle.max(Duration::from_secs(1))));
    let mut buf = vec![0u8; 64 * 1024];
    let mut moved = 0u64;
    loop {
        match from.read(&mut buf) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return moved;
            }
            Ok(n) => {
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
                let quiet = origin.elapsed().as_millis() as u64 - last.load(Ordering::Relaxed);
                if quiet > idle.as_millis() as u64 {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
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
    fn idle_splices_end() {
        let (_x, x_relay) = pair();
        let (y_relay, _y) = pair();
        let t = Instant::now();
        let m = splice(x_relay, y_relay, Duration::from_millis(200));
        assert_eq!(m, Moved::default());
        assert!(t.elapsed() < Duration::from_secs(3));
    }
}
