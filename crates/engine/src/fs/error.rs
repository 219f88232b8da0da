//! What a failed storage operation says: [`StoreError`], one line naming the path.
//!
//! Every I/O error of this folder goes through `map_io`, so that a full disk or quota is always
//! [`StoreError::NoSpace`] and anything else [`StoreError::Io`] with what was being done.

use super::path::PathError;
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};

/// A storage operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The relative path was refused.
    #[error(transparent)]
    Path(#[from] PathError),
    /// The final name already exists and overwriting was not allowed.
    #[error("destination already exists: {path:?}")]
    DestinationExists {
        /// The existing path.
        path: PathBuf,
    },
    /// The destination filesystem is full, or a quota is exhausted (`ENOSPC`, `EDQUOT`).
    #[error("destination full: {}", no_space_detail(.path, *.needed))]
    NoSpace {
        /// The file or directory being written.
        path: PathBuf,
        /// How many bytes the failed operation asked for (0 when not about data, e.g. mkdir).
        needed: u64,
    },
    /// A positional access fell outside the file's declared size.
    #[error("{path:?}: {len} bytes at offset {offset} lie outside the file's {size} bytes")]
    OutOfRange {
        /// The file.
        path: PathBuf,
        /// Offset of the access.
        offset: u64,
        /// Length of the access.
        len: u64,
        /// The file's declared size.
        size: u64,
    },
    /// The source file's size or modification time changed since it was opened, or it is
    /// shorter than its recorded size.
    #[error("source file changed while sending: {path:?}")]
    SourceChanged {
        /// The source file.
        path: PathBuf,
    },
    /// Any other I/O failure.
    #[error("cannot {op} {path:?}: {source}")]
    Io {
        /// What was being done ("create", "write", "rename", ...).
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}

fn no_space_detail(path: &Path, needed: u64) -> String {
    if needed == 0 {
        format!("no room for {path:?}")
    } else {
        format!("no room for {needed} bytes of {path:?}")
    }
}

/// Maps an I/O error to a [`StoreError`]: `ENOSPC` and `EDQUOT` become
/// [`StoreError::NoSpace`], everything else [`StoreError::Io`].
pub(super) fn map_io(path: &Path, op: &'static str, needed: u64, err: io::Error) -> StoreError {
    let full = matches!(err.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
        || matches!(
            err.kind(),
            ErrorKind::StorageFull | ErrorKind::QuotaExceeded
        );
    if full {
        StoreError::NoSpace {
            path: path.to_path_buf(),
            needed,
        }
    } else {
        StoreError::Io {
            op,
            path: path.to_path_buf(),
            source: err,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;

    #[test]
    fn no_space_mapping() {
        let p = Path::new("/out/big.iso");
        for errno in [libc::ENOSPC, libc::EDQUOT] {
            let e = map_io(p, "write", 4096, io::Error::from_raw_os_error(errno));
            assert!(
                matches!(&e, StoreError::NoSpace { path, needed: 4096 } if path == p),
                "{e:?}"
            );
            assert_eq!(
                e.to_string(),
                "destination full: no room for 4096 bytes of \"/out/big.iso\""
            );
        }
        let e = map_io(
            p,
            "create directory",
            0,
            io::Error::from(ErrorKind::StorageFull),
        );
        assert_eq!(
            e.to_string(),
            "destination full: no room for \"/out/big.iso\""
        );
        let e = map_io(p, "write", 1, io::Error::from_raw_os_error(libc::EIO));
        assert!(matches!(e, StoreError::Io { op: "write", .. }));
        assert!(e.to_string().starts_with("cannot write \"/out/big.iso\": "));

        // A real ENOSPC from the kernel, where /dev/full exists.
        if let Ok(mut full) = OpenOptions::new().write(true).open("/dev/full") {
            use std::io::Write;
            let err = full.write_all(&[0u8; 64]).and_then(|()| full.flush());
            let err = err.expect_err("/dev/full accepted a write");
            assert!(matches!(
                map_io(p, "write", 64, err),
                StoreError::NoSpace { needed: 64, .. }
            ));
        }
    }
}
