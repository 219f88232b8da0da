//! The file system: everything the engine reads and writes on disk, and path safety.
//!
//! Moved here from `store.rs`, `fds.rs` and `beneath.rs`; [`part`] still holds what was
//! `store.rs`, until it is split into rooms of its own.

pub mod beneath;
pub mod fds;
pub mod part;

pub use part::*;
