//! SIGINT (Ctrl-C) and SIGTERM. A session that is moving data is asked to end: it tells its
//! peer ("the sender was interrupted"), keeps what it verified, and its command prints what was
//! kept ([`kept`]: what is held of the whole, resumed bytes counted) and how to resume, which
//! depends on whether the code can be given again ([`Restart`], set by the command). Before any
//! data moves there is nothing to keep and the process ends at once (a receiver that served
//! transfers says how many, not that nothing moved); a second signal, or a session that has not
//! ended within a few seconds, ends it at once too.

use crate::exit;
use crate::ui;
use hurtle_engine::progress::Phase;
use hurtle_engine::Progress;
use signal_hook::consts::{SIGINT, SIGTERM};
use std::sync::atomic::{AtomicI32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The session a signal should end, if one is running.
static CURRENT: Mutex<Option<Arc<Progress>>> = Mutex::new(None);
/// The first signal received, 0 before any.
static RECEIVED: AtomicI32 = AtomicI32::new(0);
/// How long a session may take to end after a signal.
const GRACE: Duration = Duration::from_secs(5);
/// Sessions of this process that moved data (or found nothing to move) before the current.
static SERVED: AtomicUsize = AtomicUsize::new(0);
/// How an interrupted transfer is started again ([`Restart`] as a `u8`).
static RESTART: AtomicU8 = AtomicU8::new(Restart::Same as u8);

/// How an interrupted transfer is started again: what the message after an interrupt tells the
/// user to do. Either way the part files are kept and the next transfer resumes from them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Restart {
    /// The same command again: the code or keys were given, not printed (or `hurtle cp`,
    /// which makes its own).
    Same = 0,
    /// The receiver printed its code (directly or through a relay), which is gone with it: the
    /// receiver is started again and the sender given the new code.
    ReceiverCode = 1,
    /// The sender printed the code, which ended with the session: the sender is started again
    /// and the receiver given the new code.
    SenderCode = 2,
    /// A sender to a receiver's address or code: whether the receiver and its code are still
    /// there is the receiver's to say, so both cases are told.
    ReceiverDecides = 3,
}

/// Says how this process's transfer is started again after an interrupt (default:
/// [`Restart::Same`]).
pub fn restart_by(how: Restart) {
    RESTART.store(how as u8, Ordering::Relaxed);
}

fn restart() -> Restart {
    match RESTART.load(Ordering::Relaxed) {
        1 => Restart::ReceiverCode,
        2 => Restart::SenderCode,
        3 => Restart::ReceiverDecides,
        _ => Restart::Same,
    }
}

/// Starts the thread that handles the signals. Without it (if the handler cannot be installed)
/// the default action ends the process, which is still safe: part files are kept.
pub fn install() {
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else {
        return;
    };
    let _ = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                on_signal(sig);
            }
        });
}

/// Makes `progress` the session a signal ends. The one before it, if it moved data, is counted
/// as served.
pub fn watch(progress: &Arc<Progress>) {
    let before = CURRENT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .replace(progress.clone());
    if before.is_some_and(|p| !Arc::ptr_eq(&p, progress) && p.phase() == Phase::Moving) {
        SERVED.fetch_add(1, Ordering::Relaxed);
    }
}

/// The exit code for the signal received (130 for SIGINT, 143 for SIGTERM).
pub fn exit_code() -> u8 {
    match RECEIVED.load(Ordering::Relaxed) {
        SIGTERM => exit::SIGTERM,
        _ => exit::SIGINT,
    }
}

fn name() -> &'static str {
    match RECEIVED.load(Ordering::Relaxed) {
        SIGTERM => "SIGTERM",
        _ => "SIGINT",
    }
}

fn on_signal(sig: i32) {
    if RECEIVED
        .compare_exchange(0, sig, Ordering::Relaxed, Ordering::Relaxed)
        .is_err()
    {
        ui::error_line("interrupted again; stopping at once (verified blocks are kept)");
        std::process::exit(i32::from(exit_code()));
    }
    let current = CURRENT.lock().unwrap_or_else(|e| e.into_inner()).clone();
    match current {
        Some(p) if p.phase() == Phase::Moving => {
            p.interrupt();
            std::thread::sleep(GRACE);
            ui::error_line(&format!(
                "interrupted ({}); the session did not end within {} s, stopping anyway",
                name(),
                GRACE.as_secs()
            ));
        }
        _ => ui::error_line(&idle(name(), SERVED.load(Ordering::Relaxed))),
    }
    std::process::exit(i32::from(exit_code()));
}

/// The far side of `hurtle cp` lost its ssh channel (its stdin reached EOF): nobody is left to
/// read a message, so the session is ended as a signal would end it (what was verified is
/// kept), quietly, and the process exits within [`GRACE`]. Never returns.
pub fn hang_up() -> ! {
    let current = CURRENT.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some(p) = current {
        if p.phase() == Phase::Moving {
            p.interrupt();
            // The session ends and the main thread exits the process; this is the bound.
            std::thread::sleep(GRACE);
        }
    }
    std::process::exit(HANG_UP_EXIT);
}

/// The far side's exit code when its ssh channel closed (128 + SIGHUP, as a shell reports a
/// hung-up process); nobody reads it, ssh is gone.
pub const HANG_UP_EXIT: i32 = 129;

/// The line a process interrupted while no data moved prints, after `served` sessions.
fn idle(signal: &str, served: usize) -> String {
    match served {
        0 => format!("interrupted ({signal}) before any data moved; nothing to keep"),
        n => format!(
            "interrupted ({signal}) while waiting, after {n} transfer{}; none was under way",
            if n == 1 { "" } else { "s" }
        ),
    }
}

/// The line the interrupted side prints: what it keeps and how to resume.
pub fn kept(receiver: bool, progress: &Progress) -> String {
    kept_line(name(), receiver, restart(), progress)
}

/// [`kept`] for the signal `signal` and the way `restart`. What is held counts the bytes
/// resumed from an earlier transfer, of the whole (holes of sparse files left out of both).
fn kept_line(signal: &str, receiver: bool, restart: Restart, progress: &Progress) -> String {
    let resumed = progress.resumed.load(Ordering::Relaxed);
    let total = progress.total.load(Ordering::Relaxed) + resumed;
    let (moved, doing, whose) = if receiver {
        (
            progress.sent.load(Ordering::Relaxed),
            "received",
            "its hidden part files (.NAME.hurtle-part)",
        )
    } else {
        (
            progress.confirmed.load(Ordering::Relaxed),
            "the receiver holds",
            "the receiver's hidden part files",
        )
    };
    let earlier = if resumed > 0 {
        format!(" ({} of it from an earlier transfer)", ui::bytes(resumed))
    } else {
        String::new()
    };
    let again = match (receiver, restart) {
        (_, Restart::Same) => "running the same command again resumes from them",
        (true, Restart::ReceiverCode) => {
            "this receiver's code is gone with it: start the receiver again (the same --out) \
             and give the sender the new code it prints; the transfer resumes from them"
        }
        (true, Restart::SenderCode) => {
            "the sender's code ended with the session: run the send again and give this \
             receive the new code it prints; the transfer resumes from them"
        }
        (false, Restart::SenderCode) => {
            "this code ended with the session: run the send again and give the receiver the \
             new code it prints; the transfer resumes from them"
        }
        (false, Restart::ReceiverCode) | (_, Restart::ReceiverDecides) => {
            "sending the same files into the same --out again resumes from them (a receiver \
             that printed its code has ended: start it again and send with its new code)"
        }
    };
    format!(
        "interrupted ({signal}): {doing} {} of {}{earlier}; the blocks verified so far are kept \
         in {whose}; {again}",
        ui::bytes(moved.min(total - resumed) + resumed),
        ui::bytes(total)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resumed_transfer(new: u64, moved: u64, resumed: u64) -> Progress {
        let p = Progress::default();
        p.total.store(new, Ordering::Relaxed);
        p.resumed.store(resumed, Ordering::Relaxed);
        p.sent.store(moved, Ordering::Relaxed);
        p.confirmed.store(moved, Ordering::Relaxed);
        p
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn what_is_held_counts_the_resumed_part_too() {
        // 233 MiB in all, 100 resumed, 68.4 of the other 133 moved this time.
        let p = resumed_transfer(133 * MIB, 68 * MIB + 400 * 1024, 100 * MIB);
        let r = kept_line("SIGINT", true, Restart::Same, &p);
        assert!(
            r.starts_with(
                "interrupted (SIGINT): received 168.4 MiB of 233.0 MiB (100.0 MiB of it from \
                 an earlier transfer); the blocks verified so far are kept in its hidden part \
                 files"
            ),
            "{r}"
        );
        let s = kept_line("SIGTERM", false, Restart::Same, &p);
        assert!(
            s.starts_with("interrupted (SIGTERM): the receiver holds 168.4 MiB of 233.0 MiB"),
            "{s}"
        );
        // Nothing resumed: no note.
        let p = resumed_transfer(10 * MIB, 4 * MIB, 0);
        let r = kept_line("SIGINT", true, Restart::Same, &p);
        assert!(r.starts_with("interrupted (SIGINT): received 4.0 MiB of 10.0 MiB; the"));
    }

    #[test]
    fn a_printed_code_is_not_promised_to_work_again() {
        let p = resumed_transfer(10 * MIB, 4 * MIB, 0);
        let same = kept_line("SIGINT", true, Restart::Same, &p);
        assert!(same.ends_with("running the same command again resumes from them"));
        let fresh = kept_line("SIGINT", true, Restart::ReceiverCode, &p);
        assert!(!fresh.contains("same command"), "{fresh}");
        assert!(
            fresh.contains("start the receiver again")
                && fresh.contains("give the sender the new code")
                && fresh.contains("part files")
                && fresh.contains("resumes"),
            "{fresh}"
        );
        let senders = kept_line("SIGINT", true, Restart::SenderCode, &p);
        assert!(senders.contains("run the send again"), "{senders}");
        let sender = kept_line("SIGINT", false, Restart::ReceiverDecides, &p);
        assert!(
            sender.contains("start it again and send with its new code"),
            "{sender}"
        );
    }

    #[test]
    fn an_idle_receiver_that_served_transfers_says_so() {
        assert_eq!(
            idle("SIGINT", 0),
            "interrupted (SIGINT) before any data moved; nothing to keep"
        );
        assert_eq!(
            idle("SIGINT", 1),
            "interrupted (SIGINT) while waiting, after 1 transfer; none was under way"
        );
        assert!(idle("SIGTERM", 3).contains("after 3 transfers"));
    }

    #[test]
    fn a_session_that_moved_data_counts_as_served_when_the_next_is_watched() {
        let before = SERVED.load(Ordering::Relaxed);
        let idle = Arc::new(Progress::default());
        watch(&idle);
        let moved = Arc::new(Progress::default());
        watch(&moved);
        assert_eq!(
            SERVED.load(Ordering::Relaxed),
            before,
            "the idle one moved nothing"
        );
        moved.set_phase(Phase::Moving);
        watch(&moved);
        assert_eq!(
            SERVED.load(Ordering::Relaxed),
            before,
            "the same session again"
        );
        watch(&Arc::new(Progress::default()));
        assert_eq!(SERVED.load(Ordering::Relaxed), before + 1);
    }
}
