//! What another account on the receiver's host can see of a transfer under way
//! ([docs/threat-model.md](../../../docs/threat-model.md), "Local user on the same machine"):
//! a file that is still arriving, and its block journal, are readable by their owner only
//! (mode 0600 whatever the source's mode); the file takes the source's mode only once it is
//! complete, verified and under its final name.

#[allow(dead_code)] // shared with the other test binaries
mod support;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use support::proc::{self, start_receiver};
use support::{fsx, TRANSFER_TIMEOUT};

#[test]
fn a_file_still_arriving_and_its_journal_are_readable_by_their_owner_only() {
    let t = support::tempdir("hurtle-local-");
    let src = t.path().join("shared.bin");
    fsx::write_random(&src, 3_000_000, 5300);
    fsx::set_mode(&src, 0o644);
    let out = t.path().join("out");
    let r = start_receiver(&out, &[]);
    // Slow enough (3 MB at 8 Mbit/s: about 3 s) to look at the files while they arrive.
    let sender = proc::Proc::spawn(
        "sender",
        &proc::send_args(r.addr, &[&src], &["--rate", "8M"]),
    );
    let mut seen: BTreeMap<PathBuf, u32> = BTreeMap::new();
    let t0 = Instant::now();
    while t0.elapsed() < TRANSFER_TIMEOUT && !out.join("shared.bin").exists() {
        for p in fsx::part_files(&out) {
            if let Ok(m) = std::fs::metadata(&p) {
                seen.entry(p).or_insert(m.permissions().mode() & 0o777);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    sender.wait(TRANSFER_TIMEOUT).assert_success();
    r.proc.wait(TRANSFER_TIMEOUT).assert_success();
    assert!(
        seen.keys()
            .any(|p| p.to_string_lossy().ends_with(".hurtle-part")),
        "no part file seen while the file arrived: {seen:?}"
    );
    for (p, mode) in &seen {
        eprintln!("seen while the file arrived: {} mode {mode:o}", p.display());
    }
    for (p, mode) in &seen {
        assert_eq!(mode & 0o077, 0, "{} was mode {mode:o}", p.display());
    }
    let done = out.join("shared.bin");
    fsx::assert_same_file(&src, &done);
    let mode = std::fs::metadata(&done).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644, "the complete file takes the source's mode");
}
