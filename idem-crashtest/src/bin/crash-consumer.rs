//! One crash-test consumer (issue 19): pulls a JetStream durable consumer
//! one message at a time and handles each through `idem-consumer`'s NATS
//! adapter, until it is killed. Its stdout is the protocol the parent reads,
//! one line per event:
//!
//! * `ready`: connected, the store open;
//! * `run <message> <attempt> <recovery 0|1> <downstream key>`: the work
//!   really started (every run of it, so the parent counts them);
//! * `stop <point>`: it stopped dead at the point `IDEM_CRASH_STOP_AT`
//!   names, to be SIGKILLed there; it never gets further;
//! * `settled <message> <cause> <ack|retry|dead-letter> <attempt>
//!   <recovery 0|1> <retry after ms>`: the broker was told.
//!
//! Two kinds of work, by `IDEM_CRASH_BACKEND`:
//!
//! * store-backed (`sqlite:<file>`, `postgres:<url>#<schema>`,
//!   `redis:<url>#<prefix>`): `NatsConsumer::handle`; the work calls the
//!   loopback "provider" stub at `IDEM_CRASH_STUB` with its downstream key
//!   (the side effect). Stop point `after-call`.
//! * the transactional inbox (`inbox:<url>#<schema>`):
//!   `process_in_tx`, then `NatsConsumer::settle`; the work inserts a row
//!   into `<schema>.effects` on the transaction's connection. Stop points
//!   `before-commit` (after the insert) and `after-commit` (before the ack).
//!
//! `IDEM_CRASH_BROKEN=1` breaks the work on purpose, so the parent can show
//! its checks catch it: the store-backed work adds the process id to its
//! downstream key (two effects after a recovery), and the inbox writes its
//! row outside the transaction (it survives the rollback).
//!
//! The parent migrates the Postgres schema (and makes `effects`) itself, so
//! a child never waits on the locks another one holds.

use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use futures_util::StreamExt;
use idem_consumer::nats::{NatsConsumer, message_key};
use idem_consumer::{Consumer, Disposition, Processed};
use idem_core::store::Store;
use idem_core::{Attempt, Idem, InFlightMode, Outcome, Policy};
use idem_crashtest::inbound::{call_stub, stop_here};
use idem_crashtest::{backend, num, var};
use idem_postgres::PgStore;
use idem_postgres::sqlx;

type Out = Outcome<String, String>;

/// The settings, from the environment.
struct Config {
    backend: String,
    nats_url: String,
    stream: String,
    durable: String,
    lease: Duration,
    stop_at: String,
    stub: String,
    broken: bool,
}

impl Config {
    fn from_env() -> Result<Self, String> {
        Ok(Self {
            backend: var("IDEM_CRASH_BACKEND")?,
            nats_url: var("IDEM_NATS_URL")?,
            stream: var("IDEM_CRASH_STREAM")?,
            durable: var("IDEM_CRASH_DURABLE")?,
            lease: Duration::from_millis(num("IDEM_CRASH_LEASE_MS")?),
            stop_at: std::env::var("IDEM_CRASH_STOP_AT").unwrap_or_default(),
            stub: std::env::var("IDEM_CRASH_STUB").unwrap_or_default(),
            broken: std::env::var("IDEM_CRASH_BROKEN").is_ok_and(|v| v == "1"),
        })
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let cfg: &'static Config = Box::leak(Box::new(Config::from_env()?));
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let client = async_nats::connect(&cfg.nats_url)
        .await
        .map_err(|x| e(&x))?;
    let js = jetstream::new(client);
    let pull: jetstream::consumer::Consumer<pull::Config> = js
        .get_stream(&cfg.stream)
        .await
        .map_err(|x| e(&x))?
        .get_consumer(&cfg.durable)
        .await
        .map_err(|x| e(&x))?;
    let policy = Policy::builder()
        .lease(cfg.lease)
        .in_flight(InFlightMode::Reject)
        .build()
        .map_err(|x| e(&x))?;
    if let Some(rest) = cfg.backend.strip_prefix("inbox:") {
        let (url, schema) = rest.split_once('#').ok_or("inbox:<url>#<schema>")?;
        let store = backend::postgres(url, schema).await?;
        return inbox(cfg, &pull, Idem::new(store).with_policy(policy), schema).await;
    }
    let store = backend::open(&cfg.backend, false).await?;
    store_backed(cfg, &pull, Idem::new(store).with_policy(policy)).await
}

fn consumer<S: Store>(idem: Idem<S>) -> Result<NatsConsumer<S>, String> {
    let consumer = Consumer::builder(idem)
        .owner("crash-consumers")
        .operation("effect")
        .retry_backoff(Duration::from_millis(500), Duration::from_secs(2))
        .retry_jitter(false)
        .build()
        .map_err(|e| e.to_string())?;
    Ok(NatsConsumer::new(consumer))
}

/// The next message: one at a time, so a stopped child holds no pull
/// request the server could hand a redelivery to.
async fn next(
    pull: &jetstream::consumer::Consumer<pull::Config>,
) -> Result<jetstream::Message, String> {
    loop {
        let mut batch = pull
            .fetch()
            .max_messages(1)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .map_err(|e| e.to_string())?;
        if let Some(msg) = batch.next().await {
            return msg.map_err(|e| e.to_string());
        }
    }
}

fn flag(b: bool) -> u8 {
    u8::from(b)
}

fn settled(key: &str, p: &Processed<String, String>) {
    let (action, after) = match p.disposition {
        Disposition::Ack => ("ack", 0),
        Disposition::Retry { after } => ("retry", after.as_millis()),
        _ => ("dead-letter", 0),
    };
    println!(
        "settled {key} {} {action} {} {} {after}",
        p.cause,
        p.attempt,
        flag(p.recovery)
    );
}

/// Store-backed: the adapter's `handle`; the work calls the stub with its
/// downstream key.
async fn store_backed<S: Store>(
    cfg: &'static Config,
    pull: &jetstream::consumer::Consumer<pull::Config>,
    idem: Idem<S>,
) -> Result<(), String> {
    let nats = consumer(idem)?;
    println!("ready");
    loop {
        let msg = next(pull).await?;
        let (key, _) = message_key(&msg).map_err(|e| e.to_string())?;
        let k = key.clone();
        let p: Processed<String, String> = nats
            .handle(&msg, move |attempt: Attempt| async move {
                let mut dk = attempt.downstream_key("provider", 1);
                if cfg.broken {
                    dk = format!("{dk}.{}", std::process::id());
                }
                println!(
                    "run {k} {} {} {dk}",
                    attempt.number(),
                    flag(attempt.is_recovery())
                );
                if let Err(e) = call_stub(&cfg.stub, &dk).await {
                    return Out::Transient(e);
                }
                stop_here(&cfg.stop_at, "after-call").await;
                Out::Success(format!("effect {dk}"))
            })
            .await
            .map_err(|e| e.to_string())?;
        settled(&key, &p);
    }
}

/// The transactional inbox: the effect row, the claim and the outcome
/// commit together; the ack follows the commit.
async fn inbox(
    cfg: &'static Config,
    pull: &jetstream::consumer::Consumer<pull::Config>,
    idem: Idem<PgStore>,
    schema: &str,
) -> Result<(), String> {
    let pool = idem.store().pool().clone();
    let nats = consumer(idem)?;
    let insert = format!("INSERT INTO \"{schema}\".effects (message, attempt) VALUES ($1, $2)");
    let insert: &'static str = Box::leak(insert.into_boxed_str());
    println!("ready");
    loop {
        let msg = next(pull).await?;
        let (key, delivered) = message_key(&msg).map_err(|e| e.to_string())?;
        let (k, pool) = (key.clone(), pool.clone());
        let p: Processed<String, String> = nats
            .consumer()
            .delivery(delivered)
            .process_in_tx(&key, &msg.payload, move |attempt: Attempt, conn| {
                Box::pin(async move {
                    let dk = attempt.downstream_key("provider", 1);
                    println!(
                        "run {k} {} {} {dk}",
                        attempt.number(),
                        flag(attempt.is_recovery())
                    );
                    let number = i32::try_from(attempt.number()).unwrap_or(i32::MAX);
                    let query = sqlx::query(sqlx::AssertSqlSafe(insert))
                        .bind(&k)
                        .bind(number);
                    let written = if cfg.broken {
                        query.execute(&pool).await
                    } else {
                        query.execute(&mut *conn).await
                    };
                    if let Err(e) = written {
                        return Out::Transient(e.to_string());
                    }
                    stop_here(&cfg.stop_at, "before-commit").await;
                    Out::Success("effect".to_owned())
                })
            })
            .await;
        if p.ran() {
            stop_here(&cfg.stop_at, "after-commit").await;
        }
        let p = nats.settle(&msg, p).await.map_err(|e| e.to_string())?;
        settled(&key, &p);
    }
}
