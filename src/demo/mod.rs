//! `braid demo`: the gateway join live on one machine — braid's embedded broker, simulated
//! devices publishing over real MQTT, the service running `configs/gateway.toml`'s join, and a
//! one-line summary every second. Nothing to install, nothing written outside a temporary state
//! directory (results go to `effect.jsonl` in it; its path is printed).

pub mod devices;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;

use crate::config::{Overflow, SinkDef, SinkKind, SourceKind};
use crate::plan::Plan;
use crate::service::{Control, LiveView, Request, ServiceOptions};

/// The demo's configuration: the gateway join of `configs/gateway.toml`, with its devices on the
/// embedded broker and its results in a file (the demo has no cloud to send them to).
pub const CONFIG: &str = include_str!("../../configs/gateway.toml");
pub const CONFIG_NAME: &str = "configs/gateway.toml (built in)";

#[derive(clap::Args, Debug)]
pub struct DemoFlags {
    /// Where the embedded broker listens; when the port is taken (a gateway usually runs its own
    /// broker on 1883), a free one on the same address is used and printed.
    #[arg(long, default_value = "127.0.0.1:1883")]
    pub listen: SocketAddr,
    /// Simulated devices (with the default rate each reports a status change every few seconds,
    /// so some commands find none and are reported as `left_only`).
    #[arg(long, default_value_t = 5000)]
    pub devices: usize,
    /// Messages per second, all devices together.
    #[arg(long, default_value_t = 2000.0)]
    pub rate: f64,
    /// Stop after this long (e.g. "30s"); without it the demo runs until Ctrl-C.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Keep state and results here instead of a temporary directory.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    match crate::config::walk::parse_duration(text)? {
        ms if ms > 0 => Ok(Duration::from_millis(ms as u64)),
        _ => Err(format!("{text:?}: the demo needs a positive duration")),
    }
}

/// Runs the demo until Ctrl-C (or `--duration`).
pub fn run(mut plan: Plan, flags: &DemoFlags) -> anyhow::Result<()> {
    // The demo's broker takes anonymous clients (its simulated devices have no credentials): like
    // `validate` for such a broker (README "Security"), it stays on loopback.
    anyhow::ensure!(
        flags.listen.ip().is_loopback(),
        "braid demo: --listen {} is not a loopback address; the demo's broker takes anonymous clients",
        flags.listen
    );
    let listen = crate::broker::free_addr(flags.listen).context("no free port for the embedded broker")?;
    if listen != flags.listen {
        eprintln!(
            "braid demo: {} is taken (a broker already runs there?); the embedded broker uses {listen}",
            flags.listen
        );
    }
    let temp = tempfile::Builder::new().prefix("braid-demo-").tempdir().context("temporary state directory")?;
    let state_dir = flags.state_dir.clone().unwrap_or_else(|| temp.path().to_owned());
    let results = state_dir.join("effect.jsonl");
    configure(&mut plan, listen, &state_dir, &results);
    eprintln!(
        "braid demo: {} devices at {} msg/s → embedded broker {listen} → interval join \"effect\" → {}",
        flags.devices,
        flags.rate,
        results.display()
    );
    eprintln!(
        "braid demo: Ctrl-C stops; devices may connect to mqtt://{listen} too (topics devices/ID/status, devices/ID/command)"
    );
    let control = Arc::new(Control::default());
    let view = Arc::new(LiveView::default());
    let stop_devices = Arc::new(AtomicBool::new(false));
    let side = std::thread::Builder::new().name("braid-demo".into()).spawn({
        let (control, view, stop_devices) = (Arc::clone(&control), Arc::clone(&view), Arc::clone(&stop_devices));
        let sim = devices::DeviceSim {
            url_host: listen.ip().to_string(),
            port: listen.port(),
            devices: flags.devices,
            rate: flags.rate,
            seed: 7,
            qos: rumqttc::QoS::AtLeastOnce,
            limit: None,
            made_at: None,
        };
        let duration = flags.duration;
        move || drive(sim, &control, &view, &stop_devices, duration)
    })?;
    let options = ServiceOptions { config_path: None, shards: None, control: Arc::clone(&control), view };
    let outcome = crate::service::run(plan, options);
    stop_devices.store(true, Ordering::Release);
    control.ask(Request::Stop);
    let _ = side.join();
    outcome?;
    eprintln!("\nbraid demo: stopped; results were in {}", results.display());
    Ok(())
}

/// Devices on the embedded broker at `listen`, results to a file, state in `state_dir`.
fn configure(plan: &mut Plan, listen: SocketAddr, state_dir: &std::path::Path, results: &std::path::Path) {
    for source in &mut plan.sources {
        source.kind = SourceKind::Embedded;
        source.listen = Some(listen.to_string());
    }
    plan.runtime.state_dir = Some(state_dir.to_owned());
    plan.ops_listen = String::new();
    plan.sinks = vec![SinkDef {
        name: "demo".into(),
        kind: SinkKind::File,
        inputs: vec!["effect".into(), "effect.late".into(), crate::config::DEAD_LETTER.into()],
        url: None,
        topic: None,
        qos: 1,
        buffer: 0,
        overflow: Overflow::Block,
        path: Some(results.display().to_string()),
        conn: Default::default(),
        status_topic: None,
    }];
}

/// The demo's side thread: waits until the service is up, starts the devices, prints the
/// summary every second, and asks for a stop after `duration`.
fn drive(
    sim: devices::DeviceSim,
    control: &Control,
    view: &LiveView,
    stop_devices: &Arc<AtomicBool>,
    duration: Option<Duration>,
) {
    while !view.is_running() {
        if control.request() == Request::Stop {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let devices = match devices::spawn(sim, Arc::clone(stop_devices)) {
        Ok(devices) => devices,
        Err(error) => {
            eprintln!("braid demo: cannot start the devices: {error}");
            control.ask(Request::Stop);
            return;
        }
    };
    #[allow(clippy::disallowed_methods)] // the CLI's own clock, for --duration
    let started = std::time::Instant::now();
    let mut before = view.totals();
    loop {
        std::thread::sleep(Duration::from_secs(1));
        if control.request() == Request::Stop {
            break;
        }
        let now = view.totals();
        eprint!("\r{} · devices sent {}   ", now.status_line(&before, Duration::from_secs(1)), devices.1.sent());
        before = now;
        if duration.is_some_and(|d| started.elapsed() >= d) {
            control.ask(Request::Stop);
            break;
        }
    }
    stop_devices.store(true, Ordering::Release);
    let _ = devices.0.join();
}
