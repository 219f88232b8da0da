//! What the thief of a shared key gets from a session recorded before the theft
//! ([docs/threat-model.md](../../../docs/threat-model.md), "Thief of a key file"): replaying the
//! recorded key agreement with the stolen key, as either side, gives keys that open none of
//! the recorded frames. A session's keys come from the SPAKE2 exchange's ephemeral secrets,
//! which neither side keeps, as well as from the key: the key alone does not give them.

use hurtle_proto::secure::{answer, sealed_test_datagram as datagram, Offer, Secret};
use hurtle_proto::wire::{self, Control};

/// A recorded control frame: its length prefix and its sealed body.
fn split(frame: &[u8]) -> ([u8; 4], Vec<u8>) {
    (frame[..4].try_into().unwrap(), frame[4..].to_vec())
}

#[test]
fn a_stolen_key_does_not_open_a_session_recorded_before_the_theft() {
    let secret = Secret::key([0x42; 32]);
    let hello = Control::hello(0, 1, wire::DEFAULT_PAYLOAD, 1 << 20, 0x5eed_0001);
    // The session, as an on-path recorder sees it: both Agree frames, the hello, then sealed
    // frames.
    let (offer, first) = Offer::new(&secret, false, &hello);
    let (receiver, reply) = answer(&secret, &first, &hello, false).unwrap();
    let sender = offer.finish(reply.clone()).unwrap();
    let mut frames_out = sender.frames_out;
    let recorded = frames_out.seal(&Control::Reject {
        reason: "secret-file-name.txt".into(),
    });
    let recorded_datagram = datagram(&sender.data, b"the file's secret bytes");
    // The peers open them.
    let (prefix, body) = split(&recorded);
    let mut frames_in = receiver.frames_in;
    assert!(frames_in.open(prefix, body.clone()).is_ok());
    assert!(receiver
        .data
        .opener(0)
        .open(&mut recorded_datagram.clone())
        .is_ok());
    // The thief, with the key: as the receiver, it answers the recorded first frame again; as
    // the sender, it offers again and takes the recorded answer. Neither opens anything.
    let (as_receiver, _) = answer(&secret, &first, &hello, false).unwrap();
    let mut thief_in = as_receiver.frames_in;
    assert!(
        thief_in.open(prefix, body.clone()).is_err(),
        "the recorded control frame opened for the thief"
    );
    assert!(
        as_receiver
            .data
            .opener(0)
            .open(&mut recorded_datagram.clone())
            .is_err(),
        "the recorded datagram opened for the thief"
    );
    let (again, _) = Offer::new(&secret, false, &hello);
    assert!(
        again.finish(reply).is_err(),
        "the recorded answer confirmed a new offer"
    );
}
