//! Open file descriptors, a bounded number at a time, shared by every file a process works on.
//!
//! A transfer may hold more files than a process may have open (`ulimit -n`: often 1024 soft,
//! 4096 or 20,000 hard). So [`PartFile`](crate::fs::PartFile) and
//! [`SourceFile`](crate::fs::SourceFile) keep a [`Slot`], not a descriptor: the slot asks
//! [`Descriptors`] for one when the file is read or written. The most recently used descriptors
//! stay open, at most the limit; to open another, the least recently used one is closed (once
//! no thread is using it). A file asked for again is reopened by the slot's owner, which checks
//! that its path still leads to the same file (device and inode: `Identity`) before using it.
//! The process's set ([`Descriptors::global`]) is sized by its limit on open files, raised to
//! the hard limit first.
//!
//! Transfers touch files in order, a few at a time (the blocks in flight, and repairs of recent
//! ones), so a transfer of fewer files than the limit never reopens one, and one of more files
//! opens each file about twice: once to create (or check) it, once to write (or read) it.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Most descriptors kept open for files, whatever the process's limit.
const MAX_OPEN: usize = 16384;

/// Fewest, however low the limit (sockets, logs and the control connection need the rest).
const MIN_OPEN: usize = 8;

/// A bounded set of open descriptors with least-recently-used eviction.
#[derive(Debug)]
pub struct Descriptors {
    limit: usize,
    next_key: AtomicU64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Open descriptors by slot key, with when each was last used.
    open: HashMap<u64, (Arc<File>, u64)>,
    /// The same keys by last use, oldest first.
    by_use: BTreeMap<u64, u64>,
    clock: u64,
}

impl State {
    fn touch(&mut self, key: u64) -> Option<Arc<File>> {
        self.clock += 1;
        let clock = self.clock;
        let (file, used) = self.open.get_mut(&key)?;
        self.by_use.remove(used);
        *used = clock;
        self.by_use.insert(clock, key);
        Some(file.clone())
    }

    fn insert(&mut self, key: u64, file: Arc<File>, limit: usize) {
        self.clock += 1;
        self.by_use.insert(self.clock, key);
        self.open.insert(key, (file, self.clock));
        while self.open.len() > limit {
            let Some((_, oldest)) = self.by_use.pop_first() else {
                break;
            };
            // A thread still using it keeps its own `Arc`; the descriptor closes after that.
            self.open.remove(&oldest);
        }
    }

    fn remove(&mut self, key: u64) {
        if let Some((_, used)) = self.open.remove(&key) {
            self.by_use.remove(&used);
        }
    }
}

impl Descriptors {
    /// A set keeping at most `limit` descriptors open (at least one).
    pub fn new(limit: usize) -> Descriptors {
        Descriptors {
            limit: limit.max(1),
            next_key: AtomicU64::new(0),
            state: Mutex::new(State::default()),
        }
    }

    /// The process's set: half its limit on open files (raised to the hard limit first; the
    /// other half is for sockets, logs and directories), between 8 and 16384.
    pub fn global() -> &'static Descriptors {
        static GLOBAL: OnceLock<Descriptors> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            let limit = raise_open_file_limit().unwrap_or(u64::MAX);
            let half = usize::try_from(limit / 2).unwrap_or(usize::MAX);
            Descriptors::new(half.clamp(MIN_OPEN, MAX_OPEN))
        })
    }

    /// Most descriptors kept open.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Descriptors open now (not counting any that threads still use after eviction).
    pub fn open_count(&self) -> usize {
        self.lock().open.len()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent whatever a panicking holder did between calls.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One file's place in a [`Descriptors`] set; dropping it closes the file's descriptor (once no
/// thread is using it).
#[derive(Debug)]
pub struct Slot {
    fds: &'static Descriptors,
    key: u64,
}

impl Slot {
    /// Puts the just opened `file` in `fds`.
    pub fn new(fds: &'static Descriptors, file: File) -> Slot {
        let key = fds.next_key.fetch_add(1, Ordering::Relaxed);
        fds.lock().insert(key, Arc::new(file), fds.limit);
        Slot { fds, key }
    }

    /// The file's descriptor: the open one, or `reopen()`'s (which should check that it is still
    /// the same file) if it was closed to make room.
    pub fn get(&self, reopen: impl FnOnce() -> io::Result<File>) -> io::Result<Arc<File>> {
        if let Some(f) = self.fds.lock().touch(self.key) {
            return Ok(f);
        }
        // Opened without the lock held: opening can be slow (a network filesystem).
        let file = Arc::new(reopen()?);
        let mut state = self.fds.lock();
        if let Some(f) = state.touch(self.key) {
            // Another thread reopened it meanwhile; ours closes here.
            return Ok(f);
        }
        state.insert(self.key, file.clone(), self.fds.limit);
        Ok(file)
    }
}

/// Raises this process's soft limit on open files to the hard limit; returns the limit then in
/// force (`None` if the system cannot say, `u64::MAX` when unlimited). [`Descriptors`] sizes
/// itself by it.
fn raise_open_file_limit() -> Option<u64> {
    crate::sys::fs::raise_open_file_limit()
}

/// Which file a descriptor is open on (device and inode): a file reopened by path must be the
/// same one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Identity(u64, u64);

impl Identity {
    pub(super) fn of(meta: &Metadata) -> Identity {
        Identity(meta.dev(), meta.ino())
    }

    /// Fails with [`Replaced`] unless `file` is the file `expected` names.
    pub(super) fn check(file: &File, expected: Identity) -> io::Result<()> {
        if Identity::of(&file.metadata()?) == expected {
            Ok(())
        } else {
            Err(io::Error::other(Replaced))
        }
    }
}

/// A file reopened by path turned out to be another file.
#[derive(Debug, thiserror::Error)]
#[error("its path now leads to another file")]
struct Replaced;

/// Whether `e` is [`Identity::check`]'s refusal.
pub(super) fn is_replaced(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Replaced>())
}

#[cfg(test)]
impl Slot {
    /// Closes the descriptor as eviction would (for tests of reopening).
    pub(crate) fn evict(&self) {
        self.fds.lock().remove(self.key);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.fds.lock().remove(self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn leaked(limit: usize) -> &'static Descriptors {
        Box::leak(Box::new(Descriptors::new(limit)))
    }

    #[test]
    fn the_least_recently_used_descriptor_is_closed_first() {
        let dir = tempfile::tempdir().unwrap();
        let fds = leaked(2);
        let path = |i: usize| dir.path().join(format!("f{i}"));
        let reopened = std::cell::Cell::new(0);
        let reopen = |i: usize| {
            let p = path(i);
            let r = &reopened;
            move || {
                r.set(r.get() + 1);
                File::options().read(true).write(true).open(p)
            }
        };
        let slots: Vec<Slot> = (0..3)
            .map(|i| Slot::new(fds, File::create(path(i)).unwrap()))
            .collect();
        assert_eq!(fds.open_count(), 2);
        // Slot 0 was closed to make room for slot 2; 1 and 2 are open.
        slots[1].get(reopen(1)).unwrap();
        slots[2].get(reopen(2)).unwrap();
        assert_eq!(reopened.get(), 0);
        slots[0].get(reopen(0)).unwrap().write_all(b"zero").unwrap();
        assert_eq!(reopened.get(), 1);
        // Slot 1 was the least recently used, so it was closed, and 2 is still open.
        slots[2].get(reopen(2)).unwrap();
        assert_eq!(reopened.get(), 1);
        slots[1].get(reopen(1)).unwrap();
        assert_eq!(reopened.get(), 2);
        assert_eq!(fds.open_count(), 2);
        assert_eq!(std::fs::read(path(0)).unwrap(), b"zero");
        drop(slots);
        assert_eq!(fds.open_count(), 0);
    }

    #[test]
    fn a_descriptor_in_use_outlives_its_eviction() {
        let dir = tempfile::tempdir().unwrap();
        let fds = leaked(1);
        let a = Slot::new(fds, File::create(dir.path().join("a")).unwrap());
        let held = a.get(|| unreachable!("a is open")).unwrap();
        let _b = Slot::new(fds, File::create(dir.path().join("b")).unwrap());
        assert_eq!(fds.open_count(), 1);
        // `a` was evicted from the set, but the holder can still write through it.
        (&*held).write_all(b"still open").unwrap();
        drop(held);
        assert_eq!(std::fs::read(dir.path().join("a")).unwrap(), b"still open");
    }

    #[test]
    fn a_failed_reopen_is_reported_and_leaves_nothing_open() {
        let dir = tempfile::tempdir().unwrap();
        let fds = leaked(1);
        let a = Slot::new(fds, File::create(dir.path().join("a")).unwrap());
        let _b = Slot::new(fds, File::create(dir.path().join("b")).unwrap());
        let e = a
            .get(|| Err(io::Error::new(io::ErrorKind::NotFound, "gone")))
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert_eq!(fds.open_count(), 1);
    }

    #[test]
    fn threads_sharing_a_small_set_write_every_byte_where_it_belongs() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let fds = leaked(3);
        let files = 12;
        let threads = 4;
        let rounds = 50;
        let path = |f: usize| dir.path().join(format!("f{f}"));
        let slots: Vec<Slot> = (0..files)
            .map(|f| Slot::new(fds, File::create(path(f)).unwrap()))
            .collect();
        std::thread::scope(|scope| {
            for t in 0..threads {
                let (slots, path) = (&slots, &path);
                scope.spawn(move || {
                    for round in 0..rounds {
                        // Each thread visits the files in its own order, so they keep evicting
                        // each other's descriptors.
                        let f = (round * (t + 1) + t) % files;
                        let file = slots[f]
                            .get(|| File::options().write(true).open(path(f)))
                            .unwrap();
                        file.write_all_at(&[t as u8 + 1], (round * threads + t) as u64)
                            .unwrap();
                        assert!(fds.open_count() <= fds.limit());
                    }
                });
            }
        });
        for f in 0..files {
            let bytes = std::fs::read(path(f)).unwrap();
            for (at, &b) in bytes.iter().enumerate() {
                let (round, t) = (at / threads, at % threads);
                let wrote_here = (round * (t + 1) + t) % files == f;
                assert_eq!(
                    b,
                    if wrote_here { t as u8 + 1 } else { 0 },
                    "file {f} byte {at}"
                );
            }
        }
    }

    #[test]
    fn the_global_set_stays_within_its_bounds() {
        let g = Descriptors::global();
        assert!((MIN_OPEN..=MAX_OPEN).contains(&g.limit()), "{}", g.limit());
    }
}
