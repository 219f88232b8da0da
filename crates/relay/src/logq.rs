//! The relay's log lines, written by a thread of their own ([`LogQueue`]): a connection thread
//! hands its line over and goes on, never waiting on a slow or full log (a pipe nobody reads
//! blocks every write to it, and the relay's connection threads with it). At most `capacity`
//! lines wait; past that they are dropped and counted, and the count is written with the next
//! line that goes.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;

/// A bounded queue of log lines and the thread that writes them (see the module docs).
#[derive(Debug, Clone)]
pub struct LogQueue {
    tx: SyncSender<String>,
    dropped: Arc<AtomicU64>,
}

impl LogQueue {
    /// Lines written to `out`, at most `capacity` waiting.
    pub fn new(capacity: usize, mut out: impl Write + Send + 'static) -> std::io::Result<LogQueue> {
        let (tx, rx) = sync_channel::<String>(capacity);
        let dropped = Arc::new(AtomicU64::new(0));
        let lost = dropped.clone();
        std::thread::Builder::new()
            .name("relay-log".into())
            .spawn(move || {
                for line in rx {
                    let n = lost.swap(0, Ordering::Relaxed);
                    if n > 0 {
                        let _ = writeln!(
                            out,
                            "hurtle relay: {n} log lines dropped (the log was not read)"
                        );
                    }
                    let _ = writeln!(out, "hurtle relay: {line}");
                }
            })?;
        Ok(LogQueue { tx, dropped })
    }

    /// Queues `line`; never waits.
    pub fn line(&self, line: String) {
        match self.tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Lines dropped since the last one written.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    /// A writer that blocks until `open` is set, then keeps what it is given.
    struct Gate {
        open: Arc<Mutex<bool>>,
        kept: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gate {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            while !*self.open.lock().unwrap() {
                std::thread::sleep(Duration::from_millis(5));
            }
            self.kept.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_blocked_log_costs_a_writer_nothing_and_what_was_dropped_is_counted() {
        let (open, kept) = (
            Arc::new(Mutex::new(false)),
            Arc::new(Mutex::new(Vec::new())),
        );
        let q = LogQueue::new(
            4,
            Gate {
                open: open.clone(),
                kept: kept.clone(),
            },
        )
        .unwrap();
        let t0 = Instant::now();
        for i in 0..100 {
            q.line(format!("line {i}"));
        }
        assert!(
            t0.elapsed() < Duration::from_millis(500),
            "lines never wait"
        );
        // At most the capacity, and the one the thread holds, went through; the rest counted.
        assert!(q.dropped() >= 100 - 5, "{}", q.dropped());
        *open.lock().unwrap() = true;
        // Once the queued lines are out, a new one goes through (with the count before it).
        let deadline = Instant::now() + Duration::from_secs(5);
        while !String::from_utf8_lossy(&kept.lock().unwrap()).contains("after") {
            assert!(Instant::now() < deadline, "the log thread wrote nothing");
            q.line("after".into());
            std::thread::sleep(Duration::from_millis(10));
        }
        let text = String::from_utf8_lossy(&kept.lock().unwrap()).to_string();
        assert!(text.contains("hurtle relay: line 0"), "{text}");
        assert!(text.contains("log lines dropped"), "{text}");
    }
}
