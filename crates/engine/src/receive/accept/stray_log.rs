//! How many strays the log tells one by one: [`StrayLog`], the decision, with the time given
//! (no clock, no thread, no logging of its own), so that it is tested with made-up instants.
//!
//! A flood of connections (a port scan, a hostile client opening thousands) must not be a
//! flood of lines. The first [`STRAY_LOG_BURST`] strays of a *window* ([`STRAY_LOG_WINDOW`],
//! from the first of them) get a line each, as one stray always did; the rest are counted, and
//! one line says how many when the window ends, with the last one's address and reason:
//!
//! ```text
//! ... and 457 more stray connections dropped in the last 10 s (last from 10.0.0.5:5123: sent 'GET / HTTP/1.1' (not a hurtle peer))
//! ```
//!
//! A window in which some strays were only counted is a flood: the next window follows it at
//! once and counts every stray in it (no lines of their own), so a flood that goes on costs
//! one line per window; the first window without a stray ends it, and the next stray starts a
//! window with its lines again. What is counted is never lost: it is said when its window ends
//! ([`StrayLog::tick`], at [`StrayLog::due`], or by the next stray), when a session starts
//! ([`StrayLog::flush`]: the line comes before the sender's), or when the door closes
//! ([`StrayLog::close`], after which every stray gets a line).
//!
//! A failed agreement with the receiver's code ([`StrayKind::CodeTry`]) always gets a line of
//! its own, in a flood too, and uses none of a window's lines: the third spends the code, and
//! the user must be able to see who is guessing it.
//!
//! A connection closed before it sent a byte ([`StrayKind::Left`]) is no stray to the user: it
//! is what a sender's losing connect attempt looks like ([`crate::net::dial`]: the sender
//! starts a second connect when the first is slow, and closes the one that loses). It gets a
//! line at `debug`, which the CLI does not print, and takes no part in the windows.

use std::fmt;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How many strays of a window get a line of their own.
pub const STRAY_LOG_BURST: u32 = 10;

/// How long a window of the stray log is: a flood is summarised once per window.
pub const STRAY_LOG_WINDOW: Duration = Duration::from_secs(10);

/// What kind of stray it is, to the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrayKind {
    /// It said nothing, or too little, or the door was busy: information.
    Quiet,
    /// It sent bytes that are not hurtle's (or failed the agreement with a key): a warning.
    Foreign,
    /// It failed the agreement with the receiver's code, one of its tries: a warning, and
    /// always a line of its own.
    CodeTry,
    /// It closed before sending a byte: a sender's losing connect attempt, most likely (or a
    /// port scanner's connect). A line at `debug`, outside the windows, and not counted.
    Left,
}

/// A line to log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogLine {
    /// At `debug`.
    Debug(String),
    /// At `info`.
    Info(String),
    /// At `warn`.
    Warn(String),
}

impl LogLine {
    /// The line's text.
    pub fn text(&self) -> &str {
        match self {
            LogLine::Debug(t) | LogLine::Info(t) | LogLine::Warn(t) => t,
        }
    }

    fn new(warn: bool, text: String) -> LogLine {
        if warn {
            LogLine::Warn(text)
        } else {
            LogLine::Info(text)
        }
    }
}

/// The line one stray gets: `stray connection from PEER dropped: REASON`.
fn stray_line(peer: SocketAddr, reason: &dyn fmt::Display) -> String {
    format!("stray connection from {peer} dropped: {reason}")
}

/// Which strays get a line of their own, and when the others are summarised (see the module's
/// documentation). Pure: every call takes the time.
#[derive(Debug)]
pub struct StrayLog {
    burst: u32,
    window: Duration,
    current: Option<Window>,
    /// The door closed: every stray gets its line.
    closed: bool,
}

/// A window of the log.
#[derive(Debug)]
struct Window {
    start: Instant,
    /// Strays that got a line in it (all of them, [`StrayLog::burst`], in a flood's window).
    lines: u32,
    /// Some stray of it was counted rather than told: the next window follows it at once.
    flooded: bool,
    /// Counted and not yet said.
    counted: u64,
    /// Since when `counted` counts.
    since: Instant,
    /// The last one counted: its peer and reason.
    last: String,
    /// Some counted one was [`StrayKind::Foreign`].
    foreign: bool,
}

impl Window {
    fn new(start: Instant, lines: u32) -> Window {
        Window {
            start,
            lines,
            flooded: false,
            counted: 0,
            since: start,
            last: String::new(),
            foreign: false,
        }
    }

    /// The line that says what was counted since `since`, until `until`; and nothing is counted
    /// after it.
    fn summary(&mut self, until: Instant) -> Option<LogLine> {
        if self.counted == 0 {
            return None;
        }
        let n = self.counted;
        let text = format!(
            "... and {n} more stray connection{} dropped in the last {} s (last from {})",
            if n == 1 { "" } else { "s" },
            seconds(until.saturating_duration_since(self.since)),
            self.last
        );
        let line = LogLine::new(self.foreign, text);
        self.counted = 0;
        self.since = until;
        self.last.clear();
        self.foreign = false;
        Some(line)
    }
}

/// `d` in seconds for a person: whole from 10 s up, else to a tenth ("2.5", "10", "0.1").
fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 9.95 {
        format!("{s:.0}")
    } else {
        let tenths = (s * 10.0).round().max(1.0);
        if tenths % 10.0 == 0.0 {
            format!("{:.0}", tenths / 10.0)
        } else {
            format!("{:.1}", tenths / 10.0)
        }
    }
}

impl Default for StrayLog {
    fn default() -> Self {
        StrayLog::new(STRAY_LOG_BURST, STRAY_LOG_WINDOW)
    }
}

impl StrayLog {
    /// The first `burst` strays of each `window` get a line; the rest are summarised.
    pub fn new(burst: u32, window: Duration) -> StrayLog {
        StrayLog {
            burst,
            window,
            current: None,
            closed: false,
        }
    }

    /// A stray dropped at `now`: what to log, in order (the summary of a window that has
    /// ended, then its own line), or nothing (it is counted, for a summary). One that
    /// [`StrayKind::Left`] gets its line at `debug`, and the log is as it was.
    pub fn record(
        &mut self,
        now: Instant,
        kind: StrayKind,
        peer: SocketAddr,
        reason: &dyn fmt::Display,
    ) -> Vec<LogLine> {
        if kind == StrayKind::Left {
            return vec![LogLine::Debug(stray_line(peer, reason))];
        }
        let mut said: Vec<LogLine> = self.tick(now).into_iter().collect();
        let own = |reason: &dyn fmt::Display| {
            LogLine::new(kind != StrayKind::Quiet, stray_line(peer, reason))
        };
        if self.closed || kind == StrayKind::CodeTry {
            said.push(own(reason));
            return said;
        }
        let burst = self.burst;
        let w = self.current.get_or_insert_with(|| Window::new(now, 0));
        if w.lines < burst {
            w.lines += 1;
            said.push(own(reason));
        } else {
            w.flooded = true;
            w.counted += 1;
            w.last = format!("{peer}: {reason}");
            w.foreign |= kind == StrayKind::Foreign;
        }
        said
    }

    /// When [`StrayLog::tick`] has something to do: the current window's end.
    pub fn due(&self) -> Option<Instant> {
        self.current.as_ref().map(|w| w.start + self.window)
    }

    /// At `now`: ends the current window if its time is over, with the summary of what it
    /// counted. A flooded window is followed at once by one that counts every stray; a window
    /// without a counted stray ends the flood.
    pub fn tick(&mut self, now: Instant) -> Option<LogLine> {
        let end = self.due().filter(|&end| now >= end)?;
        let mut w = self.current.take()?;
        let said = w.summary(end);
        if w.flooded && now < end + self.window {
            self.current = Some(Window::new(end, self.burst));
        }
        said
    }

    /// Says now what is counted and not yet said (a session starts: its lines come after). The
    /// window goes on as it was.
    pub fn flush(&mut self, now: Instant) -> Option<LogLine> {
        self.tick(now)
            .or_else(|| self.current.as_mut().and_then(|w| w.summary(now)))
    }

    /// The door closed: says what is counted, and every later stray (a greeting that was under
    /// way) gets its own line.
    pub fn close(&mut self, now: Instant) -> Option<LogLine> {
        let said = self.flush(now);
        self.current = None;
        self.closed = true;
        said
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 5], port))
    }

    const WHY: &str = "sent 'GET / HTTP/1.1' (not a hurtle peer)";

    fn line(port: u16) -> LogLine {
        LogLine::Warn(format!(
            "stray connection from 10.0.0.5:{port} dropped: {WHY}"
        ))
    }

    /// The number a summary line says, if it is one.
    fn summarised(l: &LogLine) -> Option<u64> {
        let rest = l.text().strip_prefix("... and ")?;
        rest.split(' ').next()?.parse().ok()
    }

    /// Strays logged or summarised in `lines`.
    fn accounted(lines: &[LogLine]) -> u64 {
        lines
            .iter()
            .map(|l| {
                summarised(l).unwrap_or_else(|| {
                    assert!(l.text().starts_with("stray connection from "), "{l:?}");
                    1
                })
            })
            .sum()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_first_strays_of_a_window_get_a_line_each_the_rest_one_summary_at_its_end() {
        let t0 = Instant::now();
        let mut log = StrayLog::new(3, Duration::from_secs(10));
        for i in 0..3 {
            let said = log.record(t0 + ms(i), StrayKind::Foreign, peer(1000 + i as u16), &WHY);
            assert_eq!(said, vec![line(1000 + i as u16)]);
        }
        for i in 3..460 {
            let said = log.record(t0 + ms(i), StrayKind::Foreign, peer(1000 + i as u16), &WHY);
            assert_eq!(said, vec![], "stray {i}");
        }
        assert_eq!(log.due(), Some(t0 + Duration::from_secs(10)));
        assert_eq!(log.tick(t0 + ms(9_999)), None, "the window is not over");
        assert_eq!(
            log.tick(t0 + ms(10_003)),
            Some(LogLine::Warn(format!(
                "... and 457 more stray connections dropped in the last 10 s (last from 10.0.0.5:1459: {WHY})"
            )))
        );
        assert_eq!(log.tick(t0 + ms(10_004)), None, "said once");
    }

    #[test]
    fn a_few_strays_get_their_lines_and_no_summary() {
        let t0 = Instant::now();
        let mut log = StrayLog::new(10, Duration::from_secs(10));
        for i in 0..10 {
            let said = log.record(t0 + ms(i * 100), StrayKind::Quiet, peer(7), &"sent nothing");
            assert_eq!(
                said,
                vec![LogLine::Info(
                    "stray connection from 10.0.0.5:7 dropped: sent nothing".into()
                )]
            );
        }
        assert_eq!(log.tick(t0 + Duration::from_secs(10)), None);
        assert_eq!(log.due(), None, "no flood: nothing more to wait for");
        // A later burst gets its lines again.
        let said = log.record(
            t0 + Duration::from_secs(11),
            StrayKind::Quiet,
            peer(8),
            &"x",
        );
        assert_eq!(said.len(), 1);
    }

    #[test]
    fn a_flood_that_goes_on_is_one_summary_per_window_and_one_when_it_stops() {
        let t0 = Instant::now();
        let window = Duration::from_secs(10);
        let mut log = StrayLog::new(10, window);
        let mut lines = Vec::new();
        // 100 strays a second for 35 s, the timer ticking at each window's end as it falls due.
        for i in 0..3500u64 {
            let now = t0 + ms(i * 10);
            while let Some(due) = log.due().filter(|&d| d <= now) {
                lines.extend(log.tick(due));
            }
            lines.extend(log.record(now, StrayKind::Foreign, peer(1), &WHY));
        }
        // The flood stops: its last window is said at its end, and then it is over.
        let end = log.due().unwrap();
        assert_eq!(end, t0 + 4 * window);
        assert_eq!(log.tick(end - ms(1)), None);
        lines.extend(log.tick(end));
        assert_eq!(log.tick(end + window), None);
        assert_eq!(log.due(), None, "the flood is over");
        assert_eq!(accounted(&lines), 3500);
        let counts: Vec<Option<u64>> = lines.iter().map(summarised).collect();
        let mut want = vec![None; 10];
        want.extend([Some(990), Some(1000), Some(1000), Some(500)]);
        assert_eq!(counts, want, "{lines:#?}");
        assert!(lines[10].text().contains("in the last 10 s"), "{lines:?}");
        assert!(lines[13].text().contains("in the last 10 s"), "{lines:?}");
    }

    #[test]
    fn the_next_stray_says_the_summary_of_a_window_that_ended_before_its_line() {
        let t0 = Instant::now();
        let mut log = StrayLog::new(2, Duration::from_secs(10));
        for i in 0..5 {
            log.record(t0 + ms(i), StrayKind::Quiet, peer(i as u16), &"closed");
        }
        // No timer ticked; a stray after the window, but within the next: the summary, and it
        // is counted in the flood's next window.
        let said = log.record(t0 + ms(12_000), StrayKind::Quiet, peer(99), &"closed");
        assert_eq!(
            said,
            vec![LogLine::Info(
                "... and 3 more stray connections dropped in the last 10 s (last from 10.0.0.5:4: closed)"
                    .into()
            )]
        );
        // Long after: that window's summary, then the stray's own line (a new burst).
        let said = log.record(t0 + ms(60_000), StrayKind::Foreign, peer(100), &WHY);
        assert_eq!(
            said,
            vec![
                LogLine::Info(
                    "... and 1 more stray connection dropped in the last 10 s (last from 10.0.0.5:99: closed)"
                        .into()
                ),
                line(100)
            ]
        );
    }

    #[test]
    fn wrong_codes_always_get_their_line_and_use_none_of_the_burst() {
        let t0 = Instant::now();
        let mut log = StrayLog::new(2, Duration::from_secs(10));
        let code = |port| {
            LogLine::Warn(format!(
                "stray connection from 10.0.0.5:{port} dropped: failed the key agreement: wrong code"
            ))
        };
        let why = "failed the key agreement: wrong code";
        assert_eq!(
            log.record(t0, StrayKind::CodeTry, peer(1), &why),
            vec![code(1)]
        );
        assert_eq!(log.due(), None, "a code try starts no window");
        for i in 0..50 {
            log.record(t0 + ms(i), StrayKind::Foreign, peer(2), &WHY);
        }
        // In the middle of a flood, and in the flood's next window.
        assert_eq!(
            log.record(t0 + ms(100), StrayKind::CodeTry, peer(3), &why),
            vec![code(3)]
        );
        let summary = log.tick(t0 + ms(10_000)).unwrap();
        assert_eq!(summarised(&summary), Some(48), "{summary:?}");
        assert_eq!(
            log.record(t0 + ms(10_100), StrayKind::CodeTry, peer(4), &why),
            vec![code(4)]
        );
        assert_eq!(
            log.tick(t0 + ms(20_000)),
            None,
            "code tries are not summarised"
        );
    }

    #[test]
    fn a_session_start_says_what_is_counted_and_the_flood_stays_quiet() {
        let t0 = Instant::now();
        let mut log = StrayLog::new(1, Duration::from_secs(10));
        log.record(t0, StrayKind::Quiet, peer(1), &"closed");
        assert_eq!(log.flush(t0 + ms(500)), None, "nothing counted");
        log.record(t0 + ms(1000), StrayKind::Quiet, peer(2), &"closed");
        log.record(t0 + ms(2000), StrayKind::Foreign, peer(3), &WHY);
        assert_eq!(
            log.flush(t0 + ms(2500)),
            Some(LogLine::Warn(format!(
                "... and 2 more stray connections dropped in the last 2.5 s (last from 10.0.0.5:3: {WHY})"
            )))
        );
        assert_eq!(log.flush(t0 + ms(2600)), None, "said once");
        // The window goes on: still counted, and its end says the rest, since the flush.
        assert_eq!(
            log.record(t0 + ms(3000), StrayKind::Quiet, peer(4), &"closed"),
            vec![]
        );
        assert_eq!(
            log.tick(t0 + ms(10_000)),
            Some(LogLine::Info(
                "... and 1 more stray connection dropped in the last 7.5 s (last from 10.0.0.5:4: closed)"
                    .into()
            ))
        );
        // A flush after the window's end, before the timer: that window's summary, once.
        log.record(t0 + ms(11_000), StrayKind::Quiet, peer(5), &"closed");
        let said = log.flush(t0 + ms(21_000)).unwrap();
        assert!(
            said.text()
                .contains("1 more stray connection dropped in the last 10 s"),
            "{said:?}"
        );
        assert_eq!(log.flush(t0 + ms(21_001)), None);
    }

    #[test]
    fn closing_says_what_is_counted_and_later_strays_get_their_lines() {
        let t0 = Instant::now();
        let mut log = StrayLog::new(1, Duration::from_secs(10));
        for i in 0..4 {
            log.record(t0 + ms(i), StrayKind::Foreign, peer(i as u16), &WHY);
        }
        let said = log.close(t0 + ms(100)).unwrap();
        assert_eq!(summarised(&said), Some(3));
        assert!(said.text().contains("in the last 0.1 s"), "{said:?}");
        assert_eq!(log.due(), None);
        for i in 0..20 {
            assert_eq!(
                log.record(t0 + ms(200 + i), StrayKind::Foreign, peer(9), &WHY),
                vec![line(9)]
            );
        }
        assert_eq!(log.close(t0 + ms(300)), None);
    }

    #[test]
    fn a_connection_that_left_without_a_word_is_a_debug_line_outside_the_windows() {
        let t0 = Instant::now();
        let mut log = StrayLog::new(2, Duration::from_secs(10));
        let left = LogLine::Debug(
            "stray connection from 10.0.0.5:1 dropped: closed without sending anything".into(),
        );
        for i in 0..5 {
            assert_eq!(
                log.record(
                    t0 + ms(i),
                    StrayKind::Left,
                    peer(1),
                    &"closed without sending anything"
                ),
                vec![left.clone()]
            );
        }
        assert_eq!(log.due(), None, "no window started");
        // The burst is whole: the next strays get their lines.
        for i in 0..2 {
            assert_eq!(
                log.record(t0 + ms(10 + i), StrayKind::Foreign, peer(1000), &WHY),
                vec![line(1000)]
            );
        }
        assert_eq!(
            log.record(
                t0 + ms(20),
                StrayKind::Left,
                peer(1),
                &"closed without sending anything"
            ),
            vec![left.clone()]
        );
        assert_eq!(
            log.flush(t0 + ms(30)),
            None,
            "nothing counted for a summary"
        );
        log.close(t0 + ms(40));
        assert_eq!(
            log.record(
                t0 + ms(50),
                StrayKind::Left,
                peer(1),
                &"closed without sending anything"
            ),
            vec![left]
        );
    }

    #[test]
    fn seconds_read_well() {
        assert_eq!(seconds(Duration::from_secs(10)), "10");
        assert_eq!(seconds(ms(9_960)), "10");
        assert_eq!(seconds(ms(2_500)), "2.5");
        assert_eq!(seconds(ms(3_000)), "3");
        assert_eq!(seconds(ms(1)), "0.1");
        assert_eq!(seconds(Duration::from_secs(61)), "61");
    }
}
