//! Sparse files, and allocating a part file before its data arrives.
//!
//! [`hole_blocks`] finds the blocks of a file that lie wholly in holes (the sender leaves them
//! out of the transfer), and [`is_hole`] asks again before a source's hole is hashed as zeros
//! instead of read. A part file is allocated ahead, all but its holes
//! ([`PartFile::preallocate`](super::PartFile::preallocate)), and a resumed one gets its holes
//! back ([`PartFile::punch_holes`](super::PartFile::punch_holes)). A part file's zeros are never
//! taken from the filesystem's word ([`PartFile::is_new`](super::PartFile::is_new)).

use crate::sys;
use rustix::io::Errno;
use std::fs::{File, Metadata};
use std::io::{self, ErrorKind};
use std::os::unix::fs::MetadataExt;

/// How much [`preallocate`] asks the kernel for per call. One call for a whole large file can
/// be a long uninterruptible stretch of kernel work; under a CPU quota (cgroup `cpu.max`),
/// Linux charges that debt when the call returns and then stalls every thread of the process,
/// the keep-alive sender included, until it is repaid (under a small quota, many seconds after
/// one call for a large file). Chunks keep each stall short enough for keep-alives to get out.
const PREALLOCATE_CHUNK: u64 = 16 << 20;

/// Allocates `file`'s first `size` bytes on disk, a chunk at a time, so that a full disk shows
/// before the transfer starts and the file is laid out in one piece where the filesystem can.
/// Left alone: filesystems that cannot allocate ahead (`fallocate(2)` says `EOPNOTSUPP`; no
/// emulation by writing zeros, as `posix_fallocate` would do), and memory-backed ones (tmpfs,
/// ramfs), where allocating only zero-fills pages the writes fill anyway (CPU time before the
/// first byte moves, for no layout to gain; [`free_space`](super::free_space) covers the full-disk
/// check there).
#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
pub(super) fn preallocate(file: &File, ranges: impl Iterator<Item = (u64, u64)>) -> io::Result<()> {
    if sys::fs::memory_backed(file) {
        return Ok(());
    }
    for (start, end) in ranges {
        preallocate_range(file, start, end)?;
    }
    Ok(())
}

/// Allocates bytes `start..end` of `file` (see [`preallocate`]).
#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
fn preallocate_range(file: &File, start: u64, end: u64) -> io::Result<()> {
    let mut done = start;
    while done < end {
        let chunk = (end - done).min(PREALLOCATE_CHUNK);
        match sys::fs::allocate(file, done, chunk) {
            Ok(()) => done += chunk,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP) | Some(libc::EINVAL)
                ) =>
            {
                return Ok(())
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// No preallocation on this platform.
#[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
pub(super) fn preallocate(
    _file: &File,
    _ranges: impl Iterator<Item = (u64, u64)>,
) -> io::Result<()> {
    Ok(())
}

/// The blocks of `file`'s first `size` bytes (blocks of `block_size` bytes) that lie wholly in
/// holes, as ascending half-open ranges of block numbers: never written, they read as zeros
/// and take no space, and a sender need not send them (the file's last block counts when the
/// hole runs to the end). Found with `lseek(SEEK_HOLE / SEEK_DATA)`; empty where the
/// filesystem does not report holes (it then puts the only hole at the end of the file).
#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
pub fn hole_blocks(file: &File, size: u64, block_size: u64) -> io::Result<Vec<(u64, u64)>> {
    use rustix::fs::{seek, SeekFrom};
    let count = size.div_ceil(block_size);
    let mut holes: Vec<(u64, u64)> = Vec::new();
    let mut pos = 0;
    while pos < size {
        let hole = match seek(file, SeekFrom::Hole(pos)) {
            Ok(h) => h,
            // Past the end (the file shrank), or no holes on this filesystem.
            Err(Errno::NXIO | Errno::INVAL | Errno::OPNOTSUPP) => break,
            Err(e) => return Err(e.into()),
        };
        if hole >= size {
            break;
        }
        let data = match seek(file, SeekFrom::Data(hole)) {
            Ok(d) => d.min(size),
            // Nothing but hole to the end.
            Err(Errno::NXIO) => size,
            Err(e) => return Err(e.into()),
        };
        if data <= pos {
            break;
        }
        let first = hole.div_ceil(block_size);
        let end = if data == size {
            count
        } else {
            data / block_size
        };
        if first < end {
            match holes.last_mut() {
                Some(last) if last.1 == first => last.1 = end,
                _ => holes.push((first, end)),
            }
        }
        pos = data;
    }
    Ok(holes)
}

/// True when a file takes less space than its size: it may have holes (or be compressed by
/// its filesystem), worth asking [`hole_blocks`] or [`is_hole`] about.
pub fn may_have_holes(meta: &Metadata) -> bool {
    meta.blocks().saturating_mul(512) < meta.len()
}

/// True when bytes `start..end` of `file` lie wholly in a hole (`lseek(SEEK_DATA)` from
/// `start` finds no data before `end`): they read as zeros without being read. False where
/// the filesystem does not say.
#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
pub fn is_hole(file: &File, start: u64, end: u64) -> bool {
    use rustix::fs::{seek, SeekFrom};
    match seek(file, SeekFrom::Data(start)) {
        Ok(data) => data >= end,
        // No data from `start` on.
        Err(Errno::NXIO) => true,
        Err(_) => false,
    }
}

/// No holes are looked for on this platform.
#[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
pub fn is_hole(_file: &File, _start: u64, _end: u64) -> bool {
    false
}

/// No holes are looked for on this platform.
#[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
pub fn hole_blocks(_file: &File, _size: u64, _block_size: u64) -> io::Result<Vec<(u64, u64)>> {
    Ok(Vec::new())
}

/// The byte ranges of the blocks in `blocks` (ascending half-open ranges of block numbers) of
/// a file of `size` bytes.
pub(super) fn block_bytes(
    blocks: &[(u64, u64)],
    block_size: u64,
    size: u64,
) -> impl Iterator<Item = (u64, u64)> + '_ {
    blocks.iter().map(move |&(first, end)| {
        (
            first.saturating_mul(block_size).min(size),
            end.saturating_mul(block_size).min(size),
        )
    })
}

/// The bytes of a file of `size` bytes that lie in the blocks `blocks` (ascending half-open
/// ranges of block numbers).
pub fn bytes_in_blocks(blocks: &[(u64, u64)], block_size: u64, size: u64) -> u64 {
    block_bytes(blocks, block_size, size)
        .map(|(a, b)| b - a)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::testing::sparse_file;
    use std::fs;

    #[test]
    fn preallocates_in_chunks_to_the_exact_size() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let f = File::create(tmp.path().join("big")).unwrap();
        let size = 2 * PREALLOCATE_CHUNK + 12345;
        f.set_len(size).unwrap();
        preallocate(&f, std::iter::once((0, size))).unwrap();
        let m = f.metadata().unwrap();
        assert_eq!(m.len(), size, "the length is kept");
        // Where the filesystem allocates ahead, every chunk got its blocks, not just the first;
        // on tmpfs nothing is allocated.
        if sys::fs::memory_backed(&f) {
            assert_eq!(m.blocks(), 0, "tmpfs is left sparse");
        } else if m.blocks() > 0 {
            assert!(
                m.blocks() * 512 >= size,
                "{} blocks for {size} bytes",
                m.blocks()
            );
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn holes_are_found_in_whole_blocks() {
        for dir in [
            tempfile::tempdir().unwrap(),
            tempfile::tempdir_in("/dev/shm").unwrap(),
        ] {
            let (f, size) = sparse_file(dir.path());
            let mb = 1 << 20;
            assert_eq!(
                hole_blocks(&f, size, mb).unwrap(),
                vec![(0, 3), (4, 8), (9, 10)],
                "in {}",
                dir.path().display()
            );
            // Smaller blocks: the ones around the written bytes are data.
            let kb = 64 << 10;
            let holes = hole_blocks(&f, size, kb).unwrap();
            assert_eq!(holes.first(), Some(&(0, 48)));
            assert_eq!(holes.last().map(|h| h.1), Some(size.div_ceil(kb)));
            assert_eq!(bytes_in_blocks(&holes, kb, size), size - 2 * kb);
            // Only the first `size` bytes count, and a file without holes has none.
            assert_eq!(hole_blocks(&f, 3 << 20, mb).unwrap(), vec![(0, 3)]);
            let full = dir.path().join("full");
            fs::write(&full, vec![5u8; 3 << 20]).unwrap();
            let full = File::open(&full).unwrap();
            assert_eq!(hole_blocks(&full, 3 << 20, mb).unwrap(), vec![]);
        }
    }
}
