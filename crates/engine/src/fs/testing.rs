//! Helpers the tests of this folder share.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

pub(super) fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

pub(super) fn mode_of(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// A sparse file with data in blocks 3 and 8 of ten (1 MiB blocks, the last one short).
pub(super) fn sparse_file(dir: &Path) -> (File, u64) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.join("sparse"))
        .unwrap();
    let size = (9 << 20) + 4321;
    f.set_len(size).unwrap();
    f.write_all_at(&[1; 100], (3 << 20) + 100).unwrap();
    f.write_all_at(&[2], 8 << 20).unwrap();
    (f, size)
}
