//! A loopback TCP proxy that can cut every connection, to simulate a
//! network partition between the relay and Postgres, or a server that goes
//! away right after a client logged in (mid-failover).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// Forwards `127.0.0.1:<port>` to an upstream port.
pub struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
    after_login: Arc<AtomicBool>,
    logins_cut: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    /// Starts forwarding to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let cut = Arc::new(AtomicBool::new(false));
        let after_login = Arc::new(AtomicBool::new(false));
        let logins_cut = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (c, s, k) = (cut.clone(), stop.clone(), conns.clone());
        let (a, l) = (after_login.clone(), logins_cut.clone());
        thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        if c.load(Ordering::SeqCst) {
                            let _ = client.shutdown(Shutdown::Both);
                            continue;
                        }
                        let _ = client.set_nonblocking(false);
                        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                            continue;
                        };
                        if let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone())
                            && let Ok(mut list) = k.lock()
                        {
                            list.push(c2);
                            list.push(s2);
                        }
                        match a.load(Ordering::SeqCst) {
                            true => pipe_until_login(client, server, l.clone()),
                            false => pipe(client, server),
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(10));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Proxy {
            port,
            cut,
            after_login,
            logins_cut,
            stop,
            conns,
        }
    }

    /// The port to connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Drops every open connection and refuses new ones until [`Proxy::restore`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        if let Ok(mut list) = self.conns.lock() {
            for conn in list.drain(..) {
                let _ = conn.shutdown(Shutdown::Both);
            }
        }
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    /// From now on (`true`), closes each new connection once the server said it is ready
    /// for the first query: the login succeeds, the first query fails.
    pub fn cut_after_login(&self, on: bool) {
        self.after_login.store(on, Ordering::SeqCst);
    }

    /// How many connections were closed right after the login.
    pub fn logins_cut(&self) -> usize {
        self.logins_cut.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.cut();
    }
}

fn pipe(a: TcpStream, b: TcpStream) {
    let (Ok(mut a2), Ok(mut b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let (mut a, mut b) = (a, b);
    thread::spawn(move || {
        let _ = io::copy(&mut a, &mut b2);
        let _ = b2.shutdown(Shutdown::Both);
    });
    thread::spawn(move || {
        let _ = io::copy(&mut b, &mut a2);
        let _ = a2.shutdown(Shutdown::Both);
    });
}

/// Like [`pipe`], but closes both sides once the server's first ReadyForQuery
/// (`Z`, length 5) has reached the client.
fn pipe_until_login(client: TcpStream, server: TcpStream, cut: Arc<AtomicUsize>) {
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
                cut.fetch_add(1, Ordering::SeqCst);
                break;
            }
        }
        let _ = client2.shutdown(Shutdown::Both);
        let _ = server.shutdown(Shutdown::Both);
    });
}
