//! /metrics behind TLS and HTTP basic auth, configured the way Prometheus' own exporters are:
//! a web-config file in the exporter-toolkit format
//! (<https://prometheus.io/docs/prometheus/latest/configuration/https/>), named by
//! `prometheus.web_config_file`:
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: server.crt     # relative paths: to the web-config file's directory
//!   key_file: server.key
//! basic_auth_users:
//!   prometheus: $2y$10$...   # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\n')
//! ```
//!
//! The interface: [`WebConfig::load`] (every error names the file), [`WebConfig::wrap`] (basic
//! auth around a router) and [`WebConfig::tls`] (the acceptor `http.rs` serves through).
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use axum::{
    Router,
    extract::{Request, State},
    http::{StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
};
use base64::Engine as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use serde::Deserialize;
use tokio_rustls::{TlsAcceptor, rustls};

/// A web-config file that cannot be used: the file, and what is wrong in it.
#[derive(Debug, thiserror::Error)]
#[error("web config {path}: {problem}")]
pub struct WebConfigError {
    pub path: String,
    /// Boxed: rustls' error and two paths would make every `Result` of `load` large.
    #[source]
    pub problem: Box<WebConfigProblem>,
}

/// What is wrong in a web-config file; the certificate and key files are named as resolved
/// (relative to the web-config file's directory).
#[derive(Debug, thiserror::Error)]
pub enum WebConfigProblem {
    #[error("cannot read: {source}")]
    Read { source: std::io::Error },
    /// Not YAML, or a key exporter-toolkit or ethand does not know.
    #[error("{source}")]
    Yaml { source: serde_yaml_ng::Error },
    #[error("basic_auth_users.{user}: not a bcrypt hash (htpasswd -nBC 10 \"\" | tr -d ':\\n')")]
    NotBcrypt { user: String },
    #[error("tls_server_config.cert_file {}: {source}", .file.display())]
    CertFile {
        file: PathBuf,
        source: rustls_pki_types::pem::Error,
    },
    #[error("tls_server_config.cert_file {}: no certificate in the file", .file.display())]
    NoCertificate { file: PathBuf },
    #[error("tls_server_config.key_file {}: {source}", .file.display())]
    KeyFile {
        file: PathBuf,
        source: rustls_pki_types::pem::Error,
    },
    #[error("tls_server_config.min_version {given:?}: ethand supports \"TLS12\" and \"TLS13\"")]
    MinVersion { given: String },
    #[error("tls_server_config: {source}")]
    Protocols { source: rustls::Error },
    /// rustls refused the pair (the key does not match the certificate, or a bad key).
    #[error(
        "tls_server_config: certificate {} and key {}: {source}",
        .cert_file.display(),
        .key_file.display()
    )]
    CertAndKey {
        cert_file: PathBuf,
        key_file: PathBuf,
        source: rustls::Error,
    },
}

/// The file as exporter-toolkit defines it; the parts ethand implements. Any other key is an
/// error, so a setting is never silently ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct WebConfigFile {
    #[serde(default)]
    tls_server_config: Option<TlsServerConfig>,
    #[serde(default)]
    basic_auth_users: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsServerConfig {
    cert_file: PathBuf,
    key_file: PathBuf,
    /// "TLS12" (the exporter-toolkit default) or "TLS13".
    #[serde(default)]
    min_version: Option<String>,
}

/// User name -> bcrypt hash.
struct Users {
    hashes: BTreeMap<String, String>,
    /// A hash of nothing anyone knows: unknown users cost a bcrypt check too, so a reply's
    /// timing does not tell which user names exist.
    dummy: String,
}

impl Users {
    fn new(hashes: BTreeMap<String, String>) -> Self {
        let cost = hashes
            .values()
            .filter_map(|h| h.parse::<bcrypt::HashParts>().ok())
            .map(|h| h.get_cost())
            .max()
            .unwrap_or(bcrypt::DEFAULT_COST);
        let dummy = bcrypt::hash(b"ethand: no such user", cost).unwrap_or_default();
        Self { hashes, dummy }
    }

    fn verify(&self, user: &str, password: &str) -> bool {
        match self.hashes.get(user) {
            Some(hash) => bcrypt::verify(password, hash).unwrap_or(false),
            None => {
                let _ = bcrypt::verify(password, &self.dummy);
                false
            }
        }
    }
}

/// How /metrics is served: plain HTTP without auth unless the web-config file says otherwise.
#[derive(Clone, Default)]
pub struct WebConfig {
    tls: Option<TlsAcceptor>,
    users: Option<Arc<Users>>,
}

impl WebConfig {
    /// Reads and checks `path` (empty: plain HTTP, no auth): YAML keys, bcrypt hashes,
    /// certificate chain and key (and that they belong together).
    pub fn load(path: &Path) -> Result<Self, WebConfigError> {
        if path.as_os_str().is_empty() {
            return Ok(Self::default());
        }
        let err = |problem: WebConfigProblem| WebConfigError {
            path: path.display().to_string(),
            problem: Box::new(problem),
        };
        let text = std::fs::read_to_string(path)
            .map_err(|source| err(WebConfigProblem::Read { source }))?;
        let file: WebConfigFile = if text.trim().is_empty() {
            WebConfigFile::default()
        } else {
            serde_yaml_ng::from_str(&text)
                .map_err(|source| err(WebConfigProblem::Yaml { source }))?
        };
        for (user, hash) in &file.basic_auth_users {
            if hash.parse::<bcrypt::HashParts>().is_err() {
                return Err(err(WebConfigProblem::NotBcrypt { user: user.clone() }));
            }
        }
        let base = path.parent().unwrap_or(Path::new("."));
        let tls = match file.tls_server_config {
            Some(t) => Some(tls_acceptor(&t, base).map_err(err)?),
            None => None,
        };
        let users = (!file.basic_auth_users.is_empty())
            .then(|| Arc::new(Users::new(file.basic_auth_users)));
        Ok(Self { tls, users })
    }

    /// "https" or "http", and whether basic auth is required: for the log.
    pub fn describe(&self) -> String {
        format!(
            "{}{}",
            if self.tls.is_some() { "https" } else { "http" },
            if self.users.is_some() {
                " with basic auth"
            } else {
                ""
            }
        )
    }

    /// `app` behind basic auth when the file names users.
    pub fn wrap(&self, app: Router) -> Router {
        match &self.users {
            Some(users) => app.layer(middleware::from_fn_with_state(
                users.clone(),
                require_basic_auth,
            )),
            None => app,
        }
    }

    /// The TLS acceptor when the file configures TLS.
    pub fn tls(&self) -> Option<TlsAcceptor> {
        self.tls.clone()
    }
}

fn tls_acceptor(t: &TlsServerConfig, base: &Path) -> Result<TlsAcceptor, WebConfigProblem> {
    let cert_file = base.join(&t.cert_file);
    let key_file = base.join(&t.key_file);
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert_file)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|source| WebConfigProblem::CertFile {
            file: cert_file.clone(),
            source,
        })?;
    if certs.is_empty() {
        return Err(WebConfigProblem::NoCertificate { file: cert_file });
    }
    let key =
        PrivateKeyDer::from_pem_file(&key_file).map_err(|source| WebConfigProblem::KeyFile {
            file: key_file.clone(),
            source,
        })?;
    let versions: &[&rustls::SupportedProtocolVersion] = match t.min_version.as_deref() {
        None | Some("TLS12") => &[&rustls::version::TLS13, &rustls::version::TLS12],
        Some("TLS13") => &[&rustls::version::TLS13],
        Some(v) => return Err(WebConfigProblem::MinVersion { given: v.into() }),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(|source| WebConfigProblem::Protocols { source })?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|source| WebConfigProblem::CertAndKey {
            cert_file,
            key_file,
            source,
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// 401 with `WWW-Authenticate: Basic` unless the request carries a configured user and its
/// password. The bcrypt check (tens of ms by design) runs off the async workers.
async fn require_basic_auth(State(users): State<Arc<Users>>, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b64| {
            base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .ok()
        })
        .and_then(|raw| String::from_utf8(raw).ok())
        .and_then(|s| {
            s.split_once(':')
                .map(|(u, p)| (u.to_string(), p.to_string()))
        });
    let ok = match given {
        Some((user, password)) => {
            tokio::task::spawn_blocking(move || users.verify(&user, &password))
                .await
                .unwrap_or(false)
        }
        None => false,
    };
    if ok {
        next.run(req).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Basic")],
            "Unauthorized\n",
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, text: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("ethand-webcfg-{}-{name}", std::process::id()));
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn unknown_keys_and_bad_hashes_name_the_file() {
        let p = write(
            "unknown.yml",
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_ca_file: c\n",
        );
        let e = WebConfig::load(&p).err().expect("unknown key").to_string();
        assert!(
            e.contains(&p.display().to_string()) && e.contains("client_ca_file"),
            "{e}"
        );
        let p = write("hash.yml", "basic_auth_users:\n  alice: plaintext\n");
        let e = WebConfig::load(&p).err().expect("bad hash").to_string();
        assert!(
            e.contains("basic_auth_users.alice") && e.contains(&p.display().to_string()),
            "{e}"
        );
        let p = write(
            "nocert.yml",
            "tls_server_config:\n  cert_file: /nonexistent.crt\n  key_file: /nonexistent.key\n",
        );
        let e = WebConfig::load(&p).err().expect("missing cert").to_string();
        assert!(e.contains("/nonexistent.crt"), "{e}");
    }

    /// The text names what is wrong; the OS's error stays as the source.
    #[test]
    fn refusals_keep_their_text_and_cause() {
        use std::error::Error as _;
        let missing = WebConfig::load(Path::new("/nonexistent/web.yml"))
            .err()
            .expect("absent");
        assert!(matches!(*missing.problem, WebConfigProblem::Read { .. }));
        assert!(
            missing
                .source()
                .unwrap()
                .source()
                .unwrap()
                .is::<std::io::Error>()
        );
        let e = WebConfigProblem::MinVersion {
            given: "TLS11".into(),
        };
        assert_eq!(
            e.to_string(),
            "tls_server_config.min_version \"TLS11\": ethand supports \"TLS12\" and \"TLS13\""
        );
        let e = WebConfigProblem::NotBcrypt {
            user: "alice".into(),
        };
        assert_eq!(
            e.to_string(),
            "basic_auth_users.alice: not a bcrypt hash (htpasswd -nBC 10 \"\" | tr -d ':\\n')"
        );
    }

    #[test]
    fn users_verify_against_bcrypt_hashes() {
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let p = write(
            "users.yml",
            &format!("basic_auth_users:\n  alice: {hash}\n"),
        );
        let w = WebConfig::load(&p).unwrap();
        let users = w.users.expect("users");
        assert!(users.verify("alice", "s3cret"));
        assert!(!users.verify("alice", "wrong"));
        assert!(!users.verify("bob", "s3cret"));
        assert!(w.tls.is_none());
        assert!(
            WebConfig::load(&write("empty.yml", ""))
                .unwrap()
                .users
                .is_none()
        );
    }
}
