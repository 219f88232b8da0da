//! Symbolic links end to end, against rsync itself on the same trees: links inside a sent
//! directory arrive as links (`rsync -a --safe-links`: those pointing outside the destination
//! are not created, each named in a warning and counted), `--copy-links`/`-L` sends what they
//! point at (`rsync -rL`), an existing link is left, refused or replaced as a file would be,
//! `--delete` mirrors links, `cp` push and pull carry them (a directory's and its contents',
//! `cp SRC/`, whose own links go as links as rsync sends them), and a hostile sender's link
//! never leads a write out of the destination.

#[allow(dead_code)] // shared with the other test binaries
mod support;

use hurtle_proto::wire::{Control, Entry, EntryKind};
use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;
use support::fsx;
use support::peer::RawPeer;
use support::proc::{self, cp, fake_ssh, start_receiver};
use support::TRANSFER_TIMEOUT;

/// What a tree holds: each path (relative, not following links) with a file's content hash,
/// `dir`, or a link's target.
fn listing(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let what = if m.file_type().is_symlink() {
                format!("-> {}", std::fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                stack.push(p);
                "dir".into()
            } else {
                fsx::blake3_hex(&p)
            };
            out.insert(rel, what);
        }
    }
    out
}

/// `src/tree` with a file at two depths and links of every kind inside it; `src/beside.txt`
/// and `outside.txt` (above `src`) for the links that leave it. Returns the tree.
///
/// | link | target | rsync --safe-links |
/// |---|---|---|
/// | `rel` | `f.txt` | safe |
/// | `dirlink` | `sub` (a directory) | safe |
/// | `dangling` | `nowhere` | safe |
/// | `sub/up` | `../f.txt` | safe |
/// | `sub/side` | `../../beside.txt`: out of the tree, still inside the destination | safe |
/// | `abs` | `/…/src/tree/f.txt` (absolute) | unsafe |
/// | `sub/out` | `../../../outside.txt` (climbs out of the destination) | unsafe |
fn make_tree(root: &Path) -> PathBuf {
    let src = root.join("src");
    let t = src.join("tree");
    std::fs::create_dir_all(t.join("sub")).unwrap();
    std::fs::write(t.join("f.txt"), "f").unwrap();
    std::fs::write(t.join("sub/g.txt"), "g").unwrap();
    std::fs::write(src.join("beside.txt"), "beside").unwrap();
    std::fs::write(root.join("outside.txt"), "outside").unwrap();
    for (link, target) in [
        ("rel", "f.txt".to_string()),
        ("dirlink", "sub".into()),
        ("dangling", "nowhere".into()),
        ("sub/up", "../f.txt".into()),
        ("sub/side", "../../beside.txt".into()),
        ("abs", t.join("f.txt").display().to_string()),
        ("sub/out", "../../../outside.txt".into()),
    ] {
        symlink(target, t.join(link)).unwrap();
    }
    t
}

/// `rsync ARGS SRC DEST` (the reference), which must exit with one of `ok` codes.
fn rsync_ok(args: &[&str], src: &str, dest: &Path, ok: &[i32]) {
    std::fs::create_dir_all(dest).unwrap();
    support::rsync(args, src, dest, ok);
}

fn rsync(args: &[&str], src: &str, dest: &Path) {
    rsync_ok(args, src, dest, &[0]);
}

/// Modification time of `path` itself (a link's own), nanoseconds.
fn lmtime_ns(path: &Path) -> i64 {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path).unwrap();
    m.mtime() * 1_000_000_000 + m.mtime_nsec()
}

#[test]
fn links_arrive_as_links_and_unsafe_ones_are_refused_as_rsync_safe_links_does() {
    let t = support::tempdir("hurtle-symlinks-");
    let tree = make_tree(t.path());
    let want = t.path().join("rsync");
    rsync(&["-a", "--safe-links"], tree.to_str().unwrap(), &want);

    let dest = t.path().join("dest");
    let r = start_receiver(&dest, &["--json"]);
    let sent = proc::send(r.addr, &[&tree], &[]);
    sent.assert_success();
    let done = r.proc.wait(TRANSFER_TIMEOUT);
    done.assert_success();
    assert_eq!(listing(&dest), listing(&want));
    // Not vacuous: the safe links are there as links, the unsafe ones are not.
    let got = listing(&dest);
    assert_eq!(got["tree/rel"], "-> f.txt");
    assert_eq!(got["tree/dirlink"], "-> sub");
    assert_eq!(got["tree/dangling"], "-> nowhere");
    assert_eq!(got["tree/sub/side"], "-> ../../beside.txt");
    assert!(!got.contains_key("tree/abs") && !got.contains_key("tree/sub/out"));
    // Each link keeps its own modification time, as rsync -a keeps it.
    for l in ["rel", "dirlink", "dangling", "sub/up"] {
        assert_eq!(
            lmtime_ns(&dest.join("tree").join(l)),
            lmtime_ns(&tree.join(l)),
            "{l}"
        );
    }
    // Counted and named.
    let summary = done.json();
    assert_eq!(summary["links"], 5, "{summary}");
    assert_eq!(summary["unsafe_links"], 2, "{summary}");
    let warnings = summary["warnings"].to_string();
    for named in ["tree/abs", "tree/sub/out -> ../../../outside.txt"] {
        assert!(warnings.contains(named), "{named}: {warnings}");
    }
    // The sender knows the rule too, and says which links will not be created.
    for named in ["tree/abs\"", "tree/sub/out\" -> ../../../outside.txt"] {
        assert!(sent.stderr.contains(named), "{named}: {}", sent.stderr);
    }
    assert_eq!(
        sent.stderr
            .matches("points outside the destination")
            .count(),
        2,
        "{}",
        sent.stderr
    );

    // The same links again: left as they are, no --overwrite needed.
    let r = start_receiver(&dest, &[]);
    proc::send(r.addr, &[&tree], &[]).assert_success();
    r.proc.wait(TRANSFER_TIMEOUT).assert_success();
    assert_eq!(listing(&dest), listing(&want));

    // A link that now points elsewhere is refused as a different file is (exit 3) ...
    std::fs::remove_file(tree.join("rel")).unwrap();
    symlink("sub/g.txt", tree.join("rel")).unwrap();
    let r = start_receiver(&dest, &[]);
    let cause = proc::send(r.addr, &[&tree], &[]).assert_exit(3);
    assert!(
        cause.contains("tree/rel") && cause.contains("--overwrite"),
        "{cause}"
    );
    let _ = r.proc.wait(TRANSFER_TIMEOUT);
    assert_eq!(listing(&dest)["tree/rel"], "-> f.txt");
    // ... and replaced with --overwrite, as rsync -a replaces it.
    let r = start_receiver(&dest, &["--overwrite"]);
    proc::send(r.addr, &[&tree], &[]).assert_success();
    r.proc.wait(TRANSFER_TIMEOUT).assert_success();
    rsync(&["-a", "--safe-links"], tree.to_str().unwrap(), &want);
    assert_eq!(listing(&dest), listing(&want));
    assert_eq!(listing(&dest)["tree/rel"], "-> sub/g.txt");
}

#[test]
fn copy_links_sends_what_they_point_at_as_rsync_copy_links_does() {
    let t = support::tempdir("hurtle-symlinks-");
    let tree = make_tree(t.path());
    // rsync -L says the dangling link has no referent (exit 23) and skips it.
    let want = t.path().join("rsync");
    rsync_ok(&["-rL"], tree.to_str().unwrap(), &want, &[0, 23]);
    for flag in ["-L", "--copy-links"] {
        let dest = t.path().join(format!("dest{flag}"));
        let r = start_receiver(&dest, &[]);
        let done = proc::send(r.addr, &[&tree], &[flag]);
        done.assert_success();
        r.proc.wait(TRANSFER_TIMEOUT).assert_success();
        assert_eq!(listing(&dest), listing(&want), "{flag}");
        let got = listing(&dest);
        assert_eq!(got["tree/dirlink"], "dir", "followed: {got:?}");
        assert_eq!(
            got["tree/sub/out"],
            fsx::blake3_hex(&t.path().join("outside.txt"))
        );
        assert!(
            done.stderr.contains("dangling"),
            "the dangling link is named: {}",
            done.stderr
        );
    }
}

#[test]
fn delete_mirrors_links_as_rsync_does() {
    let t = support::tempdir("hurtle-symlinks-");
    let tree = make_tree(t.path());
    let outside = t.path().join("precious");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("keep"), "keep me").unwrap();
    let stale = |dest: &Path| {
        std::fs::create_dir_all(dest.join("tree/sub")).unwrap();
        symlink("f.txt", dest.join("tree/stale-link")).unwrap();
        symlink(&outside, dest.join("tree/sub/away")).unwrap();
        // Where the sender has a link, the receiver had a file.
        std::fs::write(dest.join("tree/dangling"), "a file").unwrap();
    };
    let want = t.path().join("rsync");
    stale(&want);
    rsync(
        &["-a", "--safe-links", "--delete"],
        tree.to_str().unwrap(),
        &want,
    );
    let dest = t.path().join("dest");
    stale(&dest);
    let r = start_receiver(&dest, &["--allow-delete", "--overwrite"]);
    proc::send(r.addr, &[&tree], &["--delete"]).assert_success();
    r.proc.wait(TRANSFER_TIMEOUT).assert_success();
    assert_eq!(listing(&dest), listing(&want));
    assert!(!dest.join("tree/stale-link").exists());
    assert_eq!(listing(&dest)["tree/dangling"], "-> nowhere");
    assert_eq!(listing(&outside).len(), 1, "nothing deleted through a link");
}

#[test]
fn a_dry_run_creates_no_link() {
    let t = support::tempdir("hurtle-symlinks-");
    let tree = make_tree(t.path());
    let dest = t.path().join("dest");
    std::fs::create_dir_all(dest.join("tree")).unwrap();
    let r = start_receiver(&dest, &[]);
    proc::send(r.addr, &[&tree], &["-n"]).assert_success();
    r.proc.wait(TRANSFER_TIMEOUT).assert_success();
    assert!(
        listing(&dest.join("tree")).is_empty(),
        "{:?}",
        listing(&dest)
    );
}

#[test]
fn cp_push_and_pull_carry_links() {
    let t = support::tempdir("hurtle-symlinks-");
    let tree = make_tree(t.path());
    let ssh = fake_ssh(t.path());
    let want = t.path().join("rsync");
    rsync(&["-a", "--safe-links"], tree.to_str().unwrap(), &want);
    let want_contents = t.path().join("rsync-contents");
    let src_contents = format!("{}/", tree.display());
    rsync(&["-a", "--safe-links"], &src_contents, &want_contents);
    let (push, pull) = (t.path().join("push"), t.path().join("pull"));
    let (push_c, pull_c) = (t.path().join("push-c"), t.path().join("pull-c"));
    for d in [&push, &pull, &push_c, &pull_c] {
        std::fs::create_dir_all(d).unwrap();
    }
    let remote = |p: &str| format!("localhost:{p}");
    let into = |d: &Path| format!("{}/", d.display());
    for (from, to, dest, want) in [
        (
            tree.display().to_string(),
            remote(&into(&push)),
            &push,
            &want,
        ),
        (remote(tree.to_str().unwrap()), into(&pull), &pull, &want),
        (
            src_contents.clone(),
            remote(&into(&push_c)),
            &push_c,
            &want_contents,
        ),
        (
            remote(&src_contents),
            into(&pull_c),
            &pull_c,
            &want_contents,
        ),
    ] {
        let done = cp(&ssh, &[&from, &to]);
        done.assert_success();
        assert_eq!(listing(dest), listing(want), "{from} -> {to}");
        // Whichever side sends, the user hears of the links not created.
        assert!(
            done.stderr.contains("abs") && done.stderr.contains("points outside"),
            "{from} -> {to}: {}",
            done.stderr
        );
    }
    assert_eq!(listing(&pull)["tree/dirlink"], "-> sub");
    assert_eq!(listing(&pull_c)["rel"], "-> f.txt");
}

/// A link entry.
fn link(path: &str, target: &str) -> Entry {
    Entry {
        path: path.into(),
        kind: EntryKind::Symlink,
        size: 0,
        mode: 0o777,
        mtime_ns: 0,
        holes: Vec::new(),
        target: target.into(),
    }
}

fn entry(path: &str, kind: EntryKind) -> Entry {
    Entry {
        kind,
        mode: 0o755,
        ..link(path, "")
    }
}

/// Sends `entries` as a hostile sender's manifest to a fresh receiver into `out`, then hangs
/// up; the receiver's end.
fn hostile(out: &Path, entries: Vec<Entry>) -> proc::Finished {
    let r = start_receiver(out, &[]);
    let mut p = RawPeer::connect(r.addr);
    p.hello();
    p.send(&Control::Manifest {
        entries,
        last: true,
    });
    let _ = p.until_abort();
    p.close();
    r.proc.wait(Duration::from_secs(20))
}

#[test]
fn a_hostile_sender_s_links_never_lead_a_write_out_of_the_destination() {
    let t = support::tempdir("hurtle-symlinks-");
    let out = t.path().join("out");
    let outside = t.path().join("outside");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let o = outside.to_str().unwrap();
    let file = |p: &str| Entry {
        size: 0,
        mode: 0o644,
        ..entry(p, EntryKind::File)
    };
    let dir = |p: &str| entry(p, EntryKind::Dir);

    // A safe-looking link, then a file and a directory "through" it: refused, none written.
    let cases: Vec<(Vec<Entry>, &str)> = vec![
        (
            vec![dir("t"), link("t/in", "."), file("t/in/x")],
            "is a symbolic link",
        ),
        (
            vec![dir("t"), link("t/in", "sub"), dir("t/in/d")],
            "is a symbolic link",
        ),
        // A link where a directory of the manifest is.
        (vec![dir("t"), dir("t/d"), link("t/d", ".")], "exists"),
        // Link paths are checked as file paths are.
        (vec![link("../l", o)], "refusing"),
        (vec![link("/tmp/hurtle-l", o)], "refusing"),
        // A target no link can have.
        (vec![link("l", "a\0b")], "bad link"),
    ];
    let there = |p: PathBuf| std::fs::symlink_metadata(p).is_ok();
    for (i, (entries, why)) in cases.into_iter().enumerate() {
        let what = format!("{entries:?}");
        let out = out.join(i.to_string());
        let cause = hostile(&out, entries).assert_failure();
        assert!(cause.contains(why), "{what}: {cause}");
        assert!(fsx::tree(&outside).is_empty(), "{what}: written outside");
        assert!(
            !there(out.join("t/in/x")) && !there(out.join("t/in/d")),
            "{what}"
        );
        assert!(
            !there(out.join("t/x")) && !there(out.join("t/sub")),
            "{what}"
        );
    }
    // A link out of the destination is not created; what the manifest puts below its name
    // lands in a real directory inside.
    let _ = hostile(&out, vec![dir("u"), link("u/esc", o), dir("u/esc/d")]);
    assert!(fsx::tree(&outside).is_empty(), "written outside");
    let esc = std::fs::symlink_metadata(out.join("u/esc")).unwrap();
    assert!(esc.is_dir(), "a real directory, not a link");
    assert!(std::fs::symlink_metadata("/tmp/hurtle-l").is_err());
}
