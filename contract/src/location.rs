//! Object storage locations as users write them: `s3://bucket/prefix` or
//! `gs://bucket/prefix`.

use std::fmt;
use std::str::FromStr;

/// A bucket and a key prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectLocation {
    /// The URI scheme (`s3` or `gs`).
    pub scheme: String,
    /// The bucket name.
    pub bucket: String,
    /// The key prefix: empty (whole bucket) or ending in `/`, so that
    /// `s3://b/data` means the "directory" `data/` and never also `data2/`.
    pub prefix: String,
}

/// A location that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid object storage URI '{uri}': {reason}")]
pub struct LocationError {
    uri: String,
    reason: &'static str,
}

impl FromStr for ObjectLocation {
    type Err = LocationError;

    fn from_str(uri: &str) -> Result<Self, Self::Err> {
        let err = |reason| LocationError { uri: uri.to_owned(), reason };
        let (scheme, rest) =
            uri.split_once("://").ok_or_else(|| err("expected s3://BUCKET[/PREFIX] or gs://BUCKET[/PREFIX]"))?;
        if scheme != "s3" && scheme != "gs" {
            return Err(err("only s3:// and gs:// are supported"));
        }
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(err("the bucket name is empty"));
        }
        let mut prefix = prefix.to_owned();
        if !prefix.is_empty() && !prefix.ends_with('/') {
            prefix.push('/');
        }
        Ok(Self { scheme: scheme.to_owned(), bucket: bucket.to_owned(), prefix })
    }
}

impl fmt::Display for ObjectLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}/{}", self.scheme, self.bucket, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_directories() {
        let loc: ObjectLocation = "s3://bucket/data/train".parse().unwrap();
        assert_eq!(loc.bucket, "bucket");
        assert_eq!(loc.prefix, "data/train/");
        assert_eq!("s3://bucket".parse::<ObjectLocation>().unwrap().prefix, "");
        assert_eq!("s3://bucket/".parse::<ObjectLocation>().unwrap().prefix, "");
        assert_eq!("gs://b/p".parse::<ObjectLocation>().unwrap().scheme, "gs");
        assert!("az://b/p".parse::<ObjectLocation>().is_err());
        assert!("s3:///p".parse::<ObjectLocation>().is_err());
        assert!("/local/path".parse::<ObjectLocation>().is_err());
    }
}
