//! NBD, the network block device protocol: [`proto`] (messages, for server and client) and
//! [`server`], which serves any [`ztier_blockdev::BlockDevice`]. It knows nothing of zram.
#![forbid(unsafe_code)]

mod buffers;
pub mod proto;
pub mod server;

pub use server::{Listener, Server, ServerConfig, Stream};
