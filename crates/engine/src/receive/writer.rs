//! Writing complete blocks to their part files ([`write_block`]: one positional write, its
//! writeback started, zeros left unwritten where the file reads as zeros), and on a disk the
//! writer thread that does it for the channel threads ([`Writer`], [`Written`]).

use super::shared::{ChanEvent, Shared};
use crate::error::SessionError;
use crate::fs::{PartFile, StoreError};
use crossbeam_channel::{unbounded, Receiver as ChanRx, Sender};
use hurtle_proto::hash::BlockValue;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Writes a complete block with one positional write and starts its writeback to the disk, so
/// that the file's final fsync has little left to do. A block of zeros is not written where
/// the file reads as zeros by construction: a part file created by this transfer (its length
/// set, its space at most preallocated), at a block never written before (`first`: not a
/// block fetched again after a failed check). The file then holds the same bytes without the
/// write, and on tmpfs without the memory. Nothing here asks the filesystem where its holes
/// are: a block is left unwritten only where nothing was ever written.
pub(super) fn write_block(
    part: &PartFile,
    file_start: u64,
    buf: &[u8],
    first: bool,
) -> Result<(), StoreError> {
    if first && part.is_new() && all_zeros(buf) {
        return Ok(());
    }
    part.write_at(file_start, buf)?;
    part.start_writeback(file_start, buf.len() as u64);
    Ok(())
}

/// True when every byte of `buf` is zero; stops at the first 64 bytes that are not, so data
/// costs next to nothing to look at.
fn all_zeros(buf: &[u8]) -> bool {
    let mut chunks = buf.chunks_exact(64);
    let whole = chunks.all(|c| c.iter().fold(0u8, |acc, &b| acc | b) == 0);
    whole && chunks.remainder().iter().all(|&b| b == 0)
}

/// A complete block on its way to the writer thread.
pub(super) struct Written {
    /// When it was handed to the writer.
    pub(super) queued: Instant,
    pub(super) file: u32,
    pub(super) block: u64,
    pub(super) file_start: u64,
    pub(super) value: BlockValue,
    pub(super) buf: Vec<u8>,
    /// Never written before (see [`write_block`]).
    pub(super) first: bool,
}

/// A channel's end of the writer thread: one thread per session writes complete blocks to
/// their files in the order they come (so a block asked for again after a failed check is
/// written after its first copy), starts their writeback, and only then hands each block's
/// value to the session loop. Its queue is bounded; how full it is counts as receiver backlog
/// in the reports, so the sender slows down before the queue fills and a channel thread has to
/// wait.
#[derive(Clone)]
pub(super) struct Writer {
    pub(super) tx: Sender<Written>,
    /// Buffers the writer is done with.
    pub(super) spare: ChanRx<Vec<u8>>,
}

impl Writer {
    /// Starts the writer thread, with a queue of `depth` blocks; returns the channels' end
    /// of it (to clone for each) and the thread, which ends once every end is dropped.
    pub(super) fn start(
        shared: Arc<Shared>,
        events: Sender<ChanEvent>,
        depth: usize,
    ) -> std::io::Result<(Writer, std::thread::JoinHandle<()>)> {
        let (tx, rx) = crossbeam_channel::bounded::<Written>(depth);
        let (spare_tx, spare_rx) = unbounded();
        let handle = std::thread::Builder::new()
            .name("writer".into())
            .spawn(move || {
                for w in rx {
                    let waited = w.queued.elapsed().as_micros() as u64;
                    shared.write_wait_us.fetch_max(waited, Ordering::Relaxed);
                    let written = match &shared.files[w.file as usize] {
                        Some(part) => write_block(part, w.file_start, &w.buf, w.first),
                        None => Ok(()),
                    };
                    if let Err(e) = written {
                        let _ = events.send(ChanEvent::Failed(e.into()));
                        shared.stop.store(true, Ordering::Relaxed);
                        return;
                    }
                    let _ = events.send(ChanEvent::Block {
                        block: w.block,
                        value: w.value,
                    });
                    let _ = spare_tx.send(w.buf);
                }
            })?;
        Ok((
            Writer {
                tx,
                spare: spare_rx,
            },
            handle,
        ))
    }

    /// Queues `w` for the writer thread, waiting if its queue is full.
    pub(super) fn hand_over(&self, shared: &Shared, w: Written) -> Result<(), SessionError> {
        let depth = self.tx.capacity().unwrap_or(1).max(1) as u64;
        let queued = self.tx.len() as u64 + 1;
        let fill = queued.min(depth) * 1000 / depth;
        // The writer's queue counts as the receiver's backlog, and apart as its disk's.
        shared.queue_fill.fetch_max(fill, Ordering::Relaxed);
        shared.write_fill.fetch_max(fill, Ordering::Relaxed);
        self.tx
            .send(w)
            .map_err(|_| SessionError::Internal("the writer thread stopped"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_are_told_from_data() {
        assert!(all_zeros(&[]));
        assert!(all_zeros(&[0; 1000]));
        for at in [0, 63, 64, 999] {
            let mut b = vec![0u8; 1000];
            b[at] = 1;
            assert!(!all_zeros(&b), "{at}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_block_of_zeros_is_written_only_where_something_was_written() {
        use std::os::unix::fs::MetadataExt;
        let mb = 1usize << 20;
        let dir = tempfile::tempdir_in("/dev/shm").expect("a tmpfs on /dev/shm");
        let mut part = PartFile::create(dir.path(), "f", 3 * mb as u64, false).unwrap();
        let allocated = |p: &PartFile| std::fs::metadata(p.part_path()).unwrap().blocks() * 512;
        // A first write into a new part file: not written, nothing allocated.
        write_block(&part, 0, &vec![0; mb], true).unwrap();
        assert_eq!(allocated(&part), 0);
        // A block fetched again over its first copy: written.
        write_block(&part, mb as u64, &vec![7; mb], true).unwrap();
        write_block(&part, mb as u64, &vec![0; mb], false).unwrap();
        let mut back = vec![1u8; 3 * mb];
        part.read_at(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        assert_eq!(allocated(&part), mb as u64, "only the block written twice");
        // A resumed part file may hold anything: written.
        part.keep_journal(mb as u64).unwrap();
        part.write_at(2 * mb as u64, &vec![9; mb]).unwrap();
        drop(part);
        let (resumed, _) = PartFile::resume(dir.path(), "f", 3 * mb as u64, mb as u64, false)
            .unwrap()
            .expect("a part file and its journal");
        write_block(&resumed, 2 * mb as u64, &vec![0; mb], true).unwrap();
        resumed.read_at(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
    }
}
