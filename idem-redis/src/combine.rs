//! Coalescing on a standalone connection: the commands of calls that arrive
//! while earlier ones are still on the wire wait together, and go as one
//! pipeline (one write, one read, one reply buffer) when a lane comes free.
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
//! There is no timer. While at most [`ALONE`] calls are under way, a call
//! goes at once, alone, exactly as without coalescing. Above that, every
//! call waits, and at most [`LANES`] pipelines are on the wire at once: the
//! next lane free takes every call waiting then (at most [`MAX_BATCH`]), so
//! that pipelines grow with the load. A pipeline runs in a task of its own,
//! so that a caller whose future is dropped while its pipeline is on the
//! wire stops no other call's command; a call dropped while it waits is
//! never sent.

use std::sync::atomic::{AtomicUsize, Ordering};
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

/// How many pipelines of waiting calls may be on the wire at once.
pub(crate) const LANES: usize = 2;

/// What a call sends: one command, or a pipeline of its own (sent as one
/// round trip, its replies in order).
#[derive(Clone, Copy)]
pub(crate) enum Send<'a> {
    One(&'a Cmd),
    Many(&'a Pipeline, usize),
}

impl Send<'_> {
    fn replies(&self) -> usize {
        match self {
            Self::One(_) => 1,
            Self::Many(_, n) => *n,
        }
    }
}

/// A call waiting for a lane.
struct Waiter {
    cmds: Vec<Cmd>,
    answer: oneshot::Sender<RedisResult<Vec<Value>>>,
}

/// The calls waiting on one connection, and how many of its lanes are busy.
pub(crate) struct Combiner {
    waiting: Mutex<Vec<Waiter>>,
    /// Pipelines of waiting calls on the wire.
    busy: AtomicUsize,
    lanes: usize,
    /// Calls under way (alone, waiting, or in a pipeline).
    callers: AtomicUsize,
    /// Above this many calls under way, every call waits.
    alone: usize,
}

impl std::fmt::Debug for Combiner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Combiner")
            .field("lanes", &self.lanes)
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
            busy: AtomicUsize::new(0),
            lanes: LANES,
            callers: AtomicUsize::new(0),
            alone,
        }))
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, Vec<Waiter>> {
        // Every operation under the lock leaves the list whole.
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a lane if one is free.
    fn take_lane(&self) -> bool {
        self.busy
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| {
                (b < self.lanes).then_some(b + 1)
            })
            .is_ok()
    }

    /// Gives a lane back, and starts the next pipeline if calls wait.
    fn give_lane(self: &Arc<Self>, manager: &ConnectionManager) {
        self.busy.fetch_sub(1, Ordering::SeqCst);
        self.kick(manager);
    }

    /// Starts a pipeline of the waiting calls if any wait and a lane is
    /// free.
    fn kick(self: &Arc<Self>, manager: &ConnectionManager) {
        if self.waiting().is_empty() || !self.take_lane() {
            return;
        }
        let (me, manager) = (Arc::clone(self), manager.clone());
        tokio::spawn(async move { me.drain(manager).await });
    }

    /// Holding a lane: sends the waiting calls as one pipeline, answers
    /// them, and goes on while calls wait.
    async fn drain(self: Arc<Self>, mut manager: ConnectionManager) {
        loop {
            let batch: Vec<Waiter> = {
                let mut w = self.waiting();
                w.retain(|q| !q.answer.is_closed());
                let n = w.len().min(MAX_BATCH);
                w.drain(..n).collect()
            };
            if batch.is_empty() {
                self.give_lane(&manager);
                return;
            }
            let mut pipe = Pipeline::with_capacity(batch.iter().map(|q| q.cmds.len()).sum());
            let mut counts = Vec::with_capacity(batch.len());
            for q in &batch {
                counts.push(q.cmds.len());
                for c in &q.cmds {
                    pipe.add_command(c.clone());
                }
            }
            record_batch(BACKEND, "command", batch.len(), true);
            let n = pipe.len();
            match manager.send_packed_commands(&pipe, 0, n).await {
                Ok(replies) => {
                    let mut replies = replies.into_iter();
                    for (q, k) in batch.into_iter().zip(counts) {
                        let mine: Vec<Value> = replies.by_ref().take(k).collect();
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
    }

    /// Sends `call` on `manager`: at once if a lane is free, else with the
    /// next pipeline. Its replies in order, error replies included as
    /// values.
    pub(crate) async fn send(
        self: &Arc<Self>,
        manager: &ConnectionManager,
        call: Send<'_>,
    ) -> RedisResult<Vec<Value>> {
        let _caller = Caller::new(&self.callers);
        if self.callers.load(Ordering::Relaxed) <= self.alone {
            record_batch(BACKEND, "command", 1, false);
            return match call {
                Send::One(cmd) => manager
                    .clone()
                    .send_packed_command(cmd)
                    .await
                    .map(|v| vec![v]),
                Send::Many(pipe, n) => manager.clone().send_packed_commands(pipe, 0, n).await,
            };
        }
        let cmds = match call {
            Send::One(cmd) => vec![cmd.clone()],
            Send::Many(pipe, _) => pipe.cmd_iter().cloned().collect(),
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
