//! `-n`/`--dry-run` and `--delete` end to end, against rsync itself on the same trees: a dry
//! run lists what `rsync -rtn --delete` would send and delete and leaves the receiver's tree as
//! it was; `--delete` leaves the destination as `rsync -r --delete` does with the same
//! patterns (what `--exclude` leaves out kept, never through a symlink out of the tree), only
//! after a complete transfer, and only where the receiver allowed it (`--allow-delete`).

#[allow(dead_code)] // shared with the other test binaries
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use support::fsx::{self, Node};
use support::proc::{self, cp, fake_ssh, start_receiver};
use support::TRANSFER_TIMEOUT;

/// What a tree holds, for comparing with rsync's copy: each path, a file's content hash, a
/// link as such (modes are left out: `rsync -r` does not keep them).
fn contents(root: &Path) -> BTreeMap<String, String> {
    fsx::tree(root)
        .into_iter()
        .map(|(p, n)| {
            let what = match n {
                Node::File { hash, .. } => hash,
                Node::Dir { .. } => "dir".into(),
                Node::Symlink => "link".into(),
            };
            (p, what)
        })
        .collect()
}

/// `src/tree`: files at two depths, `.tmp` files, a directory `build`.
fn make_tree(src: &Path) -> PathBuf {
    let t = src.join("tree");
    for d in ["sub/deep", "build"] {
        std::fs::create_dir_all(t.join(d)).unwrap();
    }
    for (f, body) in [
        ("a.txt", "a"),
        ("x.tmp", "x"),
        ("sub/b.txt", "b"),
        ("sub/deep/c.txt", "c"),
        ("build/out.o", "o"),
    ] {
        std::fs::write(t.join(f), body).unwrap();
    }
    t
}

/// A destination holding an older copy of `tree` (written by rsync -rt, so the files that
/// did not change have the source's size and time) and what the source no longer has: a stale
/// file and directory, `.tmp` files, and a link to a directory outside the destination with a
/// file in it (`outside/precious`).
fn make_dest(dest: &Path, tree: &Path, outside: &Path) {
    std::fs::create_dir_all(dest).unwrap();
    rsync(&["-rt"], tree.to_str().unwrap(), dest);
    let t = dest.join("tree");
    std::fs::create_dir_all(t.join("old/inner")).unwrap();
    for f in [
        "stale.txt",
        "old/inner/o.txt",
        "sub/gone.tmp",
        "sub/deep/gone.txt",
    ] {
        std::fs::write(t.join(f), "stale").unwrap();
    }
    std::fs::create_dir_all(outside).unwrap();
    std::fs::write(outside.join("precious"), "keep me").unwrap();
    std::os::unix::fs::symlink(outside, t.join("sub/link")).unwrap();
    // Beside the tree, not part of the transfer.
    std::fs::write(dest.join("unrelated"), "mine").unwrap();
}

/// `rsync ARGS SRC DEST` (the reference); its standard output.
fn rsync(args: &[&str], src: &str, dest: &Path) -> String {
    support::rsync(args, src, dest, &[0])
}

/// What `rsync -rtn --delete -i` says it would send (files) and delete (trailing `/` off).
fn rsync_plan(itemized: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut send = BTreeSet::new();
    let mut delete = BTreeSet::new();
    for line in itemized.lines() {
        if let Some(p) = line.strip_prefix("*deleting") {
            delete.insert(p.trim().trim_end_matches('/').to_string());
        } else if line.starts_with(">f") {
            send.insert(line.split_once(' ').unwrap().1.trim().to_string());
        }
    }
    (send, delete)
}

fn json_paths(plan: &serde_json::Value, key: &str) -> BTreeSet<String> {
    plan[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} in {plan}"))
        .iter()
        .map(|v| match v {
            serde_json::Value::String(s) => s.clone(),
            v => v["path"].as_str().unwrap().to_string(),
        })
        .collect()
}

#[test]
fn a_dry_run_lists_what_rsync_would_do_and_writes_nothing() {
    let t = support::tempdir("hurtle-mirror-");
    let tree = make_tree(&t.path().join("src"));
    let dest = t.path().join("dest");
    make_dest(&dest, &tree, &t.path().join("outside"));
    let want_dest = t.path().join("rsync");
    make_dest(&want_dest, &tree, &t.path().join("outside2"));
    // The source changes after the old copies: one file new, one of another size.
    std::fs::write(tree.join("new.txt"), "new").unwrap();
    std::fs::write(tree.join("sub/b.txt"), "b, longer now").unwrap();
    for patterns in [&[][..], &["--exclude", "*.tmp"][..]] {
        let mut args = vec!["-rtn", "--delete", "-i"];
        args.extend_from_slice(patterns);
        let (want_send, want_delete) =
            rsync_plan(&rsync(&args, tree.to_str().unwrap(), &want_dest));
        assert!(
            !want_send.is_empty() && !want_delete.is_empty(),
            "{patterns:?}"
        );

        let before = fsx::tree(&dest);
        let r = start_receiver(&dest, &["--allow-delete", "--overwrite"]);
        let mut extra = vec!["-n", "--delete", "--json"];
        extra.extend_from_slice(patterns);
        let done = proc::send(r.addr, &[&tree], &extra);
        done.assert_success();
        r.proc.wait(TRANSFER_TIMEOUT).assert_success();
        let plan: serde_json::Value = serde_json::from_str(done.stdout.trim())
            .unwrap_or_else(|e| panic!("{e}: {}", done.stdout));
        assert_eq!(plan["dry_run"], true);
        assert_eq!(json_paths(&plan, "send"), want_send, "{patterns:?}");
        assert_eq!(json_paths(&plan, "delete"), want_delete, "{patterns:?}");
        assert!(json_paths(&plan, "skip").contains("tree/a.txt"), "{plan}");
        // Nothing written, created or deleted: not a part file, not a directory.
        assert_eq!(fsx::tree(&dest), before, "{patterns:?}");
    }

    // The human list: a line per path, and the closing line.
    let r = start_receiver(&dest, &["--allow-delete", "--overwrite"]);
    let done = proc::send(r.addr, &[&tree], &["--dry-run", "--delete"]);
    done.assert_success();
    // The receiver shows the same plan.
    let received = r.proc.wait(TRANSFER_TIMEOUT);
    received.assert_success();
    assert!(
        received.stdout.contains("  delete  tree/stale.txt")
            && received
                .stdout
                .contains("hurtle: dry run: would send 2 files"),
        "{}",
        received.stdout
    );
    assert!(
        done.stdout.contains("  send    tree/new.txt"),
        "{}",
        done.stdout
    );
    assert!(
        done.stdout.contains("  delete  tree/stale.txt"),
        "{}",
        done.stdout
    );
    assert!(
        done.stdout
            .contains("hurtle: dry run: would send 2 files (16 B), skip 4, delete 7;"),
        "{}",
        done.stdout
    );
}

#[test]
fn delete_leaves_the_destination_as_rsync_does() {
    let t = support::tempdir("hurtle-mirror-");
    let tree = make_tree(&t.path().join("src"));
    std::fs::write(tree.join("new.txt"), "new").unwrap();
    let cases: &[&[&str]] = &[
        &[],
        &["--exclude", "*.tmp"],
        &["--exclude", "build/", "--exclude", "old/"],
    ];
    for (i, patterns) in cases.iter().enumerate() {
        let outside = t.path().join(format!("outside{i}"));
        let want = t.path().join(format!("rsync{i}"));
        make_dest(&want, &tree, &t.path().join(format!("outside-r{i}")));
        let mut args = vec!["-r", "--delete"];
        args.extend_from_slice(patterns);
        rsync(&args, tree.to_str().unwrap(), &want);

        let dest = t.path().join(format!("dest{i}"));
        make_dest(&dest, &tree, &outside);
        let r = start_receiver(&dest, &["--allow-delete", "--overwrite"]);
        let mut extra = vec!["--delete"];
        extra.extend_from_slice(patterns);
        proc::send(r.addr, &[&tree], &extra).assert_success();
        r.proc.wait(TRANSFER_TIMEOUT).assert_success();
        assert_eq!(contents(&dest), contents(&want), "{patterns:?}");
        // Not vacuous: something was deleted, and a link out of the tree was never followed.
        assert!(!dest.join("tree/stale.txt").exists());
        assert_eq!(
            std::fs::read_to_string(outside.join("precious")).unwrap(),
            "keep me"
        );
        assert!(dest.join("unrelated").exists(), "outside the transfer");
    }
}

#[test]
fn delete_is_refused_by_a_receiver_that_did_not_allow_it_before_anything_moves() {
    let t = support::tempdir("hurtle-mirror-");
    let tree = make_tree(&t.path().join("src"));
    let dest = t.path().join("dest");
    std::fs::create_dir_all(dest.join("tree")).unwrap();
    std::fs::write(dest.join("tree/stale.txt"), "stale").unwrap();
    let before = fsx::tree(&dest);
    let r = start_receiver(&dest, &[]);
    let done = proc::send(r.addr, &[&tree], &["--delete"]);
    let cause = done.assert_exit(3);
    assert!(cause.contains("--allow-delete"), "{cause}");
    let _ = r.proc.wait(TRANSFER_TIMEOUT);
    assert_eq!(fsx::tree(&dest), before, "nothing written, nothing deleted");
}

#[test]
fn a_failed_transfer_deletes_nothing() {
    let t = support::tempdir("hurtle-mirror-");
    let tree = make_tree(&t.path().join("src"));
    let dest = t.path().join("dest");
    std::fs::create_dir_all(dest.join("tree")).unwrap();
    std::fs::write(dest.join("tree/stale.txt"), "stale").unwrap();
    // A different file where one is sent, and no --overwrite: the receiver refuses.
    std::fs::write(dest.join("tree/a.txt"), "another a").unwrap();
    let r = start_receiver(&dest, &["--allow-delete"]);
    proc::send(r.addr, &[&tree], &["--delete"]).assert_exit(3);
    let _ = r.proc.wait(TRANSFER_TIMEOUT);
    assert!(dest.join("tree/stale.txt").exists());
}

/// A destination holding an older copy of `tree`'s contents, and what the source no longer
/// has, at its top too (a `cp tree/ DEST` mirrors DEST itself).
fn make_contents_dest(dest: &Path, tree: &Path, outside: &Path) {
    std::fs::create_dir_all(dest).unwrap();
    rsync(&["-rt"], &format!("{}/", tree.display()), dest);
    std::fs::create_dir_all(dest.join("old")).unwrap();
    for f in ["stale.txt", "old/o.txt", "sub/gone.txt", "sub/gone.tmp"] {
        std::fs::write(dest.join(f), "stale").unwrap();
    }
    std::fs::create_dir_all(outside).unwrap();
    std::fs::write(outside.join("precious"), "keep me").unwrap();
    std::os::unix::fs::symlink(outside, dest.join("link")).unwrap();
}

#[test]
fn cp_push_and_pull_mirror_a_directory_s_contents_as_rsync_does() {
    let t = support::tempdir("hurtle-mirror-");
    let tree = make_tree(&t.path().join("src"));
    let ssh = fake_ssh(t.path());
    let src = format!("{}/", tree.display());
    let dests: Vec<PathBuf> = ["want", "push", "pull"]
        .iter()
        .map(|n| {
            let d = t.path().join(n);
            make_contents_dest(&d, &tree, &t.path().join(format!("outside-{n}")));
            d
        })
        .collect();
    std::fs::write(tree.join("new.txt"), "new").unwrap();
    rsync(&["-r", "--delete", "--exclude", "*.tmp"], &src, &dests[0]);

    let push = format!("localhost:{}/", dests[1].display());
    let pull_from = format!("localhost:{src}");
    let pull = format!("{}/", dests[2].display());
    for (from, to, dest) in [
        (src.as_str(), push.as_str(), &dests[1]),
        (pull_from.as_str(), pull.as_str(), &dests[2]),
    ] {
        // A dry run first: the list, and nothing changed.
        let before = fsx::tree(dest);
        let flags = ["--delete", "--exclude", "*.tmp", "--overwrite"];
        let mut args = vec!["-n"];
        args.extend(flags);
        args.extend([from, to]);
        let done = cp(&ssh, &args);
        done.assert_success();
        assert!(
            done.stdout.contains("  delete  stale.txt"),
            "{}",
            done.stdout
        );
        assert!(done.stdout.contains("  send    new.txt"), "{}", done.stdout);
        assert_eq!(fsx::tree(dest), before, "{from} -> {to}");

        let mut args = flags.to_vec();
        args.extend([from, to]);
        cp(&ssh, &args).assert_success();
        assert_eq!(contents(dest), contents(&dests[0]), "{from} -> {to}");
        assert!(!dest.join("stale.txt").exists());
    }
    // A push's dry run to a destination not there yet does not create it.
    let absent = t.path().join("absent");
    let to = format!("localhost:{}/", absent.display());
    cp(&ssh, &["-n", &src, &to]).assert_success();
    assert!(!absent.exists());
    for n in ["push", "pull"] {
        let precious = t.path().join(format!("outside-{n}/precious"));
        assert_eq!(std::fs::read_to_string(precious).unwrap(), "keep me");
    }
}
