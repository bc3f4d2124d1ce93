#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ztier_fuzz::x509_names(data));
