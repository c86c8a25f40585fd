//! A loopback TCP proxy in front of the server: it can drop every
//! connection, refuse new ones, and counts the commands the client sends
//! (MySQL protocol: a packet with sequence id 0 starts a command; its first
//! byte says which), to measure statements and round trips per call.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Client commands seen so far.
#[derive(Debug, Default)]
pub struct Counts {
    /// `COM_STMT_EXECUTE`: one per prepared statement run.
    pub execute: AtomicU64,
    /// `COM_QUERY`: one per text-protocol query (BEGIN, COMMIT, ...).
    pub query: AtomicU64,
    /// `COM_STMT_PREPARE`: statements prepared on the server.
    pub prepare: AtomicU64,
    /// `COM_PING`: sqlx's liveness ping, which it sends when a connection
    /// goes back to the pool (off the caller's path).
    pub ping: AtomicU64,
    /// Any other command that waits for an answer (`COM_STMT_RESET`, ...).
    pub other: AtomicU64,
    /// `COM_STMT_CLOSE`: no answer, so no round trip.
    pub close: AtomicU64,
}

/// A snapshot of [`Counts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Snapshot {
    pub execute: u64,
    pub query: u64,
    pub prepare: u64,
    pub ping: u64,
    pub other: u64,
    pub close: u64,
}

impl Snapshot {
    /// Statements sent: prepared executes plus text queries.
    pub fn statements(&self) -> u64 {
        self.execute + self.query
    }
    /// Round trips the caller waits for: every command that has an answer,
    /// except the release ping.
    pub fn round_trips(&self) -> u64 {
        self.execute + self.query + self.prepare + self.other
    }
}

impl std::ops::Sub for Snapshot {
    type Output = Snapshot;
    fn sub(self, o: Snapshot) -> Snapshot {
        Snapshot {
            execute: self.execute - o.execute,
            query: self.query - o.query,
            prepare: self.prepare - o.prepare,
            ping: self.ping - o.ping,
            other: self.other - o.other,
            close: self.close - o.close,
        }
    }
}

#[derive(Debug)]
pub struct Proxy {
    pub addr: SocketAddr,
    down: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    counts: Arc<Counts>,
    accept: JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.kill_all();
    }
}

impl Proxy {
    /// Listens on 127.0.0.1 (random port), forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("addr");
        let down = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let counts = Arc::new(Counts::default());
        let (d, c, n) = (Arc::clone(&down), Arc::clone(&conns), Arc::clone(&counts));
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if d.load(Ordering::SeqCst) {
                    drop(client); // "server down": the connection is closed at once
                    continue;
                }
                let n = Arc::clone(&n);
                let task = tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    pipe(client, server, n).await;
                });
                c.lock().expect("lock").push(task);
            }
        });
        Self {
            addr,
            down,
            conns,
            counts,
            accept,
        }
    }

    /// Drops every open connection (both sides see the socket close).
    pub fn kill_all(&self) {
        for t in self.conns.lock().expect("lock").drain(..) {
            t.abort();
        }
    }

    /// While down, new connections are closed as soon as they are accepted.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    pub fn snapshot(&self) -> Snapshot {
        let c = &self.counts;
        Snapshot {
            execute: c.execute.load(Ordering::SeqCst),
            query: c.query.load(Ordering::SeqCst),
            prepare: c.prepare.load(Ordering::SeqCst),
            ping: c.ping.load(Ordering::SeqCst),
            other: c.other.load(Ordering::SeqCst),
            close: c.close.load(Ordering::SeqCst),
        }
    }
}

async fn pipe(client: TcpStream, server: TcpStream, counts: Arc<Counts>) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = async move {
        let mut parser = Parser::default();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            parser.feed(&buf[..n], &counts);
            if sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    };
    let down = async move {
        let _ = tokio::io::copy(&mut sr, &mut cw).await;
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

/// Splits the client byte stream into packets (3-byte little-endian length,
/// 1-byte sequence id, payload). The handshake response has sequence id 1;
/// every command starts with sequence id 0.
#[derive(Debug, Default)]
struct Parser {
    buf: Vec<u8>,
}

impl Parser {
    fn feed(&mut self, bytes: &[u8], counts: &Counts) {
        self.buf.extend_from_slice(bytes);
        loop {
            if self.buf.len() < 4 {
                return;
            }
            let len = usize::from(self.buf[0])
                | usize::from(self.buf[1]) << 8
                | usize::from(self.buf[2]) << 16;
            if self.buf.len() < 4 + len {
                return;
            }
            if self.buf[3] == 0 && len > 0 {
                let counter = match self.buf[4] {
                    0x17 => &counts.execute,
                    0x03 => &counts.query,
                    0x16 => &counts.prepare,
                    0x0e => &counts.ping,
                    0x19 => &counts.close,
                    _ => &counts.other,
                };
                counter.fetch_add(1, Ordering::SeqCst);
            }
            self.buf.drain(..4 + len);
        }
    }
}
