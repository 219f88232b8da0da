//! Source-side tree walking: turns the paths given to `hurtle send` into a manifest.
//!
//! This module owns the naming and ordering rules of what gets sent:
//!
//! - a file argument becomes one entry named by its file name; a directory argument `photos/`
//!   becomes `photos` plus everything below it (`photos/a/b.jpg`);
//! - directories come before their contents, and the entries of one directory are sorted by
//!   name (byte order), so the same tree always gives the same manifest;
//! - empty files and empty directories are included;
//! - symlinks found inside directories are sent as links ([`EntryKind::Symlink`], their target
//!   as `readlink` gives it, whatever it points at: the receiver judges which are safe to
//!   create), unless [`WalkOptions::follow_symlinks`] is set (`--copy-links`: then followed,
//!   with directory loops and dangling links skipped with a warning); symlinks named as
//!   arguments are followed, like `find -H`, except those in [`WalkOptions::link_args`] (what
//!   `hurtle cp SRC/` expands `SRC/` to), sent as links like those inside a directory; a link
//!   whose target is not UTF-8 is skipped with a warning, and one the receiver will not create
//!   ([`crate::fs::link_escapes`]: absolute, or climbing above the destination) is sent with a
//!   warning;
//! - fifos, sockets and devices are skipped with a warning;
//! - paths the [`WalkOptions::filter`] leaves out (`--exclude`, `--include`) are skipped
//!   silently, a directory with everything below it, arguments included;
//! - names that are not UTF-8, or that the receiver would refuse (see
//!   [`sanitize_rel_path`]), two arguments with the same name, and missing arguments are errors.
//!
//! Warnings are one line each, naming the path.

use std::collections::HashMap;
use std::fs::{self, FileType, Metadata};
use std::io::{self, ErrorKind};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use hurtle_proto::wire;

use crate::filter::Filter;
use crate::fs::{mtime_ns, sanitize_rel_path, PathError};

/// What an entry is (the manifest's own type).
pub use hurtle_proto::wire::EntryKind;

/// One file or directory to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceEntry {
    /// Path the receiver creates, relative and `/`-separated, starting with the argument's name.
    pub rel_path: String,
    /// File, directory or symbolic link.
    pub kind: EntryKind,
    /// Size in bytes (0 for a directory and a link).
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Modification time, nanoseconds since the Unix epoch (negative before 1970).
    pub mtime_ns: i64,
    /// Where to read it: the argument made absolute (without resolving symlinks), joined with
    /// the names below it.
    pub abs_path: PathBuf,
    /// A file taking less space than its size ([`crate::fs::may_have_holes`]).
    pub sparse: bool,
    /// A link's target (empty for a file and a directory).
    pub target: String,
}

impl SourceEntry {
    /// The manifest entry announcing this one to the receiver.
    pub fn to_wire(&self) -> wire::Entry {
        wire::Entry {
            path: self.rel_path.clone(),
            kind: self.kind,
            size: self.size,
            mode: self.mode,
            mtime_ns: self.mtime_ns,
            holes: Vec::new(),
            target: self.target.clone(),
        }
    }
}

/// How to walk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WalkOptions {
    /// Follow symlinks found inside directories instead of sending them as links
    /// (`--copy-links`).
    pub follow_symlinks: bool,
    /// Arguments sent as links when they are symbolic links, as links inside a directory are
    /// (unless [`WalkOptions::follow_symlinks`]): the entries of a directory whose contents
    /// are sent (`hurtle cp SRC/`), which rsync sends as links. Other arguments are followed.
    pub link_args: Vec<PathBuf>,
    /// Which paths to send (by default all).
    pub filter: Filter,
}

/// The result of [`collect`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Walk {
    /// Everything to send, in manifest order.
    pub entries: Vec<SourceEntry>,
    /// One line per skipped path, for the user.
    pub warnings: Vec<String>,
}

/// Why the sources could not be collected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WalkError {
    /// An argument does not exist.
    #[error("no such file or directory: {path:?}")]
    NotFound {
        /// The argument.
        path: PathBuf,
    },
    /// An argument has no name to send it under (such as `/`).
    #[error("cannot send {path:?}: it has no name to send it under")]
    NoName {
        /// The argument.
        path: PathBuf,
    },
    /// A name is not valid UTF-8.
    #[error("cannot send {path:?}: its name is not valid UTF-8")]
    NonUtf8Name {
        /// The offending path.
        path: PathBuf,
    },
    /// Two arguments would be sent under the same name.
    #[error("{first:?} and {second:?} would both be sent as {rel_path:?}")]
    Duplicate {
        /// The shared name.
        rel_path: String,
        /// The first argument with that name.
        first: PathBuf,
        /// The second one.
        second: PathBuf,
    },
    /// A name the receiver would refuse (backslash, drive prefix, too long...).
    #[error("cannot send {path:?}: {source}")]
    UnsafeName {
        /// The offending path.
        path: PathBuf,
        /// Why the name is refused.
        source: PathError,
    },
    /// Reading a directory or a file's metadata failed.
    #[error("cannot read {path:?}: {source}")]
    Io {
        /// The path being read.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}

/// Turns `paths` (the user's arguments) into the list of entries to send, in order.
///
/// See the [module documentation](self) for the rules.
pub fn collect(paths: &[PathBuf], opts: &WalkOptions) -> Result<Walk, WalkError> {
    let mut walk = Walk::default();
    let mut names: HashMap<String, PathBuf> = HashMap::new();
    for arg in paths {
        let io_err = |source| WalkError::Io {
            path: arg.clone(),
            source,
        };
        let abs = std::path::absolute(arg).map_err(io_err)?;
        let as_link = !opts.follow_symlinks && opts.link_args.contains(arg);
        let link_meta = match as_link {
            true => fs::symlink_metadata(&abs).ok(),
            false => None,
        };
        let meta = match link_meta {
            Some(m) if m.file_type().is_symlink() => Ok(m),
            _ => fs::metadata(&abs),
        };
        let meta = match meta {
            Ok(m) => m,
            // Distinguish a missing argument from a dangling symlink.
            Err(e) if e.kind() == ErrorKind::NotFound && fs::symlink_metadata(&abs).is_err() => {
                return Err(WalkError::NotFound { path: arg.clone() })
            }
            Err(e) => return Err(io_err(e)),
        };
        let name = arg_name(arg, &abs)?;
        if let Some(first) = names.get(&name) {
            return Err(WalkError::Duplicate {
                rel_path: name,
                first: first.clone(),
                second: arg.clone(),
            });
        }
        names.insert(name.clone(), arg.clone());
        walk_tree(abs, name, meta, opts, &mut walk)?;
    }
    Ok(walk)
}

/// The name the argument `arg` is sent under, as [`collect`] names it (its last component,
/// or for `.`, `..` and the like the last component of its canonical path): the top-level
/// name of everything sent from it.
pub fn top_name(arg: &Path) -> Result<String, WalkError> {
    let abs = std::path::absolute(arg).map_err(|source| WalkError::Io {
        path: arg.to_path_buf(),
        source,
    })?;
    arg_name(arg, &abs)
}

/// The name an argument is sent under: its last component, or for `.`, `..` and the like the
/// last component of its canonical path.
fn arg_name(arg: &Path, abs: &Path) -> Result<String, WalkError> {
    let canonical;
    let name = match abs.file_name() {
        Some(n) => n,
        None => {
            canonical = fs::canonicalize(abs).map_err(|source| WalkError::Io {
                path: arg.to_path_buf(),
                source,
            })?;
            canonical.file_name().ok_or_else(|| WalkError::NoName {
                path: arg.to_path_buf(),
            })?
        }
    };
    name.to_str()
        .map(str::to_owned)
        .ok_or_else(|| WalkError::NonUtf8Name {
            path: arg.to_path_buf(),
        })
}

/// A path waiting to be visited.
struct Pending {
    abs: PathBuf,
    rel: String,
    /// Number of directories above it in this walk.
    depth: usize,
    /// Already-resolved metadata (for arguments); children are inspected when visited.
    meta: Option<Metadata>,
}

/// Visits `abs` and everything below it, depth first, children in name order, appending to
/// `walk`.
fn walk_tree(
    abs: PathBuf,
    rel: String,
    meta: Metadata,
    opts: &WalkOptions,
    walk: &mut Walk,
) -> Result<(), WalkError> {
    let mut stack = vec![Pending {
        abs,
        rel,
        depth: 0,
        meta: Some(meta),
    }];
    // (device, inode) of the directories above the one being visited, to catch loops made by
    // followed symlinks (or bind mounts).
    let mut ancestors: Vec<(u64, u64)> = Vec::new();
    while let Some(item) = stack.pop() {
        ancestors.truncate(item.depth);
        let meta = match item.meta {
            Some(m) => m,
            None => match inspect(&item.abs, opts, &mut walk.warnings)? {
                Some(m) => m,
                None => continue,
            },
        };
        let ft = meta.file_type();
        if !opts.filter.keeps(&item.rel, ft.is_dir()) {
            continue;
        }
        let mut target = String::new();
        let kind = if ft.is_file() {
            EntryKind::File
        } else if ft.is_dir() {
            EntryKind::Dir
        } else if ft.is_symlink() {
            match link_target(&item.abs)? {
                Some(t) if crate::fs::link_escapes(&item.rel, &t) => {
                    walk.warnings.push(format!(
                        "symlink {:?} -> {t} points outside the destination: the receiver will not create it (-L sends what it points at)",
                        item.abs
                    ));
                    target = t;
                }
                Some(t) => target = t,
                None => {
                    walk.warnings.push(format!(
                        "skipping symlink {:?}: its target is not valid UTF-8",
                        item.abs
                    ));
                    continue;
                }
            }
            EntryKind::Symlink
        } else {
            walk.warnings
                .push(format!("skipping {} {:?}", special_kind(ft), item.abs));
            continue;
        };
        let id = (meta.dev(), meta.ino());
        if kind == EntryKind::Dir && ancestors.contains(&id) {
            walk.warnings.push(format!(
                "skipping {:?}: it leads back to a directory that contains it",
                item.abs
            ));
            continue;
        }
        sanitize_rel_path(&item.rel).map_err(|source| WalkError::UnsafeName {
            path: item.abs.clone(),
            source,
        })?;
        if kind == EntryKind::Dir {
            ancestors.push(id);
            let children = list_dir(&item.abs)?;
            stack.extend(children.into_iter().rev().map(|name| Pending {
                abs: item.abs.join(&name),
                rel: format!("{}/{name}", item.rel),
                depth: item.depth + 1,
                meta: None,
            }));
        }
        walk.entries.push(SourceEntry {
            rel_path: item.rel,
            kind,
            size: if kind == EntryKind::File {
                meta.len()
            } else {
                0
            },
            mode: meta.mode() & 0o7777,
            mtime_ns: mtime_ns(&meta),
            abs_path: item.abs,
            sparse: kind == EntryKind::File && crate::fs::may_have_holes(&meta),
            target,
        });
    }
    Ok(())
}

/// The names in directory `dir`, sorted. Errors on a name that is not UTF-8.
fn list_dir(dir: &Path) -> Result<Vec<String>, WalkError> {
    let io_err = |source| WalkError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err)? {
        let entry = entry.map_err(io_err)?;
        match entry.file_name().into_string() {
            Ok(name) => names.push(name),
            Err(_) => return Err(WalkError::NonUtf8Name { path: entry.path() }),
        }
    }
    names.sort_unstable();
    Ok(names)
}

/// Metadata of a path found inside a directory: a symlink's own, or its target's when
/// following; `None` (with a warning) when the path is to be skipped.
fn inspect(
    path: &Path,
    opts: &WalkOptions,
    warnings: &mut Vec<String>,
) -> Result<Option<Metadata>, WalkError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            warnings.push(format!("skipping {path:?}: it disappeared during the scan"));
            return Ok(None);
        }
        Err(source) => {
            return Err(WalkError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    if !meta.file_type().is_symlink() {
        return Ok(Some(meta));
    }
    if !opts.follow_symlinks {
        // Sent as a link.
        return Ok(Some(meta));
    }
    match fs::metadata(path) {
        Ok(m) => Ok(Some(m)),
        Err(e) => {
            warnings.push(format!("skipping symlink {path:?}: {e}"));
            Ok(None)
        }
    }
}

/// The target of link `path` as text, `None` if it is not UTF-8 (a link that disappeared or
/// became something else since it was looked at is an error, as any other read).
fn link_target(path: &Path) -> Result<Option<String>, WalkError> {
    let target = fs::read_link(path).map_err(|source| WalkError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(target.into_os_string().into_string().ok())
}

fn special_kind(ft: FileType) -> &'static str {
    if ft.is_fifo() {
        "fifo"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_block_device() {
        "block device"
    } else if ft.is_char_device() {
        "character device"
    } else if ft.is_symlink() {
        "symlink"
    } else {
        "special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{symlink, PermissionsExt};
    use std::time::{Duration, SystemTime};

    fn rels(w: &Walk) -> Vec<&str> {
        w.entries.iter().map(|e| e.rel_path.as_str()).collect()
    }

    /// photos/
    ///   a/b.jpg  a/c/ (empty)  empty.txt  résumé/日本.txt  z.txt
    ///   flink -> z.txt   link -> a   sock (socket)
    fn tree() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("photos");
        fs::create_dir_all(p.join("a/c")).unwrap();
        fs::create_dir_all(p.join("résumé")).unwrap();
        fs::write(p.join("a/b.jpg"), b"jpeg!").unwrap();
        fs::write(p.join("empty.txt"), b"").unwrap();
        fs::write(p.join("résumé/日本.txt"), "こんにちは").unwrap();
        fs::write(p.join("z.txt"), b"zz").unwrap();
        symlink("z.txt", p.join("flink")).unwrap();
        symlink("a", p.join("link")).unwrap();
        (tmp, p)
    }

    #[test]
    fn walks_tree_in_order_and_sends_symlinks_as_links() {
        let (_tmp, p) = tree();
        let _sock = std::os::unix::net::UnixListener::bind(p.join("sock")).unwrap();
        let f = fs::File::options()
            .write(true)
            .open(p.join("z.txt"))
            .unwrap();
        f.set_modified(SystemTime::UNIX_EPOCH - Duration::from_millis(1500))
            .unwrap();
        fs::set_permissions(p.join("z.txt"), fs::Permissions::from_mode(0o640)).unwrap();

        let w = collect(std::slice::from_ref(&p), &WalkOptions::default()).unwrap();
        assert_eq!(
            rels(&w),
            [
                "photos",
                "photos/a",
                "photos/a/b.jpg",
                "photos/a/c",
                "photos/empty.txt",
                "photos/flink",
                "photos/link",
                "photos/résumé",
                "photos/résumé/日本.txt",
                "photos/z.txt",
            ]
        );
        let by = |r: &str| w.entries.iter().find(|e| e.rel_path == r).unwrap();
        assert_eq!(by("photos").kind, EntryKind::Dir);
        assert_eq!(by("photos/a/c").kind, EntryKind::Dir);
        assert_eq!(by("photos/a/c").size, 0);
        assert_eq!(by("photos/empty.txt").kind, EntryKind::File);
        assert_eq!(by("photos/empty.txt").size, 0);
        assert_eq!(by("photos/résumé/日本.txt").size, 15);
        assert_eq!(
            by("photos/résumé/日本.txt").abs_path,
            p.join("résumé/日本.txt")
        );
        let z = by("photos/z.txt");
        assert_eq!((z.size, z.mode, z.mtime_ns), (2, 0o640, -1_500_000_000));
        assert_eq!(z.to_wire().path, "photos/z.txt");
        assert_eq!(z.to_wire().target, "");
        // Links travel as links, with their target as it is written, whatever it points at.
        for (rel, target) in [("photos/flink", "z.txt"), ("photos/link", "a")] {
            let l = by(rel);
            assert_eq!(
                (l.kind, l.size, l.target.as_str()),
                (EntryKind::Symlink, 0, target)
            );
            assert_eq!(l.to_wire().kind, EntryKind::Symlink);
            assert_eq!(l.to_wire().target, target);
        }
        assert_eq!(
            w.warnings,
            [format!("skipping socket {:?}", p.join("sock"))]
        );
        // Deterministic.
        assert_eq!(collect(&[p], &WalkOptions::default()).unwrap(), w);
    }

    #[test]
    fn follows_symlinks_with_loop_protection() {
        let (_tmp, p) = tree();
        symlink("..", p.join("a/up")).unwrap();
        symlink("nowhere", p.join("dangling")).unwrap();
        let opts = WalkOptions {
            follow_symlinks: true,
            ..WalkOptions::default()
        };
        let w = collect(std::slice::from_ref(&p), &opts).unwrap();
        assert_eq!(
            rels(&w),
            [
                "photos",
                "photos/a",
                "photos/a/b.jpg",
                "photos/a/c",
                "photos/empty.txt",
                "photos/flink",
                "photos/link",
                "photos/link/b.jpg",
                "photos/link/c",
                "photos/résumé",
                "photos/résumé/日本.txt",
                "photos/z.txt",
            ]
        );
        let flink = &w.entries[5];
        assert_eq!((flink.kind, flink.size), (EntryKind::File, 2));
        assert_eq!(w.warnings.len(), 3, "{:?}", w.warnings);
        assert!(w.warnings[0].starts_with(&format!("skipping {:?}: it leads back", p.join("a/up"))));
        assert!(w.warnings[1].starts_with(&format!("skipping symlink {:?}: ", p.join("dangling"))));
        assert!(w.warnings[2].contains("link/up"));
    }

    #[test]
    fn dangling_absolute_and_climbing_links_are_sent_as_they_are() {
        let (tmp, p) = tree();
        symlink("nowhere", p.join("a/dangling")).unwrap();
        symlink("/etc/hostname", p.join("a/abs")).unwrap();
        symlink("../../outside", p.join("a/up")).unwrap();
        symlink(OsStr::from_bytes(b"caf\xe9"), p.join("a/latin1")).unwrap();
        let w = collect(&[p.join("a")], &WalkOptions::default()).unwrap();
        let links: Vec<(&str, &str)> = w
            .entries
            .iter()
            .filter(|e| e.kind == EntryKind::Symlink)
            .map(|e| (e.rel_path.as_str(), e.target.as_str()))
            .collect();
        assert_eq!(
            links,
            [
                ("a/abs", "/etc/hostname"),
                ("a/dangling", "nowhere"),
                ("a/up", "../../outside")
            ]
        );
        // Those the receiver will not create are named; a target the manifest cannot carry
        // as text is skipped, named.
        let outside = |l: &str, t: &str| {
            format!(
                "symlink {:?} -> {t} points outside the destination: the receiver will not create it (-L sends what it points at)",
                p.join(l)
            )
        };
        assert_eq!(
            w.warnings,
            [
                outside("a/abs", "/etc/hostname"),
                format!(
                    "skipping symlink {:?}: its target is not valid UTF-8",
                    p.join("a/latin1")
                ),
                outside("a/up", "../../outside"),
            ]
        );
        // A link argument is still followed (`find -H`), its own links inside sent as links.
        symlink(p.join("a"), tmp.path().join("arg")).unwrap();
        let w = collect(&[tmp.path().join("arg")], &WalkOptions::default()).unwrap();
        assert_eq!(w.entries[0].kind, EntryKind::Dir);
        assert!(w
            .entries
            .iter()
            .any(|e| e.rel_path == "arg/up" && e.kind == EntryKind::Symlink));
    }

    #[test]
    fn the_filter_leaves_out_paths_and_whole_directories() {
        use crate::filter::RuleKind::{Exclude, Include};
        let (_tmp, p) = tree();
        let filter = Filter::new([
            (Include, "b.jpg"),
            (Exclude, "*.jpg"),
            (Exclude, "/photos/a/"),
            (Exclude, "flink"),
            (Exclude, "résumé"),
        ])
        .unwrap();
        let opts = WalkOptions {
            filter,
            ..WalkOptions::default()
        };
        let w = collect(std::slice::from_ref(&p), &opts).unwrap();
        // `a` goes with everything in it, though b.jpg is included; a link is filtered as a
        // file is (by its own name).
        assert_eq!(
            rels(&w),
            ["photos", "photos/empty.txt", "photos/link", "photos/z.txt"]
        );
        assert!(w.warnings.is_empty(), "{:?}", w.warnings);
        // An argument is filtered like anything else.
        let opts = WalkOptions {
            filter: Filter::new([(Exclude, "*.txt")]).unwrap(),
            ..WalkOptions::default()
        };
        let w = collect(&[p.join("z.txt"), p.join("a")], &opts).unwrap();
        assert_eq!(rels(&w), ["a", "a/b.jpg", "a/c"]);
    }

    #[test]
    fn arguments() {
        let (tmp, p) = tree();
        let opts = WalkOptions::default();
        // A file argument is named by its file name.
        let w = collect(&[p.join("a/b.jpg"), p.join("z.txt")], &opts).unwrap();
        assert_eq!(rels(&w), ["b.jpg", "z.txt"]);
        assert_eq!(w.entries[0].size, 5);
        // Trailing slash, "dir/." and "dir/.." name the directory itself.
        let w = collect(&[PathBuf::from(format!("{}/", p.display()))], &opts).unwrap();
        assert_eq!(rels(&w)[..2], ["photos", "photos/a"]);
        let w = collect(&[p.join("a/.")], &opts).unwrap();
        assert_eq!(rels(&w), ["a", "a/b.jpg", "a/c"]);
        let w = collect(&[p.join("a/c/..")], &opts).unwrap();
        assert_eq!(rels(&w), ["a", "a/b.jpg", "a/c"]);
        // A symlink argument is followed even without follow_symlinks.
        let w = collect(&[p.join("link")], &opts).unwrap();
        assert_eq!(rels(&w), ["link", "link/b.jpg", "link/c"]);
        assert_eq!(w.entries[1].abs_path, p.join("link/b.jpg"));
        // Unless it is one of link_args (cp's `SRC/` contents): then a link, dangling or not.
        symlink("nowhere", p.join("dangling")).unwrap();
        let as_links = WalkOptions {
            link_args: vec![p.join("link"), p.join("dangling"), p.join("z.txt")],
            ..WalkOptions::default()
        };
        let args = [p.join("link"), p.join("dangling"), p.join("z.txt")];
        let w = collect(&args, &as_links).unwrap();
        let got: Vec<_> = w
            .entries
            .iter()
            .map(|e| (e.rel_path.as_str(), e.kind, e.target.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("link", EntryKind::Symlink, "a"),
                ("dangling", EntryKind::Symlink, "nowhere"),
                ("z.txt", EntryKind::File, "")
            ]
        );
        // ... and followed again with --copy-links.
        let follow = WalkOptions {
            follow_symlinks: true,
            ..as_links
        };
        let w = collect(&args[..1], &follow).unwrap();
        assert_eq!(rels(&w), ["link", "link/b.jpg", "link/c"]);
        fs::remove_file(p.join("dangling")).unwrap();
        // An empty directory argument.
        let w = collect(&[p.join("a/c")], &opts).unwrap();
        assert_eq!(rels(&w), ["c"]);
        assert!(collect(&[], &opts).unwrap().entries.is_empty());

        // Same name twice.
        fs::create_dir(tmp.path().join("other")).unwrap();
        fs::write(tmp.path().join("other/z.txt"), b"").unwrap();
        let e = collect(&[p.join("z.txt"), tmp.path().join("other/z.txt")], &opts).unwrap_err();
        assert!(matches!(&e, WalkError::Duplicate { rel_path, .. } if rel_path == "z.txt"));
        assert!(e.to_string().contains("would both be sent as \"z.txt\""));
        assert!(matches!(
            collect(&[p.clone(), p.clone()], &opts),
            Err(WalkError::Duplicate { .. })
        ));
        // Missing argument, and a dangling symlink argument.
        let missing = tmp.path().join("nope");
        let e = collect(std::slice::from_ref(&missing), &opts).unwrap_err();
        assert!(matches!(&e, WalkError::NotFound { path } if *path == missing));
        assert_eq!(
            e.to_string(),
            format!("no such file or directory: {missing:?}")
        );
        symlink("nope", tmp.path().join("dangling")).unwrap();
        assert!(matches!(
            collect(&[tmp.path().join("dangling")], &opts),
            Err(WalkError::Io { .. })
        ));
        // No name.
        assert!(matches!(
            collect(&[PathBuf::from("/")], &opts),
            Err(WalkError::NoName { .. })
        ));
    }

    #[test]
    fn bad_names_are_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("d");
        fs::create_dir(&d).unwrap();
        let bad = d.join(OsStr::from_bytes(b"caf\xe9.txt"));
        fs::write(&bad, b"").unwrap();
        let e = collect(std::slice::from_ref(&d), &WalkOptions::default()).unwrap_err();
        assert!(
            matches!(&e, WalkError::NonUtf8Name { path } if *path == bad),
            "{e:?}"
        );
        assert!(e.to_string().contains("caf\\xE9.txt"), "{e}");
        assert!(matches!(
            collect(std::slice::from_ref(&bad), &WalkOptions::default()),
            Err(WalkError::NonUtf8Name { .. })
        ));
        fs::remove_file(&bad).unwrap();

        fs::write(d.join("back\\slash"), b"").unwrap();
        let e = collect(&[d], &WalkOptions::default()).unwrap_err();
        assert!(
            matches!(
                e,
                WalkError::UnsafeName {
                    source: PathError::Backslash { .. },
                    ..
                }
            ),
            "{e:?}"
        );
    }
}
