//! The log: `SETPOINT_LOG` is the filter (default `warn`);
//! `SETPOINT_LOG_FORMAT=json` writes one JSON object per line, with the spans
//! (Application, event, delivery) on each; otherwise text, for people.
//!
//! Values that come with a request reach it through
//! `ingest::webhook::untrusted::Untrusted`.

use tracing::Subscriber;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

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
                .finish(),
        )
    } else {
        Box::new(builder.with_ansi(ansi).finish())
    }
}
