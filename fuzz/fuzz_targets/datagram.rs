//! Any bytes given to the datagram decoder: never a panic, and what decodes re-encodes identically.
#![no_main]
use hurtle_proto::wire::{Header, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((h, payload)) = Header::decode(data) {
        let mut again = vec![0u8; HEADER_LEN];
        h.encode(&mut again);
        assert_eq!(&again[..], &data[..HEADER_LEN]);
        assert_eq!(payload.len(), usize::from(h.len));
    }
});
