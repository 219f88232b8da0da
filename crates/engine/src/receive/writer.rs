//! Writing complete blocks to their part files ([`write_block`]: one positional write, its
//! writeback started, zeros left unwritten where the file reads as zeros), and on a disk the
//! writer thread that does it for the channel threads ([`Writer`], [`Written`]), directly to
//! the device where the filesystem takes that well ([`DiskWriter`]).

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

/// Smallest block the writer thread writes directly ([`DiskWriter`]); smaller ones (a small
/// file, a file's short last block) go through the page cache, where the directory's one sync
/// for many files serves them better than a wait for the device each.
const DIRECT_MIN: usize = 256 << 10;

/// The writer thread's way to the disk: a complete block is written directly
/// ([`PartFile::write_direct`], from a page-aligned copy of it) where its part file's
/// filesystem takes direct writes, through the page cache ([`write_block`]) elsewhere. On a
/// disk, a buffered write costs a copy into pages the kernel must find first (on a virtual
/// machine whose free memory the host took back, each new page is a fault in the host: up to
/// two CPU-seconds per GiB) and the writeback after it; a direct write costs the device's time
/// and a copy into a buffer that is used again and again.
#[derive(Default)]
struct DiskWriter {
    /// The file last written and its direct descriptor (`None`: through the page cache).
    direct: Option<(u32, Option<std::fs::File>)>,
    /// Where blocks are copied to start at a page boundary; grown as needed.
    aligned: Vec<u8>,
}

impl DiskWriter {
    /// Writes block `w` to `part` (file number `file`), as [`write_block`] would: the same
    /// bytes end up in the file.
    fn write(&mut self, part: &PartFile, file: u32, w: &Written) -> Result<(), StoreError> {
        let align = PartFile::DIRECT_ALIGN;
        let whole = w.buf.len() / align * align;
        let direct_ok = whole >= DIRECT_MIN && w.file_start.is_multiple_of(align as u64);
        if !direct_ok || (w.first && part.is_new() && all_zeros(&w.buf)) {
            return write_block(part, w.file_start, &w.buf, w.first);
        }
        if self.direct.as_ref().map(|d| d.0) != Some(file) {
            self.direct = Some((file, part.open_direct()));
        }
        let Some((_, Some(direct))) = &self.direct else {
            return write_block(part, w.file_start, &w.buf, w.first);
        };
        let buf = aligned_copy(&mut self.aligned, &w.buf[..whole]);
        if !part.write_direct(direct, w.file_start, buf)? {
            // Refused: this file goes through the page cache from now on.
            self.direct = Some((file, None));
            return write_block(part, w.file_start, &w.buf, w.first);
        }
        if whole < w.buf.len() {
            let tail = &w.buf[whole..];
            let at = w.file_start + whole as u64;
            part.write_at(at, tail)?;
            part.start_writeback(at, tail.len() as u64);
        }
        Ok(())
    }
}

/// `data` copied into `scratch` (grown as needed) where it starts at a page boundary.
fn aligned_copy<'a>(scratch: &'a mut Vec<u8>, data: &[u8]) -> &'a [u8] {
    let align = PartFile::DIRECT_ALIGN;
    if scratch.len() < data.len() + align {
        *scratch = vec![0; data.len() + align];
    }
    let at = scratch.as_ptr().align_offset(align);
    let out = &mut scratch[at..at + data.len()];
    out.copy_from_slice(data);
    out
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

/// Writer threads per session: while one waits for the device to take a direct write, the
/// other copies its next block, so that the device always has one to work on.
const LANES: usize = 2;

/// A channel's end of the writer threads: [`LANES`] threads per session write complete blocks
/// to their files, a block always by the same thread (its number picks it), in the order they
/// come (so a block asked for again after a failed check is written after its first copy),
/// and hand each block's value to the session loop only once it is written.
/// Their queues are bounded; how full a block's queue is counts as receiver backlog in the
/// reports, so the sender slows down before the queues fill and a channel thread has to wait.
#[derive(Clone)]
pub(super) struct Writer {
    lanes: Vec<Sender<Written>>,
    /// Buffers the writers are done with.
    pub(super) spare: ChanRx<Vec<u8>>,
}

impl Writer {
    /// Starts the writer threads, with queues of `depth` blocks in all; returns the channels'
    /// end of them (to clone for each) and a thread that ends once they all have, which is
    /// once every end is dropped.
    pub(super) fn start(
        shared: Arc<Shared>,
        events: Sender<ChanEvent>,
        depth: usize,
    ) -> std::io::Result<(Writer, std::thread::JoinHandle<()>)> {
        let (spare_tx, spare_rx) = unbounded();
        let mut lanes = Vec::with_capacity(LANES);
        let mut queues = Vec::with_capacity(LANES);
        for _ in 0..LANES {
            let (tx, rx) = crossbeam_channel::bounded::<Written>(depth.div_ceil(LANES).max(2));
            lanes.push(tx);
            queues.push(rx);
        }
        let lane = move |rx: ChanRx<Written>| {
            let mut disk = DiskWriter::default();
            for w in rx {
                let waited = w.queued.elapsed().as_micros() as u64;
                shared.write_wait_us.fetch_max(waited, Ordering::Relaxed);
                let written = match &shared.files[w.file as usize] {
                    Some(part) => disk.write(part, w.file, &w),
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
        };
        let mut queues = queues.into_iter();
        let first = queues.next();
        let mut others = Vec::with_capacity(LANES - 1);
        for (i, rx) in queues.enumerate() {
            let lane = lane.clone();
            others.push(
                std::thread::Builder::new()
                    .name(format!("writer-{}", i + 1))
                    .spawn(move || lane(rx))?,
            );
        }
        let handle = std::thread::Builder::new()
            .name("writer".into())
            .spawn(move || {
                if let Some(rx) = first {
                    lane(rx);
                }
                for t in others {
                    let _ = t.join();
                }
            })?;
        Ok((
            Writer {
                lanes,
                spare: spare_rx,
            },
            handle,
        ))
    }

    /// Queues `w` for its writer thread, waiting if its queue is full.
    pub(super) fn hand_over(&self, shared: &Shared, w: Written) -> Result<(), SessionError> {
        let tx = &self.lanes[(w.block % self.lanes.len() as u64) as usize];
        let depth = tx.capacity().unwrap_or(1).max(1) as u64;
        let queued = tx.len() as u64 + 1;
        let fill = queued.min(depth) * 1000 / depth;
        // The writer's queue counts as the receiver's backlog, and apart as its disk's.
        shared.queue_fill.fetch_max(fill, Ordering::Relaxed);
        shared.write_fill.fetch_max(fill, Ordering::Relaxed);
        tx.send(w)
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

    /// A block for [`DiskWriter::write`].
    #[cfg(target_os = "linux")]
    fn block(file_start: u64, buf: Vec<u8>, first: bool) -> Written {
        Written {
            queued: Instant::now(),
            file: 0,
            block: 0,
            file_start,
            value: Default::default(),
            buf,
            first,
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_disk_writer_leaves_the_bytes_as_written_whichever_way_it_writes() {
        let mb = 1usize << 20;
        // Whole blocks, one with a short tail past the last page, a small one, zeros, and a
        // block fetched again over its first copy.
        let size = 4 * mb + 5000;
        let data: Vec<u8> = (0..size).map(|i| (i % 253) as u8).collect();
        for dir in [tempfile::tempdir(), tempfile::tempdir_in("/dev/shm")] {
            let dir = dir.unwrap();
            let part = PartFile::create(dir.path(), "f", size as u64, false).unwrap();
            let mut disk = DiskWriter::default();
            let mut first = data[..mb].to_vec();
            first[7] ^= 0xff;
            disk.write(&part, 0, &block(0, first, true)).unwrap();
            disk.write(&part, 0, &block(2 * mb as u64, vec![0; mb], true))
                .unwrap();
            let spans = [(mb, 2 * mb), (3 * mb, 4 * mb + 4000), (4 * mb + 4000, size)];
            for (start, end) in spans {
                let w = block(start as u64, data[start..end].to_vec(), true);
                disk.write(&part, 0, &w).unwrap();
            }
            disk.write(&part, 0, &block(0, data[..mb].to_vec(), false))
                .unwrap();
            let direct = matches!(disk.direct, Some((0, Some(_))));
            let suits =
                crate::sys::fs::direct_io_suits(&std::fs::File::open(part.part_path()).unwrap());
            assert_eq!(direct, suits, "written directly where the filesystem suits");
            let mut back = vec![1u8; size];
            part.read_at(0, &mut back).unwrap();
            let mut want = data.clone();
            want[2 * mb..3 * mb].fill(0);
            assert!(back == want, "{:?}", dir.path());
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
