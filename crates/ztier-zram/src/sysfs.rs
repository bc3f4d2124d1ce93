//! The device's controls under the kernel's sysfs names (`/sys/block/zramN/*`), as text in
//! and text out, so a running server can be driven the way a zram device is:
//!
//! | write | value |
//! |---|---|
//! | `idle` | `all`, or seconds not accessed |
//! | `writeback` | `idle`, `huge`, `huge_idle`, `incompressible`, `all`, `page=N`, `page_indexes=N-M` |
//! | `writeback_limit` | 4 KiB blocks (and the limit is on) |
//! | `writeback_limit_enable` | `0` or `1` |
//! | `recomp_algorithm` | `algo=ALG [priority=N]` |
//! | `recompress` | `type=idle\|huge\|huge_idle\|all [threshold=BYTES] [priority=N]` |
//! | `compact` | anything (or nothing) |
//! | `mem_limit` | bytes, with K, M, G, ... as the kernel's `memparse` takes (`0`: none) |
//! | `mem_used_max` | `0` |
//!
//! Reads: `mm_stat`, `io_stat`, `bd_stat`, `debug_stat`, `writeback_limit`,
//! `writeback_limit_enable`, `recomp_algorithm`, `backing_dev`.

use std::time::Duration;

use crate::{Device, PageSelector, Result, ZramError};

fn bad(name: &str, value: &str, want: &str) -> ZramError {
    ZramError::BadValue {
        attr: name.into(),
        value: value.into(),
        want: want.into(),
    }
}

fn number(name: &str, value: &str) -> Result<u64> {
    value
        .trim()
        .parse()
        .map_err(|_| bad(name, value, "a number"))
}

/// A number that must fit a u32 (the kernel's `kstrtouint`): a larger one is refused, not
/// cut to its low bits.
fn number_u32(name: &str, value: &str) -> Result<u32> {
    u32::try_from(number(name, value)?).map_err(|_| bad(name, value, "a number up to 4294967295"))
}

/// The kernel's `memparse()`, which `mem_limit` takes: a number in C's notation (`0x` hex,
/// a leading `0` octal, else decimal) and an optional K, M, G, T, P or E (either case).
fn memparse(name: &str, value: &str) -> Result<u64> {
    let v = value.trim();
    let (radix, body) = if let Some(hex) = v.strip_prefix("0x").or(v.strip_prefix("0X")) {
        (16, hex)
    } else if v.len() > 1 && v.starts_with('0') {
        (8, &v[1..])
    } else {
        (10, v)
    };
    let end = body
        .find(|c: char| !c.is_digit(radix))
        .unwrap_or(body.len());
    let (digits, suffix) = body.split_at(end);
    let shift = match suffix {
        "" => 0,
        "k" | "K" => 10,
        "m" | "M" => 20,
        "g" | "G" => 30,
        "t" | "T" => 40,
        "p" | "P" => 50,
        "e" | "E" => 60,
        _ => 64,
    };
    u64::from_str_radix(digits, radix)
        .ok()
        .filter(|_| shift < 64)
        .and_then(|n| n.checked_mul(1 << shift.min(63)))
        .ok_or_else(|| bad(name, value, "a size (bytes, or with K, M, G, T, P or E)"))
}

/// `key=value` words.
fn pairs<'a>(name: &str, value: &'a str) -> Result<Vec<(&'a str, &'a str)>> {
    value
        .split_whitespace()
        .map(|w| w.split_once('=').ok_or_else(|| bad(name, w, "key=value")))
        .collect()
}

impl Device {
    /// `echo VALUE > NAME`; returns what the write did, in a line.
    pub fn store_attr(&self, name: &str, value: &str) -> Result<String> {
        let value = value.trim();
        match name {
            "idle" => {
                let age = match value {
                    "all" => None,
                    v => Some(Duration::from_secs(number(name, v)?)),
                };
                Ok(format!("{} pages marked idle", self.mark_idle(age)))
            }
            "writeback" => {
                // An index past the device is refused here, as the kernel's -EINVAL, before
                // a range end of index + 1 is formed (it would overflow at u64::MAX).
                let index = |v: &str| {
                    number(name, v).and_then(|i| {
                        (i < self.pages()).then_some(i).ok_or_else(|| {
                            bad(name, v, &format!("a page index below {}", self.pages()))
                        })
                    })
                };
                let (mode, range) = if let Some(p) = value.strip_prefix("page=") {
                    let i = index(p)?;
                    (PageSelector::All, Some(i..i + 1))
                } else if let Some(r) = value.strip_prefix("page_indexes=") {
                    let (a, b) = r.split_once('-').ok_or_else(|| bad(name, r, "N-M"))?;
                    let (a, b) = (number(name, a)?, index(b)?);
                    if b < a {
                        return Err(bad(name, r, "a range N-M with N <= M"));
                    }
                    (PageSelector::All, Some(a..b + 1))
                } else {
                    (
                        value.parse::<PageSelector>().map_err(|source| {
                            ZramError::BadSelectorValue {
                                attr: name.into(),
                                source,
                            }
                        })?,
                        None,
                    )
                };
                let r = self.writeback(mode, range, None)?;
                Ok(format!(
                    "{} pages written back, {} bytes written",
                    r.pages, r.bytes_written
                ))
            }
            "writeback_limit" => {
                let n = number(name, value)?;
                self.set_writeback_limit(Some(n));
                Ok(format!("writeback limit {n} blocks"))
            }
            "writeback_limit_enable" => match value {
                "0" => {
                    self.set_writeback_limit(None);
                    Ok("writeback limit off".into())
                }
                "1" => {
                    if self.writeback_limit().is_none() {
                        self.set_writeback_limit(Some(0));
                    }
                    Ok(format!(
                        "writeback limit on, {} blocks left",
                        self.writeback_limit().unwrap_or(0)
                    ))
                }
                v => Err(bad(name, v, "0 or 1")),
            },
            "recomp_algorithm" => {
                let mut alg = None;
                let mut prio = 1usize;
                for (k, v) in pairs(name, value)? {
                    match k {
                        "algo" => {
                            alg =
                                Some(v.parse().map_err(|source| ZramError::BadAlgorithmValue {
                                    attr: name.into(),
                                    source,
                                })?)
                        }
                        "priority" => prio = number(name, v)? as usize,
                        _ => return Err(bad(name, k, "algo= or priority=")),
                    }
                }
                let alg = alg.ok_or_else(|| bad(name, value, "algo=ALG [priority=N]"))?;
                let mut algs = self.recomp_algorithms();
                if prio == 0 || prio > algs.len() + 1 {
                    return Err(bad(
                        name,
                        value,
                        &format!("a priority from 1 to {}", algs.len() + 1),
                    ));
                }
                if prio > algs.len() {
                    algs.push(alg);
                } else {
                    algs[prio - 1] = alg;
                }
                self.set_recomp_algorithms(algs)?;
                Ok(format!("secondary algorithm {prio} set"))
            }
            "recompress" => {
                let mut mode = PageSelector::All;
                let (mut threshold, mut prio) = (None, None);
                for (k, v) in pairs(name, value)? {
                    match k {
                        "type" => {
                            mode = v.parse().map_err(|source| ZramError::BadSelectorValue {
                                attr: name.into(),
                                source,
                            })?
                        }
                        "threshold" => threshold = Some(number(name, v)? as usize),
                        "priority" => prio = Some(number_u32(name, v)?),
                        _ => return Err(bad(name, k, "type=, threshold= or priority=")),
                    }
                }
                let r = self.recompress(mode, threshold, prio)?;
                Ok(format!(
                    "{} pages tried, {} recompressed ({} -> {} bytes), {} marked incompressible",
                    r.scanned, r.recompressed, r.bytes_before, r.bytes_after, r.incompressible
                ))
            }
            "compact" => Ok(format!("{} pages freed", self.compact())),
            "mem_limit" => {
                self.set_mem_limit(memparse(name, value)?);
                Ok("memory limit set".into())
            }
            "mem_used_max" => {
                if value != "0" {
                    return Err(bad(name, value, "0"));
                }
                self.reset_mem_used_max();
                Ok("mem_used_max reset".into())
            }
            _ => Err(ZramError::NoAttribute {
                name: name.into(),
                kind: "writable",
                known: "idle, writeback, writeback_limit, writeback_limit_enable, \
                        recomp_algorithm, recompress, compact, mem_limit, mem_used_max",
            }),
        }
    }

    /// `cat NAME`.
    pub fn show_attr(&self, name: &str) -> Result<String> {
        Ok(match name {
            "mm_stat" => self.mm_stat().to_string(),
            "io_stat" => self.io_stat().to_string(),
            "debug_stat" => self.debug_stat().to_string(),
            "bd_stat" => match self.bd_stat() {
                Some(b) => format!("{:>8} {:>8} {:>8}", b.bd_count, b.bd_reads, b.bd_writes),
                None => return Err(ZramError::NoBacking),
            },
            "writeback_limit" => self.writeback_limit().unwrap_or(0).to_string(),
            "writeback_limit_enable" => u8::from(self.writeback_limit().is_some()).to_string(),
            "recomp_algorithm" => self
                .recomp_algorithms()
                .iter()
                .enumerate()
                .map(|(i, a)| format!("#{}: {a}", i + 1))
                .collect::<Vec<_>>()
                .join("\n"),
            "backing_dev" => match self.backing() {
                Some(b) => format!(
                    "{:?} format, room for {} pages",
                    b.format(),
                    b.capacity_pages()
                ),
                None => "none".into(),
            },
            _ => {
                return Err(ZramError::NoAttribute {
                    name: name.into(),
                    kind: "readable",
                    known: "mm_stat, io_stat, bd_stat, debug_stat, writeback_limit, \
                            writeback_limit_enable, recomp_algorithm, backing_dev",
                })
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::memparse;
    use crate::Device;

    fn device() -> Device {
        let pool = ztier_pool::ZsPool::new(ztier_pool::ZsConfig::default()).unwrap();
        let dev = Device::new(16 * 4096, "lz4".parse().unwrap(), Box::new(pool)).unwrap();
        dev.write_page(3, &[7u8; 4096]).unwrap();
        dev
    }

    /// A number past its field's range is refused with the reason, never wrapped or cut to
    /// fit: `page=` at the largest index a u64 holds (whose range end overflowed: a panic
    /// with overflow checks, else an empty range and "0 pages written back"), a priority past
    /// a u32 (cut to its low bits, 2^32 + 1 recompressed as priority 1).
    #[test]
    fn numbers_out_of_their_range_are_refused() {
        let dev = device();
        for (attr, value, why) in [
            (
                "writeback",
                "page=18446744073709551615",
                "a page index below 16",
            ),
            ("writeback", "page=16", "a page index below 16"),
            (
                "writeback",
                "page_indexes=2-18446744073709551615",
                "a page index below 16",
            ),
            ("writeback", "page_indexes=5-3", "N <= M"),
            (
                "recompress",
                "type=all priority=4294967297",
                "a number up to 4294967295",
            ),
            ("recompress", "type=all threshold=x", "a number"),
            (
                "recomp_algorithm",
                "algo=zstd priority=18446744073709551615",
                "a priority from 1 to 1",
            ),
        ] {
            let e = dev.store_attr(attr, value).unwrap_err().to_string();
            assert!(e.contains(why), "{attr} {value}: {e}");
        }
        assert_eq!(dev.mm_stat().orig_data_size, 4096, "nothing changed");
    }

    /// A writeback limit of the most blocks a u64 holds stays a limit (it is how "no limit"
    /// was kept: the limit read back as off, and enabling it again set it to 0, stopping
    /// every writeback).
    #[test]
    fn the_largest_writeback_limit_stays_on() {
        let dev = device();
        dev.store_attr("writeback_limit", "18446744073709551615")
            .unwrap();
        assert_eq!(dev.show_attr("writeback_limit_enable").unwrap(), "1");
        dev.store_attr("writeback_limit_enable", "1").unwrap();
        assert_eq!(dev.writeback_limit(), Some(u64::MAX - 1));
        dev.store_attr("writeback_limit_enable", "0").unwrap();
        assert_eq!(dev.show_attr("writeback_limit_enable").unwrap(), "0");
    }

    #[test]
    fn memparse_reads_what_the_kernel_reads() {
        for (text, bytes) in [
            ("0", 0),
            ("4096", 4096),
            ("1K", 1024),
            ("1k", 1024),
            ("64M", 64 << 20),
            ("2G", 2 << 30),
            ("0x10", 16),
            ("0x1E", 30),
            ("0x10K", 16 << 10),
            ("010", 8),
        ] {
            assert_eq!(memparse("mem_limit", text).unwrap(), bytes, "{text}");
        }
        for bad in ["", "K", "1X", "1KK", "-1", "99999999999E", "0x", "08"] {
            assert!(memparse("mem_limit", bad).is_err(), "{bad}");
        }
    }
}
