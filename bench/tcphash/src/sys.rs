//! The one system call std does not wrap (`SO_MAX_PACING_RATE`); all `unsafe` in the crate
//! lives here, as in `bench/linkem/src/sys.rs` and the engine's `sys/`.
#![allow(unsafe_code)]

use anyhow::{Context, Result};
use std::net::TcpStream;
use std::os::fd::AsRawFd;

/// Sets `SO_MAX_PACING_RATE` to `bits_per_s / 8` bytes per second.
pub fn set_pacing_rate(conn: &TcpStream, bits_per_s: u64) -> Result<()> {
    let bytes_per_s: u64 = bits_per_s / 8;
    // SAFETY: a valid socket descriptor (borrowed for the call), a pointer to a live u64
    // and its exact size; the kernel only reads it.
    let rc = unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MAX_PACING_RATE,
            (&bytes_per_s as *const u64).cast(),
            std::mem::size_of::<u64>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("set SO_MAX_PACING_RATE");
    }
    Ok(())
}
