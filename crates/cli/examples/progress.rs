//! A transfer with a progress bar: a sender and a receiver in this process, on 127.0.0.1,
//! moving a file of random bytes (`cargo run --release --example progress -- [MiB]`, 64 MiB
//! by default). The bar follows the transfer's snapshots: bytes, the rate now, the file moving
//! and what limits the transfer (what the command's own progress line shows).

use indicatif::{ProgressBar, ProgressStyle};
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mib = match std::env::args().nth(1) {
        Some(a) => a.parse()?,
        None => 64,
    };
    let summary = run(mib, true)?;
    println!(
        "sent {} MiB in {:.2} s, {:.0} Mbit/s; limited by {}",
        summary.bytes >> 20,
        summary.seconds,
        summary.goodput_bps / 1e6,
        summary.bottleneck.map_or("-".into(), |b| b.detail)
    );
    Ok(())
}

/// Moves `mib` MiB from a temporary directory to another, drawing the bar when `draw`.
pub fn run(mib: u64, draw: bool) -> Result<hurtle::SendSummary, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("random.bin");
    let mut bytes = vec![0u8; (mib << 20) as usize];
    rand::fill(&mut bytes[..]);
    std::fs::write(&file, &bytes)?;

    let receiver = hurtle::Receiver::builder()
        .out(dir.path().join("received"))
        .listen("127.0.0.1:0")
        .build()?;
    let receiving = receiver.receive()?;
    let sending = hurtle::Sender::builder()
        .to(receiver.local_addr())
        .code(receiver.code().unwrap_or_default())
        .cold_start(true)
        .progress_interval(Duration::from_millis(100))
        .build()?
        .send([&file])?;

    let bar = if draw {
        ProgressBar::new(mib << 20)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(ProgressStyle::with_template(
        "{bar:40} {bytes}/{total_bytes} {msg}",
    )?);
    let mut last = None;
    for event in sending.iter() {
        if let hurtle::Event::Progress(s) = event {
            bar.set_length(s.total.max(1));
            bar.set_position(s.confirmed);
            let file = s.moving.first().map_or("", String::as_str);
            let limit = s
                .bottleneck
                .as_ref()
                .map_or(String::new(), |l| format!("  limited by {l}"));
            bar.set_message(format!(
                "{:.0} Mbit/s  {file}{limit}",
                s.rate_bps as f64 / 1e6
            ));
            last = Some(s);
        }
    }
    bar.finish();
    let summary = sending.wait()?;
    receiving.wait()?;
    assert_eq!(
        std::fs::read(dir.path().join("received/random.bin"))?,
        bytes
    );
    assert_eq!(last.map(|s| s.confirmed), Some(summary.bytes));
    Ok(summary)
}
