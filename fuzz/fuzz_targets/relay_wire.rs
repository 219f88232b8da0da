//! Any bytes given to the relay's frame decoders (`hurtle_relay::wire`), as a stream of frames
//! the way the relay and its clients read them, as one buffer and as a frame body: never a
//! panic, a decoder takes no more than the frame it reports, and every message decoded is
//! written back as a frame that decodes to the same message and is itself re-encoded to the
//! same bytes (the encoding is canonical, and never longer than a frame may be).
#![no_main]
use hurtle_relay::wire::{decode, decode_body, frame_len, read_msg, Msg, MAX_FRAME};
use libfuzzer_sys::fuzz_target;

fn check(msg: &Msg) {
    let frame = msg.to_frame();
    assert!(
        frame.len() >= 2 && frame.len() - 2 <= MAX_FRAME,
        "{msg:?} re-encodes to a frame of {} bytes",
        frame.len()
    );
    let (again, used) = match decode(&frame) {
        Ok(Some(d)) => d,
        other => panic!("{msg:?} re-encoded does not decode: {other:?}"),
    };
    assert_eq!(used, frame.len());
    assert_eq!(&again, msg);
    assert_eq!(again.to_frame(), frame);
}

fuzz_target!(|data: &[u8]| {
    // A stream of frames, read one at a time (as the relay reads a connection).
    let mut rest = data;
    for _ in 0..64 {
        let before = rest.len();
        match read_msg(&mut rest) {
            Ok(msg) => {
                let len = frame_len([data[data.len() - before], data[data.len() - before + 1]])
                    .expect("a frame read has a good length");
                assert_eq!(before - rest.len(), 2 + len, "read_msg read past its frame");
                check(&msg);
            }
            Err(_) => break,
        }
    }
    // The first frame of a buffer.
    match decode(data) {
        Ok(Some((msg, used))) => {
            assert!(used <= data.len() && used > 2);
            assert_eq!(decode_body(&data[2..used]).ok().as_ref(), Some(&msg));
            check(&msg);
        }
        Ok(None) => {
            // Only part of a frame: a good length prefix and too few bytes behind it.
            if data.len() >= 2 {
                let len = frame_len([data[0], data[1]]).expect("a partial frame's length is good");
                assert!(data.len() < 2 + len);
            }
        }
        Err(_) => {}
    }
    // The whole input as one frame body.
    if let Ok(msg) = decode_body(data) {
        if data.len() <= MAX_FRAME {
            check(&msg);
        }
    }
});
