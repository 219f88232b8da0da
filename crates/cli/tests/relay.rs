//! End-to-end tests of pairing by code: `hurtle relay`, `hurtle receive --relay` and
//! `hurtle send --code --relay`, as real processes.
//!
//! - on loopback: a transfer paired by code (direct path), a forced-relayed one, a wrong code
//!   (found by the peers' key agreement, not the relay), three wrong codes (spent), an expired
//!   code, single use, the lookup rate limit,
//!   malformed and oversized frames, and a load test of 200 registrations and 200 lookups;
//! - between network namespaces (root): receiver and sender in two namespaces that cannot
//!   reach each other, both reaching the relay's namespace; the transfer must be relayed.

#[allow(dead_code)]
mod support;

use hurtle_relay::client;
use hurtle_relay::wire::{self, Msg};
use hurtle_relay::Code;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use support::fsx;
use support::netns::{ip, Namespaces};
use support::proc::{Finished, Proc};
use support::TRANSFER_TIMEOUT;

const MIB: u64 = 1 << 20;

/// A fresh temporary directory.
fn tmp() -> tempfile::TempDir {
    support::tempdir("hurtle-relay-")
}

/// A running relay and its address.
struct Relay {
    proc: Proc,
    addr: SocketAddr,
}

fn listening(text: &str) -> Option<SocketAddr> {
    text.lines().find_map(|l| {
        l.strip_prefix("hurtle relay: listening on ")?
            .trim()
            .parse()
            .ok()
    })
}

/// Starts `[PREFIX...] hurtle relay --listen LISTEN EXTRA...`.
fn start_relay_with(prefix: &[&str], listen: &str, extra: &[&str]) -> Relay {
    let mut args: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
    if !prefix.is_empty() {
        args.push(support::proc::bin().into());
    }
    args.extend(["relay", "--listen", listen].map(String::from));
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut proc = if prefix.is_empty() {
        Proc::spawn("relay", &args)
    } else {
        Proc::spawn_program("relay", &args[0].clone(), &args[1..])
    };
    let addr = proc.wait_for_output("its address", Duration::from_secs(10), |_, e| listening(e));
    Relay { proc, addr }
}

fn start_relay(extra: &[&str]) -> Relay {
    start_relay_with(&[], "127.0.0.1:0", extra)
}

/// A receiver registered with a relay, and its code.
struct CodeReceiver {
    proc: Proc,
    code: String,
}

fn code_of(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| Some(l.strip_prefix("code: ")?.trim().to_owned()))
}

fn start_code_receiver_with(
    prefix: &[&str],
    relay: &str,
    out: &Path,
    extra: &[&str],
) -> CodeReceiver {
    let mut args: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
    if !prefix.is_empty() {
        args.push(support::proc::bin().into());
    }
    args.extend(["receive", "--relay", relay, "--out"].map(String::from));
    args.push(out.display().to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut proc = if prefix.is_empty() {
        Proc::spawn("receiver", &args)
    } else {
        Proc::spawn_program("receiver", &args[0].clone(), &args[1..])
    };
    let code = proc.wait_for_output("its code", Duration::from_secs(10), |_, e| code_of(e));
    CodeReceiver { proc, code }
}

fn start_code_receiver(relay: &Relay, out: &Path, extra: &[&str]) -> CodeReceiver {
    start_code_receiver_with(&[], &relay.addr.to_string(), out, extra)
}

fn send_by_code(relay: &Relay, code: &str, src: &Path, extra: &[&str]) -> Finished {
    let mut args = vec!["send".to_string(), src.display().to_string()];
    args.extend(["--code", code, "--relay", &relay.addr.to_string()].map(String::from));
    args.extend(extra.iter().map(|s| s.to_string()));
    Proc::spawn("sender", &args).wait(TRANSFER_TIMEOUT)
}

/// The code with its words replaced by other valid words.
fn wrong_words(code: &str) -> String {
    let c = Code::parse(code).unwrap();
    let other: Vec<&str> = c
        .words
        .iter()
        .map(|w| if *w == "acid" { "acorn" } else { "acid" })
        .collect();
    format!("{}-{}", c.nameplate, other.join("-"))
}

#[test]
fn paired_by_code_on_loopback_goes_direct() {
    let t = tmp();
    let src = t.path().join("src/data.bin");
    fsx::write_random(&src, 5 * MIB + 321, 51);
    let out = t.path().join("out");
    let relay = start_relay(&[]);
    let r = start_code_receiver(&relay, &out, &["--json"]);
    assert!(Code::parse(&r.code).is_ok(), "printed code {:?}", r.code);
    let s = send_by_code(&relay, &r.code, &src, &["--json"]);
    s.assert_success();
    let v = s.json();
    assert_eq!(v["path"], "direct", "{v}");
    assert_eq!(
        v["code_nameplate"],
        Code::parse(&r.code).unwrap().nameplate,
        "{v}"
    );
    assert!(
        s.stderr.contains("path: direct to 127.0.0.1:"),
        "{}",
        s.stderr
    );
    let recv = r.proc.wait(TRANSFER_TIMEOUT);
    recv.assert_success();
    assert!(
        recv.stderr.contains("path: direct from "),
        "{}",
        recv.stderr
    );
    assert_eq!(recv.json()["path"], "direct");
    fsx::assert_same_file(&src, &out.join("data.bin"));
    let log = relay.proc.kill().stderr;
    let pairing: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("pairing nameplate="))
        .collect();
    assert_eq!(pairing.len(), 1, "{log}");
    assert!(
        pairing[0].contains("path=direct") && pairing[0].contains("sender=127.0.0.1:"),
        "{log}"
    );
    // The relay never saw the words.
    let words = Code::parse(&r.code).unwrap().words;
    assert!(!words.iter().any(|w| log.contains(w)), "{log}");
}

/// A 7 MiB file sent by code with `--relay-only --channels 3` and `extra`, on loopback: both
/// sides say the session was relayed and the file is the same. The sender's JSON and the relay;
/// the receiver's summary's line on which path carried how many bytes.
fn forced_relayed(extra: &[&str]) -> (serde_json::Value, String, Relay, String) {
    let t = tmp();
    let src = t.path().join("src/data.bin");
    fsx::write_random(&src, 7 * MIB + 5, 52);
    let out = t.path().join("out");
    let relay = start_relay(&[]);
    let r = start_code_receiver(&relay, &out, &[]);
    let mut args = vec!["--json", "--relay-only", "--channels", "3"];
    args.extend(extra);
    let s = send_by_code(&relay, &r.code, &src, &args);
    s.assert_success();
    let v = s.json();
    assert_eq!(v["path"], "relayed", "{v}");
    assert_eq!(v["channels"], 3, "{v}");
    let line = format!("path: relayed via {}", relay.addr);
    assert!(s.stderr.contains(&line), "{}", s.stderr);
    let recv = r.proc.wait(TRANSFER_TIMEOUT);
    recv.assert_success();
    assert!(recv.stdout.contains(&line), "{}", recv.stdout);
    fsx::assert_same_file(&src, &out.join("data.bin"));
    let by_path = recv
        .stdout
        .lines()
        .find(|l| l.starts_with("path: ") && l.contains(" MiB"))
        .unwrap_or_else(|| panic!("no path line in\n{}", recv.stdout))
        .to_string();
    (v, s.stderr, relay, by_path)
}

#[test]
fn forced_relayed_transfer_on_loopback_goes_as_datagrams_through_the_relay() {
    let (v, stderr, mut relay, _) = forced_relayed(&[]);
    // The relay forwards datagrams: hurtle's UDP channels, paced and repaired, not TCP.
    assert_eq!(v["transport"], "udp", "{v}\n{stderr}");
    assert!(v["fallback_seconds"].is_null(), "{v}");
    let log = relay.proc.stderr();
    assert!(log.contains("udp allocations=3"), "{log}");
    // The TCP splices carried the control connection and the race's idle data connections,
    // not the file.
    let spliced: u64 = splice_bytes(&log).iter().sum();
    assert!(spliced < MIB, "{spliced} bytes spliced\n{log}");
    assert!(relay.proc.is_running());
}

/// The sender-to-receiver bytes of each splice that ended, as the relay logs them.
fn splice_bytes(log: &str) -> Vec<u64> {
    log.lines()
        .filter(|l| l.contains("splice end"))
        .filter_map(|l| {
            l.split("sender->receiver=")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

#[test]
fn forced_relayed_parallel_tcp_on_loopback_is_spliced() {
    let (v, _, mut relay, received) = forced_relayed(&["--transport", "tcp"]);
    assert_eq!(v["transport"], "tcp", "{v}");
    // So did the receiver, for what it received.
    assert!(
        received.starts_with("path: relayed over TCP 7."),
        "{received}"
    );
    // The sender counted every byte as sent through the splice.
    let (share, via_udp, via_tcp) = direct_share(&v);
    assert_eq!((share, via_udp), (0.0, 0), "{v}");
    assert!(via_tcp > 7 * MIB, "{v}");
    // One splice per connection: control and three data connections, the data bytes forwarded.
    let deadline = Instant::now() + Duration::from_secs(10);
    let ends = loop {
        let ends = splice_bytes(&relay.proc.stderr());
        if ends.len() >= 4 || Instant::now() > deadline {
            break ends;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(ends.len(), 4, "{}", relay.proc.stderr());
    assert!(ends.iter().sum::<u64>() > 7 * MIB, "{ends:?}");
    assert!(relay.proc.is_running());
}

#[test]
fn wrong_code_is_refused_and_the_receiver_keeps_waiting() {
    let t = tmp();
    let src = t.path().join("small.txt");
    std::fs::write(&src, b"right code only").unwrap();
    let out = t.path().join("out");
    let relay = start_relay(&[]);
    let mut r = start_code_receiver(&relay, &out, &[]);
    // The relay pairs it (it cannot tell a wrong code: it never sees the words); the key
    // agreement between the peers fails, and nothing is sent.
    let s = send_by_code(&relay, &wrong_words(&r.code), &src, &[]);
    let why = s.assert_exit(3);
    assert!(why.contains("does not hold this code"), "{why}");
    assert!(
        r.proc.is_running(),
        "one wrong try does not end the receiver"
    );
    // A typo that is not a code word never reaches the relay.
    let s = send_by_code(&relay, "1234-purple-sausagex", &src, &[]);
    assert!(
        s.assert_failure().contains("is not in the word list"),
        "{}",
        s.stderr
    );
    assert_eq!(s.status.code(), Some(2));
    // The right code still works.
    send_by_code(&relay, &r.code, &src, &[]).assert_success();
    r.proc.wait(TRANSFER_TIMEOUT).assert_success();
    assert_eq!(
        std::fs::read(out.join("small.txt")).unwrap(),
        b"right code only"
    );
}

#[test]
fn three_wrong_codes_spend_the_code_and_end_the_receiver() {
    let t = tmp();
    let src = t.path().join("x");
    std::fs::write(&src, b"x").unwrap();
    let out = t.path().join("out");
    let relay = start_relay(&[]);
    let r = start_code_receiver(&relay, &out, &[]);
    for _ in 0..3 {
        let s = send_by_code(&relay, &wrong_words(&r.code), &src, &[]);
        let why = s.assert_exit(3);
        assert!(why.contains("does not hold this code"), "{why}");
    }
    let recv = r.proc.wait(Duration::from_secs(10));
    let why = recv.assert_exit(3);
    assert!(why.contains("tried 3 times"), "{why}");
    assert!(
        std::fs::read_dir(&out).map_or(true, |mut d| d.next().is_none()),
        "something was written"
    );
    let s = send_by_code(&relay, &r.code, &src, &[]);
    assert_eq!(
        s.assert_failure(),
        "no such code (expired, used or mistyped)"
    );
}

#[test]
fn expired_code_is_unknown_and_the_receiver_is_told() {
    let t = tmp();
    let src = t.path().join("x");
    std::fs::write(&src, b"x").unwrap();
    let relay = start_relay(&["--code-ttl", "1"]);
    let r = start_code_receiver(&relay, &t.path().join("out"), &[]);
    let recv = r.proc.wait(Duration::from_secs(10));
    assert!(recv.assert_failure().contains("expired"), "{}", recv.stderr);
    let s = send_by_code(&relay, &r.code, &src, &[]);
    assert_eq!(
        s.assert_failure(),
        "no such code (expired, used or mistyped)"
    );
    assert_ne!(s.status.code(), Some(0));
}

#[test]
fn a_code_is_single_use() {
    let t = tmp();
    let src = t.path().join("once.txt");
    std::fs::write(&src, b"once").unwrap();
    let relay = start_relay(&[]);
    let r = start_code_receiver(&relay, &t.path().join("out"), &[]);
    send_by_code(&relay, &r.code, &src, &[]).assert_success();
    r.proc.wait(TRANSFER_TIMEOUT).assert_success();
    let s = send_by_code(&relay, &r.code, &src, &[]);
    assert_eq!(
        s.assert_failure(),
        "no such code (expired, used or mistyped)"
    );
}

#[test]
fn lookups_are_rate_limited_per_client() {
    let relay = start_relay(&["--lookup-burst", "2", "--lookup-per-sec", "0.01"]);
    let code = Code::parse("1234-acid-acorn").unwrap();
    let answers: Vec<String> = (0..3)
        .map(|_| {
            client::lookup(relay.addr, code.nameplate)
                .unwrap_err()
                .to_string()
        })
        .collect();
    assert_eq!(answers[0], "no such code (expired, used or mistyped)");
    assert_eq!(answers[1], "no such code (expired, used or mistyped)");
    assert_eq!(answers[2], "too many lookups, slow down");
}

/// Sends raw bytes; returns what the relay answered before it closed the connection.
fn raw_exchange(relay: SocketAddr, bytes: &[u8]) -> (Vec<u8>, Duration) {
    let mut s = TcpStream::connect(relay).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = Instant::now();
    s.write_all(bytes).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got)
        .expect("the relay closes the connection");
    (got, t.elapsed())
}

fn error_kind(answer: &[u8]) -> String {
    match wire::decode(answer) {
        Ok(Some((Msg::Error { kind, .. }, _))) => kind,
        other => panic!("expected an error frame, got {other:?} from {answer:?}"),
    }
}

#[test]
fn malformed_oversized_and_idle_clients_are_disconnected_and_the_relay_keeps_serving() {
    let relay = start_relay(&["--idle-timeout", "1"]);
    let mut junk = vec![0xff, 0xff];
    junk.extend(std::iter::repeat_n(b'a', 70_000));
    let (got, _) = raw_exchange(relay.addr, &junk);
    assert_eq!(error_kind(&got), "bad_frame");
    let (got, _) = raw_exchange(relay.addr, &[0, 0]);
    assert_eq!(error_kind(&got), "bad_frame");
    let (got, _) = raw_exchange(relay.addr, b"\x00\x05\xff\xfe{}]");
    assert_eq!(error_kind(&got), "bad_frame");
    let (got, _) = raw_exchange(relay.addr, &Msg::Spliced.to_frame());
    assert_eq!(error_kind(&got), "bad_request");
    // Half a frame, then silence: dropped after the idle timeout.
    let (got, took) = raw_exchange(relay.addr, b"\x00\x40{\"t\":\"loo");
    assert_eq!(error_kind(&got), "timeout");
    assert!(took < Duration::from_secs(5), "{took:?}");
    // Many garbage connections at once.
    let handles: Vec<_> = (0..50u8)
        .map(|i| {
            let a = relay.addr;
            std::thread::spawn(move || raw_exchange(a, &[0x80 | i, 0xff, i, i, i]).0)
        })
        .collect();
    for h in handles {
        assert_eq!(error_kind(&h.join().unwrap()), "bad_frame");
    }
    // Still serving.
    let reg = client::register(relay.addr, "127.0.0.1:7400".parse().unwrap(), 2).unwrap();
    let found = client::lookup(relay.addr, reg.code.nameplate).unwrap();
    assert!(found
        .candidates
        .contains(&"127.0.0.1:7400".parse().unwrap()));
    let mut relay = relay;
    assert!(relay.proc.is_running());
}

/// VmRSS of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap()
}

#[test]
fn relay_load_200_concurrent_registrations_and_lookups() {
    const N: usize = 200;
    let t0 = Instant::now();
    let relay = start_relay(&["--lookup-burst", "1000", "--lookup-per-sec", "1000"]);
    let addr = relay.addr;
    let start = Arc::new(Barrier::new(N));
    let regs: Vec<_> = (0..N)
        .map(|i| {
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                let listen: SocketAddr = format!("127.0.0.1:{}", 20_000 + i).parse().unwrap();
                (
                    listen,
                    client::register(addr, listen, 2)
                        .unwrap_or_else(|e| panic!("registration {i}: {e}")),
                )
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    let mut nameplates: Vec<u32> = regs.iter().map(|(_, r)| r.code.nameplate).collect();
    nameplates.sort();
    nameplates.dedup();
    assert_eq!(
        nameplates.len(),
        N,
        "every registration has its own nameplate"
    );
    let registered_in = t0.elapsed();
    let start = Arc::new(Barrier::new(N));
    let lookups: Vec<_> = regs
        .iter()
        .map(|(listen, r)| {
            let (start, code, listen) = (start.clone(), r.code.clone(), *listen);
            std::thread::spawn(move || {
                start.wait();
                let found = client::lookup(addr, code.nameplate)
                    .unwrap_or_else(|e| panic!("lookup {code}: {e}"));
                assert!(
                    found.candidates.contains(&listen),
                    "{:?} for {listen}",
                    found.candidates
                );
                found
            })
        })
        .collect();
    let found: Vec<_> = lookups.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(found.len(), N);
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(30), "load test took {took:?}");
    let rss = rss_kib(relay.proc.id());
    assert!(
        rss < 200 * 1024,
        "relay RSS {rss} KiB with {N} agents and {N} lookups open"
    );
    drop(found);
    drop(regs);
    let mut relay = relay;
    assert!(relay.proc.is_running());
    eprintln!("registered {N} in {registered_in:?}, looked up in {took:?}, relay RSS {rss} KiB");
}

// ---------------------------------------------------------------------------------------------
// Network namespaces (root)
// ---------------------------------------------------------------------------------------------

#[test]
fn relayed_between_namespaces_that_cannot_reach_each_other() {
    if !support::require_root("relayed_between_namespaces_that_cannot_reach_each_other") {
        return;
    }
    let pid = std::process::id();
    let (r, a, b) = (
        format!("hurtle-r-{pid}"),
        format!("hurtle-a-{pid}"),
        format!("hurtle-b-{pid}"),
    );
    let mut ns = Namespaces { names: Vec::new() };
    for n in [&r, &a, &b] {
        ns.add(n);
    }
    // A (10.213.1.2) -- R (10.213.1.1 / 10.213.2.1) -- B (10.213.2.2); R does not forward.
    ip(&[
        "-n", &r, "link", "add", "ra", "type", "veth", "peer", "name", "va", "netns", &a,
    ]);
    ip(&[
        "-n", &r, "link", "add", "rb", "type", "veth", "peer", "name", "vb", "netns", &b,
    ]);
    for (n, dev, addr) in [
        (&r, "ra", "10.213.1.1/24"),
        (&r, "rb", "10.213.2.1/24"),
        (&a, "va", "10.213.1.2/24"),
        (&b, "vb", "10.213.2.2/24"),
    ] {
        ip(&["-n", n, "addr", "add", addr, "dev", dev]);
        ip(&["-n", n, "link", "set", dev, "up"]);
    }
    ip(&["-n", &a, "route", "add", "default", "via", "10.213.1.1"]);
    ip(&["-n", &b, "route", "add", "default", "via", "10.213.2.1"]);
    ip(&[
        "netns",
        "exec",
        &r,
        "sysctl",
        "-qw",
        "net.ipv4.ip_forward=0",
    ]);

    let t = tmp();
    let src = t.path().join("src/data.bin");
    fsx::write_random(&src, 6 * MIB + 77, 53);
    let out = t.path().join("out");
    let t0 = Instant::now();
    let (s, r_done, relay) = send_across(
        (&r, &a, &b),
        ("10.213.1.1", "10.213.2.1"),
        (&src, &out),
        (&[], &["--json"]),
    );
    let sender_relay = format!("10.213.2.1:{}", relay.addr.port());
    s.assert_success();
    let v = s.json();
    assert_eq!(v["path"], "relayed", "{v}\n{}", s.stderr);
    // A and B cannot reach each other: the file's datagrams went through the relay's UDP port.
    assert_eq!(v["transport"], "udp", "{v}\n{}", s.stderr);
    assert!(v["fallback_seconds"].is_null(), "{v}");
    assert!(
        s.stderr
            .contains(&format!("path: relayed via {sender_relay}")),
        "{}",
        s.stderr
    );
    r_done.assert_success();
    assert!(
        r_done.stdout.contains("path: relayed via 10.213.1.1:"),
        "{}",
        r_done.stdout
    );
    fsx::assert_same_file(&src, &out.join("data.bin"));
    let log = relay.proc.kill().stderr;
    assert!(
        log.lines().any(|l| l.contains("pairing")
            && l.contains("receiver=10.213.1.2:")
            && l.contains("sender=10.213.2.2:")
            && l.contains("path=relayed")),
        "{log}"
    );
    eprintln!("namespace transfer took {:?}", t0.elapsed());
    drop(ns);
}

/// A TCP forwarder to `to` that keeps a copy of every byte it forwards, both ways.
fn capturing_forwarder(to: SocketAddr) -> (SocketAddr, Arc<std::sync::Mutex<Vec<u8>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = seen.clone();
    std::thread::spawn(move || {
        for inbound in listener.incoming() {
            let Ok(inbound) = inbound else { return };
            let Ok(outbound) = TcpStream::connect(to) else {
                return;
            };
            for (mut from, mut into) in [
                (inbound.try_clone().unwrap(), outbound.try_clone().unwrap()),
                (outbound, inbound),
            ] {
                let keep = keep.clone();
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        match from.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                keep.lock().unwrap().extend_from_slice(&buf[..n]);
                                if into.write_all(&buf[..n]).is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    let _ = into.shutdown(std::net::Shutdown::Write);
                });
            }
        }
    });
    (addr, seen)
}

/// Everything a relayed session sends through the relay's TCP splice is ciphertext: a file made
/// of a marker, and its distinctive name, never show in the bytes on the sender's side of the
/// relay. With `--no-encryption` on both sides the marker does show (the capture sees the data),
/// and the name still does not (control messages stay sealed). Parallel TCP, so that the file's
/// bytes cross the captured TCP connections (datagrams through the relay are sealed as on any
/// path: e2e.rs looks at what the wire shows).
#[test]
fn a_relayed_session_crosses_the_relay_encrypted() {
    let marker = b"HURTLE-RELAYED-PLAINTEXT-MARKER-";
    let name = "zebra-quokka-relayed-name.bin";
    for plain in [false, true] {
        let t = tmp();
        let src = t.path().join(name);
        let body: Vec<u8> = marker
            .iter()
            .copied()
            .cycle()
            .take(3 * MIB as usize)
            .collect();
        std::fs::write(&src, &body).unwrap();
        let out = t.path().join("out");
        let relay = start_relay(&[]);
        let (front, seen) = capturing_forwarder(relay.addr);
        let flag: &[&str] = if plain { &["--no-encryption"] } else { &[] };
        let r = start_code_receiver(&relay, &out, flag);
        let mut args = vec!["send".to_string(), src.display().to_string()];
        args.extend(
            [
                "--code",
                &r.code,
                "--relay",
                &front.to_string(),
                "--relay-only",
                "--transport",
                "tcp",
                "--json",
            ]
            .map(String::from),
        );
        args.extend(flag.iter().map(|s| s.to_string()));
        let s = Proc::spawn("sender", &args).wait(TRANSFER_TIMEOUT);
        s.assert_success();
        assert_eq!(s.json()["path"], "relayed");
        assert_eq!(s.json()["encrypted"], !plain);
        r.proc.wait(TRANSFER_TIMEOUT).assert_success();
        fsx::assert_same_file(&src, &out.join(name));
        let seen = seen.lock().unwrap();
        assert!(
            seen.len() > body.len(),
            "the session did not pass the forwarder: {} bytes",
            seen.len()
        );
        let has = |needle: &[u8]| seen.windows(needle.len()).any(|w| w == needle);
        assert_eq!(
            has(marker),
            plain,
            "the file's bytes in the clear (plain: {plain})"
        );
        assert!(
            !has(name.as_bytes()),
            "the file's name crossed the relay in the clear"
        );
        assert!(!has(r.code.as_bytes()), "the code crossed the relay");
    }
}

/// Runs `nft -f -` with `rules` in namespace `ns`.
fn nft_in(ns: &str, rules: &str) {
    use std::io::Write as _;
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("run nft");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(rules.as_bytes())
        .expect("write rules");
    assert!(
        child.wait().expect("nft").success(),
        "nft in {ns}:\n{rules}"
    );
}

/// A relay in namespace `r` (started with `relay_extra`), a receiver by code in `a` that
/// reaches it at `relay_ips.0`, and a sender in `b` that reaches it at `relay_ips.1`, sending
/// `src` into `out` with `send_extra`: the sender's end, the receiver's, the relay.
fn send_across(
    (r, a, b): (&str, &str, &str),
    relay_ips: (&str, &str),
    (src, out): (&Path, &Path),
    (relay_extra, send_extra): (&[&str], &[&str]),
) -> (support::proc::Finished, support::proc::Finished, Relay) {
    send_across_with(
        (r, a, b),
        relay_ips,
        (src, out),
        (relay_extra, &[], send_extra),
    )
}

/// [`send_across`], the receiver started with `recv_extra` too.
fn send_across_with(
    (r, a, b): (&str, &str, &str),
    relay_ips: (&str, &str),
    (src, out): (&Path, &Path),
    (relay_extra, recv_extra, send_extra): (&[&str], &[&str], &[&str]),
) -> (support::proc::Finished, support::proc::Finished, Relay) {
    let relay = start_relay_with(&["ip", "netns", "exec", r], "0.0.0.0:0", relay_extra);
    let port = relay.addr.port();
    let recv = start_code_receiver_with(
        &["ip", "netns", "exec", a],
        &format!("{}:{port}", relay_ips.0),
        out,
        recv_extra,
    );
    let sender_relay = format!("{}:{port}", relay_ips.1);
    let mut args: Vec<String> = ["netns", "exec", b, support::proc::bin(), "send"]
        .map(String::from)
        .to_vec();
    args.push(src.display().to_string());
    args.extend(["--code", &recv.code, "--relay", &sender_relay].map(String::from));
    args.extend(send_extra.iter().map(|x| x.to_string()));
    let s = Proc::spawn_program("sender", "ip", &args).wait(TRANSFER_TIMEOUT);
    let r_done = recv.proc.wait(TRANSFER_TIMEOUT);
    (s, r_done, relay)
}

/// A NAT's nftables rules, given its inside host's address and its public one.
type Nat = fn(&str, &str) -> String;

/// A NAT that gives every destination a port of its own ("symmetric", endpoint-dependent
/// mapping: masquerade with random ports), inbound only for flows the inside started.
fn symmetric(_inside: &str, _public: &str) -> String {
    r#"
table ip hurtle_nat {
  chain nat_out { type nat hook postrouting priority 100; oifname "out" masquerade random; }
  chain inbound {
    type filter hook forward priority 0; policy drop;
    ct state established,related accept;
    iifname "in" oifname "out" accept;
  }
}
"#
    .to_string()
}

/// A NAT that keeps one public port per socket (endpoint-independent mapping: masquerade,
/// which keeps a socket's port) and lets in only what answers a flow the inside started, to
/// that flow's address and port ("port-restricted cone"); unsolicited datagrams to the NAT
/// itself dropped, as home routers do (a probe that came first would otherwise leave a
/// conntrack entry that makes the NAT give the inside's own probe another port).
fn port_restricted(_inside: &str, _public: &str) -> String {
    r#"
table ip hurtle_nat {
  chain nat_out { type nat hook postrouting priority 100; oifname "out" masquerade; }
  chain inbound {
    type filter hook forward priority 0; policy drop;
    ct state established,related accept;
    iifname "in" oifname "out" accept;
  }
  chain unsolicited {
    type filter hook input priority 0; policy accept;
    iifname "out" ct state new drop;
  }
}
"#
    .to_string()
}

/// A NAT with endpoint-independent mapping and filtering ("full cone"): an explicit mapping,
/// since plain conntrack does not keep ports reliably. The inside host's UDP leaves from the
/// public address with its port kept, and any UDP datagram to the public address is let in
/// to the inside host, port kept, whoever sent it. TCP only out (and its answers).
fn full_cone(inside: &str, public: &str) -> String {
    format!(
        r#"
table ip hurtle_nat {{
  chain nat_in {{
    type nat hook prerouting priority -100;
    iifname "out" ip daddr {public} meta l4proto udp dnat to {inside};
  }}
  chain nat_out {{
    type nat hook postrouting priority 100;
    oifname "out" ip saddr {inside} snat to {public};
  }}
  chain inbound {{
    type filter hook forward priority 0; policy drop;
    ct state established,related accept;
    iifname "in" oifname "out" accept;
    iifname "out" oifname "in" ct status dnat accept;
  }}
}}
"#
    )
}

/// A NAT that lets no UDP through either way (a network that blocks UDP); TCP as
/// [`port_restricted`].
fn udp_blocked(inside: &str, public: &str) -> String {
    let mut rules = port_restricted(inside, public);
    rules.push_str(
        r#"
table ip hurtle_block {
  chain no_udp { type filter hook forward priority -10; policy accept; meta l4proto udp drop; }
}
"#,
    );
    rules
}

/// Two peers each behind its own NAT, with a relay's namespace between the NATs: A (the
/// receiver's host) 10.N.1.2 -- NAT-A (10.N.1.1 inside, 10.N.3.2 outside) -- R (10.N.3.1 /
/// 10.N.4.1) -- NAT-B (10.N.4.2 outside, 10.N.2.1 inside) -- 10.N.2.2 B (the sender's). The
/// NATs forward from inside to outside and apply their rules (nftables, `in` and `out` their
/// interfaces: NAT-A's from `nats.0`, NAT-B's from `nats.1`, each called with its inside
/// host's address and its public one); R routes between the NATs only if `routes`. Removed
/// when dropped.
struct NatPair {
    _ns: Namespaces,
    a: String,
    r: String,
    b: String,
}

fn nat_pair(tag: &str, n: u8, nats: (Nat, Nat), routes: bool) -> NatPair {
    let pid = std::process::id();
    let name = |s: &str| format!("hurtle-{tag}{s}-{pid}");
    let (a, na, r, nb, b) = (name("a"), name("na"), name("r"), name("nb"), name("b"));
    let mut ns = Namespaces { names: Vec::new() };
    for x in [&a, &na, &r, &nb, &b] {
        ns.add(x);
    }
    for (x, xdev, y, ydev) in [
        (&a, "v", &na, "in"),
        (&na, "out", &r, "ra"),
        (&r, "rb", &nb, "out"),
        (&nb, "in", &b, "v"),
    ] {
        ip(&[
            "-n", x, "link", "add", xdev, "type", "veth", "peer", "name", ydev, "netns", y,
        ]);
    }
    let net = |host: &str| format!("10.{n}.{host}/24");
    for (x, dev, addr) in [
        (&a, "v", net("1.2")),
        (&na, "in", net("1.1")),
        (&na, "out", net("3.2")),
        (&r, "ra", net("3.1")),
        (&r, "rb", net("4.1")),
        (&nb, "out", net("4.2")),
        (&nb, "in", net("2.1")),
        (&b, "v", net("2.2")),
    ] {
        ip(&["-n", x, "addr", "add", &addr, "dev", dev]);
        ip(&["-n", x, "link", "set", dev, "up"]);
    }
    for (x, via) in [(&a, "1.1"), (&na, "3.1"), (&b, "2.1"), (&nb, "4.1")] {
        ip(&[
            "-n",
            x,
            "route",
            "add",
            "default",
            "via",
            &format!("10.{n}.{via}"),
        ]);
    }
    for (x, forward) in [(&na, true), (&nb, true), (&r, routes)] {
        let v = format!("net.ipv4.ip_forward={}", u8::from(forward));
        ip(&["netns", "exec", x, "sysctl", "-qw", &v]);
    }
    nft_in(&na, &nats.0(&format!("10.{n}.1.2"), &format!("10.{n}.3.2")));
    nft_in(&nb, &nats.1(&format!("10.{n}.2.2"), &format!("10.{n}.4.2")));
    NatPair { _ns: ns, a, r, b }
}

/// Two peers each behind a NAT of its own that gives every destination a port of its own
/// ("symmetric": nftables masquerade with random ports, and inbound only for flows the inside
/// started), the relay on the network between the NATs, which does not route from one to the
/// other: no direct path of any kind, and a punched one would not work either. The session's
/// datagrams go through the relay's UDP port: UDP speed where the TCP splice used to be.
#[test]
fn two_peers_behind_symmetric_nats_send_datagrams_through_the_relay() {
    if !support::require_root("two_peers_behind_symmetric_nats_send_datagrams_through_the_relay") {
        return;
    }
    let NatPair { _ns: ns, a, r, b } = nat_pair("s", 214, (symmetric, symmetric), false);

    let t = tmp();
    let src = t.path().join("src/data.bin");
    fsx::write_random(&src, 9 * MIB + 13, 54);
    let out = t.path().join("out");
    let (s, r_done, relay) = send_across(
        (&r, &a, &b),
        ("10.214.3.1", "10.214.4.1"),
        (&src, &out),
        (&[], &["--json"]),
    );
    s.assert_success();
    let v = s.json();
    assert_eq!(v["path"], "relayed", "{v}\n{}", s.stderr);
    assert_eq!(v["transport"], "udp", "{v}\n{}", s.stderr);
    assert!(v["fallback_seconds"].is_null(), "{v}");
    r_done.assert_success();
    fsx::assert_same_file(&src, &out.join("data.bin"));
    let log = relay.proc.kill().stderr;
    // The relay saw each peer from its NAT's public address, and allocated for the session.
    assert!(
        log.lines().any(|l| l.contains("pairing")
            && l.contains("receiver=10.214.3.2:")
            && l.contains("sender=10.214.4.2:")),
        "{log}"
    );
    assert!(log.contains("udp allocations="), "{log}");
    // Nothing but the control connection and the race's idle TCP connections was spliced.
    let spliced: u64 = splice_bytes(&log).iter().sum();
    assert!(spliced < MIB, "{spliced} bytes spliced\n{log}");
    drop(ns);
}

/// Two peers each behind a NAT that keeps one public port per socket ("cone": nftables
/// masquerade, which keeps a socket's port; inbound only for flows the inside started, and
/// unsolicited datagrams to the NAT itself dropped, as home routers do: a probe that came first
/// would otherwise leave a conntrack entry that makes the NAT give the inside's own probe
/// another port),
/// with a routed network between the NATs and the relay on it. The session starts relayed and
/// its channels move to direct paths punched through both NATs: the relay forwards only what
/// went before the move.
#[test]
fn two_peers_behind_cone_nats_punch_a_direct_path_and_leave_the_relay() {
    if !support::require_root("two_peers_behind_cone_nats_punch_a_direct_path_and_leave_the_relay")
    {
        return;
    }
    let NatPair { _ns: ns, a, r, b } = nat_pair("c", 215, (port_restricted, port_restricted), true);

    let t = tmp();
    let src = t.path().join("src/data.bin");
    fsx::write_random(&src, 96 * MIB + 3, 55);
    let out = t.path().join("out");
    let (s, r_done, relay) = send_across_with(
        (&r, &a, &b),
        ("10.215.3.1", "10.215.4.1"),
        (&src, &out),
        (
            &["--metrics", "127.0.0.1:7499"],
            &["--json"],
            &["--json", "--rate", "400M"],
        ),
    );
    s.assert_success();
    let v = s.json();
    assert_eq!(v["path"], "relayed", "{v}\n{}", s.stderr);
    assert_eq!(v["transport"], "udp", "{v}\n{}", s.stderr);
    r_done.assert_success();
    let channels = v["channels"].as_u64().expect("channels");
    assert_eq!(v["direct_channels"], channels, "{v}\n{}", s.stderr);
    let after = v["direct_after_seconds"].as_f64().expect("a direct path");
    fsx::assert_same_file(&src, &out.join("data.bin"));
    // What the relay forwarded: what went before the move, a small share of the file.
    let forwarded = relay_forwarded(&r, 7499);
    let size = std::fs::metadata(&src).unwrap().len();
    let (share, via_relay, via_tcp) = direct_share(&v);
    eprintln!(
        "direct after {after:.3} s; the relay forwarded {forwarded} of {size} bytes; \
         the sender sent {:.1}% direct, {via_relay} bytes through the relay",
        share * 100.0
    );
    assert!(after < 2.0, "direct after {after} s");
    assert!(
        forwarded * 10 < size,
        "the relay forwarded {forwarded} of {size} bytes"
    );
    // The sender's own count says the same: at least 90% went direct, none over TCP.
    assert!(share >= 0.9, "{share} direct: {v}");
    // The start went through the relay (its first datagrams; where the punch takes a few
    // milliseconds, as on this path without delay, the sender may have counted no data there).
    assert!(forwarded > 0, "the relay carried nothing of the start: {v}");
    assert_eq!(via_tcp, 0, "{v}");
    // The receiver's count of what arrived each way says the same, within what was resent.
    both_sides_agree(&v, &r_done.json(), forwarded);
    drop(relay);
    drop(ns);
}

/// The receiver's `bytes_by_path` (`r`, what arrived each way, by where it came from) against
/// the sender's (`s`, what it sent each way) and the bytes the relay `forwarded`: most of it
/// direct on both sides, the start through the relay, none over TCP; the
/// receiver got no more through the relay than it forwarded; and each path's counts apart by
/// no more than what was resent (lost on the way: in the sender's count only), what the
/// receiver rejected (a direct path's first datagrams may come before the receiver's end of the
/// punch knows that address) and a batch per channel of margin. (The sender counts a batch
/// for the way its channel sent it, the receiver by where it came from: where nothing was lost
/// the two agree to the byte.) Where the punch takes a few milliseconds, what the sender sent
/// through the relay before the receiver's end was bound there never arrives that way (1 run
/// in 4 here): the receiver's relayed share may be 0.
fn both_sides_agree(s: &serde_json::Value, r: &serde_json::Value, forwarded: u64) {
    let (share, r_relay, r_tcp) = direct_share(r);
    let n = |v: &serde_json::Value, k: &str| v["bytes_by_path"][k].as_u64().unwrap_or(0);
    eprintln!(
        "sender {}; receiver {}; resent {} datagrams",
        s["bytes_by_path"], r["bytes_by_path"], s["datagrams_resent"]
    );
    assert!(share >= 0.9, "the receiver got {share} direct: {r}");
    assert!(
        r_relay <= forwarded,
        "the receiver counted {r_relay} bytes through the relay, which forwarded {forwarded}: {r}"
    );
    assert_eq!(r_tcp, 0, "{r}");
    let datagram = s["payload"].as_u64().expect("payload") + 64;
    let resent = s["datagrams_resent"].as_u64().expect("datagrams_resent") * datagram;
    let rejected = r["rejected"].as_u64().expect("rejected") * datagram;
    let batches = s["channels"].as_u64().expect("channels") * 64 * datagram;
    for k in ["direct", "relay_udp"] {
        let (sent, got) = (n(s, k), n(r, k));
        assert!(
            sent.abs_diff(got) <= resent + rejected + batches,
            "{k}: sent {sent}, received {got} (resent {resent} B, rejected {rejected} B): {s}\n{r}"
        );
    }
    assert!(forwarded > 0, "the relay carried nothing of the start: {s}");
}

/// Two peers behind NATs that give every destination a port of their own (symmetric) on
/// IPv4, as in `two_peers_behind_symmetric_nats_send_datagrams_through_the_relay` but with
/// the relay network routed, and an IPv6 network between the two hosts (unique-local
/// addresses on a link of their own, no NAT): each side's binds at the relay carry its IPv6
/// addresses, the two probe each other there, and the session moves from the relay to a
/// direct path over IPv6. The bytes the hosts' IPv6 link carried say so.
#[test]
fn two_symmetric_nats_with_ipv6_between_the_peers_go_direct_over_ipv6() {
    if !support::require_root("two_symmetric_nats_with_ipv6_between_the_peers_go_direct_over_ipv6")
    {
        return;
    }
    let NatPair { _ns: ns, a, r, b } = nat_pair("6", 219, (symmetric, symmetric), true);
    ip(&[
        "-n", &a, "link", "add", "six", "type", "veth", "peer", "name", "six", "netns", &b,
    ]);
    for (x, addr) in [(&a, "fd00:219::1/64"), (&b, "fd00:219::2/64")] {
        // No duplicate address detection: the address is usable at once, not tentative.
        ip(&["-n", x, "addr", "add", addr, "dev", "six", "nodad"]);
        ip(&["-n", x, "link", "set", "six", "up"]);
    }
    let t = tmp();
    let src = t.path().join("src/data.bin");
    fsx::write_random(&src, 64 * MIB + 9, 59);
    let out = t.path().join("out");
    let six_bytes = |ns: &str| -> u64 {
        let o = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                ns,
                "cat",
                "/sys/class/net/six/statistics/rx_bytes",
            ])
            .output()
            .expect("read the link's counter");
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse()
            .unwrap_or(0)
    };
    let before = six_bytes(&a);
    let (s, r_done, relay) = send_across_with(
        (&r, &a, &b),
        ("10.219.3.1", "10.219.4.1"),
        (&src, &out),
        (
            &["--metrics", "127.0.0.1:7496"],
            &["--json"],
            &["--json", "--rate", "400M"],
        ),
    );
    s.assert_success();
    r_done.assert_success();
    fsx::assert_same_file(&src, &out.join("data.bin"));
    let v = s.json();
    assert_eq!(v["path"], "relayed", "{v}\n{}", s.stderr);
    assert_eq!(v["transport"], "udp", "{v}\n{}", s.stderr);
    let channels = v["channels"].as_u64().expect("channels");
    assert_eq!(v["direct_channels"], channels, "{v}\n{}", s.stderr);
    let after = v["direct_after_seconds"].as_f64().expect("a direct path");
    let size = std::fs::metadata(&src).unwrap().len();
    let forwarded = relay_forwarded(&r, 7496);
    let over_six = six_bytes(&a) - before;
    eprintln!(
        "direct after {after:.3} s; the relay forwarded {forwarded} of {size} bytes; \
         the receiver's IPv6 link took {over_six} bytes"
    );
    assert!(after < 2.0, "direct after {after} s");
    assert!(
        forwarded * 10 < size,
        "the relay forwarded {forwarded} of {size} bytes"
    );
    // At least 90% of the file crossed the IPv6 link (the IPv4 NATs give no direct path; what
    // went before the move went through the relay).
    assert!(
        over_six * 10 > size * 9,
        "{over_six} bytes over IPv6 for {size}"
    );
    both_sides_agree(&v, &r_done.json(), forwarded);
    drop(relay);
    drop(ns);
}

/// The datagram bytes the relay in namespace `ns`, serving metrics on 127.0.0.1:`port`, has
/// forwarded (its `hurtle_relay_udp_forwarded_bytes_total`).
fn relay_forwarded(ns: &str, port: u16) -> u64 {
    let metrics = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "python3", "-c"])
        .arg(format!("import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:{port}/metrics').read().decode())"))
        .output()
        .expect("read the relay's metrics");
    let text = String::from_utf8_lossy(&metrics.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("hurtle_relay_udp_forwarded_bytes_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no forwarded bytes in\n{text}"))
}

/// The sender behind a NAT that gives every destination a port of its own (symmetric), the
/// receiver behind one that lets any datagram to its public port in (full cone), on a routed
/// network with the relay on it. The receiver cannot reach the sender's port toward it (it
/// knows only the one toward the relay), but the sender's probe reaches the receiver, which
/// answers it where it came from and probes that port: a direct path both ways. The session
/// starts relayed and its channels move there.
#[test]
fn a_symmetric_sender_and_a_full_cone_receiver_punch_a_direct_path() {
    if !support::require_root("a_symmetric_sender_and_a_full_cone_receiver_punch_a_direct_path") {
        return;
    }
    let NatPair { _ns: ns, a, r, b } = nat_pair("f", 216, (full_cone, symmetric), true);
    let t = tmp();
    let src = t.path().join("src/data.bin");
    fsx::write_random(&src, 96 * MIB + 7, 56);
    let out = t.path().join("out");
    let (s, r_done, relay) = send_across_with(
        (&r, &a, &b),
        ("10.216.3.1", "10.216.4.1"),
        (&src, &out),
        (
            &["--metrics", "127.0.0.1:7498"],
            &["--json"],
            &["--json", "--rate", "400M"],
        ),
    );
    s.assert_success();
    let v = s.json();
    assert_eq!(v["path"], "relayed", "{v}\n{}", s.stderr);
    assert_eq!(v["transport"], "udp", "{v}\n{}", s.stderr);
    r_done.assert_success();
    fsx::assert_same_file(&src, &out.join("data.bin"));
    let channels = v["channels"].as_u64().expect("channels");
    assert_eq!(v["direct_channels"], channels, "{v}\n{}", s.stderr);
    let after = v["direct_after_seconds"].as_f64().expect("a direct path");
    let forwarded = relay_forwarded(&r, 7498);
    let size = std::fs::metadata(&src).unwrap().len();
    let (share, via_relay, via_tcp) = direct_share(&v);
    eprintln!(
        "direct after {after:.3} s; the relay forwarded {forwarded} of {size} bytes; \
         the sender sent {:.1}% direct, {via_relay} bytes through the relay",
        share * 100.0
    );
    assert!(after < 2.0, "direct after {after} s");
    assert!(
        forwarded * 10 < size,
        "the relay forwarded {forwarded} of {size} bytes"
    );
    // The sender's own count says the same: at least 90% went direct, none over TCP.
    assert!(share >= 0.9, "{share} direct: {v}");
    // The start went through the relay (its first datagrams; where the punch takes a few
    // milliseconds, as on this path without delay, the sender may have counted no data there).
    assert!(forwarded > 0, "the relay carried nothing of the start: {v}");
    assert_eq!(via_tcp, 0, "{v}");
    both_sides_agree(&v, &r_done.json(), forwarded);
    drop(relay);
    drop(ns);
}

/// The receiver behind a symmetric NAT, the sender behind a port-restricted cone, on a routed
/// network: the sender's NAT lets in only answers from where its socket sent, and the port
/// the receiver's NAT opens toward the sender is one the sender never learns. No direct path:
/// the punching gives up and the whole file goes as datagrams through the relay.
#[test]
fn a_symmetric_receiver_and_a_port_restricted_sender_stay_on_the_udp_relay() {
    if !support::require_root(
        "a_symmetric_receiver_and_a_port_restricted_sender_stay_on_the_udp_relay",
    ) {
        return;
    }
    let NatPair { _ns: ns, a, r, b } = nat_pair("p", 217, (symmetric, port_restricted), true);
    let t = tmp();
    let src = t.path().join("src/data.bin");
    fsx::write_random(&src, 24 * MIB + 11, 57);
    let out = t.path().join("out");
    let (s, r_done, relay) = send_across_with(
        (&r, &a, &b),
        ("10.217.3.1", "10.217.4.1"),
        (&src, &out),
        (
            &["--metrics", "127.0.0.1:7497"],
            &["--json"],
            &["--json", "--rate", "200M"],
        ),
    );
    s.assert_success();
    let v = s.json();
    assert_eq!(v["path"], "relayed", "{v}\n{}", s.stderr);
    assert_eq!(v["transport"], "udp", "{v}\n{}", s.stderr);
    assert!(v["fallback_seconds"].is_null(), "{v}");
    r_done.assert_success();
    fsx::assert_same_file(&src, &out.join("data.bin"));
    assert_eq!(v["direct_channels"], 0, "{v}\n{}", s.stderr);
    assert!(v["direct_after_seconds"].is_null(), "{v}");
    let (share, via_relay, via_tcp) = direct_share(&v);
    assert_eq!((share, via_tcp), (0.0, 0), "{v}");
    assert!(via_relay > 24 * MIB, "{v}");
    // The receiver's count: all of it arrived from the relay's UDP port.
    let got = r_done.json();
    let (share, got_relay, got_tcp) = direct_share(&got);
    assert_eq!((share, got_tcp), (0.0, 0), "{got}");
    assert!(got_relay > 24 * MIB && got_relay <= via_relay, "{got}\n{v}");
    // Every byte of the file went through the relay's UDP port, none through its splice.
    let forwarded = relay_forwarded(&r, 7497);
    let size = std::fs::metadata(&src).unwrap().len();
    assert!(
        forwarded > size,
        "the relay forwarded {forwarded} of {size} bytes"
    );
    let log = relay.proc.kill().stderr;
    let spliced: u64 = splice_bytes(&log).iter().sum();
    assert!(spliced < MIB, "{spliced} bytes spliced\n{log}");
    drop(ns);
}

/// The sender behind a network that lets no UDP through (its NAT drops every datagram), the
/// receiver behind a port-restricted cone: neither a punched path nor the relay's UDP port
/// works, and the channels go on over parallel TCP through the relay's splice. The `--json`
/// says so (and counts the bytes there), and so does the summary for people (a second
/// transfer, without `--json`).
#[test]
fn udp_blocked_on_one_side_goes_through_the_relay_s_tcp_splice_and_says_so() {
    if !support::require_root(
        "udp_blocked_on_one_side_goes_through_the_relay_s_tcp_splice_and_says_so",
    ) {
        return;
    }
    let NatPair { _ns: ns, a, r, b } = nat_pair("u", 218, (port_restricted, udp_blocked), true);
    let t = tmp();
    let src = t.path().join("src/data.bin");
    let size = 12 * MIB + 5;
    fsx::write_random(&src, size, 58);
    for json in [true, false] {
        let out = t.path().join(format!("out-{json}"));
        let extra: &[&str] = if json { &["--json"] } else { &[] };
        let (s, r_done, relay) = send_across_with(
            (&r, &a, &b),
            ("10.218.3.1", "10.218.4.1"),
            (&src, &out),
            (&[], extra, extra),
        );
        s.assert_success();
        r_done.assert_success();
        fsx::assert_same_file(&src, &out.join("data.bin"));
        if json {
            let v = s.json();
            eprintln!(
                "UDP blocked: {} s in all, data from {} ms, on TCP after {} s more; {}",
                v["seconds"], v["first_data_ms"], v["fallback_seconds"], v["bytes_by_path"]
            );
            assert_eq!(v["path"], "relayed", "{v}\n{}", s.stderr);
            assert_eq!(v["transport"], "tcp", "{v}\n{}", s.stderr);
            assert_eq!(v["direct_channels"], 0, "{v}\n{}", s.stderr);
            let by_path = &v["bytes_by_path"];
            assert_eq!(by_path["direct"], 0, "{v}");
            // Nearly all of it through the splice (the sender counts per batch what each path
            // took, and a batch counted while the channels moved may land on the UDP side:
            // 1 run in 6 counted a few KB under the file's size here).
            assert!(
                by_path["relay_tcp"].as_u64().expect("relay_tcp") * 100 >= size * 99,
                "{v}"
            );
            // The receiver's count: all of it came over the TCP connections the relay spliced.
            let got = r_done.json();
            let by_path = &got["bytes_by_path"];
            assert_eq!(
                (&by_path["direct"], &by_path["relay_udp"]),
                (&0.into(), &0.into()),
                "{got}"
            );
            assert!(
                by_path["relay_tcp"].as_u64().expect("relay_tcp") > size,
                "{got}"
            );
        } else {
            // "sent 12.0 MiB ... over 2 tcp connections", and where they went.
            assert!(s.stdout.contains(" tcp connections"), "{}", s.stdout);
            let path = s
                .stdout
                .lines()
                .find(|l| l.starts_with("path: ") && l.contains(" MiB"))
                .unwrap_or_else(|| panic!("no path line in\n{}", s.stdout));
            assert!(path.contains("relayed over TCP 12."), "{path}");
            assert!(!path.contains("direct"), "{path}");
            // The receiver's summary says so too.
            let path = r_done
                .stdout
                .lines()
                .find(|l| l.starts_with("path: ") && l.contains(" MiB"))
                .unwrap_or_else(|| panic!("no path line in\n{}", r_done.stdout));
            assert!(path.contains("relayed over TCP 12."), "{path}");
        }
        // The file's bytes crossed the relay's TCP splices.
        let deadline = Instant::now() + Duration::from_secs(10);
        let spliced = loop {
            let spliced: u64 = splice_bytes(&relay.proc.stderr()).iter().sum();
            if spliced > size || Instant::now() > deadline {
                break spliced;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(
            spliced > size,
            "{spliced} bytes spliced\n{}",
            relay.proc.stderr()
        );
    }
    drop(ns);
}

/// The share of the bytes a sender's channels sent that went direct, from its `--json`
/// (`bytes_by_path`); the bytes that went through the relay as datagrams, and over TCP.
fn direct_share(v: &serde_json::Value) -> (f64, u64, u64) {
    let by = &v["bytes_by_path"];
    let n = |k: &str| by[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"));
    let (direct, udp, tcp) = (n("direct"), n("relay_udp"), n("relay_tcp"));
    (direct as f64 / (direct + udp + tcp).max(1) as f64, udp, tcp)
}
