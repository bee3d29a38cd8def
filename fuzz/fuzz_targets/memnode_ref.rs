//! A memory-node reference as any peer may send it (`RemoteRef::from_bytes`): never a panic,
//! and whatever decodes encodes back to the same 48 bytes.
#![no_main]

use netless_memnode::RemoteRef;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(reference) = RemoteRef::from_bytes(data) {
        assert_eq!(&reference.to_bytes()[..], data);
        assert!(reference.pages() <= reference.len().div_ceil(4096));
        let _ = format!("{reference:?}");
    }
});
