//! rsync's everyday filters, end to end against rsync itself: the same tree sent with
//! `--exclude`/`--include` by `hurtle send` and `hurtle cp` (push and pull, through a stand-in
//! for ssh that runs the far side's command here) lands as `rsync -r` with the same patterns
//! leaves it; and `hurtle send -`, standard input sent as a named file.

#[allow(dead_code)] // shared with the other test binaries
mod support;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use support::fsx::{self, Node};
use support::proc::{self, bin, cp, fake_ssh, start_receiver, Proc};
use support::TRANSFER_TIMEOUT;

/// What a tree holds, for comparing with rsync's copy: each path, and a file's content hash
/// (modes are left out: `rsync -r` does not keep them).
fn contents(root: &Path) -> BTreeMap<String, Option<String>> {
    fsx::tree(root)
        .into_iter()
        .map(|(p, n)| {
            let hash = match n {
                Node::File { hash, .. } => Some(hash),
                _ => None,
            };
            (p, hash)
        })
        .collect()
}

/// `src/tree` with names every case below picks from: a file and a directory both named
/// `build`, `cache` at several depths, `top-only` at the top and below, `.tmp` files.
fn make_tree(src: &Path) -> PathBuf {
    let t = src.join("tree");
    for d in ["build", "src/sub", "src/deep/cache", "cache", "docs"] {
        std::fs::create_dir_all(t.join(d)).unwrap();
    }
    for (f, body) in [
        ("a.txt", "a"),
        ("x.tmp", "x"),
        ("keep.tmp", "keep"),
        ("top-only", "top"),
        ("build/out.o", "obj"),
        ("src/main.c", "int main;"),
        ("src/util.h", "#pragma once"),
        ("src/build", "a file named build"),
        ("src/sub/top-only", "below"),
        ("src/sub/y.tmp", "y"),
        ("src/sub/z.c", "z"),
        ("src/deep/cache/d.bin", "d"),
        ("cache/c.bin", "c"),
        ("docs/readme", "r"),
    ] {
        std::fs::write(t.join(f), body).unwrap();
    }
    t
}

/// `rsync -r PATTERNS SRC DEST`: the reference.
fn rsync(patterns: &[&str], src: &str, dest: &Path) {
    let args: Vec<&str> = std::iter::once("-r")
        .chain(patterns.iter().copied())
        .collect();
    support::rsync(&args, src, dest, &[0]);
}

/// The cases: patterns as a user would type them, each flag with its value.
const CASES: &[&[&str]] = &[
    &["--exclude", "*.tmp"],
    &["--exclude", "build/"],
    &["--exclude", "/tree/top-only"],
    &["--exclude", "**/cache"],
    &["--exclude", "src/*.h"],
    &["--include", "keep.tmp", "--exclude", "*.tmp"],
    &["--exclude", "*.tmp", "--include", "keep.tmp"],
    &["--include", "*/", "--include", "*.c", "--exclude", "*"],
    &["--exclude", "src/", "--include", "src/main.c"],
];

#[test]
fn send_leaves_out_what_rsync_leaves_out() {
    let t = support::tempdir("hurtle-filters-");
    let tree = make_tree(&t.path().join("src"));
    for (i, patterns) in CASES.iter().enumerate() {
        let want = t.path().join(format!("rsync{i}"));
        rsync(patterns, tree.to_str().unwrap(), &want);
        let out = t.path().join(format!("out{i}"));
        let r = start_receiver(&out, &[]);
        proc::send(r.addr, &[&tree], patterns).assert_success();
        r.proc.wait(TRANSFER_TIMEOUT).assert_success();
        assert_eq!(contents(&out), contents(&want), "{patterns:?}");
        // Not vacuous: every case leaves something out, and sends something.
        assert!(contents(&out).len() < contents(tree.parent().unwrap()).len());
        assert!(!contents(&out).is_empty(), "{patterns:?}");
    }
}

#[test]
fn cp_push_and_pull_leave_out_what_rsync_leaves_out() {
    let t = support::tempdir("hurtle-filters-");
    let tree = make_tree(&t.path().join("src"));
    let ssh = fake_ssh(t.path());
    // `tree/`: the contents, so `/top-only` is anchored at the tree's own top.
    let cases: &[&[&str]] = &[
        &["--exclude", "/top-only"],
        &[
            "--include",
            "keep.tmp",
            "--exclude",
            "*.tmp",
            "--exclude",
            "build/",
        ],
    ];
    let src = format!("{}/", tree.display());
    for (i, patterns) in cases.iter().enumerate() {
        let want = t.path().join(format!("rsync{i}"));
        rsync(patterns, &src, &want);
        let pushed = t.path().join(format!("push{i}"));
        let mut args = patterns.to_vec();
        let dest = format!("localhost:{}/", pushed.display());
        args.extend([src.as_str(), dest.as_str()]);
        cp(&ssh, &args).assert_success();
        assert_eq!(contents(&pushed), contents(&want), "push {patterns:?}");

        // A pull: the far side is the sender, and gets the rules in their order.
        let pulled = t.path().join(format!("pull{i}"));
        let mut args = patterns.to_vec();
        let from = format!("localhost:{src}");
        let dest = format!("{}/", pulled.display());
        args.extend([from.as_str(), dest.as_str()]);
        cp(&ssh, &args).assert_success();
        assert_eq!(contents(&pulled), contents(&want), "pull {patterns:?}");
    }
}

#[test]
fn a_bad_pattern_is_a_usage_error() {
    let t = support::tempdir("hurtle-filters-");
    let f = Proc::spawn(
        "sender",
        &[
            "send",
            t.path().to_str().unwrap(),
            "--to",
            "127.0.0.1:9",
            "--exclude",
            "a**b",
        ],
    )
    .wait(TRANSFER_TIMEOUT);
    assert_eq!(f.status.code(), Some(2), "{f:?}");
    assert!(f.stderr.contains("a**b"), "{}", f.stderr);
}

#[test]
fn send_dash_sends_standard_input_under_its_name() {
    let t = support::tempdir("hurtle-filters-");
    let input = t.path().join("input.bin");
    fsx::write_random(&input, 3 << 20, 54);
    let out = t.path().join("out");
    let r = start_receiver(&out, &[]);
    // Through a pipe, as `tar c dir | hurtle send -` gives it.
    let script = format!(
        "cat {} | \"$0\" send - --name from-stdin.bin --to {} --channels 2",
        input.display(),
        r.addr
    );
    Proc::spawn_program("sender", "sh", &["-c", script.as_str(), bin()])
        .wait(TRANSFER_TIMEOUT)
        .assert_success();
    r.proc.wait(TRANSFER_TIMEOUT).assert_success();
    fsx::assert_same_file(&input, &out.join("from-stdin.bin"));
    assert_eq!(contents(&out).len(), 1, "only the one file");
    let mode = std::fs::metadata(out.join("from-stdin.bin"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644);

    // Misuse is a usage error, before anything connects.
    for args in [
        &["send", "-", "--to", "127.0.0.1:9"][..],
        &["send", "-", "--name", "a/b", "--to", "127.0.0.1:9"][..],
        &["send", "-", "x", "--name", "n", "--to", "127.0.0.1:9"][..],
        &["send", s(&input), "--name", "n", "--to", "127.0.0.1:9"][..],
    ] {
        let f = Proc::spawn("sender", args).wait(TRANSFER_TIMEOUT);
        assert_eq!(f.status.code(), Some(2), "{args:?}: {f:?}");
        assert!(
            f.stderr.contains("--name") || f.stderr.contains("standard input"),
            "{args:?}: {}",
            f.stderr
        );
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}
