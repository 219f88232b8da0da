//! The sender's paths, on either side of `hurtle cp`: rsync's trailing-slash rule
//! ([`source_kind`], [`expand_sources`]).

use crate::exit::{self, Failure};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// What a source path stands for, by rsync's rule, read alike by the side that sends it and
/// by a pull's side that checks what it is offered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Kind {
    /// Itself, sent under its last component (this name, when the path says it).
    Itself(String),
    /// What is in it: `SRC/`, and `.` or `..` as the last component (`SRC/.`, `host:`),
    /// which name no directory of their own, as rsync reads them.
    Contents,
}

/// What `path` stands for (see [`Kind`]).
pub(super) fn source_kind(path: &str) -> Kind {
    match path.rsplit('/').next() {
        None | Some("" | "." | "..") => Kind::Contents,
        Some(last) => Kind::Itself(last.to_string()),
    }
}

/// The sender's paths under rsync's rule: `SRC/` (a directory named with a trailing slash,
/// or `SRC/.`, see [`Kind::Contents`]) stands for what is in it, each entry sent under its own
/// name (sorted); any other path is sent as itself, a directory with everything below it. A
/// path that does not exist is a storage failure (exit 6) before anything starts.
///
/// Also returns the entries of `SRC/` that are symbolic links: sent as links, as rsync sends
/// them (`SendOptions::link_args`), unless `follow_symlinks` (`--copy-links`); a path given as
/// itself is followed, as `send` follows it.
pub fn expand_sources(
    paths: &[PathBuf],
    follow_symlinks: bool,
) -> Result<(Vec<PathBuf>, Vec<PathBuf>), Failure> {
    let storage = |what: String| Failure::new(exit::STORAGE, anyhow::anyhow!(what));
    let mut out = Vec::new();
    let mut links = Vec::new();
    for p in paths {
        let meta = std::fs::metadata(p);
        if meta.is_err() && std::fs::symlink_metadata(p).is_err() {
            return Err(storage(format!(
                "no such file or directory: {}",
                p.display()
            )));
        }
        let contents = std::str::from_utf8(p.as_os_str().as_bytes())
            .map_or(p.as_os_str().as_bytes().ends_with(b"/"), |s| {
                source_kind(s) == Kind::Contents
            });
        if !(contents && meta.is_ok_and(|m| m.is_dir())) {
            out.push(p.clone());
            continue;
        }
        let mut entries = std::fs::read_dir(p)
            .and_then(|d| d.collect::<Result<Vec<_>, _>>())
            .map_err(|e| storage(format!("cannot read {}: {e}", p.display())))?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let path = p.join(e.file_name());
            if !follow_symlinks && e.file_type().is_ok_and(|t| t.is_symlink()) {
                links.push(path.clone());
            }
            out.push(path);
        }
    }
    Ok((out, links))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slash_a_dot_or_two_dots_at_the_end_stand_for_the_contents() {
        for contents in ["d/", "/", ".", "d/.", "..", "a/b/..", "~/"] {
            assert_eq!(source_kind(contents), Kind::Contents, "{contents}");
        }
        for (path, name) in [("a", "a"), ("a/b.bin", "b.bin"), ("/x/.hidden", ".hidden")] {
            assert_eq!(source_kind(path), Kind::Itself(name.into()), "{path}");
        }
    }

    #[test]
    fn the_contents_of_dot_are_its_entries() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::fs::write(t.path().join("d/x"), b"x").unwrap();
        std::fs::write(t.path().join("d/y"), b"y").unwrap();
        let d = t.path().join("d");
        std::os::unix::fs::symlink("x", t.path().join("d/z")).unwrap();
        for given in [d.join("."), PathBuf::from(format!("{}/", d.display()))] {
            let got = expand_sources(std::slice::from_ref(&given), false).unwrap();
            let all = [given.join("x"), given.join("y"), given.join("z")];
            assert_eq!(got, (all.to_vec(), vec![given.join("z")]), "{given:?}");
            // With --copy-links, no link is sent as one.
            let got = expand_sources(std::slice::from_ref(&given), true).unwrap();
            assert_eq!(got, (all.to_vec(), vec![]), "{given:?}");
        }
        assert_eq!(
            expand_sources(std::slice::from_ref(&d), false).unwrap(),
            (vec![d], vec![])
        );
    }
}
