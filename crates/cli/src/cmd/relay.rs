//! `hurtle relay`: the rendezvous and relay server, until it is killed; and its per-address
//! limits' flags ([`LimitArgs`], part of `RelayArgs`).

use crate::args::{parse_rate, RelayArgs};
use crate::cmd::resolve;
use crate::exit::{self, Failure, Outcome};
use clap::Args;
use hurtle_engine::SessionError;
use hurtle_relay::{Config, Server};
use std::time::Duration;

/// What one client address (an IPv4 address, or an IPv6 /64) may hold or use at the relay.
/// The defaults leave room for a NAT full of honest users.
#[derive(Args, Clone, Debug)]
pub struct LimitArgs {
    /// Connections one client address may hold open at once, idle ones included.
    #[arg(long, value_name = "N", default_value_t = 512, value_parser = parse_positive)]
    pub connections_per_address: usize,
    /// Codes one client address may hold registered at once (receivers waiting).
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = parse_positive)]
    pub codes_per_address: usize,
    /// UDP allocations one client address may hold at once (one per channel of a session).
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = parse_positive)]
    pub allocations_per_address: usize,
    /// Rate at which one client address may send through the relay, as datagrams (dropped over
    /// it) and through TCP splices (paced to it), each; the forms of `send --rate`, or `off`.
    #[arg(long, value_name = "RATE", default_value = "1G", value_parser = parse_rate_or_off)]
    pub rate_per_address: u64,
}

fn parse_positive(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{s:?}: expected a whole number of at least 1")),
    }
}

/// Bits per second as `send --rate` takes them, or `off` (0: no limit).
fn parse_rate_or_off(s: &str) -> Result<u64, String> {
    match s.trim() {
        "off" | "none" | "0" => Ok(0),
        _ => parse_rate(s),
    }
}

/// Serves until killed.
pub fn run(a: RelayArgs) -> Outcome {
    let addr = resolve(&a.listen, "listening")?;
    // The parsers accept only positive, finite seconds.
    let secs = |v: f64| Duration::try_from_secs_f64(v).unwrap_or(Duration::from_secs(1));
    let cfg = Config {
        code_ttl: secs(a.code_ttl),
        idle_timeout: secs(a.idle_timeout),
        lookup_burst: a.lookup_burst,
        lookup_per_sec: a.lookup_per_sec,
        max_connections: a.max_connections,
        connections_per_address: a.limits.connections_per_address,
        max_codes: a.max_codes,
        codes_per_address: a.limits.codes_per_address,
        max_allocations: a.max_allocations,
        allocations_per_address: a.limits.allocations_per_address,
        bytes_per_sec_per_address: a.limits.rate_per_address / 8,
        metrics: match &a.metrics {
            Some(m) => Some(resolve(m, "metrics")?),
            None => None,
        },
        log: true,
    };
    let server = Server::bind(addr, cfg).map_err(|source| SessionError::Listen { addr, source })?;
    let bound = server
        .local_addr()
        .map_err(|e| SessionError::io("relay socket", e))?;
    eprintln!("hurtle relay: listening on {bound}");
    if let Some(m) = server.metrics_addr() {
        eprintln!("hurtle relay: metrics on http://{m}/metrics");
    }
    server
        .run()
        .map_err(|e| Failure::new(exit::NETWORK, anyhow::anyhow!("relay stopped: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_bits_per_second_or_off() {
        assert_eq!(parse_rate_or_off("off"), Ok(0));
        assert_eq!(parse_rate_or_off("0"), Ok(0));
        assert_eq!(parse_rate_or_off("1G"), Ok(1_000_000_000));
        assert!(parse_rate_or_off("fast").is_err());
        assert!(parse_positive("0").is_err());
    }
}
