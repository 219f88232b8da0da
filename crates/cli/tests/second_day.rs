//! The habits a user brings on the second day, end to end: rates in bits or bytes as written,
//! codes checked before they cost one of the receiver's tries, usage errors on one line with
//! the fix, and `--json` that prints one object on failure too.

#[allow(dead_code)] // shared with the other test binaries
mod support;

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;
use support::fsx;
use support::proc::{self, start_receiver, Finished, Proc};
use support::TRANSFER_TIMEOUT;

/// A fresh temporary directory.
fn tmp() -> tempfile::TempDir {
    support::tempdir("hurtle-secondday-")
}

/// Runs `hurtle ARGS` to completion (10 s at most).
fn hurtle(args: &[&str]) -> Finished {
    Proc::spawn("hurtle", args).wait(Duration::from_secs(10))
}

/// Runs `hurtle ARGS` with extra environment variables to completion (10 s at most).
fn hurtle_env(args: &[&str], env: &[(&str, &str)]) -> Finished {
    Proc::spawn_env("hurtle", args, env).wait(Duration::from_secs(10))
}

/// A loopback address nothing listens on (a port just bound and let go).
fn nothing_listens() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// The failure's `--json` error object: stdout is that one object and nothing else, and it says
/// what stderr's one error line says, with the process's exit code and `kind`.
fn assert_json_error(f: &Finished, code: i32, kind: &str) -> String {
    let cause = f.assert_exit(code);
    let lines: Vec<&str> = f.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one object on stdout:\n{}", f.stdout);
    let v: serde_json::Value = serde_json::from_str(lines[0]).expect("a JSON object");
    let e = &v["error"];
    assert_eq!(e["kind"], kind, "{v}");
    assert_eq!(e["exit_code"], code, "{v}");
    assert_eq!(e["message"], cause.as_str(), "{v}");
    assert_eq!(
        v.as_object().map(|o| o.len()),
        Some(1),
        "only the error: {v}"
    );
    cause
}

// ---------------------------------------------------------------------------------------------
// Units people mean
// ---------------------------------------------------------------------------------------------

/// `--rate 100MiB/s` is bytes: 838.9 Mbit/s, in the `--json` summary's cap and in the
/// summary line of a fixed rate; `100MB/s` is 800 Mbit/s. An ambiguous unit is refused.
#[test]
fn a_rate_in_bytes_per_second_is_eight_times_as_many_bits() {
    let t = tmp();
    let src = t.path().join("a.bin");
    fsx::write_random(&src, 1 << 20, 1);
    let mut r = start_receiver(&t.path().join("out"), &["--serve", "--overwrite"]);
    let s = proc::send(r.addr, &[&src], &["--rate", "100MiB/s", "--json"]);
    s.assert_success();
    let v = s.json();
    assert_eq!(v["rate"]["cap_bps"], 838_860_800u64, "{v}");
    // Another file: one the receiver has already is skipped, and a skip-only run names no rate.
    let other = t.path().join("b.bin");
    fsx::write_random(&other, 1 << 20, 2);
    let s = proc::send(r.addr, &[&other], &["--rate-fixed", "100MiB/s"]);
    s.assert_success();
    assert!(s.stdout.contains("final rate 838.9 Mbit/s"), "{}", s.stdout);
    let s = proc::send(r.addr, &[&src], &["--rate", "100MB/s", "--json"]);
    s.assert_success();
    assert_eq!(s.json()["rate"]["cap_bps"], 800_000_000u64);
    assert!(r.proc.is_running());
    r.proc.kill();
    let refused = proc::send(r.addr, &[&src], &["--rate", "100Mb"]);
    let cause = refused.assert_exit(2);
    assert!(cause.contains("ambiguous"), "{cause}");
    assert!(
        cause.contains("100MiB/s"),
        "lists the accepted forms: {cause}"
    );
}

// ---------------------------------------------------------------------------------------------
// Codes checked before they cost a try
// ---------------------------------------------------------------------------------------------

/// Mistyped codes (a word not in the list, no number, too many words; on the command line or in
/// `HURTLE_CODE`) are refused by the sender before it connects: exit 2, with the word meant for
/// a near miss. The receiver never sees them: it prints nothing about them, keeps waiting, and
/// its code is not spent (more typos than its 3 tries, then the right code moves the file, and
/// its summary counts no connection turned away).
#[test]
fn a_mistyped_code_never_reaches_the_receiver() {
    let t = tmp();
    let src = t.path().join("a.bin");
    fsx::write_random(&src, 100_000, 2);
    let mut r = start_receiver(&t.path().join("out"), &["--json"]);
    let code = support::TEST_CODE; // 1234-acorn-bison-cedar
    for (typed, says) in [
        (
            "1234-acorn-bisn-cedar",
            "'bisn' is not in the word list; did you mean 'bison'?",
        ),
        (
            "1234-acron-bison-cedar",
            "'acron' is not in the word list; did you mean 'acorn' or 'apron'?",
        ),
        ("acorn-bison-cedar", "a code starts with a number"),
        ("1234-acorn-bison-cedar-daisy", "2 to 3 words"),
        ("1234-acorn-bison-xyzzy", "'xyzzy' is not in the word list"),
    ] {
        let s = proc::send(r.addr, &[&src], &["--code", typed]);
        let cause = s.assert_exit(2);
        assert!(cause.contains(says), "{typed}: {cause}");
    }
    let s = proc::send_env(
        r.addr,
        &[&src],
        &[],
        &[("HURTLE_CODE", "1234 acorn bisson cedar")],
    );
    assert!(s.assert_exit(2).contains("did you mean 'bison'?"));
    std::thread::sleep(Duration::from_millis(300));
    assert!(r.proc.is_running(), "a mistyped code ended the receiver");
    let heard = r.proc.stderr();
    assert!(
        !heard.contains("stray") && !heard.contains("wrong code"),
        "the receiver heard of a mistyped code:\n{heard}"
    );
    // Spaces for dashes and capitals are forgiven, as the receiver forgives them.
    let spoken = code.replace('-', " ").to_uppercase();
    proc::send(r.addr, &[&src], &["--code", &spoken]).assert_success();
    let recv = r.proc.wait(TRANSFER_TIMEOUT);
    recv.assert_success();
    assert_eq!(recv.json()["strays"], 0, "{}", recv.stdout);
    fsx::assert_same_file(&src, &t.path().join("out/a.bin"));
}

/// A receiver refuses to start with a code no sender could give; with a near miss it says the
/// word meant.
#[test]
fn a_receiver_refuses_a_code_a_sender_could_not_give() {
    let t = tmp();
    let out = t.path().join("out");
    let out = out.to_str().unwrap();
    let f = hurtle(&[
        "receive",
        "--listen",
        "127.0.0.1:0",
        "--out",
        out,
        "--code",
        "7-tigre-plum",
    ]);
    assert!(f.assert_exit(2).contains("did you mean 'tiger'?"), "{f:?}");
    let f = hurtle_env(
        &["receive", "--listen", "127.0.0.1:0", "--out", out],
        &[("HURTLE_CODE", "hunter2")],
    );
    assert!(f.assert_exit(2).contains("starts with a number"), "{f:?}");
}

/// A relay code is checked the same way, before the relay is asked (nothing listens at the
/// relay's address: a code that got that far would fail with exit 4).
#[test]
fn a_mistyped_relay_code_is_refused_before_the_relay_is_asked() {
    let t = tmp();
    let src = t.path().join("a.bin");
    fsx::write_random(&src, 1000, 3);
    let relay = nothing_listens().to_string();
    let s = src.to_str().unwrap();
    let f = hurtle(&[
        "send",
        s,
        "--code",
        "4821-purpel-sausage",
        "--relay",
        &relay,
    ]);
    assert!(f.assert_exit(2).contains("did you mean 'purple'?"), "{f:?}");
    let f = hurtle(&[
        "send",
        s,
        "--code",
        "4821-purple-sausage",
        "--relay",
        &relay,
    ]);
    f.assert_exit(4);
}

// ---------------------------------------------------------------------------------------------
// Usage errors on one line
// ---------------------------------------------------------------------------------------------

/// clap's errors (an unknown flag, a missing operand, a bad value, an unknown command) are one
/// `hurtle: error:` line that ends with where the help is; exit 2, nothing on stdout.
#[test]
fn usage_errors_are_one_line_with_the_fix() {
    for (args, says, fix) in [
        (
            &["send", "a", "--to", "h", "--zzz"][..],
            "unexpected argument '--zzz' found",
            "try 'hurtle send --help'",
        ),
        (
            &["send", "a", "--to", "h", "--rat", "1M"][..],
            "a similar argument exists: '--rate'",
            "try 'hurtle send --help'",
        ),
        (
            &["send", "--to", "h"][..],
            "the following required arguments were not provided: <PATHS>...",
            "try 'hurtle send --help'",
        ),
        (
            &["receive", "--channels", "4"][..],
            "unexpected argument '--channels' found",
            "try 'hurtle receive --help'",
        ),
        (
            &["demo", "--size", "lots"][..],
            "invalid value 'lots' for '--size <SIZE>'",
            "try 'hurtle demo --help'",
        ),
        (
            &["sned", "a"][..],
            "unrecognized subcommand 'sned'; a similar subcommand exists: 'send'",
            "try 'hurtle --help'",
        ),
    ] {
        let f = hurtle(args);
        let cause = f.assert_exit(2);
        assert_eq!(f.stderr.lines().count(), 1, "one line:\n{}", f.stderr);
        assert!(cause.contains(says), "{args:?}: {cause}");
        assert!(cause.ends_with(fix), "{args:?}: {cause}");
        assert_eq!(f.stdout, "", "{args:?}");
    }
    // Help and version are no errors.
    hurtle(&["send", "--help"]).assert_success();
    hurtle(&["--version"]).assert_success();
}

// ---------------------------------------------------------------------------------------------
// `--json` prints one object on failure too
// ---------------------------------------------------------------------------------------------

/// Each failure a script meets often, with `--json`: one error object on stdout (kind, message,
/// exit code), the same message on stderr.
#[test]
fn json_prints_one_error_object_on_each_kind_of_failure() {
    let t = tmp();
    let src = t.path().join("a.bin");
    fsx::write_random(&src, 10_000, 4);
    let s = src.to_str().unwrap();
    // Usage, from clap and from hurtle.
    let f = hurtle(&["send", s, "--to", "h", "--json", "--zzz"]);
    assert_json_error(&f, 2, "usage");
    let f = hurtle(&["send", s, "--to", "h", "--json", "--rate", "100Mb"]);
    assert!(assert_json_error(&f, 2, "usage").contains("ambiguous"));
    // A malformed code.
    let to = nothing_listens().to_string();
    let f = hurtle(&[
        "send",
        s,
        "--to",
        &to,
        "--json",
        "--code",
        "1234-acorn-bisn-cedar",
    ]);
    assert!(assert_json_error(&f, 2, "usage").contains("did you mean 'bison'?"));
    // A refused connection.
    let f = hurtle(&["send", s, "--to", &to, "--json"]);
    assert!(assert_json_error(&f, 4, "network").contains("cannot reach the receiver"));
    // A missing source file.
    let missing = t.path().join("missing.bin");
    let f = hurtle(&["send", missing.to_str().unwrap(), "--to", &to, "--json"]);
    assert!(assert_json_error(&f, 6, "storage").contains("missing.bin"));
    // A wrong code (well formed): one of the receiver's tries, refused.
    let r = start_receiver(&t.path().join("out"), &[]);
    let f = proc::send(
        r.addr,
        &[&src],
        &["--json", "--code", "1234-acorn-bison-daisy"],
    );
    assert_json_error(&f, 3, "refused");
    // The receiver's own failures too: an --out that is a file.
    r.proc.kill();
    let f = hurtle(&["receive", "--listen", "127.0.0.1:0", "--out", s, "--json"]);
    assert!(assert_json_error(&f, 6, "storage").contains("not a directory"));
}

// ---------------------------------------------------------------------------------------------
// Manual pages
// ---------------------------------------------------------------------------------------------

/// The manual pages `hurtle man` writes have EXIT STATUS and EXAMPLES sections (the exit codes
/// as tagged paragraphs, not a preformatted EXTRA section), and `man` reads them.
#[test]
fn manual_pages_have_exit_status_and_examples() {
    let t = tmp();
    let dir = t.path().join("man1");
    hurtle(&["man", "--out", dir.to_str().unwrap()]).assert_success();
    for page in [
        "hurtle.1",
        "hurtle-send.1",
        "hurtle-receive.1",
        "hurtle-cp.1",
    ] {
        let text = std::fs::read_to_string(dir.join(page)).unwrap();
        assert!(text.contains(".SH \"EXIT STATUS\""), "{page}");
        assert!(
            text.contains(".TP\n.B 3\nrefused by the receiver"),
            "{page}"
        );
        assert!(text.contains(".SH EXAMPLES"), "{page}");
        assert!(!text.contains(".SH EXTRA"), "{page}");
    }
    let top = hurtle(&["man"]);
    top.assert_success();
    assert!(top.stdout.contains(".SH EXAMPLES\n"), "{}", top.stdout);
    assert!(top.stdout.contains("hurtle receive \\-\\-out ./incoming"));
}
