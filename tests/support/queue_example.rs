//! What the queue examples' interface tests share (`nats_orders`,
//! `rabbitmq_orders`): the built example as a process read line by line,
//! the SQLite file it writes (`ledger`, `dead_letters`), and the lines'
//! parsing.

use std::{
    io::{BufRead, BufReader, Read},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use idem::sqlite::sqlx::{self, Row, SqlitePool, sqlite::SqliteConnectOptions};
use tokio::sync::mpsc;

use super::TempSqlite;

/// How long any one printed line may take.
pub(crate) const LINE: Duration = Duration::from_secs(30);

/// A running queue example: its stdout line by line; SIGKILLed when dropped.
pub(crate) struct Orders {
    name: String,
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    pub(crate) seen: Vec<String>,
    stderr: Arc<Mutex<String>>,
}

impl Orders {
    /// Starts it and waits (bounded) for its `consuming stream` line.
    pub(crate) fn start(name: &str, features: &str, env: &[(&str, String)]) -> Self {
        let mut child = super::spawn(name, features, env, |cmd| {
            cmd.stdin(Stdio::null());
        });
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut err = child.stderr.take().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    return;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Self {
            name: name.to_owned(),
            child,
            lines,
            seen: Vec::new(),
            stderr,
        }
    }

    /// The next line `pred` accepts, within [`LINE`]; the lines before it are
    /// kept in `seen`.
    pub(crate) async fn wait_for(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + LINE;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => {
                    self.seen.push(line.clone());
                    if pred(&line) {
                        return line;
                    }
                }
                Ok(None) => panic!(
                    "{} exited before {what}: stdout {:?}, stderr {}",
                    self.name,
                    self.seen,
                    self.stderr.lock().unwrap()
                ),
                Err(_) => panic!(
                    "no {what} within {LINE:?}: stdout {:?}, stderr {}",
                    self.seen,
                    self.stderr.lock().unwrap()
                ),
            }
        }
    }

    /// Waits for exactly this line.
    pub(crate) async fn expect(&mut self, line: &str) {
        self.wait_for(&format!("`{line}`"), |l| l == line).await;
    }

    /// The next line about message `id` (any line naming it), which must be
    /// `expected`; lines about other messages are skipped.
    pub(crate) async fn next_about(&mut self, id: &str) -> String {
        self.wait_for(&format!("a line about {id}"), |l| {
            l.split(' ').nth(1) == Some(id)
        })
        .await
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits (bounded) for the process to exit.
    pub(crate) async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} still running after {within:?}: stdout {:?}, stderr {}",
                self.name,
                self.seen,
                self.stderr.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM while the message `id` (just published) is in hand: it
    /// finishes and is acked, then the process says `stopped`; its exit
    /// status.
    pub(crate) async fn terminate_with_in_hand(&mut self, db: &Db, id: &str) -> ExitStatus {
        db.wait_for_ledger_row(id).await;
        self.terminate();
        self.expect(&format!("acked {id} attempt 1 executed")).await;
        self.expect("stopped").await;
        self.wait_exit(LINE).await
    }

    /// SIGTERM.
    pub(crate) fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM {}: {status}", self.pid());
    }

    /// A hard stop (SIGKILL): nothing is flushed, nothing acknowledged.
    /// Returns every line it printed.
    pub(crate) async fn kill(mut self) -> Vec<String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The pipe is closed now: the reader ends, and so does the channel.
        let deadline = tokio::time::Instant::now() + LINE;
        while let Some(line) = tokio::time::timeout_at(deadline, self.lines.recv())
            .await
            .expect("stdout closes after the kill")
        {
            self.seen.push(line);
        }
        std::mem::take(&mut self.seen)
    }
}

impl Drop for Orders {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The SQLite file the example writes, read here; removed (with its WAL)
/// when dropped.
pub(crate) struct Db(TempSqlite);

impl Db {
    pub(crate) fn new(name: &str) -> Self {
        Self(TempSqlite::new(name))
    }

    pub(crate) fn env(&self) -> String {
        self.0.env()
    }

    pub(crate) async fn pool(&self) -> SqlitePool {
        let options = SqliteConnectOptions::new().filename(&self.0.0);
        SqlitePool::connect_with(options).await.unwrap()
    }

    /// `(attempt, recoveries)` of each ledger row of message `id`.
    pub(crate) async fn ledger(&self, id: &str) -> Vec<(i64, i64)> {
        let pool = self.pool().await;
        let rows = sqlx::query("SELECT attempt, recoveries FROM ledger WHERE message_id = ?")
            .bind(id)
            .fetch_all(&pool)
            .await
            .unwrap();
        pool.close().await;
        rows.iter()
            .map(|r| (r.get::<i64, _>(0), r.get::<i64, _>(1)))
            .collect()
    }

    /// The `dead_letters` rows for message `id`, oldest first: (reason,
    /// payload).
    pub(crate) async fn dead_letters(&self, id: &str) -> Vec<(String, String)> {
        let pool = self.pool().await;
        let rows: Vec<(String, Vec<u8>)> = sqlx::query_as(
            "SELECT reason, payload FROM dead_letters WHERE message_id = ? ORDER BY id",
        )
        .bind(id)
        .fetch_all(&pool)
        .await
        .unwrap();
        pool.close().await;
        rows.into_iter()
            .map(|(reason, payload)| (reason, String::from_utf8(payload).unwrap()))
            .collect()
    }

    /// Waits (bounded) until message `id` has a ledger row: its effect is
    /// written, its outcome not necessarily stored.
    pub(crate) async fn wait_for_ledger_row(&self, id: &str) {
        let deadline = Instant::now() + LINE;
        while self.ledger(id).await.is_empty() {
            assert!(Instant::now() < deadline, "no ledger row for {id}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The `<ms>` of a `retry <id> after <ms>` line.
pub(crate) fn retry_ms(line: &str, id: &str) -> u64 {
    let prefix = format!("retry {id} after ");
    line.strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("not a retry of {id}: {line}"))
        .parse()
        .unwrap()
}
