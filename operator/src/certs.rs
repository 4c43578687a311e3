//! Certificates the operator issues itself, keeps in Secrets and renews
//! before they expire: the pod webhook's CA and serving certificate (so the
//! webhook works without cert-manager), and each DataStage's peer CA and
//! the one certificate its workers serve and ask each other with
//! ([`Purpose`]). Pure; unit-tested here.
//!
//! A Secret holds `tls.crt`/`tls.key` (the certificate and its key, the
//! layout cert-manager writes too, and the files a worker's `--peer-tls`
//! directory holds), `ca.crt` (the CA bundle to trust: the current CA
//! first, then older CAs until they expire, so a CA renewal never breaks a
//! certificate still in use) and `ca.key` (the current CA's key, only when
//! the operator issues; cert-manager keeps its own).
//!
//! A certificate is renewed once less than a third of its lifetime is left,
//! as cert-manager does by default, which leaves replicas two thirds of a
//! lifetime to pick the new one up.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};

/// Secret key: the certificate (PEM).
pub const TLS_CERT: &str = ferry_contract::peers::tls::CERT_FILE;
/// Secret key: its key (PEM).
pub const TLS_KEY: &str = ferry_contract::peers::tls::KEY_FILE;
/// Secret key: the CA bundle to trust (PEM, current CA first).
pub const CA_CERT: &str = ferry_contract::peers::tls::CA_FILE;
/// Secret key: the current CA's key (PEM).
pub const CA_KEY: &str = "ca.key";

/// Why certificates could not be read or issued.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// The Secret lacks a key.
    #[error("the Secret has no {0}")]
    Missing(&'static str),
    /// A PEM value does not parse.
    #[error("the Secret's {what} does not parse: {detail}")]
    Unparsable {
        /// Which value.
        what: &'static str,
        /// The parser's complaint.
        detail: String,
    },
    /// Issuing failed.
    #[error("cannot issue a certificate: {0}")]
    Issue(#[from] rcgen::Error),
}

/// What a CA and its certificate are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// The pod webhook: the API server connects to it.
    Webhook,
    /// The peer ports of one DataStage's workers: each worker serves and
    /// asks with the one certificate, so it is good for both ends.
    Peers,
}

impl Purpose {
    fn ca_name(self) -> &'static str {
        match self {
            Purpose::Webhook => "ferry-operator webhook CA",
            Purpose::Peers => "ferry DataStage peers CA",
        }
    }

    fn usages(self) -> Vec<ExtendedKeyUsagePurpose> {
        match self {
            Purpose::Webhook => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Purpose::Peers => vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth],
        }
    }
}

/// How long certificates live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetimes {
    /// The CA's.
    pub ca: Duration,
    /// The serving certificate's.
    pub serving: Duration,
}

/// The validity window of one certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    /// Not valid before.
    pub not_before: SystemTime,
    /// Not valid after.
    pub not_after: SystemTime,
}

impl Validity {
    /// Whether less than a third of the lifetime is left at `now`.
    pub fn due(&self, now: SystemTime) -> bool {
        let lifetime = self.not_after.duration_since(self.not_before).unwrap_or_default();
        self.not_after.duration_since(now).map_or(true, |left| left < lifetime / 3)
    }

    /// Whether it has expired at `now`.
    pub fn expired(&self, now: SystemTime) -> bool {
        self.not_after <= now
    }
}

/// A CA bundle and a certificate it signed, as a Secret holds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bundle {
    /// CA certificates to trust, current first (PEM).
    pub ca_bundle: String,
    /// The current CA's key (PEM), when the operator issues.
    pub ca_key: Option<String>,
    /// The certificate (PEM).
    pub cert: String,
    /// Its key (PEM).
    pub key: String,
}

impl Bundle {
    /// Reads a Secret's data.
    ///
    /// # Errors
    /// When the serving pair or the CA bundle is missing.
    pub fn from_secret_data(data: &BTreeMap<String, ByteString>) -> Result<Self, CertError> {
        let text = |key: &'static str| {
            data.get(key).map(|v| String::from_utf8_lossy(&v.0).into_owned()).ok_or(CertError::Missing(key))
        };
        Ok(Self { ca_bundle: text(CA_CERT)?, ca_key: text(CA_KEY).ok(), cert: text(TLS_CERT)?, key: text(TLS_KEY)? })
    }

    /// The Secret's data.
    pub fn to_secret_data(&self) -> BTreeMap<String, ByteString> {
        let mut data = BTreeMap::from([
            (CA_CERT.to_owned(), ByteString(self.ca_bundle.clone().into_bytes())),
            (TLS_CERT.to_owned(), ByteString(self.cert.clone().into_bytes())),
            (TLS_KEY.to_owned(), ByteString(self.key.clone().into_bytes())),
        ]);
        if let Some(key) = &self.ca_key {
            data.insert(CA_KEY.to_owned(), ByteString(key.clone().into_bytes()));
        }
        data
    }
}

/// Every certificate in `pem`, in order, as DER.
fn certificates(pem: &str, what: &'static str) -> Result<Vec<Vec<u8>>, CertError> {
    let parsed = ::pem::parse_many(pem).map_err(|e| CertError::Unparsable { what, detail: e.to_string() })?;
    let certs: Vec<Vec<u8>> =
        parsed.into_iter().filter(|p| p.tag() == "CERTIFICATE").map(|p| p.into_contents()).collect();
    if certs.is_empty() {
        return Err(CertError::Unparsable { what, detail: "no certificate".into() });
    }
    Ok(certs)
}

/// The validity of a DER certificate and its DNS names.
fn inspect(der: &[u8], what: &'static str) -> Result<(Validity, Vec<String>), CertError> {
    use x509_parser::prelude::{FromDer as _, GeneralName, X509Certificate};
    let (_, cert) =
        X509Certificate::from_der(der).map_err(|e| CertError::Unparsable { what, detail: e.to_string() })?;
    let time = |t: x509_parser::time::ASN1Time| {
        SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(t.timestamp()).unwrap_or_default())
    };
    let validity =
        Validity { not_before: time(cert.validity().not_before), not_after: time(cert.validity().not_after) };
    let names = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::DNSName(name) => Some((*name).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    Ok((validity, names))
}

/// The validity of the first certificate in `pem`.
///
/// # Errors
/// When it does not parse.
pub fn validity_of(pem: &str) -> Result<Validity, CertError> {
    inspect(&certificates(pem, "certificate")?[0], "certificate").map(|(v, _)| v)
}

/// The DNS names a serving certificate for Service `service` in
/// `namespace` must carry: the API server connects by
/// `<service>.<namespace>.svc`.
pub fn service_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

fn params(now: SystemTime, lifetime: Duration) -> CertificateParams {
    let mut params = CertificateParams::default();
    // An hour of slack for clocks that lag ours.
    let start = now - Duration::from_secs(3600).min(lifetime / 10);
    params.not_before = start.into();
    params.not_after = (now + lifetime).into();
    params
}

/// A fresh CA: (certificate PEM, key PEM).
///
/// # Errors
/// When key generation or signing fails.
pub fn issue_ca(purpose: Purpose, now: SystemTime, lifetime: Duration) -> Result<(String, String), CertError> {
    let key = KeyPair::generate()?;
    let mut params = params(now, lifetime);
    params.distinguished_name.push(DnType::CommonName, purpose.ca_name());
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A certificate for `names`, signed by the CA: (PEM, key PEM).
///
/// # Errors
/// When the CA does not parse or signing fails.
pub fn issue_leaf(
    purpose: Purpose,
    ca_cert: &str,
    ca_key: &str,
    names: &[String],
    now: SystemTime,
    lifetime: Duration,
) -> Result<(String, String), CertError> {
    let ca_key =
        KeyPair::from_pem(ca_key).map_err(|e| CertError::Unparsable { what: CA_KEY, detail: e.to_string() })?;
    let issuer = Issuer::from_ca_cert_pem(ca_cert, ca_key)
        .map_err(|e| CertError::Unparsable { what: CA_CERT, detail: e.to_string() })?;
    let key = KeyPair::generate()?;
    let mut params = params(now, lifetime);
    params.subject_alt_names =
        names.iter().map(|n| Ok(SanType::DnsName(n.clone().try_into()?))).collect::<Result<_, rcgen::Error>>()?;
    params.distinguished_name.push(DnType::CommonName, names.first().cloned().unwrap_or_default());
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = purpose.usages();
    params.use_authority_key_identifier_extension = true;
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// What to write so a Secret keeps a valid certificate for `names`:
/// `None` when `current` is good as it is. A missing or unreadable bundle
/// is replaced; a CA past two thirds of its life is renewed (the old one
/// stays in the bundle until it expires); a serving certificate past two
/// thirds of its life, or for other names, is re-issued.
///
/// # Errors
/// When issuing fails.
pub fn renew(
    purpose: Purpose,
    current: Option<&Bundle>,
    names: &[String],
    lifetimes: Lifetimes,
    now: SystemTime,
) -> Result<Option<Bundle>, CertError> {
    let usable = current.and_then(|bundle| {
        let ca_key = bundle.ca_key.clone()?;
        let cas = certificates(&bundle.ca_bundle, CA_CERT).ok()?;
        let ca_validity = inspect(&cas[0], CA_CERT).ok()?.0;
        let serving = inspect(certificates(&bundle.cert, TLS_CERT).ok()?.first()?, TLS_CERT).ok()?;
        Some((bundle, ca_key, cas, ca_validity, serving))
    });
    let Some((bundle, ca_key, cas, ca_validity, (serving, serving_names))) = usable else {
        let (ca_cert, ca_key) = issue_ca(purpose, now, lifetimes.ca)?;
        let (cert, key) = issue_leaf(purpose, &ca_cert, &ca_key, names, now, lifetimes.serving)?;
        return Ok(Some(Bundle { ca_bundle: ca_cert, ca_key: Some(ca_key), cert, key }));
    };
    if ca_validity.due(now) {
        let (ca_cert, ca_key) = issue_ca(purpose, now, lifetimes.ca)?;
        let (cert, key) = issue_leaf(purpose, &ca_cert, &ca_key, names, now, lifetimes.serving)?;
        let still_valid = cas.iter().filter(|der| inspect(der, CA_CERT).is_ok_and(|(v, _)| !v.expired(now)));
        let ca_bundle = std::iter::once(ca_cert)
            .chain(still_valid.map(|der| ::pem::encode(&::pem::Pem::new("CERTIFICATE", der.clone()))))
            .collect::<Vec<_>>()
            .join("");
        return Ok(Some(Bundle { ca_bundle, ca_key: Some(ca_key), cert, key }));
    }
    if serving.due(now) || serving_names != names {
        let current_ca = ::pem::encode(&::pem::Pem::new("CERTIFICATE", cas[0].clone()));
        let (cert, key) = issue_leaf(purpose, &current_ca, &ca_key, names, now, lifetimes.serving)?;
        return Ok(Some(Bundle { cert, key, ..bundle.clone() }));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);
    const LIFETIMES: Lifetimes =
        Lifetimes { ca: Duration::from_secs(3650 * 86_400), serving: Duration::from_secs(90 * 86_400) };

    fn names() -> Vec<String> {
        service_names("ferry-webhook", "ferry-system")
    }

    #[test]
    fn a_missing_bundle_gets_a_ca_and_a_serving_certificate_for_the_service() {
        let now = SystemTime::now();
        let bundle = renew(Purpose::Webhook, None, &names(), LIFETIMES, now).unwrap().unwrap();
        let (validity, sans) = inspect(&certificates(&bundle.cert, TLS_CERT).unwrap()[0], TLS_CERT).unwrap();
        assert_eq!(sans, names());
        assert!(sans.contains(&"ferry-webhook.ferry-system.svc".to_owned()));
        let lifetime = validity.not_after.duration_since(now).unwrap();
        assert!(lifetime > 89 * DAY && lifetime <= 90 * DAY);
        assert!(!validity.due(now));
        // Round trip through a Secret, and nothing to do while it is fresh.
        let read = Bundle::from_secret_data(&bundle.to_secret_data()).unwrap();
        assert_eq!(read, bundle);
        assert_eq!(renew(Purpose::Webhook, Some(&read), &names(), LIFETIMES, now + 30 * DAY).unwrap(), None);
    }

    #[test]
    fn serving_certificates_renew_in_the_last_third_under_the_same_ca() {
        let now = SystemTime::now();
        let bundle = renew(Purpose::Webhook, None, &names(), LIFETIMES, now).unwrap().unwrap();
        let later = now + 61 * DAY;
        let renewed = renew(Purpose::Webhook, Some(&bundle), &names(), LIFETIMES, later).unwrap().unwrap();
        assert_eq!(
            (renewed.ca_bundle.as_str(), renewed.ca_key.as_deref()),
            (bundle.ca_bundle.as_str(), bundle.ca_key.as_deref())
        );
        assert_ne!(renewed.cert, bundle.cert);
        assert!(validity_of(&renewed.cert).unwrap().not_after > later + 89 * DAY);
        // Other names (a renamed Service) re-issue at once.
        let other = service_names("other", "ns");
        assert!(renew(Purpose::Webhook, Some(&bundle), &other, LIFETIMES, now).unwrap().is_some());
    }

    #[test]
    fn a_renewed_ca_keeps_the_old_one_trusted_until_it_expires() {
        let now = SystemTime::now();
        let short = Lifetimes { ca: 30 * DAY, serving: 10 * DAY };
        let bundle = renew(Purpose::Webhook, None, &names(), short, now).unwrap().unwrap();
        let renewed = renew(Purpose::Webhook, Some(&bundle), &names(), short, now + 21 * DAY).unwrap().unwrap();
        let cas = certificates(&renewed.ca_bundle, CA_CERT).unwrap();
        assert_eq!(cas.len(), 2);
        assert_eq!(cas[1], certificates(&bundle.ca_bundle, CA_CERT).unwrap()[0]);
        assert_ne!(renewed.ca_key, bundle.ca_key);
        // Once the old CA has expired it leaves the bundle.
        let again = renew(Purpose::Webhook, Some(&renewed), &names(), short, now + 41 * DAY).unwrap().unwrap();
        assert_eq!(certificates(&again.ca_bundle, CA_CERT).unwrap().len(), 2, "old expired, previous kept");
        assert!(!again.ca_bundle.contains(bundle.ca_bundle.trim()));
    }

    #[test]
    fn an_unreadable_bundle_is_replaced() {
        let junk = Bundle { ca_bundle: "junk".into(), ca_key: None, cert: "junk".into(), key: "junk".into() };
        assert!(renew(Purpose::Webhook, Some(&junk), &names(), LIFETIMES, SystemTime::now()).unwrap().is_some());
        assert!(matches!(Bundle::from_secret_data(&BTreeMap::new()), Err(CertError::Missing(CA_CERT))));
    }
}
