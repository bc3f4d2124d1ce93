#![no_main]
libfuzzer_sys::fuzz_target!(
    // The arena's helper thread lives for the process; started here, before any input, it
    // is not taken for an input's leak.
    init: ztier_fuzz::keep_arena_helper(),
    |data: &[u8]| ztier_fuzz::zram_state(data)
);
