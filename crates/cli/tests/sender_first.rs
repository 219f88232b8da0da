//! Either side may start first (issue 54), as real processes on loopback:
//!
//! - direct: a sender started before its receiver listens waits for it (`--wait`), and with
//!   `--wait 0` fails at once as it always did;
//! - by relay, the sender printing the code (croc's way): `hurtle send FILE` with a relay prints
//!   `code: ...` and waits, `hurtle receive CODE` fetches the file; a receiver that types
//!   another code is refused (exit 3) and the sender keeps waiting, until the third such
//!   receiver spends the code; a code whose number no sender offers is refused at once;
//! - by relay, the receiver printing the code: a sender given a code that is not registered
//!   looks it up again for `--wait` seconds, then fails as before;
//! - an interrupted transfer whose code the sender printed says so on both sides: the sender
//!   is run again for a new code.
//!
//! Every process here is started with `HURTLE_CODE` empty where the test gives no code (the
//! suite gives every process one by default), and `HURTLE_WAIT` as the test needs it.

#[allow(dead_code)]
mod support;

use hurtle_relay::Code;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::{Duration, Instant};
use support::fsx;
use support::proc::{start_receiver_at, Proc};
use support::{TEST_CODE, TRANSFER_TIMEOUT};

/// A fresh temporary directory.
fn tmp() -> tempfile::TempDir {
    support::tempdir("hurtle-sender-first-")
}

/// A running `hurtle relay` on loopback and its address.
struct Relay {
    _proc: Proc,
    addr: SocketAddr,
}

fn start_relay() -> Relay {
    let mut proc = Proc::spawn("relay", &["relay", "--listen", "127.0.0.1:0"]);
    let addr = proc.wait_for_output("its address", Duration::from_secs(10), |_, e| {
        e.lines().find_map(|l| {
            l.strip_prefix("hurtle relay: listening on ")?
                .trim()
                .parse()
                .ok()
        })
    });
    Relay { _proc: proc, addr }
}

/// An address on loopback where nothing listens yet (a port bound, then let go), below the
/// kernel's range of ephemeral ports (32768 and up), so that no receiver of another test that
/// listens on port 0 gets it while a sender here waits for it.
fn free_addr() -> SocketAddr {
    let first = (std::process::id() % 10_000) as u16;
    (0..2_000u16)
        .map(|i| 20_000 + (first + i * 7) % 12_000)
        .find_map(|port| {
            let l = TcpListener::bind(("127.0.0.1", port)).ok()?;
            l.local_addr().ok()
        })
        .expect("a free port below 32000")
}

/// The code a process printed as `code: CODE`.
fn code_of(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| Some(l.strip_prefix("code: ")?.trim().to_owned()))
}

/// The code with its words replaced by other words of the list.
fn wrong_words(code: &str) -> String {
    let c = Code::parse(code).unwrap();
    let other: Vec<&str> = c
        .words
        .iter()
        .map(|w| if *w == "acid" { "acorn" } else { "acid" })
        .collect();
    format!("{}-{}", c.nameplate, other.join("-"))
}

/// A sender that printed its code through the relay, and that code.
struct Offering {
    proc: Proc,
    code: String,
}

/// Starts `hurtle send SRC --relay RELAY` (no code: it prints one) and waits for the code.
fn start_offering_sender(relay: &Relay, src: &Path) -> Offering {
    let args = [
        "send".to_string(),
        src.display().to_string(),
        "--relay".into(),
        relay.addr.to_string(),
    ];
    let mut proc = Proc::spawn_env("sender", &args, &[("HURTLE_CODE", "")]);
    let code = proc.wait_for_output("its code", Duration::from_secs(10), |_, e| code_of(e));
    Offering { proc, code }
}

/// Runs `hurtle receive CODE --out OUT` with the relay configured (HURTLE_RELAY).
fn receive_by_code(relay: &Relay, code: &str, out: &Path) -> support::proc::Finished {
    let args = [
        "receive".to_string(),
        code.to_string(),
        "--out".into(),
        out.display().to_string(),
    ];
    let relay = relay.addr.to_string();
    Proc::spawn_env(
        "receiver",
        &args,
        &[("HURTLE_CODE", ""), ("HURTLE_RELAY", relay.as_str())],
    )
    .wait(TRANSFER_TIMEOUT)
}

#[test]
fn a_direct_sender_started_first_waits_for_its_receiver() {
    let t = tmp();
    let src = t.path().join("early.bin");
    fsx::write_random(&src, 3 << 20, 54);
    let to = free_addr();
    let sender = Proc::spawn(
        "sender",
        &[
            "send",
            src.to_str().unwrap(),
            "--to",
            &to.to_string(),
            "--code",
            TEST_CODE,
            "--wait",
            "30",
        ],
    );
    std::thread::sleep(Duration::from_secs(2));
    let out = t.path().join("out");
    let r = start_receiver_at(&to.to_string(), &out, &[]);
    let s = sender.wait(TRANSFER_TIMEOUT);
    s.assert_success();
    r.proc.wait(TRANSFER_TIMEOUT).assert_success();
    fsx::assert_same_file(&src, &out.join("early.bin"));
    let said = format!("hurtle: waiting for the receiver at {to} to listen (up to 30 s)...");
    assert_eq!(
        s.stdout.lines().filter(|l| *l == said).count(),
        1,
        "one line says the wait:\n{}",
        s.stdout
    );
}

#[test]
fn a_direct_sender_with_wait_0_fails_at_once_as_before() {
    let t = tmp();
    let src = t.path().join("x");
    std::fs::write(&src, b"x").unwrap();
    let to = free_addr().to_string();
    let t0 = Instant::now();
    let s = Proc::spawn(
        "sender",
        &["send", src.to_str().unwrap(), "--to", &to, "--wait", "0"],
    )
    .wait(TRANSFER_TIMEOUT);
    let took = t0.elapsed();
    let why = s.assert_exit(4);
    assert!(why.contains("Connection refused"), "{why}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(!s.stdout.contains("waiting for"), "{}", s.stdout);
}

#[test]
fn the_sender_prints_the_code_and_the_receiver_fetches_it() {
    let t = tmp();
    let src = t.path().join("croc.bin");
    fsx::write_random(&src, 2 << 20, 7);
    let relay = start_relay();
    let sender = start_offering_sender(&relay, &src);
    Code::parse(&sender.code).expect("a code of the list");
    let told = format!(
        "hurtle: on the receiving host: hurtle receive --code {} --relay {}",
        sender.code, relay.addr
    );
    let out = t.path().join("out");
    let r = receive_by_code(&relay, &sender.code, &out);
    r.assert_success();
    let s = sender.proc.wait(TRANSFER_TIMEOUT);
    s.assert_success();
    fsx::assert_same_file(&src, &out.join("croc.bin"));
    assert!(s.stdout.contains(&told), "{}", s.stdout);
    assert!(
        s.stdout.contains("path: direct to 127.0.0.1:"),
        "{}",
        s.stdout
    );
    assert!(
        r.stdout.contains(&format!(
            "the sender of code {} is waiting at the relay",
            sender.code
        )),
        "{}",
        r.stdout
    );
}

#[test]
fn with_a_configured_relay_the_sender_tells_the_receiver_to_type_only_the_code() {
    let t = tmp();
    let src = t.path().join("small.txt");
    std::fs::write(&src, b"from a configured relay\n").unwrap();
    let relay = start_relay();
    let relay_addr = relay.addr.to_string();
    let mut sender = Proc::spawn_env(
        "sender",
        &["send", src.to_str().unwrap()],
        &[("HURTLE_CODE", ""), ("HURTLE_RELAY", relay_addr.as_str())],
    );
    let code = sender.wait_for_output("its code", Duration::from_secs(10), |_, e| code_of(e));
    sender.wait_for_output("the receiver's command", Duration::from_secs(10), |o, _| {
        o.contains(&format!(
            "hurtle: on the receiving host: hurtle receive {code}   "
        ))
        .then_some(())
    });
    let out = t.path().join("out");
    receive_by_code(&relay, &code, &out).assert_success();
    sender.wait(TRANSFER_TIMEOUT).assert_success();
    fsx::assert_same_file(&src, &out.join("small.txt"));
}

#[test]
fn a_wrong_code_on_the_receiving_side_is_refused_and_the_sender_keeps_waiting() {
    let t = tmp();
    let src = t.path().join("kept.bin");
    fsx::write_random(&src, 1 << 20, 3);
    let relay = start_relay();
    let mut sender = start_offering_sender(&relay, &src);
    let wrong_out = t.path().join("wrong");
    let wrong = receive_by_code(&relay, &wrong_words(&sender.code), &wrong_out);
    let why = wrong.assert_exit(3);
    assert!(why.contains("the sender holds another code"), "{why}");
    assert!(
        std::fs::read_dir(&wrong_out).map_or(true, |mut d| d.next().is_none()),
        "something was written by a wrong code"
    );
    sender
        .proc
        .wait_for_output("its warning", Duration::from_secs(10), |_, e| {
            e.contains("a receiver answered with another code (1 of 3 tries); still waiting")
                .then_some(())
        });
    assert!(sender.proc.is_running(), "the sender keeps waiting");
    let out = t.path().join("out");
    receive_by_code(&relay, &sender.code, &out).assert_success();
    sender.proc.wait(TRANSFER_TIMEOUT).assert_success();
    fsx::assert_same_file(&src, &out.join("kept.bin"));
}

#[test]
fn three_wrong_codes_on_the_receiving_side_spend_the_senders_code() {
    let t = tmp();
    let src = t.path().join("x");
    std::fs::write(&src, b"x").unwrap();
    let relay = start_relay();
    let sender = start_offering_sender(&relay, &src);
    for _ in 0..3 {
        receive_by_code(&relay, &wrong_words(&sender.code), &t.path().join("w")).assert_exit(3);
    }
    let s = sender.proc.wait(Duration::from_secs(20));
    let why = s.assert_exit(3);
    assert!(
        why.contains("answered 3 times with another code and is no longer valid"),
        "{why}"
    );
    // The code is gone with its sender.
    let r = receive_by_code(&relay, &sender.code, &t.path().join("late"));
    assert!(
        r.assert_failure()
            .contains("no sender is waiting with code"),
        "{}",
        r.stderr
    );
}

#[test]
fn a_code_no_sender_offers_is_refused_at_once_and_a_positional_code_needs_a_relay() {
    let t = tmp();
    let relay = start_relay();
    let t0 = Instant::now();
    let r = receive_by_code(&relay, "1234-acid-acorn", &t.path().join("out"));
    let why = r.assert_exit(1);
    assert!(
        why.contains("no sender is waiting with code 1234-acid-acorn"),
        "{why}"
    );
    assert!(t0.elapsed() < Duration::from_secs(10));
    let lone = Proc::spawn_env(
        "receiver",
        &[
            "receive",
            "1234-acid-acorn",
            "--out",
            t.path().to_str().unwrap(),
        ],
        &[
            ("HURTLE_CODE", ""),
            ("HURTLE_RELAY", ""),
            ("HURTLE_CONFIG", "/nonexistent/hurtle.toml"),
        ],
    )
    .wait(TRANSFER_TIMEOUT);
    let why = lone.assert_exit(2);
    assert!(why.contains("found through its relay"), "{why}");
}

#[test]
fn a_sender_by_code_waits_for_the_code_to_be_registered_then_gives_up() {
    let t = tmp();
    let src = t.path().join("x");
    std::fs::write(&src, b"x").unwrap();
    let relay = start_relay();
    let t0 = Instant::now();
    let s = Proc::spawn(
        "sender",
        &[
            "send",
            src.to_str().unwrap(),
            "--code",
            "1234-acid-acorn",
            "--relay",
            &relay.addr.to_string(),
            "--wait",
            "4",
        ],
    )
    .wait(TRANSFER_TIMEOUT);
    let took = t0.elapsed();
    assert_eq!(
        s.assert_failure(),
        "no such code (expired, used or mistyped)"
    );
    // Asked once a second while the next ask still falls within the wait: the last at 3 s.
    assert!(
        took >= Duration::from_millis(2900) && took < Duration::from_secs(15),
        "{took:?}"
    );
    assert!(
        s.stdout.contains(
            "hurtle: waiting for the receiver of code 1234-acid-acorn to register at the relay"
        ),
        "{}",
        s.stdout
    );
}

/// The sender and receiver of a slow transfer by a code the sender printed, moving data.
fn slow_sender_first(t: &Path, relay: &Relay) -> (Proc, Proc) {
    let src = t.join("big.bin");
    fsx::write_random(&src, 32 << 20, 11);
    let args = [
        "send".to_string(),
        src.display().to_string(),
        "--relay".into(),
        relay.addr.to_string(),
        "--rate".into(),
        "40M".into(),
        "--channels".into(),
        "2".into(),
    ];
    let mut sender = Proc::spawn_env("sender", &args, &[("HURTLE_CODE", "")]);
    let code = sender.wait_for_output("its code", Duration::from_secs(10), |_, e| code_of(e));
    let out = t.join("out");
    let relay_addr = relay.addr.to_string();
    let receiver = Proc::spawn_env(
        "receiver",
        &["receive", &code, "--out", out.to_str().unwrap()],
        &[("HURTLE_CODE", ""), ("HURTLE_RELAY", relay_addr.as_str())],
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while fsx::part_files(&out).is_empty() {
        assert!(Instant::now() < deadline, "no transfer started within 15 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(1000));
    (sender, receiver)
}

fn interrupt(p: &Proc) {
    let ok = std::process::Command::new("kill")
        .args(["-INT", &p.id().to_string()])
        .status()
        .expect("kill(1)")
        .success();
    assert!(ok, "kill -INT failed");
}

#[test]
fn an_interrupted_transfer_of_a_sender_printed_code_says_to_run_the_send_again() {
    let relay = start_relay();
    // The sender interrupted.
    let t = tmp();
    let (sender, receiver) = slow_sender_first(t.path(), &relay);
    interrupt(&sender);
    let s = sender.wait(TRANSFER_TIMEOUT);
    receiver.wait(TRANSFER_TIMEOUT).assert_failure();
    assert_ne!(s.status.code(), Some(0), "{}", s.stderr);
    assert!(
        s.stderr
            .contains("this code ended with the session: run the send again"),
        "{}",
        s.stderr
    );
    // The receiver interrupted.
    let t = tmp();
    let (sender, receiver) = slow_sender_first(t.path(), &relay);
    interrupt(&receiver);
    let r = receiver.wait(TRANSFER_TIMEOUT);
    sender.wait(TRANSFER_TIMEOUT).assert_failure();
    assert_ne!(r.status.code(), Some(0), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("the sender's code ended with the session: run the send again"),
        "{}",
        r.stderr
    );
}
