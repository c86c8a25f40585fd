//! Coalescing: claims and completions that arrive while every connection of
//! the store's own pool is busy wait in a queue of their kind, and the next
//! connection that comes free takes all of them (at most [`MAX_BATCH`], one
//! per record) as one batch: one transaction, one commit, or one statement
//! where the dialect has one ([`Dialect::claim_batch`],
//! [`Dialect::complete_batch`]).
//!
//! There is no timer. A call that finds a connection free goes at once,
//! alone, as it would without coalescing; only calls that would have waited
//! for a connection anyway wait together. Every call of a batch gets the
//! answer it would get alone: a batch that fails as a whole (a statement the
//! server refused, a lock wait, a race lost inside it) is rolled back and
//! its calls run one by one on the same connection; only a batch whose
//! connection broke answers every call with the error.
//!
//! While the store is busy (more claims and completions under way than its
//! pool has connections, or than [`Dialect::busy_above`] says), those calls
//! all queue, and at most a quarter of the pool's connections run batches
//! at once ([`Queues::lanes`]): the
//! others' calls gather in the queue meanwhile, so batches grow with the
//! load instead of each connection that comes free taking the one or two
//! calls that arrived since. Below that load nothing changes: a call that
//! finds a connection free goes alone.
//!
//! A batch runs in a task of its own, so that a caller whose future is
//! dropped while its batch is in flight stops no other call's statement:
//! its claim, if the batch made it, stays in flight until its lease ends,
//! exactly as a dropped single call's does.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use idem_core::RecordId;
use idem_core::clock::Timestamp;
use idem_core::store::{
    CLAIM_RACE_TRIES, ClaimOutcome, ClaimRequest, Claimed, Completion, OwnedCompletion, Previous,
    StoreError, StoredRecord, Token, record_batch,
};
use idem_core::store::{Coalescing, Fingerprint};
use sqlx::{ColumnIndex, Database, Decode, Type};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot};
use tracing::debug;

use crate::conns::Judged;
use crate::pool::{Conn, ConnectionError, Pool};
use crate::store::{DbConnection, Dialect, SqlCore, record_key};

/// The most calls one batch takes.
pub const MAX_BATCH: usize = 128;

/// A claim as it waits in the queue (owning what [`ClaimRequest`]
/// borrows).
pub(crate) struct ClaimCall {
    id: RecordId,
    fingerprint: Fingerprint,
    token: Token,
    now: Timestamp,
    lease_until: Timestamp,
    key_expires_at: Timestamp,
}

impl ClaimCall {
    fn of(req: &ClaimRequest<'_>) -> Self {
        Self {
            id: req.id.clone(),
            fingerprint: req.fingerprint,
            token: req.token,
            now: req.now,
            lease_until: req.lease_until,
            key_expires_at: req.key_expires_at,
        }
    }

    fn request(&self) -> ClaimRequest<'_> {
        ClaimRequest::new(
            &self.id,
            self.fingerprint,
            self.token,
            self.now,
            self.lease_until,
            self.key_expires_at,
        )
    }
}

/// A completion as it waits in the queue.
pub(crate) struct CompleteCall {
    id: RecordId,
    token: Token,
    completion: OwnedCompletion,
}

impl CompleteCall {
    fn of(id: &RecordId, token: Token, c: &Completion<'_>) -> Self {
        Self {
            id: id.clone(),
            token,
            completion: OwnedCompletion::of(c),
        }
    }
}

/// One completion of a batch, as [`Dialect::complete_batch`] reads it.
#[derive(Debug, Clone, Copy)]
pub struct BatchCompletion<'a> {
    /// The record.
    pub id: &'a RecordId,
    /// The fencing token the completion holds.
    pub token: Token,
    /// What it stores.
    pub completion: Completion<'a>,
}

/// A dialect whose claim statement returns the record's row, claimed or
/// standing, for a batch as for one claim: each row is settled as alone
/// ([`SettleClaim::settle`]); the dialect says how its row reads and how it
/// takes a record over.
pub trait SettleClaim: Dialect {
    /// The attempt when `row` is this claim's own insert (the claim won),
    /// `None` when it holds a standing record.
    ///
    /// # Errors
    ///
    /// A column that does not decode.
    fn won(
        &self,
        req: &ClaimRequest<'_>,
        row: &<Self::Db as Database>::Row,
    ) -> Result<Option<u32>, Self::Error>;

    /// The standing record `row` holds, as the claim sees it at `req.now`.
    ///
    /// # Errors
    ///
    /// A column that does not decode, or a row of another identity.
    fn standing(
        &self,
        req: &ClaimRequest<'_>,
        row: &<Self::Db as Database>::Row,
    ) -> Result<StoredRecord, Self::Error>;

    /// Takes over exactly the version of `record` that `row` holds (a
    /// claimable record; `expired`: its key expired, and the claim starts
    /// over at attempt 1): the new attempt and the resource id it carries
    /// on, or `None` when the takeover lost a race.
    fn take_over(
        &self,
        conn: &mut DbConnection<Self>,
        req: &ClaimRequest<'_>,
        row: &<Self::Db as Database>::Row,
        record: &StoredRecord,
        expired: bool,
    ) -> impl Future<Output = Result<Option<(u32, Option<String>)>, Self::Error>> + Send;

    /// The claim's answer from the row its statement returned for it: won,
    /// the standing record, or (claimable) the takeover of exactly the
    /// version read; `None` when the takeover lost a race.
    ///
    /// A takeover reports the state it read (an expired key starts over:
    /// attempt 1, no previous attempt). A holder whose lease ended may
    /// release meanwhile: where the release changes a column the takeover
    /// is fenced on, the takeover loses and the claim runs again (and reads
    /// `Released`); otherwise the reason reads `LeaseExpired`, the cautious
    /// answer (the work reconciles either way).
    fn settle(
        &self,
        conn: &mut DbConnection<Self>,
        req: &ClaimRequest<'_>,
        row: &<Self::Db as Database>::Row,
    ) -> impl Future<Output = Result<Option<ClaimOutcome>, Self::Error>> + Send {
        async move {
            if let Some(attempt) = self.won(req, row)? {
                let previous = None;
                return Ok(Some(ClaimOutcome::Claimed(Claimed { attempt, previous })));
            }
            let record = self.standing(req, row)?;
            let reason = record.takeover_reason(&req.fingerprint, req.now);
            let expired = record.is_expired(req.now);
            if !expired && reason.is_none() {
                return Ok(Some(ClaimOutcome::Existing(record)));
            }
            let took = self.take_over(conn, req, row, &record, expired).await?;
            let Some((attempt, resource_id)) = took else {
                return Ok(None);
            };
            let previous = reason.filter(|_| attempt > 1).map(|reason| Previous {
                reason,
                resource_id,
            });
            Ok(Some(ClaimOutcome::Claimed(Claimed { attempt, previous })))
        }
    }

    /// The answers of a batch's claims `reqs`, in order, from the `rows`
    /// their statement returned, each settled ([`SettleClaim::settle`]) on
    /// `conn`; `None` for a claim no row names. `keys` are the claims'
    /// record keys ([`record_key`]).
    ///
    /// # Errors
    ///
    /// The first settlement's, or [`RowError::Corrupt`](crate::RowError)
    /// for a row of none of the batch's records.
    fn settle_batch(
        &self,
        conn: &mut DbConnection<Self>,
        reqs: &[ClaimRequest<'_>],
        keys: &[[u8; 16]],
        rows: &[<Self::Db as Database>::Row],
    ) -> impl Future<Output = Result<Vec<Option<ClaimOutcome>>, Self::Error>> + Send
    where
        Self::Error: From<crate::RowError>,
        &'static str: ColumnIndex<<Self::Db as Database>::Row>,
        for<'r> Vec<u8>: Decode<'r, Self::Db> + Type<Self::Db>,
    {
        async move {
            let mut answers = vec![None; reqs.len()];
            for row in rows {
                let at = crate::batch_position(row, keys)?;
                answers[at] = self.settle(&mut *conn, &reqs[at], row).await?;
            }
            Ok(answers)
        }
    }
}

/// A call waiting for its batch.
pub(crate) struct Queued<R, A> {
    seq: u64,
    key: [u8; 16],
    call: R,
    answer: oneshot::Sender<A>,
    /// Told when a batch takes the call, so that its caller stops waiting
    /// for a connection it no longer needs.
    taken: Arc<Notify>,
}

impl<R, A> Queued<R, A> {
    fn answer(self, a: A) {
        // The caller may be gone (its future dropped): nobody to tell.
        let _ = self.answer.send(a);
    }
}

/// The calls of one kind waiting for a connection, oldest first.
pub(crate) struct Queue<R, A> {
    waiting: Mutex<Waiting<R, A>>,
}

struct Waiting<R, A> {
    next: u64,
    calls: VecDeque<Queued<R, A>>,
}

impl<R, A> Default for Queue<R, A> {
    fn default() -> Self {
        Self {
            waiting: Mutex::new(Waiting {
                next: 0,
                calls: VecDeque::new(),
            }),
        }
    }
}

impl<R, A> Queue<R, A> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting<R, A>> {
        // A panic while holding the lock leaves the queue as it was between
        // two whole operations: it stays usable.
        self.waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `call` on the record whose key is `key`: its place, where its
    /// answer comes, and what tells it a batch took it.
    fn push(&self, key: [u8; 16], call: R) -> (u64, oneshot::Receiver<A>, Arc<Notify>) {
        let (answer, told) = oneshot::channel();
        let taken = Arc::new(Notify::new());
        let mut w = self.lock();
        let seq = w.next;
        w.next += 1;
        w.calls.push_back(Queued {
            seq,
            key,
            call,
            answer,
            taken: Arc::clone(&taken),
        });
        (seq, told, taken)
    }

    /// Takes at most `max` waiting calls, oldest first, at most one per
    /// record (a second call on a record waits for the next batch, so that
    /// one batch never writes a row twice), skipping calls whose caller is
    /// gone; of those, the oldest `fit(n)` (at least one). Sorted by key,
    /// so that two batches take their row locks in the same order and never
    /// deadlock on each other.
    fn take(&self, max: usize, fit: impl Fn(usize) -> usize) -> Vec<Queued<R, A>> {
        let mut w = self.lock();
        let mut batch: Vec<Queued<R, A>> = Vec::new();
        let mut kept = VecDeque::new();
        while let Some(q) = w.calls.pop_front() {
            if q.answer.is_closed() {
                continue;
            }
            if batch.len() == max || batch.iter().any(|b| b.key == q.key) {
                kept.push_back(q);
            } else {
                batch.push(q);
            }
        }
        let n = fit(batch.len()).clamp(1, batch.len().max(1));
        while batch.len() > n {
            if let Some(q) = batch.pop() {
                kept.push_front(q);
            }
        }
        w.calls = kept;
        drop(w);
        for q in &batch {
            // A stored wake-up if its caller is not waiting right now.
            q.taken.notify_one();
        }
        batch.sort_unstable_by_key(|q| q.key);
        batch
    }

    /// Whether the call at `seq` still waits in the queue.
    fn holds(&self, seq: u64) -> bool {
        self.lock().calls.iter().any(|q| q.seq == seq)
    }

    /// Takes the call at `seq` out of the queue; whether it was still
    /// there (not yet taken into a batch).
    fn withdraw(&self, seq: u64) -> bool {
        let mut w = self.lock();
        let before = w.calls.len();
        w.calls.retain(|q| q.seq != seq);
        w.calls.len() != before
    }
}

/// A lane of `lanes` (none to wait for without them), within the pool's
/// checkout wait: a lane is the first half of a batch's checkout, and a
/// caller that waits for one (while the lanes' batches hang on a server
/// that stopped answering, say) fails as a checkout that waited too long
/// would.
async fn lane(
    lanes: Option<&Arc<Semaphore>>,
    wait: Option<std::time::Duration>,
) -> Result<Option<OwnedSemaphorePermit>, sqlx::Error> {
    let Some(lanes) = lanes else { return Ok(None) };
    let acquire = Arc::clone(lanes).acquire_owned();
    let acquired = match wait {
        Some(wait) => tokio::time::timeout(wait, acquire)
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?,
        None => acquire.await,
    };
    // The semaphore is never closed.
    acquired.map(Some).map_err(|_| sqlx::Error::PoolClosed)
}

/// A claim's answer.
type ClaimAnswer = Result<ClaimOutcome, StoreError>;
/// A completion's answer.
type CompleteAnswer = Result<(), StoreError>;

/// The queues of one store (shared by its clones).
#[derive(Default)]
pub(crate) struct Queues {
    claims: Queue<ClaimCall, ClaimAnswer>,
    completions: Queue<CompleteCall, CompleteAnswer>,
    /// The claims and completions under way on the coalescing path (alone,
    /// waiting, or in a batch).
    callers: AtomicUsize,
    /// The batches that may run at once ([`Dialect::batch_lanes`]).
    lanes: OnceLock<Arc<Semaphore>>,
}

impl Queues {
    /// The lanes, `n` of them (made on the first batch).
    fn lanes(&self, n: impl FnOnce() -> usize) -> Arc<Semaphore> {
        let lanes = self
            .lanes
            .get_or_init(|| Arc::new(Semaphore::new(n().max(1))));
        Arc::clone(lanes)
    }
}

/// One claim or completion under way on the coalescing path, counted in
/// [`Queues::callers`] until it ends or its future is dropped.
struct Caller<'a>(&'a Queues);

impl<'a> Caller<'a> {
    fn new(queues: &'a Queues) -> Self {
        queues.callers.fetch_add(1, Ordering::Relaxed);
        Self(queues)
    }
}

impl Drop for Caller<'_> {
    fn drop(&mut self) {
        self.0.callers.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The store's own pool.
type OwnPool<D> = Pool<DbConnection<D>>;
/// A checkout of it.
type OwnConn<D> = Conn<DbConnection<D>>;

/// Where a coalescing store sends a call ([`SqlCore::route`]).
enum Route<'a, D: Dialect> {
    /// Alone, on this free connection.
    Alone(OwnConn<D>),
    /// To the queue, to go with the next batch on this pool.
    Queue(&'a OwnPool<D>),
}

/// `Err` of a batch call as its caller sees it, with the verdict on the
/// connection.
type Judgement<D> = Judged<<D as Dialect>::Error>;

impl<D: Dialect> SqlCore<D> {
    /// Where a call of kind `call` goes: `None` when coalescing is off or
    /// the store runs on the user's pool (the caller runs it on its own
    /// checkout); a free connection of the store's own pool, taken now, to
    /// run it alone on (under [`Coalescing::WhenBusy`], while the calls
    /// under way are no more than the pool's connections); or the queue.
    async fn route(&self, call: &'static str) -> Option<Result<Route<'_, D>, StoreError>> {
        let own = match self.coalescing {
            Coalescing::Off => return None,
            Coalescing::WhenBusy | Coalescing::Always => self.connections().own_pool()?,
        };
        let busy =
            self.queues.callers.load(Ordering::Relaxed) > self.dialect().busy_above(own.max_size());
        if self.coalescing == Coalescing::WhenBusy && !busy {
            match own.try_get().await {
                Ok(Some(conn)) => {
                    record_batch(D::BACKEND, call, 1, false);
                    return Some(Ok(Route::Alone(conn)));
                }
                Ok(None) => {}
                Err(e) => return Some(Err(D::checkout_error(e).into())),
            }
        }
        Some(Ok(Route::Queue(own)))
    }

    /// The claim, coalesced if coalescing is on: `None` when it is off (the
    /// caller runs it on its own checkout).
    pub(crate) async fn claim_coalesced(
        &self,
        req: &ClaimRequest<'_>,
    ) -> Option<Result<ClaimOutcome, StoreError>> {
        let _caller = Caller::new(&self.queues);
        Some(match self.route("claim").await? {
            Err(e) => Err(e),
            Ok(Route::Alone(mut conn)) => self.claim_alone(&mut conn, req).await,
            Ok(Route::Queue(own)) => {
                let call = ClaimCall::of(req);
                self.queued(own, &self.queues.claims, record_key(req.id), call)
                    .await
            }
        })
    }

    /// The completion, coalesced if coalescing is on: `None` when it is
    /// off.
    pub(crate) async fn complete_coalesced(
        &self,
        id: &RecordId,
        token: Token,
        completion: &Completion<'_>,
    ) -> Option<Result<(), StoreError>> {
        let _caller = Caller::new(&self.queues);
        Some(match self.route("complete").await? {
            Err(e) => Err(e),
            Ok(Route::Alone(mut conn)) => {
                self.complete_alone(&mut conn, id, token, completion).await
            }
            Ok(Route::Queue(own)) => {
                let call = CompleteCall::of(id, token, completion);
                self.queued(own, &self.queues.completions, record_key(id), call)
                    .await
            }
        })
    }

    /// Queues `call` and waits for its answer. While it waits, it also waits
    /// for a connection; whoever gets one first takes every call waiting in
    /// the queue (its own too, unless another batch took it) and runs them
    /// as one batch in a task of its own. A caller whose call another batch
    /// took stops waiting for a connection at once: without that, every
    /// such caller checked a connection out only to find the queue empty,
    /// one wasted checkout per call taken.
    async fn queued<R, A>(
        &self,
        own: &OwnPool<D>,
        queue: &Queue<R, Result<A, StoreError>>,
        key: [u8; 16],
        call: R,
    ) -> Result<A, StoreError>
    where
        R: Batched<D, Answer = A>,
        A: Send + 'static,
    {
        let lost = || StoreError::Unavailable {
            backend: D::BACKEND,
            source: "the batch this call was in ended without an answer".into(),
        };
        let (seq, mut told, taken) = queue.push(key, call);
        // Under `Always` (tests) every call queues, and batches run on as
        // many connections as are free, as they would without a bound.
        let lanes = (self.coalescing == Coalescing::WhenBusy).then(|| {
            self.queues
                .lanes(|| self.dialect().batch_lanes(own.max_size()))
        });
        loop {
            let lane = tokio::select! {
                biased;
                answer = &mut told => return answer.unwrap_or_else(|_| Err(lost())),
                // Taken into another caller's batch: nothing to wait for.
                () = taken.notified() => break,
                lane = lane(lanes.as_ref(), own.acquire_wait()) => lane,
            };
            let lane = match lane {
                Ok(lane) => lane,
                // As a checkout that waited too long: a lane is part of it.
                Err(e) if queue.withdraw(seq) => return Err(D::checkout_error(e).into()),
                Err(_) => break,
            };
            let conn = tokio::select! {
                biased;
                answer = &mut told => return answer.unwrap_or_else(|_| Err(lost())),
                () = taken.notified() => break,
                conn = own.get() => conn,
            };
            let conn = match conn {
                Ok(conn) => conn,
                Err(e) if queue.withdraw(seq) => return Err(D::checkout_error(e).into()),
                // Taken into a batch already: its answer comes.
                Err(_) => break,
            };
            let batch = queue.take(MAX_BATCH, |n| self.dialect().batch_len(n));
            if !batch.is_empty() {
                record_batch(D::BACKEND, R::CALL, batch.len(), true);
                let run = run(self.clone(), conn, batch, lane);
                match tokio::runtime::Handle::try_current() {
                    Ok(runtime) => drop(runtime.spawn(run)),
                    Err(_) => run.await,
                }
            }
            if !queue.holds(seq) {
                break;
            }
        }
        told.await.unwrap_or_else(|_| Err(lost()))
    }

    /// A claim on `conn`, run again after a lost race as on its own
    /// checkout, within [`Dialect::bounded`]. The checks of
    /// [`Dialect::write`] ran in the caller before it took a connection (a
    /// check takes a connection of its own, which a call holding one must
    /// not wait for); a batch's callers ran them before they queued.
    async fn claim_alone(&self, conn: &mut OwnConn<D>, req: &ClaimRequest<'_>) -> ClaimAnswer {
        self.dialect()
            .bounded(async {
                for _ in 0..CLAIM_RACE_TRIES {
                    let once = conn
                        .run(|c| async {
                            self.dialect().claim_once(c, req).await.map_err(judge::<D>)
                        })
                        .await;
                    match once.map_err(|j| j.into_inner().into())? {
                        Some(outcome) => return Ok(outcome),
                        None => debug!("claim lost a race; running it again"),
                    }
                }
                Err(D::contention(CLAIM_RACE_TRIES))
            })
            .await
    }

    /// A completion on `conn`, as on its own checkout.
    async fn complete_alone(
        &self,
        conn: &mut OwnConn<D>,
        id: &RecordId,
        token: Token,
        completion: &Completion<'_>,
    ) -> CompleteAnswer {
        self.dialect()
            .bounded(async {
                let applied = conn
                    .run(|c| async {
                        self.complete_on(c, id, token, completion)
                            .await
                            .map_err(judge::<D>)
                    })
                    .await
                    .map_err(|j| j.into_inner().into())?;
                if applied {
                    Ok(())
                } else {
                    Err(StoreError::LeaseLost)
                }
            })
            .await
    }

    /// A batch that failed as a whole: when its connection is sound (the
    /// server refused a statement and the batch was rolled back), `None`, and
    /// every call runs alone; otherwise the error each call gets (what
    /// reached the server is unknown, as for a single call that lost its
    /// connection).
    fn failed_batch(&self, j: Judgement<D>) -> Option<StoreError> {
        if j.leaves_connection_sound() {
            debug!("a batch failed; its calls run one by one");
            return None;
        }
        let e: StoreError = j.into_inner().into();
        self.dialect().observe(&e);
        Some(e)
    }
}

/// A store call's error, judged by the dialect.
fn judge<D: Dialect>(e: D::Error) -> Judgement<D> {
    Judged::new(e, D::leaves_connection_sound)
}

/// Every call of a batch whose connection broke gets the error: the first
/// the error itself, the others its text.
fn answer_all<R, A>(
    batch: Vec<Queued<R, Result<A, StoreError>>>,
    backend: &'static str,
    e: StoreError,
) {
    let text = e.to_string();
    let mut first = Some(e);
    for q in batch {
        let e = first.take().unwrap_or_else(|| StoreError::Unavailable {
            backend,
            source: text.clone().into(),
        });
        q.answer(Err(e));
    }
}

/// A kind of call that can wait in a batch.
pub(crate) trait Batched<D: Dialect>: Sized + Send + Sync + 'static {
    /// What the call returns.
    type Answer: Send + 'static;
    /// What the batch's statement says of one call.
    type Said: Send;
    /// The call's name in the `idem_store_batch_size` metric.
    const CALL: &'static str;

    /// The batch's statement(s) on `conn`: what they say of each call, in
    /// order.
    fn statement<'a>(
        core: &'a SqlCore<D>,
        conn: &'a mut DbConnection<D>,
        calls: &'a [&'a Self],
    ) -> impl Future<Output = Result<Vec<Self::Said>, D::Error>> + Send + 'a;

    /// The call's answer from what the statement said of it; `None`: the
    /// call runs again alone.
    fn answer(said: Self::Said) -> Option<Result<Self::Answer, StoreError>>;

    /// The call alone on `conn`, as on its own checkout.
    fn alone<'a>(
        &'a self,
        core: &'a SqlCore<D>,
        conn: &'a mut OwnConn<D>,
    ) -> impl Future<Output = Result<Self::Answer, StoreError>> + Send + 'a;
}

/// Runs `batch` on `conn` and answers every call of it: what the batch's
/// statement says, and the calls it leaves open run alone on `conn`; a
/// batch that failed as a whole runs every call alone, or answers every
/// call with the error when its connection broke (see
/// [`SqlCore::failed_batch`]).
async fn run<D: Dialect, R: Batched<D>>(
    core: SqlCore<D>,
    mut conn: OwnConn<D>,
    batch: Vec<Queued<R, Result<R::Answer, StoreError>>>,
    lane: Option<OwnedSemaphorePermit>,
) {
    // The lane is free again when the batch has run.
    let _lane = lane;
    let calls: Vec<&R> = batch.iter().map(|q| &q.call).collect();
    // Bounded like a single call; the checks of `Dialect::write` ran in the
    // callers, before they queued.
    let got = core
        .dialect()
        .bounded(async {
            Ok(conn
                .run(|c| async { R::statement(&core, c, &calls).await.map_err(judge::<D>) })
                .await)
        })
        .await;
    drop(calls);
    let again = match got {
        Ok(Ok(said)) if said.len() == batch.len() => {
            let mut again = Vec::new();
            for (q, said) in batch.into_iter().zip(said) {
                match R::answer(said) {
                    Some(answer) => q.answer(answer),
                    None => again.push(q),
                }
            }
            again
        }
        Ok(Ok(_)) => batch,
        Ok(Err(j)) => match core.failed_batch(j) {
            None => batch,
            Some(e) => return answer_all(batch, D::BACKEND, e),
        },
        Err(e) => return answer_all(batch, D::BACKEND, e),
    };
    for q in again {
        let answer = q.call.alone(&core, &mut conn).await;
        q.answer(answer);
    }
}

impl<D: Dialect> Batched<D> for ClaimCall {
    type Answer = ClaimOutcome;
    type Said = Option<ClaimOutcome>;
    const CALL: &'static str = "claim";

    async fn statement(
        core: &SqlCore<D>,
        conn: &mut DbConnection<D>,
        calls: &[&Self],
    ) -> Result<Vec<Option<ClaimOutcome>>, D::Error> {
        let reqs: Vec<ClaimRequest<'_>> = calls.iter().map(|c| c.request()).collect();
        core.dialect().claim_batch(conn, &reqs).await
    }

    fn answer(said: Option<ClaimOutcome>) -> Option<ClaimAnswer> {
        said.map(Ok)
    }

    async fn alone(&self, core: &SqlCore<D>, conn: &mut OwnConn<D>) -> ClaimAnswer {
        core.claim_alone(conn, &self.request()).await
    }
}

impl<D: Dialect> Batched<D> for CompleteCall {
    type Answer = ();
    type Said = bool;
    const CALL: &'static str = "complete";

    async fn statement(
        core: &SqlCore<D>,
        conn: &mut DbConnection<D>,
        calls: &[&Self],
    ) -> Result<Vec<bool>, D::Error> {
        let items: Vec<BatchCompletion<'_>> = calls
            .iter()
            .map(|c| BatchCompletion {
                id: &c.id,
                token: c.token,
                completion: c.completion.completion(),
            })
            .collect();
        core.dialect().complete_batch(conn, &items).await
    }

    fn answer(applied: bool) -> Option<CompleteAnswer> {
        Some(if applied {
            Ok(())
        } else {
            Err(StoreError::LeaseLost)
        })
    }

    async fn alone(&self, core: &SqlCore<D>, conn: &mut OwnConn<D>) -> CompleteAnswer {
        let c = self.completion.completion();
        core.complete_alone(conn, &self.id, self.token, &c).await
    }
}
