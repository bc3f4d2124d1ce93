#![no_main]
libfuzzer_sys::fuzz_target!(
    // A pool kept for the process (see keep_arena_helper).
    init: ztier_fuzz::keep_arena_helper(),
    |data: &[u8]| ztier_fuzz::zram_attrs(data)
);
