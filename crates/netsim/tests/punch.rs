//! Hole punching between two peers behind NATs of each kind (`hurtle_netsim::punch`): which
//! pairings find a direct path, and how many round trips after the relay starts them; which
//! do not, and give up (their sessions stay relayed).
//!
//! The default paths: 30 and 40 ms one way from the sender and the receiver to the relay, 50
//! ms one way between the peers (a direct round trip is 100 ms).

use hurtle_netsim::nat::NatConfig;
use hurtle_netsim::punch::{PunchOutcome, PunchScenario};
use hurtle_proto::punch::{PunchEvent, PUNCH_FOR};
use std::net::IpAddr;
use std::time::Duration;

const RTT: Duration = Duration::from_millis(100);

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn pairing(
    sender: Option<fn(IpAddr) -> NatConfig>,
    receiver: Option<fn(IpAddr) -> NatConfig>,
) -> PunchScenario {
    PunchScenario {
        sender_nat: sender.map(|f| f(ip("198.51.100.1"))),
        receiver_nat: receiver.map(|f| f(ip("203.0.113.1"))),
        ..PunchScenario::default()
    }
}

fn run(name: &str, sc: &PunchScenario) -> PunchOutcome {
    let out = sc.run();
    eprintln!("{name}: {out}");
    out
}

fn gave_up(out: &PunchOutcome) -> bool {
    out.sender == Some(PunchEvent::GaveUp) && out.receiver == Some(PunchEvent::GaveUp)
}

#[test]
fn the_relay_starts_both_sides_together_once_it_has_both_candidates() {
    let out = run("port-restricted both", &PunchScenario::default());
    // Each side's socket hears its address from the relay one round trip to it after time
    // zero (60 and 80 ms), tells the relay (30 and 40 ms on): the relay has both at 120 ms and
    // both have the other's candidates 40 ms later.
    assert_eq!(out.started, Duration::from_millis(160));
    assert_eq!(out.reflexive.0.ip(), ip("198.51.100.1"));
    assert_eq!(out.reflexive.1.ip(), ip("203.0.113.1"));
}

#[test]
fn cone_nats_on_both_sides_go_direct_in_one_round_trip() {
    for (name, nat) in [
        ("full cone", NatConfig::full_cone as fn(IpAddr) -> NatConfig),
        ("restricted cone", NatConfig::restricted_cone),
        ("port-restricted", NatConfig::port_restricted),
    ] {
        let out = run(name, &pairing(Some(nat), Some(nat)));
        // Both first probes cross: each NAT has sent toward the other's mapping already.
        assert_eq!(out.direct_after(), Some(RTT), "{name}: {out}");
        // Each side's path is the other's public mapping.
        assert!(
            matches!(out.sender, Some(PunchEvent::Direct { addr, .. }) if addr == out.reflexive.1),
            "{name}: {out}"
        );
        assert!(
            matches!(out.receiver, Some(PunchEvent::Direct { addr, .. }) if addr == out.reflexive.0),
            "{name}: {out}"
        );
    }
}

#[test]
fn a_public_peer_and_a_nat_go_direct_in_one_round_trip() {
    let out = run(
        "public sender",
        &pairing(None, Some(NatConfig::port_restricted)),
    );
    assert_eq!(out.direct_after(), Some(RTT), "{out}");
    // Behind a symmetric NAT the sender is reached at the port its NAT opened toward the
    // receiver, which the receiver learns from the sender's probe: half a round trip more.
    let out = run(
        "public receiver",
        &pairing(Some(NatConfig::symmetric), None),
    );
    assert_eq!(out.direct_after(), Some(RTT + RTT / 2), "{out}");
}

#[test]
fn a_symmetric_nat_goes_direct_where_the_other_side_lets_its_new_port_in() {
    for (name, nat) in [
        ("full cone", NatConfig::full_cone as fn(IpAddr) -> NatConfig),
        ("restricted cone", NatConfig::restricted_cone),
    ] {
        let out = run(name, &pairing(Some(NatConfig::symmetric), Some(nat)));
        // The sender's probe comes from a port its NAT opened for the receiver: the receiver
        // answers it there (the sender has a path after one round trip) and probes it, which
        // the sender answers: half a round trip later for the receiver.
        assert_eq!(out.direct_after(), Some(RTT + RTT / 2), "{name}: {out}");
        let Some(PunchEvent::Direct { addr, .. }) = out.receiver else {
            panic!("{name}: {out}");
        };
        assert_ne!(
            addr, out.reflexive.0,
            "{name}: the port toward the receiver, not the relay's"
        );
        // The same the other way round.
        let out = run(name, &pairing(Some(nat), Some(NatConfig::symmetric)));
        assert_eq!(
            out.direct_after(),
            Some(RTT + RTT / 2),
            "{name} (swapped): {out}"
        );
    }
}

#[test]
fn symmetric_against_port_restricted_or_symmetric_gives_up_and_stays_relayed() {
    for (name, s, r) in [
        (
            "symmetric / port-restricted",
            NatConfig::symmetric as fn(IpAddr) -> NatConfig,
            NatConfig::port_restricted as fn(IpAddr) -> NatConfig,
        ),
        (
            "port-restricted / symmetric",
            NatConfig::port_restricted,
            NatConfig::symmetric,
        ),
        (
            "symmetric / symmetric",
            NatConfig::symmetric,
            NatConfig::symmetric,
        ),
    ] {
        let out = run(name, &pairing(Some(s), Some(r)));
        assert!(gave_up(&out), "{name}: {out}");
        // Every probe was dropped by a filter, never answered.
        assert!(out.filtered > 0, "{name}: {out}");
        // Within the bounded time: six rounds of probes to each candidate and no more.
        assert!(out.datagrams < 2 * (2 + 6 * 3), "{name}: {out}");
        let _ = PUNCH_FOR;
    }
}

#[test]
fn lost_probes_cost_retries_not_the_path() {
    // 20% of datagrams lost on every path (the relay's too): still direct, a few retries on.
    let mut worst = Duration::ZERO;
    for seed in 1..=20 {
        let sc = PunchScenario {
            loss: 0.2,
            seed,
            ..PunchScenario::default()
        };
        let out = run(&format!("lossy seed {seed}"), &sc);
        let after = out
            .direct_after()
            .unwrap_or_else(|| panic!("seed {seed}: {out}"));
        worst = worst.max(after);
    }
    // The retries come 100, 200, 400 ms apart: three lost rounds in a row cost 0.7 s.
    assert!(worst <= Duration::from_millis(1600), "{worst:?}");
}
