//! Any bytes given to the control-frame decoder: never a panic; decoded messages round-trip.
#![no_main]
use hurtle_proto::wire::Control;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() >= 4 {
        let _ = Control::frame_len([data[0], data[1], data[2], data[3]]);
    }
    if let Ok(msg) = Control::from_body(data) {
        let frame = msg.to_frame();
        assert_eq!(Control::from_body(&frame[4..]).ok(), Some(msg));
    }
});
