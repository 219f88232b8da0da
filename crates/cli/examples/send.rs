//! Sends files to a receiver: `cargo run --example send -- --to HOST:PORT --code CODE PATH...`
//! (start one with `cargo run --example receive`, or `hurtle receive`). Prints the summary as
//! JSON, as `hurtle send --json` does.

use std::process::ExitCode;

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(summary) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&summary).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("send: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// Sends as `args` say: `--to HOST:PORT --code CODE [--rate RATE] PATH...`.
pub fn run(args: Vec<String>) -> Result<hurtle::SendSummary, hurtle::Error> {
    let mut builder = hurtle::Sender::builder().cold_start(true);
    let mut paths = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| hurtle::Error::Usage(format!("{arg} needs a value")))
        };
        builder = match arg.as_str() {
            "--to" => builder.to(value()?),
            "--code" => builder.code(value()?),
            "--rate" => builder.rate(&value()?),
            _ => {
                paths.push(arg);
                builder
            }
        };
    }
    let transfer = builder.build()?.send(paths)?;
    transfer.wait()
}
