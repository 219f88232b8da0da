//! A pull, `hurtle cp [user@]host:SRC... DEST`: this side binds a receiver and the far side
//! (`hurtle ssh-serve send`) sends to it, dialling back directly or through the ssh channel; a
//! direct session whose data could not get through is retried once through the ssh channel,
//! as the receiver's next session. This side places what it receives by the destination
//! rules, and takes only the names it asked for.

use super::dest::{place, shape_of};
use super::far::{near_failure, Far, Ssh};
use super::operands::Remote;
use super::options::{receive_options, Secret};
use super::route::{
    accept_for, retry_before_failure, retry_in_summary, warn_retry, warn_slow, Route, RETRIED,
};
use super::sources::{source_kind, Kind};
use crate::args::{CpArgs, SendFlags};
use crate::cmd::receive::check_out;
use crate::exit::{self, Failure, Outcome};
use crate::{interrupt, ui};
use hurtle_engine::receive::Names;
use hurtle_engine::{Receiver, SessionError};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a pull whose direct session failed here waits for the far sender's word that its
/// data path failed (then the transfer is retried through the ssh channel).
const RETRY_WORD_WAIT: Duration = Duration::from_secs(2);

/// The far paths a pull asks for: as given, but the far home `~` stands for its contents
/// (`~/`), as `host:` does (its name is the far side's to say, and this side takes only names
/// it knows).
fn far_paths(sources: &[Remote]) -> Vec<String> {
    sources
        .iter()
        .map(|r| match r.path.as_str() {
            "~" => "~/".to_string(),
            p => p.to_string(),
        })
        .collect()
}

/// The names this side takes from the far sender: the top-level name of each source sent as
/// itself; any name when a source stands for a directory's contents.
fn wanted(paths: &[String]) -> Option<Vec<String>> {
    paths
        .iter()
        .map(|p| match source_kind(p) {
            Kind::Itself(name) => Some(name),
            Kind::Contents => None,
        })
        .collect()
}

/// Receives `sources` (all on one far host, which runs `hurtle ssh-serve send`) at `dest`, by
/// the destination rules ([`place`]), taking only the names asked for.
pub(super) fn pull(a: &CpArgs, flags: &SendFlags, sources: &[Remote], dest: &str) -> Outcome {
    let ssh = Ssh::new(&a.ssh, a.port, &sources[0])?;
    let paths = far_paths(sources);
    let given: Vec<&str> = paths.iter().map(String::as_str).collect();
    let shape = shape_of(&given, |p| match source_kind(p) {
        Kind::Itself(name) => Ok(name),
        Kind::Contents => Err(Failure::new(
            exit::OTHER,
            anyhow::anyhow!("{p}: no name of its own"),
        )),
    })?;
    let placed = place(dest, &shape)?;
    let out = placed.out.as_path();
    check_out(out)?;
    let names = Names {
        allowed: wanted(&paths),
        rename: placed.rename,
    };
    // Listen on the address family ssh reaches the far host by, so its dial back matches.
    let v6 = (ssh.hostname().as_str(), 22)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|a| a.is_ipv6());
    let any = if v6 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    };
    let secret = Secret::new();
    let opts = receive_options(
        (out, names),
        (a.overwrite, a.send.delete),
        a.output.log_dir.clone(),
        &secret,
    );
    let own_ports = opts.own_ports.clone();
    let receiver = Receiver::bind(SocketAddr::new(any, 0), opts)?;
    let port = receiver.local_addr()?.port();
    let mut words: Vec<String> = vec!["ssh-serve".into(), "send".into()];
    words.extend(flags.to_args());
    words.push("--".into());
    words.extend(paths);
    let mut far = Far::start(&ssh, &a.remote_hurtle, &words)?;
    let said = far.banner()?;
    if said.first().map(String::as_str) != Some("ready") {
        far.wait();
        return Err(Failure::new(
            exit::OTHER,
            anyhow::anyhow!("the far side said {said:?}, not that it is ready to send"),
        ));
    }
    far.read_on();
    let mode = if a.via_ssh { "ssh" } else { "auto" };
    far.tell(&format!("{port} {secret} {mode}\n"))?;
    // The far side says which path it takes: `direct` (it reached our port), or `ssh WHY`
    // (from now on its stdout and stdin are the mux).
    let said = far.banner()?;
    let mut route = match said.first().map(String::as_str) {
        Some("direct") => {
            far.read_on();
            Route::Direct(SocketAddr::new(any, port))
        }
        Some("ssh") => {
            let why = said[1..].join(" ");
            if !a.via_ssh {
                warn_slow(&a.output, &format!("the far side {why}"));
            }
            far.start_mux(Some(accept_for(any, own_ports.clone())))?;
            Route::Ssh(if a.via_ssh {
                "asked for with --via-ssh".into()
            } else {
                "no direct port was reachable".into()
            })
        }
        _ => {
            far.wait();
            return Err(Failure::new(
                exit::OTHER,
                anyhow::anyhow!("the far side said {said:?}, not the path it takes"),
            ));
        }
    };
    // One session at a time, in a thread that hands the receiver back with its result.
    let accept = |receiver: Receiver| {
        let (progress, bar) = ui::progress_bar(&a.output, "receiving");
        interrupt::watch(&progress);
        let (tx, rx) = mpsc::channel();
        let session = progress.clone();
        std::thread::spawn(move || {
            let result = receiver.accept_one(session);
            let _ = tx.send((result, receiver));
        });
        (rx, progress, bar)
    };
    let (mut rx, mut progress, mut bar) = accept(receiver);
    // This side's direct session failed: kept while the far side may still say that its data
    // path failed (it says so when its own session has ended, which can be just after ours).
    let mut failed: Option<(SessionError, Receiver, Instant)> = None;
    // The far side said so (`ssh WHY`): the retry's mux runs, its first connection waits at
    // this receiver's door; `second`: the receiver's next session (the retry) was started.
    let (mut retried, mut second) = (None, false);
    // The session ends, or ssh ends first: then the far side failed before or during it (a
    // source that does not exist, ssh cut off), unless the session ends just after.
    let result = loop {
        if failed.is_none() {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok((Ok(s), _)) => break Some(Ok(s)),
                Ok((Err(_), receiver)) if retried.is_some() && !second => {
                    // The direct session ended here too: the retry is the next one.
                    second = true;
                    bar.finish();
                    (rx, progress, bar) = accept(receiver);
                    continue;
                }
                Ok((Err(e), receiver))
                    if retried.is_none() && matches!(route, Route::Direct(_)) =>
                {
                    failed = Some((e, receiver, Instant::now()));
                }
                Ok((Err(e), _)) => break Some(Err(e)),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break None,
            }
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
        if retried.is_none() && matches!(route, Route::Direct(_)) {
            if let Some(why) = far.retry_word()? {
                retried = Some(warn_retry(&a.output, "the far side's", &why));
                far.tell("ssh\n")?;
                far.start_mux(Some(accept_for(any, own_ports.clone())))?;
                route = Route::ssh(RETRIED);
                if let Some((_, receiver, _)) = failed.take() {
                    second = true;
                    bar.finish();
                    (rx, progress, bar) = accept(receiver);
                }
                continue;
            }
        }
        if let Some((_, _, at)) = &failed {
            if at.elapsed() >= RETRY_WORD_WAIT || far.ended().is_some() {
                break failed.take().map(|(e, ..)| Err(e));
            }
            continue;
        }
        if let Some(status) = far.ended() {
            let grace = if status.success() {
                Duration::from_secs(30)
            } else {
                Duration::from_secs(2)
            };
            break match rx.recv_timeout(grace) {
                // The direct session's end, while the retry failed on the far side: its
                // failure is the one to show.
                Ok((Err(_), _)) if retried.is_some() && !second => None,
                r => r.ok().map(|(r, _)| r),
            };
        }
    };
    bar.finish();
    match result {
        Some(Ok(mut s)) => {
            far.finish(&a.output);
            retry_in_summary(&a.output, &mut s.warnings, retried);
            if a.send.dry_run {
                ui::print_plan(&a.output, &s.file_hashes, &s.warnings);
            } else {
                ui::print_receive_summary(&a.output, &s, Some(&route.info()));
            }
            if let Route::Direct(_) = route {
                ui::say(&a.output, &format!("path: direct from {}", s.peer));
            } else {
                ui::say(&a.output, &format!("path: {}", route.describe()));
            }
            Ok(())
        }
        Some(Err(e)) => {
            retry_before_failure(&a.output, retried.as_ref());
            Err(near_failure(e, true, &progress, &mut far))
        }
        None => {
            retry_before_failure(&a.output, retried.as_ref());
            Err(far.failure())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(path: &str) -> Remote {
        Remote {
            user: None,
            host: "h".into(),
            path: path.into(),
        }
    }

    #[test]
    fn a_pull_asks_for_the_top_level_names_of_its_sources() {
        let paths = far_paths(&[remote("/d/big.bin"), remote("~/tree"), remote("x/.ssh")]);
        assert_eq!(paths, ["/d/big.bin", "~/tree", "x/.ssh"]);
        assert_eq!(
            wanted(&paths),
            Some(vec!["big.bin".into(), "tree".into(), ".ssh".into()])
        );
        // The far home and a directory's contents: any name they hold.
        for contents in ["~", ".", "d/", "d/.."] {
            let paths = far_paths(&[remote("a"), remote(contents)]);
            assert_eq!(wanted(&paths), None, "{contents}");
        }
        assert_eq!(far_paths(&[remote("~")]), ["~/"]);
    }
}
