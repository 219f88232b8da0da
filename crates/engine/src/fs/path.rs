//! Checking a peer-supplied relative path before it touches the disk.
//!
//! [`sanitize_rel_path`] accepts only plain `/`-separated components, none longer than
//! [`MAX_COMPONENT_LEN`] and all together no longer than [`MAX_PATH_LEN`]; it looks at the
//! string only. [`PathError`] says why a path was refused, here or by the output tree
//! ([`super::tree`]) when a symlink is on the way; its message is one line naming the path.

use std::io;
use std::path::PathBuf;

/// Longest accepted path component, in bytes (`NAME_MAX` on Linux).
pub const MAX_COMPONENT_LEN: usize = 255;

/// Longest accepted relative path, in bytes (`PATH_MAX` on Linux).
pub const MAX_PATH_LEN: usize = 4096;

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

/// Splits a sanitized relative path into its directory part ("" if none) and its last
/// component.
pub(super) fn split_parent(rel: &str) -> (&str, &str) {
    rel.rsplit_once('/').unwrap_or(("", rel))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::path::Path;

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
    }
}
