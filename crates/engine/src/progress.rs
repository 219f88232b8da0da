//! Live counters a session updates and a user interface reads (from another thread).
//!
//! Besides byte counters, a session says which [`Phase`] it is in (so that a display does not
//! show an empty transfer as a finished one while it waits), when data started moving (so
//! that a rate is measured over the transfer, not over the wait), and, per channel, which file
//! it last moved bytes of (so that a display names the files whose bytes are moving now, not
//! the one most recently started or finished). A sender also says which way each channel's
//! datagrams go now ([`Route`]: direct, or through a relay as datagrams or over its TCP
//! splice) and counts the bytes each way carried, per batch sent ([`Progress::count_sent`]);
//! a receiver the same, for the bytes it received ([`Progress::count_route`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where a session is. Set by the engine; a fallback to TCP goes back to an earlier phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Nothing has happened yet: a receiver waits for a sender to connect, a sender reads
    /// the list of files to send.
    Idle = 0,
    /// A sender connects to the receiver.
    Connecting = 1,
    /// Connected: hello, manifest, decisions, preallocation, probing the path. No data yet.
    SettingUp = 2,
    /// Data moves: `total` is known and `sent` counts up to it.
    Moving = 3,
}

/// Which way a channel's datagrams go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Route {
    /// Straight to the receiver (its address, or a path punched through NATs).
    Direct = 0,
    /// As datagrams through a relay's UDP port.
    RelayUdp = 1,
    /// Over parallel TCP through a relay's splice.
    RelayTcp = 2,
}

impl Route {
    /// Every route, in the order of [`Progress::route_bytes`].
    pub const ALL: [Route; 3] = [Route::Direct, Route::RelayUdp, Route::RelayTcp];

    /// `direct`, `relay_udp` or `relay_tcp`.
    pub fn as_str(self) -> &'static str {
        match self {
            Route::Direct => "direct",
            Route::RelayUdp => "relay_udp",
            Route::RelayTcp => "relay_tcp",
        }
    }
}

/// Progress of one session. All counters are monotonic within a session.
#[derive(Debug)]
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
    /// Set by the user interface (on SIGINT or SIGTERM) through [`Progress::interrupt`].
    interrupt: AtomicBool,
    phase: AtomicU8,
    /// When `phase` became [`Phase::Moving`], microseconds after `origin` (`u64::MAX`: not).
    moving_since_us: AtomicU64,
    /// The address a receiver waits on, or the one a sender connects to.
    address: Mutex<Option<SocketAddr>>,
    /// File names by file id (the manifest's files, in order).
    names: Mutex<Arc<[String]>>,
    /// Per channel: `(file id + 1) << 32 | milliseconds after origin` of the last bytes it
    /// moved; 0 when it moved none yet.
    moving: Box<[AtomicU64]>,
    /// What limits the transfer now, in a few words (sender; `None` until it is known).
    limit: Mutex<Option<String>>,
    /// Per channel, its [`Route`] now.
    routes: Box<[AtomicU8]>,
    /// Channels whose routes are kept (0: routes never set, the session is not relayed).
    routed: AtomicU16,
    /// Bytes sent (received) each way, by [`Route`] (datagrams with their headers, repairs and
    /// parity included; over TCP the frames).
    route_bytes: [AtomicU64; 3],
    origin: Instant,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            total: AtomicU64::new(0),
            resumed: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            confirmed: AtomicU64::new(0),
            rate_bps: AtomicU64::new(0),
            files_done: AtomicUsize::new(0),
            interrupt: AtomicBool::new(false),
            phase: AtomicU8::new(Phase::Idle as u8),
            moving_since_us: AtomicU64::new(u64::MAX),
            address: Mutex::new(None),
            names: Mutex::new(Arc::from(Vec::new())),
            moving: (0..hurtle_proto::layout::MAX_CHANNELS)
                .map(|_| AtomicU64::new(0))
                .collect(),
            limit: Mutex::new(None),
            routes: (0..hurtle_proto::layout::MAX_CHANNELS)
                .map(|_| AtomicU8::new(Route::Direct as u8))
                .collect(),
            routed: AtomicU16::new(0),
            route_bytes: Default::default(),
            origin: Instant::now(),
        }
    }
}

impl Progress {
    /// Asks the session to end: within a fraction of a second the session tells the peer,
    /// keeps what it verified, and returns [`crate::SessionError::Interrupted`].
    pub fn interrupt(&self) {
        self.interrupt.store(true, Ordering::Relaxed);
    }

    /// Whether the session was asked to end.
    pub fn interrupted(&self) -> bool {
        self.interrupt.load(Ordering::Relaxed)
    }

    /// The session's phase.
    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Idle,
            1 => Phase::Connecting,
            2 => Phase::SettingUp,
            _ => Phase::Moving,
        }
    }

    /// Enters `phase`; entering [`Phase::Moving`] starts the transfer's clock, leaving it
    /// (a fallback) stops it.
    pub fn set_phase(&self, phase: Phase) {
        let since = if phase == Phase::Moving {
            self.origin.elapsed().as_micros() as u64
        } else {
            u64::MAX
        };
        self.moving_since_us.store(since, Ordering::Release);
        self.phase.store(phase as u8, Ordering::Release);
    }

    /// When data started moving, if it has.
    pub fn moving_since(&self) -> Option<Instant> {
        match self.moving_since_us.load(Ordering::Acquire) {
            u64::MAX => None,
            us => Some(self.origin + Duration::from_micros(us)),
        }
    }

    /// The address a receiver waits on, or the one a sender connects to.
    pub fn address(&self) -> Option<SocketAddr> {
        *self.address.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets [`Progress::address`].
    pub fn set_address(&self, addr: SocketAddr) {
        *self.address.lock().unwrap_or_else(|e| e.into_inner()) = Some(addr);
    }

    /// Names the session's files, by file id, and forgets what any channel moved before.
    pub fn set_files(&self, names: Vec<String>) {
        *self.names.lock().unwrap_or_else(|e| e.into_inner()) = Arc::from(names);
        for m in self.moving.iter() {
            m.store(0, Ordering::Relaxed);
        }
    }

    /// Channel `channel` just moved bytes of file `file` (sent them, or received new ones).
    /// Cheap: one clock read and one store.
    pub fn note_moving(&self, channel: u16, file: u32) {
        if let Some(slot) = self.moving.get(usize::from(channel)) {
            let ms = self.origin.elapsed().as_millis().min(u128::from(u32::MAX)) as u64;
            slot.store((u64::from(file) + 1) << 32 | ms, Ordering::Relaxed);
        }
    }

    /// Says what limits the transfer now (see [`Progress::limit`]).
    pub fn set_limit(&self, what: String) {
        *self.limit.lock().unwrap_or_else(|e| e.into_inner()) = Some(what);
    }

    /// What limits the transfer now, in a few words ("the path, about 412 Mbit/s, 1.0% random
    /// loss"), as the sender's rate controller sees it; `None` until known.
    pub fn limit(&self) -> Option<String> {
        self.limit.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The session's `channels` channels all go by `route` from now on (a relayed start, or a
    /// move to TCP).
    pub fn set_routes(&self, channels: u16, route: Route) {
        for r in self.routes.iter().take(usize::from(channels)) {
            r.store(route as u8, Ordering::Relaxed);
        }
        let channels = channels.min(self.routes.len() as u16);
        self.routed.fetch_max(channels, Ordering::Relaxed);
    }

    /// Channel `channel` goes by `route` from now on (a direct path punched for it).
    pub fn set_route(&self, channel: u16, route: Route) {
        if let Some(r) = self.routes.get(usize::from(channel)) {
            r.store(route as u8, Ordering::Relaxed);
        }
    }

    /// Channel `channel` just sent `bytes`: counted for its route now. Cheap (two relaxed
    /// atomics): once per batch, not per datagram.
    pub fn count_sent(&self, channel: u16, bytes: u64) {
        let route = self
            .routes
            .get(usize::from(channel))
            .map_or(0, |r| r.load(Ordering::Relaxed));
        self.route_bytes[usize::from(route).min(2)].fetch_add(bytes, Ordering::Relaxed);
    }

    /// `bytes` just went by `route` (a receiver, which knows each datagram's way by where it
    /// came from). Cheap (one relaxed atomic): once per batch and route.
    pub fn count_route(&self, route: Route, bytes: u64) {
        self.route_bytes[route as usize].fetch_add(bytes, Ordering::Relaxed);
    }

    /// Bytes sent (or, on a receiver, received) each way so far, in the order of
    /// [`Route::ALL`].
    pub fn route_bytes(&self) -> [u64; 3] {
        [0, 1, 2].map(|i| self.route_bytes[i].load(Ordering::Relaxed))
    }

    /// Which way the data goes now, in a word for a progress line: `None` unless the session
    /// was relayed (a direct session needs no tag); `relay`, `relay tcp`, `direct`, or
    /// `relay+direct` while its channels are split.
    pub fn route_tag(&self) -> Option<&'static str> {
        let n = usize::from(self.routed.load(Ordering::Relaxed));
        if n == 0 {
            return None;
        }
        let mut seen = [false; 3];
        for r in self.routes.iter().take(n) {
            seen[usize::from(r.load(Ordering::Relaxed)).min(2)] = true;
        }
        Some(match seen {
            [true, false, false] => "direct",
            [false, true, false] => "relay",
            [false, false, true] => "relay tcp",
            _ => "relay+direct",
        })
    }

    /// The names of the files some channel moved bytes of in the last `within`, by file id
    /// (transfer order), each once.
    pub fn moving_files(&self, within: Duration) -> Vec<String> {
        let now_ms = self.origin.elapsed().as_millis() as u64;
        let window_ms = within.as_millis() as u64;
        let mut ids: Vec<u32> = self
            .moving
            .iter()
            .map(|m| m.load(Ordering::Relaxed))
            .filter(|&v| v != 0 && now_ms.saturating_sub(v & 0xffff_ffff) <= window_ms)
            .map(|v| ((v >> 32) - 1) as u32)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner()).clone();
        ids.iter()
            .filter_map(|&id| names.get(id as usize).cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_and_the_transfer_clock() {
        let p = Progress::default();
        assert_eq!(p.phase(), Phase::Idle);
        assert!(p.moving_since().is_none());
        p.set_phase(Phase::SettingUp);
        assert!(p.moving_since().is_none());
        p.set_phase(Phase::Moving);
        assert_eq!(p.phase(), Phase::Moving);
        let since = p.moving_since().expect("moving");
        assert!(since <= Instant::now());
        p.set_phase(Phase::Connecting);
        assert!(p.moving_since().is_none());
    }

    #[test]
    fn bytes_are_counted_by_each_channel_s_route_and_the_tag_says_where_data_goes() {
        let p = Progress::default();
        p.count_sent(0, 100);
        assert_eq!(p.route_bytes(), [100, 0, 0]);
        assert_eq!(p.route_tag(), None, "not relayed: no tag");
        p.set_routes(2, Route::RelayUdp);
        assert_eq!(p.route_tag(), Some("relay"));
        p.count_sent(0, 10);
        p.count_sent(1, 20);
        p.set_route(1, Route::Direct);
        assert_eq!(p.route_tag(), Some("relay+direct"));
        p.count_sent(1, 5);
        p.set_route(0, Route::Direct);
        assert_eq!(p.route_tag(), Some("direct"));
        p.count_sent(0, 7);
        assert_eq!(p.route_bytes(), [112, 30, 0]);
        p.set_routes(2, Route::RelayTcp);
        assert_eq!(p.route_tag(), Some("relay tcp"));
        p.count_sent(1, 1);
        // Unknown channels count as direct, and set nothing.
        p.set_route(u16::MAX, Route::RelayUdp);
        p.count_sent(u16::MAX, 3);
        assert_eq!(p.route_bytes(), [115, 30, 1]);
    }

    #[test]
    fn moving_files_are_recent_in_transfer_order_and_once() {
        let p = Progress::default();
        assert!(p.moving_files(Duration::from_secs(1)).is_empty());
        p.set_files(vec!["a".into(), "b".into(), "c".into()]);
        p.note_moving(3, 2);
        p.note_moving(0, 1);
        p.note_moving(1, 2);
        assert_eq!(p.moving_files(Duration::from_secs(1)), ["b", "c"]);
        // A channel's last file stays only while it is recent.
        std::thread::sleep(Duration::from_millis(30));
        assert!(p.moving_files(Duration::from_millis(5)).is_empty());
        // Unknown channels and files are ignored.
        p.note_moving(u16::MAX, 0);
        p.note_moving(2, 9);
        assert!(p.moving_files(Duration::from_secs(1)).len() == 2);
        p.set_files(vec!["x".into()]);
        assert!(p.moving_files(Duration::from_secs(1)).is_empty());
    }
}
