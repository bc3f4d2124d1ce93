//! The checks behind every fuzz target: a decompressor is total (any input gives Ok or Err,
//! never a panic, an overrun or a hang, and never more output than room; lz4's also agrees
//! with liblz4 on every block both accept, lzo's with liblzo2), every compressor
//! round-trips whatever it is given, and the readers of outside input (the NBD server and
//! client, a saved zram state, control requests, a capture's trace) answer or refuse it.
//!
//! One module a theme: [`compress`], [`pool`], [`nbd`], [`zram`], [`trace`]; the targets in
//! `fuzz_targets/` call the checks by the names re-exported here.

pub mod compress;
pub mod nbd;
pub mod pool;
pub mod trace;
pub mod zram;

pub use compress::{decompress_is_total, round_trips};
pub use nbd::{nbd_client, nbd_server, nbd_server_tls, x509_names};
pub use pool::pool_model;
pub use trace::trace;
pub use zram::{keep_arena_helper, zram_attrs, zram_state};
