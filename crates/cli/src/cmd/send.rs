//! `hurtle send`: to an address (`--to`) or to a receiver found by code through a relay.

use crate::args::{parse_channels, parse_rate, parse_relay_target, SendArgs};
use crate::cmd::keys;
use crate::cmd::{resolve, session_failure};
use crate::config::Defaults;
use crate::exit::{Failure, Outcome};
use crate::{interrupt, rendezvous, ui};
use hurtle_engine::SendOptions;
use hurtle_relay::Code;

/// A code as given to `--code` or in `HURTLE_CODE`, checked locally: a number and 2 or 3 words
/// of the list, with the nearest word for one not in it.
pub(crate) fn checked_code(code: &str) -> Result<Code, Failure> {
    Code::parse(code).map_err(|e| Failure::usage(format!("bad code: {e}")))
}

/// Runs `hurtle send`.
pub fn run(mut a: SendArgs, defaults: &Defaults) -> Outcome {
    let mut opts = SendOptions {
        no_encryption: a.no_encryption,
        ..a.flags.options(a.output.log_dir.clone())
    };
    // The code is checked here, before it costs one of the receiver's tries: a code of another
    // shape, or with a word not in the list, is a usage error (exit 2), with the word meant.
    let code = match keys::given_code(&a.code) {
        Some(c) if a.key.is_none() => Some(checked_code(&c)?),
        _ => None,
    };
    opts.secret = keys::sender_secret(&a.key, code.as_ref().map(Code::to_string).as_deref())?;
    if a.flags.channels.is_none() {
        if let Some(c) = defaults.get("channels", parse_channels)? {
            opts.channels = c;
        }
    }
    if a.flags.rate.rate.is_none() && a.flags.rate.rate_fixed.is_none() {
        a.flags.rate.rate = defaults.get("rate", parse_rate)?;
        a.flags.rate.apply(&mut opts);
    }
    let (to, path) = match (&a.to, &code) {
        (Some(to), _) => {
            if opts.secret.is_none() {
                return Err(Failure::usage(
                    "give the code the receiver printed: --code CODE (or HURTLE_CODE), or a key file with --key",
                ));
            }
            (resolve(to, "receiver")?, None)
        }
        (None, Some(code)) => {
            let relay = match &a.relay {
                Some(r) => r.clone(),
                None => defaults.get("relay", parse_relay_target)?.ok_or_else(|| {
                    Failure::usage(
                        "--code needs a relay: --relay HOST[:PORT], HURTLE_RELAY or relay in the \
                         configuration file",
                    )
                })?,
            };
            let (to, path) = rendezvous::pair(&a.output, &relay, code, a.relay_only)?;
            opts.dialer = Some(path.dialer.clone());
            opts.secret = Some(path.secret.clone());
            (to, Some(path))
        }
        (None, None) => return Err(Failure::usage("give --to, or --code")),
    };
    let (progress, bar) = ui::progress_bar(&a.output, "sending");
    interrupt::watch(&progress);
    let result = hurtle_engine::send(&a.paths, to, &opts, progress.clone());
    bar.finish();
    let s = result.map_err(|e| session_failure(e, false, &progress))?;
    ui::print_send_summary(&a.output, &s, path.as_ref().map(|p| &p.info));
    Ok(())
}
