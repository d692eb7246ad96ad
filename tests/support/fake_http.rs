//! A loopback HTTP/1.1 server answering each request with the test's handler and recording
//! them: an OIDC token endpoint, STS. One request per connection (`Connection: close`);
//! bounded by read timeouts, stopped on drop (`support::loopback`).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::loopback::Loopback;

/// One request received.
#[derive(Clone, Debug)]
pub struct Request {
    /// `GET`, `POST`...
    pub method: String,
    /// The path and query.
    pub path: String,
    /// Header names lower-cased, with their values.
    pub headers: Vec<(String, String)>,
    /// The body, as text.
    pub body: String,
}

impl Request {
    /// The value of header `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let found = self.headers.iter().find(|(n, _)| n == name);
        found.map(|(_, v)| v.as_str())
    }
}

/// The handler's answer.
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// The body.
    pub body: String,
    /// More headers.
    pub headers: Vec<(&'static str, String)>,
}

impl Answer {
    /// An answer with this status, content type and body.
    pub fn new(status: u16, content_type: &'static str, body: impl Into<String>) -> Answer {
        let body = body.into();
        Answer {
            status,
            content_type,
            body,
            headers: Vec::new(),
        }
    }

    /// This answer with header `name: value` too.
    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Answer {
        self.headers.push((name, value.into()));
        self
    }
}

/// The server.
pub struct FakeHttp {
    server: Loopback<Request>,
}

impl FakeHttp {
    /// Serves on a free loopback port.
    pub fn start(handler: impl Fn(&Request) -> Answer + Send + Sync + 'static) -> FakeHttp {
        let server = Loopback::start(move |stream, keep| {
            if let Some(request) = serve(stream, &handler) {
                keep(request);
            }
        });
        FakeHttp { server }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.server.port())
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Request> {
        self.server.served()
    }
}

fn serve(mut stream: TcpStream, handler: &dyn Fn(&Request) -> Answer) -> Option<Request> {
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut data = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&chunk[..n]);
        if let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        if data.len() > 1 << 20 {
            return None;
        }
    };
    let head = String::from_utf8_lossy(&data[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split_whitespace();
    let (method, path) = (first.next()?.to_owned(), first.next()?.to_owned());
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length = headers.iter().find(|(n, _)| n == "content-length");
    let length: usize = length.and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
    let mut body = data[head_end + 4..].to_vec();
    while body.len() < length.min(1 << 20) {
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let request = Request {
        method,
        path,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    };
    let answer = handler(&request);
    let headers: String = answer
        .headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let response = format!(
        "HTTP/1.1 {} X\r\nContent-Type: {}\r\nContent-Length: {}\r\n{headers}\
         Connection: close\r\n\r\n{}",
        answer.status,
        answer.content_type,
        answer.body.len(),
        answer.body
    );
    let _ = stream.write_all(response.as_bytes());
    Some(request)
}
