//! What a pull found of its destination's filesystem: how large it is, how
//! much of it was free, and, when the pull was refused for room, how much
//! it needed. The stager puts it in its summary; the operator keeps it in
//! the worker's status and, from every worker's on a node, knows what room
//! Ferry's destinations there have, so that a DataStage refused for room
//! waits, and starts again when room appears, instead of failing.
//!
//! The operator also tells a pull what other pulls on its node are still
//! to write ([`CapacityClaims`], `--capacity-claimed`), by filesystem, so
//! that two DataStages staging onto one disk do not both count on the same
//! free space.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::size::human_bytes;

/// One measurement of a destination's filesystem.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::kubernetes_integer_formats)]
pub struct DiskSpace {
    /// Which filesystem of its node: the device number of the destination
    /// (`MAJOR:MINOR`, as `stat -c %Hd:%Ld` prints it), the same for every
    /// destination on that filesystem, seen from the node or a container.
    pub filesystem: String,
    /// The filesystem's size in bytes.
    pub size_bytes: u64,
    /// Bytes an unprivileged writer could still allocate.
    pub free_bytes: u64,
    /// A pull refused for room: the bytes it needed free, its reserve
    /// included (at least this much when its listing had not finished).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needed_bytes: Option<u64>,
    /// A pull refused for room: of the free bytes, what other pulls on the
    /// node were still to write there (`--capacity-claimed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_bytes: Option<u64>,
    /// When it was measured, in seconds since the Unix epoch.
    pub measured_at: u64,
}

impl DiskSpace {
    /// Whether what a refused pull needed could ever fit on this filesystem
    /// (it needs no more than the filesystem's size); true when nothing
    /// was refused.
    pub fn could_ever_fit(&self) -> bool {
        self.needed_bytes.is_none_or(|needed| needed <= self.size_bytes)
    }

    /// "needs 29.5 MiB free (its reserve included) where 26.5 MiB of
    /// 40.0 MiB is free" (with "and other pulls still write 3.0 MiB of it"
    /// when others claimed some), or without a need what is free.
    pub fn describe(&self) -> String {
        let mut free = format!("{} of {} is free", human_bytes(self.free_bytes), human_bytes(self.size_bytes));
        if let Some(claimed) = self.claimed_bytes.filter(|claimed| *claimed > 0) {
            free.push_str(&format!(" and other pulls still write {} of it", human_bytes(claimed)));
        }
        match self.needed_bytes {
            Some(needed) => format!("needs {} free (its reserve included) where {free}", human_bytes(needed)),
            None => free,
        }
    }
}

/// What other pulls running on the same node still have to write, in
/// bytes, by the filesystem they write to (its [`DiskSpace::filesystem`]).
/// A pull counts the claim on its own filesystem as taken: it needs its own
/// bytes and reserve free beyond it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CapacityClaims(BTreeMap<String, u64>);

impl CapacityClaims {
    /// Adds `bytes` on `filesystem` to what is claimed.
    pub fn add(&mut self, filesystem: &str, bytes: u64) {
        if bytes > 0 {
            let claimed = self.0.entry(filesystem.to_owned()).or_default();
            *claimed = claimed.saturating_add(bytes);
        }
    }

    /// Bytes claimed on `filesystem`.
    pub fn on(&self, filesystem: &str) -> u64 {
        self.0.get(filesystem).copied().unwrap_or_default()
    }

    /// Whether nothing is claimed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// `FS=BYTES` pairs separated by commas (`259:1=1048576,0:52=4096`).
impl fmt::Display for CapacityClaims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (filesystem, bytes) in &self.0 {
            write!(f, "{}{filesystem}={bytes}", if first { "" } else { "," })?;
            first = false;
        }
        Ok(())
    }
}

/// A `--capacity-claimed` value that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("'{0}' is not a list of capacity claims: write FILESYSTEM=BYTES pairs separated by commas, e.g. 259:1=1048576")]
pub struct CapacityClaimsError(String);

impl FromStr for CapacityClaims {
    type Err = CapacityClaimsError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut claims = CapacityClaims::default();
        for pair in text.split(',').filter(|pair| !pair.is_empty()) {
            let (filesystem, bytes) = pair
                .split_once('=')
                .filter(|(filesystem, _)| !filesystem.is_empty())
                .and_then(|(filesystem, bytes)| Some((filesystem, bytes.parse::<u64>().ok()?)))
                .ok_or_else(|| CapacityClaimsError(text.to_owned()))?;
            claims.add(filesystem, bytes);
        }
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_measurement_round_trips_in_the_summary_and_the_status_spelling() {
        let refused = DiskSpace {
            filesystem: "259:1".into(),
            size_bytes: 40 * MIB,
            free_bytes: 26 * MIB,
            needed_bytes: Some(30 * MIB),
            claimed_bytes: Some(MIB),
            measured_at: 1_764_196_000,
        };
        let json = serde_json::to_value(&refused).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"filesystem": "259:1", "sizeBytes": 40 * MIB, "freeBytes": 26 * MIB, "neededBytes": 30 * MIB, "claimedBytes": MIB, "measuredAt": 1_764_196_000})
        );
        assert_eq!(serde_json::from_value::<DiskSpace>(json).unwrap(), refused);
        let measured = DiskSpace { needed_bytes: None, claimed_bytes: None, ..refused.clone() };
        let json = serde_json::to_string(&measured).unwrap();
        assert!(!json.contains("neededBytes") && !json.contains("claimedBytes"), "{json}");
        assert_eq!(serde_json::from_str::<DiskSpace>(&json).unwrap(), measured);
    }

    #[test]
    fn claims_add_up_per_filesystem_and_round_trip_as_text() {
        let mut claims = CapacityClaims::default();
        assert!(claims.is_empty() && claims.to_string().is_empty());
        claims.add("259:1", 5);
        claims.add("0:52", 7);
        claims.add("259:1", 6);
        claims.add("0:53", 0);
        assert_eq!((claims.on("259:1"), claims.on("0:52"), claims.on("0:53")), (11, 7, 0));
        assert_eq!(claims.to_string(), "0:52=7,259:1=11");
        assert_eq!("0:52=7,259:1=11".parse::<CapacityClaims>(), Ok(claims));
        assert_eq!("".parse::<CapacityClaims>(), Ok(CapacityClaims::default()));
        for bad in ["259:1", "=5", "259:1=-1", "259:1=5MiB", "a=1,b"] {
            let error = bad.parse::<CapacityClaims>().unwrap_err().to_string();
            assert!(error.contains("FILESYSTEM=BYTES"), "{bad}: {error}");
        }
    }

    #[test]
    fn a_need_larger_than_the_filesystem_can_never_fit_and_says_so_in_numbers() {
        let disk =
            DiskSpace { filesystem: "0:52".into(), size_bytes: 40 * MIB, free_bytes: 26 * MIB, ..DiskSpace::default() };
        assert!(disk.could_ever_fit());
        assert_eq!(disk.describe(), "26.0 MiB of 40.0 MiB is free");
        let waits = DiskSpace { needed_bytes: Some(30 * MIB), ..disk.clone() };
        assert!(waits.could_ever_fit());
        assert_eq!(waits.describe(), "needs 30.0 MiB free (its reserve included) where 26.0 MiB of 40.0 MiB is free");
        let claimed = DiskSpace { claimed_bytes: Some(3 * MIB), ..waits.clone() };
        assert_eq!(
            claimed.describe(),
            "needs 30.0 MiB free (its reserve included) where 26.0 MiB of 40.0 MiB is free and other pulls still write 3.0 MiB of it"
        );
        assert!(DiskSpace { needed_bytes: Some(40 * MIB), ..disk.clone() }.could_ever_fit(), "exactly the size fits");
        assert!(!DiskSpace { needed_bytes: Some(40 * MIB + 1), ..disk }.could_ever_fit());
    }
}
