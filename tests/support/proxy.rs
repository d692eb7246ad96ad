//! A loopback TCP proxy with faults a network has: every connection cut (a partition), new
//! connections refused (a server unreachable), the open connections dropped while new ones are
//! accepted (a connection reset mid-batch), the server's answers held back (a slow or stalled
//! path: requests arrive, responses do not), or a Postgres connection closed right after its
//! login (a server going away mid-failover).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// How often a paused pump looks again.
const PAUSE_POLL: Duration = Duration::from_millis(10);

/// Forwards `127.0.0.1:<port>` to an upstream port.
pub struct Proxy {
    port: u16,
    state: Arc<State>,
}

/// What the accepting thread and every pump share.
#[derive(Default)]
struct State {
    /// New connections are closed at once.
    cut: AtomicBool,
    /// Bytes from the server wait before reaching the client.
    hold: AtomicBool,
    after_login: AtomicBool,
    logins_cut: AtomicUsize,
    /// Bytes the server sent while answers were held (they reach the client only if the
    /// connection lives until the hold ends).
    held_reads: AtomicUsize,
    accepted: AtomicUsize,
    stop: AtomicBool,
    conns: Mutex<Vec<TcpStream>>,
}

impl State {
    /// Closes every open connection, both ways.
    fn drop_connections(&self) {
        if let Ok(mut list) = self.conns.lock() {
            for conn in list.drain(..) {
                let _ = conn.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Proxy {
    /// Starts forwarding to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let state = Arc::new(State::default());
        let shared = Arc::clone(&state);
        thread::spawn(move || accept(listener, upstream, shared));
        Proxy { port, state }
    }

    /// The port to connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Drops every open connection and refuses new ones until [`Proxy::restore`].
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::SeqCst);
        self.state.drop_connections();
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.state.cut.store(false, Ordering::SeqCst);
    }

    /// Drops every open connection and goes on accepting new ones.
    pub fn reset(&self) {
        self.state.drop_connections();
    }

    /// From now on (`true`), the server's bytes wait in the proxy instead of reaching the
    /// client, until `false`: requests arrive and are handled, their answers do not.
    pub fn hold_responses(&self, on: bool) {
        self.state.hold.store(on, Ordering::SeqCst);
    }

    /// How many reads from a server were held back so far.
    pub fn held_reads(&self) -> usize {
        self.state.held_reads.load(Ordering::SeqCst)
    }

    /// Connections accepted (and forwarded) so far.
    pub fn accepted(&self) -> usize {
        self.state.accepted.load(Ordering::SeqCst)
    }

    /// From now on (`true`), closes each new connection once the server said it is ready
    /// for the first query: the login succeeds, the first query fails.
    pub fn cut_after_login(&self, on: bool) {
        self.state.after_login.store(on, Ordering::SeqCst);
    }

    /// How many connections were closed right after the login.
    pub fn logins_cut(&self) -> usize {
        self.state.logins_cut.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        self.cut();
    }
}

/// Accepts until the proxy is dropped, forwarding each connection to `upstream`.
fn accept(listener: TcpListener, upstream: u16, state: Arc<State>) {
    while !state.stop.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(_) => {
                thread::sleep(PAUSE_POLL);
                continue;
            }
        };
        if state.cut.load(Ordering::SeqCst) {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let _ = client.set_nonblocking(false);
        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = (client.set_nodelay(true), server.set_nodelay(true));
        if let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone())
            && let Ok(mut list) = state.conns.lock()
        {
            list.push(c2);
            list.push(s2);
        }
        state.accepted.fetch_add(1, Ordering::SeqCst);
        match state.after_login.load(Ordering::SeqCst) {
            true => pipe_until_login(client, server, Arc::clone(&state)),
            false => pipe(client, server, Arc::clone(&state)),
        }
    }
}

/// Both directions of one connection; the server's side obeys [`Proxy::hold_responses`].
fn pipe(client: TcpStream, server: TcpStream, state: Arc<State>) {
    let (Ok(client2), Ok(server2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let to_server = Arc::clone(&state);
    thread::spawn(move || pump(client, server2, &to_server, false));
    thread::spawn(move || pump(server, client2, &state, true));
}

/// Copies `from` to `to` until either closes, then closes both; `held`: the bytes wait while
/// the proxy holds responses.
fn pump(mut from: TcpStream, mut to: TcpStream, state: &State, held: bool) {
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf) {
        if held && state.hold.load(Ordering::SeqCst) {
            state.held_reads.fetch_add(1, Ordering::SeqCst);
            while state.hold.load(Ordering::SeqCst) && !state.stop.load(Ordering::SeqCst) {
                thread::sleep(PAUSE_POLL);
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

/// Like [`pipe`], but closes both sides once the server's first ReadyForQuery
/// (`Z`, length 5) has reached the client.
fn pipe_until_login(client: TcpStream, server: TcpStream, state: Arc<State>) {
    let (Ok(mut client2), Ok(mut server2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let (mut client, mut server) = (client, server);
    thread::spawn(move || {
        let _ = io::copy(&mut client, &mut server2);
    });
    thread::spawn(move || {
        let (mut buf, mut seen) = ([0u8; 8192], Vec::new());
        while let Ok(n @ 1..) = server.read(&mut buf) {
            if client2.write_all(&buf[..n]).is_err() {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
            if seen.windows(5).any(|w| w == b"Z\0\0\0\x05") {
                state.logins_cut.fetch_add(1, Ordering::SeqCst);
                break;
            }
        }
        let _ = client2.shutdown(Shutdown::Both);
        let _ = server.shutdown(Shutdown::Both);
    });
}
