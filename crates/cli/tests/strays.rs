//! End-to-end tests of the receiver's front door (`hurtle_engine::receive::accept`):
//! connections that are not a hurtle sender's (port scanners, HTTP clients, garbage, silence)
//! are dropped and logged, and neither end nor stall a waiting receiver.
//!
//! - a one-shot receiver gets 100 stray connections, some still open when the real sender
//!   comes, and then receives the real transfer and exits 0;
//! - a `--serve` receiver holding 20 silent connections serves a real sender at once.

#[allow(dead_code)] // shared with the other test binaries
mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use support::proc::{self, start_receiver, ReceiverProc};
use support::{fsx, Rng, TRANSFER_TIMEOUT};

/// Waits until the receiver has logged at least `n` dropped stray connections.
fn wait_strays(r: &mut ReceiverProc, n: usize) -> usize {
    r.proc.wait_for_output(
        &format!("{n} dropped strays"),
        Duration::from_secs(30),
        |_, e| {
            let count = e
                .lines()
                .filter(|l| l.contains("stray connection from "))
                .count();
            (count >= n).then_some(count)
        },
    )
}

fn connect(addr: SocketAddr) -> TcpStream {
    TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connect to the receiver at {addr}: {e}"))
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
    let mut r = start_receiver(&t.path().join("out"), &["--json"]);
    let mut rng = Rng::new(4101);
    let mut silent = Vec::new();
    let mut spoke = 0;
    for i in 0..100 {
        // Four at a time, the three that spoke dropped before the next four: the silent ones
        // alone stay in their greeting, never more at once than the receiver greets (32).
        if i % 4 == 0 && spoke > 0 {
            wait_strays(&mut r, spoke);
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
            2 => s.write_all(&[0xff; 4]),
            // Silent: connects and says nothing.
            _ => {
                silent.push(s);
                continue;
            }
        };
        spoke += 1;
    }
    // 75 strays that spoke are dropped at once; then 15 of the 25 silent ones give up.
    assert_eq!(wait_strays(&mut r, 75), 75);
    std::thread::sleep(Duration::from_millis(300));
    let still: Vec<TcpStream> = silent.split_off(15);
    drop(silent);
    assert_eq!(
        wait_strays(&mut r, 90),
        90,
        "the 10 silent ones are not dropped yet"
    );
    // The real sender comes while 10 silent connections are still open.
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
    assert!((90..=100).contains(&strays), "{summary}");
}

#[test]
fn silent_connections_do_not_hold_up_a_sender_to_a_serving_receiver() {
    let t = support::tempdir("hurtle-strays-");
    let src = t.path().join("small.bin");
    fsx::write_random(&src, 200_000, 4200);
    let r = start_receiver(&t.path().join("out"), &["--serve"]);
    let silent: Vec<TcpStream> = (0..20).map(|_| connect(r.addr)).collect();
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
