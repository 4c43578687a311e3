//! Which objects a run copies: include/exclude globs and `--shard I/N`.
//!
//! Both apply to the key relative to the prefix (the path under the
//! destination), so pull and push select the same set for the same data.
//! Globs follow the AWS CLI convention: `*` matches across `/`, so
//! `--include '*.parquet'` selects nested files too. Sharding hashes the
//! relative key with FNV-1a, which is stable across runs, versions and
//! machines: N workers with shards 0..N see disjoint sets whose union is
//! everything.

pub use ferry_contract::Shard;
use globset::{Glob, GlobSet, GlobSetBuilder};

/// A bad `--include`, `--exclude` or `--shard` value.
#[derive(Debug, thiserror::Error)]
pub enum SelectionError {
    /// A glob does not parse.
    #[error("invalid glob '{pattern}': {source}")]
    Glob {
        /// The pattern as given.
        pattern: String,
        /// The parser's complaint.
        #[source]
        source: globset::Error,
    },
}

/// The include/exclude/shard filter of one run.
#[derive(Debug, Clone)]
pub struct Selection {
    include: Option<GlobSet>,
    exclude: GlobSet,
    shard: Option<Shard>,
}

impl Selection {
    /// Compiles the filter.
    ///
    /// # Errors
    /// Fails on a pattern that does not parse.
    pub fn new(include: &[String], exclude: &[String], shard: Option<Shard>) -> Result<Self, SelectionError> {
        let build = |patterns: &[String]| -> Result<GlobSet, SelectionError> {
            let mut set = GlobSetBuilder::new();
            for pattern in patterns {
                let glob =
                    Glob::new(pattern).map_err(|source| SelectionError::Glob { pattern: pattern.clone(), source })?;
                set.add(glob);
            }
            set.build().map_err(|source| SelectionError::Glob { pattern: patterns.join(","), source })
        };
        Ok(Self {
            include: if include.is_empty() { None } else { Some(build(include)?) },
            exclude: build(exclude)?,
            shard,
        })
    }

    /// Selects everything.
    pub fn all() -> Self {
        Self { include: None, exclude: GlobSet::empty(), shard: None }
    }

    /// The shard, if any.
    pub fn shard(&self) -> Option<Shard> {
        self.shard
    }

    /// Whether the object at `relative_key` is part of this run.
    pub fn selects(&self, relative_key: &str) -> bool {
        self.in_dataset(relative_key) && self.shard.is_none_or(|shard| shard.owns(relative_key))
    }

    /// Whether the object at `relative_key` is this run's shard's, but left
    /// out of the dataset by include or exclude: what an earlier run with
    /// another selection may have staged, which this run neither copies
    /// nor removes but must still account for.
    pub fn deselects(&self, relative_key: &str) -> bool {
        !self.in_dataset(relative_key) && self.shard.is_none_or(|shard| shard.owns(relative_key))
    }

    /// Whether the object at `relative_key` is part of the dataset, whichever
    /// shard copies it: what a quota on the whole dataset counts.
    pub fn in_dataset(&self, relative_key: &str) -> bool {
        self.include.as_ref().is_none_or(|set| set.is_match(relative_key)) && !self.exclude.is_match(relative_key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn include_and_exclude_apply_to_nested_keys() {
        let s = Selection::new(&["*.bin".into()], &["tmp/**".into()], None).unwrap();
        assert!(s.selects("a.bin"));
        assert!(s.selects("deep/er/a.bin"));
        assert!(!s.selects("tmp/a.bin"));
        assert!(!s.selects("a.txt"));
        assert!(Selection::all().selects("anything"));
    }

    #[test]
    fn shard_strings_are_validated() {
        assert_eq!("1/3".parse::<Shard>().unwrap(), Shard { index: 1, count: 3 });
        for bad in ["3/3", "1", "a/3", "0/0", "-1/2"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
    }

    proptest! {
        /// Every key is owned by exactly one of N shards.
        #[test]
        fn shards_partition_every_key_exactly_once(key in ".{0,40}", count in 1u32..16) {
            let owners = (0..count).filter(|&index| Shard { index, count }.owns(&key)).count();
            prop_assert_eq!(owners, 1);
        }
    }
}
