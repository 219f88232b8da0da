//! Test tooling for the end-to-end suite: running the `hurtle` binary with timeouts, files,
//! an impairing proxy and a hand-driven protocol peer.

pub mod fsx;
pub mod netns;
pub mod peer;
pub mod proc;
pub mod proxy;

use std::time::Duration;

/// A fresh temporary directory named `PREFIX...`, removed when dropped.
pub fn tempdir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(prefix).tempdir().unwrap()
}

/// `rsync ARGS SRC DEST`, the reference the tests compare with, which must exit with one of
/// the `ok` codes; its standard output.
#[allow(dead_code)] // not every test binary uses it
pub fn rsync(args: &[&str], src: &str, dest: &std::path::Path, ok: &[i32]) -> String {
    let out = std::process::Command::new("rsync")
        .args(args)
        .arg(src)
        .arg(dest)
        .output()
        .expect("rsync runs (the test compares with it)");
    assert!(
        out.status.code().is_some_and(|c| ok.contains(&c)),
        "rsync: {out:?}"
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The code every `hurtle` the suite starts is given (in `HURTLE_CODE`), unless a test gives
/// its own.
pub const TEST_CODE: &str = "1234-acorn-bison-cedar";

/// Longest any single transfer in this suite may take before the test fails.
pub const TRANSFER_TIMEOUT: Duration = Duration::from_secs(60);

/// A small seeded random generator (SplitMix64), so files and impairments replay identically.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Fills `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let last = self.next_u64().to_le_bytes();
        rest.copy_from_slice(&last[..rest.len()]);
    }
}

/// Whether tests that need root may run. Not root: fails the test with a clear message, unless
/// `HURTLE_SKIP_ROOT_TESTS=1`, in which case it says the test is skipped and returns false.
pub fn require_root(test: &str) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse::<u32>().ok());
    if euid == Some(0) {
        return true;
    }
    if std::env::var("HURTLE_SKIP_ROOT_TESTS").as_deref() == Ok("1") {
        eprintln!("SKIPPED {test}: needs root (HURTLE_SKIP_ROOT_TESTS=1)");
        return false;
    }
    panic!(
        "{test} needs root (it mounts a tmpfs); run as root or set HURTLE_SKIP_ROOT_TESTS=1 \
         to skip it (effective uid: {euid:?})"
    );
}

/// Asserts that a sender's `--json` summary `v` names what limited it: a `bottleneck` of a
/// known kind, with a line for people.
pub fn assert_named_bottleneck(v: &serde_json::Value) {
    let kind = v["bottleneck"]["kind"].as_str().unwrap_or_default();
    assert!(
        [
            "path",
            "startup",
            "receiver-cpu",
            "receiver-buffers",
            "receiver-disk",
            "receiver-ceiling",
            "rate-cap",
            "sender",
            "fixed-rate"
        ]
        .contains(&kind),
        "{v}"
    );
    assert!(
        !v["bottleneck"]["detail"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "{v}"
    );
}
