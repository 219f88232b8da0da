//! The sender's cache of block values ([`ValueCache`]): what a session that ended before its
//! files were finished had computed of them, so that resuming costs the sender next to nothing
//! instead of a read of every block the receiver already holds.
//!
//! A resumed transfer's receiver holds blocks from the interrupted one, and the sender must
//! give their values (their bytes are not sent) for the file's root to be checked. Without a
//! cache it reads and hashes each of them again: about a CPU-second and a full read per 4 GiB.
//! With one, a held block's value comes from the entry of its source, when that entry's
//! [`SourceStamp`] (device, inode, size, modification and change times) is the source's stamp
//! now, and was its stamp from the open that the values were read after to the moment they were
//! kept. Anything else (no entry, another stamp, a torn or foreign entry, a block it lacks) is
//! read and hashed as before. A value from the cache is the same as one read, so the file's
//! root, `b3sum`'s or `blake3-sparse`, comes out the same; the receiver checks every value
//! against its own all the same.
//!
//! Why the change time: every write, truncation, `touch`, or `chmod` sets it to the current
//! time, and no system call sets it back (only setting the system clock back could), so a
//! source rewritten with its modification time restored has another stamp. The one gap is a change within the same clock tick as the last
//! one (timestamps come from a coarse clock, or a 1-2 s granularity on some filesystems): a
//! stamp whose change time is less than [`RACY`] before the source was opened is not kept.
//!
//! Where: one file per source (device and inode), `<hex>.values`, under
//! `$XDG_CACHE_HOME/hurtle/values` or `~/.cache/hurtle/values` ([`ValueCache::default_dir`];
//! `HURTLE_VALUE_CACHE` names another directory, or `off`), the directory mode 0700 and each
//! entry 0600, written to a temporary file and renamed into place. A directory that is not the
//! user's alone (another owner, or writable by group or others) is neither read nor written. The directory is kept under
//! [`MAX_CACHE_BYTES`] and [`MAX_ENTRIES`], the oldest entries going first, and an entry is
//! removed once its file is confirmed. Files of fewer than [`MIN_BLOCKS`] blocks are not
//! kept. A cache that cannot be read or written never fails a transfer: the values are then
//! read.
//!
//! An entry, all integers little-endian: the 16-byte [`MAGIC`]; the stamp (device, inode,
//! size, modification and change times: 5 x 8 bytes); the block size (8); the number of runs
//! (8); each run of consecutive blocks as its first block and the one after its last (16 each,
//! ascending, apart, within the file); the 32-byte values of the runs' blocks in order; and the
//! BLAKE3 of everything before it (32), so that a torn or truncated entry is never used.

use crate::fs::source::{SourceFile, SourceStamp};
use hurtle_proto::hash::{is_hole_value, BlockValue};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The first bytes of every entry: the format and its version.
pub const MAGIC: &[u8; 16] = b"hurtle-values-1\n";

/// The most bytes of entries the directory keeps (the oldest go first): 8 million blocks'
/// values, 8 TiB of 1 MiB blocks.
pub const MAX_CACHE_BYTES: u64 = 256 << 20;

/// The most entries the directory keeps (the oldest go first).
pub const MAX_ENTRIES: usize = 1024;

/// Files of fewer blocks than this are not kept: reading their held blocks again costs
/// little, and a tree of many small files would churn the cache.
pub const MIN_BLOCKS: u64 = 16;

/// A source whose change time is less than this before it was opened may still change within
/// the same timestamp (coarse clock ticks; 1-2 s granularity on some filesystems) without its
/// stamp changing: its values are not kept.
pub const RACY: Duration = Duration::from_secs(3);

/// Bytes before the runs: magic, stamp, block size, number of runs.
const HEADER: usize = 16 + 5 * 8 + 8 + 8;

/// Why an entry could not be kept.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A file system call on the cache failed.
    #[error("block value cache: cannot {op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// To which file or directory.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// The directory is not this user's alone (another owner, or writable by others): what
    /// others could write there is not taken.
    #[error("block value cache: {} is not this user's alone", path.display())]
    NotOurs {
        /// The directory.
        path: PathBuf,
    },
    /// The entry would be larger than the whole cache may be.
    #[error("block value cache: {bytes} bytes of values are more than the cache keeps")]
    TooLarge {
        /// The entry's size.
        bytes: u64,
    },
}

/// Why an entry's bytes were not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadEntry {
    /// Not an entry of this format, or cut short.
    #[error("not a block value entry, or cut short")]
    Format,
    /// Its checksum does not match: torn, or written over.
    #[error("the entry's checksum does not match")]
    Checksum,
    /// It was kept for another state of the file (or another file), or another block size.
    #[error("the entry is for another file, another state of it or another block size")]
    Stale,
    /// Its runs are not ascending and apart, or lie outside the file.
    #[error("the entry's runs are out of order or outside the file")]
    Runs,
}

/// Where block values are kept between sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueCache {
    dir: PathBuf,
}

/// The values an entry holds for a file: some of its blocks, by their index in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedValues {
    /// Ascending, apart half-open runs of block indexes, each with where its values start.
    runs: Vec<(u64, u64, usize)>,
    values: Vec<BlockValue>,
}

impl CachedValues {
    /// The value of block `index`, if the entry holds it.
    pub fn get(&self, index: u64) -> Option<BlockValue> {
        let i = self.runs.partition_point(|&(_, end, _)| end <= index);
        let &(start, _, at) = self.runs.get(i).filter(|r| r.0 <= index)?;
        self.values.get(at + (index - start) as usize).copied()
    }

    /// How many values it holds.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// True when it holds none.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// Blocks in a file of `size` bytes.
fn blocks_in(size: u64, block_size: u64) -> u64 {
    size.div_ceil(block_size.max(1))
}

/// An entry's bytes: `values` (by block index) of the file stamped `stamp`.
pub fn encode(stamp: &SourceStamp, block_size: u64, values: &BTreeMap<u64, BlockValue>) -> Vec<u8> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &index in values.keys() {
        match runs.last_mut() {
            Some((_, end)) if *end == index => *end += 1,
            _ => runs.push((index, index + 1)),
        }
    }
    let mut out = Vec::with_capacity(HEADER + runs.len() * 16 + values.len() * 32 + 32);
    out.extend_from_slice(MAGIC);
    for n in [stamp.dev, stamp.ino, stamp.size] {
        out.extend_from_slice(&n.to_le_bytes());
    }
    for n in [stamp.mtime_ns, stamp.ctime_ns] {
        out.extend_from_slice(&n.to_le_bytes());
    }
    out.extend_from_slice(&block_size.to_le_bytes());
    out.extend_from_slice(&(runs.len() as u64).to_le_bytes());
    for (start, end) in &runs {
        out.extend_from_slice(&start.to_le_bytes());
        out.extend_from_slice(&end.to_le_bytes());
    }
    for v in values.values() {
        out.extend_from_slice(v);
    }
    let sum = blake3::hash(&out);
    out.extend_from_slice(sum.as_bytes());
    out
}

/// Reads 8 little-endian bytes at `at`.
fn u64_at(bytes: &[u8], at: usize) -> Result<u64, BadEntry> {
    let b = bytes.get(at..at + 8).ok_or(BadEntry::Format)?;
    Ok(u64::from_le_bytes(
        b.try_into().map_err(|_| BadEntry::Format)?,
    ))
}

/// The values in an entry's `bytes`, if it is whole and was kept for `stamp` and `block_size`.
pub fn decode(
    bytes: &[u8],
    stamp: &SourceStamp,
    block_size: u64,
) -> Result<CachedValues, BadEntry> {
    if bytes.len() < HEADER + 32 || !bytes.starts_with(MAGIC) {
        return Err(BadEntry::Format);
    }
    let (body, sum) = bytes.split_at(bytes.len() - 32);
    if blake3::hash(body).as_bytes() != sum {
        return Err(BadEntry::Checksum);
    }
    let kept = SourceStamp {
        dev: u64_at(body, 16)?,
        ino: u64_at(body, 24)?,
        size: u64_at(body, 32)?,
        mtime_ns: u64_at(body, 40)? as i64,
        ctime_ns: u64_at(body, 48)? as i64,
    };
    if kept != *stamp || u64_at(body, 56)? != block_size {
        return Err(BadEntry::Stale);
    }
    let blocks = blocks_in(stamp.size, block_size);
    let n_runs = u64_at(body, 64)?;
    // Each run takes 16 bytes: more runs than the body could hold is no entry.
    if n_runs > (body.len() / 16) as u64 {
        return Err(BadEntry::Format);
    }
    let mut runs = Vec::with_capacity(n_runs as usize);
    let mut at = 0usize;
    let mut prev_end = None;
    for i in 0..n_runs as usize {
        let start = u64_at(body, HEADER + i * 16)?;
        let end = u64_at(body, HEADER + i * 16 + 8)?;
        if start >= end || end > blocks || prev_end.is_some_and(|p| start <= p) {
            return Err(BadEntry::Runs);
        }
        prev_end = Some(end);
        runs.push((start, end, at));
        at += (end - start) as usize;
    }
    let values_at = HEADER + runs.len() * 16;
    let values = body.get(values_at..).ok_or(BadEntry::Format)?;
    if values.len() != at * 32 {
        return Err(BadEntry::Format);
    }
    let values = values
        .chunks_exact(32)
        .map(|c| c.try_into().map_err(|_| BadEntry::Format))
        .collect::<Result<Vec<BlockValue>, _>>()?;
    Ok(CachedValues { runs, values })
}

/// The stamp `source` has now, if it is still the one recorded at its open and old enough to
/// be trusted ([`RACY`]): values read from it since that open belong to that stamp.
pub fn trusted_stamp(source: &SourceFile) -> Option<SourceStamp> {
    let now = source.stamp_now().ok()?;
    let opened = source.stamp();
    let opened_ns = source
        .stamped_at()
        .duration_since(UNIX_EPOCH)
        .ok()?
        .as_nanos();
    let settled = i128::from(opened.ctime_ns) + RACY.as_nanos() as i128 <= opened_ns as i128;
    (now == opened && settled).then_some(now)
}

impl ValueCache {
    /// The cache in `dir` (which need not exist yet).
    pub fn at(dir: impl Into<PathBuf>) -> ValueCache {
        ValueCache { dir: dir.into() }
    }

    /// `$XDG_CACHE_HOME/hurtle/values`, or `$HOME/.cache/hurtle/values` (`None` without
    /// either).
    pub fn default_dir() -> Option<PathBuf> {
        super::cache_dir().map(|d| d.join("values"))
    }

    /// The cache the environment asks for: `HURTLE_VALUE_CACHE` (a directory, or `off` for
    /// none), else [`ValueCache::default_dir`].
    pub fn from_env() -> Option<ValueCache> {
        match std::env::var_os("HURTLE_VALUE_CACHE") {
            Some(v) if v == "off" => None,
            Some(v) if !v.is_empty() => Some(ValueCache::at(v)),
            _ => ValueCache::default_dir().map(ValueCache::at),
        }
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry's file for the source `stamp` names (one per device and inode: a later entry
    /// for the same file replaces the earlier).
    pub fn entry_path(&self, stamp: &SourceStamp) -> PathBuf {
        let mut h = blake3::Hasher::new();
        h.update(b"hurtle-values file");
        h.update(&stamp.dev.to_le_bytes());
        h.update(&stamp.ino.to_le_bytes());
        let name = hurtle_proto::hash::to_hex(h.finalize().as_bytes());
        self.dir.join(format!("{}.values", &name[..32]))
    }

    /// True when the directory is this user's alone: owned by the effective user, and not
    /// writable by its group or others.
    fn is_ours(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&self.dir).is_ok_and(|m| {
            m.is_dir() && m.uid() == rustix::process::geteuid().as_raw() && m.mode() & 0o022 == 0
        })
    }

    /// The values kept for `source` with blocks of `block_size`, if an entry for its stamp
    /// now, which is still the one recorded at its open, is whole, in a directory that is this
    /// user's alone; `None` otherwise.
    pub fn load(&self, source: &SourceFile, block_size: u64) -> Option<CachedValues> {
        if !self.is_ours() {
            return None;
        }
        let now = source.stamp_now().ok()?;
        if now != source.stamp() {
            return None;
        }
        let path = self.entry_path(&now);
        // No entry is larger than one of every block's value in a run of its own.
        let blocks = blocks_in(now.size, block_size);
        let most = (HEADER as u64 + 32).saturating_add(blocks.saturating_mul(48));
        let len = std::fs::metadata(&path).ok()?.len();
        if len > most {
            return None;
        }
        let bytes = std::fs::read(&path).ok()?;
        decode(&bytes, &now, block_size).ok()
    }

    /// Keeps `values` (by block index; hole markers are left out, being no block's value
    /// whatever its holes) for the source stamped `stamp`, replacing what was kept for that
    /// file, then evicts the oldest entries beyond the cache's bounds. `stamp` must be one
    /// [`trusted_stamp`] gave after the values were read.
    pub fn store(
        &self,
        stamp: &SourceStamp,
        block_size: u64,
        values: &BTreeMap<u64, BlockValue>,
    ) -> Result<(), CacheError> {
        let path = self.write_entry(stamp, block_size, values)?;
        self.evict(path.as_slice());
        Ok(())
    }

    /// [`ValueCache::store`] without the eviction; returns the entry written, if any.
    fn write_entry(
        &self,
        stamp: &SourceStamp,
        block_size: u64,
        values: &BTreeMap<u64, BlockValue>,
    ) -> Result<Option<PathBuf>, CacheError> {
        let io = |op, path: &Path| {
            let path = path.to_path_buf();
            move |source| CacheError::Io { op, path, source }
        };
        let values: BTreeMap<u64, BlockValue> = values
            .iter()
            .filter(|(_, v)| !is_hole_value(v))
            .map(|(&i, &v)| (i, v))
            .collect();
        let path = self.entry_path(stamp);
        if values.is_empty() {
            self.forget(stamp);
            return Ok(None);
        }
        let bytes = encode(stamp, block_size, &values);
        if bytes.len() as u64 > MAX_CACHE_BYTES {
            return Err(CacheError::TooLarge {
                bytes: bytes.len() as u64,
            });
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(io("create", &self.dir))?;
        if !self.is_ours() {
            return Err(CacheError::NotOurs {
                path: self.dir.clone(),
            });
        }
        let tmp = self.dir.join(format!(
            ".{}.{}.{:016x}.tmp",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("entry"),
            std::process::id(),
            rand::random::<u64>()
        ));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&bytes))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(io("write", &path)(e));
        }
        Ok(Some(path))
    }

    /// Removes what is kept for the file `stamp` names, if anything.
    pub fn forget(&self, stamp: &SourceStamp) {
        let _ = std::fs::remove_file(self.entry_path(stamp));
    }

    /// Removes the oldest entries until the directory is within [`MAX_CACHE_BYTES`] and
    /// [`MAX_ENTRIES`] (never those in `keep`, just written), and temporary files left an
    /// hour or more ago by a writer that died.
    fn evict(&self, keep: &[PathBuf]) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let now = SystemTime::now();
        let mut entries: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
        for e in dir.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let path = e.path();
            let modified = meta.modified().unwrap_or(UNIX_EPOCH);
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".tmp") {
                let age = now.duration_since(modified).unwrap_or_default();
                if age >= Duration::from_secs(3600) {
                    let _ = std::fs::remove_file(&path);
                }
            } else if name.ends_with(".values") {
                entries.push((modified, meta.len(), path));
            }
        }
        entries.sort();
        let mut bytes: u64 = entries.iter().map(|e| e.1).sum();
        let mut count = entries.len();
        for (_, len, path) in entries {
            if bytes <= MAX_CACHE_BYTES && count <= MAX_ENTRIES {
                break;
            }
            if keep.contains(&path) {
                continue;
            }
            if std::fs::remove_file(&path).is_ok() {
                bytes -= len;
                count -= 1;
            }
        }
    }
}

/// The values a session computed, per file (by its place among the session's sources) and
/// block index in it: what is kept in the [`ValueCache`] when a file is left unfinished.
#[derive(Debug, Default)]
pub struct ValueLog {
    files: BTreeMap<u32, BTreeMap<u64, BlockValue>>,
    /// Files with values noted since the cache last kept them.
    dirty: std::collections::BTreeSet<u32>,
    /// Files the receiver confirmed: nothing more is kept for them.
    done: std::collections::BTreeSet<u32>,
}

impl ValueLog {
    /// Notes the value of block `index` of `file`.
    pub fn note(&mut self, file: u32, index: u64, value: BlockValue) {
        if self.done.contains(&file) || is_hole_value(&value) {
            return;
        }
        self.files.entry(file).or_default().insert(index, value);
        self.dirty.insert(file);
    }

    /// `file` is confirmed: its values are dropped, and its entry removed from `cache`.
    pub fn confirmed(&mut self, file: u32, source: &SourceFile, cache: Option<&ValueCache>) {
        self.done.insert(file);
        self.files.remove(&file);
        self.dirty.remove(&file);
        if let Some(cache) = cache {
            cache.forget(&source.stamp());
        }
    }

    /// True when values were noted since the last [`ValueLog::keep`].
    pub fn is_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Keeps, in `cache`, the values of each unconfirmed file noted since the last time, for
    /// files whose stamp is still the one of their open and trusted ([`trusted_stamp`]); a
    /// file that changed has its entry removed. Returns the files kept, and the first error.
    pub fn keep(
        &mut self,
        cache: &ValueCache,
        sources: &[SourceFile],
        block_size: u64,
    ) -> (usize, Option<CacheError>) {
        let mut kept = Vec::new();
        let mut first_error = None;
        for file in std::mem::take(&mut self.dirty) {
            let (Some(values), Some(source)) = (self.files.get(&file), sources.get(file as usize))
            else {
                continue;
            };
            let Some(stamp) = trusted_stamp(source) else {
                cache.forget(&source.stamp());
                continue;
            };
            match cache.write_entry(&stamp, block_size, values) {
                Ok(path) => kept.extend(path),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if !kept.is_empty() {
            cache.evict(&kept);
        }
        (kept.len(), first_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hurtle_proto::hash::{block_value, file_hash, hole_value};
    use std::fs;

    fn stamp() -> SourceStamp {
        SourceStamp {
            dev: 7,
            ino: 42,
            size: 10 * 1024 + 5,
            mtime_ns: 1_700_000_000_123_456_789,
            ctime_ns: 1_700_000_001_000_000_000,
        }
    }

    fn values(indexes: &[u64]) -> BTreeMap<u64, BlockValue> {
        indexes.iter().map(|&i| (i, [i as u8 + 1; 32])).collect()
    }

    #[test]
    fn an_entry_gives_back_its_values_and_none_it_lacks() {
        let v = values(&[0, 1, 2, 5, 7, 8, 10]);
        let bytes = encode(&stamp(), 1024, &v);
        let got = decode(&bytes, &stamp(), 1024).unwrap();
        assert_eq!(got.len(), 7);
        for i in 0..12 {
            assert_eq!(got.get(i), v.get(&i).copied(), "block {i}");
        }
        let none = decode(&encode(&stamp(), 1024, &BTreeMap::new()), &stamp(), 1024).unwrap();
        assert!(none.is_empty() && none.get(0).is_none());
    }

    #[test]
    fn another_stamp_block_size_or_file_is_stale() {
        let bytes = encode(&stamp(), 1024, &values(&[0, 3]));
        let changed = [
            SourceStamp {
                ctime_ns: stamp().ctime_ns + 1,
                ..stamp()
            },
            SourceStamp {
                mtime_ns: stamp().mtime_ns - 1,
                ..stamp()
            },
            SourceStamp {
                size: stamp().size + 1,
                ..stamp()
            },
            SourceStamp { ino: 43, ..stamp() },
            SourceStamp { dev: 8, ..stamp() },
        ];
        for s in changed {
            assert_eq!(decode(&bytes, &s, 1024), Err(BadEntry::Stale), "{s:?}");
        }
        assert_eq!(decode(&bytes, &stamp(), 2048), Err(BadEntry::Stale));
    }

    #[test]
    fn a_torn_truncated_or_altered_entry_is_never_used() {
        let bytes = encode(&stamp(), 1024, &values(&[0, 1, 4]));
        for cut in [
            0,
            1,
            15,
            HEADER,
            HEADER + 16,
            bytes.len() - 33,
            bytes.len() - 1,
        ] {
            assert!(
                decode(&bytes[..cut], &stamp(), 1024).is_err(),
                "cut at {cut}"
            );
        }
        // A bit flipped anywhere: in the stamp, a run, a value or the checksum itself.
        for at in [
            20,
            HEADER + 3,
            HEADER + 40,
            bytes.len() - 40,
            bytes.len() - 1,
        ] {
            let mut b = bytes.clone();
            b[at] ^= 0x10;
            assert_eq!(decode(&b, &stamp(), 1024), Err(BadEntry::Checksum), "{at}");
        }
        // Bytes added.
        let mut longer = bytes.clone();
        longer.extend_from_slice(&[0; 32]);
        assert!(decode(&longer, &stamp(), 1024).is_err());
        // Runs outside the file or out of order, with a checksum that matches.
        for runs in [
            [(3u64, 2u64), (5, 6)],
            [(0, 12), (13, 14)],
            [(4, 5), (1, 2)],
        ] {
            let mut b = bytes[..HEADER - 8].to_vec();
            b.extend_from_slice(&2u64.to_le_bytes());
            for (s, e) in runs {
                b.extend_from_slice(&s.to_le_bytes());
                b.extend_from_slice(&e.to_le_bytes());
            }
            let n: u64 = runs.iter().map(|(s, e)| e.saturating_sub(*s)).sum();
            b.extend(std::iter::repeat_n(9u8, n as usize * 32));
            let sum = blake3::hash(&b);
            b.extend_from_slice(sum.as_bytes());
            assert_eq!(decode(&b, &stamp(), 1024), Err(BadEntry::Runs), "{runs:?}");
        }
    }

    /// Writes a source of `blocks` blocks of 1 KiB whose change time is `RACY` in the past of
    /// its open (by opening it "later": the test cannot wait that long).
    fn old_source(dir: &Path, name: &str, data: &[u8]) -> SourceFile {
        let path = dir.join(name);
        fs::write(&path, data).unwrap();
        std::thread::sleep(RACY + Duration::from_millis(50));
        SourceFile::open(&path).unwrap()
    }

    fn block_values(data: &[u8], bs: usize) -> Vec<BlockValue> {
        let n = data.len().div_ceil(bs) as u64;
        data.chunks(bs)
            .enumerate()
            .map(|(i, c)| block_value(c, i as u64, bs as u64, n))
            .collect()
    }

    #[test]
    fn kept_values_come_back_for_the_same_file_only_and_give_the_same_root() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ValueCache::at(dir.path().join("cache/hurtle/values"));
        let data: Vec<u8> = (0..10 * 1024 + 77).map(|i| (i * 31 % 251) as u8).collect();
        let other: Vec<u8> = data.iter().map(|b| b ^ 1).collect();
        let src = old_source(dir.path(), "a", &data);
        let twin = SourceFile::open(&{
            fs::write(dir.path().join("b"), &other).unwrap();
            dir.path().join("b")
        })
        .unwrap();
        let read = block_values(&data, 1024);
        // The first session read blocks 0..6 and 9, and a hole marker is never kept.
        let mut log = ValueLog::default();
        for i in (0..6).chain([9]) {
            log.note(0, i, read[i as usize]);
        }
        log.note(0, 10, hole_value(10, 1024));
        log.note(1, 0, block_values(&other, 1024)[0]);
        assert!(log.is_dirty());
        let (kept, err) = log.keep(&cache, &[src, twin], 1024);
        assert!(err.is_none(), "{err:?}");
        // The second file was opened as soon as written: not kept (racy).
        assert_eq!(kept, 1);
        assert!(!log.is_dirty());
        let src = SourceFile::open(&dir.path().join("a")).unwrap();
        let got = cache.load(&src, 1024).unwrap();
        assert_eq!(got.len(), 7);
        assert!(got.get(6).is_none() && got.get(10).is_none());
        // Values from the cache, the rest read: the root is the one of reading every block.
        let mixed: Vec<BlockValue> = (0..read.len() as u64)
            .map(|i| got.get(i).unwrap_or(read[i as usize]))
            .collect();
        assert_eq!(file_hash(&mixed), *blake3::hash(&data).as_bytes());
        // Another block size, or another file, finds nothing.
        assert!(cache.load(&src, 2048).is_none());
        let twin = SourceFile::open(&dir.path().join("b")).unwrap();
        assert!(cache.load(&twin, 1024).is_none());
        // The entry and its directory are the user's only.
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&cache.entry_path(&src.stamp())), 0o600);
        assert_eq!(mode(cache.dir()), 0o700);
        // Confirmed: the entry goes.
        log.confirmed(0, &src, Some(&cache));
        assert!(cache.load(&src, 1024).is_none());
    }

    #[test]
    fn a_source_changed_with_its_mtime_restored_finds_no_values() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ValueCache::at(dir.path().join("values"));
        let data = vec![5u8; 4096];
        let src = old_source(dir.path(), "a", &data);
        let mut log = ValueLog::default();
        for (i, v) in block_values(&data, 1024).into_iter().enumerate() {
            log.note(0, i as u64, v);
        }
        assert_eq!(log.keep(&cache, &[src], 1024).0, 1);
        let path = dir.path().join("a");
        let before = SourceFile::open(&path).unwrap();
        assert!(cache.load(&before, 1024).is_some());
        // Same size, one byte changed, the modification time put back as it was.
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(b"x", 100).unwrap();
        let mtime = UNIX_EPOCH + Duration::from_nanos(before.stamp().mtime_ns as u64);
        f.set_modified(mtime).unwrap();
        drop(f);
        let after = SourceFile::open(&path).unwrap();
        assert_eq!(after.stamp().mtime_ns, before.stamp().mtime_ns);
        assert_ne!(after.stamp().ctime_ns, before.stamp().ctime_ns);
        assert!(cache.load(&after, 1024).is_none());
        // A source opened before the change and changed after: its stamp now is not the one of
        // its open, so nothing is loaded for it, nor kept.
        assert!(cache.load(&before, 1024).is_none());
        let mut log = ValueLog::default();
        log.note(0, 0, [1; 32]);
        assert_eq!(log.keep(&cache, &[before], 1024).0, 0);
        assert!(
            !cache.entry_path(&after.stamp()).exists(),
            "its entry removed"
        );
    }

    #[test]
    fn the_cache_stays_within_its_bounds_and_leaves_no_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ValueCache::at(dir.path());
        for ino in 0..(MAX_ENTRIES as u64 + 5) {
            let s = SourceStamp { ino, ..stamp() };
            cache.store(&s, 1024, &values(&[0])).unwrap();
        }
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), MAX_ENTRIES, "{names:?}");
        assert!(names.iter().all(|n| n.ends_with(".values")));
        // The newest stays.
        let newest = SourceStamp {
            ino: MAX_ENTRIES as u64 + 4,
            ..stamp()
        };
        assert!(cache.entry_path(&newest).exists());
        // No values: no entry.
        cache.store(&newest, 1024, &BTreeMap::new()).unwrap();
        assert!(!cache.entry_path(&newest).exists());
    }

    #[test]
    fn a_directory_others_may_write_is_neither_read_nor_written() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let data = vec![3u8; 20 * 1024];
        let src = old_source(dir.path(), "a", &data);
        let cache = ValueCache::at(dir.path().join("values"));
        let mut log = ValueLog::default();
        log.note(0, 0, block_values(&data, 1024)[0]);
        assert_eq!(log.keep(&cache, std::slice::from_ref(&src), 1024).0, 1);
        assert!(cache.load(&src, 1024).is_some());
        fs::set_permissions(cache.dir(), fs::Permissions::from_mode(0o777)).unwrap();
        assert!(
            cache.load(&src, 1024).is_none(),
            "read from a shared directory"
        );
        let e = cache.store(&src.stamp(), 1024, &values(&[1])).unwrap_err();
        assert!(matches!(e, CacheError::NotOurs { .. }), "{e}");
    }

    #[test]
    fn a_cache_that_cannot_be_written_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("hurtle"), b"").unwrap();
        let cache = ValueCache::at(dir.path().join("hurtle/values"));
        let e = cache.store(&stamp(), 1024, &values(&[1])).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("block value cache: cannot create"),
            "{e}"
        );
    }
}
