//! The receiver's decision for one manifest entry, from what its file system has at the
//! entry's path. The driver looks ([`Found`]), asks [`first_look`], and where the answer needs
//! more facts (the existing file's hash, a part file's journal) reads them and finishes the
//! decision with [`Look::with_hash`] or [`Look::with_part`].

use crate::wire::{Decision, Entry, EntryKind};

/// What the receiver's file system has at an entry's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Nothing.
    Nothing,
    /// A regular file of this length and modification time.
    File {
        /// Length in bytes.
        len: u64,
        /// Modification time, nanoseconds since the Unix epoch.
        mtime_ns: i64,
    },
    /// Something else: a directory, a symlink, a device.
    Other,
}

/// What the receiver answers an entry, or which fact it needs first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Look {
    /// Decided.
    Decided(Decision),
    /// The receiver has a file of the same size: its BLAKE3 decides ([`Look::with_hash`]).
    HashExisting {
        /// Whether the receiver may replace it.
        replace_ok: bool,
    },
    /// A part file of an interrupted transfer may hold some of its blocks
    /// ([`Look::with_part`]).
    LookForPart,
}

impl Look {
    /// The decision once the existing file's hash is known.
    pub fn with_hash(replace_ok: bool, hash: [u8; 32]) -> Decision {
        Decision::Have { hash, replace_ok }
    }

    /// The decision once the part file was looked for: the blocks its journal vouches for
    /// (none, or no part file, sends everything).
    pub fn with_part(blocks: Option<Vec<(u64, u64)>>) -> Decision {
        match blocks {
            Some(blocks) => Decision::Resume { blocks },
            None => Decision::SendAll,
        }
    }
}

/// The first look at an entry: `checksum` when the sender asked to compare files by hash
/// (never by size and time alone), `overwrite` when the receiver may replace its files.
///
/// - A file of the same size and modification time is unchanged (rsync's quick check, as
///   hurtle leaves a file it received), unless checksums were asked for.
/// - A file of the same size is compared by hash.
/// - Anything else in the way is refused without `overwrite`.
/// - A non-empty file may resume from a part file; an empty one and a directory are sent.
pub fn first_look(entry: &Entry, found: Found, checksum: bool, overwrite: bool) -> Look {
    match (entry.kind, found) {
        (EntryKind::File, Found::File { len, mtime_ns })
            if !checksum && len == entry.size && mtime_ns == entry.mtime_ns =>
        {
            Look::Decided(Decision::Unchanged)
        }
        (EntryKind::File, Found::File { len, .. }) if len == entry.size => Look::HashExisting {
            replace_ok: overwrite,
        },
        (EntryKind::File, Found::File { .. } | Found::Other) if !overwrite => {
            Look::Decided(Decision::Refuse(
                "it exists on the receiver (receive with --overwrite to replace it)".into(),
            ))
        }
        (EntryKind::File, _) if entry.size > 0 => Look::LookForPart,
        _ => Look::Decided(Decision::SendAll),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(size: u64, mtime_ns: i64) -> Entry {
        Entry {
            path: "a".into(),
            kind: EntryKind::File,
            size,
            mode: 0o644,
            mtime_ns,
            holes: Vec::new(),
            target: String::new(),
        }
    }

    #[test]
    fn same_size_and_time_is_unchanged_unless_checksums_are_asked() {
        let found = Found::File {
            len: 10,
            mtime_ns: 5,
        };
        assert_eq!(
            first_look(&file(10, 5), found, false, false),
            Look::Decided(Decision::Unchanged)
        );
        assert_eq!(
            first_look(&file(10, 5), found, true, false),
            Look::HashExisting { replace_ok: false }
        );
        assert_eq!(
            first_look(&file(10, 6), found, false, true),
            Look::HashExisting { replace_ok: true }
        );
    }

    #[test]
    fn something_else_in_the_way_is_refused_without_overwrite() {
        for found in [
            Found::File {
                len: 9,
                mtime_ns: 5,
            },
            Found::Other,
        ] {
            assert!(matches!(
                first_look(&file(10, 5), found, false, false),
                Look::Decided(Decision::Refuse(_))
            ));
            assert_eq!(
                first_look(&file(10, 5), found, false, true),
                Look::LookForPart
            );
        }
    }

    #[test]
    fn new_files_resume_or_are_sent_and_directories_are_made() {
        assert_eq!(
            first_look(&file(10, 5), Found::Nothing, false, false),
            Look::LookForPart
        );
        assert_eq!(
            first_look(&file(0, 5), Found::Nothing, false, false),
            Look::Decided(Decision::SendAll)
        );
        let dir = Entry {
            kind: EntryKind::Dir,
            size: 0,
            ..file(0, 0)
        };
        assert_eq!(
            first_look(&dir, Found::Other, false, false),
            Look::Decided(Decision::SendAll)
        );
        assert_eq!(Look::with_part(None), Decision::SendAll);
        assert_eq!(
            Look::with_part(Some(vec![(0, 2)])),
            Decision::Resume {
                blocks: vec![(0, 2)]
            }
        );
    }
}
