//! Live counters a session updates and a user interface reads (from another thread).

use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::Mutex;

/// Progress of one session. All counters are monotonic within a session.
#[derive(Debug, Default)]
pub struct Progress {
    /// Bytes the session will move in total (known after the manifest).
    pub total: AtomicU64,
    /// Bytes not moved because the receiver holds them from an interrupted transfer (not in
    /// `total`).
    pub resumed: AtomicU64,
    /// Bytes sent at least once (sender) or received (receiver).
    pub sent: AtomicU64,
    /// Bytes the receiver reports holding.
    pub confirmed: AtomicU64,
    /// Current pacing rate, bits per second (sender).
    pub rate_bps: AtomicU64,
    /// Files confirmed complete.
    pub files_done: AtomicUsize,
    /// The file most recently started.
    pub current: Mutex<String>,
}
