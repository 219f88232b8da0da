//! Any bytes given to the security layer's decoders: as a sealed datagram to a channel's opener,
//! as a sealed control frame to a frame opener, and as the first frame of a key agreement to
//! a receiver holding a code. Never a panic; nothing forged ever opens.
#![no_main]
use hurtle_proto::secure::{answer, offered_key, Offer, Secret};
use hurtle_proto::wire::{Control, DEFAULT_PAYLOAD};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let secret = Secret::code("1234-fuzz-code");
    // The hello the sender sends in the clear behind its `Agree` (bound into the keys).
    let hello = Control::hello(0, 4, DEFAULT_PAYLOAD, 1 << 20, 7);
    // Keys both sides would hold after a real agreement.
    let (offer, first) = Offer::new(&secret, false, &hello);
    let Ok((mut receiver, reply)) = answer(&secret, &first, &hello, false) else {
        panic!("a real offer was refused");
    };
    let Ok(_sender) = offer.finish(reply) else {
        panic!("a real answer was refused");
    };

    // A sealed datagram: whatever the bytes, it does not open (the key is unknown to them).
    let mut datagram = data.to_vec();
    // The opener of the channel the header names (byte 1), so that the bytes reach the AEAD.
    let channel = data.get(1).copied().map_or(0, u16::from);
    assert!(receiver.data.opener(channel).open(&mut datagram).is_err());

    // A sealed control frame.
    if data.len() >= 4 {
        let prefix = [data[0], data[1], data[2], data[3]];
        assert!(receiver.frames_in.open(prefix, data[4..].to_vec()).is_err());
    }

    // The first frame of an agreement: decoded, checked, answered or refused; never a panic.
    if let Ok(msg) = Control::from_body(data) {
        let _ = offered_key(&msg);
        let _ = answer(&secret, &msg, &hello, false);
    }
});
