//! The processes of the MQTT end-to-end bench and what it reads about them: a private mosquitto,
//! the release `braid run`, its `/metrics`, and CPU time per thread from `/proc`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Debian's mosquitto.
pub const MOSQUITTO: &str = "/usr/sbin/mosquitto";
/// Un-acked QoS 1 messages mosquitto keeps in flight to one client (its default is 20). The same
/// for the plain subscriber and for braid's source, so neither waits on acknowledgement round
/// trips more than the other.
pub const MAX_INFLIGHT: u16 = 1000;
/// How long a process may take to start or stop.
const PATIENCE: Duration = Duration::from_secs(10);

/// A free TCP port on 127.0.0.1 (bound once and released).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    listener.local_addr().unwrap().port()
}

fn accepts(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// A mosquitto of its own for one measurement: 127.0.0.1 on a free port, no persistence (nothing
/// is written to disk while it runs), unlimited queues (`max_queued_messages 0`: a subscriber
/// slower than the publishers makes the broker queue, never drop) and [`MAX_INFLIGHT`].
/// `nodelay` sets `set_tcp_nodelay true` (TCP_NODELAY on its client sockets; mosquitto's default
/// leaves Nagle's algorithm on).
pub struct Mosquitto {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Child,
}

impl Mosquitto {
    pub fn start(nodelay: bool) -> Mosquitto {
        let dir = tempfile::Builder::new().prefix("braid-bench-mosquitto-").tempdir().unwrap();
        let port = free_port();
        let config = format!(
            "listener {port} 127.0.0.1\n\
             allow_anonymous true\n\
             user root\n\
             persistence false\n\
             max_queued_messages 0\n\
             max_inflight_messages {MAX_INFLIGHT}\n\
             set_tcp_nodelay {nodelay}\n\
             log_dest file {}/mosquitto.log\n\
             log_type error\n\
             log_type warning\n",
            dir.path().display()
        );
        let conf = dir.path().join("mosquitto.conf");
        std::fs::write(&conf, config).unwrap();
        let child = Command::new(MOSQUITTO)
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {MOSQUITTO}: {e} (apt-get install -y mosquitto)"));
        let mut broker = Mosquitto { port, dir, child };
        let since = Instant::now();
        while !accepts(port) {
            if let Ok(Some(status)) = broker.child.try_wait() {
                panic!("mosquitto exited with {status}; log:\n{}", broker.log());
            }
            assert!(since.elapsed() < PATIENCE, "mosquitto did not listen on {port}; log:\n{}", broker.log());
            std::thread::sleep(Duration::from_millis(10));
        }
        broker
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mosquitto.log")).unwrap_or_default()
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where braid's results go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Egress {
    /// An MQTT sink to the broker on this port (the devices' or one of its own), topic
    /// `up/effect/{device}` (QoS 1, default window).
    Mqtt(u16),
    /// A file sink in the state directory (no MQTT traffic for results).
    File,
}

/// The gateway join of configs/gateway.toml (its streams and operator, as deployed) with its
/// devices on `mqtt_port` and its results sent where `egress` says.
/// `runtime` is a line added to its `[runtime]` (the bench's `--runtime`; "" for none); one that
/// sets `shards` replaces the default `"auto"`.
pub fn braid_config(mqtt_port: u16, ops_port: u16, state_dir: &Path, egress: Egress, runtime: &str) -> String {
    let sink = match egress {
        Egress::Mqtt(results_port) => format!(
            "[sinks.up]\nkind = \"mqtt\"\ninputs = [\"effect\"]\nurl = \"mqtt://127.0.0.1:{results_port}\"\n\
             topic = \"up/effect/{{device}}\"\nqos = 1\n"
        ),
        Egress::File => format!(
            "[sinks.up]\nkind = \"file\"\ninputs = [\"effect\"]\npath = \"{}\"\n",
            state_dir.join("effect.jsonl").display()
        ),
    };
    let shards = if runtime.trim_start().starts_with("shards") { "" } else { "shards = \"auto\"\n" };
    let deployment = format!(
        "[runtime]\n{shards}idle_advance = true\nstate_dir = \"{state}\"\n{runtime}\n\n\
         [ops]\nlisten = \"127.0.0.1:{ops_port}\"\n\n\
         [sources.devices]\nkind = \"mqtt\"\nurl = \"mqtt://127.0.0.1:{mqtt_port}\"\n\n{sink}",
        state = state_dir.display()
    );
    let mut config: toml::Table = include_str!("../../configs/gateway.toml").parse().expect("configs/gateway.toml");
    config.retain(|section, _| section == "streams" || section == "operators");
    config.extend(deployment.parse::<toml::Table>().expect("the bench's deployment sections"));
    toml::to_string(&config).expect("a config table")
}

/// Which braid binary the bench runs, and a line added to its config's `[runtime]` ("" for none).
pub struct BraidRun {
    pub bin: PathBuf,
    pub runtime: String,
}

/// `braid run` on a fresh state directory; SIGTERM and wait when dropped.
pub struct Braid {
    pub ops_port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Braid {
    /// Starts `bin` on [`braid_config`]; returns once `/metrics` answers.
    pub fn start(run: &BraidRun, mqtt_port: u16, egress: Egress) -> Braid {
        let bin = &run.bin;
        let dir = tempfile::Builder::new().prefix("braid-bench-state-").tempdir().unwrap();
        let ops_port = free_port();
        let config = dir.path().join("braid.toml");
        std::fs::write(&config, braid_config(mqtt_port, ops_port, &dir.path().join("state"), egress, &run.runtime))
            .unwrap();
        let log = std::fs::File::create(dir.path().join("braid.log")).unwrap();
        let child = Command::new(bin)
            .arg("run")
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let mut braid = Braid { ops_port, dir, child: Some(child) };
        let since = Instant::now();
        while metrics(ops_port).is_none() {
            if let Some(Ok(Some(status))) = braid.child.as_mut().map(Child::try_wait) {
                panic!("braid exited with {status}; log:\n{}", braid.log());
            }
            assert!(since.elapsed() < PATIENCE, "braid's /metrics did not answer; log:\n{}", braid.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        braid
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("braid.log")).unwrap_or_default()
    }

    /// SIGTERM, then wait (bounded, then SIGKILL).
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        // SAFETY: kill(2) on our own child, not yet waited for, so the pid is still ours.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let since = Instant::now();
        while since.elapsed() < PATIENCE * 2 {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("mqtt_e2e: braid did not stop within {:?} of SIGTERM; killing it", PATIENCE * 2);
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Braid {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `GET /metrics` on 127.0.0.1:`port` (None while nothing answers).
pub fn metrics(port: u16) -> Option<String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

/// The sum of a metric's samples whose labels contain `labels` ("" for all).
pub fn metric(text: &str, name: &str, labels: &str) -> u64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            (metric == name && rest.contains(labels)).then(|| value.parse::<f64>().ok())?
        })
        .sum::<f64>() as u64
}

/// The `le` bound (s; infinite for `+Inf`) of the first bucket of Prometheus histogram `name`
/// that holds quantile `q` of its count (braid's rule: `result_latency::quantile_bucket`); `None`
/// without samples.
pub fn histogram_bound(text: &str, name: &str, q: f64) -> Option<f64> {
    braid::shard::result_latency::quantile_bucket(&histogram_buckets(text, name), q)
}

/// The cumulative buckets of Prometheus histogram `name`: (`le` in s, infinite for `+Inf`; count).
pub fn histogram_buckets(text: &str, name: &str) -> Vec<(f64, u64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    text.lines()
        .filter_map(|l| {
            let (le, count) = l.strip_prefix(&prefix)?.split_once("\"} ")?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, count.trim().parse().ok()?))
        })
        .collect()
}

/// What histogram `name` counted between two scrapes, `earlier` and `later`, as cumulative
/// buckets; empty when the scrapes' buckets differ (a restart between them).
pub fn histogram_since(earlier: &str, later: &str, name: &str) -> Vec<(f64, u64)> {
    let (before, after) = (histogram_buckets(earlier, name), histogram_buckets(later, name));
    if before.len() != after.len() || before.iter().zip(&after).any(|(b, a)| b.0 != a.0 || b.1 > a.1) {
        return Vec::new();
    }
    before.iter().zip(&after).map(|(b, a)| (a.0, a.1 - b.1)).collect()
}

/// The share (%) of cumulative `buckets`' count within `bound_s`; `None` without samples.
pub fn share_within(buckets: &[(f64, u64)], bound_s: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    let within = buckets.iter().filter(|(le, _)| *le <= bound_s).map(|&(_, n)| n).max().unwrap_or(0);
    (total > 0).then(|| 100.0 * within as f64 / total as f64)
}

/// CPU time (user + system, clock ticks) of some processes, in all and per thread name.
#[derive(Clone, Debug, Default)]
pub struct ThreadTimes {
    /// (process label, thread name) → ticks, summed over threads of the same name; the thread
    /// name [`ALL_THREADS`] holds the whole process, threads that already ended included.
    ticks: BTreeMap<(String, String), u64>,
    /// Process label → context switches of its living threads.
    switches: BTreeMap<String, Switches>,
}

/// Context switches of a process's threads. Voluntary ones are its own: a thread went to sleep
/// (a hand-off it waits for, a read that would block). Involuntary ones are the scheduler's: a
/// runnable thread preempted by another process, which on a 2-core machine shared with the broker
/// and the load generator says more about the machine than about braid.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Switches {
    pub voluntary: u64,
    pub involuntary: u64,
}

impl Switches {
    pub fn total(self) -> u64 {
        self.voluntary + self.involuntary
    }

    fn since(self, before: Switches) -> Switches {
        Switches {
            voluntary: self.voluntary.saturating_sub(before.voluntary),
            involuntary: self.involuntary.saturating_sub(before.involuntary),
        }
    }
}

/// A process's memory (`/proc/PID/status`, KiB): DESIGN.md's memory target reads its peak
/// resident set and its private (anonymous) memory.
#[derive(Clone, Copy, Debug, Default)]
pub struct Memory {
    /// `VmHWM`: the peak resident set.
    pub peak_rss: u64,
    /// `RssAnon`: private anonymous pages (heap, stacks, anonymous mappings).
    pub anon: u64,
    /// `RssFile`: pages of mapped files (the binary, libraries, the state arenas and journal).
    pub file: u64,
    /// `RssShmem`: shared memory (the shard rings, when the state directory is on a tmpfs).
    pub shmem: u64,
}

impl Memory {
    pub fn read(pid: u32) -> Memory {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let kib = |field: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(field)?.trim().strip_suffix("kB")?.trim().parse().ok())
                .unwrap_or(0)
        };
        Memory { peak_rss: kib("VmHWM:"), anon: kib("RssAnon:"), file: kib("RssFile:"), shmem: kib("RssShmem:") }
    }
}

/// The "thread name" of a process's total.
pub const ALL_THREADS: &str = "*";

/// utime + stime of a `/proc/…/stat` line, and its comm.
fn stat_ticks(stat: &str) -> Option<(String, u64)> {
    // pid (comm) state ppid …: comm may hold spaces, so split at the last ')'.
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let fields: Vec<&str> = stat.get(close + 2..)?.split(' ').collect();
    // After the comm: state is field 3, utime 14 and stime 15 (proc(5)).
    let used = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some((stat[open + 1..close].to_owned(), used))
}

impl ThreadTimes {
    pub fn read(processes: &[(&str, u32)]) -> ThreadTimes {
        let (mut ticks, mut switches) = (BTreeMap::new(), BTreeMap::new());
        for &(label, pid) in processes {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if let Some((_, used)) = stat_ticks(&stat) {
                ticks.insert((label.to_owned(), ALL_THREADS.to_owned()), used);
            }
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
            for task in tasks.flatten() {
                let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
                if let Some((name, used)) = stat_ticks(&stat) {
                    *ticks.entry((label.to_owned(), name)).or_insert(0) += used;
                }
                let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
                let count = |field: &str| -> u64 {
                    status.lines().find_map(|l| l.strip_prefix(field)?.trim().parse().ok()).unwrap_or(0)
                };
                let process: &mut Switches = switches.entry(label.to_owned()).or_default();
                process.voluntary += count("voluntary_ctxt_switches:");
                process.involuntary += count("nonvoluntary_ctxt_switches:");
            }
        }
        ThreadTimes { ticks, switches }
    }

    /// Context switches of `process`'s threads since `before` (threads that ended in between are
    /// not counted).
    pub fn switches_since(&self, before: &ThreadTimes, process: &str) -> Switches {
        let now = self.switches.get(process).copied().unwrap_or_default();
        now.since(before.switches.get(process).copied().unwrap_or_default())
    }

    /// Per (process, thread name or [`ALL_THREADS`]): the share of one core used between
    /// `before` and `self`, over `seconds`, busiest first.
    pub fn busy_since(&self, before: &ThreadTimes, seconds: f64) -> Vec<(String, String, f64)> {
        // SAFETY: sysconf reads a constant of the system; no memory is involved.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let mut out: Vec<_> = self
            .ticks
            .iter()
            .map(|((process, thread), &t)| {
                let was = before.ticks.get(&(process.clone(), thread.clone())).copied().unwrap_or(0);
                (process.clone(), thread.clone(), t.saturating_sub(was) as f64 / hz / seconds.max(1e-9))
            })
            .filter(|(_, _, share)| *share >= 0.005)
            .collect();
        out.sort_by(|a, b| b.2.total_cmp(&a.2));
        out
    }
}

/// Busy and total jiffies of all cores (`/proc/stat`).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemTimes {
    busy: u64,
    total: u64,
}

impl SystemTimes {
    pub fn read() -> SystemTimes {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let Some(cpu) = stat.lines().find(|l| l.starts_with("cpu ")) else { return SystemTimes::default() };
        let v: Vec<u64> = cpu.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        let total: u64 = v.iter().take(8).sum();
        let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
        SystemTimes { busy: total - idle, total }
    }

    /// Cores busy on average since `before` (0 … number of cores).
    pub fn cores_busy_since(&self, before: &SystemTimes, cores: usize) -> f64 {
        let total = self.total.saturating_sub(before.total) as f64;
        if total == 0.0 { 0.0 } else { self.busy.saturating_sub(before.busy) as f64 / total * cores as f64 }
    }
}

/// `/proc/loadavg`'s 1-minute figure.
pub fn load1() -> f64 {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().next().and_then(|l| l.parse().ok()).unwrap_or(f64::NAN)
}

/// The machine, as BENCHMARKS.md records it.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned()))
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mosquitto = Command::new(MOSQUITTO)
        .arg("-h")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).lines().next().map(str::to_owned))
        .unwrap_or_default();
    format!("{cores} × {model}, Linux {}, {mosquitto}", kernel.trim())
}

/// Where the bench finds the braid binary: the `braid` bin target that `cargo bench` builds, with
/// the bench profile, next to this bench (Cargo sets `CARGO_BIN_EXE_<name>` for benches and
/// integration tests, and builds the package's binaries before them).
pub fn braid_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_braid"))
}
