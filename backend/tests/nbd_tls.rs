//! NBD over TLS against qemu-nbd requiring it (`--tls-creds` with a `tls-creds-x509`
//! object), with certificates the test makes with `openssl`: data read and written inside
//! TLS over TCP and unix sockets, in both contexts; client certificates; and the one-line
//! errors (TLS required but not given, not offered but asked, untrusted or misnamed
//! certificate, missing files).

mod util;

use std::fs;
use std::io::{IoSlice, IoSliceMut};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use backend::nbd::TlsOptions;
use backend::{BlockBackend, Ctx, NbdBackend, NbdOptions, OpenOptions};
use corofuse_tests::nbd::{NbdServer, Via};
use corofuse_tests::require_tool;
use corofuse_tests::tls::TlsCerts;
use util::{in_coroutine, pattern, read};

const MIB: usize = 1 << 20;

fn tls(creds: &Path, hostname: Option<&str>) -> NbdOptions {
    NbdOptions {
        connections: 2,
        tls: Some(TlsOptions {
            creds: creds.to_owned(),
            hostname: hostname.map(str::to_owned),
        }),
        ..NbdOptions::default()
    }
}

fn try_open(uri: &str, nbd: &NbdOptions) -> std::io::Result<NbdBackend> {
    let opts = OpenOptions {
        writable: true,
        ..OpenOptions::default()
    };
    backend::nbd::open(uri, &opts, nbd)
}

/// The one-line error of an open that must fail.
fn open_error(uri: &str, nbd: &NbdOptions) -> String {
    let err = try_open(uri, nbd)
        .err()
        .expect("the open fails")
        .to_string();
    assert!(!err.contains('\n'), "{err}");
    err
}

/// A served image and its contents.
struct Served {
    _dir: tempfile::TempDir,
    image: PathBuf,
    server: NbdServer,
}

fn serve(certs: &TlsCerts, via: Via, verify_peer: bool) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.raw");
    fs::write(&image, pattern(4 * MIB, 9)).unwrap();
    let args = certs.qemu_nbd_args(verify_peer);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = NbdServer::qemu_nbd(&image, "raw", "disk", via, &args);
    Served {
        _dir: dir,
        image,
        server,
    }
}

/// Writes and reads through `b` (large and small, many at once from coroutines), then
/// checks every byte against `model`.
fn exercise(b: &dyn BlockBackend, cx: &Ctx<'_>, model: &mut [u8], seed: u8) {
    let data = pattern(3 * MIB / 2, seed);
    b.writev(cx, &[IoSlice::new(&data)], MIB as u64).unwrap();
    model[MIB..MIB + data.len()].copy_from_slice(&data);
    for i in 0..64u64 {
        let small = [seed ^ i as u8; 4096];
        b.writev(cx, &[IoSlice::new(&small)], i * 8192).unwrap();
        model[i as usize * 8192..][..4096].copy_from_slice(&small);
    }
    b.flush(cx).unwrap();
    for i in 0..64usize {
        assert_eq!(
            read(b, cx, 4096, (i * 8192) as u64),
            model[i * 8192..][..4096]
        );
    }
    let mut all = vec![0; model.len()];
    b.readv(cx, &mut [IoSliceMut::new(&mut all)], 0).unwrap();
    assert!(all == model, "the export differs from the model");
}

fn round_trip(via: Via, verify_peer: bool) {
    require_tool!("qemu-nbd", "openssl");
    let certs = TlsCerts::new();
    let served = serve(&certs, via, verify_peer);
    let creds = match verify_peer {
        true => certs.client(),
        false => certs.anon(),
    };
    let b = Arc::new(try_open(served.server.uri(), &tls(&creds, None)).unwrap());
    assert!(b.describe().contains("TLS"), "{}", b.describe());
    let mut model = pattern(4 * MIB, 9);
    exercise(&*b, &Ctx::Blocking, &mut model, 1);
    let (b2, mut model2) = (Arc::clone(&b), model.clone());
    in_coroutine(move |cx| exercise(&*b2, cx, &mut model2, 2));
    exercise(&*b, &Ctx::Blocking, &mut model, 2); // the same writes, for the model
    drop(b);
    drop(served.server);
    assert!(
        fs::read(&served.image).unwrap() == model,
        "the image differs"
    );
}

/// TLS over a unix socket: the chain is checked, no host name (as QEMU).
#[test]
fn nbd_tls_unix() {
    round_trip(Via::Unix, false);
}

/// TLS over TCP: the server's certificate is checked for 127.0.0.1.
#[test]
fn nbd_tls_tcp() {
    round_trip(Via::Tcp, false);
}

/// `verify-peer=yes`: our client certificate is sent and accepted.
#[test]
fn nbd_tls_client_cert() {
    round_trip(Via::Tcp, true);
}

/// `verify-peer=yes` and no client certificate in DIR: one line saying what is wanted.
#[test]
fn nbd_tls_client_cert_missing() {
    require_tool!("qemu-nbd", "openssl");
    let certs = TlsCerts::new();
    let served = serve(&certs, Via::Unix, true);
    let err = open_error(served.server.uri(), &tls(&certs.anon(), None));
    assert!(err.contains("client-cert.pem"), "{err}");
}

/// A server that requires TLS and a client without `--tls-creds`.
#[test]
fn nbd_tls_required() {
    require_tool!("qemu-nbd", "openssl");
    let certs = TlsCerts::new();
    let served = serve(&certs, Via::Tcp, false);
    let err = open_error(served.server.uri(), &NbdOptions::default());
    assert!(
        err.contains("the server requires TLS: give --tls-creds DIR"),
        "{err}"
    );
    let tls_uri = served.server.uri().replacen("nbd://", "nbds://", 1);
    let err = open_error(&tls_uri, &NbdOptions::default());
    assert!(err.contains("nbds:// needs --tls-creds DIR"), "{err}");
    // nbds:// with credentials works.
    let b = try_open(&tls_uri, &tls(&certs.anon(), None)).unwrap();
    assert_eq!(read(&b, &Ctx::Blocking, 100, 0), pattern(4 * MIB, 9)[..100]);
}

/// A server whose certificate our CA did not sign; one not issued for the name checked.
#[test]
fn nbd_tls_untrusted() {
    require_tool!("qemu-nbd", "openssl");
    let certs = TlsCerts::new();
    let served = serve(&certs, Via::Tcp, false);
    let err = open_error(served.server.uri(), &tls(&certs.wrong_ca(), None));
    assert!(err.contains("certificate is not trusted"), "{err}");
    assert!(err.contains("ca-cert.pem"), "{err}");
    let misnamed = tls(&certs.anon(), Some("nbd.example"));
    let err = open_error(served.server.uri(), &misnamed);
    assert!(err.contains("not valid for \"nbd.example\""), "{err}");
    let unix = serve(&certs, Via::Unix, false);
    let err = open_error(unix.server.uri(), &tls(&certs.wrong_ca(), None));
    assert!(err.contains("certificate is not trusted"), "{err}");
}

/// `ca-crl.pem` (QEMU's name): a server whose certificate the CA revoked is refused,
/// saying so; a list that revokes another certificate lets it through.
#[test]
fn nbd_tls_revoked() {
    require_tool!("qemu-nbd", "openssl");
    let certs = TlsCerts::new();
    let served = serve(&certs, Via::Tcp, false);
    let err = open_error(served.server.uri(), &tls(&certs.revoked(), None));
    assert!(err.contains("certificate is revoked"), "{err}");
    assert!(err.contains("ca-crl.pem"), "{err}");
    let b = try_open(served.server.uri(), &tls(&certs.listed(), None)).unwrap();
    assert_eq!(read(&b, &Ctx::Blocking, 100, 0).len(), 100);
}

/// A `ca-crl.pem` that does not parse, or that another CA of the same name signed: the
/// error names the file.
#[test]
fn nbd_tls_bad_crl_is_named() {
    require_tool!("qemu-nbd", "openssl");
    let certs = TlsCerts::new();
    let served = serve(&certs, Via::Unix, false);
    let err = open_error(served.server.uri(), &tls(&certs.foreign_crl(), None));
    assert!(err.contains("ca-crl.pem"), "{err}");
    let garbage = tempfile::tempdir().unwrap();
    fs::copy(
        certs.anon().join("ca-cert.pem"),
        garbage.path().join("ca-cert.pem"),
    )
    .unwrap();
    let pem = "-----BEGIN X509 CRL-----\nMIIBAAAA\n-----END X509 CRL-----\n";
    fs::write(garbage.path().join("ca-crl.pem"), pem).unwrap();
    let err = open_error(served.server.uri(), &tls(garbage.path(), None));
    assert!(err.contains("ca-crl.pem"), "{err}");
}

/// A server without TLS and a client asking for it: refused, not used in the clear.
#[test]
fn nbd_tls_not_offered() {
    require_tool!("qemu-nbd", "openssl");
    let certs = TlsCerts::new();
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.raw");
    fs::write(&image, [0; 4096]).unwrap();
    let server = NbdServer::qemu_nbd(&image, "raw", "disk", Via::Unix, &[]);
    let err = open_error(server.uri(), &tls(&certs.anon(), None));
    assert!(err.contains("the server does not offer TLS"), "{err}");
}

/// Files missing from the credentials directory are named.
#[test]
fn nbd_tls_missing_files() {
    require_tool!("openssl");
    let certs = TlsCerts::new();
    let empty = tempfile::tempdir().unwrap();
    let uri = "nbds+unix:///disk?socket=/nonexistent";
    let err = open_error(uri, &tls(empty.path(), None));
    assert!(err.contains("ca-cert.pem: missing"), "{err}");
    let half = tempfile::tempdir().unwrap();
    for f in ["ca-cert.pem", "client-cert.pem"] {
        fs::copy(certs.client().join(f), half.path().join(f)).unwrap();
    }
    let err = open_error(uri, &tls(half.path(), None));
    assert!(err.contains("client-key.pem: missing"), "{err}");
}

/// `--reconnect-delay` over TLS: the server restarted, the handshake (TLS included) is
/// redone and requests go on, in both contexts.
#[test]
fn nbd_tls_reconnect() {
    require_tool!("qemu-nbd", "openssl");
    let certs = TlsCerts::new();
    let mut served = serve(&certs, Via::Tcp, true);
    let nbd = NbdOptions {
        reconnect_delay: std::time::Duration::from_secs(10),
        ..tls(&certs.client(), None)
    };
    let b = Arc::new(try_open(served.server.uri(), &nbd).unwrap());
    let model = pattern(4 * MIB, 9);
    assert_eq!(read(&*b, &Ctx::Blocking, 4096, 0), model[..4096]);
    served.server.restart();
    assert_eq!(read(&*b, &Ctx::Blocking, 4096, 8192), model[8192..][..4096]);
    served.server.restart();
    let b2 = Arc::clone(&b);
    in_coroutine(move |cx| assert_eq!(read(&*b2, cx, 4096, MIB as u64), model[MIB..][..4096]));
}
