//! A file being received ([`PartFile`]), from its creation beside its final name to the rename
//! that puts it there.
//!
//! It is written positionally into `.<name>.hurtle-part` ([`free_space`] lets the receiver
//! refuse a transfer that cannot fit, and [`PartFile::preallocate`] allocates the file before
//! data arrives, where that is cheap and useful; [`PartFile::open_direct`] gives a second
//! descriptor for direct writes where the filesystem suits them), and [`PartFile::finish`]
//! fsyncs it, applies mode and mtime, renames it into place and fsyncs the directory. Nothing is ever written
//! under the final name before that rename. Beside it, its block journal
//! ([`PartFile::record_blocks`], [`super::journal`]) lets an interrupted transfer resume
//! ([`PartFile::resume`]).
//!
//! It keeps no descriptor of its own: it borrows one from [`Descriptors`], which keeps the
//! recently used ones open and closes others to stay within the process's limit on open files.
//! Reopened by path, it must still be the same file (device and inode), so a part file replaced
//! meanwhile is an error, never written to.

use super::beneath::open_at;
use super::error::{map_io, StoreError};
use super::fds::{Descriptors, Identity, Slot};
use super::holes::{block_bytes, preallocate};
use super::journal::{
    entry_line, journal_file_name, journal_header, parse_journal, part_file_name, seal_line,
    JournalKey, JournalScope, Journaled,
};
use super::meta::{system_time_from_ns, MODE_MASK};
use super::path::{sanitize_rel_path, split_parent};
use super::tree::{DirAt, OutRoot};
use crate::sys;
use hurtle_proto::hash::BlockValue;
use rustix::fs::{AtFlags, OFlags, RenameFlags};
use rustix::io::Errno;
use std::fs::{File, Permissions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Bytes an unprivileged writer can still use on the filesystem holding `dir` (`statvfs`), or
/// `None` if the system cannot say.
pub fn free_space(dir: &Path) -> Option<u64> {
    sys::fs::free_space(dir)
}

/// A file being received: written positionally into `.<name>.hurtle-part` beside its final
/// name, then moved into place by [`PartFile::finish`].
///
/// All I/O methods take `&self`, so several threads can share one `Arc<PartFile>`. Dropping it
/// without `finish` leaves the `.hurtle-part` file in place (it is the partial a resume starts
/// from); nothing is ever written under the final name until `finish` renames it.
#[derive(Debug)]
pub struct PartFile {
    /// Its descriptor, open while in use (see [`Descriptors`]).
    slot: Slot,
    /// The file `slot` must be open on: reopening checks it.
    identity: Identity,
    /// The file's directory: every operation by name goes through its descriptor.
    dir_at: Arc<DirAt>,
    name: String,
    part_name: String,
    journal_name: String,
    final_path: PathBuf,
    part_path: PathBuf,
    journal_path: PathBuf,
    /// Whether verified blocks are journaled (see [`PartFile::keep_journal`]). The journal is
    /// opened for each line, not kept open: a transfer of many files would otherwise need
    /// two descriptors per file.
    journal: bool,
    /// The key of its journal's lines (see [`super::journal`]), once there is a journal.
    journal_key: Option<JournalKey>,
    /// Its blocks' size, once there is a journal.
    block_size: u64,
    /// Still a part file (not renamed into place nor discarded): closing it seals its journal.
    open: AtomicBool,
    size: u64,
    /// Created by this transfer (not resumed): what was never written reads as zeros.
    new: bool,
    overwrite: bool,
}

impl PartFile {
    /// What a direct write's buffer address, file offset and length must be multiples of
    /// ([`PartFile::write_direct`]): the page size, which covers every device's logical block.
    pub const DIRECT_ALIGN: usize = 4096;

    /// Starts receiving `rel` (a peer-supplied relative path) of `size` bytes under `root`.
    ///
    /// Creates `root` and the parent directories as needed (refusing symlinks on the way),
    /// refuses with [`StoreError::DestinationExists`] if the final name exists and `overwrite`
    /// is false, creates or truncates `.<name>.hurtle-part` (mode 0600, not following a symlink)
    /// and gives it its length (sparse: no space is allocated yet; see
    /// [`PartFile::preallocate`], called once the receiver knows all the files fit).
    ///
    /// A block journal left by an earlier attempt is removed: its blocks are gone.
    pub fn create(
        root: &Path,
        rel: &str,
        size: u64,
        overwrite: bool,
    ) -> Result<PartFile, StoreError> {
        Self::create_in(&OutRoot::new(root), rel, size, overwrite)
    }

    /// [`PartFile::create`] under `out`, whose directories this transfer may have checked
    /// already.
    pub fn create_in(
        out: &OutRoot,
        rel: &str,
        size: u64,
        overwrite: bool,
    ) -> Result<PartFile, StoreError> {
        let target = Self::target(out, rel, overwrite)?;
        let (dir, fd, name) = (&target.dir, &target.fd, target.name);
        let (part_name, journal_name) = (part_file_name(name), journal_file_name(name));
        let journal_path = dir.path.join(&journal_name);
        if !out.known_missing(&journal_path) {
            match rustix::fs::unlinkat(&**fd, journal_name.as_str(), AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(map_io(&journal_path, "remove", 0, e.into())),
            }
        }
        let part_path = dir.path.join(&part_name);
        let flags = OFlags::RDWR | OFlags::CREATE | OFlags::TRUNC;
        let file = open_at(&**fd, &part_name, flags, 0o600)
            .map_err(|e| map_io(&part_path, "create", 0, e))?;
        out.note_created(&part_path);
        let identity = match file.set_len(size).and_then(|()| file.metadata()) {
            Ok(meta) => Identity::of(&meta),
            Err(e) => {
                drop(file);
                // Best effort: the error below is what matters, and the file holds nothing yet.
                let _ = rustix::fs::unlinkat(&**fd, part_name.as_str(), AtFlags::empty());
                return Err(map_io(&part_path, "size", size, e));
            }
        };
        Ok(PartFile::opened(
            target, file, identity, size, overwrite, false,
        ))
    }

    /// The part file `file` (of `size` bytes, with `identity`) of `target`; `resumed`: picked
    /// up from an earlier transfer, its journal kept, rather than created by this one.
    fn opened(
        target: Target<'_>,
        file: File,
        identity: Identity,
        size: u64,
        overwrite: bool,
        resumed: bool,
    ) -> PartFile {
        let Target {
            dir,
            name,
            final_path,
            ..
        } = target;
        let (part_name, journal_name) = (part_file_name(name), journal_file_name(name));
        PartFile {
            slot: Slot::new(Descriptors::global(), file),
            identity,
            part_path: dir.path.join(&part_name),
            journal_path: dir.path.join(&journal_name),
            dir_at: dir,
            name: name.to_owned(),
            part_name,
            journal_name,
            final_path,
            journal: resumed,
            journal_key: None,
            block_size: 0,
            open: AtomicBool::new(true),
            size,
            new: !resumed,
            overwrite,
        }
    }

    /// Picks up where an interrupted transfer of `rel` left off: if `.<name>.hurtle-part`
    /// exists with `size` bytes beside a block journal written for `size` and `block_size`,
    /// opens the part file (journaling on) and returns it with what the journal says: blocks
    /// it vouches for with their values, and blocks it only claims, to hash again before
    /// trusting them (see [`super::journal`]). `Ok(None)` when there is nothing to resume
    /// from; then [`PartFile::create`] starts over.
    /// Refuses like `create` when the final name exists and `overwrite` is false.
    pub fn resume(
        root: &Path,
        rel: &str,
        size: u64,
        block_size: u64,
        overwrite: bool,
    ) -> Result<Option<(PartFile, Journaled)>, StoreError> {
        Self::resume_in(&OutRoot::new(root), rel, size, block_size, overwrite)
    }

    /// [`PartFile::resume`] under `out`, whose directories this transfer may have checked
    /// already.
    pub fn resume_in(
        out: &OutRoot,
        rel: &str,
        size: u64,
        block_size: u64,
        overwrite: bool,
    ) -> Result<Option<(PartFile, Journaled)>, StoreError> {
        let target = Self::target(out, rel, overwrite)?;
        let (dir, fd, name) = (&target.dir, &target.fd, target.name);
        let (part_name, journal_name) = (part_file_name(name), journal_file_name(name));
        let part_path = dir.path.join(&part_name);
        // Most files have no part file: then the journal is not looked for.
        if out.known_missing(&part_path) {
            return Ok(None);
        }
        let Ok(file) = open_at(&**fd, &part_name, OFlags::RDWR, 0) else {
            return Ok(None);
        };
        let Ok(mut journal) = open_at(&**fd, &journal_name, OFlags::RDWR | OFlags::APPEND, 0)
        else {
            return Ok(None);
        };
        let regular = |f: &File| f.metadata().ok().filter(|m| m.is_file());
        let (identity, inode, ctime) = match (regular(&file), regular(&journal)) {
            (Some(m), Some(j)) if m.len() == size && j.len() <= 256 << 20 => {
                (Identity::of(&m), m.ino(), (m.ctime(), m.ctime_nsec()))
            }
            _ => return Ok(None),
        };
        let mut text = Vec::new();
        if io::Read::read_to_end(&mut journal, &mut text).is_err() {
            return Ok(None);
        }
        let scope = JournalScope {
            inode,
            size,
            block_size,
        };
        let Some(journaled) = parse_journal(&text, scope, ctime) else {
            return Ok(None);
        };
        let mut part = PartFile::opened(target, file, identity, size, overwrite, true);
        part.block_size = block_size;
        match journaled.key {
            // Appends go after the last complete line (a torn last line is cut off).
            Some(key) => {
                let keep = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
                if journal.set_len(keep as u64).is_err() {
                    return Ok(None);
                }
                part.journal_key = Some(key);
            }
            // A version 1 journal vouches for nothing: a new one, whose lines will.
            None => {
                drop(journal);
                part.keep_journal(block_size)?;
            }
        }
        Ok(Some((part, journaled)))
    }

    /// Starts a block journal for this file (blocks of `block_size` bytes), replacing any
    /// other, with a new key: from now on [`PartFile::record_blocks`] lists the blocks that
    /// passed verification, so that an interrupted transfer can resume. Without it, an
    /// interrupted transfer starts over.
    pub fn keep_journal(&mut self, block_size: u64) -> Result<(), StoreError> {
        let key: JournalKey = rand::random();
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC;
        let mut journal = self
            .dir_fd()
            .and_then(|dir| open_at(&*dir, &self.journal_name, flags, 0o600))
            .map_err(|e| map_io(&self.journal_path, "create", 0, e))?;
        io::Write::write_all(
            &mut journal,
            journal_header(self.size, block_size, &key).as_bytes(),
        )
        .map_err(|e| map_io(&self.journal_path, "write", 0, e))?;
        self.journal = true;
        self.journal_key = Some(key);
        self.block_size = block_size;
        Ok(())
    }

    /// Notes in the block journal that these blocks (counted within this file, with their
    /// verified values) were written and passed verification, with one write. Best effort and
    /// not synced: a lost line costs that block's refetch on resume, nothing more; the lines
    /// are trusted only once the journal is sealed ([`PartFile::seal_journal`]). Does nothing
    /// once the file is committed (its journal is gone and is not created again).
    pub fn record_blocks(&self, blocks: &[(u64, BlockValue)]) {
        if blocks.is_empty() {
            return;
        }
        self.append_journal(|key, scope| {
            blocks
                .iter()
                .map(|(i, v)| entry_line(key, scope, *i, v))
                .collect()
        });
    }

    /// Seals the journal, as closing the part file does (dropping it without putting it in
    /// place): syncs the part file (data and times: `fsync`), then notes its change time in a
    /// MACed line. A resume trusts the journal's lines only while the part file's change time
    /// is still the sealed one: nothing wrote into it since (a crash or a kill -9 leaves no
    /// seal, and then every block is hashed again). Best effort, like the lines.
    pub fn seal_journal(&self) {
        if !self.journal || self.journal_key.is_none() || !self.open.load(Ordering::Relaxed) {
            return;
        }
        let Ok(file) = self.file() else {
            return;
        };
        if file.sync_all().is_err() {
            return;
        }
        let Ok(meta) = file.metadata() else {
            return;
        };
        let ctime = (meta.ctime(), meta.ctime_nsec());
        self.append_journal(|key, scope| seal_line(key, scope, ctime));
    }

    /// Appends what `lines` makes (given the journal's key and scope) to the journal, if this
    /// file keeps one.
    fn append_journal(&self, lines: impl FnOnce(&JournalKey, JournalScope) -> String) {
        let Some(key) = self.journal_key.filter(|_| self.journal) else {
            return;
        };
        if !self.open.load(Ordering::Relaxed) {
            return;
        }
        let Ok(meta) = self.file().and_then(|f| {
            f.metadata()
                .map_err(|e| map_io(&self.part_path, "inspect", 0, e))
        }) else {
            return;
        };
        let scope = JournalScope {
            inode: meta.ino(),
            size: self.size,
            block_size: self.block_size,
        };
        let flags = OFlags::WRONLY | OFlags::APPEND;
        let journal = self
            .dir_fd()
            .and_then(|dir| open_at(&*dir, &self.journal_name, flags, 0));
        if let Ok(mut j) = journal {
            let _ = io::Write::write_all(&mut j, lines(&key, scope).as_bytes());
        }
    }

    /// Checks `rel` and the final name: the directory to work in (created as needed), the
    /// file name, and the final path.
    fn target<'a>(out: &OutRoot, rel: &'a str, overwrite: bool) -> Result<Target<'a>, StoreError> {
        sanitize_rel_path(rel)?;
        let (dirs, name) = split_parent(rel);
        let dir = out.ensure_dirs(dirs, rel)?;
        let fd = dir.open()?;
        let final_path = dir.path.join(name);
        let target = Target {
            dir,
            fd,
            name,
            final_path,
        };
        if out.known_missing(&target.final_path) {
            return Ok(target);
        }
        let final_path = target.final_path.clone();
        match rustix::fs::statat(&*target.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) if !overwrite => {
                return Err(StoreError::DestinationExists { path: final_path });
            }
            Ok(st) if rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir() => {
                return Err(StoreError::Io {
                    op: "replace",
                    path: final_path,
                    source: io::Error::new(ErrorKind::IsADirectory, "it is a directory"),
                })
            }
            Ok(_) | Err(Errno::NOENT) => {}
            Err(e) => return Err(map_io(&final_path, "inspect", 0, e.into())),
        }
        Ok(target)
    }

    /// The name the file gets once [`PartFile::finish`] succeeds.
    pub fn final_path(&self) -> &Path {
        &self.final_path
    }

    /// The temporary `.hurtle-part` file being written.
    pub fn part_path(&self) -> &Path {
        &self.part_path
    }

    /// The file's declared size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// True for a part file this transfer created (not resumed from an earlier one): where
    /// nothing was written yet, it reads as zeros.
    pub fn is_new(&self) -> bool {
        self.new
    }

    /// Allocates the file on disk before anything is written (`fallocate(2)` in chunks;
    /// skipped on tmpfs and ramfs), all but `holes` (ascending half-open ranges of blocks of
    /// `block_size` bytes, which stay holes): a full disk shows as [`StoreError::NoSpace`]
    /// now, not halfway through the transfer.
    pub fn preallocate(&self, holes: &[(u64, u64)], block_size: u64) -> Result<(), StoreError> {
        let mut data = Vec::new();
        let mut at = 0;
        for (start, end) in block_bytes(holes, block_size, self.size) {
            if start > at {
                data.push((at, start));
            }
            at = end;
        }
        if at < self.size {
            data.push((at, self.size));
        }
        preallocate(&*self.file()?, data.into_iter())
            .map_err(|e| map_io(&self.part_path, "preallocate", self.size, e))
    }

    /// Turns the blocks `holes` (ascending half-open ranges of blocks of `block_size` bytes)
    /// back into holes that read as zeros (`fallocate(PUNCH_HOLE)`), for a resumed part file
    /// that may hold other bytes there. Returns false where the filesystem cannot: then the
    /// bytes stay.
    pub fn punch_holes(&self, holes: &[(u64, u64)], block_size: u64) -> Result<bool, StoreError> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            use rustix::fs::{fallocate, FallocateFlags};
            let file = self.file()?;
            let mode = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
            for (start, end) in block_bytes(holes, block_size, self.size) {
                match fallocate(&*file, mode, start, end - start) {
                    Ok(()) => {}
                    Err(Errno::OPNOTSUPP) => return Ok(false),
                    Err(e) => return Err(map_io(&self.part_path, "punch a hole in", 0, e.into())),
                }
            }
            Ok(true)
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        {
            let _ = (holes, block_size);
            Ok(false)
        }
    }

    /// Gives up on the file before anything was written: removes the `.hurtle-part` file and
    /// its block journal.
    pub fn discard(self) -> Result<(), StoreError> {
        self.open.store(false, Ordering::Relaxed);
        let dir = self.dir_at.open()?;
        let _ = rustix::fs::unlinkat(&dir, self.journal_name.as_str(), AtFlags::empty());
        rustix::fs::unlinkat(&dir, self.part_name.as_str(), AtFlags::empty())
            .map_err(|e| map_io(&self.part_path, "remove", 0, e.into()))
    }

    /// The file's directory's descriptor.
    fn dir_fd(&self) -> io::Result<Arc<File>> {
        self.dir_at.fd()
    }

    /// The part file's descriptor, reopened if it was closed to make room for others; refused
    /// if the part file's path now leads to another file.
    fn file(&self) -> Result<Arc<File>, StoreError> {
        self.slot
            .get(|| {
                let file = open_at(&*self.dir_fd()?, &self.part_name, OFlags::RDWR, 0)?;
                Identity::check(&file, self.identity)?;
                Ok(file)
            })
            .map_err(|e| map_io(&self.part_path, "reopen", 0, e))
    }

    fn check_range(&self, offset: u64, len: usize) -> Result<(), StoreError> {
        let len = len as u64;
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(StoreError::OutOfRange {
                path: self.part_path.clone(),
                offset,
                len,
                size: self.size,
            }),
        }
    }

    /// Writes all of `data` at `offset`. Refuses with [`StoreError::OutOfRange`] anything past
    /// the declared size.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        self.check_range(offset, data.len())?;
        self.file()?
            .write_all_at(data, offset)
            .map_err(|e| map_io(&self.part_path, "write", data.len() as u64, e))
    }

    /// Starts writing `len` bytes from `offset` to the disk, without waiting for the disk: the
    /// final [`PartFile::sync`] then finds most of the file already written instead of
    /// writing all of it at the end. Errors are left for that sync to report.
    pub fn start_writeback(&self, offset: u64, len: u64) {
        if let Ok(file) = self.file() {
            let _ = sys::fs::start_writeback(&file, offset, len);
        }
    }

    /// Opens the part file a second time for direct writes ([`PartFile::write_direct`]:
    /// `O_DIRECT`, from the caller's buffer to the disk without a copy in the page cache),
    /// where its filesystem is a local one known to do them well (ext4, XFS, btrfs). `None`
    /// elsewhere, or where the open fails: then writes go through the page cache.
    pub fn open_direct(&self) -> Option<File> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            if !sys::fs::direct_io_suits(&*self.file().ok()?) {
                return None;
            }
            let flags = OFlags::WRONLY | OFlags::DIRECT;
            let file = open_at(&*self.dir_fd().ok()?, &self.part_name, flags, 0).ok()?;
            Identity::check(&file, self.identity).ok()?;
            Some(file)
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        None
    }

    /// Writes all of `data` at `offset` through `direct` (from [`PartFile::open_direct`]).
    /// `data` must start at a multiple of [`PartFile::DIRECT_ALIGN`] in memory, and `offset` and its
    /// length must be multiples of it. Returns `Ok(false)` where the filesystem refuses the
    /// direct write (`EINVAL`): the caller then writes the same bytes through the page cache.
    /// Refuses with [`StoreError::OutOfRange`] anything past the declared size.
    pub fn write_direct(
        &self,
        direct: &File,
        offset: u64,
        data: &[u8],
    ) -> Result<bool, StoreError> {
        self.check_range(offset, data.len())?;
        let align = Self::DIRECT_ALIGN as u64;
        if !offset.is_multiple_of(align) || !(data.len() as u64).is_multiple_of(align) {
            return Ok(false);
        }
        match direct.write_all_at(data, offset) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
            Err(e) => Err(map_io(&self.part_path, "write", data.len() as u64, e)),
        }
    }

    /// Fills `buf` from `offset` (for instance to hash what was written). Refuses with
    /// [`StoreError::OutOfRange`] anything past the declared size.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.check_range(offset, buf.len())?;
        self.file()?
            .read_exact_at(buf, offset)
            .map_err(|e| map_io(&self.part_path, "read", 0, e))
    }

    /// Flushes written data to stable storage (`fdatasync`).
    pub fn sync(&self) -> Result<(), StoreError> {
        self.file()?
            .sync_data()
            .map_err(|e| map_io(&self.part_path, "sync", 0, e))
    }

    /// Completes the file: sets its permission bits (`mode`, set-ID and sticky bits dropped)
    /// and modification time, fsyncs it, renames it to its final name and fsyncs the
    /// directory. Returns the final path.
    ///
    /// Without `overwrite` the final name is checked again just before the rename and
    /// [`StoreError::DestinationExists`] returned if something appeared there meanwhile. On
    /// error the `.hurtle-part` file stays.
    pub fn finish(self, mode: u32, mtime_ns: i64) -> Result<PathBuf, StoreError> {
        self.commit(mode, mtime_ns)
    }

    /// [`PartFile::finish`] for a file shared between threads (behind an `Arc`): the same steps;
    /// the caller must not write to it afterwards.
    pub fn commit(&self, mode: u32, mtime_ns: i64) -> Result<PathBuf, StoreError> {
        self.seal(mode, mtime_ns)?;
        let path = self.rename_into_place()?;
        sync_dir(self.dir())?;
        Ok(path)
    }

    /// The first step of [`PartFile::commit`]: sets the file's permission bits and
    /// modification time and fsyncs it. Many files are committed faster sealed all first,
    /// then renamed, then each directory synced once, than each committed in turn (one
    /// directory sync per file).
    pub fn seal(&self, mode: u32, mtime_ns: i64) -> Result<(), StoreError> {
        let part = &self.part_path;
        let file = self.file()?;
        file.set_permissions(Permissions::from_mode(mode & MODE_MASK))
            .map_err(|e| map_io(part, "set permissions of", 0, e))?;
        let t = system_time_from_ns(part, mtime_ns)?;
        file.set_modified(t)
            .map_err(|e| map_io(part, "set modification time of", 0, e))?;
        file.sync_all().map_err(|e| map_io(part, "sync", 0, e))
    }

    /// The second step of [`PartFile::commit`], after [`PartFile::seal`]: renames the part
    /// file to its final name (without `overwrite`, checking once more that nothing appeared
    /// there) and removes its journal. The rename is durable once [`sync_dir`] has synced
    /// [`PartFile::dir`]. Returns the final path.
    pub fn rename_into_place(&self) -> Result<PathBuf, StoreError> {
        let dir = self.dir_at.open()?;
        let (from, to) = (self.part_name.as_str(), self.name.as_str());
        let exists = || StoreError::DestinationExists {
            path: self.final_path.clone(),
        };
        let renamed = if self.overwrite {
            rustix::fs::renameat(&dir, from, &dir, to)
        } else {
            match rustix::fs::renameat_with(&dir, from, &dir, to, RenameFlags::NOREPLACE) {
                // A filesystem without RENAME_NOREPLACE: look just before the rename instead.
                Err(Errno::INVAL) => {
                    match rustix::fs::statat(&dir, to, AtFlags::SYMLINK_NOFOLLOW) {
                        Ok(_) => return Err(exists()),
                        Err(Errno::NOENT) => rustix::fs::renameat(&dir, from, &dir, to),
                        Err(e) => return Err(map_io(&self.final_path, "inspect", 0, e.into())),
                    }
                }
                r => r,
            }
        };
        match renamed {
            Ok(()) => self.open.store(false, Ordering::Relaxed),
            Err(Errno::EXIST) if !self.overwrite => return Err(exists()),
            Err(e) => return Err(map_io(&self.final_path, "rename into place", 0, e.into())),
        }
        // The journal's blocks are in place now (a file without one had any stale journal
        // removed when it was created). Best effort: a journal left behind has no part file
        // to resume and is removed by the next `create`.
        if self.journal {
            let _ = rustix::fs::unlinkat(&dir, self.journal_name.as_str(), AtFlags::empty());
        }
        Ok(self.final_path.clone())
    }

    /// The directory the file lands in.
    pub fn dir(&self) -> &Path {
        &self.dir_at.path
    }
}

/// Where a received file goes: its directory (with a descriptor), its name and final path.
struct Target<'a> {
    dir: Arc<DirAt>,
    fd: Arc<File>,
    name: &'a str,
    final_path: PathBuf,
}

/// Closing a part file that is still one (an interrupted transfer's) seals its journal
/// ([`PartFile::seal_journal`]): by then every thread that wrote into it let go of it.
impl Drop for PartFile {
    fn drop(&mut self) {
        self.seal_journal();
    }
}

/// True when `dir` is on tmpfs or ramfs (memory, no disk behind it); false if it cannot say.
pub fn memory_backed_dir(dir: &Path) -> bool {
    File::open(dir).is_ok_and(|d| sys::fs::memory_backed(&d))
}

/// Fsyncs a directory, making the renames into it durable.
pub fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| map_io(dir, "sync directory", 0, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::hole_blocks;
    use crate::fs::mtime_ns;
    use crate::fs::testing::{mode_of, names_in};
    use std::fs;
    use std::os::unix::fs::{symlink, MetadataExt};

    #[test]
    fn a_part_file_closed_to_make_room_is_reopened_for_the_next_write() {
        let dir = tempfile::tempdir().unwrap();
        let part = PartFile::create(dir.path(), "f.bin", 8, false).unwrap();
        part.write_at(0, b"abcd").unwrap();
        part.slot.evict();
        part.write_at(4, b"efgh").unwrap();
        part.slot.evict();
        let mut back = [0u8; 8];
        part.read_at(0, &mut back).unwrap();
        assert_eq!(&back, b"abcdefgh");
        part.slot.evict();
        let done = part.finish(0o640, 0).unwrap();
        assert_eq!(fs::read(&done).unwrap(), b"abcdefgh");
        assert_eq!(
            fs::metadata(&done).unwrap().permissions().mode() & 0o777,
            0o640
        );
    }

    #[test]
    fn a_directory_closed_to_make_room_is_reopened_only_if_it_is_the_same_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("out");
        let out = OutRoot::new(&root);
        let a = PartFile::create_in(&out, "d/a", 1, false).unwrap();
        a.dir_at.evict();
        a.slot.evict();
        a.write_at(0, b"a").unwrap();
        a.dir_at.evict();
        a.finish(0o644, 0).unwrap();
        assert_eq!(fs::read(root.join("d/a")).unwrap(), b"a");

        // Closed, then the directory is moved away and another put at its path: the file
        // left in the moved directory is not renamed into the new one.
        let b = PartFile::create_in(&out, "d/b", 1, false).unwrap();
        b.dir_at.evict();
        fs::rename(root.join("d"), root.join("moved")).unwrap();
        fs::create_dir(root.join("d")).unwrap();
        let e = b.rename_into_place().unwrap_err();
        assert!(e.to_string().contains("another file"), "{e}");
        // A symlink at its path is refused the same way.
        fs::remove_dir(root.join("d")).unwrap();
        symlink(root.join("moved"), root.join("d")).unwrap();
        assert!(b.rename_into_place().is_err());
        assert!(names_in(&root.join("moved")).contains(&".b.hurtle-part".to_owned()));
    }

    #[test]
    fn a_part_file_replaced_while_closed_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let part = PartFile::create(dir.path(), "f.bin", 4, false).unwrap();
        part.slot.evict();
        let other = dir.path().join("other");
        fs::write(&other, b"keep").unwrap();
        fs::rename(&other, part.part_path()).unwrap();
        let e = part.write_at(0, b"evil").unwrap_err();
        assert!(e.to_string().contains("another file"), "{e}");
        assert_eq!(fs::read(part.part_path()).unwrap(), b"keep");
    }

    #[test]
    fn writeback_started_early_leaves_the_data_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..3 << 20).map(|i| (i % 251) as u8).collect();
        let part = PartFile::create(dir.path(), "w.bin", data.len() as u64, false).unwrap();
        for (i, chunk) in data.chunks(1 << 20).enumerate() {
            let at = (i << 20) as u64;
            part.write_at(at, chunk).unwrap();
            part.start_writeback(at, chunk.len() as u64);
        }
        // A range past the end is the kernel's business, not an error of ours.
        part.start_writeback(1 << 40, 1 << 20);
        let done = part.finish(0o644, 0).unwrap();
        assert_eq!(fs::read(done).unwrap(), data);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn direct_writes_land_where_the_filesystem_takes_them() {
        let mb = 1usize << 20;
        // Memory is never written directly.
        let shm = tempfile::tempdir_in("/dev/shm").expect("a tmpfs on /dev/shm");
        let part = PartFile::create(shm.path(), "m.bin", mb as u64, false).unwrap();
        assert!(part.open_direct().is_none());

        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..2 * mb).map(|i| (i % 251) as u8).collect();
        let part = PartFile::create(dir.path(), "d.bin", data.len() as u64, false).unwrap();
        let suits = sys::fs::direct_io_suits(&part.file().unwrap());
        let Some(direct) = part.open_direct() else {
            assert!(!suits, "ext4, XFS and btrfs are opened for direct writes");
            return;
        };
        assert!(rustix::fs::fcntl_getfl(&direct)
            .unwrap()
            .contains(OFlags::DIRECT));
        // Page-aligned memory, offset and length: written directly.
        let mut scratch = vec![0u8; mb + PartFile::DIRECT_ALIGN];
        let at = scratch.as_ptr().align_offset(PartFile::DIRECT_ALIGN);
        let aligned = &mut scratch[at..at + mb];
        aligned.copy_from_slice(&data[mb..]);
        assert!(part.write_direct(&direct, mb as u64, aligned).unwrap());
        // An offset or length off the page boundary is left to the page cache.
        assert!(!part.write_direct(&direct, 512, &aligned[..4096]).unwrap());
        assert!(!part.write_direct(&direct, 0, &aligned[..100]).unwrap());
        // Past the declared size: refused like any write.
        assert!(matches!(
            part.write_direct(&direct, 2 * mb as u64, &aligned[..4096]),
            Err(StoreError::OutOfRange { .. })
        ));
        part.write_at(0, &data[..mb]).unwrap();
        let done = part.finish(0o644, 0).unwrap();
        assert_eq!(fs::read(done).unwrap(), data);
    }

    #[test]
    fn part_file_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("out");
        let size = 100_000u64;
        let data: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
        let pf = Arc::new(PartFile::create(&root, "résumé/sub/日本.bin", size, false).unwrap());
        let dir = root.join("résumé/sub");
        assert_eq!(pf.part_path(), dir.join(".日本.bin.hurtle-part"));
        assert_eq!(pf.final_path(), dir.join("日本.bin"));
        assert_eq!(fs::metadata(pf.part_path()).unwrap().len(), size);
        assert!(!pf.final_path().exists());

        // Four threads write interleaved chunks, in reverse.
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let pf = Arc::clone(&pf);
                let data = &data;
                s.spawn(move || {
                    for chunk in (0..size.div_ceil(1000)).rev().filter(|c| c % 4 == t) {
                        let start = chunk * 1000;
                        let end = (start + 1000).min(size);
                        pf.write_at(start, &data[start as usize..end as usize])
                            .unwrap();
                    }
                });
            }
        });
        pf.sync().unwrap();
        let mut back = vec![0u8; 5000];
        pf.read_at(50_000, &mut back).unwrap();
        assert_eq!(&back[..], &data[50_000..55_000]);
        assert!(matches!(
            pf.write_at(size - 1, b"xy"),
            Err(StoreError::OutOfRange { .. })
        ));
        assert!(matches!(
            pf.write_at(u64::MAX, b"x"),
            Err(StoreError::OutOfRange { .. })
        ));
        assert!(matches!(
            pf.read_at(size, &mut [0u8; 1]),
            Err(StoreError::OutOfRange { .. })
        ));

        let pf = Arc::into_inner(pf).unwrap();
        let mtime = 1_234_567_890_123_456_789i64;
        let final_path = pf.finish(0o4640, mtime).unwrap();
        assert_eq!(final_path, dir.join("日本.bin"));
        assert_eq!(fs::read(&final_path).unwrap(), data);
        assert_eq!(mode_of(&final_path), 0o640, "set-ID bit dropped");
        assert_eq!(mtime_ns(&fs::metadata(&final_path).unwrap()), mtime);
        assert_eq!(names_in(&dir), vec!["日本.bin"], "no .hurtle-part left");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn holes_stay_holes_and_punched_blocks_read_as_zeros() {
        use std::os::unix::fs::MetadataExt;
        // Preallocation skips the holes (on tmpfs nothing is preallocated at all).
        let tmp = tempfile::tempdir().unwrap();
        let mb = 1u64 << 20;
        let size = 8 * mb;
        let pf = PartFile::create(tmp.path(), "p.bin", size, false).unwrap();
        pf.preallocate(&[(0, 3), (5, 8)], mb).unwrap();
        let allocated = fs::metadata(pf.part_path()).unwrap().blocks() * 512;
        assert!(
            allocated <= 2 * mb,
            "{allocated} bytes allocated of 2 MiB of data"
        );
        // Punched blocks read as zeros, the others keep their bytes.
        pf.write_at(0, &vec![9u8; size as usize]).unwrap();
        pf.punch_holes(&[(1, 2), (6, 8)], mb).unwrap();
        let mut back = vec![0u8; size as usize];
        pf.read_at(0, &mut back).unwrap();
        for (i, chunk) in back.chunks(mb as usize).enumerate() {
            let want = if i == 1 || i >= 6 { 0 } else { 9 };
            assert!(chunk.iter().all(|&b| b == want), "block {i}");
        }
        let f = File::open(pf.part_path()).unwrap();
        assert_eq!(hole_blocks(&f, size, mb).unwrap(), vec![(1, 2), (6, 8)]);
    }

    /// A write that finds the disk full (here a 1 MiB tmpfs, where nothing is preallocated) is
    /// `NoSpace`, naming the part file, and nothing appears under the final name. Needs root
    /// (to mount the tmpfs); says so and passes without it.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_write_into_a_full_disk_is_no_space() {
        use std::process::Command;
        let root = fs::read_to_string("/proc/self/status")
            .unwrap_or_default()
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
        if !root {
            eprintln!("SKIPPED a_write_into_a_full_disk_is_no_space: needs root to mount a tmpfs");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let mnt = tmp.path().join("small");
        fs::create_dir(&mnt).unwrap();
        let mount = |args: &[&str]| Command::new(args[0]).args(&args[1..]).status().unwrap();
        let m = mnt.to_str().unwrap();
        assert!(mount(&["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", m]).success());
        let result = std::panic::catch_unwind(|| {
            let pf = PartFile::create(&mnt, "big.bin", 4 << 20, false).unwrap();
            pf.preallocate(&[], 1 << 20).unwrap();
            let chunk = vec![7u8; 256 << 10];
            let err = (0..16)
                .find_map(|i| pf.write_at(i * chunk.len() as u64, &chunk).err())
                .expect("a 1 MiB filesystem takes 4 MiB");
            assert!(
                matches!(&err, StoreError::NoSpace { path, .. } if path == pf.part_path()),
                "{err:?}"
            );
            assert!(err.to_string().contains("full"), "{err}");
            drop(pf);
            assert!(
                !mnt.join("big.bin").exists(),
                "nothing under the final name"
            );
        });
        assert!(mount(&["umount", m]).success());
        result.unwrap();
    }

    #[test]
    fn free_space_and_discard() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(free_space(tmp.path()).is_some_and(|b| b > 0));
        assert_eq!(free_space(&tmp.path().join("missing")), None);
        let pf = PartFile::create(tmp.path(), "gone.bin", 1 << 20, false).unwrap();
        let part = pf.part_path().to_path_buf();
        assert_eq!(
            fs::metadata(&part).unwrap().len(),
            1 << 20,
            "has its length"
        );
        pf.discard().unwrap();
        assert!(!part.exists());
        assert!(names_in(tmp.path()).is_empty());
    }

    #[test]
    fn empty_file_and_negative_mtime() {
        let tmp = tempfile::tempdir().unwrap();
        let pf = PartFile::create(tmp.path(), "empty", 0, false).unwrap();
        let p = pf.finish(0o600, -1_500_000_000).unwrap();
        let m = fs::metadata(&p).unwrap();
        assert_eq!(m.len(), 0);
        assert_eq!((m.mtime(), m.mtime_nsec()), (-2, 500_000_000));
        assert_eq!(mtime_ns(&m), -1_500_000_000);
    }

    #[test]
    fn drop_without_finish_leaves_only_part() {
        let tmp = tempfile::tempdir().unwrap();
        let pf = PartFile::create(tmp.path(), "a/f.txt", 10, false).unwrap();
        pf.write_at(0, b"hello").unwrap();
        drop(pf);
        assert_eq!(names_in(&tmp.path().join("a")), vec![".f.txt.hurtle-part"]);
        // Creating again truncates the partial and starts over.
        let pf = PartFile::create(tmp.path(), "a/f.txt", 3, false).unwrap();
        let mut buf = [9u8; 3];
        pf.read_at(0, &mut buf).unwrap();
        assert_eq!(buf, [0, 0, 0]);
    }

    /// A part file for `rel` of `size` bytes whose journal (blocks of 4096) lists `blocks`,
    /// left as an interrupted transfer leaves it.
    fn journaled(root: &Path, rel: &str, size: u64, blocks: &[u64]) -> PartFile {
        let mut pf = PartFile::create(root, rel, size, false).unwrap();
        pf.keep_journal(4096).unwrap();
        pf.record_blocks(&valued(blocks));
        pf
    }

    /// `blocks` with made-up values (block `b`'s is `[b; 32]`).
    fn valued(blocks: &[u64]) -> Vec<(u64, BlockValue)> {
        blocks.iter().map(|&b| (b, [b as u8; 32])).collect()
    }

    /// The trusted blocks of a resume (checking their values), and the claimed ones.
    fn said(j: &Journaled) -> (Vec<u64>, Vec<u64>) {
        for &(b, v) in &j.trusted {
            assert_eq!(v, [b as u8; 32], "block {b}'s value");
        }
        (
            j.trusted.iter().map(|&(b, _)| b).collect(),
            j.claims.clone(),
        )
    }

    #[test]
    fn files_committed_in_steps_appear_only_when_renamed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let parts: Vec<PartFile> = ["d/a", "d/b"]
            .iter()
            .map(|rel| {
                let pf = PartFile::create(root, rel, 3, false).unwrap();
                pf.write_at(0, b"xyz").unwrap();
                pf
            })
            .collect();
        for pf in &parts {
            pf.seal(0o640, 1_000_000_000).unwrap();
        }
        // Sealed, not yet renamed: nothing under a final name.
        assert_eq!(
            names_in(&root.join("d")),
            vec![".a.hurtle-part", ".b.hurtle-part"]
        );
        let finals: Vec<PathBuf> = parts
            .iter()
            .map(|pf| pf.rename_into_place().unwrap())
            .collect();
        sync_dir(parts[0].dir()).unwrap();
        assert_eq!(names_in(&root.join("d")), vec!["a", "b"]);
        for f in &finals {
            let meta = fs::metadata(f).unwrap();
            assert_eq!(fs::read(f).unwrap(), b"xyz");
            assert_eq!(meta.permissions().mode() & 0o777, 0o640);
            assert_eq!(mtime_ns(&meta), 1_000_000_000);
        }
    }

    #[test]
    fn a_journal_lets_an_interrupted_file_resume() {
        use std::io::Write;
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let pf = journaled(root, "a/f", 10_000, &[0, 2]);
        pf.write_at(0, &[7; 4096]).unwrap();
        pf.record_blocks(&valued(&[0]));
        drop(pf);
        assert_eq!(
            names_in(&root.join("a")),
            vec![".f.hurtle-blocks", ".f.hurtle-part"]
        );
        // A crash tore the last line: it does not count, and the next line starts afresh.
        let journal = root.join("a/.f.hurtle-blocks");
        fs::OpenOptions::new()
            .append(true)
            .open(&journal)
            .unwrap()
            .write_all(b"1")
            .unwrap();
        let (pf, blocks) = PartFile::resume(root, "a/f", 10_000, 4096, false)
            .unwrap()
            .unwrap();
        assert_eq!(said(&blocks), (vec![0, 2], vec![]));
        let mut buf = [0u8; 4096];
        pf.read_at(0, &mut buf).unwrap();
        assert_eq!(buf, [7; 4096], "resuming keeps the data");
        pf.record_blocks(&valued(&[1]));
        drop(pf);
        let (pf, blocks) = PartFile::resume(root, "a/f", 10_000, 4096, false)
            .unwrap()
            .unwrap();
        assert_eq!(said(&blocks), (vec![0, 1, 2], vec![]));
        // Finishing removes the journal with the part file.
        pf.commit(0o644, 0).unwrap();
        assert_eq!(names_in(&root.join("a")), vec!["f"]);
    }

    #[test]
    fn nothing_is_resumed_from_a_journal_of_another_transfer() {
        use std::io::Write;
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        drop(journaled(root, "f", 10_000, &[1]));
        let resume = |size, block| PartFile::resume(root, "f", size, block, false).unwrap();
        assert!(resume(10_001, 4096).is_none(), "another size");
        assert!(resume(10_000, 8192).is_none(), "another block size");
        assert_eq!(said(&resume(10_000, 4096).unwrap().1), (vec![1], vec![]));
        // Block numbers past the file's end are dropped; a bare number is a claim.
        fs::OpenOptions::new()
            .append(true)
            .open(root.join(".f.hurtle-blocks"))
            .unwrap()
            .write_all(b"3\n99\nx\n2\n")
            .unwrap();
        assert_eq!(said(&resume(10_000, 4096).unwrap().1), (vec![1], vec![2]));
        // A part file without a journal, or a journal without its header, is not resumed.
        fs::write(root.join(".f.hurtle-blocks"), b"1\n").unwrap();
        assert!(resume(10_000, 4096).is_none());
        fs::remove_file(root.join(".f.hurtle-blocks")).unwrap();
        assert!(resume(10_000, 4096).is_none());
        // Nor with the final name taken, unless overwriting.
        drop(journaled(root, "g", 10, &[]));
        fs::write(root.join("g"), b"x").unwrap();
        assert!(matches!(
            PartFile::resume(root, "g", 10, 4096, false),
            Err(StoreError::DestinationExists { .. })
        ));
        assert!(PartFile::resume(root, "g", 10, 4096, true)
            .unwrap()
            .is_some());
    }

    #[test]
    fn torn_stale_and_forged_journal_lines_are_only_claims() {
        use std::io::Write;
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let journal = root.join(".f.hurtle-blocks");
        let append = |text: &[u8]| {
            let mut j = fs::OpenOptions::new().append(true).open(&journal).unwrap();
            j.write_all(text).unwrap();
        };
        let resume = || PartFile::resume(root, "f", 5 * 4096, 4096, false).unwrap();
        drop(journaled(root, "f", 5 * 4096, &[0, 1]));
        let text = fs::read_to_string(&journal).unwrap();
        let line1 = text.lines().nth(2).unwrap().to_owned();
        assert!(line1.starts_with("1 "), "{text}");
        // Forged: another value under block 1's MAC, and a block with a made-up MAC.
        let forged = line1.replacen(&"01".repeat(32), &"02".repeat(32), 1);
        append(format!("{forged}\n2 {} {}\n", "03".repeat(32), "00".repeat(16)).as_bytes());
        // Torn: a line cut short, then a whole one after it.
        let torn = &line1[..line1.len() - 3];
        append(format!("{}\n", torn.replacen('1', "3", 1)).as_bytes());
        assert_eq!(said(&resume().unwrap().1), (vec![0, 1], vec![2, 3]));
        // Stale: the lines of an earlier journal (another key) vouch for nothing in a new one.
        let (mut pf, _) = resume().unwrap();
        pf.keep_journal(4096).unwrap();
        pf.record_blocks(&valued(&[4]));
        drop(pf);
        append(format!("{line1}\n").as_bytes());
        assert_eq!(said(&resume().unwrap().1), (vec![4], vec![1]));
        // Another part file in its place (a copy, another inode): every line is a claim.
        let part = root.join(".f.hurtle-part");
        fs::copy(&part, root.join("copy")).unwrap();
        fs::rename(root.join("copy"), &part).unwrap();
        assert_eq!(said(&resume().unwrap().1), (vec![], vec![1, 4]));
        // A version 1 journal (numbers only): claims, and a new journal whose lines count.
        fs::write(
            &journal,
            format!("hurtle-blocks 1 size={} block=4096\n0\n2\n", 5 * 4096),
        )
        .unwrap();
        let (pf, j) = resume().unwrap();
        assert_eq!(said(&j), (vec![], vec![0, 2]));
        pf.record_blocks(&valued(&[2]));
        drop(pf);
        assert_eq!(said(&resume().unwrap().1), (vec![2], vec![]));
    }

    #[test]
    fn a_part_file_written_after_its_journal_was_sealed_is_hashed_again() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let resume = || PartFile::resume(root, "f", 5 * 4096, 4096, false).unwrap();
        // Not sealed (a kill -9 leaves the journal so): every line is a claim.
        let pf = journaled(root, "f", 5 * 4096, &[0, 3]);
        std::mem::forget(pf);
        assert_eq!(said(&resume().unwrap().1), (vec![], vec![0, 3]));
        // Sealed (the resumed part file was closed), then written by someone else.
        let (pf, _) = resume().unwrap();
        pf.record_blocks(&valued(&[0, 3]));
        drop(pf);
        assert_eq!(said(&resume().unwrap().1), (vec![0, 3], vec![]));
        std::thread::sleep(std::time::Duration::from_millis(20));
        let part = fs::OpenOptions::new()
            .write(true)
            .open(root.join(".f.hurtle-part"))
            .unwrap();
        part.write_all_at(b"damage", 5).unwrap();
        drop(part);
        assert_eq!(said(&resume().unwrap().1), (vec![], vec![0, 3]));
    }

    #[test]
    fn starting_over_removes_the_old_journal() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        drop(journaled(root, "f", 10, &[0]));
        let pf = PartFile::create(root, "f", 10, false).unwrap();
        assert_eq!(names_in(root), vec![".f.hurtle-part"]);
        pf.discard().unwrap();
        journaled(root, "f", 10, &[]).discard().unwrap();
        assert!(names_in(root).is_empty(), "discard removes both");
    }

    #[test]
    fn destination_exists() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        fs::write(root.join("f"), b"old").unwrap();
        let e = PartFile::create(root, "f", 3, false).unwrap_err();
        assert!(matches!(e, StoreError::DestinationExists { .. }), "{e:?}");
        assert!(e.to_string().starts_with("destination already exists: "));
        assert_eq!(names_in(root), vec!["f"]);

        // A dangling symlink counts as existing too.
        symlink(root.join("nowhere"), root.join("l")).unwrap();
        assert!(matches!(
            PartFile::create(root, "l", 3, false),
            Err(StoreError::DestinationExists { .. })
        ));

        // With overwrite, the old file is replaced, and a symlink is replaced, not followed.
        let pf = PartFile::create(root, "f", 3, true).unwrap();
        pf.write_at(0, b"new").unwrap();
        pf.finish(0o644, 0).unwrap();
        assert_eq!(fs::read(root.join("f")).unwrap(), b"new");
        let pf = PartFile::create(root, "l", 1, true).unwrap();
        pf.write_at(0, b"x").unwrap();
        pf.finish(0o644, 0).unwrap();
        assert!(fs::symlink_metadata(root.join("l")).unwrap().is_file());
        assert!(!root.join("nowhere").exists());

        // Something appearing under the final name during the transfer is not clobbered.
        let pf = PartFile::create(root, "g", 1, false).unwrap();
        fs::write(root.join("g"), b"theirs").unwrap();
        assert!(matches!(
            pf.finish(0o644, 0),
            Err(StoreError::DestinationExists { .. })
        ));
        assert_eq!(fs::read(root.join("g")).unwrap(), b"theirs");

        // A directory in the way is refused up front, even with overwrite.
        fs::create_dir(root.join("d")).unwrap();
        assert!(matches!(
            PartFile::create(root, "d", 1, true),
            Err(StoreError::Io { .. })
        ));
        // So is a file where a parent directory should be.
        assert!(PartFile::create(root, "f/x", 1, false).is_err());
    }
}
