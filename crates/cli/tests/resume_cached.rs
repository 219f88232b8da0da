//! End-to-end tests of the sender's cache of block values (the engine's `send::value_cache`):
//! a transfer interrupted on the sender (SIGINT) leaves the values it computed in the cache,
//! and the next one takes the values of the blocks the receiver holds from there instead of
//! reading them (`resume_blocks_cached` in the sender's `--json`), and ends byte-exact; a
//! source changed after the interruption, with its modification time put back as `touch -d`
//! does, has another change time: its held blocks are read and valued again, and the two that
//! changed are fetched. A sender killed outright (SIGKILL) leaves what it kept every 15 s.
//!
//! Every process runs under a deadline and is killed by its own handle if it overstays.

#[allow(dead_code)] // shared with the other test binaries
mod support;

use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::fsx;
use support::proc::{self, start_receiver, Proc};

const MIB: u64 = 1 << 20;

/// The sender's arguments for every transfer here: 1 MiB blocks, two channels.
const ARGS: [&str; 4] = ["--chunk-size", "1M", "--channels", "2"];

/// How long a source must have been unchanged before the sender trusts its stamp (the
/// engine's `value_cache::RACY`, 3 s), with a margin.
const SETTLE: Duration = Duration::from_millis(3300);

/// The part file's journal in `out`, for the file `name`.
fn journal(out: &Path, name: &str) -> PathBuf {
    out.join(format!(".{name}.hurtle-blocks"))
}

/// The blocks the journal lists (header and seals left out), ascending, once each.
fn listed(out: &Path, name: &str) -> Vec<u64> {
    let text = fs::read_to_string(journal(out, name)).unwrap();
    let mut blocks: Vec<u64> = text
        .lines()
        .skip(1)
        .filter_map(|l| l.split(' ').next()?.parse().ok())
        .collect();
    blocks.sort_unstable();
    blocks.dedup();
    blocks
}

/// The entries in the cache directory.
fn entries(cache: &Path) -> Vec<PathBuf> {
    fs::read_dir(cache)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "values"))
                .collect()
        })
        .unwrap_or_default()
}

/// A 32 MiB source of seeded bytes, settled ([`SETTLE`]): the test's directory, the source,
/// and where it goes (`out`) and the value cache (`cache`), both inside the directory.
fn source(seed: u64) -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let t = support::tempdir("hurtle-resume-cached-");
    let src = t.path().join("src/data.bin");
    fsx::write_random(&src, 32 * MIB, seed);
    let (out, cache) = (t.path().join("out"), t.path().join("cache"));
    std::thread::sleep(SETTLE);
    (t, src, out, cache)
}

/// A receiver into `out`, and a sender of `src` to it at `rate` with the value cache in
/// `cache`, started.
fn start_sending(src: &Path, out: &Path, cache: &Path, rate: &str) -> (proc::ReceiverProc, Proc) {
    let r = start_receiver(out, &[]);
    let mut args = vec!["--rate", rate];
    args.extend_from_slice(&ARGS);
    let env = [("HURTLE_VALUE_CACHE", cache.to_str().unwrap())];
    let s = Proc::spawn_env("sender", &proc::send_args(r.addr, &[src], &args), &env);
    (r, s)
}

/// Starts sending `src` into `out` at 40 Mbit/s with the value cache in `cache`, waits until
/// the journal lists `lines` blocks and interrupts the sender with SIGINT; both sides end.
fn interrupt(src: &Path, out: &Path, cache: &Path, lines: usize) {
    let (r, mut s) = start_sending(src, out, cache, "40M");
    let j = journal(out, src.file_name().unwrap().to_str().unwrap());
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) && s.is_running() {
        let listed = fs::read_to_string(&j).map_or(0, |t| t.lines().count().saturating_sub(1));
        if listed >= lines {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(s.is_running(), "the sender ended before the interruption");
    let pid = s.id().to_string();
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert!(status.success());
    let f = s.wait(Duration::from_secs(30));
    assert!(!f.status.success(), "an interrupted sender fails: {f:?}");
    r.proc.wait(Duration::from_secs(30));
}

/// Sends `src` into `out` to the end with the value cache in `cache`; checks it arrived
/// byte-exact and returns both summaries.
fn finish(src: &Path, out: &Path, cache: &Path) -> (Value, Value) {
    let env = [("HURTLE_VALUE_CACHE", cache.to_str().unwrap())];
    proc::send_whole(src, out, &ARGS, &env)
}

#[test]
fn a_resumed_transfer_takes_the_values_of_held_blocks_from_the_senders_cache() {
    let (_t, src, out, cache) = source(0x5c1);
    interrupt(&src, &out, &cache, 10);
    let kept = entries(&cache);
    assert_eq!(kept.len(), 1, "{kept:?}");
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(&kept[0]).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let held = listed(&out, "data.bin");
    assert!(held.len() >= 10, "{held:?}");

    let (sj, rj) = finish(&src, &out, &cache);
    // Every block the receiver held was valued from the cache, none read; the receiver
    // checked each value against its journal's and took them all.
    let resumed = sj["resumed_bytes"].as_u64().unwrap();
    assert_eq!(resumed, held.len() as u64 * MIB, "{sj}");
    assert_eq!(sj["resume_blocks_cached"], held.len() as u64, "{sj}");
    assert_eq!(sj["resume_blocks_read"], 0, "{sj}");
    assert_eq!(rj["resumed_bytes"], resumed, "{rj}");
    assert_eq!(rj["rejected_blocks"], 0, "{rj}");
    assert_eq!(
        sj["file_hashes"][0]["blake3"],
        fsx::blake3_hex(&src).as_str()
    );
    // The file is done: its entry is gone.
    assert!(entries(&cache).is_empty(), "{:?}", entries(&cache));
}

#[test]
fn a_source_changed_after_the_interruption_with_its_mtime_restored_is_read_again() {
    let (_t, src, out, cache) = source(0x5c2);
    interrupt(&src, &out, &cache, 10);
    assert_eq!(entries(&cache).len(), 1);
    let held = listed(&out, "data.bin");
    assert!(held.len() >= 10, "{held:?}");
    // Two held blocks change at the source, same size, and the modification time is put back
    // (as `touch -d` would): only the change time tells.
    let mtime = fs::metadata(&src).unwrap().modified().unwrap();
    use std::os::unix::fs::FileExt;
    let f = fs::OpenOptions::new().write(true).open(&src).unwrap();
    for &b in &held[..2] {
        f.write_all_at(b"changed since", b * MIB + 100).unwrap();
    }
    f.set_modified(mtime).unwrap();
    drop(f);
    assert_eq!(fs::metadata(&src).unwrap().modified().unwrap(), mtime);

    let (sj, rj) = finish(&src, &out, &cache);
    assert_eq!(sj["resume_blocks_cached"], 0, "{sj}");
    assert_eq!(sj["resume_blocks_read"], held.len() as u64, "{sj}");
    assert_eq!(rj["rejected_blocks"], 2, "{rj}");
    assert_eq!(
        sj["file_hashes"][0]["blake3"],
        fsx::blake3_hex(&src).as_str()
    );
}

#[test]
fn a_sender_killed_outright_leaves_the_values_it_kept_on_the_way() {
    let (_t, src, out, cache) = source(0x5c3);
    // Slow enough that the sender is still sending when it first keeps its values (every
    // 15 s); killed (SIGKILL) as soon as the entry is there.
    let (r, mut s) = start_sending(&src, &out, &cache, "8M");
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) && s.is_running() && entries(&cache).is_empty()
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(s.is_running(), "the sender ended before it kept its values");
    assert_eq!(entries(&cache).len(), 1);
    s.kill();
    r.proc.wait(Duration::from_secs(30));
    let held = listed(&out, "data.bin");
    assert!(!held.is_empty());

    let (sj, _) = finish(&src, &out, &cache);
    // The blocks valued before the entry was kept come from it; any the receiver took after
    // are read.
    let (cached, read) = (
        sj["resume_blocks_cached"].as_u64().unwrap(),
        sj["resume_blocks_read"].as_u64().unwrap(),
    );
    assert!(cached > 0, "{sj}");
    assert_eq!(cached + read, held.len() as u64, "{sj}");
    assert!(entries(&cache).is_empty());
}
