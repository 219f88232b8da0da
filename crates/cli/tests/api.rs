//! The library API end to end on loopback: the four examples run (the send and receive ones
//! against each other, the progress and cancel ones on their own), and the API's behaviour a
//! program relies on: a wrong code's error kind, a cancelled receiver that is still waiting,
//! the events of a transfer, a resume.

use hurtle::{ErrorKind, Event, Phase, Receiver, Sender, Waiting};
use std::net::SocketAddr;
use std::time::Duration;

#[allow(dead_code)]
#[path = "../examples/cancel.rs"]
mod cancel_example;
#[allow(dead_code)]
#[path = "../examples/progress.rs"]
mod progress_example;
#[allow(dead_code)]
#[path = "../examples/receive.rs"]
mod receive_example;
#[allow(dead_code)]
#[path = "../examples/send.rs"]
mod send_example;

/// A receiver on loopback with a new code, receiving into `out`.
fn on_loopback(out: std::path::PathBuf) -> Receiver {
    Receiver::builder()
        .out(out)
        .listen("127.0.0.1:0")
        .build()
        .unwrap()
}

/// A sender to `receiver`, with its code, starting cold.
fn to(receiver: &Receiver) -> hurtle::SenderBuilder {
    Sender::builder()
        .to(receiver.local_addr())
        .code(receiver.code().unwrap())
        .cold_start(true)
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_send_and_receive_examples_move_files_between_them() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("a.txt"), b"hello").unwrap();
    std::fs::write(src.join("sub/b.bin"), vec![9u8; 3 << 20]).unwrap();
    let out = dir.path().join("out");
    let (tx, rx) = std::sync::mpsc::channel();
    let args = strings(&[
        "--out",
        out.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--code",
        "15-acid-acorn-actor",
    ]);
    let receiving = std::thread::spawn(move || {
        receive_example::run(args, |r| tx.send(r.local_addr()).unwrap())
    });
    let addr = rx.recv_timeout(Duration::from_secs(10)).expect("listening");
    let sent = send_example::run(strings(&[
        "--to",
        &addr.to_string(),
        "--code",
        "15-acid-acorn-actor",
        src.to_str().unwrap(),
    ]))
    .expect("sent");
    let received = receiving.join().unwrap().expect("received");
    assert_eq!((sent.files, received.files), (2, 2));
    assert_eq!(sent.bytes, 5 + (3 << 20));
    assert_eq!(
        std::fs::read(out.join("src/sub/b.bin")).unwrap(),
        vec![9u8; 3 << 20]
    );
    assert_eq!(std::fs::read(out.join("src/a.txt")).unwrap(), b"hello");
}

#[test]
fn the_progress_example_moves_its_file_and_follows_it() {
    let summary = progress_example::run(8, false).expect("the progress example");
    assert_eq!(summary.bytes, 8 << 20);
}

#[test]
fn the_cancel_example_keeps_what_was_verified_and_resumes_from_it() {
    let (kept, resumed) = cancel_example::run(48).expect("the cancel example");
    assert!(kept > 0, "something was kept at the cancel");
    // What was confirmed at the cancel is kept, less the blocks still being written then (at
    // most one 1 MiB block per channel, 8 channels at most).
    assert!(
        resumed > 0 && resumed + (8 << 20) >= kept,
        "the second transfer resumed {resumed} of the {kept} kept"
    );
}

#[test]
fn a_wrong_code_is_refused_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"x").unwrap();
    let receiver = Receiver::builder()
        .out(dir.path().join("out"))
        .listen("127.0.0.1:0")
        .code("21-acid-acorn-actor")
        .build()
        .unwrap();
    let receiving = receiver.receive().unwrap();
    let e = Sender::builder()
        .to(receiver.local_addr())
        .code("21-acid-acorn-adobe")
        .cold_start(true)
        .build()
        .unwrap()
        .send([dir.path().join("f")])
        .unwrap()
        .wait()
        .expect_err("a wrong code");
    assert_eq!(e.kind(), ErrorKind::Refused, "{e}");
    assert_eq!(e.exit_code(), 3);
    // The receiver keeps waiting (one try of three spent); a cancel ends it at once.
    assert!(!receiving.wait_timeout(Duration::from_millis(300)));
    receiving.cancel();
    assert!(
        receiving.wait_timeout(Duration::from_secs(2)),
        "a cancel ends a receiver waiting for its sender at once"
    );
    let e = receiving.wait().expect_err("cancelled");
    assert_eq!(e.kind(), ErrorKind::Interrupted, "{e}");
    assert!(!dir.path().join("out/f").exists());
}

#[test]
fn a_receiver_cancelled_from_another_thread_stops_waiting_and_receives_again() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), vec![5u8; 100_000]).unwrap();
    let receiver = on_loopback(dir.path().join("out"));
    let receiving = receiver.receive().unwrap();
    let canceller = receiving.canceller();
    let cancelling = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        // What a signal handler looks at before it cancels: still waiting, nothing to keep.
        assert_eq!(canceller.phase(), Phase::Waiting);
        let s = canceller.snapshot();
        assert_eq!((s.phase, s.total, s.sent), (Phase::Waiting, 0, 0));
        canceller.cancel();
        std::time::Instant::now()
    });
    assert!(
        receiving.wait_timeout(Duration::from_secs(5)),
        "the cancelled receiver still waits"
    );
    let e = receiving.wait().expect_err("cancelled while waiting");
    let waited = cancelling.join().unwrap().elapsed();
    eprintln!("the waiting receiver ended {waited:?} after the cancel");
    assert_eq!(e.kind(), ErrorKind::Interrupted, "{e}");
    assert!(
        waited < Duration::from_secs(2),
        "ended {waited:?} after the cancel"
    );
    // The waiting thread has ended: the same receiver takes the next sender.
    let again = receiver
        .receive()
        .expect("the cancelled wait no longer holds the receiver");
    let sent = to(&receiver)
        .build()
        .unwrap()
        .send([dir.path().join("f")])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(
        (sent.bytes, again.wait().unwrap().bytes),
        (100_000, 100_000)
    );
}

#[test]
fn events_say_the_phases_the_files_and_the_bytes() {
    let dir = tempfile::tempdir().unwrap();
    for (name, size) in [("one", 2 << 20), ("two", 1 << 20)] {
        std::fs::write(dir.path().join(name), vec![1u8; size]).unwrap();
    }
    let receiver = on_loopback(dir.path().join("out"));
    let receiving = receiver.receive().unwrap();
    let sending = to(&receiver)
        .progress_interval(Duration::from_millis(20))
        .build()
        .unwrap()
        .send([dir.path().join("one"), dir.path().join("two")])
        .unwrap();
    let events: Vec<Event> = sending.iter().collect();
    let summary = sending.wait().unwrap();
    receiving.wait().unwrap();
    assert!(events.contains(&Event::Phase(Phase::Moving)), "{events:?}");
    assert!(events.contains(&Event::FileDone { done: 2 }), "{events:?}");
    let Some(Event::Progress(last)) = events
        .iter()
        .rev()
        .find(|e| matches!(e, Event::Progress(_)))
    else {
        panic!("no progress event: {events:?}");
    };
    assert_eq!((last.total, last.confirmed), (summary.bytes, summary.bytes));
    assert_eq!(last.files_done, 2);
    // What the command's progress line shows is in the snapshots too: the phase, the peer,
    // the files moving.
    assert_eq!(last.phase, Phase::Moving);
    assert_eq!(last.peer, Some(receiver.local_addr()));
    assert!(
        last.moving_since.is_some() && last.path.is_none(),
        "{last:?}"
    );
    let moving: Vec<&String> = events
        .iter()
        .filter_map(|e| match e {
            Event::Progress(s) => Some(&s.moving),
            _ => None,
        })
        .flatten()
        .collect();
    assert!(
        moving.iter().any(|f| f.as_str() == "one"),
        "no snapshot named the file moving: {events:?}"
    );
}

/// A relay on loopback, in this process, for as long as the test runs.
fn loopback_relay() -> SocketAddr {
    let relay = hurtle_relay::server::Server::bind(
        "127.0.0.1:0".parse().unwrap(),
        hurtle_relay::server::Config::default(),
    )
    .unwrap();
    let relay_addr = relay.local_addr().unwrap();
    std::thread::spawn(move || relay.run());
    relay_addr
}

/// A sender that starts first at `relay`, offering a code, sending `file`.
fn offering(relay: SocketAddr, file: std::path::PathBuf) -> hurtle::Transfer<hurtle::SendSummary> {
    Sender::builder()
        .relay(relay)
        .cold_start(true)
        .build()
        .unwrap()
        .send([file])
        .unwrap()
}

/// A receiver on loopback answering, at `relay`, the sender that printed `code`.
fn answering(relay: SocketAddr, code: &str, out: std::path::PathBuf) -> hurtle::ReceiverBuilder {
    Receiver::builder()
        .out(out)
        .listen("127.0.0.1:0")
        .relay(relay)
        .sender_code(code)
}

#[test]
fn a_sender_waiting_for_its_receiver_to_listen_says_so() {
    // A port nothing listens on.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"x").unwrap();
    let sending = Sender::builder()
        .to(addr)
        .code("7-acid-acorn")
        .wait(Duration::from_secs(1))
        .cold_start(true)
        .build()
        .unwrap()
        .send([dir.path().join("f")])
        .unwrap();
    let events: Vec<Event> = sending.iter().collect();
    let e = sending.wait().expect_err("nothing listens");
    assert_eq!(e.kind(), ErrorKind::Network, "{e}");
    assert!(
        events.contains(&Event::Waiting(Waiting::Listener {
            addr,
            up_to: Duration::from_secs(1)
        })),
        "{events:?}"
    );
}

#[test]
fn a_sender_first_offers_a_code_and_the_receiver_given_it_receives() {
    let relay = loopback_relay();
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 241) as u8).collect();
    std::fs::write(dir.path().join("first.bin"), &data).unwrap();
    let sending = offering(relay, dir.path().join("first.bin"));
    let code = sending.code().expect("the offered code").to_string();
    let first = sending
        .events()
        .recv_timeout(Duration::from_secs(5))
        .unwrap();
    assert!(
        matches!(&first, Event::Waiting(Waiting::Receiver { code: c, valid }) if *c == code && !valid.is_zero()),
        "{first:?}"
    );
    let receiver = answering(relay, &code, dir.path().join("out"))
        .build()
        .unwrap();
    assert_eq!(receiver.code(), Some(code.as_str()));
    let received = receiver.receive().unwrap().wait().unwrap();
    let events: Vec<Event> = sending.iter().collect();
    let sent = sending.wait().unwrap();
    assert_eq!((sent.bytes, received.bytes), (1 << 20, 1 << 20));
    assert_eq!(
        std::fs::read(dir.path().join("out/first.bin")).unwrap(),
        data
    );
    assert!(
        events.iter().any(|e| matches!(e, Event::Found { .. })),
        "{events:?}"
    );
    // The code is spent: another receiver given it finds no sender.
    let e = answering(relay, &code, dir.path().join("out"))
        .build()
        .expect_err("a spent code");
    assert_eq!(e.kind(), ErrorKind::Other, "{e}");
    assert!(e.to_string().contains("no sender is waiting"), "{e}");
}

#[test]
fn a_receiver_with_another_code_is_refused_and_the_sender_waits_on_until_cancelled() {
    let relay = loopback_relay();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"secret").unwrap();
    let sending = offering(relay, dir.path().join("f"));
    let code = sending.code().unwrap().to_string();
    // The same number (the offer's nameplate), other words.
    let (number, words) = code.split_once('-').unwrap();
    let other = ["acid-acorn", "acorn-acid"]
        .into_iter()
        .find(|w| *w != words)
        .unwrap();
    // The `Receiver` is dropped at once: its transfer keeps its registration at the relay.
    let receiving = answering(relay, &format!("{number}-{other}"), dir.path().join("out"))
        .build()
        .unwrap()
        .receive()
        .unwrap();
    assert!(
        receiving.wait_timeout(Duration::from_secs(20)),
        "the receiver with another code still waits"
    );
    let e = receiving.wait().expect_err("a wrong code");
    assert_eq!(e.kind(), ErrorKind::Refused, "{e}");
    let wrong = std::iter::from_fn(|| sending.events().recv_timeout(Duration::from_secs(10)).ok())
        .find(|e| matches!(e, Event::WrongCode { .. }));
    assert_eq!(wrong, Some(Event::WrongCode { tries: 1 }));
    assert!(
        !sending.is_finished(),
        "the sender waits for the next receiver"
    );
    sending.cancel();
    assert!(sending.wait_timeout(Duration::from_secs(2)));
    let e = sending.wait().expect_err("cancelled");
    assert_eq!(e.kind(), ErrorKind::Interrupted, "{e}");
    assert!(!dir.path().join("out/f").exists());
}

#[test]
fn a_receiver_and_a_sender_pair_by_code_through_a_relay() {
    let relay_addr = loopback_relay();
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..(2u32 << 20)).map(|i| (i % 251) as u8).collect();
    std::fs::write(dir.path().join("f.bin"), &data).unwrap();
    let out = dir.path().join("out");
    for relay_only in [false, true] {
        let receiver = Receiver::builder()
            .out(&out)
            .listen("127.0.0.1:0")
            .relay(relay_addr)
            .overwrite(true)
            .build()
            .unwrap();
        let code = receiver.code().expect("the relay's code").to_string();
        let receiving = receiver.receive().unwrap();
        let sending = Sender::builder()
            .relay(relay_addr)
            .code(&code)
            .relay_only(relay_only)
            .checksum(true)
            .cold_start(true)
            .build()
            .unwrap()
            .send([dir.path().join("f.bin")])
            .unwrap();
        let events: Vec<Event> = sending.iter().collect();
        let sent = sending
            .wait()
            .unwrap_or_else(|e| panic!("relay_only {relay_only}: {e}"));
        // On loopback the receiver is reached directly unless told to go through the relay.
        let found = events.iter().find_map(|e| match e {
            Event::Found { relayed, .. } => Some(*relayed),
            _ => None,
        });
        assert_eq!(found, Some(relay_only), "{events:?}");
        let received = receiving.wait().unwrap();
        assert_eq!((sent.bytes, received.bytes), (2 << 20, 2 << 20));
        assert_eq!(std::fs::read(out.join("f.bin")).unwrap(), data);
        std::fs::remove_file(out.join("f.bin")).unwrap();
    }
    // A receiver's relay code is the relay's: a code of one's own is refused with it.
    let e = Receiver::builder()
        .out(&out)
        .relay(relay_addr)
        .code("7-acid-acorn")
        .build()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Usage, "{e}");
}
