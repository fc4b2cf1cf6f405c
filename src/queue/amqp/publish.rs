//! Publishing with publisher confirms: events to the shards, failed events
//! to the delay queue of their next attempt, and what cannot go on to the
//! parking queue with the reason in a header.

use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Confirmation};

use super::{ERROR_HEADER, Shared, short, unavailable};
use crate::event::Event;
use crate::queue::QueueError;

/// Parked errors are for a person reading them; the whole chain of a failed
/// apply can be long, and headers travel with every copy of the message.
pub const ERROR_HEADER_MAX_CHARS: usize = 1000;

impl Shared {
    /// Publishes one message and waits for the broker's confirm: an error
    /// unless the broker took responsibility for it.
    pub(super) async fn send(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), QueueError> {
        let link = self.current()?;
        if !link.usable() {
            return Err(QueueError::Unavailable(
                "RabbitMQ blocks publishing (a memory or disk alarm)".into(),
            ));
        }
        let (exchange_name, key) = (short(exchange)?, short(routing_key)?);
        let timeout = self.settings.confirm_timeout;
        let confirmed = async {
            let channel = link
                .publisher()
                .await
                .map_err(|e| unavailable("failed to open a publishing channel", e))?;
            let confirm = channel
                .basic_publish(
                    exchange_name,
                    key,
                    BasicPublishOptions::default(),
                    body,
                    properties,
                )
                .await
                .map_err(|e| unavailable(format!("failed to publish to {exchange}"), e))?;
            match confirm.await {
                Ok(Confirmation::Ack(None)) => Ok(()),
                Ok(Confirmation::Ack(Some(returned))) => Err(QueueError::NotConfirmed(format!(
                    "{exchange} returned the message: {}",
                    returned.reply_text
                ))),
                Ok(Confirmation::Nack(_)) => Err(QueueError::NotConfirmed(format!(
                    "{exchange} nacked the message"
                ))),
                Ok(Confirmation::NotRequested) => Err(QueueError::NotConfirmed(
                    "the publishing channel is not in confirm mode".into(),
                )),
                Err(error) => Err(QueueError::NotConfirmed(format!("{exchange}: {error}"))),
            }
        };
        tokio::time::timeout(timeout, confirmed)
            .await
            .unwrap_or_else(|_| {
                Err(QueueError::NotConfirmed(format!(
                    "no confirm from {exchange} within {timeout:?}"
                )))
            })
    }

    /// Puts a message in the parking queue with its last error.
    pub(super) async fn park(
        &self,
        body: &[u8],
        event: Option<&Event>,
        error: &str,
    ) -> Result<(), QueueError> {
        let mut headers = FieldTable::default();
        headers.insert(
            ERROR_HEADER.into(),
            AMQPValue::LongString(truncate(error).into()),
        );
        let properties = match event {
            Some(event) => message_properties(event),
            None => persistent_json(),
        }
        .with_headers(headers);
        // Through the default exchange: the routing key is the queue's name.
        self.send("", &self.names.parked, body, properties).await
    }

    /// Sends a failed event to wait out the delay of its next attempt, or
    /// parks it when it has none left.
    pub(super) async fn send_retry(&self, event: &Event, error: &str) -> Result<(), QueueError> {
        let max_attempts = self.settings.retry.max_attempts;
        match self
            .names
            .retry(event.attempt)
            .filter(|_| event.attempt < max_attempts)
        {
            Some(delay_queue) => {
                tracing::info!(app = %event.app, attempt = event.attempt, error, "retrying event");
                let properties = message_properties(event);
                self.send(
                    delay_queue,
                    &routing_key(event),
                    &event.to_bytes(),
                    properties,
                )
                .await
            }
            None => {
                tracing::warn!(app = %event.app, attempts = event.attempt, error, "parking event");
                self.park(&event.to_bytes(), Some(event), error).await
            }
        }
    }
}

fn persistent_json() -> BasicProperties {
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
}

pub(super) fn message_properties(event: &Event) -> BasicProperties {
    match ShortString::try_new(event.id.as_str()) {
        Ok(id) => persistent_json().with_message_id(id),
        Err(_) => persistent_json(),
    }
}

/// The Application's `namespace/name`. AMQP routing keys hold 255 bytes and
/// a namespace plus a name can hold more; a longer key is cut (on a char
/// boundary), which keeps it stable, and two Applications sharing the first
/// 255 bytes merely share a shard.
pub(super) fn routing_key(event: &Event) -> String {
    let mut key = event.app.to_string();
    if key.len() > 255 {
        let mut end = 255;
        while !key.is_char_boundary(end) {
            end -= 1;
        }
        key.truncate(end);
    }
    key
}

fn truncate(error: &str) -> String {
    match error.char_indices().nth(ERROR_HEADER_MAX_CHARS) {
        Some((end, _)) => format!("{}…", &error[..end]),
        None => error.to_string(),
    }
}

/// The reason a parked message carries (`ERROR_HEADER`); empty without one.
pub fn error_header(properties: &BasicProperties) -> String {
    let value = properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(ERROR_HEADER));
    match value {
        Some(AMQPValue::LongString(text)) => text.to_string(),
        Some(AMQPValue::ShortString(text)) => text.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{AppKey, Cause};

    #[test]
    fn long_errors_and_keys_are_cut() {
        let error = "é".repeat(5000);
        let cut = truncate(&error);
        assert_eq!(cut.chars().count(), ERROR_HEADER_MAX_CHARS + 1);
        assert_eq!(truncate("short"), "short");

        let long = Event::new(AppKey::new("n".repeat(63), "ü".repeat(200)), Cause::Sweep);
        let key = routing_key(&long);
        assert!(key.len() <= 255 && key.starts_with("nnn"));
        let web = Event::new(AppKey::new("team", "web"), Cause::Sweep);
        assert_eq!(routing_key(&web), "team/web");
    }
}
