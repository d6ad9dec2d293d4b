//! Durations as rule files write them: `500ms`, `10s`, `1m`, `1h`, `1d`, `1w`, or a number of
//! seconds.

use std::time::Duration;

use serde::Deserializer;

/// What a duration may be, as errors say it.
const EXPECTED: &str = "expected a whole number and ms, s, m, h, d or w (`10s`, `1m`)";

/// Parses `text`: a whole number followed by `ms`, `s`, `m`, `h`, `d` or `w`, or a whole
/// number of seconds.
///
/// # Errors
/// A message saying what is accepted.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let bad = || format!("invalid duration `{text}`: {EXPECTED}");
    let n: u64 = number.parse().map_err(|_| bad())?;
    let millis = match unit.trim() {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "w" => 7 * 86_400_000,
        _ => return Err(bad()),
    };
    n.checked_mul(millis)
        .map(Duration::from_millis)
        .ok_or_else(bad)
}

/// A duration field: a string as [`parse_duration`] reads it, or a number of seconds.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    struct Seconds;
    impl serde::de::Visitor<'_> for Seconds {
        type Value = Duration;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a duration (`10s`, `1m`) or a whole number of seconds")
        }
        fn visit_u64<E: serde::de::Error>(self, seconds: u64) -> Result<Duration, E> {
            Ok(Duration::from_secs(seconds))
        }
        fn visit_i64<E: serde::de::Error>(self, seconds: i64) -> Result<Duration, E> {
            u64::try_from(seconds)
                .map(Duration::from_secs)
                .map_err(|_| E::custom(format!("invalid duration `{seconds}`: {}", EXPECTED)))
        }
        fn visit_f64<E: serde::de::Error>(self, seconds: f64) -> Result<Duration, E> {
            Err(E::custom(format!(
                "invalid duration `{seconds}`: {}",
                EXPECTED
            )))
        }
        fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Duration, E> {
            parse_duration(text).map_err(E::custom)
        }
    }
    d.deserialize_any(Seconds)
}

/// The JSON Schema of a duration field: a string as [`parse_duration`] reads it, or a whole
/// number of seconds.
pub(crate) fn schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "A duration: a whole number and ms, s, m, h, d or w (`10s`, `1m`), or a whole number of seconds.",
        "oneOf": [
            { "type": "string", "pattern": "^[0-9]+ *(ms|s|m|h|d|w)?$" },
            { "type": "integer", "minimum": 0 }
        ]
    })
}

/// An optional duration field.
pub(crate) fn deserialize_option<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    deserialize(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        for bad in ["", "s", "1y", "-1s", "1.5s", "99999999999999999999d"] {
            assert!(
                parse_duration(bad)
                    .unwrap_err()
                    .contains("invalid duration"),
                "{bad}"
            );
        }
    }
}
