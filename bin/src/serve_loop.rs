//! Serving on the coroutine event loop (`--dispatch coroutine` and `inline`).
//!
//! The main coroutine starts the queue and a signal watcher, then waits for the queue to
//! finish (stopped by SIGINT/SIGTERM, or unmounted), cancels the watcher and flushes.

use std::io;
use std::rc::Rc;
use std::sync::Arc;

use backend::Ctx;
use image_export::Export;
use runtime::{Co, Config, Runtime};
use transport::{FileSystem, Queue};

use crate::mount::{Served, Serving};
use crate::signals::SignalFd;

pub fn serve(serving: Serving) -> Served {
    let rt = match Runtime::new(Config {
        poll_ns: serving.poll_ns(),
        account: serving.accounting(),
        ..Config::default()
    }) {
        Ok(rt) => rt,
        Err(e) => return Served::failed(e.to_string()),
    };
    let queue_fd = match serving.session.clone_queue(true) {
        Ok(fd) => fd,
        Err(e) => return Served::failed(format!("cloning the /dev/fuse queue: {e}")),
    };
    let queue = Queue::new(
        queue_fd,
        Arc::clone(&serving.export),
        serving.max_write,
        serving.queue_config(),
    );
    let serving = Rc::new(serving);
    let (q, s) = (Rc::clone(&queue), Rc::clone(&serving));
    let result = rt.block_on(move |co| run_queue(co, &q, &s));
    Served {
        result: flatten(result),
        runtime: rt.counters(),
        queue: queue.stats(),
        ops: queue.accounting(),
    }
}

fn flatten(result: io::Result<io::Result<()>>) -> Result<(), String> {
    result
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}

/// The main coroutine: serve until the queue ends, then flush.
fn run_queue(co: &Co<'_>, queue: &Rc<Queue<Export>>, serving: &Rc<Serving>) -> io::Result<()> {
    queue.start(co)?;
    let watcher = {
        let (queue, serving) = (Rc::clone(queue), Rc::clone(serving));
        co.spawn_named("signals", move |co| watch_signals(co, &queue, &serving))?
    };
    queue.wait_finished(co);
    co.cancel_io(watcher)?;
    let fs = &serving.export;
    log::info!("no request left in flight; flushing {}", fs.describe());
    fs.flush(&Ctx::Coroutine(co))
}

/// Reads signals through the ring: SIGUSR1 writes the stats, SIGINT/SIGTERM stop the queue.
fn watch_signals(co: &Co<'_>, queue: &Queue<Export>, serving: &Serving) {
    let mut info = [0u8; 128];
    loop {
        match co.read(&serving.signals, &mut info) {
            Ok(128) => {}
            Ok(n) => log::warn!("short signalfd read of {n} bytes"),
            Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => return,
            Err(e) => {
                log::error!("reading signals: {e}");
                return;
            }
        }
        match SignalFd::signo(&info) {
            libc::SIGUSR1 => serving.write_stats(co.counters(), queue.stats(), &queue.accounting()),
            signo => {
                log::info!("signal {signo}: finishing the requests in flight, then unmounting");
                queue.stop(co);
                return;
            }
        }
    }
}
