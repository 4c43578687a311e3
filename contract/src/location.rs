//! Object storage locations as users write them: `s3://bucket/prefix`,
//! `gs://bucket/prefix`, `az://container/prefix`, or an OCI artifact,
//! `oci://registry/repository:tag` (whose "bucket" is the whole reference:
//! an artifact has no prefixes), or a Hugging Face Hub repository,
//! `hf://[datasets/|spaces/]ORG/REPO[@REVISION][/PATH]` (whose "bucket" is
//! the repository at its revision, see [`crate::hub`]). The scheme is a [`Scheme`], decided here once, so
//! that the operator, the engine and the budgets match on a type instead of
//! comparing strings.

use std::fmt;
use std::str::FromStr;

/// Which protocol a location is read and written with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// `s3://`: S3 and S3-compatible stores.
    S3,
    /// `gs://`: Google Cloud Storage.
    Gcs,
    /// `az://`: Azure Blob Storage (the container is the bucket; the
    /// account is the endpoint's).
    Azure,
    /// `oci://`: an artifact in an OCI registry, read only.
    Oci,
    /// `hf://`: a repository on the Hugging Face Hub, read only.
    Hf,
}

impl Scheme {
    /// Every scheme, in the order messages list them.
    pub const ALL: [Scheme; 5] = [Scheme::S3, Scheme::Gcs, Scheme::Azure, Scheme::Oci, Scheme::Hf];

    /// How URIs spell it, before `://`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::S3 => "s3",
            Scheme::Gcs => "gs",
            Scheme::Azure => "az",
            Scheme::Oci => "oci",
            Scheme::Hf => "hf",
        }
    }

    /// Whether a push may write to it (OCI artifacts and Hub
    /// repositories are pulled only).
    pub fn writable(self) -> bool {
        !matches!(self, Scheme::Oci | Scheme::Hf)
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A scheme no store of Ferry's speaks.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown scheme '{0}': expected one of s3, gs, az, oci, hf")]
pub struct UnknownScheme(String);

impl FromStr for Scheme {
    type Err = UnknownScheme;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        Scheme::ALL.into_iter().find(|s| s.as_str() == value).ok_or_else(|| UnknownScheme(value.to_owned()))
    }
}

/// A bucket and a key prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectLocation {
    /// The protocol.
    pub scheme: Scheme,
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
        let (scheme, rest) = uri
            .split_once("://")
            .ok_or_else(|| err("expected s3://BUCKET[/PREFIX], gs://BUCKET[/PREFIX], az://CONTAINER[/PREFIX] oci://REGISTRY/REPOSITORY[:TAG] or hf://ORG/REPO[@REVISION]"))?;
        let scheme: Scheme =
            scheme.parse().map_err(|_| err("only s3://, gs://, az://, oci:// and hf:// are supported"))?;
        if scheme == Scheme::Hf {
            let (repo, path) = crate::hub::split_location(rest)
                .map_err(|_| err("expected hf://[datasets/|spaces/]ORG/REPO[@REVISION][/PATH]"))?;
            let prefix = if path.is_empty() { path } else { format!("{path}/") };
            return Ok(Self { scheme, bucket: repo.to_string(), prefix });
        }
        if scheme == Scheme::Oci {
            let reference = rest.trim_end_matches('/');
            if reference.split('/').filter(|part| !part.is_empty()).count() < 2 {
                return Err(err("expected oci://REGISTRY/REPOSITORY[:TAG|@sha256:DIGEST]"));
            }
            return Ok(Self { scheme, bucket: reference.to_owned(), prefix: String::new() });
        }
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(err("the bucket name is empty"));
        }
        let mut prefix = prefix.to_owned();
        if !prefix.is_empty() && !prefix.ends_with('/') {
            prefix.push('/');
        }
        Ok(Self { scheme, bucket: bucket.to_owned(), prefix })
    }
}

impl fmt::Display for ObjectLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.scheme {
            Scheme::Oci => write!(f, "oci://{}", self.bucket),
            _ => write!(f, "{}://{}/{}", self.scheme, self.bucket, self.prefix),
        }
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
        assert_eq!("gs://b/p".parse::<ObjectLocation>().unwrap().scheme, Scheme::Gcs);
        for scheme in Scheme::ALL {
            assert_eq!(scheme.as_str().parse::<Scheme>(), Ok(scheme));
            assert_eq!(format!("{scheme}://b/r/").parse::<ObjectLocation>().unwrap().scheme, scheme);
        }
        let artifact: ObjectLocation = "oci://127.0.0.1:5000/models/llama:v1".parse().unwrap();
        assert_eq!((artifact.bucket.as_str(), artifact.prefix.as_str()), ("127.0.0.1:5000/models/llama:v1", ""));
        assert_eq!(artifact.to_string(), "oci://127.0.0.1:5000/models/llama:v1");
        assert!("oci://registry.example".parse::<ObjectLocation>().is_err(), "a registry is no artifact");
        assert!(!Scheme::Oci.writable() && !Scheme::Hf.writable() && Scheme::Azure.writable());
        let model: ObjectLocation = "hf://datasets/acme/corpus@v2/train".parse().unwrap();
        assert_eq!(
            (model.scheme, model.bucket.as_str(), model.prefix.as_str()),
            (Scheme::Hf, "datasets/acme/corpus@v2", "train/")
        );
        assert_eq!(model.to_string(), "hf://datasets/acme/corpus@v2/train/");
        assert_eq!("hf://acme/tiny".parse::<ObjectLocation>().unwrap().to_string(), "hf://acme/tiny/");
        assert!("hf://tiny".parse::<ObjectLocation>().is_err(), "a repository has an owner");
        assert!("ftp://b/p".parse::<ObjectLocation>().is_err());
        assert!("s3:///p".parse::<ObjectLocation>().is_err());
        assert!("/local/path".parse::<ObjectLocation>().is_err());
    }
}
