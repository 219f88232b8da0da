//! A hostile receiver's NACKs (their ranges and what they claim to know of) fed to a channel
//! sender between its sends: never a panic, every run lies inside the channel's stripe, a
//! repair only covers what was already sent, and the sender still finishes.
#![no_main]
use hurtle_proto::{ChannelSender, Layout, RunKind, SendConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let layout = Layout::new(&[10_000, 0, 5000, 70_000], 1024, 3).unwrap();
    for ch in 0..3u16 {
        let stripe = layout.stripe_len(ch);
        // Repairs are remembered for 5 ms; the clock moves 1 ms per operation.
        let cfg = SendConfig {
            repair_echo: std::time::Duration::from_millis(5),
            ..SendConfig::default()
        };
        let mut s = ChannelSender::new(&layout, ch, cfg);
        let mut now = std::time::Instant::now();
        let mut sent = 0u64;
        let check = |run: hurtle_proto::Run, sent: &mut u64| {
            assert!(
                run.len > 0 && run.pos + run.len <= stripe,
                "{run:?} outside {stripe}"
            );
            match run.kind {
                RunKind::Repair => assert!(run.pos + run.len <= *sent, "{run:?} not sent yet"),
                _ => {
                    assert_eq!(run.pos, *sent, "new data out of order");
                    *sent = run.pos + run.len;
                }
            }
        };
        for w in data.chunks_exact(17) {
            now += std::time::Duration::from_millis(1);
            let a = u64::from_le_bytes(w[1..9].try_into().unwrap());
            let b = u64::from_le_bytes(w[9..17].try_into().unwrap());
            match w[0] % 3 {
                0 => {
                    // What the NACK claims to know of: up to 63 ms either side of now.
                    let shift = std::time::Duration::from_millis(b >> 58);
                    let knew = if a & 1 == 0 {
                        now.checked_sub(shift).unwrap_or(now)
                    } else {
                        now + shift
                    };
                    s.on_nack(&[(a, b), (a % 4096, b % 8192)], now, knew);
                }
                1 => s.on_channel_done(),
                _ => {
                    if let Some(run) = s.poll_run(&layout, u64::from(w[0]) * 64 + 1, now) {
                        check(run, &mut sent);
                    }
                }
            }
        }
        // Whatever was asked, the rest goes out and the sender ends.
        for _ in 0..1_000_000 {
            match s.poll_run(&layout, 1 << 20, now) {
                Some(run) => check(run, &mut sent),
                None => break,
            }
        }
        assert_eq!(sent, stripe);
        assert_eq!(s.new_remaining(), 0);
        assert_eq!(s.repair_pending(), 0);
    }
});
