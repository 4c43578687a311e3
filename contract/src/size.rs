//! Sizes as users write them (`8MiB`, `512Ki`, `64k`, `1048576`): one
//! grammar for the CRD's admission rule and for the stager's parser, so a
//! value the API server admits is a value the stager accepts, and back.
//!
//! Units are binary: `K`/`k`, `M`, `G`, `T`, each optionally followed by
//! `i` and/or `B` (`8M`, `8Mi`, `8MB` and `8MiB` are all 8 × 2²⁰ bytes), or
//! none for plain bytes (an optional `B`). The number has at most 6 digits
//! with a unit and 15 without, so every admitted value fits in 64 bits.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The size grammar's alternatives, unanchored: [`SIZE_PATTERN`] and
/// [`RESERVE_PATTERN`] are both written from them, so they cannot drift.
macro_rules! size_alternatives {
    () => {
        r"[1-9][0-9]{0,14}B?|[1-9][0-9]{0,5}[kKMGT]i?B?"
    };
}

/// The size grammar as a regular expression (RE2 syntax, as CEL's
/// `matches()` uses). [`ByteSize::from_str`] accepts exactly these strings.
pub const SIZE_PATTERN: &str = concat!("^(", size_alternatives!(), ")$");

/// Serde and CRD schema for a type written as text in a grammar: it is
/// (de)serialized as its `Display`/`FromStr` text, and in a CRD it is a
/// string whose CEL rule is the grammar, so the API server refuses what the
/// stager could not parse, with a message that says how to write it (the
/// API server prefixes the field's path).
macro_rules! text_in_a_grammar {
    ($type:ty, $name:literal, $pattern:expr, $must:literal, $help:expr) => {
        impl Serialize for $type {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $type {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }

        impl schemars::JsonSchema for $type {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                $name.into()
            }

            fn inline_schema() -> bool {
                true
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({
                    "type": "string",
                    "maxLength": 20,
                    "x-kubernetes-validations": [{
                        "rule": format!("self.matches('{}')", $pattern),
                        "message": format!("{}: {}", $must, $help),
                    }],
                })
            }
        }
    };
}

/// A positive number of bytes, written and read in the [`SIZE_PATTERN`]
/// grammar. Keeps the text it was parsed from, so a spec's `8Mi` reaches
/// the stager's command line as `8Mi`, not as a re-rendered number.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ByteSize {
    bytes: u64,
    text: String,
}

/// How to write a size, for error messages.
const SIZE_HELP: &str = "a positive whole number with an optional binary unit K, M, G or T (optionally followed by i and/or B), e.g. 512Ki, 8MiB, 1G or 1048576";

/// A string outside the size grammar.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("'{0}' is not a size: write {SIZE_HELP}")]
pub struct SizeError(String);

impl ByteSize {
    /// The size in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// `bytes` written with the largest binary unit that divides it
    /// (`8MiB`, `1536KiB`, `1000`).
    pub fn from_bytes(bytes: u64) -> Result<Self, SizeError> {
        const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
        let text = UNITS
            .iter()
            .find(|(_, shift)| bytes >= 1 << shift && bytes.is_multiple_of(1 << shift))
            .map(|(unit, shift)| format!("{}{unit}", bytes >> shift))
            .unwrap_or_else(|| bytes.to_string());
        text.parse()
    }
}

impl FromStr for ByteSize {
    type Err = SizeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = || SizeError(text.to_owned());
        let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
        let (digits, unit) = text.split_at(split);
        if digits.is_empty() || digits.starts_with('0') {
            return Err(err());
        }
        let (shift, max_digits) = match unit.trim_end_matches('B').trim_end_matches('i') {
            // `i` without a unit letter (`8iB`) is not a unit.
            "" if unit.is_empty() || unit == "B" => (0, 15),
            "k" | "K" => (10, 6),
            "M" => (20, 6),
            "G" => (30, 6),
            "T" => (40, 6),
            _ => return Err(err()),
        };
        // Only `[unit][i][B]` in that order: `8BiB` or `8MBi` are refused.
        let rest = &unit[unit.len().min(1)..];
        if shift > 0 && !matches!(rest, "" | "i" | "B" | "iB") {
            return Err(err());
        }
        if digits.len() > max_digits {
            return Err(err());
        }
        let value: u64 = digits.parse().map_err(|_| err())?;
        Ok(Self { bytes: value << shift, text: text.to_owned() })
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

text_in_a_grammar!(ByteSize, "ByteSize", SIZE_PATTERN, "must be a size", SIZE_HELP);

/// The capacity-reserve grammar: a size in the [`SIZE_PATTERN`] grammar,
/// `0`, or a whole percentage below 100 (`10%`). [`CapacityReserve::from_str`]
/// accepts exactly these strings.
pub const RESERVE_PATTERN: &str = concat!("^(0|", size_alternatives!(), "|[0-9]{1,2}%)$");

/// How to write a reserve, for error messages.
const RESERVE_HELP: &str =
    "a size (e.g. 64MiB, 10G, or 0 for none) or a whole percentage of the volume below 100 (e.g. 10%)";

/// Free space a pull leaves on its destination's filesystem beyond what it
/// writes: a fixed size, or a share of the filesystem's size, which suits
/// a policy written once for volumes of many sizes (as the kubelet's
/// `nodefs.available<10%`). Keeps the text it was parsed from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CapacityReserve {
    /// A fixed number of bytes (none for `0`).
    Size(Option<ByteSize>),
    /// This percentage of the filesystem's size, 0 to 99.
    Percent(u8),
}

/// A string outside the reserve grammar.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("'{0}' is not a capacity reserve: write {RESERVE_HELP}")]
pub struct ReserveError(String);

impl CapacityReserve {
    /// The reserve in bytes on a filesystem of `filesystem_bytes`.
    pub fn bytes_of(&self, filesystem_bytes: u64) -> u64 {
        match self {
            Self::Size(size) => size.as_ref().map_or(0, ByteSize::bytes),
            // Rounded up: a reserve never leaves less than it says.
            Self::Percent(percent) => {
                let share = u128::from(filesystem_bytes) * u128::from(*percent);
                u64::try_from(share.div_ceil(100)).unwrap_or(u64::MAX)
            }
        }
    }
}

impl FromStr for CapacityReserve {
    type Err = ReserveError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = || ReserveError(text.to_owned());
        if text == "0" {
            return Ok(Self::Size(None));
        }
        if let Some(digits) = text.strip_suffix('%') {
            if digits.is_empty() || digits.len() > 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err());
            }
            return digits.parse().map(Self::Percent).map_err(|_| err());
        }
        text.parse().map(|size| Self::Size(Some(size))).map_err(|_| err())
    }
}

impl fmt::Display for CapacityReserve {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Size(Some(size)) => size.fmt(f),
            Self::Size(None) => f.write_str("0"),
            Self::Percent(percent) => write!(f, "{percent}%"),
        }
    }
}

text_in_a_grammar!(CapacityReserve, "CapacityReserve", RESERVE_PATTERN, "must be a capacity reserve", RESERVE_HELP);

/// Formats a byte count with binary units, one decimal: `512 B`, `4.0 MiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        let bytes = |s: &str| s.parse::<ByteSize>().map(|b| b.bytes());
        assert_eq!(bytes("8MiB"), Ok(8 << 20));
        assert_eq!(bytes("8Mi"), Ok(8 << 20));
        assert_eq!(bytes("8M"), Ok(8 << 20));
        assert_eq!(bytes("8MB"), Ok(8 << 20));
        assert_eq!(bytes("64k"), Ok(64 << 10));
        assert_eq!(bytes("1G"), Ok(1 << 30));
        assert_eq!(bytes("4096"), Ok(4096));
        assert_eq!(bytes("4096B"), Ok(4096));
        assert_eq!(bytes("999999TiB"), Ok(999_999 << 40));
        for bad in ["", "0", "08M", "MiB", "8XB", "8iB", "8BiB", "8MBi", "8m", "8 MiB", "-1", "1e6", "1000000MiB"] {
            assert!(bad.parse::<ByteSize>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn a_size_keeps_its_text_and_renders_from_bytes() {
        assert_eq!("8Mi".parse::<ByteSize>().unwrap().to_string(), "8Mi");
        assert_eq!(ByteSize::from_bytes(8 << 20).unwrap().to_string(), "8MiB");
        assert_eq!(ByteSize::from_bytes(1536 << 10).unwrap().to_string(), "1536KiB");
        assert_eq!(ByteSize::from_bytes(1000).unwrap().to_string(), "1000");
        assert!(ByteSize::from_bytes(0).is_err());
    }

    #[test]
    fn reserves_are_sizes_or_percentages_of_the_volume() {
        let reserve = |s: &str| s.parse::<CapacityReserve>().unwrap();
        assert_eq!(reserve("64MiB").bytes_of(1 << 40), 64 << 20);
        assert_eq!(reserve("0").bytes_of(1 << 40), 0);
        assert_eq!(reserve("0%").bytes_of(1 << 40), 0);
        assert_eq!(reserve("10%").bytes_of(80 << 20), 8 << 20);
        // Rounded up, and no overflow on the largest filesystems.
        assert_eq!(reserve("1%").bytes_of(101), 2);
        assert_eq!(reserve("99%").bytes_of(u64::MAX), u64::MAX - u64::MAX / 100);
        for text in ["64MiB", "8Mi", "0", "5%", "0%", "99%", "1048576"] {
            assert_eq!(reserve(text).to_string(), text);
            let json = serde_json::to_string(&reserve(text)).unwrap();
            assert_eq!(serde_json::from_str::<CapacityReserve>(&json).unwrap(), reserve(text));
        }
        for bad in ["", "100%", "150%", "5.5%", "-1%", "%", "05", "00", "10 %", "1e3", "5%%", "-64MiB"] {
            let error = bad.parse::<CapacityReserve>().unwrap_err().to_string();
            assert!(error.contains("a whole percentage of the volume below 100"), "{bad:?}: {error}");
        }
    }

    /// Strings near the grammar: digits (maybe a leading zero, maybe too
    /// many) followed by the unit characters in any order, plus noise.
    fn near_sizes() -> impl Strategy<Value = String> {
        prop_oneof!["[0-9]{1,17}[kKmMGTBi]{0,3}", "[1-9][0-9]{0,6}[kKMGT]?i?B?", "[ -~]{0,8}",]
    }

    /// Strings near the reserve grammar: sizes, zeros and percentages.
    fn near_reserves() -> impl Strategy<Value = String> {
        prop_oneof![near_sizes(), "[0-9]{0,4}%{0,2}", "0{1,3}[kM%]?"]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// The same for reserves: what the CRD admits, the stager accepts.
        #[test]
        fn the_reserve_parser_accepts_exactly_what_its_pattern_admits(text in near_reserves()) {
            let pattern = regex::Regex::new(RESERVE_PATTERN).unwrap();
            prop_assert_eq!(pattern.is_match(&text), text.parse::<CapacityReserve>().is_ok(), "{:?}", text);
        }

        /// What the CRD's rule admits, the parser accepts, and vice versa.
        #[test]
        fn the_parser_accepts_exactly_what_the_pattern_admits(text in near_sizes()) {
            let pattern = regex::Regex::new(SIZE_PATTERN).unwrap();
            prop_assert_eq!(pattern.is_match(&text), text.parse::<ByteSize>().is_ok(), "{:?}", text);
        }
    }
}
