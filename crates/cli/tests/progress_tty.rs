//! The progress display as a person sees it: `hurtle receive` and `hurtle send` run in
//! pseudo-terminals (stdout and stderr both on the terminal, as in a shell), and what they
//! draw is fed to a terminal emulator whose screen the test reads while they run. On terminals
//! of 60, 80 and 200 columns every line the display draws fits the width, keeps the
//! percentage and the rate, and shows the other parts as the width allows; no empty bar is
//! ever drawn.
//!
//! Both processes run on loopback only, under deadlines, and are killed by their own handles if
//! they overstay or the test fails.

#[allow(dead_code)]
mod support;

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::pty::{openpty, Winsize};
use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::proc::{bin, send_args};
use support::{Rng, TRANSFER_TIMEOUT};

const ROWS: u16 = 24;
const COLS: u16 = 160;

/// A `hurtle` process whose stdout and stderr are a pseudo-terminal; everything it writes there
/// is collected in the background. Dropping it kills the process if it still runs.
struct Tty {
    name: String,
    cols: u16,
    child: Child,
    written: Arc<Mutex<Vec<u8>>>,
}

fn cloexec(fd: &OwnedFd) {
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).expect("FD_CLOEXEC");
}

impl Tty {
    fn spawn<S: AsRef<OsStr>>(name: &str, args: &[S]) -> Tty {
        Tty::spawn_cols(name, COLS, args)
    }

    /// [`Tty::spawn`] on a terminal `cols` columns wide.
    fn spawn_cols<S: AsRef<OsStr>>(name: &str, cols: u16, args: &[S]) -> Tty {
        let size = Winsize {
            ws_row: ROWS,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = openpty(&size, None).expect("openpty");
        // Neither end may leak into a process started later (the other peer): the reader
        // would then not see the end of this one's output when it exits.
        cloexec(&pty.master);
        cloexec(&pty.slave);
        let child = {
            let mut cmd = Command::new(bin());
            cmd.args(args)
                .env("TERM", "xterm-256color")
                .env("COLUMNS", cols.to_string())
                .env("HURTLE_CODE", support::TEST_CODE)
                .env("HURTLE_PATH_MEMORY", "off")
                .stdin(Stdio::null())
                .stdout(Stdio::from(pty.slave.try_clone().expect("dup pty")))
                .stderr(Stdio::from(pty.slave));
            cmd.spawn()
                .unwrap_or_else(|e| panic!("cannot start {name}: {e}"))
            // `cmd`, holding our copies of the terminal's slave end, is dropped here.
        };
        let written = Arc::new(Mutex::new(Vec::new()));
        let into = written.clone();
        let mut master = File::from(pty.master);
        // Ends when the process has exited and the terminal has no writer left (EIO).
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = master.read(&mut buf) {
                if n == 0 {
                    break;
                }
                into.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend_from_slice(&buf[..n]);
            }
        });
        Tty {
            name: name.to_owned(),
            cols,
            child,
            written,
        }
    }

    /// Everything written to the terminal so far, escape sequences and all.
    fn raw(&self) -> String {
        String::from_utf8_lossy(&self.written.lock().unwrap_or_else(|e| e.into_inner())).into()
    }

    /// What the terminal shows now.
    fn screen(&self) -> String {
        let mut term = vt100::Parser::new(
            ROWS.try_into().expect("rows"),
            self.cols.try_into().expect("cols"),
            0,
        );
        term.process(&self.written.lock().unwrap_or_else(|e| e.into_inner()));
        term.screen().contents()
    }

    /// Polls the screen until `pick` finds something on it; fails the test after `timeout` or
    /// if the process exits first.
    fn wait_screen<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut pick: impl FnMut(&str) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            let screen = self.screen();
            if let Some(v) = pick(&screen) {
                return v;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{} exited ({status}) before its screen showed {what}; screen:\n{screen}",
                    self.name
                );
            }
            assert!(
                Instant::now() < deadline,
                "{}'s screen did not show {what} within {timeout:?}; screen:\n{screen}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Polls what was written (escape sequences and all) until `pick` finds something in it;
    /// fails the test after `timeout` or if the process exits first.
    fn wait_raw<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut pick: impl FnMut(&str) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = pick(&self.raw()) {
                return v;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{} exited ({status}) before it wrote {what}", self.name);
            }
            assert!(
                Instant::now() < deadline,
                "{} did not write {what} within {timeout:?}: {:?}",
                self.name,
                self.raw()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the process to exit; after `timeout` kills it and fails the test.
    fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                // The last output may still be on its way from the terminal.
                std::thread::sleep(Duration::from_millis(100));
                return status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{} still running after {timeout:?}; killed it. Screen:\n{}",
                    self.name,
                    self.screen()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Tty {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The line of `screen` that starts with `prefix`, if any.
fn line<'a>(screen: &'a str, prefix: &str) -> Option<&'a str> {
    screen.lines().find(|l| l.trim_start().starts_with(prefix))
}

/// What indicatif's own rate and totals looked like: bytes per second, and an empty transfer's
/// "0 B/0 B" bar.
fn assert_no_byte_rates(who: &str, raw: &str) {
    for bad in ["iB/s", " B/s", "0 B/0 B"] {
        assert!(
            !raw.contains(bad),
            "{who}'s terminal showed {bad:?}:\n{raw:?}"
        );
    }
}

#[test]
fn progress_display_waits_then_shows_bit_rate_and_the_moving_file() {
    let dir = tempfile::Builder::new()
        .prefix("hurtle-tty-")
        .tempdir()
        .expect("temp dir");
    let name = "tty-progress-payload.bin";
    let src = dir.path().join(name);
    let mut data = vec![0u8; 48 << 20];
    Rng::new(24).fill(&mut data);
    std::fs::write(&src, &data).expect("write the source");
    let out = dir.path().join("out");

    // The receiver, alone: it waits, and says so.
    let out_arg = out.display().to_string();
    let mut receiver = Tty::spawn(
        "receiver",
        &["receive", "--listen", "127.0.0.1:0", "--out", &out_arg],
    );
    let addr: SocketAddr = receiver.wait_screen("its address", Duration::from_secs(10), |s| {
        let rest = line(s, "hurtle: listening on ")?.trim();
        let rest = rest.strip_prefix("hurtle: listening on ")?;
        rest.split(", receiving into").next()?.parse().ok()
    });
    let waiting = receiver.wait_screen("that it waits", Duration::from_secs(10), |s| {
        s.contains(&format!("waiting for a sender on {addr}…"))
            .then(|| s.to_owned())
    });
    // For a while longer, before any sender: still waiting, no bar.
    let until = Instant::now() + Duration::from_millis(600);
    while Instant::now() < until {
        let s = receiver.screen();
        assert!(
            s.contains(&format!("waiting for a sender on {addr}")),
            "the receiver stopped saying it waits, with no sender:\n{s}"
        );
        assert!(
            !s.contains("0 B/0 B") && !s.contains('['),
            "the receiver shows a bar with no sender:\n{s}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_no_byte_rates("the receiver", &receiver.raw());

    // The sender, paced so that the transfer lasts about two seconds.
    let mut sender = Tty::spawn(
        "sender",
        &send_args(addr, &[&src], &["--rate-fixed", "200M"]),
    );
    let moving = |prefix: &'static str| {
        move |s: &str| {
            let l = line(s, prefix)?;
            (l.contains('[') && l.contains("bit/s") && l.contains(name)).then(|| l.to_owned())
        }
    };
    let timeout = Duration::from_secs(20);
    let receiving = receiver.wait_screen(
        "a bar with a bit rate and the file",
        timeout,
        moving("receiving ["),
    );
    let sending = sender.wait_screen(
        "a bar with a bit rate and the file",
        timeout,
        moving("sending ["),
    );
    // The time left shows with the rate.
    let with_eta = sender.wait_screen("a bar with the time left", timeout, |s| {
        line(s, "sending [")
            .filter(|l| l.contains("ETA ") && l.contains("bit/s"))
            .map(str::to_owned)
    });
    eprintln!("receiver, waiting:\n{waiting}");
    eprintln!("receiver, moving:\n{receiving}");
    eprintln!("sender, moving:\n{sending}\n{with_eta}");

    let s = sender.wait(TRANSFER_TIMEOUT);
    let r = receiver.wait(TRANSFER_TIMEOUT);
    assert!(s.success(), "sender failed ({s}):\n{}", sender.screen());
    assert!(r.success(), "receiver failed ({r}):\n{}", receiver.screen());
    assert_eq!(
        std::fs::read(out.join(name)).expect("the received file"),
        data,
        "the received file differs"
    );
    // Nothing either terminal showed, at any moment, spoke bytes per second or showed an
    // empty bar.
    let (sent_raw, received_raw) = (sender.raw(), receiver.raw());
    assert_no_byte_rates("the sender", &sent_raw);
    assert_no_byte_rates("the receiver", &received_raw);
    // On the receiver's terminal, the wait came before any bar.
    let waited = received_raw.find("waiting for a sender").expect("waiting");
    let bar = received_raw.find("receiving [").expect("a bar");
    assert!(waited < bar, "the receiver showed a bar before it waited");
    // The summaries are still there when the bars are gone.
    assert!(sender.screen().contains("sent 48.0 MiB in 1 files"));
    assert!(receiver.screen().contains("received 48.0 MiB in 1 files"));
}

/// The lines a progress display drew on a terminal, in order: what was written, without
/// escape sequences, cut at each carriage return and line feed, keeping those that are part of
/// the display (a spinner's wait, or a moving transfer's line with its rate), not the
/// summaries and notes printed as lines of their own.
fn drawn_lines(raw: &str) -> Vec<String> {
    let plain = console::strip_ansi_codes(raw);
    plain
        .split(['\r', '\n'])
        .map(str::trim_end)
        .filter(|l| {
            let summary = [
                "sent ",
                "received ",
                "nothing to ",
                "hurtle",
                "encrypted",
                "code",
                "limited by",
                "path: ",
                "the path went out",
            ]
            .iter()
            .any(|p| l.starts_with(p));
            let spinner = [
                "waiting for",
                "setting up",
                "connecting",
                "starting the",
                "a sender",
            ]
            .iter()
            .any(|w| l.contains(w));
            !summary && (l.contains("bit/s") || l.contains("measuring the rate") || spinner)
        })
        .map(str::to_owned)
        .collect()
}

/// A 24 MiB file with a long name sent at 100 Mbit/s between two terminals `cols` wide: every
/// line either display drew fits in `cols` columns, and no empty bar was ever drawn. Returns
/// the lines the sender's display drew while data moved.
fn progress_fits(cols: u16) -> Vec<String> {
    let dir = tempfile::Builder::new()
        .prefix("hurtle-tty-width-")
        .tempdir()
        .expect("temp dir");
    let src = dir.path().join(LONG_NAME);
    let mut data = vec![0u8; 24 << 20];
    Rng::new(u64::from(cols)).fill(&mut data);
    std::fs::write(&src, &data).expect("write the source");
    let out = dir.path().join("out");
    let out_arg = out.display().to_string();
    let mut receiver = Tty::spawn_cols(
        "receiver",
        cols,
        &["receive", "--listen", "127.0.0.1:0", "--out", &out_arg],
    );
    // A narrow screen wraps the address's line: it is read from what was written.
    let addr: SocketAddr = receiver.wait_raw("its address", Duration::from_secs(10), |raw| {
        let plain = console::strip_ansi_codes(raw).into_owned();
        let rest = plain.split("hurtle: listening on ").nth(1)?;
        rest.split(", receiving into").next()?.parse().ok()
    });
    let mut sender = Tty::spawn_cols(
        "sender",
        cols,
        &send_args(addr, &[&src], &["--rate-fixed", "100M"]),
    );
    let s = sender.wait(TRANSFER_TIMEOUT);
    let r = receiver.wait(TRANSFER_TIMEOUT);
    assert!(s.success(), "sender failed ({s}):\n{}", sender.screen());
    assert!(r.success(), "receiver failed ({r}):\n{}", receiver.screen());
    assert_eq!(
        std::fs::read(out.join(LONG_NAME)).expect("the received file"),
        data,
        "the received file differs"
    );
    let mut moving = Vec::new();
    for (who, tty) in [("sender", &sender), ("receiver", &receiver)] {
        let raw = tty.raw();
        let lines = drawn_lines(&raw);
        // indicatif's default style, drawn before the display is set up, is a full-width empty
        // bar of these.
        assert!(
            !raw.contains('░'),
            "the {who}'s terminal showed an empty default bar:\n{raw:?}"
        );
        assert!(
            lines.iter().any(|l| l.contains("bit/s")),
            "the {who}'s display drew no moving line at {cols} columns:\n{raw:?}"
        );
        for l in &lines {
            let w = console::measure_text_width(l);
            assert!(
                w <= usize::from(cols),
                "the {who}'s display drew a line of {w} columns on a terminal of {cols}:\n{l}"
            );
            // No empty bar before the first bytes moved.
            assert!(
                !l.contains("[  "),
                "the {who}'s display drew an empty bar:\n{l}"
            );
        }
        // The percentage and the rate are never given up.
        for l in lines.iter().filter(|l| l.contains("bit/s")) {
            let pct = l.split_whitespace().any(|w| {
                w.strip_suffix('%')
                    .is_some_and(|n| n.parse::<u8>().is_ok_and(|n| n <= 100))
            });
            assert!(pct, "the {who}'s line has no percentage:\n{l}");
        }
        assert_no_byte_rates(who, &raw);
        if who == "sender" {
            moving = lines.into_iter().filter(|l| l.contains("bit/s")).collect();
        }
    }
    eprintln!("{cols} columns, the sender's lines:");
    for l in &moving {
        eprintln!("{l}");
    }
    moving
}

/// A name longer than a narrow terminal leaves room for.
const LONG_NAME: &str = "a-rather-long-file-name-for-the-progress-line.bin";

/// Whether some line of `lines` has every one of `parts`.
fn some_line_has(lines: &[String], parts: &[&str]) -> bool {
    lines.iter().any(|l| parts.iter().all(|p| l.contains(p)))
}

#[test]
fn progress_fits_60_columns_with_the_percentage_rate_and_time_left() {
    let lines = progress_fits(60);
    assert!(
        some_line_has(&lines, &["sending ", "% ", "bit/s, ETA "]),
        "no line with the verb, the rate and the time left:\n{lines:#?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("a-rather")),
        "no room for the file name at 60 columns, yet it shows:\n{lines:#?}"
    );
}

#[test]
fn progress_fits_80_columns_with_a_bar_and_the_name_shortened_in_the_middle() {
    let lines = progress_fits(80);
    assert!(
        some_line_has(
            &lines,
            &["sending [", "MiB  ", "bit/s, ETA ", "a-ra", "…", "ine.bin"]
        ),
        "no line with the bar, the rate, the time left and the name shortened:\n{lines:#?}"
    );
}

#[test]
fn progress_fits_200_columns_with_every_part() {
    let lines = progress_fits(200);
    assert!(
        some_line_has(&lines, &["sending [", "MiB  ", "bit/s, ETA ", LONG_NAME]),
        "no line with the bar, the rate, the time left and the whole name:\n{lines:#?}"
    );
}
