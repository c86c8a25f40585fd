//! One crash-test worker: loops over a small, moving key space calling
//! `Idem::execute` on the shared store until it is killed. The work appends
//! `effect <record> <attempt> <downstream key>` to this process's fsynced log
//! (the side effect), lingers a little (a window for SIGKILL between the side
//! effect and the completion), and returns a response unique to this run;
//! every successful reply is logged as
//! `reply <record> <replayed> <stored> <attempt> <response>`. See the crate docs.

use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::store::Store;
use idem_core::{Idem, InFlightMode, Outcome, Policy, Scope};
use idem_crashtest::{DurableLog, WorkerConfig, backend};

/// How long a generation of keys lasts, in milliseconds.
const GENERATION_MS: u128 = 1500;

/// A small random source (no dependency): the process's random hasher keys.
struct Dice(std::collections::hash_map::RandomState, u64);

impl Dice {
    fn below(&mut self, n: u64) -> u64 {
        self.1 += 1;
        self.0.hash_one(self.1) % n.max(1)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let cfg = WorkerConfig::from_env()?;
    let log = DurableLog::create(&cfg.log_dir, cfg.worker).map_err(|e| e.to_string())?;
    let log = Arc::new(Mutex::new(log));
    let policy = Policy::builder()
        .lease(cfg.lease)
        .in_flight(InFlightMode::Reject)
        .store_retries(3, Duration::from_millis(50))
        .build()
        .map_err(|e| e.to_string())?;
    // The store may be restarting: keep trying to connect.
    for _ in 0..200 {
        let opened = open_and_run(&cfg, policy.clone(), &log).await;
        if let Err(e) = opened {
            eprintln!("worker {}: {e}; retrying", cfg.worker);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Err("the store never opened".to_owned())
}

/// Opens the backend (migrated) and runs for ever; returns only if opening
/// failed.
async fn open_and_run(
    cfg: &WorkerConfig,
    policy: Policy,
    log: &Arc<Mutex<DurableLog>>,
) -> Result<(), String> {
    let store = backend::open(&cfg.backend, true).await?;
    run(Idem::new(store).with_policy(policy), cfg, log).await
}

async fn run<S: Store>(
    idem: Idem<S>,
    cfg: &WorkerConfig,
    log: &Arc<Mutex<DurableLog>>,
) -> Result<(), String> {
    let scope = Scope::new("crash", "POST /effects").map_err(|e| e.to_string())?;
    let mut dice = Dice(std::collections::hash_map::RandomState::new(), 0);
    let write = |kind: &str, fields: &[&str]| {
        let mut log = log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // A log that cannot be written proves nothing: stop at once.
        if let Err(e) = log.line(kind, fields) {
            eprintln!("cannot write the log: {e}");
            std::process::abort();
        }
    };
    loop {
        // Fresh keys keep coming: the key space moves on every generation,
        // and the previous one is still visited, so records left in flight
        // by a killed worker are recovered once their lease ends.
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let generation = now_ms / GENERATION_MS - u128::from(dice.below(10) < 3);
        let record = format!("g{generation}-k{:02}", dice.below(cfg.keys.into()));
        let linger = Duration::from_millis(dice.below(80));
        let nonce = dice.below(u64::MAX);
        let broken_key = format!("{:016x}", dice.below(u64::MAX));
        let reply = idem
            .execute(
                &scope,
                record.as_str(),
                &serde_json::json!({ "record": record }),
                |attempt| {
                    let downstream = if cfg.broken {
                        broken_key
                    } else {
                        attempt.downstream_key("effect", 1)
                    };
                    let number = attempt.number().to_string();
                    write("effect", &[&record, &number, &downstream]);
                    let response = format!(
                        "w{}-p{}-a{number}-n{nonce:x}",
                        cfg.worker,
                        std::process::id()
                    );
                    async move {
                        tokio::time::sleep(linger).await;
                        Outcome::<String, String>::Success(response)
                    }
                },
            )
            .await;
        if let Ok(reply) = reply {
            let flag = |b: bool| if b { "1" } else { "0" };
            let response = match reply.outcome() {
                Outcome::Success(r) | Outcome::Failure(r) | Outcome::Transient(r) => r.clone(),
            };
            let attempt = reply.attempt().to_string();
            write(
                "reply",
                &[
                    &record,
                    flag(reply.is_replay()),
                    flag(reply.is_stored()),
                    &attempt,
                    &response,
                ],
            );
        }
        tokio::time::sleep(Duration::from_millis(dice.below(5))).await;
    }
}
