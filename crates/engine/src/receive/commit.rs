//! Putting verified work on disk for good: the committer thread ([`Commits`], [`commit_loop`],
//! [`commit_files`]: seal, rename into place, sync each directory once), and
//! the journal lines of verified blocks, written in batches ([`JournalQueue`]).

use super::shared::Shared;
use crate::error::SessionError;
use crate::fs;
use crossbeam_channel::{unbounded, Sender};
use hurtle_proto::hash::{is_hole_value, BlockValue};
use hurtle_proto::wire::Entry;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Files verified and committed so far.
type Committed = Vec<(u32, [u8; 32])>;

/// The session loop's side of the committer thread.
pub(super) struct Commits {
    pub(super) to_commit: Sender<(u32, [u8; 32])>,
    pub(super) committed: crossbeam_channel::Receiver<Result<Committed, SessionError>>,
    /// Files given to the committer and not reported back yet.
    pub(super) outstanding: usize,
}

impl Commits {
    /// Starts the committer thread in `scope`.
    pub(super) fn start<'scope, 'env>(
        scope: &'scope std::thread::Scope<'scope, 'env>,
        shared: &'env Shared,
        files: &'env [&'env Entry],
    ) -> Result<Commits, SessionError> {
        let (to_commit, queue) = unbounded();
        let (report, committed) = unbounded();
        std::thread::Builder::new()
            .name("commit".into())
            .spawn_scoped(scope, move || commit_loop(shared, files, queue, report))
            .map_err(|e| SessionError::io("commit thread", e))?;
        Ok(Commits {
            to_commit,
            committed,
            outstanding: 0,
        })
    }

    /// Gives a verified file to the committer.
    pub(super) fn give(&mut self, file: u32, hash: [u8; 32]) {
        self.outstanding += 1;
        // The committer outlives the session loop, so the queue cannot be closed here.
        let _ = self.to_commit.send((file, hash));
    }

    /// A batch the committer reports in place, counted; its error ends the session.
    pub(super) fn note(
        &mut self,
        batch: Result<Committed, SessionError>,
    ) -> Result<Committed, SessionError> {
        let batch = batch?;
        self.outstanding = self.outstanding.saturating_sub(batch.len());
        Ok(batch)
    }

    /// Waits until the committer has put in place every file it was given; returns the files
    /// it put in place meanwhile.
    pub(super) fn finish(&mut self) -> Result<Committed, SessionError> {
        let mut all = Vec::new();
        while self.outstanding > 0 {
            match self.committed.recv() {
                Ok(batch) => all.extend(self.note(batch)?),
                Err(_) => break,
            }
        }
        Ok(all)
    }
}

/// Verified blocks waiting to be noted in their files' journals: written in batches, one open
/// and write per file for every [`JournalQueue::BATCH`] blocks or [`JournalQueue::EVERY`],
/// and when the session ends, however it ends (a journal line per block cost three system
/// calls per MiB on the session's thread).
pub(super) struct JournalQueue<'a> {
    shared: &'a Shared,
    /// `(file, block within the file, its value)`, in verification order.
    pending: Vec<(u32, u64, BlockValue)>,
    flushed: Instant,
}

impl<'a> JournalQueue<'a> {
    const BATCH: usize = 64;
    const EVERY: Duration = Duration::from_millis(100);

    pub(super) fn new(shared: &'a Shared) -> Self {
        JournalQueue {
            shared,
            pending: Vec::new(),
            flushed: Instant::now(),
        }
    }

    /// Notes a verified block. Holes are not journaled: a resume takes them from the
    /// manifest again, without reading them.
    pub(super) fn push(&mut self, file: u32, index: u64, value: BlockValue) {
        if is_hole_value(&value) {
            return;
        }
        self.pending.push((file, index, value));
        if self.pending.len() >= Self::BATCH {
            self.flush();
        }
    }

    pub(super) fn tick(&mut self, now: Instant) {
        if !self.pending.is_empty() && now.saturating_duration_since(self.flushed) >= Self::EVERY {
            self.flush();
        }
    }

    fn flush(&mut self) {
        self.pending.sort_unstable_by_key(|&(f, i, _)| (f, i));
        for run in self.pending.chunk_by(|a, b| a.0 == b.0) {
            if let Some(Some(part)) = self.shared.files.get(run[0].0 as usize) {
                let blocks: Vec<(u64, BlockValue)> = run.iter().map(|&(_, i, v)| (i, v)).collect();
                part.record_blocks(&blocks);
            }
        }
        self.pending.clear();
        self.flushed = Instant::now();
    }
}

impl Drop for JournalQueue<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Most verified files committed together.
const COMMIT_BATCH: usize = 256;

/// How long the committer gathers verified files before it commits them (unless it has
/// [`COMMIT_BATCH`] sooner): one directory sync serves them all.
const COMMIT_GATHER: Duration = Duration::from_millis(5);

/// The committer thread: takes verified files from `queue`, gathers them for up to
/// [`COMMIT_GATHER`] or [`COMMIT_BATCH`] files, commits them together (`commit_files`) and
/// reports each batch on `out`, until the queue is closed and empty or a commit fails (then the
/// error is the last report). On a thread of its own so that syncing many files does not hold
/// up the session loop's reports and verification.
fn commit_loop(
    shared: &Shared,
    files: &[&Entry],
    queue: crossbeam_channel::Receiver<(u32, [u8; 32])>,
    out: Sender<Result<Committed, SessionError>>,
) {
    let mut pending = Vec::new();
    while let Ok(first) = queue.recv() {
        pending.push(first);
        let until = Instant::now() + COMMIT_GATHER;
        while pending.len() < COMMIT_BATCH {
            match queue.recv_deadline(until) {
                Ok(next) => pending.push(next),
                Err(_) => break,
            }
        }
        let mut done = Vec::with_capacity(pending.len());
        let result = commit_files(shared, files, &mut pending, &mut done);
        let _ = out.send(Ok(done));
        if let Err(e) = result {
            let _ = out.send(Err(e));
            return;
        }
    }
}

/// Commits the verified files in `pending` (emptied) together: each is sealed (attributes
/// set, synced), then each renamed into place, then each directory synced once, and only then
/// is each added to `done` (the session loop tells the sender, with `FileDone`). One at a time, each file
/// would cost a sync of itself and another of its directory; batched, a directory is synced
/// once for many files (BENCHMARKS.md, section 7, has today's figure for many small files). A
/// failure stops the session; the files of the batch renamed before it are still synced and
/// reported.
fn commit_files(
    shared: &Shared,
    files: &[&Entry],
    pending: &mut Vec<(u32, [u8; 32])>,
    done: &mut Vec<(u32, [u8; 32])>,
) -> Result<(), SessionError> {
    if pending.is_empty() {
        return Ok(());
    }
    let part = |f: u32| shared.files[f as usize].as_ref();
    let mut failed = None;
    let mut sealed = 0;
    for &(f, _) in pending.iter() {
        let e = files[f as usize];
        if let Some(Err(err)) = part(f).map(|p| p.seal(e.mode, e.mtime_ns)) {
            failed = Some(err);
            break;
        }
        sealed += 1;
    }
    let mut renamed = 0;
    let mut dirs: Vec<&Path> = Vec::new();
    for &(f, _) in &pending[..sealed] {
        if let Some(p) = part(f) {
            if let Err(err) = p.rename_into_place() {
                failed = Some(err);
                break;
            }
            if !dirs.contains(&p.dir()) {
                dirs.push(p.dir());
            }
        }
        renamed += 1;
    }
    for dir in dirs {
        fs::sync_dir(dir)?;
    }
    for (file, hash) in pending.drain(..).take(renamed) {
        done.push((file, hash));
        shared.progress.files_done.fetch_add(1, Ordering::Relaxed);
    }
    match failed {
        Some(err) => Err(err.into()),
        None => Ok(()),
    }
}
