//! A hostile relay cannot use a receiver's agent to reach other local services: the agent dials
//! only ports the receiver itself listens on.

use hurtle_engine::{ReceiveOptions, Receiver};
use hurtle_relay::client::{self, AgentEvent};
use hurtle_relay::wire::{read_msg, write_msg, Msg};
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::Duration;

#[test]
fn agent_dials_only_the_receivers_own_ports() {
    let relay = TcpListener::bind("127.0.0.1:0").unwrap();
    let relay_addr = relay.local_addr().unwrap();
    let other_service = TcpListener::bind("127.0.0.1:0").unwrap();
    let other_port = other_service.local_addr().unwrap().port();
    // The receiver measures its destination when it binds: keep that out of the source tree.
    let out = tempfile::tempdir().unwrap();
    let opts = ReceiveOptions {
        out_dir: out.path().to_path_buf(),
        ..ReceiveOptions::default()
    };
    let ports = opts.own_ports.clone();
    let receiver = Receiver::bind("127.0.0.1:0".parse().unwrap(), opts).unwrap();
    let control = receiver.local_addr().unwrap();
    assert!(ports.contains(control.port()));
    assert!(!ports.contains(other_port));

    // The fake relay: registers the receiver, then asks it to dial.
    let fake = std::thread::spawn(move || {
        let (mut s, _) = relay.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        assert!(matches!(read_msg(&mut s).unwrap(), Msg::Register { .. }));
        write_msg(&mut s, &Msg::Nameplate { nameplate: 4821 }).unwrap();
        write_msg(
            &mut s,
            &Msg::Registered {
                ttl_secs: 60,
                idle_secs: 30,
            },
        )
        .unwrap();
        write_msg(
            &mut s,
            &Msg::Dial {
                id: 1,
                port: other_port,
            },
        )
        .unwrap();
        let refused = loop {
            match read_msg(&mut s).unwrap() {
                Msg::Ping => continue,
                m => break m,
            }
        };
        assert!(matches!(refused, Msg::Refuse { id: 1, .. }), "{refused:?}");
        write_msg(
            &mut s,
            &Msg::Dial {
                id: 2,
                port: control.port(),
            },
        )
        .unwrap();
        let (mut j, _) = relay.accept().unwrap();
        j.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        assert_eq!(read_msg(&mut j).unwrap(), Msg::Join { id: 2 });
    });

    let reg = client::register(relay_addr, control, 2).unwrap();
    assert_eq!(reg.code.nameplate, 4821);
    let (tx, rx) = mpsc::channel();
    let _agent = reg
        .start_agent(control.ip(), ports, move |e| {
            let _ = tx.send(e);
        })
        .unwrap();
    match rx.recv_timeout(Duration::from_secs(10)).unwrap() {
        AgentEvent::Refused { port, .. } => assert_eq!(port, other_port),
        e => panic!("expected a refusal, got {e:?}"),
    }
    fake.join().unwrap();
    other_service.set_nonblocking(true).unwrap();
    assert!(
        other_service.accept().is_err(),
        "the other service was never connected"
    );
    drop(receiver);
}
