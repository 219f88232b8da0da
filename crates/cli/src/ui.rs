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
/// sender on ADDR…", "connecting to ADDR…", "setting up…"), never a bar, not even an empty
/// one. Once the first bytes move it is one line, drawn here, that fits the terminal's width
/// (asked again at each refresh, so a resized terminal is followed):
///
/// `sending [=====>    ] 42% 20.1/48.0 MiB  [relay] 200.0 Mbit/s, ETA 3 s  NAME (+2 more)
/// limited by NOTE  (resumed: X were already there)`
///
/// The rate is in bit/s, measured over the last few seconds of the transfer only; the time
/// left shows as soon as there is a rate. When the line is too wide, it gives up its parts in
/// this order ([`Line::fit`]):
///
/// 1. the file name is shortened in the middle, to no fewer than 16 columns;
/// 2. the note on bytes resumed from an interrupted transfer goes;
/// 3. the "limited by" note goes;
/// 4. the bar narrows from 20 columns to 10;
/// 5. the file name goes (with its "+N more");
/// 6. the bar goes;
/// 7. the byte counts go;
/// 8. the time left goes;
/// 9. the verb ("sending") goes;
/// 10. the path tag ("[relay]") goes.
///
/// The percentage and the rate stay; on a terminal too narrow even for them the line is cut.
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
        SHOWN.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.bar.finish_and_clear();
    }
}

/// The display on the terminal now, if one shows: lines printed meanwhile go above it.
static SHOWN: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// Runs `print` with the display, if one shows, cleared from the terminal and drawn again
/// after, so that a line printed (a log event, a warning) does not run into it.
fn above_bar(print: impl FnOnce()) {
    let shown = SHOWN.lock().unwrap_or_else(|e| e.into_inner()).clone();
    match shown {
        Some(bar) => bar.suspend(print),
        None => print(),
    }
}

/// How often the display is refreshed from the counters.
const TICK: Duration = Duration::from_millis(100);
/// The rate shown is measured over this much of the recent transfer.
const RATE_WINDOW: Duration = Duration::from_secs(3);
/// A file is shown as moving while some channel moved bytes of it this recently.
const MOVING_WITHIN: Duration = Duration::from_millis(500);

/// The columns of the terminal on stderr; 80 when it does not say.
fn term_width() -> usize {
    console::Term::stderr()
        .size_checked()
        .map_or(80, |(_, cols)| usize::from(cols))
        .max(1)
}

/// Creates the session's counters and, when appropriate, a display that shows them. `verb` is
/// "sending" or "receiving".
pub fn progress_bar(out: &OutputArgs, verb: &'static str) -> (Arc<Progress>, Bar) {
    let progress = Arc::new(Progress::default());
    let visible = !out.quiet && !out.json && std::io::stderr().is_terminal();
    let bar = ProgressBar::with_draw_target(
        None,
        if visible {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        },
    );
    // Before anything can draw: indicatif's default style is a full-width empty bar.
    bar.set_style(spinner_style());
    let side = if verb == "receiving" {
        Side::Receiver(None)
    } else {
        Side::Sender
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let waiting = Arc::new(Mutex::new(None));
    if visible {
        *SHOWN.lock().unwrap_or_else(|e| e.into_inner()) = Some(bar.clone());
    }
    let thread = visible.then(|| {
        let (p, b, s, w) = (progress.clone(), bar.clone(), stop.clone(), waiting.clone());
        std::thread::spawn(move || {
            let mut meter = Meter::default();
            let mut spinning = true;
            while !s.load(Ordering::Relaxed) {
                let what = w.lock().map(|w| w.clone()).unwrap_or(None);
                let shown = match (&side, what) {
                    (Side::Receiver(_), Some(what)) => Side::Receiver(Some(what)),
                    _ => side.clone(),
                };
                let width = term_width();
                match describe(&p, &shown, &mut meter, Instant::now()) {
                    View::Waiting(msg) => {
                        if !spinning {
                            b.set_style(spinner_style());
                            spinning = true;
                        }
                        // The spinner and a space come first.
                        b.set_message(cut(&msg, width.saturating_sub(2)));
                        b.tick();
                    }
                    View::Moving(line) => {
                        if spinning {
                            b.set_style(line_style());
                            spinning = false;
                        }
                        b.set_message(line.with_verb(verb).fit(width));
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
    ProgressStyle::with_template("{spinner} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
}

/// The moving transfer's line is drawn whole by [`Line::fit`]: no `{bytes_per_sec}` or
/// `{eta}` (indicatif's count the time before data moved, and speak bytes per second), and no
/// `{bar}` (its width is not the line's to choose).
fn line_style() -> ProgressStyle {
    ProgressStyle::with_template("{msg}").unwrap_or_else(|_| ProgressStyle::default_spinner())
}

/// `text` cut at the end to at most `width` columns, with "…" where it was cut.
fn cut(text: &str, width: usize) -> String {
    console::truncate_str(text, width, "…").into_owned()
}

/// `text` shortened in the middle to at most `width` columns ("tty-pro…yload.bin"), so that
/// both a name's start and its extension show.
fn middle(text: &str, width: usize) -> String {
    let w = console::measure_text_width;
    if w(text) <= width {
        return text.to_owned();
    }
    if width < 3 {
        return cut(text, width);
    }
    let room = width - 1;
    let (mut head, mut tail) = (String::new(), Vec::new());
    let (mut head_w, mut tail_w) = (0, 0);
    let chars: Vec<char> = text.chars().collect();
    let (mut i, mut j) = (0, chars.len());
    let mut buf = [0u8; 4];
    // The end holds half the room (a name's extension), the start the rest.
    while j > i {
        let c = w(chars[j - 1].encode_utf8(&mut buf));
        if tail_w + c > room / 2 {
            break;
        }
        tail_w += c;
        j -= 1;
        tail.push(chars[j]);
    }
    while i < j {
        let c = w(chars[i].encode_utf8(&mut buf));
        if head_w + tail_w + c > room {
            break;
        }
        head_w += c;
        head.push(chars[i]);
        i += 1;
    }
    head.push('…');
    head.extend(tail.iter().rev());
    head
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
    /// Data moves: the progress line's parts.
    Moving(Line),
}

/// The parts of a moving transfer's progress line; [`Line::fit`] draws them.
#[derive(Debug, Clone, PartialEq)]
struct Line {
    /// "sending" or "receiving" (empty: none).
    verb: &'static str,
    /// Bytes moved so far, of `total` (those resumed not counted in either).
    done: u64,
    total: u64,
    /// Which way the data goes ([`Progress::route_tag`]).
    tag: Option<&'static str>,
    /// "200.0 Mbit/s", "measuring the rate", or "200.0 Mbit/s average" once all moved.
    rate: String,
    /// Time left.
    eta: Option<String>,
    /// The first file moving now, and how many more are.
    files: Option<(String, usize)>,
    /// Once every byte moved: what the session waits for, in place of the files.
    note: Option<String>,
    /// What limits the transfer now.
    limit: Option<String>,
    /// Bytes resumed from an interrupted transfer.
    resumed: u64,
}

/// Which of a [`Line`]'s parts are drawn, and how wide.
#[derive(Debug, Clone, Copy)]
struct Shown {
    verb: bool,
    /// The bar's inside, columns (0: no bar).
    bar: usize,
    bytes: bool,
    tag: bool,
    eta: bool,
    /// The file name's (or the note's) most columns; `None`: not shown.
    name: Option<usize>,
    limit: bool,
    resumed: bool,
}

/// The bar's inside, columns, and the fewest it narrows to.
const BAR: usize = 20;
const BAR_NARROW: usize = 10;
/// A file name is not shortened below this many columns; it goes instead.
const NAME_SHORT: usize = 16;

impl Line {
    fn with_verb(mut self, verb: &'static str) -> Line {
        self.verb = verb;
        self
    }

    /// The part after the bar and the byte counts: rate, time left, files and notes.
    #[cfg(test)]
    fn message(&self) -> String {
        self.render(&Shown {
            verb: false,
            bar: 0,
            bytes: false,
            tag: true,
            eta: true,
            name: Some(usize::MAX),
            limit: true,
            resumed: true,
        })
        .split_once("  ")
        .map_or(String::new(), |(_, m)| m.to_owned())
    }

    /// Percent moved, rounded down (100 only when all moved).
    fn percent(&self) -> u64 {
        match self.total {
            0 => 100,
            t => (u128::from(self.done.min(t)) * 100 / u128::from(t)) as u64,
        }
    }

    fn render(&self, s: &Shown) -> String {
        let mut head = Vec::new();
        if s.verb && !self.verb.is_empty() {
            head.push(self.verb.to_owned());
        }
        if s.bar > 0 {
            let full = (u128::from(self.done.min(self.total)) * s.bar as u128
                / u128::from(self.total.max(1))) as usize;
            let mut bar = "=".repeat(full);
            if full < s.bar {
                bar.push(if self.done > 0 { '>' } else { ' ' });
                bar.push_str(&" ".repeat(s.bar - full - 1));
            }
            head.push(format!("[{bar}]"));
        }
        head.push(format!("{}%", self.percent()));
        if s.bytes {
            // "20.1/48.0 MiB" when both are in the same unit.
            let (done, total) = (bytes(self.done), bytes(self.total));
            head.push(match (done.split_once(' '), total.split_once(' ')) {
                (Some((d, unit)), Some((t, same))) if unit == same => format!("{d}/{t} {unit}"),
                _ => format!("{done}/{total}"),
            });
        }
        let mut rate = String::new();
        if let (true, Some(tag)) = (s.tag, self.tag) {
            rate += &format!("[{tag}] ");
        }
        rate += &self.rate;
        if let (true, Some(eta)) = (s.eta, &self.eta) {
            rate += &format!(", ETA {eta}");
        }
        let mut parts = vec![head.join(" "), rate];
        if let Some(width) = s.name {
            if let Some((first, more)) = &self.files {
                let mut f = middle(first, width);
                if *more > 0 {
                    f += &format!(" (+{more} more)");
                }
                parts.push(f);
            }
            if let Some(note) = &self.note {
                parts.push(cut(note, width));
            }
        }
        if let (true, Some(limit)) = (s.limit, &self.limit) {
            parts.push(format!("limited by {limit}"));
        }
        if s.resumed && self.resumed > 0 {
            parts.push(format!(
                "(resumed: {} were already there)",
                bytes(self.resumed)
            ));
        }
        parts.join("  ")
    }

    /// The line in at most `width` columns, its parts given up in the order [`Bar`] states.
    fn fit(&self, width: usize) -> String {
        let mut s = Shown {
            verb: true,
            bar: BAR,
            bytes: true,
            tag: true,
            eta: true,
            name: Some(usize::MAX),
            limit: true,
            resumed: true,
        };
        let name_w = |line: &Line| {
            line.files
                .as_ref()
                .map(|(f, _)| f.as_str())
                .or(line.note.as_deref())
                .map_or(0, console::measure_text_width)
        };
        let steps: [fn(&mut Shown, usize, usize); 10] = [
            |s, over, name| s.name = Some(name.saturating_sub(over).max(NAME_SHORT)),
            |s, _, _| s.resumed = false,
            |s, _, _| s.limit = false,
            // Straight to narrow: a bar whose width followed the digits would jitter.
            |s, _, _| s.bar = BAR_NARROW,
            |s, _, _| s.name = None,
            |s, _, _| s.bar = 0,
            |s, _, _| s.bytes = false,
            |s, _, _| s.eta = false,
            |s, _, _| s.verb = false,
            |s, _, _| s.tag = false,
        ];
        let mut line = self.render(&s);
        for step in steps {
            let over = console::measure_text_width(&line).saturating_sub(width);
            if over == 0 {
                return line;
            }
            step(&mut s, over, name_w(self));
            line = self.render(&s);
        }
        cut(&line, width)
    }
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
    if done == 0 {
        // No bar before the first bytes: it would be an empty one.
        return View::Waiting("starting the transfer…".into());
    }
    let mut line = Line {
        verb: "",
        done,
        total,
        tag: p.route_tag(),
        rate: String::new(),
        eta: None,
        files: None,
        note: None,
        limit: None,
        resumed: p.resumed.load(Ordering::Relaxed),
    };
    if done >= total {
        let end = *meter.all_moved.get_or_insert(now);
        let secs = end.saturating_duration_since(since).as_secs_f64().max(1e-3);
        line.rate = format!("{} average", rate(total as f64 * 8.0 / secs));
        line.note = Some(if receiver {
            "all received, finishing…".into()
        } else {
            "all sent, waiting for the receiver to confirm".into()
        });
    } else {
        line.rate = match bps {
            Some(bps) => rate(bps),
            None => "measuring the rate".into(),
        };
        // The time left, as soon as there is a rate to reckon it by.
        line.eta = bps
            .filter(|&b| b > 0.0)
            .map(|bps| eta((total - done) as f64 * 8.0 / bps));
        let files = p.moving_files(MOVING_WITHIN);
        line.files = files.first().map(|f| (f.clone(), files.len() - 1));
        line.limit = p.limit();
    }
    View::Moving(line)
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
        above_bar(|| eprintln!("{line}"));
    } else {
        above_bar(|| println!("{line}"));
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

/// How many files `-v` lists with their BLAKE3 value; the rest are counted (`-vv` and `--json`
/// list every one).
const LISTED_FILES: usize = 10;

/// The `-v` lines of the files' BLAKE3 values: the first [`LISTED_FILES`], then how many more;
/// at `-vv` (`verbose` 2 or more) every file.
fn hash_lines(files: &[hurtle_engine::report::FileReport], verbose: u8) -> Vec<String> {
    let listed = if verbose >= 2 {
        files.len()
    } else {
        LISTED_FILES
    };
    let mut lines: Vec<String> = files
        .iter()
        .take(listed)
        .map(|f| match f.blake3.as_str() {
            "" => format!("  {:<64}  {}", "(not read: the receiver had it)", f.path),
            hash => format!("  {hash}  {}", f.path),
        })
        .collect();
    if files.len() > listed {
        lines.push(format!(
            "  ... and {} more files (-vv or --json lists every file's BLAKE3)",
            files.len() - listed
        ));
    }
    lines
}

/// The pacing the sender ended with: "final rate 412.0 Mbit/s (auto)"; over TCP, where the
/// kernel paces unless `--rate` caps it, what did.
fn pacing(s: &SendSummary) -> String {
    /// The rate a TCP session gets when nothing caps it (the engine's "unpaced").
    const UNPACED: u64 = 100_000_000_000;
    match (s.transport, s.rate.final_bps) {
        ("tcp", bps) if bps >= UNPACED => "paced by TCP's congestion control".into(),
        ("tcp", bps) => format!("capped at {}", rate(bps as f64)),
        (_, bps) => format!("final rate {} ({})", rate(bps as f64), s.rate.mode),
    }
}

/// The bytes of the files skipped because the receiver had them.
fn skipped_bytes(files: &[hurtle_engine::report::FileReport]) -> u64 {
    files.iter().filter(|f| f.skipped).map(|f| f.size).sum()
}

/// "all 503 files", "the file".
fn all_files(n: usize) -> String {
    match n {
        1 => "the file".into(),
        n => format!("all {n} files"),
    }
}

/// What a dry run (`-n`) found, either side's: the `--json` object and the lines of the list.
#[derive(Debug, serde::Serialize)]
pub struct Plan<'a> {
    /// Always true: nothing moved, nothing was written.
    pub dry_run: bool,
    /// The files that would be sent.
    pub send: Vec<PlanFile<'a>>,
    /// The files that would be skipped (the receiver has them).
    pub skip: Vec<PlanFile<'a>>,
    /// The paths a mirror (`--delete`) would delete on the receiver.
    pub delete: Vec<&'a str>,
    /// The bytes that would be sent.
    pub bytes: u64,
}

/// One file of a [`Plan`].
#[derive(Debug, serde::Serialize)]
pub struct PlanFile<'a> {
    /// As the manifest names it.
    pub path: &'a str,
    /// Bytes.
    pub size: u64,
}

impl<'a> Plan<'a> {
    /// The plan in a dry run's summary: its files (skipped or not) and the warning lines that
    /// name a path to delete ([`hurtle_engine::mirror::DELETING`]).
    pub fn of(files: &'a [hurtle_engine::report::FileReport], warnings: &'a [String]) -> Plan<'a> {
        let file = |f: &'a hurtle_engine::report::FileReport| PlanFile {
            path: &f.path,
            size: f.size,
        };
        Plan {
            dry_run: true,
            send: files.iter().filter(|f| !f.skipped).map(file).collect(),
            skip: files.iter().filter(|f| f.skipped).map(file).collect(),
            delete: warnings
                .iter()
                .filter_map(|w| w.strip_prefix(hurtle_engine::mirror::DELETING))
                .collect(),
            bytes: files.iter().filter(|f| !f.skipped).map(|f| f.size).sum(),
        }
    }

    /// The list, one line per path (`send`, `skip`, `delete`), the first [`LISTED_FILES`]
    /// and then how many more; at `-vv` every one.
    pub fn lines(&self, verbose: u8) -> Vec<String> {
        let all = self
            .send
            .iter()
            .map(|f| format!("  send    {}", f.path))
            .chain(self.skip.iter().map(|f| format!("  skip    {}", f.path)))
            .chain(self.delete.iter().map(|p| format!("  delete  {p}")));
        let total = self.send.len() + self.skip.len() + self.delete.len();
        let listed = if verbose >= 2 { total } else { LISTED_FILES };
        let mut lines: Vec<String> = all.take(listed).collect();
        if total > listed {
            lines.push(format!(
                "  ... and {} more (-vv or --json lists every one)",
                total - listed
            ));
        }
        lines
    }

    /// The closing line: "dry run: would send 3 files (1.2 MiB), skip 2, delete 1; nothing
    /// moved".
    pub fn headline(&self) -> String {
        let mut s = format!(
            "dry run: would send {} file{} ({})",
            self.send.len(),
            if self.send.len() == 1 { "" } else { "s" },
            bytes(self.bytes)
        );
        s += &format!(", skip {}", self.skip.len());
        if !self.delete.is_empty() {
            s += &format!(", delete {}", self.delete.len());
        }
        s + "; nothing moved, nothing was written"
    }
}

/// A dry run's summary (`-n`, either side's files and warnings): the plan's list and its
/// closing line, or with `--json` the [`Plan`] object.
pub fn print_plan(
    out: &OutputArgs,
    files: &[hurtle_engine::report::FileReport],
    warnings: &[String],
) {
    let plan = Plan::of(files, warnings);
    for w in warnings {
        let listed = w.starts_with(hurtle_engine::mirror::DELETING)
            || w.starts_with(hurtle_engine::mirror::DRY_RUN);
        if !out.quiet && !listed {
            warning(w);
        }
    }
    if out.json {
        return json(&plan);
    }
    for line in plan.lines(out.verbose) {
        say(out, &line);
    }
    say(out, &format!("hurtle: {}", plan.headline()));
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
    // Every file skipped: no data moved, so no rate, and nothing limited it.
    let skipped_all = s.skipped > 0 && s.skipped == s.files;
    if skipped_all {
        say(
            out,
            &format!(
                "nothing to send: the receiver already had {} ({}{}) in {:.2} s",
                all_files(s.files),
                bytes(skipped_bytes(&s.file_hashes)),
                if s.dirs > 0 {
                    format!(", {} dirs", s.dirs)
                } else {
                    String::new()
                },
                s.seconds
            ),
        );
    } else {
        say(out, &format!(
            "sent {} in {} files ({} dirs{}{}) in {:.2} s: {} over {} {} {}, {:.2}% resent, {} NACKs, {}",
            bytes(s.bytes), s.files, s.dirs,
            if s.skipped > 0 { format!(", {} skipped: the receiver had them", s.skipped) } else { String::new() },
            not_sent(s.resumed_bytes, s.sparse_bytes), s.seconds, rate(s.goodput_bps), s.channels, s.transport,
            if s.transport == "tcp" { "connections" } else { "channels" }, s.resent_share * 100.0, s.nacks,
            pacing(s)
        ));
    }
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
    if skipped_all {
        if out.verbose > 0 {
            hash_lines(&s.file_hashes, out.verbose)
                .iter()
                .for_each(|l| say(out, l));
        }
        return;
    }
    if let Some(b) = &s.bottleneck {
        say(out, &format!("limited by {}", b.detail));
    }
    if let Some(line) = outage_line(&s.rate.outages) {
        say(out, &line);
    }
    if out.verbose > 0 {
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
        if s.transport != "tcp" {
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
        }
        hash_lines(&s.file_hashes, out.verbose)
            .iter()
            .for_each(|l| say(out, l));
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
    let skipped = s.file_hashes.iter().filter(|f| f.skipped).count();
    if skipped > 0 && skipped == s.files {
        // Every file was here already: no data moved, so no rate.
        say(
            out,
            &format!(
                "nothing to receive: {} from {} ({}) already here, checked in {:.2} s",
                all_files(s.files),
                s.peer,
                bytes(skipped_bytes(&s.file_hashes)),
                s.seconds
            ),
        );
    } else {
        say(
            out,
            &format!(
            "received {} in {} files ({} dirs{}) from {} in {:.2} s: {}, {} NACKs, {} datagrams rejected",
            bytes(s.bytes), s.files, s.dirs, not_sent(s.resumed_bytes, s.sparse_bytes), s.peer, s.seconds, rate(s.goodput_bps), s.nacks, s.rejected
        ),
        );
    }
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
    if let Some(line) = receive_path_line(s) {
        say(out, &line);
    }
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
    if out.verbose > 0 {
        hash_lines(&s.file_hashes, out.verbose)
            .iter()
            .for_each(|l| say(out, l));
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
            above_bar(|| eprintln!("hurtle: {}", m.0));
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
    above_bar(|| eprintln!("hurtle: {tag} {line}"));
}

/// Prints `hurtle: warning: LINE` on stderr, in one write.
pub fn warning(line: &str) {
    let tag = console::style("warning:").yellow().bold().for_stderr();
    above_bar(|| eprintln!("hurtle: {tag} {line}"));
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

/// Which path carried how many bytes of a relayed receive, as they arrived (see
/// [`path_line`]). `None` when nothing came through a relay.
fn receive_path_line(s: &ReceiveSummary) -> Option<String> {
    let b = &s.bytes_by_path;
    route_line(
        [b.relay_udp, b.direct, b.relay_tcp],
        s.direct_after_seconds,
        None,
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
    fn a_plan_lists_ten_paths_then_counts_the_rest_and_every_one_at_vv() {
        let files: Vec<hurtle_engine::report::FileReport> = (0..12)
            .map(|i| hurtle_engine::report::FileReport {
                path: format!("t/f{i:02}"),
                size: 10,
                blake3: String::new(),
                hash: "blake3",
                skipped: i % 3 == 0,
            })
            .collect();
        let warnings = vec![
            format!("{}t/old", hurtle_engine::mirror::DELETING),
            "something else".to_string(),
        ];
        let plan = Plan::of(&files, &warnings);
        assert_eq!((plan.send.len(), plan.skip.len()), (8, 4));
        assert_eq!(plan.delete, ["t/old"]);
        assert_eq!(plan.bytes, 80);
        let lines = plan.lines(0);
        assert_eq!(lines.len(), 11);
        assert_eq!(lines[0], "  send    t/f01");
        assert_eq!(
            lines[10],
            "  ... and 3 more (-vv or --json lists every one)"
        );
        let all = plan.lines(2);
        assert_eq!(all.len(), 13);
        assert_eq!(all[12], "  delete  t/old");
        assert_eq!(
            plan.headline(),
            "dry run: would send 8 files (80 B), skip 4, delete 1; nothing moved, nothing was written"
        );
    }

    #[test]
    fn the_progress_line_of_a_relayed_send_says_which_way_its_data_goes() {
        use hurtle_engine::progress::Route;
        let p = Progress::default();
        p.total.store(100_000_000, Ordering::Relaxed);
        p.sent.store(1_000_000, Ordering::Relaxed);
        p.set_phase(Phase::Moving);
        let since = p.moving_since().unwrap();
        let msg = |p: &Progress| {
            let mut meter = Meter::default();
            match describe(p, &Side::Sender, &mut meter, since + Duration::from_secs(1)) {
                View::Moving(line) => line.message(),
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
        let View::Moving(line) = view else {
            panic!("a bar: {view:?}")
        };
        assert_eq!((line.done, line.total), (25_000_000, 100_000_000));
        assert_eq!(line.message(), "200.0 Mbit/s, ETA 3 s  b.bin (+1 more)");
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
                let View::Moving(line) = view else {
                    panic!("a bar")
                };
                assert_eq!(line.done, 65_000_000);
                let msg = line.message();
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
            let View::Moving(line) = view else {
                panic!("a bar")
            };
            assert_eq!(
                line.message(),
                "100.0 Mbit/s average  all sent, waiting for the receiver to confirm"
            );
        }
    }

    fn a_line() -> Line {
        Line {
            verb: "sending",
            done: 21_076_377,
            total: 50_331_648,
            tag: Some("relay"),
            rate: "200.0 Mbit/s".into(),
            eta: Some("2 s".into()),
            files: Some(("tty-progress-payload-with-a-long-name.bin".into(), 2)),
            note: None,
            limit: Some("the path, about 412 Mbit/s, 1.0% random loss".into()),
            resumed: 12 << 20,
        }
    }

    #[test]
    fn the_progress_line_fits_the_width_and_gives_up_parts_in_the_stated_order() {
        let line = a_line();
        let full = line.fit(usize::MAX);
        assert_eq!(
            full,
            "sending [========>           ] 41% 20.1/48.0 MiB  [relay] 200.0 Mbit/s, ETA 2 s  \
             tty-progress-payload-with-a-long-name.bin (+2 more)  limited by the path, about \
             412 Mbit/s, 1.0% random loss  (resumed: 12.0 MiB were already there)"
        );
        let width = console::measure_text_width;
        // Every width from the full line's down to 1: never wider, and the parts that show
        // are those the order leaves.
        let order = [
            "(resumed:",
            "limited by",
            "(+2 more)",
            "] 41%",
            "20.1/48.0 MiB",
            "ETA 2 s",
            "sending",
            "[relay]",
        ];
        let mut gone = 0;
        for w in (1..=width(&full)).rev() {
            let l = line.fit(w);
            assert!(width(&l) <= w, "{w}: {l:?} is {} wide", width(&l));
            // Once a part went, it stays gone at narrower widths, and those before it too.
            while gone < order.len() && !l.contains(order[gone]) {
                gone += 1;
            }
            for p in &order[gone..] {
                assert!(
                    l.contains(p),
                    "{w}: {l:?} lost {p:?} before {:?}",
                    order[gone]
                );
            }
            if w >= 17 {
                assert!(l.contains("41% ") || l.ends_with("41%"), "{w}: {l:?}");
                assert!(l.contains("200.0 Mbit/s"), "{w}: {l:?}");
            }
        }
        assert_eq!(gone, order.len(), "at 1 column, everything went");
        // The file name is shortened in the middle first, keeping its end.
        let l = line.fit(width(&full) - 10);
        assert!(
            l.contains("tty-progress-pa…a-long-name.bin (+2 more)"),
            "{l}"
        );
        assert!(l.contains("limited by") && l.contains("(resumed:"), "{l}");
        // At 80 columns: the bar, narrowed; no notes, no room for the files.
        assert_eq!(
            line.fit(80),
            "sending [====>     ] 41% 20.1/48.0 MiB  [relay] 200.0 Mbit/s, ETA 2 s"
        );
        // One file, not relayed, nothing limiting yet: its name fits at 80, shortened.
        let one = Line {
            tag: None,
            files: Some(("tty-progress-payload.bin".into(), 0)),
            limit: None,
            resumed: 0,
            ..line.clone()
        };
        assert_eq!(
            one.fit(80),
            "sending [====>     ] 41% 20.1/48.0 MiB  200.0 Mbit/s, ETA 2 s  tty-prog…oad.bin"
        );
        assert_eq!(
            one.fit(200),
            "sending [========>           ] 41% 20.1/48.0 MiB  200.0 Mbit/s, ETA 2 s  \
             tty-progress-payload.bin"
        );
        // At 60: no file, no bar.
        assert_eq!(
            line.fit(60),
            "sending 41% 20.1/48.0 MiB  [relay] 200.0 Mbit/s, ETA 2 s"
        );
        assert_eq!(line.fit(25), "41%  [relay] 200.0 Mbit/s");
        assert_eq!(line.fit(18), "41%  200.0 Mbit/s");
    }

    #[test]
    fn names_are_shortened_in_the_middle_by_columns() {
        assert_eq!(middle("short.bin", 16), "short.bin");
        assert_eq!(
            middle("abcdefghijklmnopqrstuvwxyz.bin", 16),
            "abcdefgh…xyz.bin"
        );
        assert_eq!(
            console::measure_text_width(&middle("日本語のファイル名.txt", 11)),
            11
        );
        assert_eq!(middle("abcdef", 2), "a…");
    }

    #[test]
    fn no_bar_before_the_first_bytes_and_an_eta_with_the_first_rate() {
        let p = Progress::default();
        p.total.store(100_000_000, Ordering::Relaxed);
        p.set_phase(Phase::Moving);
        let since = p.moving_since().unwrap();
        let mut meter = Meter::default();
        let view = describe(
            &p,
            &Side::Sender,
            &mut meter,
            since + Duration::from_millis(50),
        );
        assert_eq!(view, View::Waiting("starting the transfer…".into()));
        // A fifth of a second in, 5 MB moved: a rate, and the time left with it.
        p.sent.store(5_000_000, Ordering::Relaxed);
        let view = describe(
            &p,
            &Side::Sender,
            &mut meter,
            since + Duration::from_millis(200),
        );
        let View::Moving(line) = view else {
            panic!("a bar: {view:?}")
        };
        assert_eq!(line.message(), "200.0 Mbit/s, ETA 4 s");
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
