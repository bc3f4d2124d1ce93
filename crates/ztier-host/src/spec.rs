//! What a device is to be: its name, size, compressor, allocator and limits, written as
//! `vm1,size=64G,compressor=lz4,mem_limit=2G,mem_low=256M` (a flag, a control request) or
//! as a table of a host's config file; both read by [`DeviceSpec::from_pairs`], so they
//! take the same keys with the same meaning and the same errors.
//!
//! Invariant: a spec that parsed names a device that can be made (a name the front ends
//! can use as an export and a file name, a size that is whole pages, a known compressor
//! and allocator, a valid pool layout).

use std::time::Duration;

use ztier_base::private_file::PrivateFileError;
use ztier_base::units::{parse_duration, parse_size, UnitError};
use ztier_compress::{Algorithm, BadAlgorithm};
use ztier_pool::{AllocatorKind, ChainRule, ConfigError, UnknownName, ZsConfig};
use ztier_zram::{BadPolicyConfig, BadPromotionTarget, BadWbFormat, WbFormat};

/// The longest device name (an NBD export name, a socket's and a state file's name).
pub const NAME_MAX: usize = 64;

/// Why a spec was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    #[error("a device named {given} cannot also be name={named}")]
    TwoNames { given: String, named: String },
    #[error("a device needs a name (the first word, or name=NAME)")]
    NoName,
    #[error(
        "device name {0:?}: 1 to {NAME_MAX} letters, digits, '-', '_' or '.', not starting \
         with '.' or '-'"
    )]
    BadName(String),
    #[error("device {name}: no size (size=64G)")]
    NoSize { name: String },
    #[error("device {name}: size {size} is not a positive whole number of {page_size}-byte pages")]
    BadSize {
        name: String,
        size: u64,
        page_size: usize,
    },
    #[error("device {name}: unknown key {key:?} (size, compressor, allocator, chain_size, page_size, unit_size, mem_limit, mem_low, store_limit, writeback_format, writeback_idle, promotion_target, recompress_algorithm, recompress_idle, mem_target, read_only, serial)")]
    UnknownKey { name: String, key: String },
    /// The cause is in the message, not also a `source`: clap prints a `--device` flag's
    /// error by its message alone, and a chain printed whole (`{:#}`) would say it twice.
    /// Boxed: a compressor's error is large, and every `Result` of a spec or a host
    /// carries this one's size.
    #[error("device {name}: {key}={value}: {why}")]
    BadValue {
        name: String,
        key: String,
        value: String,
        why: Box<ValueError>,
    },
    #[error("device {name}: {key} given twice")]
    Repeated { name: String, key: String },
}

/// Why a key's value was refused: the parser's own error where one read it, else what the
/// key takes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ValueError {
    #[error(transparent)]
    Unit(#[from] UnitError),
    #[error(transparent)]
    Compressor(#[from] BadAlgorithm),
    #[error(transparent)]
    Allocator(#[from] UnknownName),
    #[error(transparent)]
    WritebackFormat(#[from] BadWbFormat),
    #[error(transparent)]
    PromotionTarget(#[from] BadPromotionTarget),
    /// Keys the device's policy cannot follow together.
    #[error(transparent)]
    Policy(#[from] BadPolicyConfig),
    /// The pool layout the keys make together (said at `page_size`).
    #[error(transparent)]
    Layout(#[from] ConfigError),
    /// A value outside what the key takes, which is said (`1 to 16 pages`).
    #[error("{0}")]
    Expected(&'static str),
    /// A word of a flag's spec that is not `key=value`.
    #[error("not key=value")]
    NotAPair,
}

/// Why a device's saved spec (`NAME.spec` in a host's state directory) could not be written
/// or read back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SavedSpecError {
    /// The file may not hold a spec, or could not be made or opened. Its message names the
    /// file and the system's error, so that error is not also a `source` (a chain printed
    /// whole would say it twice).
    #[error("{0}")]
    File(PrivateFileError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("{line:?} is not key=value")]
    NotAPair { line: String },
    #[error(transparent)]
    Spec(#[from] SpecError),
}

/// A device to make.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceSpec {
    pub name: String,
    /// Bytes.
    pub size: u64,
    pub compressor: Algorithm,
    pub allocator: AllocatorKind,
    pub layout: ZsConfig,
    /// Bytes a compression unit holds (the page's: the kernel's; 16 or 64 KiB: denser).
    pub unit_size: usize,
    /// The device's own cap on its pool (`mem_limit`); 0 = none.
    pub mem_limit: u64,
    /// The pool below which the host's budget takes none of its pages while another device
    /// is above its own (memory cgroups' `memory.low`); 0 = none.
    pub mem_low: u64,
    /// The most bytes of the host's shared store the device's volume may hold (whole
    /// extents); 0 = none but the store's room.
    pub store_limit: u64,
    pub writeback_format: WbFormat,
    /// The device's own policy: write back pages idle this long.
    pub writeback_idle: Option<Duration>,
    /// The device's own policy, instead of `writeback_idle`: write back at the idle age
    /// that keeps reads from the store under this percent of the stored pages per minute
    /// (`promotion_target=0.2%/min`, SDFM's figure, there of the working set; kept as the
    /// percent given, so a saved spec
    /// reads back the same).
    pub promotion_target_percent: Option<f64>,
    /// Secondary algorithms, priority 1 first.
    pub recompress_algorithms: Vec<Algorithm>,
    /// The device's own policy: recompress pages idle this long.
    pub recompress_idle: Option<Duration>,
    /// The device's own policy: keep its pool under this by writeback.
    pub mem_target: Option<u64>,
    /// Served read-only by its front ends.
    pub read_only: bool,
    /// What a VM reads as the disk's serial (vhost-user-blk's GET_ID); the name if unset.
    pub serial: Option<String>,
}

impl DeviceSpec {
    /// A device of `size` bytes with the defaults: lzo-rle on zsmalloc, the kernel's layout,
    /// no limits.
    pub fn new(name: &str, size: u64) -> Result<DeviceSpec, SpecError> {
        check_name(name)?;
        let spec = DeviceSpec::new_unchecked(name, size);
        spec.check_size()?;
        Ok(spec)
    }

    /// A spec from `key=value` pairs (the name as `name=...` or given apart).
    pub fn from_pairs<'a>(
        name: Option<&str>,
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<DeviceSpec, SpecError> {
        let pairs: Vec<(&str, &str)> = pairs.into_iter().collect();
        let named = pairs.iter().find(|(k, _)| *k == "name").map(|(_, v)| *v);
        if let (Some(given), Some(named)) = (name, named) {
            if given != named {
                return Err(SpecError::TwoNames {
                    given: given.to_string(),
                    named: named.to_string(),
                });
            }
        }
        let name = name.or(named).ok_or(SpecError::NoName)?;
        check_name(name)?;
        let size = pairs
            .iter()
            .find(|(k, _)| *k == "size")
            .ok_or_else(|| SpecError::NoSize {
                name: name.to_string(),
            })?;
        let bad = |key: &str, value: &str, why: ValueError| SpecError::BadValue {
            name: name.to_string(),
            key: key.to_string(),
            value: value.to_string(),
            why: Box::new(why),
        };
        let size_of = |k: &str, v: &str| parse_size(v).map_err(|e| bad(k, v, e.into()));
        let duration_of = |k: &str, v: &str| parse_duration(v).map_err(|e| bad(k, v, e.into()));
        let mut spec = DeviceSpec::new_unchecked(name, size_of("size", size.1)?);
        let mut seen: Vec<&str> = Vec::new();
        for &(key, value) in &pairs {
            if key != "recompress_algorithm" && seen.contains(&key) {
                return Err(SpecError::Repeated {
                    name: name.to_string(),
                    key: key.to_string(),
                });
            }
            seen.push(key);
            match key {
                "name" | "size" => {}
                "compressor" => {
                    spec.compressor = value
                        .parse()
                        .map_err(|e| bad(key, value, ValueError::Compressor(e)))?
                }
                "allocator" => {
                    spec.allocator = value
                        .parse()
                        .map_err(|e| bad(key, value, ValueError::Allocator(e)))?
                }
                "chain_size" => {
                    spec.layout.chain_size = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=16).contains(n))
                        .ok_or_else(|| bad(key, value, ValueError::Expected("1 to 16 pages")))?
                }
                "page_size" => {
                    spec.layout.page_size = size_of(key, value)
                        .ok()
                        .and_then(|n| usize::try_from(n).ok())
                        .filter(|n| ztier_pool::PAGE_SIZES.contains(n))
                        .ok_or_else(|| bad(key, value, ValueError::Expected("4K or 16K")))?
                }
                "chain_rule" => {
                    spec.layout.chain_rule = match value {
                        "least-waste" => ChainRule::LeastWaste,
                        "used-percent" => ChainRule::UsedPercent,
                        _ => {
                            return Err(bad(
                                key,
                                value,
                                ValueError::Expected("least-waste or used-percent"),
                            ))
                        }
                    }
                }
                "unit_size" => {
                    spec.unit_size = size_of(key, value)
                        .ok()
                        .and_then(|n| usize::try_from(n).ok())
                        .filter(|n| [4096, 16384, 65536].contains(n))
                        .ok_or_else(|| bad(key, value, ValueError::Expected("4K, 16K or 64K")))?
                }
                "mem_limit" => spec.mem_limit = size_of(key, value)?,
                "mem_low" => spec.mem_low = size_of(key, value)?,
                "store_limit" => spec.store_limit = size_of(key, value)?,
                "mem_target" => spec.mem_target = Some(size_of(key, value)?),
                "writeback_format" => {
                    spec.writeback_format = value
                        .parse()
                        .map_err(|e| bad(key, value, ValueError::WritebackFormat(e)))?
                }
                "writeback_idle" => spec.writeback_idle = Some(duration_of(key, value)?),
                "promotion_target" => {
                    spec.promotion_target_percent = Some(
                        ztier_zram::promotion::parse_percent_per_minute(value)
                            .map_err(|e| bad(key, value, e.into()))?,
                    )
                }
                "recompress_idle" => spec.recompress_idle = Some(duration_of(key, value)?),
                "recompress_algorithm" => spec.recompress_algorithms.push(
                    value
                        .parse()
                        .map_err(|e| bad(key, value, ValueError::Compressor(e)))?,
                ),
                "read_only" => {
                    spec.read_only = match value {
                        "true" | "yes" | "1" => true,
                        "false" | "no" | "0" => false,
                        _ => return Err(bad(key, value, ValueError::Expected("true or false"))),
                    }
                }
                "serial" => spec.serial = Some(value.to_string()),
                _ => {
                    return Err(SpecError::UnknownKey {
                        name: name.to_string(),
                        key: key.to_string(),
                    })
                }
            }
        }
        if let Err(why) = spec.policy_config(Duration::from_secs(10)).validate() {
            let value = pairs
                .iter()
                .find(|(k, _)| *k == "promotion_target")
                .map_or("", |(_, v)| *v);
            return Err(bad("promotion_target", value, why.into()));
        }
        // A unit not named is the pool's page, as the kernel's zram stores one.
        if !seen.contains(&"unit_size") {
            spec.unit_size = spec.layout.page_size;
        }
        if let Err(why) = spec.layout.validate() {
            let page_size = spec.layout.page_size.to_string();
            return Err(bad("page_size", &page_size, why.into()));
        }
        spec.check_size()?;
        Ok(spec)
    }

    fn new_unchecked(name: &str, size: u64) -> DeviceSpec {
        DeviceSpec {
            name: name.to_string(),
            size,
            compressor: "lzo-rle".parse().expect("a built-in algorithm"),
            allocator: AllocatorKind::Zsmalloc,
            layout: ZsConfig::default(),
            unit_size: 4096,
            mem_limit: 0,
            mem_low: 0,
            store_limit: 0,
            writeback_format: WbFormat::Packed,
            writeback_idle: None,
            promotion_target_percent: None,
            recompress_algorithms: Vec::new(),
            recompress_idle: None,
            mem_target: None,
            read_only: false,
            serial: None,
        }
    }

    fn check_size(&self) -> Result<(), SpecError> {
        let ps = self.layout.page_size;
        if self.size == 0 || !self.size.is_multiple_of(ps as u64) {
            return Err(SpecError::BadSize {
                name: self.name.clone(),
                size: self.size,
                page_size: ps,
            });
        }
        Ok(())
    }

    /// The spec as `key=value` pairs, every key [`DeviceSpec::from_pairs`] reads (each
    /// value whole: a compressor's parameters may hold commas), so a spec saved and read
    /// back is the same spec.
    pub fn to_pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = vec![
            ("name", self.name.clone()),
            ("size", self.size.to_string()),
            ("compressor", self.compressor.to_string()),
            ("allocator", self.allocator.to_string()),
            ("chain_size", self.layout.chain_size.to_string()),
            ("page_size", self.layout.page_size.to_string()),
            (
                "chain_rule",
                match self.layout.chain_rule {
                    ChainRule::LeastWaste => "least-waste",
                    ChainRule::UsedPercent => "used-percent",
                }
                .to_string(),
            ),
            ("mem_limit", self.mem_limit.to_string()),
            ("mem_low", self.mem_low.to_string()),
            ("store_limit", self.store_limit.to_string()),
            (
                "writeback_format",
                match self.writeback_format {
                    WbFormat::Page => "page",
                    WbFormat::Compressed => "compressed",
                    WbFormat::Packed => "packed",
                }
                .to_string(),
            ),
            ("read_only", self.read_only.to_string()),
        ];
        if self.unit_size != self.layout.page_size {
            pairs.push(("unit_size", self.unit_size.to_string()));
        }
        let seconds = |d: Duration| format!("{}ms", d.as_millis());
        if let Some(d) = self.writeback_idle {
            pairs.push(("writeback_idle", seconds(d)));
        }
        if let Some(p) = self.promotion_target_percent {
            pairs.push(("promotion_target", format!("{p}%/min")));
        }
        if let Some(d) = self.recompress_idle {
            pairs.push(("recompress_idle", seconds(d)));
        }
        if let Some(t) = self.mem_target {
            pairs.push(("mem_target", t.to_string()));
        }
        for a in &self.recompress_algorithms {
            pairs.push(("recompress_algorithm", a.to_string()));
        }
        if let Some(serial) = &self.serial {
            pairs.push(("serial", serial.clone()));
        }
        pairs
    }

    /// The device's own policy, passing every `interval`.
    pub fn policy_config(&self, interval: Duration) -> ztier_zram::PolicyConfig {
        ztier_zram::PolicyConfig {
            recompress_idle: self.recompress_idle,
            writeback_idle: self.writeback_idle,
            mem_target: self.mem_target,
            interval,
            promotion_target: self
                .promotion_target_percent
                .map(|p| ztier_zram::PromotionTarget::new(p / 100.0)),
        }
    }

    /// The serial a VM reads: the one given, else the name.
    pub fn serial(&self) -> &str {
        self.serial.as_deref().unwrap_or(&self.name)
    }
}

impl std::str::FromStr for DeviceSpec {
    type Err = SpecError;

    /// `NAME,key=value,...` or `name=NAME,key=value,...`.
    fn from_str(s: &str) -> Result<DeviceSpec, SpecError> {
        let mut words = s.split(',').map(str::trim).filter(|w| !w.is_empty());
        let first = words.next().ok_or(SpecError::NoName)?;
        let (name, mut pairs) = match first.split_once('=') {
            Some(pair) => (None, vec![pair]),
            None => (Some(first), Vec::new()),
        };
        for w in words {
            let pair = w.split_once('=').ok_or_else(|| SpecError::BadValue {
                name: name.unwrap_or("?").to_string(),
                key: w.to_string(),
                value: String::new(),
                why: Box::new(ValueError::NotAPair),
            })?;
            pairs.push(pair);
        }
        DeviceSpec::from_pairs(name, pairs)
    }
}

/// A name front ends can use as an NBD export, a socket's file name and a state file's.
fn check_name(name: &str) -> Result<(), SpecError> {
    let ok = !name.is_empty()
        && name.len() <= NAME_MAX
        && !name.starts_with(['.', '-'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(SpecError::BadName(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_reads_as_the_spec_it_says() {
        let s: DeviceSpec = "vm1,size=64G,compressor=lz4,mem_limit=2G,mem_low=256M,chain_size=4"
            .parse()
            .unwrap();
        assert_eq!(s.name, "vm1");
        assert_eq!(s.size, 64 << 30);
        assert_eq!(s.compressor.to_string(), "lz4");
        assert_eq!(s.mem_limit, 2 << 30);
        assert_eq!(s.mem_low, 256 << 20);
        assert_eq!(s.layout.chain_size, 4);
        assert_eq!(s.serial(), "vm1");
        let s: DeviceSpec =
            "name=a.b_c-1,size=4M,recompress_algorithm=zstd,recompress_algorithm=deflate"
                .parse()
                .unwrap();
        assert_eq!(s.name, "a.b_c-1");
        assert_eq!(s.recompress_algorithms.len(), 2);
        // A promotion target: the percent kept as given, written back out the same, and the
        // policy's share of it.
        let s: DeviceSpec = "vm2,size=4M,promotion_target=0.2%/min".parse().unwrap();
        assert_eq!(s.promotion_target_percent, Some(0.2));
        let pairs = s.to_pairs();
        assert!(pairs.contains(&("promotion_target", "0.2%/min".to_string())));
        let again =
            DeviceSpec::from_pairs(None, pairs.iter().map(|(k, v)| (*k, v.as_str()))).unwrap();
        assert_eq!(again, s);
        let policy = s.policy_config(Duration::from_secs(10));
        assert_eq!(policy.promotion_target.unwrap().share_per_minute, 0.002);
        assert!(policy.is_active() && policy.writeback_idle.is_none());
    }

    #[test]
    fn mistakes_are_said() {
        let err = |s: &str| s.parse::<DeviceSpec>().unwrap_err();
        assert!(matches!(err(""), SpecError::NoName));
        assert!(matches!(err("../x,size=1M"), SpecError::BadName(_)));
        assert!(matches!(err(".hidden,size=1M"), SpecError::BadName(_)));
        assert!(matches!(err("vm1"), SpecError::NoSize { .. }));
        assert!(matches!(err("vm1,size=1000"), SpecError::BadSize { .. }));
        assert!(matches!(
            err("vm1,size=1M,colour=red"),
            SpecError::UnknownKey { .. }
        ));
        let e = err("vm1,size=1M,compressor=lz9");
        assert!(matches!(
            &e,
            SpecError::BadValue { why, .. }
                if matches!(**why, ValueError::Compressor(BadAlgorithm::Unknown { .. }))
        ));
        // The cause said once, in the message.
        assert!(
            e.to_string()
                .starts_with("device vm1: compressor=lz9: unknown compressor 'lz9'"),
            "{e}"
        );
        assert!(std::error::Error::source(&e).is_none());
        assert!(matches!(
            err("vm1,size=1M,mem_limit=2X"),
            SpecError::BadValue { why, .. } if matches!(*why, ValueError::Unit(UnitError::NotASize(_)))
        ));
        assert!(matches!(
            err("vm1,size=1M,size=2M"),
            SpecError::Repeated { .. }
        ));
        assert!(matches!(
            err("vm1,size=1M,chain_size=17"),
            SpecError::BadValue { .. }
        ));
        assert!(matches!(
            err("vm1,size=1M,oops"),
            SpecError::BadValue { .. }
        ));
        let e = err("vm1,size=1M,promotion_target=0.2");
        assert!(matches!(
            &e,
            SpecError::BadValue { why, .. }
                if matches!(**why, ValueError::PromotionTarget(BadPromotionTarget::NotAPercent { .. }))
        ));
        assert!(
            e.to_string().starts_with(
                "device vm1: promotion_target=0.2: a promotion target of \"0.2\": a percent"
            ),
            "{e}"
        );
        assert!(matches!(
            err("vm1,size=1M,promotion_target=0.2%/min,writeback_idle=10m"),
            SpecError::BadValue { why, .. }
                if matches!(*why, ValueError::Policy(BadPolicyConfig::TwoWritebackAges { .. }))
        ));
        let long = format!("{},size=1M", "x".repeat(65));
        assert!(matches!(err(&long), SpecError::BadName(_)));
    }
}
