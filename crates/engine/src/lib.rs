//! hurtle's drivers: everything that touches the OS on behalf of the sans-IO core in `hurtle-proto`.
//!
//! - [`udp`]: batched UDP data channels (GSO/GRO and multi-message syscalls via quinn-udp).
//! - [`store`]: positional file I/O, temporary `.part` files, fsync and rename, path sanitizing.
//! - [`walk`]: turning the user's source arguments into a manifest of files and directories.

pub mod store;
pub mod udp;
pub mod walk;
