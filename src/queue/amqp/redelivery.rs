//! A message that crashes its worker must not loop. Unacknowledged when its
//! worker dies (a crash, an OOM kill, a SIGKILL), a delivery goes back to its
//! shard and to the next active consumer, which would die the same way.
//!
//! Quorum shards count the deliveries that came back themselves: the broker
//! sets `x-delivery-count` on each redelivery, and at `max_deliveries` the
//! event is parked (its reason in `x-setpoint-error`) instead of reaching the
//! worker; nothing is republished (`admit_counted`).
//!
//! Classic shards only flag a delivery as `redelivered`. So the count
//! travels in the message itself, header `x-setpoint-deliveries`: before a
//! redelivered event reaches the worker, a copy with the count plus one is
//! published (confirmed) through the events exchange, which hashes it to the
//! same shard, and the original is acknowledged; the copy is what the worker
//! then reconciles. At `max_deliveries` the event goes to the parking queue
//! instead, with the reason in `x-setpoint-error`. An event acknowledged
//! normally is gone with its count; its retry copies and the next events of
//! its Application start from zero.
//!
//! The copy keeps the shard, hence one consumer at a time for its
//! Application; it is queued behind the events that came meanwhile, which is
//! harmless since each reconcile converges on the current state. A worker
//! killed between the confirm and the ack leaves both copies: a duplicate
//! reconcile, never a loss. A delivery given back on purpose (a graceful stop
//! with deliveries waiting, a shard handoff) is also flagged `redelivered`
//! and counts as well, hence a limit of a few deliveries, not one.

use std::sync::Arc;

use lapin::Channel;
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::BasicAckOptions;
use lapin::types::{AMQPValue, FieldTable};

use super::acker::give_back_later;
use super::connection::RECONNECT_MAX;
use super::publish::{message_properties, routing_key};
use super::{DELIVERIES_HEADER, Shared};
use crate::event::Event;

/// What becomes of an event delivered to this consumer, before the worker
/// sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Admission {
    /// Its first delivery: to the worker.
    Deliver,
    /// Delivered `n` times without an acknowledgement: publish a copy that
    /// says so, acknowledge this one.
    Count(u32),
    /// Delivered `n` times without an acknowledgement, and `n` is the limit:
    /// park it.
    Park(u32),
}

/// `previous`: the deliveries without an acknowledgement that the message
/// carries (its header, 0 when absent); a `redelivered` message adds the
/// one that brought it back.
pub(super) fn admit(redelivered: bool, previous: u32, max_deliveries: u32) -> Admission {
    if !redelivered {
        return Admission::Deliver;
    }
    let deliveries = previous.saturating_add(1);
    if deliveries >= max_deliveries {
        Admission::Park(deliveries)
    } else {
        Admission::Count(deliveries)
    }
}

/// The same decision on a quorum shard, which counted the deliveries that
/// came back (`x-delivery-count`, absent on the first delivery): nothing
/// to republish, so below the limit it goes to the worker as it is.
pub(super) fn admit_counted(returned: u32, max_deliveries: u32) -> Admission {
    if returned >= max_deliveries {
        Admission::Park(returned)
    } else {
        Admission::Deliver
    }
}

/// The header a quorum queue counts the deliveries that came back in.
pub(super) const BROKER_COUNT_HEADER: &str = "x-delivery-count";

/// The parked message's reason.
pub(super) fn parked_reason(deliveries: u32) -> String {
    format!(
        "delivered {deliveries} times without being acknowledged: the worker crashed or was \
         killed while reconciling it"
    )
}

/// The count a message carries.
pub(super) fn deliveries(headers: Option<&FieldTable>) -> u32 {
    count(headers, DELIVERIES_HEADER)
}

/// A whole-number header, 0 when absent or not a number.
pub(super) fn count(headers: Option<&FieldTable>, header: &str) -> u32 {
    let value = headers.and_then(|headers| headers.inner().get(header));
    match value {
        Some(AMQPValue::LongUInt(n)) => *n,
        Some(AMQPValue::LongLongInt(n)) => u32::try_from(*n).unwrap_or(u32::MAX),
        Some(AMQPValue::LongInt(n)) => u32::try_from(*n).unwrap_or(0),
        Some(AMQPValue::ShortUInt(n)) => u32::from(*n),
        Some(AMQPValue::ShortShortUInt(n)) => u32::from(*n),
        _ => 0,
    }
}

/// Carries out a `Count` or a `Park`; what it cannot publish (the broker
/// refuses) is given back after a while, uncounted, and comes back here.
pub(super) async fn count_or_park(
    shared: &Arc<Shared>,
    channel: &Channel,
    delivery: AmqpDelivery,
    event: &Event,
    admission: Admission,
) {
    let published = match admission {
        Admission::Deliver => return,
        Admission::Count(n) => {
            tracing::warn!(
                app = %event.app,
                event = %event.id,
                deliveries = n,
                "an event came back unacknowledged (its worker crashed or was killed); counting it"
            );
            let mut headers = FieldTable::default();
            headers.insert(DELIVERIES_HEADER.into(), AMQPValue::LongUInt(n));
            let properties = message_properties(event).with_headers(headers);
            shared
                .send(
                    &shared.names.events,
                    &routing_key(event),
                    &delivery.data,
                    properties,
                )
                .await
        }
        Admission::Park(n) => {
            let reason = parked_reason(n);
            tracing::error!(app = %event.app, event = %event.id, reason, "parking event");
            shared.park(&delivery.data, Some(event), &reason).await
        }
    };
    match published {
        Ok(()) => {
            let _ = delivery.acker.ack(BasicAckOptions::default()).await;
        }
        Err(error) => {
            tracing::warn!(%error, app = %event.app, "failed to count a redelivery, giving it back");
            give_back_later(delivery.acker, channel.clone(), RECONNECT_MAX, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_delivery_goes_to_the_worker_whatever_it_carries() {
        assert_eq!(admit(false, 0, 3), Admission::Deliver);
        // A copy that was counted: its own first delivery.
        assert_eq!(admit(false, 2, 3), Admission::Deliver);
    }

    #[test]
    fn redeliveries_are_counted_then_parked_at_the_limit() {
        // Three deliveries killed their worker: the first (no header), then
        // the copies counted 1 and 2.
        assert_eq!(admit(true, 0, 3), Admission::Count(1));
        assert_eq!(admit(true, 1, 3), Admission::Count(2));
        assert_eq!(admit(true, 2, 3), Admission::Park(3));
        // Beyond it (a copy of an older limit), never back to the worker.
        assert_eq!(admit(true, 7, 3), Admission::Park(8));
        assert_eq!(admit(true, u32::MAX, 3), Admission::Park(u32::MAX));
        // A limit of one parks the first redelivery.
        assert_eq!(admit(true, 0, 1), Admission::Park(1));
    }

    #[test]
    fn a_quorum_shards_count_parks_at_the_limit_without_copies() {
        assert_eq!(admit_counted(0, 3), Admission::Deliver);
        assert_eq!(admit_counted(2, 3), Admission::Deliver);
        assert_eq!(admit_counted(3, 3), Admission::Park(3));
        assert_eq!(admit_counted(9, 3), Admission::Park(9));
        let mut headers = FieldTable::default();
        headers.insert(BROKER_COUNT_HEADER.into(), AMQPValue::LongLongInt(2));
        assert_eq!(count(Some(&headers), BROKER_COUNT_HEADER), 2);
    }

    #[test]
    fn the_count_is_read_from_the_header() {
        assert_eq!(deliveries(None), 0);
        let mut headers = FieldTable::default();
        assert_eq!(deliveries(Some(&headers)), 0);
        headers.insert(DELIVERIES_HEADER.into(), AMQPValue::LongUInt(2));
        assert_eq!(deliveries(Some(&headers)), 2);
        headers.insert(DELIVERIES_HEADER.into(), AMQPValue::LongLongInt(4));
        assert_eq!(deliveries(Some(&headers)), 4);
        headers.insert(DELIVERIES_HEADER.into(), AMQPValue::LongString("x".into()));
        assert_eq!(deliveries(Some(&headers)), 0);
    }

    #[test]
    fn the_reason_says_what_happened() {
        assert_eq!(
            parked_reason(3),
            "delivered 3 times without being acknowledged: the worker crashed or was killed \
             while reconciling it"
        );
    }
}
