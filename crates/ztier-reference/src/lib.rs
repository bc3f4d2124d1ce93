//! The C references ztier's benches and fuzz targets compare with, that no library of ztier
//! needs: liblzo2 (linked from the system, Debian's liblzo2-dev). liblz4 lives in
//! `ztier-compress`, which uses it for lz4hc. The criterion benches that use it are in
//! `ztier-compress/benches`.
//!
//! This library has no tests of its own (`test = false`), so `cargo test --workspace` never
//! links liblzo2: only `cargo bench` and the fuzz targets do.
#![deny(unsafe_code)]

pub mod liblzo2;
