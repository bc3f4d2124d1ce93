//! What devices cost before they are used: alone in its process, so no other test's memory
//! is counted.

use ztier_host::{DeviceSpec, Host, HostConfig};

fn rss() -> u64 {
    ztier_base::os::process_rss_bytes().unwrap()
}

/// 256 devices of 64 GiB cost next to nothing before a page is written: their tables come
/// from the OS untouched.
#[test]
fn two_hundred_fifty_six_devices_of_64_gib_cost_little_before_use() {
    let host = Host::new(HostConfig::default()).unwrap();
    let before = rss();
    for i in 0..256 {
        host.create(format!("vm{i},size=64G").parse::<DeviceSpec>().unwrap())
            .unwrap();
    }
    let grown = rss().saturating_sub(before);
    eprintln!(
        "256 devices of 64 GiB: {} KiB of RSS before use",
        grown >> 10
    );
    assert!(
        grown <= 64 << 20,
        "256 devices of 64 GiB hold {} MiB before use",
        grown >> 20
    );
    for i in 0..256 {
        host.destroy(&format!("vm{i}")).unwrap();
    }
}
