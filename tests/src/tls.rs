//! X.509 credentials for the NBD TLS tests, made with `openssl` in a scratch directory and
//! laid out as QEMU's `tls-creds-x509` wants them: a directory per endpoint with
//! `ca-cert.pem` and the endpoint's `*-cert.pem`/`*-key.pem`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

/// A test CA, a server certificate for 127.0.0.1 and localhost, a client certificate, a
/// second CA that signed nothing of these, and two revocation lists of the first CA: one
/// that revokes the client's certificate, one that also revokes the server's.
pub struct TlsCerts {
    dir: TempDir,
}

impl TlsCerts {
    /// Makes every key and certificate (about a second with `openssl`).
    pub fn new() -> TlsCerts {
        let dir = tempfile::Builder::new()
            .prefix("corofuse-tls-")
            .tempdir()
            .expect("temp dir");
        let d = dir.path();
        let subs = [
            "server",
            "client",
            "anon",
            "wrong-ca",
            "ca",
            "other-ca",
            "revoked",
            "listed",
            "foreign-crl",
        ];
        for sub in subs {
            fs::create_dir(d.join(sub)).expect("mkdir");
        }
        make_ca(&d.join("ca"));
        make_ca(&d.join("other-ca"));
        let ca = d.join("ca");
        let server_ext = "subjectAltName=IP:127.0.0.1,DNS:localhost\n\
             extendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature,keyEncipherment\n";
        let client_ext = "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature,keyEncipherment\n";
        make_cert(&ca, &d.join("server"), "server", "localhost", server_ext);
        make_cert(
            &ca,
            &d.join("client"),
            "client",
            "corofuse-client",
            client_ext,
        );
        for sub in [
            "server",
            "client",
            "anon",
            "revoked",
            "listed",
            "foreign-crl",
        ] {
            fs::copy(ca.join("ca-cert.pem"), d.join(sub).join("ca-cert.pem")).expect("copy");
        }
        // The client's certificate revoked first: a list that does not name the server's.
        revoke(&ca, &d.join("client").join("client-cert.pem"));
        fs::copy(ca.join("ca-crl.pem"), d.join("listed").join("ca-crl.pem")).expect("copy");
        revoke(&ca, &d.join("server").join("server-cert.pem"));
        fs::copy(ca.join("ca-crl.pem"), d.join("revoked").join("ca-crl.pem")).expect("copy");
        // A list of the other CA, which has the same name as the first.
        revoke(
            &d.join("other-ca"),
            &d.join("client").join("client-cert.pem"),
        );
        let foreign = d.join("other-ca").join("ca-crl.pem");
        fs::copy(foreign, d.join("foreign-crl").join("ca-crl.pem")).expect("copy");
        let other = d.join("other-ca").join("ca-cert.pem");
        fs::copy(other, d.join("wrong-ca").join("ca-cert.pem")).expect("copy");
        TlsCerts { dir }
    }

    /// The server's directory (`dir=` of qemu-nbd's `tls-creds-x509` object).
    pub fn server(&self) -> PathBuf {
        self.dir.path().join("server")
    }

    /// A client's directory with a client certificate.
    pub fn client(&self) -> PathBuf {
        self.dir.path().join("client")
    }

    /// A client's directory with the CA only.
    pub fn anon(&self) -> PathBuf {
        self.dir.path().join("anon")
    }

    /// A client's directory with the CA and its revocation list, which revokes the
    /// server's certificate.
    pub fn revoked(&self) -> PathBuf {
        self.dir.path().join("revoked")
    }

    /// A client's directory with the CA and a revocation list that does not name the
    /// server's certificate.
    pub fn listed(&self) -> PathBuf {
        self.dir.path().join("listed")
    }

    /// A client's directory with the CA and a revocation list signed by another CA of the
    /// same name (a CA made again, its old list left behind).
    pub fn foreign_crl(&self) -> PathBuf {
        self.dir.path().join("foreign-crl")
    }

    /// A client's directory trusting a CA that did not sign the server's certificate.
    pub fn wrong_ca(&self) -> PathBuf {
        self.dir.path().join("wrong-ca")
    }

    /// qemu-nbd's arguments to require TLS with these credentials, asking the client for
    /// a certificate if `verify_peer`.
    pub fn qemu_nbd_args(&self, verify_peer: bool) -> Vec<String> {
        let verify = if verify_peer { "yes" } else { "no" };
        vec![
            "--object".into(),
            format!(
                "tls-creds-x509,id=tls0,dir={},endpoint=server,verify-peer={verify}",
                self.server().display()
            ),
            "--tls-creds".into(),
            "tls0".into(),
        ]
    }
}

impl Default for TlsCerts {
    fn default() -> Self {
        Self::new()
    }
}

fn openssl(args: &[&str], cwd: &Path) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"];

fn make_ca(dir: &Path) {
    let mut args = vec!["req", "-x509", "-nodes", "-days", "2"];
    args.extend(EC);
    args.extend([
        "-keyout",
        "ca-key.pem",
        "-out",
        "ca-cert.pem",
        "-subj",
        "/CN=corofuse test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl(&args, dir);
}

/// Revokes `cert` in the CA in `ca`, and writes the CA's revocation list as `ca-crl.pem`
/// there (`openssl ca`, with a minimal database).
fn revoke(ca: &Path, cert: &Path) {
    if !ca.join("ca.cnf").exists() {
        let config = "[ ca ]\ndefault_ca = CA_default\n[ CA_default ]\ndatabase = index.txt\n\
             crlnumber = crlnumber\ndefault_md = sha256\ndefault_crl_days = 2\n";
        fs::write(ca.join("ca.cnf"), config).expect("write ca.cnf");
        fs::write(ca.join("index.txt"), "").expect("write index.txt");
        fs::write(ca.join("crlnumber"), "01\n").expect("write crlnumber");
    }
    let signer = [
        "-config",
        "ca.cnf",
        "-keyfile",
        "ca-key.pem",
        "-cert",
        "ca-cert.pem",
    ];
    let cert = cert.to_str().expect("utf-8");
    openssl(&[&["ca"][..], &signer, &["-revoke", cert]].concat(), ca);
    openssl(
        &[&["ca"][..], &signer, &["-gencrl", "-out", "ca-crl.pem"]].concat(),
        ca,
    );
}

/// `NAME-cert.pem` and `NAME-key.pem` in `dir`, signed by the CA in `ca`.
fn make_cert(ca: &Path, dir: &Path, name: &str, cn: &str, ext: &str) {
    let (key, cert) = (format!("{name}-key.pem"), format!("{name}-cert.pem"));
    let subj = format!("/CN={cn}");
    let mut args = vec!["req", "-nodes"];
    args.extend(EC);
    args.extend(["-keyout", &key, "-out", "req.pem", "-subj", &subj]);
    openssl(&args, dir);
    fs::write(dir.join("ext.cnf"), ext).expect("write ext.cnf");
    let (ca_cert, ca_key) = (ca.join("ca-cert.pem"), ca.join("ca-key.pem"));
    let args = [
        "x509",
        "-req",
        "-in",
        "req.pem",
        "-CA",
        ca_cert.to_str().expect("utf-8"),
        "-CAkey",
        ca_key.to_str().expect("utf-8"),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        "-out",
        &cert,
    ];
    openssl(&args, dir);
    for f in ["req.pem", "ext.cnf"] {
        let _ = fs::remove_file(dir.join(f));
    }
}
