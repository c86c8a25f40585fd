//! The AWS Lambda + SQS adapter: [`SqsConsumer::process_batch`] turns an
//! [`SqsEvent`] into the partial batch response Lambda reads
//! ([`SqsBatchResponse`]): the records to redeliver are listed, the others
//! are deleted from the queue.
//!
//! **The event source mapping must have `ReportBatchItemFailures`**:
//! without it Lambda ignores the response and deletes every record of a
//! batch that returned, failed ones included.
//!
//! | `Disposition` | response |
//! |---|---|
//! | `Ack` | not listed (deleted) |
//! | `Retry { after }` | listed: redelivered after the queue's visibility timeout (the response cannot carry `after`) |
//! | `DeadLetter { reason }` | the dead-letter hook runs (e.g. `SendMessage` to a DLQ); not listed when it succeeds, listed when it fails. Without a hook, listed: the queue's redrive policy (`maxReceiveCount`) then moves it to the queue's own DLQ, so a message is never dropped silently |
//!
//! * **Key**: `messageId` (new for every `SendMessage`, so a producer's
//!   retry is a new message); [`SqsKey`] keys on the producer's id instead.
//! * **Order**: one record at a time, in order. The same `messageId` twice
//!   in one batch: the first copy decides, the second is not processed, and
//!   the id is listed at most once (C16).
//! * **FIFO** (the source ARN ends in `.fifo`): after the first record that
//!   gets a retry, no later record is processed; it and every later record
//!   are listed, which keeps each message group in order (C17).
//! * **Valid responses only**: Lambda fails the *whole* batch for an empty
//!   or unknown `itemIdentifier`, so only ids from the event are listed,
//!   each once; a record without a `messageId` is never listed.
//! * Set the idem lease at least to the function's timeout, and `key_ttl`
//!   above the queue's retention.

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use idem_core::store::Store;
use idem_core::{Attempt, Outcome, Storable};
use tracing::{error, warn};

use crate::{Consumer, DeadLetterReason, Disposition, Processed};

type BoxDynError = Box<dyn std::error::Error + Send + Sync + 'static>;
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type DeadLetterHook =
    Arc<dyn Fn(SqsMessage, DeadLetterReason) -> BoxFuture<Result<(), BoxDynError>> + Send + Sync>;

/// What keys a record.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SqsKey {
    /// The record's `messageId` (the default): every `SendMessage` makes a
    /// new one.
    #[default]
    MessageId,
    /// A string message attribute the producer sets (its own event id).
    Attribute(String),
    /// A FIFO queue's `MessageDeduplicationId`.
    DeduplicationId,
    /// A JSON pointer into the body (`/id`); a string or a number.
    BodyPointer(String),
}

/// The SQS adapter around a [`Consumer`]. Cheap to clone.
pub struct SqsConsumer<S: Store> {
    consumer: Consumer<S>,
    key: SqsKey,
    dead_letter: Option<DeadLetterHook>,
}

adapter_impls!(SqsConsumer { consumer, key } hooks { dead_letter });

impl<S: Store> SqsConsumer<S> {
    /// The adapter, keyed on `messageId`, without a dead-letter hook.
    #[must_use]
    pub fn new(consumer: Consumer<S>) -> Self {
        Self {
            consumer,
            key: SqsKey::MessageId,
            dead_letter: None,
        }
    }

    /// What keys a record (default: `messageId`).
    #[must_use]
    pub fn key_from(mut self, key: SqsKey) -> Self {
        self.key = key;
        self
    }

    /// Runs `hook` for a dead letter (e.g. `SendMessage` to a DLQ); the
    /// record is listed for redelivery when it fails.
    #[must_use]
    pub fn dead_letter<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(SqsMessage, DeadLetterReason) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), BoxDynError>> + Send + 'static,
    {
        self.dead_letter = Some(Arc::new(move |m, r| Box::pin(hook(m, r))));
        self
    }

    /// The core consumer.
    #[must_use]
    pub fn consumer(&self) -> &Consumer<S> {
        &self.consumer
    }

    /// Processes every record of `event` (see the [module docs](self)) and
    /// answers with the records to redeliver. `work` gets the attempt and
    /// the record.
    pub async fn process_batch<T, E, O, W, Fut>(&self, event: SqsEvent, work: W) -> SqsBatchResponse
    where
        T: Storable,
        E: Storable + fmt::Debug,
        O: Into<Outcome<T, E>>,
        W: Fn(Attempt, SqsMessage) -> Fut + Send + Sync,
        Fut: Future<Output = O> + Send,
    {
        let mut response = SqsBatchResponse::default();
        let mut seen: HashSet<String> = HashSet::new();
        let mut listed: HashSet<String> = HashSet::new();
        let mut stopped = false;
        for record in event.records {
            let id = record.message_id.clone().filter(|id| !id.is_empty());
            let fifo = record
                .event_source_arn
                .as_deref()
                .is_some_and(|arn| arn.ends_with(".fifo"));
            let mut list = |id: &Option<String>| {
                if let Some(id) = id
                    && listed.insert(id.clone())
                {
                    let mut failure = BatchItemFailure::default();
                    failure.item_identifier = id.clone();
                    response.batch_item_failures.push(failure);
                }
            };
            if stopped {
                list(&id);
                continue;
            }
            if let Some(id) = &id
                && !seen.insert(id.clone())
            {
                continue; // C16: the first copy decided.
            }
            let processed: Processed<T, E> = match self.delivery_of(&record) {
                Some((key, count)) => {
                    let body = record.body.clone().unwrap_or_default();
                    let copy = record.clone();
                    self.consumer
                        .delivery(count)
                        .process(&key, body.as_bytes(), |a| work(a, copy))
                        .await
                }
                None => {
                    warn!(message_id = ?record.message_id, key = ?self.key, "record without its key: dead letter");
                    Processed::keyless()
                }
            };
            let redeliver = match processed.disposition {
                Disposition::Ack => false,
                Disposition::Retry { .. } => {
                    stopped = fifo;
                    true
                }
                Disposition::DeadLetter { reason } => match &self.dead_letter {
                    Some(hook) => match hook(record, reason).await {
                        Ok(()) => false,
                        Err(e) => {
                            error!(message_id = ?id, %reason, error = %e, "dead-letter hook failed: listed for redelivery");
                            true
                        }
                    },
                    None => {
                        warn!(message_id = ?id, %reason, "dead letter without a hook: listed, for the queue's redrive policy");
                        true
                    }
                },
            };
            if redeliver {
                list(&id);
            }
        }
        response
    }

    /// The key of `record` under this adapter's [`SqsKey`], and its
    /// delivery count (`ApproximateReceiveCount`, 1 when absent).
    fn delivery_of(&self, record: &SqsMessage) -> Option<(String, u32)> {
        let key = self.record_key(record)?;
        let count = record
            .attributes
            .get("ApproximateReceiveCount")
            .and_then(|n| n.parse().ok())
            .unwrap_or(1);
        Some((key, count))
    }

    /// The key of `record` under this adapter's [`SqsKey`].
    fn record_key(&self, record: &SqsMessage) -> Option<String> {
        let key = match &self.key {
            SqsKey::MessageId => record.message_id.clone(),
            SqsKey::Attribute(name) => record
                .message_attributes
                .get(name)
                .and_then(|a| a.string_value.clone()),
            SqsKey::DeduplicationId => record.attributes.get("MessageDeduplicationId").cloned(),
            SqsKey::BodyPointer(pointer) => {
                let body: serde_json::Value = serde_json::from_str(record.body.as_deref()?).ok()?;
                match body.pointer(pointer)? {
                    serde_json::Value::String(s) => Some(s.clone()),
                    serde_json::Value::Number(n) => Some(n.to_string()),
                    _ => None,
                }
            }
        };
        key.filter(|k| !k.is_empty())
    }
}
