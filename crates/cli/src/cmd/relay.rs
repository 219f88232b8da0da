//! `hurtle relay`: the rendezvous and relay server, until it is killed.

use crate::args::RelayArgs;
use crate::cmd::resolve;
use crate::exit::{self, Failure, Outcome};
use hurtle_engine::SessionError;
use hurtle_relay::{Config, Server};
use std::time::Duration;

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
        max_codes: a.max_codes,
        max_allocations: a.max_allocations,
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
