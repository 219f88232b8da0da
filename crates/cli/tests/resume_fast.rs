//! End-to-end tests of resuming from a block journal whose lines carry MACs (see the engine's
//! `fs::journal`): a transfer killed (`kill -9`) at any point, on either side, resumes and ends
//! byte-exact; journal lines that are forged, torn or stale are only claims, whose blocks are
//! hashed again and fetched where they are wrong, never a wrong byte.
//!
//! Every process runs under a deadline and is killed by its own handle if it overstays.

#[allow(dead_code)] // shared with the other test binaries
mod support;

use hurtle_proto::hash::block_value;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::fsx;
use support::proc::{self, start_receiver, Proc};
use support::TRANSFER_TIMEOUT;

const MIB: u64 = 1 << 20;

/// The sender's arguments for every transfer here: 1 MiB blocks, two channels.
const ARGS: [&str; 4] = ["--chunk-size", "1M", "--channels", "2"];

/// The part file's journal in `out`, for the file `name`.
fn journal(out: &Path, name: &str) -> PathBuf {
    out.join(format!(".{name}.hurtle-blocks"))
}

/// Starts sending `src` into `out` at `rate`, waits `after` (or until the journal lists
/// `lines` blocks, whichever comes first) and kills one side with SIGKILL (`sender`: the
/// sender, else the receiver); waits for the other side to end. Returns false when the
/// transfer finished before the kill.
fn interrupt(
    src: &Path,
    out: &Path,
    rate: &str,
    after: Duration,
    lines: usize,
    sender: bool,
) -> bool {
    let r = start_receiver(out, &[]);
    let mut args = vec!["--rate", rate];
    args.extend_from_slice(&ARGS);
    let mut s = Proc::spawn("sender", &proc::send_args(r.addr, &[src], &args));
    let j = journal(out, src.file_name().unwrap().to_str().unwrap());
    let start = Instant::now();
    while start.elapsed() < after {
        let listed = fs::read_to_string(&j).map_or(0, |t| t.lines().count().saturating_sub(1));
        if listed >= lines || !s.is_running() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if !s.is_running() {
        s.wait(TRANSFER_TIMEOUT).assert_success();
        r.proc.wait(TRANSFER_TIMEOUT).assert_success();
        return false;
    }
    if sender {
        s.kill();
        r.proc.wait(Duration::from_secs(30));
    } else {
        r.proc.kill();
        s.wait(Duration::from_secs(30));
    }
    true
}

/// Sends `src` into `out` to the end; checks it arrived byte-exact with nothing left behind
/// and returns both summaries.
fn finish(src: &Path, out: &Path) -> (Value, Value) {
    proc::send_whole(src, out, &ARGS, &[])
}

#[test]
fn killed_at_any_point_on_either_side_a_transfer_resumes_byte_exact() {
    let t = support::tempdir("hurtle-resume-");
    let src = t.path().join("src/data.bin");
    let size = 40 * MIB + 12_345;
    fsx::write_random(&src, size, 0x4e5);
    let out = t.path().join("out");
    // Kills early (set-up, first blocks), in the middle and late, on both sides, each
    // resuming from what the one before left: a journal sealed by a receiver that saw its
    // sender die, or left unsealed by a receiver killed itself.
    let kills = [
        (Duration::from_millis(150), 1, true),
        (Duration::from_secs(20), 8, false),
        (Duration::from_secs(20), 15, true),
        (Duration::from_secs(20), 24, true),
        (Duration::from_secs(20), 33, false),
        (Duration::from_secs(20), 38, true),
    ];
    let mut interrupted = 0;
    for (after, lines, sender) in kills {
        interrupted += usize::from(interrupt(&src, &out, "60M", after, lines, sender));
        if out.join("data.bin").exists() {
            break;
        }
    }
    assert!(
        interrupted >= 3,
        "only {interrupted} transfers were interrupted"
    );
    if out.join("data.bin").exists() {
        fsx::assert_same_file(&src, &out.join("data.bin"));
        return;
    }
    let (sj, rj) = finish(&src, &out);
    assert!(sj["resumed_bytes"].as_u64().unwrap() > 0, "{sj}");
    assert_eq!(rj["resumed_bytes"], sj["resumed_bytes"], "{rj}");
    assert_eq!(
        sj["file_hashes"][0]["blake3"],
        fsx::blake3_hex(&src).as_str()
    );
}

/// The journal's lines: `(block, whole line)`, header and seals left out.
fn entries(text: &str) -> Vec<(u64, String)> {
    text.lines()
        .skip(1)
        .filter_map(|l| Some((l.split(' ').next()?.parse().ok()?, l.to_owned())))
        .collect()
}

#[test]
fn forged_torn_and_stale_journal_lines_are_hashed_again_and_fetched() {
    let t = support::tempdir("hurtle-resume-");
    let src = t.path().join("src/data.bin");
    let other = t.path().join("src/other.bin");
    let size = 32 * MIB;
    fsx::write_random(&src, size, 0x4e6);
    fsx::write_random(&other, size, 0x4e7);
    let (out, elsewhere) = (t.path().join("out"), t.path().join("elsewhere"));
    // Two interrupted transfers (their senders killed: both journals sealed), each about a
    // third done.
    for (f, o) in [(&src, &out), (&other, &elsewhere)] {
        assert!(
            interrupt(f, o, "40M", Duration::from_secs(20), 10, true),
            "finished before the kill"
        );
    }
    let j = journal(&out, "data.bin");
    let text = fs::read_to_string(&j).unwrap();
    let mut listed: Vec<u64> = entries(&text).iter().map(|e| e.0).collect();
    listed.sort_unstable();
    listed.dedup();
    let missing: Vec<u64> = (0..32)
        .filter(|b| !listed.contains(b))
        .rev()
        .take(3)
        .collect();
    assert_eq!(missing.len(), 3, "{text}");
    // Each line names a missing block with its right value (as the sender has it), so that a
    // line wrongly trusted would leave that block's zeros in place: the file would differ.
    let data = fs::read(&src).unwrap();
    let right = |b: u64| {
        let v = block_value(
            &data[(b * MIB) as usize..((b + 1) * MIB) as usize],
            b,
            MIB,
            32,
        );
        v.iter().map(|x| format!("{x:02x}")).collect::<String>()
    };
    let mac = |line: &str| line.rsplit(' ').next().unwrap().to_owned();
    let mut lines = text.clone();
    // Forged: under a listed block's MAC.
    let model = &entries(&text)[0].1;
    lines.push_str(&format!(
        "{} {} {}\n",
        missing[0],
        right(missing[0]),
        mac(model)
    ));
    // Stale: under a MAC of the other file's journal (another key).
    let theirs = fs::read_to_string(journal(&elsewhere, "other.bin")).unwrap();
    let stale = mac(&entries(&theirs)[0].1);
    lines.push_str(&format!("{} {} {stale}\n", missing[1], right(missing[1])));
    // Torn: its MAC cut short.
    let torn = &mac(model)[..20];
    lines.push_str(&format!("{} {} {torn}\n", missing[2], right(missing[2])));
    fs::write(&j, lines).unwrap();
    // Those three blocks were never received (the part file holds zeros there): hashed again,
    // they do not match and are fetched. The lines that check are trusted and not fetched.
    let (sj, rj) = finish(&src, &out);
    let resumed = sj["resumed_bytes"].as_u64().unwrap();
    assert_eq!(resumed, (listed.len() as u64 + 3) * MIB, "{sj}");
    assert_eq!(rj["rejected_blocks"].as_u64().unwrap(), 3, "{rj}");
}

#[test]
fn a_source_changed_since_the_interruption_is_noticed_by_its_values() {
    let t = support::tempdir("hurtle-resume-");
    let src = t.path().join("src/data.bin");
    fsx::write_random(&src, 24 * MIB, 0x4e8);
    let out = t.path().join("out");
    assert!(
        interrupt(&src, &out, "40M", Duration::from_secs(20), 8, true),
        "finished before the kill"
    );
    let text = fs::read_to_string(journal(&out, "data.bin")).unwrap();
    let mut listed: Vec<u64> = entries(&text).iter().map(|e| e.0).collect();
    listed.sort_unstable();
    listed.dedup();
    // Two blocks the receiver holds, trusted by its journal, change at the source (same size):
    // the sender's values for them (it reads held blocks to value them) differ from the
    // journal's, and they are fetched again.
    use std::os::unix::fs::FileExt;
    let f = fs::OpenOptions::new().write(true).open(&src).unwrap();
    for &b in &listed[..2] {
        f.write_all_at(b"changed since", b * MIB + 100).unwrap();
    }
    drop(f);
    let (sj, rj) = finish(&src, &out);
    assert_eq!(
        sj["resumed_bytes"].as_u64().unwrap(),
        listed.len() as u64 * MIB
    );
    assert_eq!(rj["rejected_blocks"].as_u64().unwrap(), 2, "{rj}");
}
