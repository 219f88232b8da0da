//! Symbolic links on the receiver: which link targets are safe to create
//! ([`link_escapes`], rsync's `--safe-links` rule), and creating or replacing a link through its
//! directory's descriptor ([`OutRoot::make_symlink`]), following nothing on the way or at the
//! end.
//!
//! A link is only text here: its target is never resolved, opened or checked for existence
//! (a dangling link is created as it is). Whatever is written later at a path below a link is
//! refused by [`OutRoot`], which opens every directory without following symlinks.

use super::error::{map_io, StoreError};
use super::meta::system_time_from_ns;
use super::path::{sanitize_rel_path, split_parent};
use super::tree::OutRoot;
use rustix::fs::{AtFlags, Timestamps};
use rustix::io::Errno;
use std::io;
use std::path::Path;

/// Whether a link at `rel` (a sanitized path relative to the destination, `/`-separated)
/// with target `target` points outside the destination directory, read lexically as rsync's
/// `--safe-links` reads it: an absolute target is outside; otherwise, from the link's own
/// directory, each `..` climbs one level and any other name goes down one, and a `..` above
/// the destination is outside. Nothing on the disk is looked at (a component that is itself
/// a link is not followed here, and the receiver never follows one when it writes).
pub fn link_escapes(rel: &str, target: &str) -> bool {
    if target.starts_with('/') {
        return true;
    }
    let (dirs, _) = split_parent(rel);
    let mut depth = dirs
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .count();
    for comp in target.split('/') {
        match comp {
            "" | "." => {}
            ".." => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return true,
            },
            _ => depth += 1,
        }
    }
    false
}

/// What [`OutRoot::make_symlink`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkMade {
    /// Nothing was there: the link was created.
    Created,
    /// The same link was there already: left as it was.
    Unchanged,
    /// Something else was there (a file, another link) and `replace` allowed replacing it.
    Replaced,
}

/// The name a link is first created under, beside its final name, when it replaces something.
fn temp_name(name: &str) -> String {
    format!(".{name}.hurtle-link")
}

impl OutRoot {
    /// Creates symbolic link `rel` under the root pointing at `target`, with modification
    /// time `mtime_ns`, creating missing parent directories and refusing symlinks on the way.
    ///
    /// The same link already there is left as it is ([`LinkMade::Unchanged`]). Anything else
    /// there is an error ([`StoreError::DestinationExists`]) unless `replace`, when a file or
    /// another link is replaced atomically (a link made beside it under a temporary name,
    /// then renamed over it); a directory there is always an error. The target is not
    /// checked here: callers decide which targets are safe ([`link_escapes`]).
    pub fn make_symlink(
        &self,
        rel: &str,
        target: &str,
        mtime_ns: i64,
        replace: bool,
    ) -> Result<LinkMade, StoreError> {
        sanitize_rel_path(rel)?;
        let (dirs, name) = split_parent(rel);
        let parent = self.ensure_dirs(dirs, rel)?;
        let path = parent.path.join(name);
        let dir = parent.open()?;
        let io_err = |op, e: Errno| map_io(&path, op, 0, io::Error::from(e));
        let made = match rustix::fs::symlinkat(target, &*dir, name) {
            Ok(()) => LinkMade::Created,
            Err(Errno::EXIST) => {
                let same = rustix::fs::readlinkat(&*dir, name, Vec::new())
                    .is_ok_and(|t| t.as_bytes() == target.as_bytes());
                if same {
                    return Ok(LinkMade::Unchanged);
                }
                if !replace {
                    return Err(StoreError::DestinationExists { path });
                }
                let st = rustix::fs::statat(&*dir, name, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| io_err("look at", e))?;
                if rustix::fs::FileType::from_raw_mode(st.st_mode)
                    == rustix::fs::FileType::Directory
                {
                    return Err(map_io(
                        &path,
                        "replace",
                        0,
                        io::Error::new(io::ErrorKind::IsADirectory, "a directory is in the way"),
                    ));
                }
                let tmp = temp_name(name);
                // A temporary left by an interrupted transfer goes first.
                match rustix::fs::unlinkat(&*dir, tmp.as_str(), AtFlags::empty()) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    Err(e) => return Err(io_err("remove a stale link beside", e)),
                }
                rustix::fs::symlinkat(target, &*dir, tmp.as_str())
                    .map_err(|e| io_err("create a link beside", e))?;
                if let Err(e) = rustix::fs::renameat(&*dir, tmp.as_str(), &*dir, name) {
                    let _ = rustix::fs::unlinkat(&*dir, tmp.as_str(), AtFlags::empty());
                    return Err(io_err("replace", e));
                }
                LinkMade::Replaced
            }
            Err(e) => return Err(io_err("create link", e)),
        };
        self.note_created(&path);
        set_link_time(&dir, name, &path, mtime_ns)?;
        Ok(made)
    }
}

/// Sets the modification time of link `name` in `dir` (the link's own, not its target's).
fn set_link_time(
    dir: &std::fs::File,
    name: &str,
    path: &Path,
    mtime_ns: i64,
) -> Result<(), StoreError> {
    // Checks the time is one the system can hold, as for files and directories.
    system_time_from_ns(path, mtime_ns)?;
    let times = Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: mtime_ns.div_euclid(1_000_000_000),
            tv_nsec: mtime_ns.rem_euclid(1_000_000_000) as _,
        },
    };
    rustix::fs::utimensat(dir, name, &times, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| map_io(path, "set modification time of", 0, e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::testing::names_in;
    use crate::fs::{mtime_ns, PartFile, PathError};
    use std::fs;

    #[test]
    fn the_safe_link_rule_is_rsyncs() {
        for (rel, target) in [
            ("t/l", "x"),
            ("t/l", "../x"),
            ("t/a/l", "../../y"),
            ("t/a/l", "./b/../../c"),
            ("t/l", "sub/"),
            ("t/l", ".."),
            ("l", "x"),
            ("l", "a/../b"),
        ] {
            assert!(!link_escapes(rel, target), "{rel} -> {target}");
        }
        for (rel, target) in [
            ("t/l", "/etc/passwd"),
            ("t/l", "/"),
            ("t/l", "../../x"),
            ("t/a/l", "../../../y"),
            ("l", ".."),
            ("l", "../t"),
            // Down and up again past the top, as rsync counts it.
            ("t/l", "a/../../.."),
            ("t/l", "../../t/x"),
        ] {
            assert!(link_escapes(rel, target), "{rel} -> {target}");
        }
    }

    #[test]
    fn a_link_is_created_kept_and_replaced_only_when_allowed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("out");
        let out = OutRoot::new(&root);
        let made = out.make_symlink("t/a/l", "../f", 1_500_000_000, false);
        assert_eq!(made.unwrap(), LinkMade::Created);
        let l = root.join("t/a/l");
        assert_eq!(fs::read_link(&l).unwrap(), Path::new("../f"));
        assert_eq!(mtime_ns(&fs::symlink_metadata(&l).unwrap()), 1_500_000_000);
        // The same link again: nothing to do.
        let out = OutRoot::new(&root);
        assert_eq!(
            out.make_symlink("t/a/l", "../f", 0, false).unwrap(),
            LinkMade::Unchanged
        );
        // Another one there: refused, unless replacing.
        assert!(matches!(
            out.make_symlink("t/a/l", "other", 0, false),
            Err(StoreError::DestinationExists { .. })
        ));
        assert_eq!(fs::read_link(&l).unwrap(), Path::new("../f"));
        assert_eq!(
            out.make_symlink("t/a/l", "other", 0, true).unwrap(),
            LinkMade::Replaced
        );
        assert_eq!(fs::read_link(&l).unwrap(), Path::new("other"));
        // A file in the way is replaced as a file would be, never written through.
        fs::write(root.join("t/file"), b"mine").unwrap();
        assert!(out.make_symlink("t/file", "x", 0, false).is_err());
        assert_eq!(
            out.make_symlink("t/file", "x", 0, true).unwrap(),
            LinkMade::Replaced
        );
        assert_eq!(fs::read_link(root.join("t/file")).unwrap(), Path::new("x"));
        // A directory in the way is an error, replacing or not.
        fs::create_dir(root.join("t/dir")).unwrap();
        let e = out.make_symlink("t/dir", "x", 0, true).unwrap_err();
        assert!(e.to_string().contains("a directory is in the way"), "{e}");
        assert!(root.join("t/dir").is_dir());
        assert_eq!(names_in(&root.join("t")), ["a", "dir", "file"]);
    }

    #[test]
    fn nothing_is_written_through_a_link_made_here() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("out");
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        let out = OutRoot::new(&root);
        // A hostile sender's link out of the tree (the session refuses it before this; here
        // the tree itself is checked), then a file, a directory and a link "through" it.
        out.make_symlink("t/evil", outside.to_str().unwrap(), 0, false)
            .unwrap();
        assert!(matches!(
            PartFile::create_in(&out, "t/evil/x", 1, false),
            Err(StoreError::Path(PathError::SymlinkInPath { .. }))
        ));
        assert!(out.make_dir("t/evil/d", 0o755).is_err());
        assert!(out.make_symlink("t/evil/l", "x", 0, true).is_err());
        assert!(out.make_symlink("t/evil", "y", 0, false).is_err());
        assert!(names_in(&outside).is_empty(), "nothing written outside");
        // A link where a directory of the path should be is refused too.
        assert!(out.make_symlink("t/evil/../x", "y", 0, false).is_err());
    }
}
