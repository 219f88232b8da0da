//! A sender's losing connect attempts ([`hurtle_engine::net::dial`]: a second connect when the
//! first is slow, and whichever loses is closed) reach the receiver as connections that close
//! without a word. A one-shot receiver takes them quietly, one before the winner (it goes on
//! waiting) and one while the winner's session runs (the session goes on): the transfer
//! completes, its summary counts no stray, and nothing is logged about them above `debug`.
//!
//! Its own test binary: it installs a global `tracing` subscriber that records every event of
//! hurtle's crates, whichever thread logs it (the front door's greetings run in threads of
//! their own).

use hurtle_engine::net::dial::{Dialer, Direct};
use hurtle_engine::send::Transport;
use hurtle_engine::{Keyring, Progress, ReceiveOptions, Receiver, SendOptions};
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const CODE: &str = "7-dial-losers";

/// Every event of hurtle's crates: its level and message.
static EVENTS: Mutex<Vec<(tracing::Level, String)>> = Mutex::new(Vec::new());

struct Record;

impl tracing::Subscriber for Record {
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        m.target().starts_with("hurtle")
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    self.0 = format!("{v:?}");
                }
            }
        }
        let mut m = Message(String::new());
        e.record(&mut m);
        EVENTS.lock().unwrap().push((*e.metadata().level(), m.0));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Connects to `addr` and closes without a word, as a losing attempt is closed; returns once
/// the receiver has closed its end (its front door has taken the connection and let it go).
fn lose(addr: SocketAddr) -> io::Result<()> {
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    c.shutdown(Shutdown::Write)?;
    c.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut buf = [0u8; 64];
    match c.read(&mut buf) {
        Ok(0) => Ok(()),
        Ok(n) => Err(io::Error::other(format!("the receiver said {n} bytes"))),
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(()),
        Err(e) => Err(e),
    }
}

/// Dials directly, and beside the control connection sends the receiver two losing attempts:
/// one before the winner, and one while its session runs (when the first TCP data connection
/// is dialled, after the receiver's answer to the hello).
#[derive(Debug, Default)]
struct WithLosers {
    control: Mutex<Option<SocketAddr>>,
}

impl Dialer for WithLosers {
    fn dial(&self, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        let mut control = self.control.lock().unwrap();
        match *control {
            None => {
                *control = Some(addr);
                lose(addr)?;
            }
            Some(c) => lose(c)?,
        }
        drop(control);
        Direct.dial(addr, timeout)
    }
}

#[test]
fn losing_connect_attempts_before_and_during_a_session_are_taken_quietly() {
    tracing::subscriber::set_global_default(Record).unwrap();
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("file.bin");
    let data: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(7919) >> 5) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    let out = t.path().join("out");
    let receiver = Receiver::bind(
        "127.0.0.1:0".parse().unwrap(),
        ReceiveOptions {
            out_dir: out.clone(),
            keys: Keyring::code(CODE),
            ..ReceiveOptions::default()
        },
    )
    .unwrap();
    let addr = receiver.local_addr().unwrap();
    let received = std::thread::spawn(move || receiver.accept_one(Arc::new(Progress::default())));
    let opts = SendOptions {
        transport: Transport::Tcp,
        channels: 2,
        secret: Some(hurtle_proto::secure::Secret::code(CODE)),
        dialer: Some(Arc::new(WithLosers::default())),
        ..SendOptions::default()
    };
    hurtle_engine::send(&[src], addr, &opts, Arc::new(Progress::default())).unwrap();
    let summary = received.join().unwrap().unwrap();
    assert_eq!(std::fs::read(out.join("file.bin")).unwrap(), data);
    assert_eq!(summary.strays, 0, "losing attempts counted as turned away");
    let events = EVENTS.lock().unwrap().clone();
    let about_losers: Vec<&(tracing::Level, String)> = events
        .iter()
        .filter(|(_, m)| m.contains("closed without sending anything"))
        .collect();
    // The one before the session and the one per data connection dialled during it.
    assert_eq!(about_losers.len(), 3, "{events:#?}");
    assert!(
        about_losers
            .iter()
            .all(|(l, _)| *l == tracing::Level::DEBUG),
        "{events:#?}"
    );
    assert!(
        !events
            .iter()
            .any(|(l, m)| *l <= tracing::Level::INFO && m.contains("stray")),
        "{events:#?}"
    );
}
