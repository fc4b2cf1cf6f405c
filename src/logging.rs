//! The log: `SETPOINT_LOG` is the filter (default `warn`);
//! `SETPOINT_LOG_FORMAT=json` writes one JSON object per line, with the spans
//! (Application, event, delivery) on each; otherwise text, for people.
//!
//! Values that come with a request reach it through
//! `ingest::webhook::untrusted::Untrusted`.
//!
//! One line of a library is left out whatever the filter: lapin's ERROR for
//! a channel RabbitMQ closed because a queue does not exist (404
//! `NOT_FOUND`). Each process probes, every balance interval, for a shard
//! queue of a larger, older shard count with a passive declare
//! (`queue::amqp::reshard`); when there is none, which is nearly always, the
//! broker answers by closing that probe's channel. The queue code reports
//! the closes that matter itself, with what it was doing.

use std::fmt::Debug;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// The subscriber `main` installs, writing to `writer`.
pub fn subscriber<W>(
    filter: EnvFilter,
    json: bool,
    ansi: bool,
    writer: W,
) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    if json {
        Box::new(
            builder
                .json()
                .with_current_span(true)
                .with_span_list(true)
                .finish()
                .with(MissingQueueCloses),
        )
    } else {
        Box::new(builder.with_ansi(ansi).finish().with(MissingQueueCloses))
    }
}

/// Drops lapin's line for a channel closed over a missing queue (see the
/// module's comment).
struct MissingQueueCloses;

impl<S: Subscriber> Layer<S> for MissingQueueCloses {
    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        if !event.metadata().target().starts_with("lapin::channel") {
            return true;
        }
        let mut close = CloseMethod::default();
        event.record(&mut close);
        !close.missing_queue
    }
}

/// Whether an event's `method` field is a `channel.close` for a missing queue.
#[derive(Default)]
struct CloseMethod {
    missing_queue: bool,
}

impl Visit for CloseMethod {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        if field.name() == "method" {
            let method = format!("{value:?}");
            self.missing_queue = method.starts_with("Close")
                && method.contains("reply_code: 404")
                && method.contains("NOT_FOUND - no queue");
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A log writer that keeps what it is given.
    #[derive(Clone, Default)]
    pub(crate) struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Captured {
        pub(crate) fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The shape of lapin's `channel.close` method, as its event records it.
    #[derive(Debug)]
    #[allow(dead_code)] // read through Debug only
    struct Close {
        reply_code: u16,
        reply_text: &'static str,
    }

    #[test]
    fn a_close_over_a_missing_queue_is_left_out_and_other_closes_are_not() {
        for json in [false, true] {
            let captured = Captured::default();
            let writer = {
                let captured = captured.clone();
                move || captured.clone()
            };
            let subscriber = subscriber(EnvFilter::new("warn"), json, false, writer);
            tracing::subscriber::with_default(subscriber, || {
                let missing = Close {
                    reply_code: 404,
                    reply_text: "NOT_FOUND - no queue 'setpoint.shard.16' in vhost '/'",
                };
                tracing::error!(target: "lapin::channel", channel = 4, method = ?missing, "Channel closed");
                let refused = Close {
                    reply_code: 406,
                    reply_text: "PRECONDITION_FAILED - inequivalent arg 'x-queue-type'",
                };
                tracing::error!(target: "lapin::channel", channel = 6, method = ?refused, "Channel closed");
                tracing::error!(target: "lapin::connection", "connection lost");
                tracing::warn!(target: "setpoint::worker", "NOT_FOUND - no queue, in Setpoint's own words");
            });
            let log = captured.text();
            assert_eq!(log.lines().count(), 3, "{log}");
            assert!(!log.contains("reply_code: 404"), "{log}");
            assert!(log.contains("PRECONDITION_FAILED"), "{log}");
            assert!(log.contains("connection lost"), "{log}");
            assert!(log.contains("in Setpoint's own words"), "{log}");
        }
    }
}
