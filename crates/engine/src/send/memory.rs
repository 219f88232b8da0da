//! What earlier transfers learnt of their paths ([`PathMemory`]: `auto`'s bottleneck and the
//! round-trip time), kept in a small text file so that the next transfer to the same receiver
//! starts near that bottleneck instead of climbing to it from a cold start
//! ([`RateController::resume`] decides whether a memory still fits the path).
//!
//! The file (by default `$XDG_CACHE_HOME/hurtle/paths`, else `~/.cache/hurtle/paths`; see
//! [`PathMemories::default_file`]) has a line per receiver address, oldest first:
//! `ADDRESS BOTTLENECK_BPS RTT_MICROSECONDS SAVED_AT_UNIX_SECONDS`, at most
//! [`MAX_ENTRIES`] of them. It is rewritten whole through a temporary file and a rename, so a
//! reader never sees half of it; two transfers ending at once keep one's line. Anything
//! unreadable in it is passed over: a memory only ever shortens a start, and a transfer never
//! fails for it.
//!
//! [`RateController::resume`]: hurtle_proto::RateController::resume

use hurtle_proto::rate::PathMemory;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Most receivers remembered (the oldest go first).
pub const MAX_ENTRIES: usize = 256;

/// The file of path memories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathMemories {
    file: PathBuf,
}

/// One line of the file.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Entry {
    peer: IpAddr,
    memory: PathMemory,
    saved_at: u64,
}

impl Entry {
    fn parse(line: &str) -> Option<Entry> {
        let mut f = line.split_whitespace();
        let peer = f.next()?.parse().ok()?;
        let bottleneck_bps = f.next()?.parse().ok()?;
        let rtt = Duration::from_micros(f.next()?.parse().ok()?);
        let saved_at = f.next()?.parse().ok()?;
        f.next().is_none().then_some(Entry {
            peer,
            memory: PathMemory {
                bottleneck_bps,
                rtt,
            },
            saved_at,
        })
    }

    fn line(&self) -> String {
        format!(
            "{} {} {} {}\n",
            self.peer,
            self.memory.bottleneck_bps,
            self.memory.rtt.as_micros(),
            self.saved_at
        )
    }
}

fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl PathMemories {
    /// The memories in `file` (which need not exist yet).
    pub fn at(file: impl Into<PathBuf>) -> PathMemories {
        PathMemories { file: file.into() }
    }

    /// `$XDG_CACHE_HOME/hurtle/paths`, or `$HOME/.cache/hurtle/paths` (`None` without either).
    pub fn default_file() -> Option<PathBuf> {
        super::cache_dir().map(|d| d.join("paths"))
    }

    /// The file.
    pub fn file(&self) -> &Path {
        &self.file
    }

    fn entries(&self) -> Vec<Entry> {
        std::fs::read_to_string(&self.file)
            .map(|text| text.lines().filter_map(Entry::parse).collect())
            .unwrap_or_default()
    }

    /// What the last transfer to `peer` learnt, and how long ago (at `now`).
    pub fn recall(&self, peer: IpAddr, now: SystemTime) -> Option<(PathMemory, Duration)> {
        let e = self.entries().into_iter().rev().find(|e| e.peer == peer)?;
        let age = unix_seconds(now).checked_sub(e.saved_at)?;
        Some((e.memory, Duration::from_secs(age)))
    }

    /// Keeps `memory` for `peer` (in place of what was kept for it), saved at `now`.
    pub fn remember(
        &self,
        peer: IpAddr,
        memory: PathMemory,
        now: SystemTime,
    ) -> std::io::Result<()> {
        let mut entries = self.entries();
        entries.retain(|e| e.peer != peer);
        entries.push(Entry {
            peer,
            memory,
            saved_at: unix_seconds(now),
        });
        let skip = entries.len().saturating_sub(MAX_ENTRIES);
        let text: String = entries[skip..].iter().map(Entry::line).collect();
        if let Some(dir) = self.file.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut tmp = self.file.clone().into_os_string();
        tmp.push(format!(".{}.tmp", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let written = std::fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .and_then(|()| std::fs::rename(&tmp, &self.file));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(bps: u64, rtt_ms: u64) -> PathMemory {
        PathMemory {
            bottleneck_bps: bps,
            rtt: Duration::from_millis(rtt_ms),
        }
    }

    #[test]
    fn a_memory_is_recalled_for_its_peer_with_its_age_and_replaced_by_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let m = PathMemories::at(dir.path().join("cache/hurtle/paths"));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "::1".parse().unwrap();
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert_eq!(m.recall(a, t0), None, "no file yet");
        m.remember(a, memory(500_000_000, 150), t0).unwrap();
        m.remember(b, memory(9_000_000_000, 1), t0).unwrap();
        let later = t0 + Duration::from_secs(90);
        assert_eq!(
            m.recall(a, later),
            Some((memory(500_000_000, 150), Duration::from_secs(90)))
        );
        assert_eq!(m.recall(b, later).unwrap().0, memory(9_000_000_000, 1));
        m.remember(a, memory(400_000_000, 160), later).unwrap();
        assert_eq!(
            m.recall(a, later),
            Some((memory(400_000_000, 160), Duration::ZERO))
        );
        let text = std::fs::read_to_string(m.file()).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        // A clock that went back is no age.
        assert_eq!(m.recall(a, t0), None);
    }

    #[test]
    fn garbage_in_the_file_is_passed_over_and_the_file_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let m = PathMemories::at(dir.path().join("paths"));
        let a: IpAddr = "192.0.2.7".parse().unwrap();
        std::fs::write(
            m.file(),
            "not a line\n192.0.2.7 12 x 5\n192.0.2.7 100 2000 1800000000 extra\n\u{0}\u{ff}\n\
             192.0.2.7 300000000 80000 1800000000\n",
        )
        .unwrap();
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_010);
        assert_eq!(m.recall(a, now).unwrap().0, memory(300_000_000, 80));
        for i in 0..(MAX_ENTRIES as u32 + 10) {
            let peer = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            m.remember(peer, memory(1_000_000 + u64::from(i), 10), now)
                .unwrap();
        }
        let text = std::fs::read_to_string(m.file()).unwrap();
        assert_eq!(text.lines().count(), MAX_ENTRIES);
        // The oldest went first, the garbage with them.
        assert_eq!(m.recall(a, now), None);
        assert!(m.recall("10.0.0.9".parse().unwrap(), now).is_none());
        assert!(m.recall("10.0.0.10".parse().unwrap(), now).is_some());
        assert!(m.recall("10.0.1.9".parse().unwrap(), now).is_some());
        // No temporary file left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_file_that_cannot_be_written_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        // Its directory is a file.
        std::fs::write(dir.path().join("hurtle"), b"").unwrap();
        let m = PathMemories::at(dir.path().join("hurtle/paths"));
        assert!(m
            .remember("10.0.0.1".parse().unwrap(), memory(1, 1), SystemTime::now())
            .is_err());
    }
}
