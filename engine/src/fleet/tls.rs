//! Mutual TLS on the peer port ([`ferry_contract::peers::tls`]): a worker
//! serves only clients whose certificate its DataStage's CA signed, and
//! asks only servers that show one. The CA is the DataStage's identity,
//! not the name or the address: pod IPs are not known when the operator
//! issues the certificate, so every certificate carries one fixed name,
//! [`SERVER_NAME`], which the client checks in place of the address it
//! dialled.
//!
//! Handshakes run off the accept loop ([`TlsListener`]), so a client that
//! stalls mid-handshake delays nobody else; how many connections are open
//! at once, handshaking or served, is capped ([`super::permitted::Permitted`]).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ferry_contract::peers::tls::{CA_FILE, CERT_FILE, KEY_FILE, SERVER_NAME};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::server::TlsStream;

use super::permitted::Permitted;

/// How long a client has to complete its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a `--peer-tls` directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read or does not hold what it should.
    #[error("--peer-tls: {file}: {detail}")]
    File {
        /// Which file.
        file: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The files do not make a usable configuration (a key that does not
    /// match the certificate, a CA that is not one).
    #[error("--peer-tls: {0}")]
    Config(String),
}

/// A worker's TLS settings for both ends of the peer protocol.
#[derive(Clone, Debug)]
pub struct PeerTls {
    /// To serve: presents the certificate, requires a client certificate
    /// the CA signed.
    pub server: Arc<ServerConfig>,
    /// To ask: presents the certificate, trusts only servers the CA signed.
    pub client: ClientConfig,
}

impl PeerTls {
    /// Reads `ca.crt`, `tls.crt` and `tls.key` from `dir`.
    ///
    /// # Errors
    /// A file is missing or unreadable, or they do not fit together.
    pub fn load(dir: &Path) -> Result<Self, TlsError> {
        let read = |name: &str| {
            std::fs::read(dir.join(name))
                .map_err(|e| TlsError::File { file: dir.join(name).display().to_string(), detail: e.to_string() })
        };
        Self::from_pem(&read(CA_FILE)?, &read(CERT_FILE)?, &read(KEY_FILE)?)
    }

    /// The settings from PEM: the CA bundle, the certificate (with any
    /// intermediates after it) and its key.
    ///
    /// # Errors
    /// Something does not parse or they do not fit together.
    pub fn from_pem(ca: &[u8], cert: &[u8], key: &[u8]) -> Result<Self, TlsError> {
        let file_error = |file: &str, detail: String| TlsError::File { file: file.to_owned(), detail };
        let certificates = |pem: &[u8], file: &str| {
            let certs = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| file_error(file, e.to_string()))?;
            if certs.is_empty() {
                return Err(file_error(file, "no certificate in it".into()));
            }
            Ok(certs)
        };
        let mut roots = RootCertStore::empty();
        for ca in certificates(ca, CA_FILE)? {
            roots.add(ca).map_err(|e| file_error(CA_FILE, e.to_string()))?;
        }
        let roots = Arc::new(roots);
        let chain = certificates(cert, CERT_FILE)?;
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| file_error(KEY_FILE, e.to_string()))?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config_error = |e: rustls::Error| TlsError::Config(e.to_string());

        let clients = WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let server = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(config_error)?
            .with_client_cert_verifier(clients)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(config_error)?;

        let servers = rustls::client::WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(config_error)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PeerName { inner: servers }))
            .with_client_auth_cert(chain, key)
            .map_err(config_error)?;
        Ok(Self { server: Arc::new(server), client })
    }
}

/// Verifies a peer's certificate chain against the DataStage's CA and for
/// [`SERVER_NAME`], whatever address was dialled.
#[derive(Debug)]
struct PeerName {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
}

impl ServerCertVerifier for PeerName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _dialled: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let name = ServerName::try_from(SERVER_NAME).expect("the peer name is a DNS name");
        self.inner.verify_server_cert(end_entity, intermediates, &name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Whether `error` (from a request to a peer) is a TLS failure: the peer
/// refused this worker's certificate, or showed one the CA did not sign.
/// Not a closed port: nothing will change by asking again.
pub fn is_tls_failure(error: &(dyn std::error::Error + 'static)) -> bool {
    if error.is::<rustls::Error>() {
        return true;
    }
    // hyper and hyper-rustls wrap rustls' errors in io::Errors, nested,
    // whose `source` skips the wrapped error itself.
    if let Some(io) = error.downcast_ref::<std::io::Error>()
        && let Some(inner) = io.get_ref()
        && is_tls_failure(inner)
    {
        return true;
    }
    error.source().is_some_and(is_tls_failure)
}

/// The peer port's listener under TLS: accepts connections and hands on
/// those whose handshake succeeded; `refused` is called for each that
/// failed (no certificate, another CA's, not TLS at all) and for each
/// closed at once because `open` had no permit left.
pub struct TlsListener {
    handshaken: mpsc::Receiver<(Permitted<TlsStream<TcpStream>>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Serves TLS with `config` on `tcp`. The accept loop ends, closing the
    /// port, once this listener is dropped.
    ///
    /// # Errors
    /// The socket has no local address.
    pub fn new(
        tcp: TcpListener,
        config: Arc<ServerConfig>,
        open: Arc<Semaphore>,
        refused: impl Fn(&std::io::Error) + Send + Sync + 'static,
    ) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let (sender, handshaken) = mpsc::channel(64);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let refused = Arc::new(refused);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = sender.closed() => break,
                    accepted = tcp.accept() => accepted,
                };
                let (stream, from) = match accepted {
                    Ok(accepted) => accepted,
                    // Out of file descriptors and the like: breathe, then go on.
                    Err(error) => {
                        tracing::debug!(%error, "peer port: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // A flood of connections (a handshake task each) is closed at
                // once past the cap: the peers that belong wait in no queue
                // behind it, and a peer that is refused reads from the store.
                let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
                    tracing::debug!(%from, "peer port: too many connections open; closing this one");
                    refused(&std::io::Error::other("too many connections"));
                    drop(stream);
                    continue;
                };
                let (acceptor, sender, refused) = (acceptor.clone(), sender.clone(), Arc::clone(&refused));
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = sender.send((Permitted::new(tls, permit), from)).await;
                        }
                        Ok(Err(error)) => {
                            tracing::debug!(%from, %error, "peer port: TLS handshake refused");
                            refused(&error);
                        }
                        Err(_) => tracing::debug!(%from, "peer port: TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(Self { handshaken, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = Permitted<TlsStream<TcpStream>>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.handshaken.recv().await {
            Some(accepted) => accepted,
            // The accept loop ended: nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
