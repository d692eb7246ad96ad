//! Delivery reports served on the runtime's own thread, the pipeline's.
//!
//! rust-rdkafka's `ThreadedProducer` polls them on a thread of its own, which then has to
//! wake the pipeline for every batch of reports: two thread hops between the broker's answer
//! and the ack, and a thread's wake-ups per request. Here librdkafka calls [`queue_nonempty`]
//! when its reply queue gets an event while empty, and a task polls the queue dry.
//!
//! The crate's only `unsafe` code: rdkafka wraps this hook for consumers, not for producers.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::ops::Deref;
use std::ptr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use rdkafka::producer::{BaseProducer, Producer, ProducerContext};
use rdkafka_sys as rdsys;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

/// Most events served in one pass before the task yields to the pipeline.
const EVENTS_PER_PASS: usize = 256;

/// A producer whose reply queue wakes a [`Notify`]; dropped, it stops the task serving it
/// and unhooks the queue before the producer itself goes.
pub struct Served<C: ProducerContext> {
    task: AbortHandle,
    wakeup: Wakeup,
    producer: BaseProducer<C>,
}

impl<C: ProducerContext> Drop for Served<C> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<C: ProducerContext> Deref for Served<C> {
    type Target = BaseProducer<C>;

    fn deref(&self) -> &BaseProducer<C> {
        &self.producer
    }
}

/// librdkafka's reply queue with the callback set, and the `Notify` it fires.
struct Wakeup {
    queue: *mut rdsys::RDKafkaQueue,
    /// What the hook's opaque pointer points at, alive until the hook is unhooked.
    _notify: Arc<Notify>,
}

// SAFETY: librdkafka's queue handles may be used from any thread (it is thread-safe
// throughout); `Notify` is Sync.
unsafe impl Send for Wakeup {}
// SAFETY: as above.
unsafe impl Sync for Wakeup {}

/// Called by librdkafka, on one of its threads, when the reply queue gets an event while empty.
unsafe extern "C" fn queue_nonempty(_client: *mut rdsys::RDKafka, opaque: *mut c_void) {
    // SAFETY: `opaque` is the `Notify` of a `Wakeup`, which unhooks this callback (under the
    // queue's lock, so no call is running) before it lets the `Notify` go.
    let notify = unsafe { &*(opaque as *const Notify) };
    notify.notify_one();
}

impl Drop for Wakeup {
    fn drop(&mut self) {
        // SAFETY: `queue` is the handle `serve` took; unhooked first, it is destroyed once.
        unsafe {
            rdsys::rd_kafka_queue_cb_event_enable(self.queue, None, ptr::null_mut());
            rdsys::rd_kafka_queue_destroy(self.queue);
        }
    }
}

impl<C: ProducerContext> Served<C> {
    /// Events waiting in the reply queue.
    fn pending(&self) -> usize {
        // SAFETY: the handle lives as long as `self`.
        unsafe { rdsys::rd_kafka_queue_length(self.wakeup.queue) }
    }
}

/// Hooks `producer`'s reply queue and spawns the task that serves it on the current runtime,
/// until the last `Arc` of the producer is gone.
pub fn serve<C: ProducerContext + 'static>(producer: BaseProducer<C>) -> Arc<Served<C>> {
    let notify = Arc::new(Notify::new());
    // SAFETY: the client outlives the handle: `Served` drops `wakeup` before `producer`.
    let queue = unsafe { rdsys::rd_kafka_queue_get_main(producer.client().native_ptr()) };
    // SAFETY: `notify` outlives the hook (see `queue_nonempty`).
    unsafe {
        rdsys::rd_kafka_queue_cb_event_enable(
            queue,
            Some(queue_nonempty),
            Arc::as_ptr(&notify) as *mut c_void,
        );
    }
    // Events queued before the hook fire nothing.
    notify.notify_one();
    Arc::new_cyclic(|served| Served {
        task: tokio::spawn(poll_reports(Weak::clone(served), Arc::clone(&notify))).abort_handle(),
        wakeup: Wakeup {
            queue,
            _notify: notify,
        },
        producer,
    })
}

async fn poll_reports<C: ProducerContext>(producer: Weak<Served<C>>, notify: Arc<Notify>) {
    loop {
        notify.notified().await;
        let Some(producer) = producer.upgrade() else {
            return;
        };
        for _ in 0..EVENTS_PER_PASS {
            if producer.pending() == 0 {
                break;
            }
            producer.poll(Duration::ZERO);
        }
        // A queue left non-empty fires no callback: come back after the pipeline's turn.
        if producer.pending() > 0 {
            notify.notify_one();
            tokio::task::yield_now().await;
        }
    }
}
