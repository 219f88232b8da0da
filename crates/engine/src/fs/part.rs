//! File storage and path safety.
//!
//! This module owns every filesystem write the receiver makes, and the sender's reads:
//!
//! - [`sanitize_rel_path`] checks a peer-supplied relative path before it touches the disk:
//!   only plain `/`-separated components. [`OutRoot`] is one transfer's output directory: it
//!   creates each directory under it once, opened from its parent's descriptor without
//!   following symlinks ([`crate::fs::beneath`]), and every file is created, renamed and removed
//!   through its directory's descriptor ([`PartFile::create_in`], [`PartFile::resume_in`]), so
//!   no symlink in the output tree, planted before the transfer or swapped in during it, is
//!   ever followed. [`resolve_under`] gives the path of what may already be there, for looking.
//! - [`PartFile`] is a file being received. It is written positionally into
//!   `.<name>.hurtle-part` beside its final name ([`free_space`] lets the receiver refuse a
//!   transfer that cannot fit, and [`PartFile::preallocate`] allocates the file before data
//!   arrives, where that is cheap and useful), and [`PartFile::finish`] fsyncs it, applies
//!   mode and mtime, renames it into place and fsyncs the directory. Nothing is ever written
//!   under the final name before that rename. Beside the part file, a *block journal*
//!   `.<name>.hurtle-blocks` lists the blocks that passed verification
//!   ([`PartFile::record_blocks`]), so that a transfer interrupted by a killed peer, a lost
//!   network or a full disk can resume ([`PartFile::resume`]). The journal is a hint, not a
//!   proof: a resumed block is hashed again and checked against the sender's value before it
//!   counts, so a journal that is stale, torn or lying costs a refetch, never a wrong byte.
//! - [`make_dir`], [`set_dir_mode`] and [`set_dir_times`] create directories and apply their
//!   metadata once their contents are done.
//! - [`SourceFile`] is the sender's side: positional reads that notice when the source file
//!   changes underneath the transfer.
//! - Sparse files: [`hole_blocks`] finds the blocks of a file that lie wholly in holes (the
//!   sender leaves them out of the transfer), [`is_hole`] asks again before a source's hole is
//!   hashed as zeros instead of read, [`PartFile::preallocate`] leaves the holes unallocated
//!   and [`PartFile::punch_holes`] makes them holes again in a resumed part file. A part
//!   file's zeros are never taken from the filesystem's word ([`PartFile::is_new`]).
//!
//! Neither keeps a descriptor of its own: both borrow one from [`Descriptors`], which keeps the
//! recently used ones open and closes others to stay within the process's limit on open files;
//! a file reopened by path must still be the same file (device and inode), so a part file or
//! source replaced meanwhile is an error, never written to or read from.
//!
//! Errors are [`PathError`] (a refused path) and [`StoreError`] (everything else); every message
//! is one line naming the path. A full disk or quota is always [`StoreError::NoSpace`].

use super::beneath::{self, Access};
use super::fds::{Descriptors, Slot};
use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags};
use rustix::io::Errno;
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::{self, File, Metadata, Permissions};
use std::io::{self, ErrorKind};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Suffix of the temporary file a file is received into: `.<name>.hurtle-part`.
pub const PART_SUFFIX: &str = ".hurtle-part";

/// Suffix of the block journal beside a part file: `.<name>.hurtle-blocks`.
pub const JOURNAL_SUFFIX: &str = ".hurtle-blocks";

/// Longest accepted path component, in bytes (`NAME_MAX` on Linux).
pub const MAX_COMPONENT_LEN: usize = 255;

/// Longest accepted relative path, in bytes (`PATH_MAX` on Linux).
pub const MAX_PATH_LEN: usize = 4096;

/// Permission bits the receiver applies. Set-user-ID, set-group-ID and sticky bits coming from
/// the peer are dropped.
const MODE_MASK: u32 = 0o777;

/// Why a relative path was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    /// The path is the empty string.
    #[error("refusing empty path")]
    Empty,
    /// The path starts with `/`.
    #[error("refusing absolute path {path:?}")]
    Absolute {
        /// The refused path.
        path: String,
    },
    /// A component is `..`.
    #[error("refusing path {path:?}: it contains a '..' component")]
    ParentDir {
        /// The refused path.
        path: String,
    },
    /// A component is `.`.
    #[error("refusing path {path:?}: it contains a '.' component")]
    CurDir {
        /// The refused path.
        path: String,
    },
    /// Two `/` in a row, or a trailing `/`.
    #[error("refusing path {path:?}: it contains an empty component")]
    EmptyComponent {
        /// The refused path.
        path: String,
    },
    /// The path contains a NUL byte.
    #[error("refusing path {path:?}: it contains a NUL byte")]
    Nul {
        /// The refused path.
        path: String,
    },
    /// The path contains a backslash.
    #[error("refusing path {path:?}: it contains a backslash")]
    Backslash {
        /// The refused path.
        path: String,
    },
    /// A component starts like a Windows drive prefix (`C:`).
    #[error("refusing path {path:?}: a component starts like a Windows drive prefix")]
    DrivePrefix {
        /// The refused path.
        path: String,
    },
    /// A component is longer than [`MAX_COMPONENT_LEN`] bytes.
    #[error("refusing path {path:?}: a component is longer than {MAX_COMPONENT_LEN} bytes")]
    ComponentTooLong {
        /// The refused path.
        path: String,
    },
    /// The path is longer than [`MAX_PATH_LEN`] bytes.
    #[error("refusing path {path:?}: it is {len} bytes long, the limit is {MAX_PATH_LEN}")]
    TooLong {
        /// The refused path.
        path: String,
        /// Its length in bytes.
        len: usize,
    },
    /// An existing directory on the way to the target is a symbolic link.
    #[error("refusing path {path:?}: {link:?} is a symbolic link")]
    SymlinkInPath {
        /// The refused relative path.
        path: String,
        /// The symlink found on the way.
        link: PathBuf,
    },
    /// Inspecting a directory on the way to the target failed.
    #[error("cannot inspect {path:?}: {source}")]
    Io {
        /// The directory being inspected.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}

/// A storage operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The relative path was refused.
    #[error(transparent)]
    Path(#[from] PathError),
    /// The final name already exists and overwriting was not allowed.
    #[error("destination already exists: {path:?}")]
    DestinationExists {
        /// The existing path.
        path: PathBuf,
    },
    /// The destination filesystem is full, or a quota is exhausted (`ENOSPC`, `EDQUOT`).
    #[error("destination full: {}", no_space_detail(.path, *.needed))]
    NoSpace {
        /// The file or directory being written.
        path: PathBuf,
        /// How many bytes the failed operation asked for (0 when not about data, e.g. mkdir).
        needed: u64,
    },
    /// A positional access fell outside the file's declared size.
    #[error("{path:?}: {len} bytes at offset {offset} lie outside the file's {size} bytes")]
    OutOfRange {
        /// The file.
        path: PathBuf,
        /// Offset of the access.
        offset: u64,
        /// Length of the access.
        len: u64,
        /// The file's declared size.
        size: u64,
    },
    /// The source file's size or modification time changed since it was opened, or it is
    /// shorter than its recorded size.
    #[error("source file changed while sending: {path:?}")]
    SourceChanged {
        /// The source file.
        path: PathBuf,
    },
    /// Any other I/O failure.
    #[error("cannot {op} {path:?}: {source}")]
    Io {
        /// What was being done ("create", "write", "rename", ...).
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}

fn no_space_detail(path: &Path, needed: u64) -> String {
    if needed == 0 {
        format!("no room for {path:?}")
    } else {
        format!("no room for {needed} bytes of {path:?}")
    }
}

/// Maps an I/O error to a [`StoreError`]: `ENOSPC` and `EDQUOT` become
/// [`StoreError::NoSpace`], everything else [`StoreError::Io`].
pub(crate) fn map_io(path: &Path, op: &'static str, needed: u64, err: io::Error) -> StoreError {
    let full = matches!(err.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
        || matches!(
            err.kind(),
            ErrorKind::StorageFull | ErrorKind::QuotaExceeded
        );
    if full {
        StoreError::NoSpace {
            path: path.to_path_buf(),
            needed,
        }
    } else {
        StoreError::Io {
            op,
            path: path.to_path_buf(),
            source: err,
        }
    }
}

/// Checks a peer-supplied relative path and converts it to a [`PathBuf`].
///
/// Accepted: a non-empty, `/`-separated sequence of plain components. Refused: absolute paths,
/// `.` and `..` components, empty components (`a//b`, trailing `/`), NUL bytes, backslashes,
/// components that start like a Windows drive (`C:`), components over [`MAX_COMPONENT_LEN`]
/// bytes and paths over [`MAX_PATH_LEN`] bytes.
pub fn sanitize_rel_path(p: &str) -> Result<PathBuf, PathError> {
    let path = || p.to_owned();
    if p.is_empty() {
        return Err(PathError::Empty);
    }
    if p.len() > MAX_PATH_LEN {
        return Err(PathError::TooLong {
            path: path(),
            len: p.len(),
        });
    }
    if p.contains('\0') {
        return Err(PathError::Nul { path: path() });
    }
    if p.contains('\\') {
        return Err(PathError::Backslash { path: path() });
    }
    if p.starts_with('/') {
        return Err(PathError::Absolute { path: path() });
    }
    let mut out = PathBuf::with_capacity(p.len());
    for c in p.split('/') {
        match c {
            "" => return Err(PathError::EmptyComponent { path: path() }),
            "." => return Err(PathError::CurDir { path: path() }),
            ".." => return Err(PathError::ParentDir { path: path() }),
            _ if c.len() > MAX_COMPONENT_LEN => {
                return Err(PathError::ComponentTooLong { path: path() })
            }
            _ if is_drive_prefix(c) => return Err(PathError::DrivePrefix { path: path() }),
            _ => out.push(c),
        }
    }
    Ok(out)
}

fn is_drive_prefix(component: &str) -> bool {
    let b = component.as_bytes();
    b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b':'
}

/// Sanitizes `rel` and joins it to `root`, refusing if any existing directory between `root`
/// and the target is a symbolic link (so a pre-existing symlink inside the output directory
/// cannot redirect writes outside it).
///
/// `root` itself may be a symlink, and the target itself is not checked: callers that open it
/// do so without following symlinks, and a rename replaces a symlink rather than following it.
pub fn resolve_under(root: &Path, rel: &str) -> Result<PathBuf, PathError> {
    OutRoot::new(root).resolve(rel)
}

/// Splits a sanitized relative path into its directory part ("" if none) and its last
/// component.
fn split_parent(rel: &str) -> (&str, &str) {
    rel.rsplit_once('/').unwrap_or(("", rel))
}

/// The names in `dir` (`Some(empty)` if it does not exist), or `None` if it cannot be read or
/// holds more than [`MAX_LISTED`].
fn list_names(dir: &Path) -> Option<HashSet<OsString>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Some(HashSet::new()),
        Err(_) => return None,
    };
    let mut names = HashSet::new();
    for entry in entries {
        names.insert(entry.ok()?.file_name());
        if names.len() > MAX_LISTED {
            return None;
        }
    }
    Some(names)
}

/// The output directory of one transfer, and the directories under it that the transfer created
/// or found to be real directories, so that a transfer of many files in few directories
/// creates and checks each directory once rather than once per file.
///
/// Every file operation under it starts from a descriptor of the file's directory opened
/// through the root's descriptor without following any symlink ([`crate::fs::beneath`]), at the
/// moment of the operation: a symlink planted before the transfer, or swapped in for a
/// directory during it, is refused, never followed.
#[derive(Debug)]
pub struct OutRoot {
    root: PathBuf,
    /// The root's descriptor once created, and the directories known to be real. Threads
    /// creating part files together share it.
    dirs: Mutex<Dirs>,
    /// The names in each directory when this transfer first looked (`None`: unreadable, or
    /// more than [`MAX_LISTED`]): a name missing there needs no system call to be found
    /// missing again.
    listings: Mutex<HashMap<PathBuf, Option<HashSet<OsString>>>>,
}

#[derive(Debug, Default)]
struct Dirs {
    root: Option<Arc<OwnedFd>>,
    /// By path (the root's own too).
    known: HashMap<PathBuf, Arc<DirAt>>,
}

/// Most names of one directory kept in an [`OutRoot`]'s listing.
const MAX_LISTED: usize = 100_000;

/// A directory under an [`OutRoot`] that this transfer created or found real, opened without
/// following symlinks. Its descriptor is borrowed from [`Descriptors`] like a file's: the files
/// in it are created and renamed through it, so they stay in this directory even if someone
/// moves it or puts a symlink at its path. Reopened (after its descriptor was closed to make
/// room) from the root without following symlinks, and only if it is still the same directory.
#[derive(Debug)]
struct DirAt {
    slot: Slot,
    identity: Identity,
    root: Arc<OwnedFd>,
    /// Relative to the root (`""` for the root itself).
    rel: String,
    path: PathBuf,
}

impl DirAt {
    fn new(root: Arc<OwnedFd>, rel: &str, path: PathBuf, fd: OwnedFd) -> io::Result<DirAt> {
        let file = File::from(fd);
        let identity = Identity::of(&file.metadata()?);
        Ok(DirAt {
            slot: Slot::new(Descriptors::global(), file),
            identity,
            root,
            rel: rel.to_owned(),
            path,
        })
    }

    /// Its descriptor (an `O_PATH` anchor for `*at` calls).
    fn fd(&self) -> io::Result<Arc<File>> {
        self.slot.get(|| {
            let file = File::from(beneath::open_dir(&*self.root, &self.rel, Access::Anchor)?);
            Identity::check(&file, self.identity)?;
            Ok(file)
        })
    }

    /// [`DirAt::fd`], with an error that names the directory.
    fn open(&self) -> Result<Arc<File>, StoreError> {
        self.fd()
            .map_err(|e| map_io(&self.path, "open directory", 0, e))
    }
}

impl OutRoot {
    /// `root`, with nothing checked yet.
    pub fn new(root: &Path) -> OutRoot {
        OutRoot {
            root: root.to_path_buf(),
            dirs: Mutex::new(Dirs::default()),
            listings: Mutex::new(HashMap::new()),
        }
    }

    /// The output directory.
    pub fn path(&self) -> &Path {
        &self.root
    }

    // Sets of paths and names stay consistent whatever a panicking holder did.
    fn dirs(&self) -> std::sync::MutexGuard<'_, Dirs> {
        self.dirs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn listings(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Option<HashSet<OsString>>>> {
        self.listings.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The root's descriptor, creating the root first if missing.
    fn root_fd(&self, dirs: &mut Dirs) -> Result<Arc<OwnedFd>, StoreError> {
        if let Some(fd) = &dirs.root {
            return Ok(fd.clone());
        }
        fs::create_dir_all(&self.root).map_err(|e| map_io(&self.root, "create directory", 0, e))?;
        let fd = Arc::new(
            beneath::open_root(&self.root)
                .map_err(|e| map_io(&self.root, "open directory", 0, e))?,
        );
        dirs.root = Some(fd.clone());
        Ok(fd)
    }

    /// Creates the root if missing, then each directory of `dirs` (a sanitized relative path,
    /// possibly empty) below it, refusing symlinks on the way. Each directory is created and
    /// checked once per transfer, through its parent's descriptor; the directory `dirs` is
    /// returned with its descriptor.
    fn ensure_dirs(&self, dirs: &str, rel: &str) -> Result<Arc<DirAt>, StoreError> {
        let mut known = self.dirs();
        let root = self.root_fd(&mut known)?;
        let mut cur = self.root.clone();
        let mut dir = match known.known.get(&cur) {
            Some(d) => d.clone(),
            None => {
                let d = beneath::open_dir(&*root, "", Access::Anchor)
                    .and_then(|fd| DirAt::new(root.clone(), "", cur.clone(), fd))
                    .map_err(|e| map_io(&cur, "open directory", 0, e))?;
                let d = Arc::new(d);
                known.known.insert(cur.clone(), d.clone());
                d
            }
        };
        let mut at = 0;
        for comp in dirs.split('/').filter(|c| !c.is_empty()) {
            cur.push(comp);
            at += comp.len() + usize::from(at > 0);
            if let Some(d) = known.known.get(&cur) {
                dir = d.clone();
                continue;
            }
            let parent = dir.open()?;
            self.make_in(&parent, comp, &cur, 0o777)?;
            let fd = beneath::walk(&*parent, comp, Access::Anchor)
                .map_err(|e| self.refused(rel, &cur, e))?;
            let d = DirAt::new(root.clone(), &dirs[..at], cur.clone(), fd)
                .map_err(|e| map_io(&cur, "open directory", 0, e))?;
            dir = Arc::new(d);
            known.known.insert(cur.clone(), dir.clone());
        }
        Ok(dir)
    }

    /// Creates directory `name` (at `path`) in `parent` with `mode` (less the umask), noting it
    /// as created and empty. Returns whether it was created (false: something is there).
    fn make_in(
        &self,
        parent: &File,
        name: &str,
        path: &Path,
        mode: u32,
    ) -> Result<bool, StoreError> {
        match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(mode)) {
            Ok(()) => {
                self.note_created(path);
                // Created just now: nothing in it yet.
                self.listings()
                    .insert(path.to_path_buf(), Some(HashSet::new()));
                Ok(true)
            }
            Err(Errno::EXIST) => Ok(false),
            Err(e) => Err(map_io(path, "create directory", 0, e.into())),
        }
    }

    /// The error for `rel` when opening `path` under the root failed with `e`: a refused
    /// symlink names the first symlink on the way (looked up for the message only).
    fn refused(&self, rel: &str, path: &Path, e: io::Error) -> StoreError {
        if beneath::is_refused_link(&e) {
            let mut cur = self.root.clone();
            let below = path.strip_prefix(&self.root).unwrap_or(path);
            for comp in below.components() {
                cur.push(comp);
                match fs::symlink_metadata(&cur) {
                    Ok(m) if m.file_type().is_symlink() => {
                        return PathError::SymlinkInPath {
                            path: rel.to_owned(),
                            link: cur,
                        }
                        .into()
                    }
                    Ok(m) if !m.is_dir() => {
                        return StoreError::Io {
                            op: "open directory",
                            path: cur,
                            source: io::Error::new(
                                ErrorKind::NotADirectory,
                                "a non-directory is in the way",
                            ),
                        }
                    }
                    _ => {}
                }
            }
        }
        map_io(path, "open directory", 0, e)
    }

    /// Whether `path` (in a directory under this root) was missing when this transfer first
    /// listed its directory, and has not been created by it since. Only a hint for skipping a
    /// look-up whose answer would be "missing": a name that appears later is caught where it
    /// matters, by the rename that refuses to replace it.
    pub fn known_missing(&self, path: &Path) -> bool {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return false;
        };
        let mut listings = self.listings();
        let listing = listings
            .entry(dir.to_path_buf())
            .or_insert_with(|| list_names(dir));
        listing.as_ref().is_some_and(|names| !names.contains(name))
    }

    /// Notes that this transfer created `path`, so that [`OutRoot::known_missing`] stays true
    /// to it.
    fn note_created(&self, path: &Path) {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return;
        };
        let mut listings = self.listings();
        if let Some(Some(names)) = listings.get_mut(dir) {
            names.insert(name.to_os_string());
        }
    }

    /// [`resolve_under`] this root, skipping the directories already checked. The path is for
    /// looking at what is there (is the file already here?); writes go through the
    /// descriptors of [`crate::fs::beneath`].
    pub fn resolve(&self, rel: &str) -> Result<PathBuf, PathError> {
        let rel_path = sanitize_rel_path(rel)?;
        let (dirs, _) = split_parent(rel);
        let known = self.dirs();
        let mut cur = self.root.clone();
        for comp in Path::new(dirs).components() {
            cur.push(comp);
            if known.known.contains_key(&cur) {
                continue;
            }
            match fs::symlink_metadata(&cur) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(PathError::SymlinkInPath {
                        path: rel.to_owned(),
                        link: cur,
                    })
                }
                Ok(_) => {}
                // Nothing deeper exists, so nothing deeper can be a symlink.
                Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
                    break
                }
                Err(e) => {
                    return Err(PathError::Io {
                        path: cur,
                        source: e,
                    })
                }
            }
        }
        Ok(self.root.join(rel_path))
    }

    /// Opens what is at `rel` under the root for reading (to hash a file that is already
    /// here), following no symlink on the way or at the end.
    pub fn open_existing(&self, rel: &str) -> Result<File, StoreError> {
        sanitize_rel_path(rel)?;
        let (dirs, name) = split_parent(rel);
        let dir = self.open_below(dirs, rel, Access::Anchor)?;
        let path = self.root.join(rel);
        open_at(&dir, name, OFlags::RDONLY, 0).map_err(|e| map_io(&path, "open", 0, e))
    }

    /// Creates directory `rel` under the root, and any missing parents, refusing symlinks on
    /// the way. Returns its path.
    ///
    /// If it is created here it gets `mode`'s permission bits plus owner read/write/execute,
    /// so that its contents can be written; apply the exact mode with
    /// [`OutRoot::set_dir_mode`] once they are done. An existing directory is left as it is.
    /// Missing parents get default permissions.
    pub fn make_dir(&self, rel: &str, mode: u32) -> Result<PathBuf, StoreError> {
        sanitize_rel_path(rel)?;
        let (dirs, name) = split_parent(rel);
        let parent = self.ensure_dirs(dirs, rel)?;
        let path = parent.path.join(name);
        let parent_fd = parent.open()?;
        if self.make_in(&parent_fd, name, &path, 0o700)? {
            let dir = beneath::walk(&*parent_fd, name, Access::Read)
                .map_err(|e| self.refused(rel, &path, e))?;
            rustix::fs::fchmod(&dir, Mode::from_raw_mode((mode & MODE_MASK) | 0o700))
                .map_err(|e| map_io(&path, "set permissions of", 0, e.into()))?;
        }
        // Checks that it is a real directory, and keeps it for the files to come.
        self.ensure_dirs(rel, rel)?;
        Ok(path)
    }

    /// Opens existing directory `rel` under the root for metadata changes, refusing symlinks
    /// anywhere from the root down to and including the directory itself.
    fn open_dir(&self, rel: &str) -> Result<(PathBuf, File), StoreError> {
        sanitize_rel_path(rel)?;
        Ok((
            self.root.join(rel),
            self.open_below(rel, rel, Access::Read)?,
        ))
    }

    /// Opens directory `dirs` under the root from the root's descriptor, following no symlink
    /// (for `rel`, whose directory it is or which it is, named in an error).
    fn open_below(&self, dirs: &str, rel: &str, access: Access) -> Result<File, StoreError> {
        let root = self.root_fd(&mut self.dirs())?;
        let path = self.root.join(dirs);
        beneath::open_dir(&*root, dirs, access)
            .map(File::from)
            .map_err(|e| self.refused(rel, &path, e))
    }

    /// Sets the permission bits of existing directory `rel` (set-ID and sticky bits dropped).
    /// Call it after the directory's contents are written: a read-only mode would otherwise
    /// stop them from being created.
    pub fn set_dir_mode(&self, rel: &str, mode: u32) -> Result<(), StoreError> {
        let (path, dir) = self.open_dir(rel)?;
        dir.set_permissions(Permissions::from_mode(mode & MODE_MASK))
            .map_err(|e| map_io(&path, "set permissions of", 0, e))
    }

    /// Sets the modification time of existing directory `rel`. Call it after the directory's
    /// contents are written, since creating a file in it changes its mtime.
    pub fn set_dir_times(&self, rel: &str, mtime_ns: i64) -> Result<(), StoreError> {
        let (path, dir) = self.open_dir(rel)?;
        let t = system_time_from_ns(&path, mtime_ns)?;
        dir.set_modified(t)
            .map_err(|e| map_io(&path, "set modification time of", 0, e))
    }
}

/// [`OutRoot::make_dir`] under `root`.
pub fn make_dir(root: &Path, rel: &str, mode: u32) -> Result<PathBuf, StoreError> {
    OutRoot::new(root).make_dir(rel, mode)
}

/// [`OutRoot::set_dir_mode`] under `root`.
pub fn set_dir_mode(root: &Path, rel: &str, mode: u32) -> Result<(), StoreError> {
    OutRoot::new(root).set_dir_mode(rel, mode)
}

/// [`OutRoot::set_dir_times`] under `root`.
pub fn set_dir_times(root: &Path, rel: &str, mtime_ns: i64) -> Result<(), StoreError> {
    OutRoot::new(root).set_dir_times(rel, mtime_ns)
}

/// Converts nanoseconds since the Unix epoch (possibly negative) to a [`SystemTime`].
fn system_time_from_ns(path: &Path, ns: i64) -> Result<SystemTime, StoreError> {
    let d = Duration::from_nanos(ns.unsigned_abs());
    let t = if ns >= 0 {
        SystemTime::UNIX_EPOCH.checked_add(d)
    } else {
        SystemTime::UNIX_EPOCH.checked_sub(d)
    };
    t.ok_or_else(|| StoreError::Io {
        op: "set modification time of",
        path: path.to_path_buf(),
        source: io::Error::new(ErrorKind::InvalidInput, "time out of range"),
    })
}

/// Modification time of `meta` in nanoseconds since the Unix epoch (saturating far outside
/// ±292 years).
pub(crate) fn mtime_ns(meta: &Metadata) -> i64 {
    meta.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.mtime_nsec())
}

/// Name of the temporary file for final name `name`: `.<name>.hurtle-part`, or, when that would
/// exceed [`MAX_COMPONENT_LEN`], a shortened name that keeps a hash of the full one (so it is
/// still unique and stable across runs).
fn part_file_name(name: &str) -> String {
    hidden_name(name, PART_SUFFIX)
}

/// Name of the block journal for final name `name`, shortened like [`part_file_name`].
fn journal_file_name(name: &str) -> String {
    hidden_name(name, JOURNAL_SUFFIX)
}

/// `.<name><suffix>`, or a shortened name with a hash of `name` where that is too long.
fn hidden_name(name: &str, suffix: &str) -> String {
    let plain = format!(".{name}{suffix}");
    if plain.len() <= MAX_COMPONENT_LEN {
        return plain;
    }
    const HASH_HEX: usize = 16;
    let hash = blake3::hash(name.as_bytes()).to_hex();
    let hash = hash.get(..HASH_HEX).unwrap_or_default();
    // "." + prefix + "~" + hash + suffix
    let budget = MAX_COMPONENT_LEN - 2 - HASH_HEX - suffix.len();
    let mut cut = budget.min(name.len());
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!(".{}~{hash}{suffix}", &name[..cut])
}

/// The first line of a block journal: what the blocks are blocks of. A journal whose header
/// does not match the transfer (another size or block size) is not resumed from.
fn journal_header(size: u64, block_size: u64) -> String {
    format!("hurtle-blocks 1 size={size} block={block_size}\n")
}

/// The block numbers a journal lists, if its header matches `size` and `block_size`: sorted,
/// without repeats, each below the file's block count. A line that is not a complete decimal
/// number (a write torn by a crash) is skipped.
fn parse_journal(text: &[u8], size: u64, block_size: u64) -> Option<Vec<u64>> {
    let header = journal_header(size, block_size);
    let rest = text.strip_prefix(header.as_bytes())?;
    let count = size.div_ceil(block_size.max(1));
    let mut blocks: Vec<u64> = rest
        .split_inclusive(|&b| b == b'\n')
        .filter_map(|line| line.strip_suffix(b"\n"))
        .filter_map(|line| std::str::from_utf8(line).ok()?.parse::<u64>().ok())
        .filter(|&b| b < count)
        .collect();
    blocks.sort_unstable();
    blocks.dedup();
    Some(blocks)
}

/// How much [`preallocate`] asks the kernel for per call. One call for a whole large file can
/// be a long uninterruptible stretch of kernel work; under a CPU quota (cgroup `cpu.max`),
/// Linux charges that debt when the call returns and then stalls every thread of the process,
/// the keep-alive sender included, until it is repaid (14 s at 3% of a core after one 0.44 s
/// call, when tmpfs was still preallocated). Chunks keep each stall short enough for
/// keep-alives to get out.
const PREALLOCATE_CHUNK: u64 = 16 << 20;

/// Allocates `file`'s first `size` bytes on disk, a chunk at a time, so that a full disk shows
/// before the transfer starts and the file is laid out in one piece where the filesystem can.
/// Left alone: filesystems that cannot allocate ahead (`fallocate(2)` says `EOPNOTSUPP`; no
/// emulation by writing zeros, as `posix_fallocate` would do), and memory-backed ones (tmpfs,
/// ramfs), where allocating only zero-fills pages the writes fill anyway (0.3 s of CPU per GiB
/// before the first byte moves, for no layout to gain; [`free_space`] covers the full-disk
/// check there).
#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
fn preallocate(file: &File, ranges: impl Iterator<Item = (u64, u64)>) -> io::Result<()> {
    if sys::memory_backed(file) {
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
        match sys::allocate(file, done, chunk) {
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
fn preallocate(_file: &File, _ranges: impl Iterator<Item = (u64, u64)>) -> io::Result<()> {
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
fn block_bytes(
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

/// The system calls behind [`preallocate`], [`free_space`], [`PartFile::start_writeback`] and
/// [`raise_open_file_limit`]: the only `unsafe` in this file.
#[cfg(unix)]
#[allow(unsafe_code)]
mod sys {
    use std::fs::File;
    use std::io;
    use std::os::fd::AsRawFd;
    use std::path::Path;

    /// A file offset or length as the system calls take it.
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
    fn as_off<T: TryFrom<u64>>(v: u64) -> io::Result<T> {
        T::try_from(v).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file too large"))
    }

    /// Allocates `len` bytes at `offset` of `file` (`fallocate(2)` mode 0; `posix_fallocate` on
    /// FreeBSD, where it is the native call).
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
    pub(super) fn allocate(file: &File, offset: u64, len: u64) -> io::Result<()> {
        let (off, len): (libc::off_t, libc::off_t) = (as_off(offset)?, as_off(len)?);
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            // SAFETY: the descriptor belongs to `file`, which outlives the call; fallocate only
            // uses it during the call and touches no memory of ours.
            if unsafe { libc::fallocate(file.as_raw_fd(), 0, off, len) } == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        }
        #[cfg(target_os = "freebsd")]
        {
            // SAFETY: as above.
            match unsafe { libc::posix_fallocate(file.as_raw_fd(), off, len) } {
                0 => Ok(()),
                e => Err(io::Error::from_raw_os_error(e)),
            }
        }
    }

    /// Starts writing `len` bytes at `offset` of `file` back to the disk without waiting for
    /// them (`sync_file_range(SYNC_FILE_RANGE_WRITE)`).
    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub(super) fn start_writeback(file: &File, offset: u64, len: u64) -> io::Result<()> {
        let (off, len): (libc::off64_t, libc::off64_t) = (as_off(offset)?, as_off(len)?);
        // SAFETY: the descriptor belongs to `file`, which outlives the call; sync_file_range
        // only uses it during the call and touches no memory of ours.
        let done = unsafe {
            libc::sync_file_range(file.as_raw_fd(), off, len, libc::SYNC_FILE_RANGE_WRITE)
        };
        if done == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Elsewhere the final fsync does all the writing.
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    pub(super) fn start_writeback(_file: &File, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }

    /// True when `file` is on tmpfs or ramfs.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    // The magic numbers' and `f_type`'s integer types differ between targets.
    #[allow(clippy::unnecessary_cast)]
    pub(super) fn memory_backed(file: &File) -> bool {
        let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
        // SAFETY: `st` is writable for one statfs and only read after the call succeeded.
        if unsafe { libc::fstatfs(file.as_raw_fd(), st.as_mut_ptr()) } != 0 {
            return false;
        }
        // SAFETY: fstatfs returned 0, so `st` is initialised.
        let kind = unsafe { st.assume_init() }.f_type;
        /// `RAMFS_MAGIC` from linux/magic.h (the libc crate does not have it).
        const RAMFS_MAGIC: i64 = 0x8584_58f6;
        let kind = kind as i64;
        kind == libc::TMPFS_MAGIC as i64 || kind == RAMFS_MAGIC
    }

    /// FreeBSD's tmpfs is not told apart: preallocation there costs what it costs.
    #[cfg(target_os = "freebsd")]
    pub(super) fn memory_backed(_file: &File) -> bool {
        false
    }

    /// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the soft limit then in force
    /// (`None` if it cannot be read; `u64::MAX` when unlimited).
    pub(super) fn raise_open_file_limit() -> Option<u64> {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `lim` is a valid, writable rlimit for the duration of the call.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            // SAFETY: `raised` is a valid rlimit that the kernel only reads.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
        // rlim_t is u64 on Linux, but not everywhere.
        #[allow(clippy::unnecessary_cast)]
        Some(if lim.rlim_cur == libc::RLIM_INFINITY {
            u64::MAX
        } else {
            lim.rlim_cur as u64
        })
    }

    /// `statvfs`: bytes available to unprivileged writers on the filesystem holding `dir`.
    pub(super) fn free_space(dir: &Path) -> Option<u64> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
        let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
        // SAFETY: `path` is a valid NUL-terminated string and `st` is writable for one
        // statvfs; it is only read after the call succeeded.
        if unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) } != 0 {
            return None;
        }
        // SAFETY: statvfs returned 0, so `st` is initialised.
        let st = unsafe { st.assume_init() };
        #[allow(clippy::useless_conversion)]
        let (avail, frsize) = (u64::from(st.f_bavail), u64::from(st.f_frsize));
        Some(avail.saturating_mul(frsize))
    }
}

/// The BLAKE3 of a whole file (what `b3sum` prints), read in aligned pieces (see
/// [`crate::iobuf`]).
pub fn hash_file(path: &Path) -> io::Result<[u8; 32]> {
    hash_open(&File::open(path)?)
}

/// [`hash_file`] of a file already open. The holes of a sparse file are hashed as zeros
/// without reading them (reading one makes the kernel fill page-cache pages with zeros).
pub fn hash_open(file: &File) -> io::Result<[u8; 32]> {
    const PIECE: usize = 256 << 10;
    let meta = file.metadata()?;
    let sparse = may_have_holes(&meta);
    let mut buf = crate::iobuf::IoBuf::new(PIECE);
    let mut h = blake3::Hasher::new();
    let mut offset = 0u64;
    loop {
        let end = offset + PIECE as u64;
        if sparse && end <= meta.len() && is_hole(file, offset, end) {
            h.update(crate::iobuf::zeros(PIECE));
            offset = end;
            continue;
        }
        let piece = buf.aligned();
        let n = match file.read_at(piece, offset) {
            Ok(0) => return Ok(*h.finalize().as_bytes()),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&piece[..n]);
        offset += n as u64;
    }
}

/// Raises this process's soft limit on open files to the hard limit; returns the limit then in
/// force (`None` if the system cannot say, `u64::MAX` when unlimited). [`Descriptors`] sizes
/// itself by it.
pub(crate) fn raise_open_file_limit() -> Option<u64> {
    sys::raise_open_file_limit()
}

/// Bytes an unprivileged writer can still use on the filesystem holding `dir` (`statvfs`), or
/// `None` if the system cannot say.
pub fn free_space(dir: &Path) -> Option<u64> {
    sys::free_space(dir)
}

/// Which file a descriptor is open on (device and inode): a file reopened by path must be the
/// same one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity(u64, u64);

impl Identity {
    fn of(meta: &Metadata) -> Identity {
        Identity(meta.dev(), meta.ino())
    }

    /// Fails with [`Replaced`] unless `file` is the file `expected` names.
    fn check(file: &File, expected: Identity) -> io::Result<()> {
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
fn is_replaced(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Replaced>())
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
    size: u64,
    /// Created by this transfer (not resumed): what was never written reads as zeros.
    new: bool,
    overwrite: bool,
}

impl PartFile {
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
            size,
            new: !resumed,
            overwrite,
        }
    }

    /// Picks up where an interrupted transfer of `rel` left off: if `.<name>.hurtle-part`
    /// exists with `size` bytes beside a block journal written for `size` and `block_size`,
    /// opens the part file (journaling on) and returns it with the blocks the journal lists.
    /// `Ok(None)` when there is nothing to resume from; then [`PartFile::create`] starts over.
    /// The listed blocks are only claims: hash them again before trusting them.
    /// Refuses like `create` when the final name exists and `overwrite` is false.
    pub fn resume(
        root: &Path,
        rel: &str,
        size: u64,
        block_size: u64,
        overwrite: bool,
    ) -> Result<Option<(PartFile, Vec<u64>)>, StoreError> {
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
    ) -> Result<Option<(PartFile, Vec<u64>)>, StoreError> {
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
        let identity = match (regular(&file), regular(&journal)) {
            (Some(m), Some(j)) if m.len() == size && j.len() <= 64 << 20 => Identity::of(&m),
            _ => return Ok(None),
        };
        let mut text = Vec::new();
        if io::Read::read_to_end(&mut journal, &mut text).is_err() {
            return Ok(None);
        }
        let Some(blocks) = parse_journal(&text, size, block_size) else {
            return Ok(None);
        };
        // Appends go after the last complete line (a torn last line is cut off).
        let keep = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        if journal.set_len(keep as u64).is_err() {
            return Ok(None);
        }
        Ok(Some((
            PartFile::opened(target, file, identity, size, overwrite, true),
            blocks,
        )))
    }

    /// Starts a block journal for this file (blocks of `block_size` bytes), replacing any
    /// other: from now on [`PartFile::record_blocks`] lists the blocks that passed
    /// verification, so that an interrupted transfer can resume. Without it, an interrupted
    /// transfer starts over.
    pub fn keep_journal(&mut self, block_size: u64) -> Result<(), StoreError> {
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC;
        let mut journal = self
            .dir_fd()
            .and_then(|dir| open_at(&*dir, &self.journal_name, flags, 0o600))
            .map_err(|e| map_io(&self.journal_path, "create", 0, e))?;
        io::Write::write_all(
            &mut journal,
            journal_header(self.size, block_size).as_bytes(),
        )
        .map_err(|e| map_io(&self.journal_path, "write", 0, e))?;
        self.journal = true;
        Ok(())
    }

    /// Notes in the block journal that these blocks (counted within this file) were written
    /// and passed verification, with one write. Best effort and not synced: a lost line costs
    /// that block's refetch on resume, nothing more. Does nothing once the file is committed
    /// (its journal is gone and is not created again).
    pub fn record_blocks(&self, indices: &[u64]) {
        if !self.journal || indices.is_empty() {
            return;
        }
        let flags = OFlags::WRONLY | OFlags::APPEND;
        let journal = self
            .dir_fd()
            .and_then(|dir| open_at(&*dir, &self.journal_name, flags, 0));
        if let Ok(mut j) = journal {
            let lines: String = indices.iter().map(|i| format!("{i}\n")).collect();
            let _ = io::Write::write_all(&mut j, lines.as_bytes());
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
            let _ = sys::start_writeback(&file, offset, len);
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
            Ok(()) => {}
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

/// Opens `name` in directory `dir`, never following a symlink (`mode` for a file created).
fn open_at(dir: impl AsFd, name: &str, flags: OFlags, mode: u32) -> io::Result<File> {
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(File::from(rustix::fs::openat(
        dir,
        name,
        flags,
        Mode::from_raw_mode(mode),
    )?))
}

/// True when `dir` is on tmpfs or ramfs (memory, no disk behind it); false if it cannot say.
pub fn memory_backed_dir(dir: &Path) -> bool {
    File::open(dir).is_ok_and(|d| sys::memory_backed(&d))
}

/// Fsyncs a directory, making the renames into it durable.
pub fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| map_io(dir, "sync directory", 0, e))
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
}

impl SourceFile {
    /// Opens `path` (following symlinks) and records its size and modification time. Refuses
    /// anything but a regular file.
    pub fn open(path: &Path) -> Result<SourceFile, StoreError> {
        let file = File::open(path).map_err(|e| map_io(path, "open", 0, e))?;
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
        })
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
    use proptest::prelude::*;
    use std::fs::OpenOptions;
    use std::os::unix::fs::symlink;
    use std::sync::Arc;

    #[test]
    fn one_out_root_serves_many_files_and_still_refuses_a_planted_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("out");
        let elsewhere = tmp.path().join("elsewhere");
        fs::create_dir_all(&elsewhere).unwrap();
        fs::create_dir_all(root.join("a")).unwrap();
        symlink(&elsewhere, root.join("a/link")).unwrap();
        let out = OutRoot::new(&root);
        for i in 0..3 {
            let rel = format!("a/b/f{i}");
            assert_eq!(out.resolve(&rel).unwrap(), root.join(&rel));
            let p = PartFile::create_in(&out, &rel, 1, false).unwrap();
            p.write_at(0, &[i]).unwrap();
            assert_eq!(fs::read(p.finish(0o644, 0).unwrap()).unwrap(), [i]);
        }
        assert!(matches!(
            out.resolve("a/link/x"),
            Err(PathError::SymlinkInPath { .. })
        ));
        assert!(matches!(
            PartFile::create_in(&out, "a/link/x", 1, false),
            Err(StoreError::Path(PathError::SymlinkInPath { .. }))
        ));
        assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);
    }

    #[test]
    fn a_directory_swapped_for_a_symlink_during_the_transfer_is_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("out");
        let elsewhere = tmp.path().join("elsewhere");
        fs::create_dir_all(&elsewhere).unwrap();
        let mode_before = fs::metadata(&elsewhere).unwrap().permissions().mode();
        let out = OutRoot::new(&root);
        out.make_dir("a", 0o755).unwrap();
        let first = PartFile::create_in(&out, "a/f0", 2, false).unwrap();
        first.write_at(0, b"ok").unwrap();
        // Someone with write access to the output tree moves the checked directory away and
        // puts a symlink to another directory in its place.
        fs::rename(root.join("a"), root.join("moved")).unwrap();
        symlink(&elsewhere, root.join("a")).unwrap();
        // This transfer goes on in the directory it checked, wherever that now is.
        let second = PartFile::create_in(&out, "a/f1", 1, false).unwrap();
        second.write_at(0, b"!").unwrap();
        second.finish(0o644, 0).unwrap();
        first.finish(0o644, 0).unwrap();
        out.make_dir("a/sub", 0o755).unwrap();
        assert_eq!(names_in(&root.join("moved")), ["f0", "f1", "sub"]);
        assert_eq!(fs::read(root.join("moved/f0")).unwrap(), b"ok");
        // What goes by the path again is refused: the directory's metadata, and a new transfer.
        assert!(out.set_dir_mode("a", 0o777).is_err());
        assert!(out.set_dir_times("a", 0).is_err());
        assert!(matches!(
            PartFile::create_in(&OutRoot::new(&root), "a/f2", 1, false),
            Err(StoreError::Path(PathError::SymlinkInPath { .. }))
        ));
        assert!(
            names_in(&elsewhere).is_empty(),
            "nothing written through the symlink"
        );
        assert_eq!(
            fs::metadata(&elsewhere).unwrap().permissions().mode(),
            mode_before
        );
    }

    #[test]
    fn a_file_where_a_directory_should_be_is_a_clear_error() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("out");
        fs::create_dir_all(root.join("d")).unwrap();
        fs::write(root.join("d/a"), b"file").unwrap();
        let out = OutRoot::new(&root);
        for e in [
            PartFile::create_in(&out, "d/a/b", 1, false).unwrap_err(),
            out.make_dir("d/a", 0o755).unwrap_err(),
            out.make_dir("d/a/c", 0o755).unwrap_err(),
        ] {
            assert!(e.to_string().contains("non-directory is in the way"), "{e}");
        }
        assert_eq!(fs::read(root.join("d/a")).unwrap(), b"file");
    }

    #[test]
    fn an_existing_file_is_opened_for_hashing_without_following_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("out");
        fs::create_dir_all(root.join("d")).unwrap();
        fs::write(root.join("d/f"), b"mine").unwrap();
        fs::write(tmp.path().join("secret"), b"not yours").unwrap();
        symlink(tmp.path().join("secret"), root.join("d/leaf")).unwrap();
        symlink(tmp.path(), root.join("dirlink")).unwrap();
        let out = OutRoot::new(&root);
        let f = out.open_existing("d/f").unwrap();
        assert_eq!(hash_open(&f).unwrap(), *blake3::hash(b"mine").as_bytes());
        assert!(out.open_existing("d/leaf").is_err());
        assert!(matches!(
            out.open_existing("dirlink/secret"),
            Err(StoreError::Path(PathError::SymlinkInPath { .. }))
        ));
    }

    #[test]
    fn out_root_knows_what_was_missing_when_it_first_looked() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("out");
        fs::create_dir_all(root.join("d")).unwrap();
        fs::write(root.join("d/there"), b"x").unwrap();
        let out = OutRoot::new(&root);
        assert!(!out.known_missing(&root.join("d/there")));
        assert!(out.known_missing(&root.join("d/absent")));
        // A directory that does not exist holds nothing.
        assert!(out.known_missing(&root.join("new/f")));
        // What the transfer creates is known too.
        let p = PartFile::create_in(&out, "new/f", 1, false).unwrap();
        assert!(!out.known_missing(p.part_path()));
        assert!(!out.known_missing(&root.join("new")));
        assert!(out.known_missing(&root.join("new/f")));
        // Someone else's file appearing later is not seen here: the rename catches it.
        fs::write(root.join("new/f"), b"theirs").unwrap();
        assert!(out.known_missing(&root.join("new/f")));
        p.write_at(0, b"y").unwrap();
        assert!(matches!(
            p.finish(0o644, 0),
            Err(StoreError::DestinationExists { .. })
        ));
        assert_eq!(fs::read(root.join("new/f")).unwrap(), b"theirs");
    }

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
        a.dir_at.slot.evict();
        a.slot.evict();
        a.write_at(0, b"a").unwrap();
        a.dir_at.slot.evict();
        a.finish(0o644, 0).unwrap();
        assert_eq!(fs::read(root.join("d/a")).unwrap(), b"a");

        // Closed, then the directory is moved away and another put at its path: the file
        // left in the moved directory is not renamed into the new one.
        let b = PartFile::create_in(&out, "d/b", 1, false).unwrap();
        b.dir_at.slot.evict();
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

    #[test]
    fn hash_file_is_the_files_blake3() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0usize, 1, (256 << 10) - 1, 256 << 10, 600_001] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
            let p = dir.path().join(format!("f{len}"));
            fs::write(&p, &data).unwrap();
            assert_eq!(
                hash_file(&p).unwrap(),
                *blake3::hash(&data).as_bytes(),
                "{len}"
            );
        }
        assert!(hash_file(&dir.path().join("missing")).is_err());
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    fn mode_of(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn sanitize_table() {
        let long_comp = "x".repeat(256);
        let max_comp = "x".repeat(255);
        let long_path = vec!["abcdefg"; 600].join("/");
        let accept = [
            ("a", "a"),
            ("a/b/c.txt", "a/b/c.txt"),
            ("ok/日本.txt", "ok/日本.txt"),
            ("résumé/日本.txt", "résumé/日本.txt"),
            (".hidden", ".hidden"),
            ("...", "..."),
            ("a..b", "a..b"),
            ("notes: todo", "notes: todo"),
            ("1:x", "1:x"),
            (max_comp.as_str(), max_comp.as_str()),
        ];
        for (input, want) in accept {
            let got = sanitize_rel_path(input).unwrap_or_else(|e| panic!("{input:?}: {e}"));
            assert_eq!(got, Path::new(want), "{input:?}");
        }
        type IsExpected = fn(&PathError) -> bool;
        let refuse: &[(&str, IsExpected)] = &[
            ("", |e| matches!(e, PathError::Empty)),
            ("/etc/passwd", |e| matches!(e, PathError::Absolute { .. })),
            ("/", |e| matches!(e, PathError::Absolute { .. })),
            ("..", |e| matches!(e, PathError::ParentDir { .. })),
            ("a/../b", |e| matches!(e, PathError::ParentDir { .. })),
            ("a/..", |e| matches!(e, PathError::ParentDir { .. })),
            (".", |e| matches!(e, PathError::CurDir { .. })),
            ("./a", |e| matches!(e, PathError::CurDir { .. })),
            ("a/./b", |e| matches!(e, PathError::CurDir { .. })),
            ("a//b", |e| matches!(e, PathError::EmptyComponent { .. })),
            ("a/", |e| matches!(e, PathError::EmptyComponent { .. })),
            ("a\\b", |e| matches!(e, PathError::Backslash { .. })),
            ("..\\x", |e| matches!(e, PathError::Backslash { .. })),
            ("a\0b", |e| matches!(e, PathError::Nul { .. })),
            ("C:x", |e| matches!(e, PathError::DrivePrefix { .. })),
            ("c:", |e| matches!(e, PathError::DrivePrefix { .. })),
            ("a/D:/b", |e| matches!(e, PathError::DrivePrefix { .. })),
            (long_comp.as_str(), |e| {
                matches!(e, PathError::ComponentTooLong { .. })
            }),
            (long_path.as_str(), |e| {
                matches!(e, PathError::TooLong { len: 4799, .. })
            }),
        ];
        for (input, is_expected) in refuse {
            match sanitize_rel_path(input) {
                Ok(p) => panic!("{input:?} accepted as {p:?}"),
                Err(e) => {
                    assert!(is_expected(&e), "{input:?}: unexpected error {e:?}");
                    let msg = e.to_string();
                    assert!(!msg.contains('\n') && !msg.contains('\0'), "{msg:?}");
                }
            }
        }
    }

    proptest! {
        #[test]
        fn sanitized_paths_stay_under_root(s in "[a-zA-Z0-9./\\\\:\u{0}é]{0,24}") {
            if let Ok(p) = sanitize_rel_path(&s) {
                prop_assert!(p.is_relative());
                for c in p.components() {
                    prop_assert!(matches!(c, std::path::Component::Normal(_)), "{:?}", p);
                }
                prop_assert_eq!(p.to_str(), Some(s.as_str()));
            }
        }

        /// Whatever a journal holds after its header, what it yields is sorted, without
        /// repeats and inside the file; the lines that are whole numbers in range all count.
        #[test]
        fn any_journal_yields_only_blocks_of_the_file(
            lines in proptest::collection::vec("[0-9]{0,3}|x|[0-9]+ ", 0..40),
            torn in "[0-9]{0,2}",
        ) {
            let (size, block) = (50 * 1024 + 1, 1024);
            let mut text = journal_header(size, block).into_bytes();
            for l in &lines {
                text.extend_from_slice(l.as_bytes());
                text.push(b'\n');
            }
            text.extend_from_slice(torn.as_bytes());
            let got = parse_journal(&text, size, block).unwrap();
            let mut want: Vec<u64> = lines
                .iter()
                .filter_map(|l| l.parse::<u64>().ok())
                .filter(|&b| b < 51)
                .collect();
            want.sort_unstable();
            want.dedup();
            prop_assert_eq!(got, want);
            prop_assert!(parse_journal(&text, size + 1, block).is_none());
            prop_assert!(parse_journal(&text[1..], size, block).is_none());
        }
    }

    #[test]
    fn resolve_under_refuses_symlinked_dirs() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("out");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(root.join("real")).unwrap();
        fs::create_dir(&outside).unwrap();
        symlink(&outside, root.join("evil")).unwrap();
        symlink(&outside, root.join("real/evil2")).unwrap();

        assert_eq!(
            resolve_under(&root, "real/new/x.txt").unwrap(),
            root.join("real/new/x.txt")
        );
        assert_eq!(resolve_under(&root, "x").unwrap(), root.join("x"));
        for rel in ["evil/x", "evil/sub/x", "real/evil2/x"] {
            let e = resolve_under(&root, rel).unwrap_err();
            assert!(matches!(e, PathError::SymlinkInPath { .. }), "{rel}: {e:?}");
            let e = PartFile::create(&root, rel, 3, false).unwrap_err();
            assert!(
                matches!(e, StoreError::Path(PathError::SymlinkInPath { .. })),
                "{rel}: {e:?}"
            );
            let e = make_dir(&root, rel, 0o755).unwrap_err();
            assert!(matches!(
                e,
                StoreError::Path(PathError::SymlinkInPath { .. })
            ));
        }
        // Directory-level operations refuse the symlink itself too.
        assert!(make_dir(&root, "evil", 0o755).is_err());
        assert!(set_dir_times(&root, "evil", 0).is_err());
        assert!(set_dir_mode(&root, "evil", 0o700).is_err());
        assert!(names_in(&outside).is_empty(), "nothing written outside");
        // Refused paths are refused before touching the disk.
        assert!(matches!(
            resolve_under(&root, "../x"),
            Err(PathError::ParentDir { .. })
        ));
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
        if sys::memory_backed(&f) {
            assert_eq!(m.blocks(), 0, "tmpfs is left sparse");
        } else if m.blocks() > 0 {
            assert!(
                m.blocks() * 512 >= size,
                "{} blocks for {size} bytes",
                m.blocks()
            );
        }
    }

    /// A sparse file with data in blocks 3 and 8 of ten (1 MiB blocks, the last one short).
    fn sparse_file(dir: &Path) -> (File, u64) {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join("sparse"))
            .unwrap();
        let size = (9 << 20) + 4321;
        f.set_len(size).unwrap();
        f.write_all_at(&[1; 100], (3 << 20) + 100).unwrap();
        f.write_all_at(&[2], 8 << 20).unwrap();
        (f, size)
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

    #[cfg(target_os = "linux")]
    #[test]
    fn a_sparse_file_hashes_as_its_bytes_read() {
        for dir in [
            tempfile::tempdir().unwrap(),
            tempfile::tempdir_in("/dev/shm").unwrap(),
        ] {
            let (f, _) = sparse_file(dir.path());
            let want = blake3::hash(&fs::read(dir.path().join("sparse")).unwrap());
            assert_eq!(hash_open(&f).unwrap(), *want.as_bytes());
            assert_eq!(
                hash_file(&dir.path().join("sparse")).unwrap(),
                *want.as_bytes()
            );
        }
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

    #[cfg(target_os = "linux")]
    #[test]
    fn shared_memory_counts_as_memory_backed() {
        let tmp = tempfile::tempdir_in("/dev/shm").expect("Linux has a tmpfs on /dev/shm");
        let f = File::create(tmp.path().join("x")).unwrap();
        assert!(sys::memory_backed(&f));
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
        pf.record_blocks(blocks);
        pf
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
        pf.record_blocks(&[0]);
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
        assert_eq!(blocks, vec![0, 2]);
        let mut buf = [0u8; 4096];
        pf.read_at(0, &mut buf).unwrap();
        assert_eq!(buf, [7; 4096], "resuming keeps the data");
        pf.record_blocks(&[1]);
        drop(pf);
        let (pf, blocks) = PartFile::resume(root, "a/f", 10_000, 4096, false)
            .unwrap()
            .unwrap();
        assert_eq!(blocks, vec![0, 1, 2]);
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
        assert_eq!(resume(10_000, 4096).unwrap().1, vec![1]);
        // Block numbers past the file's end are dropped.
        fs::OpenOptions::new()
            .append(true)
            .open(root.join(".f.hurtle-blocks"))
            .unwrap()
            .write_all(b"3\n99\nx\n")
            .unwrap();
        assert_eq!(resume(10_000, 4096).unwrap().1, vec![1]);
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

    #[test]
    fn part_file_name_fits() {
        assert_eq!(part_file_name("a.txt"), ".a.txt.hurtle-part");
        let n242 = "n".repeat(242);
        assert_eq!(part_file_name(&n242).len(), 255);
        let long = "日".repeat(85); // 255 bytes
        let p = part_file_name(&long);
        assert!(p.len() <= MAX_COMPONENT_LEN, "{}", p.len());
        assert!(p.starts_with(".日") && p.ends_with(PART_SUFFIX));
        let other = format!("{}x", "日".repeat(84));
        assert_ne!(part_file_name(&other), p, "hash keeps names distinct");
        // And it really works on disk.
        let tmp = tempfile::tempdir().unwrap();
        let pf = PartFile::create(tmp.path(), &long, 2, false).unwrap();
        pf.write_at(0, b"ok").unwrap();
        let f = pf.finish(0o600, 0).unwrap();
        assert_eq!(fs::read(f).unwrap(), b"ok");
    }

    #[test]
    fn dirs_mode_and_times() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let d = make_dir(root, "x/y/ro", 0o555).unwrap();
        assert_eq!(d, root.join("x/y/ro"));
        assert_eq!(mode_of(&d), 0o755, "owner can still write into it");
        // Contents can be written, then the exact mode and time applied.
        let pf = PartFile::create(root, "x/y/ro/f", 1, false).unwrap();
        pf.write_at(0, b"z").unwrap();
        pf.finish(0o444, 0).unwrap();
        set_dir_times(root, "x/y/ro", -5_000_000_123).unwrap();
        set_dir_mode(root, "x/y/ro", 0o2555).unwrap();
        assert_eq!(mode_of(&d), 0o555);
        assert_eq!(mtime_ns(&fs::metadata(&d).unwrap()), -5_000_000_123);
        // Existing directories are accepted and left alone.
        assert_eq!(make_dir(root, "x/y/ro", 0o700).unwrap(), d);
        assert_eq!(mode_of(&d), 0o555);
        fs::set_permissions(&d, Permissions::from_mode(0o755)).unwrap();
        // A file in the way is an error.
        fs::write(root.join("file"), b"").unwrap();
        assert!(matches!(
            make_dir(root, "file", 0o755),
            Err(StoreError::Io { .. })
        ));
        assert!(set_dir_times(root, "missing", 0).is_err());
    }

    #[test]
    fn no_space_mapping() {
        let p = Path::new("/out/big.iso");
        for errno in [libc::ENOSPC, libc::EDQUOT] {
            let e = map_io(p, "write", 4096, io::Error::from_raw_os_error(errno));
            assert!(
                matches!(&e, StoreError::NoSpace { path, needed: 4096 } if path == p),
                "{e:?}"
            );
            assert_eq!(
                e.to_string(),
                "destination full: no room for 4096 bytes of \"/out/big.iso\""
            );
        }
        let e = map_io(
            p,
            "create directory",
            0,
            io::Error::from(ErrorKind::StorageFull),
        );
        assert_eq!(
            e.to_string(),
            "destination full: no room for \"/out/big.iso\""
        );
        let e = map_io(p, "write", 1, io::Error::from_raw_os_error(libc::EIO));
        assert!(matches!(e, StoreError::Io { op: "write", .. }));
        assert!(e.to_string().starts_with("cannot write \"/out/big.iso\": "));

        // A real ENOSPC from the kernel, where /dev/full exists.
        if let Ok(mut full) = OpenOptions::new().write(true).open("/dev/full") {
            use std::io::Write;
            let err = full.write_all(&[0u8; 64]).and_then(|()| full.flush());
            let err = err.expect_err("/dev/full accepted a write");
            assert!(matches!(
                map_io(p, "write", 64, err),
                StoreError::NoSpace { needed: 64, .. }
            ));
        }
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
