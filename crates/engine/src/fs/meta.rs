//! The metadata a transfer carries beside the bytes: modification times as nanoseconds since
//! the Unix epoch, and the permission bits a receiver applies (never set-ID or sticky bits).

use super::error::StoreError;
use std::fs::Metadata;
use std::io::{self, ErrorKind};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// Permission bits the receiver applies. Set-user-ID, set-group-ID and sticky bits coming from
/// the peer are dropped.
pub(super) const MODE_MASK: u32 = 0o777;

/// Converts nanoseconds since the Unix epoch (possibly negative) to a [`SystemTime`].
pub(super) fn system_time_from_ns(path: &Path, ns: i64) -> Result<SystemTime, StoreError> {
    let d = Duration::from_nanos(ns.unsigned_abs());
    let t = if ns >= 0 {
        SystemTime::UNIX_EPOCH.checked_add(d)
    } else {
        SystemTime::UNIX_EPOCH.checked_sub(d)
    };
    t.ok_or_else(|| StoreError::Io {
        op: "set modification time of",
        path: path.to_path_buf(),
        source: io::Error::new(ErrorKind::InvalidInput, "time out of range"),
    })
}

/// Modification time of `meta` in nanoseconds since the Unix epoch (saturating far outside
/// ±292 years).
pub(crate) fn mtime_ns(meta: &Metadata) -> i64 {
    meta.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.mtime_nsec())
}
