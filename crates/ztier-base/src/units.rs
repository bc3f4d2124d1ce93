//! Sizes and durations as people write them: bytes, or a number with a K, M, G or T suffix
//! (powers of 1024, as the kernel's `disksize` and `mem_limit` take them); `500ms`, `30s`,
//! `5m`, `2h`, `1d`. The one parser of each, for the command line and the files that
//! describe devices.

use std::time::Duration;

/// A size or a duration that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UnitError {
    #[error("'{0}' is not a size (bytes, or a number with K, M, G or T)")]
    NotASize(String),
    #[error("'{0}' is more bytes than 64 bits hold")]
    SizeTooLarge(String),
    #[error("'{0}' is not a duration (a number with ms, s, m, h or d)")]
    NotADuration(String),
    #[error("'{0}' is not a duration above zero")]
    ZeroDuration(String),
}

/// Parses `4096`, `64K`, `512M`, `2G`, `1T` (upper or lower case, an optional `iB`/`B`).
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (digits, shift) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 30),
        Some('t' | 'T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| UnitError::NotASize(s.to_string()))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| UnitError::SizeTooLarge(s.to_string()))
}

/// Parses a duration: `500ms`, `30s`, `5m`, `2h`, `1d`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let t = s.trim();
    let bad = || UnitError::NotADuration(s.to_string());
    let (digits, unit_ms): (&str, u64) = if let Some(d) = t.strip_suffix("ms") {
        (d, 1)
    } else {
        match t.chars().last() {
            Some('s') => (&t[..t.len() - 1], 1000),
            Some('m') => (&t[..t.len() - 1], 60_000),
            Some('h') => (&t[..t.len() - 1], 3_600_000),
            Some('d') => (&t[..t.len() - 1], 86_400_000),
            _ => (t, 1000),
        }
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    n.checked_mul(unit_ms)
        .map(Duration::from_millis)
        .ok_or_else(bad)
}

/// [`parse_duration`]'s, above zero: for an interval or a time limit, which at zero would
/// spin (an interval) or end everything at once (a limit).
pub fn parse_positive_duration(s: &str) -> Result<Duration, UnitError> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(UnitError::ZeroDuration(s.to_string()));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("").is_err());
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["0", "0s", "0ms", "0d", "", "-1s", "5 parsecs", "s", "1e400"] {
            assert!(parse_positive_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_positive_duration("500ms"),
            Ok(Duration::from_millis(500))
        );
        assert_eq!(parse_positive_duration("1ms"), Ok(Duration::from_millis(1)));
    }

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert!(parse_size("12X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T")
            .unwrap_err()
            .to_string()
            .contains("64 bits"));
    }
}
