//! SIGINT (Ctrl-C) and SIGTERM. A session that is moving data is asked to end: it tells its
//! peer ("the sender was interrupted"), keeps what it verified, and its command prints what was
//! kept and how to resume. Before any data moves there is nothing to keep and the process ends
//! at once; a second signal, or a session that has not ended within a few seconds, ends it
//! at once too.

use crate::exit;
use crate::ui;
use hurtle_engine::progress::Phase;
use hurtle_engine::Progress;
use signal_hook::consts::{SIGINT, SIGTERM};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The session a signal should end, if one is running.
static CURRENT: Mutex<Option<Arc<Progress>>> = Mutex::new(None);
/// The first signal received, 0 before any.
static RECEIVED: AtomicI32 = AtomicI32::new(0);
/// How long a session may take to end after a signal.
const GRACE: Duration = Duration::from_secs(5);

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

/// Makes `progress` the session a signal ends.
pub fn watch(progress: &Arc<Progress>) {
    *CURRENT.lock().unwrap_or_else(|e| e.into_inner()) = Some(progress.clone());
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
        _ => ui::error_line(&format!(
            "interrupted ({}) before any data moved; nothing to keep",
            name()
        )),
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

/// The line the interrupted side prints: what it keeps and how to resume.
pub fn kept(receiver: bool, progress: &Progress) -> String {
    let total = progress.total.load(Ordering::Relaxed);
    let (held, doing) = if receiver {
        (progress.sent.load(Ordering::Relaxed), "received")
    } else {
        (
            progress.confirmed.load(Ordering::Relaxed),
            "the receiver holds",
        )
    };
    let whose = if receiver {
        "its hidden part files (.NAME.hurtle-part)"
    } else {
        "the receiver's hidden part files"
    };
    format!(
        "interrupted ({}): {doing} {} of {}; the blocks verified so far are kept in {whose}, and \
         running the same send again resumes from them",
        name(),
        ui::bytes(held),
        ui::bytes(total)
    )
}
