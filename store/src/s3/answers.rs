//! How S3's answers are read, by the SDK's control path ([`super`]) and the
//! hyper data path ([`super::hyper_path`]) alike: an error response
//! classified into a [`StoreError`], an object's checksum headers into the
//! [`Integrity`] it is verified against.

use aws_sdk_s3::types::{ChecksumType, ServerSideEncryption};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use crate::xml::error_document;
use crate::{Integrity, PartAlgorithm, PartsChecksum, RetryReason, StoreError, StoredChecksum, md5_from_etag};

/// Classifies an error response by its status and S3 error code.
pub(super) fn classify_status(status: u16, code: &str, message: &str, bucket: &str) -> StoreError {
    let summary = || if message.is_empty() { format!("HTTP {status}") } else { message.to_owned() };
    match (status, code) {
        (_, "SlowDown" | "Throttling" | "ThrottlingException" | "RequestLimitExceeded" | "TooManyRequests")
        | (429, _)
        | (503, _) => StoreError::transient(RetryReason::Throttled, format!("{code} {}", summary())),
        (_, "RequestTimeout") => StoreError::transient(RetryReason::Timeout, summary()),
        (500..=599, _) => {
            StoreError::transient(RetryReason::ServerError, format!("HTTP {status} {code} {}", summary()))
        }
        (_, "NoSuchBucket") => StoreError::NoSuchBucket { bucket: bucket.to_owned() },
        (_, "NoSuchKey" | "NoSuchUpload") | (404, _) => StoreError::NotFound,
        (412, _) | (_, "PreconditionFailed") => StoreError::Changed,
        (
            _,
            "AccessDenied"
            | "InvalidAccessKeyId"
            | "SignatureDoesNotMatch"
            | "ExpiredToken"
            | "InvalidToken"
            | "InvalidClientTokenId",
        )
        | (401 | 403, _) => StoreError::AccessDenied {
            code: if code.is_empty() { format!("HTTP {status}") } else { code.to_owned() },
            message: summary(),
        },
        _ => StoreError::Rejected {
            code: if code.is_empty() { format!("HTTP {status}") } else { code.to_owned() },
            message: summary(),
        },
    }
}

/// Classifies an error response from its status and body.
pub(super) fn classify_response(status: u16, body: &str, bucket: &str) -> StoreError {
    let (code, message) = error_document(body);
    classify_status(status, &code, &message, bucket)
}

pub(super) fn encode_crc(crc: u32) -> String {
    BASE64.encode(crc.to_be_bytes())
}

/// The checksum headers of a HEAD or GET response, as S3 sends them
/// (base64 values, composite ones ending in `-N`), from the SDK's output
/// structs ([`checksum_headers!`]) or from a raw header map
/// ([`ChecksumHeaders::from_headers`]) alike.
#[derive(Clone, Debug, Default)]
pub(super) struct ChecksumHeaders<'a> {
    pub(super) crc64nvme: Option<&'a str>,
    pub(super) crc32c: Option<&'a str>,
    pub(super) crc32: Option<&'a str>,
    pub(super) sha1: Option<&'a str>,
    pub(super) sha256: Option<&'a str>,
    /// `x-amz-checksum-type`: `COMPOSITE` or `FULL_OBJECT`.
    pub(super) checksum_type: Option<&'a str>,
    pub(super) etag: Option<&'a str>,
    /// `x-amz-server-side-encryption`: `AES256`, `aws:kms`, `aws:kms:dsse`.
    pub(super) encryption: Option<&'a str>,
    /// Whether the object is encrypted with a customer key (SSE-C).
    pub(super) customer_key: bool,
}

impl<'a> ChecksumHeaders<'a> {
    /// The checksum headers of a raw response (the non-SDK data paths).
    pub(super) fn from_headers(headers: &'a http::HeaderMap) -> Self {
        fn header<'a>(headers: &'a http::HeaderMap, name: &str) -> Option<&'a str> {
            headers.get(name).and_then(|value| value.to_str().ok())
        }
        ChecksumHeaders {
            crc64nvme: header(headers, CRC64NVME_HEADER),
            crc32c: header(headers, CRC32C_HEADER),
            crc32: header(headers, CRC32_HEADER),
            sha1: header(headers, SHA1_HEADER),
            sha256: header(headers, SHA256_HEADER),
            checksum_type: header(headers, CHECKSUM_TYPE_HEADER),
            etag: header(headers, ETAG_HEADER),
            encryption: header(headers, ENCRYPTION_HEADER),
            customer_key: headers.contains_key(CUSTOMER_KEY_HEADER),
        }
    }
}

pub(super) const CRC64NVME_HEADER: &str = "x-amz-checksum-crc64nvme";
/// Read from responses, and sent with every PUT and part on the hyper path.
pub(super) const CRC32C_HEADER: &str = "x-amz-checksum-crc32c";
pub(super) const CRC32_HEADER: &str = "x-amz-checksum-crc32";
pub(super) const SHA1_HEADER: &str = "x-amz-checksum-sha1";
pub(super) const SHA256_HEADER: &str = "x-amz-checksum-sha256";
pub(super) const CHECKSUM_TYPE_HEADER: &str = "x-amz-checksum-type";
pub(super) const ETAG_HEADER: &str = "etag";
pub(super) const ENCRYPTION_HEADER: &str = "x-amz-server-side-encryption";
pub(super) const CUSTOMER_KEY_HEADER: &str = "x-amz-server-side-encryption-customer-algorithm";
/// Sent with a whole-object GET by every data path: S3 returns an object's
/// checksum headers only when asked (the SDK's `checksum_mode`).
pub(super) const CHECKSUM_MODE_HEADER: &str = "x-amz-checksum-mode";
/// The value of [`CHECKSUM_MODE_HEADER`] that asks.
pub(super) const CHECKSUM_MODE_ENABLED: &str = "ENABLED";

/// Picks what to verify the object against, cheapest first: a full-object
/// CRC (computed as ranges stream past), the MD5 a single-part ETag is
/// (hashed in SIMD lanes), a full-object SHA, then checksums of per-part
/// checksums (composite, then the multipart ETag), which need the part
/// layout. SSE-KMS and SSE-C ETags are not MD5s of the content, so they are
/// never taken for one.
pub(super) fn integrity(headers: &ChecksumHeaders<'_>) -> Option<Integrity> {
    let composite = headers.checksum_type.is_some_and(|t| t.eq_ignore_ascii_case(ChecksumType::Composite.as_str()));
    let whole = |value: Option<&str>| value.filter(|v| !composite && !v.contains('-')).and_then(decode_base64);
    if let Some(crc) = whole(headers.crc64nvme).and_then(|b| b.try_into().ok()) {
        return Some(Integrity::Whole(StoredChecksum::Crc64Nvme(u64::from_be_bytes(crc))));
    }
    if let Some(crc) = whole(headers.crc32c).and_then(|b| b.try_into().ok()) {
        return Some(Integrity::Whole(StoredChecksum::Crc32c(u32::from_be_bytes(crc))));
    }
    if let Some(crc) = whole(headers.crc32).and_then(|b| b.try_into().ok()) {
        return Some(Integrity::Whole(StoredChecksum::Crc32(u32::from_be_bytes(crc))));
    }
    let kms = [ServerSideEncryption::AwsKms.as_str(), ServerSideEncryption::AwsKmsDsse.as_str()];
    let etag_is_content_hash = !headers.customer_key && !headers.encryption.is_some_and(|e| kms.contains(&e));
    if etag_is_content_hash && let Some(md5) = headers.etag.and_then(md5_from_etag) {
        return Some(Integrity::Whole(md5));
    }
    if let Some(sha) = whole(headers.sha256).and_then(|b| b.try_into().ok()) {
        return Some(Integrity::Whole(StoredChecksum::Sha256(sha)));
    }
    if let Some(sha) = whole(headers.sha1).and_then(|b| b.try_into().ok()) {
        return Some(Integrity::Whole(StoredChecksum::Sha1(sha)));
    }
    let composites = [
        (headers.crc32c, PartAlgorithm::Crc32c),
        (headers.crc32, PartAlgorithm::Crc32),
        (headers.sha256, PartAlgorithm::Sha256),
        (headers.sha1, PartAlgorithm::Sha1),
    ];
    for (value, algorithm) in composites {
        if let Some(parts) = value.and_then(|v| composite_checksum(v, algorithm)) {
            return Some(Integrity::Parts(parts));
        }
    }
    if etag_is_content_hash {
        return headers.etag.and_then(multipart_etag).map(Integrity::Parts);
    }
    None
}

pub(super) fn decode_base64(value: &str) -> Option<Vec<u8>> {
    BASE64.decode(value).ok()
}

/// A whole CRC header value (not a composite `-N` one).
pub(super) fn decode_crc(value: &str) -> Option<u32> {
    Some(u32::from_be_bytes(decode_base64(value)?.try_into().ok()?))
}

/// Splits `<digest>-<parts>`.
pub(super) fn split_parts(value: &str) -> Option<(&str, u32)> {
    let (digest, parts) = value.rsplit_once('-')?;
    let parts: u32 = parts.parse().ok()?;
    (parts > 0).then_some((digest, parts))
}

/// A composite checksum header, `<base64>-N`.
pub(super) fn composite_checksum(value: &str, algorithm: PartAlgorithm) -> Option<PartsChecksum> {
    let (digest, parts) = split_parts(value)?;
    let digest = decode_base64(digest)?;
    let width = match algorithm {
        PartAlgorithm::Crc32c | PartAlgorithm::Crc32 => 4,
        PartAlgorithm::Sha1 => 20,
        PartAlgorithm::Sha256 => 32,
        PartAlgorithm::Md5 => 16,
    };
    (digest.len() == width).then_some(PartsChecksum { algorithm, digest, parts })
}

/// A multipart upload's ETag, `<hex MD5 of the parts' MD5s>-N`.
pub(super) fn multipart_etag(etag: &str) -> Option<PartsChecksum> {
    let (digest, parts) = split_parts(etag.trim_matches('"'))?;
    let digest = hex::decode(digest).ok().filter(|d| d.len() == 16)?;
    Some(PartsChecksum { algorithm: PartAlgorithm::Md5, digest, parts })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttling_and_server_errors_are_retryable() {
        let slow = classify_status(503, "SlowDown", "Please reduce your request rate.", "b");
        assert_eq!(slow.retry_reason(), Some(RetryReason::Throttled));
        let internal = classify_status(500, "InternalError", "", "b");
        assert_eq!(internal.retry_reason(), Some(RetryReason::ServerError));
    }

    #[test]
    fn credential_and_bucket_errors_are_permanent_and_specific() {
        assert!(matches!(
            classify_status(403, "InvalidAccessKeyId", "The Access Key Id you provided does not exist", "b"),
            StoreError::AccessDenied { .. }
        ));
        assert!(
            matches!(classify_status(404, "NoSuchBucket", "", "data"), StoreError::NoSuchBucket { bucket } if bucket == "data")
        );
        assert!(matches!(classify_status(412, "PreconditionFailed", "", "b"), StoreError::Changed));
    }

    fn headers() -> ChecksumHeaders<'static> {
        ChecksumHeaders::default()
    }

    #[test]
    fn a_full_object_crc_is_preferred_and_a_composite_one_is_never_taken_for_it() {
        let crc = encode_crc(0xdead_beef);
        let full =
            ChecksumHeaders { crc32c: Some(&crc), etag: Some("\"9e107d9d372bb6826bd81d3542a419d6\""), ..headers() };
        assert_eq!(integrity(&full), Some(Integrity::Whole(StoredChecksum::Crc32c(0xdead_beef))));
        let nvme = BASE64.encode(0x0123_4567_89ab_cdef_u64.to_be_bytes());
        let both = ChecksumHeaders { crc64nvme: Some(&nvme), ..full.clone() };
        assert_eq!(integrity(&both), Some(Integrity::Whole(StoredChecksum::Crc64Nvme(0x0123_4567_89ab_cdef))));

        let composite = ChecksumHeaders {
            crc32c: Some("3q2+7w==-4"),
            checksum_type: Some(ChecksumType::Composite.as_str()),
            etag: Some("\"9e107d9d372bb6826bd81d3542a419d6-4\""),
            ..headers()
        };
        let parts = PartsChecksum {
            algorithm: PartAlgorithm::Crc32c,
            digest: 0xdead_beef_u32.to_be_bytes().to_vec(),
            parts: 4,
        };
        assert_eq!(integrity(&composite), Some(Integrity::Parts(parts)));
    }

    #[test]
    fn a_raw_header_map_is_read_as_the_sdks_output_is() {
        let mut map = http::HeaderMap::new();
        map.insert("x-amz-checksum-crc32c", encode_crc(0xdead_beef).parse().unwrap());
        map.insert("etag", "\"9e107d9d372bb6826bd81d3542a419d6\"".parse().unwrap());
        assert_eq!(
            integrity(&ChecksumHeaders::from_headers(&map)),
            Some(Integrity::Whole(StoredChecksum::Crc32c(0xdead_beef)))
        );
        map.insert("x-amz-checksum-crc32c", "3q2+7w==-4".parse().unwrap());
        map.insert("x-amz-checksum-type", "COMPOSITE".parse().unwrap());
        map.insert("etag", "\"9e107d9d372bb6826bd81d3542a419d6-4\"".parse().unwrap());
        assert!(matches!(
            integrity(&ChecksumHeaders::from_headers(&map)),
            Some(Integrity::Parts(PartsChecksum { algorithm: PartAlgorithm::Crc32c, parts: 4, .. }))
        ));
        let mut kms = http::HeaderMap::new();
        kms.insert("etag", "\"3f0e5b1c2c0a4d6e8b9a7c5d4e3f2a1b\"".parse().unwrap());
        kms.insert("x-amz-server-side-encryption", "aws:kms".parse().unwrap());
        assert_eq!(integrity(&ChecksumHeaders::from_headers(&kms)), None);
        kms.insert("x-amz-server-side-encryption", "AES256".parse().unwrap());
        kms.insert(CUSTOMER_KEY_HEADER, "AES256".parse().unwrap());
        assert_eq!(integrity(&ChecksumHeaders::from_headers(&kms)), None);
    }

    #[test]
    fn error_documents_are_classified_as_the_sdks_errors_are() {
        let missing = r#"<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>NoSuchKey</Code><Message>The specified key does not exist &amp; never did.</Message><Key>k</Key></Error>"#;
        assert_eq!(
            error_document(missing),
            ("NoSuchKey".to_owned(), "The specified key does not exist & never did.".to_owned())
        );
        assert!(matches!(classify_response(404, missing, "b"), StoreError::NotFound));
        assert!(matches!(classify_response(412, "", "b"), StoreError::Changed));
        let slow = "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";
        assert_eq!(classify_response(503, slow, "b").retry_reason(), Some(RetryReason::Throttled));
        assert_eq!(classify_response(429, "", "b").retry_reason(), Some(RetryReason::Throttled));
        assert_eq!(
            classify_response(502, "<html>bad gateway</html>", "b").retry_reason(),
            Some(RetryReason::ServerError)
        );
        let signature = "<Error><Code>SignatureDoesNotMatch</Code><Message>no</Message></Error>";
        assert!(
            matches!(classify_response(403, signature, "b"), StoreError::AccessDenied { code, .. } if code == "SignatureDoesNotMatch")
        );
        let bucket = "<Error><Code>NoSuchBucket</Code></Error>";
        assert!(
            matches!(classify_response(404, bucket, "data"), StoreError::NoSuchBucket { bucket } if bucket == "data")
        );
    }

    #[test]
    fn an_upload_that_is_gone_is_not_found() {
        assert!(matches!(classify_status(404, "NoSuchUpload", "", "b"), StoreError::NotFound));
    }

    #[test]
    fn single_part_etags_are_md5s_and_multipart_ones_md5s_of_parts() {
        let md5 = "\"9e107d9d372bb6826bd81d3542a419d6\"";
        assert!(matches!(
            integrity(&ChecksumHeaders { etag: Some(md5), ..headers() }),
            Some(Integrity::Whole(StoredChecksum::Md5(_)))
        ));
        let multipart =
            integrity(&ChecksumHeaders { etag: Some("\"9e107d9d372bb6826bd81d3542a419d6-3\""), ..headers() });
        assert_eq!(
            multipart,
            Some(Integrity::Parts(PartsChecksum {
                algorithm: PartAlgorithm::Md5,
                digest: hex::decode("9e107d9d372bb6826bd81d3542a419d6").unwrap(),
                parts: 3
            }))
        );
        assert_eq!(integrity(&ChecksumHeaders { etag: Some("\"abc-3\""), ..headers() }), None);
        assert_eq!(
            integrity(&ChecksumHeaders { etag: Some("\"9e107d9d372bb6826bd81d3542a419d6-0\""), ..headers() }),
            None
        );
    }

    /// Recorded from AWS: an SSE-KMS object's ETag is 32 hex digits that are
    /// not the content's MD5, and an SSE-C object's neither. Taking them for
    /// MD5s would fail good objects.

    #[test]
    fn sse_kms_and_sse_c_etags_are_not_taken_for_md5s() {
        let etag = Some("\"3f0e5b1c2c0a4d6e8b9a7c5d4e3f2a1b\"");
        let kms = ChecksumHeaders { etag, encryption: Some(ServerSideEncryption::AwsKms.as_str()), ..headers() };
        assert_eq!(integrity(&kms), None);
        let customer = ChecksumHeaders {
            etag,
            customer_key: true,
            encryption: Some(ServerSideEncryption::Aes256.as_str()),
            ..headers()
        };
        assert_eq!(integrity(&customer), None);
        let multipart_kms = ChecksumHeaders {
            etag: Some("\"3f0e5b1c2c0a4d6e8b9a7c5d4e3f2a1b-2\""),
            encryption: Some(ServerSideEncryption::AwsKms.as_str()),
            ..headers()
        };
        assert_eq!(integrity(&multipart_kms), None);
        // SSE-S3 (AES256) ETags are MD5s of the content.
        let s3 = ChecksumHeaders { etag, encryption: Some(ServerSideEncryption::Aes256.as_str()), ..headers() };
        assert!(matches!(integrity(&s3), Some(Integrity::Whole(StoredChecksum::Md5(_)))));
        // A KMS object's checksum header still verifies it.
        let crc = encode_crc(7);
        assert_eq!(
            integrity(&ChecksumHeaders { crc32c: Some(&crc), ..kms }),
            Some(Integrity::Whole(StoredChecksum::Crc32c(7)))
        );
    }

    #[test]
    fn full_object_shas_are_taken_after_an_md5_etag() {
        let sha = BASE64.encode([7u8; 32]);
        let with_md5 =
            ChecksumHeaders { sha256: Some(&sha), etag: Some("\"9e107d9d372bb6826bd81d3542a419d6\""), ..headers() };
        assert!(matches!(integrity(&with_md5), Some(Integrity::Whole(StoredChecksum::Md5(_)))));
        let kms = ChecksumHeaders { encryption: Some(ServerSideEncryption::AwsKms.as_str()), ..with_md5 };
        assert_eq!(integrity(&kms), Some(Integrity::Whole(StoredChecksum::Sha256([7; 32]))));
    }
}
