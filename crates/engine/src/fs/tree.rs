//! One transfer's output directory ([`OutRoot`]) and the directories under it.
//!
//! Each directory is created and checked once per transfer, opened from its parent's descriptor
//! without following symlinks ([`super::beneath`]), and every file is created, renamed and
//! removed through its directory's descriptor
//! ([`PartFile::create_in`](super::PartFile::create_in),
//! [`PartFile::resume_in`](super::PartFile::resume_in)), so no symlink in the output tree,
//! planted before the transfer or swapped in during it, is ever followed. [`resolve_under`]
//! gives the path of what may already be there, for looking. [`make_dir`], [`set_dir_mode`]
//! and [`set_dir_times`] create directories and apply their metadata once their contents are
//! done; a transfer does that with [`OutRoot::finish_dir`], which leaves the mode of a
//! directory that was there before the transfer as it is (unless the receiver replaces what
//! exists, `--overwrite`).

use super::beneath::{self, open_at, Access};
use super::error::{map_io, StoreError};
use super::fds::{Descriptors, Identity, Slot};
use super::meta::{system_time_from_ns, MODE_MASK};
use super::path::{sanitize_rel_path, split_parent, PathError};
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::{self, File, Permissions};
use std::io::{self, ErrorKind};
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Sanitizes `rel` and joins it to `root`, refusing if any existing directory between `root`
/// and the target is a symbolic link (so a pre-existing symlink inside the output directory
/// cannot redirect writes outside it).
///
/// `root` itself may be a symlink, and the target itself is not checked: callers that open it
/// do so without following symlinks, and a rename replaces a symlink rather than following it.
pub fn resolve_under(root: &Path, rel: &str) -> Result<PathBuf, PathError> {
    OutRoot::new(root).resolve(rel)
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
    /// The directories this transfer created (their modes are the sender's to set).
    created: Mutex<HashSet<PathBuf>>,
    /// Whether [`OutRoot::finish_dir`] sets the mode of a directory that was already there.
    replace_modes: bool,
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
pub(super) struct DirAt {
    slot: Slot,
    identity: Identity,
    root: Arc<OwnedFd>,
    /// Relative to the root (`""` for the root itself).
    rel: String,
    pub(super) path: PathBuf,
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
    pub(super) fn fd(&self) -> io::Result<Arc<File>> {
        self.slot.get(|| {
            let file = File::from(beneath::open_dir(&*self.root, &self.rel, Access::Anchor)?);
            Identity::check(&file, self.identity)?;
            Ok(file)
        })
    }

    /// [`DirAt::fd`], with an error that names the directory.
    pub(super) fn open(&self) -> Result<Arc<File>, StoreError> {
        self.fd()
            .map_err(|e| map_io(&self.path, "open directory", 0, e))
    }
}

#[cfg(test)]
impl DirAt {
    /// Closes its descriptor as eviction would (for tests of reopening).
    pub(super) fn evict(&self) {
        self.slot.evict();
    }
}

impl OutRoot {
    /// `root`, with nothing checked yet.
    pub fn new(root: &Path) -> OutRoot {
        OutRoot {
            root: root.to_path_buf(),
            dirs: Mutex::new(Dirs::default()),
            listings: Mutex::new(HashMap::new()),
            created: Mutex::new(HashSet::new()),
            replace_modes: false,
        }
    }

    /// This root, whose [`OutRoot::finish_dir`] also sets the mode of directories that were
    /// there before the transfer when `overwrite` (the receiver replaces what exists).
    pub fn replacing_modes(self, overwrite: bool) -> OutRoot {
        OutRoot {
            replace_modes: overwrite,
            ..self
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
    pub(super) fn ensure_dirs(&self, dirs: &str, rel: &str) -> Result<Arc<DirAt>, StoreError> {
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
                self.created
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(path.to_path_buf());
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
    pub(super) fn note_created(&self, path: &Path) {
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

    /// Applies a directory entry's metadata once its contents are written: its modification
    /// time, and its mode if this transfer created it (or [`OutRoot::replacing_modes`] says
    /// so). A directory that was there before keeps its mode: a sender never loosens (or
    /// tightens) a directory the receiver already had, such as `~/.ssh`.
    pub fn finish_dir(&self, rel: &str, mode: u32, mtime_ns: i64) -> Result<(), StoreError> {
        let path = self.root.join(sanitize_rel_path(rel)?);
        let created = self
            .created
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&path);
        if created || self.replace_modes {
            self.set_dir_mode(rel, mode)?;
        }
        self.set_dir_times(rel, mtime_ns)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::testing::{mode_of, names_in};
    use crate::fs::{hash_open, mtime_ns, PartFile};
    use std::os::unix::fs::symlink;

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
    fn a_transfer_sets_the_mode_only_of_directories_it_created_unless_replacing() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        fs::create_dir(root.join("mine")).unwrap();
        fs::set_permissions(root.join("mine"), Permissions::from_mode(0o700)).unwrap();
        let out = OutRoot::new(root);
        out.make_dir("mine", 0o755).unwrap();
        out.make_dir("mine/new", 0o750).unwrap();
        out.make_dir("fresh/deeper", 0o751).unwrap();
        for (rel, mode) in [
            ("mine/new", 0o750),
            ("fresh/deeper", 0o751),
            ("mine", 0o755),
        ] {
            out.finish_dir(rel, mode, 1_000_000_000).unwrap();
        }
        assert_eq!(mode_of(&root.join("mine")), 0o700, "was there: kept");
        assert_eq!(mode_of(&root.join("mine/new")), 0o750);
        assert_eq!(mode_of(&root.join("fresh/deeper")), 0o751);
        // Its time is the sender's all the same.
        assert_eq!(
            mtime_ns(&fs::metadata(root.join("mine")).unwrap()),
            1_000_000_000
        );
        // A parent created on the way was created here too.
        out.finish_dir("fresh", 0o705, 0).unwrap();
        assert_eq!(mode_of(&root.join("fresh")), 0o705);
        // Replacing (--overwrite): the existing directory takes the sender's mode.
        let out = OutRoot::new(root).replacing_modes(true);
        out.make_dir("mine", 0o755).unwrap();
        out.finish_dir("mine", 0o755, 0).unwrap();
        assert_eq!(mode_of(&root.join("mine")), 0o755);
        // A symlink is refused as ever.
        symlink(root.join("mine"), root.join("link")).unwrap();
        assert!(OutRoot::new(root).finish_dir("link", 0o777, 0).is_err());
        assert_eq!(mode_of(&root.join("mine")), 0o755);
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
}
