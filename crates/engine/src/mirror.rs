//! Mirror (`send --delete`, `receive --allow-delete`): what a receiver deletes once a transfer
//! is complete, as `rsync -r --delete` does for the same arguments.
//!
//! This module owns which paths are extraneous and their deletion:
//!
//! - only inside the directories the manifest offers (`send tree` mirrors `tree` below the
//!   destination; the destination's other names are not looked at), as the receiver writes
//!   them ([`Names::local`]), and the destination itself when the sender sends a directory's
//!   contents (`cp tree/ DEST`, the `root` of [`extraneous`]);
//! - a path is extraneous when the manifest does not name it, unless the sender's rules
//!   ([`Filter`], matched on the path as the manifest would name it) leave it out: what
//!   `--exclude` leaves out is kept, as rsync keeps it without `--delete-excluded`;
//! - nothing is followed: a directory offered that is a symlink here (or has one on its way)
//!   is not looked into, and a symlink found is deleted as a link, never what it points to;
//! - a directory is deleted after what it holds, and only if nothing kept is left in it.
//!
//! The receiver lists the paths at the outcome of a dry run (and sends them to the sender),
//! and deletes them after the sender's `Done`, every file committed: never after a failed or
//! interrupted transfer.

use crate::filter::Filter;
use crate::fs::OutRoot;
use crate::receive::Names;
use hurtle_proto::wire::{Entry, EntryKind};
use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};

/// How a dry run's summary (either side's) names a path a mirror would delete: a warning line
/// with this prefix, which `hurtle` shows in the plan's list.
pub const DELETING: &str = "would delete: ";

/// The note a receiver's dry-run summary starts its warnings' last line with: `hurtle` shows
/// that summary as the plan's list.
pub const DRY_RUN: &str = "dry run: nothing was written";

/// The most paths one mirror lists or deletes (a bound on the walk, not a policy).
pub const MAX_EXTRANEOUS: usize = 1 << 20;

/// One path to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stray {
    /// As the manifest would name it (`/`-separated; a name that is not UTF-8 shown lossily).
    pub rel_path: String,
    /// Where it is here.
    pub path: PathBuf,
    /// A directory (deleted after what it holds, which comes before it in the list).
    pub is_dir: bool,
}

/// Why the extraneous paths could not be listed or deleted.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// A directory could not be read, or a path not deleted.
    #[error("mirror: cannot {what} {path}: {source}")]
    Io {
        /// What was tried.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// More than [`MAX_EXTRANEOUS`] paths.
    #[error("mirror: more than {MAX_EXTRANEOUS} paths to delete; nothing was deleted")]
    TooMany,
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> MirrorError {
    let path = path.to_path_buf();
    move |source| MirrorError::Io { what, path, source }
}

/// The paths inside the manifest's directories (and the destination itself with `root`)
/// that it does not name and `filter` does not leave out, what a directory holds before the
/// directory. A directory offered that is not here yet (a dry run), or is not a real
/// directory here, holds nothing extraneous.
pub fn extraneous(
    out: &OutRoot,
    entries: &[Entry],
    names: &Names,
    filter: &Filter,
    root: bool,
) -> Result<Vec<Stray>, MirrorError> {
    let offered: HashSet<&str> = entries.iter().map(|e| e.path.as_str()).collect();
    let mut strays = Vec::new();
    if root && is_real_dir(out.path()) {
        walk(out.path(), "", &offered, filter, &mut strays)?;
    }
    for dir in entries.iter().filter(|e| e.kind == EntryKind::Dir) {
        let local = names.local(&dir.path);
        // A symlink on the way: not looked into (the transfer itself refuses such a path).
        let Ok(path) = out.resolve(&local) else {
            continue;
        };
        if !is_real_dir(&path) {
            continue;
        }
        walk(&path, &dir.path, &offered, filter, &mut strays)?;
    }
    Ok(strays)
}

fn is_real_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_dir())
}

/// Adds the extraneous paths below `dir` (named `rel` in the manifest) to `strays`; returns
/// whether everything in it is extraneous (so that the directory itself may go).
fn walk(
    dir: &Path,
    rel: &str,
    offered: &HashSet<&str>,
    filter: &Filter,
    strays: &mut Vec<Stray>,
) -> Result<bool, MirrorError> {
    let mut all = true;
    let mut children: Vec<_> = std::fs::read_dir(dir)
        .map_err(io_err("read directory", dir))?
        .collect::<Result<_, _>>()
        .map_err(io_err("read directory", dir))?;
    children.sort_by_key(|c| c.file_name());
    for child in children {
        let name = child.file_name();
        let child_rel = match rel {
            "" => name.to_string_lossy().into_owned(),
            rel => format!("{rel}/{}", name.to_string_lossy()),
        };
        let is_dir = child
            .file_type()
            .map_err(io_err("look at", &child.path()))?
            .is_dir();
        if name.to_str().is_some() && offered.contains(child_rel.as_str()) {
            // Offered: a directory offered is walked on its own.
            all = false;
            continue;
        }
        if !filter.keeps(&child_rel, is_dir) {
            // Left out by the rules: kept here.
            all = false;
            continue;
        }
        let path = child.path();
        if is_dir && !walk(&path, &child_rel, offered, filter, strays)? {
            all = false;
            continue;
        }
        if strays.len() >= MAX_EXTRANEOUS {
            return Err(MirrorError::TooMany);
        }
        strays.push(Stray {
            rel_path: child_rel,
            path,
            is_dir,
        });
    }
    Ok(all)
}

/// Deletes `strays` under `root` in order ([`extraneous`]'s: a directory after what it held),
/// links as links. Each is reached from the root's descriptor one directory at a time, none
/// opened through a symlink (`O_NOFOLLOW`), and unlinked from its parent's descriptor: a
/// directory swapped for a link since the listing is not followed. Returns how many were
/// deleted; the first failure stops it.
pub fn delete(root: &Path, strays: &[Stray]) -> Result<usize, MirrorError> {
    use rustix::fs::{openat, unlinkat, AtFlags, Mode, OFlags};
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let root_fd = rustix::fs::open(root, dir_flags, Mode::empty())
        .map_err(|e| io_err("open directory", root)(e.into()))?;
    for s in strays {
        let fail = |what: &'static str, e: rustix::io::Errno| MirrorError::Io {
            what,
            path: s.path.clone(),
            source: e.into(),
        };
        let rel = s.path.strip_prefix(root).map_err(|_| {
            fail(
                "delete (not below the destination)",
                rustix::io::Errno::INVAL,
            )
        })?;
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
            return Err(fail("delete", rustix::io::Errno::INVAL));
        };
        let mut dir = None;
        for comp in parent.components() {
            let at = dir.as_ref().unwrap_or(&root_fd);
            let next = openat(
                at,
                comp.as_os_str(),
                dir_flags | OFlags::NOFOLLOW,
                Mode::empty(),
            )
            .map_err(|e| fail("open the directory of", e))?;
            dir = Some(next);
        }
        let at = dir.as_ref().unwrap_or(&root_fd);
        let flags = match s.is_dir {
            true => AtFlags::REMOVEDIR,
            false => AtFlags::empty(),
        };
        match unlinkat(at, name, flags) {
            // Gone meanwhile: what was wanted.
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(fail("delete", e)),
        }
    }
    Ok(strays.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::RuleKind;
    use std::fs;

    fn entry(path: &str, kind: EntryKind) -> Entry {
        Entry {
            path: path.into(),
            kind,
            size: 0,
            mode: 0o755,
            mtime_ns: 0,
            holes: Vec::new(),
            target: String::new(),
        }
    }

    #[test]
    fn lists_only_inside_offered_directories_and_keeps_what_the_rules_leave_out() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("out");
        let outside = t.path().join("outside");
        fs::create_dir_all(root.join("t/sub/old")).unwrap();
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("precious"), b"x").unwrap();
        fs::write(root.join("unrelated"), b"x").unwrap();
        fs::write(root.join("t/keep.txt"), b"x").unwrap();
        fs::write(root.join("t/gone.txt"), b"x").unwrap();
        fs::write(root.join("t/x.tmp"), b"x").unwrap();
        fs::write(root.join("t/sub/old/a"), b"x").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("t/link")).unwrap();
        let entries = [
            entry("t", EntryKind::Dir),
            entry("t/keep.txt", EntryKind::File),
            entry("t/sub", EntryKind::Dir),
        ];
        let filter = Filter::new([(RuleKind::Exclude, "*.tmp")]).unwrap();
        let out = OutRoot::new(&root);
        let strays = extraneous(&out, &entries, &Names::default(), &filter, false).unwrap();
        let rels: Vec<&str> = strays.iter().map(|s| s.rel_path.as_str()).collect();
        assert_eq!(rels, ["t/gone.txt", "t/link", "t/sub/old/a", "t/sub/old"]);
        assert_eq!(delete(&root, &strays).unwrap(), 4);
        assert!(root.join("t/keep.txt").exists());
        assert!(root.join("t/x.tmp").exists());
        assert!(root.join("unrelated").exists());
        assert!(!root.join("t/sub/old").exists());
        assert!(fs::symlink_metadata(root.join("t/link")).is_err());
        assert!(
            outside.join("precious").exists(),
            "a link is never followed"
        );
    }

    #[test]
    fn a_directory_holding_something_kept_is_kept() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        fs::create_dir_all(root.join("t/old")).unwrap();
        fs::write(root.join("t/old/x.tmp"), b"x").unwrap();
        fs::write(root.join("t/old/y"), b"x").unwrap();
        let entries = [entry("t", EntryKind::Dir)];
        let filter = Filter::new([(RuleKind::Exclude, "*.tmp")]).unwrap();
        let strays = extraneous(
            &OutRoot::new(root),
            &entries,
            &Names::default(),
            &filter,
            false,
        )
        .unwrap();
        let rels: Vec<&str> = strays.iter().map(|s| s.rel_path.as_str()).collect();
        assert_eq!(rels, ["t/old/y"]);
    }

    #[test]
    fn a_directory_swapped_for_a_link_after_the_listing_is_not_followed() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("out");
        let outside = t.path().join("outside");
        fs::create_dir_all(root.join("t/d")).unwrap();
        fs::write(root.join("t/d/victim"), b"x").unwrap();
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("victim"), b"keep").unwrap();
        let entries = [entry("t", EntryKind::Dir)];
        let strays = extraneous(
            &OutRoot::new(&root),
            &entries,
            &Names::default(),
            &Filter::default(),
            false,
        )
        .unwrap();
        assert_eq!(strays[0].rel_path, "t/d/victim");
        // Between the listing and the deletion, t/d becomes a link out of the tree.
        fs::remove_dir_all(root.join("t/d")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("t/d")).unwrap();
        assert!(delete(&root, &strays).is_err());
        assert_eq!(fs::read(outside.join("victim")).unwrap(), b"keep");
    }

    #[test]
    fn an_offered_directory_that_is_a_symlink_here_is_not_looked_into() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("out");
        let outside = t.path().join("outside");
        fs::create_dir_all(&root).unwrap();
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("precious"), b"x").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("t")).unwrap();
        let entries = [entry("t", EntryKind::Dir)];
        let strays = extraneous(
            &OutRoot::new(&root),
            &entries,
            &Names::default(),
            &Filter::default(),
            false,
        )
        .unwrap();
        assert!(strays.is_empty(), "{strays:?}");
    }
}
