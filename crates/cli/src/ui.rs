//! What the user sees: progress bars (terminal only), summaries, JSON.

use crate::OutputArgs;
use hurtle_engine::{Progress, ReceiveSummary, SendSummary};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// A progress bar fed from the session's counters by a background thread. Hidden when stderr is
/// not a terminal, with `-q` or with `--json`.
pub struct Bar {
    bar: ProgressBar,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Bar {
    /// Stops updating and clears the bar.
    pub fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.bar.finish_and_clear();
    }
}

/// Creates the session's counters and, when appropriate, a bar that shows them.
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
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta} {wide_msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_prefix(verb);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let thread = visible.then(|| {
        let (p, b, s) = (progress.clone(), bar.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                b.set_length(p.total.load(Ordering::Relaxed));
                b.set_position(p.sent.load(Ordering::Relaxed));
                if let Ok(cur) = p.current.lock() {
                    let r = p.rate_bps.load(Ordering::Relaxed);
                    let mut msg = if r > 0 {
                        format!("pacing {} {}", rate(r as f64), cur)
                    } else {
                        cur.clone()
                    };
                    let resumed = p.resumed.load(Ordering::Relaxed);
                    if resumed > 0 {
                        msg = format!("{msg} (resumed: {} were already there)", bytes(resumed));
                    }
                    b.set_message(msg);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    });
    (progress, Bar { bar, stop, thread })
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

/// How the peers were paired through a relay, added to the `--json` summary.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PathInfo {
    /// `direct` or `relayed`.
    pub path: &'static str,
    /// The relay, as given.
    pub relay: String,
    /// The code's nameplate (the words stay secret).
    pub code_nameplate: u32,
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
    if let Some(b) = &s.bottleneck {
        say(out, &format!("limited by {}", b.detail));
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
        say(
            out,
            &format!(
                "rate {}: started {}, ended {}, range {} to {}, {} changes {:?}; receiver ceiling {}",
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
    if out.verbose {
        for f in &s.file_hashes {
            say(out, &format!("  {}  {}", f.blake3, f.path));
        }
    }
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
