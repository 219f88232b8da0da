//! Directories under a transfer's output root, and the files in them, opened so that no symlink
//! can redirect them.
//!
//! A path checked for symlinks and then used by name can be changed in between: someone who
//! can write to the output tree swaps a checked directory for a symlink, and a receiver
//! running as a more privileged user creates, renames or changes files wherever the link
//! points. So the receiver never uses a peer-supplied path by name. It opens the output root
//! once (the path the user gave, trusted as given), and every later operation starts from a
//! descriptor of the file's directory, opened from the root's descriptor by [`open_dir`]
//! without following any symlink, and then names only the file itself (`openat`, here
//! `open_at`, `renameat`, `unlinkat`, `fstatat`, each refusing a symlink as the last component
//! too).
//!
//! [`open_dir`] uses `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, one system call for the
//! whole path (Linux 5.6 and later), and where that is missing or forbidden walks the path one
//! component at a time with `openat(O_NOFOLLOW)`, which refuses the same paths.

use rustix::fs::{openat, openat2, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

/// How a directory is opened: as an anchor for `*at` calls only (`O_PATH`, which needs no read
/// permission), or readable (to sync it or change its metadata).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// An anchor for `*at` calls.
    Anchor,
    /// Readable: for `fsync`, `fchmod`, `futimens`.
    Read,
}

impl Access {
    fn flags(self) -> OFlags {
        let base = OFlags::DIRECTORY | OFlags::CLOEXEC;
        match self {
            Access::Anchor => base | OFlags::PATH,
            Access::Read => base | OFlags::RDONLY,
        }
    }
}

/// Opens the output root itself: the user's own path, whose symlinks are followed.
pub fn open_root(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        Access::Anchor.flags(),
        Mode::empty(),
    )?)
}

/// Opens directory `dirs` under `root`: a relative path of plain `/`-separated components
/// (`""` for the root itself). Fails with `ELOOP` or `ENOTDIR` if any component is a symlink,
/// and refuses components that could climb out (`..`, `.`, empty).
pub fn open_dir(root: impl AsFd, dirs: &str, access: Access) -> io::Result<OwnedFd> {
    if dirs.is_empty() {
        return Ok(openat(root, ".", access.flags(), Mode::empty())?);
    }
    check_components(dirs)?;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    match openat2(&root, dirs, access.flags(), Mode::empty(), resolve) {
        // No openat2 here (older kernel, or a seccomp filter that refuses it).
        Err(Errno::NOSYS | Errno::PERM) => walk(root, dirs, access),
        r => Ok(r?),
    }
}

/// [`open_dir`] one component at a time, without `openat2`.
pub fn walk(root: impl AsFd, dirs: &str, access: Access) -> io::Result<OwnedFd> {
    check_components(dirs)?;
    let step = Access::Anchor.flags() | OFlags::NOFOLLOW;
    let mut cur = openat(root, ".", step, Mode::empty())?;
    let mut parts = dirs.split('/').peekable();
    while let Some(comp) = parts.next() {
        let flags = if parts.peek().is_none() {
            access.flags() | OFlags::NOFOLLOW
        } else {
            step
        };
        // O_PATH with O_NOFOLLOW would open a symlink itself; O_DIRECTORY then fails with
        // ENOTDIR, so a symlink is never followed.
        cur = openat(&cur, comp, flags, Mode::empty())?;
    }
    Ok(cur)
}

fn check_components(dirs: &str) -> io::Result<()> {
    if dirs
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a path component that is empty, '.' or '..'",
        ));
    }
    Ok(())
}

/// Whether `e` is how [`open_dir`] or an `O_NOFOLLOW` open refuses a symlink (`ELOOP`,
/// `ENOTDIR`, or `EXDEV` for a path that would leave the root).
pub fn is_refused_link(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ELOOP | libc::ENOTDIR | libc::EXDEV)
    )
}

/// Opens `name` in directory `dir`, never following a symlink (`mode` for a file created).
pub(super) fn open_at(dir: impl AsFd, name: &str, flags: OFlags, mode: u32) -> io::Result<File> {
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(File::from(rustix::fs::openat(
        dir,
        name,
        flags,
        Mode::from_raw_mode(mode),
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    /// root/a/b/c real, root/l -> a, root/a/lb -> b, root/a/b/lc -> /tmp (outside).
    fn tree() -> (tempfile::TempDir, OwnedFd) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        fs::create_dir_all(root.join("a/b/c")).unwrap();
        symlink("a", root.join("l")).unwrap();
        symlink("b", root.join("a/lb")).unwrap();
        symlink(t.path(), root.join("a/b/lc")).unwrap();
        let fd = open_root(&root).unwrap();
        (t, fd)
    }

    fn same_dir(fd: &OwnedFd, path: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        let st = rustix::fs::fstat(fd).unwrap();
        let m = fs::metadata(path).unwrap();
        st.st_ino == m.ino() && st.st_dev == m.dev()
    }

    #[test]
    fn real_directories_open_both_ways() {
        let (t, root) = tree();
        for f in [open_dir, walk] {
            for access in [Access::Anchor, Access::Read] {
                let fd = f(&root, "a/b/c", access).unwrap();
                assert!(same_dir(&fd, &t.path().join("root/a/b/c")));
            }
        }
        let fd = open_dir(&root, "", Access::Read).unwrap();
        assert!(same_dir(&fd, &t.path().join("root")));
    }

    #[test]
    fn a_symlink_anywhere_on_the_way_is_refused_both_ways() {
        let (_t, root) = tree();
        for f in [open_dir, walk] {
            for dirs in ["l", "l/b", "a/lb", "a/lb/c", "a/b/lc"] {
                for access in [Access::Anchor, Access::Read] {
                    let e = f(&root, dirs, access).unwrap_err();
                    assert!(is_refused_link(&e), "{dirs}: {e}");
                }
            }
        }
    }

    #[test]
    fn climbing_components_are_refused_both_ways() {
        let (_t, root) = tree();
        for f in [open_dir, walk] {
            for dirs in ["..", "a/../..", "a//b", "./a", "a/"] {
                let e = f(&root, dirs, Access::Anchor).unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{dirs}");
            }
        }
    }

    #[test]
    fn a_missing_directory_is_not_found_both_ways() {
        let (_t, root) = tree();
        for f in [open_dir, walk] {
            let e = f(&root, "a/nope", Access::Anchor).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NotFound);
        }
    }
}
