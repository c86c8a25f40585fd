//! Coalescing on a standalone connection: while the connection is busy, the
//! commands of the calls that arrive go together as one pipeline (one
//! write, one read, one reply buffer).
//!
//! redis-rs's multiplexed connection already shares one socket between
//! every task, but writes each call on its own: at 64 tasks a fresh key is
//! two writes and two reads on each side of the socket, and those system
//! calls are most of what Redis and the client spend on it. Sending the
//! waiting calls as one pipeline changes no answer: the server runs the
//! commands in the order they arrive on the connection, as it did when they
//! were written one by one, and a pipeline is not a transaction (an error
//! reply answers its own command only).
//!
//! There is no timer, and no call waits for another call's reply. While at
//! most [`ALONE`] calls are under way, a call goes at once, alone, exactly
//! as without coalescing. Above that, every call waits in a queue, and one
//! task gathers the queue: each time it runs, it takes every call waiting
//! then (at most [`MAX_BATCH`]), hands them to a task of their own as one
//! pipeline, and yields, so that the calls arriving meanwhile make the next
//! pipeline. Pipelines grow with the load; a pipeline's task answers its
//! calls, so that a caller whose future is dropped while its pipeline is
//! on the wire stops no other call's command. A call dropped while it waits
//! is never sent.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use idem_core::store::{Coalescing, record_batch};
use redis::aio::ConnectionManager;
use redis::{Cmd, Pipeline, RedisResult, Value};
use tokio::sync::oneshot;

use crate::error::BACKEND;

/// The most calls one pipeline takes.
pub(crate) const MAX_BATCH: usize = 128;

/// Up to this many calls under way, a call goes at once, alone
/// ([`Coalescing::WhenBusy`]); above it, every call waits.
pub(crate) const ALONE: usize = 16;

/// What a call sends: one command, or a pipeline of its own (sent as one
/// round trip, its replies in order).
#[derive(Clone, Copy)]
pub(crate) enum Call<'a> {
    One(&'a Cmd),
    Many(&'a Pipeline, usize),
}

impl Call<'_> {
    fn replies(&self) -> usize {
        match self {
            Self::One(_) => 1,
            Self::Many(_, n) => *n,
        }
    }
}

/// A call waiting for the next pipeline.
struct Waiter {
    cmds: Vec<Cmd>,
    answer: oneshot::Sender<RedisResult<Vec<Value>>>,
}

/// The calls waiting on one connection, and whether a task gathers them.
pub(crate) struct Combiner {
    waiting: Mutex<Vec<Waiter>>,
    /// A task gathers the waiting calls into pipelines.
    gathering: AtomicBool,
    /// Calls under way (alone, waiting, or in a pipeline).
    callers: AtomicUsize,
    /// Above this many calls under way, every call waits.
    alone: usize,
}

impl std::fmt::Debug for Combiner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Combiner")
            .field("alone", &self.alone)
            .finish_non_exhaustive()
    }
}

impl Combiner {
    /// The calls of a connection coalesced as `mode` says; `None` for
    /// [`Coalescing::Off`].
    pub(crate) fn new(mode: Coalescing) -> Option<Arc<Self>> {
        let alone = match mode {
            Coalescing::Off => return None,
            Coalescing::WhenBusy => ALONE,
            Coalescing::Always => 0,
        };
        Some(Arc::new(Self {
            waiting: Mutex::new(Vec::new()),
            gathering: AtomicBool::new(false),
            callers: AtomicUsize::new(0),
            alone,
        }))
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, Vec<Waiter>> {
        // Every operation under the lock leaves the list whole.
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts the task that gathers the waiting calls, unless it runs or no
    /// call waits.
    fn kick(self: &Arc<Self>, manager: &ConnectionManager) {
        if self.waiting().is_empty() || self.gathering.swap(true, Ordering::SeqCst) {
            return;
        }
        let (me, manager) = (Arc::clone(self), manager.clone());
        tokio::spawn(async move { me.gather(manager).await });
    }

    /// Sends the waiting calls as one pipeline, in a task of its own, then
    /// yields so that the calls arriving meanwhile make the next one; stops
    /// when none waits.
    async fn gather(self: Arc<Self>, manager: ConnectionManager) {
        loop {
            let batch: Vec<Waiter> = {
                let mut w = self.waiting();
                w.retain(|q| !q.answer.is_closed());
                let n = w.len().min(MAX_BATCH);
                w.drain(..n).collect()
            };
            if batch.is_empty() {
                self.gathering.store(false, Ordering::SeqCst);
                // A call queued after the take above, before the store,
                // found the task running: start it again for that call.
                self.kick(&manager);
                return;
            }
            record_batch(BACKEND, "command", batch.len(), true);
            tokio::spawn(send(manager.clone(), batch));
            tokio::task::yield_now().await;
        }
    }

    /// Sends `call` on `manager`: at once while at most `alone` calls are
    /// under way, else with the next pipeline. Its replies in order, error
    /// replies included as values.
    pub(crate) async fn send(
        self: &Arc<Self>,
        manager: &ConnectionManager,
        call: Call<'_>,
    ) -> RedisResult<Vec<Value>> {
        let _caller = Caller::new(&self.callers);
        if self.callers.load(Ordering::Relaxed) <= self.alone {
            record_batch(BACKEND, "command", 1, false);
            return match call {
                Call::One(cmd) => manager
                    .clone()
                    .send_packed_command(cmd)
                    .await
                    .map(|v| vec![v]),
                Call::Many(pipe, n) => manager.clone().send_packed_commands(pipe, 0, n).await,
            };
        }
        let cmds = match call {
            Call::One(cmd) => vec![cmd.clone()],
            Call::Many(pipe, _) => pipe.cmd_iter().cloned().collect(),
        };
        debug_assert_eq!(cmds.len(), call.replies());
        let (answer, told) = oneshot::channel();
        self.waiting().push(Waiter { cmds, answer });
        self.kick(manager);
        match told.await {
            Ok(answer) => answer,
            // The pipeline's task ended without answering (a panic in it).
            Err(_) => Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "the pipeline carrying this call was lost",
            ))),
        }
    }
}

/// A call under way, counted until it ends or its future is dropped.
struct Caller<'a>(&'a AtomicUsize);

impl<'a> Caller<'a> {
    fn new(callers: &'a AtomicUsize) -> Self {
        callers.fetch_add(1, Ordering::Relaxed);
        Self(callers)
    }
}

impl Drop for Caller<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Sends the commands of `batch` as one pipeline and answers each call with
/// its replies (or every call with the connection's error).
async fn send(mut manager: ConnectionManager, mut batch: Vec<Waiter>) {
    let mut pipe = Pipeline::with_capacity(batch.iter().map(|q| q.cmds.len()).sum());
    let mut counts = Vec::with_capacity(batch.len());
    for q in &mut batch {
        counts.push(q.cmds.len());
        for c in std::mem::take(&mut q.cmds) {
            pipe.add_command(c);
        }
    }
    match manager.send_packed_commands(&pipe, 0, pipe.len()).await {
        Ok(replies) => {
            let mut replies = replies.into_iter();
            for (q, n) in batch.into_iter().zip(counts) {
                let mine: Vec<Value> = replies.by_ref().take(n).collect();
                let _ = q.answer.send(Ok(mine));
            }
        }
        Err(e) => {
            for q in batch {
                let _ = q.answer.send(Err(e.clone()));
            }
        }
    }
}
