//! The `braid` command line (CONTRACT.md "Command line").

mod bench;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use braid::config;
use braid::plan::{MAX_SHARDS, Plan};
use braid::replay::{self, ReplayArgs};

/// EX_CONFIG: the configuration is invalid (as systemd and `vector validate` expect).
const EXIT_CONFIG: u8 = 78;

#[derive(Parser)]
#[command(name = "braid", version, about = "Event-time stream joins for edge gateways")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check a configuration; start nothing. Exit 0 valid, 78 invalid (every error on stderr).
    Validate {
        #[arg(long, env = "BRAID_CONFIG")]
        config: PathBuf,
    },
    /// Run the configuration over JSON-lines files, deterministically.
    Replay {
        #[arg(long, env = "BRAID_CONFIG")]
        config: PathBuf,
        /// Overrides `runtime.shards`.
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=MAX_SHARDS as i64))]
        shards: Option<u16>,
        /// STREAM=FILE: one JSON object per line in the stream's schema.
        #[arg(long = "input", value_name = "STREAM=FILE", value_parser = name_and_path)]
        inputs: Vec<(String, PathBuf)>,
        /// NAME=FILE: a stream, an operator, OPERATOR.late, OPERATOR.expired or dead_letter, as
        /// JSON lines.
        #[arg(long = "output", value_name = "NAME=FILE", value_parser = name_and_path)]
        outputs: Vec<(String, PathBuf)>,
        /// Write the final metrics (Prometheus text) to this file.
        #[arg(long, value_name = "FILE")]
        metrics: Option<PathBuf>,
        /// Run every 200 ms tick instead of skipping those that change nothing (slow; the output
        /// is the same).
        #[arg(long)]
        every_tick: bool,
    },
    /// Why rows of a key did or did not join: replays the inputs and tells the fate of every row of
    /// the key at every operator it reached. Exit 0, 78 bad config, 1 unreadable input.
    Explain {
        #[arg(long, env = "BRAID_CONFIG")]
        config: PathBuf,
        /// STREAM=FILE, as for replay.
        #[arg(long = "input", value_name = "STREAM=FILE", value_parser = name_and_path)]
        inputs: Vec<(String, PathBuf)>,
        /// The key, as the streams' key fields read it (a composite key: its values joined by
        /// `,` in the key's order, `north,1`).
        #[arg(long, required_unless_present_any = ["rows", "ids"])]
        key: Option<String>,
        /// STREAM:FIELD=VALUE[,FIELD=VALUE...]: one row of a pair to explain (with a second
        /// `--row` or an `--id`).
        #[arg(long = "row", value_name = "STREAM:FIELD=VALUE,...", value_parser = braid::explain::pair::Pick::parse_row, conflicts_with = "key")]
        rows: Vec<braid::explain::pair::Pick>,
        /// An input row's `_id` (16 hex digits): one row of a pair to explain; alone, a result's
        /// `_id`: the pair behind it.
        #[arg(long = "id", value_name = "ID", value_parser = braid::explain::pair::Pick::parse_id, conflicts_with = "key")]
        ids: Vec<braid::explain::pair::Pick>,
        /// Explain what the running service's journal still holds (fetched from its ops
        /// endpoint) instead of `--input` files.
        #[arg(long, conflicts_with = "inputs")]
        live: bool,
        /// With `--live`: the ops endpoint (else the config's `[ops] listen`).
        #[arg(long, value_name = "ADDR", requires = "live")]
        ops: Option<String>,
        /// One JSON object per row and operator instead of plain words.
        #[arg(long)]
        json: bool,
        /// Overrides `runtime.shards` (the fates do not depend on it; the shard shown does).
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=MAX_SHARDS as i64))]
        shards: Option<u16>,
    },
    /// Print the pipeline in another system's language: `flink-sql` (a Flink SQL script).
    Export {
        #[arg(value_parser = ["flink-sql"])]
        format: String,
        #[arg(long, env = "BRAID_CONFIG")]
        config: PathBuf,
        /// STREAM=PATH: the table reads JSON lines from PATH (else an MQTT placeholder).
        #[arg(long = "input", value_name = "STREAM=PATH", value_parser = name_and_path)]
        inputs: Vec<(String, PathBuf)>,
        /// NAME=PATH: a stream or operator written as JSON lines to PATH.
        #[arg(long = "output", value_name = "NAME=PATH", value_parser = name_and_path)]
        outputs: Vec<(String, PathBuf)>,
    },
    /// Synthetic load through the shard runtime, in process; prints figures (rows/s, latency, memory).
    Bench(bench::BenchFlags),
    /// The service: MQTT in, joins, results out, until SIGTERM (systemd: Type=notify).
    Run {
        #[arg(long, env = "BRAID_CONFIG")]
        config: PathBuf,
        /// Overrides `runtime.shards`.
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=MAX_SHARDS as i64))]
        shards: Option<u16>,
    },
    /// Embedded broker + simulated devices + the gateway join, with a live summary (Ctrl-C ends).
    Demo(braid::demo::DemoFlags),
    /// A live view of a running service from its ops endpoint, every second (`--once`: one frame).
    /// Exit 0, 78 bad config, 1 when the endpoint cannot be reached.
    Status {
        /// The service's configuration: its `[ops] listen` is the address (unless `--ops`).
        #[arg(long, env = "BRAID_CONFIG")]
        config: Option<PathBuf>,
        /// The ops endpoint, host:port (default: the config's `[ops] listen`, else 127.0.0.1:9464).
        #[arg(long, value_name = "ADDR")]
        ops: Option<String>,
        /// Print one frame (rates over one second) and exit, for scripts.
        #[arg(long)]
        once: bool,
    },
}

fn name_and_path(arg: &str) -> Result<(String, PathBuf), String> {
    match arg.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => Ok((name.to_owned(), PathBuf::from(path))),
        _ => Err(format!("{arg:?}: want NAME=FILE")),
    }
}

fn main() -> ExitCode {
    braid::ops::malloc::keep_large_buffers_mapped();
    // BRAID_LOG_FORMAT and JOURNAL_STREAM choose the output (README.md "Logs").
    if let Err(error) = braid::ops::logs::init() {
        eprintln!("error: {error}");
        return ExitCode::from(EXIT_CONFIG);
    }
    let cli = Cli::parse();
    if let Command::Status { config, ops, once } = &cli.command {
        return status(config.as_deref(), ops.as_deref(), *once);
    }
    let loaded = match &cli.command {
        Command::Validate { config }
        | Command::Replay { config, .. }
        | Command::Explain { config, .. }
        | Command::Export { config, .. } => config::load(config),
        Command::Run { config, .. } => config::load(config),
        Command::Bench(flags) => match &flags.config {
            Some(config) => config::load(config),
            None => config::parse(bench::GATEWAY_CONFIG_NAME, bench::GATEWAY_CONFIG),
        },
        Command::Demo(_) => config::parse(braid::demo::CONFIG_NAME, braid::demo::CONFIG),
        Command::Status { .. } => unreachable!("handled above"),
    };
    let plan = match loaded {
        Ok(plan) => plan,
        Err(errors) => return config_failed(&errors),
    };
    for warning in &plan.warnings {
        eprintln!("{warning}");
    }
    let outcome = match cli.command {
        Command::Validate { config } => {
            eprintln!("{}: valid", config.display());
            Ok(())
        }
        Command::Replay { shards, inputs, outputs, metrics, every_tick, .. } => {
            let shards = shards.map(usize::from).or(plan.runtime.shards).unwrap_or_else(default_shards);
            replay(
                &plan,
                ReplayArgs {
                    shards,
                    every_tick,
                    inputs: &inputs,
                    outputs: &outputs,
                    sort_run_bytes: braid::replay::input::SORT_RUN_BYTES,
                },
                metrics,
            )
        }
        Command::Explain { config, inputs, key, rows, ids, json, shards, live, ops } => {
            let shards = shards.map(usize::from).or(plan.runtime.shards).unwrap_or_else(default_shards);
            let picks: Vec<_> = rows.into_iter().chain(ids).collect();
            explain(&plan, &config, Explained { shards, inputs, key, picks, json, live, ops })
        }
        Command::Export { inputs, outputs, .. } => {
            braid::sql::export::flink_sql(&plan, &inputs, &outputs).map_err(anyhow::Error::msg).and_then(|script| {
                use std::io::Write;
                std::io::stdout().lock().write_all(script.as_bytes()).context("writing the script")
            })
        }
        Command::Bench(flags) => run_bench(&plan, &flags.into_args()),
        Command::Run { config, shards } => {
            let options = braid::service::ServiceOptions {
                config_path: Some(config),
                shards: shards.map(usize::from),
                control: Default::default(),
                view: Default::default(),
            };
            braid::service::run(plan, options).map_err(anyhow::Error::from)
        }
        Command::Demo(flags) => braid::demo::run(plan, &flags),
        Command::Status { .. } => unreachable!("handled above"),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Every configuration error on stderr, then exit 78.
fn config_failed(errors: &config::ConfigErrors) -> ExitCode {
    eprint!("{errors}");
    eprintln!("{}: {} configuration error(s)", errors.file, errors.errors.len());
    ExitCode::from(EXIT_CONFIG)
}

/// `braid status`: the address from `--ops`, else the config's `[ops] listen`, else the default.
fn status(config: Option<&std::path::Path>, ops: Option<&str>, once: bool) -> ExitCode {
    use braid::ops::status;
    let plan = match config.map(|path| (path, config::load(path))) {
        None => None,
        Some((path, Ok(plan))) => Some((path.display().to_string(), plan)),
        Some((_, Err(errors))) => return config_failed(&errors),
    };
    let listen = plan.as_ref().map(|(file, plan)| (file.as_str(), plan.ops_listen.as_str()));
    let outcome = status::resolve(ops, listen).and_then(|addr| {
        let stdout = std::io::stdout();
        let terminal = stdout.is_terminal();
        let mut out = stdout.lock();
        if once { status::once(addr, &mut out) } else { status::live(addr, &mut out, terminal) }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `shards = "auto"`: one per core.
fn default_shards() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// `braid explain`'s flags, checked by clap.
struct Explained {
    shards: usize,
    inputs: Vec<(String, PathBuf)>,
    key: Option<String>,
    picks: Vec<braid::explain::pair::Pick>,
    json: bool,
    live: bool,
    ops: Option<String>,
}

fn explain(plan: &Plan, config: &std::path::Path, flags: Explained) -> anyhow::Result<()> {
    let live = match flags.live {
        true => {
            let file = config.display().to_string();
            let addr = braid::ops::status::resolve(flags.ops.as_deref(), Some((&file, &plan.ops_listen)))?;
            let fetched = braid::explain::live::fetch(addr)?;
            eprintln!("{addr}: the journal holds {} line(s) (the messages since the last checkpoint)", fetched.lines);
            Some(fetched)
        }
        false => None,
    };
    let inputs = live.as_ref().map_or(flags.inputs.as_slice(), |l| l.inputs.as_slice());
    let mut out = std::io::stdout().lock();
    let json = flags.json;
    if let Some(key) = &flags.key {
        let story = braid::explain::run(plan, &braid::explain::ExplainArgs { shards: flags.shards, inputs, key })?;
        return if json { story.write_json(&mut out) } else { story.write_text(&mut out) }
            .context("writing the explanation");
    }
    let args = braid::explain::ExplainArgs { shards: flags.shards, inputs, key: "" };
    let story = braid::explain::pair::run(plan, &args, &flags.picks)?;
    if json { story.write_json(&mut out) } else { story.write_text(&mut out) }.context("writing the explanation")
}

fn run_bench(plan: &Plan, args: &bench::BenchArgs) -> anyhow::Result<()> {
    let report = bench::run(plan, args)?;
    report.write_table(&mut std::io::stderr().lock()).context("writing the table")?;
    report.write_figures(&mut std::io::stdout().lock()).context("writing the figures")
}

fn replay(plan: &Plan, args: ReplayArgs<'_>, metrics: Option<PathBuf>) -> anyhow::Result<()> {
    let summary = replay::run(plan, &args)?;
    if let Some(path) = metrics {
        let text = braid::ops::metrics::render(plan, &summary.figures);
        std::fs::write(&path, text).with_context(|| format!("--metrics {}", path.display()))?;
    }
    tracing::info!(lines = summary.lines, shards = args.shards, "Replay finished");
    Ok(())
}
