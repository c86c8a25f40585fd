//! The NATS JetStream adapter: [`NatsConsumer::handle`] processes one
//! [`jetstream::Message`] and acknowledges it per its [`Disposition`].
//!
//! | `Disposition` | JetStream |
//! |---|---|
//! | `Ack` | `double_ack()` (waits for the server's confirmation; a lost ack only causes a replay) |
//! | `Retry { after }` | `ack_with(AckKind::Nak(Some(after)))` |
//! | `DeadLetter { reason }` | the dead-letter hook (e.g. [`publish_dead_letter`]), then `AckKind::Term`; a hook that fails turns it into a Nak, so the message is never lost |
//!
//! * **Key**: the `Nats-Msg-Id` header (it survives a producer's retry past
//!   the stream's `duplicate_window`, which JetStream's own dedup does not);
//!   without it, `"{stream}:{stream_sequence}"`, stable across redeliveries.
//!   The delivery count (for the backoff) is `info.delivered`.
//! * **Long work**: with [`NatsConsumer::progress_every`] (set it to a third
//!   of the consumer's `ack_wait`), the adapter sends `AckKind::Progress`
//!   and extends the idem lease by the policy's lease at that pace while the
//!   work runs, so neither the broker nor idem hands the message to another
//!   consumer.
//! * `max_deliver` on the JetStream consumer bounds the retries.
//! * [`NatsConsumer::run`] loops over a pull consumer's messages with
//!   bounded concurrency and a graceful stop.
//!
//! ```no_run
//! use async_nats::jetstream::{self, consumer::pull};
//! use futures_util::StreamExt;
//! use idem_consumer::Consumer;
//! use idem_consumer::nats::{NatsConsumer, publish_dead_letter};
//! use idem_core::{Failure, Idem, MemoryStore};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let client = async_nats::connect("nats://127.0.0.1:4222").await?;
//! let js = jetstream::new(client);
//! let stream = js.get_stream("ORDERS").await?;
//! let pull = stream
//!     .get_or_create_consumer("billing", pull::Config {
//!         durable_name: Some("billing".to_owned()),
//!         ack_wait: std::time::Duration::from_secs(30),
//!         max_deliver: 10,
//!         ..Default::default()
//!     })
//!     .await?;
//! let consumer = Consumer::builder(Idem::new(MemoryStore::new()))
//!     .owner("billing-service")
//!     .operation("charge-on-order-created")
//!     .build()?;
//! let dlq = js.clone();
//! let nats = NatsConsumer::new(consumer)
//!     .progress_every(std::time::Duration::from_secs(10))
//!     .dead_letter(move |d| publish_dead_letter(dlq.clone(), "dlq", d));
//! let mut messages = pull.messages().await?;
//! while let Some(msg) = messages.next().await {
//!     let msg = msg?;
//!     let payload = msg.payload.clone();
//!     let _ = nats
//!         .handle::<String, String, _, _, _>(&msg, |attempt| async move {
//!             let _ = (attempt.downstream_key("psp", 1), payload);
//!             Ok::<_, Failure<String>>("charged".to_owned())
//!         })
//!         .await;
//! }
//! # Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, AckKind};
use idem_core::store::Store;
use idem_core::{Attempt, Outcome, Storable};
use tracing::{error, warn};

use crate::{Consumer, DeadLetterReason, Disposition, Processed};

/// The header naming why a message was dead-lettered
/// ([`DeadLetterReason::as_str`]), set by [`publish_dead_letter`].
pub const REASON_HEADER: &str = "Idem-Dead-Letter-Reason";

type BoxDynError = Box<dyn std::error::Error + Send + Sync + 'static>;
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type DeadLetterHook = Arc<dyn Fn(DeadLetter) -> BoxFuture<Result<(), BoxDynError>> + Send + Sync>;

/// A message on its way to the dead letter: what the hook receives.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The key the message was processed under (its `Nats-Msg-Id`, or
    /// `stream:sequence`).
    pub message_id: String,
    /// The subject it was published on.
    pub subject: String,
    /// Its payload.
    pub payload: bytes::Bytes,
    /// Its headers.
    pub headers: Option<HeaderMap>,
    /// Why it is dead-lettered.
    pub reason: DeadLetterReason,
}

/// Why [`NatsConsumer::handle`] could not finish a message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsError {
    /// The message has no JetStream metadata (it did not come from a
    /// JetStream consumer); nothing was claimed.
    #[error("not a JetStream message: {0}")]
    NotJetStream(#[source] BoxDynError),
    /// The acknowledgement failed; the message was processed (or not, per
    /// its disposition) and JetStream redelivers it after `ack_wait`, when it
    /// is a replay.
    #[error("acknowledging the message failed")]
    Ack(#[source] BoxDynError),
}

/// The JetStream adapter around a [`Consumer`]. Cheap to clone.
pub struct NatsConsumer<S: Store> {
    consumer: Consumer<S>,
    progress_every: Option<Duration>,
    dead_letter: Option<DeadLetterHook>,
}

adapter_impls!(NatsConsumer { consumer, progress_every } hooks { dead_letter });

impl<S: Store> NatsConsumer<S> {
    /// The adapter, without progress acks or a dead-letter hook (a dead
    /// letter is then only `Term`ed, and logged at `warn`).
    #[must_use]
    pub fn new(consumer: Consumer<S>) -> Self {
        Self {
            consumer,
            progress_every: None,
            dead_letter: None,
        }
    }

    /// Sends `AckKind::Progress` and extends the idem lease (by the
    /// policy's lease) every `every` while the work runs: set it to about a
    /// third of the JetStream consumer's `ack_wait`.
    #[must_use]
    pub fn progress_every(mut self, every: Duration) -> Self {
        self.progress_every = Some(every).filter(|d| !d.is_zero());
        self
    }

    /// Runs `hook` before a message is `Term`ed (e.g. [`publish_dead_letter`]);
    /// when it fails, the message is nak'd instead (with the backoff), so it
    /// is never lost because dead-lettering it failed.
    #[must_use]
    pub fn dead_letter<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(DeadLetter) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), BoxDynError>> + Send + 'static,
    {
        self.dead_letter = Some(Arc::new(move |d| Box::pin(hook(d))));
        self
    }

    /// The core consumer.
    #[must_use]
    pub fn consumer(&self) -> &Consumer<S> {
        &self.consumer
    }

    /// Processes `msg` once per consumer group and acknowledges it per its
    /// disposition (see the [module docs](self)). The returned
    /// [`Processed::disposition`] is the action taken (a dead letter whose
    /// hook failed comes back as the `Retry` that was sent).
    ///
    /// # Errors
    ///
    /// [`NatsError::NotJetStream`] for a message without JetStream metadata
    /// (nothing claimed, nothing run); [`NatsError::Ack`] when the
    /// acknowledgement failed (the processing stands).
    pub async fn handle<T, E, O, F, Fut>(
        &self,
        msg: &jetstream::Message,
        work: F,
    ) -> Result<Processed<T, E>, NatsError>
    where
        T: Storable,
        E: Storable + fmt::Debug,
        O: Into<Outcome<T, E>> + Send,
        F: FnOnce(Attempt) -> Fut + Send,
        Fut: Future<Output = O> + Send,
    {
        let (key, delivered) = message_key(msg)?;
        let lease = self.consumer.idem().policy().lease();
        let every = self.progress_every;
        let work = move |attempt: Attempt| async move {
            let Some(every) = every else {
                let outcome: Outcome<T, E> = work(attempt).await.into();
                return outcome;
            };
            let fut = work(attempt.clone());
            tokio::pin!(fut);
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            loop {
                tokio::select! {
                    out = &mut fut => {
                        let outcome: Outcome<T, E> = out.into();
                        break outcome;
                    }
                    _ = tick.tick() => {
                        if let Err(e) = msg.ack_with(AckKind::Progress).await {
                            warn!(error = %e, "progress ack failed");
                        }
                        if let Err(e) = attempt.extend_lease(lease).await {
                            warn!(error = %e, "lease extension failed");
                        }
                    }
                }
            }
        };
        let processed: Processed<T, E> = self
            .consumer
            .delivery(delivered)
            .process(&key, &msg.payload, work)
            .await;
        self.settle(msg, processed).await
    }

    /// Acknowledges `msg` per `processed.disposition`, as
    /// [`NatsConsumer::handle`] does after its processing: for a
    /// [`Processed`] made some other way, above all by the transactional
    /// inbox (`consumer.delivery(n).process_in_tx(..)`, feature `sql`),
    /// whose disposition must reach JetStream only after its commit.
    /// Returns `processed` with the action taken (a dead letter whose hook
    /// failed comes back as the `Retry` that was sent).
    ///
    /// With the inbox: `let (key, n) = message_key(&msg)?;`, then
    /// `let p = nats.consumer().delivery(n).process_in_tx(&key, &msg.payload,
    /// work).await;` (the effect written on the transaction's connection),
    /// then `nats.settle(&msg, p).await?`: a crash between the commit and
    /// the ack makes the redelivery a replay, and the effect stays applied
    /// once.
    ///
    /// # Errors
    ///
    /// [`NatsError::NotJetStream`] for a message without JetStream metadata
    /// (nothing acknowledged); [`NatsError::Ack`] when the acknowledgement
    /// failed (the processing stands).
    pub async fn settle<T, E>(
        &self,
        msg: &jetstream::Message,
        mut processed: Processed<T, E>,
    ) -> Result<Processed<T, E>, NatsError> {
        let (key, delivered) = message_key(msg)?;
        let ack = match processed.disposition {
            Disposition::Ack => msg.double_ack().await,
            Disposition::Retry { after } => msg.ack_with(AckKind::Nak(Some(after))).await,
            Disposition::DeadLetter { reason } => {
                match self.send_dead_letter(msg, &key, reason).await {
                    Ok(()) => msg.ack_with(AckKind::Term).await,
                    Err(e) => {
                        let after = self.consumer.backoff(delivered);
                        error!(message_id = %key, %reason, error = %e, "dead-letter hook failed: nak instead");
                        processed.disposition = Disposition::Retry { after };
                        msg.ack_with(AckKind::Nak(Some(after))).await
                    }
                }
            }
        };
        ack.map_err(NatsError::Ack)?;
        Ok(processed)
    }

    /// Consumes `messages` (e.g. `pull_consumer.messages().await?`) until
    /// the stream ends or `shutdown` resolves, handling up to `concurrency`
    /// messages at once, each in its own task; then waits for the messages
    /// in hand to finish and be acknowledged (a graceful stop: nothing is
    /// abandoned mid-work). `work` gets the attempt and the payload.
    ///
    /// A message the stream fails to deliver, or one whose acknowledgement
    /// fails, is logged at `warn` and left to JetStream's redelivery.
    /// Returns how many messages were handled.
    pub async fn run<T, E, O, W, Fut, M, ME>(
        &self,
        mut messages: M,
        concurrency: usize,
        shutdown: impl Future<Output = ()> + Send,
        work: W,
    ) -> u64
    where
        T: Storable,
        E: Storable + fmt::Debug,
        O: Into<Outcome<T, E>> + Send + 'static,
        W: Fn(Attempt, bytes::Bytes) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = O> + Send + 'static,
        M: futures_util::Stream<Item = Result<jetstream::Message, ME>> + Unpin + Send,
        ME: fmt::Display,
    {
        use futures_util::StreamExt;

        let slots = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
        let work = Arc::new(work);
        let mut tasks = tokio::task::JoinSet::new();
        let mut handled = 0;
        tokio::pin!(shutdown);
        loop {
            let permit = tokio::select! {
                () = &mut shutdown => break,
                permit = Arc::clone(&slots).acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let next = tokio::select! {
                () = &mut shutdown => break,
                next = messages.next() => next,
            };
            let msg = match next {
                None => break,
                Some(Err(e)) => {
                    warn!(error = %e, "message stream error");
                    continue;
                }
                Some(Ok(msg)) => msg,
            };
            handled += 1;
            let (this, work) = (self.clone(), Arc::clone(&work));
            tasks.spawn(async move {
                let _slot = permit;
                let payload = msg.payload.clone();
                let result: Result<Processed<T, E>, _> =
                    this.handle(&msg, move |a| work(a, payload)).await;
                if let Err(e) = result {
                    warn!(error = %e, "message not settled: left to redelivery");
                }
            });
            while tasks.try_join_next().is_some() {}
        }
        while tasks.join_next().await.is_some() {}
        handled
    }

    async fn send_dead_letter(
        &self,
        msg: &jetstream::Message,
        key: &str,
        reason: DeadLetterReason,
    ) -> Result<(), BoxDynError> {
        let Some(hook) = &self.dead_letter else {
            warn!(message_id = %key, %reason, "dead letter: terminated (no dead-letter hook)");
            return Ok(());
        };
        hook(DeadLetter {
            message_id: key.to_owned(),
            subject: msg.subject.to_string(),
            payload: msg.payload.clone(),
            headers: msg.headers.clone(),
            reason,
        })
        .await
    }
}

/// The key and delivery count of `msg`: its `Nats-Msg-Id`, else
/// `"{stream}:{stream_sequence}"`.
///
/// # Errors
///
/// [`NatsError::NotJetStream`] when the message has no JetStream metadata.
pub fn message_key(msg: &jetstream::Message) -> Result<(String, u32), NatsError> {
    let info = msg.info().map_err(NatsError::NotJetStream)?;
    let delivered = u32::try_from(info.delivered.max(1)).unwrap_or(u32::MAX);
    let header = msg
        .headers
        .as_ref()
        .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
        .map(|v| v.as_str().to_owned())
        .filter(|v| !v.is_empty());
    let key = header.unwrap_or_else(|| format!("{}:{}", info.stream, info.stream_sequence));
    Ok((key, delivered))
}

/// A dead-letter hook: publishes the message to `"{prefix}.{subject}"` on
/// JetStream with its headers, `Nats-Msg-Id: dlq:<key>` and
/// [`REASON_HEADER`], and waits for the stream's acknowledgement (so a
/// subject no stream captures is an error, and the message is nak'd
/// rather than lost).
///
/// # Errors
///
/// The publish or its acknowledgement failing.
pub async fn publish_dead_letter(
    js: jetstream::Context,
    prefix: &str,
    d: DeadLetter,
) -> Result<(), BoxDynError> {
    let mut headers = d.headers.unwrap_or_default();
    // Its own id: `dlq:` + the key. The original's id would be dropped as a
    // duplicate by a stream that captures both subjects (JetStream dedups per
    // stream); this one still dedups a dead letter published twice.
    let id = format!("dlq:{}", d.message_id);
    headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
    headers.insert(REASON_HEADER, d.reason.as_str());
    let subject = format!("{prefix}.{}", d.subject);
    js.publish_with_headers(subject, headers, d.payload)
        .await?
        .await?;
    Ok(())
}
