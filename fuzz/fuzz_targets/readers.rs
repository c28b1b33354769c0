//! `cargo +nightly fuzz run readers`: every format's reader (and writer) on arbitrary JSON.
#![no_main]
use libfuzzer_sys::fuzz_target;
use stepwise_core::formats::ALL_FORMATS;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        for f in ALL_FORMATS {
            if let Ok(sols) = f.read(&v, 0) {
                let _ = f.write(&sols);
            }
        }
    }
});
