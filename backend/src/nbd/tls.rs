//! TLS for NBD, as QEMU's `tls-creds-x509` client does it: X.509 credentials from one
//! directory with QEMU's file names, `NBD_OPT_STARTTLS` during option haggling (see
//! `handshake`), then the rest of the haggling and every request inside TLS.
//!
//! # Credentials (`--tls-creds DIR`)
//! - `ca-cert.pem`: the CA(s) the server's certificate must chain to (required).
//! - `ca-crl.pem`: certificate revocation lists of those CAs, if there: a revoked
//!   certificate anywhere in the server's chain is refused.
//! - `client-cert.pem` and `client-key.pem`: sent when the server asks for a client
//!   certificate (`verify-peer=yes`), if both are there; one without the other is refused.
//!
//! The server's name is checked against its certificate as QEMU does: the URI's host over
//! TCP, `--tls-hostname` if given; over a unix socket without `--tls-hostname`, only the
//! chain is checked (QEMU sets no host name there either).
//!
//! # I/O
//! rustls runs over our own transport: ciphertext moves between the socket and rustls
//! (`read_tls`/`write_tls`) through the caller's [`Ctx`] (the ring in a coroutine,
//! blocking syscalls otherwise), plaintext through `reader()`/`writer()`. The session sits
//! behind a mutex held for the cryptography only, never across socket I/O, so the one
//! reader and the one writer of a connection (`conn`) run at once as on a plain socket.
//! Our buffers (ciphertext in, ciphertext out) are made once per connection; rustls's
//! own record buffers are internal to it.

use std::fmt;
use std::fs;
use std::io::{self, IoSlice, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{
    CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName, UnixTime,
};
use rustls::{
    AlertDescription, CertificateError, ClientConfig, ClientConnection, DigitallySignedStruct,
    RootCertStore, SignatureScheme,
};

use super::stream::Sock;
use crate::Ctx;

/// Bytes of ciphertext one socket read takes at most.
const CIPHER_IN: usize = 128 << 10;

/// What `--tls-creds` and `--tls-hostname` say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// The directory with `ca-cert.pem` (and optionally `client-cert.pem`, `client-key.pem`).
    pub creds: PathBuf,
    /// The name the server's certificate must carry; default: the URI's TCP host.
    pub hostname: Option<String>,
}

/// A client configuration, made once at open and used by every connection (and
/// reconnection) to the server.
#[derive(Clone)]
pub struct Client {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    /// For error messages: the directory and the name checked (if any).
    creds: PathBuf,
    checked: Option<String>,
    /// Without a client certificate: set once a server asked for one.
    asked: Option<Arc<AtomicBool>>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tls::Client({}, {:?})",
            self.creds.display(),
            self.checked
        )
    }
}

impl Client {
    /// Loads the credentials in `opts.creds`; `tcp_host` is the URI's host, if TCP. Errors
    /// are one line naming the file.
    pub fn new(opts: &TlsOptions, tcp_host: Option<&str>) -> io::Result<Client> {
        let dir = &opts.creds;
        let roots = load_roots(&dir.join("ca-cert.pem"))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let checked = opts.hostname.clone().or(tcp_host.map(str::to_owned));
        let crls = load_crls(&dir.join("ca-crl.pem"))?;
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .with_crls(crls)
            // As GnuTLS (QEMU): a certificate no list speaks of is not refused for it.
            .allow_unknown_revocation_status()
            .build()
            .map_err(|e| bad(&format!("{}: {e}", dir.join("ca-crl.pem").display())))?;
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(&e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Verifier {
                webpki,
                check_name: checked.is_some(),
            }));
        let mut asked = None;
        let mut config = match load_client_auth(dir)? {
            Some((certs, key)) => builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| bad(&format!("{}: {e}", dir.join("client-key.pem").display())))?,
            None => {
                let flag = Arc::new(AtomicBool::new(false));
                asked = Some(Arc::clone(&flag));
                builder.with_client_cert_resolver(Arc::new(NoCert(flag)))
            }
        };
        config.enable_sni = checked.is_some();
        let text = checked.clone().unwrap_or_else(|| "localhost".into());
        let name = ServerName::try_from(text.clone())
            .map_err(|_| bad(&format!("{text:?} is not a valid TLS host name")))?;
        Ok(Client {
            config: Arc::new(config),
            name,
            creds: dir.clone(),
            checked,
            asked,
        })
    }

    /// Runs the TLS handshake on `sock` (blocking: at open), after the server's ACK to
    /// `NBD_OPT_STARTTLS`.
    pub fn connect(&self, sock: &Sock) -> io::Result<Session> {
        let conn = ClientConnection::new(Arc::clone(&self.config), self.name.clone())
            .map_err(|e| bad(&e.to_string()))?;
        let session = Session {
            state: Mutex::new(State {
                conn,
                cipher_in: vec![0; CIPHER_IN].into_boxed_slice(),
                fed: 0,
                got: 0,
                cipher_out: Vec::with_capacity(CIPHER_IN),
            }),
            hint: Hint {
                creds: self.creds.clone(),
                checked: self.checked.clone(),
                asked: self.asked.clone(),
            },
        };
        session.handshake(sock)?;
        Ok(session)
    }
}

/// No client certificate to give, remembering that a server asked for one (to say so
/// when it then hangs up).
#[derive(Debug)]
struct NoCert(Arc<AtomicBool>);

impl ResolvesClientCert for NoCert {
    fn resolve(
        &self,
        _: &[&[u8]],
        _: &[SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        self.0.store(true, Ordering::Relaxed);
        None
    }

    fn has_certs(&self) -> bool {
        false
    }
}

/// The server's certificate checked against `ca-cert.pem`, and its name unless there is
/// none to check (a unix socket without `--tls-hostname`).
#[derive(Debug)]
struct Verifier {
    webpki: Arc<WebPkiServerVerifier>,
    check_name: bool,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified =
            self.webpki
                .verify_server_cert(end_entity, intermediates, server_name, ocsp, now);
        // webpki checks the chain before the name: a name error means a trusted chain.
        match verified {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

fn read_pem(path: &Path) -> io::Result<Vec<u8>> {
    fs::read(path).map_err(|e| {
        let what = match e.kind() {
            io::ErrorKind::NotFound => "missing".to_owned(),
            _ => e.to_string(),
        };
        io::Error::new(
            e.kind(),
            format!("TLS credentials: {}: {what}", path.display()),
        )
    })
}

fn load_roots(path: &Path) -> io::Result<RootCertStore> {
    let pem = read_pem(path)?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| bad(&format!("{}: {e}", path.display())))?;
        roots
            .add(cert)
            .map_err(|e| bad(&format!("{}: {e}", path.display())))?;
    }
    match roots.is_empty() {
        true => Err(bad(&format!("{}: no certificate in it", path.display()))),
        false => Ok(roots),
    }
}

/// The revocation lists in `path`, if the file is there (none otherwise).
fn load_crls(path: &Path) -> io::Result<Vec<CertificateRevocationListDer<'static>>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let pem = read_pem(path)?;
    let crls = CertificateRevocationListDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(&format!("{}: {e}", path.display())))?;
    match crls.is_empty() {
        true => Err(bad(&format!(
            "{}: no revocation list in it",
            path.display()
        ))),
        false => Ok(crls),
    }
}

type ClientAuth = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

/// `client-cert.pem` and `client-key.pem`, if both are in `dir`.
fn load_client_auth(dir: &Path) -> io::Result<Option<ClientAuth>> {
    let (cert, key) = (dir.join("client-cert.pem"), dir.join("client-key.pem"));
    match (cert.exists(), key.exists()) {
        (false, false) => return Ok(None),
        (true, false) => read_pem(&key).map(drop)?,
        (false, true) => read_pem(&cert).map(drop)?,
        (true, true) => {}
    }
    let pem = read_pem(&cert)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(&format!("{}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(bad(&format!("{}: no certificate in it", cert.display())));
    }
    let key_pem = read_pem(&key)?;
    let private = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| bad(&format!("{}: no usable private key: {e}", key.display())))?;
    Ok(Some((certs, private)))
}

/// A TLS session on a connected socket.
pub struct Session {
    state: Mutex<State>,
    hint: Hint,
}

/// What an error message may say about the configuration.
struct Hint {
    creds: PathBuf,
    checked: Option<String>,
    asked: Option<Arc<AtomicBool>>,
}

struct State {
    conn: ClientConnection,
    /// Ciphertext read from the socket: `[fed, got)` not yet given to rustls.
    cipher_in: Box<[u8]>,
    fed: usize,
    got: usize,
    /// Ciphertext to send; taken by the writer while it sends.
    cipher_out: Vec<u8>,
}

impl State {
    /// Gives rustls some buffered ciphertext and decrypts what it completes.
    fn feed(&mut self) -> Result<(), rustls::Error> {
        let mut rest = &self.cipher_in[self.fed..self.got];
        let n = self.conn.read_tls(&mut rest).map_err(|e| {
            rustls::Error::General(format!("cannot take ciphertext: {e}")) // our bug if so
        })?;
        self.fed += n;
        self.conn.process_new_packets().map(drop)
    }
}

impl Session {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn handshake(&self, sock: &Sock) -> io::Result<()> {
        let cx = Ctx::Blocking;
        loop {
            let mut st = self.lock();
            let (handshaking, wants_write) = (st.conn.is_handshaking(), st.conn.wants_write());
            drop(st);
            if wants_write {
                self.write_all(sock, &cx, &mut [])?;
            } else if !handshaking {
                return Ok(());
            } else {
                st = self.lock();
                if st.fed == st.got {
                    self.fill(sock, &cx, st)?;
                    st = self.lock();
                }
                let fed = st.feed();
                drop(st);
                if let Err(e) = fed {
                    let _ = self.write_all(sock, &cx, &mut []); // our alert, if any
                    return Err(self.error(e));
                }
            }
        }
    }

    /// Reads ciphertext from the socket into the (empty) input buffer.
    fn fill(&self, sock: &Sock, cx: &Ctx<'_>, mut st: MutexGuard<'_, State>) -> io::Result<()> {
        let mut buf = std::mem::take(&mut st.cipher_in);
        drop(st);
        let got = sock.read_some(cx, &mut buf);
        let mut st = self.lock();
        st.cipher_in = buf;
        (st.fed, st.got) = (0, got?);
        Ok(())
    }

    /// Reads plaintext: what rustls holds and the ciphertext buffered already yield, or
    /// else one socket read's worth. End of file (also a TLS `close_notify`) is
    /// `UnexpectedEof`, as on a plain socket.
    pub fn read_some(&self, sock: &Sock, cx: &Ctx<'_>, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        let mut st = self.lock();
        while n < buf.len() {
            match st.conn.reader().read(&mut buf[n..]) {
                Ok(0) if n == 0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(0) => return Ok(n),
                Ok(k) => {
                    n += k;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if st.fed < st.got {
                st.feed().map_err(|e| self.error(e))?;
            } else if n > 0 {
                break;
            } else {
                self.fill(sock, cx, st)?;
                st = self.lock();
            }
        }
        Ok(n)
    }

    /// Encrypts all of `bufs` and sends it (with anything rustls queued, such as a key
    /// update's answer). One writer at a time, as on a plain socket: records leave in the
    /// order they were sealed.
    pub fn write_all(
        &self,
        sock: &Sock,
        cx: &Ctx<'_>,
        mut bufs: &mut [IoSlice<'_>],
    ) -> io::Result<()> {
        IoSlice::advance_slices(&mut bufs, 0);
        loop {
            let mut st = self.lock();
            while !bufs.is_empty() {
                let n = st.conn.writer().write_vectored(bufs)?;
                if n == 0 {
                    break; // rustls's buffer is full: send what it holds first
                }
                IoSlice::advance_slices(&mut bufs, n);
            }
            let mut out = std::mem::take(&mut st.cipher_out);
            while st.conn.wants_write() {
                st.conn.write_tls(&mut out)?;
            }
            drop(st);
            let sent = match out.is_empty() {
                true => Ok(()),
                false => sock.write_all(cx, &mut [IoSlice::new(&out)]),
            };
            out.clear();
            self.lock().cipher_out = out;
            sent?;
            if bufs.is_empty() {
                return Ok(());
            }
        }
    }

    /// Why the server may have closed the connection during option haggling: it asked
    /// for a client certificate and we had none.
    pub fn why_closed(&self) -> Option<String> {
        let asked = self.hint.asked.as_ref()?.load(Ordering::Relaxed);
        asked.then(|| {
            format!(
                "the server closed the connection after asking for a client certificate, \
                 and {} has none (client-cert.pem, client-key.pem)",
                self.hint.creds.display()
            )
        })
    }

    /// One line saying what went wrong, and what to check.
    fn error(&self, e: rustls::Error) -> io::Error {
        let dir = self.hint.creds.display();
        let why = match &e {
            rustls::Error::InvalidCertificate(CertificateError::NotValidForName)
            | rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                ..
            }) => format!(
                "the server's certificate is not valid for {:?} (--tls-hostname sets the name to check)",
                self.hint.checked.as_deref().unwrap_or("")
            ),
            rustls::Error::InvalidCertificate(CertificateError::Revoked) => format!(
                "the server's certificate is revoked ({dir}/ca-crl.pem lists it)"
            ),
            rustls::Error::InvalidCertRevocationList(c) => format!(
                "{dir}/ca-crl.pem: a revocation list issued in the name of the server's CA does \
                 not verify ({c:?}): is it the list of the CA in {dir}/ca-cert.pem?"
            ),
            rustls::Error::InvalidCertificate(c) => format!(
                "the server's certificate is not trusted ({c:?}): is {dir}/ca-cert.pem the CA that signed it?"
            ),
            rustls::Error::AlertReceived(
                a @ (AlertDescription::CertificateRequired
                | AlertDescription::BadCertificate
                | AlertDescription::UnknownCA
                | AlertDescription::HandshakeFailure
                | AlertDescription::AccessDenied),
            ) => format!(
                "the server refused the TLS handshake ({a:?}): does it want a client certificate \
                 ({dir}/client-cert.pem and client-key.pem) from a CA it trusts?"
            ),
            e => format!("TLS: {e}"),
        };
        io::Error::new(io::ErrorKind::PermissionDenied, why)
    }
}

fn bad(why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("TLS credentials: {why}"),
    )
}
