//! Running braid from tests: the binary under test (`braid replay` with inputs, outputs and a
//! timeout, its JSON-lines outputs read back), files in a test's temporary folder, and replays in
//! this process (`braid::replay::run`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use serde_json::Value;

/// (name, file) pairs, as `--input NAME=PATH` and `--output NAME=PATH` name them.
pub type Files = Vec<(String, PathBuf)>;

/// How long one `braid replay` of a generated workload may take before the test calls it hung.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(2);

/// The braid binary under test, ignoring any `BRAID_CONFIG` of the environment.
pub fn braid() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_braid"));
    cmd.env_remove("BRAID_CONFIG");
    cmd
}

/// `braid replay --config CONFIG [--shards N]` with an `--input` per input and an `--output` per
/// output, in the order given (the order of the `--input` flags breaks ties in the merge).
pub fn replay_command(
    config: &Path,
    shards: Option<u32>,
    inputs: &[(String, PathBuf)],
    outputs: &[(String, PathBuf)],
) -> Command {
    let mut cmd = braid();
    cmd.arg("replay").arg("--config").arg(config);
    if let Some(n) = shards {
        cmd.arg("--shards").arg(n.to_string());
    }
    for (name, path) in inputs {
        cmd.arg("--input").arg(format!("{name}={}", path.display()));
    }
    for (name, path) in outputs {
        cmd.arg("--output").arg(format!("{name}={}", path.display()));
    }
    cmd
}

/// Runs `cmd` with no stdin and no stdout, its stderr kept in a temporary file, for at most
/// `timeout` (polled: tests do not read the clock, clippy.toml). Its exit status and stderr; Err
/// when it cannot start or does not finish in time (then it is killed).
pub fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> Result<(ExitStatus, String), String> {
    let stderr_file = tempfile::NamedTempFile::new().map_err(|e| format!("tempfile: {e}"))?;
    let stderr_out = stderr_file.reopen().map_err(|e| format!("tempfile: {e}"))?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr_out)
        .spawn()
        .map_err(|e| format!("cannot start braid: {e}"))?;
    let mut waited = Duration::ZERO;
    let status = loop {
        match child.try_wait().map_err(|e| format!("waiting for braid: {e}"))? {
            Some(status) => break status,
            None if waited > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("braid did not finish within {timeout:?}"));
            }
            None => {
                std::thread::sleep(POLL);
                waited += POLL;
            }
        }
    };
    let stderr = std::fs::read(stderr_file.path()).unwrap_or_default();
    Ok((status, String::from_utf8_lossy(&stderr).into_owned()))
}

/// The outputs of one replay, by output name.
#[derive(Debug, Default)]
pub struct Outputs {
    pub by_name: BTreeMap<String, Vec<Value>>,
    pub stderr: String,
}

impl Outputs {
    pub fn get(&self, name: &str) -> &[Value] {
        self.by_name.get(name).map_or(&[], Vec::as_slice)
    }

    /// The rows of output `name`, taken out of `self`.
    pub fn take(&mut self, name: &str) -> Vec<Value> {
        self.by_name.remove(name).unwrap_or_default()
    }
}

/// Runs `braid replay` ([`replay_command`], at most `timeout`) with each of `outputs` written to
/// `dir/out-NAME.jsonl`; when it exits 0, the rows of every output. Err: what went wrong, with
/// braid's stderr.
pub fn replay(
    dir: &Path,
    config: &Path,
    shards: Option<u32>,
    inputs: &[(String, PathBuf)],
    outputs: &[&str],
    timeout: Duration,
) -> Result<Outputs, String> {
    let files = output_files(dir, "out", outputs);
    let (status, stderr) = run_with_timeout(&mut replay_command(config, shards, inputs, &files), timeout)
        .map_err(|e| format!("braid replay: {e} (shards {shards:?})"))?;
    if !status.success() {
        return Err(format!("braid replay exited with {status} (shards {shards:?}); stderr:\n{stderr}"));
    }
    let mut out = Outputs { stderr, ..Outputs::default() };
    for (name, path) in files {
        out.by_name.insert(name, read_jsonl(&path)?);
    }
    Ok(out)
}

/// The rows of a JSON-lines file, in file order; Err names the file and the line that is no JSON.
pub fn read_jsonl(path: &Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line).map_err(|e| format!("{} line {}: {e}: {line}", path.display(), i + 1))
        })
        .collect()
}

/// Writes `text` to `dir/name`; its path.
pub fn write_file(dir: &Path, name: &str, text: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Writes each input (stream name, lines) to `dir/NAME.jsonl`; (stream, path) pairs in the
/// same order, for `--input` flags or [`braid::replay::ReplayArgs`].
pub fn write_inputs<N: AsRef<str>, T: AsRef<[u8]>>(dir: &Path, inputs: impl IntoIterator<Item = (N, T)>) -> Files {
    inputs
        .into_iter()
        .map(|(name, text)| {
            let name = name.as_ref();
            (name.to_owned(), write_file(dir, &format!("{name}.jsonl"), text))
        })
        .collect()
}

/// (name, `dir/PREFIX-NAME.jsonl`) for each output name.
pub fn output_files(dir: &Path, prefix: &str, names: &[&str]) -> Files {
    names.iter().map(|name| (name.to_string(), dir.join(format!("{prefix}-{name}.jsonl")))).collect()
}

/// A fresh folder under the cargo target tmp dir, to save a failing workload in for a human.
pub fn repro_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Replays `plan` in this process (`braid::replay::run`) with `shards` shards, skipping ticks
/// that cannot change anything or (`every_tick`) stepping through every one; the lines of each
/// of `outputs`, in file order.
pub fn replay_in_process(
    plan: &braid::plan::Plan,
    shards: usize,
    every_tick: bool,
    inputs: &[(String, PathBuf)],
    outputs: &[(String, PathBuf)],
) -> Vec<Vec<String>> {
    braid::replay::run(
        plan,
        &braid::replay::ReplayArgs {
            shards,
            every_tick,
            inputs,
            outputs,
            sort_run_bytes: braid::replay::input::SORT_RUN_BYTES,
        },
    )
    .unwrap();
    outputs
        .iter()
        .map(|(_, path)| std::fs::read_to_string(path).unwrap().lines().map(str::to_owned).collect())
        .collect()
}

/// [`replay_in_process`] twice, skipping ticks and stepping through every one, with the outputs
/// written to `dir/skip-NAME.jsonl` and `dir/step-NAME.jsonl`: each run's outputs as sorted lines
/// (multisets), (skipping, stepping).
pub fn skip_and_step(
    plan: &braid::plan::Plan,
    dir: &Path,
    shards: usize,
    inputs: &[(String, PathBuf)],
    outputs: &[&str],
) -> (Vec<Vec<String>>, Vec<Vec<String>>) {
    let run = |every_tick: bool| -> Vec<Vec<String>> {
        let files = output_files(dir, if every_tick { "step" } else { "skip" }, outputs);
        let mut texts = replay_in_process(plan, shards, every_tick, inputs, &files);
        texts.iter_mut().for_each(|lines| lines.sort());
        texts
    };
    (run(false), run(true))
}
