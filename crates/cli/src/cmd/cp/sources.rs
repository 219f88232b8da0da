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
/// or `SRC/.`, see [`Kind::Contents`]) stands for what is in it, each entry sent under its own name (sorted, symbolic links among
/// them skipped with a warning unless `follow_symlinks`); any other path is sent as itself, a
/// directory with everything below it. A path that does not exist is a storage failure
/// (exit 6) before anything starts.
pub fn expand_sources(
    paths: &[PathBuf],
    follow_symlinks: bool,
    warnings: &mut Vec<String>,
) -> Result<Vec<PathBuf>, Failure> {
    let storage = |what: String| Failure::new(exit::STORAGE, anyhow::anyhow!(what));
    let mut out = Vec::new();
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
                warnings.push(format!(
                    "skipping symbolic link {} (--follow-symlinks follows it)",
                    path.display()
                ));
                continue;
            }
            out.push(path);
        }
    }
    Ok(out)
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
        let mut warnings = Vec::new();
        for given in [d.join("."), PathBuf::from(format!("{}/", d.display()))] {
            let got = expand_sources(std::slice::from_ref(&given), false, &mut warnings).unwrap();
            assert_eq!(got, [given.join("x"), given.join("y")], "{given:?}");
        }
        assert_eq!(
            expand_sources(std::slice::from_ref(&d), false, &mut warnings).unwrap(),
            [d]
        );
    }
}
