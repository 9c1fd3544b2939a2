//! A loop with nothing to do, and what it may do then: block in one system call on its own
//! thread ([`Co::block_while_idle`]) instead of waiting on its ring.
//!
//! Why: a request source such as /dev/fuse wakes every ring poll waiting on it through
//! task work (an interrupt to each poller's CPU), where a thread blocked in `read(2)` is
//! an exclusive waiter, woken alone and directly. At one request at a time that is the
//! difference between a loop and a blocking thread (benches/HISTORY.md, 2026-12-07: 6.7
//! system calls a request against 3). The loop may do it only when nothing else of its
//! own could need it meanwhile: no coroutine ready, and no SQE in flight but *background*
//! waits ([`Co::wait_in_background`]): the wake-ups other threads send it, each of which
//! ends the blocking call ([`Interrupter`](crate::interrupt::Interrupter)).

use std::io;

use crate::co::Co;

impl Co<'_> {
    /// Whether this coroutine is all its loop has to run: no other coroutine ready, and no
    /// SQE in flight but background waits.
    pub fn loop_is_alone(&self) -> bool {
        self.loop_is_alone_but(0)
    }

    /// Whether this coroutine is all its loop has to run but `waits` SQEs in flight (and
    /// background waits): no other coroutine ready, no other SQE in flight.
    pub fn loop_is_alone_but(&self, waits: usize) -> bool {
        let inner = self.inner;
        inner.sched.with(|s| s.ready.is_empty())
            && inner.reactor.in_flight() <= inner.background_waits.get() + waits
    }

    /// Runs `wait` (a call that suspends on the ring until another thread wakes the loop)
    /// as a *background* wait: it does not keep the loop busy for
    /// [`Co::block_while_idle`]. Whoever ends it must then also end the loop's blocking
    /// call ([`EventFd::wait_in_background`](crate::EventFd) sees to it).
    pub fn wait_in_background<T>(&self, wait: impl FnOnce() -> T) -> T {
        let waits = &self.inner.background_waits;
        waits.set(waits.get() + 1);
        let got = wait();
        waits.set(waits.get() - 1);
        got
    }

    /// Runs `call`, a blocking system call, on the loop's thread if the loop is alone
    /// ([`Co::loop_is_alone`]) and no wake-up of a background wait is pending; `None`
    /// otherwise (wait through the ring then). A wake-up that comes while it blocks makes it
    /// fail with `EINTR`. The loop turns no wheel meanwhile: nothing else of it runs.
    pub fn block_while_idle<T>(
        &self,
        call: impl FnOnce() -> io::Result<T>,
    ) -> Option<io::Result<T>> {
        if !self.loop_is_alone() {
            return None;
        }
        self.inner.interrupt.get_or_make()?.block(call)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::io::Read;
    use std::rc::Rc;
    use std::sync::Arc;

    use crate::interrupt::tests::pipe;
    use crate::{EventFd, Runtime};

    #[test]
    fn a_loop_is_alone_only_with_nothing_but_background_waits() {
        let rt = Runtime::new(Default::default()).unwrap();
        let kick = Arc::new(EventFd::new().unwrap());
        let seen = rt
            .block_on({
                let kick = Arc::clone(&kick);
                move |co| {
                    let mut seen = vec![co.loop_is_alone()];
                    let (reader, _writer) = pipe();
                    let reader = Rc::new(reader);
                    // A coroutine waiting on the ring: not alone.
                    let waiting = {
                        let reader = Rc::clone(&reader);
                        co.spawn(move |co| {
                            let _ = co.ctx().poll(&*reader, libc::POLLIN);
                        })
                        .unwrap()
                    };
                    co.yield_now();
                    seen.push(co.loop_is_alone());
                    co.cancel_io(waiting).unwrap();
                    co.yield_now();
                    co.yield_now();
                    // A coroutine waiting in the background: alone.
                    let kick2 = Arc::clone(&kick);
                    let background = co.spawn(move |co| {
                        let _ = kick2.wait_in_background(co);
                    });
                    co.yield_now();
                    seen.push(co.loop_is_alone());
                    // Ready coroutines: not alone.
                    let _ = co.spawn(|_| {});
                    seen.push(co.loop_is_alone());
                    kick.signal().unwrap();
                    drop(background);
                    // Waits in the background and wake-ups alone make no interrupter.
                    seen.push(co.inner.interrupt.is_made());
                    seen
                }
            })
            .unwrap();
        assert_eq!(seen, [true, false, true, false, false]);
    }

    #[test]
    fn a_signal_of_a_background_eventfd_ends_the_blocking_call() {
        let rt = Runtime::new(Default::default()).unwrap();
        let kick = Arc::new(EventFd::new().unwrap());
        let (reader, writer) = pipe();
        let sender = {
            let kick = Arc::clone(&kick);
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                kick.signal().unwrap();
                writer // kept open until then: the read has nothing to return
            })
        };
        let woke = Rc::new(Cell::new(false));
        let result = rt
            .block_on({
                let (kick, woke) = (Arc::clone(&kick), Rc::clone(&woke));
                move |co| {
                    let kick2 = Arc::clone(&kick);
                    let woke2 = Rc::clone(&woke);
                    co.spawn(move |co| {
                        kick2.wait_in_background(co).unwrap();
                        woke2.set(true);
                    })
                    .unwrap();
                    co.yield_now(); // the watcher's poll is in flight
                    let mut reader = reader;
                    let mut byte = [0u8; 1];
                    // The first attempt makes the interrupter and declines: a wake-up may
                    // have come before it existed.
                    let first = co.block_while_idle(|| reader.read(&mut byte)).is_some();
                    let blocked = co.block_while_idle(|| reader.read(&mut byte));
                    // Declines now: the wake-up is pending until the loop waits on its ring.
                    let again = co.block_while_idle(|| reader.read(&mut byte)).is_some();
                    co.yield_now();
                    co.yield_now();
                    let blocked = blocked.map(|r| r.map_err(|e| e.raw_os_error()));
                    (first, blocked, again)
                }
            })
            .unwrap();
        drop(sender.join().unwrap());
        assert_eq!(result, (false, Some(Err(Some(libc::EINTR))), false));
        assert!(woke.get(), "the background wait saw the wake-up");
    }
}
