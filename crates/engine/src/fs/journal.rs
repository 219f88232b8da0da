//! The names of a part file and its block journal beside the final name, and the journal's
//! format.
//!
//! A file is received into `.<name>.hurtle-part` ([`PART_SUFFIX`]). Beside it, a block journal
//! `.<name>.hurtle-blocks` ([`JOURNAL_SUFFIX`]) lists the blocks that passed verification, so
//! that a transfer interrupted by a killed peer, a lost network or a full disk can resume
//! ([`PartFile::resume`](super::PartFile::resume)) without reading them all back.
//!
//! Its first line names the file's size and block size and holds a random 32-byte key, made
//! when the journal is; each further line is one block: its number, its value (BLAKE3, as
//! verified) and a MAC, the keyed BLAKE3 of the key over the part file's inode, the size, the
//! block size, the block's number and value (`entry_line`). When the part file is closed
//! without being put in place (the transfer was interrupted, but this process lived to see it
//! end), it is synced and a seal line notes its change time (`seal_line`,
//! [`PartFile::seal_journal`](super::PartFile::seal_journal)).
//!
//! On resume, a line whose MAC checks, in a journal sealed at the part file's change time now
//! (nothing wrote into it since), is trusted: the block counts as held with that value, unread
//! ([`Journaled::trusted`]). Every other line that names a block is only a claim: that block is
//! read and hashed again and checked against the sender's value before it counts
//! ([`Journaled::claims`]). Claims are what a torn line (a crash mid-write), a line of an earlier
//! journal or of another part file, a line written by hand, a version 1 journal (numbers only),
//! and every line of an unsealed journal (the receiver killed with `kill -9`, a power loss) or
//! of a part file changed since its seal leave.
//!
//! What this defends: torn and partial lines, stale lines (another key or another part file),
//! lines made by anyone who cannot read the key, writes into the part file after the seal
//! (its change time moves, and no one can set it back), and a crash before the seal. What it
//! does not: someone who can read the journal (the key is beside the data it vouches for,
//! mode 0600) and forge a seal, bytes the disk itself corrupts after the seal without the
//! kernel noticing (nothing is read again), and a write into the part file within the
//! filesystem's timestamp granularity of the seal.

use super::path::MAX_COMPONENT_LEN;
use hurtle_proto::hash::BlockValue;

/// Suffix of the temporary file a file is received into: `.<name>.hurtle-part`.
pub const PART_SUFFIX: &str = ".hurtle-part";

/// Suffix of the block journal beside a part file: `.<name>.hurtle-blocks`.
pub const JOURNAL_SUFFIX: &str = ".hurtle-blocks";

/// Name of the temporary file for final name `name`: `.<name>.hurtle-part`, or, when that would
/// exceed [`MAX_COMPONENT_LEN`], a shortened name that keeps a hash of the full one (so it is
/// still unique and stable across runs).
pub(super) fn part_file_name(name: &str) -> String {
    hidden_name(name, PART_SUFFIX)
}

/// Name of the block journal for final name `name`, shortened like [`part_file_name`].
pub(super) fn journal_file_name(name: &str) -> String {
    hidden_name(name, JOURNAL_SUFFIX)
}

/// `.<name><suffix>`, or a shortened name with a hash of `name` where that is too long.
fn hidden_name(name: &str, suffix: &str) -> String {
    let plain = format!(".{name}{suffix}");
    if plain.len() <= MAX_COMPONENT_LEN {
        return plain;
    }
    const HASH_HEX: usize = 16;
    let hash = blake3::hash(name.as_bytes()).to_hex();
    let hash = hash.get(..HASH_HEX).unwrap_or_default();
    // "." + prefix + "~" + hash + suffix
    let budget = MAX_COMPONENT_LEN - 2 - HASH_HEX - suffix.len();
    let mut cut = budget.min(name.len());
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!(".{}~{hash}{suffix}", &name[..cut])
}

/// A journal's key: what its lines' MACs are keyed with.
pub(super) type JournalKey = [u8; 32];

/// What the MAC of a journal line binds a block's value to: the part file's inode, the file's
/// size and the block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct JournalScope {
    pub(super) inode: u64,
    pub(super) size: u64,
    pub(super) block_size: u64,
}

/// The first line of a block journal: what the blocks are blocks of, and the key. A journal
/// whose header does not match the transfer (another size or block size) is not resumed from.
pub(super) fn journal_header(size: u64, block_size: u64, key: &JournalKey) -> String {
    format!(
        "hurtle-blocks 2 size={size} block={block_size} key={}\n",
        hex(key)
    )
}

/// The header of a version 1 journal (numbers only, no key): every line is a claim.
fn journal_header_v1(size: u64, block_size: u64) -> String {
    format!("hurtle-blocks 1 size={size} block={block_size}\n")
}

/// A journal line for block `index` with value `value`: `<index> <value hex> <mac hex>`.
pub(super) fn entry_line(
    key: &JournalKey,
    scope: JournalScope,
    index: u64,
    value: &BlockValue,
) -> String {
    format!(
        "{index} {} {}\n",
        hex(value),
        hex(&entry_mac(key, scope, index, value))
    )
}

/// The line that seals a journal when its part file is closed: the part file's change time
/// then (`ctime`, seconds and nanoseconds), after its last write: `seal <s>.<ns> <mac hex>`.
pub(super) fn seal_line(key: &JournalKey, scope: JournalScope, ctime: (i64, i64)) -> String {
    format!(
        "seal {}.{:09} {}\n",
        ctime.0,
        ctime.1,
        hex(&seal_mac(key, scope, ctime))
    )
}

/// The MAC of a seal line: 16 bytes of keyed BLAKE3.
fn seal_mac(key: &JournalKey, scope: JournalScope, ctime: (i64, i64)) -> [u8; 16] {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(b"hurtle journal seal 2");
    for n in [scope.inode, scope.size, scope.block_size] {
        h.update(&n.to_le_bytes());
    }
    h.update(&ctime.0.to_le_bytes());
    h.update(&ctime.1.to_le_bytes());
    let mut mac = [0u8; 16];
    mac.copy_from_slice(&h.finalize().as_bytes()[..16]);
    mac
}

/// A seal line's change time and MAC, if it is one.
fn parse_seal(line: &str) -> Option<((i64, i64), [u8; 16])> {
    let mut parts = line.strip_prefix("seal ")?.split(' ');
    let (sec, nsec) = parts.next()?.split_once('.')?;
    let ctime = (sec.parse().ok()?, nsec.parse().ok()?);
    let mac = unhex::<16>(parts.next()?)?;
    parts.next().is_none().then_some((ctime, mac))
}

/// The MAC of a journal line (see the module docs): 16 bytes of keyed BLAKE3.
fn entry_mac(key: &JournalKey, scope: JournalScope, index: u64, value: &BlockValue) -> [u8; 16] {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(b"hurtle journal entry 2");
    for n in [scope.inode, scope.size, scope.block_size, index] {
        h.update(&n.to_le_bytes());
    }
    h.update(value);
    let mut mac = [0u8; 16];
    mac.copy_from_slice(&h.finalize().as_bytes()[..16]);
    mac
}

/// What a journal says, once read (`parse_journal`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Journaled {
    /// Blocks whose lines' MACs check, with their values: held unread. Ascending, no repeats.
    pub trusted: Vec<(u64, BlockValue)>,
    /// Other blocks the journal names: to hash again before they count. Ascending, no
    /// repeats, none of them trusted.
    pub claims: Vec<u64>,
    /// The journal's key when it is a version 2 journal (lines are appended with it).
    pub(super) key: Option<JournalKey>,
}

impl Journaled {
    /// True when it names no block.
    pub fn is_empty(&self) -> bool {
        self.trusted.is_empty() && self.claims.is_empty()
    }
}

/// What a journal holds, if its header matches the scope's size and block size: every block
/// it names is below the file's block count; see [`Journaled`]. A line that is not complete
/// (a write torn by a crash) names nothing. Lines are trusted only when a seal line vouches
/// that the part file was not changed since it was closed: its change time now, `ctime`, is
/// the one sealed; otherwise every block named is a claim.
pub(super) fn parse_journal(
    text: &[u8],
    scope: JournalScope,
    ctime: (i64, i64),
) -> Option<Journaled> {
    let JournalScope {
        size, block_size, ..
    } = scope;
    let count = size.div_ceil(block_size.max(1));
    let (rest, key) = match text.strip_prefix(journal_header_v1(size, block_size).as_bytes()) {
        Some(rest) => (rest, None),
        None => {
            let line_end = text.iter().position(|&b| b == b'\n')?;
            let (first, rest) = (&text[..line_end], &text[line_end + 1..]);
            let first = std::str::from_utf8(first).ok()?;
            let prefix = format!("hurtle-blocks 2 size={size} block={block_size} key=");
            let key = unhex::<32>(first.strip_prefix(&prefix)?)?;
            (rest, Some(key))
        }
    };
    let mut trusted: Vec<(u64, BlockValue)> = Vec::new();
    let mut claims: Vec<u64> = Vec::new();
    let mut sealed = false;
    for line in rest
        .split_inclusive(|&b| b == b'\n')
        .filter_map(|line| line.strip_suffix(b"\n"))
        .filter_map(|line| std::str::from_utf8(line).ok())
    {
        if let (Some(key), Some((at, mac))) = (key, parse_seal(line)) {
            sealed |= at == ctime && seal_mac(&key, scope, at) == mac;
            continue;
        }
        let mut parts = line.split(' ');
        let Some(index) = parts.next().and_then(|n| n.parse::<u64>().ok()) else {
            continue;
        };
        if index >= count {
            continue;
        }
        let value = parts.next().and_then(unhex::<32>);
        let mac = parts.next().and_then(unhex::<16>);
        match (key, value, mac, parts.next()) {
            (Some(key), Some(value), Some(mac), None)
                if entry_mac(&key, scope, index, &value) == mac =>
            {
                trusted.push((index, value))
            }
            _ => claims.push(index),
        }
    }
    if !sealed {
        claims.extend(trusted.drain(..).map(|(b, _)| b));
    }
    trusted.sort_unstable_by_key(|&(b, _)| b);
    trusted.dedup_by_key(|&mut (b, _)| b);
    claims.sort_unstable();
    claims.dedup();
    claims.retain(|b| trusted.binary_search_by_key(b, |&(t, _)| t).is_err());
    Some(Journaled {
        trusted,
        claims,
        key,
    })
}

/// Lower-case hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `N` bytes from exactly `2 * N` hex digits.
fn unhex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::PartFile;
    use proptest::prelude::*;
    use std::fs;

    #[test]
    fn part_file_name_fits() {
        assert_eq!(part_file_name("a.txt"), ".a.txt.hurtle-part");
        let n242 = "n".repeat(242);
        assert_eq!(part_file_name(&n242).len(), 255);
        let long = "日".repeat(85); // 255 bytes
        let p = part_file_name(&long);
        assert!(p.len() <= MAX_COMPONENT_LEN, "{}", p.len());
        assert!(p.starts_with(".日") && p.ends_with(PART_SUFFIX));
        let other = format!("{}x", "日".repeat(84));
        assert_ne!(part_file_name(&other), p, "hash keeps names distinct");
        // And it really works on disk.
        let tmp = tempfile::tempdir().unwrap();
        let pf = PartFile::create(tmp.path(), &long, 2, false).unwrap();
        pf.write_at(0, b"ok").unwrap();
        let f = pf.finish(0o600, 0).unwrap();
        assert_eq!(fs::read(f).unwrap(), b"ok");
    }

    const SCOPE: JournalScope = JournalScope {
        inode: 77,
        size: 50 * 1024 + 1,
        block_size: 1024,
    };

    proptest! {
        /// Whatever a version 1 journal holds after its header, it vouches for nothing, and
        /// what it claims is sorted, without repeats and inside the file; the lines that are
        /// whole numbers in range all count.
        #[test]
        fn any_old_journal_yields_only_claims_of_the_file(
            lines in proptest::collection::vec("[0-9]{0,3}|x|[0-9]+ ", 0..40),
            torn in "[0-9]{0,2}",
        ) {
            let (size, block) = (SCOPE.size, SCOPE.block_size);
            let mut text = journal_header_v1(size, block).into_bytes();
            for l in &lines {
                text.extend_from_slice(l.as_bytes());
                text.push(b'\n');
            }
            text.extend_from_slice(torn.as_bytes());
            let got = parse_journal(&text, SCOPE, (0, 0)).unwrap();
            let mut want: Vec<u64> = lines
                .iter()
                .filter_map(|l| l.split(' ').next()?.parse::<u64>().ok())
                .filter(|&b| b < 51)
                .collect();
            want.sort_unstable();
            want.dedup();
            prop_assert!(got.trusted.is_empty());
            prop_assert_eq!(got.claims, want);
            let bigger = JournalScope { size: size + 1, ..SCOPE };
            prop_assert!(parse_journal(&text, bigger, (0, 0)).is_none());
            prop_assert!(parse_journal(&text[1..], SCOPE, (0, 0)).is_none());
        }

        /// A journal of lines each whole, cut short, or with one byte changed: exactly the
        /// whole lines are trusted, with their values; the others are claims where their
        /// number survived; nothing is both.
        #[test]
        fn only_whole_lines_are_trusted(
            lines in proptest::collection::vec((0u64..51, any::<u8>(), 0u8..3, any::<usize>()), 0..30),
        ) {
            let key: JournalKey = [9; 32];
            let mut text = journal_header(SCOPE.size, SCOPE.block_size, &key).into_bytes();
            let mut whole = std::collections::BTreeMap::new();
            for &(b, v, how, at) in &lines {
                let line = entry_line(&key, SCOPE, b, &[v; 32]);
                let mut bytes = line.clone().into_bytes();
                match how {
                    0 => {
                        whole.entry(b).or_insert([v; 32]);
                    }
                    1 => bytes.truncate(at % (line.len() - 1)),
                    _ => {
                        // A changed digit of the value or the MAC (never the number).
                        let i = line.find(' ').unwrap() + 1 + at % (line.len() - line.find(' ').unwrap() - 2);
                        if bytes[i] == b' ' {
                            continue;
                        }
                        bytes[i] = if bytes[i] == b'0' { b'1' } else { b'0' };
                    }
                }
                if how == 1 {
                    bytes.push(b'\n');
                }
                text.extend_from_slice(&bytes);
            }
            text.extend_from_slice(seal_line(&key, SCOPE, (5, 6)).as_bytes());
            let got = parse_journal(&text, SCOPE, (5, 6)).unwrap();
            let trusted: Vec<(u64, BlockValue)> = whole.into_iter().collect();
            // A block with a whole line keeps the first whole line's value.
            prop_assert_eq!(got.trusted.iter().map(|t| t.0).collect::<Vec<_>>(),
                trusted.iter().map(|t| t.0).collect::<Vec<_>>());
            for (b, v) in &got.trusted {
                prop_assert!(lines.iter().any(|&(lb, lv, how, _)| lb == *b && how == 0 && [lv; 32] == *v));
            }
            for c in &got.claims {
                prop_assert!(got.trusted.binary_search_by_key(c, |t| t.0).is_err());
            }
            // Another inode, another key: nothing is trusted.
            let moved = JournalScope { inode: 78, ..SCOPE };
            let other = parse_journal(&text, moved, (5, 6)).unwrap();
            prop_assert!(other.trusted.is_empty());
            // The part file changed since the seal: nothing is trusted, all is claimed.
            let changed = parse_journal(&text, SCOPE, (5, 7)).unwrap();
            prop_assert!(changed.trusted.is_empty());
            for (b, _) in &got.trusted {
                prop_assert!(changed.claims.binary_search(b).is_ok());
            }
        }
    }
}
