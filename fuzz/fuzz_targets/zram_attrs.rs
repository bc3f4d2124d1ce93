#![no_main]
libfuzzer_sys::fuzz_target!(
    // A pool kept for the process (see zram_state_init).
    init: ztier_fuzz::zram_state_init(),
    |data: &[u8]| ztier_fuzz::zram_attrs(data)
);
