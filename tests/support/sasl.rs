//! A Kafka broker that requires SASL/OAUTHBEARER: librdkafka's mock cluster (which has no
//! SASL) behind a front on loopback that logs clients in and then passes their requests
//! through, the mock advertising the front's address so that every connection takes it.
//!
//! The front answers `SaslHandshake` (OAUTHBEARER only) and `SaslAuthenticate` itself,
//! judging each bearer token with the test's validator, which says how long the session may
//! last (the broker's `session_lifetime_ms`, after which librdkafka logs in again on the same
//! connection with its current token, as KIP-368 has it). It adds both APIs to the mock's
//! `ApiVersions` answer, and refuses (closes) a connection that sends anything else before
//! it logged in. Every login is recorded.
//!
//! Bounded: every socket has a read timeout, and dropping the broker stops the accept loop
//! and shuts every connection down.

#![allow(dead_code)]
// The mock's advertised address can be changed only through librdkafka's C API.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::ffi::CString;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime};

use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, DefaultProducerContext, Producer};

/// `SaslHandshake`, `SaslAuthenticate` and `ApiVersions`.
const SASL_HANDSHAKE: i16 = 17;
const SASL_AUTHENTICATE: i16 = 36;
const API_VERSIONS: i16 = 18;
/// Kafka's `SASL_AUTHENTICATION_FAILED` and `UNSUPPORTED_SASL_MECHANISM`.
const AUTHENTICATION_FAILED: i16 = 58;
const UNSUPPORTED_MECHANISM: i16 = 33;
/// How long a socket read may block before the thread looks at the stop flag.
const POLL: Duration = Duration::from_millis(200);
/// The largest frame either side may send (the mock's ~5 MB partitions fit).
const MAX_FRAME: usize = 64 << 20;

/// Judges a bearer token: `Ok(session lifetime)` or `Err(why)`.
pub type Validator = Arc<dyn Fn(&str) -> Result<Duration, String> + Send + Sync>;

/// One `SaslAuthenticate`.
#[derive(Clone, Debug)]
pub struct Login {
    /// The bearer token.
    pub token: String,
    /// The SASL extensions sent with it (`key=value`).
    pub extensions: Vec<String>,
    /// Whether the validator took it, or why not.
    pub verdict: Result<Duration, String>,
    /// The front's number of the client connection.
    pub connection: u64,
    /// A login on a connection that was already logged in (KIP-368 re-authentication).
    pub again: bool,
    /// When.
    pub at: SystemTime,
}

/// The mock cluster and its front.
pub struct SaslBroker {
    /// Owns the mock cluster (`test.mock.num.brokers`).
    owner: BaseProducer,
    front: Arc<Front>,
    accept: Option<JoinHandle<()>>,
    port: u16,
}

struct Front {
    upstream: String,
    validator: Validator,
    logins: Mutex<Vec<Login>>,
    stop: AtomicBool,
    next_connection: AtomicU64,
    sockets: Mutex<Vec<TcpStream>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SaslBroker {
    /// One mock broker behind a front on a free loopback port, taking the tokens
    /// `validator` takes.
    pub fn start(validator: Validator) -> SaslBroker {
        let owner: BaseProducer = ClientConfig::new()
            .set("test.mock.num.brokers", "1")
            .set("log_level", "3")
            .create()
            .expect("a client owning a mock cluster");
        let upstream = {
            let mock = owner.client().mock_cluster().expect("the mock cluster");
            mock.bootstrap_servers()
        };
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the SASL front");
        let port = listener.local_addr().expect("front address").port();
        advertise(&owner, port);
        let front = Arc::new(Front {
            upstream,
            validator,
            logins: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            next_connection: AtomicU64::new(0),
            sockets: Mutex::new(Vec::new()),
        });
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let accepting = front.clone();
        let accept = thread::spawn(move || accept_loop(&accepting, &listener));
        SaslBroker {
            owner,
            front,
            accept: Some(accept),
            port,
        }
    }

    /// What clients bootstrap from: the front.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The mock cluster, to create topics.
    pub fn mock(&self) -> MockCluster<'_, DefaultProducerContext> {
        self.owner
            .client()
            .mock_cluster()
            .expect("the mock cluster")
    }

    /// Every login so far.
    pub fn logins(&self) -> Vec<Login> {
        lock(&self.front.logins).clone()
    }
}

impl Drop for SaslBroker {
    fn drop(&mut self) {
        self.front.stop.store(true, Ordering::Relaxed);
        for socket in lock(&self.front.sockets).drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

/// Makes the mock's only broker advertise the front's port in its metadata.
fn advertise(owner: &BaseProducer, port: u16) {
    let host = CString::new("127.0.0.1").expect("a C string");
    // SAFETY: the client owns the mock cluster and outlives this call; librdkafka copies
    // the host name under the cluster's lock.
    unsafe {
        let cluster = rdkafka_sys::rd_kafka_handle_mock_cluster(owner.client().native_ptr());
        assert!(!cluster.is_null(), "the client has no mock cluster");
        rdkafka_sys::rd_kafka_mock_broker_set_host_port(cluster, 1, host.as_ptr(), i32::from(port));
    }
}

fn accept_loop(front: &Arc<Front>, listener: &TcpListener) {
    while !front.stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((client, _)) => {
                let front = front.clone();
                thread::spawn(move || {
                    if let Err(e) = serve(&front, client) {
                        eprintln!("SASL front: connection ended: {e}");
                    }
                });
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                eprintln!("SASL front: accept failed: {e}");
                return;
            }
        }
    }
}

/// What the client is owed next, in order: Kafka answers a connection's requests in order.
enum Owed {
    /// The upstream's answer to this correlation id (`Some(version)`: an `ApiVersions`).
    Upstream(i32, Option<i16>),
    /// A frame of the front's own.
    Own(Vec<u8>),
}

/// One client connection's way back to the client.
struct Back {
    client: TcpStream,
    owed: VecDeque<Owed>,
    /// Close once the owed frames are out (a refused login).
    close: bool,
}

fn serve(front: &Arc<Front>, client: TcpStream) -> std::io::Result<()> {
    let connection = front.next_connection.fetch_add(1, Ordering::Relaxed);
    let upstream = TcpStream::connect(&front.upstream)?;
    for socket in [&client, &upstream] {
        socket.set_read_timeout(Some(POLL))?;
        socket.set_nodelay(true)?;
        lock(&front.sockets).push(socket.try_clone()?);
    }
    let back = Arc::new(Mutex::new(Back {
        client: client.try_clone()?,
        owed: VecDeque::new(),
        close: false,
    }));
    let answers = {
        let front = front.clone();
        let back = back.clone();
        let upstream = upstream.try_clone()?;
        thread::spawn(move || relay_answers(&front, &back, upstream))
    };
    let result = relay_requests(front, connection, client, upstream, &back);
    let _ = answers.join();
    result
}

/// Client to upstream: logins are answered here, everything else passes once logged in.
fn relay_requests(
    front: &Front,
    connection: u64,
    mut client: TcpStream,
    mut upstream: TcpStream,
    back: &Mutex<Back>,
) -> std::io::Result<()> {
    let mut logged_in = false;
    // A broker closes a connection whose session outlived its token (KIP-368).
    let mut session_ends = Instant::now();
    while let Some(frame) = read_frame(front, &mut client)? {
        let header = RequestHeader::parse(&frame)?;
        match header.api_key {
            SASL_HANDSHAKE => {
                let mechanism = Cursor::new(&frame[header.body..]).string()?;
                let error = if mechanism == "OAUTHBEARER" {
                    0
                } else {
                    UNSUPPORTED_MECHANISM
                };
                let mut body = Vec::new();
                body.extend(error.to_be_bytes());
                body.extend(1i32.to_be_bytes());
                put_string(&mut body, "OAUTHBEARER");
                owe(
                    back,
                    Owed::Own(answer(header.correlation, &body)),
                    error != 0,
                )?;
            }
            SASL_AUTHENTICATE => {
                let bytes = Cursor::new(&frame[header.body..]).bytes()?;
                let bearer = bearer(&bytes).unwrap_or_default();
                let verdict = (front.validator)(&bearer.token);
                if let Ok(lifetime) = &verdict {
                    session_ends = Instant::now() + *lifetime;
                }
                lock(&front.logins).push(Login {
                    token: bearer.token,
                    extensions: bearer.extensions,
                    verdict: verdict.clone(),
                    connection,
                    again: logged_in,
                    at: SystemTime::now(),
                });
                let body = authenticate_answer(&verdict, header.api_version);
                let refused = verdict.is_err();
                logged_in = !refused;
                owe(back, Owed::Own(answer(header.correlation, &body)), refused)?;
            }
            API_VERSIONS => {
                let version = Some(header.api_version);
                forward(
                    back,
                    &mut upstream,
                    &frame,
                    Owed::Upstream(header.correlation, version),
                )?;
            }
            _ if !logged_in => {
                return Err(std::io::Error::other(format!(
                    "request {} before logging in: refused",
                    header.api_key
                )));
            }
            _ if Instant::now() > session_ends => {
                return Err(std::io::Error::other("the session expired: closed"));
            }
            _ => forward(
                back,
                &mut upstream,
                &frame,
                Owed::Upstream(header.correlation, None),
            )?,
        }
    }
    let _ = upstream.shutdown(Shutdown::Both);
    Ok(())
}

/// Upstream to client, in the order owed, with the front's own frames where they fall.
fn relay_answers(front: &Front, back: &Mutex<Back>, mut upstream: TcpStream) {
    let relayed = (|| -> std::io::Result<()> {
        while let Some(frame) = read_frame(front, &mut upstream)? {
            let correlation = Cursor::new(&frame).i32()?;
            let mut back = lock(back);
            let Some(Owed::Upstream(owed, version)) = back.owed.pop_front() else {
                return Err(std::io::Error::other("an answer nobody asked for"));
            };
            if owed != correlation {
                return Err(std::io::Error::other("answers out of order"));
            }
            let frame = match version {
                Some(version) => with_sasl_apis(&frame, version)?,
                None => frame,
            };
            write_frame(&mut back.client, &frame)?;
            flush_own(&mut back)?;
        }
        Ok(())
    })();
    if let Err(e) = relayed {
        eprintln!("SASL front: answers ended: {e}");
    }
    let _ = lock(back).client.shutdown(Shutdown::Both);
}

fn forward(
    back: &Mutex<Back>,
    upstream: &mut TcpStream,
    frame: &[u8],
    owed: Owed,
) -> std::io::Result<()> {
    lock(back).owed.push_back(owed);
    write_frame(upstream, frame)
}

/// Sends `own` now when nothing is owed before it, else after what is.
fn owe(back: &Mutex<Back>, own: Owed, close: bool) -> std::io::Result<()> {
    let mut back = lock(back);
    back.owed.push_back(own);
    back.close |= close;
    flush_own(&mut back)
}

fn flush_own(back: &mut Back) -> std::io::Result<()> {
    while let Some(Owed::Own(_)) = back.owed.front() {
        if let Some(Owed::Own(frame)) = back.owed.pop_front() {
            write_frame(&mut back.client, &frame)?;
        }
    }
    if back.close && back.owed.is_empty() {
        let _ = back.client.shutdown(Shutdown::Both);
    }
    Ok(())
}

/// `SaslAuthenticate` v0/v1's answer: error, message, no server bytes, the session lifetime.
fn authenticate_answer(verdict: &Result<Duration, String>, version: i16) -> Vec<u8> {
    let mut body = Vec::new();
    match verdict {
        Ok(_) => {
            body.extend(0i16.to_be_bytes());
            body.extend((-1i16).to_be_bytes());
        }
        Err(why) => {
            body.extend(AUTHENTICATION_FAILED.to_be_bytes());
            put_string(&mut body, why);
        }
    }
    body.extend(0i32.to_be_bytes());
    if version >= 1 {
        let lifetime = verdict.as_ref().map_or(0, |d| d.as_millis());
        body.extend(i64::try_from(lifetime).unwrap_or(i64::MAX).to_be_bytes());
    }
    body
}

/// What an OAUTHBEARER client-first message carries.
#[derive(Default)]
struct Bearer {
    token: String,
    /// `key=value`.
    extensions: Vec<String>,
}

/// The token and extensions of an OAUTHBEARER client-first message
/// (`n,,\x01auth=Bearer TOKEN\x01key=value\x01\x01`).
fn bearer(message: &[u8]) -> Option<Bearer> {
    let text = std::str::from_utf8(message).ok()?;
    let fields = text.split('\x01').skip(1).filter(|f| !f.is_empty());
    let mut token = None;
    let mut extensions = Vec::new();
    for field in fields {
        match field.strip_prefix("auth=Bearer ") {
            Some(found) => token = Some(found.to_owned()),
            None => extensions.push(field.to_owned()),
        }
    }
    Some(Bearer {
        token: token?,
        extensions,
    })
}

/// The mock's `ApiVersions` answer with `SaslHandshake` 0..1 and `SaslAuthenticate` 0..1
/// added (v0 to v3: v3 is a flexible version, with compact arrays and tagged fields).
fn with_sasl_apis(frame: &[u8], version: i16) -> std::io::Result<Vec<u8>> {
    let mut cursor = Cursor::new(frame);
    let correlation = cursor.i32()?;
    let error = cursor.i16()?;
    if error != 0 {
        return Ok(frame.to_vec());
    }
    let flexible = version >= 3;
    let count = match flexible {
        true => cursor.uvarint()?.saturating_sub(1),
        false => u64::try_from(cursor.i32()?).unwrap_or(0),
    };
    let mut apis = Vec::new();
    for _ in 0..count {
        let entry = (cursor.i16()?, cursor.i16()?, cursor.i16()?);
        if flexible {
            cursor.skip_tags()?;
        }
        if entry.0 != SASL_HANDSHAKE && entry.0 != SASL_AUTHENTICATE {
            apis.push(entry);
        }
    }
    apis.push((SASL_HANDSHAKE, 0, 1));
    apis.push((SASL_AUTHENTICATE, 0, 1));
    let rest = &frame[cursor.at..];
    let mut out = Vec::with_capacity(frame.len() + 16);
    out.extend(correlation.to_be_bytes());
    out.extend(error.to_be_bytes());
    match flexible {
        true => put_uvarint(&mut out, apis.len() as u64 + 1),
        false => out.extend(i32::try_from(apis.len()).unwrap_or(0).to_be_bytes()),
    }
    for (key, min, max) in apis {
        out.extend(key.to_be_bytes());
        out.extend(min.to_be_bytes());
        out.extend(max.to_be_bytes());
        if flexible {
            out.push(0);
        }
    }
    out.extend(rest);
    Ok(out)
}

/// An answer frame's bytes: the correlation id (response header v0), then `body`.
fn answer(correlation: i32, body: &[u8]) -> Vec<u8> {
    let mut frame = correlation.to_be_bytes().to_vec();
    frame.extend(body);
    frame
}

/// A request's header (v1: the SASL requests and ApiVersions up to v2; v2 adds tagged
/// fields, which only ApiVersions v3 of the intercepted ones uses).
struct RequestHeader {
    api_key: i16,
    api_version: i16,
    correlation: i32,
    /// Where the body starts.
    body: usize,
}

impl RequestHeader {
    fn parse(frame: &[u8]) -> std::io::Result<RequestHeader> {
        let mut cursor = Cursor::new(frame);
        let api_key = cursor.i16()?;
        let api_version = cursor.i16()?;
        let correlation = cursor.i32()?;
        let _client_id = cursor.nullable_string()?;
        if api_key == API_VERSIONS && api_version >= 3 {
            cursor.skip_tags()?;
        }
        Ok(RequestHeader {
            api_key,
            api_version,
            correlation,
            body: cursor.at,
        })
    }
}

/// The next frame from `socket` (without its length); `None` once it closed or the front
/// stops.
fn read_frame(front: &Front, socket: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut size = [0u8; 4];
    if !read_exact(front, socket, &mut size)? {
        return Ok(None);
    }
    let size = usize::try_from(i32::from_be_bytes(size)).unwrap_or(usize::MAX);
    if size > MAX_FRAME {
        return Err(std::io::Error::other(format!("a frame of {size} bytes")));
    }
    let mut frame = vec![0u8; size];
    match read_exact(front, socket, &mut frame)? {
        true => Ok(Some(frame)),
        false => Ok(None),
    }
}

/// Fills `buf`, waiting out read timeouts until the front stops; false at end of stream.
fn read_exact(front: &Front, socket: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<bool> {
    let mut filled = 0;
    while filled < buf.len() {
        if front.stop.load(Ordering::Relaxed) {
            return Ok(false);
        }
        match socket.read(&mut buf[filled..]) {
            Ok(0) => return Ok(false),
            Ok(n) => filled += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if filled == 0 && e.kind() == ErrorKind::ConnectionReset => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn write_frame(socket: &mut TcpStream, frame: &[u8]) -> std::io::Result<()> {
    let size = i32::try_from(frame.len()).map_err(std::io::Error::other)?;
    let mut out = size.to_be_bytes().to_vec();
    out.extend(frame);
    socket.write_all(&out)
}

fn put_string(out: &mut Vec<u8>, text: &str) {
    out.extend(i16::try_from(text.len()).unwrap_or(i16::MAX).to_be_bytes());
    out.extend(text.as_bytes());
}

fn put_uvarint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A checked reader over a frame.
struct Cursor<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn new(data: &'a [u8]) -> Cursor<'a> {
        Cursor { data, at: 0 }
    }

    fn take(&mut self, n: usize) -> std::io::Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|end| *end <= self.data.len());
        let end = end.ok_or_else(|| std::io::Error::other("a truncated frame"))?;
        let taken = &self.data[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn i16(&mut self) -> std::io::Result<i16> {
        let bytes = self.take(2)?;
        Ok(i16::from_be_bytes([bytes[0], bytes[1]]))
    }

    fn i32(&mut self) -> std::io::Result<i32> {
        let bytes = self.take(4)?;
        Ok(i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    fn uvarint(&mut self) -> std::io::Result<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.take(1)?[0];
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(std::io::Error::other("an unending varint"))
    }

    fn skip_tags(&mut self) -> std::io::Result<()> {
        for _ in 0..self.uvarint()? {
            let _tag = self.uvarint()?;
            let size = usize::try_from(self.uvarint()?).map_err(std::io::Error::other)?;
            self.take(size)?;
        }
        Ok(())
    }

    fn string(&mut self) -> std::io::Result<String> {
        Ok(self.nullable_string()?.unwrap_or_default())
    }

    fn nullable_string(&mut self) -> std::io::Result<Option<String>> {
        let size = self.i16()?;
        let Ok(size) = usize::try_from(size) else {
            return Ok(None);
        };
        let bytes = self.take(size)?;
        Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
    }

    fn bytes(&mut self) -> std::io::Result<Vec<u8>> {
        let size = usize::try_from(self.i32()?).unwrap_or(0);
        Ok(self.take(size)?.to_vec())
    }
}
