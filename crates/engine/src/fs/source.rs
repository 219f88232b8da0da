//! A file being sent ([`SourceFile`]): positional reads that notice when the source changes
//! underneath the transfer.
//!
//! Its size and modification time are recorded at open, and it is read no further than that
//! size. Like a part file it borrows its descriptor from [`Descriptors`]; reopened by path, it
//! must still be the same file (device and inode), so a source replaced meanwhile counts as
//! changed, never read from.
//!
//! Its [`SourceStamp`] (device, inode, size, modification and change times), recorded at open
//! and taken again on demand, is what the sender's cache of block values is keyed by: the
//! change time cannot be set back by a user, so a file rewritten with its modification time
//! restored still has another stamp.
//!
//! It also holds the blocks the manifest announced as holes ([`SourceFile::with_holes`]): such
//! a block, still a hole, is valued without being read or hashed
//! ([`hurtle_proto::hash::hole_value`]).

use super::error::{map_io, StoreError};
use super::fds::{is_replaced, Descriptors, Identity, Slot};
use super::holes::is_hole;
use super::meta::mtime_ns;
use std::fs::{File, Metadata};
use std::io::{self, ErrorKind};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

/// What identifies one state of a source file: which file (device, inode) and what its
/// metadata said (size, modification and change times, nanoseconds since the Unix epoch). Any
/// write, truncation, `touch`, rename over it or replacement gives another stamp: the change
/// time is set by the kernel to the current time on each of them, and no call sets it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SourceStamp {
    /// Device number.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
    /// Change time (the inode's: never set back by a user), nanoseconds since the Unix epoch.
    pub ctime_ns: i64,
}

impl SourceStamp {
    /// The stamp of a file's metadata.
    pub fn of(meta: &Metadata) -> SourceStamp {
        SourceStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime_ns: mtime_ns(meta),
            ctime_ns: meta
                .ctime()
                .saturating_mul(1_000_000_000)
                .saturating_add(meta.ctime_nsec()),
        }
    }
}

/// A file being sent: positional reads, with its size and modification time recorded at open
/// so that changes during the transfer are noticed.
#[derive(Debug)]
pub struct SourceFile {
    /// Its descriptor, open while in use (see [`Descriptors`]).
    slot: Slot,
    /// The file `slot` must be open on: a source replaced by another file counts as changed.
    identity: Identity,
    path: PathBuf,
    size: u64,
    mtime_ns: i64,
    /// Its stamp at open, and when it was taken.
    stamp: SourceStamp,
    stamped_at: SystemTime,
    /// Blocks the manifest announced as holes: ascending half-open ranges of block numbers.
    holes: Vec<(u64, u64)>,
}

impl SourceFile {
    /// Opens `path` (following symlinks) and records its size and modification time. Refuses
    /// anything but a regular file.
    pub fn open(path: &Path) -> Result<SourceFile, StoreError> {
        let file = File::open(path).map_err(|e| map_io(path, "open", 0, e))?;
        let stamped_at = SystemTime::now();
        let meta = file.metadata().map_err(|e| map_io(path, "inspect", 0, e))?;
        if !meta.is_file() {
            return Err(StoreError::Io {
                op: "send",
                path: path.to_path_buf(),
                source: io::Error::new(ErrorKind::InvalidInput, "not a regular file"),
            });
        }
        Ok(SourceFile {
            slot: Slot::new(Descriptors::global(), file),
            identity: Identity::of(&meta),
            path: path.to_path_buf(),
            size: meta.len(),
            mtime_ns: mtime_ns(&meta),
            stamp: SourceStamp::of(&meta),
            stamped_at,
            holes: Vec::new(),
        })
    }

    /// The same source, with the blocks the manifest announced as holes (ascending half-open
    /// ranges of block numbers; see [`hurtle_proto::hash::value_of`]).
    pub fn with_holes(self, holes: Vec<(u64, u64)>) -> SourceFile {
        SourceFile { holes, ..self }
    }

    /// True when the manifest announced holes in this file: its root hash is then of the kind
    /// [`HashKind::Sparse`](hurtle_proto::hash::HashKind::Sparse).
    pub fn has_announced_holes(&self) -> bool {
        !self.holes.is_empty()
    }

    /// True when block `index` (of the file's own blocks) was announced as a hole.
    pub fn is_announced_hole(&self, index: u64) -> bool {
        let i = self.holes.partition_point(|&(_, end)| end <= index);
        self.holes.get(i).is_some_and(|&(start, _)| start <= index)
    }

    /// The source's descriptor, reopened if it was closed to make room for others;
    /// [`StoreError::SourceChanged`] if its path now leads to another file.
    fn file(&self) -> Result<Arc<File>, StoreError> {
        self.slot
            .get(|| {
                let file = File::open(&self.path)?;
                Identity::check(&file, self.identity)?;
                Ok(file)
            })
            .map_err(|e| {
                if e.kind() == ErrorKind::NotFound || is_replaced(&e) {
                    StoreError::SourceChanged {
                        path: self.path.clone(),
                    }
                } else {
                    map_io(&self.path, "reopen", 0, e)
                }
            })
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size recorded at open.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Modification time recorded at open, nanoseconds since the Unix epoch.
    pub fn mtime_ns(&self) -> i64 {
        self.mtime_ns
    }

    /// The file's [`SourceStamp`] recorded at open.
    pub fn stamp(&self) -> SourceStamp {
        self.stamp
    }

    /// When [`SourceFile::stamp`] was taken (just before the file was inspected).
    pub fn stamped_at(&self) -> SystemTime {
        self.stamped_at
    }

    /// The file's [`SourceStamp`] now, from its open descriptor.
    pub fn stamp_now(&self) -> Result<SourceStamp, StoreError> {
        let meta = self
            .file()?
            .metadata()
            .map_err(|e| map_io(&self.path, "inspect", 0, e))?;
        Ok(SourceStamp::of(&meta))
    }

    /// Reads from `offset` into `buf`, up to the recorded size: returns `buf.len()`, or fewer
    /// bytes when the recorded end of file comes first (0 at or past it). Returns
    /// [`StoreError::SourceChanged`] if the file is now shorter than its recorded size. Bytes
    /// beyond the recorded size are never read; use [`SourceFile::check_unchanged`] to notice
    /// growth or rewrites.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, StoreError> {
        let remaining = self.size.saturating_sub(offset);
        let want = usize::try_from(remaining).map_or(buf.len(), |r| r.min(buf.len()));
        let file = self.file()?;
        let mut got = 0;
        while got < want {
            match file.read_at(&mut buf[got..want], offset + got as u64) {
                Ok(0) => {
                    return Err(StoreError::SourceChanged {
                        path: self.path.clone(),
                    })
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(map_io(&self.path, "read", 0, e)),
            }
        }
        Ok(want)
    }

    /// True when bytes `start..end` lie wholly in a hole, so they read as zeros (see
    /// [`is_hole`]).
    pub fn is_hole(&self, start: u64, end: u64) -> Result<bool, StoreError> {
        Ok(is_hole(&*self.file()?, start, end))
    }

    /// Stats the open file again and returns [`StoreError::SourceChanged`] if its size or
    /// modification time differ from those recorded at open.
    pub fn check_unchanged(&self) -> Result<(), StoreError> {
        let meta = self
            .file()?
            .metadata()
            .map_err(|e| map_io(&self.path, "inspect", 0, e))?;
        if meta.len() != self.size || mtime_ns(&meta) != self.mtime_ns {
            return Err(StoreError::SourceChanged {
                path: self.path.clone(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::time::{Duration, SystemTime};

    #[test]
    fn a_source_reopened_after_eviction_reads_on_but_a_replaced_one_counts_as_changed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("src");
        fs::write(&path, b"0123456789").unwrap();
        let src = SourceFile::open(&path).unwrap();
        src.slot.evict();
        let mut buf = [0u8; 4];
        assert_eq!(src.read_at(3, &mut buf).unwrap(), 4);
        assert_eq!(&buf, b"3456");
        src.check_unchanged().unwrap();
        // Same size, same content, but another file (as an editor's save-by-rename makes).
        let twin = dir.path().join("twin");
        fs::write(&twin, b"0123456789").unwrap();
        fs::rename(&twin, &path).unwrap();
        src.slot.evict();
        assert!(matches!(
            src.read_at(0, &mut buf),
            Err(StoreError::SourceChanged { .. })
        ));
        fs::remove_file(&path).unwrap();
        src.slot.evict();
        assert!(matches!(
            src.check_unchanged(),
            Err(StoreError::SourceChanged { .. })
        ));
    }

    #[test]
    fn announced_holes_are_known_by_block() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("src");
        fs::write(&path, b"0123456789").unwrap();
        let src = SourceFile::open(&path).unwrap();
        assert!(!src.has_announced_holes() && !src.is_announced_hole(0));
        let src = src.with_holes(vec![(1, 3), (5, 6)]);
        assert!(src.has_announced_holes());
        let holes: Vec<u64> = (0..8).filter(|&b| src.is_announced_hole(b)).collect();
        assert_eq!(holes, vec![1, 2, 5]);
    }

    #[test]
    fn source_file_reads_and_notices_changes() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("src.bin");
        fs::write(&p, b"0123456789").unwrap();
        let sf = SourceFile::open(&p).unwrap();
        assert_eq!(sf.size(), 10);
        assert_eq!(sf.path(), p);
        let mut buf = [0u8; 4];
        assert_eq!(sf.read_at(0, &mut buf).unwrap(), 4);
        assert_eq!(&buf, b"0123");
        assert_eq!(sf.read_at(8, &mut buf).unwrap(), 2, "short at recorded EOF");
        assert_eq!(&buf[..2], b"89");
        assert_eq!(sf.read_at(10, &mut buf).unwrap(), 0);
        assert_eq!(sf.read_at(u64::MAX, &mut buf).unwrap(), 0);
        sf.check_unchanged().unwrap();

        // A touched mtime is noticed; restoring it makes the file look unchanged again.
        let mut f = fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1))
            .unwrap();
        assert!(matches!(
            sf.check_unchanged(),
            Err(StoreError::SourceChanged { .. })
        ));
        let recorded = SystemTime::UNIX_EPOCH + Duration::from_nanos(sf.mtime_ns() as u64);
        f.set_modified(recorded).unwrap();
        sf.check_unchanged().unwrap();
        // Growth: reads stay within the recorded size, the check notices.
        {
            use std::io::{Seek, Write};
            f.seek(io::SeekFrom::End(0)).unwrap();
            f.write_all(b"more").unwrap();
        }
        f.set_modified(recorded).unwrap();
        assert_eq!(sf.read_at(8, &mut buf).unwrap(), 2);
        assert!(matches!(
            sf.check_unchanged(),
            Err(StoreError::SourceChanged { .. })
        ));
        // Truncation: reading where data should be is an error.
        f.set_len(6).unwrap();
        let e = sf.read_at(4, &mut buf).unwrap_err();
        assert!(matches!(e, StoreError::SourceChanged { .. }), "{e:?}");
        assert!(e
            .to_string()
            .starts_with("source file changed while sending: "));
        assert!(matches!(
            sf.check_unchanged(),
            Err(StoreError::SourceChanged { .. })
        ));

        assert!(SourceFile::open(tmp.path()).is_err(), "a directory");
        assert!(matches!(
            SourceFile::open(&tmp.path().join("nope")),
            Err(StoreError::Io { op: "open", .. })
        ));
    }
}
