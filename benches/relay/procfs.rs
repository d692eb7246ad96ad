//! CPU time and peak memory of processes, sampled from /proc.

use std::fs;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// How often a child process's /proc entry is sampled.
pub(crate) const PROC_POLL: Duration = Duration::from_millis(5);

/// Seconds per clock tick of /proc/<pid>/stat (`getconf CLK_TCK`, usually 100).
pub(crate) fn clock_tick() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<f64>()
                .ok()
        })
        .filter(|t| *t > 0.0)
        .map_or(0.01, |t| 1.0 / t)
}

/// What the bench reads of `/proc/<pid>/stat`.
pub(crate) struct ProcStat {
    /// `R`, `S`, ... `Z` (zombie), `X` (dead).
    pub(crate) state: char,
    /// User plus system time, in clock ticks.
    pub(crate) cpu_ticks: u64,
}

impl ProcStat {
    pub(crate) fn parse(stat: &str) -> Option<ProcStat> {
        // The command name is in parentheses and may contain anything: split after the last ')'.
        let rest = stat.get(stat.rfind(')')? + 1..)?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let state = fields.first()?.chars().next()?;
        // Fields 14 (utime) and 15 (stime) of proc(5); `fields[0]` is field 3.
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        Some(ProcStat {
            state,
            cpu_ticks: utime + stime,
        })
    }

    /// Exited (a zombie not yet reaped, or being reaped): its CPU times are final.
    pub(crate) fn exited(&self) -> bool {
        self.state == 'Z' || self.state == 'X'
    }
}

/// A process's stat (or the bench's own, for `"self"`); `None` once it is gone.
pub(crate) fn proc_stat(pid: &str) -> Option<ProcStat> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    ProcStat::parse(&text)
}

/// The 1-minute load average: other work on the machine skews every figure.
pub(crate) fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

pub(crate) fn cpu_ticks(pid: u32) -> Option<u64> {
    proc_stat(&pid.to_string()).map(|stat| stat.cpu_ticks)
}

pub(crate) fn self_cpu_ticks() -> u64 {
    proc_stat("self").map_or(0, |stat| stat.cpu_ticks)
}

/// Peak resident set size (`VmHWM`), in MiB.
pub(crate) fn vm_hwm_mib(pid: u32) -> Option<f64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_hwm_mib(&status)
}

/// `VmHWM` of a `/proc/<pid>/status` text (in kB there), in MiB.
pub(crate) fn parse_vm_hwm_mib(status: &str) -> Option<f64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Samples a process's CPU ticks until it is gone or `stop` is set; returns the
/// last reading (so at most one `PROC_POLL` of CPU is missed).
pub(crate) fn sample_cpu_until_exit(
    pid: u32,
    stop: Arc<AtomicBool>,
    limit: Duration,
) -> Option<u64> {
    let deadline = Instant::now() + limit;
    let mut last = None;
    for _ in 0..(limit.as_millis() / PROC_POLL.as_millis() + 1) {
        match cpu_ticks(pid) {
            Some(t) => last = Some(t),
            None => break,
        }
        if stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
            break;
        }
        thread::sleep(PROC_POLL);
    }
    last
}
