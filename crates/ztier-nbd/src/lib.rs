//! NBD, the network block device protocol: [`proto`] (messages, for server and client),
//! [`server`], which serves any [`ztier_blockdev::BlockDevice`], and [`client`], which makes
//! a remote export one. It knows nothing of zram.
#![forbid(unsafe_code)]

mod buffers;
pub mod client;
pub mod proto;
pub mod server;
pub mod tls;

pub use client::{Client, ClientConfig, LinkState, LinkStatus, Uri, UriTls};
pub use server::{Listener, Server, ServerConfig, Stream};
pub use tls::{ServerTls, TlsError, TlsMode};
