//! The adapter against a file system that serves two operations: defaults answer ENOSYS,
//! the forgets reach their methods and get no reply, the reply borrows what the method
//! was given, and `run` sees each request's kind.

use super::*;
use std::sync::Mutex;

use fuse::abi::fuse_in_header;
use zerocopy::{FromZeros, IntoBytes};

/// Serves GETATTR and READ; records forgets and the kinds `run` saw.
#[derive(Default)]
struct Two {
    forgotten: Mutex<Vec<(u64, u64)>>,
    ran: Mutex<Vec<OpKind>>,
}

/// The reply's argument struct.
struct Attr(fuse_attr_out);

impl Default for Attr {
    fn default() -> Attr {
        Attr(FromZeros::new_zeroed())
    }
}

impl Operations for Two {
    type Scratch = Attr;

    fn run<'b>(
        &self,
        cx: &Ctx<'_>,
        _req: &Request<'_>,
        kind: OpKind,
        answer: impl FnOnce(&Ctx<'_>) -> Answer<'b> + Send,
    ) -> Answer<'b> {
        self.ran.lock().unwrap().push(kind);
        answer(cx)
    }

    fn forget(&self, nodeid: u64, nlookup: u64) {
        self.forgotten.lock().unwrap().push((nodeid, nlookup));
    }

    fn getattr<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        _arg: &fuse_getattr_in,
        s: &'b mut Attr,
    ) -> Answer<'b> {
        s.0.attr.ino = req.nodeid;
        Ok(Reply::arg(req.unique, &s.0))
    }

    fn read<'b>(
        &self,
        _cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_read_in,
        data: &'b mut [u8],
    ) -> Answer<'b> {
        let out = &mut data[..arg.size as usize];
        out.fill(7);
        Ok(Reply::data(req.unique, out))
    }
}

/// `opcode` with the zeroed argument `body` (after the header), 8-byte aligned.
fn request_words(opcode: u32, body: &[u8]) -> Vec<u64> {
    let header = fuse_in_header {
        len: (40 + body.len()) as u32,
        opcode,
        unique: 9,
        nodeid: 5,
        uid: 0,
        gid: 0,
        pid: 1,
        total_extlen: 0,
        padding: 0,
    };
    let bytes = [header.as_bytes(), body].concat();
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    words.as_mut_bytes()[..bytes.len()].copy_from_slice(&bytes);
    words
}

/// The reply's error (0 for success) and length, or `None` without a reply.
fn serve(fs: &Two, opcode: u32, body: &[u8], data: &mut [u8]) -> Option<(i32, usize)> {
    let words = request_words(opcode, body);
    let req = Request::decode(&words.as_bytes()[..40 + body.len()], &[]).unwrap();
    let mut scratch = Attr::default();
    let reply = handle(fs, &Ctx::Blocking, &req, &mut scratch, data)?;
    Some((reply.header().error, reply.len()))
}

#[test]
fn served_operations_reply_and_the_rest_answer_enosys() {
    let fs = Two::default();
    assert_eq!(
        serve(&fs, FUSE_GETATTR, &[0; 16], &mut []),
        Some((0, 16 + 104))
    );
    let mut read = fuse_read_in::new_zeroed();
    read.size = 100;
    let mut data = [0u8; 4096];
    assert_eq!(
        serve(&fs, FUSE_READ, read.as_bytes(), &mut data),
        Some((0, 116))
    );
    assert_eq!(data[99], 7);
    let enosys = Some((-libc::ENOSYS, 16));
    assert_eq!(serve(&fs, FUSE_OPEN, &[0; 8], &mut []), enosys);
    assert_eq!(serve(&fs, FUSE_STATFS, &[], &mut []), enosys);
    assert_eq!(serve(&fs, FUSE_IOCTL, &[0; 32], &mut []), enosys);
    assert_eq!(
        serve(&fs, FUSE_INIT, &[0; 64], &mut []),
        Some((-libc::EPROTO, 16))
    );
    assert_eq!(serve(&fs, FUSE_DESTROY, &[], &mut []), Some((0, 16)));
    let ran = fs.ran.lock().unwrap().clone();
    assert_eq!(ran[..3], [OpKind::Getattr, OpKind::Read, OpKind::Open]);
}

#[test]
fn forgets_and_interrupts_take_no_reply_and_skip_run() {
    let fs = Two::default();
    assert_eq!(serve(&fs, FUSE_FORGET, &3u64.to_ne_bytes(), &mut []), None);
    let batch: Vec<u8> = [1u32.to_ne_bytes(), [0; 4]]
        .concat()
        .into_iter()
        .chain([8u64, 2].iter().flat_map(|v| v.to_ne_bytes()))
        .collect();
    assert_eq!(serve(&fs, FUSE_BATCH_FORGET, &batch, &mut []), None);
    assert_eq!(serve(&fs, FUSE_INTERRUPT, &[0; 8], &mut []), None);
    assert_eq!(*fs.forgotten.lock().unwrap(), [(5, 3), (8, 2)]);
    assert!(fs.ran.lock().unwrap().is_empty());
}
