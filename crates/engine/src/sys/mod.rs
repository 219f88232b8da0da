//! The system calls that std, rustix, socket2 and quinn-udp do not make for us, each behind a
//! safe wrapper: the only `unsafe` in the engine. The crate denies `unsafe_code` and allows it
//! for this folder alone (in `lib.rs`); every call has a `SAFETY` comment.
//!
//! - [`socket`]: `poll`, GSO `sendmsg`, `sendmmsg` and `getsockopt(SO_MEMINFO)`, for the UDP
//!   channels ([`crate::net::udp`]).
//! - [`fs`]: `fallocate`, `sync_file_range`, `fstatfs`, `statvfs`, `getrlimit`/`setrlimit`,
//!   for the file system ([`crate::fs`]).
//! - [`clock`]: `clock_gettime`, for the CPU clock ([`crate::cpu`]).
//! - [`prefetch`]: a cache hint for lines about to be written, for the receiver's block
//!   buffers.
//!
//! Nothing here knows the protocol, and nothing here uses another part of the engine.

pub(crate) mod clock;
#[cfg(unix)]
pub(crate) mod fs;
pub(crate) mod prefetch;
pub(crate) mod socket;
