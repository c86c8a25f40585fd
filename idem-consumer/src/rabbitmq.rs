//! The RabbitMQ adapter: [`RabbitConsumer::handle`] processes one
//! [`Delivery`] (manual acknowledgement mode) and settles it per its
//! [`Disposition`].
//!
//! | `Disposition` | AMQP 0.9.1 |
//! |---|---|
//! | `Ack` | `basic.ack` |
//! | `Retry { after }` | `basic.nack` with `requeue`, sent `after` later (the delivery is held unacknowledged meanwhile) |
//! | `DeadLetter { reason }` | `basic.reject` without `requeue`: the queue's dead-letter exchange (`x-dead-letter-exchange`) receives it |
//!
//! **Why a held nack for the delay**, rather than a retry queue with a
//! message TTL that dead-letters back: it needs no topology, works on every
//! queue type, and the message never leaves the broker's hands (a republish
//! to a retry queue followed by an ack is two steps, and a crash between
//! them duplicates it). The cost: a held message counts against the
//! channel's prefetch until its nack, and a delay must stay below the
//! broker's `consumer_timeout` (30 min by default; the backoff caps at
//! 5 min). If the consumer dies meanwhile, RabbitMQ redelivers at once,
//! which idem makes harmless (in flight, then a replay or a recovery).
//!
//! * **Key**: the `message_id` property; else the header named with
//!   [`RabbitConsumer::key_header`]. A message with neither cannot be
//!   deduplicated and goes to the dead letter (`InvalidMessage`).
//! * **Delivery count** (for the backoff): quorum queues' `x-delivery-count`
//!   header plus one; else 2 when `redelivered`, 1 otherwise.

use std::fmt;
use std::future::Future;

/// The AMQP client this adapter is built on, re-exported so that an
/// application names the same version ([`Delivery`], the declare and
/// consume options, `Connection`) without adding it to its own manifest.
pub use lapin;

use idem_core::store::Store;
use idem_core::{Attempt, Outcome, Storable};
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use lapin::types::AMQPValue;
use tracing::warn;

use crate::{Consumer, Disposition, Processed};

/// Why [`RabbitConsumer::handle`] could not settle a delivery.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RabbitError {
    /// `basic.ack` or `basic.reject` failed (the channel closed): RabbitMQ
    /// redelivers the message, which is then a replay (or in flight).
    #[error("settling the delivery failed")]
    Settle(#[source] lapin::Error),
}

/// The RabbitMQ adapter around a [`Consumer`]. Cheap to clone.
pub struct RabbitConsumer<S: Store> {
    consumer: Consumer<S>,
    key_header: Option<String>,
}

adapter_impls!(RabbitConsumer { consumer, key_header } hooks {});

impl<S: Store> RabbitConsumer<S> {
    /// The adapter, keyed on the `message_id` property.
    #[must_use]
    pub fn new(consumer: Consumer<S>) -> Self {
        Self {
            consumer,
            key_header: None,
        }
    }

    /// The header that keys a message without a `message_id` property
    /// (e.g. `"event-id"`).
    #[must_use]
    pub fn key_header(mut self, name: impl Into<String>) -> Self {
        self.key_header = Some(name.into());
        self
    }

    /// The core consumer.
    #[must_use]
    pub fn consumer(&self) -> &Consumer<S> {
        &self.consumer
    }

    /// The key of `delivery`: its `message_id`, else the key header; `None`
    /// without either.
    #[must_use]
    pub fn message_key(&self, delivery: &Delivery) -> Option<String> {
        let from_property = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str().to_owned());
        let from_header = || {
            let name = self.key_header.as_deref()?;
            let headers = delivery.properties.headers().as_ref()?;
            match headers.inner().get(name)? {
                AMQPValue::LongString(s) => {
                    Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
                }
                AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
                _ => None,
            }
        };
        from_property.or_else(from_header).filter(|k| !k.is_empty())
    }

    /// Processes `delivery` once per consumer group and settles it per its
    /// disposition (see the [module docs](self)). A retry's nack is sent by
    /// a spawned task after the delay; this returns at once.
    ///
    /// # Errors
    ///
    /// [`RabbitError::Settle`] when the ack or the reject failed (the
    /// processing stands; RabbitMQ redelivers).
    pub async fn handle<T, E, O, F, Fut>(
        &self,
        delivery: &Delivery,
        work: F,
    ) -> Result<Processed<T, E>, RabbitError>
    where
        T: Storable,
        E: Storable + fmt::Debug,
        O: Into<Outcome<T, E>>,
        F: FnOnce(Attempt) -> Fut + Send,
        Fut: Future<Output = O> + Send,
    {
        let processed = match self.message_key(delivery) {
            Some(key) => {
                self.consumer
                    .delivery(delivery_count(delivery))
                    .process(&key, &delivery.data, work)
                    .await
            }
            None => {
                warn!(
                    routing_key = %delivery.routing_key,
                    "message without message_id or key header: dead letter"
                );
                Processed::keyless()
            }
        };
        match processed.disposition {
            Disposition::Ack => {
                delivery
                    .acker
                    .ack(BasicAckOptions::default())
                    .await
                    .map_err(RabbitError::Settle)?;
            }
            Disposition::Retry { after } => {
                let acker = delivery.acker.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    let requeue = BasicNackOptions {
                        multiple: false,
                        requeue: true,
                    };
                    if let Err(e) = acker.nack(requeue).await {
                        warn!(error = %e, "delayed nack failed: RabbitMQ redelivers when the channel closes");
                    }
                });
            }
            Disposition::DeadLetter { reason } => {
                warn!(%reason, "dead letter: rejected to the queue's dead-letter exchange");
                delivery
                    .acker
                    .reject(BasicRejectOptions { requeue: false })
                    .await
                    .map_err(RabbitError::Settle)?;
            }
        }
        Ok(processed)
    }
}

/// The broker's delivery count: `x-delivery-count` + 1 (quorum queues),
/// else from the `redelivered` flag.
fn delivery_count(delivery: &Delivery) -> u32 {
    let header = delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get("x-delivery-count"))
        .and_then(|v| match v {
            AMQPValue::LongLongInt(n) => u32::try_from(*n).ok(),
            AMQPValue::LongInt(n) => u32::try_from(*n).ok(),
            AMQPValue::LongUInt(n) => Some(*n),
            AMQPValue::ShortInt(n) => u32::try_from(*n).ok(),
            _ => None,
        });
    match header {
        Some(n) => n.saturating_add(1),
        None if delivery.redelivered => 2,
        None => 1,
    }
}
