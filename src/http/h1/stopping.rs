//! The drain as one connection sees it: whether the listener, or an HTTP/2
//! connection's idle watch, has said this connection must stop taking requests.
//! Both HTTP/1.1 sides of a student's connection (the gateway's own and hyper's)
//! and HTTP/2 poll it between requests.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Wake, Waker};

use futures_util::task::AtomicWaker;

/// When a connection must stop taking requests: `stop` resolved.
///
/// `stop` is polled only when its own waker fired (and once at first): the
/// connection's task wakes twice a request for its own reasons, and each poll of
/// the listener's wait takes a lock (about 350 instructions a request, 1 % of
/// a small page's user-space work). For the same reason the task's waker is handed
/// to `woken` only when it is not there already: a registration is two locked
/// instructions, a check that it would wake the same task two compares.
pub(crate) struct Stopping<'a> {
    stop: Pin<&'a mut (dyn Future<Output = ()> + Send)>,
    /// Its waker, made when `stop` is polled (once at first, then only when woken):
    /// not kept, as every idle connection would keep it.
    woken: Arc<StopWoken>,
    /// The task's waker as last handed to `woken.task`; a wake takes it out of
    /// there, and says so by setting `woken.woken` after it has.
    registered: Option<Waker>,
    stopped: bool,
}

impl<'a> Stopping<'a> {
    pub(crate) fn new(stop: Pin<&'a mut (dyn Future<Output = ()> + Send)>) -> Self {
        Self {
            stop,
            woken: Arc::new(StopWoken::default()),
            registered: None,
            stopped: false,
        }
    }

    /// Whether the connection must stop; if not yet, `cx` is woken when it must.
    pub(crate) fn poll_stopped(&mut self, cx: &mut Context<'_>) -> bool {
        if self.stopped {
            return true;
        }
        // Registered before the flag is read: a wake after this point wakes the
        // task, one before it left the flag set.
        if !(self.registered.as_ref()).is_some_and(|waker| waker.will_wake(cx.waker())) {
            self.register(cx);
        }
        let woken = &self.woken.woken;
        if woken.load(Ordering::Acquire) && woken.swap(false, Ordering::AcqRel) {
            // That wake took the task's waker with it.
            self.register(cx);
            let waker = Waker::from(self.woken.clone());
            let mut stop_cx = Context::from_waker(&waker);
            self.stopped = self.stop.as_mut().poll(&mut stop_cx).is_ready();
        }
        self.stopped
    }

    fn register(&mut self, cx: &Context<'_>) {
        self.woken.task.register(cx.waker());
        match &mut self.registered {
            Some(waker) => waker.clone_from(cx.waker()),
            None => self.registered = Some(cx.waker().clone()),
        }
    }
}

/// Whether a connection's `stop` was woken since it was last polled, and the
/// connection's task to wake when it is.
struct StopWoken {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Default for StopWoken {
    /// Woken: `stop` is polled once at first, to register its waker.
    fn default() -> Self {
        Self {
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        }
    }
}

impl Wake for StopWoken {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    /// The waker is taken before the flag is set: a task that finds the flag set
    /// knows its waker is gone and hands it over again.
    fn wake_by_ref(self: &Arc<Self>) {
        let task = self.task.take();
        self.woken.store(true, Ordering::Release);
        if let Some(task) = task {
            task.wake();
        }
    }
}
