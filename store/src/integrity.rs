//! What an object can be verified against: the checksums stores keep, in
//! one vocabulary for every backend, and what is generic about them (an
//! ETag that is an MD5 is one on any store that writes it so).

use std::fmt;

use ferry_contract::summary::VerifiedKind;

/// A whole-object checksum the store keeps and can be verified against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoredChecksum {
    /// CRC64NVME of the whole object (S3's default for new uploads).
    Crc64Nvme(u64),
    /// CRC32C (Castagnoli) of the whole object.
    Crc32c(u32),
    /// CRC32 (IEEE) of the whole object.
    Crc32(u32),
    /// MD5 of the whole object, known from the ETag of a single-part upload.
    Md5([u8; 16]),
    /// SHA-1 of a single-part object.
    Sha1([u8; 20]),
    /// SHA-256 of a single-part object.
    Sha256([u8; 32]),
    /// The id git gives a file's content: the SHA-1 of `blob SIZE\0`
    /// followed by the bytes (what the Hugging Face Hub lists for a file
    /// kept in git rather than in LFS).
    GitBlob([u8; 20]),
}

impl StoredChecksum {
    /// What verifying against it counts as in the summary.
    pub fn kind(&self) -> VerifiedKind {
        match self {
            StoredChecksum::Crc64Nvme(_) => VerifiedKind::Crc64nvme,
            StoredChecksum::Crc32c(_) => VerifiedKind::Crc32c,
            StoredChecksum::Crc32(_) => VerifiedKind::Crc32,
            StoredChecksum::Md5(_) => VerifiedKind::Md5,
            StoredChecksum::Sha1(_) | StoredChecksum::Sha256(_) | StoredChecksum::GitBlob(_) => VerifiedKind::Sha,
        }
    }

    /// The short name used in logs and summaries.
    pub fn algorithm(&self) -> &'static str {
        match self {
            StoredChecksum::Crc64Nvme(_) => "crc64nvme",
            StoredChecksum::Crc32c(_) => "crc32c",
            StoredChecksum::Crc32(_) => "crc32",
            StoredChecksum::Md5(_) => "md5",
            StoredChecksum::Sha1(_) => "sha1",
            StoredChecksum::Sha256(_) => "sha256",
            StoredChecksum::GitBlob(_) => "git-blob",
        }
    }

    /// Whether it can be computed range by range as bytes stream past and
    /// combined (the CRCs); the others are hashed over the bytes in order.
    pub fn is_combinable(&self) -> bool {
        matches!(self, StoredChecksum::Crc64Nvme(_) | StoredChecksum::Crc32c(_) | StoredChecksum::Crc32(_))
    }
}

impl fmt::Display for StoredChecksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let algorithm = self.algorithm();
        match self {
            StoredChecksum::Crc64Nvme(v) => write!(f, "{algorithm}:{v:016x}"),
            StoredChecksum::Crc32c(v) | StoredChecksum::Crc32(v) => write!(f, "{algorithm}:{v:08x}"),
            StoredChecksum::Md5(d) => write!(f, "{algorithm}:{}", hex::encode(d)),
            StoredChecksum::Sha1(d) | StoredChecksum::GitBlob(d) => write!(f, "{algorithm}:{}", hex::encode(d)),
            StoredChecksum::Sha256(d) => write!(f, "{algorithm}:{}", hex::encode(d)),
        }
    }
}

/// The hash a multipart object's per-part checksums are taken with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartAlgorithm {
    /// CRC32C per part (a composite checksum).
    Crc32c,
    /// CRC32 per part (a composite checksum).
    Crc32,
    /// SHA-1 per part (a composite checksum).
    Sha1,
    /// SHA-256 per part (a composite checksum).
    Sha256,
    /// MD5 per part: the multipart ETag.
    Md5,
}

impl PartAlgorithm {
    /// The short name used in logs.
    pub fn name(&self) -> &'static str {
        match self {
            PartAlgorithm::Crc32c => "crc32c",
            PartAlgorithm::Crc32 => "crc32",
            PartAlgorithm::Sha1 => "sha1",
            PartAlgorithm::Sha256 => "sha256",
            PartAlgorithm::Md5 => "md5",
        }
    }
}

/// A checksum of a multipart object's per-part checksums: S3's composite
/// checksums (`x-amz-checksum-crc32c: <base64>-N`) and multipart ETags
/// (`<hex md5>-N`). Verifying one needs the part boundaries, which only the
/// store knows ([`ObjectStore::part_size`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartsChecksum {
    /// How each part, and then the list of part checksums, is hashed.
    pub algorithm: PartAlgorithm,
    /// The hash of the concatenated part checksums (big-endian for CRCs).
    pub digest: Vec<u8>,
    /// How many parts the object was uploaded in.
    pub parts: u32,
}

impl fmt::Display for PartsChecksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}-{}", self.algorithm.name(), hex::encode(&self.digest), self.parts)
    }
}

/// What an object can be verified against, best first when a store offers
/// several.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Integrity {
    /// A checksum of the whole object.
    Whole(StoredChecksum),
    /// A checksum of per-part checksums.
    Parts(PartsChecksum),
}

impl Integrity {
    /// What verifying against it counts as in the summary.
    pub fn kind(&self) -> VerifiedKind {
        match self {
            Integrity::Whole(checksum) => checksum.kind(),
            Integrity::Parts(PartsChecksum { algorithm: PartAlgorithm::Md5, .. }) => VerifiedKind::EtagMultipart,
            Integrity::Parts(_) => VerifiedKind::Composite,
        }
    }

    /// The whole-object checksum, if it is one.
    pub fn whole(&self) -> Option<&StoredChecksum> {
        match self {
            Integrity::Whole(checksum) => Some(checksum),
            Integrity::Parts(_) => None,
        }
    }
}

impl fmt::Display for Integrity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Integrity::Whole(checksum) => checksum.fmt(f),
            Integrity::Parts(parts) => parts.fmt(f),
        }
    }
}

/// The MD5 of a single-part object's content, when its ETag is one (32 hex
/// digits, quoted or not). Whether the store's ETags are content hashes at
/// all (not under SSE-KMS, say) is the backend's to decide.
pub fn md5_from_etag(etag: &str) -> Option<StoredChecksum> {
    let etag = etag.trim_matches('"');
    if etag.len() != 32 {
        return None;
    }
    let bytes = hex::decode(etag).ok()?;
    Some(StoredChecksum::Md5(bytes.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_32_hex_digit_etag_is_an_md5() {
        let md5 = md5_from_etag("\"9e107d9d372bb6826bd81d3542a419d6\"").unwrap();
        assert_eq!(md5.to_string(), "md5:9e107d9d372bb6826bd81d3542a419d6");
        assert_eq!(md5.kind(), VerifiedKind::Md5);
        assert_eq!(md5_from_etag("9e107d9d372bb6826bd81d3542a419d6-3"), None, "a multipart ETag");
        assert_eq!(md5_from_etag("0x8DC1234567890AB"), None, "an Azure ETag");
        assert_eq!(md5_from_etag("zz107d9d372bb6826bd81d3542a419d6"), None);
    }
}
