//! What a relay has done, for its operator: counters kept by the server ([`Metrics`]) and an
//! endpoint that serves them in the Prometheus text format ([`serve`]), off unless
//! `hurtle relay --metrics ADDR` names an address.
//!
//! The endpoint answers every request on its socket with the current values (`GET /metrics`
//! is what a scraper sends; the path is not checked), one connection at a time, each read
//! bounded by a deadline, so a slow or hostile client costs it nothing but its own time.

use crate::udp::Counts;
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The server's counters (monotonic unless named a gauge).
#[derive(Debug, Default)]
pub struct Metrics {
    /// Codes registered.
    pub registrations: AtomicU64,
    /// Lookups that found a code, by how the sender said it reaches the receiver.
    pub pairings_direct: AtomicU64,
    /// Pairings through the relay.
    pub pairings_relayed: AtomicU64,
    /// Pairings whose sender did not say.
    pub pairings_unreported: AtomicU64,
    /// Requests refused, by reason: rate limited, no such code, busy, bad request or frame,
    /// unknown ticket.
    pub refused_rate_limited: AtomicU64,
    /// No such code.
    pub refused_no_such_code: AtomicU64,
    /// The relay was full (connections, codes or allocations).
    pub refused_busy: AtomicU64,
    /// A malformed or unexpected message.
    pub refused_bad_request: AtomicU64,
    /// A ticket nobody was given (or whose receiver left).
    pub refused_no_such_ticket: AtomicU64,
    /// Over a per-address (or per-ticket) limit.
    pub refused_limited: AtomicU64,
    /// Limits hit: connections from one address.
    pub limit_connections_per_address: AtomicU64,
    /// Codes registered from one address.
    pub limit_codes_per_address: AtomicU64,
    /// Lookups from one address (its token bucket).
    pub limit_lookups_per_address: AtomicU64,
    /// Connections to the receiver's control port from one ticket.
    pub limit_control_splices_per_ticket: AtomicU64,
    /// The relay's own bounds: connections, codes, tickets.
    pub limit_connections: AtomicU64,
    /// Codes held by the relay.
    pub limit_codes: AtomicU64,
    /// Tickets held by the relay.
    pub limit_tickets: AtomicU64,
    /// TCP splices that ended, and the bytes they carried each way.
    pub splices: AtomicU64,
    /// Bytes spliced sender to receiver.
    pub splice_bytes_forward: AtomicU64,
    /// Bytes spliced receiver to sender.
    pub splice_bytes_back: AtomicU64,
    /// UDP allocations made.
    pub allocations: AtomicU64,
}

/// Adds one to `c`.
pub(crate) fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Metrics {
    /// The counters, `gauges` (connections open, codes held, allocations held) and the UDP
    /// forwarder's `udp` counts, in the Prometheus text format (version 0.0.4).
    pub fn render(
        &self,
        (connections, codes, allocations): (u64, u64, u64),
        udp: Counts,
    ) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut out = String::new();
        let mut one = |name: &str, kind: &str, help: &str, samples: &[(&str, u64)]| {
            let _ = writeln!(out, "# HELP hurtle_relay_{name} {help}");
            let _ = writeln!(out, "# TYPE hurtle_relay_{name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(out, "hurtle_relay_{name}{labels} {v}");
            }
        };
        one(
            "connections",
            "gauge",
            "TCP connections being served.",
            &[("", connections)],
        );
        one("codes", "gauge", "Codes registered now.", &[("", codes)]);
        one(
            "registrations_total",
            "counter",
            "Codes registered.",
            &[("", get(&self.registrations))],
        );
        one(
            "pairings_total",
            "counter",
            "Lookups that found a code, by the path the sender reported.",
            &[
                ("{path=\"direct\"}", get(&self.pairings_direct)),
                ("{path=\"relayed\"}", get(&self.pairings_relayed)),
                ("{path=\"unreported\"}", get(&self.pairings_unreported)),
            ],
        );
        one(
            "refusals_total",
            "counter",
            "Requests refused, by reason.",
            &[
                ("{reason=\"rate_limited\"}", get(&self.refused_rate_limited)),
                ("{reason=\"no_such_code\"}", get(&self.refused_no_such_code)),
                ("{reason=\"busy\"}", get(&self.refused_busy)),
                ("{reason=\"bad_request\"}", get(&self.refused_bad_request)),
                (
                    "{reason=\"no_such_ticket\"}",
                    get(&self.refused_no_such_ticket),
                ),
                ("{reason=\"limited\"}", get(&self.refused_limited)),
            ],
        );
        one(
            "limits_hit_total",
            "counter",
            "Requests or datagrams held back by a limit, by limit.",
            &[
                (
                    "{limit=\"connections_per_address\"}",
                    get(&self.limit_connections_per_address),
                ),
                (
                    "{limit=\"codes_per_address\"}",
                    get(&self.limit_codes_per_address),
                ),
                (
                    "{limit=\"lookups_per_address\"}",
                    get(&self.limit_lookups_per_address),
                ),
                ("{limit=\"allocations_per_address\"}", udp.refused[1]),
                ("{limit=\"bytes_per_address\"}", udp.dropped[4]),
                (
                    "{limit=\"control_connections_per_lookup\"}",
                    get(&self.limit_control_splices_per_ticket),
                ),
                ("{limit=\"connections\"}", get(&self.limit_connections)),
                ("{limit=\"codes\"}", get(&self.limit_codes)),
                ("{limit=\"tickets\"}", get(&self.limit_tickets)),
                ("{limit=\"allocations\"}", udp.refused[0]),
            ],
        );
        one(
            "splices_total",
            "counter",
            "TCP splices that ended.",
            &[("", get(&self.splices))],
        );
        one(
            "splice_bytes_total",
            "counter",
            "Bytes carried by ended TCP splices, by direction.",
            &[
                (
                    "{direction=\"to_receiver\"}",
                    get(&self.splice_bytes_forward),
                ),
                ("{direction=\"to_sender\"}", get(&self.splice_bytes_back)),
            ],
        );
        one(
            "udp_allocations",
            "gauge",
            "UDP allocations held now.",
            &[("", allocations)],
        );
        one(
            "udp_allocations_total",
            "counter",
            "UDP allocations made.",
            &[("", get(&self.allocations))],
        );
        one(
            "udp_forwarded_datagrams_total",
            "counter",
            "Datagrams forwarded between paired peers.",
            &[("", udp.forwarded)],
        );
        one(
            "udp_forwarded_bytes_total",
            "counter",
            "Bytes of datagrams forwarded between paired peers.",
            &[("", udp.bytes)],
        );
        one(
            "udp_answered_total",
            "counter",
            "Observe and bind requests answered.",
            &[("", udp.answered)],
        );
        one(
            "udp_dropped_total",
            "counter",
            "Datagrams dropped, by reason.",
            &[
                ("{reason=\"malformed\"}", udp.dropped[0]),
                ("{reason=\"unknown_token\"}", udp.dropped[1]),
                ("{reason=\"stranger\"}", udp.dropped[2]),
                ("{reason=\"unpaired\"}", udp.dropped[3]),
                ("{reason=\"over_rate\"}", udp.dropped[4]),
            ],
        );
        one(
            "udp_dropped_over_rate_bytes_total",
            "counter",
            "Bytes of datagrams dropped over their sender's address's rate.",
            &[("", udp.over_rate_bytes)],
        );
        out
    }
}

/// Serves `render()` to every connection on `listener`, until it fails.
pub fn serve(listener: TcpListener, render: impl Fn() -> String) -> io::Result<()> {
    loop {
        let (mut s, _) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
        // The request's head (at most 4 KiB, until its blank line): what it asks does not
        // matter.
        let mut head = [0u8; 4096];
        let mut got = 0;
        while got < head.len() {
            match s.read(&mut head[got..]) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
            if head[..got].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        let body = render();
        let _ = write!(
            s,
            "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_is_rendered_with_its_type() {
        let m = Metrics::default();
        inc(&m.pairings_relayed);
        inc(&m.pairings_relayed);
        let udp = Counts {
            forwarded: 5,
            bytes: 7000,
            answered: 2,
            dropped: [1, 0, 3, 0, 2],
            over_rate_bytes: 2400,
            refused: [0, 1],
        };
        inc(&m.limit_connections_per_address);
        let text = m.render((4, 1, 2), udp);
        for line in [
            "hurtle_relay_connections 4",
            "hurtle_relay_pairings_total{path=\"relayed\"} 2",
            "hurtle_relay_udp_allocations 2",
            "hurtle_relay_udp_forwarded_bytes_total 7000",
            "hurtle_relay_udp_dropped_total{reason=\"stranger\"} 3",
            "# TYPE hurtle_relay_refusals_total counter",
            "hurtle_relay_limits_hit_total{limit=\"connections_per_address\"} 1",
            "hurtle_relay_limits_hit_total{limit=\"allocations_per_address\"} 1",
            "hurtle_relay_limits_hit_total{limit=\"bytes_per_address\"} 2",
            "hurtle_relay_udp_dropped_over_rate_bytes_total 2400",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        // Each metric has its HELP and TYPE once.
        let types = text.lines().filter(|l| l.starts_with("# TYPE")).count();
        let helps = text.lines().filter(|l| l.starts_with("# HELP")).count();
        assert_eq!(types, helps);
        assert_eq!(types, 15);
    }
}
