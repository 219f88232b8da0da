//! What the user sees: progress bars (terminal only), summaries, JSON.

use crate::OutputArgs;
use hurtle_engine::progress::Phase;
use hurtle_engine::send::OutageSummary;
use hurtle_engine::{Progress, ReceiveSummary, SendSummary};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::VecDeque;
use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A progress display fed from the session's counters by a background thread. Hidden when
/// stderr is not a terminal, with `-q` or with `--json`.
///
/// Until data moves it is a spinner that says what the session waits for ("waiting for a
/// sender on ADDR…", "connecting to ADDR…", "setting up…"), never a bar. Once data moves it is
/// a bar with the rate (bit/s, over the last few seconds of the transfer only) and the time
/// left, and the files whose bytes moved in the last moment.
pub struct Bar {
    bar: ProgressBar,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// What a receiver waits for, when not a sender on its address (a code).
    waiting: Arc<Mutex<Option<String>>>,
}

impl Bar {
    /// Says "waiting for a sender WHAT…" while the receiver waits (default: "on ADDR").
    pub fn waiting_for(&self, what: String) {
        *self.waiting.lock().unwrap_or_else(|e| e.into_inner()) = Some(what);
    }

    /// Stops updating and clears the bar.
    pub fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.bar.finish_and_clear();
    }
}

/// How often the display is refreshed from the counters.
const TICK: Duration = Duration::from_millis(100);
/// The rate shown is measured over this much of the recent transfer.
const RATE_WINDOW: Duration = Duration::from_secs(3);
/// A file is shown as moving while some channel moved bytes of it this recently.
const MOVING_WITHIN: Duration = Duration::from_millis(500);

/// Creates the session's counters and, when appropriate, a display that shows them. `verb` is
/// "sending" or "receiving".
pub fn progress_bar(out: &OutputArgs, verb: &'static str) -> (Arc<Progress>, Bar) {
    let progress = Arc::new(Progress::default());
    let visible = !out.quiet && !out.json && std::io::stderr().is_terminal();
    let bar = ProgressBar::with_draw_target(
        Some(0),
        if visible {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        },
    );
    bar.set_prefix(verb);
    let side = if verb == "receiving" {
        Side::Receiver(None)
    } else {
        Side::Sender
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let waiting = Arc::new(Mutex::new(None));
    let thread = visible.then(|| {
        let (p, b, s, w) = (progress.clone(), bar.clone(), stop.clone(), waiting.clone());
        std::thread::spawn(move || {
            let mut meter = Meter::default();
            let mut spinning = None;
            while !s.load(Ordering::Relaxed) {
                let what = w.lock().map(|w| w.clone()).unwrap_or(None);
                let shown = match (&side, what) {
                    (Side::Receiver(_), Some(what)) => Side::Receiver(Some(what)),
                    _ => side.clone(),
                };
                match describe(&p, &shown, &mut meter, Instant::now()) {
                    View::Waiting(msg) => {
                        if spinning != Some(true) {
                            b.set_style(spinner_style());
                            spinning = Some(true);
                        }
                        b.set_message(msg);
                        b.tick();
                    }
                    View::Moving { total, done, msg } => {
                        if spinning != Some(false) {
                            b.set_style(bar_style());
                            spinning = Some(false);
                        }
                        b.set_length(total);
                        b.set_position(done);
                        b.set_message(msg);
                    }
                }
                std::thread::sleep(TICK);
            }
        })
    });
    (
        progress,
        Bar {
            bar,
            stop,
            thread,
            waiting,
        },
    )
}

fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} {wide_msg}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
}

fn bar_style() -> ProgressStyle {
    // No `{bytes_per_sec}` or `{eta}`: indicatif's count the time before data moved, and speak
    // bytes per second. The rate and time left are in the message.
    ProgressStyle::with_template("{prefix} [{bar:20}] {bytes}/{total_bytes} {wide_msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

/// Which end of the transfer a display is for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Side {
    Sender,
    /// With what it waits for, when not a sender on its address.
    Receiver(Option<String>),
}

/// What the display shows at one moment.
#[derive(Debug, Clone, PartialEq)]
enum View {
    /// No data moves yet: what the session waits for.
    Waiting(String),
    /// Data moves: `done` of `total` bytes, and the rate, time left and files.
    Moving { total: u64, done: u64, msg: String },
}

/// The transfer's rate, measured over the last [`RATE_WINDOW`] of it (never over the time
/// before data moved).
#[derive(Debug, Default)]
struct Meter {
    /// When the transfer started, as the engine said.
    since: Option<Instant>,
    /// `(when, bytes moved)`, oldest first; the first is at or before the window's start.
    samples: VecDeque<(Instant, u64)>,
    /// When every byte had moved, first seen.
    all_moved: Option<Instant>,
}

impl Meter {
    /// Takes a sample of a transfer that started at `since` (bytes then: 0); returns the rate
    /// in bits per second, once there is a tenth of a second to measure it over.
    fn sample(&mut self, since: Instant, now: Instant, done: u64) -> Option<f64> {
        if self.since != Some(since) {
            self.since = Some(since);
            self.samples.clear();
            self.samples.push_back((since, 0));
            self.all_moved = None;
        }
        self.samples.push_back((now, done));
        // Keep one sample at or before the window's start, so the window is full.
        while self.samples.len() > 2
            && now.saturating_duration_since(self.samples[1].0) >= RATE_WINDOW
        {
            self.samples.pop_front();
        }
        let &(t0, b0) = self.samples.front()?;
        let secs = now.saturating_duration_since(t0).as_secs_f64();
        (secs >= 0.1).then(|| done.saturating_sub(b0) as f64 * 8.0 / secs)
    }
}

/// What to show for `p` now.
fn describe(p: &Progress, side: &Side, meter: &mut Meter, now: Instant) -> View {
    let receiver = matches!(side, Side::Receiver(_));
    let since = match (p.phase(), p.moving_since(), side) {
        (Phase::Moving, Some(since), _) => since,
        (Phase::Idle, _, Side::Receiver(what)) => {
            let what = match (what, p.address()) {
                (Some(what), _) => format!(" {what}"),
                (None, Some(a)) => format!(" on {a}"),
                (None, None) => String::new(),
            };
            return View::Waiting(format!("waiting for a sender{what}…"));
        }
        (Phase::Connecting, _, _) => {
            let to = p.address().map(|a| format!(" to {a}")).unwrap_or_default();
            return View::Waiting(format!("connecting{to}…"));
        }
        (Phase::SettingUp, _, Side::Receiver(_)) => {
            return View::Waiting("a sender connected: setting up…".into())
        }
        _ => return View::Waiting("setting up…".into()),
    };
    let total = p.total.load(Ordering::Relaxed);
    if total == 0 {
        // Nothing to move: every file is empty, skipped or already there.
        return View::Waiting("nothing to move: finishing…".into());
    }
    let done = p.sent.load(Ordering::Relaxed).min(total);
    let bps = meter.sample(since, now, done);
    let mut msg = if done >= total {
        let end = *meter.all_moved.get_or_insert(now);
        let secs = end.saturating_duration_since(since).as_secs_f64().max(1e-3);
        format!(
            "{} average; {}",
            rate(total as f64 * 8.0 / secs),
            if receiver {
                "all received, finishing…"
            } else {
                "all sent, waiting for the receiver to confirm"
            }
        )
    } else {
        let mut m = match bps {
            Some(bps) => rate(bps),
            None => "measuring the rate".into(),
        };
        if let Some(bps) = bps.filter(|&b| b > 0.0) {
            if now.saturating_duration_since(since) >= Duration::from_secs(1) {
                let left = (total - done) as f64 * 8.0 / bps;
                m += &format!(", ETA {}", eta(left));
            }
        }
        let files = p.moving_files(MOVING_WITHIN);
        if let Some(first) = files.first() {
            m += "  ";
            m += first;
            if files.len() > 1 {
                m += &format!(" (+{} more)", files.len() - 1);
            }
        }
        if let Some(limit) = p.limit() {
            m += &format!("  limited by {limit}");
        }
        // Which way the data goes, first: the end of a long line is cut at the terminal's.
        match p.route_tag() {
            Some(tag) => format!("[{tag}] {m}"),
            None => m,
        }
    };
    let resumed = p.resumed.load(Ordering::Relaxed);
    if resumed > 0 {
        msg = format!("{msg} (resumed: {} were already there)", bytes(resumed));
    }
    View::Moving { total, done, msg }
}

/// Time left, rounded up: "7 s", "2 min 05 s", "1 h 02 min".
fn eta(secs: f64) -> String {
    let s = if secs.is_finite() {
        secs.ceil().clamp(0.0, 1e9) as u64
    } else {
        return "unknown".into();
    };
    match s {
        s if s < 60 => format!("{s} s"),
        s if s < 3600 => format!("{} min {:02} s", s / 60, s % 60),
        s => format!("{} h {:02} min", s / 3600, s % 3600 / 60),
    }
}

/// Prints a line unless quiet; on stderr when stdout is reserved for JSON.
pub fn say(out: &OutputArgs, line: &str) {
    if out.quiet {
        return;
    }
    if out.json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

/// Human-readable bits per second.
pub fn rate(bps: f64) -> String {
    match bps {
        b if b >= 1e9 => format!("{:.2} Gbit/s", b / 1e9),
        b if b >= 1e6 => format!("{:.1} Mbit/s", b / 1e6),
        b => format!("{:.0} kbit/s", b / 1e3),
    }
}

/// Human-readable bytes.
pub fn bytes(n: u64) -> String {
    let n = n as f64;
    match n {
        b if b >= (1u64 << 30) as f64 => format!("{:.2} GiB", b / (1u64 << 30) as f64),
        b if b >= (1u64 << 20) as f64 => format!("{:.1} MiB", b / (1u64 << 20) as f64),
        b if b >= 1024.0 => format!("{:.1} KiB", b / 1024.0),
        b => format!("{b} B"),
    }
}

fn json(value: &impl serde::Serialize) {
    match serde_json::to_string(value) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("hurtle: cannot encode the summary: {e}"),
    }
}

/// The path the session took, added to the `--json` summary: paired through a relay, or
/// started over ssh by `hurtle cp`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PathInfo {
    /// `direct` or `relayed` (a relay), `direct` or `ssh` (`hurtle cp`: through the ssh
    /// channel itself).
    pub path: &'static str,
    /// The relay, as given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relay: Option<String>,
    /// The code's nameplate (the words stay secret).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code_nameplate: Option<u32>,
}

#[derive(serde::Serialize)]
struct WithPath<'a, T: serde::Serialize> {
    #[serde(flatten)]
    summary: &'a T,
    #[serde(flatten)]
    path: Option<&'a PathInfo>,
}

/// ", 12.0 MiB resumed from an interrupted transfer" when an interrupted transfer's blocks
/// were reused, ", 80.0 GiB of holes not sent" when sparse files' holes were left out; else
/// nothing.
fn not_sent(resumed: u64, sparse: u64) -> String {
    let mut s = String::new();
    if resumed > 0 {
        s += &format!(", {} resumed from an interrupted transfer", bytes(resumed));
    }
    if sparse > 0 {
        s += &format!(", {} of holes not sent", bytes(sparse));
    }
    s
}

/// The sender's closing summary.
pub fn print_send_summary(out: &OutputArgs, s: &SendSummary, path: Option<&PathInfo>) {
    for w in &s.warnings {
        if !out.quiet {
            warning(w);
        }
    }
    if out.json {
        return json(&WithPath { summary: s, path });
    }
    say(out, &format!(
        "sent {} in {} files ({} dirs{}{}) in {:.2} s: {} over {} {} {}, {:.2}% resent, {} NACKs, final rate {} ({})",
        bytes(s.bytes), s.files, s.dirs,
        if s.skipped > 0 { format!(", {} skipped: the receiver had them", s.skipped) } else { String::new() },
        not_sent(s.resumed_bytes, s.sparse_bytes), s.seconds, rate(s.goodput_bps), s.channels, s.transport,
        if s.transport == "tcp" { "connections" } else { "channels" }, s.resent_share * 100.0, s.nacks,
        rate(s.rate.final_bps as f64), s.rate.mode
    ));
    say(
        out,
        if s.encrypted {
            "encrypted: control and data (AES-256-GCM), authenticated by the code or key"
        } else {
            "encrypted: control only (both sides gave --no-encryption); authenticated by the code or key"
        },
    );
    if let Some(line) = path_line(s) {
        say(out, &line);
    }
    if let Some(b) = &s.bottleneck {
        say(out, &format!("limited by {}", b.detail));
    }
    if let Some(line) = outage_line(&s.rate.outages) {
        say(out, &line);
    }
    if out.verbose {
        say(
            out,
            &format!(
                "datagrams sent {} (resent {}), payload {} B, receiver rejected {}",
                s.datagrams_sent, s.datagrams_resent, s.payload, s.receiver_rejected
            ),
        );
        let r = &s.rate;
        let resumed = r.resumed.as_ref().map_or(String::new(), |m| {
            format!(
                " (from the {} this path took {} ago)",
                rate(m.remembered_bps as f64),
                ago(m.age_s)
            )
        });
        say(
            out,
            &format!(
                "rate {}: started {}{resumed}, ended {}, range {} to {}, {} changes {:?}; receiver ceiling {}",
                r.mode,
                rate(r.start_bps as f64),
                rate(r.final_bps as f64),
                rate(r.min_bps as f64),
                rate(r.max_bps as f64),
                r.changes,
                r.reasons,
                if r.receiver_ceiling_bps == 0 { "not offered".to_string() } else { rate(r.receiver_ceiling_bps as f64) }
            ),
        );
        for f in &s.file_hashes {
            say(out, &format!("  {}  {}", f.blake3, f.path));
        }
    }
}

/// A past time span, in its largest whole unit: `40 s`, `3 min`, `5 h`.
fn ago(seconds: u64) -> String {
    match seconds {
        s if s < 120 => format!("{s} s"),
        s if s < 2 * 3600 => format!("{} min", s / 60),
        s => format!("{} h", s / 3600),
    }
}

/// The receiver's closing summary.
pub fn print_receive_summary(out: &OutputArgs, s: &ReceiveSummary, path: Option<&PathInfo>) {
    for w in &s.warnings {
        if !out.quiet {
            warning(w);
        }
    }
    if out.json {
        return json(&WithPath { summary: s, path });
    }
    say(
        out,
        &format!(
        "received {} in {} files ({} dirs{}) from {} in {:.2} s: {}, {} NACKs, {} datagrams rejected",
        bytes(s.bytes), s.files, s.dirs, not_sent(s.resumed_bytes, s.sparse_bytes), s.peer, s.seconds, rate(s.goodput_bps), s.nacks, s.rejected
    ),
    );
    let encrypted = if s.encrypted {
        "control and data (AES-256-GCM)"
    } else {
        "control only (both sides gave --no-encryption)"
    };
    say(
        out,
        &format!(
            "encrypted: {encrypted}; {} forged, changed or replayed datagrams dropped",
            s.unauthentic
        ),
    );
    if s.strays > 0 {
        say(
            out,
            &format!(
                "{} connection{} turned away before the transfer (not hurtle senders, silent, or without the code or key)",
                s.strays,
                if s.strays == 1 { "" } else { "s" }
            ),
        );
    }
    if out.verbose {
        for f in &s.file_hashes {
            say(out, &format!("  {}  {}", f.blake3, f.path));
        }
    }
}

/// Prints the engine's log events on stderr, unless `--quiet`: those of hurtle's own crates at
/// `info` and above (a stray connection dropped by the receiver's front door, say), as
/// `hurtle: MESSAGE`, or `hurtle: warning: MESSAGE` for warnings, one write per line.
pub fn log_engine_events(out: &OutputArgs) {
    if !out.quiet {
        // Only fails if one is installed already, which then does the job.
        let _ = tracing::subscriber::set_global_default(StderrLog);
    }
}

/// A `tracing` subscriber that prints events' messages on stderr, and keeps no spans.
struct StderrLog;

impl tracing::Subscriber for StderrLog {
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        *m.level() <= tracing::Level::INFO && m.target().starts_with("hurtle")
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
        if *e.metadata().level() <= tracing::Level::WARN {
            warning(&m.0);
        } else {
            eprintln!("hurtle: {}", m.0);
        }
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// Whether errors and warnings on stderr are colored: `--color`, then `NO_COLOR`, then whether
/// stderr is a terminal.
pub fn set_color(choice: crate::args::ColorArg, no_color: bool) {
    use crate::args::ColorArg;
    let on = match choice {
        ColorArg::Always => true,
        ColorArg::Never => false,
        ColorArg::Auto => !no_color && std::io::stderr().is_terminal(),
    };
    console::set_colors_enabled_stderr(on);
}

/// Prints `hurtle: error: LINE` on stderr, in one write.
pub fn error_line(line: &str) {
    let tag = console::style("error:").red().bold().for_stderr();
    eprintln!("hurtle: {tag} {line}");
}

/// Prints `hurtle: warning: LINE` on stderr, in one write.
pub fn warning(line: &str) {
    let tag = console::style("warning:").yellow().bold().for_stderr();
    eprintln!("hurtle: {tag} {line}");
}

/// The summary's line on the path's outages during a send, if there were any.
/// Which path carried how many bytes of a relayed send, and when it changed: "path: relayed
/// 3.1 MiB, then direct 92.9 MiB after 0.41 s". `None` when nothing went through a relay.
fn path_line(s: &SendSummary) -> Option<String> {
    let b = &s.bytes_by_path;
    route_line(
        [b.relay_udp, b.direct, b.relay_tcp],
        s.direct_after_seconds,
        s.fallback_seconds,
    )
}

/// [`path_line`] of the bytes sent through the relay as datagrams, direct and through the
/// relay over TCP, the first move to a direct path and the move to TCP, seconds.
fn route_line(
    [relay_udp, direct, relay_tcp]: [u64; 3],
    direct_after: Option<f64>,
    tcp_after: Option<f64>,
) -> Option<String> {
    if relay_udp + relay_tcp == 0 {
        return None;
    }
    let after = |secs: Option<f64>| secs.map_or(String::new(), |t| format!(" after {t:.2} s"));
    let parts: Vec<String> = [
        ("relayed", relay_udp, String::new()),
        ("direct", direct, after(direct_after)),
        ("relayed over TCP", relay_tcp, after(tcp_after)),
    ]
    .into_iter()
    .filter(|&(_, n, _)| n > 0)
    .map(|(what, n, when)| format!("{what} {}{when}", bytes(n)))
    .collect();
    Some(format!("path: {}", parts.join(", then ")))
}

fn outage_line(o: &OutageSummary) -> Option<String> {
    let times = match o.count {
        0 => return None,
        1 => "once".to_string(),
        2 => "twice".to_string(),
        n => format!("{n} times"),
    };
    Some(format!(
        "the path went out {times} ({:.1} s in all without deliveries; what was sent meanwhile \
         was sent again)",
        o.seconds
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_progress_line_of_a_relayed_send_says_which_way_its_data_goes() {
        use hurtle_engine::progress::Route;
        let p = Progress::default();
        p.total.store(100_000_000, Ordering::Relaxed);
        p.set_phase(Phase::Moving);
        let since = p.moving_since().unwrap();
        let msg = |p: &Progress| {
            let mut meter = Meter::default();
            match describe(p, &Side::Sender, &mut meter, since + Duration::from_secs(1)) {
                View::Moving { msg, .. } => msg,
                other => panic!("{other:?}"),
            }
        };
        assert!(!msg(&p).contains('['), "a direct session has no tag");
        p.set_routes(2, Route::RelayUdp);
        assert!(msg(&p).starts_with("[relay] "), "{}", msg(&p));
        p.set_route(0, Route::Direct);
        assert!(msg(&p).starts_with("[relay+direct] "), "{}", msg(&p));
        p.set_route(1, Route::Direct);
        assert!(msg(&p).starts_with("[direct] "), "{}", msg(&p));
        p.set_routes(2, Route::RelayTcp);
        assert!(msg(&p).starts_with("[relay tcp] "), "{}", msg(&p));
    }

    #[test]
    fn the_summary_says_which_path_carried_how_many_bytes_when_relayed() {
        const MIB: u64 = 1 << 20;
        assert_eq!(
            route_line([0, 96 * MIB, 0], None, None),
            None,
            "direct only"
        );
        assert_eq!(
            route_line([3 * MIB + MIB / 10, 93 * MIB, 0], Some(0.412), None).as_deref(),
            Some("path: relayed 3.1 MiB, then direct 93.0 MiB after 0.41 s")
        );
        assert_eq!(
            route_line([24 * MIB, 0, 0], None, None).as_deref(),
            Some("path: relayed 24.0 MiB")
        );
        assert_eq!(
            route_line([5000, 0, 12 * MIB], None, Some(2.5)).as_deref(),
            Some("path: relayed 4.9 KiB, then relayed over TCP 12.0 MiB after 2.50 s")
        );
        assert_eq!(
            route_line([0, 0, 7 * MIB], None, None).as_deref(),
            Some("path: relayed over TCP 7.0 MiB")
        );
    }

    #[test]
    fn the_summary_says_the_path_s_outages_if_there_were_any() {
        let o = |count, seconds| OutageSummary { count, seconds };
        assert_eq!(outage_line(&o(0, 0.0)), None);
        assert_eq!(
            outage_line(&o(1, 3.06)).as_deref(),
            Some(
                "the path went out once (3.1 s in all without deliveries; what was sent \
                 meanwhile was sent again)"
            )
        );
        assert!(outage_line(&o(2, 5.0))
            .unwrap()
            .starts_with("the path went out twice (5.0 s"));
        assert!(outage_line(&o(7, 9.0))
            .unwrap()
            .starts_with("the path went out 7 times"));
    }

    fn waiting(p: &Progress, side: &Side) -> String {
        match describe(p, side, &mut Meter::default(), Instant::now()) {
            View::Waiting(msg) => msg,
            other => panic!("expected a wait, got {other:?}"),
        }
    }

    #[test]
    fn before_data_moves_it_says_what_it_waits_for() {
        let p = Progress::default();
        let receiver = Side::Receiver(None);
        assert_eq!(waiting(&p, &receiver), "waiting for a sender…");
        p.set_address("127.0.0.1:7400".parse().unwrap());
        assert_eq!(
            waiting(&p, &receiver),
            "waiting for a sender on 127.0.0.1:7400…"
        );
        let coded = Side::Receiver(Some("with code 7-a-b".into()));
        assert_eq!(waiting(&p, &coded), "waiting for a sender with code 7-a-b…");
        assert_eq!(waiting(&p, &Side::Sender), "setting up…");
        p.set_phase(Phase::Connecting);
        assert_eq!(waiting(&p, &Side::Sender), "connecting to 127.0.0.1:7400…");
        p.set_phase(Phase::SettingUp);
        assert_eq!(waiting(&p, &Side::Sender), "setting up…");
        assert_eq!(waiting(&p, &receiver), "a sender connected: setting up…");
        // The total is known before data moves: still no bar.
        p.total.store(1 << 30, Ordering::Relaxed);
        assert_eq!(waiting(&p, &receiver), "a sender connected: setting up…");
        // Data moves, but there is none to move.
        p.total.store(0, Ordering::Relaxed);
        p.set_phase(Phase::Moving);
        assert_eq!(waiting(&p, &receiver), "nothing to move: finishing…");
    }

    #[test]
    fn the_rate_counts_the_transfer_only_in_bits_per_second() {
        let p = Progress::default();
        p.total.store(100_000_000, Ordering::Relaxed);
        // A long wait before data moves does not count.
        std::thread::sleep(Duration::from_millis(50));
        p.set_phase(Phase::Moving);
        p.set_files(vec!["a.bin".into(), "b.bin".into(), "c.bin".into()]);
        let since = p.moving_since().unwrap();
        let mut meter = Meter::default();
        // 25 MB in the first second: 200 Mbit/s, 3 s left.
        p.sent.store(25_000_000, Ordering::Relaxed);
        p.note_moving(0, 1);
        p.note_moving(1, 2);
        let view = describe(
            &p,
            &Side::Sender,
            &mut meter,
            since + Duration::from_secs(1),
        );
        assert_eq!(
            view,
            View::Moving {
                total: 100_000_000,
                done: 25_000_000,
                msg: "200.0 Mbit/s, ETA 3 s  b.bin (+1 more)".into()
            }
        );
        // Then 10 MB a second for 4 s: the rate is the last 3 s's.
        for s in 2..=5 {
            p.sent
                .store(25_000_000 + (s - 1) * 10_000_000, Ordering::Relaxed);
            let view = describe(
                &p,
                &Side::Receiver(None),
                &mut meter,
                since + Duration::from_secs(s),
            );
            if s == 5 {
                let View::Moving { done, msg, .. } = view else {
                    panic!("a bar")
                };
                assert_eq!(done, 65_000_000);
                assert!(msg.starts_with("80.0 Mbit/s, ETA 4 s"), "{msg}");
            }
        }
        // All moved: the average over the transfer, frozen.
        p.sent.store(100_000_000, Ordering::Relaxed);
        for s in [8, 20] {
            let view = describe(
                &p,
                &Side::Sender,
                &mut meter,
                since + Duration::from_secs(s),
            );
            let View::Moving { msg, .. } = view else {
                panic!("a bar")
            };
            assert_eq!(
                msg,
                "100.0 Mbit/s average; all sent, waiting for the receiver to confirm"
            );
        }
    }

    #[test]
    fn time_left_reads_as_the_summaries_do() {
        assert_eq!(eta(0.2), "1 s");
        assert_eq!(eta(59.0), "59 s");
        assert_eq!(eta(125.0), "2 min 05 s");
        assert_eq!(eta(3720.0), "1 h 02 min");
        assert_eq!(eta(f64::INFINITY), "unknown");
    }
}
