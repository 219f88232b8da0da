//! A transfer cancelled half way, then resumed: a sender and a receiver in this process on
//! 127.0.0.1 (`cargo run --example cancel`). The sender paces at a fixed 400 Mbit/s so that
//! there is time to cancel; cancelling keeps what the receiver verified, and the same transfer
//! again sends only the rest.

use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (kept, resumed) = run(64)?;
    println!("cancelled with {kept} bytes kept; the second transfer resumed {resumed} of them");
    Ok(())
}

/// Sends `mib` MiB, cancels once a quarter is confirmed, sends again; returns the bytes kept
/// at the cancel and those the second transfer did not send again.
pub fn run(mib: u64) -> Result<(u64, u64), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("big.bin");
    let mut bytes = vec![0u8; (mib << 20) as usize];
    rand::fill(&mut bytes[..]);
    std::fs::write(&file, &bytes)?;
    let out = dir.path().join("received");

    let receiver = hurtle::Receiver::builder()
        .out(&out)
        .listen("127.0.0.1:0")
        .build()?;
    let sender = hurtle::Sender::builder()
        .to(receiver.local_addr())
        .code(receiver.code().unwrap_or_default())
        .rate_fixed("400M")
        .cold_start(true)
        .build()?;

    // First try: cancelled once a quarter is confirmed (or after 20 s at most).
    let receiving = receiver.receive()?;
    let sending = sender.send([&file])?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sending.is_finished() && Instant::now() < deadline {
        let s = sending.snapshot();
        if s.total > 0 && s.confirmed >= s.total / 4 {
            sending.cancel();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let kept = match sending.wait() {
        Err(e) if e.kind() == hurtle::ErrorKind::Interrupted => {
            println!("{e}");
            match e {
                hurtle::Error::Interrupted { held, .. } => held,
                _ => 0,
            }
        }
        Err(e) => return Err(e.into()),
        Ok(_) => return Err("the transfer ended before it was cancelled".into()),
    };
    // The receiver hears that the sender was interrupted.
    let peer = receiving
        .wait()
        .expect_err("the receiver's session ends too");
    println!("receiver: {peer}");

    // Second try: only what was not verified moves.
    let receiving = receiver.receive()?;
    let summary = sender.send([&file])?.wait()?;
    receiving.wait()?;
    assert_eq!(std::fs::read(out.join("big.bin"))?, bytes);
    Ok((kept, summary.resumed_bytes))
}
