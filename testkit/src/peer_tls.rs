//! Certificates for fleet tests: a CA standing for one DataStage, and the
//! `--peer-tls` directory it issues, laid out as the operator's peer
//! Secret is mounted ([`ferry_contract::peers::tls`]).

use std::path::Path;

use ferry_contract::peers::tls::{CA_FILE, CERT_FILE, KEY_FILE, SERVER_NAME};
use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// A CA that issues peer certificates: one per DataStage in a test.
pub struct PeerCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl PeerCa {
    /// A fresh CA.
    pub fn new() -> Self {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let pem = params.self_signed(&key).expect("self-sign the CA").pem();
        Self { issuer: Issuer::new(params, key), pem }
    }

    /// The CA's certificate (PEM).
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A certificate for `name` and its key (PEM), good to serve and to ask.
    pub fn issue(&self, name: &str) -> (String, String) {
        let key = KeyPair::generate().expect("peer key");
        let mut params = CertificateParams::new(vec![name.to_owned()]).expect("peer parameters");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.issuer).expect("sign the peer certificate");
        (cert.pem(), key.serialize_pem())
    }

    /// Writes a `--peer-tls` directory into the existing `dir`: this CA and
    /// a certificate it issued for the peer name.
    pub fn write_peer_dir(&self, dir: &Path) {
        let (cert, key) = self.issue(SERVER_NAME);
        std::fs::write(dir.join(CA_FILE), &self.pem).expect("write the CA");
        std::fs::write(dir.join(CERT_FILE), cert).expect("write the certificate");
        std::fs::write(dir.join(KEY_FILE), key).expect("write the key");
    }
}

impl Default for PeerCa {
    fn default() -> Self {
        Self::new()
    }
}
