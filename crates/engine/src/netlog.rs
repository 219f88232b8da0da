//! Per-channel network logs (`--log-dir`): what MCDTP calls the network logger.
//!
//! One text file per channel and side (`send-ch03.log`, `recv-ch03.log`), one line per event
//! with microseconds since the session started: batches sent and received, losses detected,
//! NACKs, repairs, final markers, verification results. The sender also writes `send-rate.log`:
//! each receiver report and what the rate controller made of it. Lines are per batch or report,
//! never per datagram, and nothing is formatted when logging is off.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Instant;

/// A channel's log; a no-op when disabled.
pub struct NetLog {
    out: Option<BufWriter<File>>,
    start: Instant,
}

impl NetLog {
    /// A log that writes nothing.
    pub fn off(start: Instant) -> Self {
        NetLog { out: None, start }
    }

    /// Opens `dir/<side>-chNN.log` (creating `dir`), or a disabled log when `dir` is `None`.
    pub fn open(
        dir: Option<&Path>,
        side: &str,
        channel: u16,
        start: Instant,
    ) -> std::io::Result<Self> {
        Self::open_named(dir, &format!("{side}-ch{channel:02}.log"), start)
    }

    /// Opens `dir/name` (creating `dir`), or a disabled log when `dir` is `None`.
    pub fn open_named(dir: Option<&Path>, name: &str, start: Instant) -> std::io::Result<Self> {
        let Some(dir) = dir else {
            return Ok(Self::off(start));
        };
        std::fs::create_dir_all(dir)?;
        let file = File::create(dir.join(name))?;
        Ok(NetLog {
            out: Some(BufWriter::with_capacity(64 * 1024, file)),
            start,
        })
    }

    /// True when lines are written.
    pub fn enabled(&self) -> bool {
        self.out.is_some()
    }

    /// Writes one line; `f` is only called when logging is on.
    pub fn line(&mut self, f: impl FnOnce() -> String) {
        if let Some(out) = self.out.as_mut() {
            let us = self.start.elapsed().as_micros();
            let _ = writeln!(out, "{us:>12} {}", f());
        }
    }
}

impl Drop for NetLog {
    fn drop(&mut self) {
        if let Some(out) = self.out.as_mut() {
            let _ = out.flush();
        }
    }
}
