//! Files for the tests: seeded random contents, tree comparison, leftover `.hurtle-part` files,
//! and a small tmpfs that is unmounted however the test ends.

use super::Rng;
use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

/// Writes `size` seeded random bytes to `path` (parents created).
pub fn write_random(path: &Path, size: u64, seed: u64) {
    if let Some(p) = path.parent() {
        fs::create_dir_all(p).unwrap();
    }
    let mut f = fs::File::create(path).unwrap();
    let mut rng = Rng::new(seed);
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        rng.fill(&mut buf[..n]);
        f.write_all(&buf[..n]).unwrap();
        left -= n as u64;
    }
}

/// BLAKE3 of a file, hex.
pub fn blake3_hex(path: &Path) -> String {
    let mut h = blake3::Hasher::new();
    let mut f = fs::File::open(path).unwrap_or_else(|e| panic!("open {path:?}: {e}"));
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    h.finalize().to_hex().to_string()
}

/// Fails unless `got` has exactly the bytes of `want` (size, contents and BLAKE3).
pub fn assert_same_file(want: &Path, got: &Path) {
    let (a, b) = (
        fs::read(want).unwrap_or_else(|e| panic!("read {want:?}: {e}")),
        fs::read(got).unwrap_or_else(|e| panic!("read {got:?}: {e}")),
    );
    assert_eq!(a.len(), b.len(), "size of {got:?} differs from {want:?}");
    if let Some(i) = a.iter().zip(&b).position(|(x, y)| x != y) {
        panic!("{got:?} differs from {want:?} at byte {i}");
    }
    assert_eq!(blake3_hex(want), blake3_hex(got));
}

/// What a path in a tree is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// A regular file with its BLAKE3 (hex) and permission bits.
    File {
        /// BLAKE3, hex.
        hash: String,
        /// Permission bits.
        mode: u32,
    },
    /// A directory with its permission bits.
    Dir {
        /// Permission bits.
        mode: u32,
    },
    /// A symbolic link.
    Symlink,
}

/// Every path under `root` (relative, `/`-separated), not following symlinks.
pub fn tree(root: &Path) -> BTreeMap<String, Node> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap_or_else(|e| panic!("read_dir {dir:?}: {e}")) {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let mode = m.permissions().mode() & 0o7777;
            let node = if m.file_type().is_symlink() {
                Node::Symlink
            } else if m.is_dir() {
                stack.push(p.clone());
                Node::Dir { mode }
            } else {
                Node::File {
                    hash: blake3_hex(&p),
                    mode,
                }
            };
            out.insert(rel, node);
        }
    }
    out
}

/// `.hurtle-part` files and their `.hurtle-blocks` journals anywhere under `root`.
pub fn part_files(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            let name = p.to_string_lossy();
            if name.ends_with(".hurtle-part") || name.ends_with(".hurtle-blocks") {
                found.push(p.clone());
            }
            if fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
                stack.push(p);
            }
        }
    }
    found
}

/// Fails if any `.hurtle-part` file or block journal is left under `root`.
pub fn assert_no_part_files(root: &Path) {
    let left = part_files(root);
    assert!(left.is_empty(), ".hurtle-part files left behind: {left:?}");
}

/// Modification time of `path` (not following a symlink), nanoseconds since the epoch.
pub fn mtime_ns(path: &Path) -> i64 {
    let m = fs::symlink_metadata(path).unwrap();
    m.mtime() * 1_000_000_000 + m.mtime_nsec()
}

/// Sets the modification time of a file or directory.
pub fn set_mtime(path: &Path, since_epoch: Duration) {
    let f = fs::File::open(path).unwrap();
    f.set_modified(SystemTime::UNIX_EPOCH + since_epoch)
        .unwrap_or_else(|e| panic!("set mtime of {path:?}: {e}"));
}

/// Sets permission bits.
pub fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// A tmpfs mounted for one test; unmounted (lazily if busy) when dropped, even on panic.
pub struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (e.g. "4m") on directory `dir`, created if missing. Needs
    /// root.
    pub fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).expect("create the mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mount -t tmpfs on {dir:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs {
            dir: dir.to_path_buf(),
        }
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            // Something still holds it open (a process being killed): detach it now, the
            // kernel frees it once the last user is gone.
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}
