//! Receives one transfer: `cargo run --example receive -- --out DIR [--listen HOST:PORT]
//! [--code CODE]`. Prints where it listens and the code for the sender (`cargo run --example
//! send`, or `hurtle send`), then each file as it starts, then the summary as JSON.

use std::process::ExitCode;

fn main() -> ExitCode {
    let ready = |r: &hurtle::Receiver| {
        println!(
            "listening on {}; on the sending host: cargo run --example send -- --to {} --code {} FILES",
            r.local_addr(),
            r.local_addr(),
            r.code().unwrap_or_default()
        );
    };
    match run(std::env::args().skip(1).collect(), ready) {
        Ok(summary) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&summary).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("receive: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// Receives as `args` say (`--out DIR [--listen HOST:PORT] [--code CODE]`), telling `ready`
/// where it listens before it waits.
pub fn run(
    args: Vec<String>,
    ready: impl FnOnce(&hurtle::Receiver),
) -> Result<hurtle::ReceiveSummary, hurtle::Error> {
    let mut builder = hurtle::Receiver::builder().listen("0.0.0.0:7400");
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let value = args
            .next()
            .ok_or_else(|| hurtle::Error::Usage(format!("{arg} needs a value")))?;
        builder = match arg.as_str() {
            "--out" => builder.out(value),
            "--listen" => builder.listen(value),
            "--code" => builder.code(value),
            _ => return Err(hurtle::Error::Usage(format!("unknown option {arg}"))),
        };
    }
    let receiver = builder.build()?;
    ready(&receiver);
    let transfer = receiver.receive()?;
    for event in transfer.iter() {
        if let hurtle::Event::FileStarted(name) = event {
            println!("receiving {name}");
        }
    }
    transfer.wait()
}
