//! A loopback LDAP server that answers simple binds with the test's verdict and records
//! them: Postgres's `ldap` authentication (simple bind mode) hands it the password a client
//! sent, so a test sees exactly what the relay logged in with. Enough BER for BindRequest,
//! BindResponse and UnbindRequest; bounded by read timeouts, stopped on drop.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, SystemTime};

use super::loopback::Loopback;

/// One simple bind.
#[derive(Clone, Debug)]
pub struct Bind {
    /// The bind DN (Postgres: `ldapprefix` + user + `ldapsuffix`).
    pub dn: String,
    /// The password the client gave Postgres.
    pub password: String,
    /// The verdict given.
    pub accepted: bool,
    /// When.
    pub at: SystemTime,
}

/// The server.
pub struct FakeLdap {
    server: Loopback<Bind>,
}

impl FakeLdap {
    /// Serves on a free loopback port, accepting the binds `verdict(dn, password)` accepts.
    pub fn start(verdict: impl Fn(&str, &str) -> bool + Send + Sync + 'static) -> FakeLdap {
        let server = Loopback::start(move |stream, keep| serve(stream, &verdict, keep));
        FakeLdap { server }
    }

    /// The port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// Every bind so far.
    pub fn binds(&self) -> Vec<Bind> {
        self.server.served()
    }
}

fn serve(mut stream: TcpStream, verdict: &dyn Fn(&str, &str) -> bool, keep: &dyn Fn(Bind)) {
    if stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .is_err()
    {
        return;
    }
    // At most a bind and an unbind per connection from Postgres; bounded anyway.
    for _ in 0..16 {
        let Some(message) = read_element(&mut stream) else {
            return;
        };
        let Some((id, op_tag, op)) = message_parts(&message) else {
            return;
        };
        match op_tag {
            // BindRequest: version, name, simple [0] password.
            0x60 => {
                let Some((dn, password)) = bind_request(op) else {
                    return;
                };
                let accepted = verdict(&dn, &password);
                let at = SystemTime::now();
                keep(Bind {
                    dn,
                    password,
                    accepted,
                    at,
                });
                // resultCode success (0) or invalidCredentials (49).
                let code = if accepted { 0 } else { 49 };
                let response = [&[0x0a, 0x01, code][..], &[0x04, 0x00], &[0x04, 0x00]].concat();
                let op = element(0x61, &response);
                let message = element(0x30, &[element(0x02, id), op].concat());
                if stream.write_all(&message).is_err() {
                    return;
                }
            }
            // UnbindRequest, or anything else: the conversation is over.
            _ => return,
        }
    }
}

/// One BER element (tag, length, content) read whole.
fn read_element(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).ok()?;
    let mut raw = head.to_vec();
    let length = match head[1] {
        short if short < 0x80 => usize::from(short),
        long => {
            let mut bytes = vec![0u8; usize::from(long & 0x7f)];
            if bytes.len() > 4 {
                return None;
            }
            stream.read_exact(&mut bytes).ok()?;
            raw.extend_from_slice(&bytes);
            bytes.iter().fold(0usize, |n, b| n << 8 | usize::from(*b))
        }
    };
    if length > 1 << 20 {
        return None;
    }
    let mut content = vec![0u8; length];
    stream.read_exact(&mut content).ok()?;
    raw.extend_from_slice(&content);
    Some(raw)
}

/// The (tag, content) of the element at the start of `data`, and what follows it.
fn split(data: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *data.first()?;
    let first = *data.get(1)?;
    let (length, start) = match first {
        short if short < 0x80 => (usize::from(short), 2),
        long => {
            let n = usize::from(long & 0x7f);
            let bytes = data.get(2..2 + n)?;
            (
                bytes.iter().fold(0usize, |v, b| v << 8 | usize::from(*b)),
                2 + n,
            )
        }
    };
    let content = data.get(start..start.checked_add(length)?)?;
    Some((tag, content, &data[start + length..]))
}

/// An LDAPMessage's id (content of its INTEGER), operation tag and operation content.
fn message_parts(message: &[u8]) -> Option<(&[u8], u8, &[u8])> {
    let (_, sequence, _) = split(message)?;
    let (_, id, rest) = split(sequence)?;
    let (op_tag, op, _) = split(rest)?;
    Some((id, op_tag, op))
}

/// A BindRequest's name and simple password.
fn bind_request(op: &[u8]) -> Option<(String, String)> {
    let (_, _version, rest) = split(op)?;
    let (_, name, rest) = split(rest)?;
    let (tag, password, _) = split(rest)?;
    (tag == 0x80).then(|| {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (text(name), text(password))
    })
}

/// A BER element with a definite length.
fn element(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    match content.len() {
        n if n < 0x80 => out.push(n as u8),
        n if n < 0x100 => out.extend([0x81, n as u8]),
        n => out.extend([0x82, (n >> 8) as u8, n as u8]),
    }
    out.extend_from_slice(content);
    out
}
