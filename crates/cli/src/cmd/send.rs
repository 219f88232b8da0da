//! `hurtle send`: to an address (`--to`) or to a receiver found by code through a relay.

use crate::args::{parse_channels, parse_rate, parse_relay_target, SendArgs};
use crate::cmd::keys;
use crate::cmd::{resolve, session_failure};
use crate::config::Defaults;
use crate::exit::{Failure, Outcome};
use crate::{interrupt, rendezvous, ui};
use hurtle_engine::SendOptions;

/// Runs `hurtle send`.
pub fn run(mut a: SendArgs, defaults: &Defaults) -> Outcome {
    let mut opts = SendOptions {
        no_encryption: a.no_encryption,
        ..a.flags.options(a.output.log_dir.clone())
    };
    let code = keys::given_code(&a.code);
    opts.secret = keys::sender_secret(&a.key, code.as_deref())?;
    if a.flags.channels.is_none() {
        if let Some(c) = defaults.get("channels", parse_channels)? {
            opts.channels = c;
        }
    }
    if a.flags.rate.rate.is_none() && a.flags.rate.rate_fixed.is_none() {
        a.flags.rate.rate = defaults.get("rate", parse_rate)?;
        a.flags.rate.apply(&mut opts);
    }
    let (to, path) = match (&a.to, &a.code) {
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
