//! What a new user meets first, end to end: the README's `hurtle demo`, exit codes as
//! documented, interrupts that say what was kept, early checks of flags and `--out`, a default
//! port, shell completions and manual pages, colors, and documentation (README.md, `docs/`)
//! whose flags and exit codes match the binary.

#[allow(dead_code)] // shared with the other test binaries
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use support::fsx;
use support::proc::{self, start_receiver, Finished, Proc, ReceiverProc};
use support::TRANSFER_TIMEOUT;

const MIB: u64 = 1 << 20;

/// A fresh temporary directory.
fn tmp() -> tempfile::TempDir {
    support::tempdir("hurtle-firstday-")
}

/// Runs `hurtle ARGS` to completion (10 s at most).
fn hurtle(args: &[&str]) -> Finished {
    Proc::spawn("hurtle", args).wait(Duration::from_secs(10))
}

/// Runs `hurtle ARGS` with extra environment variables to completion (10 s at most).
fn hurtle_env(args: &[&str], env: &[(&str, &str)]) -> Finished {
    Proc::spawn_env("hurtle", args, env).wait(Duration::from_secs(10))
}

/// A usage error: exit 2 and clap's (or hurtle's) message naming `what`.
fn assert_usage(f: &Finished, what: &str) {
    assert_eq!(f.status.code(), Some(2), "{f:?}");
    assert!(f.stderr.contains(what), "{what:?} not in: {}", f.stderr);
}

// ---------------------------------------------------------------------------------------------
// The README's first command
// ---------------------------------------------------------------------------------------------

/// What a directory holds.
fn left_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect()
}

/// The README's first command, `hurtle demo`, small: the transfer is verified, the summary says
/// what limited it, and the temporary directory it made is gone afterwards.
#[test]
fn the_demo_moves_a_verified_file_says_what_limited_it_and_leaves_nothing_behind() {
    let t = tmp();
    let tmpdir = t.path().to_str().unwrap();
    let f = Proc::spawn_env("demo", &["demo", "--size", "8M"], &[("TMPDIR", tmpdir)])
        .wait(TRANSFER_TIMEOUT);
    f.assert_success();
    assert!(f.stdout.contains("BLAKE3 matches"), "{}", f.stdout);
    assert!(f.stdout.contains("limited by "), "{}", f.stdout);
    assert!(f.stdout.contains("plain TCP: 8.0 MiB"), "{}", f.stdout);
    assert_eq!(left_in(t.path()), Vec::<PathBuf>::new(), "left behind");

    let f = Proc::spawn_env(
        "demo",
        &["demo", "--size", "8M", "--no-tcp", "--json"],
        &[("TMPDIR", tmpdir)],
    )
    .wait(TRANSFER_TIMEOUT);
    f.assert_success();
    let v: serde_json::Value = serde_json::from_str(f.stdout.trim()).expect("one JSON object");
    assert_eq!(v["hash_match"], true, "{v}");
    assert_eq!(v["size"], 8 * MIB, "{v}");
    assert_eq!(v["encrypted"], true, "{v}");
    assert!(v["goodput_bps"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["first_data_ms"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["tcp_seconds"].is_null(), "{v}");
    support::assert_named_bottleneck(&v);
    assert_eq!(left_in(t.path()), Vec::<PathBuf>::new(), "left behind");
}

// ---------------------------------------------------------------------------------------------
// Flags: checked before anything starts
// ---------------------------------------------------------------------------------------------

#[test]
fn out_of_range_and_malformed_values_are_usage_errors() {
    let t = tmp();
    let src = t.path().join("a.bin");
    fsx::write_random(&src, 1000, 1);
    let s = src.to_str().unwrap();
    for (args, what) in [
        (
            vec!["send", s, "--to", "127.0.0.1:7400", "--channels", "0"],
            "--channels",
        ),
        (
            vec!["send", s, "--to", "127.0.0.1:7400", "--channels", "100"],
            "--channels",
        ),
        (
            vec!["send", s, "--to", "127.0.0.1:7400", "--payload", "100"],
            "--payload",
        ),
        (
            vec!["send", s, "--to", "127.0.0.1:7400", "--payload", "9000"],
            "--payload",
        ),
        (
            vec!["send", s, "--to", "127.0.0.1:7400", "--chunk-size", "3K"],
            "--chunk-size",
        ),
        (
            vec!["send", s, "--to", "127.0.0.1:7400", "--rate", "fast"],
            "--rate",
        ),
        (vec!["send", s, "--to", "localhost:port"], "not a port"),
        (vec!["send", s, "--to", "localhost:70000"], "not a port"),
        (vec!["send", s, "--to", "localhost:0"], "port 0"),
        (vec!["send", s, "--to", ":7400"], "no host"),
        (vec!["demo", "--channels", "0"], "--channels"),
        (vec!["relay", "--max-codes", "0"], "--max-codes"),
        (vec!["relay", "--code-ttl", "0"], "--code-ttl"),
        (
            vec!["send", s, "--code", "12-acid-acorn"],
            "--code needs a relay",
        ),
        (
            vec!["send", s, "--code", "nonsense", "--relay", "127.0.0.1"],
            "bad code",
        ),
    ] {
        let f = hurtle(&args);
        assert_usage(&f, what);
    }
}

#[test]
fn an_unknown_host_is_a_network_error() {
    // `.invalid` never resolves (RFC 6761); resolving it needs no network.
    let t = tmp();
    let src = t.path().join("a.bin");
    fsx::write_random(&src, 1000, 2);
    let s = src.to_str().unwrap();
    let cause = hurtle(&["send", s, "--to", "nothing.invalid"]).assert_exit(4);
    assert!(
        cause.contains("cannot resolve the receiver host"),
        "{cause}"
    );
    let f = hurtle(&[
        "send",
        s,
        "--code",
        "12-acid-acorn",
        "--relay",
        "nothing.invalid",
    ]);
    let cause = f.assert_exit(4);
    assert!(cause.contains("cannot resolve the relay host"), "{cause}");
}

#[test]
fn a_source_that_cannot_be_read_exits_6_before_connecting() {
    // Port 9 (discard) on loopback: nothing listens, and nothing is dialled anyway.
    let cause = hurtle(&["send", "/nonexistent/x.bin", "--to", "127.0.0.1:9"]).assert_exit(6);
    assert!(cause.contains("/nonexistent/x.bin"), "{cause}");
}

#[test]
fn a_peer_that_speaks_no_hurtle_or_another_version_is_dropped_and_the_receiver_waits_on() {
    use hurtle_proto::wire::{Control, VERSION};
    use support::peer::RawPeer;
    let t = tmp();
    // Bytes that are no message: a stray, dropped and logged; the receiver waits on.
    let mut r = start_receiver(&t.path().join("out"), &[]);
    let mut p = RawPeer::connect_plain(r.addr);
    p.send_raw(&[0, 0, 0, 8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
    assert_eq!(p.recv(), None, "expected the receiver to hang up");
    let line = r.proc.wait_for_log_line(
        "the stray logged",
        Duration::from_secs(10),
        "stray connection from",
    );
    assert!(line.contains("malformed"), "{line}");
    assert!(r.proc.is_running(), "a stray ended the receiver");
    r.proc.kill();
    // A hurtle of another protocol version (an older one opens with its hello, a newer one
    // with its key agreement): told in the message every version reads. Before the key
    // agreement anyone can claim any version, so it does not end the receiver either.
    let mut r = start_receiver(&t.path().join("out"), &[]);
    for first in [
        Control::Hello {
            magic: *b"HRTL",
            version: VERSION - 1,
            caps: 0,
            channels: 1,
            payload: 1384,
            block_size: 1 << 20,
            session: 1,
        },
        Control::Agree {
            magic: *b"HRTL",
            version: VERSION + 1,
            key_id: [0; 8],
            pake: vec![7; 33],
            confirm: vec![],
            plain_data: false,
        },
    ] {
        let mut p = RawPeer::connect_plain(r.addr);
        p.send(&first);
        match p.recv() {
            Some(Control::Reject { reason }) => {
                assert!(reason.contains("same hurtle version"), "{reason}")
            }
            other => panic!("expected a Reject, got {other:?}"),
        }
    }
    let line = r.proc.wait_for_log_line(
        "the other version logged",
        Duration::from_secs(10),
        "protocol version",
    );
    assert!(line.contains("stray connection from"), "{line}");
    assert!(r.proc.is_running(), "another version ended the receiver");
    r.proc.kill();
}

#[test]
fn to_without_a_port_means_port_7400() {
    // An address of its own in 127/8, so that no other test's port 7400 is in the way.
    let t = tmp();
    let src = t.path().join("a.bin");
    fsx::write_random(&src, 300_000, 3);
    let out = t.path().join("out");
    let r = proc::start_receiver_at("127.0.74.1", &out, &[]);
    assert_eq!(r.addr.port(), 7400, "--listen HOST listens on 7400");
    let s = Proc::spawn(
        "sender",
        &["send", src.to_str().unwrap(), "--to", "127.0.74.1"],
    )
    .wait(TRANSFER_TIMEOUT);
    s.assert_success();
    r.proc.wait(TRANSFER_TIMEOUT).assert_success();
    fsx::assert_same_file(&src, &out.join("a.bin"));
}

// ---------------------------------------------------------------------------------------------
// --out, checked at start
// ---------------------------------------------------------------------------------------------

#[test]
fn an_out_that_is_a_file_or_cannot_be_made_fails_before_listening() {
    let t = tmp();
    let file = t.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let out_of = |out: &Path| {
        hurtle(&[
            "receive",
            "--listen",
            "127.0.0.1:0",
            "--out",
            out.to_str().unwrap(),
        ])
    };
    let f = out_of(&file);
    let cause = f.assert_exit(6);
    assert!(cause.contains("is not a directory"), "{cause}");
    assert!(!f.stdout.contains("listening"), "it listened: {}", f.stdout);
    // /proc refuses new directories even to root, as a read-only or foreign mount would.
    let f = out_of(Path::new("/proc/hurtle-cannot-be-here"));
    let cause = f.assert_exit(6);
    assert!(cause.contains("cannot create --out"), "{cause}");
    assert!(!f.stdout.contains("listening"), "it listened: {}", f.stdout);
}

#[test]
fn a_good_out_shows_its_free_space() {
    let t = tmp();
    let out = t.path().join("new/deeper");
    let mut r = start_receiver(&out, &[]);
    assert!(out.is_dir(), "--out was not created");
    let line = r
        .proc
        .wait_for_output("its listening line", Duration::from_secs(5), |o, _| {
            o.lines()
                .find(|l| l.contains("listening on"))
                .map(String::from)
        });
    assert!(line.contains(" free)"), "{line}");
    // Nothing is left behind by the check.
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
}

// ---------------------------------------------------------------------------------------------
// Interrupts
// ---------------------------------------------------------------------------------------------

/// A 64 MiB transfer at 50 Mbit/s into a new directory, with the receiver's part file present.
struct Slow {
    _t: tempfile::TempDir,
    src: PathBuf,
    out: PathBuf,
    r: ReceiverProc,
    sender: Proc,
}

fn slow(seed: u64) -> Slow {
    let t = tmp();
    let src = t.path().join("src/big.bin");
    fsx::write_random(&src, 64 * MIB, seed);
    let out = t.path().join("out");
    let r = start_receiver(&out, &[]);
    let sender = Proc::spawn(
        "sender",
        &proc::send_args(r.addr, &[&src], &["--rate", "50M", "--channels", "2"]),
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while fsx::part_files(&out).is_empty() {
        assert!(Instant::now() < deadline, "no transfer started within 15 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Some data moves first.
    std::thread::sleep(Duration::from_millis(1000));
    Slow {
        _t: t,
        src,
        out,
        r,
        sender,
    }
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
fn an_interrupted_sender_says_what_was_kept_and_the_receiver_names_the_cause() {
    let Slow {
        _t,
        src,
        out,
        r,
        sender,
    } = slow(10);
    signal(&sender, "-INT");
    let at = Instant::now();
    let s = sender.wait(Duration::from_secs(10));
    assert!(
        at.elapsed() < Duration::from_secs(3),
        "took {:?}",
        at.elapsed()
    );
    let cause = s.assert_exit(130);
    assert!(
        cause.starts_with("interrupted (SIGINT): the receiver holds") && cause.contains("resumes"),
        "{cause}"
    );
    let rcause = r.proc.wait(Duration::from_secs(10)).assert_exit(4);
    assert_eq!(rcause, "the sender was interrupted");
    assert_eq!(
        fsx::part_files(&out).len(),
        2,
        "a part file and its journal"
    );
    // The same command resumes.
    let r = start_receiver(&out, &["--json"]);
    let s = proc::send(r.addr, &[&src], &["--json", "--channels", "2"]);
    s.assert_success();
    r.proc.wait(TRANSFER_TIMEOUT).assert_success();
    assert!(
        s.json()["resumed_bytes"].as_u64().unwrap() > MIB,
        "{}",
        s.stdout
    );
    fsx::assert_same_file(&src, &out.join("big.bin"));
}

#[test]
fn a_terminated_receiver_says_what_was_kept_and_the_sender_names_the_cause() {
    let Slow {
        _t, out, r, sender, ..
    } = slow(11);
    signal(&r.proc, "-TERM");
    let f = r.proc.wait(Duration::from_secs(10));
    let cause = f.assert_exit(143);
    assert!(
        cause.starts_with("interrupted (SIGTERM): received") && cause.contains("part files"),
        "{cause}"
    );
    let scause = sender.wait(Duration::from_secs(10)).assert_exit(4);
    assert_eq!(scause, "the receiver was interrupted");
    assert_eq!(
        fsx::part_files(&out).len(),
        2,
        "a part file and its journal"
    );
}

#[test]
fn a_waiting_receiver_ends_at_once_on_ctrl_c() {
    let t = tmp();
    let r = start_receiver(&t.path().join("out"), &[]);
    signal(&r.proc, "-INT");
    let at = Instant::now();
    let cause = r.proc.wait(Duration::from_secs(5)).assert_exit(130);
    assert!(at.elapsed() < Duration::from_secs(2));
    assert!(cause.contains("before any data moved"), "{cause}");
}

// ---------------------------------------------------------------------------------------------
// Completions, manual pages, colors
// ---------------------------------------------------------------------------------------------

#[test]
fn completions_and_manual_pages_come_from_the_flags() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let f = hurtle(&["completions", shell]);
        f.assert_success();
        assert!(
            f.stdout.contains("chunk-size") && f.stdout.contains("receive"),
            "{shell}: {}",
            f.stdout
        );
    }
    assert_usage(&hurtle(&["completions", "tcsh"]), "tcsh");
    let f = hurtle(&["man"]);
    f.assert_success();
    assert!(
        f.stdout.starts_with(".ie") || f.stdout.contains(".TH hurtle 1"),
        "{}",
        f.stdout
    );
    let t = tmp();
    let dir = t.path().join("man1");
    hurtle(&["man", "--out", dir.to_str().unwrap()]).assert_success();
    for page in [
        "hurtle.1",
        "hurtle-send.1",
        "hurtle-receive.1",
        "hurtle-relay.1",
    ] {
        let text = std::fs::read_to_string(dir.join(page)).unwrap();
        assert!(text.contains(".TH"), "{page}");
    }
    let send = std::fs::read_to_string(dir.join("hurtle-send.1")).unwrap();
    assert!(send.contains("chunk\\-size"), "{send}");
}

/// Runs `hurtle ARGS` on a pseudo-terminal (`script`), with `env`; returns what it printed.
fn on_a_terminal(args: &str, env: &[(&str, &str)]) -> String {
    let out = Command::new("script")
        .args(["-qec", &format!("{} {args}", proc::bin()), "/dev/null"])
        .env_remove("NO_COLOR")
        .env("HURTLE_PATH_MEMORY", "off")
        .envs(env.iter().copied())
        .output()
        .expect("script(1), from util-linux");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn errors_are_colored_on_a_terminal_unless_no_color_or_never() {
    let args = "send /nonexistent --to nothing.invalid";
    let esc = "\u{1b}[";
    let plain = hurtle(&["send", "/nonexistent", "--to", "nothing.invalid"]);
    assert!(!plain.stderr.contains(esc), "colored into a pipe");
    let forced = hurtle(&["--color", "always", "send", "/x", "--to", "nothing.invalid"]);
    assert!(
        forced.stderr.contains(esc),
        "--color always: {:?}",
        forced.stderr
    );
    let tty = on_a_terminal(args, &[]);
    assert!(
        tty.contains("error") && tty.contains(esc),
        "terminal: {tty:?}"
    );
    let no_color = on_a_terminal(args, &[("NO_COLOR", "1")]);
    assert!(
        no_color.contains("error") && !no_color.contains(esc),
        "{no_color:?}"
    );
    let never = on_a_terminal(&format!("--color never {args}"), &[]);
    assert!(never.contains("error") && !never.contains(esc), "{never:?}");
}

// ---------------------------------------------------------------------------------------------
// Defaults from the environment and a configuration file
// ---------------------------------------------------------------------------------------------

#[test]
fn bad_defaults_name_where_they_came_from() {
    let t = tmp();
    let src = t.path().join("a.bin");
    fsx::write_random(&src, 1000, 4);
    let s = src.to_str().unwrap();
    let f = hurtle_env(
        &["send", s, "--to", "127.0.0.1:1"],
        &[("HURTLE_CHANNELS", "0")],
    );
    assert_usage(&f, "HURTLE_CHANNELS=0");
    let config = t.path().join("config.toml");
    std::fs::write(&config, "relai = \"x\"\n").unwrap();
    let f = hurtle_env(
        &["send", s, "--to", "127.0.0.1:1"],
        &[("HURTLE_CONFIG", config.to_str().unwrap())],
    );
    assert_usage(&f, "unknown key \"relai\"");
    // A flag wins over the environment: a bad HURTLE_RATE is not read when --rate is given.
    std::fs::write(&config, "").unwrap();
    let out = t.path().join("out");
    let r = start_receiver(&out, &[]);
    let to = r.addr.to_string();
    let f = Proc::spawn_env(
        "sender",
        &["send", s, "--to", &to, "--rate", "100M"],
        &[
            ("HURTLE_RATE", "fast"),
            ("HURTLE_CONFIG", config.to_str().unwrap()),
        ],
    )
    .wait(TRANSFER_TIMEOUT);
    f.assert_success();
    r.proc.wait(TRANSFER_TIMEOUT).assert_success();
}

#[test]
fn the_receive_out_default_comes_from_the_environment() {
    let t = tmp();
    let src = t.path().join("a.bin");
    fsx::write_random(&src, 200_000, 5);
    let out = t.path().join("from-env");
    let mut r = Proc::spawn_env(
        "receiver",
        &["receive", "--listen", "127.0.0.1:0"],
        &[("HURTLE_OUT", out.to_str().unwrap())],
    );
    let addr = r.wait_for_output("its address", Duration::from_secs(10), |o, _| {
        o.lines().find_map(|l| {
            l.strip_prefix("hurtle: listening on ")?
                .split(", receiving into")
                .next()?
                .parse::<std::net::SocketAddr>()
                .ok()
        })
    });
    proc::send(addr, &[&src], &[]).assert_success();
    r.wait(TRANSFER_TIMEOUT).assert_success();
    fsx::assert_same_file(&src, &out.join("a.bin"));
}

// ---------------------------------------------------------------------------------------------
// The documentation against the binary
// ---------------------------------------------------------------------------------------------

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A page of the documentation, by its path from the workspace root.
fn page(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The pages that document the flags (a table row or a sentence each): every flag the binary
/// has is in one of them.
const FLAG_PAGES: [&str; 3] = ["docs/usage.md", "docs/cp.md", "docs/relay.md"];

/// The page that holds `--help`'s exit-code table.
const EXIT_CODE_PAGE: &str = "docs/usage.md";

/// Every page a user reads: README.md and each `docs/*.md`.
fn every_page() -> Vec<(String, String)> {
    let mut paths = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ at the workspace root")
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths.into_iter().map(|p| (page(&p), p)).collect()
}

/// Long flags (`--name`) in `text`.
fn long_flags(text: &str) -> Vec<String> {
    let mut flags = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("--") {
        let tail = &rest[i + 2..];
        let name: String = tail
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        let before_ok = i == 0 || !rest[..i].ends_with(|c: char| c.is_alphanumeric());
        if before_ok && name.len() > 1 && !name.ends_with('-') {
            flags.push(format!("--{name}"));
        }
        rest = &tail[name.len()..];
    }
    flags
}

/// Every flag the README or a page of `docs/` names exists in `--help`, and every flag in
/// `--help` is documented in the flag pages.
#[test]
fn every_flag_the_docs_name_exists_and_every_flag_is_documented() {
    let reference: String = FLAG_PAGES.iter().map(|p| page(p)).collect();
    let mut help = String::new();
    for cmd in [
        "send",
        "receive",
        "cp",
        "demo",
        "relay",
        "completions",
        "man",
        "keygen",
    ] {
        let f = hurtle(&[cmd, "--help"]);
        f.assert_success();
        help.push_str(&f.stdout);
    }
    let top = hurtle(&["--help"]);
    help.push_str(&top.stdout);
    // Flags of the test harness, cargo and other tools the pages quote.
    let foreign = [
        "--release",
        "--workspace",
        "--locked",
        "--path",
        "--target",
        "--git",
        "--hurtle-base",
        "--rounds",
        "--profiles",
        "--tools",
        "--sizes",
        "--runs",
        "--check",
        "--change",
        "--base",
        "--file",
        "--out-dir",
        "--no-fail-fast",
        "--bin",
        "--features",
        // cargo's, in docs/library.md: `cargo run --example`, `cargo doc --open`.
        "--example",
        "--open",
        // rsync's, where docs/usage.md and docs/cp.md compare links with it.
        "--safe-links",
    ];
    for (text, path) in every_page() {
        let mut missing: Vec<String> = long_flags(&text)
            .into_iter()
            .filter(|f| !foreign.contains(&f.as_str()) && !help.contains(f.as_str()))
            .collect();
        missing.sort();
        missing.dedup();
        assert!(
            missing.is_empty(),
            "{path} names flags the binary lacks: {missing:?}"
        );
    }
    let mut undocumented: Vec<String> = long_flags(&help)
        .into_iter()
        .filter(|f| !["--help", "--version"].contains(&f.as_str()))
        .filter(|f| !reference.contains(&format!("`{f}")))
        .collect();
    undocumented.sort();
    undocumented.dedup();
    assert!(
        undocumented.is_empty(),
        "flags none of {FLAG_PAGES:?} documents: {undocumented:?}"
    );
}

#[test]
fn the_docs_and_help_show_the_same_exit_codes() {
    let help = hurtle(&["--help"]).stdout;
    let table = &help[help
        .find("Exit codes:")
        .expect("an exit-code table in --help")..];
    assert!(
        page(EXIT_CODE_PAGE).contains(table.trim_end()),
        "{EXIT_CODE_PAGE} lacks --help's exit-code table:\n{table}"
    );
    for cmd in ["send", "receive", "cp"] {
        let f = hurtle(&[cmd, "--help"]);
        assert!(f.stdout.contains(table.trim_end()), "{cmd} --help");
    }
}
