//! Sizes and durations on the command line: ztier-base's parsers ([`ztier_base::units`]),
//! the one copy, which clap calls as value parsers.
pub use ztier_base::units::{parse_duration, parse_positive_duration, parse_size};
