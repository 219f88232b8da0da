//! The BLAKE3 of a whole file (what `b3sum` prints): of a file the receiver already has, and of
//! the sender's copy of it. The holes of a sparse file are hashed as zeros without being read.

use super::holes::{is_hole, may_have_holes};
use std::fs::File;
use std::io::{self, ErrorKind};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The BLAKE3 of a whole file (what `b3sum` prints), read in aligned pieces (see
/// [`crate::iobuf`]).
pub fn hash_file(path: &Path) -> io::Result<[u8; 32]> {
    hash_open(&File::open(path)?)
}

/// [`hash_file`] of a file already open. The holes of a sparse file are hashed as zeros
/// without reading them (reading one makes the kernel fill page-cache pages with zeros).
pub fn hash_open(file: &File) -> io::Result<[u8; 32]> {
    const PIECE: usize = 256 << 10;
    let meta = file.metadata()?;
    let sparse = may_have_holes(&meta);
    let mut buf = crate::iobuf::IoBuf::new(PIECE);
    let mut h = blake3::Hasher::new();
    let mut offset = 0u64;
    loop {
        let end = offset + PIECE as u64;
        if sparse && end <= meta.len() && is_hole(file, offset, end) {
            h.update(crate::iobuf::zeros(PIECE));
            offset = end;
            continue;
        }
        let piece = buf.aligned();
        let n = match file.read_at(piece, offset) {
            Ok(0) => return Ok(*h.finalize().as_bytes()),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&piece[..n]);
        offset += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::testing::sparse_file;
    use std::fs;

    #[test]
    fn hash_file_is_the_files_blake3() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0usize, 1, (256 << 10) - 1, 256 << 10, 600_001] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
            let p = dir.path().join(format!("f{len}"));
            fs::write(&p, &data).unwrap();
            assert_eq!(
                hash_file(&p).unwrap(),
                *blake3::hash(&data).as_bytes(),
                "{len}"
            );
        }
        assert!(hash_file(&dir.path().join("missing")).is_err());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_sparse_file_hashes_as_its_bytes_read() {
        for dir in [
            tempfile::tempdir().unwrap(),
            tempfile::tempdir_in("/dev/shm").unwrap(),
        ] {
            let (f, _) = sparse_file(dir.path());
            let want = blake3::hash(&fs::read(dir.path().join("sparse")).unwrap());
            assert_eq!(hash_open(&f).unwrap(), *want.as_bytes());
            assert_eq!(
                hash_file(&dir.path().join("sparse")).unwrap(),
                *want.as_bytes()
            );
        }
    }
}
