//! End-to-end tests of sparse files: their holes are neither sent nor hashed, the file arrives
//! byte-exact and keeps its holes, and both sides report the same root of the kind they say
//! (`"hash": "blake3-sparse"` with announced holes, `"blake3"`, what `b3sum` prints, without).
//!
//! Every process runs under a deadline and is killed by its own handle if it overstays.

#[allow(dead_code)] // shared with the other test binaries
mod support;

use hurtle_proto::hash::{file_hash, value_of, BlockValue};
use serde_json::Value;
use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use support::fsx;
use support::proc::{self, start_receiver};
use support::TRANSFER_TIMEOUT;

const MIB: u64 = 1 << 20;

/// Bytes written at an offset.
type Written = (u64, Vec<u8>);

/// A sparse file of `size` bytes with `data` (offset, bytes) written into it; the rest holes.
fn sparse_file(path: &Path, size: u64, data: &[Written]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let f = fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
    for (at, bytes) in data {
        f.write_all_at(bytes, *at).unwrap();
    }
}

/// The root hurtle reports for `content` in blocks of `block` bytes when the blocks
/// `announced` (ascending half-open ranges) were announced as holes: computed here from the
/// bytes, independently of the engine.
fn sparse_root(content: &[u8], block: u64, announced: &[(u64, u64)]) -> [u8; 32] {
    let n = content.len().div_ceil(block as usize) as u64;
    let values: Vec<BlockValue> = content
        .chunks(block as usize)
        .enumerate()
        .map(|(i, c)| {
            let i = i as u64;
            let hole = announced.iter().any(|&(a, b)| a <= i && i < b);
            value_of(c, i, block, n, hole)
        })
        .collect();
    file_hash(&values)
}

/// Sends `src` in 1 MiB chunks into `out` with `extra` sender arguments; checks that it
/// arrived byte-exact and returns both sides' summaries.
fn send(src: &Path, out: &Path, extra: &[&str]) -> (Value, Value) {
    let r = start_receiver(out, &["--json"]);
    let mut args = vec!["--json", "--chunk-size", "1M"];
    args.extend_from_slice(extra);
    let s = proc::send(r.addr, &[src], &args);
    s.assert_success();
    let rj = r.proc.wait(TRANSFER_TIMEOUT).assert_success().json();
    fsx::assert_same_file(src, &out.join(src.file_name().unwrap()));
    fsx::assert_no_part_files(out);
    (s.json(), rj)
}

/// The one file's report in a summary.
fn report(v: &Value) -> &Value {
    let files = v["file_hashes"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{v}");
    &files[0]
}

fn hex(h: &[u8; 32]) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn holes_are_valued_not_hashed_and_both_sides_report_the_same_sparse_root() {
    let t = support::tempdir("hurtle-sparse-");
    // Layouts: data in the middle, at both ends, in the last short block, none at all but a
    // few bytes; holes running to the end and holes between data.
    let cases: [(u64, Vec<Written>); 3] = [
        (
            24 * MIB + 5,
            vec![(0, b"head".to_vec()), (24 * MIB, b"tail!".to_vec())],
        ),
        (32 * MIB, vec![(16 * MIB - 3, vec![0x5a; 10])]),
        (
            9 * MIB + 777,
            vec![(3 * MIB, vec![7; 2 * MIB as usize]), (9 * MIB + 1, vec![1])],
        ),
    ];
    for (n, (size, data)) in cases.into_iter().enumerate() {
        let src = t.path().join(format!("src{n}/disk.img"));
        sparse_file(&src, size, &data);
        let f = fs::File::open(&src).unwrap();
        let holes = hurtle_engine::fs::hole_blocks(&f, size, MIB).unwrap();
        assert!(!holes.is_empty(), "case {n}: no holes on this filesystem");
        let content = fs::read(&src).unwrap();
        let out = t.path().join(format!("out{n}"));
        let (sj, rj) = send(&src, &out, &[]);
        let want = hex(&sparse_root(&content, MIB, &holes));
        for j in [&sj, &rj] {
            assert_eq!(report(j)["hash"], "blake3-sparse", "case {n}: {j}");
            assert_eq!(report(j)["blake3"], want.as_str(), "case {n}: {j}");
            let hole_bytes = hurtle_engine::fs::bytes_in_blocks(&holes, MIB, size);
            assert_eq!(j["sparse_bytes"].as_u64().unwrap(), hole_bytes, "{j}");
        }
        assert_ne!(want, hex(blake3::hash(&content).as_bytes()));
        // The receiver's copy keeps its holes: only the data blocks take space.
        let got = fs::metadata(out.join("disk.img")).unwrap().blocks() * 512;
        let data_blocks = size.div_ceil(MIB) - holes.iter().map(|h| h.1 - h.0).sum::<u64>();
        assert!(
            got <= (data_blocks + 1) * MIB,
            "case {n}: {got} bytes allocated for {data_blocks} data blocks"
        );
    }
}

#[test]
fn without_announced_holes_the_root_is_b3sums() {
    let t = support::tempdir("hurtle-sparse-");
    let size = 6 * MIB + 3;
    let src = t.path().join("src/disk.img");
    sparse_file(&src, size, &[(2 * MIB, b"x".to_vec())]);
    let content = fs::read(&src).unwrap();
    let (sj, rj) = send(&src, &t.path().join("out"), &["--no-sparse"]);
    let want = hex(blake3::hash(&content).as_bytes());
    for j in [&sj, &rj] {
        assert_eq!(report(j)["hash"], "blake3", "{j}");
        assert_eq!(report(j)["blake3"], want.as_str(), "{j}");
        assert_eq!(j["sparse_bytes"].as_u64().unwrap(), 0, "{j}");
    }
}
