//! Placeholder until this target's decoder lands; replaced by the crate's owner.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = data;
});
