//! The names of a part file and its block journal beside the final name, and the journal's
//! format.
//!
//! A file is received into `.<name>.hurtle-part` ([`PART_SUFFIX`]). Beside it, a block journal
//! `.<name>.hurtle-blocks` ([`JOURNAL_SUFFIX`]) lists the blocks that passed verification, one
//! number a line after a header naming the file's size and block size, so that a transfer
//! interrupted by a killed peer, a lost network or a full disk can resume
//! ([`PartFile::resume`](super::PartFile::resume)). The journal is a hint, not a proof: a
//! resumed block is hashed again and checked against the sender's value before it counts, so a
//! journal that is stale, torn or lying costs a refetch, never a wrong byte.

use super::path::MAX_COMPONENT_LEN;

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

/// The first line of a block journal: what the blocks are blocks of. A journal whose header
/// does not match the transfer (another size or block size) is not resumed from.
pub(super) fn journal_header(size: u64, block_size: u64) -> String {
    format!("hurtle-blocks 1 size={size} block={block_size}\n")
}

/// The block numbers a journal lists, if its header matches `size` and `block_size`: sorted,
/// without repeats, each below the file's block count. A line that is not a complete decimal
/// number (a write torn by a crash) is skipped.
pub(super) fn parse_journal(text: &[u8], size: u64, block_size: u64) -> Option<Vec<u64>> {
    let header = journal_header(size, block_size);
    let rest = text.strip_prefix(header.as_bytes())?;
    let count = size.div_ceil(block_size.max(1));
    let mut blocks: Vec<u64> = rest
        .split_inclusive(|&b| b == b'\n')
        .filter_map(|line| line.strip_suffix(b"\n"))
        .filter_map(|line| std::str::from_utf8(line).ok()?.parse::<u64>().ok())
        .filter(|&b| b < count)
        .collect();
    blocks.sort_unstable();
    blocks.dedup();
    Some(blocks)
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

    proptest! {
        /// Whatever a journal holds after its header, what it yields is sorted, without
        /// repeats and inside the file; the lines that are whole numbers in range all count.
        #[test]
        fn any_journal_yields_only_blocks_of_the_file(
            lines in proptest::collection::vec("[0-9]{0,3}|x|[0-9]+ ", 0..40),
            torn in "[0-9]{0,2}",
        ) {
            let (size, block) = (50 * 1024 + 1, 1024);
            let mut text = journal_header(size, block).into_bytes();
            for l in &lines {
                text.extend_from_slice(l.as_bytes());
                text.push(b'\n');
            }
            text.extend_from_slice(torn.as_bytes());
            let got = parse_journal(&text, size, block).unwrap();
            let mut want: Vec<u64> = lines
                .iter()
                .filter_map(|l| l.parse::<u64>().ok())
                .filter(|&b| b < 51)
                .collect();
            want.sort_unstable();
            want.dedup();
            prop_assert_eq!(got, want);
            prop_assert!(parse_journal(&text, size + 1, block).is_none());
            prop_assert!(parse_journal(&text[1..], size, block).is_none());
        }
    }
}
