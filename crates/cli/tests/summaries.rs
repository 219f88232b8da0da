//! What `hurtle send` and `hurtle receive` say at the end, end to end on loopback: `-v` on a
//! tree summarised, a run that skips every file said as such (no rate, nothing "limited"),
//! TCP's pacing said as it is, and the lines after an interrupt true to what happens next (a
//! receiver's printed code is gone; an idle `--serve` receiver that served transfers says so).
//!
//! Every process runs on loopback under a deadline and is killed by its own handle.

#[allow(dead_code)]
mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use support::fsx;
use support::proc::{self, start_receiver, start_receiver_env, Proc};
use support::TRANSFER_TIMEOUT;

const MIB: u64 = 1 << 20;

/// A tree of `n` small files under `root/tree`.
fn tree(root: &Path, n: u64) -> std::path::PathBuf {
    let dir = root.join("tree");
    for i in 0..n {
        fsx::write_random(&dir.join(format!("f{i:03}.bin")), 3000 + i, i);
    }
    dir
}

/// The `-v` lines that name a file (two leading spaces, then a BLAKE3 or a note, then a path).
fn file_lines(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter(|l| l.starts_with("  ") && l.contains("tree/f"))
        .collect()
}

#[test]
fn verbose_lists_ten_files_and_counts_the_rest_and_a_skip_only_run_says_so() {
    let t = support::tempdir("hurtle-summaries-");
    let src = tree(t.path(), 25);
    let out = t.path().join("out");

    let r = start_receiver(&out, &["-v"]);
    let s = proc::send(r.addr, &[&src], &["-v"]);
    s.assert_success();
    let rf = r.proc.wait(TRANSFER_TIMEOUT);
    rf.assert_success();
    for (who, stdout) in [("sender", &s.stdout), ("receiver", &rf.stdout)] {
        let files = file_lines(stdout);
        assert_eq!(files.len(), 10, "{who} lists 10 files:\n{stdout}");
        assert!(
            files[0].contains(&fsx::blake3_hex(&src.join("f000.bin"))),
            "{who}: {stdout}"
        );
        assert!(
            stdout.contains("  ... and 15 more files (-vv or --json lists every file's BLAKE3)"),
            "{who}: {stdout}"
        );
    }
    // -vv and --json list every file.
    let r = start_receiver(&t.path().join("out2"), &["-vv"]);
    let s = proc::send(r.addr, &[&src], &["--json"]);
    let rf = r.proc.wait(TRANSFER_TIMEOUT);
    rf.assert_success();
    let listed = s.json()["file_hashes"].as_array().map_or(0, Vec::len);
    assert_eq!(listed, 25, "{}", s.stdout);
    assert_eq!(file_lines(&rf.stdout).len(), 25, "{}", rf.stdout);
    assert!(!rf.stdout.contains("more files"), "{}", rf.stdout);

    // Again into the first: every file is there already.
    let r = start_receiver(&out, &[]);
    let s = proc::send(r.addr, &[&src], &[]);
    s.assert_success();
    let rf = r.proc.wait(TRANSFER_TIMEOUT);
    rf.assert_success();
    assert!(
        s.stdout
            .starts_with("nothing to send: the receiver already had all 25 files ("),
        "{}",
        s.stdout
    );
    assert!(
        rf.stdout.contains("nothing to receive: all 25 files from "),
        "{}",
        rf.stdout
    );
    for (who, stdout) in [("sender", &s.stdout), ("receiver", &rf.stdout)] {
        for bad in ["bit/s", "limited by", "final rate"] {
            assert!(
                !stdout.contains(bad),
                "{who}'s skip-only summary says {bad:?}:\n{stdout}"
            );
        }
    }
}

#[test]
fn a_tcp_send_says_what_paced_it_not_a_fixed_rate_of_a_thousand_gigabits() {
    let t = support::tempdir("hurtle-summaries-");
    let src = t.path().join("a.bin");
    fsx::write_random(&src, 4 * MIB, 7);
    let r = start_receiver(&t.path().join("out"), &[]);
    let s = proc::send(r.addr, &[&src], &["--transport", "tcp", "-v"]);
    s.assert_success();
    r.proc.wait(TRANSFER_TIMEOUT).assert_success();
    assert!(
        s.stdout.contains("paced by TCP's congestion control"),
        "{}",
        s.stdout
    );
    for bad in ["1000.00 Gbit/s", "(fixed)", "final rate"] {
        assert!(!s.stdout.contains(bad), "says {bad:?}:\n{}", s.stdout);
    }
    // Capped by --rate: that cap.
    let r = start_receiver(&t.path().join("out2"), &[]);
    let s = proc::send(r.addr, &[&src], &["--transport", "tcp", "--rate", "400M"]);
    s.assert_success();
    r.proc.wait(TRANSFER_TIMEOUT).assert_success();
    assert!(s.stdout.contains("capped at 400.0 Mbit/s"), "{}", s.stdout);
}

fn signal(p: &Proc, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &p.id().to_string()])
        .status()
        .expect("kill(1)")
        .success();
    assert!(ok, "kill {sig} failed");
}

#[test]
fn an_interrupted_receiver_with_a_printed_code_does_not_promise_the_same_command() {
    let t = support::tempdir("hurtle-summaries-");
    let src = t.path().join("big.bin");
    fsx::write_random(&src, 64 * MIB, 12);
    let out = t.path().join("out");
    // No code given: the receiver makes one and prints it.
    let mut r = start_receiver_env(&out, &[], &[("HURTLE_CODE", "")]);
    let code = r
        .proc
        .wait_for_output("its code", Duration::from_secs(10), |_, e| {
            e.lines()
                .find_map(|l| l.strip_prefix("code: "))
                .map(str::to_owned)
        });
    let sender = Proc::spawn_env(
        "sender",
        &proc::send_args(r.addr, &[&src], &["--rate", "50M", "--channels", "2"]),
        &[("HURTLE_CODE", &code)],
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while fsx::part_files(&out).is_empty() {
        assert!(Instant::now() < deadline, "no transfer started within 15 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(800));
    signal(&r.proc, "-INT");
    let cause = r.proc.wait(Duration::from_secs(10)).assert_exit(130);
    assert!(
        cause.starts_with("interrupted (SIGINT): received "),
        "{cause}"
    );
    assert!(
        !cause.contains("same command"),
        "promises that the same command resumes: {cause}"
    );
    assert!(
        cause.contains("start the receiver again")
            && cause.contains("give the sender the new code")
            && cause.contains("part files")
            && cause.contains("resumes"),
        "{cause}"
    );
    sender.wait(Duration::from_secs(10));

    // Done as it says: a new receiver, its new code to the sender; the part resumes, and what
    // is held counts it.
    let mut r = start_receiver_env(&out, &["--json"], &[("HURTLE_CODE", "")]);
    let code2 = r
        .proc
        .wait_for_output("its code", Duration::from_secs(10), |_, e| {
            e.lines()
                .find_map(|l| l.strip_prefix("code: "))
                .map(str::to_owned)
        });
    assert_ne!(code, code2, "a new code");
    let s = proc::send_env(
        r.addr,
        &[&src],
        &["--json", "--channels", "2"],
        &[("HURTLE_CODE", &code2)],
    );
    s.assert_success();
    r.proc.wait(TRANSFER_TIMEOUT).assert_success();
    assert!(
        s.json()["resumed_bytes"].as_u64().unwrap_or(0) > MIB,
        "{}",
        s.stdout
    );
    fsx::assert_same_file(&src, &out.join("big.bin"));
}

#[test]
fn ctrl_c_on_an_idle_serving_receiver_counts_what_it_served() {
    let t = support::tempdir("hurtle-summaries-");
    let src = t.path().join("a.bin");
    fsx::write_random(&src, MIB, 3);
    let mut r = start_receiver(&t.path().join("out"), &["--serve"]);
    for name in ["one", "two"] {
        let dir = t.path().join(name);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let f = dir.join(format!("{name}.bin"));
        std::fs::copy(&src, &f).expect("copy");
        proc::send(r.addr, &[&f], &[]).assert_success();
    }
    r.proc
        .wait_for_output("two summaries", Duration::from_secs(10), |o, _| {
            (o.matches("received ").count() >= 2).then_some(())
        });
    signal(&r.proc, "-INT");
    let cause = r.proc.wait(Duration::from_secs(5)).assert_exit(130);
    assert_eq!(
        cause,
        "interrupted (SIGINT) while waiting, after 2 transfers; none was under way"
    );
}
