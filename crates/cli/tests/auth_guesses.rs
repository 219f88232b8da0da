//! End-to-end tests of a code's budget of guesses (`hurtle_proto::guesses`, charged by the
//! engine's `handshake::answer`), and of what a failed guess leaves behind:
//!
//! - 32 guessers with 32 different wrong codes, from 32 addresses, started at one instant, each holding its
//!   connection open after the receiver's answer (as a proxy that keeps failed guessers'
//!   connections open does): at most 3 of them are answered (the answer is what lets a guesser
//!   test its code); the others are told the code's tries are under way, or that it is
//!   spent; the code ends spent (receiver exit 3, "tried 3 times"), and the right code then
//!   delivers nothing;
//! - two wrong guesses held open do not keep the right code out: it takes the third slot;
//! - a guess held open after the answer finds no data socket, listener or part file opened
//!   for it: the receiver's sockets are those it had before (the data path it opened ahead of
//!   any sender, lent to the guess and given back), and more are opened only for a sender that
//!   proved the code.
//!
//! Guessers run the real key agreement (`hurtle_proto::secure::Offer`) over the real
//! receiver's control port, so that "answered" means what an attacker gets: the receiver's
//! `Agree`, whose confirmation tells a right guess from a wrong one.
//!
//! `HURTLE_UNDER_TEST` names another build of `hurtle` to run the receiver from (that is how
//! these tests were run against the build before the budget, to see them fail).

#[allow(dead_code)] // shared with the other test binaries
mod support;

use hurtle_proto::secure::{Offer, Secret};
use hurtle_proto::wire::Control;
use std::collections::HashSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use support::peer::read_frame;
use support::proc::{self, Proc};
use support::{fsx, TRANSFER_TIMEOUT};

const RIGHT: &str = support::TEST_CODE;

/// The `hurtle` whose receiver is tested.
fn under_test() -> String {
    std::env::var("HURTLE_UNDER_TEST").unwrap_or_else(|_| proc::bin().to_owned())
}

/// `hurtle receive --listen 127.0.0.1:0 --out OUT --code RIGHT EXTRA...`, and its address.
fn receiver(out: &Path, extra: &[&str]) -> (Proc, SocketAddr) {
    let mut args = vec![
        "receive",
        "--listen",
        "127.0.0.1:0",
        "--out",
        out.to_str().unwrap(),
        "--code",
        RIGHT,
    ];
    args.extend_from_slice(extra);
    let mut p = Proc::spawn_program("receiver", &under_test(), &args);
    let addr = p.wait_for_output("its address", Duration::from_secs(10), |o, e| {
        o.lines().chain(e.lines()).find_map(|l| {
            let rest = l.strip_prefix("hurtle: listening on ")?;
            rest.split(',').next()?.trim().parse().ok()
        })
    });
    (p, addr)
}

/// What a guess got from the receiver.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Heard {
    /// The agreement's answer: the guess could be tested (and was wrong).
    Answered,
    /// A `Reject` with this reason.
    Rejected(String),
    /// Nothing: the connection closed or failed first.
    Nothing,
}

/// A connection to `addr` from `from` (any loopback address: each is a source of its own to
/// the receiver's door).
fn connect_from(from: std::net::IpAddr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.bind(&SocketAddr::new(from, 0).into())?;
    s.connect_timeout(&addr.into(), Duration::from_secs(5))?;
    Ok(s.into())
}

/// Offers `code` to the receiver at `addr` from 127.0.0.1 and reads its first frame; the
/// connection is returned open, to hold.
fn guess(addr: SocketAddr, code: &str) -> (Heard, Option<TcpStream>) {
    guess_from([127, 0, 0, 1].into(), addr, code)
}

/// [`guess`] from `from`.
fn guess_from(from: std::net::IpAddr, addr: SocketAddr, code: &str) -> (Heard, Option<TcpStream>) {
    let Ok(mut s) = connect_from(from, addr) else {
        return (Heard::Nothing, None);
    };
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let hello = Control::hello(0, 1, hurtle_proto::wire::DEFAULT_PAYLOAD, 1 << 20, 7);
    let (offer, first) = Offer::new(&Secret::code(code), false, &hello);
    let mut flight = first.to_frame();
    flight.extend_from_slice(&hello.to_frame());
    if s.write_all(&flight).is_err() {
        return (Heard::Nothing, None);
    }
    let heard = match read_frame(&mut s) {
        Some(Control::Reject { reason }) => Heard::Rejected(reason),
        Some(reply @ Control::Agree { .. }) => {
            // The answer tests the guess: a wrong one fails the confirmation.
            assert!(offer.finish(reply).is_err(), "a wrong code was confirmed");
            Heard::Answered
        }
        _ => Heard::Nothing,
    };
    (heard, Some(s))
}

/// Holds `s` open, sending nothing, until the receiver closes it (at most `limit`).
fn hold(mut s: TcpStream, limit: Duration) {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 256];
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return,
            Err(_) => return,
        }
    }
}

#[test]
fn thirty_two_wrong_codes_at_once_held_open_get_at_most_three_answers_and_spend_the_code() {
    let t = support::tempdir("hurtle-guesses-");
    let out = t.path().join("out");
    let (r, addr) = receiver(&out, &[]);
    let start = Arc::new(Barrier::new(32));
    let guessers: Vec<_> = (0..32)
        .map(|i| {
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                // Each from an address of its own: the door's bound per address is not what
                // stops them.
                let from = [127, 0, 1, 1 + i as u8].into();
                let (heard, held) = guess_from(from, addr, &format!("{i}-wrong-guess-{i}"));
                // Held open after the answer, as the proxy of the finding did, until the
                // receiver closes it.
                if let Some(s) = held {
                    hold(s, Duration::from_secs(15));
                }
                heard
            })
        })
        .collect();
    let heard: Vec<Heard> = guessers.into_iter().map(|g| g.join().unwrap()).collect();
    let answered = heard.iter().filter(|h| **h == Heard::Answered).count();
    eprintln!("answered {answered} of 32: {heard:?}");
    assert!(
        answered <= 3,
        "{answered} wrong guesses were answered: {heard:?}"
    );
    // The others were told why: tries under way (busy), or the code spent.
    for h in &heard {
        if let Heard::Rejected(reason) = h {
            assert!(
                reason.contains("under way") || reason.contains("spent"),
                "{reason}"
            );
        }
    }
    // The code is spent: the receiver ends, as documented, and the right code then delivers
    // nothing.
    let ended = r.wait(Duration::from_secs(15));
    assert!(
        ended.assert_exit(3).contains("tried 3 times"),
        "{}",
        ended.stderr
    );
    let src = t.path().join("late.bin");
    fsx::write_random(&src, 10_000, 61);
    let s = proc::send(addr, &[&src], &["--code", RIGHT]);
    assert_ne!(s.status.code(), Some(0), "{}", s.stderr);
    assert!(
        std::fs::read_dir(&out).map_or(true, |mut d| d.next().is_none()),
        "something was written"
    );
}

#[test]
fn two_wrong_guesses_held_open_leave_the_right_code_its_try() {
    let t = support::tempdir("hurtle-guesses-");
    let out = t.path().join("out");
    let (r, addr) = receiver(&out, &[]);
    let held: Vec<TcpStream> = (0..2)
        .map(|i| {
            let (heard, s) = guess(addr, &format!("{i}-wrong-guess-{i}"));
            assert_eq!(heard, Heard::Answered);
            s.unwrap()
        })
        .collect();
    let src = t.path().join("right.bin");
    fsx::write_random(&src, 200_000, 62);
    proc::send(addr, &[&src], &["--code", RIGHT]).assert_success();
    r.wait(TRANSFER_TIMEOUT).assert_success();
    fsx::assert_same_file(&src, &out.join("right.bin"));
    drop(held);
}

/// The inodes of the sockets process `pid` holds.
fn socket_inodes(pid: u32) -> HashSet<u64> {
    let mut inodes = HashSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        if let Ok(link) = std::fs::read_link(fd.path()) {
            let link = link.to_string_lossy().into_owned();
            if let Some(n) = link
                .strip_prefix("socket:[")
                .and_then(|r| r.strip_suffix(']'))
            {
                inodes.insert(n.parse().unwrap());
            }
        }
    }
    inodes
}

/// Of process `pid`'s sockets: how many are UDP, and how many listen on TCP.
fn udp_and_listening(pid: u32) -> (usize, usize) {
    let mine = socket_inodes(pid);
    // /proc/net/{udp,tcp}[6]: the 10th column is the inode, the 4th the state (0A: listen).
    let count = |tables: &[&str], listening_only: bool| -> usize {
        tables
            .iter()
            .filter_map(|t| std::fs::read_to_string(t).ok())
            .flat_map(|text| {
                text.lines()
                    .skip(1)
                    .filter_map(|l| {
                        let cols: Vec<&str> = l.split_whitespace().collect();
                        let inode: u64 = cols.get(9)?.parse().ok()?;
                        let state = *cols.get(3)?;
                        (mine.contains(&inode) && (!listening_only || state == "0A")).then_some(())
                    })
                    .collect::<Vec<_>>()
            })
            .count()
    };
    (
        count(&["/proc/net/udp", "/proc/net/udp6"], false),
        count(&["/proc/net/tcp", "/proc/net/tcp6"], true),
    )
}

#[test]
fn a_guess_held_after_the_answer_finds_no_data_socket_listener_or_part_file() {
    // The count sees a socket when there is one (this process's own, here).
    let me = std::process::id();
    let (udp, listening) = udp_and_listening(me);
    let probe = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    assert_eq!(udp_and_listening(me), (udp + 1, listening + 1));
    drop((probe, tcp));
    let t = support::tempdir("hurtle-guesses-");
    let out = t.path().join("out");
    let (mut r, addr) = receiver(&out, &["--serve"]);
    let pid = r.id();
    // Settled: whatever the receiver opens at its start is open.
    std::thread::sleep(Duration::from_millis(500));
    let before = udp_and_listening(pid);
    // The data path opened ahead of any sender is there already (not opened for anyone):
    // UDP sockets, and a TCP listener beside the control port's.
    assert!(
        before.0 > 0 && before.1 > 1,
        "(UDP sockets, TCP listeners) {before:?}: no data path opened ahead"
    );
    let (heard, held) = guess(addr, "9-wrong-guess-9");
    assert_eq!(heard, Heard::Answered);
    // The answer is out; the guess is held where the old receiver had its data path open.
    std::thread::sleep(Duration::from_millis(300));
    let during = udp_and_listening(pid);
    assert_eq!(
        during, before,
        "(UDP sockets, TCP listeners) opened for a stranger's guess"
    );
    drop(held);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(udp_and_listening(pid), before);
    assert!(
        std::fs::read_dir(&out).map_or(true, |mut d| d.next().is_none()),
        "a file was made for a stranger"
    );
    // A sender with the code gets its data path.
    let src = t.path().join("ok.bin");
    fsx::write_random(&src, 100_000, 63);
    proc::send(addr, &[&src], &["--code", RIGHT]).assert_success();
    fsx::assert_same_file(&src, &out.join("ok.bin"));
    assert!(r.is_running());
    r.kill();
}
