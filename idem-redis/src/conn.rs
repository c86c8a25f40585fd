//! The connection behind a store, and the three ways a call reaches Redis:
//! one command, one pipeline routed to a record's slot, and a script call
//! (`EVALSHA`, reloaded after `NOSCRIPT`), alone or in a pipeline.
//!
//! Commands are built as one [`Cmd`] each, their arguments written straight
//! into its buffer (no [`ScriptInvocation`](redis::ScriptInvocation), which
//! keeps a vector per argument and copies them again into the command).

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ErrorKind, RedisResult, Script, ServerErrorKind, Value};
use tracing::debug;

use std::sync::Arc;

use crate::ack::ReplicaAck;
use crate::combine::{Call, Combiner};

/// The connection behind a store: standalone (reconnecting) or cluster.
#[derive(Clone)]
pub(crate) enum Connection {
    /// With the calls waiting on it, when it coalesces them.
    Standalone(ConnectionManager, Option<Arc<Combiner>>),
    Cluster(ClusterConnection),
}

/// How many times a script call is made when Redis answers `NOSCRIPT`.
///
/// A `SCRIPT FLUSH` or a failover landing between the load and the second
/// `EVALSHA` answers `NOSCRIPT` again. A `NOSCRIPT` reply means the script did
/// not run, so calling again can never apply a transition twice.
const NOSCRIPT_TRIES: u32 = 3;

fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// `EVALSHA <sha> <keys> <key…>` for `script`, its arguments to follow;
/// `capacity` is the expected size of everything written (a hint).
pub(crate) fn evalsha(script: &Script, keys: &[&[u8]], args: usize, capacity: usize) -> Cmd {
    let mut cmd = Cmd::with_capacity(3 + keys.len() + args, 64 + capacity);
    cmd.arg("EVALSHA")
        .arg(script.get_hash())
        .arg(keys.len())
        .arg(keys);
    cmd
}

impl Connection {
    /// One command on the keys of one record (routed by its first key in a
    /// cluster); an error reply is the error.
    pub(crate) async fn command(&self, cmd: &Cmd) -> RedisResult<Value> {
        let v = match self {
            Self::Standalone(c, Some(combiner)) => {
                let mut replies = combiner.send(c, Call::One(cmd)).await?;
                replies.pop().unwrap_or(Value::Nil)
            }
            // The inherent method: `ConnectionLike`'s boxes its future.
            Self::Standalone(c, None) => c.clone().send_packed_command(cmd).await?,
            Self::Cluster(c) => c.clone().req_packed_command(cmd).await?,
        };
        v.extract_error()
    }

    /// Sends `pipe` in one round trip and returns its `n` replies, error
    /// replies included as [`Value::ServerError`]. In a cluster the pipeline
    /// goes to the primary of `key`'s slot (every key of a record shares it,
    /// and a `WAIT` in the pipeline must reach the node that wrote).
    pub(crate) async fn packed(
        &self,
        pipe: &redis::Pipeline,
        key: &[u8],
        n: usize,
    ) -> RedisResult<Vec<Value>> {
        match self {
            Self::Standalone(c, Some(combiner)) => combiner.send(c, Call::Many(pipe, n)).await,
            Self::Standalone(c, None) => c.clone().send_packed_commands(pipe, 0, n).await,
            Self::Cluster(c) => {
                let route = Route::with_key(key, SlotAddr::Master);
                c.clone()
                    .route_pipeline(
                        pipe.clone(),
                        0,
                        n,
                        SingleNodeRoutingInfo::SpecificNode(route),
                    )
                    .await
            }
        }
    }

    /// Loads `script` (on every primary of a cluster).
    async fn load(&self, script: &Script) -> RedisResult<()> {
        let inv = script.prepare_invoke();
        match self {
            Self::Standalone(c, _) => inv.load_async(&mut c.clone()).await?,
            Self::Cluster(c) => inv.load_async(&mut c.clone()).await?,
        };
        Ok(())
    }

    /// After a `NOSCRIPT` answer to try number `tries`: loads `script` for
    /// the next try.
    async fn reload(&self, script: &Script, tries: &mut u32) -> RedisResult<()> {
        debug!(
            tries = *tries,
            "script not loaded on the server (NOSCRIPT): loading it"
        );
        self.load(script).await?;
        *tries += 1;
        Ok(())
    }

    /// Runs `call` (an [`evalsha`] of `script`) after the command `pre`, if
    /// any, and with `ack`, `WAIT` after it, in one pipeline routed like
    /// [`Self::packed`] (a lone call is sent as one command). Returns the
    /// script's reply and `WAIT`'s. An error reply to `pre` is the call's
    /// error. After `NOSCRIPT` the script is loaded and everything sent again
    /// (the script did not run; `pre` must be safe to repeat).
    ///
    /// `WAIT` counts the replicas holding every write made so far *on its
    /// own connection*, so it must follow the script on the same connection
    /// with no reconnection in between: one pipeline gives both (a dropped
    /// connection fails the pair). In a cluster redis-rs would send a lone
    /// `WAIT` to every primary and keep the smallest answer, so the pipeline
    /// is routed explicitly to the slot's primary.
    pub(crate) async fn eval(
        &self,
        script: &Script,
        pre: Option<Cmd>,
        call: Cmd,
        key: &[u8],
        ack: Option<ReplicaAck>,
    ) -> RedisResult<(Value, Option<Value>)> {
        let mut tries = 1;
        if pre.is_none() && ack.is_none() {
            loop {
                match self.command(&call).await {
                    Err(e) if tries < NOSCRIPT_TRIES && is_noscript(&e) => {
                        self.reload(script, &mut tries).await?;
                    }
                    other => return other.map(|v| (v, None)),
                }
            }
        }
        let n_pre = usize::from(pre.is_some());
        let mut pipe = redis::pipe();
        if let Some(pre) = pre {
            pipe.add_command(pre);
        }
        pipe.add_command(call);
        if let Some(ack) = ack {
            pipe.cmd("WAIT").arg(ack.replicas()).arg(ack.timeout_ms());
        }
        let n = n_pre + 1 + usize::from(ack.is_some());
        loop {
            let mut replies = self.packed(&pipe, key, n).await?.into_iter();
            for _ in 0..n_pre {
                if let Some(v) = replies.next() {
                    v.extract_error()?;
                }
            }
            let reply = replies.next().unwrap_or(Value::Nil);
            match reply.extract_error() {
                Err(e) if tries < NOSCRIPT_TRIES && is_noscript(&e) => {
                    self.reload(script, &mut tries).await?;
                }
                Err(e) => return Err(e),
                Ok(reply) => {
                    let wait = replies.next().map(Value::extract_error).transpose()?;
                    return Ok((reply, wait));
                }
            }
        }
    }
}
