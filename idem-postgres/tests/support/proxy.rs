//! A loopback TCP proxy in front of the server: it can drop every
//! connection, refuse new ones, stall every connection (bytes are read but
//! held until it resumes), point new connections at another server, and
//! counts the frontend messages that go through (Execute, simple Query,
//! Sync) and the connections it forwards, to measure statements per call.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Frontend messages seen so far.
#[derive(Debug, Default)]
pub struct Counts {
    /// `E`: one per statement run with the extended protocol.
    pub execute: AtomicU64,
    /// `Q`: one per simple-protocol query string (BEGIN, COMMIT, ...).
    pub query: AtomicU64,
    /// `S` after Parse/Bind/Execute/...: one per extended-protocol round trip.
    pub sync: AtomicU64,
    /// A bare `S` with nothing before it: sqlx's liveness ping, which it
    /// sends when a connection goes back to the pool (off the caller's path).
    pub ping: AtomicU64,
    /// `P`: statements prepared (parsed) on the server.
    pub parse: AtomicU64,
    /// Connections accepted and forwarded.
    pub connections: AtomicU64,
}

/// A snapshot of [`Counts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Snapshot {
    pub execute: u64,
    pub query: u64,
    pub sync: u64,
    pub ping: u64,
    pub parse: u64,
    pub connections: u64,
}

impl Snapshot {
    /// Statements sent: extended executes plus simple queries.
    pub fn statements(&self) -> u64 {
        self.execute + self.query
    }
    /// Round trips: each Sync and each simple query waits for ReadyForQuery.
    pub fn round_trips(&self) -> u64 {
        self.sync + self.query
    }
}

impl std::ops::Sub for Snapshot {
    type Output = Snapshot;
    fn sub(self, o: Snapshot) -> Snapshot {
        Snapshot {
            execute: self.execute - o.execute,
            query: self.query - o.query,
            sync: self.sync - o.sync,
            ping: self.ping - o.ping,
            parse: self.parse - o.parse,
            connections: self.connections - o.connections,
        }
    }
}

#[derive(Debug)]
pub struct Proxy {
    pub addr: SocketAddr,
    down: Arc<AtomicBool>,
    stalled: watch::Sender<bool>,
    upstream: Arc<Mutex<SocketAddr>>,
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
        let stalled = watch::Sender::new(false);
        let upstream = Arc::new(Mutex::new(upstream));
        let (s, u) = (stalled.clone(), Arc::clone(&upstream));
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if d.load(Ordering::SeqCst) {
                    drop(client); // "server down": the connection is closed at once
                    continue;
                }
                n.connections.fetch_add(1, Ordering::SeqCst);
                let n = Arc::clone(&n);
                let gate = s.subscribe();
                let upstream = *u.lock().expect("lock");
                let task = tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    pipe(client, server, n, gate).await;
                });
                c.lock().expect("lock").push(task);
            }
        });
        Self {
            addr,
            down,
            stalled,
            upstream,
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

    /// While stalled, every connection's bytes (both ways) are read and
    /// held, not forwarded: the peers see a silent, open link. Bytes read
    /// after `set_stalled(true)` returns are never forwarded before
    /// `set_stalled(false)`.
    pub fn set_stalled(&self, stalled: bool) {
        self.stalled.send_replace(stalled);
    }

    /// New connections go to `upstream` (open ones keep their server).
    pub fn set_upstream(&self, upstream: SocketAddr) {
        *self.upstream.lock().expect("lock") = upstream;
    }

    pub fn snapshot(&self) -> Snapshot {
        let c = &self.counts;
        Snapshot {
            execute: c.execute.load(Ordering::SeqCst),
            query: c.query.load(Ordering::SeqCst),
            sync: c.sync.load(Ordering::SeqCst),
            ping: c.ping.load(Ordering::SeqCst),
            parse: c.parse.load(Ordering::SeqCst),
            connections: c.connections.load(Ordering::SeqCst),
        }
    }
}

/// Waits while the proxy is stalled; false once the proxy is gone.
async fn open(gate: &mut watch::Receiver<bool>) -> bool {
    gate.wait_for(|stalled| !stalled).await.is_ok()
}

async fn pipe(
    client: TcpStream,
    server: TcpStream,
    counts: Arc<Counts>,
    gate: watch::Receiver<bool>,
) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let mut up_gate = gate.clone();
    let mut down_gate = gate;
    let up = async move {
        let mut parser = Parser::default();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            parser.feed(&buf[..n], &counts);
            if !open(&mut up_gate).await || sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    };
    let down = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if !open(&mut down_gate).await || cw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

/// Splits the frontend byte stream into messages: untyped startup messages
/// first (SSLRequest is answered and followed by the real startup message),
/// then `type byte + i32 length` messages.
#[derive(Debug, Default)]
struct Parser {
    buf: Vec<u8>,
    started: bool,
    /// Extended-protocol messages sent since the last Sync.
    busy: bool,
}

impl Parser {
    fn feed(&mut self, bytes: &[u8], counts: &Counts) {
        self.buf.extend_from_slice(bytes);
        loop {
            let header = usize::from(self.started);
            if self.buf.len() < header + 4 {
                return;
            }
            let len = i32::from_be_bytes(self.buf[header..header + 4].try_into().expect("4 bytes"))
                as usize;
            if self.buf.len() < header + len {
                return;
            }
            if self.started {
                let counter = match self.buf[0] {
                    b'E' => Some(&counts.execute),
                    b'Q' => Some(&counts.query),
                    b'S' if self.busy => Some(&counts.sync),
                    b'S' => Some(&counts.ping),
                    b'P' => Some(&counts.parse),
                    _ => None,
                };
                self.busy = matches!(self.buf[0], b'P' | b'B' | b'D' | b'E' | b'C' | b'H');
                if let Some(c) = counter {
                    c.fetch_add(1, Ordering::SeqCst);
                }
            } else {
                let code = i32::from_be_bytes(self.buf[4..8].try_into().expect("4 bytes"));
                // 80877103: SSLRequest, 80877104: GSSENCRequest; otherwise startup.
                self.started = !(code == 80_877_103 || code == 80_877_104);
            }
            self.buf.drain(..header + len);
        }
    }
}
