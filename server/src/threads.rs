//! Serving with worker threads ([`Dispatch::Threads`](crate::Dispatch)): the libfuse
//! model, for comparison.
//!
//! The workers block in `read(2)` on their own cloned /dev/fuse fds; the thread that
//! called [`Server::serve`] waits for the handle's commands and for the workers to leave
//! by themselves (the file system was unmounted), then flushes.

use std::time::Duration;

use runtime::CounterSnapshot;
use transport::blocking::Workers;
use transport::FileSystem;

use crate::control::Command;
use crate::error::ServeError;
use crate::server::{Report, Served, Server};

pub fn serve<F: FileSystem>(server: &Server<F>, threads: usize) -> Served {
    let started = Workers::start(
        &server.session,
        &server.fs,
        server.max_write,
        threads,
        server.options.accounting,
    );
    let workers = match started {
        Ok(workers) => workers,
        Err(source) => return Served::failed(ServeError::StartWorkers { threads, source }),
    };
    'serving: while !workers.all_finished() {
        if workers.failed() {
            log::error!("a worker's request stream failed: stopping the others, then unmounting");
            break;
        }
        for command in server.commands.wait(Duration::from_millis(100)) {
            match command {
                Command::Snapshot(reply) => {
                    let (queue, ops) = workers.snapshot();
                    let _ = reply.send(Report {
                        runtime: CounterSnapshot::default(),
                        queue,
                        ops,
                        per_queue: Vec::new(),
                        placement: None,
                    });
                }
                Command::Stop => break 'serving,
            }
        }
    }
    let (queue, accounting) = workers.stop();
    Served {
        result: server.flush(),
        report: Report {
            runtime: CounterSnapshot::default(),
            queue,
            ops: accounting.report(),
            per_queue: Vec::new(),
            placement: None,
        },
    }
}
