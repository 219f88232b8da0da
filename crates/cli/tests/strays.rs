//! End-to-end tests of the receiver's front door (`hurtle_engine::receive::accept`):
//! connections that are not a hurtle sender's (port scanners, HTTP clients, garbage, silence)
//! are dropped and logged, and neither end nor stall a waiting receiver.
//!
//! - a one-shot receiver gets 100 stray connections, some still open when the real sender
//!   comes, and then receives the real transfer and exits 0; its log accounts for them;
//! - a `--serve` receiver holding 20 silent connections serves a real sender at once;
//! - a flood of 200 strays is a few lines on the receiver's stderr (the first 10 of a window,
//!   then one summary per 10 s), whose numbers add up to the 160 that sent something; wrong
//!   codes get a line each;
//! - one address renewing 32 silent connections as fast as they close holds at most its share
//!   of a `--serve` receiver's door (8 of 32): a real sender from another address gets in at
//!   once, and a connection refused for want of room hears "busy: ...";
//! - a sender refused for want of room says "the receiver is busy" (exit 4), not that the
//!   peer closed the connection;
//! - running out of descriptors at `accept` is said once and does not end a one-shot receiver.
//!
//! Connections that are meant to be held come from addresses of their own (127.0.B.N, all this
//! host's), so that the bound per address is not what turns them away.
//!
//! A connection closed before it sent a byte (what a sender's losing connect attempt looks like)
//! is taken quietly: dropped, but neither counted nor given a line on stderr.
//!
//! A stray is known to be dropped when the receiver closes it: it is counted and logged (or
//! counted for a summary) before it is closed. The log is read as individual lines ("stray
//! connection from ...") plus the numbers of summary lines ("... and 457 more stray
//! connections dropped in the last 10 s ...").

#[allow(dead_code)] // shared with the other test binaries
mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use support::peer::read_frame_within;
use support::proc::{self, start_receiver, ReceiverProc};
use support::{fsx, Rng, TRANSFER_TIMEOUT};

/// The number a summary line says ("... and 457 more stray connections dropped ..."), if the
/// line is one.
fn summarised(line: &str) -> Option<u64> {
    let (_, rest) = line.split_once("... and ")?;
    let (n, rest) = rest.split_once(" more stray connection")?;
    assert!(rest.contains(" dropped in the last "), "{line}");
    Some(
        n.parse()
            .unwrap_or_else(|_| panic!("a summary without its number: {line}")),
    )
}

/// Strays a receiver's stderr accounts for: a line each, and each summary's number.
fn logged_strays(stderr: &str) -> u64 {
    stderr
        .lines()
        .map(|l| {
            if l.contains("stray connection from ") {
                1
            } else {
                summarised(l).unwrap_or(0)
            }
        })
        .sum()
}

/// Waits until the receiver's log accounts for at least `n` dropped stray connections, within
/// `timeout`; returns how many it accounts for.
fn wait_logged(r: &mut ReceiverProc, n: u64, timeout: Duration) -> u64 {
    r.proc
        .wait_for_output(&format!("{n} dropped strays"), timeout, |_, e| {
            let count = logged_strays(e);
            (count >= n).then_some(count)
        })
}

/// Waits for the receiver to close `s`, i.e. to drop it as a stray (counted and logged first).
fn wait_dropped(mut s: TcpStream) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            // A `Reject`, say: read on to the close.
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
                ) =>
            {
                return
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("the receiver did not drop a stray within 10 s: {e}"),
        }
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connect to the receiver at {addr}: {e}"))
}

/// A connection to `addr` from `from` (any address of 127/8 is this host's: each is a source
/// of its own to the receiver's door, which lets one source hold only a share of it).
fn connect_from(from: IpAddr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.bind(&SocketAddr::new(from, 0).into())?;
    s.connect_timeout(&addr.into(), Duration::from_secs(5))?;
    Ok(s.into())
}

/// The `n`th address of the loopback block `127.0.B.0/24`.
fn loopback(b: u8, n: usize) -> IpAddr {
    IpAddr::from([127, 0, b, 1 + (n % 250) as u8])
}

/// Whether the receiver still holds `s` open: nothing to read, and no end of stream.
fn still_open(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 1];
    let open = matches!((&*s).read(&mut buf), Err(e) if e.kind() == ErrorKind::WouldBlock);
    s.set_nonblocking(false).unwrap();
    open
}

#[test]
fn a_one_shot_receiver_outlasts_100_strays_and_receives_the_real_sender() {
    let t = support::tempdir("hurtle-strays-");
    let src = t.path().join("real.bin");
    fsx::write_random(&src, 3 << 20, 4100);
    let r = start_receiver(&t.path().join("out"), &["--json"]);
    let mut rng = Rng::new(4101);
    let mut silent = Vec::new();
    let mut spoke = Vec::new();
    let mut dropped = 0;
    for i in 0..100 {
        // Four at a time, the three that spoke dropped before the next four: the silent ones
        // alone stay in their greeting, never more at once than the receiver greets (32).
        if i % 4 == 0 {
            dropped += spoke.len();
            spoke.drain(..).for_each(wait_dropped);
        }
        if i % 4 == 3 {
            // Silent: connects and says nothing, each from an address of its own (one
            // address holds no more than a share of the door).
            silent.push(connect_from(loopback(5, i), r.addr).unwrap());
            continue;
        }
        let mut s = connect(r.addr);
        // A peer the receiver already closed may see its write fail: that is fine.
        let _ = match i % 4 {
            // Garbage behind a plausible length prefix.
            0 => {
                let mut junk = vec![0u8; 64];
                rng.fill(&mut junk);
                junk[..4].copy_from_slice(&60u32.to_be_bytes());
                s.write_all(&junk)
            }
            1 => s.write_all(b"GET / HTTP/1.1\r\nHost: hurtle\r\nAccept: */*\r\n\r\n"),
            _ => s.write_all(&[0xff; 4]),
        };
        spoke.push(s);
    }
    // 75 strays that spoke are dropped at once; then 15 of the 25 silent ones give up, closed
    // without a word (as a sender's losing connect attempt is): taken quietly.
    dropped += spoke.len();
    spoke.drain(..).for_each(wait_dropped);
    assert_eq!(dropped, 75);
    std::thread::sleep(Duration::from_millis(300));
    let still: Vec<TcpStream> = silent.split_off(15);
    for s in silent {
        s.shutdown(Shutdown::Write).unwrap();
        wait_dropped(s);
    }
    // The real sender comes while 10 silent connections are still open: 75 dropped, 15 left
    // quietly, and the 10 not yet.
    assert!(
        still.iter().all(still_open),
        "closed before their grace time"
    );
    let s = proc::send(r.addr, &[&src], &[]);
    s.assert_success();
    let done = r.proc.wait(TRANSFER_TIMEOUT);
    done.assert_success();
    fsx::assert_same_file(&src, &t.path().join("out/real.bin"));
    fsx::assert_no_part_files(&t.path().join("out"));
    let summary = done.json();
    let strays = summary["strays"].as_u64().expect("strays in --json");
    assert!((75..=85).contains(&strays), "{summary}");
    // The log accounts for every stray, those before the session before its first line (what
    // was counted for a summary is said when the session starts).
    let (before, _) = done
        .stderr
        .split_once("authenticated with")
        .unwrap_or_else(|| panic!("no session in the log:\n{}", done.stderr));
    let logged_before = logged_strays(before);
    assert!(
        (75..=strays).contains(&logged_before),
        "{logged_before} strays logged before the session, {strays} in the summary:\n{}",
        done.stderr
    );
    let logged = logged_strays(&done.stderr);
    assert!(
        (strays..=85).contains(&logged),
        "{logged} strays logged, {strays} in the summary:\n{}",
        done.stderr
    );
    assert!(
        !done.stderr.contains("closed without sending anything"),
        "a connection that left without a word was logged:\n{}",
        done.stderr
    );
    // And it took a few lines, not 75.
    let lines = done
        .stderr
        .lines()
        .filter(|l| l.contains("stray connection"))
        .count();
    assert!(
        lines <= 15,
        "{lines} lines for {logged} strays:\n{}",
        done.stderr
    );
}

#[test]
fn silent_connections_do_not_hold_up_a_sender_to_a_serving_receiver() {
    let t = support::tempdir("hurtle-strays-");
    let src = t.path().join("small.bin");
    fsx::write_random(&src, 200_000, 4200);
    let r = start_receiver(&t.path().join("out"), &["--serve"]);
    // Each from an address of its own, and each sends a byte (half a length prefix): a
    // connection that has sent something has the whole grace time (5 s), not the shorter one
    // of a connection that never spoke.
    let silent: Vec<TcpStream> = (0..20)
        .map(|i| {
            let mut s = connect_from(loopback(6, i), r.addr).unwrap();
            s.write_all(&[0]).unwrap();
            s
        })
        .collect();
    // Before the front door, each silent connection held the receiver for its 10 s handshake
    // timeout in turn. Now greetings run side by side, so the sender is greeted at once. The
    // bound is the greeting's grace time (5 s): a sender that had to wait for even one silent
    // connection to be dropped would need more than that, while the transfer itself (200 kB on
    // loopback, two process start-ups) takes well under a second even on a busy machine.
    let t0 = Instant::now();
    let s = proc::send(r.addr, &[&src], &["--json"]);
    let took = t0.elapsed();
    s.assert_success();
    assert!(
        took < Duration::from_secs(5),
        "the sender took {took:?} behind 20 silent connections"
    );
    // And it started at once: its first data left within a second of its start (the sender's
    // own clock, from its start to its first datagram: connect, key agreement, hello, manifest).
    let first = s.json()["first_data_ms"].as_f64().expect("first_data_ms");
    assert!(
        first < 1000.0,
        "the sender's first data left {first} ms after its start"
    );
    fsx::assert_same_file(&src, &t.path().join("out/small.bin"));
    assert!(
        silent.iter().all(still_open),
        "the silent connections were closed before their grace time: the test measured nothing"
    );
}

#[test]
fn a_flood_of_200_strays_is_a_few_lines_whose_numbers_add_up() {
    let t = support::tempdir("hurtle-strays-");
    let src = t.path().join("after.bin");
    fsx::write_random(&src, 200_000, 4300);
    let mut r = start_receiver(&t.path().join("out"), &["--json"]);
    let mut rng = Rng::new(4301);
    let t0 = Instant::now();
    // 200 connections, 20 at a time (the receiver greets 32 at once), each dropped before the
    // next 20 come: garbage, HTTP, a huge length prefix, an empty frame, a close without a word
    // (these 40 taken quietly: neither counted nor logged).
    for _ in 0..10 {
        let batch: Vec<TcpStream> = (0..20)
            .map(|i| {
                // Each from an address of its own: one address holds no more than a share of
                // the door.
                let mut s = connect_from(loopback(7, i), r.addr).unwrap();
                let _ = match i % 5 {
                    0 => {
                        let mut junk = vec![0u8; 64];
                        rng.fill(&mut junk);
                        junk[..4].copy_from_slice(&60u32.to_be_bytes());
                        s.write_all(&junk)
                    }
                    1 => s.write_all(b"GET / HTTP/1.1\r\nHost: hurtle\r\n\r\n"),
                    2 => s.write_all(&[0xff; 4]),
                    3 => s.write_all(&[0; 4]),
                    _ => Ok(()),
                };
                let _ = s.shutdown(Shutdown::Write);
                s
            })
            .collect();
        batch.into_iter().for_each(wait_dropped);
    }
    // Two wrong codes in the flood (a third would spend the code): a line each, always.
    for _ in 0..2 {
        proc::send(r.addr, &[&src], &["--code", "1234-acorn-bison-daisy"]).assert_exit(3);
    }
    // Nothing else happens: the window's summary comes when the window (10 s from the first
    // stray) ends, not with a next stray or a session.
    let logged = wait_logged(&mut r, 162, Duration::from_secs(30));
    assert_eq!(logged, 162, "\n{}", r.proc.stderr());
    assert!(
        t0.elapsed() >= Duration::from_secs(9),
        "summarised after {:?}, before the window ended",
        t0.elapsed()
    );
    let log = r.proc.stderr();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("stray connection"))
        .collect();
    let own: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.contains("stray connection from "))
        .collect();
    let summaries: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| summarised(l).is_some())
        .collect();
    assert_eq!(own.len() + summaries.len(), lines.len(), "{log}");
    let tries = own
        .iter()
        .filter(|l| l.contains("failed the key agreement"))
        .count();
    assert_eq!(tries, 2, "each wrong code has its line:\n{log}");
    // The first 10 strays and the two tries a line each; the 150 others in a summary or two
    // (one per 10 s while they came: about a second on loopback, a few on a busy machine).
    assert_eq!(own.len(), 12, "{log}");
    assert!((1..=3).contains(&summaries.len()), "{log}");
    for l in &summaries {
        assert!(l.contains("(last from 127.0.7."), "{l}");
    }
    // The receiver still serves, and its summary counts what the log said.
    proc::send(r.addr, &[&src], &[]).assert_success();
    let done = r.proc.wait(TRANSFER_TIMEOUT);
    done.assert_success();
    fsx::assert_same_file(&src, &t.path().join("out/after.bin"));
    assert_eq!(done.json()["strays"].as_u64(), Some(162), "{}", done.stdout);
    assert_eq!(logged_strays(&done.stderr), 162, "{}", done.stderr);
    assert!(
        !done.stderr.contains("closed without sending anything"),
        "{}",
        done.stderr
    );
}

/// The `hurtle` whose receiver the door test runs: `HURTLE_UNDER_TEST`, or this build (another
/// build is how the test was run against the door before its per-address bound, to see it
/// fail).
fn under_test() -> String {
    std::env::var("HURTLE_UNDER_TEST").unwrap_or_else(|_| proc::bin().to_owned())
}

#[test]
fn one_address_renewing_32_silent_connections_does_not_hold_the_door() {
    let t = support::tempdir("hurtle-strays-");
    let src = t.path().join("real.bin");
    fsx::write_random(&src, 200_000, 4400);
    let out = t.path().join("out");
    let mut r = {
        let args = [
            "receive",
            "--listen",
            "127.0.0.1:0",
            "--out",
            out.to_str().unwrap(),
            "--serve",
        ];
        let mut p = proc::Proc::spawn_program("receiver", &under_test(), &args);
        let addr: SocketAddr = p.wait_for_output("its address", Duration::from_secs(10), |o, e| {
            o.lines().chain(e.lines()).find_map(|l| {
                let rest = l.strip_prefix("hurtle: listening on ")?;
                rest.split(',').next()?.trim().parse().ok()
            })
        });
        (p, addr)
    };
    let addr = r.1;
    // The attacker: 32 connections from 127.0.0.2 that say nothing, each renewed as soon as
    // the receiver closes it, for as long as the test runs (30 s at most). What a refused one
    // is told is kept.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attacker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let from = IpAddr::from([127, 0, 0, 2]);
            let mut held: Vec<Option<TcpStream>> = (0..32).map(|_| None).collect();
            let mut told = Vec::new();
            let (mut opened, t0) = (0u64, Instant::now());
            while !stop.load(std::sync::atomic::Ordering::Relaxed)
                && t0.elapsed() < Duration::from_secs(30)
            {
                for slot in held.iter_mut() {
                    let closed = match slot {
                        None => true,
                        Some(s) => {
                            s.set_nonblocking(true).unwrap();
                            let mut b = [0u8; 512];
                            match (&*s).read(&mut b) {
                                Err(e) if e.kind() == ErrorKind::WouldBlock => false,
                                Ok(n) if n > 0 => {
                                    // The receiver said something: read it as a frame.
                                    s.set_nonblocking(false).unwrap();
                                    let mut all = b[..n].to_vec();
                                    let _ = s.read_to_end(&mut all);
                                    if all.len() >= 4 {
                                        let body = &all[4..];
                                        if let Ok(hurtle_proto::wire::Control::Reject { reason }) =
                                            hurtle_proto::wire::Control::from_body(body)
                                        {
                                            told.push(reason);
                                        }
                                    }
                                    true
                                }
                                _ => true,
                            }
                        }
                    };
                    if closed {
                        *slot = connect_from(from, addr).ok();
                        opened += 1;
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            (opened, told)
        })
    };
    // The attack is under way: the door is as full as one address can make it.
    std::thread::sleep(Duration::from_secs(1));
    // A refused connection from that address hears why.
    let mut refused = None;
    for _ in 0..50 {
        let mut c = connect_from(IpAddr::from([127, 0, 0, 2]), addr).unwrap();
        if let Some(hurtle_proto::wire::Control::Reject { reason }) =
            read_frame_within(&mut c, Duration::from_millis(200))
        {
            refused = Some(reason);
            break;
        }
    }
    // The real sender from 127.0.0.1 gets in within a few seconds (on loopback the transfer
    // itself takes well under one).
    let t0 = Instant::now();
    let s = proc::send(addr, &[&src], &[]);
    let took = t0.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (opened, told) = attacker.join().unwrap();
    eprintln!("the attacker opened {opened} connections; the sender took {took:?}");
    s.assert_success();
    assert!(took < Duration::from_secs(5), "the sender took {took:?}");
    fsx::assert_same_file(&src, &out.join("real.bin"));
    let refused = refused.expect("no connection from the attacker's address was told anything");
    assert!(refused.starts_with("busy: "), "{refused}");
    assert!(refused.contains("your address"), "{refused}");
    assert!(told.iter().all(|t| t.starts_with("busy: ")), "{told:?}");
    assert!(r.0.is_running(), "the attack ended the receiver");
    r.0.kill();
}

#[test]
fn a_sender_refused_for_want_of_room_is_told_the_receiver_is_busy() {
    let t = support::tempdir("hurtle-strays-");
    let src = t.path().join("x.bin");
    fsx::write_random(&src, 10_000, 4500);
    let r = start_receiver(&t.path().join("out"), &["--serve"]);
    // Eight connections from 127.0.0.1 that say something and then nothing (so the whole
    // grace time): all the door gives one address.
    let _held: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut s = connect(r.addr);
            s.write_all(&[0]).unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let s = proc::send(r.addr, &[&src], &[]);
    let why = s.assert_exit(4);
    assert!(why.contains("the receiver is busy"), "{why}");
    assert!(!why.contains("closed the control connection"), "{why}");
}

#[test]
fn running_out_of_descriptors_at_accept_does_not_end_a_receiver() {
    let t = support::tempdir("hurtle-strays-");
    let src = t.path().join("late.bin");
    fsx::write_random(&src, 100_000, 4600);
    let out = t.path().join("out");
    // A one-shot receiver under a hard limit of 30 descriptors (so it cannot raise it), and 60
    // silent connections from addresses of their own: the greetings take what descriptors are
    // left, and `accept` fails for want of one.
    let script = "ulimit -n 30 && exec \"$0\" \"$@\"";
    let bin = under_test();
    let args = [
        "-c",
        script,
        bin.as_str(),
        "receive",
        "--listen",
        "127.0.0.1:0",
        "--out",
        out.to_str().unwrap(),
    ];
    let mut p = proc::Proc::spawn_program("receiver", "sh", &args);
    let addr: SocketAddr = p.wait_for_output("its address", Duration::from_secs(10), |o, e| {
        o.lines().chain(e.lines()).find_map(|l| {
            let rest = l.strip_prefix("hurtle: listening on ")?;
            rest.split(',').next()?.trim().parse().ok()
        })
    });
    let silent: Vec<TcpStream> = (0..60)
        .filter_map(|i| connect_from(loopback(8, i), addr).ok())
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        p.is_running(),
        "the receiver ended when accept failed:\n{}",
        p.stderr()
    );
    // It did run out (so the test tested something), and said so once.
    let said = p.stderr();
    assert_eq!(
        said.matches("cannot accept connections").count(),
        1,
        "{said}"
    );
    // The silent ones go; the real sender gets in.
    drop(silent);
    let s = proc::send(addr, &[&src], &[]);
    s.assert_success();
    p.wait(TRANSFER_TIMEOUT).assert_success();
    fsx::assert_same_file(&src, &out.join("late.bin"));
}
