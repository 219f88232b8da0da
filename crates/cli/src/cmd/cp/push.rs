//! A push, `hurtle cp SRC... [user@]host:DEST`: this side sends its local sources to a
//! receiver the far side starts (`hurtle ssh-serve receive`), directly to the far side's port
//! or through the ssh channel, and retries once through the ssh channel when the direct
//! session's data could not get through.

use super::dest::shape_of;
use super::far::{near_failure, Far, Ssh};
use super::operands::Remote;
use super::options::{send_options, Secret};
use super::route::{
    retry_before_failure, retry_in_summary, retry_reason, warn_retry, warn_slow, Prepared, Route,
    RETRIED,
};
use super::sources::expand_sources;
use super::DIRECT_TRY;
use crate::args::{CpArgs, HostPort, SendFlags};
use crate::cmd::resolve;
use crate::exit::{self, Failure, Outcome};
use crate::{interrupt, ui};
use hurtle_engine::SendOptions;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Sends local `sources` to `dest` on the far host, which runs `hurtle ssh-serve receive`.
pub(super) fn push(a: &CpArgs, flags: &SendFlags, sources: &[String], dest: &Remote) -> Outcome {
    let paths: Vec<PathBuf> = sources.iter().map(PathBuf::from).collect();
    let (paths, link_args) = expand_sources(&paths, flags.follow_symlinks)?;
    // What the far side needs for the destination rules (a single source is named DEST).
    let given: Vec<&str> = sources.iter().map(String::as_str).collect();
    let shape = shape_of(&given, |s| {
        hurtle_engine::walk::top_name(std::path::Path::new(s))
            .map_err(|e| Failure::new(exit::STORAGE, anyhow::anyhow!(e)))
    })?;
    let ssh = Ssh::new(&a.ssh, a.port, dest)?;
    let mut words: Vec<String> = ["ssh-serve", "receive", "--out", &dest.path]
        .map(String::from)
        .to_vec();
    if a.send.delete {
        // The local user asked for the mirror, and is the far side's user too.
        words.push("--allow-delete".into());
    }
    if a.send.dry_run {
        words.push("--dry-run".into());
    }
    if a.overwrite {
        words.push("--overwrite".into());
    }
    let mut far = Far::start(&ssh, &a.remote_hurtle, &words)?;
    // The far side reads the shape before it picks its output directory and says its port.
    far.tell(&shape.line())?;
    let said = far.banner()?;
    let (port, secret) = match said.as_slice() {
        [port, secret, ..] => (port.parse::<u16>().ok(), Secret::parse(secret)),
        _ => (None, None),
    };
    let (Some(port), Some(secret)) = (port, secret) else {
        far.wait();
        return Err(Failure::new(
            exit::OTHER,
            anyhow::anyhow!("the far side's line {said:?} is not a port and a secret"),
        ));
    };
    let host = HostPort {
        host: ssh.hostname(),
        port,
    };
    let to = resolve(&host, "far")?;
    // The far side's port directly, or else the ssh channel.
    let direct = if a.via_ssh {
        Err(Route::ssh("asked for with --via-ssh"))
    } else {
        hurtle_engine::net::dial::connect_hedged(to, DIRECT_TRY).map_err(|e| {
            let why = format!("cannot connect to the far side's port {to} directly ({e})");
            warn_slow(&a.output, &why);
            Route::ssh("no direct port was reachable")
        })
    };
    let mut opts = send_options(flags, a.output.log_dir.clone(), &secret);
    opts.link_args = link_args;
    opts.mirror_root = super::options::mirror_root(sources.iter().map(String::as_str));
    let mut route = match direct {
        Ok(first) => {
            far.tell("direct\n")?;
            far.read_on();
            opts.dialer = Some(Arc::new(Prepared::new(to, first)));
            Route::Direct(to)
        }
        Err(route) => {
            far.tell("ssh\n")?;
            opts.dialer = Some(far.start_mux(None)?.dialer());
            route
        }
    };
    if a.output.verbose > 0 {
        ui::say(
            &a.output,
            &format!(
                "hurtle: the far side receives on {to} (over ssh to {}), {}",
                ssh.destination,
                route.describe()
            ),
        );
    }
    let send = |opts: &SendOptions| {
        let (progress, bar) = ui::progress_bar(&a.output, "sending");
        interrupt::watch(&progress);
        let result = hurtle_engine::send(&paths, to, opts, progress.clone());
        bar.finish();
        (result, progress)
    };
    let started = Instant::now();
    let (mut result, mut progress) = send(&opts);
    let mut retry_warning = None;
    if let (Route::Direct(_), Err(e)) = (&route, &result) {
        match retry_reason(e, to, &progress) {
            // The far side's port answered, but the session's data could not get through:
            // the same transfer again, through the ssh channel (the far side acknowledges,
            // and its mux connects to the same receiver, with the same secret).
            Some(why) => {
                let spent = started.elapsed().as_secs_f64();
                retry_warning = Some(warn_retry(
                    &a.output,
                    "the",
                    &format!("{why}; {spent:.1} s spent"),
                ));
                far.tell("ssh\n")?;
                let said = far.banner()?;
                if said.first().map(String::as_str) != Some("ssh") {
                    far.wait();
                    return Err(Failure::new(
                        exit::OTHER,
                        anyhow::anyhow!("the far side said {said:?}, not that it takes the retry"),
                    ));
                }
                opts.dialer = Some(far.start_mux(None)?.dialer());
                route = Route::ssh(RETRIED);
                (result, progress) = send(&opts);
            }
            // No retry: the far side ends with its own failure.
            None => far.end_direct(),
        }
    }
    match result {
        Ok(mut s) => {
            far.finish(&a.output);
            retry_in_summary(&a.output, &mut s.warnings, retry_warning);
            if a.send.dry_run {
                ui::print_plan(&a.output, &s.file_hashes, &s.warnings);
            } else {
                ui::print_send_summary(&a.output, &s, Some(&route.info()));
            }
            ui::say(&a.output, &format!("path: {}", route.describe()));
            Ok(())
        }
        Err(e) => {
            retry_before_failure(&a.output, retry_warning.as_ref());
            Err(near_failure(e, false, &progress, &mut far))
        }
    }
}
