//! The file system calls std and rustix do not make for [`crate::fs`]: preallocation
//! (`fallocate`), early writeback (`sync_file_range`), telling memory-backed filesystems and
//! those suited to direct writes apart (`fstatfs`), free space (`statvfs`) and the open-file
//! limit (`getrlimit`/`setrlimit`).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// A file offset or length as the system calls take it.
#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
fn as_off<T: TryFrom<u64>>(v: u64) -> io::Result<T> {
    T::try_from(v).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file too large"))
}

/// Allocates `len` bytes at `offset` of `file` (`fallocate(2)` mode 0; `posix_fallocate` on
/// FreeBSD, where it is the native call).
#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
pub(crate) fn allocate(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let (off, len): (libc::off_t, libc::off_t) = (as_off(offset)?, as_off(len)?);
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        // SAFETY: the descriptor belongs to `file`, which outlives the call; fallocate only
        // uses it during the call and touches no memory of ours.
        if unsafe { libc::fallocate(file.as_raw_fd(), 0, off, len) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
    #[cfg(target_os = "freebsd")]
    {
        // SAFETY: as above.
        match unsafe { libc::posix_fallocate(file.as_raw_fd(), off, len) } {
            0 => Ok(()),
            e => Err(io::Error::from_raw_os_error(e)),
        }
    }
}

/// Starts writing `len` bytes at `offset` of `file` back to the disk without waiting for
/// them (`sync_file_range(SYNC_FILE_RANGE_WRITE)`).
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) fn start_writeback(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let (off, len): (libc::off64_t, libc::off64_t) = (as_off(offset)?, as_off(len)?);
    // SAFETY: the descriptor belongs to `file`, which outlives the call; sync_file_range
    // only uses it during the call and touches no memory of ours.
    let done =
        unsafe { libc::sync_file_range(file.as_raw_fd(), off, len, libc::SYNC_FILE_RANGE_WRITE) };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Elsewhere the final fsync does all the writing.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(crate) fn start_writeback(_file: &File, _offset: u64, _len: u64) -> io::Result<()> {
    Ok(())
}

/// The filesystem type of `file` (`fstatfs`'s `f_type`), `None` where the call fails.
#[cfg(any(target_os = "linux", target_os = "android"))]
// The magic numbers' and `f_type`'s integer types differ between targets.
#[allow(clippy::unnecessary_cast)]
fn fs_kind(file: &File) -> Option<i64> {
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `st` is writable for one statfs and only read after the call succeeded.
    if unsafe { libc::fstatfs(file.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: fstatfs returned 0, so `st` is initialised.
    Some(unsafe { st.assume_init() }.f_type as i64)
}

/// True when `file` is on tmpfs or ramfs.
#[cfg(any(target_os = "linux", target_os = "android"))]
#[allow(clippy::unnecessary_cast)]
pub(crate) fn memory_backed(file: &File) -> bool {
    /// `RAMFS_MAGIC` from linux/magic.h (the libc crate does not have it).
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    fs_kind(file).is_some_and(|kind| kind == libc::TMPFS_MAGIC as i64 || kind == RAMFS_MAGIC)
}

/// True when `file` is on a local disk filesystem known to write well with `O_DIRECT` (ext4,
/// XFS, btrfs): straight from the caller's buffer to the device, each write done when it
/// returns. Elsewhere (network filesystems, where a direct write is a synchronous round trip;
/// FUSE; memory) the page cache does better, or the flag is refused.
#[cfg(any(target_os = "linux", target_os = "android"))]
// The magic numbers' and `f_type`'s integer types differ between targets.
#[allow(clippy::unnecessary_cast)]
pub(crate) fn direct_io_suits(file: &File) -> bool {
    let Some(kind) = fs_kind(file) else {
        return false;
    };
    [
        libc::EXT4_SUPER_MAGIC as i64,
        libc::XFS_SUPER_MAGIC as i64,
        libc::BTRFS_SUPER_MAGIC as i64,
    ]
    .contains(&kind)
}

/// Direct writes only where they are known to suit (Linux).
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(crate) fn direct_io_suits(_file: &File) -> bool {
    false
}

/// FreeBSD's tmpfs is not told apart: preallocation there costs what it costs.
#[cfg(target_os = "freebsd")]
pub(crate) fn memory_backed(_file: &File) -> bool {
    false
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the soft limit then in force
/// (`None` if it cannot be read; `u64::MAX` when unlimited).
pub(crate) fn raise_open_file_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for the duration of the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit that the kernel only reads.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        }
    }
    // rlim_t is u64 on Linux, but not everywhere.
    #[allow(clippy::unnecessary_cast)]
    Some(if lim.rlim_cur == libc::RLIM_INFINITY {
        u64::MAX
    } else {
        lim.rlim_cur as u64
    })
}

/// `statvfs`: bytes available to unprivileged writers on the filesystem holding `dir`.
pub(crate) fn free_space(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `path` is a valid NUL-terminated string and `st` is writable for one
    // statvfs; it is only read after the call succeeded.
    if unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so `st` is initialised.
    let st = unsafe { st.assume_init() };
    #[allow(clippy::useless_conversion)]
    let (avail, frsize) = (u64::from(st.f_bavail), u64::from(st.f_frsize));
    Some(avail.saturating_mul(frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn shared_memory_counts_as_memory_backed() {
        let tmp = tempfile::tempdir_in("/dev/shm").expect("Linux has a tmpfs on /dev/shm");
        let f = File::create(tmp.path().join("x")).unwrap();
        assert!(memory_backed(&f));
    }
}
