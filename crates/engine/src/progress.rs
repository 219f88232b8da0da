//! Live counters a session updates and a user interface reads (from another thread).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
    /// Set by the user interface (on SIGINT or SIGTERM) to end the session: within a fraction
    /// of a second the session tells the peer, keeps what it verified, and returns
    /// [`crate::SessionError::Interrupted`].
    pub interrupt: AtomicBool,
}

impl Progress {
    /// Asks the session to end (see [`Progress::interrupt`]).
    pub fn interrupt(&self) {
        self.interrupt.store(true, Ordering::Relaxed);
    }

    /// Whether the session was asked to end.
    pub fn interrupted(&self) -> bool {
        self.interrupt.load(Ordering::Relaxed)
    }
}
