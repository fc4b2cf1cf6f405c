//! Reading a delivery's body within bounds, so that neither large bodies nor
//! slow ones can take the process down:
//! - each body is cut at its provider's limit (413), a declared length over
//!   it before anything is read;
//! - the bytes held by all bodies being read at once are bounded by one
//!   semaphore; a chunk that would go over it answers 503 with Retry-After
//!   (the Git host, or Setpoint's redelivery, sends it again);
//! - a body must arrive within the read deadline (408), so a client that
//!   sends half a body holds nothing for longer;
//! - the GitHub signature is computed chunk by chunk as the body arrives.

use std::sync::Arc;
use std::time::Duration;

use actix_web::web;
use futures::StreamExt as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::WebhookError;
use super::signature::GitHubVerifier;

/// A body read whole, with its share of the in-flight bytes: given back
/// when the body is dropped, once the delivery is handled.
pub(crate) struct Body {
    pub bytes: web::Bytes,
    _permit: Option<OwnedSemaphorePermit>,
}

/// The bytes all requests may hold while their bodies are read.
#[derive(Clone)]
pub(crate) struct InFlight {
    permits: Arc<Semaphore>,
    limit: usize,
}

impl InFlight {
    pub fn new(limit: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(limit.min(Semaphore::MAX_PERMITS))),
            limit,
        }
    }

    /// The bytes held now, for tests.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.limit.min(Semaphore::MAX_PERMITS) - self.permits.available_permits()
    }

    fn take(
        &self,
        held: &mut Option<OwnedSemaphorePermit>,
        bytes: usize,
    ) -> Result<(), WebhookError> {
        let busy = || WebhookError::Busy { limit: self.limit };
        let n = u32::try_from(bytes).map_err(|_| busy())?;
        let permit = self
            .permits
            .clone()
            .try_acquire_many_owned(n)
            .map_err(|_| busy())?;
        match held {
            Some(held) => held.merge(permit),
            None => *held = Some(permit),
        }
        Ok(())
    }
}

/// Reads `payload` up to `limit` bytes by `deadline`, feeding `verifier`.
pub(crate) async fn read(
    mut payload: web::Payload,
    declared: Option<u64>,
    limit: usize,
    in_flight: &InFlight,
    deadline: (Instant, Duration),
    mut verifier: Option<&mut GitHubVerifier>,
) -> Result<Body, WebhookError> {
    let mut held = None;
    // Sized once when the length is declared (and allowed): the pages are
    // only touched as the bytes arrive.
    let capacity = declared.map_or(0, |len| len.min(limit as u64) as usize);
    let mut bytes = web::BytesMut::with_capacity(capacity);
    loop {
        let chunk = match tokio::time::timeout_at(deadline.0, payload.next()).await {
            Err(_) => return Err(WebhookError::ReadTimeout(deadline.1)),
            Ok(None) => break,
            Ok(Some(chunk)) => chunk.map_err(|err| WebhookError::ReadBody(err.to_string()))?,
        };
        if bytes.len() + chunk.len() > limit {
            return Err(WebhookError::TooLarge { limit });
        }
        in_flight.take(&mut held, chunk.len())?;
        if let Some(verifier) = verifier.as_mut() {
            verifier.update(&chunk);
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Body {
        bytes: bytes.freeze(),
        _permit: held,
    })
}
