//! A loopback TCP proxy that can cut every connection, to simulate a
//! network partition between the relay and Postgres.

use std::io;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// Forwards `127.0.0.1:<port>` to an upstream port.
pub struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
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
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (c, s, k) = (cut.clone(), stop.clone(), conns.clone());
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
                        pipe(client, server);
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
