//! The file system: every write the receiver makes and every read the sender makes, and the
//! checks that keep a peer's paths inside the output directory.
//!
//! One thing per file:
//!
//! - [`path`]: checking a peer-supplied relative path before it touches the disk
//!   ([`sanitize_rel_path`], [`PathError`]).
//! - [`beneath`]: directories under the output root, and the files in them, opened from
//!   descriptors so that no symlink can redirect them.
//! - [`tree`]: one transfer's output directory ([`OutRoot`]): each directory created and checked
//!   once, and the directories' modes and times.
//! - [`link`]: symbolic links on the receiver: rsync's safe-link rule ([`link_escapes`]), and
//!   a link created or replaced through its directory's descriptor.
//! - [`part`]: a file being received ([`PartFile`]): written positionally into
//!   `.<name>.hurtle-part`, then fsynced and renamed into place; free space, directory syncs.
//! - [`journal`]: the names of part files and block journals, and the journal's format, which
//!   lets an interrupted transfer resume without reading back the blocks its MACs vouch for.
//! - [`holes`]: sparse files' holes, and preallocation around them.
//! - [`hash`]: the BLAKE3 of a whole file (what `b3sum` prints).
//! - [`source`]: a file being sent ([`SourceFile`]), noticing when it changes underneath.
//! - [`meta`]: modification times in nanoseconds, and the permission bits a receiver applies.
//! - [`fds`]: open descriptors, a bounded number at a time within the process's limit, and the
//!   check that a file reopened by path is still the same file.
//! - [`error`]: [`StoreError`], every message one line naming the path; a full disk or quota is
//!   always [`StoreError::NoSpace`].
//!
//! This folder has no `unsafe`: the system calls std and rustix lack (`fallocate`,
//! `sync_file_range`, `fstatfs`, `statvfs`, `setrlimit`) are made through safe wrappers in the
//! engine's `sys` folder.
//!
//! Imports point one way, down to what a file builds on, never back up: [`part`] and [`link`]
//! use [`tree`]; [`part`] uses
//! [`journal`] and [`holes`]; [`source`] and [`hash`] use [`holes`]; below them, [`beneath`],
//! [`fds`], [`meta`], [`path`] and [`error`] use nothing above themselves; [`fds`], [`holes`]
//! and [`part`] make their system calls through the engine's `sys`. The only other part of
//! the engine used here is [`crate::iobuf`] (to hash).
//!
//! The items the rest of the engine and the CLI use are re-exported here.

pub mod beneath;
pub mod error;
pub mod fds;
pub mod hash;
pub mod holes;
pub mod journal;
pub mod link;
pub mod meta;
pub mod part;
pub mod path;
pub mod source;
#[cfg(test)]
mod testing;
pub mod tree;

pub use error::StoreError;
pub use hash::{hash_file, hash_open};
pub use holes::{bytes_in_blocks, hole_blocks, is_hole, may_have_holes};
pub use journal::{Journaled, JOURNAL_SUFFIX, PART_SUFFIX};
pub use link::{link_escapes, LinkMade};
pub(crate) use meta::mtime_ns;
pub use part::{free_space, memory_backed_dir, sync_dir, PartFile};
pub use path::{sanitize_rel_path, PathError, MAX_COMPONENT_LEN, MAX_PATH_LEN};
pub use source::SourceFile;
pub use tree::{make_dir, resolve_under, set_dir_mode, set_dir_times, OutRoot};
