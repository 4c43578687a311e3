//! A Microsoft Entra ID token endpoint for one tenant and one application,
//! on loopback, for the stager's keyless `az://` tests.
//!
//! Entra ID itself cannot run here, so this stands in for its OAuth 2.0
//! client-credentials endpoint (`POST /TENANT/oauth2/v2.0/token`) and
//! nothing more: it checks the tenant, the client id, the grant and either
//! the client secret or the federated assertion as Entra does, refuses with
//! Entra's error shape (`AADSTS…` codes), and issues a JWT whose audience
//! is the requested scope's resource and whose issuer is the tenant's, which
//! Azurite ([`crate::AzuriteServer::start_entra`]) then checks for real.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as BASE64URL;

/// What the endpoint accepts.
#[derive(Clone, Debug)]
struct Expected {
    tenant: String,
    client_id: String,
    client_secret: String,
    federated_token: String,
}

/// A running token endpoint, stopped on drop.
#[derive(Debug)]
pub struct EntraServer {
    /// `http://127.0.0.1:PORT/`: what `AZURE_AUTHORITY_HOST` names.
    pub authority_host: String,
    /// The tenant it serves.
    pub tenant: String,
    /// The application (client) id it knows.
    pub client_id: String,
    /// The client secret it accepts.
    pub client_secret: String,
    /// The federated token it accepts as a client assertion (as a
    /// workload identity's projected service-account token would be).
    pub federated_token: String,
    issued: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl EntraServer {
    /// Starts the endpoint on a free loopback port.
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        let expected = Expected {
            tenant: "72f988bf-86f1-41af-91ab-2d7cd011db47".into(),
            client_id: "0d5a1e9c-ferry-test-application".into(),
            client_secret: "ferry-test-client-secret".into(),
            federated_token: jwt(&serde_json::json!({
                "iss": "https://kubernetes.default.svc.cluster.local",
                "sub": "system:serviceaccount:ml:trainer",
                "aud": ["api://AzureADTokenExchange"],
            })),
        };
        let issued = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (serving, counter, stopping) = (expected.clone(), issued.clone(), stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::Relaxed) {
                    return;
                }
                if let Ok(stream) = stream {
                    let _ = serve(stream, &serving, &counter);
                }
            }
        });
        Self {
            authority_host: format!("http://127.0.0.1:{port}/"),
            tenant: expected.tenant,
            client_id: expected.client_id,
            client_secret: expected.client_secret,
            federated_token: expected.federated_token,
            issued,
            stop,
        }
    }

    /// How many access tokens it has issued.
    pub fn issued(&self) -> usize {
        self.issued.load(Ordering::SeqCst)
    }
}

impl Drop for EntraServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accepting thread so that it sees the flag.
        let _ = TcpStream::connect(self.authority_host.trim_start_matches("http://").trim_end_matches('/'));
    }
}

/// An unsigned JWT of `claims` (Azurite decodes, it does not verify).
fn jwt(claims: &serde_json::Value) -> String {
    let header = BASE64URL.encode(br#"{"alg":"RS256","typ":"JWT"}"#);
    format!("{header}.{}.{}", BASE64URL.encode(claims.to_string()), BASE64URL.encode(b"not-signed"))
}

/// Answers one request and closes the connection.
fn serve(stream: TcpStream, expected: &Expected, issued: &AtomicUsize) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let (status, answer) = answer(&request_line, &String::from_utf8_lossy(&body), expected);
    if status == 200 {
        issued.fetch_add(1, Ordering::SeqCst);
    }
    let answer = answer.to_string();
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
        if status == 200 { "OK" } else { "Bad Request" },
        answer.len()
    )?;
    stream.flush()
}

/// The status and JSON answer to a token request.
fn answer(request_line: &str, body: &str, expected: &Expected) -> (u16, serde_json::Value) {
    let refuse = |status: u16, error: &str, description: String| {
        (status, serde_json::json!({"error": error, "error_description": description, "error_codes": []}))
    };
    let path = request_line.split_whitespace().nth(1).unwrap_or_default();
    let Some(tenant) = path.strip_prefix('/').and_then(|p| p.strip_suffix("/oauth2/v2.0/token")) else {
        return refuse(404, "invalid_request", format!("no token endpoint at {path}"));
    };
    if tenant != expected.tenant {
        return refuse(400, "invalid_tenant", format!("AADSTS90002: Tenant '{tenant}' not found."));
    }
    // The form's pairs, percent-decoded as a URL's query would be.
    let form: Vec<(String, String)> = reqwest::Url::parse(&format!("http://form/?{body}"))
        .map(|url| url.query_pairs().into_owned().collect())
        .unwrap_or_default();
    let field = |name: &str| form.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
    if field("grant_type") != Some("client_credentials") {
        return refuse(400, "unsupported_grant_type", "AADSTS70003: only client_credentials here".into());
    }
    let client = field("client_id").unwrap_or_default();
    if client != expected.client_id {
        return refuse(
            400,
            "unauthorized_client",
            format!("AADSTS700016: Application with identifier '{client}' was not found in the directory."),
        );
    }
    let Some(resource) = field("scope").and_then(|scope| scope.strip_suffix("/.default")) else {
        return refuse(
            400,
            "invalid_scope",
            "AADSTS70011: The provided value for the input parameter 'scope' is not valid.".into(),
        );
    };
    match (field("client_secret"), field("client_assertion_type"), field("client_assertion")) {
        (Some(secret), _, _) if secret == expected.client_secret => {}
        (Some(_), _, _) => {
            return refuse(401, "invalid_client", "AADSTS7000215: Invalid client secret provided.".into());
        }
        (None, Some("urn:ietf:params:oauth:client-assertion-type:jwt-bearer"), Some(assertion))
            if assertion == expected.federated_token => {}
        (None, Some(_), Some(_)) => {
            return refuse(
                400,
                "invalid_client",
                "AADSTS70021: No matching federated identity record found for presented assertion.".into(),
            );
        }
        _ => {
            return refuse(
                400,
                "invalid_client",
                "AADSTS7000216: client_assertion or client_secret is required.".into(),
            );
        }
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_secs();
    let token = jwt(&serde_json::json!({
        "aud": resource,
        "iss": format!("https://sts.windows.net/{}/", expected.tenant),
        "iat": now - 60, "nbf": now - 60, "exp": now + 3600,
        "appid": expected.client_id, "tid": expected.tenant, "ver": "1.0",
    }));
    (
        200,
        serde_json::json!({"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": token}),
    )
}
