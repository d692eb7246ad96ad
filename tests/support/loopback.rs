//! A TCP server on a free loopback port for the tests' fake services (an OIDC token endpoint,
//! STS, LDAP): it accepts connections on a thread of its own, serves each on another, keeps
//! what each served, and stops on drop. Bounded: the accept loop looks at its stop flag every
//! 10 ms, and the servers set their own read timeouts.

#![allow(dead_code)]

use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// The server, keeping the `R`s its connections produce.
pub struct Loopback<R> {
    port: u16,
    served: Arc<Mutex<Vec<R>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl<R: Clone + Send + 'static> Loopback<R> {
    /// Serves each connection with `serve`, which hands what it served to its second argument.
    pub fn start(serve: impl Fn(TcpStream, &dyn Fn(R)) + Send + Sync + 'static) -> Loopback<R> {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("its address").port();
        listener.set_nonblocking(true).expect("non-blocking");
        let served = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let serve = Arc::new(serve);
        let kept = served.clone();
        let stopped = stop.clone();
        let thread = thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let kept = kept.clone();
                        let serve = serve.clone();
                        thread::spawn(move || {
                            let _ = stream.set_nonblocking(false);
                            let keep =
                                |r: R| kept.lock().unwrap_or_else(PoisonError::into_inner).push(r);
                            serve(stream, &keep);
                        });
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(10));
                    }
                    Err(_) => return,
                }
            }
        });
        Loopback {
            port,
            served,
            stop,
            thread: Some(thread),
        }
    }

    /// The port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// What the connections served so far.
    pub fn served(&self) -> Vec<R> {
        self.served
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl<R> Drop for Loopback<R> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
